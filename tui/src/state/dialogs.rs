//! The input line and the dialogs that take the keys while open.

use proto::client::edit::{EditSession, Problem};
use proto::resource::v1::Id;

use super::SnapshotPurpose;
use crate::model::ResRef;

/// What is typed on the bottom line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputKind {
    /// `:` — a type to jump to, or a screen name.
    Command,
    /// `/` — narrows the resource table as you type.
    Filter,
    /// `/` on the events screen — narrows the event tail as you type.
    EventFilter,
    /// The snapshot file to save to or open.
    SnapshotPath(SnapshotPurpose),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub kind: InputKind,
    pub text: String,
}

/// A choice in a confirmation dialog; every dialog starts on `Cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    #[default]
    Cancel,
    Confirm,
}

impl Choice {
    pub fn toggled(self) -> Choice {
        match self {
            Choice::Cancel => Choice::Confirm,
            Choice::Confirm => Choice::Cancel,
        }
    }
}

/// What a delete would run into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletePlan {
    pub at: ResRef,
    pub id: Id,
    pub version: String,
    pub label: String,
    pub finalizers: Vec<String>,
    /// `Kind/name` of each direct child (deleted with it, after their own finalizers).
    pub children: Vec<String>,
    /// The controllers that release its finalizers, where they run.
    pub controllers: Vec<String>,
    /// Finalizers no controller releases.
    pub unowned: Vec<String>,
    pub choice: Choice,
}

/// An overlay on top of the screen; it takes the keys while open.
#[derive(Debug, Clone)]
pub enum Dialog {
    Help {
        scroll: u16,
    },
    ConfirmDelete(Box<DeletePlan>),
    /// Hand leadership to `node` (at `api_addr`)?
    ConfirmTransfer {
        node: u64,
        api_addr: String,
        choice: Choice,
    },
    /// Why a resource marked for deletion is still there (recomputed live from the store).
    WhyStuck {
        at: ResRef,
    },
    /// An edit round that did not save: `e` edits again, `esc` gives up.
    EditProblem {
        session: Box<EditSession>,
        problem: Problem,
    },
    Message {
        title: String,
        text: String,
    },
}
