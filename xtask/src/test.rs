//! `cargo xtask test`: what CI runs.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::s3::{BUCKET, S3Server};
use crate::{browser, cargo_has, layers, python, run_checked};

pub fn run(root: &Path, interop: bool, rest: &[String]) -> Result<()> {
    let cargo = || {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(root);
        cmd
    };
    run_checked(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run_checked(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Function length is held by `#![cfg_attr(not(test), deny(clippy::too_many_lines))]`
    // in every crate root, so this one pass checks it for the code that ships.
    layers::run(root)?;

    let python = python::ensure_venv(root)?;
    let s3 = S3Server::start(root, &python)?;
    eprintln!("S3 API server (moto) at {}", s3.endpoint);
    let with_s3 = |cmd: &mut Command| {
        cmd.env("MINKTEST_S3_ENDPOINT", &s3.endpoint)
            .env("MINKTEST_S3_BUCKET", BUCKET)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
    };

    let mut tests = cargo();
    if cargo_has("nextest") {
        tests.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        eprintln!("cargo-nextest is not installed; falling back to cargo test");
        tests.args(["test", "--workspace", "--no-fail-fast"]);
    }
    tests.args(rest);
    with_s3(&mut tests);
    // The chaos harness's pyarrow writer.
    tests.env("MINKTEST_CHAOS_PYTHON", &python);
    run_checked(&mut tests)?;
    if cargo_has("nextest") && rest.is_empty() {
        // nextest does not run doctests; the README examples are doctests. Only the
        // crates that hold any (each crate sits in the directory of its name).
        let packages: Vec<(String, std::path::PathBuf)> = layers::ALLOWED
            .iter()
            .map(|(name, _)| (name.to_string(), root.join(name)))
            .collect();
        let with = crate::doctests::packages_with_doctests(&packages)?;
        eprintln!("doctests in: {}", with.join(", "));
        if !with.is_empty() {
            let mut doc = cargo();
            doc.args(["test", "--doc"]);
            for name in &with {
                doc.args(["-p", name]);
            }
            run_checked(&mut doc)?;
        }
    }

    if interop {
        browser::ensure_chromium()?;
        run_checked(cargo().args(["build", "--workspace", "--bins"]))?;
        let mut pytest = Command::new(&python);
        pytest
            .current_dir(root)
            .args(["-m", "pytest", "-q", "--durations=15", "tests/interop"])
            .env("MINKTEST_BIN_DIR", root.join("target/debug"));
        with_s3(&mut pytest);
        run_checked(&mut pytest)?;
    }
    Ok(())
}
