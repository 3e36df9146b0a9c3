//! Integration tests of the `resctl` binary that need no server: `--help` of every command is
//! snapshot-tested (insta), exit codes for usage errors and unreachable servers.

use std::process::{Command, Output};

fn resctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_resctl"))
        .args(args)
        .env("RESCTL_CONFIG", "/nonexistent/resctl-test/contexts.yaml")
        .env_remove("RESD_SERVER")
        .env_remove("RESD_OUTPUT")
        .env_remove("RESD_CONTEXT")
        .output()
        .expect("run resctl")
}

/// Every command path: `[]`, `["get"]`, `["cluster", "status"]`, …
fn command_paths(command: &clap::Command, prefix: Vec<String>, paths: &mut Vec<Vec<String>>) {
    paths.push(prefix.clone());
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let mut path = prefix.clone();
        path.push(sub.get_name().to_owned());
        command_paths(sub, path, paths);
    }
}

#[test]
fn help_of_every_command_matches_its_snapshot() {
    use clap::CommandFactory;
    let mut paths = Vec::new();
    command_paths(&ctl::cli::Cli::command(), Vec::new(), &mut paths);
    assert!(paths.len() > 20, "{paths:?}");
    for path in paths {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let output = resctl(&args);
        assert!(output.status.success(), "resctl {args:?} failed");
        let name = if path.is_empty() {
            "resctl".to_owned()
        } else {
            format!("resctl-{}", path.join("-"))
        };
        insta::assert_snapshot!(name, String::from_utf8_lossy(&output.stdout));
    }
}

#[test]
fn usage_errors_exit_with_2_and_failures_with_1() {
    let usage = resctl(&["get"]);
    assert_eq!(usage.status.code(), Some(2));
    let unknown = resctl(&["frobnicate"]);
    assert_eq!(unknown.status.code(), Some(2));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let unreachable = resctl(&["--server", &format!("127.0.0.1:{port}"), "types"]);
    assert_eq!(unreachable.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        stderr.contains("unreachable") && stderr.contains("resd dev"),
        "{stderr}"
    );
}

#[test]
fn completion_scripts_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let output = resctl(&["completion", shell]);
        assert!(output.status.success());
        assert!(String::from_utf8_lossy(&output.stdout).contains("resctl"));
    }
}
