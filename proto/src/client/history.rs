//! Reading an object's history (DESIGN §18) the way every front end shows it: each version as
//! leaf fields (`data.title`, `metadata.team`, `status.<key>.conditions[0].state`), what a
//! version changed from the one before, and blame — each field with the version and actor that
//! last changed it. resctl's `history`/`blame` and the dashboard's history pane share it.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::codec::{Codec, CodecError};
use crate::resource::v1::{HistoryEntry, Resource, history_entry};

/// A version's data, metadata, owner and statuses as leaf paths.
pub fn leaves(codec: &Codec, resource: &Resource) -> Result<BTreeMap<String, Value>, CodecError> {
    let value = codec.to_value(resource)?;
    let mut out = BTreeMap::new();
    if let Value::Object(fields) = value {
        for key in ["owner", "metadata", "data", "status"] {
            if let Some(field) = fields.get(key) {
                flatten(key, field, &mut out);
            }
        }
    }
    Ok(out)
}

/// `value` as leaf paths under `path` (objects by `.key`, lists by `[i]`; nulls left out).
pub fn flatten(path: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(fields) if !fields.is_empty() => {
            for (key, field) in fields {
                flatten(&format!("{path}.{key}"), field, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (index, item) in items.iter().enumerate() {
                flatten(&format!("{path}[{index}]"), item, out);
            }
        }
        Value::Null => {}
        other => {
            out.insert(path.to_owned(), other.clone());
        }
    }
}

/// The paths whose value differs between two versions (added, changed or removed), sorted.
pub fn changed(before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) -> Vec<String> {
    let mut paths: Vec<String> = after
        .iter()
        .filter(|(path, value)| before.get(*path) != Some(value))
        .map(|(path, _)| path.clone())
        .chain(
            before
                .keys()
                .filter(|path| !after.contains_key(*path))
                .cloned(),
        )
        .collect();
    paths.sort();
    paths
}

/// One field's change: `+` added, `-` removed, `~` changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldChange {
    pub path: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl FieldChange {
    /// `~ data.genre: GENRE_JAZZ → GENRE_BLUES` (`+`/`-` for a field added or removed).
    pub fn line(&self) -> String {
        match (&self.before, &self.after) {
            (None, Some(after)) => format!("+ {}: {}", self.path, text(after)),
            (Some(before), None) => format!("- {}: {}", self.path, text(before)),
            (Some(before), Some(after)) => {
                format!("~ {}: {} → {}", self.path, text(before), text(after))
            }
            (None, None) => format!("  {}", self.path),
        }
    }
}

/// A value as one line: strings as they are, the rest as JSON.
pub fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// What `after` changed from `before`, field by field.
pub fn field_changes(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> Vec<FieldChange> {
    changed(before, after)
        .into_iter()
        .map(|path| FieldChange {
            before: before.get(&path).cloned(),
            after: after.get(&path).cloned(),
            path,
        })
        .collect()
}

/// `write`, `status` or `delete`.
pub fn operation_name(entry: &HistoryEntry) -> &'static str {
    match history_entry::Operation::try_from(entry.operation) {
        Ok(history_entry::Operation::Write) => "write",
        Ok(history_entry::Operation::Status) => "status",
        Ok(history_entry::Operation::Delete) => "delete",
        _ => "?",
    }
}

/// An entry's time, RFC 3339 (seconds).
pub fn time_of(entry: &HistoryEntry) -> String {
    entry
        .time
        .as_ref()
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// One field of a blame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Blamed {
    pub field: String,
    pub value: Value,
    pub version: String,
    pub actor: String,
    pub time: String,
}

/// Each field of the newest version kept (of `entries`, newest first) with the version and
/// actor that last changed it; fields unchanged since the oldest version kept are that
/// version's.
pub fn blame(codec: &Codec, entries: &[HistoryEntry]) -> Result<Vec<Blamed>, CodecError> {
    let mut fields: BTreeMap<String, Blamed> = BTreeMap::new();
    for entry in entries.iter().rev() {
        if entry.operation == history_entry::Operation::Delete as i32 {
            continue;
        }
        let now = leaves(codec, &entry.resource.clone().unwrap_or_default())?;
        fields.retain(|path, _| now.contains_key(path));
        for (path, value) in now {
            let unchanged = fields
                .get(&path)
                .is_some_and(|blamed| blamed.value == value);
            if !unchanged {
                fields.insert(
                    path.clone(),
                    Blamed {
                        field: path,
                        value,
                        version: entry.version.clone(),
                        actor: entry.actor.clone(),
                        time: time_of(entry),
                    },
                );
            }
        }
    }
    Ok(fields.into_values().collect())
}

/// What each entry (newest first) changed from the one before it; the oldest kept and a
/// deletion change nothing.
pub fn changes(
    codec: &Codec,
    entries: &[HistoryEntry],
) -> Result<Vec<Vec<FieldChange>>, CodecError> {
    let mut out = Vec::with_capacity(entries.len());
    let mut previous: Option<BTreeMap<String, Value>> = None;
    for entry in entries.iter().rev() {
        let now = leaves(codec, &entry.resource.clone().unwrap_or_default())?;
        let deletion = entry.operation == history_entry::Operation::Delete as i32;
        out.push(match (&previous, deletion) {
            (Some(before), false) => field_changes(before, &now),
            _ => Vec::new(),
        });
        previous = Some(now);
    }
    out.reverse();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(path, value)| ((*path).to_owned(), value.clone()))
            .collect()
    }

    #[test]
    fn changes_name_every_path_added_changed_or_removed() {
        let before = leaf(&[
            ("data.title", Value::from("a")),
            ("metadata.team", Value::from("x")),
        ]);
        let after = leaf(&[
            ("data.title", Value::from("b")),
            ("data.year", Value::from(1959)),
        ]);
        assert_eq!(
            changed(&before, &after),
            vec!["data.title", "data.year", "metadata.team"]
        );
        let lines: Vec<String> = field_changes(&before, &after)
            .iter()
            .map(FieldChange::line)
            .collect();
        assert_eq!(
            lines,
            vec![
                "~ data.title: a → b",
                "+ data.year: 1959",
                "- metadata.team: x"
            ]
        );
    }

    #[test]
    fn nested_values_flatten_to_their_paths() {
        let mut out = BTreeMap::new();
        flatten(
            "data",
            &serde_json::json!({"a": {"b": 1}, "list": [1, {"c": "x"}], "none": null}),
            &mut out,
        );
        assert_eq!(
            out.keys().cloned().collect::<Vec<_>>(),
            vec!["data.a.b", "data.list[0]", "data.list[1].c"]
        );
    }
}
