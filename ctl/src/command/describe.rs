//! `resctl describe TYPE NAME`: one object for people — who it is, its owner, finalizers and
//! labels, every status condition, and the events controllers recorded about it (DESIGN §18),
//! newest first.

use std::collections::BTreeMap;

use anyhow::Context as _;
use proto::client::describe;
use proto::events::v1::{Event, event};
use proto::resource::v1::{Id, Resource, Tenancy};
use serde::Serialize;

use super::status::{ConditionRow, report_of};
use crate::cli::NamedArgs;
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct EventRow {
    #[serde(rename = "type")]
    pub event_type: String,
    pub reason: String,
    pub count: u64,
    pub first_seen: String,
    pub last_seen: String,
    pub reporter: String,
    pub message: String,
    #[serde(skip)]
    last_seconds: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Description {
    pub id: String,
    pub uid: String,
    pub version: String,
    pub generation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    pub labels: BTreeMap<String, String>,
    pub conditions: Vec<ConditionRow>,
    /// Sharded controllers of its type: which member reconciles it (DESIGN §16).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<String>,
    pub events: Vec<EventRow>,
}

fn events_type() -> proto::resource::v1::Type {
    proto::resource::v1::Type {
        group: "events".into(),
        group_version: "v1".into(),
        kind: "Event".into(),
    }
}

/// Where the events about `id` live: its namespace, or `default/default`.
fn events_tenancy(id: &Id) -> Tenancy {
    let tenancy = id.tenancy.clone().unwrap_or_default();
    if tenancy.namespace.is_empty() {
        Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }
    } else {
        tenancy
    }
}

fn time_label(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Whether `event` regards the object `id` (any version of its type; its uid when both say).
fn regards(event: &Event, id: &Id) -> bool {
    let Some(regarding) = &event.regarding else {
        return false;
    };
    let kind = |id: &Id| {
        id.r#type
            .as_ref()
            .map(|t| (t.group.clone(), t.kind.clone()))
    };
    kind(regarding) == kind(id)
        && regarding.name == id.name
        && regarding.tenancy.clone().unwrap_or_default() == id.tenancy.clone().unwrap_or_default()
        && (regarding.uid.is_empty() || id.uid.is_empty() || regarding.uid == id.uid)
}

/// For each sharded controller of `id`'s type (its replicas report it), who reconciles `id`:
/// "invoices: member replica-2 (ring 4)". Nothing when the caller may not list controllers.
async fn shard_owners(session: &Session, id: &Id) -> Vec<String> {
    let Ok(controllers) = session.client.list_controllers(false).await else {
        return Vec::new();
    };
    let same_type = |t: Option<&proto::resource::v1::Type>| {
        t.zip(id.r#type.as_ref())
            .is_some_and(|(a, b)| a.group == b.group && a.kind == b.kind)
    };
    let mut maps = std::collections::BTreeSet::new();
    for replica in &controllers.external {
        let Some(controller) = &replica.controller else {
            continue;
        };
        if replica.shard.is_some() && same_type(controller.managed_type.as_ref()) {
            let tenancy = replica.tenancy.clone().unwrap_or_default();
            maps.insert((
                controller.name.clone(),
                tenancy.partition,
                tenancy.namespace,
            ));
        }
    }
    let mut owners = Vec::new();
    for (controller, partition, namespace) in maps {
        let map_id = Id {
            uid: String::new(),
            name: controller.clone(),
            r#type: Some(proto::resource::v1::Type {
                group: "coordination".into(),
                group_version: "v1".into(),
                kind: "ShardMap".into(),
            }),
            tenancy: Some(Tenancy {
                partition,
                namespace,
            }),
        };
        let label = match session.client.read(&map_id).await {
            Ok(Some(stored)) => stored
                .data
                .as_ref()
                .and_then(|data| {
                    <proto::coordination::v1::ShardMap as prost::Message>::decode(
                        data.value.as_slice(),
                    )
                    .ok()
                })
                .map(|map| proto::shard::owner_label(&map, &proto::shard::ShardKey::of(id)))
                .unwrap_or_else(|| "its ShardMap cannot be read".into()),
            Ok(None) => "no ShardMap yet (no member has joined)".into(),
            Err(error) => format!("its ShardMap cannot be read: {error}"),
        };
        owners.push(format!("{controller}: {label}"));
    }
    owners
}

/// The events about `id`, newest first.
pub async fn events_of(session: &Session, id: &Id) -> anyhow::Result<Vec<EventRow>> {
    let listed = session
        .client
        .list(&events_type(), &events_tenancy(id), "")
        .await
        .context("cannot list the events")?;
    let mut rows: Vec<EventRow> = listed
        .iter()
        .filter_map(|resource: &Resource| {
            let data = resource.data.as_ref()?;
            <Event as prost::Message>::decode(data.value.as_slice()).ok()
        })
        .filter(|event| regards(event, id))
        .map(|event| EventRow {
            event_type: match event::Type::try_from(event.r#type) {
                Ok(event::Type::Warning) => "Warning",
                _ => "Normal",
            }
            .to_owned(),
            reason: event.reason.clone(),
            count: event.count,
            first_seen: time_label(event.first_seen.as_ref()),
            last_seen: time_label(event.last_seen.as_ref()),
            reporter: event.reporter.clone(),
            message: event.message.clone(),
            last_seconds: event.last_seen.as_ref().map_or(0, |t| t.seconds),
        })
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.last_seconds));
    Ok(rows)
}

pub async fn run(session: &Session, args: &NamedArgs) -> anyhow::Result<u8> {
    let resource = super::get::read(session, &args.resource_type, &args.name).await?;
    let id = resource.id.clone().unwrap_or_default();
    let events = events_of(session, &id).await?;
    let shards = shard_owners(session, &id).await;
    let labels: BTreeMap<String, String> = resource
        .metadata
        .iter()
        .filter(|(key, _)| {
            key.as_str() != proto::meta::FINALIZERS_KEY
                && key.as_str() != proto::meta::DELETION_TIMESTAMP_KEY
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let description = Description {
        id: describe::id_label(&id),
        uid: id.uid.clone(),
        version: resource.version.clone(),
        generation: resource.generation.clone(),
        owner: resource.owner.as_ref().map(describe::id_label),
        finalizers: proto::meta::finalizers(&resource)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        deleting: proto::meta::is_marked_for_deletion(&resource),
        labels,
        conditions: report_of(&resource).conditions,
        shards,
        events,
    };
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&description)?,
        OutputFormat::Yaml => output::yaml(&description)?,
        OutputFormat::Name => format!("{}\n", description.id),
        _ => render(&description),
    };
    output::print(&text)?;
    Ok(0)
}

fn render(d: &Description) -> String {
    let mut text = String::new();
    let mut line = |key: &str, value: &str| text.push_str(&format!("{key:<12}{value}\n"));
    line("Name:", &d.id);
    line("UID:", &d.uid);
    line("Version:", &d.version);
    line("Generation:", &d.generation);
    line("Owner:", d.owner.as_deref().unwrap_or("<none>"));
    let finalizers = if d.finalizers.is_empty() {
        "<none>".to_owned()
    } else {
        d.finalizers.join(", ")
    };
    line(
        "Finalizers:",
        &if d.deleting {
            format!("{finalizers} (marked for deletion: waiting for them)")
        } else {
            finalizers
        },
    );
    let labels = if d.labels.is_empty() {
        "<none>".to_owned()
    } else {
        d.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    line("Labels:", &labels);
    for owner in &d.shards {
        line("Shard:", &output::clean(owner));
    }
    text.push_str("\nStatus:\n");
    if d.conditions.is_empty() {
        text.push_str("  no status yet: no controller has reported on this resource\n");
    } else {
        let mut table = Table::new(["  KEY", "CONDITION", "STATE", "REASON", "MESSAGE"]);
        for row in &d.conditions {
            let state = if row.up_to_date {
                row.state.clone()
            } else {
                format!("{} (stale)", row.state)
            };
            table.row([
                format!("  {}", row.key),
                row.condition_type.clone(),
                state,
                row.reason.clone(),
                row.message.clone(),
            ]);
        }
        text.push_str(&table.render());
    }
    text.push_str("\nEvents:\n");
    if d.events.is_empty() {
        text.push_str("  none in the last hour\n");
    } else {
        let mut table = Table::new(["  TYPE", "REASON", "COUNT", "LAST SEEN", "FROM", "MESSAGE"]);
        for event in &d.events {
            table.row([
                format!("  {}", event.event_type),
                event.reason.clone(),
                event.count.to_string(),
                event.last_seen.clone(),
                event.reporter.clone(),
                event.message.clone(),
            ]);
        }
        text.push_str(&table.render());
    }
    text
}
