//! What a team's controller program needs before it runs a replica (DESIGN §16): the cluster
//! found as resctl finds it — the same flags and `RESD_*` variables ([`ConnectArgs`], flatten
//! them into the program's own arguments), over the current context of resctl's contexts
//! file, so a program started next to `resd dev` needs no flag — and logs that are plain text
//! when they are not read on a terminal.

use std::io::IsTerminal;

pub use proto::client::connect::{ConnectArgs, ConnectError, Connection};
use proto::client::{Client, ClientError};

/// Why a program cannot reach its cluster's settings.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error(transparent)]
    Settings(#[from] ConnectError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// A client of the cluster `args` lead to (flags, environment, context, defaults), and where
/// it was found: the connection is made lazily, so an unreachable server is said by the first
/// call, not here.
pub fn connect(args: &ConnectArgs) -> Result<(Client, Connection), ProgramError> {
    let connection = args.resolve()?;
    let client = Client::new(connection.config.clone())?;
    Ok((client, connection))
}

/// Logs to stderr at `RUST_LOG`'s levels (`info` by default), coloured only on a terminal and
/// without `NO_COLOR` (a file or a pipe gets plain lines).
pub fn init_logging() {
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .try_init();
}
