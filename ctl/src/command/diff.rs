//! `resctl diff -f …`: what `apply` would change, as a unified diff of the server's current
//! state against what apply would store (the type's mutate hook applied, metadata merged as
//! apply merges it). Compares what apply owns — data, metadata, owner — so the server's own
//! fields (version, generation, status) never show as changes. Exit 0 without changes, 1 with,
//! 2 on errors, like `kubectl diff`; nothing is written.

use std::collections::BTreeSet;
use std::io::IsTerminal as _;

use futures::StreamExt as _;
use proto::codec::{Codec, gvk};
use proto::resource::v1::Resource;
use serde::Serialize;

use crate::command::apply::{self, Document, Plan};
use crate::output::{self, OutputFormat};
use crate::session::Session;

/// What apply would do to one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Create,
    Update,
    None,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub file: String,
    pub document: usize,
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    pub tenancy: String,
    pub change: Change,
    /// The unified diff (empty without changes).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub diff: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many documents are compared at once within one ordering group.
const PARALLEL_READS: usize = 16;

/// Compares every document with the server, in apply's order.
pub async fn diff(session: &Session, documents: &[Document]) -> anyhow::Result<Vec<Difference>> {
    let codec = session.codec().await?;
    // Partitions and namespaces the input creates count as existing for what follows them.
    let planned: BTreeSet<(String, String)> = documents
        .iter()
        .filter_map(|document| document.resource.as_ref().ok())
        .filter_map(apply::tenancy_unit)
        .collect();
    let mut differences = Vec::new();
    for group in apply::order(documents) {
        let mut stream = futures::stream::iter(
            group
                .into_iter()
                .map(|index| compare(session, codec, &documents[index], &planned)),
        )
        .buffered(PARALLEL_READS);
        while let Some(difference) = stream.next().await {
            differences.push(difference);
        }
    }
    Ok(differences)
}

async fn compare(
    session: &Session,
    codec: &Codec,
    document: &Document,
    planned: &BTreeSet<(String, String)>,
) -> Difference {
    let (resource_type, name, tenancy) = document.labels();
    let mut difference = Difference {
        file: document.file.clone(),
        document: document.index,
        resource_type,
        name,
        tenancy,
        change: Change::Error,
        diff: String::new(),
        error: None,
    };
    let resource = match &document.resource {
        Ok(resource) => resource,
        Err(error) => {
            difference.error = Some(error.message.clone());
            return difference;
        }
    };
    let plan = match apply::plan(session, resource).await {
        Err(error) if apply::missing_planned_tenancy(&error, resource, planned) => {
            apply::plan_as_new(session, resource).await
        }
        other => other,
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(error) => {
            difference.error = Some(error.to_string());
            return difference;
        }
    };
    match unified(codec, &plan, &path_of(resource)) {
        Ok(text) => {
            difference.change = match (&plan.stored, text.is_empty()) {
                (None, _) => Change::Create,
                (Some(_), true) => Change::None,
                (Some(_), false) => Change::Update,
            };
            difference.diff = text;
        }
        Err(error) => difference.error = Some(error.to_string()),
    }
    difference
}

/// `demo.v2.Album/default/jazz/kind-of-blue`: the name a diff header gives a resource.
fn path_of(resource: &Resource) -> String {
    let id = resource.id.clone().unwrap_or_default();
    let tenancy = id.tenancy.unwrap_or_default();
    let mut path = id.r#type.as_ref().map(gvk).unwrap_or_default();
    for part in [&tenancy.partition, &tenancy.namespace, &id.name] {
        if !part.is_empty() {
            path.push('/');
            path.push_str(part);
        }
    }
    path
}

/// What a diff shows of a resource: what apply owns, and the identity around it.
fn shown(codec: &Codec, resource: &Resource) -> anyhow::Result<String> {
    let mut resource = resource.clone();
    resource.version.clear();
    resource.generation.clear();
    resource.status.clear();
    without_compiled_schemas(&mut resource);
    Ok(codec.to_yaml(&resource)?)
}

/// A `registry.v1.Type` without the descriptor sets the server compiles from its `.proto`
/// text: a diff of a Type shows the schema's text, not two encodings of it (DESIGN §15.1).
fn without_compiled_schemas(resource: &mut Resource) {
    let is_type = resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .is_some_and(|t| gvk(t) == "registry.v1.Type");
    let Some(data) = resource.data.as_mut().filter(|_| is_type) else {
        return;
    };
    let Ok(mut t) = <proto::registry::v1::Type as prost::Message>::decode(data.value.as_slice())
    else {
        return;
    };
    t.descriptor_set.clear();
    for version in &mut t.versions {
        version.descriptor_set.clear();
    }
    data.value = prost::Message::encode_to_vec(&t);
}

/// The unified diff between what is stored and what apply would store; empty when the same.
fn unified(codec: &Codec, plan: &Plan, path: &str) -> anyhow::Result<String> {
    let (live, merged) = match &plan.stored {
        None => (String::new(), shown(codec, &plan.mutated)?),
        Some(_) if !plan.changes(codec) => return Ok(String::new()),
        Some(stored) => {
            let mut after = stored.clone();
            after.data = plan.mutated.data.clone();
            after.metadata = plan.mutated.metadata.clone();
            after.owner = plan.mutated.owner.clone();
            (shown(codec, stored)?, shown(codec, &after)?)
        }
    };
    let live_name = if plan.stored.is_some() {
        format!("live/{path}")
    } else {
        "/dev/null".to_owned()
    };
    Ok(similar::TextDiff::from_lines(&live, &merged)
        .unified_diff()
        .context_radius(3)
        .header(&live_name, &format!("merged/{path}"))
        .to_string())
}

/// Colours `+` and `-` lines when printing to a terminal (unless `NO_COLOR` is set).
pub(crate) fn colour(diff: &str) -> String {
    let mut text = String::with_capacity(diff.len());
    for line in diff.split_inclusive('\n') {
        let code = if line.starts_with("+++") || line.starts_with("---") {
            "1"
        } else if line.starts_with('+') {
            "32"
        } else if line.starts_with('-') {
            "31"
        } else if line.starts_with("@@") {
            "36"
        } else {
            ""
        };
        if code.is_empty() {
            text.push_str(line);
        } else {
            let body = line.trim_end_matches('\n');
            text.push_str(&format!("\x1b[{code}m{body}\x1b[0m"));
            if line.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    text
}

/// `resctl diff -f …`.
pub async fn run(session: &Session, args: &crate::cli::DiffArgs) -> anyhow::Result<u8> {
    match compare_and_print(session, args).await {
        Ok(code) => Ok(code),
        // A diff that could not be computed is an error (2), never "no changes" or "changes".
        Err(error) => {
            crate::say!("error: {error:#}");
            Ok(2)
        }
    }
}

async fn compare_and_print(session: &Session, args: &crate::cli::DiffArgs) -> anyhow::Result<u8> {
    if let (Some(type_name), Some(name)) = (&args.resource_type, &args.name) {
        let Some(from) = &args.from else {
            anyhow::bail!(
                "--from VERSION is required to compare two versions of {type_name} {name} (`resctl history {type_name} {name}` lists them)"
            );
        };
        return super::history::diff(session, type_name, name, from, args.to.as_deref()).await;
    }
    let sources = apply::read_sources(&args.files)?;
    let codec = session.codec().await?;
    let documents = apply::decode(session, codec, &sources);
    let differences = diff(session, &documents).await?;
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&differences)?,
        OutputFormat::Yaml => output::yaml(&differences)?,
        OutputFormat::Name => differences
            .iter()
            .filter(|d| matches!(d.change, Change::Create | Change::Update))
            .map(|d| format!("{}/{}\n", d.resource_type, d.name))
            .collect(),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            let text: String = differences.iter().map(|d| d.diff.as_str()).collect();
            if std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
                colour(&text)
            } else {
                text
            }
        }
    };
    output::print(&text)?;
    let mut failed = false;
    for difference in &differences {
        if let Some(error) = &difference.error {
            failed = true;
            let what = if difference.name.is_empty() {
                String::new()
            } else {
                format!(" ({} {})", difference.resource_type, difference.name)
            };
            crate::say!(
                "error: {} document {}{what}: {error}",
                difference.file,
                difference.document
            );
        }
    }
    let changed = differences
        .iter()
        .any(|d| matches!(d.change, Change::Create | Change::Update));
    Ok(match (failed, changed) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Type's diff shows its schema's text, line by line, and none of the compiled bytes.
    #[test]
    fn a_type_shows_its_schema_text_not_its_descriptors() {
        use proto::cluster::v1::{ListTypesResponse, Scope, TypeInfo};
        let codec = Codec::new(ListTypesResponse {
            types: vec![TypeInfo {
                r#type: Some(proto::resource::v1::Type {
                    group: "registry".into(),
                    group_version: "v1".into(),
                    kind: "Type".into(),
                }),
                scope: Scope::Cluster as i32,
                message_name: "resd.registry.v1.Type".into(),
                builtin: true,
                ..Default::default()
            }],
            file_descriptor_set: proto::FILE_DESCRIPTOR_SET.to_vec().into(),
            next_page_token: String::new(),
        })
        .expect("codec");
        let t = proto::registry::v1::Type {
            group: "platform".into(),
            kind: "Database".into(),
            versions: vec![proto::registry::v1::TypeVersion {
                name: "v1".into(),
                proto: "syntax = \"proto3\";\npackage resd.platform.v1;\nmessage Database {}\n"
                    .into(),
                descriptor_set: vec![7; 300],
                served: true,
                ..Default::default()
            }],
            descriptor_set: vec![9; 300],
            ..Default::default()
        };
        let resource = Resource {
            id: Some(proto::resource::v1::Id {
                name: "platform-database".into(),
                r#type: Some(proto::resource::v1::Type {
                    group: "registry".into(),
                    group_version: "v1".into(),
                    kind: "Type".into(),
                }),
                ..Default::default()
            }),
            data: Some(proto::to_any(&t)),
            ..Default::default()
        };
        let text = shown(&codec, &resource).expect("shown");
        assert!(!text.contains("descriptorSet"), "{text}");
        assert!(
            text.lines()
                .any(|line| line.trim() == "package resd.platform.v1;"),
            "the schema is text, a line each: {text}"
        );
    }

    #[test]
    fn colour_marks_added_removed_and_hunks() {
        let diff = "--- live/a\n+++ merged/a\n@@ -1 +1 @@\n-old\n+new\n same\n";
        let coloured = colour(diff);
        assert!(coloured.contains("\x1b[31m-old\x1b[0m\n"));
        assert!(coloured.contains("\x1b[32m+new\x1b[0m\n"));
        assert!(coloured.contains("\x1b[36m@@ -1 +1 @@\x1b[0m\n"));
        assert!(coloured.ends_with(" same\n"));
    }
}
