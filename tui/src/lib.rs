//! The resd dashboard, `resctl tui`: a live ratatui view of a cluster's resources, statuses,
//! finalizers, owner trees, nodes and controller placement, with edit, delete and a snapshot
//! stepper. It talks to the cluster only through `proto::client`.
//!
//! The code is split the way the house style asks (the Elm architecture, as gitui and
//! bottom do it):
//! - [`state`] and [`model`]: plain data — what is on screen and the copy of the resources;
//! - [`update`]: `update(state, msg) -> effects`, the only place state changes, tested as data;
//! - [`view`]: draws a frame from the state and changes nothing (rendering tests use
//!   ratatui's `TestBackend`);
//! - [`app`]: the runtime — terminal, key events, background tasks (watches, the cluster
//!   poller, snapshots), carrying out effects;
//! - [`keymap`]: every key in one table, which both dispatch and `?` help read.

pub mod app;
pub mod clock;
pub mod keymap;
pub mod model;
pub mod msg;
pub mod state;
pub mod terminal;
pub mod testing;
pub mod update;
pub mod view;

pub use app::{Options, TuiError, run};
