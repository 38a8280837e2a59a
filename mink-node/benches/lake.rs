//! `cargo xtask bench lake`: lake tiering on one node over `file://`.
//!
//! - tiering MB/s: rows already in the log, `lake.enabled` turned on, time until the
//!   lake holds them all; against raw Parquet writing (encode + PUT) of the same rows
//!   to the same store in the same run;
//! - lag under a steady write load (`lake.freshness` 1 s): for each committed round,
//!   how long ago its newest row was acknowledged;
//! - `Union` read MB/s against a log scan of the same table;
//! - a primary-key table merged on read: what a round writes after 1% of the keys
//!   changed against the state, its time against tiering the same rows into a log
//!   table's lake, and `Lake` reads after ten such rounds against after a rewrite.
//!
//! Several runs each; the report gives min..max over runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_flight::MinkClient;
use mink_flight::protocol::ReadTicket;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::{Column, DataType, Schema, TableDescriptor, TablePath};
use mink_wal::{ObjectStoreConfig, open_object_store};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 2_000;
const BUCKETS: u32 = 4;

fn descriptor() -> TableDescriptor {
    TableDescriptor {
        bucket_count: BUCKETS,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("body", DataType::String, true),
            ],
        ))
    }
}

/// ~1 KB rows, not all alike (Parquet would compress identical ones to nothing).
fn batch(seed: i64) -> RecordBatch {
    batch_of(seed, ROWS)
}

/// As [`batch`], `rows` rows.
fn batch_of(seed: i64, rows: usize) -> RecordBatch {
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
    ];
    RecordBatch::try_new(
        descriptor().schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(seed..seed + rows as i64)),
            Arc::new(StringArray::from_iter_values((0..rows).map(|i| {
                let n = seed as usize + i;
                let mut s = String::with_capacity(1000);
                while s.len() < 1000 {
                    s.push_str(words[(n * 7 + s.len()) % words.len()]);
                    s.push_str(&(n * 31 + s.len()).to_string());
                }
                s
            }))),
        ],
    )
    .unwrap()
}

fn config(dir: &std::path::Path) -> MinkConfig {
    let mut c = MinkConfig {
        data_dir: dir.join("data"),
        ..MinkConfig::default()
    };
    c.object_store.url = format!("file://{}", dir.join("objects").display());
    c.listeners = mink_node::config::Listeners::ephemeral();
    c.lake.check_interval_ms = 10;
    c
}

async fn lake_rows(client: &MinkClient, path: &TablePath) -> i64 {
    match client
        .action::<serde_json::Value>("lake_snapshot", serde_json::json!({"path": path}))
        .await
    {
        Ok(s) => s["offsets"]
            .as_object()
            .map_or(0, |o| o.values().filter_map(|v| v.as_i64()).sum()),
        Err(_) => 0,
    }
}

async fn setup(dir: &std::path::Path) -> (Node, MinkClient, TablePath) {
    let node = Node::start(config(dir)).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.lake").unwrap();
    client.create_table(&path, &descriptor()).await.unwrap();
    (node, client, path)
}

async fn enable(client: &MinkClient, path: &TablePath) {
    client
        .action::<serde_json::Value>(
            "alter_table",
            serde_json::json!({"path": path, "set_properties": {"lake.enabled": "true", "lake.freshness": "1s"}}),
        )
        .await
        .unwrap();
}

struct Backlog {
    tier_mbps: f64,
    raw_mbps: f64,
    union_mbps: f64,
    scan_mbps: f64,
}

/// `batches` batches in the log, then the lake turned on: how fast it catches up.
async fn backlog(batches: usize) -> Backlog {
    let dir = tempfile::tempdir().unwrap();
    let (node, client, path) = setup(dir.path()).await;
    let mut bytes = 0usize;
    let mut written = Vec::new();
    for i in 0..batches {
        let b = batch(i as i64 * ROWS as i64);
        bytes += b.get_array_memory_size();
        client.append(&path, &b).await.unwrap();
        written.push(b);
    }
    let rows = (batches * ROWS) as i64;
    let start = Instant::now();
    enable(&client, &path).await;
    while lake_rows(&client, &path).await < rows {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let tier_secs = start.elapsed().as_secs_f64();

    // Raw Parquet of the same rows (same writer settings), PUT to the same store.
    let store: Arc<dyn ObjectStore> = open_object_store(&ObjectStoreConfig {
        url: format!("file://{}", dir.path().join("raw").display()),
        ..Default::default()
    })
    .unwrap();
    let start = Instant::now();
    for (i, chunk) in written
        .chunks(written.len().div_ceil(BUCKETS as usize))
        .enumerate()
    {
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(Vec::new(), chunk[0].schema(), Some(props))
                .unwrap();
        for b in chunk {
            w.write(b).unwrap();
        }
        let data = w.into_inner().unwrap();
        store
            .put(&format!("raw/{i}.parquet").into(), PutPayload::from(data))
            .await
            .unwrap();
    }
    let raw_secs = start.elapsed().as_secs_f64();

    let union = ReadTicket::Union {
        path: path.clone(),
        bucket: None,
        columns: None,
        filter: None,
    };
    let union_mbps = read_mbps(&client, &union, rows).await;
    let start = Instant::now();
    let scanned = client.scan_table(&path).await.unwrap();
    let scan_secs = start.elapsed().as_secs_f64();
    let scan_bytes: usize = scanned.iter().map(|b| b.get_array_memory_size()).sum();
    node.stop().await;
    Backlog {
        tier_mbps: bytes as f64 / tier_secs / 1e6,
        raw_mbps: bytes as f64 / raw_secs / 1e6,
        union_mbps,
        scan_mbps: scan_bytes as f64 / scan_secs / 1e6,
    }
}

/// A writer paced at `mbps` for `secs`; each time the lake moves, how long ago its
/// oldest row the lake lacks was acknowledged. Returns (achieved MB/s, lag p50, p99,
/// max) in seconds.
async fn lag(mbps: f64, secs: f64) -> (f64, f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let (node, client, path) = setup(dir.path()).await;
    enable(&client, &path).await;
    let probe = batch(0);
    let per_batch = probe.get_array_memory_size() as f64;
    let interval = Duration::from_secs_f64(per_batch / (mbps * 1e6));
    let acked: Arc<std::sync::Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let writer = {
        let acked = acked.clone();
        let addr = node.flight_addr.to_string();
        let path = path.clone();
        tokio::spawn(async move {
            let client = MinkClient::connect(&addr).await.unwrap();
            let start = Instant::now();
            let mut rows = 0i64;
            let mut next = Instant::now();
            while start.elapsed().as_secs_f64() < secs {
                client.append(&path, &batch(rows)).await.unwrap();
                rows += ROWS as i64;
                acked.lock().unwrap().push((rows, Instant::now()));
                next += interval;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    tokio::time::sleep(wait).await;
                }
            }
            (rows as f64 * per_batch / ROWS as f64) / start.elapsed().as_secs_f64() / 1e6
        })
    };
    // Sampled every 20 ms: how long the oldest acknowledged row the lake lacks has
    // been waiting (0 when the lake holds every acknowledged row).
    let mut lags = Vec::new();
    while !writer.is_finished() {
        let tiered = lake_rows(&client, &path).await;
        let oldest = acked
            .lock()
            .unwrap()
            .iter()
            .find(|(rows, _)| *rows > tiered)
            .map(|(_, t)| *t);
        lags.push(oldest.map_or(0.0, |t| t.elapsed().as_secs_f64()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let achieved = writer.await.unwrap();
    node.stop().await;
    lags.sort_by(f64::total_cmp);
    let at = |q: f64| {
        lags.get(((lags.len() as f64 * q) as usize).min(lags.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    (
        achieved,
        at(0.5),
        at(0.99),
        lags.last().copied().unwrap_or(f64::NAN),
    )
}

async fn log_end(client: &MinkClient, path: &TablePath) -> i64 {
    let a: serde_json::Value = client
        .action(
            "list_offsets",
            serde_json::json!({"path": path, "spec": "latest"}),
        )
        .await
        .unwrap();
    a.as_array()
        .unwrap()
        .iter()
        .map(|o| o["offset"].as_i64().unwrap_or(0))
        .sum()
}

async fn lake_bytes(client: &MinkClient, path: &TablePath) -> f64 {
    let s: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    s["bytes"].as_f64().unwrap_or(0.0)
}

/// The sum and count of the node's `mink_lake_round_seconds` (committed rounds), read
/// from its Prometheus page: the difference across one round is that round's time.
fn round_seconds(admin: std::net::SocketAddr) -> (f64, f64) {
    let page = metrics_page(admin);
    (
        metric(&page, "mink_lake_round_seconds_sum"),
        metric(&page, "mink_lake_round_seconds_count"),
    )
}

/// The node's Prometheus page.
fn metrics_page(admin: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(admin).unwrap();
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut page = String::new();
    conn.read_to_string(&mut page).unwrap();
    page
}

/// The value of the unlabelled series `name` on `page` (0 when absent).
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// What one primary-key run measured.
struct PkRun {
    /// The first round (the whole state), from `lake.enabled` on.
    first_secs: f64,
    state_mb: f64,
    /// Merge-on-read rounds after 1% of the keys changed (10 of them): the round's own
    /// time, and what it wrote against the state.
    mor_secs: Vec<f64>,
    mor_written_mb: Vec<f64>,
    /// The same rows appended to a log table of the same node: its round's time.
    log_secs: Vec<f64>,
    /// `Lake` reads of the state, MB/s of Arrow data: after the 10 merge-on-read
    /// rounds, and after the rewrite that follows them.
    read_before_mbps: f64,
    read_after_mbps: f64,
    rewrite_secs: f64,
}

/// Waits for the lake of `path` to reach the log's end; the round's time (from the
/// node's round histogram), or `None` when a round ran while the rows were still being
/// written and the change took two.
async fn one_round(
    client: &MinkClient,
    admin: std::net::SocketAddr,
    path: &TablePath,
    before: (f64, f64),
) -> Option<f64> {
    let end = log_end(client, path).await;
    while lake_rows(client, path).await < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut after = round_seconds(admin);
    // The histogram is recorded right after the commit the wait saw.
    while after.1 <= before.1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        after = round_seconds(admin);
    }
    (after.1 - before.1 == 1.0).then_some(after.0 - before.0)
}

/// The Arrow MB/s of a `Lake` read of a primary-key table (the best of three).
async fn read_state_mbps(client: &MinkClient, path: &TablePath) -> f64 {
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        let start = Instant::now();
        let batches = client
            .read_state_any(&ReadTicket::Lake {
                path: path.clone(),
                snapshot_id: None,
                bucket: None,
                columns: None,
                filter: None,
            })
            .await
            .unwrap();
        let secs = start.elapsed().as_secs_f64();
        let bytes: usize = batches.iter().map(|(b, _)| b.get_array_memory_size()).sum();
        best = best.max(bytes as f64 / 1e6 / secs);
    }
    best
}

/// A primary-key table: `batches` batches of distinct keys tiered (the first round
/// writes the whole state), then ten rounds after each of which 1% of the keys
/// changed (merge-on-read: the changed rows and position deletes), each against the
/// same rows appended to a log table's lake on the same node; then reads of the lake
/// before and after the rewrite the eleventh round does (`rewrite_files_max` 19: ten
/// rounds leave 20 delta and delete files).
async fn pk_rounds(batches: usize) -> PkRun {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.lake.rewrite_files_max = 19;
    c.lake.rewrite_deleted_percent = 100;
    let node = Node::start(c).await.unwrap();
    let admin = node.admin_addr;
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.users").unwrap();
    let mut d = descriptor();
    d.primary_key = vec!["id".into()];
    client.create_table(&path, &d).await.unwrap();
    let log_path = TablePath::parse("b.changes").unwrap();
    client.create_table(&log_path, &descriptor()).await.unwrap();
    enable(&client, &log_path).await;
    for i in 0..batches {
        client
            .put(&path, &batch(i as i64 * ROWS as i64), None, None)
            .await
            .unwrap();
    }
    let start = Instant::now();
    enable(&client, &path).await;
    let end = log_end(&client, &path).await;
    while lake_rows(&client, &path).await < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first_secs = start.elapsed().as_secs_f64();
    let state_mb = lake_bytes(&client, &path).await / 1e6;
    let changed = (batches * ROWS / 100).max(1);
    let (mut mor_secs, mut mor_written_mb, mut log_secs) = (Vec::new(), Vec::new(), Vec::new());
    let update = |round: usize| {
        // 1% of the keys, other ones each round, spread over the whole key range;
        // same keys, other values (an upsert that changes nothing emits no changelog).
        let keys: Vec<i64> = (0..changed)
            .map(|k| ((k * 100 + round * 7) % (batches * ROWS)) as i64)
            .collect();
        let values = batch(7 + round as i64).slice(0, changed);
        RecordBatch::try_new(
            values.schema(),
            vec![Arc::new(Int64Array::from(keys)), values.column(1).clone()],
        )
        .unwrap()
    };
    for round in 0..10 {
        let rows = update(round);
        let before = round_seconds(admin);
        client.put(&path, &rows, None, None).await.unwrap();
        let mor = one_round(&client, admin, &path, before).await;
        let snap: serde_json::Value = client
            .action("lake_snapshot", serde_json::json!({"path": path}))
            .await
            .unwrap();
        assert!(snap["delete_files"].as_u64().unwrap() > 0, "{snap}");
        if mor.is_some() {
            mor_written_mb.push(snap["added_bytes"].as_f64().unwrap_or(0.0) / 1e6);
        }
        let before = round_seconds(admin);
        client.append(&log_path, &rows).await.unwrap();
        // A pair is kept only when each change took one round.
        let log = one_round(&client, admin, &log_path, before).await;
        // Each round on stderr, with the key-column scans so far (a round without a
        // usable key index scans): what a slow round did.
        let scans = metric(&metrics_page(admin), "mink_lake_key_index_scans_total");
        eprintln!("pk round {round}: merge-on-read {mor:?} s, log {log:?} s, key scans {scans}");
        if let (Some(m), Some(l)) = (mor, log) {
            mor_secs.push(m);
            log_secs.push(l);
        }
    }
    let read_before_mbps = read_state_mbps(&client, &path).await;
    let before = round_seconds(admin);
    client.put(&path, &update(10), None, None).await.unwrap();
    let rewrite_secs = one_round(&client, admin, &path, before)
        .await
        .unwrap_or(f64::NAN);
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    assert_eq!(
        snap["delete_files"], 0,
        "the eleventh round rewrites: {snap}"
    );
    let read_after_mbps = read_state_mbps(&client, &path).await;
    node.stop().await;
    PkRun {
        first_secs,
        state_mb,
        mor_secs,
        mor_written_mb,
        log_secs,
        read_before_mbps,
        read_after_mbps,
        rewrite_secs,
    }
}

struct CompactRun {
    files_before: u64,
    files_after: u64,
    fresh_files: u64,
    small_mbps: f64,
    compacted_mbps: f64,
    fresh_mbps: f64,
    catch_up_rounds: u32,
    /// Bytes read and written, and requests, by the lake while compaction caught up.
    catch_up_mb: (f64, f64),
    catch_up_requests: u64,
}

async fn lake_files(client: &MinkClient, path: &TablePath) -> u64 {
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    snap["files"].as_u64().unwrap()
}

/// MB/s of a whole-table `Lake` read of `rows` rows: the best of three (one read of
/// ~100 MB takes well under a second; one slow one is the machine's noise).
async fn lake_read_mbps(client: &MinkClient, path: &TablePath, rows: i64) -> f64 {
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        let lake = ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        };
        best = best.max(read_mbps(client, &lake, rows).await);
    }
    best
}

/// MB/s of one read of `ticket`, which must answer `rows` rows.
async fn read_mbps(client: &MinkClient, ticket: &ReadTicket, rows: i64) -> f64 {
    let start = Instant::now();
    let read = client.read_any(ticket).await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(
        read.iter().map(|(b, _)| b.num_rows()).sum::<usize>() as i64,
        rows
    );
    let bytes: usize = read.iter().map(|(b, _)| b.get_array_memory_size()).sum();
    bytes as f64 / secs / 1e6
}

/// Waits until the lake holds `rows` rows of `path`.
async fn until_lake_holds(client: &MinkClient, path: &TablePath, rows: i64) {
    while lake_rows(client, path).await < rows {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A log table tiered in `rounds` rounds of one small file per bucket (a backlog of
/// `rounds` appends, tiered with a file target of one append's rows per bucket, with
/// compaction off), read; then the node restarted with the default settings, which
/// compact while rounds tier a trickle of new rows, until every bucket is down to at
/// most `compact_files_min` files; read again. The baseline: the same rows appended to
/// a second table whose lake is turned on afterwards with the default settings.
async fn compaction(rounds: usize) -> CompactRun {
    const PER_APPEND: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // One append holds ~25 KB per bucket: a round's file.
    c.lake.file_bytes_target = 16 << 10;
    c.lake.round_bytes_max = 16 << 10;
    c.lake.compact_files_min = 0;
    let node = Node::start(c).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("b").await.unwrap();
    let path = TablePath::parse("b.small").unwrap();
    let fresh = TablePath::parse("b.fresh").unwrap();
    for p in [&path, &fresh] {
        client.create_table(p, &descriptor()).await.unwrap();
    }
    for i in 0..rounds {
        let b = batch_of((i * PER_APPEND) as i64, PER_APPEND);
        client.append(&path, &b).await.unwrap();
        client.append(&fresh, &b).await.unwrap();
    }
    let mut rows = (rounds * PER_APPEND) as i64;
    enable(&client, &path).await;
    until_lake_holds(&client, &path, rows).await;
    let files_before = lake_files(&client, &path).await;
    let small_mbps = lake_read_mbps(&client, &path, rows).await;
    node.stop().await;

    let defaults = config(dir.path());
    let min_files = defaults.lake.compact_files_min as u64;
    let node = Node::start(defaults).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    let before = node.accounting.report();
    let mut catch_up_rounds = 0;
    let mut files_after = files_before;
    let mut steady = 0;
    // Until the file count stops falling (two rounds without a merge) and every
    // bucket is within `compact_files_min`.
    while (steady < 2 || files_after > BUCKETS as u64 * min_files) && catch_up_rounds < 100 {
        // A few rows in every bucket (a log table without bucket keys puts a batch in
        // one bucket, round-robin): each bucket's next round tiers them, and merges.
        for _ in 0..BUCKETS {
            let b = batch_of(rows, 4);
            client.append(&path, &b).await.unwrap();
            client.append(&fresh, &b).await.unwrap();
            rows += 4;
        }
        until_lake_holds(&client, &path, rows).await;
        catch_up_rounds += 1;
        let files = lake_files(&client, &path).await;
        steady = if files >= files_after { steady + 1 } else { 0 };
        files_after = files;
    }
    let after = node.accounting.report();
    let lake = |r: &mink_wal::AccountingReport| {
        r.by_kind
            .iter()
            .filter(|u| u.purpose == mink_wal::Purpose::Lake)
            .fold((0u64, 0u64, 0u64), |(rx, tx, n), u| {
                (rx + u.bytes_received, tx + u.bytes_sent, n + u.requests)
            })
    };
    let (rx0, tx0, n0) = lake(&before);
    let (rx1, tx1, n1) = lake(&after);
    let compacted_mbps = lake_read_mbps(&client, &path, rows).await;
    enable(&client, &fresh).await;
    until_lake_holds(&client, &fresh, rows).await;
    let fresh_files = lake_files(&client, &fresh).await;
    let fresh_mbps = lake_read_mbps(&client, &fresh, rows).await;
    node.stop().await;
    eprintln!(
        "compaction: {files_before} files -> {files_after} in {catch_up_rounds} rounds; \
         reads {small_mbps:.1} -> {compacted_mbps:.1} MB/s, fresh {fresh_mbps:.1} MB/s \
         ({fresh_files} files)"
    );
    CompactRun {
        files_before,
        files_after,
        fresh_files,
        small_mbps,
        compacted_mbps,
        fresh_mbps,
        catch_up_rounds,
        catch_up_mb: ((rx1 - rx0) as f64 / 1e6, (tx1 - tx0) as f64 / 1e6),
        catch_up_requests: n1 - n0,
    }
}

fn compaction_report(runs: &[CompactRun], rounds: usize) -> String {
    let col = |f: fn(&CompactRun) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    let mut out = format!(
        "\nCompaction of a log table's lake ({BUCKETS} buckets, ~1 KB rows): {rounds} appends \
         of 100 rows (each in one bucket, round-robin) tiered by rounds of one file each \
         (compaction off), then the node restarted with the defaults (`compact_files_min` \
         16, `file_bytes_target` 128 MiB) and rounds of a few rows per bucket until the \
         file count stopped falling; the baseline is the same rows tiered fresh into a \
         second table. {} runs, min..max.\n\n\
         | measure | value | baseline | ratio |\n|---|---|---|---|\n",
        runs.len()
    );
    out.push_str(&format!(
        "| `Lake` read after {rounds} appends ({} files) | {} MB/s | fresh ({} files): {} MB/s | {} |\n",
        range(&col(|r| r.files_before as f64)),
        range(&col(|r| r.small_mbps)),
        range(&col(|r| r.fresh_files as f64)),
        range(&col(|r| r.fresh_mbps)),
        range(&col(|r| r.small_mbps / r.fresh_mbps)),
    ));
    out.push_str(&format!(
        "| `Lake` read once compaction caught up ({} files) | {} MB/s | fresh: {} MB/s | {} |\n",
        range(&col(|r| r.files_after as f64)),
        range(&col(|r| r.compacted_mbps)),
        range(&col(|r| r.fresh_mbps)),
        range(&col(|r| r.compacted_mbps / r.fresh_mbps)),
    ));
    out.push_str(&format!(
        "| catching up: rounds, MB read / written, requests (lake) | {} rounds, {} / {} MB, {} requests | | |\n",
        range(&col(|r| f64::from(r.catch_up_rounds))),
        range(&col(|r| r.catch_up_mb.0)),
        range(&col(|r| r.catch_up_mb.1)),
        range(&col(|r| r.catch_up_requests as f64)),
    ));
    out
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn range(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.2}..{max:.2}")
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench -p mink-node --bench lake -- --pk-only`: the primary-key part alone.
    let pk_only = std::env::args().any(|a| a == "--pk-only");
    // `-- --compaction-only`: the compaction part alone.
    if std::env::args().any(|a| a == "--compaction-only") {
        let (runs, rounds) = if quick { (1, 100) } else { (3, 1000) };
        let mut c = Vec::new();
        for _ in 0..runs {
            c.push(compaction(rounds).await);
        }
        print!("{}", compaction_report(&c, rounds));
        return;
    }
    let (runs, batches, secs) = if quick { (1, 10, 3.0) } else { (3, 100, 20.0) };
    let mut b = Vec::new();
    for _ in 0..runs {
        if pk_only {
            break;
        }
        b.push(backlog(batches).await);
    }
    let col = |f: fn(&Backlog) -> f64| b.iter().map(f).collect::<Vec<_>>();
    let mut out = format!(
        "One node in-process on `file://`, a log table of {BUCKETS} buckets, rows of ~1 KB \
         ({} MB of Arrow data per backlog run), {runs} runs, min..max.\n\n\
         | measure | MB/s | baseline MB/s | ratio |\n|---|---|---|---|\n",
        batches * batch(0).get_array_memory_size() / 1_000_000
    );
    let tier = col(|x| x.tier_mbps);
    let raw = col(|x| x.raw_mbps);
    let ratio: Vec<f64> = b.iter().map(|x| x.tier_mbps / x.raw_mbps).collect();
    out.push_str(&format!(
        "| tiering a backlog (log → Parquet → Iceberg commit) | {} | raw Parquet encode + PUT: {} | {} |\n",
        range(&tier),
        range(&raw),
        range(&ratio)
    ));
    let union = col(|x| x.union_mbps);
    let scan = col(|x| x.scan_mbps);
    let ratio: Vec<f64> = b.iter().map(|x| x.union_mbps / x.scan_mbps).collect();
    out.push_str(&format!(
        "| `Union` read (all rows in the lake) | {} | log scan of the same table: {} | {} |\n",
        range(&union),
        range(&scan),
        range(&ratio)
    ));
    out.push_str(&format!(
        "\nLag under a steady write load, `lake.freshness` 1 s, {secs:.0} s per run, sampled \
         every 20 ms: how long the oldest acknowledged row the lake lacks has waited.\n\n\
         | target MB/s | achieved MB/s | lag p50 | lag p99 | lag max |\n|---|---|---|---|---|\n"
    ));
    for _ in 0..runs {
        if pk_only {
            break;
        }
        let (achieved, p50, p99, max) = lag(50.0, secs).await;
        out.push_str(&format!(
            "| 50 | {achieved:.1} | {p50:.2} s | {p99:.2} s | {max:.2} s |\n"
        ));
    }
    let pk: Vec<PkRun> = {
        let mut v = Vec::new();
        for _ in 0..runs {
            v.push(pk_rounds(batches / 2).await);
        }
        v
    };
    let all = |f: fn(&PkRun) -> Vec<f64>| pk.iter().flat_map(f).collect::<Vec<_>>();
    let written_share: Vec<f64> = pk
        .iter()
        .flat_map(|r| r.mor_written_mb.iter().map(|w| w / r.state_mb))
        .collect();
    let time_ratio: Vec<f64> = pk
        .iter()
        .flat_map(|r| r.mor_secs.iter().zip(&r.log_secs).map(|(m, l)| m / l))
        .collect();

    out.push_str(&format!(
        "\nPrimary-key table, merge-on-read: a state of {} MB of Parquet ({} keys, 1 KB \
         rows, {BUCKETS} buckets); then ten rounds, each after 1% of the keys changed \
         (every bucket), each against the same rows appended to a log table's lake on \
         the same node; round times are the node's own (`mink_lake_round_seconds`). \
         {runs} runs, min..max over every round of every run.\n\n\
         | measure | value | baseline | ratio |\n|---|---|---|---|\n",
        range(&pk.iter().map(|r| r.state_mb).collect::<Vec<_>>()),
        batches / 2 * ROWS,
    ));
    out.push_str(&format!(
        "| first round (the whole state), from `lake.enabled` | {} s | | |\n",
        range(&pk.iter().map(|r| r.first_secs).collect::<Vec<_>>())
    ));
    out.push_str(&format!(
        "| bytes a round writes after 1% changed (data + deletes + nothing else) | {} MB | the state | {} |\n",
        range(&all(|r| r.mor_written_mb.clone())),
        range(&written_share)
    ));
    out.push_str(&format!(
        "| the round's time | {} s | tiering the same rows into a log table's lake: {} s | {} (median {:.2}, {} of {} above 2) |\n",
        range(&all(|r| r.mor_secs.clone())),
        range(&all(|r| r.log_secs.clone())),
        range(&time_ratio),
        median(&time_ratio),
        time_ratio.iter().filter(|r| **r > 2.0).count(),
        time_ratio.len(),
    ));
    out.push_str(&format!(
        "| `Lake` read after the ten rounds (20 delta and delete files per bucket) | {} MB/s | after the rewrite: {} MB/s | {} |\n",
        range(&pk.iter().map(|r| r.read_before_mbps).collect::<Vec<_>>()),
        range(&pk.iter().map(|r| r.read_after_mbps).collect::<Vec<_>>()),
        range(&pk.iter().map(|r| r.read_before_mbps / r.read_after_mbps).collect::<Vec<_>>())
    ));
    out.push_str(&format!(
        "| the rewrite round (the eleventh: the whole state again) | {} s | | |\n",
        range(&pk.iter().map(|r| r.rewrite_secs).collect::<Vec<_>>())
    ));
    if !pk_only {
        let rounds = if quick { 100 } else { 1000 };
        let mut c = Vec::new();
        for _ in 0..runs {
            c.push(compaction(rounds).await);
        }
        out.push_str(&compaction_report(&c, rounds));
    }
    print!("{out}");
}
