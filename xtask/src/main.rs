//! `cargo xtask`: every developer task of the Mink workspace, in Rust.
//!
//! - `cargo xtask test`: formatting, lints (and a function-length gate on shipped code),
//!   layering, the Rust test suite (nextest
//!   when installed), and the interop suites under `tests/interop/` against real
//!   clients, with a local S3 API server (moto) started for the run.
//! - `cargo xtask check-layers`: fails when a workspace crate depends on one it may
//!   not use (DESIGN.md's table).
//! - `cargo xtask bench NAME`: a benchmark in release mode, recorded in
//!   docs/benchmarks.md.
//! - `cargo xtask chaos [--seconds N] [--seed S] [--s3]`: the chaos harness, long.
//! - `cargo xtask s3`: runs the local S3 API server in the foreground, for manual work.
//! - `cargo xtask cluster up|down|status`: a local cluster of mink-node processes.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod bench;
mod browser;
mod chaos;
mod cluster;
mod doctests;
mod layers;
mod python;
mod s3;
mod test;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "Mink's developer tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum ClusterAction {
    /// Start N nodes and wait until each serves.
    Up {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Share a local S3 API server (moto) instead of a directory.
        #[arg(long)]
        s3: bool,
        /// Run release builds.
        #[arg(long)]
        release: bool,
    },
    /// Stop the nodes (SIGTERM: a clean handover) and the S3 server.
    Down,
    /// List the nodes, their addresses and health.
    Status,
    /// Print `export MINK_ADDR=…` for the first node.
    Env,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Run everything CI runs: fmt, clippy, check-layers, Rust tests, interop tests.
    Test {
        /// Skip the Python interop suites.
        #[arg(long)]
        no_interop: bool,
        /// Extra arguments passed to the Rust test runner (a filter, say).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Check that workspace crates depend only on the crates DESIGN.md allows.
    CheckLayers,
    /// Run a benchmark (release build) and record it in docs/benchmarks.md.
    Bench {
        /// Which benchmark: wal, log, kv, ingest, idle, lake, kafka, cost, meta.
        name: String,
        /// Short phases, for a smoke run; docs are not updated.
        #[arg(long)]
        quick: bool,
    },
    /// Run the chaos harness: node processes under writers and seeded faults
    /// (kills, pauses, store failures, ambiguous PUTs, latency, rebalances, a join),
    /// then check every acknowledged write. Release mode.
    Chaos {
        /// How long faults are injected.
        #[arg(long, default_value_t = 180)]
        seconds: u64,
        /// The seed of the fault schedule (a failing run names it).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Share a local S3 API server (moto) instead of a directory.
        #[arg(long)]
        s3: bool,
    },
    /// Run the local S3 API server (moto) until Ctrl-C and print its endpoint.
    S3,
    /// A local cluster of mink-node processes sharing one object store.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
        /// Where the cluster keeps its state, logs and data.
        #[arg(long, global = true, default_value = "target/cluster")]
        dir: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    let root = workspace_root()?;
    match args.task {
        Task::Test { no_interop, rest } => test::run(&root, !no_interop, &rest),
        Task::CheckLayers => layers::run(&root),
        Task::Bench { name, quick } => bench::run(&root, &name, quick),
        Task::Chaos { seconds, seed, s3 } => chaos::run(&root, seconds, seed, s3),
        Task::S3 => s3::run_foreground(&root),
        Task::Cluster { action, dir } => {
            let dir = if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir()?.join(dir)
            };
            match action {
                ClusterAction::Up { nodes, s3, release } => {
                    cluster::up(&root, &dir, nodes, s3, release)
                }
                ClusterAction::Down => cluster::down(&dir),
                ClusterAction::Status => cluster::status(&dir),
                ClusterAction::Env => cluster::env(&dir),
            }
        }
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> Result<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

/// Runs `cmd`, echoing it, and fails unless it exits 0.
fn run_checked(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", render(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", render(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", render(cmd));
    }
    Ok(())
}

fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `cargo <sub> --version` works (nextest, say).
fn cargo_has(sub: &str) -> bool {
    Command::new("cargo")
        .args([sub, "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
