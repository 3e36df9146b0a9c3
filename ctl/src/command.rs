//! Dispatch: one module per command. Each module exposes its operation as a function returning
//! data, and a `run` that renders it for the session's output format.

pub mod acl;
pub mod apply;
pub mod auth;
pub mod bench;
pub mod cluster;
pub mod completion;
pub mod context;
pub mod controllers;
pub mod delete;
pub mod describe;
pub mod diff;
pub mod edit;
pub mod explain;
pub mod get;
pub mod history;
pub mod label;
pub mod plan;
pub mod policy;
pub mod snapshot;
pub mod status;
pub mod tree;
pub mod tui;
pub mod types;
pub mod wait;
pub mod watch;

use crate::cli::{Cli, Command};
use crate::session::Session;

/// Runs a parsed command line; the result is the exit code for a command that reports partial
/// failure itself (apply), errors are printed by the caller.
pub async fn run(cli: Cli) -> anyhow::Result<u8> {
    if let Some(template) = &cli.global.output.template {
        crate::output::use_template(template.clone());
    }
    if let Some(columns) = &cli.global.output.columns {
        crate::output::use_columns(columns.clone());
    }
    match cli.command {
        Command::Completion(args) => completion::run(&args),
        Command::Context(command) => context::run(command, cli.global.output.format),
        command => {
            // A contexts file, certificate path or address that cannot be used is a usage error.
            let session = Session::from_args(&cli.global)
                .map_err(|error| crate::UsageError(format!("{error:#}")))?;
            let outcome = match command {
                Command::Apply(args) => apply::run(&session, &args).await,
                Command::Diff(args) => diff::run(&session, &args).await,
                Command::Get(args) => get::run(&session, &args).await,
                Command::History(args) => history::history(&session, &args).await,
                Command::Blame(args) => history::blame_run(&session, &args).await,
                Command::Delete(args) => delete::run(&session, &args).await,
                Command::Status(args) => status::run(&session, &args).await,
                Command::Describe(args) => describe::run(&session, &args).await,
                Command::Wait(args) => wait::run(&session, &args).await,
                Command::Tree(args) => tree::run(&session, &args).await,
                Command::Edit(args) => edit::run(&session, &args).await,
                Command::Types => types::run(&session).await,
                Command::Type(command) => plan::run(&session, command).await,
                Command::Explain(args) => explain::run(&session, &args).await,
                Command::Watch(args) => watch::run(&session, &args).await,
                Command::Label(args) => label::run(&session, &args).await,
                Command::Cluster(command) => cluster::run(&session, command).await,
                Command::Acl(command) => acl::run(&session, command).await,
                Command::Auth(command) => auth::run(&session, command).await,
                Command::Policy(command) => policy::run(&session, command).await,
                Command::Controllers => controllers::run(&session).await,
                Command::Snapshot(command) => snapshot::run(&session, command).await,
                Command::Bench(args) => bench::run(&session, &args).await,
                Command::Tui(args) => tui::run(&session, &args, &cli.global).await,
                Command::Completion(_) | Command::Context(_) => Ok(0),
            };
            session.print_warnings();
            outcome
        }
    }
}
