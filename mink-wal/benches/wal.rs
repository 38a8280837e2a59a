//! `cargo xtask bench wal`: s3stream append latency and throughput against the raw
//! object store, in one run, on this machine.
//!
//! Prints a Markdown report on stdout (xtask splices it into docs/benchmarks.md).
//! `--quick` shortens every phase (for a smoke run).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{ObjectStoreConfig, StreamStore, WalConfig, open_object_store};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// The allocator mink-node runs with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Run {
    appends: u64,
    bytes: u64,
    puts: u64,
    secs: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn wal_config() -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        tail_cache_bytes_max: 0,
        ..Default::default()
    }
}

/// p50 and p99 of `n` sequential 1 KiB PUTs, in ms.
async fn raw_put_latency(store: &Arc<dyn ObjectStore>, n: usize) -> (f64, f64) {
    let body = Bytes::from(vec![7u8; 1024]);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        store
            .put(
                &Path::from(format!("raw/lat/{i}")),
                PutPayload::from(body.clone()),
            )
            .await
            .unwrap();
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// p50 and p99 of `n` sequential 1 KiB appends on an idle node, in ms.
async fn idle_append_latency(store: Arc<dyn ObjectStore>, n: usize) -> (f64, f64) {
    let node = StreamStore::open(store, "lat", wal_config()).await.unwrap();
    let stream = node.open_stream("lat", 1).await.unwrap();
    let body = Bytes::from(vec![7u8; 1024]);
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        stream.append_durable(1, 1, 0, body.clone()).await.unwrap();
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// `appenders` closed-loop appenders of `size` bytes over 16 streams for `secs`.
async fn throughput(
    counting: FaultyStore,
    appenders: usize,
    size: usize,
    secs: f64,
    tag: &str,
) -> Run {
    let store: Arc<dyn ObjectStore> = Arc::new(counting.clone());
    let node = StreamStore::open(store, tag, wal_config()).await.unwrap();
    let streams: Vec<_> = {
        let mut v = Vec::new();
        for s in 0..16 {
            v.push(node.open_stream(&format!("{tag}-{s}"), 1).await.unwrap());
        }
        v
    };
    let puts_before = counting.counters().puts.load(Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let appends = Arc::new(AtomicU64::new(0));
    let body = Bytes::from(vec![7u8; size]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for a in 0..appenders {
        let stream = streams[a % streams.len()].clone();
        let (stop, appends, body) = (stop.clone(), appends.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                stream.append_durable(1, 1, 0, body.clone()).await.unwrap();
                appends.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = appends.load(Ordering::Relaxed);
    Run {
        appends: n,
        bytes: n * size as u64,
        puts: counting.counters().puts.load(Ordering::Relaxed) - puts_before,
        secs: elapsed,
    }
}

/// Raw PUT throughput of `total` bytes in `object`-byte objects, `concurrency` at once.
async fn raw_put_throughput(
    store: &Arc<dyn ObjectStore>,
    object: usize,
    total: usize,
    concurrency: usize,
) -> f64 {
    let body = Bytes::from(vec![7u8; object]);
    let count = total.div_ceil(object).max(concurrency);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (store, body, next) = (store.clone(), body.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count as u64 {
                    break;
                }
                store
                    .put(
                        &Path::from(format!("raw/tp/{i}")),
                        PutPayload::from(body.clone()),
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (count * object) as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn file_store() -> (Arc<dyn ObjectStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_object_store(&ObjectStoreConfig {
        url: format!("file://{}", dir.path().display()),
        ..Default::default()
    })
    .unwrap();
    (store, dir)
}

fn latency_store(ms: u64) -> FaultyStore {
    FaultyStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        FaultConfig {
            put_latency: Duration::from_millis(ms),
            ..Default::default()
        },
    )
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let secs = if quick { 0.3 } else { 1.5 };
    let samples = if quick { 10 } else { 50 };
    let mut out = String::new();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    out.push_str(&format!(
        "Run on {cores} cores{}. Latency store: in-memory object store behind the fault \
         wrapper with a fixed PUT latency. `file://` is LocalFileSystem with fsync. \
         Defaults: `group_bytes_max` 8 MiB, `linger_ms` 0, `inflight_uploads_max` 4.\n\n",
        if quick { ", quick mode" } else { "" }
    ));

    // 1. Idle latency against the PUT latency.
    out.push_str("### Idle append latency (1 KiB, one appender)\n\n");
    out.push_str("| store | raw PUT p50 | raw PUT p99 | append p50 | append p99 | append p50 − PUT p50 |\n|---|---|---|---|---|---|\n");
    for (label, store) in [
        (
            "20 ms PUT",
            Arc::new(latency_store(20)) as Arc<dyn ObjectStore>,
        ),
        ("file://", file_store().0),
    ] {
        let (put50, put99) = raw_put_latency(&store, samples).await;
        let (app50, app99) = idle_append_latency(store.clone(), samples).await;
        out.push_str(&format!(
            "| {label} | {put50:.2} ms | {put99:.2} ms | {app50:.2} ms | {app99:.2} ms | {:+.2} ms |\n",
            app50 - put50
        ));
    }

    // 2. Throughput by concurrency and size.
    for (label, ms) in [
        ("20 ms PUT latency", Some(20u64)),
        ("file://, no injected latency", None),
    ] {
        out.push_str(&format!("\n### Throughput, {label}\n\n"));
        out.push_str("| appenders | size | appends/s | MB/s | PUTs | appends per PUT |\n|---|---|---|---|---|---|\n");
        for size in [1024usize, 64 * 1024] {
            for appenders in [1usize, 8, 64, 256] {
                let (counting, _dir) = match ms {
                    Some(ms) => (latency_store(ms), None),
                    None => {
                        let (store, dir) = file_store();
                        (FaultyStore::new(store, FaultConfig::default()), Some(dir))
                    }
                };
                let tag = format!("t{appenders}x{size}");
                let run = throughput(counting, appenders, size, secs, &tag).await;
                out.push_str(&format!(
                    "| {appenders} | {} KiB | {:.0} | {:.1} | {} | {:.1} |\n",
                    size / 1024,
                    run.appends as f64 / run.secs,
                    run.bytes as f64 / run.secs / 1e6,
                    run.puts,
                    run.appends as f64 / run.puts.max(1) as f64
                ));
            }
        }
    }

    // 3. file:// MB/s against raw PUTs of the same bytes, interleaved three times
    // (the disk is shared and noisy); medians reported.
    out.push_str("\n### `file://` WAL throughput against raw PUT throughput\n\n");
    let mut wal = Vec::new();
    let mut raw = Vec::new();
    for round in 0..3 {
        let (store, _dir) = file_store();
        let counting = FaultyStore::new(store.clone(), FaultConfig::default());
        let run = throughput(counting, 256, 64 * 1024, secs, &format!("ratio{round}")).await;
        wal.push(run.bytes as f64 / run.secs / 1e6);
        let avg_object = (run.bytes / run.puts.max(1)) as usize;
        raw.push(raw_put_throughput(&store, avg_object.max(1024), run.bytes as usize, 4).await);
    }
    wal.sort_by(f64::total_cmp);
    raw.sort_by(f64::total_cmp);
    let (wal_mbps, raw_mbps) = (wal[1], raw[1]);
    out.push_str("| WAL MB/s (256 × 64 KiB appenders), median of 3 | raw PUT MB/s (same bytes, same object size, 4 in flight), median of 3 | ratio |\n|---|---|---|\n");
    out.push_str(&format!(
        "| {wal_mbps:.1} | {raw_mbps:.1} | {:.2} |\n",
        wal_mbps / raw_mbps
    ));
    print!("{out}");
}
