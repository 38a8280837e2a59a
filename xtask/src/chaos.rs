//! `cargo xtask chaos`: the chaos harness (mink-node/tests/it/chaos.rs) in release mode,
//! for as long as asked: node processes on one store (a directory, or the local S3
//! server with `--s3`) under writers and seeded faults; it fails on any violation and
//! prints the faults injected, the rows checked and the recovery times.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::run_checked;
use crate::s3::{BUCKET, S3Server};

pub fn run(root: &Path, seconds: u64, seed: u64, s3: bool) -> Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args([
            "test",
            "--release",
            "-p",
            "mink-node",
            "--test",
            "it",
            "--",
            "chaos::",
            "--nocapture",
        ])
        .env("MINK_CHAOS_SECONDS", seconds.to_string())
        .env("MINK_CHAOS_SEED", seed.to_string());
    let python = crate::python::ensure_venv(root)?;
    cmd.env("MINKTEST_CHAOS_PYTHON", &python);
    let _server = if s3 {
        let server = S3Server::start(root, &python)?;
        eprintln!("S3 API server (moto) at {}", server.endpoint);
        cmd.env("MINK_CHAOS_S3", "1")
            .env("MINKTEST_S3_ENDPOINT", &server.endpoint)
            .env("MINKTEST_S3_BUCKET", BUCKET)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
        Some(server)
    } else {
        None
    };
    run_checked(&mut cmd)
}
