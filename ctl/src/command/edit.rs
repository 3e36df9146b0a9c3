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
/// after a problem (a script says no; a person gets the editor again at once, with the problem
/// on top, as DESIGN §9 says).
///
/// After a rejected document, quitting the editor without a change ends the edit (the text is
/// kept and its path given). After a conflict the editor opens the server's version with the
/// user's changes merged in, and saving it as it is saves that.
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
    let mut rejected: Option<Problem> = None;
    for _ in 0..MAX_ROUNDS {
        let edited = edit.edit_with(editor)?;
        if let Some(problem) = &rejected
            && proto::client::edit::strip_comments(&edited).trim() == edit.body().trim()
        {
            anyhow::bail!(
                "edit of {} not saved: the editor was closed without a change after: {}{}",
                edit.label(),
                problem.explain("resctl edit"),
                keep_edit(name, edit.body())
            );
        }
        match edit.submit(&session.client, codec, &edited).await? {
            Round::Done(outcome) => return Ok(outcome),
            Round::Problem(problem) => {
                // What the user would apply next: their text after a rejection; after a
                // conflict, the server's version with their changes merged in (so `apply -f`
                // of the kept file compares against the current version).
                if !retry(&problem) {
                    anyhow::bail!(
                        "edit of {} not saved: {}{}",
                        edit.label(),
                        problem.explain("resctl edit"),
                        keep_edit(name, edit.body())
                    );
                }
                rejected = matches!(problem, Problem::Rejected(_)).then_some(problem);
            }
        }
    }
    anyhow::bail!(
        "edit of {} abandoned after {MAX_ROUNDS} rounds{}",
        edit.label(),
        keep_edit(name, edit.body())
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
            Problem::Conflict { changes, .. } => crate::say!(
                "the resource changed on the server while you edited:\n{changes}\
                 reopening the editor on the server's version with your changes merged in"
            ),
            Problem::Rejected(message) => crate::say!(
                "error: {message}\nreopening the editor with the error on top (close it without a change to give up)"
            ),
        }
        true
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
