//! `resctl policy plan -f FILE` (DESIGN §17): every stored object an admission policy would
//! match, checked against it — which it would refuse and why — with nothing changed.

use proto::codec::gvk;
use serde::Serialize;

use super::plan::Failure;
use crate::output::{self, OutputFormat};
use crate::session::Session;

/// The plan of one policy document.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyPlan {
    pub name: String,
    pub checked: u64,
    pub failures: Vec<Failure>,
    /// Refusals beyond those listed.
    pub omitted: u64,
}

impl PolicyPlan {
    fn refused(&self) -> u64 {
        self.failures.len() as u64 + self.omitted
    }

    /// `Policy modern-albums: 12 objects matched, 2 would be refused`.
    pub fn summary(&self) -> String {
        format!(
            "Policy {}: {} {} matched, {} would be refused",
            self.name,
            self.checked,
            if self.checked == 1 {
                "object"
            } else {
                "objects"
            },
            self.refused()
        )
    }
}

/// Plans `resource` (a `policy.v1.AdmissionPolicy`), with a spinner while the server checks.
pub async fn plan(
    session: &Session,
    resource: &proto::resource::v1::Resource,
) -> anyhow::Result<PolicyPlan> {
    let name = resource
        .id
        .as_ref()
        .map(|id| id.name.clone())
        .unwrap_or_default();
    let spinner = super::plan::spinner(
        session,
        format!("checking the stored objects policy {name} matches (nothing changes)"),
    );
    let answer = session.client.plan_policy(resource.clone()).await;
    spinner.finish_and_clear();
    let answer = answer?;
    Ok(PolicyPlan {
        name,
        checked: answer.checked,
        failures: answer.failures.into_iter().map(Failure::of).collect(),
        omitted: answer.omitted,
    })
}

pub async fn run(session: &Session, command: crate::cli::PolicyCommand) -> anyhow::Result<u8> {
    let crate::cli::PolicyCommand::Plan(args) = command;
    let sources = super::apply::read_sources(std::slice::from_ref(&args.file))?;
    let codec = session.codec().await?;
    let documents = super::apply::decode(session, codec, &sources);
    let mut plans = Vec::new();
    for document in &documents {
        let resource = match &document.resource {
            Ok(resource) => resource,
            Err(error) => anyhow::bail!(
                "{} document {}: {}",
                document.file,
                document.index,
                error.message
            ),
        };
        let is_policy = resource
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| gvk(t) == "policy.v1.AdmissionPolicy");
        if !is_policy {
            continue;
        }
        plans.push(plan(session, resource).await?);
    }
    if plans.is_empty() {
        anyhow::bail!(
            "{} holds no policy.v1.AdmissionPolicy document to plan",
            args.file.display()
        );
    }
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&plans)?,
        OutputFormat::Yaml => output::yaml(&plans)?,
        OutputFormat::Name => plans
            .iter()
            .flat_map(|plan| plan.failures.iter())
            .map(|failure| format!("{}/{}\n", failure.resource_type, failure.name))
            .collect(),
        _ => {
            let mut text = String::new();
            for plan in &plans {
                text.push_str(&format!(
                    "Policy {}: {} {} matched, {} would be refused\n",
                    plan.name,
                    plan.checked,
                    if plan.checked == 1 {
                        "object"
                    } else {
                        "objects"
                    },
                    plan.refused()
                ));
                text.push_str(&super::plan::failures_table(
                    &plan.failures,
                    plan.omitted,
                    "REFUSED BECAUSE",
                ));
            }
            text
        }
    };
    output::print(&text)?;
    Ok(if plans.iter().any(|plan| plan.refused() > 0) {
        1
    } else {
        0
    })
}
