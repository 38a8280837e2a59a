//! `cargo xtask bench kv`: upserts/s and lookup latency on fjall and redb, and upsert
//! throughput against log-table appends of the same rows in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_kv::{KvBackend, KvTablet, PutRequest, open_kv_store};
use mink_log::{AppendRequest, LogConfig, LogTablet, NO_WRITER};
use mink_types::{ChangelogImage, Column, DataType, Schema, TableBucket, TableDescriptor};
use mink_wal::{StreamStore, WalConfig};
use object_store::ObjectStore;
use object_store::memory::InMemory;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000;
const KEYS: i64 = 100_000;
const PUTTERS: usize = 4;

fn schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("name", DataType::String, true),
            Column::new("score", DataType::BigInt, true),
        ],
    )
}

fn batch(seed: u64) -> RecordBatch {
    // A cheap deterministic spread of keys: half updates, half inserts over the run.
    let ids = (0..ROWS as u64).map(|i| ((seed * 7919 + i * 104_729) % KEYS as u64) as i64);
    RecordBatch::try_new(
        schema().to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(StringArray::from_iter_values(
                (0..ROWS).map(|i| format!("name-{seed}-{i}-{}", "x".repeat(80))),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..ROWS as i64).map(|i| i + seed as i64),
            )),
        ],
    )
    .unwrap()
}

fn bucket() -> TableBucket {
    TableBucket::new(1, None, 0)
}

async fn log_rows_per_sec(batches: &[RecordBatch]) -> f64 {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let node = StreamStore::open(store, "log", WalConfig::default())
        .await
        .unwrap();
    let stream = node.open_stream("t1-b0", 1).await.unwrap();
    let log = LogTablet::open(
        bucket(),
        stream,
        false,
        vec![schema()],
        LogConfig::default(),
    )
    .await
    .unwrap();
    let start = Instant::now();
    let chunks: Vec<Vec<RecordBatch>> = (0..PUTTERS)
        .map(|p| batches.iter().skip(p).step_by(PUTTERS).cloned().collect())
        .collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let log = log.clone();
            tokio::spawn(async move {
                for b in chunk {
                    log.append(AppendRequest {
                        writer_id: NO_WRITER,
                        first_sequence: 0,
                        last_sequence: 0,
                        schema_id: 1,
                        change_types: None,
                        batch: b,
                        ipc: None,
                    })
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (batches.len() * ROWS) as f64 / start.elapsed().as_secs_f64()
}

async fn kv_run(
    backend: KvBackend,
    image: ChangelogImage,
    batches: &[RecordBatch],
    lookups: usize,
) -> (f64, Duration, Duration, f64) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let node = StreamStore::open(store, "kv", WalConfig::default())
        .await
        .unwrap();
    let stream = node.open_stream("t1-b0", 1).await.unwrap();
    let log = LogTablet::open(bucket(), stream, true, vec![schema()], LogConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kv = open_kv_store(backend, dir.path()).unwrap();
    let mut descriptor = TableDescriptor {
        primary_key: vec!["id".into()],
        ..TableDescriptor::log_table(schema())
    };
    descriptor.properties.changelog_image = image;
    let tablet = KvTablet::open(
        bucket(),
        log,
        kv.namespace("t1-b0").unwrap(),
        descriptor,
        vec![schema()],
        None,
    )
    .await
    .unwrap();
    let start = Instant::now();
    let chunks: Vec<Vec<RecordBatch>> = (0..PUTTERS)
        .map(|p| batches.iter().skip(p).step_by(PUTTERS).cloned().collect())
        .collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let tablet = tablet.clone();
            tokio::spawn(async move {
                for b in chunk {
                    tablet
                        .put(PutRequest {
                            writer_id: NO_WRITER,
                            batch_sequence: 0,
                            kafka: None,
                            schema_id: 1,
                            target_columns: None,
                            changes: None,
                            batch: b,
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let upserts = (batches.len() * ROWS) as f64 / start.elapsed().as_secs_f64();
    // Point lookups, one key each.
    let mut samples = Vec::with_capacity(lookups);
    for i in 0..lookups {
        let keys = RecordBatch::try_from_iter(vec![(
            "id",
            Arc::new(Int64Array::from(vec![(i as i64 * 7_919) % KEYS])) as _,
        )])
        .unwrap();
        let t = Instant::now();
        std::hint::black_box(tablet.lookup(&keys).unwrap());
        samples.push(t.elapsed());
    }
    samples.sort();
    let p50 = samples[samples.len() / 2];
    let p99 = samples[samples.len() * 99 / 100];
    // Batched lookups of 1,000 keys.
    let keys = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from_iter_values(0..1_000)) as _,
    )])
    .unwrap();
    let t = Instant::now();
    let rounds = 20;
    for _ in 0..rounds {
        std::hint::black_box(tablet.lookup(&keys).unwrap());
    }
    let batched = (rounds * 1_000) as f64 / t.elapsed().as_secs_f64();
    (upserts, p50, p99, batched)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n_batches = if quick { 20 } else { 500 };
    let rounds = if quick { 1 } else { 3 };
    let lookups = if quick { 1_000 } else { 10_000 };
    let batches: Vec<RecordBatch> = (0..n_batches).map(batch).collect();
    let mut out = String::new();
    out.push_str(&format!(
        "In-memory object store (no injected latency), one bucket, {PUTTERS} concurrent writers, {n_batches} batches of {ROWS} rows (~100 B) over {KEYS} keys (inserts and updates mixed), `last_row`, full rows. {rounds} rounds, log and KV alternating; the figures are each round's.\n\n| backend | round | upserts/s | log appends/s (same rows) | ratio | lookup p50 | lookup p99 | batched lookups (1,000 keys) |\n|---|---|---|---|---|---|---|---|\n"
    ));
    // Each configuration runs in a process of its own (this binary again, with
    // `MINK_BENCH_KV_RUN=INDEX`): a store's background work (fjall flushes and
    // compactions after a run) would otherwise slow the runs after it.
    // `MINK_BENCH_KV_BACKENDS=fjall` (or `redb`) runs one backend, for profiles.
    let only = std::env::var("MINK_BENCH_KV_BACKENDS").unwrap_or_default();
    let runs = [
        (KvBackend::Fjall, ChangelogImage::Full),
        (KvBackend::Fjall, ChangelogImage::Wal),
        (KvBackend::Redb, ChangelogImage::Full),
    ];
    let child: Option<usize> = std::env::var("MINK_BENCH_KV_RUN")
        .ok()
        .and_then(|v| v.parse().ok());
    for (i, (backend, image)) in runs.into_iter().enumerate() {
        if !only.is_empty() && !only.eq_ignore_ascii_case(&format!("{backend:?}")) {
            continue;
        }
        if child.is_some_and(|c| c != i) {
            continue;
        }
        if child.is_none() {
            let run = std::process::Command::new(std::env::current_exe().unwrap())
                .args(std::env::args().skip(1))
                .env("MINK_BENCH_KV_RUN", i.to_string())
                .output()
                .unwrap();
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            out.push_str(&String::from_utf8_lossy(&run.stdout));
            continue;
        }
        let name = match image {
            ChangelogImage::Full => format!("{backend:?}"),
            ChangelogImage::Wal => format!("{backend:?}, `changelog_image=wal`"),
        };
        // Warm up the allocator and caches once, so that both figures see the same state.
        log_rows_per_sec(&batches).await;
        for round in 1..=rounds {
            let log = log_rows_per_sec(&batches).await;
            let (upserts, p50, p99, batched) = kv_run(backend, image, &batches, lookups).await;
            out.push_str(&format!(
                "| {name} | {round} | {upserts:.0} | {log:.0} | {:.2} | {:.1} µs | {:.1} µs | {batched:.0} keys/s |\n",
                upserts / log,
                p50.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6
            ));
        }
    }
    if child.is_some() {
        // Only the rows: the parent prints the heading.
        out = out
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| backend"))
            .map(|l| format!("{l}\n"))
            .collect();
    }
    print!("{out}");
}
