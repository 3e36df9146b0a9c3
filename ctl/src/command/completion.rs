//! `resctl completion SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::CommandFactory;

use crate::cli::{Cli, CompletionArgs};

pub fn run(args: &CompletionArgs) -> anyhow::Result<u8> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "resctl", &mut script);
    crate::output::print(&String::from_utf8_lossy(&script))?;
    Ok(0)
}
