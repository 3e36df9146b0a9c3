//! resctl as a library: the binary (`src/main.rs`) only parses flags and owns exit codes.
//!
//! Layout:
//! - [`cli`]: the clap definitions (global flags with their environment variables, commands);
//! - [`context`]: the contexts file (named servers, tokens, default tenancy);
//! - [`session`]: the client, the codec fetched from the server, resolved defaults;
//! - [`output`]: tables, YAML, JSON and names;
//! - [`command`]: one module per command; each exposes the operation as a function returning
//!   data (what tests drive through the library) and renders it.

pub mod cli;
pub mod command;
pub mod context;
pub mod jsonpath;
pub mod output;
pub mod session;

/// A mistake in how resctl was invoked that clap cannot see (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The process exit code for an error: 2 for usage errors, 1 for everything else.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<UsageError>().is_some() {
        2
    } else {
        1
    }
}
