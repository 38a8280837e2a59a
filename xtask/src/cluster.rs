//! `cargo xtask cluster up|down|status`: a local cluster of `mink-node` processes
//! sharing one object store (`file://` under the cluster directory, or with `--s3` a
//! local moto server started for it).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::run_checked;

#[derive(Debug, Serialize, Deserialize)]
struct NodeEntry {
    id: String,
    pid: u32,
    flight: String,
    /// Empty in a state file written before nodes had a Kafka listener.
    #[serde(default)]
    kafka: String,
    admin: String,
    /// The Iceberg REST catalog; empty in a state file written before nodes served it.
    #[serde(default)]
    iceberg_rest: String,
    log: PathBuf,
}

/// The cluster's mink-query (Flight SQL).
#[derive(Debug, Serialize, Deserialize)]
struct QueryEntry {
    pid: u32,
    addr: String,
    log: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
struct ClusterState {
    object_store: String,
    s3_pid: Option<u32>,
    nodes: Vec<NodeEntry>,
    /// Absent in a state file written before clusters had one.
    #[serde(default)]
    query: Option<QueryEntry>,
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

/// `GET path` over plain HTTP/1.0; the status code, or `None` when nothing answers.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut stream =
        TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// Builds the binaries, starts the object store (a directory, or the local S3 server),
/// `nodes` nodes and a mink-query beside them, and waits until every node is healthy.
pub fn up(root: &Path, dir: &Path, nodes: usize, s3: bool, release: bool) -> Result<()> {
    if nodes == 0 || nodes > 16 {
        bail!("--nodes must be within 1..=16");
    }
    if state_file(dir).exists() {
        bail!(
            "a cluster is already up in {} (cargo xtask cluster down first)",
            dir.display()
        );
    }
    let mut build = Command::new("cargo");
    build
        .current_dir(root)
        .args(["build", "--bin", "mink-node", "--bin", "mink-query"]);
    if release {
        build.arg("--release");
    }
    run_checked(&mut build)?;
    let binary = root.join(if release {
        "target/release/mink-node"
    } else {
        "target/debug/mink-node"
    });
    std::fs::create_dir_all(dir)?;
    let dir = std::path::absolute(dir)?;
    let store = if s3 {
        s3_store(root, &dir)?
    } else {
        Store {
            url: format!("file://{}", dir.join("objects").display()),
            s3_pid: None,
            env: vec![],
        }
    };
    let started = (0..nodes)
        .map(|i| spawn_node(&binary, &dir, &format!("n{i}"), &store))
        .collect::<Result<Vec<_>>>()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let entries = started
        .into_iter()
        .map(|(id, pid, log)| node_entry(id, pid, log, deadline))
        .collect::<Result<Vec<_>>>()?;
    let mut state = ClusterState {
        object_store: store.url,
        s3_pid: store.s3_pid,
        nodes: entries,
        query: None,
    };
    std::fs::write(state_file(&dir), serde_json::to_vec_pretty(&state)?)?;
    for n in &state.nodes {
        while http_status(&n.admin, "/health") != Some(200) {
            if Instant::now() > deadline || !alive(n.pid) {
                bail!(
                    "node {} did not become healthy; see {}",
                    n.id,
                    n.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    state.query = Some(start_query(
        &binary.with_file_name("mink-query"),
        &dir,
        &state.nodes,
    )?);
    std::fs::write(state_file(&dir), serde_json::to_vec_pretty(&state)?)?;
    println!(
        "cluster up in {} (object store {})",
        dir.display(),
        state.object_store
    );
    print_nodes(&state);
    println!(
        "\ncargo xtask cluster status | down --dir {}",
        dir.display()
    );
    Ok(())
}

/// The cluster's object store: its URL, the S3 server's process (with `--s3`), and
/// what the nodes need in their environment to reach it.
struct Store {
    url: String,
    s3_pid: Option<u32>,
    env: Vec<(String, String)>,
}

/// Starts the local S3 server (moto) for good, logging to `dir/s3.log`.
fn s3_store(root: &Path, dir: &Path) -> Result<Store> {
    let python = crate::python::ensure_venv(root)?;
    let log = std::fs::File::create(dir.join("s3.log"))?;
    let mut child = Command::new(&python)
        .arg(root.join("tests/interop/s3_server.py"))
        .arg("--forever")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the S3 server")?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().context("no stdout")?),
        &mut line,
    )?;
    let endpoint = line
        .trim()
        .strip_prefix("MINK_S3_ENDPOINT=")
        .context("the S3 server did not start")?
        .to_string();
    Ok(Store {
        url: format!("s3://{}/cluster", crate::s3::BUCKET),
        s3_pid: Some(child.id()),
        env: vec![
            ("MINK_OBJECT_STORE__ENDPOINT".to_string(), endpoint),
            (
                "MINK_OBJECT_STORE__ALLOW_HTTP".to_string(),
                "true".to_string(),
            ),
            ("AWS_ACCESS_KEY_ID".to_string(), "test".to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), "test".to_string()),
        ],
    })
}

/// Starts node `id` on `store`, its log at `dir/{id}.log`. Every node binds port 0 and
/// reports the addresses it got in its log, so no port is picked here and then raced
/// for. Returns the id, the process id and the log.
fn spawn_node(
    binary: &Path,
    dir: &Path,
    id: &str,
    store: &Store,
) -> Result<(String, u32, PathBuf)> {
    let log = dir.join(format!("{id}.log"));
    let child = process(binary, dir, &log)?
        .env("MINK_NODE_ID", id)
        .env("MINK_DATA_DIR", dir.join(id))
        .env("MINK_OBJECT_STORE__URL", &store.url)
        .env("MINK_LISTENERS__FLIGHT", "127.0.0.1:0")
        .env("MINK_LISTENERS__ADMIN", "127.0.0.1:0")
        .env("MINK_LISTENERS__KAFKA", "127.0.0.1:0")
        .env("MINK_LISTENERS__ICEBERG_REST", "127.0.0.1:0")
        .envs(store.env.iter().cloned())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    Ok((id.to_string(), child.id(), log))
}

/// A started node's entry, once its log names the three addresses it bound (by
/// `deadline`, while it lives).
fn node_entry(id: String, pid: u32, log: PathBuf, deadline: Instant) -> Result<NodeEntry> {
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // The admin line comes last (the catalog's before it).
        if let (Some(flight), Some(kafka), Some(admin)) = (
            logged_addr(&text, "Flight listening on "),
            logged_addr(&text, "Kafka listening on "),
            logged_addr(&text, "admin HTTP listening on "),
        ) {
            let iceberg_rest =
                logged_addr(&text, "Iceberg REST catalog listening on ").unwrap_or_default();
            return Ok(NodeEntry {
                id,
                pid,
                flight,
                kafka,
                admin,
                iceberg_rest,
                log,
            });
        }
        if Instant::now() > deadline || !alive(pid) {
            bail!("node {id} did not start; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A cluster process of `binary` in `dir`, in a process group of its own: this
/// environment without its `MINK_*` settings (the cluster sets its own), logging at
/// `RUST_LOG` or info to `log`, no stdin or stdout.
fn process(binary: &Path, dir: &Path, log: &Path) -> Result<Command> {
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .envs(std::env::vars().filter(|(k, _)| !k.starts_with("MINK_")))
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .process_group(0);
    Ok(cmd)
}

/// Starts a mink-query against every node (any one would do), on a port the OS picks.
fn start_query(binary: &Path, dir: &Path, nodes: &[NodeEntry]) -> Result<QueryEntry> {
    let log = dir.join("query.log");
    let list: Vec<String> = nodes.iter().map(|n| format!("\"{}\"", n.flight)).collect();
    let child = process(binary, dir, &log)?
        .env("MINK_QUERY_LISTEN", "127.0.0.1:0")
        .env("MINK_QUERY_NODES", format!("[{}]", list.join(",")))
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(addr) = logged_addr(&text, "Flight SQL listening on ") {
            return Ok(QueryEntry { pid, addr, log });
        }
        if Instant::now() > deadline || !alive(pid) {
            bail!("mink-query did not start; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The address after `marker` in a node's log (`Flight listening on 127.0.0.1:4711`).
fn logged_addr(log: &str, marker: &str) -> Option<String> {
    let rest = &log[log.find(marker)? + marker.len()..];
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    (!addr.is_empty()).then_some(addr)
}

fn print_nodes(state: &ClusterState) {
    print_node_table(state);
    if let Some(q) = &state.query {
        let health = if alive(q.pid) { "serving" } else { "stopped" };
        println!(
            "sql    {:>8} grpc://{} (mink-query, Flight SQL) {health}",
            q.pid, q.addr
        );
    }
}

fn print_node_table(state: &ClusterState) {
    println!(
        "{:<6} {:>8} {:<22} {:<22} {:<22} {:<22} health",
        "node", "pid", "flight", "kafka", "admin", "iceberg rest"
    );
    for n in &state.nodes {
        let health = if !alive(n.pid) {
            "stopped".to_string()
        } else {
            match http_status(&n.admin, "/health") {
                Some(200) => "serving".to_string(),
                Some(code) => format!("unhealthy ({code})"),
                None => "no answer".to_string(),
            }
        };
        println!(
            "{:<6} {:>8} {:<22} {:<22} {:<22} {:<22} {health}",
            n.id, n.pid, n.flight, n.kafka, n.admin, n.iceberg_rest
        );
    }
}

fn load(dir: &Path) -> Result<ClusterState> {
    let text = std::fs::read(state_file(dir))
        .with_context(|| format!("no cluster is up in {}", dir.display()))?;
    Ok(serde_json::from_slice(&text)?)
}

/// Prints `export MINK_ADDR=…` for the first node, `export MINK_SQL=grpc://…` for the
/// cluster's mink-query, `export KAFKA_BOOTSTRAP=…` with every node's Kafka address,
/// and `export ICEBERG_REST=http://…` for the first node's Iceberg REST catalog
/// (`eval "$(cargo xtask cluster env)"`).
pub fn env(dir: &Path) -> Result<()> {
    let state = load(dir)?;
    let first = state.nodes.first().context("the cluster has no node")?;
    println!("export MINK_ADDR={}", first.flight);
    if let Some(q) = &state.query {
        println!("export MINK_SQL=grpc://{}", q.addr);
    }
    let kafka: Vec<&str> = state
        .nodes
        .iter()
        .map(|n| n.kafka.as_str())
        .filter(|k| !k.is_empty())
        .collect();
    if !kafka.is_empty() {
        println!("export KAFKA_BOOTSTRAP={}", kafka.join(","));
    }
    if !first.iceberg_rest.is_empty() {
        println!("export ICEBERG_REST=http://{}", first.iceberg_rest);
    }
    Ok(())
}

pub fn status(dir: &Path) -> Result<()> {
    let state = load(dir)?;
    println!("object store {}", state.object_store);
    print_nodes(&state);
    Ok(())
}

pub fn down(dir: &Path) -> Result<()> {
    let state = load(dir)?;
    let pids: Vec<u32> = state
        .nodes
        .iter()
        .map(|n| n.pid)
        .chain(state.query.as_ref().map(|q| q.pid))
        .collect();
    for pid in &pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in pids.iter().filter(|p| alive(**p)) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    if let Some(pid) = state.s3_pid {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    std::fs::remove_file(state_file(dir))?;
    println!(
        "cluster in {} is down ({} nodes stopped)",
        dir.display(),
        state.nodes.len()
    );
    Ok(())
}

use std::os::unix::process::CommandExt as _;
