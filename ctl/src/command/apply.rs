//! `resctl apply`: create or update resources from YAML documents. Documents are ordered so
//! partitions, namespaces and owners are written before what depends on them; each reports
//! `created`, `updated`, `unchanged` (same data, metadata and owner as stored after the type's
//! mutate hook: nothing is written) or the server's error, and one failure never stops the rest.
//! Metadata merges: the document's keys win, other keys and finalizers others hold are kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use futures::StreamExt as _;
use proto::client::{ClientError, describe};
use proto::cluster::v1::Scope;
use proto::codec::{Codec, gvk};
use proto::resource::v1::{Id, Resource, Tenancy};
use serde::Serialize;

use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

/// One YAML text and where it came from.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file as given (or `-` for stdin).
    pub file: String,
    pub text: String,
}

/// One document of the input, decoded, with its place.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: String,
    /// 1-based index of the document in its file.
    pub index: usize,
    pub resource: Result<Resource, proto::codec::CodecError>,
}

impl Document {
    /// `group.version.Kind`, name and tenancy of the document's resource as reports show them
    /// (empty when the document could not be read).
    pub fn labels(&self) -> (String, String, String) {
        let Ok(resource) = &self.resource else {
            return Default::default();
        };
        let id = resource.id.clone().unwrap_or_default();
        (
            id.r#type.as_ref().map(gvk).unwrap_or_default(),
            id.name,
            describe::tenancy_label(id.tenancy.as_ref()),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Created,
    Updated,
    Unchanged,
    Failed,
}

/// What happened to one document.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    pub file: String,
    pub document: usize,
    /// `group.version.Kind`, empty when the document could not be read.
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    pub tenancy: String,
    pub outcome: Outcome,
    /// The version stored (for created/updated/unchanged).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ApplyReport {
    pub dry_run: bool,
    pub results: Vec<Applied>,
}

impl ApplyReport {
    pub fn failed(&self) -> usize {
        self.results
            .iter()
            .filter(|r| r.outcome == Outcome::Failed)
            .count()
    }

    pub fn count(&self, outcome: Outcome) -> usize {
        self.results.iter().filter(|r| r.outcome == outcome).count()
    }
}

/// Reads files, directories (recursively, `.yaml`/`.yml`, in name order) and `-` (stdin).
pub fn read_sources(paths: &[PathBuf]) -> anyhow::Result<Vec<Source>> {
    let mut sources = Vec::new();
    for path in paths {
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("cannot read stdin")?;
            sources.push(Source {
                file: "-".into(),
                text,
            });
            continue;
        }
        let metadata =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if metadata.is_dir() {
            let mut files = Vec::new();
            collect_yaml_files(path, &mut files)?;
            if files.is_empty() {
                anyhow::bail!("{} holds no .yaml or .yml files", path.display());
            }
            for file in files {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                sources.push(Source {
                    file: file.display().to_string(),
                    text,
                });
            }
        } else {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            sources.push(Source {
                file: path.display().to_string(),
                text,
            });
        }
    }
    Ok(sources)
}

fn collect_yaml_files(directory: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(directory)
        .with_context(|| format!("cannot list {}", directory.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect_yaml_files(&entry, files)?;
        } else if entry
            .extension()
            .is_some_and(|extension| extension == "yaml" || extension == "yml")
        {
            files.push(entry);
        }
    }
    Ok(())
}

/// Decodes every document and fills tenancies the documents leave out from the session's
/// defaults (by the type's scope; an owner defaults to its dependent's tenancy).
pub fn decode(session: &Session, codec: &Codec, sources: &[Source]) -> Vec<Document> {
    let mut documents = Vec::new();
    for source in sources {
        let base = (source.file != "-")
            .then(|| Path::new(&source.file).parent())
            .flatten();
        for (position, result) in codec
            .read_yaml_from(&source.text, base)
            .into_iter()
            .enumerate()
        {
            let index = match &result {
                Err(error) => error.document.unwrap_or(position + 1),
                Ok(_) => position + 1,
            };
            documents.push(Document {
                file: source.file.clone(),
                index,
                resource: result
                    .map(|mut resource| {
                        fill_tenancy(session, codec, &mut resource);
                        resource
                    })
                    .map_err(|error| proto::codec::CodecError {
                        document: None,
                        ..error
                    }),
            });
        }
    }
    // Documents that failed to read still count, numbered by their position in the file.
    documents
}

fn fill_tenancy(session: &Session, codec: &Codec, resource: &mut Resource) {
    let Some(id) = resource.id.as_mut() else {
        return;
    };
    let scope = id
        .r#type
        .as_ref()
        .and_then(|t| codec.scope(t))
        .unwrap_or(Scope::Namespace);
    let tenancy = id.tenancy.get_or_insert_with(Tenancy::default);
    default_tenancy(tenancy, scope, &session.partition, &session.namespace);
    let own_tenancy = tenancy.clone();
    if let Some(owner) = resource.owner.as_mut() {
        let owner_scope = owner
            .r#type
            .as_ref()
            .and_then(|t| codec.scope(t))
            .unwrap_or(Scope::Namespace);
        let owner_tenancy = owner.tenancy.get_or_insert_with(Tenancy::default);
        let partition = if own_tenancy.partition.is_empty() {
            session.partition.clone()
        } else {
            own_tenancy.partition.clone()
        };
        let namespace = if own_tenancy.namespace.is_empty() {
            session.namespace.clone()
        } else {
            own_tenancy.namespace.clone()
        };
        default_tenancy(owner_tenancy, owner_scope, &partition, &namespace);
    }
}

fn default_tenancy(tenancy: &mut Tenancy, scope: Scope, partition: &str, namespace: &str) {
    match scope {
        Scope::Cluster => {}
        Scope::Partition => {
            if tenancy.partition.is_empty() {
                tenancy.partition = partition.to_owned();
            }
        }
        _ => {
            if tenancy.partition.is_empty() {
                tenancy.partition = partition.to_owned();
            }
            if tenancy.namespace.is_empty() {
                tenancy.namespace = namespace.to_owned();
            }
        }
    }
}

/// A key naming a resource regardless of its type's version.
fn name_key(id: &Id) -> (String, String, String, String, String) {
    let resource_type = id.r#type.clone().unwrap_or_default();
    let tenancy = id.tenancy.clone().unwrap_or_default();
    (
        resource_type.group,
        resource_type.kind,
        tenancy.partition,
        tenancy.namespace,
        id.name.clone(),
    )
}

/// The write order: partitions, then namespaces, then everything else by owner depth within the
/// input (owners first), stable in input order. Returns groups that may be written in parallel.
pub fn order(documents: &[Document]) -> Vec<Vec<usize>> {
    let mut owner_of: HashMap<_, Option<_>> = HashMap::new();
    for document in documents {
        if let Ok(resource) = &document.resource
            && let Some(id) = &resource.id
        {
            owner_of.insert(name_key(id), resource.owner.as_ref().map(name_key));
        }
    }
    let depth = |document: &Document| -> usize {
        let Ok(resource) = &document.resource else {
            return 0;
        };
        let kind = resource
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .map(gvk)
            .unwrap_or_default();
        if kind.starts_with("tenancy.") && kind.ends_with(".Partition") {
            return 0;
        }
        if kind.starts_with("tenancy.") && kind.ends_with(".Namespace") {
            return 1;
        }
        // Owner chains within the input; bounded so a cycle cannot loop.
        let mut level = 2;
        let mut owner = resource.owner.as_ref().map(name_key);
        while let Some(key) = owner {
            match owner_of.get(&key) {
                Some(next) if level < 2 + documents.len() => {
                    level += 1;
                    owner = next.clone();
                }
                _ => break,
            }
        }
        level
    };
    let mut levels: Vec<(usize, usize)> = documents
        .iter()
        .enumerate()
        .map(|(index, document)| (depth(document), index))
        .collect();
    levels.sort();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current_level = None;
    for (level, index) in levels {
        if current_level != Some(level) {
            groups.push(Vec::new());
            current_level = Some(level);
        }
        if let Some(group) = groups.last_mut() {
            group.push(index);
        }
    }
    groups
}

/// Whether what a write would store equals what is stored: data (compared decoded, so encoding
/// differences do not matter), metadata and owner.
fn same_content(codec: &Codec, desired: &Resource, stored: &Resource) -> bool {
    let same_owner = match (&desired.owner, &stored.owner) {
        (None, None) => true,
        (Some(desired), Some(stored)) => {
            name_key(desired) == name_key(stored)
                && (desired.uid.is_empty() || desired.uid == stored.uid)
        }
        _ => false,
    };
    same_owner
        && desired.metadata == stored.metadata
        && codec.same_data(desired.data.as_ref(), stored.data.as_ref())
}

/// Apply owns the metadata keys its document names and nothing else: keys others set (a
/// controller's marks, the deletion mark) are kept, and finalizers are a union — a document can
/// add finalizers but never drops one a controller holds (remove those with `resctl edit`).
fn merge_metadata(desired: &mut Resource, stored: &Resource) {
    let mut merged = stored.metadata.clone();
    for (key, value) in &desired.metadata {
        merged.insert(key.clone(), value.clone());
    }
    let mut finalizers = proto::meta::finalizers(stored);
    finalizers.extend(proto::meta::finalizers(desired));
    if !finalizers.is_empty() {
        merged.insert(
            proto::meta::FINALIZERS_KEY.to_owned(),
            finalizers.into_iter().collect::<Vec<_>>().join(" "),
        );
    }
    desired.metadata = merged;
}

/// How many writes run at once within one ordering group.
const PARALLEL_WRITES: usize = 16;

/// How an apply goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mode {
    /// Store nothing; report what would change.
    pub dry_run: bool,
    /// Write a changed Type even when stored objects would fail under it.
    pub force: bool,
}

/// Whether a document registers a type (`registry.v1.Type`).
fn registers_a_type(document: &Document) -> bool {
    document.resource.as_ref().is_ok_and(|resource| {
        resource
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| gvk(t) == "registry.v1.Type")
    })
}

/// Decodes and applies `sources`. When some documents are of a type that Type documents of the
/// same input register (DESIGN §15), the Types are applied first and the rest decoded with the
/// schemas the server publishes then.
pub async fn decode_and_apply(
    session: &Session,
    sources: &[Source],
    mode: Mode,
    mut on_result: impl FnMut(&Applied),
) -> anyhow::Result<ApplyReport> {
    let codec = session.codec().await?;
    let documents = decode(session, codec, sources);
    let unregistered = documents.iter().any(|document| {
        document
            .resource
            .as_ref()
            .is_err_and(|error| error.unregistered_type)
    });
    if mode.dry_run || !unregistered || !documents.iter().any(registers_a_type) {
        return apply(session, codec, &documents, mode, on_result).await;
    }
    let types: Vec<Document> = documents
        .iter()
        .filter(|d| registers_a_type(d))
        .cloned()
        .collect();
    let mut report = apply(session, codec, &types, mode, &mut on_result).await?;
    let fresh = Codec::new(session.client.list_types().await?)?;
    let rest: Vec<Document> = decode(session, &fresh, sources)
        .into_iter()
        .filter(|d| !registers_a_type(d))
        .collect();
    let more = apply(session, &fresh, &rest, mode, on_result).await?;
    report.results.extend(more.results);
    Ok(report)
}

/// Applies decoded documents in dependency order; `on_result` sees each outcome as it lands.
pub async fn apply(
    session: &Session,
    codec: &Codec,
    documents: &[Document],
    mode: Mode,
    mut on_result: impl FnMut(&Applied),
) -> anyhow::Result<ApplyReport> {
    let dry_run = mode.dry_run;
    let mut results: Vec<Option<Applied>> = vec![None; documents.len()];
    // A dry run simulates the whole apply: partitions and namespaces it would create count as
    // existing for the documents after them.
    let mut planned_tenancy: std::collections::BTreeSet<(String, String)> = Default::default();
    for group in order(documents) {
        let planned = &planned_tenancy;
        let mut stream = futures::stream::iter(group.into_iter().map(|index| {
            let document = &documents[index];
            async move {
                (
                    index,
                    apply_one(session, codec, document, mode, planned).await,
                )
            }
        }))
        .buffered(PARALLEL_WRITES);
        let mut done = Vec::new();
        while let Some((index, applied)) = stream.next().await {
            on_result(&applied);
            done.push(index);
            results[index] = Some(applied);
        }
        drop(stream);
        for index in done {
            if let (Some(applied), Ok(resource)) = (&results[index], &documents[index].resource)
                && applied.outcome != Outcome::Failed
                && let Some(unit) = tenancy_unit(resource)
            {
                planned_tenancy.insert(unit);
            }
        }
    }
    Ok(ApplyReport {
        dry_run,
        results: results.into_iter().flatten().collect(),
    })
}

/// The tenancy a partition or namespace resource makes: `("p", "")` or `("p", "n")`.
pub fn tenancy_unit(resource: &Resource) -> Option<(String, String)> {
    let id = resource.id.as_ref()?;
    let kind = id.r#type.as_ref().map(gvk)?;
    match kind.as_str() {
        "tenancy.v1.Partition" => Some((id.name.clone(), String::new())),
        "tenancy.v1.Namespace" => Some((
            id.tenancy
                .as_ref()
                .map(|t| t.partition.clone())
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "default".into()),
            id.name.clone(),
        )),
        _ => None,
    }
}

/// Whether a dry run may count `resource`'s missing tenancy as created: every partition and
/// namespace it needs is one this run creates (or exists, and was not the one missing).
fn tenancy_planned(
    resource: &Resource,
    planned: &std::collections::BTreeSet<(String, String)>,
) -> bool {
    let tenancy = resource
        .id
        .as_ref()
        .and_then(|id| id.tenancy.clone())
        .unwrap_or_default();
    let partition = (tenancy.partition.clone(), String::new());
    let namespace = (tenancy.partition.clone(), tenancy.namespace.clone());
    planned.contains(&partition) || (!tenancy.namespace.is_empty() && planned.contains(&namespace))
}

async fn apply_one(
    session: &Session,
    codec: &Codec,
    document: &Document,
    mode: Mode,
    planned: &std::collections::BTreeSet<(String, String)>,
) -> Applied {
    let dry_run = mode.dry_run;
    let (resource_type, name, tenancy) = document.labels();
    let mut applied = Applied {
        file: document.file.clone(),
        document: document.index,
        resource_type,
        name,
        tenancy,
        outcome: Outcome::Failed,
        version: String::new(),
        error: None,
    };
    let resource = match &document.resource {
        Ok(resource) => resource,
        Err(error) => {
            applied.error = Some(error.message.clone());
            return applied;
        }
    };
    match write_if_changed(session, codec, resource, mode).await {
        Ok((outcome, version)) => {
            applied.outcome = outcome;
            applied.version = version;
        }
        // The partition or namespace is one this dry run creates: it would be created too.
        Err(error) if dry_run && missing_planned_tenancy(&error, resource, planned) => {
            match plan_as_new(session, resource).await {
                Ok(_) => applied.outcome = Outcome::Created,
                Err(error) => applied.error = Some(error.to_string()),
            }
        }
        Err(error) => applied.error = Some(error.to_string()),
    }
    applied
}

/// Whether `error` says that `resource`'s partition or namespace does not exist, and it is one
/// the same run creates before it.
pub fn missing_planned_tenancy(
    error: &ClientError,
    resource: &Resource,
    planned: &std::collections::BTreeSet<(String, String)>,
) -> bool {
    error.reason() == Some(proto::reason::Reason::TenancyNotFound)
        && tenancy_planned(resource, planned)
}

/// The plan for a resource whose tenancy does not exist yet but will: validated against the
/// default tenancy of the same scope, shown with its own.
pub async fn plan_as_new(session: &Session, resource: &Resource) -> Result<Plan, ClientError> {
    let mut stand_in = resource.clone();
    stand_in.status.clear();
    stand_in.generation.clear();
    if let Some(tenancy) = stand_in.id.as_mut().and_then(|id| id.tenancy.as_mut()) {
        if !tenancy.partition.is_empty() {
            tenancy.partition = "default".into();
        }
        if !tenancy.namespace.is_empty() {
            tenancy.namespace = "default".into();
        }
    }
    let mut mutated = session.client.mutate_and_validate(&stand_in).await?;
    mutated.id = resource.id.clone();
    let mut desired = resource.clone();
    desired.status.clear();
    desired.generation.clear();
    Ok(Plan {
        desired,
        mutated,
        stored: None,
    })
}

/// Attempts for an update that loses a compare-and-swap race to a concurrent writer.
const CAS_ATTEMPTS: usize = 3;

/// What apply would do with one document: the resource as it would be stored (after the type's
/// mutate hook, metadata merged with what is stored) and what is stored now.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What apply sends: the document without status and generation, metadata merged.
    pub desired: Resource,
    /// What the server would store from it (its mutate hook applied).
    pub mutated: Resource,
    pub stored: Option<Resource>,
}

impl Plan {
    pub fn changes(&self, codec: &Codec) -> bool {
        self.stored
            .as_ref()
            .is_none_or(|stored| !same_content(codec, &self.mutated, stored))
    }
}

/// Validates a document with the server and reads what it would replace.
pub async fn plan(session: &Session, resource: &Resource) -> Result<Plan, ClientError> {
    // What the server keeps for itself is not part of what is applied: status is written by
    // controllers, generation by the server. A version in the document is a precondition.
    let mut desired = resource.clone();
    desired.status.clear();
    desired.generation.clear();
    // Validate first, so errors read as the write's errors (`resource.id.name …`).
    let mut mutated = session.client.mutate_and_validate(&desired).await?;
    let mut lookup = desired.id.clone().unwrap_or_default();
    lookup.uid.clear();
    let stored = session.client.read(&lookup).await?;
    if let Some(stored) = &stored {
        merge_metadata(&mut desired, stored);
        mutated.metadata = desired.metadata.clone();
    }
    Ok(Plan {
        desired,
        mutated,
        stored,
    })
}

async fn write_if_changed(
    session: &Session,
    codec: &Codec,
    resource: &Resource,
    mode: Mode,
) -> Result<(Outcome, String), ClientError> {
    let dry_run = mode.dry_run;
    let mut planned_type = false;
    for attempt in 1..=CAS_ATTEMPTS {
        let plan = plan(session, resource).await?;
        let is_type = plan
            .desired
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| gvk(t) == "registry.v1.Type");
        if is_type && plan.stored.is_some() && plan.changes(codec) && !planned_type {
            // A change to a Type: its plan first (DESIGN §15.1), refused when stored objects
            // would fail under it, unless forced.
            planned_type = true;
            let type_plan = super::plan::plan(session, &plan.desired)
                .await
                .map_err(|error| match error.downcast::<ClientError>() {
                    Ok(client) => client,
                    Err(other) => ClientError::Settings(other.to_string()),
                })?;
            crate::say!("{}", type_plan.summary());
            if type_plan.failing() > 0 && !mode.force && !dry_run {
                let first = &type_plan.failures[0];
                return Err(ClientError::FailedPrecondition {
                    reason: None,
                    message: format!(
                        "{} stored objects would fail under this Type (first: {} {}: {}); see them with `resctl type plan -f FILE`, or apply with --force",
                        type_plan.failing(),
                        first.resource_type,
                        first.name,
                        first.message
                    ),
                });
            }
        }
        let is_policy = plan
            .desired
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| gvk(t) == "policy.v1.AdmissionPolicy");
        if is_policy && attempt == 1 && (plan.stored.is_none() || plan.changes(codec)) {
            // A new or changed admission policy: what it would refuse of what is stored
            // (DESIGN §17). It judges writes from now on; what is stored stays.
            if let Ok(policy_plan) = super::policy::plan(session, &plan.desired).await {
                crate::say!("{}", policy_plan.summary());
            }
        }
        let Some(stored) = &plan.stored else {
            if dry_run {
                return Ok((Outcome::Created, String::new()));
            }
            let written = session.client.write(&plan.desired).await?;
            return Ok((Outcome::Created, written.version));
        };
        if !plan.changes(codec) {
            return Ok((Outcome::Unchanged, stored.version.clone()));
        }
        if dry_run {
            return Ok((Outcome::Updated, stored.version.clone()));
        }
        let mut update = plan.desired.clone();
        if update.version.is_empty() {
            update.version = stored.version.clone();
        }
        match session.client.write(&update).await {
            Ok(written) => return Ok((Outcome::Updated, written.version)),
            // Someone else wrote in between: compare again, unless the document itself named
            // the version it expects.
            Err(ClientError::Conflict { .. })
                if plan.desired.version.is_empty() && attempt < CAS_ATTEMPTS =>
            {
                continue;
            }
            Err(error) => return Err(error),
        }
    }
    Err(ClientError::Conflict {
        reason: None,
        message: "the resource kept changing while it was applied; try again".into(),
    })
}

/// Renders a report: a line per document for people, the results for scripts.
pub fn render(report: &ApplyReport, format: OutputFormat) -> anyhow::Result<String> {
    match format {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(report),
        OutputFormat::Yaml => output::yaml(report),
        OutputFormat::Name => Ok(report
            .results
            .iter()
            .filter(|r| r.outcome != Outcome::Failed)
            .map(|r| format!("{}/{}\n", r.resource_type, r.name))
            .collect()),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            let mut table = Table::new(["RESULT", "TYPE", "TENANCY", "NAME", "VERSION"]);
            for result in report
                .results
                .iter()
                .filter(|r| r.outcome != Outcome::Failed)
            {
                table.row([
                    line_outcome(result, report.dry_run),
                    result.resource_type.clone(),
                    result.tenancy.clone(),
                    result.name.clone(),
                    result.version.clone(),
                ]);
            }
            let mut text = if table.is_empty() {
                String::new()
            } else {
                table.render()
            };
            text.push_str(&summary(report));
            Ok(text)
        }
    }
}

fn line_outcome(result: &Applied, dry_run: bool) -> String {
    let word = match result.outcome {
        Outcome::Created => "created",
        Outcome::Updated => "updated",
        Outcome::Unchanged => "unchanged",
        Outcome::Failed => "failed",
    };
    if dry_run && result.outcome != Outcome::Unchanged {
        format!("{word} (dry run)")
    } else {
        word.to_owned()
    }
}

/// `5 created, 1 updated, 3 unchanged, 2 failed`.
pub fn summary(report: &ApplyReport) -> String {
    let mut parts = Vec::new();
    for (outcome, word) in [
        (Outcome::Created, "created"),
        (Outcome::Updated, "updated"),
        (Outcome::Unchanged, "unchanged"),
        (Outcome::Failed, "failed"),
    ] {
        let count = report.count(outcome);
        if count > 0 {
            parts.push(format!("{count} {word}"));
        }
    }
    if parts.is_empty() {
        parts.push("nothing to apply".to_owned());
    }
    let suffix = if report.dry_run {
        " (dry run: nothing was stored)"
    } else {
        ""
    };
    format!("{}{suffix}\n", parts.join(", "))
}

/// Each failing document with its file, index and the server's message (for stderr).
pub fn failures(report: &ApplyReport) -> String {
    report
        .results
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .map(|r| {
            let what = if r.name.is_empty() {
                String::new()
            } else {
                format!(" ({} {})", r.resource_type, r.name)
            };
            format!(
                "error: {} document {}{what}: {}\n",
                r.file,
                r.document,
                r.error.as_deref().unwrap_or("failed")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;

/// `resctl apply -f …`.
pub async fn run(session: &Session, args: &crate::cli::ApplyArgs) -> anyhow::Result<u8> {
    let sources = read_sources(&args.files)?;
    // A progress bar once the output would scroll past a screenful.
    let documents: usize = sources
        .iter()
        .map(|source| source.text.matches("\n---").count() + 1)
        .sum();
    let bar = if documents > 40 {
        session.progress(documents as u64, "applying")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mode = Mode {
        dry_run: args.dry_run,
        force: args.force,
    };
    let report = decode_and_apply(session, &sources, mode, |_| bar.inc(1)).await?;
    bar.finish_and_clear();
    output::print(&render(&report, session.output)?)?;
    let failures = failures(&report);
    if !failures.is_empty() {
        crate::say_raw!("{failures}");
        return Ok(1);
    }
    Ok(0)
}
