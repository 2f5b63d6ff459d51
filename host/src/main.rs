//! `mounthost` binary: parse flags, set up logging, run the subcommand.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use mounthost::cli::{Cli, Command, cache, client, dynamic, lazyfs, model, plugin, serve};
use mounthost::telemetry;

fn main() -> ExitCode {
    // Before the runtime or anything else opens a descriptor (see the function).
    mounthost::exec::process::reserve_low_descriptors();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.global.log_format, &cli.global.log);
    let mut cfg = match cli.global.config() {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("error: resolving the configured directories: {e}");
            return ExitCode::from(2);
        }
    };
    let served = match cli.command {
        Command::Plugin(cmd) => {
            return match plugin::run(&cfg, cmd).await {
                Ok(out) => print_out(&out),
                // The report on stdout, as when it passes; exit 1 (2 is for usage errors).
                Err(plugin::CliError::CheckFailed(report)) => {
                    print_out(&report);
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("error ({:?}): {e}", e.kind());
                    ExitCode::from(2)
                }
            };
        }
        Command::Client(args) => {
            let socket = match args.endpoint.as_deref().map(mounthost::unpriv::grpc::socket_path) {
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    eprintln!("error (InvalidArgument): {e}");
                    return ExitCode::from(2);
                }
                None => cfg.state_dir.join("csi.sock"),
            };
            return match client::run(socket, cfg.host_socket.clone(), args.command).await {
                Ok(out) => print_out(&out),
                Err(e) => {
                    eprintln!("error ({:?}): {}", e.code, e.message);
                    ExitCode::from(2)
                }
            };
        }
        Command::Cache(cmd) => {
            return match cache::run(&cfg.host_socket, cmd).await {
                Ok(out) => print_out(&out),
                Err(e) => {
                    eprintln!("error ({:?}): {}", e.code, e.message);
                    ExitCode::from(2)
                }
            };
        }
        Command::Model(cmd) => {
            return match model::run(&cfg, cmd).await {
                Ok(out) => print_out(&out),
                Err(e) => {
                    eprintln!("error ({:?}): {e}", e.kind());
                    ExitCode::from(2)
                }
            };
        }
        Command::Lazyfs(args) => {
            return match lazyfs::run(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Dynamic(args) => {
            return match dynamic::run(args).await {
                Ok(out) => print_out(&out),
                Err(e) => {
                    // A mount that failed or was not ready in time: its last view, then why.
                    if let Some(out) = &e.output {
                        print_out(out);
                    }
                    eprintln!("error ({}): {}", e.code, e.message);
                    ExitCode::from(2)
                }
            };
        }
        Command::Host => serve::host(cfg).await,
        Command::Csi(args) => serve::csi(cfg, args).await,
        Command::Local(args) => {
            if cli.global.kubelet_dir.is_none() {
                cfg.kubelet_dir = cfg.state_dir.join("kubelet");
            }
            serve::local(cfg, args).await
        }
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Print a command's output and end. A reader that went away (`mounthost plugin info x | head
/// -1`) ends the output, exit 0, as `rg` and other Unix tools do: Rust ignores SIGPIPE, so the
/// write fails with EPIPE, where `println!` would panic. Any other write error is reported.
fn print_out(out: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{out}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing the output: {e}");
            ExitCode::FAILURE
        }
    }
}
