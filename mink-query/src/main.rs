//! `mink-query`: serves Flight SQL on 127.0.0.1:9130 against the node at
//! 127.0.0.1:9120, with no configuration at all (docs/query.md).
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mink_query::QueryConfig;
use mink_query::config::LogFormat;

/// Flight SQL over the Mink nodes.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// A TOML configuration file (default: ./mink-query.toml when it exists).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match QueryConfig::load(args.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("mink-query: {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    init_tracing(config.logging.format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mink-query: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let server = match mink_query::QueryServer::start(config.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot start: {e:#}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(nodes = ?config.nodes, "mink-query started");
        shutdown_signal().await;
        tracing::info!("shutting down");
        server.stop().await;
        ExitCode::SUCCESS
    })
}
