//! `resctl edit TYPE NAME`: open the resource as YAML in `$VISUAL`/`$EDITOR` (else `vi`), then
//! save it with compare-and-swap on the version it was read at. When someone else wrote in the
//! meantime, show what changed on the server and offer to edit again on top of it; a document
//! the server rejects is reopened with the error (interactive) or reported (scripts).

use std::path::Path;

use anyhow::Context as _;
use proto::client::{ClientError, describe};
use proto::codec::Codec;
use proto::resource::v1::Resource;

use crate::cli::NamedArgs;
use crate::output;
use crate::session::Session;

#[derive(Debug, Clone, PartialEq)]
pub enum EditOutcome {
    Saved(Box<Resource>),
    /// The editor saved the same content: nothing written.
    Unchanged,
    /// The editor left an empty file.
    Cancelled,
}

/// What the user is asked when something went wrong between edit rounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The resource changed on the server; the text is a diff of the server's changes.
    Conflict(String),
    /// The edited document was rejected (unreadable or refused by the server).
    Rejected(String),
}

/// Most edit rounds before giving up (each round is one editor session).
const MAX_ROUNDS: usize = 10;

/// The editable document: everything but status (controllers own it).
pub fn editable_yaml(codec: &Codec, resource: &Resource) -> anyhow::Result<String> {
    let mut editable = resource.clone();
    editable.status.clear();
    Ok(codec.to_yaml(&editable)?)
}

fn strip_comments(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect()
}

fn commented(text: &str) -> String {
    text.lines().map(|line| format!("# {line}\n")).collect()
}

/// Runs the edit loop. `editor` edits the file in place; `retry` decides whether to reopen
/// after a problem (a script says no).
pub async fn edit(
    session: &Session,
    type_name: &str,
    name: &str,
    editor: &mut dyn FnMut(&Path) -> anyhow::Result<()>,
    retry: &mut dyn FnMut(&Problem) -> bool,
) -> anyhow::Result<EditOutcome> {
    let codec = session.codec().await?;
    let resource = super::get::read(session, type_name, name).await?;
    let id = resource.id.clone().unwrap_or_default();
    let label = describe::id_label(&id);
    let mut base = editable_yaml(codec, &resource)?;
    let mut base_resource = resource.clone();
    base_resource.status.clear();
    let mut body = base.clone();
    let mut notes = String::new();
    for _ in 0..MAX_ROUNDS {
        let header = format!(
            "# Editing {label}. Lines starting with '#' are ignored.\n\
             # Save and quit to apply (compare-and-swap on `version`); an empty file cancels.\n{notes}#\n"
        );
        let file = tempfile::Builder::new()
            .prefix(&format!("resctl-edit-{name}-"))
            .suffix(".yaml")
            .tempfile()
            .context("cannot create a temporary file to edit")?;
        std::fs::write(file.path(), format!("{header}{body}"))?;
        editor(file.path())?;
        let edited = std::fs::read_to_string(file.path())
            .with_context(|| format!("cannot read back {}", file.path().display()))?;
        let edited = strip_comments(&edited);
        if edited.trim().is_empty() {
            return Ok(EditOutcome::Cancelled);
        }
        if edited.trim() == base.trim() {
            return Ok(EditOutcome::Unchanged);
        }
        body = edited.clone();
        let parsed = match codec.read_yaml(&edited).as_slice() {
            [Ok(parsed)] => parsed.clone(),
            [Err(error)] => {
                let problem =
                    Problem::Rejected(format!("the document is not valid: {}", error.message));
                if retry(&problem) {
                    notes = commented(&format!("error: {}", error.message));
                    continue;
                }
                anyhow::bail!("edit of {label} not saved: {}", error.message);
            }
            _ => {
                let problem = Problem::Rejected("the file must hold exactly one document".into());
                if retry(&problem) {
                    notes = commented("error: the file must hold exactly one document");
                    continue;
                }
                anyhow::bail!("edit of {label} not saved: the file must hold exactly one document");
            }
        };
        let mut desired = parsed.clone();
        let parsed_id = desired.id.clone().unwrap_or_default();
        if parsed_id.name != id.name || parsed_id.r#type != id.r#type {
            let message = "the type and name cannot be changed by edit (apply a new resource and delete the old one)";
            if retry(&Problem::Rejected(message.into())) {
                notes = commented(&format!("error: {message}"));
                continue;
            }
            anyhow::bail!("edit of {label} not saved: {message}");
        }
        desired.status.clear();
        desired.generation.clear();
        match session.client.write(&desired).await {
            Ok(saved) => return Ok(EditOutcome::Saved(Box::new(saved))),
            Err(ClientError::Conflict(_)) => {
                let current = super::get::read(session, type_name, name).await?;
                let current_yaml = editable_yaml(codec, &current)?;
                let changes = line_diff(&base, &current_yaml);
                if retry(&Problem::Conflict(changes.clone())) {
                    notes = commented(&format!(
                        "{label} changed on the server while you edited (version {} → {}):\n{changes}\
                         Below: the server's version with your changes merged in (yours win where both changed).",
                        desired.version, current.version
                    ));
                    let mut theirs = current.clone();
                    theirs.status.clear();
                    let mut merged = three_way_merge(
                        &codec.to_value(&base_resource)?,
                        &codec.to_value(&parsed)?,
                        &codec.to_value(&theirs)?,
                    );
                    if let Some(object) = merged.as_object_mut() {
                        object.insert("version".into(), current.version.clone().into());
                    }
                    body = serde_yaml_ng::to_string(&merged)?;
                    base = current_yaml;
                    base_resource = theirs;
                    continue;
                }
                anyhow::bail!(
                    "edit of {label} not saved: it changed on the server since it was read (version {} → {}):\n{changes}run `resctl edit` again to edit the current version",
                    desired.version,
                    current.version
                );
            }
            Err(error) => {
                let message = error.to_string();
                if retry(&Problem::Rejected(message.clone())) {
                    notes = commented(&format!("error from the server: {message}"));
                    continue;
                }
                anyhow::bail!("edit of {label} not saved: {message}");
            }
        }
    }
    anyhow::bail!("edit of {label} abandoned after {MAX_ROUNDS} rounds")
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

/// Runs `$VISUAL`/`$EDITOR` (else `vi`) through the shell, as git does, so editors with
/// arguments (`code --wait`) work.
pub fn run_editor(path: &Path) -> anyhow::Result<()> {
    let editor = std::env::var("VISUAL")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .or_else(|| {
            std::env::var("EDITOR")
                .ok()
                .filter(|e| !e.trim().is_empty())
        })
        .unwrap_or_else(|| "vi".to_owned());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("resctl-editor")
        .arg(path)
        .status()
        .with_context(|| format!("cannot run the editor {editor:?} (set $EDITOR)"))?;
    if !status.success() {
        anyhow::bail!("the editor {editor:?} exited with {status}; nothing was saved");
    }
    Ok(())
}

pub async fn run(session: &Session, args: &NamedArgs) -> anyhow::Result<u8> {
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let mut retry = |problem: &Problem| {
        if !interactive {
            return false;
        }
        match problem {
            Problem::Conflict(changes) => {
                eprintln!("the resource changed on the server while you edited:\n{changes}");
            }
            Problem::Rejected(message) => eprintln!("error: {message}"),
        }
        crate::session::confirm("edit again?", true)
    };
    match edit(
        session,
        &args.resource_type,
        &args.name,
        &mut run_editor,
        &mut retry,
    )
    .await?
    {
        EditOutcome::Saved(saved) => output::print(&format!(
            "{} saved (version {})\n",
            output::resource_name(&saved),
            saved.version
        ))?,
        EditOutcome::Unchanged => output::print("no changes; nothing saved\n")?,
        EditOutcome::Cancelled => output::print("edit cancelled (empty file); nothing saved\n")?,
    }
    Ok(0)
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
}
