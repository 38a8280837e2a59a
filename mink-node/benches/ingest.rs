//! `cargo xtask bench ingest`: DoPut throughput of one node against raw s3stream
//! appends of the same bytes in the same run, and write→tail visibility latency.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use bytes::Bytes;
use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::{
    ChangelogImage, Column, Compression, DataType, Schema, TableBucket, TableDescriptor, TablePath,
};
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{ObjectStoreConfig, StreamStore, WalConfig, open_object_store};
use object_store::ObjectStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000;
const WRITERS: usize = 8;
const BUCKETS: u32 = 4;

/// The throughput table's: a body of one letter repeated, which zstd would shrink to
/// nothing, so its rows are stored uncompressed (the compression section measures
/// codecs on real rows).
fn descriptor() -> TableDescriptor {
    let mut d = TableDescriptor {
        bucket_count: BUCKETS,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("body", DataType::String, true),
            ],
        ))
    };
    d.properties.compression = Compression::None;
    d
}

/// `ROWS` rows with ids from `seed` and a body of `body` bytes of `fill`.
fn batch_of(seed: i64, fill: char, body: usize) -> RecordBatch {
    let body = fill.to_string().repeat(body);
    RecordBatch::try_new(
        descriptor().schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(seed..seed + ROWS as i64)),
            Arc::new(StringArray::from_iter_values(
                (0..ROWS).map(|_| body.as_str()),
            )),
        ],
    )
    .unwrap()
}

/// `n` rows of `d`'s columns with ids from 0 and a 100-byte body.
fn small_rows(d: &TableDescriptor, n: i64) -> RecordBatch {
    RecordBatch::try_new(
        d.schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|_| "x".repeat(100)),
            )),
        ],
    )
    .unwrap()
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

enum Kind {
    File,
    Latency(u64),
}

fn store(kind: &Kind) -> (Arc<dyn ObjectStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = match kind {
        Kind::File => open_object_store(&ObjectStoreConfig {
            url: format!("file://{}", dir.path().join("objects").display()),
            ..Default::default()
        })
        .unwrap(),
        Kind::Latency(ms) => Arc::new(FaultyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig {
                put_latency: Duration::from_millis(*ms),
                ..Default::default()
            },
        )),
    };
    (store, dir)
}

fn config(dir: &std::path::Path) -> MinkConfig {
    let mut c = MinkConfig {
        data_dir: dir.join("data"),
        ..MinkConfig::default()
    };
    c.listeners = mink_node::config::Listeners::ephemeral();
    c.wal.compaction_interval_ms = 3_600_000;
    c
}

/// Bytes this process has caused to be written to storage so far (`write_bytes` of
/// /proc/self/io: file pages dirtied, not socket traffic); 0 where there is none.
fn storage_bytes_written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Bytes written to storage per row by the last [`ingest`] run (see
/// [`storage_bytes_written`]), for the Put/append comparison.
static LAST_BYTES_PER_ROW: std::sync::Mutex<f64> = std::sync::Mutex::new(0.0);

/// Rows/s and MB/s of `WRITERS` closed-loop Flight writers (client-side routing) of
/// rows with a body of `body` bytes; with `pk`, Puts to a primary-key table of the same
/// columns and that changelog image (key `id`: every writer rewrites its own 1,000
/// keys, so after its first batch each row is an update).
async fn ingest(
    kind: &Kind,
    secs: f64,
    pk: Option<ChangelogImage>,
    body: usize,
) -> (f64, f64, usize) {
    ingest_into(kind, secs, pk, body, Routing::Client).await
}

/// How [`ingest_into`]'s writers send their batches.
#[derive(Clone, Copy, PartialEq)]
enum Routing {
    /// Routed by the client, one idempotent request per bucket (`append`, `put`); a
    /// log table is unkeyed, so each batch goes whole into one bucket.
    Client,
    /// As `Client`, but a log table's rows are bucketed by `id` (as a primary-key
    /// table's are), so that each batch is split over the buckets as Puts are.
    ClientById,
    /// Routed by the node: one `AppendTable` or `PutTable` request per batch (as
    /// pyarrow and the Python client write), split over the buckets by the node.
    Node,
}

/// [`ingest`], with the writers' [`Routing`].
async fn ingest_into(
    kind: &Kind,
    secs: f64,
    pk: Option<ChangelogImage>,
    body: usize,
    routing: Routing,
) -> (f64, f64, usize) {
    let (store, dir) = store(kind);
    let node = Node::start_with_store(config(dir.path()), store)
        .await
        .unwrap();
    let addr = node.flight_addr.to_string();
    let client = MinkClient::connect(&addr).await.unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.ingest").unwrap();
    let mut d = descriptor();
    if let Some(image) = pk {
        d.primary_key = vec!["id".into()];
        d.properties.changelog_image = image;
    } else if routing == Routing::ClientById {
        d.bucket_keys = Some(vec!["id".into()]);
    }
    client.create_table(&path, &d).await.unwrap();
    let probe = batch_of(0, 'x', body);
    let bytes_per_batch = probe.get_array_memory_size();
    for _ in 0..100 {
        let written = if pk.is_some() {
            client.put(&path, &probe, None, None).await
        } else {
            client.append(&path, &probe).await
        };
        if written.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let written_before = storage_bytes_written();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let addr = addr.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let client = MinkClient::connect(&addr).await.unwrap();
                // Two bodies in turn: every Put after the first changes each row (an
                // update with its -U/+U changelog, never a no-op).
                let b = [
                    batch_of(w as i64 * 1_000_000, 'x', body),
                    batch_of(w as i64 * 1_000_000, 'y', body),
                ];
                let mut n = 0usize;
                while Instant::now() < deadline {
                    let b = &b[n % 2];
                    if routing == Routing::Node {
                        client.write_table(&path, b, None).await.unwrap();
                    } else if pk.is_some() {
                        client.put(&path, b, None, None).await.unwrap();
                    } else {
                        client.append(&path, b).await.unwrap();
                    }
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
    let written = storage_bytes_written().saturating_sub(written_before);
    *LAST_BYTES_PER_ROW.lock().unwrap() = written as f64 / (batches * ROWS).max(1) as f64;
    node.stop().await;
    let rows = (batches * ROWS) as f64 / elapsed;
    (
        rows,
        rows * (bytes_per_batch / ROWS) as f64 / 1e6,
        bytes_per_batch,
    )
}

/// The columns of TPC-H's `lineitem` (prices and rates as DOUBLE).
fn lineitem_descriptor(compression: Compression) -> TableDescriptor {
    use DataType::{BigInt, Date, Double, Int, String as Text};
    let columns = [
        ("l_orderkey", BigInt),
        ("l_partkey", BigInt),
        ("l_suppkey", BigInt),
        ("l_linenumber", Int),
        ("l_quantity", Double),
        ("l_extendedprice", Double),
        ("l_discount", Double),
        ("l_tax", Double),
        ("l_returnflag", Text),
        ("l_linestatus", Text),
        ("l_shipdate", Date),
        ("l_commitdate", Date),
        ("l_receiptdate", Date),
        ("l_shipinstruct", Text),
        ("l_shipmode", Text),
        ("l_comment", Text),
    ];
    let schema = Schema::new(
        1,
        columns
            .into_iter()
            .map(|(n, t)| Column::new(n, t, false))
            .collect(),
    );
    let mut d = TableDescriptor::log_table(schema);
    d.bucket_count = BUCKETS;
    d.properties.compression = compression;
    d
}

/// `ROWS` rows shaped as dbgen's `lineitem`: orders of 1-7 lines, keys, prices and
/// dates drawn as dbgen draws them, comments of 10-43 characters from its word list.
fn lineitem(seed: u64) -> RecordBatch {
    use arrow::array::{Date32Array, Float64Array, Int32Array};
    use rand::{Rng, SeedableRng};
    const WORDS: [&str; 24] = [
        "furiously",
        "quickly",
        "carefully",
        "blithely",
        "slyly",
        "ironic",
        "final",
        "pending",
        "regular",
        "express",
        "special",
        "bold",
        "deposits",
        "requests",
        "accounts",
        "packages",
        "instructions",
        "theodolites",
        "foxes",
        "pinto",
        "beans",
        "sleep",
        "nag",
        "haggle",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order = seed as i64 * 4 * ROWS as i64;
    let (mut line, mut lines) = (0, 0);
    let mut cols: (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i32>) = Default::default();
    let mut money: (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) = Default::default();
    let mut dates: (Vec<i32>, Vec<i32>, Vec<i32>) = Default::default();
    let mut text: [Vec<String>; 5] = Default::default();
    for _ in 0..ROWS {
        if line == lines {
            order += rng.random_range(1..=4);
            (line, lines) = (0, rng.random_range(1..=7));
        }
        line += 1;
        let quantity = f64::from(rng.random_range(1..=50));
        let part = rng.random_range(1..=200_000i64);
        let ship = 8036 + rng.random_range(0..2_526);
        cols.0.push(order);
        cols.1.push(part);
        cols.2.push(rng.random_range(1..=10_000));
        cols.3.push(line);
        money.0.push(quantity);
        money
            .1
            .push(quantity * (900.0 + (part % 1_000) as f64 / 10.0));
        money.2.push(f64::from(rng.random_range(0..=10)) / 100.0);
        money.3.push(f64::from(rng.random_range(0..=8)) / 100.0);
        dates.0.push(ship);
        dates.1.push(ship + rng.random_range(-60..=60));
        dates.2.push(ship + rng.random_range(1..=30));
        let flag = if ship > 9_300 {
            "N"
        } else {
            ["A", "R"][rng.random_range(0..2)]
        };
        text[0].push(flag.into());
        text[1].push(if ship > 9_300 { "O" } else { "F" }.into());
        let instruct = [
            "DELIVER IN PERSON",
            "COLLECT COD",
            "NONE",
            "TAKE BACK RETURN",
        ];
        text[2].push(instruct[rng.random_range(0..4)].into());
        let modes = ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"];
        text[3].push(modes[rng.random_range(0..7)].into());
        let mut comment = String::new();
        let len = rng.random_range(10..=43);
        while comment.len() < len {
            comment.push_str(WORDS[rng.random_range(0..WORDS.len())]);
            comment.push(' ');
        }
        comment.truncate(len);
        text[4].push(comment);
    }
    let [flags, status, instruct, mode, comment] = text;
    let columns: Vec<arrow::array::ArrayRef> = vec![
        Arc::new(Int64Array::from(cols.0)),
        Arc::new(Int64Array::from(cols.1)),
        Arc::new(Int64Array::from(cols.2)),
        Arc::new(Int32Array::from(cols.3)),
        Arc::new(Float64Array::from(money.0)),
        Arc::new(Float64Array::from(money.1)),
        Arc::new(Float64Array::from(money.2)),
        Arc::new(Float64Array::from(money.3)),
        Arc::new(StringArray::from(flags)),
        Arc::new(StringArray::from(status)),
        Arc::new(Date32Array::from(dates.0)),
        Arc::new(Date32Array::from(dates.1)),
        Arc::new(Date32Array::from(dates.2)),
        Arc::new(StringArray::from(instruct)),
        Arc::new(StringArray::from(mode)),
        Arc::new(StringArray::from(comment)),
    ];
    let schema = lineitem_descriptor(Compression::None).schema.to_arrow();
    RecordBatch::try_new(schema, columns).unwrap()
}

/// The bytes of `batch` as Arrow IPC, uncompressed: what a client sends.
fn ipc_bytes(batch: &RecordBatch) -> usize {
    let mut out = Vec::new();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &batch.schema()).unwrap();
    w.write(batch).unwrap();
    w.finish().unwrap();
    drop(w);
    out.len()
}

/// One [`compression`] cell: rows/s of lineitem appends into a table of that
/// compression, and the bytes PUT to the store during the run (WAL, then segments once
/// compaction has caught up) and kept by the log at the end, each per byte of Arrow IPC
/// the clients sent.
async fn compression_cell(compression: Compression, secs: f64) -> (f64, f64, f64) {
    let (store, dir) = store(&Kind::File);
    let mut c = config(dir.path());
    // A round every 2 s: a few segments per stream in a run, too few to be merged
    // (`segment_merge_fanin` 8), so the bytes written are the WAL's and one segment
    // copy's, as at the default interval over a longer run.
    c.wal.compaction_interval_ms = 2_000;
    let node = Node::start_with_store(c, store).await.unwrap();
    let addr = node.flight_addr.to_string();
    let client = MinkClient::connect(&addr).await.unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.lineitem").unwrap();
    client
        .create_table(&path, &lineitem_descriptor(compression))
        .await
        .unwrap();
    let probe = lineitem(u64::MAX);
    for _ in 0..100 {
        if client.append(&path, &probe).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let put_bytes = |node: &Node| node.accounting.report().bytes_sent;
    let before = put_bytes(&node);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (addr, path) = (addr.clone(), path.clone());
            tokio::spawn(async move {
                let client = MinkClient::connect(&addr).await.unwrap();
                let batches: Vec<_> = (0..4).map(|i| lineitem(w as u64 * 4 + i)).collect();
                let sizes: Vec<usize> = batches.iter().map(ipc_bytes).collect();
                let (mut n, mut sent) = (0, 0);
                while Instant::now() < deadline {
                    client.append(&path, &batches[n % 4]).await.unwrap();
                    sent += sizes[n % 4];
                    n += 1;
                }
                (n, sent)
            })
        })
        .collect();
    let (mut batches, mut sent) = (0, 0);
    for t in tasks {
        let (n, s) = t.await.unwrap();
        batches += n;
        sent += s;
    }
    let rows = (batches * ROWS) as f64 / start.elapsed().as_secs_f64();
    // Until compaction has written every byte to segments and collected the WAL.
    let stats = mink_flight::actions::BucketStats {
        path: Some(path.clone()),
        open: true,
    };
    let mut kept = 0;
    for _ in 0..40 {
        // Longer than a round apart: equal twice means every round has run.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let now: u64 = client
            .call(&stats)
            .await
            .unwrap()
            .iter()
            .filter_map(|s| s.stored_bytes)
            .sum();
        if now == kept {
            break;
        }
        kept = now;
    }
    let written = put_bytes(&node) - before;
    node.stop().await;
    let sent = sent as f64;
    (rows, written as f64 / sent, kept as f64 / sent)
}

/// The compression section: lineitem rows under each codec, `runs` rounds.
async fn compression(secs: f64, runs: usize) -> String {
    let mut out = format!(
        "\nCompression (the table's `compression` property): {WRITERS} closed-loop writers \
         appending TPC-H `lineitem`-shaped rows ({ROWS} a batch, ~{} bytes of Arrow IPC a \
         row) on `file://`, compaction every 2 s. Bytes PUT to the store (WAL, then \
         segments) and kept by the log once compaction caught up, per byte of Arrow IPC \
         sent; rows/s against `none` in the same round.\n\n\
         | round | compression | rows/s | ratio to none | written per byte sent | kept per byte sent |\n\
         |---|---|---|---|---|---|\n",
        ipc_bytes(&lineitem(0)) / ROWS
    );
    for round in 1..=runs {
        let mut none = 0.0;
        for c in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let (rows, written, kept) = compression_cell(c, secs).await;
            if c == Compression::None {
                none = rows;
            }
            out.push_str(&format!(
                "| {round} | {c} | {rows:.0} | {:.2} | {written:.2} | {kept:.2} |\n",
                rows / none
            ));
        }
    }
    out
}

/// MB/s of raw s3stream appends of `size` bytes by `WRITERS` appenders over `BUCKETS`
/// streams. With `compact`, the store's compactor runs beside them as it does in a
/// node: it is due every `segment_bytes_max` (64 MiB) of appends, so at hundreds of
/// MB/s it rewrites every byte into segments within the run, in the node as here.
async fn raw(kind: &Kind, size: usize, secs: f64, compact: bool) -> f64 {
    let (store, _dir) = store(kind);
    let node = StreamStore::open(store, "raw", WalConfig::default())
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let compactor = compact.then(|| {
        let node = node.clone();
        tokio::spawn(async move {
            node.run_compactor(async move {
                let _ = stopped.await;
            })
            .await
        })
    });
    let mut streams = Vec::new();
    for b in 0..BUCKETS {
        streams.push(node.open_stream(&format!("raw{b}"), 1).await.unwrap());
    }
    let body = Bytes::from(vec![7u8; size]);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let s = streams[w % streams.len()].clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut n = 0usize;
                while Instant::now() < deadline {
                    s.append_durable(1, ROWS as u32, 0, body.clone())
                        .await
                        .unwrap();
                    n += body.len();
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let mbps = total as f64 / start.elapsed().as_secs_f64() / 1e6;
    let _ = stop.send(());
    if let Some(c) = compactor {
        c.await.unwrap();
    }
    mbps
}

/// Write→tail visibility: a tail polls one bucket; a writer writes rows stamped with
/// the time; the tail measures when it sees them.
async fn visibility(kind: &Kind, samples: usize) -> (f64, f64, f64, f64) {
    let (store, dir) = store(kind);
    // The store's own latency, at the same cadence, in the same run: a write becomes
    // visible one WAL PUT after it is sent, so the store's tail is the floor of ours.
    let (put_p50, put_p99) = put_latency(&store, samples, Duration::from_millis(5)).await;
    let node = Node::start_with_store(config(dir.path()), store)
        .await
        .unwrap();
    let addr = node.flight_addr.to_string();
    let client = MinkClient::connect(&addr).await.unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.tail").unwrap();
    let mut d = descriptor();
    d.bucket_count = 1;
    client.create_table(&path, &d).await.unwrap();
    let stamp = |ts: i64| {
        RecordBatch::try_new(
            d.schema.to_arrow(),
            vec![
                Arc::new(Int64Array::from(vec![ts])),
                Arc::new(StringArray::from(vec!["t"])),
            ],
        )
        .unwrap()
    };
    for _ in 0..100 {
        if client.append(&path, &stamp(now_ns())).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bucket = TableBucket::new(1, None, 0);
    let start_offset = client
        .scan(&path, bucket, 0)
        .await
        .unwrap()
        .iter()
        .map(|(b, _)| b.num_rows() as i64)
        .sum::<i64>();
    let tail = {
        let addr = addr.clone();
        let path = path.clone();
        tokio::spawn(async move {
            let client = MinkClient::connect(&addr).await.unwrap();
            let mut offset = start_offset;
            let mut latencies = Vec::new();
            while latencies.len() < samples {
                let (batches, next) = client
                    .poll(&path, bucket, offset, Duration::from_secs(10))
                    .await
                    .unwrap();
                let seen = now_ns();
                for b in batches {
                    let ts = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                    for i in 0..ts.len() {
                        latencies.push((seen - ts.value(i)) as f64 / 1e6);
                    }
                }
                offset = next;
            }
            latencies
        })
    };
    for _ in 0..samples {
        client.append(&path, &stamp(now_ns())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut latencies = tail.await.unwrap();
    node.stop().await;
    latencies.sort_by(f64::total_cmp);
    (
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        put_p50,
        put_p99,
    )
}

/// PUT latency of `store` itself, p50 and p99 in ms: `samples` PUTs of 1 KiB, one at a
/// time, `gap` apart (the WAL of an idle bucket makes one such PUT per write).
async fn put_latency(store: &Arc<dyn ObjectStore>, samples: usize, gap: Duration) -> (f64, f64) {
    use object_store::{ObjectStoreExt, PutPayload};
    let mut puts = Vec::new();
    for i in 0..samples {
        let t = Instant::now();
        store
            .put(
                &format!("probe/{i}").into(),
                PutPayload::from(vec![1u8; 1024]),
            )
            .await
            .unwrap();
        puts.push(t.elapsed().as_secs_f64() * 1e3);
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    puts.sort_by(f64::total_cmp);
    (puts[puts.len() / 2], puts[puts.len() * 99 / 100])
}

/// One table-addressed write (`AppendTable`, as pyarrow and `mink write` send it) over
/// 8 buckets at one node, at 20 ms PUT latency: the node writes every bucket's part at
/// once, so a write should cost about one PUT. Returns (write p50, p99, PUT p50) in ms,
/// the PUT measured on the same kind of store in the same run.
async fn table_write_latency(samples: usize) -> (f64, f64, f64) {
    use futures::StreamExt;
    use mink_flight::protocol::{WriteBatch, WriteDescriptor};
    let kind = Kind::Latency(20);
    let (store, dir) = store(&kind);
    let (put_p50, _) = put_latency(&store, samples.min(30), Duration::ZERO).await;
    let node = Node::start_with_store(config(dir.path()), store)
        .await
        .unwrap();
    let addr = node.flight_addr.to_string();
    let client = MinkClient::connect(&addr).await.unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.wide").unwrap();
    let mut d = descriptor();
    d.bucket_count = 8;
    d.bucket_keys = Some(vec!["id".into()]);
    client.create_table(&path, &d).await.unwrap();
    let rows = small_rows(&d, 800);
    let descriptor = WriteDescriptor::AppendTable {
        path: path.clone(),
        schema_id: 1,
    };
    let mut flight = mink_flight::client::connect(&addr).await.unwrap();
    let mut write = async || {
        let data =
            mink_flight::client::encode_write(&rows, Some(&descriptor), &WriteBatch::default())
                .unwrap();
        let t = Instant::now();
        let mut answers = flight
            .do_put(futures::stream::iter(data))
            .await
            .map(|r| r.into_inner());
        let ok = match answers.as_mut() {
            Ok(s) => matches!(s.next().await, Some(Ok(_))),
            Err(_) => false,
        };
        (ok, t.elapsed().as_secs_f64() * 1e3)
    };
    // Until every bucket has its leader and tablet open.
    for _ in 0..200 {
        if write().await.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..5 {
        write().await;
    }
    let mut lat = Vec::new();
    for _ in 0..samples {
        let (ok, ms) = write().await;
        assert!(ok, "a table write failed");
        lat.push(ms);
    }
    node.stop().await;
    lat.sort_by(f64::total_cmp);
    (lat[lat.len() / 2], lat[lat.len() * 99 / 100], put_p50)
}

/// Batches/s of one client with `TASKS` tasks appending to a one-bucket table at 20 ms
/// PUT latency, the client keeping up to `depth` batches of the bucket in flight
/// (issue #15, item 3: depth 1 is the client before pipelining).
async fn single_bucket(depth: usize, secs: f64) -> f64 {
    const TASKS: usize = 8;
    let (store, dir) = store(&Kind::Latency(20));
    let node = Node::start_with_store(config(dir.path()), store)
        .await
        .unwrap();
    let addr = node.flight_addr.to_string();
    let client = Arc::new(
        MinkClient::connect(&addr)
            .await
            .unwrap()
            .with_append_pipeline_depth(depth),
    );
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.one").unwrap();
    let mut d = descriptor();
    d.bucket_count = 1;
    client.create_table(&path, &d).await.unwrap();
    let rows = small_rows(&d, 100);
    for _ in 0..100 {
        if client.append(&path, &rows).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, path, rows) = (client.clone(), path.clone(), rows.clone());
            tokio::spawn(async move {
                let mut n = 0usize;
                while Instant::now() < deadline {
                    client.append(&path, &rows).await.unwrap();
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
    let rate = batches as f64 / start.elapsed().as_secs_f64();
    node.stop().await;
    rate
}

/// Primary-key Puts against appends of the same rows, `runs` times for each row size,
/// alternating: the Markdown section.
async fn puts_against_appends(secs: f64, runs: usize) -> String {
    let mut out = String::from(
        "\nPrimary-key Puts against log appends of the same rows, through the same client path \
         (8 closed-loop writers, each rewriting its own 1,000 keys with one of two bodies in \
         turn: every row of every Put after the first is a real update), `file://`, alternating; \
         rows of a 1 KB and of a 100-byte body (issue 31, item 2; goal: Puts with full \
         changelog images ≥ 0.5 of appends for both).\n\n\
         Bytes written to storage per row (file pages the process dirtied: WAL, segments, \
         the KV store) show what a Put costs beside an append: its changelog carries an \
         update's old and new row, and the KV store takes the new rows (each hot key once per \
         store write: docs/kv.md, the prewrite buffer).\n\n\
         The three columns after them: Puts to the same table with `changelog_image=wal` \
         (no `-U` images; docs/kv.md). The last two: appends to a log table bucketed by \
         `id`, whose batches the client splits over the buckets as it splits Puts (an \
         unkeyed log table takes each batch whole into one bucket): the Puts' ratio to \
         those leaves out what the routing costs.\n\n\
         The last three: the same rows written as pyarrow and the Python client write \
         them, one table-addressed request per batch that the node splits over the buckets \
         (`AppendTable` to the unkeyed log table, `PutTable` with full images; the issue's \
         own measure).\n\n\
         | body | run | append rows/s | Put rows/s | ratio | storage bytes per appended row | per Put row | Put rows/s, `wal` image | ratio | per Put row | appends bucketed by `id`, rows/s | Puts / those | AppendTable rows/s | PutTable rows/s | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (label, body) in [("1 KB", 1000), ("100 B", 100)] {
        for i in 0..runs {
            let (appends, _, _) = ingest(&Kind::File, secs, None, body).await;
            let append_bytes = *LAST_BYTES_PER_ROW.lock().unwrap();
            let (puts, _, _) = ingest(&Kind::File, secs, Some(ChangelogImage::Full), body).await;
            let put_bytes = *LAST_BYTES_PER_ROW.lock().unwrap();
            let (wal_puts, _, _) = ingest(&Kind::File, secs, Some(ChangelogImage::Wal), body).await;
            let wal_bytes = *LAST_BYTES_PER_ROW.lock().unwrap();
            let (keyed, _, _) =
                ingest_into(&Kind::File, secs, None, body, Routing::ClientById).await;
            let (append_table, _, _) =
                ingest_into(&Kind::File, secs, None, body, Routing::Node).await;
            let full = Some(ChangelogImage::Full);
            let (put_table, _, _) = ingest_into(&Kind::File, secs, full, body, Routing::Node).await;
            out.push_str(&format!(
                "| {label} | {} | {appends:.0} | {puts:.0} | {:.2} | {append_bytes:.0} | {put_bytes:.0} | {wal_puts:.0} | {:.2} | {wal_bytes:.0} | {keyed:.0} | {:.2} | {append_table:.0} | {put_table:.0} | {:.2} |\n",
                i + 1,
                puts / appends,
                wal_puts / appends,
                puts / keyed,
                put_table / append_table
            ));
        }
    }
    out
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `MINK_BENCH_PROFILE=SECS`: only the `file://` append ingest, for SECS seconds (to
    // run under a profiler); prints rows/s, and the raw baseline unless
    // `MINK_BENCH_PROFILE_NO_RAW` is set.
    if let Some(secs) = std::env::var("MINK_BENCH_PROFILE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
    {
        let (rows, mbps, batch_bytes) = ingest(&Kind::File, secs, None, 1000).await;
        if std::env::var_os("MINK_BENCH_PROFILE_NO_RAW").is_some() {
            println!("file:// ingest {rows:.0} rows/s, {mbps:.1} MB/s");
            return;
        }
        let raw_mbps = raw(&Kind::File, batch_bytes, secs.min(3.0), false).await;
        let compacted = raw(&Kind::File, batch_bytes, secs.min(3.0), true).await;
        println!(
            "file:// ingest {rows:.0} rows/s, {mbps:.1} MB/s; raw {raw_mbps:.1} MB/s (ratio {:.2}); raw with compaction {compacted:.1} MB/s (ratio {:.2})",
            mbps / raw_mbps,
            mbps / compacted
        );
        return;
    }
    // `MINK_BENCH_ONE=WHAT,BODY,ROUTING`: one `ingest_into` run of 10 s, to run under a
    // profiler or `perf stat`: WHAT is `append`, `full` or `wal` (Puts with that
    // changelog image), BODY the body's bytes, ROUTING `client`, `by-id` or `node`.
    if let Ok(one) = std::env::var("MINK_BENCH_ONE") {
        let parts: Vec<&str> = one.split(',').collect();
        let pk = match parts[0] {
            "append" => None,
            "full" => Some(ChangelogImage::Full),
            "wal" => Some(ChangelogImage::Wal),
            other => panic!("MINK_BENCH_ONE: {other:?} is not append, full or wal"),
        };
        let body = parts.get(1).and_then(|b| b.parse().ok()).unwrap_or(1000);
        let routing = match parts.get(2).copied().unwrap_or("client") {
            "client" => Routing::Client,
            "by-id" => Routing::ClientById,
            "node" => Routing::Node,
            other => panic!("MINK_BENCH_ONE: {other:?} is not client, by-id or node"),
        };
        let (rows, _, _) = ingest_into(&Kind::File, 10.0, pk, body, routing).await;
        let bytes = *LAST_BYTES_PER_ROW.lock().unwrap();
        println!("file:// {one}: {rows:.0} rows/s, {bytes:.0} storage bytes per row");
        // What went to and came from the object store (bytes, requests and the summed
        // time of each kind: PUT time over wall time is the uploads in flight), what
        // the WAL grouped and how long its acks took, and the KV store's writes, for
        // the whole process.
        const SHOWN: &[&str] = &[
            "mink_object_store_bytes_",
            "mink_object_store_requests_total",
            "mink_object_store_request_duration_seconds_sum",
            "mink_object_store_request_duration_seconds_count",
            "mink_wal_upload",
            "mink_wal_segments_written_total",
            "mink_wal_group_bytes",
            "mink_wal_ack_latency_seconds",
            "mink_kv_store_writes_total",
            "mink_kv_before_images_total",
        ];
        for line in mink_node::admin::prometheus().render().lines() {
            if SHOWN.iter().any(|p| line.starts_with(p)) {
                println!("  {line}");
            }
        }
        return;
    }
    // `MINK_BENCH_COMPRESSION=RUNS`: only the compression section, RUNS rounds.
    if let Some(runs) = std::env::var("MINK_BENCH_COMPRESSION")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        print!("{}", compression(if quick { 1.0 } else { 5.0 }, runs).await);
        return;
    }
    // `MINK_BENCH_PUTS=RUNS`: only the Put/append comparison, RUNS runs.
    if let Some(runs) = std::env::var("MINK_BENCH_PUTS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        print!("{}", puts_against_appends(3.0, runs).await);
        return;
    }
    // `MINK_BENCH_VISIBILITY=RUNS`: only the `file://` write→tail visibility, RUNS times.
    if let Some(runs) = std::env::var("MINK_BENCH_VISIBILITY")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        for _ in 0..runs {
            let (p50, p99, put_p50, put_p99) = visibility(&Kind::File, 200).await;
            println!(
                "file:// visibility p50 {p50:.2} ms p99 {p99:.2} ms ({:.2}); PUT p50 {put_p50:.2} ms p99 {put_p99:.2} ms ({:.2})",
                p99 / p50,
                put_p99 / put_p50
            );
        }
        return;
    }
    let secs = if quick { 0.5 } else { 3.0 };
    let samples = if quick { 20 } else { 200 };
    let rounds = if quick { 1 } else { 3 };
    let mut out = String::from(&format!(
        "One node in-process, {WRITERS} closed-loop writers through the Rust client (Flight DoPut, client-side routing, idempotent sequences), {BUCKETS} buckets, batches of {ROWS} rows of ~1 KB. Two baselines of the same bytes in the same run: raw s3stream appends alone, and with s3stream's compactor running as it does in the node (due every 64 MiB of appends, so at these rates it rewrites every byte into segments during the run: on `file://` the node writes each byte twice). Rounds alternate.\n\n| store | round | rows/s | MB/s | raw appends MB/s | ratio | raw appends + compaction MB/s | ratio |\n|---|---|---|---|---|---|---|---|\n"
    ));
    let mut tails = String::from(
        "\nWrite→tail visibility (one writer, one tail on the bucket; goal p99 ≤ 2 × p50), beside the store's own PUT latency (1 KiB PUTs at the same cadence, same run).\n\n| store | p50 | p99 | p99 / p50 | store PUT p50 | PUT p99 | PUT p99 / p50 |\n|---|---|---|---|---|---|---|\n",
    );
    for (label, kind) in [
        ("file://", Kind::File),
        ("20 ms PUT latency", Kind::Latency(20)),
    ] {
        for round in 1..=rounds {
            let (rows, mbps, batch_bytes) = ingest(&kind, secs, None, 1000).await;
            let raw_mbps = raw(&kind, batch_bytes, secs, false).await;
            let compacted = raw(&kind, batch_bytes, secs, true).await;
            out.push_str(&format!(
                "| {label} | {round} | {rows:.0} | {mbps:.1} | {raw_mbps:.1} | {:.2} | {compacted:.1} | {:.2} |\n",
                mbps / raw_mbps,
                mbps / compacted
            ));
        }
        let (p50, p99, put_p50, put_p99) = visibility(&kind, samples).await;
        tails.push_str(&format!(
            "| {label} | {p50:.1} ms | {p99:.1} ms | {:.2} | {put_p50:.1} ms | {put_p99:.1} ms | {:.2} |\n",
            p99 / p50,
            put_p99 / put_p50
        ));
    }
    out.push_str(&tails);
    out.push_str(&puts_against_appends(secs, if quick { 1 } else { 3 }).await);
    out.push_str(&compression(if quick { 1.0 } else { 5.0 }, if quick { 1 } else { 3 }).await);
    let samples = if quick { 20 } else { 200 };
    let mut rows = Vec::new();
    for _ in 0..if quick { 1 } else { 3 } {
        rows.push(table_write_latency(samples).await);
    }
    out.push_str(
        "\nOne `AppendTable` (table-addressed, 800 rows over 8 buckets, sent to one node) at 20 ms PUT latency: \
         the node writes every bucket's part at once (issue #15, item 1; goal p50 ≤ PUT + 5 ms).\n\n\
         | run | PUT p50 (same store) | table write p50 | p99 | p50 − PUT |\n|---|---|---|---|---|\n",
    );
    for (i, (p50, p99, put)) in rows.iter().enumerate() {
        out.push_str(&format!(
            "| {} | {put:.1} ms | {p50:.1} ms | {p99:.1} ms | {:.1} ms |\n",
            i + 1,
            p50 - put
        ));
    }
    out.push_str(
        "\nOne client, 8 tasks appending 100-row batches to a one-bucket table at 20 ms PUT latency \
         (issue #15, item 3; goal: pipelined ≥ 4 × one batch in flight). Runs alternate.\n\n\
         | run | one in flight (batches/s) | pipelined, 5 in flight (batches/s) | ratio |\n|---|---|---|---|\n",
    );
    for i in 0..if quick { 1 } else { 3 } {
        let one = single_bucket(1, secs).await;
        let five = single_bucket(5, secs).await;
        out.push_str(&format!(
            "| {} | {one:.0} | {five:.0} | {:.2} |\n",
            i + 1,
            five / one
        ));
    }
    print!("{out}");
}
