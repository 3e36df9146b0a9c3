//! `resctl type plan -f FILE` (DESIGN §15.1): every stored object of a Type's kind checked
//! against the Type the file proposes — what would fail and why — with nothing changed. Also
//! the summary `apply` prints before it writes a Type.

use proto::cluster::v1::PlanTypeResponse;
use proto::codec::gvk;
use proto::resource::v1::Resource;
use serde::Serialize;

use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

/// One object that would fail.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// `group.version.Kind`, in the version it is stored in.
    #[serde(rename = "type")]
    pub resource_type: String,
    pub partition: String,
    pub namespace: String,
    pub name: String,
    pub message: String,
}

impl Failure {
    /// A failure as a plan's answer names it.
    pub fn of(failure: proto::cluster::v1::PlanFailure) -> Failure {
        let id = failure.id.unwrap_or_default();
        let tenancy = id.tenancy.unwrap_or_default();
        Failure {
            resource_type: id.r#type.as_ref().map(gvk).unwrap_or_default(),
            partition: tenancy.partition,
            namespace: tenancy.namespace,
            // The server withholds what the token may not read.
            name: if id.name.is_empty() {
                "(not readable)".to_owned()
            } else {
                id.name
            },
            message: failure.message,
        }
    }
}

/// A spinner on stderr saying `message` while a plan runs (nothing when not a terminal).
pub fn spinner(session: &Session, message: String) -> indicatif::ProgressBar {
    if !session.interactive {
        return indicatif::ProgressBar::hidden();
    }
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(message);
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    spinner
}

/// The plan of one Type document.
#[derive(Debug, Clone, Serialize)]
pub struct TypePlan {
    /// The Type resource's name.
    pub name: String,
    pub checked: u64,
    pub failures: Vec<Failure>,
    /// Failures beyond those listed.
    pub omitted: u64,
    pub storage_version: String,
    /// Objects a migration would rewrite into the storage version.
    pub to_migrate: u64,
}

impl TypePlan {
    pub fn of(name: &str, answer: PlanTypeResponse) -> TypePlan {
        TypePlan {
            name: name.to_owned(),
            checked: answer.checked,
            failures: answer.failures.into_iter().map(Failure::of).collect(),
            omitted: answer.omitted,
            storage_version: answer.storage_version,
            to_migrate: answer.to_migrate,
        }
    }

    /// How many objects would fail.
    pub fn failing(&self) -> u64 {
        self.failures.len() as u64 + self.omitted
    }

    /// `Type platform-database: 3 objects checked, 1 would fail; 2 to migrate to v2`.
    pub fn summary(&self) -> String {
        let objects = if self.checked == 1 {
            "object"
        } else {
            "objects"
        };
        let mut line = format!(
            "Type {}: {} {objects} checked, {} would fail",
            self.name,
            self.checked,
            self.failing()
        );
        if self.to_migrate > 0 {
            line.push_str(&format!(
                "; {} to migrate to {}",
                self.to_migrate, self.storage_version
            ));
        }
        line
    }
}

/// The objects a plan names, as a table (empty when none), and how many more it left out.
pub fn failures_table(failures: &[Failure], omitted: u64, why: &str) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let mut table = Table::new(["TYPE", "TENANCY", "NAME", why]);
    for failure in failures {
        let tenancy = match (failure.partition.as_str(), failure.namespace.as_str()) {
            ("", _) => "-".to_owned(),
            (partition, "") => partition.to_owned(),
            (partition, namespace) => format!("{partition}/{namespace}"),
        };
        table.row([
            failure.resource_type.clone(),
            tenancy,
            failure.name.clone(),
            failure.message.clone(),
        ]);
    }
    let mut text = table.render();
    if omitted > 0 {
        text.push_str(&format!("… and {omitted} more\n"));
    }
    text
}

/// Plans `proposed` (a `registry.v1.Type` resource), with a spinner while the server checks.
pub async fn plan(session: &Session, proposed: &Resource) -> anyhow::Result<TypePlan> {
    let name = proposed
        .id
        .as_ref()
        .map(|id| id.name.clone())
        .unwrap_or_default();
    let spinner = spinner(
        session,
        format!("checking every stored object against Type {name} (nothing changes)"),
    );
    let answer = session.client.plan_type(proposed).await;
    spinner.finish_and_clear();
    Ok(TypePlan::of(&name, answer?))
}

pub async fn run(session: &Session, command: crate::cli::TypeCommand) -> anyhow::Result<u8> {
    let crate::cli::TypeCommand::Plan(args) = command;
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
        let is_type = resource
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| gvk(t) == "registry.v1.Type");
        if is_type {
            plans.push(plan(session, resource).await?);
        }
    }
    if plans.is_empty() {
        anyhow::bail!(
            "{} holds no registry.v1.Type document: `type plan` checks a Type against the objects stored under it",
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
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            let mut text = String::new();
            for plan in &plans {
                text.push_str(&plan.summary());
                text.push('\n');
                text.push_str(&failures_table(
                    &plan.failures,
                    plan.omitted,
                    "WOULD FAIL BECAUSE",
                ));
            }
            text
        }
    };
    output::print(&text)?;
    Ok(if plans.iter().any(|plan| plan.failing() > 0) {
        1
    } else {
        0
    })
}
