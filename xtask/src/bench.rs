//! `cargo xtask bench NAME`: runs a benchmark binary in release mode and splices its
//! Markdown report into docs/benchmarks.md between `<!-- bench:NAME -->` markers.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Benchmarks: name, package, bench target, what it measures.
pub const BENCHES: &[(&str, &str, &str, &str)] = &[
    (
        "wal",
        "mink-wal",
        "wal",
        "s3stream append latency and throughput against raw object-store PUTs",
    ),
    (
        "log",
        "mink-log",
        "log",
        "log-tablet appends against raw s3stream appends; scans from memory and segments",
    ),
    (
        "kv",
        "mink-kv",
        "kv",
        "KV upserts and lookups on fjall and redb against log appends of the same rows",
    ),
    (
        "ingest",
        "mink-node",
        "ingest",
        "DoPut rows/s against raw s3stream appends; write-to-tail visibility latency",
    ),
    (
        "idle",
        "mink-node",
        "idle",
        "object-store requests per hour of an idle node and an idle 3-node cluster",
    ),
    (
        "lake",
        "mink-node",
        "lake",
        "lake tiering MB/s against raw Parquet writing, lag under steady load, Union read MB/s",
    ),
    (
        "kafka",
        "mink-node",
        "kafka",
        "librdkafka produce/consume MB/s and produce-to-consume latency against the Flight ingest path",
    ),
    (
        "cost",
        "mink-node",
        "cost",
        "object-store requests, ack latency and the monthly S3 request bill at 1, 10 and 50 MB/s with the PUT budget and with fixed lingers of 0-250 ms; a primary-key table at 10 MB/s",
    ),
    (
        "query",
        "mink-query",
        "query_bench.py",
        "SQL through mink-query against raw Flight scans and lookups; DuckDB over the lake as a peer",
    ),
    (
        "tpch",
        "mink-query",
        "tpch_bench.py",
        "the 22 TPC-H queries through mink-query against DataFusion and DuckDB over the same rows as Parquet",
    ),
    (
        "python",
        "clients/python",
        "bench_client.py",
        "the Python client's Writer against the Rust client, and its scans against raw Flight DoGet",
    ),
    (
        "meta",
        "mink-meta",
        "meta",
        "metadata proposals/s, lease failover time, start-up from snapshot and from replay",
    ),
];

pub fn run(root: &Path, name: &str, quick: bool) -> Result<()> {
    let Some((_, package, target, what)) = BENCHES.iter().find(|(n, ..)| *n == name) else {
        let known: Vec<&str> = BENCHES.iter().map(|(n, ..)| *n).collect();
        bail!("unknown benchmark {name:?}; known: {}", known.join(", "));
    };
    eprintln!("bench {name}: {what}");
    // A `.py` target drives release binaries from the test venv's clients (a bench
    // of mink-query cannot link the node: DESIGN.md's layering; the Python client is
    // Python).
    let mut cmd = if target.ends_with(".py") {
        // The node, and the binary the benchmark compares against.
        let other = if matches!(name, "query" | "tpch") {
            "mink-query"
        } else {
            "mink"
        };
        crate::run_checked(Command::new("cargo").current_dir(root).args([
            "build",
            "--release",
            "--bin",
            "mink-node",
            "--bin",
            other,
        ]))?;
        let python = crate::python::ensure_venv(root)?;
        // What only this benchmark needs (not the tests): `benches/requirements-NAME.txt`.
        let extra = root
            .join(package)
            .join("benches")
            .join(format!("requirements-{name}.txt"));
        if extra.exists() {
            crate::python::pip_install(&python, &extra)?;
        }
        let mut cmd = Command::new(python);
        cmd.current_dir(root)
            .arg(root.join(package).join("benches").join(target))
            .arg("--bin-dir")
            .arg(root.join("target/release"));
        cmd
    } else {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(root)
            .args(["bench", "--quiet", "-p", package, "--bench", target, "--"]);
        cmd
    };
    if quick {
        cmd.arg("--quick");
    }
    if name == "kafka" {
        // The load generator is librdkafka, from the test venv.
        cmd.env("MINKBENCH_PYTHON", crate::python::ensure_venv(root)?);
    }
    let output = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo bench")?;
    if !output.status.success() {
        bail!("the {name} benchmark failed: {}", output.status);
    }
    let report = String::from_utf8(output.stdout).context("the report is not UTF-8")?;
    print!("{report}");
    if quick {
        eprintln!("quick mode: docs/benchmarks.md left unchanged");
        return Ok(());
    }
    splice(&root.join("docs/benchmarks.md"), name, &report)
}

/// Replaces the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` (or
/// appends a new section) with `report`.
fn splice(path: &Path, name: &str, report: &str) -> Result<()> {
    let doc = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let open = format!("<!-- bench:{name} -->");
    let close = format!("<!-- /bench:{name} -->");
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    let section = format!(
        "{open}\n_Measured {} with `cargo xtask bench {name}`._\n\n{report}{close}",
        date.trim()
    );
    let updated = match (doc.find(&open), doc.find(&close)) {
        (Some(a), Some(b)) if a < b => format!("{}{section}{}", &doc[..a], &doc[b + close.len()..]),
        _ => format!("{}\n## {name}\n\n{section}\n", doc.trim_end()),
    };
    std::fs::write(path, updated).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("updated {}", path.display());
    Ok(())
}
