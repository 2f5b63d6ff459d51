//! `mounthost` binary: parse flags, set up logging, run the subcommand.

use std::process::ExitCode;

use clap::Parser;
use mounthost::cli::{Cli, Command, plugin};
use mounthost::telemetry;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.global.log_format, &cli.global.log);
    let cfg = match cli.global.config() {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("error: resolving the configured directories: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Plugin(cmd) => plugin::run(&cfg, cmd).await,
    };
    match result {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error ({:?}): {e}", e.kind());
            ExitCode::from(2)
        }
    }
}
