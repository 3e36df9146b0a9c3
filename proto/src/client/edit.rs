//! Editing one resource as a YAML document, the way `resctl edit` and the dashboard both do it:
//! the document (everything but status, which controllers own) opens in `$VISUAL`/`$EDITOR`,
//! and is saved with compare-and-swap on the version it was read at. When someone else wrote in
//! the meantime the round ends with a [`Problem::Conflict`] that shows the server's changes, and
//! the next round opens the server's version with the user's changes merged in; a document the
//! server rejects reopens with the error on top.
//!
//! An [`EditSession`] is a step function, so each front end drives the rounds its own way:
//! the CLI asks "edit again?" on stderr, the dashboard shows a dialog between rounds.

use std::io::Write as _;
use std::path::Path;

use crate::codec::{Codec, CodecError};
use crate::resource::v1::{Id, Resource};

use super::{Client, ClientError, describe};

/// How an edit ended.
#[derive(Debug, Clone, PartialEq)]
pub enum EditOutcome {
    Saved(Box<Resource>),
    /// The editor saved the same content: nothing written.
    Unchanged,
    /// The editor left an empty file.
    Cancelled,
}

/// Why a round did not save; the session is ready for another round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The resource changed on the server since it was read; `changes` is a line diff of the
    /// server's changes (`- ` before, `+ ` now).
    Conflict {
        changes: String,
        /// A line diff of the edit that was not saved (`- ` as read, `+ ` yours).
        yours: String,
        read_version: String,
        server_version: String,
    },
    /// The edited document was rejected (unreadable, or refused by the server).
    Rejected(String),
}

impl Problem {
    /// One sentence for a front end that will not retry.
    pub fn explain(&self, command: &str) -> String {
        match self {
            Problem::Conflict {
                changes,
                read_version,
                server_version,
                ..
            } => format!(
                "it changed on the server since it was read (version {read_version} → \
                 {server_version}):\n{changes}run `{command}` again to edit the current version"
            ),
            Problem::Rejected(message) => message.clone(),
        }
    }
}

/// What one round came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Round {
    Done(EditOutcome),
    Problem(Problem),
}

#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0} was deleted on the server while you edited; nothing was saved")]
    Gone(String),
    #[error("cannot run the editor {editor:?} (set $VISUAL or $EDITOR): {source}")]
    Spawn {
        editor: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the editor {editor:?} exited with {status}; nothing was saved")]
    EditorFailed { editor: String, status: String },
    #[error("cannot {action} the edit file: {source}")]
    File {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The editable document: everything but status (controllers own it).
pub fn editable_yaml(codec: &Codec, resource: &Resource) -> Result<String, CodecError> {
    let mut editable = resource.clone();
    editable.status.clear();
    codec.to_yaml(&editable)
}

/// An edit in progress: what the next round opens and what it is compared with.
#[derive(Debug, Clone)]
pub struct EditSession {
    id: Id,
    label: String,
    /// The document as read (the version the next save compares and swaps against).
    base: String,
    base_resource: Resource,
    /// What the editor opens with next.
    body: String,
    /// Comment lines above the document (the last round's problem).
    notes: String,
}

/// Keeps the user's text of an edit that did not save in a file that stays (never throw an
/// edit away, as kubectl keeps it) and returns its path; `None` for an empty text or when no
/// file can be written.
pub fn keep_edit(label: &str, text: &str) -> Option<std::path::PathBuf> {
    if text.trim().is_empty() {
        return None;
    }
    let mut file = tempfile::Builder::new()
        .prefix(&format!("resctl-edit-{}-", sanitize(label)))
        .suffix(".yaml")
        .tempfile()
        .ok()?;
    file.write_all(text.as_bytes()).ok()?;
    file.keep().ok().map(|(_, path)| path)
}

impl EditSession {
    /// The text the next round opens with (the user's last edit, after a problem).
    pub fn body(&self) -> &str {
        &self.body
    }

    pub fn new(codec: &Codec, resource: &Resource) -> Result<EditSession, CodecError> {
        let id = resource.id.clone().unwrap_or_default();
        let base = editable_yaml(codec, resource)?;
        let mut base_resource = resource.clone();
        base_resource.status.clear();
        Ok(EditSession {
            label: describe::id_label(&id),
            id,
            body: base.clone(),
            base,
            base_resource,
            notes: String::new(),
        })
    }

    pub fn id(&self) -> &Id {
        &self.id
    }

    /// `Kind/name` with tenancy, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The version the next save compares and swaps against.
    pub fn base_version(&self) -> &str {
        &self.base_resource.version
    }

    /// The text of the file the editor opens: a comment header, the last round's problem, the
    /// document.
    pub fn document(&self) -> String {
        format!(
            "# Editing {}. Lines starting with '#' are ignored.\n\
             # Save and quit to apply (compare-and-swap on `version`); an empty file cancels.\n{}#\n{}",
            self.label, self.notes, self.body
        )
    }

    /// Writes [`EditSession::document`] to a private temporary file, lets `editor` change it,
    /// and reads it back.
    pub fn edit_with(
        &self,
        editor: &mut dyn FnMut(&Path) -> Result<(), EditError>,
    ) -> Result<String, EditError> {
        let io = |action| move |source| EditError::File { action, source };
        let mut file = tempfile::Builder::new()
            .prefix(&format!("resd-edit-{}-", sanitize(&self.id.name)))
            .suffix(".yaml")
            .tempfile()
            .map_err(io("create"))?;
        file.write_all(self.document().as_bytes())
            .and_then(|()| file.flush())
            .map_err(io("write"))?;
        editor(file.path())?;
        std::fs::read_to_string(file.path()).map_err(io("read back"))
    }

    /// Takes the editor's text: saves it with compare-and-swap, or says why not (and prepares
    /// the next round: the error on top, or after a conflict the server's version with these
    /// changes merged in).
    pub async fn submit(
        &mut self,
        client: &Client,
        codec: &Codec,
        edited: &str,
    ) -> Result<Round, EditError> {
        let edited = strip_comments(edited);
        if edited.trim().is_empty() {
            return Ok(Round::Done(EditOutcome::Cancelled));
        }
        if edited.trim() == self.base.trim() {
            return Ok(Round::Done(EditOutcome::Unchanged));
        }
        self.body = edited.clone();
        let parsed = match codec.read_yaml(&edited).as_slice() {
            [Ok(parsed)] => parsed.clone(),
            [Err(error)] => {
                return Ok(self.rejected(format!("the document is not valid: {}", error.message)));
            }
            _ => return Ok(self.rejected("the file must hold exactly one document".into())),
        };
        let parsed_id = parsed.id.clone().unwrap_or_default();
        if parsed_id.name != self.id.name || parsed_id.r#type != self.id.r#type {
            return Ok(self.rejected(
                "the type and name cannot be changed by edit (apply a new resource and delete \
                 the old one)"
                    .into(),
            ));
        }
        let mut desired = parsed.clone();
        desired.status.clear();
        desired.generation.clear();
        match client.write(&desired).await {
            Ok(saved) => Ok(Round::Done(EditOutcome::Saved(Box::new(saved)))),
            Err(ClientError::Conflict { .. }) => {
                let mut lookup = self.id.clone();
                lookup.uid.clear();
                let current = client
                    .read(&lookup)
                    .await?
                    .ok_or_else(|| EditError::Gone(self.label.clone()))?;
                let current_yaml = editable_yaml(codec, &current)?;
                let mut theirs = current.clone();
                theirs.status.clear();
                // Diffs with defaults written out: a field set back to its default shows as
                // `- x: true` / `+ x: false`, not as a line gone.
                let full = |resource: &Resource| codec.to_yaml_with_defaults(resource);
                let base_full = full(&self.base_resource)?;
                let changes = line_diff(&base_full, &full(&theirs)?);
                let mut mine = desired.clone();
                mine.generation = self.base_resource.generation.clone();
                let problem = Problem::Conflict {
                    changes: changes.clone(),
                    yours: line_diff(&base_full, &full(&mine)?),
                    read_version: desired.version.clone(),
                    server_version: current.version.clone(),
                };
                self.notes = commented(&format!(
                    "{} changed on the server while you edited (version {} → {}):\n{changes}\
                     Below: the server's version with your changes merged in (yours win where \
                     both changed).",
                    self.label, desired.version, current.version
                ));
                let mut merged = three_way_merge(
                    &codec.to_value(&self.base_resource)?,
                    &codec.to_value(&parsed)?,
                    &codec.to_value(&theirs)?,
                );
                if let Some(object) = merged.as_object_mut() {
                    object.insert("version".into(), current.version.clone().into());
                }
                self.body = serde_yaml_ng::to_string(&merged).map_err(|error| {
                    CodecError::new(format!("cannot render the merged document: {error}"))
                })?;
                self.base = current_yaml;
                self.base_resource = theirs;
                Ok(Round::Problem(problem))
            }
            Err(error) => Ok(self.rejected(format!("not saved: {error}"))),
        }
    }

    fn rejected(&mut self, message: String) -> Round {
        self.notes = commented(&format!("error: {message}"));
        Round::Problem(Problem::Rejected(message))
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect()
}

/// Drops comment lines (the header and notes the session adds).
pub fn strip_comments(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect()
}

fn commented(text: &str) -> String {
    text.lines().map(|line| format!("# {line}\n")).collect()
}

/// Merges my changes (base → mine) into theirs (base → theirs), object by object; where both
/// changed the same value, mine wins.
pub fn three_way_merge(
    base: &serde_json::Value,
    mine: &serde_json::Value,
    theirs: &serde_json::Value,
) -> serde_json::Value {
    use serde_json::Value;
    if mine == base {
        return theirs.clone();
    }
    if theirs == base {
        return mine.clone();
    }
    match (base, mine, theirs) {
        (Value::Object(base), Value::Object(mine), Value::Object(theirs)) => {
            let mut merged = serde_json::Map::new();
            let keys: std::collections::BTreeSet<&String> = base
                .keys()
                .chain(mine.keys())
                .chain(theirs.keys())
                .collect();
            for key in keys {
                let missing = Value::Null;
                let value = three_way_merge(
                    base.get(key).unwrap_or(&missing),
                    mine.get(key).unwrap_or(&missing),
                    theirs.get(key).unwrap_or(&missing),
                );
                if !value.is_null() {
                    merged.insert(key.clone(), value);
                }
            }
            Value::Object(merged)
        }
        _ => mine.clone(),
    }
}

/// A minimal line diff (`- old`, `+ new`), longest-common-subsequence based.
pub fn line_diff(old: &str, new: &str) -> String {
    let old: Vec<&str> = old.lines().collect();
    let new: Vec<&str> = new.lines().collect();
    if old.len() * new.len() > 4_000_000 {
        return "  (too large to diff)\n".into();
    }
    let mut table = vec![vec![0u32; new.len() + 1]; old.len() + 1];
    for i in (0..old.len()).rev() {
        for j in (0..new.len()).rev() {
            table[i][j] = if old[i] == new[j] {
                table[i + 1][j + 1] + 1
            } else {
                table[i + 1][j].max(table[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut text) = (0, 0, String::new());
    while i < old.len() || j < new.len() {
        if i < old.len() && j < new.len() && old[i] == new[j] {
            i += 1;
            j += 1;
        } else if j < new.len() && (i == old.len() || table[i][j + 1] >= table[i + 1][j]) {
            text.push_str(&format!("+ {}\n", new[j]));
            j += 1;
        } else {
            text.push_str(&format!("- {}\n", old[i]));
            i += 1;
        }
    }
    text
}

/// The editor a user asked for: `$VISUAL`, else `$EDITOR`, else `vi`.
pub fn preferred_editor() -> String {
    ["VISUAL", "EDITOR"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|editor| !editor.trim().is_empty())
        .unwrap_or_else(|| "vi".to_owned())
}

/// Runs the preferred editor on `path` through the shell, as git does, so editors with
/// arguments (`code --wait`) work. Blocks until it exits.
pub fn run_editor(path: &Path) -> Result<(), EditError> {
    let editor = preferred_editor();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("resd-editor")
        .arg(path)
        .status()
        .map_err(|source| EditError::Spawn {
            editor: editor.clone(),
            source,
        })?;
    if !status.success() {
        return Err(EditError::EditorFailed {
            editor,
            status: status.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_shows_removed_and_added_lines() {
        let diff = line_diff("a\nb\nc\n", "a\nB\nc\nd\n");
        assert_eq!(diff, "+ B\n- b\n+ d\n");
        assert_eq!(line_diff("same\n", "same\n"), "");
    }

    #[test]
    fn a_three_way_merge_keeps_both_sides_changes() {
        let base = serde_json::json!({"data": {"name": "Ed", "position": "CEO"}, "version": "3"});
        let mine = serde_json::json!({"data": {"name": "Ed", "position": "CFO"}, "version": "3"});
        let theirs =
            serde_json::json!({"data": {"name": "Edward", "position": "CEO"}, "version": "5"});
        assert_eq!(
            three_way_merge(&base, &mine, &theirs),
            serde_json::json!({"data": {"name": "Edward", "position": "CFO"}, "version": "5"})
        );
    }

    #[test]
    fn comment_lines_are_dropped() {
        assert_eq!(
            strip_comments("# header\nname: x\n  # indented\n"),
            "name: x\n"
        );
    }

    #[test]
    fn a_conflict_explains_itself_to_scripts() {
        let problem = Problem::Conflict {
            changes: "- a\n+ b\n".into(),
            yours: String::new(),
            read_version: "3".into(),
            server_version: "5".into(),
        };
        assert_eq!(
            problem.explain("resctl edit"),
            "it changed on the server since it was read (version 3 → 5):\n- a\n+ b\nrun \
             `resctl edit` again to edit the current version"
        );
    }
}
