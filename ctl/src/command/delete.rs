//! `resctl delete TYPE NAME… | -f FILE`: delete resources; with `--wait`, wait until they and
//! everything they own are gone, and on timeout say what blocks: pending finalizers (with the
//! controllers that manage the type and where they run) and remaining children.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use proto::client::describe;
use proto::codec::gvk;
use proto::resource::v1::Id;
use serde::Serialize;

use super::tree::{TreeNode, descendants, read_exact};
use crate::cli::DeleteArgs;
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct Deleted {
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    pub tenancy: String,
    /// `deleted` (gone), `deleting` (marked, waiting for finalizers or not waited for),
    /// `not found`.
    pub result: String,
}

/// Something that keeps a deletion from finishing.
#[derive(Debug, Clone, Serialize)]
pub struct Blocker {
    /// `Kind/name` of the resource still present.
    pub resource: String,
    #[serde(rename = "type")]
    pub resource_type: String,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    /// The controllers that release its finalizers, with where they run.
    pub controllers: Vec<String>,
    /// Finalizers no controller releases: only a person can remove them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unowned: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeleteReport {
    pub results: Vec<Deleted>,
    /// Filled when `--wait` timed out.
    pub blocked: Vec<Blocker>,
    pub waited_ms: u64,
}

/// How often `--wait` checks.
const POLL: Duration = Duration::from_millis(200);

/// Deletes `ids`; with `wait`, waits up to `timeout` for them and their descendants to go.
pub async fn delete(
    session: &Session,
    ids: &[Id],
    wait: Option<Duration>,
) -> anyhow::Result<DeleteReport> {
    let client = &session.client;
    let started = Instant::now();
    let mut results = Vec::new();
    let mut pending: Vec<Id> = Vec::new();
    for id in ids {
        let label = Deleted {
            resource_type: id.r#type.as_ref().map(gvk).unwrap_or_default(),
            name: id.name.clone(),
            tenancy: describe::tenancy_label(id.tenancy.as_ref()),
            result: String::new(),
        };
        let Some(stored) = read_exact(client, id).await? else {
            results.push(Deleted {
                result: "not found".into(),
                ..label
            });
            continue;
        };
        let stored_id = stored.id.clone().unwrap_or_default();
        client
            .delete(&stored_id, "")
            .await
            .with_context(|| format!("cannot delete {}", describe::id_label(&stored_id)))?;
        pending.push(stored_id);
        results.push(Deleted {
            result: "deleting".into(),
            ..label
        });
    }
    let mut blocked = Vec::new();
    if let Some(timeout) = wait {
        let deadline = started + timeout;
        loop {
            let mut remaining = Vec::new();
            for id in &pending {
                remaining.extend(still_present(session, id).await?);
            }
            for result in &mut results {
                let gone = !remaining.iter().any(|(root, _)| {
                    root.name == result.name
                        && root.r#type.as_ref().map(gvk).unwrap_or_default() == result.resource_type
                });
                if result.result == "deleting" && gone {
                    result.result = "deleted".into();
                }
            }
            if remaining.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                blocked = blockers(session, remaining).await;
                break;
            }
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(DeleteReport {
        results,
        blocked,
        waited_ms: started.elapsed().as_millis() as u64,
    })
}

/// The resource (if still there) and its remaining descendants, each paired with the root id.
async fn still_present(session: &Session, id: &Id) -> anyhow::Result<Vec<(Id, TreeNode)>> {
    let client = &session.client;
    let mut present = Vec::new();
    if let Some(resource) = read_exact(client, id).await? {
        let node = TreeNode {
            resource_type: id.r#type.as_ref().map(gvk).unwrap_or_default(),
            name: id.name.clone(),
            tenancy: describe::tenancy_label(id.tenancy.as_ref()),
            uid: id.uid.clone(),
            condition: None,
            finalizers: proto::meta::finalizers(&resource)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            deleting: proto::meta::is_marked_for_deletion(&resource),
            missing: false,
            children: Vec::new(),
        };
        present.push((id.clone(), node));
    }
    // Children are found by the owner's uid even after the owner itself is gone.
    for child in descendants(client, id, 0).await? {
        for node in child.walk() {
            let mut flat = node.clone();
            flat.children.clear();
            present.push((id.clone(), flat));
        }
    }
    Ok(present)
}

async fn blockers(session: &Session, remaining: Vec<(Id, TreeNode)>) -> Vec<Blocker> {
    // Best effort: without the controller list the blockers are still worth reporting.
    let placement = session
        .client
        .list_controllers(true)
        .await
        .ok()
        .map(|listing| proto::client::placement::placement_map(&listing));
    remaining
        .into_iter()
        .map(|(_, node)| {
            // By finalizer, and only where they run (a singleton's standbys hold nothing up).
            let (running, unowned) = placement
                .as_ref()
                .map(|map| map.release_labels(&node.finalizers))
                .unwrap_or_default();
            let kind = node.resource_type.rsplit('.').next().unwrap_or_default();
            Blocker {
                resource: format!("{kind}/{}", node.name),
                resource_type: node.resource_type.clone(),
                finalizers: node.finalizers.clone(),
                deleting: node.deleting,
                controllers: running,
                unowned,
            }
        })
        .collect()
}

/// What blocks, as sentences for stderr.
pub fn explain_blockers(report: &DeleteReport) -> String {
    let mut text = format!(
        "timed out after {:.1}s; still present:\n",
        report.waited_ms as f64 / 1000.0
    );
    for blocker in &report.blocked {
        text.push_str(&format!("  {}", blocker.resource));
        if blocker.finalizers.is_empty() {
            text.push_str(if blocker.deleting {
                " (marked for deletion, no finalizers left)\n"
            } else {
                " (not yet deleted: its owner's cascade has not reached it)\n"
            });
        } else {
            text.push_str(&format!(
                " waits for finalizers: {}\n",
                blocker.finalizers.join(", ")
            ));
        }
        for finalizer in &blocker.unowned {
            text.push_str(&format!(
                "    no controller releases {finalizer}: remove it by hand (`resctl edit {} …`, delete it from metadata.finalizers)\n",
                blocker.resource_type
            ));
        }
        for controller in &blocker.controllers {
            text.push_str(&format!("    controller {controller}\n"));
        }
    }
    text
}

/// The resources `delete -l SELECTOR` or `delete --all` would delete, after asking: an
/// interactive caller is shown how many and where, and says yes; anyone else passes --yes.
async fn selected(
    session: &Session,
    args: &DeleteArgs,
    type_name: &str,
) -> anyhow::Result<Vec<Id>> {
    let selector = args.selector.clone().unwrap_or_default();
    let resources =
        super::get::list_matching(session, type_name, args.all_namespaces, "", &selector).await?;
    let ids: Vec<Id> = resources
        .into_iter()
        .filter_map(|resource| resource.id)
        .collect();
    if ids.is_empty() || args.yes {
        return Ok(ids);
    }
    let info = session.resolve_type(type_name).await?;
    let tenancy = session.tenancy(info.scope(), args.all_namespaces);
    let what = match &args.selector {
        Some(selector) => format!("{type_name} matching {selector:?}"),
        None => format!("every {type_name}"),
    };
    let question = format!(
        "delete {} ({what}, in {})?",
        ids.len(),
        describe::tenancy_label(Some(&tenancy))
    );
    if !session.interactive {
        return Err(crate::UsageError(format!(
            "{question} pass --yes to confirm when not running interactively"
        ))
        .into());
    }
    if !crate::session::confirm(&question, false) {
        anyhow::bail!("nothing deleted");
    }
    Ok(ids)
}

pub async fn run(session: &Session, args: &DeleteArgs) -> anyhow::Result<u8> {
    let ids = if args.selector.is_some() || args.all {
        let Some(type_name) = &args.resource_type else {
            return Err(crate::UsageError("delete -l and --all need TYPE".into()).into());
        };
        selected(session, args, type_name).await?
    } else if args.files.is_empty() {
        let Some(first) = &args.resource_type else {
            return Err(crate::UsageError("delete needs TYPE NAME… or -f FILE".into()).into());
        };
        let mut ids = Vec::new();
        for (type_name, name) in crate::cli::typed_names(first, &args.names)? {
            ids.push(session.id(type_name, name).await?);
        }
        ids
    } else {
        let sources = super::apply::read_sources(&args.files)?;
        let codec = session.codec().await?;
        let mut ids = Vec::new();
        for document in super::apply::decode(session, codec, &sources) {
            match document.resource {
                Ok(resource) => ids.push(resource.id.unwrap_or_default()),
                Err(error) => {
                    anyhow::bail!("{} document {}: {error}", document.file, document.index)
                }
            }
        }
        // Dependents first, so owners go last.
        ids.reverse();
        ids
    };
    let bar = if args.wait && session.interactive {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("waiting for the deletion (and its cascade) to finish");
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let report = delete(session, &ids, args.wait.then_some(args.timeout)).await?;
    bar.finish_and_clear();
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&report)?,
        OutputFormat::Yaml => output::yaml(&report)?,
        OutputFormat::Name => report
            .results
            .iter()
            .map(|r| format!("{}/{}\n", r.resource_type, r.name))
            .collect(),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            let mut table = Table::new(["RESULT", "TYPE", "TENANCY", "NAME"]);
            for result in &report.results {
                table.row([
                    result.result.clone(),
                    result.resource_type.clone(),
                    result.tenancy.clone(),
                    result.name.clone(),
                ]);
            }
            table.render()
        }
    };
    output::print(&text)?;
    if !report.blocked.is_empty() {
        crate::say_raw!("{}", explain_blockers(&report));
        return Ok(1);
    }
    if report.results.iter().any(|r| r.result == "not found") {
        crate::say!("error: some resources were not found");
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blockers_name_finalizers_their_controllers_and_waiting_children() {
        let report = DeleteReport {
            results: Vec::new(),
            waited_ms: 60_000,
            blocked: vec![
                Blocker {
                    resource: "Album/kind-of-blue".into(),
                    resource_type: "demo.v2.Album".into(),
                    finalizers: vec!["demo.resd.io/album-cleanup".into()],
                    deleting: true,
                    controllers: vec![
                        "demo-album releases demo.resd.io/album-cleanup, on node 1 (running, queue 0)"
                            .into(),
                    ],
                    unowned: Vec::new(),
                },
                Blocker {
                    resource: "Album/abbey-road".into(),
                    resource_type: "demo.v2.Album".into(),
                    finalizers: vec!["ops.example.com/hold".into()],
                    deleting: true,
                    controllers: Vec::new(),
                    unowned: vec!["ops.example.com/hold".into()],
                },
            ],
        };
        assert_eq!(
            explain_blockers(&report),
            "timed out after 60.0s; still present:\n  \
             Album/kind-of-blue waits for finalizers: demo.resd.io/album-cleanup\n    \
             controller demo-album releases demo.resd.io/album-cleanup, on node 1 (running, queue 0)\n  \
             Album/abbey-road waits for finalizers: ops.example.com/hold\n    \
             no controller releases ops.example.com/hold: remove it by hand (`resctl edit demo.v2.Album …`, delete it from metadata.finalizers)\n"
        );
    }
}
