//! The snapshot stepper: save → inspect → confirm → restore → verify.

use super::Keys;
use crate::clock;
use crate::keymap::Action;
use crate::msg::{Effect, SnapshotMsg};
use crate::state::{Choice, Input, InputKind, SnapshotPurpose, SnapshotStep, State};

pub(super) const SNAPSHOT: Keys = Keys {
    move_by: |_, _| {},
    open: |_| {},
    back: |_| {},
    perform,
};

fn perform(state: &mut State, action: Action, effects: &mut Vec<Effect>) -> bool {
    match action {
        Action::SnapshotSave => match &state.snapshot {
            SnapshotStep::Saving { .. }
            | SnapshotStep::Opening { .. }
            | SnapshotStep::Restoring { .. }
            | SnapshotStep::Verifying { .. } => {
                state.flash_error("a snapshot step is under way; esc cancels it")
            }
            _ => {
                state.input = Some(Input {
                    kind: InputKind::SnapshotPath(SnapshotPurpose::Save),
                    text: format!("resd-{}.snap", clock::file_stamp(state.now)),
                })
            }
        },
        Action::SnapshotOpen => match &state.snapshot {
            SnapshotStep::Saving { .. }
            | SnapshotStep::Opening { .. }
            | SnapshotStep::Restoring { .. }
            | SnapshotStep::Verifying { .. } => {
                state.flash_error("a snapshot step is under way; esc cancels it")
            }
            step => {
                let text = snapshot_info(step)
                    .map(|info| info.path.display().to_string())
                    .unwrap_or_default();
                state.input = Some(Input {
                    kind: InputKind::SnapshotPath(SnapshotPurpose::Open),
                    text,
                });
            }
        },
        Action::SnapshotRestore => match &state.snapshot {
            SnapshotStep::Inspect(info)
            | SnapshotStep::Verified { info, .. }
            | SnapshotStep::Failed {
                info: Some(info), ..
            } => {
                state.snapshot = SnapshotStep::Confirm {
                    info: info.clone(),
                    choice: Choice::Cancel,
                };
            }
            _ => state.flash_error("save or open a snapshot first (s or o), then r restores it"),
        },
        Action::Toggle => {
            if let SnapshotStep::Confirm { choice, .. } = &mut state.snapshot {
                *choice = choice.toggled();
            }
        }
        Action::Choose | Action::Yes => {
            if let SnapshotStep::Confirm { info, choice } = &state.snapshot {
                if action == Action::Yes || *choice == Choice::Confirm {
                    let path = info.path.clone();
                    state.snapshot = SnapshotStep::Restoring {
                        total: info.bytes,
                        info: info.clone(),
                        sent: 0,
                    };
                    effects.push(Effect::SnapshotRestore(path));
                } else {
                    state.snapshot = SnapshotStep::Inspect(info.clone());
                }
            }
        }
        Action::Cancel => cancel_snapshot_step(state, effects),
        _ => return false,
    }
    true
}

/// A file name typed for a save or an open: the step starts.
pub(super) fn start(
    state: &mut State,
    purpose: SnapshotPurpose,
    path: std::path::PathBuf,
    effects: &mut Vec<Effect>,
) {
    match purpose {
        SnapshotPurpose::Save => {
            state.snapshot = SnapshotStep::Saving {
                path: path.clone(),
                written: 0,
                total: None,
            };
            effects.push(Effect::SnapshotSave(path));
        }
        SnapshotPurpose::Open => {
            state.snapshot = SnapshotStep::Opening { path: path.clone() };
            effects.push(Effect::SnapshotOpen(path));
        }
    }
}

fn snapshot_info(step: &SnapshotStep) -> Option<&crate::state::SnapshotInfo> {
    match step {
        SnapshotStep::Inspect(info)
        | SnapshotStep::Confirm { info, .. }
        | SnapshotStep::Restoring { info, .. }
        | SnapshotStep::Verifying { info, .. }
        | SnapshotStep::Verified { info, .. }
        | SnapshotStep::Failed {
            info: Some(info), ..
        } => Some(info),
        _ => None,
    }
}

fn cancel_snapshot_step(state: &mut State, effects: &mut Vec<Effect>) {
    let step = std::mem::replace(&mut state.snapshot, SnapshotStep::Start);
    state.snapshot = match step {
        SnapshotStep::Saving { path, .. } => {
            effects.push(Effect::SnapshotCancel);
            state.flash(format!(
                "save cancelled; nothing was written to {}",
                path.display()
            ));
            SnapshotStep::Start
        }
        SnapshotStep::Opening { .. } => {
            effects.push(Effect::SnapshotCancel);
            SnapshotStep::Start
        }
        SnapshotStep::Restoring { info, .. } => {
            effects.push(Effect::SnapshotCancel);
            SnapshotStep::Failed {
                what: "restore".into(),
                error: "cancelled: the upload was stopped before the server committed it, so \
                        the cluster keeps its state (check the counts on the Types screen)"
                    .into(),
                info: Some(info),
            }
        }
        SnapshotStep::Confirm { info, .. } => SnapshotStep::Inspect(info),
        SnapshotStep::Verifying { info, .. } => {
            effects.push(Effect::SnapshotCancel);
            SnapshotStep::Inspect(info)
        }
        SnapshotStep::Start
        | SnapshotStep::Inspect(_)
        | SnapshotStep::Verified { .. }
        | SnapshotStep::Failed { .. } => SnapshotStep::Start,
    };
}

pub(super) fn on_snapshot(state: &mut State, msg: SnapshotMsg, effects: &mut Vec<Effect>) {
    let step = std::mem::replace(&mut state.snapshot, SnapshotStep::Start);
    state.snapshot = match (step, msg) {
        (SnapshotStep::Saving { path, .. }, SnapshotMsg::SaveProgress { written, total }) => {
            SnapshotStep::Saving {
                path,
                written,
                total,
            }
        }
        (SnapshotStep::Saving { .. }, SnapshotMsg::Saved(Ok(info))) => {
            state.flash(format!(
                "saved {} ({} resources)",
                info.path.display(),
                info.header.resource_count
            ));
            SnapshotStep::Inspect(Box::new(info))
        }
        (SnapshotStep::Saving { path, .. }, SnapshotMsg::Saved(Err(error))) => {
            SnapshotStep::Failed {
                what: format!("save to {}", path.display()),
                error,
                info: None,
            }
        }
        (SnapshotStep::Opening { .. }, SnapshotMsg::Opened(Ok(info))) => {
            SnapshotStep::Inspect(Box::new(info))
        }
        (SnapshotStep::Opening { path }, SnapshotMsg::Opened(Err(error))) => SnapshotStep::Failed {
            what: format!("open {}", path.display()),
            error,
            info: None,
        },
        (SnapshotStep::Restoring { info, .. }, SnapshotMsg::RestoreProgress { sent, total }) => {
            SnapshotStep::Restoring { info, sent, total }
        }
        (SnapshotStep::Restoring { info, .. }, SnapshotMsg::Restored(Ok(restored_index))) => {
            effects.push(Effect::SnapshotVerify(info.counts()));
            SnapshotStep::Verifying {
                info,
                restored_index,
            }
        }
        (SnapshotStep::Restoring { info, .. }, SnapshotMsg::Restored(Err(error))) => {
            SnapshotStep::Failed {
                what: "restore".into(),
                error,
                info: Some(info),
            }
        }
        (
            SnapshotStep::Verifying {
                info,
                restored_index,
            },
            SnapshotMsg::Verified(Ok(rows)),
        ) => SnapshotStep::Verified {
            info,
            restored_index,
            rows,
        },
        (SnapshotStep::Verifying { info, .. }, SnapshotMsg::Verified(Err(error))) => {
            SnapshotStep::Failed {
                what: "verify the restored counts".into(),
                error,
                info: Some(info),
            }
        }
        // A late message from a step that was cancelled: nothing to do.
        (step, _) => step,
    };
}
