//! `cargo xtask bench log`: log-tablet append throughput against raw s3stream appends
//! of the same bytes in the same run, and scan throughput from memory and segments.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use bytes::Bytes;
use mink_log::{AppendRequest, LogConfig, LogTablet, NO_WRITER};
use mink_types::{Column, DataType, Schema, TableBucket};
use mink_wal::{ObjectStoreConfig, StreamStore, WalConfig, open_object_store};
use object_store::ObjectStore;

/// The allocator mink-node runs with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1000;
const ROW_BYTES: usize = 1024;
const TABLETS: usize = 4;
const APPENDERS_PER_TABLET: usize = 4;

fn schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("body", DataType::String, true),
        ],
    )
}

fn batch() -> RecordBatch {
    let body = "x".repeat(ROW_BYTES - 8);
    RecordBatch::try_new(
        schema().to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS as i64)),
            Arc::new(StringArray::from_iter_values(
                (0..ROWS).map(|_| body.as_str()),
            )),
        ],
    )
    .unwrap()
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

fn wal_config(tail_cache: u64) -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        tail_cache_bytes_max: tail_cache,
        pending_bytes_max: 256 << 20,
        ..Default::default()
    }
}

fn bucket(b: usize) -> TableBucket {
    TableBucket::new(1, None, b as u32)
}

/// Runs `tasks` futures made by `f` to completion; returns the bytes they report and
/// the seconds it took.
async fn run_tasks<F, Fut>(tasks: usize, f: F) -> (u64, f64)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = u64> + Send + 'static,
{
    let start = Instant::now();
    let joins: Vec<_> = (0..tasks).map(|t| tokio::spawn(f(t))).collect();
    let mut total = 0;
    for j in joins {
        total += j.await.unwrap();
    }
    (total, start.elapsed().as_secs_f64())
}

/// Raw s3stream appends of `encoded_len` bytes; MB/s.
async fn raw_run(secs: f64, encoded_len: usize) -> f64 {
    let (store, _dir) = file_store();
    let node = StreamStore::open(store.clone(), "raw", wal_config(0))
        .await
        .unwrap();
    let mut streams = Vec::new();
    for b in 0..TABLETS {
        streams.push(node.open_stream(&format!("raw{b}"), 1).await.unwrap());
    }
    let body = Bytes::from(vec![7u8; encoded_len]);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (wal_bytes, wal_secs) = run_tasks(TABLETS * APPENDERS_PER_TABLET, |t| {
        let stream = streams[t % TABLETS].clone();
        let body = body.clone();
        async move {
            let mut n = 0;
            while Instant::now() < deadline {
                stream
                    .append_durable(1, ROWS as u32, 0, body.clone())
                    .await
                    .unwrap();
                n += body.len() as u64;
            }
            n
        }
    })
    .await;

    wal_bytes as f64 / wal_secs / 1e6
}

/// Log-tablet appends of `batch`; (MB/s of encoded batches, rows/s).
async fn log_run(secs: f64, batch: &RecordBatch, encoded_len: usize) -> (f64, f64) {
    let (store, _dir2) = file_store();
    let node = StreamStore::open(store.clone(), "log", wal_config(0))
        .await
        .unwrap();
    let mut tablets = Vec::new();
    for b in 0..TABLETS {
        let stream = node.open_stream(&format!("t1-b{b}"), 1).await.unwrap();
        tablets.push(
            LogTablet::open(
                bucket(b),
                stream,
                false,
                vec![schema()],
                LogConfig::default(),
            )
            .await
            .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (log_bytes, log_secs) = run_tasks(TABLETS * APPENDERS_PER_TABLET, |t| {
        let tablet = tablets[t % TABLETS].clone();
        let batch = batch.clone();
        async move {
            let mut n = 0;
            while Instant::now() < deadline {
                tablet
                    .append(AppendRequest {
                        writer_id: NO_WRITER,
                        first_sequence: 0,
                        last_sequence: 0,
                        schema_id: 1,
                        change_types: None,
                        batch: batch.clone(),
                        ipc: None,
                    })
                    .await
                    .unwrap();
                n += encoded_len as u64;
            }
            n
        }
    })
    .await;
    let mbps = log_bytes as f64 / log_secs / 1e6;
    let rows = (log_bytes / encoded_len as u64) as f64 * ROWS as f64 / log_secs;
    (mbps, rows)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let secs = if quick { 0.5 } else { 3.0 };
    let batch = batch();
    let payload_bytes = batch.get_array_memory_size();
    let mut out = String::new();

    out.push_str(&format!(
        "`file://` store. {TABLETS} buckets × {APPENDERS_PER_TABLET} closed-loop appenders, batches of {ROWS} rows of ~{ROW_BYTES} B (~{:.1} MB of Arrow per batch).\n\n",
        payload_bytes as f64 / 1e6
    ));

    // Baseline: raw s3stream appends of the encoded batch's bytes.
    let encoded_len = {
        let h = mink_log::BatchHeader {
            base_offset: 0,
            record_count: ROWS as i32,
            commit_timestamp: 0,
            leader_epoch: 1,
            schema_id: 1,
            writer_id: NO_WRITER,
            first_sequence: 0,
            last_sequence: 0,
            attributes: 0,
            change_types: vec![],
        };
        mink_log::batch::encode(&h, &batch, mink_types::Compression::None)
            .unwrap()
            .len()
    };
    let mut ratios = Vec::new();
    let mut rows_per_sec = Vec::new();
    let mut log_mbps = Vec::new();
    let mut wal_mbps = Vec::new();
    // Rounds alternate which runs first: a run leaves the disk busier for the next.
    for round in 0..if quick { 2 } else { 4 } {
        let (w, l, rows) = if round % 2 == 0 {
            let w = raw_run(secs, encoded_len).await;
            let (l, rows) = log_run(secs, &batch, encoded_len).await;
            (w, l, rows)
        } else {
            let (l, rows) = log_run(secs, &batch, encoded_len).await;
            let w = raw_run(secs, encoded_len).await;
            (w, l, rows)
        };
        wal_mbps.push(w);
        log_mbps.push(l);
        ratios.push(l / w);
        rows_per_sec.push(rows);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    out.push_str("### Append throughput (median of rounds)\n\n| log rows/s | log MB/s | raw s3stream MB/s (same bytes) | ratio |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| {:.0} | {:.1} | {:.1} | {:.2} |\n",
        median(&mut rows_per_sec),
        median(&mut log_mbps),
        median(&mut wal_mbps),
        median(&mut ratios)
    ));

    // Scans: from memory (tail cache) and from segments.
    let (store, _dir) = file_store();
    let node = StreamStore::open(store.clone(), "scan", wal_config(1 << 30))
        .await
        .unwrap();
    let stream = node.open_stream("t1-b0", 1).await.unwrap();
    let tablet = LogTablet::open(
        bucket(0),
        stream,
        false,
        vec![schema()],
        LogConfig::default(),
    )
    .await
    .unwrap();
    let batches = if quick { 20 } else { 100 };
    for _ in 0..batches {
        tablet
            .append(AppendRequest {
                writer_id: NO_WRITER,
                first_sequence: 0,
                last_sequence: 0,
                schema_id: 1,
                change_types: None,
                batch: batch.clone(),
                ipc: None,
            })
            .await
            .unwrap();
    }
    let scan_all = |tablet: LogTablet| async move {
        let start = Instant::now();
        let mut pos = tablet.log_start();
        let mut bytes = 0usize;
        while pos < tablet.high_watermark() {
            let r = tablet.scan(pos, 8 << 20).await.unwrap();
            bytes += r.bytes();
            pos = r.next_offset(pos);
        }
        bytes as f64 / start.elapsed().as_secs_f64() / 1e6
    };
    let memory = scan_all(tablet.clone()).await;
    node.compact().await.unwrap();
    drop(tablet);
    // A new owner with no cache reads everything from segments.
    let reader = StreamStore::open(store.clone(), "reader", wal_config(0))
        .await
        .unwrap();
    let stream = reader.open_stream("t1-b0", 2).await.unwrap();
    let tablet = LogTablet::open(
        bucket(0),
        stream,
        false,
        vec![schema()],
        LogConfig::default(),
    )
    .await
    .unwrap();
    let segments = scan_all(tablet).await;
    out.push_str(&format!(
        "\n### Scan throughput ({batches} batches, decoded to Arrow)\n\n| from memory (tail cache) | from segments (`file://`) |\n|---|---|\n| {memory:.0} MB/s | {segments:.0} MB/s |\n"
    ));
    print!("{out}");
}
