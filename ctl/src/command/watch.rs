//! `resctl watch TYPE [PREFIX]`: one line per event (time, kind, version, id, a short summary),
//! NDJSON with `-o json`. The stream resumes after restarts and leader changes; when the server
//! cannot resume it relists and says so (stderr, and a `relisting` line in JSON).

use std::time::{SystemTime, UNIX_EPOCH};

use proto::client::{WatchUpdate, describe};
use proto::codec::Codec;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Resource, WatchEvent, WatchListRequest};
use serde::Serialize;

use crate::cli::WatchArgs;
use crate::output::{self, OutputFormat};
use crate::session::Session;

/// One line of `-o json` output.
#[derive(Debug, Clone, Serialize)]
pub struct WatchLine {
    pub time: String,
    /// `upsert`, `delete`, `end_of_snapshot`, `relisting`, `resumed` or `disconnected`.
    pub event: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Who made the change (a token's accessor, `controller/<name>`, `anonymous` with ACLs
    /// off); absent for the listing and for changes recorded without one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub actor: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `HH:MM:SS.mmm` in UTC.
pub fn clock(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        since.subsec_millis()
    )
}

fn summary(resource: &Resource) -> String {
    let mut parts = Vec::new();
    if let Some(condition) = describe::worst_condition(resource) {
        parts.push(describe::condition_label(condition));
    }
    let finalizers: Vec<&str> = proto::meta::finalizers(resource).into_iter().collect();
    if !finalizers.is_empty() {
        parts.push(format!("finalizers={}", finalizers.join(",")));
    }
    if proto::meta::is_marked_for_deletion(resource) {
        parts.push("deleting".into());
    }
    parts.join("  ")
}

/// Renders an event as a human line (with who made the change when `show_actor`) or a JSON
/// object line (which always carries the actor).
pub fn render_event(
    codec: &Codec,
    event: &WatchEvent,
    format: OutputFormat,
    now: SystemTime,
    show_actor: bool,
) -> anyhow::Result<Option<String>> {
    let (kind, resource) = match &event.event {
        Some(Event::Upsert(upsert)) => ("upsert", upsert.resource.as_ref()),
        Some(Event::Delete(delete)) => ("delete", delete.resource.as_ref()),
        Some(Event::EndOfSnapshot(_)) => ("end_of_snapshot", None),
        Some(Event::Bookmark(_)) | None => return Ok(None),
    };
    match format {
        OutputFormat::Json | OutputFormat::JsonPath => {
            let line = WatchLine {
                time: prost_types::Timestamp::from(now).to_string(),
                event: kind.to_owned(),
                version: event.version.clone(),
                actor: event.actor.clone(),
                resource: resource.map(|r| codec.to_value(r)).transpose()?,
                message: None,
            };
            Ok(Some(output::json_line(&line)?))
        }
        OutputFormat::Name => Ok(resource.map(|r| format!("{}\n", output::resource_name(r)))),
        _ => {
            let Some(resource) = resource else {
                return Ok(Some(format!(
                    "{}  --------  {:<8}  (listed; watching for changes)\n",
                    clock(now),
                    event.version
                )));
            };
            let id = resource.id.clone().unwrap_or_default();
            let mut line = format!(
                "{}  {:<8}  {:<8}  ",
                clock(now),
                kind.to_uppercase(),
                event.version,
            );
            if show_actor {
                let actor = if event.actor.is_empty() {
                    "-"
                } else {
                    event.actor.as_str()
                };
                line.push_str(&format!("{actor:<24}  "));
            }
            line.push_str(&describe::id_label(&id));
            if kind == "upsert" {
                let summary = summary(resource);
                if !summary.is_empty() {
                    line.push_str("  ");
                    line.push_str(&summary);
                }
            }
            if format == OutputFormat::Yaml {
                line.push('\n');
                line.push_str(&codec.to_yaml(resource)?);
                line.push_str("---");
            }
            line.push('\n');
            Ok(Some(line))
        }
    }
}

fn notice(format: OutputFormat, event: &str, message: String) -> anyhow::Result<()> {
    crate::say!("resctl: {message}");
    if format == OutputFormat::Json {
        // Not for jsonpath: a template describes events, and a notice is not one.
        let line = WatchLine {
            time: prost_types::Timestamp::from(SystemTime::now()).to_string(),
            event: event.to_owned(),
            version: String::new(),
            actor: String::new(),
            resource: None,
            message: Some(message),
        };
        output::print(&(serde_json::to_string(&line)? + "\n"))?;
    }
    Ok(())
}

pub async fn run(session: &Session, args: &WatchArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let info = session.resolve_type(&args.resource_type).await?;
    let request = WatchListRequest {
        r#type: info.r#type.clone(),
        tenancy: Some(session.tenancy(info.scope(), args.all_namespaces)),
        name_prefix: args.name_prefix.clone().unwrap_or_default(),
        since_version: args.from_version.clone().unwrap_or_default(),
        selector: args.selector.clone().unwrap_or_default(),
        bookmarks: false,
        shard: None,
    };
    let mut watcher = session.client.watcher(request);
    let mut seen: u64 = 0;
    // Whether the next EndOfSnapshot ends a listing (a fresh watch or a relist), rather than a
    // resume, which lists nothing and was already announced.
    let mut listing = args.from_version.is_none();
    loop {
        if args.count.is_some_and(|count| seen >= count) {
            return Ok(0);
        }
        let update = tokio::select! {
            update = watcher.next() => update,
            _ = tokio::signal::ctrl_c() => return Ok(0),
        };
        // A deprecated version's warning, as soon as the stream is open.
        session.print_warnings();
        match update {
            None => return Ok(1),
            Some(WatchUpdate::Event(event)) => {
                let end_of_snapshot = matches!(event.event, Some(Event::EndOfSnapshot(_)));
                let counts = !end_of_snapshot;
                let human = !matches!(
                    session.output,
                    OutputFormat::Json | OutputFormat::JsonPath | OutputFormat::Name
                );
                if end_of_snapshot && !std::mem::replace(&mut listing, false) && human {
                    // A resume (or --from-version) lists nothing: say it caught up instead.
                    output::print(&format!(
                        "{}  --------  {:<8}  (caught up; watching for changes)\n",
                        clock(SystemTime::now()),
                        event.version
                    ))?;
                    continue;
                }
                if let Some(line) = render_event(
                    codec,
                    &event,
                    session.output,
                    SystemTime::now(),
                    args.show_actor,
                )? {
                    output::print(&line)?;
                }
                if counts {
                    seen += 1;
                }
            }
            Some(WatchUpdate::Disconnected { error, retry_in }) => notice(
                session.output,
                "disconnected",
                match retry_in.as_millis() {
                    0 => format!("watch disconnected ({error}); retrying now"),
                    ms @ 1..1000 => format!("watch disconnected ({error}); retrying in {ms} ms"),
                    _ => format!(
                        "watch disconnected ({error}); retrying in {:.1} s",
                        retry_in.as_secs_f64()
                    ),
                },
            )?,
            Some(WatchUpdate::Resumed {
                since_version,
                server,
            }) => notice(
                session.output,
                "resumed",
                format!(
                    "watch resumed after version {since_version} on {server}; nothing was missed"
                ),
            )?,
            Some(WatchUpdate::Relisting { reason }) => {
                listing = true;
                notice(
                    session.output,
                    "relisting",
                    format!("watch could not resume ({reason}); listing everything again"),
                )?
            }
            Some(WatchUpdate::Failed(error)) => {
                return Err(anyhow::Error::new(error).context("watch failed"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_shows_utc_time_of_day_with_milliseconds() {
        let time = UNIX_EPOCH + std::time::Duration::from_millis(86_400_000 + 3_723_045);
        assert_eq!(clock(time), "01:02:03.045");
    }
}
