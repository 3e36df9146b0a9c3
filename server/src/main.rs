//! The `resd` binary: parses flags, installs logging and signal handling, runs the agent.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use server::agent::{Agent, AgentConfig};
use tokio_util::sync::CancellationToken;

/// resd: a cluster server for typed, versioned resources.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a server node (in-memory storage for now: data does not survive a restart).
    Agent(AgentArgs),
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Address of the gRPC API (resource and cluster services, health, reflection); port 0 picks
    /// a free port.
    #[arg(long, env = "RESD_API_ADDR", default_value = "127.0.0.1:8502")]
    api_addr: SocketAddr,

    /// Largest encoded resource a client may write, in bytes.
    #[arg(long, env = "RESD_MAX_RESOURCE_BYTES", default_value_t = server::service::DEFAULT_MAX_RESOURCE_BYTES)]
    max_resource_bytes: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("resd: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Agent(args) => run_agent(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("resd: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let config = AgentConfig {
        api_addr: args.api_addr,
        max_resource_bytes: args.max_resource_bytes,
    };
    let shutdown = CancellationToken::new();
    let agent = Agent::start(config, shutdown.clone()).await?;
    let api_addr = agent
        .api_addr()
        .context("cannot read the bound API address")?;
    tracing::info!(%api_addr, storage = "memory", "resd agent serving gRPC");
    // One line on stdout for scripts and tests that start resd on port 0.
    #[allow(clippy::print_stdout)]
    {
        println!("resd: serving gRPC on {api_addr}");
    }

    let signals = tokio::spawn(wait_for_signal(shutdown.clone()));
    let served = agent.run().await;
    signals.abort();
    // The signal task only ever ends by abort or by cancelling; either way it is done.
    let _ = signals.await;
    served?;
    tracing::info!("resd agent stopped cleanly");
    Ok(())
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM.
async fn wait_for_signal(shutdown: CancellationToken) {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for SIGINT; stop resd with SIGTERM");
            std::future::pending::<()>().await;
        }
        "SIGINT"
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; stop resd with SIGINT");
                std::future::pending::<()>().await;
            }
        }
        "SIGTERM"
    };
    let signal = tokio::select! {
        signal = interrupt => signal,
        signal = terminate => signal,
    };
    tracing::info!(
        signal,
        "shutting down: finishing in-flight requests and ending watches"
    );
    shutdown.cancel();
}
