//! `cargo xtask bench kafka`: a Kafka client we did not write (librdkafka, through
//! confluent-kafka: `kafka_load.py`) against one node: produce MB/s (1 KiB records,
//! acks=all, idempotent), consume MB/s, produce→consume latency; and, in the same run,
//! the Flight ingest path (the Rust client, 1 KiB rows) as the baseline. On `file://`
//! and with 20 ms of injected PUT latency. `xtask` passes the test venv's Python in
//! `MINKBENCH_PYTHON`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::{Column, DataType, Schema, TableDescriptor, TablePath};
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{ObjectStoreConfig, open_object_store};
use object_store::ObjectStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: u32 = 4;
const ROWS: usize = 1_000;
const WRITERS: usize = 8;

fn store(latency_ms: Option<u64>, dir: &std::path::Path) -> Arc<dyn ObjectStore> {
    match latency_ms {
        None => open_object_store(&ObjectStoreConfig {
            url: format!("file://{}", dir.join("objects").display()),
            ..Default::default()
        })
        .unwrap(),
        Some(ms) => Arc::new(FaultyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig {
                put_latency: Duration::from_millis(ms),
                ..Default::default()
            },
        )),
    }
}

fn config(dir: &std::path::Path) -> MinkConfig {
    let mut c = MinkConfig {
        data_dir: dir.join("data"),
        ..MinkConfig::default()
    };
    c.listeners = mink_node::config::Listeners::ephemeral();
    c.kafka.default_partitions = PARTITIONS;
    c
}

/// CPU time of this process (every thread), in seconds.
fn process_cpu_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Flight ingest: `WRITERS` closed-loop writers of 1 KiB rows; MB/s of row bodies and
/// the CPU seconds per GB this process (node and client) spent on them.
async fn flight_mbps(latency_ms: Option<u64>, secs: f64) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with_store(config(dir.path()), store(latency_ms, dir.path()))
        .await
        .unwrap();
    let addr = node.flight_addr.to_string();
    let client = MinkClient::connect(&addr).await.unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.flight").unwrap();
    let d = TableDescriptor {
        bucket_count: PARTITIONS,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("body", DataType::String, true),
            ],
        ))
    };
    client.create_table(&path, &d).await.unwrap();
    let body = "x".repeat(1024);
    let batch = RecordBatch::try_new(
        d.schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS as i64)),
            Arc::new(StringArray::from_iter_values(
                (0..ROWS).map(|_| body.as_str()),
            )),
        ],
    )
    .unwrap();
    for _ in 0..100 {
        if client.append(&path, &batch).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let cpu = process_cpu_s();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (addr, path, batch) = (addr.clone(), path.clone(), batch.clone());
            tokio::spawn(async move {
                let client = MinkClient::connect(&addr).await.unwrap();
                let mut n = 0usize;
                while Instant::now() < deadline {
                    client.append(&path, &batch).await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut batches = 0;
    for t in tasks {
        batches += t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = process_cpu_s() - cpu;
    node.stop().await;
    let bytes = (batches * ROWS * 1024) as f64;
    (bytes / elapsed / 1e6, cpu / (bytes / 1e9))
}

/// Runs `kafka_load.py MODE BOOTSTRAP TOPIC ARG`; its JSON.
async fn load(python: &str, mode: &str, bootstrap: &str, arg: String) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/kafka_load.py");
    let args = [
        script.to_string(),
        mode.to_string(),
        bootstrap.to_string(),
        "load".to_string(),
        arg,
    ];
    let python = python.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "kafka_load.py {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The Kafka load generator against a fresh node: its JSON, with `node_cpu_s`, the CPU
/// this process (the node alone: the client is another process) spent while it
/// produced.
async fn kafka(latency_ms: Option<u64>, secs: f64, python: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with_store(config(dir.path()), store(latency_ms, dir.path()))
        .await
        .unwrap();
    let bootstrap = node.kafka_addr.expect("the Kafka listener").to_string();
    let cpu = process_cpu_s();
    let mut out = load(python, "produce", &bootstrap, secs.to_string()).await;
    let node_cpu = process_cpu_s() - cpu;
    let produced = out["produced"].as_u64().unwrap();
    let read = load(python, "read", &bootstrap, produced.to_string()).await;
    node.stop().await;
    let o = out.as_object_mut().unwrap();
    o.insert("node_cpu_s".into(), node_cpu.into());
    o.extend(read.as_object().unwrap().clone());
    out
}

fn span(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.2}..{max:.2}")
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let python = std::env::var("MINKBENCH_PYTHON")
        .expect("MINKBENCH_PYTHON: run this with `cargo xtask bench kafka`");
    let (runs, secs) = if quick { (1, 2.0) } else { (3, 6.0) };
    let mut out = format!(
        "One node in-process, {PARTITIONS} partitions/buckets; librdkafka (confluent-kafka) producing 1 KiB records \
         (acks=all, idempotent, linger 5 ms; queued 1,000 at a time, each thousand to one partition in turn, \
         as the Flight writers send each batch to one bucket) for {secs:.0} s, then consuming them from offset 0, then \
         produce→consume latency of 300 records sent 10 ms apart; the Flight ingest path ({WRITERS} Rust-client \
         writers, 1 KiB rows) in the same run as the baseline. {runs} runs, min..max. CPU per GB: \
         CPU seconds spent per GB of record values while producing — the node's alone for Kafka (the \
         client is another process, measured on its own), the node's and its in-process client's for \
         Flight.\n\n\
         | store | Kafka produce MB/s | Flight ingest MB/s | produce / Flight | Kafka consume MB/s | produce→consume p50 | p99 | CPU s/GB: Kafka node | Kafka client | Flight node + client |\n\
         |---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (label, latency) in [("file://", None), ("20 ms PUT latency", Some(20))] {
        let (mut produce, mut flight, mut ratio, mut consume, mut p50, mut p99) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut node_cpu, mut client_cpu, mut flight_cpu) = (vec![], vec![], vec![]);
        for _ in 0..runs {
            let k = kafka(latency, secs, &python).await;
            let (f, fc) = flight_mbps(latency, secs).await;
            let pm = k["produce_mbps"].as_f64().unwrap();
            let gb = k["produced"].as_f64().unwrap() * 1024.0 / 1e9;
            node_cpu.push(k["node_cpu_s"].as_f64().unwrap() / gb);
            client_cpu.push(k["client_cpu_s"].as_f64().unwrap() / gb);
            flight_cpu.push(fc);
            produce.push(pm);
            flight.push(f);
            ratio.push(pm / f);
            consume.push(k["consume_mbps"].as_f64().unwrap());
            p50.push(k["latency_p50_ms"].as_f64().unwrap());
            p99.push(k["latency_p99_ms"].as_f64().unwrap());
        }
        out.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} ms | {} ms | {} | {} | {} |\n",
            span(&produce),
            span(&flight),
            span(&ratio),
            span(&consume),
            span(&p50),
            span(&p99),
            span(&node_cpu),
            span(&client_cpu),
            span(&flight_cpu)
        ));
    }
    print!("{out}");
}
