//! `cargo xtask bench idle`: object-store requests an idle node and an idle 3-node
//! cluster make, on the wall clock, with the default timings, counted by the node's
//! own request accounting and scaled to an hour. Several runs, so the spread shows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::{Column, DataType, Schema, TableDescriptor, TablePath};
use mink_wal::AccountingReport;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn descriptor(buckets: u32, pk: bool) -> TableDescriptor {
    let mut d = TableDescriptor {
        bucket_keys: Some(vec!["id".into()]),
        bucket_count: buckets,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("msg", DataType::String, true),
            ],
        ))
    };
    if pk {
        d.primary_key = vec!["id".into()];
    }
    d
}

fn rows(n: i64) -> RecordBatch {
    RecordBatch::try_new(
        descriptor(1, false).schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("m{i}")),
            )),
        ],
    )
    .unwrap()
}

async fn retry<T, F, Fut>(f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = mink_types::Result<T>>,
{
    let mut last = None;
    for _ in 0..200 {
        match f().await {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never settled: {last:?}");
}

fn total(reports: &[AccountingReport]) -> u64 {
    reports.iter().map(|r| r.requests).sum()
}

/// One run: `n` nodes on a fresh `file://` store with the default timings, a log and a
/// primary-key table written once, `settle` of quiet, then `window` counted.
/// Returns requests per hour and the per-purpose breakdown of the window.
async fn run(n: usize, settle: Duration, window: Duration) -> (f64, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..n {
        let id = format!("n{i}");
        let mut c = MinkConfig {
            node_id: id.clone(),
            data_dir: dir.path().join(&id),
            ..MinkConfig::default()
        };
        c.object_store.url = format!("file://{}", dir.path().join("objects").display());
        c.listeners = mink_node::config::Listeners::ephemeral();
        nodes.push(Node::start(c).await.unwrap());
    }
    let client = MinkClient::connect(&nodes[0].flight_addr.to_string())
        .await
        .unwrap();
    retry(|| client.create_database("db")).await;
    let log = TablePath::parse("db.events").unwrap();
    client
        .create_table(&log, &descriptor(6, false))
        .await
        .unwrap();
    let pk = TablePath::parse("db.users").unwrap();
    client
        .create_table(&pk, &descriptor(3, true))
        .await
        .unwrap();
    let batch = rows(100);
    retry(|| client.append(&log, &batch)).await;
    retry(|| client.put(&pk, &batch, None, None)).await;
    drop(client);
    tokio::time::sleep(settle).await;
    let before: Vec<AccountingReport> = nodes.iter().map(|n| n.accounting.report()).collect();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after: Vec<AccountingReport> = nodes.iter().map(|n| n.accounting.report()).collect();
    let elapsed = started.elapsed().as_secs_f64();
    let per_hour = (total(&after) - total(&before)) as f64 * 3600.0 / elapsed;
    let mut by: std::collections::BTreeMap<&str, u64> = Default::default();
    for (b, a) in before.iter().zip(&after) {
        for u in &a.by_kind {
            let prior = b
                .by_kind
                .iter()
                .find(|x| x.op == u.op && x.purpose == u.purpose)
                .map_or(0, |x| x.requests);
            *by.entry(u.purpose.as_str()).or_default() += u.requests - prior;
        }
    }
    let breakdown = by
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k} {:.0}", *v as f64 * 3600.0 / elapsed))
        .collect::<Vec<_>>()
        .join(", ");
    for node in nodes {
        node.stop().await;
    }
    (per_hour, breakdown)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (runs, settle, window) = if quick {
        (1, Duration::from_secs(15), Duration::from_secs(15))
    } else {
        // The settle outlasts the first writer checkpoint of every bucket (60 s after
        // its writes) and two compaction rounds: one-off work, not idle cost.
        (3, Duration::from_secs(75), Duration::from_secs(60))
    };
    // `--runs N` overrides the number of runs (to run several processes side by side).
    let args: Vec<String> = std::env::args().collect();
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(runs);
    println!(
        "Default timings (5 s heartbeat, 5 s idle tail, 30 s compaction), `file://` store, \
         nodes in one process. A log table (6 buckets) and a primary-key table (3 buckets) \
         are written once; after {} s of quiet, every request the nodes make in {} s is \
         counted and scaled to an hour. {runs} runs per row. GC passes (every 10 compaction \
         ticks at first, backing off to one an hour) add ~10–40 requests an hour per node \
         that a short window may miss; `mink-node/tests/it/cost.rs` counts a whole virtual \
         hour on the paused clock.\n",
        settle.as_secs(),
        window.as_secs()
    );
    println!(
        "| nodes | budget/hour | requests/hour, each run | min–max | by purpose (last run, per hour) |"
    );
    println!("|---|---|---|---|---|");
    for (n, budget) in [(1usize, 2_000), (3, 6_000)] {
        let mut results = Vec::new();
        let mut last = String::new();
        for i in 0..runs {
            eprintln!("idle: {n} node(s), run {}", i + 1);
            let (per_hour, breakdown) = run(n, settle, window).await;
            results.push(per_hour);
            last = breakdown;
        }
        let min = results.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = results.iter().cloned().fold(0.0, f64::max);
        let each = results
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!("| {n} | {budget} | {each} | {min:.0}–{max:.0} | {last} |");
    }
}
