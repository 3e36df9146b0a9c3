//! `resctl edit TYPE NAME`: open the resource as YAML in `$VISUAL`/`$EDITOR` (else `vi`), then
//! save it with compare-and-swap on the version it was read at. When someone else wrote in the
//! meantime, show what changed on the server and offer to edit again on top of it; a document
//! the server rejects is reopened with the error (interactive) or reported (scripts). The rounds
//! themselves are `proto::client::edit`, shared with the dashboard.

use std::path::Path;

use proto::client::edit::{EditError, EditSession, Round};
pub use proto::client::edit::{EditOutcome, Problem, run_editor};

use crate::cli::NamedArgs;
use crate::output;
use crate::session::Session;

/// Most edit rounds before giving up (each round is one editor session).
const MAX_ROUNDS: usize = 10;

/// Runs the edit loop. `editor` edits the file in place; `retry` decides whether to reopen
/// after a problem (a script says no).
pub async fn edit(
    session: &Session,
    type_name: &str,
    name: &str,
    editor: &mut dyn FnMut(&Path) -> Result<(), EditError>,
    retry: &mut dyn FnMut(&Problem) -> bool,
) -> anyhow::Result<EditOutcome> {
    let codec = session.codec().await?;
    let resource = super::get::read(session, type_name, name).await?;
    let mut edit = EditSession::new(codec, &resource)?;
    let mut last_edit = String::new();
    for _ in 0..MAX_ROUNDS {
        let edited = edit.edit_with(editor)?;
        last_edit = edited.clone();
        match edit.submit(&session.client, codec, &edited).await? {
            Round::Done(outcome) => return Ok(outcome),
            Round::Problem(problem) => {
                if !retry(&problem) {
                    anyhow::bail!(
                        "edit of {} not saved: {}{}",
                        edit.label(),
                        problem.explain("resctl edit"),
                        keep_edit(name, &last_edit)
                    );
                }
            }
        }
    }
    anyhow::bail!(
        "edit of {} abandoned after {MAX_ROUNDS} rounds{}",
        edit.label(),
        keep_edit(name, &last_edit)
    )
}

/// Where the user's text of an edit that did not save is kept, as a sentence (empty when it
/// could not be kept).
fn keep_edit(name: &str, text: &str) -> String {
    match proto::client::edit::keep_edit(name, text) {
        Some(path) => format!(
            "\nyour edit is kept in {}: fix it and `resctl apply -f {}` (or edit again)",
            path.display(),
            path.display()
        ),
        None => String::new(),
    }
}

pub async fn run(session: &Session, args: &NamedArgs) -> anyhow::Result<u8> {
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let mut retry = |problem: &Problem| {
        if !interactive {
            return false;
        }
        match problem {
            Problem::Conflict { changes, .. } => {
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
