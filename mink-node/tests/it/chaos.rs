//! The chaos harness: a cluster of `mink-node` processes on one object store, written
//! to by idempotent Rust clients (a log table and a primary-key table; one client
//! shared by several tasks, so that its appends to a bucket are pipelined), a pyarrow
//! AppendTable writer (`chaos_pyarrow_writer.py`), an idempotent librdkafka producer
//! (`chaos_kafka_producer.py`) and a librdkafka consumer group on its topic
//! (`chaos_kafka_consumer.py`; the three when `MINKTEST_CHAOS_PYTHON` is set),
//! while a seeded controller injects faults: SIGKILL and restart, SIGSTOP long enough
//! to lose the lease and the buckets then SIGCONT, object-store PUT failures /
//! ambiguous timeouts / latency through the nodes' fault injector
//! (`testing.fault_injection`, `POST /fault`), `rebalance` under load, and a node
//! joining (the previous joiner leaving for good). Every kind comes once per cycle in
//! a seeded order; from the second cycle on, about a third of the faults overlap with
//! a second one on another node.
//!
//! After the faults stop and the cluster settles, the checker verifies: every
//! acknowledged row is readable at its acknowledged offset, no idempotent writer's row
//! appears twice, offsets are contiguous in every bucket, and primary-key lookups equal
//! the model built from acknowledged writes; for Kafka, every acknowledged record once
//! at its reported offset, and the consumer group's reads and commits against the
//! topic (`check_kafka_group`). It also measures, after each fault, the
//! time until every bucket accepts writes again.
//!
//! `MINK_CHAOS_SECONDS` (default 40), `MINK_CHAOS_SEED` (default 1) and, for an S3
//! store, `MINK_CHAOS_S3=1` with the local S3 server's `MINKTEST_S3_*` variables.
//! `cargo xtask chaos` runs it in release mode for longer.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use mink_flight::MinkClient;
use mink_flight::protocol::{BucketWritten, WriteResult};
use mink_types::table::BucketingRule;
use mink_types::{Column, DataType, Schema, TableBucket, TableDescriptor, TablePath};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common;

const LOG_BUCKETS: u32 = 6;
const KV_BUCKETS: u32 = 4;
const LOG_WRITERS: i64 = 3;
/// Tasks appending through one shared client (pipelined per bucket).
const PIPELINED_WRITERS: i64 = 4;
/// The writer number of the first pipelined task (row ids `w × 10⁹ + …`, clear of the
/// other writers and of the probes at 9 × 10⁹).
const PIPELINED_FIRST_WRITER: i64 = 10;
const KV_WRITERS: i64 = 2;
const KEYS_PER_KV_WRITER: i64 = 12;
/// The pyarrow writer's ids are `PYARROW_WRITER * 10^9 + n`.
const PYARROW_WRITER: i64 = 7;

/// One node process.
struct Proc {
    id: String,
    child: Option<Child>,
    flight: String,
    admin: String,
    kafka: String,
    stopped: bool,
}

struct Cluster {
    dir: PathBuf,
    store_env: Vec<(String, String)>,
    nodes: Vec<Proc>,
}

fn node_env(dir: &Path, id: &str, store_env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "RUST_LOG".into(),
            "warn,mink_node=info,mink_wal::stream=info".into(),
        ),
        ("MINK_NODE_ID".into(), id.into()),
        ("MINK_DATA_DIR".into(), dir.join(id).display().to_string()),
        ("MINK_LISTENERS__FLIGHT".into(), "127.0.0.1:0".into()),
        ("MINK_LISTENERS__ADMIN".into(), "127.0.0.1:0".into()),
        ("MINK_LISTENERS__KAFKA".into(), "127.0.0.1:0".into()),
        ("MINK_LISTENERS__ICEBERG_REST".into(), "127.0.0.1:0".into()),
        ("MINK_META__HEARTBEAT_INTERVAL_MS".into(), "200".into()),
        ("MINK_META__LEASE_TIMEOUT_MS".into(), "2000".into()),
        ("MINK_META__NODE_SESSION_TIMEOUT_MS".into(), "3000".into()),
        ("MINK_META__TAIL_IDLE_INTERVAL_MAX_MS".into(), "200".into()),
        ("MINK_WAL__UPLOAD_RETRY_BUDGET_MS".into(), "2000".into()),
        ("MINK_WAL__COMPACTION_INTERVAL_MS".into(), "2000".into()),
        ("MINK_WAL__DEAD_WAL_GRACE_MS".into(), "5000".into()),
        ("MINK_KV__SNAPSHOT_INTERVAL_MS".into(), "3000".into()),
        ("MINK_LOG__TTL_CHECK_INTERVAL_MS".into(), "500".into()),
        ("MINK_TESTING__FAULT_INJECTION".into(), "true".into()),
        // The Kafka topic gets 4 partitions, so the consumer group's members split them.
        ("MINK_KAFKA__DEFAULT_PARTITIONS".into(), "4".into()),
    ];
    env.extend(store_env.iter().cloned());
    env
}

impl Cluster {
    fn spawn(&self, id: &str) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mink-node"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in node_env(&self.dir, id, &self.store_env) {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the mink-node binary starts");
        // Appended to: a restarted node's earlier lives stay in its log (a takeover
        // after a restart is explained by what the previous process did).
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{id}.log")))
            .ok();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (mut flight, mut admin, mut kafka) = (None, None, None);
        let mut log = log;
        while flight.is_none() || admin.is_none() {
            let line = lines
                .next()
                .expect("the node reports its addresses before exiting")
                .unwrap();
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            let after = |marker: &str| {
                line.find(marker).map(|at| {
                    line[at + marker.len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string()
                })
            };
            if let Some(a) = after("Flight listening on ") {
                flight = Some(a);
            }
            if let Some(a) = after("admin HTTP listening on ") {
                admin = Some(a);
            }
            if let Some(a) = after("Kafka listening on ") {
                kafka = Some(a);
            }
        }
        std::thread::spawn(move || {
            for line in lines.map_while(|l| l.ok()) {
                if let Some(f) = log.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
            }
        });
        Proc {
            id: id.into(),
            child: Some(child),
            flight: flight.unwrap_or_default(),
            admin: admin.unwrap_or_default(),
            kafka: kafka.unwrap_or_default(),
            stopped: false,
        }
    }

    fn signal(&mut self, i: usize, sig: &str) {
        if let Some(child) = &self.nodes[i].child {
            let _ = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status();
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn restart(&mut self, i: usize) {
        self.kill(i);
        let id = self.nodes[i].id.clone();
        self.nodes[i] = self.spawn(&id);
    }

    /// Writes the live Flight addresses to `addrs`, where the pyarrow writer finds
    /// them, and the Kafka ones to `kafka_addrs`, for the Kafka producer.
    fn publish(&self) {
        let _ = std::fs::write(self.dir.join("addrs"), self.addrs().join("\n"));
        let kafka: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some() && !n.stopped && !n.kafka.is_empty())
            .map(|n| n.kafka.clone())
            .collect();
        let _ = std::fs::write(self.dir.join("kafka_addrs"), kafka.join("\n"));
    }

    fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && !n.stopped)
            .map(|n| n.flight.clone())
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.signal(i, "-CONT");
            self.kill(i);
        }
    }
}

/// `POST /fault` on a node's admin endpoint (a plain HTTP/1.1 request).
fn post_fault(admin: &str, body: &str) -> bool {
    let Ok(mut conn) = std::net::TcpStream::connect(admin) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!(
        "POST /fault HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if conn.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

fn schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("msg", DataType::String, true),
        ],
    )
}

/// The primary-key table: a `log_ttl` of 2 s, so that its changelog is trimmed all
/// the time (only below a KV snapshot, which the TTL writes first when it must) while
/// its buckets move, fail over and recover from snapshot plus changelog.
fn kv_table() -> TableDescriptor {
    let mut d = TableDescriptor {
        primary_key: vec!["id".into()],
        bucket_keys: Some(vec!["id".into()]),
        bucket_count: KV_BUCKETS,
        ..TableDescriptor::log_table(schema())
    };
    d.properties.set("log_ttl", "2s").unwrap();
    d
}

fn batch(ids: &[i64], msg: impl Fn(i64) -> String) -> RecordBatch {
    RecordBatch::try_new(
        schema().to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.iter().copied())),
            Arc::new(StringArray::from_iter_values(ids.iter().map(|i| msg(*i)))),
        ],
    )
    .unwrap()
}

/// The bucket of each id of the log table.
fn buckets_of(ids: &[i64], count: u32) -> Vec<u32> {
    let b = batch(ids, |_| String::new());
    mink_types::bucket_per_row(&b, &[0], BucketingRule::Hash, count).unwrap()
}

#[derive(Default)]
struct Ledger {
    /// Acknowledged log rows: bucket -> first offset -> ids in offset order.
    log_acked: BTreeMap<u32, BTreeMap<i64, Vec<i64>>>,
    log_rows_acked: u64,
    log_calls_failed: u64,
    /// AppendTable calls of the pyarrow writer: acknowledged, failed.
    py_acked: u64,
    py_failed: u64,
    /// Primary-key writes: key -> (last acknowledged value, values whose outcome is unknown since).
    kv: HashMap<i64, (Option<String>, Vec<String>)>,
    kv_acked: u64,
    kv_failed: u64,
    /// Kafka records: id -> (partition, offset) when acknowledged, `None` when failed.
    kafka: HashMap<i64, Option<(i32, i64)>>,
    kafka_acked: u64,
    kafka_failed: u64,
    /// What the consumer group consumed: (partition, offset, value).
    kafka_consumed: Vec<(i32, i64, String)>,
    /// The highest commit the group's members saw confirmed, per partition.
    kafka_committed: HashMap<i32, i64>,
    /// The group's committed offsets read back after the run.
    kafka_final_committed: Option<HashMap<i32, i64>>,
    /// Kafka records in the topic more than once, each copy under another epoch of
    /// the same producer: librdkafka re-sent them after bumping its epoch (below).
    kafka_resent_after_bump: u64,
    violations: Vec<String>,
}

type Shared = Arc<Mutex<Ledger>>;

fn ledger(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records an acknowledged append of `ids`: each bucket's part at its offsets.
fn record_log_ack(l: &Shared, ids: &[i64], written: &[BucketWritten]) {
    let buckets = buckets_of(ids, LOG_BUCKETS);
    let mut per_bucket: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for (id, b) in ids.iter().zip(buckets) {
        per_bucket.entry(b).or_default().push(*id);
    }
    let mut l = ledger(l);
    for w in written {
        let rows = per_bucket.remove(&w.bucket.bucket).unwrap_or_default();
        if rows.len() as i64 != w.last_offset - w.first_offset + 1 {
            l.violations.push(format!(
                "{}: {} rows acknowledged at {}..={}",
                w.bucket,
                rows.len(),
                w.first_offset,
                w.last_offset
            ));
        }
        l.log_rows_acked += rows.len() as u64;
        l.log_acked
            .entry(w.bucket.bucket)
            .or_default()
            .insert(w.first_offset, rows);
    }
    if !per_bucket.is_empty() {
        l.violations.push(format!(
            "an append was acknowledged without buckets {:?}",
            per_bucket.keys().collect::<Vec<_>>()
        ));
    }
}

async fn connect(cluster: &Arc<Mutex<Cluster>>) -> MinkClient {
    loop {
        let addrs = cluster.lock().unwrap().addrs();
        for addr in addrs {
            if let Ok(c) = MinkClient::connect(&addr).await {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn log_writer(
    cluster: Arc<Mutex<Cluster>>,
    l: Shared,
    w: i64,
    stop: Arc<AtomicBool>,
    path: TablePath,
) {
    let mut client = connect(&cluster).await;
    let mut n = 0i64;
    while !stop.load(Ordering::SeqCst) {
        let ids: Vec<i64> = (0..12).map(|i| w * 1_000_000_000 + n * 12 + i).collect();
        n += 1;
        match client
            .append(&path, &batch(&ids, |i| format!("m{i}")))
            .await
        {
            Ok(written) => record_log_ack(&l, &ids, &written),
            Err(_) => {
                ledger(&l).log_calls_failed += 1;
                // The node we know may be gone for good (killed): start over elsewhere.
                client = connect(&cluster).await;
            }
        }
    }
}

/// `PIPELINED_WRITERS` tasks appending through one client, which keeps up to five
/// batches of a bucket in flight. After a failed call the client is replaced by a
/// fresh one (its node may be gone for good), once for all tasks.
fn pipelined_writers(
    cluster: Arc<Mutex<Cluster>>,
    l: Shared,
    first_writer: i64,
    stop: Arc<AtomicBool>,
    path: TablePath,
) -> Vec<tokio::task::JoinHandle<()>> {
    let shared: Arc<tokio::sync::RwLock<Option<Arc<MinkClient>>>> = Arc::default();
    (0..PIPELINED_WRITERS)
        .map(|k| {
            let (cluster, l, stop, path, shared) = (
                cluster.clone(),
                l.clone(),
                stop.clone(),
                path.clone(),
                shared.clone(),
            );
            let w = first_writer + k;
            tokio::spawn(async move {
                let mut n = 0i64;
                while !stop.load(Ordering::SeqCst) {
                    let client = {
                        let mut current = shared.write().await;
                        match current.as_ref() {
                            Some(c) => c.clone(),
                            None => {
                                let c = Arc::new(connect(&cluster).await);
                                *current = Some(c.clone());
                                c
                            }
                        }
                    };
                    let ids: Vec<i64> = (0..12).map(|i| w * 1_000_000_000 + n * 12 + i).collect();
                    n += 1;
                    match client
                        .append(&path, &batch(&ids, |i| format!("p{i}")))
                        .await
                    {
                        Ok(written) => record_log_ack(&l, &ids, &written),
                        Err(_) => {
                            ledger(&l).log_calls_failed += 1;
                            let mut current = shared.write().await;
                            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &client)) {
                                *current = None;
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

async fn kv_writer(
    cluster: Arc<Mutex<Cluster>>,
    l: Shared,
    w: i64,
    stop: Arc<AtomicBool>,
    seal: Arc<AtomicBool>,
    path: TablePath,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x4B56 + w as u64));
    let mut client = connect(&cluster).await;
    let keys: Vec<i64> = (0..KEYS_PER_KV_WRITER).map(|k| w * 1_000 + k).collect();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let key = keys[rng.random_range(0..keys.len())];
        n += 1;
        let value = format!("w{w}-{n}");
        let put = client
            .put(&path, &batch(&[key], |_| value.clone()), None, None)
            .await;
        let failed = {
            let mut led = ledger(&l);
            let entry = led.kv.entry(key).or_default();
            match put {
                Ok(_) => {
                    *entry = (Some(value), Vec::new());
                    led.kv_acked += 1;
                    false
                }
                Err(_) => {
                    entry.1.push(value);
                    led.kv_failed += 1;
                    true
                }
            }
        };
        if failed {
            client = connect(&cluster).await;
        }
    }
    // Seal: the last write of every key is acknowledged, so the final state is known.
    while !seal.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for key in keys {
        let value = format!("w{w}-final");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match client
                .put(&path, &batch(&[key], |_| value.clone()), None, None)
                .await
            {
                Ok(_) => {
                    ledger(&l).kv.insert(key, (Some(value), Vec::new()));
                    break;
                }
                Err(e) if Instant::now() > deadline => {
                    ledger(&l)
                        .violations
                        .push(format!("key {key}: never writable after the faults: {e}"));
                    break;
                }
                Err(_) => {
                    client = connect(&cluster).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// The kinds of fault the controller injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Pause,
    StoreDown,
    AmbiguousPuts,
    Latency,
    Rebalance,
    Join,
    /// A bucket moved to another live node and, a moment later, back (the previous
    /// leader idle meanwhile: its view of the stream metadata is stale).
    MoveBack,
}

/// The seeded parameters of one fault.
struct Plan {
    millis: u64,
    seed: u32,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::Kill,
        Fault::Pause,
        Fault::StoreDown,
        Fault::AmbiguousPuts,
        Fault::Latency,
        Fault::Rebalance,
        Fault::Join,
        Fault::MoveBack,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::StoreDown => "store down (PUTs fail)",
            Fault::AmbiguousPuts => "ambiguous PUTs",
            Fault::Latency => "latency spike",
            Fault::Rebalance => "rebalance",
            Fault::Join => "join",
            Fault::MoveBack => "move and back",
        }
    }

    fn plan(self, rng: &mut StdRng) -> Plan {
        let millis = match self {
            Fault::Kill => rng.random_range(300..1_500),
            // Long enough to lose the lease (2 s) and the buckets (session 3 s).
            Fault::Pause => rng.random_range(3_500..5_500),
            Fault::StoreDown | Fault::AmbiguousPuts => rng.random_range(2_000..4_000),
            Fault::Latency => rng.random_range(1_000..3_000),
            Fault::MoveBack => rng.random_range(200..1_500),
            Fault::Rebalance | Fault::Join => 0,
        };
        Plan {
            millis,
            seed: rng.random(),
        }
    }
}

/// The wall-clock time of day, UTC, as the nodes' logs print it (`HH:MM:SS.mmm`).
fn utc_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        now.subsec_millis()
    )
}

/// Injects one fault on node `i` and waits until it is over (the recovery is measured
/// by the caller). A join starts a new node; the node of the previous join, if any,
/// leaves for good first (killed, never restarted), so the cluster stays at four.
async fn inject(
    cluster: &Arc<Mutex<Cluster>>,
    admin: &MinkClient,
    fault: Fault,
    i: usize,
    plan: Plan,
    joined: u32,
) {
    let pause = Duration::from_millis(plan.millis);
    let admin_of = |i: usize| cluster.lock().unwrap().nodes[i].admin.clone();
    match fault {
        Fault::Kill => {
            cluster.lock().unwrap().signal(i, "-KILL");
            tokio::time::sleep(pause).await;
            cluster.lock().unwrap().restart(i);
        }
        Fault::Pause => {
            {
                let mut c = cluster.lock().unwrap();
                c.signal(i, "-STOP");
                c.nodes[i].stopped = true;
            }
            tokio::time::sleep(pause).await;
            let mut c = cluster.lock().unwrap();
            c.signal(i, "-CONT");
            c.nodes[i].stopped = false;
        }
        Fault::StoreDown => {
            let admin_addr = admin_of(i);
            post_fault(&admin_addr, r#"{"put_failure_rate": 1.0}"#);
            tokio::time::sleep(pause).await;
            post_fault(&admin_addr, "{}");
        }
        Fault::AmbiguousPuts => {
            let admin_addr = admin_of(i);
            let body = format!(
                r#"{{"put_ambiguous_rate": 0.3, "put_conflict_rate": 0.2, "put_failure_rate": 0.1, "seed": {}}}"#,
                plan.seed
            );
            post_fault(&admin_addr, &body);
            tokio::time::sleep(pause).await;
            post_fault(&admin_addr, "{}");
        }
        Fault::Latency => {
            let admin_addr = admin_of(i);
            post_fault(&admin_addr, r#"{"put_latency_ms": 300, "jitter_ms": 200}"#);
            tokio::time::sleep(pause).await;
            post_fault(&admin_addr, "{}");
        }
        Fault::Rebalance => {
            let _ = admin
                .action::<serde_json::Value>("rebalance", serde_json::json!({}))
                .await;
        }
        Fault::MoveBack => move_and_back(admin, pause, plan.seed).await,
        Fault::Join => {
            let mut c = cluster.lock().unwrap();
            if c.nodes.len() > 3 {
                let last = c.nodes.len() - 1;
                c.kill(last);
                c.nodes.pop();
            }
            let node = c.spawn(&format!("j{joined}"));
            c.nodes.push(node);
        }
    }
}

/// Moves one bucket (of either table, chosen by `seed`) to another live node, waits
/// `pause`, and moves it back to the node that led it, if that one is still alive.
async fn move_and_back(admin: &MinkClient, pause: Duration, seed: u32) {
    let mut rng = StdRng::seed_from_u64(seed as u64);
    let path = if rng.random_bool(0.5) {
        "chaos.kv"
    } else {
        "chaos.events"
    };
    let (Ok(meta), Ok(cluster)) = (
        admin
            .action::<serde_json::Value>("metadata", serde_json::json!({"path": path}))
            .await,
        admin
            .action::<serde_json::Value>("describe_cluster", serde_json::json!({}))
            .await,
    ) else {
        return;
    };
    let buckets = meta["buckets"].as_array().cloned().unwrap_or_default();
    // `nodes` maps each node id to what the cluster knows of it.
    let nodes: Vec<String> = cluster["nodes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, n)| n["alive"].as_bool() == Some(true))
        .map(|(id, _)| id.clone())
        .collect();
    if buckets.is_empty() || nodes.len() < 2 {
        return;
    }
    let b = &buckets[rng.random_range(0..buckets.len())];
    let Some(from) = b["leader"].as_str().map(String::from) else {
        return;
    };
    let others: Vec<&String> = nodes.iter().filter(|n| **n != from).collect();
    let Some(to) = others.get(rng.random_range(0..others.len().max(1))) else {
        return;
    };
    let mv = |to: &str| serde_json::json!({"moves": [{"bucket": b["bucket"], "to": to}]});
    let _ = admin.action::<serde_json::Value>("rebalance", mv(to)).await;
    tokio::time::sleep(pause).await;
    let _ = admin
        .action::<serde_json::Value>("rebalance", mv(&from))
        .await;
}

/// A Python helper of the harness (`tests/NAME`, run by `MINKTEST_CHAOS_PYTHON`, which
/// `cargo xtask test` and `cargo xtask chaos` set) and a thread that hands each JSON
/// line it prints to `on_line`; a line that is not JSON is a violation. `None` when no
/// Python is named. `stderr` is where its log goes.
fn python_helper(
    name: &str,
    args: &[String],
    stderr: Stdio,
    l: &Shared,
    on_line: impl Fn(&Shared, serde_json::Value) + Send + 'static,
) -> Option<(Child, std::thread::JoinHandle<()>)> {
    let Ok(python) = std::env::var("MINKTEST_CHAOS_PYTHON") else {
        eprintln!("MINKTEST_CHAOS_PYTHON is not set: no {name} in this run");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    let mut child = Command::new(python)
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
    let out = BufReader::new(child.stdout.take().unwrap());
    let (l, name) = (l.clone(), name.to_string());
    let reader = std::thread::spawn(move || {
        for line in out.lines().map_while(|l| l.ok()) {
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) => on_line(&l, v),
                Err(_) => ledger(&l)
                    .violations
                    .push(format!("{name} printed {line:?}")),
            }
        }
    });
    Some((child, reader))
}

/// The pyarrow AppendTable writer (chaos_pyarrow_writer.py): its acknowledged calls go
/// into the ledger like the Rust writers'.
fn pyarrow_writer(
    dir: &Path,
    l: &Shared,
    path: &TablePath,
) -> Option<(Child, std::thread::JoinHandle<()>)> {
    let args = [
        dir.join("addrs").display().to_string(),
        path.to_string(),
        PYARROW_WRITER.to_string(),
    ];
    python_helper(
        "chaos_pyarrow_writer.py",
        &args,
        Stdio::inherit(),
        l,
        |l, v| {
            if v.get("failed").is_some() {
                ledger(l).py_failed += 1;
                return;
            }
            let ids: Vec<i64> = serde_json::from_value(v["ids"].clone()).unwrap_or_default();
            match serde_json::from_value::<WriteResult>(v["answer"].clone()) {
                Ok(WriteResult::Routed { buckets }) => {
                    record_log_ack(l, &ids, &buckets);
                    ledger(l).py_acked += 1;
                }
                other => ledger(l)
                    .violations
                    .push(format!("AppendTable answered {other:?}")),
            }
        },
    )
}

/// The Kafka topic the producer writes (table `kafka.chaos`).
const KAFKA_TOPIC: &str = "chaos";

/// The idempotent librdkafka producer (`chaos_kafka_producer.py`): its delivery reports
/// go into the ledger.
fn kafka_producer(dir: &Path, l: &Shared) -> Option<(Child, std::thread::JoinHandle<()>)> {
    let args = [
        dir.join("kafka_addrs").display().to_string(),
        KAFKA_TOPIC.to_string(),
    ];
    // librdkafka logs every broker that goes away: into a file, not the test's output
    // (kept with the other logs when the run finds violations).
    let log = std::fs::File::create(dir.join("kafka_producer.log"))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    python_helper("chaos_kafka_producer.py", &args, log, l, |l, v| {
        let mut led = ledger(l);
        if let Some(id) = v["failed"].as_i64() {
            led.kafka_failed += 1;
            led.kafka.insert(id, None);
        } else if let (Some(id), Some(p), Some(o)) = (
            v["id"].as_i64(),
            v["partition"].as_i64(),
            v["offset"].as_i64(),
        ) {
            led.kafka_acked += 1;
            if let Some(Some(before)) = led.kafka.insert(id, Some((p as i32, o))) {
                led.violations
                    .push(format!("Kafka record {id} acknowledged twice: {before:?}"));
            }
        }
    })
}

/// The consumer group of the harness.
const KAFKA_GROUP: &str = "chaos-group";

/// The consumer group (`chaos_kafka_consumer.py`, two members, one of them replaced
/// every 15 s): what it consumed and the commits it saw confirmed go into the ledger.
fn kafka_consumer(dir: &Path, l: &Shared) -> Option<(Child, std::thread::JoinHandle<()>)> {
    let args = [
        dir.join("kafka_addrs").display().to_string(),
        KAFKA_TOPIC.to_string(),
        KAFKA_GROUP.to_string(),
    ];
    python_helper(
        "chaos_kafka_consumer.py",
        &args,
        Stdio::null(),
        l,
        |l, v| {
            let mut led = ledger(l);
            if let Some(committed) = v["committed"].as_array() {
                for pair in committed {
                    if let (Some(p), Some(o)) = (pair[0].as_i64(), pair[1].as_i64()) {
                        let at = led.kafka_committed.entry(p as i32).or_insert(o);
                        *at = (*at).max(o);
                    }
                }
            } else if let (Some(p), Some(o), Some(value)) = (
                v["partition"].as_i64(),
                v["offset"].as_i64(),
                v["value"].as_str(),
            ) {
                led.kafka_consumed.push((p as i32, o, value.to_string()));
            }
        },
    )
}

/// The group's committed offsets, read back once by a fresh librdkafka consumer.
fn kafka_final_committed(dir: &Path, l: &Shared) {
    let args = [
        "--committed".to_string(),
        dir.join("kafka_addrs").display().to_string(),
        KAFKA_TOPIC.to_string(),
        KAFKA_GROUP.to_string(),
    ];
    let Some((mut child, reader)) = python_helper(
        "chaos_kafka_consumer.py",
        &args,
        Stdio::null(),
        l,
        |l, v| {
            let mut led = ledger(l);
            match v["final"].as_array() {
                Some(pairs) => {
                    led.kafka_final_committed = Some(
                        pairs
                            .iter()
                            .filter_map(|p| Some((p[0].as_i64()? as i32, p[1].as_i64()?)))
                            .collect(),
                    )
                }
                None => led
                    .violations
                    .push(format!("the group's committed offsets cannot be read: {v}")),
            }
        },
    ) else {
        return;
    };
    let _ = child.wait();
    let _ = reader.join();
}

/// The consumer group's view against the topic as read back (`at`: the record at each
/// (partition, offset)): everything it consumed is what the topic holds there (nothing
/// read above the high watermark and lost later); the offsets it committed are still
/// committed after the run (at least the highest it saw confirmed); and every record
/// below a committed offset was consumed by some member (no record skipped).
fn check_kafka_group(l: &mut Ledger, at: &HashMap<(i32, i64), String>) {
    let mut violations = Vec::new();
    let mut consumed: HashMap<i32, std::collections::BTreeSet<i64>> = HashMap::new();
    for (p, o, value) in &l.kafka_consumed {
        match at.get(&(*p, *o)) {
            Some(v) if v == value => {}
            other => violations.push(format!(
                "the group consumed {value:?} at ({p}, {o}); the topic holds {other:?} there"
            )),
        }
        consumed.entry(*p).or_default().insert(*o);
    }
    let finals = l.kafka_final_committed.clone().unwrap_or_default();
    for (p, seen) in &l.kafka_committed {
        let last = finals.get(p).copied().unwrap_or(-1);
        if last < *seen {
            violations.push(format!(
                "partition {p}: a commit of {seen} was confirmed, the group's offset is {last} after the run"
            ));
        }
    }
    for (p, committed) in &finals {
        let got = consumed.get(p);
        if let Some(missing) = (0..*committed)
            .find(|o| at.contains_key(&(*p, *o)) && !got.is_some_and(|s| s.contains(o)))
        {
            violations.push(format!(
                "partition {p}: offset {missing} is below the committed {committed} but no member consumed it"
            ));
        }
    }
    l.violations.extend(violations.into_iter().take(20));
}

/// Reads the Kafka topic back: every acknowledged record at its reported partition and
/// offset, no record (acknowledged or failed) twice under one producer epoch; then the
/// consumer group's view against it ([`check_kafka_group`]). Returns the records read.
///
/// Idempotence holds per producer id *and epoch*, as in Kafka. librdkafka bumps its
/// epoch (KIP-360) when messages time out or after an OUT_OF_ORDER_SEQUENCE that a
/// failed earlier request caused (librdkafka issue #4953), and then sends again, as
/// new, every message it had no answer for, some of them already written: a copy under
/// an older epoch of the same producer is that, not a broken window. Both copies are
/// told apart by the writer id each batch carries (`ScanBatch::writer_id`).
async fn check_kafka(client: &MinkClient, l: &Shared, dir: &Path) -> u64 {
    use arrow::array::AsArray;
    let path = TablePath::parse(&format!("kafka.{KAFKA_TOPIC}")).unwrap();
    let table = match client
        .action::<serde_json::Value>("get_table", serde_json::json!({"path": path}))
        .await
    {
        Ok(t) => t,
        Err(e) => {
            ledger(l)
                .violations
                .push(format!("cannot read the Kafka topic's table: {e}"));
            return 0;
        }
    };
    let table_id = table["id"]
        .as_i64()
        .or_else(|| table["table"]["id"].as_i64())
        .unwrap_or(-1);
    let partitions = table["descriptor"]["bucket_count"]
        .as_u64()
        .or_else(|| table["table"]["descriptor"]["bucket_count"].as_u64())
        .unwrap_or(0) as u32;
    // Every copy of each record: (partition, offset, writer id).
    let mut found: HashMap<i64, Vec<(i32, i64, Option<i64>)>> = HashMap::new();
    let mut at: HashMap<(i32, i64), String> = HashMap::new();
    let mut violations = Vec::new();
    let mut records = 0u64;
    for p in 0..partitions {
        let bucket = TableBucket::new(table_id, None, p);
        let mut pos = 0i64;
        loop {
            let read = match read_retrying(client, &path, bucket, pos).await {
                Ok(r) => r,
                Err(e) => {
                    violations.push(format!("topic {bucket}: read at {pos} failed: {e}"));
                    break;
                }
            };
            let mut hw = pos;
            let mut progressed = false;
            for (batch, meta) in &read {
                hw = meta.high_watermark;
                let Some(values) = batch.column_by_name("value") else {
                    violations.push("the topic has no value column".into());
                    break;
                };
                let values = values.as_binary::<i32>();
                for r in 0..values.len() {
                    let offset = meta.base_offset + r as i64;
                    at.insert(
                        (p as i32, offset),
                        String::from_utf8_lossy(values.value(r)).into_owned(),
                    );
                    let id = std::str::from_utf8(values.value(r))
                        .ok()
                        .and_then(|v| v.parse::<i64>().ok());
                    match id {
                        Some(id) => {
                            found
                                .entry(id)
                                .or_default()
                                .push((p as i32, offset, meta.writer_id))
                        }
                        None => violations.push(format!("a foreign record at ({p}, {offset})")),
                    }
                    records += 1;
                }
                pos = meta.base_offset + values.len() as i64;
                progressed = true;
            }
            if !progressed || pos >= hw {
                break;
            }
        }
    }
    let mut resent = 0u64;
    for (id, copies) in &found {
        if copies.len() < 2 {
            continue;
        }
        // One producer, each copy under an epoch of its own.
        let writers: Vec<Option<(i64, i64)>> = copies
            .iter()
            .map(|c| c.2.map(mink_types::split_writer))
            .collect();
        let one_producer = writers
            .iter()
            .all(|w| w.is_some() && w.map(|w| w.0) == writers[0].map(|w| w.0));
        let epochs: std::collections::HashSet<_> = writers.iter().map(|w| w.map(|w| w.1)).collect();
        if one_producer && epochs.len() == copies.len() {
            resent += 1;
        } else {
            violations.push(format!(
                "Kafka record {id} is in the topic {} times under one producer epoch (or no producer): {copies:?}",
                copies.len()
            ));
        }
    }
    kafka_final_committed(dir, l);
    let mut led = ledger(l);
    led.kafka_resent_after_bump = resent;
    check_kafka_group(&mut led, &at);
    for (id, acked) in &led.kafka {
        if let Some(at) = acked {
            let copies = found.get(id).map(Vec::as_slice).unwrap_or_default();
            if !copies.iter().any(|c| (c.0, c.1) == *at) {
                violations.push(format!(
                    "Kafka record {id} acknowledged at {at:?} is at {copies:?}"
                ));
            }
        }
    }
    led.violations.extend(violations);
    records
}

/// Ids of the log table, one per bucket (probes), all below `base + PROBE_SPAN`.
fn probe_ids(base: i64) -> Vec<i64> {
    let mut out: BTreeMap<u32, i64> = BTreeMap::new();
    let mut id = base;
    while out.len() < LOG_BUCKETS as usize {
        let b = buckets_of(&[id], LOG_BUCKETS)[0];
        out.entry(b).or_insert(id);
        id += 1;
    }
    assert!(
        id <= base + PROBE_SPAN,
        "probe ids from {base} spill into the next probe's"
    );
    out.into_values().collect()
}

/// The longest a fault's recovery may take (from the end of the fault until every
/// bucket of the log table accepts a write): the lease timeout (2 s here) plus 10 s.
const RECOVERY_BOUND: Duration = Duration::from_secs(12);

/// Ids a probe attempt may take: [`probe_ids`] of consecutive attempts never meet.
const PROBE_SPAN: i64 = 100;

/// Waits until every bucket of the log table accepts a write; returns how long it took.
/// Every attempt writes rows of its own (ids from `next_probe`, which it advances): a
/// failed append may have landed in some buckets, and sending the same rows again
/// through a new client (a new writer) would write those twice, as it would for any
/// caller. A failed probe counts as a failed call: its rows may appear, once.
async fn until_writable(
    cluster: &Arc<Mutex<Cluster>>,
    l: &Shared,
    path: &TablePath,
    next_probe: &mut i64,
) -> Option<Duration> {
    let started = Instant::now();
    let mut client = connect(cluster).await;
    while started.elapsed() < Duration::from_secs(90) {
        let ids = probe_ids(*next_probe);
        *next_probe += PROBE_SPAN;
        match client
            .append(path, &batch(&ids, |i| format!("probe{i}")))
            .await
        {
            Ok(written) => {
                record_log_ack(l, &ids, &written);
                return Some(started.elapsed());
            }
            Err(_) => {
                ledger(l).log_calls_failed += 1;
                client = connect(cluster).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_no_acknowledged_write() {
    let seconds: u64 = std::env::var("MINK_CHAOS_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("MINK_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let dir = tempfile::tempdir().unwrap();
    let store_env: Vec<(String, String)> = match (
        std::env::var("MINK_CHAOS_S3").is_ok(),
        std::env::var("MINKTEST_S3_ENDPOINT"),
        std::env::var("MINKTEST_S3_BUCKET"),
    ) {
        (true, Ok(endpoint), Ok(bucket)) => vec![
            (
                "MINK_OBJECT_STORE__URL".into(),
                format!("s3://{bucket}/chaos-{seed}-{}", std::process::id()),
            ),
            ("MINK_OBJECT_STORE__ENDPOINT".into(), endpoint),
            ("MINK_OBJECT_STORE__ALLOW_HTTP".into(), "true".into()),
            ("MINK_OBJECT_STORE__ACCESS_KEY_ID".into(), "test".into()),
            ("MINK_OBJECT_STORE__SECRET_ACCESS_KEY".into(), "test".into()),
        ],
        (true, _, _) => panic!("MINK_CHAOS_S3 needs MINKTEST_S3_ENDPOINT and MINKTEST_S3_BUCKET"),
        _ => vec![(
            "MINK_OBJECT_STORE__URL".into(),
            format!("file://{}", dir.path().join("objects").display()),
        )],
    };
    let mut cluster = Cluster {
        dir: dir.path().to_path_buf(),
        store_env,
        nodes: Vec::new(),
    };
    for i in 0..3 {
        let node = cluster.spawn(&format!("n{i}"));
        cluster.nodes.push(node);
    }
    cluster.publish();
    let cluster = Arc::new(Mutex::new(cluster));
    let admin = connect(&cluster).await;
    admin.create_database("chaos").await.unwrap();
    let events = TablePath::parse("chaos.events").unwrap();
    let kv = TablePath::parse("chaos.kv").unwrap();
    admin
        .create_table(&events, &common::events_in(LOG_BUCKETS))
        .await
        .unwrap();
    admin.create_table(&kv, &kv_table()).await.unwrap();
    let l: Shared = Arc::default();
    // Every bucket is led and writable before the faults start.
    let mut probe = 9_000_000_000i64;
    until_writable(&cluster, &l, &events, &mut probe)
        .await
        .expect("the cluster serves");

    let stop = Arc::new(AtomicBool::new(false));
    let seal = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..LOG_WRITERS {
        writers.push(tokio::spawn(log_writer(
            cluster.clone(),
            l.clone(),
            w + 1,
            stop.clone(),
            events.clone(),
        )));
    }
    writers.extend(pipelined_writers(
        cluster.clone(),
        l.clone(),
        PIPELINED_FIRST_WRITER,
        stop.clone(),
        events.clone(),
    ));
    for w in 0..KV_WRITERS {
        writers.push(tokio::spawn(kv_writer(
            cluster.clone(),
            l.clone(),
            w + 1,
            stop.clone(),
            seal.clone(),
            kv.clone(),
            seed,
        )));
    }

    let pyarrow = pyarrow_writer(dir.path(), &l, &events);
    let kafka = kafka_producer(dir.path(), &l);
    let group = kafka_consumer(dir.path(), &l);

    // The faults: every kind once per cycle, in a seeded order, so that each kind is
    // injected about equally often; from the second cycle on, some faults overlap with
    // a second one on another node. Each step is followed by a measured recovery.
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut recovery: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    let mut slow_recoveries: Vec<String> = Vec::new();
    let mut cycle: Vec<Fault> = Vec::new();
    let mut cycles = 0;
    let mut joined = 0;
    while started.elapsed() < Duration::from_secs(seconds.saturating_sub(5).max(5)) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        if cycle.is_empty() {
            cycle = Fault::ALL.to_vec();
            cycle.shuffle(&mut rng);
            cycles += 1;
        }
        let fault = cycle.pop().unwrap_or(Fault::Rebalance);
        let live = cluster.lock().unwrap().nodes.len();
        let i = rng.random_range(0..live);
        let plan = fault.plan(&mut rng);
        let second = (cycles > 1 && fault != Fault::Join && rng.random_bool(0.3)).then(|| {
            let other = loop {
                let f = Fault::ALL[rng.random_range(0..Fault::ALL.len())];
                if f != fault && f != Fault::Join {
                    break f;
                }
            };
            let j = (i + rng.random_range(1..live.max(2))) % live;
            (other, j, other.plan(&mut rng))
        });
        if fault == Fault::Join {
            joined += 1;
        }
        // What is injected where, for the report of a slow recovery (the nodes' logs
        // are read by these names and times).
        let what = {
            let c = cluster.lock().unwrap();
            let on = |i: usize| c.nodes.get(i).map_or("?".to_string(), |n| n.id.clone());
            match &second {
                Some((other, j, _)) => format!(
                    "{} on {} + {} on {}",
                    fault.name(),
                    on(i),
                    other.name(),
                    on(*j)
                ),
                None => format!("{} on {}", fault.name(), on(i)),
            }
        };
        let first = inject(&cluster, &admin, fault, i, plan, joined);
        let kind = match second {
            Some((other, j, plan2)) => {
                tokio::join!(first, inject(&cluster, &admin, other, j, plan2, joined));
                *faults.entry(other.name()).or_default() += 1;
                *faults.entry("(overlapping)").or_default() += 1;
                "overlapping"
            }
            None => {
                first.await;
                fault.name()
            }
        };
        *faults.entry(fault.name()).or_default() += 1;
        cluster.lock().unwrap().publish();
        let ended = utc_now();
        match until_writable(&cluster, &l, &events, &mut probe).await {
            Some(took) => {
                if took > RECOVERY_BOUND {
                    slow_recoveries.push(format!(
                        "after a {kind} ({what}, over at {ended} UTC), every bucket was writable \
                         again only after {:.2} s (bound {} s)",
                        took.as_secs_f64(),
                        RECOVERY_BOUND.as_secs()
                    ));
                }
                recovery.entry(kind).or_default().push(took)
            }
            None => ledger(&l).violations.push(format!(
                "after a {kind} ({what}, over at {ended} UTC), some bucket stayed unwritable for 90 s"
            )),
        }
    }

    // Settle: faults off everywhere, writers stop, primary keys sealed.
    {
        let c = cluster.lock().unwrap();
        for n in &c.nodes {
            post_fault(&n.admin, "{}");
        }
    }
    stop.store(true, Ordering::SeqCst);
    seal.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    for (mut child, reader) in [pyarrow, kafka, group].into_iter().flatten() {
        // Its calls in flight are not acknowledged: their rows may or may not land.
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
    }
    let checker = connect(&cluster).await;
    let (rows_checked, keys_checked) = check(&checker, &events, &kv, &l).await;
    let kafka_checked = if std::env::var_os("MINKTEST_CHAOS_PYTHON").is_some() {
        check_kafka(&checker, &l, dir.path()).await
    } else {
        0
    };

    let l = ledger(&l);
    let bumps = epoch_bumps(&dir.path().join("kafka_producer.log"));
    let all: Vec<Duration> = recovery.values().flatten().copied().collect();
    let recovery_line: Vec<String> = recovery
        .iter()
        .chain((!all.is_empty()).then_some((&"every fault", &all)))
        .map(|(k, v)| {
            let mut v = v.clone();
            v.sort();
            format!(
                "{k}: p50 {:.2} s, max {:.2} s",
                v[v.len() / 2].as_secs_f64(),
                v[v.len() - 1].as_secs_f64()
            )
        })
        .collect();
    eprintln!(
        "chaos seed {seed}, {seconds} s: faults {faults:?}; log rows acknowledged {}, failed calls {}; \
         pyarrow AppendTable calls acknowledged {}, failed {}; Kafka records acknowledged \
         {}, failed {}, re-sent by librdkafka after an epoch bump {} (bumps: {bumps}); Kafka records consumed by the group {} (commits on {} partitions); \
         primary-key writes acknowledged {}, failed {}; rows checked \
         {rows_checked}, Kafka records checked {kafka_checked}, keys checked \
         {keys_checked}; violations {}; recovery until every bucket is writable: {}",
        l.log_rows_acked,
        l.log_calls_failed,
        l.py_acked,
        l.py_failed,
        l.kafka_acked,
        l.kafka_failed,
        l.kafka_resent_after_bump,
        l.kafka_consumed.len(),
        l.kafka_committed.len(),
        l.kv_acked,
        l.kv_failed,
        l.violations.len(),
        recovery_line.join("; ")
    );
    let logs = if l.violations.is_empty()
        && slow_recoveries.is_empty()
        && std::env::var_os("MINK_CHAOS_KEEP_LOGS").is_none()
    {
        dir.path().to_path_buf()
    } else {
        // Kept for the post-mortem of a violation or a slow recovery (or, with
        // `MINK_CHAOS_KEEP_LOGS`, to read the nodes' recovery timings).
        let kept = dir.keep();
        println!("node logs kept in {}", kept.display());
        kept
    };
    assert!(
        l.violations.is_empty(),
        "seed {seed}: {} violations (logs in {}):\n{}",
        l.violations.len(),
        logs.display(),
        l.violations.join("\n")
    );
    // The recovery tail: past the bound fails the run, unless asked only to report it
    // (`MINK_CHAOS_RECOVERY_REPORT_ONLY`, for exploring a slow store).
    if !slow_recoveries.is_empty() {
        eprintln!("slow recoveries:\n{}", slow_recoveries.join("\n"));
        assert!(
            std::env::var_os("MINK_CHAOS_RECOVERY_REPORT_ONLY").is_some(),
            "seed {seed}: {} recoveries over the bound (logs in {})",
            slow_recoveries.len(),
            logs.display()
        );
    }
    assert!(
        l.log_rows_acked > 0 && l.kv_acked > 0,
        "the writers made progress"
    );
    // Keep the logs of a failed run: the assertion above leaves the directory.
    drop(l);
}

/// Reads everything back and compares it with the ledger; returns (rows, keys) checked.
async fn check(client: &MinkClient, events: &TablePath, kv: &TablePath, l: &Shared) -> (u64, u64) {
    let mut violations = Vec::new();
    let mut seen: HashMap<i64, (u32, i64)> = HashMap::new();
    let mut rows = 0u64;
    let table_id = client
        .action::<serde_json::Value>("get_table", serde_json::json!({"path": events}))
        .await
        .ok()
        .and_then(|t| t["id"].as_i64().or_else(|| t["table"]["id"].as_i64()));
    let Some(table_id) = table_id else {
        ledger(l)
            .violations
            .push("cannot read the log table's id".into());
        return (0, 0);
    };
    for b in 0..LOG_BUCKETS {
        let bucket = TableBucket::new(table_id, None, b);
        let mut at: BTreeMap<i64, i64> = BTreeMap::new();
        let mut pos = 0i64;
        let mut expected_next: Option<i64> = None;
        loop {
            let read = match read_retrying(client, events, bucket, pos).await {
                Ok(r) => r,
                Err(e) => {
                    violations.push(format!("{bucket}: read at {pos} failed: {e}"));
                    break;
                }
            };
            let mut progressed = false;
            let mut hw = pos;
            for (batch, meta) in &read {
                hw = meta.high_watermark;
                if let Some(next) = expected_next
                    && meta.base_offset != next
                {
                    violations.push(format!(
                        "{bucket}: a batch at {} where {next} was expected",
                        meta.base_offset
                    ));
                }
                let ids = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                for r in 0..ids.len() {
                    let offset = meta.base_offset + r as i64;
                    at.insert(offset, ids.value(r));
                    if let Some(first) = seen.insert(ids.value(r), (b, offset)) {
                        violations.push(format!(
                            "id {} appears twice: {first:?} and ({b}, {offset})",
                            ids.value(r)
                        ));
                    }
                    rows += 1;
                }
                expected_next = Some(meta.base_offset + ids.len() as i64);
                pos = meta.base_offset + ids.len() as i64;
                progressed = true;
            }
            if !progressed || pos >= hw {
                break;
            }
        }
        let led = ledger(l);
        for (first, ids) in led.log_acked.get(&b).into_iter().flatten() {
            for (k, id) in ids.iter().enumerate() {
                let offset = first + k as i64;
                if at.get(&offset) != Some(id) {
                    violations.push(format!(
                        "{bucket}: acknowledged id {id} at offset {offset} is lost (found {:?})",
                        at.get(&offset)
                    ));
                }
            }
        }
    }
    let expected: Vec<(i64, String)> = ledger(l)
        .kv
        .iter()
        .filter_map(|(k, (v, _))| v.clone().map(|v| (*k, v)))
        .collect();
    let keys: Vec<Vec<serde_json::Value>> = expected
        .iter()
        .map(|(k, _)| vec![serde_json::json!(k)])
        .collect();
    let mut found: HashMap<i64, String> = HashMap::new();
    match client.lookup(kv, keys).await {
        Ok(batches) => {
            for b in batches {
                let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                let msgs = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
                for r in 0..b.num_rows() {
                    found.insert(ids.value(r), msgs.value(r).to_string());
                }
            }
        }
        Err(e) => violations.push(format!("lookups failed: {e}")),
    }
    for (k, v) in &expected {
        if found.get(k) != Some(v) {
            violations.push(format!(
                "key {k}: lookup {:?}, last acknowledged {v:?}",
                found.get(k)
            ));
        }
    }
    ledger(l).violations.extend(violations);
    (rows, expected.len() as u64)
}

/// A scan that retries while the bucket is moving or opening.
async fn read_retrying(
    client: &MinkClient,
    path: &TablePath,
    bucket: TableBucket,
    offset: i64,
) -> mink_types::Result<Vec<(RecordBatch, mink_flight::protocol::ScanBatch)>> {
    let mut last = None;
    for _ in 0..100 {
        match client.scan(path, bucket, offset).await {
            Ok(r) => return Ok(r),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last.unwrap())
}

/// librdkafka's epoch bumps in the producer's log (`debug: eos`), by reason: "N
/// message(s) timed out" (the client gave up on them), "skipped sequence numbers" (an
/// OUT_OF_ORDER_SEQUENCE_NUMBER after a failed request), "message sequence gap", ...
fn epoch_bumps(log: &std::path::Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return "no producer log".into();
    };
    let mut reasons: std::collections::BTreeMap<String, u32> = Default::default();
    for line in text.lines() {
        let Some((_, reason)) = line.split_once("epoch bump for ") else {
            continue;
        };
        let reason = reason.split_once(": ").map_or(reason, |(_, r)| r).trim();
        // "140 message(s) timed out on chaos [2]" -> "message(s) timed out".
        let reason = match reason.split_once(" message(s) timed out") {
            Some(_) => "message(s) timed out",
            None => reason,
        };
        *reasons.entry(reason.to_string()).or_default() += 1;
    }
    if reasons.is_empty() {
        return "none".into();
    }
    reasons
        .iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect::<Vec<_>>()
        .join(", ")
}
