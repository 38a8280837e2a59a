//! `cargo xtask bench cost`: what a node costs on S3 under steady ingest. One node,
//! in-process, on an in-memory store with S3-like latency (20 ms PUT, 10 ms GET), takes
//! a steady (open-loop) stream of appends at 1, 10 and 50 MB/s through the Rust client,
//! with the WAL settings a node takes on S3 by default (a PUT budget of
//! `wal.put_rate_max` 10 a second, `wal.linger_ms` 250 as the most it may add), and
//! without a budget at `wal.linger_ms` 0 (the default on a local directory), 50 and 250.
//! The node's own request accounting counts
//! every object-store request of a measured window, by operation; the client measures
//! each append's acknowledgement latency. The monthly bill uses S3 Standard list
//! prices: $0.005 per 1,000 PUT/LIST requests, $0.0004 per 1,000 GET/HEAD requests
//! (DELETE is free).
//!
//! A primary-key table at 10 MB/s shows what upserts add: every row after the first
//! pass over the keys is an update, whose changelog carries the old and the new row.
//! The column "stored bytes per byte sent" divides the bytes the node PUT to the store
//! (WAL, segments, metadata, KV snapshots) by the bytes of the rows clients sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::{Column, DataType, Schema, TableDescriptor, TablePath};
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{AccountingReport, Op, Purpose};
use object_store::ObjectStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BUCKETS: u32 = 4;
/// Rows per append, of ~1 KiB each: ~256 KiB per append.
const ROWS: usize = 256;
/// Tasks sending appends (each with its own client), open loop.
const SENDERS: usize = 4;
/// Appends of one sender in flight at most; beyond it the sender falls behind its rate
/// (reported as the achieved MB/s).
const SENDER_IN_FLIGHT_MAX: usize = 16;
const SECONDS_PER_MONTH: f64 = 30.0 * 24.0 * 3600.0;
const PUT_PRICE: f64 = mink_wal::accounting::Op::Put.list_price_usd();
const GET_PRICE: f64 = mink_wal::accounting::Op::Get.list_price_usd();

/// Keys of one sender on the primary-key table: after its first 16 appends, every row
/// it sends is an update.
const KEYS_PER_SENDER: usize = 16 * ROWS;

/// The WAL's group-commit settings of a cell.
#[derive(Clone, Copy)]
enum Wal {
    /// The default on S3: a PUT budget, the default linger as its bound.
    Budget(u32),
    /// No budget, a fixed linger.
    Linger(u64),
}

impl Wal {
    fn label(self) -> String {
        match self {
            Wal::Budget(n) => format!(
                "budget {n}/s, linger ≤ {} ms (S3 default)",
                mink_wal::DEFAULT_BUDGET_LINGER_MS
            ),
            Wal::Linger(0) => "no budget, linger 0".into(),
            Wal::Linger(ms) => format!("no budget, linger {ms} ms"),
        }
    }

    fn apply(self, wal: &mut mink_wal::WalConfig) {
        match self {
            Wal::Budget(n) => {
                wal.put_rate_max = Some(n);
                wal.linger_ms = None;
            }
            Wal::Linger(ms) => {
                wal.put_rate_max = Some(0);
                wal.linger_ms = Some(ms);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Log,
    PrimaryKey,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Log => "log",
            Kind::PrimaryKey => "primary key",
        }
    }
}

fn descriptor(kind: Kind) -> TableDescriptor {
    let schema = Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("body", DataType::String, true),
        ],
    );
    let mut descriptor = TableDescriptor::log_table(schema);
    descriptor.bucket_count = BUCKETS;
    // The bodies are one letter repeated, which zstd shrinks to nothing: stored bytes
    // here are of uncompressed rows (bench ingest measures compression on real rows).
    descriptor.properties.compression = mink_types::Compression::None;
    if kind == Kind::PrimaryKey {
        descriptor.primary_key = vec!["id".into()];
    }
    descriptor
}

/// The `n`th batch of sender `sender`: on the primary-key table, its own keys in turn,
/// with a body that differs from the one the key had (so every update is a change).
fn batch(kind: Kind, sender: usize, n: usize) -> RecordBatch {
    let (first, body) = match kind {
        Kind::Log => (0, "x".repeat(1000)),
        Kind::PrimaryKey => {
            let offset = n * ROWS % KEYS_PER_SENDER;
            let pass = n * ROWS / KEYS_PER_SENDER;
            let fill = if pass.is_multiple_of(2) { "x" } else { "y" };
            (sender * KEYS_PER_SENDER + offset, fill.repeat(1000))
        }
    };
    RecordBatch::try_new(
        descriptor(kind).schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(
                (first..first + ROWS).map(|k| k as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..ROWS).map(|_| body.as_str()),
            )),
        ],
    )
    .unwrap()
}

async fn write(
    client: &MinkClient,
    kind: Kind,
    path: &TablePath,
    rows: &RecordBatch,
) -> mink_types::Result<()> {
    match kind {
        Kind::Log => client.append(path, rows).await.map(drop),
        Kind::PrimaryKey => client.put(path, rows, None, None).await.map(drop),
    }
}

fn count(report: &AccountingReport, ops: &[Op], purpose: Option<Purpose>) -> u64 {
    report
        .by_kind
        .iter()
        .filter(|u| ops.contains(&u.op) && purpose.is_none_or(|p| u.purpose == p))
        .map(|u| u.requests)
        .sum()
}

struct Cell {
    mbps: f64,
    puts_per_s: f64,
    wal_puts_per_s: f64,
    gets_per_s: f64,
    lists_per_s: f64,
    mib_per_wal_put: f64,
    p50_ms: f64,
    p99_ms: f64,
    dollars_per_month: f64,
    stored_per_sent: f64,
}

async fn cell(
    kind: Kind,
    target_mbps: f64,
    settings: Wal,
    warmup: Duration,
    window: Duration,
) -> Cell {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        FaultConfig {
            put_latency: Duration::from_millis(20),
            get_latency: Duration::from_millis(10),
            ..Default::default()
        },
    ));
    let mut config = MinkConfig {
        data_dir: dir.path().join("data"),
        ..MinkConfig::default()
    };
    config.listeners = mink_node::config::Listeners::ephemeral();
    settings.apply(&mut config.wal);
    let node = Node::start_with_store(config, store).await.unwrap();
    let addr = node.flight_addr.to_string();
    let admin = MinkClient::connect(&addr).await.unwrap();
    admin.create_database("b").await.unwrap();
    let path = TablePath::parse("b.cost").unwrap();
    admin.create_table(&path, &descriptor(kind)).await.unwrap();
    let batch_bytes = batch(kind, 0, 0).get_array_memory_size() as f64;
    // Until the bucket has a leader: rows of keys no sender writes.
    let first = batch(kind, SENDERS, 0);
    for _ in 0..100 {
        if write(&admin, kind, &path, &first).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let interval = Duration::from_secs_f64(batch_bytes * SENDERS as f64 / (target_mbps * 1e6));
    let started = Instant::now();
    let measure_from = started + warmup;
    let stop_at = measure_from + window;
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let (addr, path) = (addr.clone(), path.clone());
            tokio::spawn(async move {
                let client = Arc::new(MinkClient::connect(&addr).await.unwrap());
                let slots = Arc::new(tokio::sync::Semaphore::new(SENDER_IN_FLIGHT_MAX));
                let mut tick = tokio::time::interval_at(
                    tokio::time::Instant::now() + interval.mul_f64(s as f64 / SENDERS as f64),
                    interval,
                );
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut appends = Vec::new();
                while Instant::now() < stop_at {
                    tick.tick().await;
                    let permit = slots.clone().acquire_owned().await.unwrap();
                    let rows = batch(kind, s, appends.len());
                    let (client, path) = (client.clone(), path.clone());
                    appends.push(tokio::spawn(async move {
                        let sent = Instant::now();
                        write(&client, kind, &path, &rows).await.unwrap();
                        drop(permit);
                        (sent, sent.elapsed())
                    }));
                }
                let mut out = Vec::new();
                for a in appends {
                    out.push(a.await.unwrap());
                }
                out
            })
        })
        .collect();
    tokio::time::sleep_until(tokio::time::Instant::from_std(measure_from)).await;
    let before = node.accounting.report();
    let window_start = Instant::now();
    tokio::time::sleep_until(tokio::time::Instant::from_std(stop_at)).await;
    let after = node.accounting.report();
    let elapsed = window_start.elapsed().as_secs_f64();
    let mut latencies = Vec::new();
    for s in senders {
        for (sent, took) in s.await.unwrap() {
            if sent >= measure_from && sent < stop_at {
                latencies.push(took.as_secs_f64() * 1e3);
            }
        }
    }
    node.stop().await;
    latencies.sort_by(f64::total_cmp);
    let delta = |ops: &[Op], purpose: Option<Purpose>| {
        (count(&after, ops, purpose) - count(&before, ops, purpose)) as f64 / elapsed
    };
    let puts = delta(&[Op::Put], None);
    let wal_puts = delta(&[Op::Put], Some(Purpose::Wal));
    let gets = delta(&[Op::Get, Op::GetRange, Op::Head], None);
    let lists = delta(&[Op::List], None);
    let mbps = latencies.len() as f64 * batch_bytes / elapsed / 1e6;
    let stored = (after.bytes_sent - before.bytes_sent) as f64 / elapsed;
    Cell {
        mbps,
        puts_per_s: puts,
        wal_puts_per_s: wal_puts,
        gets_per_s: gets,
        lists_per_s: lists,
        mib_per_wal_put: if wal_puts > 0.0 {
            mbps * 1e6 / (1 << 20) as f64 / wal_puts
        } else {
            0.0
        },
        p50_ms: latencies.get(latencies.len() / 2).copied().unwrap_or(0.0),
        p99_ms: latencies
            .get(latencies.len() * 99 / 100)
            .copied()
            .unwrap_or(0.0),
        dollars_per_month: ((puts + lists) * PUT_PRICE + gets * GET_PRICE) * SECONDS_PER_MONTH,
        stored_per_sent: if mbps > 0.0 {
            stored / (mbps * 1e6)
        } else {
            0.0
        },
    }
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (warmup, window) = if quick {
        (Duration::from_secs(1), Duration::from_secs(3))
    } else {
        (Duration::from_secs(3), Duration::from_secs(30))
    };
    println!(
        "One node in-process on an in-memory store with 20 ms PUT and 10 ms GET latency; \
         {SENDERS} clients send appends of {ROWS} rows (~256 KiB) open-loop at the target \
         rate over {BUCKETS} buckets; default WAL settings but those named. Requests are \
         the node's own accounting over a {} s window after {} s of warm-up (compaction \
         every 30 s is included; with a shorter window it may fall outside). PUTs include \
         heartbeats, metadata and segments; the bill counts PUT and LIST at $0.005 and \
         GET and HEAD at $0.0004 per 1,000 (S3 Standard list prices), DELETE free. \
         The primary-key rows Put the same rows, each sender over its own {} keys, so \
         that after the first pass every row is an update with a changed body (its \
         changelog holds the old and the new row); a KV snapshot (every 10 minutes by \
         default) falls outside the window. Stored bytes per byte sent: bytes the node \
         PUT to the store over the bytes of the rows the clients sent.\n",
        window.as_secs(),
        warmup.as_secs(),
        KEYS_PER_SENDER
    );
    println!(
        "| table | target MB/s | WAL settings | achieved MB/s | PUTs/s (WAL) | MiB per WAL PUT | GETs/s | LISTs/s | ack p50 | ack p99 | $/month | stored bytes per byte sent |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let budget = Wal::Budget(mink_wal::DEFAULT_PUT_RATE_MAX);
    // `MINK_BENCH_COST_BUDGET_ONLY`: the S3 default's cells alone (for repeated runs).
    let budget_only = std::env::var_os("MINK_BENCH_COST_BUDGET_ONLY").is_some();
    let settings: &[Wal] = if budget_only {
        &[budget]
    } else {
        &[budget, Wal::Linger(0), Wal::Linger(50), Wal::Linger(250)]
    };
    let cells = [1.0, 10.0, 50.0]
        .into_iter()
        .flat_map(|t| settings.iter().map(move |w| (Kind::Log, t, *w)))
        .chain(
            settings
                .iter()
                .take(2)
                .map(|w| (Kind::PrimaryKey, 10.0, *w)),
        );
    for (kind, target, settings) in cells {
        let label = settings.label();
        eprintln!("cost: {} table, {target} MB/s, {label}", kind.name());
        let c = cell(kind, target, settings, warmup, window).await;
        println!(
            "| {} | {target:.0} | {label} | {:.1} | {:.1} ({:.1}) | {:.2} | {:.1} | {:.2} | {:.1} ms | {:.1} ms | {:.0} | {:.2} |",
            kind.name(),
            c.mbps,
            c.puts_per_s,
            c.wal_puts_per_s,
            c.mib_per_wal_put,
            c.gets_per_s,
            c.lists_per_s,
            c.p50_ms,
            c.p99_ms,
            c.dollars_per_month,
            c.stored_per_sent
        );
    }
}
