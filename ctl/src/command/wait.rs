//! `resctl wait TYPE NAME --for condition=TYPE[=True|False|Unknown] | --for delete
//! [--timeout D]`: watches the resource until the condition holds (in any status key) or it is
//! gone; exit 0 when met, 1 on timeout, saying what it last saw.

use std::time::Duration;

use proto::client::WatchUpdate;
use proto::client::describe;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Resource, WatchListRequest};

use crate::cli::WaitArgs;
use crate::session::Session;
use crate::{UsageError, output};

/// What `--for` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goal {
    /// A condition of this type in this state (`True`, `False` or `Unknown`).
    Condition {
        kind: String,
        state: String,
    },
    Deleted,
}

pub fn parse_goal(text: &str) -> Result<Goal, UsageError> {
    if text == "delete" {
        return Ok(Goal::Deleted);
    }
    let Some(rest) = text.strip_prefix("condition=") else {
        return Err(UsageError(format!(
            "--for {text:?}: use condition=TYPE, condition=TYPE=True|False|Unknown, or delete"
        )));
    };
    let (kind, state) = rest.split_once('=').unwrap_or((rest, "True"));
    let state = match state.to_ascii_lowercase().as_str() {
        "true" => "True",
        "false" => "False",
        "unknown" => "Unknown",
        other => {
            return Err(UsageError(format!(
                "--for {text:?}: the state {other:?} is not True, False or Unknown"
            )));
        }
    };
    if kind.is_empty() {
        return Err(UsageError(format!(
            "--for {text:?}: name the condition type"
        )));
    }
    Ok(Goal::Condition {
        kind: kind.to_owned(),
        state: state.to_owned(),
    })
}

/// Whether `resource` (`None`: gone) meets `goal`, and what it shows, for the timeout message.
pub fn check(goal: &Goal, resource: Option<&Resource>) -> (bool, String) {
    match (goal, resource) {
        (Goal::Deleted, None) => (true, "deleted".into()),
        (Goal::Deleted, Some(resource)) => (
            false,
            if proto::meta::is_marked_for_deletion(resource) {
                format!(
                    "marked for deletion, waiting for finalizers: {}",
                    proto::meta::finalizers(resource)
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                "present, not marked for deletion".into()
            },
        ),
        (Goal::Condition { kind, .. }, None) => (false, format!("not present (no {kind})")),
        (Goal::Condition { kind, state }, Some(resource)) => {
            let mut seen = Vec::new();
            for (key, status) in &resource.status {
                for condition in &status.conditions {
                    let label = describe::state_label(condition.state);
                    if &condition.r#type == kind && label == state {
                        return (true, format!("{kind}={label} (status {key})"));
                    }
                    if &condition.r#type == kind {
                        seen.push(format!(
                            "{kind}={label} (status {key}: {})",
                            condition.reason
                        ));
                    }
                }
            }
            if seen.is_empty() {
                (false, format!("no {kind} condition yet"))
            } else {
                (false, seen.join("; "))
            }
        }
    }
}

pub async fn run(session: &Session, args: &WaitArgs) -> anyhow::Result<u8> {
    let goal = parse_goal(&args.wait_for)?;
    let timeout = super::acl::parse_duration(&args.timeout)
        .map_err(|error| UsageError(format!("--timeout: {error}")))?;
    let id = session.id(&args.resource_type, &args.name).await?;
    let label = describe::id_label(&id);
    let mut current = session.client.read(&id).await?;
    let (met, mut last) = check(&goal, current.as_ref());
    if met {
        output::print(&format!("{label}: {last}\n"))?;
        return Ok(0);
    }
    let mut watcher = session.client.watcher(WatchListRequest {
        r#type: id.r#type.clone(),
        tenancy: id.tenancy.clone(),
        name_prefix: id.name.clone(),
        ..WatchListRequest::default()
    });
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let update = match tokio::time::timeout_at(deadline, watcher.next()).await {
            Err(_) => {
                let state = if current.is_some() {
                    "has not reached the condition"
                } else {
                    "does not exist"
                };
                crate::say!(
                    "timed out after {}: {label} {state}; last seen: {last}",
                    humanize(timeout)
                );
                return Ok(1);
            }
            Ok(None) => anyhow::bail!("the watch of {label} ended"),
            Ok(Some(update)) => update,
        };
        let WatchUpdate::Event(event) = update else {
            if let WatchUpdate::Failed(error) = update {
                return Err(anyhow::Error::new(error).context(format!("waiting for {label}")));
            }
            continue;
        };
        let is_ours = |resource: &Option<Resource>| {
            resource
                .as_ref()
                .and_then(|r| r.id.as_ref())
                .map(|i| &i.name)
                == Some(&id.name)
        };
        match event.event {
            Some(Event::Upsert(upsert)) if is_ours(&upsert.resource) => current = upsert.resource,
            Some(Event::Delete(delete)) if is_ours(&delete.resource) => current = None,
            _ => {}
        }
        let (met, seen) = check(&goal, current.as_ref());
        last = seen;
        if met {
            output::print(&format!("{label}: {last}\n"))?;
            return Ok(0);
        }
    }
}

fn humanize(duration: Duration) -> String {
    format!("{}s", duration.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(parse_goal("delete").expect("delete"), Goal::Deleted);
        assert_eq!(
            parse_goal("condition=Accepted").expect("default True"),
            Goal::Condition {
                kind: "Accepted".into(),
                state: "True".into()
            }
        );
        assert_eq!(
            parse_goal("condition=Accepted=false").expect("False"),
            Goal::Condition {
                kind: "Accepted".into(),
                state: "False".into()
            }
        );
        assert!(parse_goal("ready").is_err());
        assert!(parse_goal("condition=Accepted=maybe").is_err());
        assert!(parse_goal("condition=").is_err());
    }
}
