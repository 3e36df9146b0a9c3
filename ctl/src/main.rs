//! The `resctl` binary: parse the command line, run the command, map the outcome to an exit
//! code (0 ok, 1 failure, 2 usage).

use std::process::ExitCode;

use clap::Parser;
use ctl::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(ctl::command::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            ctl::say!("error: {error:#}");
            ExitCode::from(ctl::exit_code(&error))
        }
    }
}
