//! `mink-node`: runs one Mink node.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mink_node::MinkConfig;
use mink_node::config::LogFormat;
use mink_node::node::{Node, shutdown_signal};

/// Runs one Mink node. With no configuration at all it is a single node on
/// ./mink-data; see README.md for the configuration sources.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// A TOML configuration file (default: ./mink.toml when it exists).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

/// mimalloc keeps freed memory for reuse: encoding a 1 MB batch into a fresh buffer
/// is ~10× faster than with the system allocator, which returns large blocks to the
/// kernel and page-faults them back (measured in `cargo xtask bench log`).
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

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match MinkConfig::load(args.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("mink-node: {e}");
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
            eprintln!("mink-node: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let shutdown = shutdown_signal();
        let node = match Node::start(config).await {
            Ok(node) => node,
            Err(e) => {
                tracing::error!("cannot start: {e:#}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            node_id = %node.config.node_id,
            data_dir = %node.config.data_dir.display(),
            object_store = %node.config.object_store.url,
            flight = %node.flight_addr,
            "node started"
        );
        shutdown.await;
        tracing::info!("shutting down");
        node.stop().await;
        ExitCode::SUCCESS
    })
}
