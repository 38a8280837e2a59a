//! `cargo xtask bench meta`: metadata proposals per second, lease failover time, and
//! start-up time with 10,000 tables from a snapshot and from full replay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mink_meta::{MetaCommand, MetaConfig, MetaNode, MetaState};
use mink_types::{Column, DataType, Schema, TableDescriptor, TablePath};
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{ObjectLog, ObjectLogOptions, ObjectStoreConfig, open_object_store};
use object_store::ObjectStore;
use object_store::memory::InMemory;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn quiet() -> MetaConfig {
    // Long intervals: background traffic stays out of the proposal figures.
    MetaConfig {
        heartbeat_interval_ms: 60_000,
        lease_timeout_ms: 120_000,
        node_session_timeout_ms: 180_000,
        tail_idle_interval_max_ms: 1_000,
        snapshot_every_entries: 1_000_000,
        applied_index_wait_max_ms: 5_000,
        ..MetaConfig::default()
    }
}

async fn proposals_per_sec(latency_ms: u64, proposers: usize, secs: f64) -> f64 {
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            put_latency: Duration::from_millis(latency_ms),
            ..Default::default()
        },
    ));
    let mut nodes = Vec::new();
    for i in 0..proposers {
        nodes.push(
            MetaNode::open(store.clone(), &format!("n{i}"), "x:1", "x:2", quiet())
                .await
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let node = node.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    node.create_database(&format!("d{i}_{n}")).await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let rate = total as f64 / start.elapsed().as_secs_f64();
    for n in nodes {
        n.shutdown(false).await;
    }
    rate
}

/// Offset commits per second of `committers` concurrent committers on one node (as a
/// lease holder hosting many consumer groups sees them): group commit puts the
/// proposals queued behind one PUT into the next entry.
async fn offset_commits_per_sec(latency_ms: u64, committers: usize, secs: f64) -> (f64, f64) {
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            put_latency: Duration::from_millis(latency_ms),
            ..Default::default()
        },
    ));
    let node = MetaNode::open(store, "n0", "x:1", "x:2", quiet())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let before = node.applied_index();
    let tasks: Vec<_> = (0..committers)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    node.propose(mink_meta::MetaCommand::CommitGroupOffsets {
                        group: format!("g{i}"),
                        offsets: std::collections::BTreeMap::from([(
                            "t/0".to_string(),
                            (n as i64, String::new()),
                        )]),
                        at_ms: 0,
                        retention_ms: 86_400_000,
                    })
                    .await
                    .unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let entries = (node.applied_index() - before) as f64;
    node.shutdown(false).await;
    (total as f64 / elapsed, total as f64 / entries.max(1.0))
}

async fn failover_ms() -> f64 {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let config = MetaConfig {
        heartbeat_interval_ms: 100,
        lease_timeout_ms: 1_000,
        node_session_timeout_ms: 1_500,
        tail_idle_interval_max_ms: 100,
        ..quiet()
    };
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(
            MetaNode::open(
                store.clone(),
                &format!("n{i}"),
                "x:1",
                "x:2",
                config.clone(),
            )
            .await
            .unwrap(),
        );
    }
    while nodes[0].lease().1.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (term, holder) = nodes[0].lease();
    let holder = holder.unwrap();
    let old = nodes.iter().find(|n| n.node_id() == holder).unwrap();
    old.shutdown(false).await;
    let start = Instant::now();
    let other = nodes.iter().find(|n| n.node_id() != holder).unwrap();
    loop {
        other.inner_catch_up().await;
        if other.lease().0 > term {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed().as_secs_f64() * 1e3
}

async fn startup(tables: usize) -> (f64, f64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_object_store(&ObjectStoreConfig {
        url: format!("file://{}", dir.path().display()),
        ..Default::default()
    })
    .unwrap();
    let options = ObjectLogOptions {
        delete_grace: Duration::ZERO,
        list_refresh: Duration::ZERO,
    };
    let writer = ObjectLog::open_with(store.clone(), "meta", MetaState::default(), options.clone())
        .await
        .unwrap();
    writer
        .append(&MetaCommand::CreateDatabase { name: "db".into() })
        .await
        .unwrap();
    let descriptor = TableDescriptor {
        bucket_count: 4,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("v", DataType::String, true),
            ],
        ))
    };
    for i in 0..tables {
        writer
            .append(&MetaCommand::CreateTable {
                path: TablePath::parse(&format!("db.t{i}")).unwrap(),
                descriptor: descriptor.clone(),
                at_ms: 0,
            })
            .await
            .unwrap();
    }
    let start = Instant::now();
    let replayed = ObjectLog::open(store.clone(), "meta", MetaState::default())
        .await
        .unwrap();
    let replay = start.elapsed().as_secs_f64();
    assert_eq!(replayed.read(|s, _| s.tables.len()), tables);
    writer.write_snapshot().await.unwrap();
    let at = writer.applied_index();
    writer.delete_covered(at).await.unwrap();
    let snapshot_bytes = serde_json::to_vec(&writer.read(|s, _| s.clone()))
        .unwrap()
        .len();
    let start = Instant::now();
    let from_snapshot = ObjectLog::open(store.clone(), "meta", MetaState::default())
        .await
        .unwrap();
    let snap = start.elapsed().as_secs_f64();
    assert_eq!(from_snapshot.read(|s, _| s.tables.len()), tables);
    (replay, snap, snapshot_bytes)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let secs = if quick { 0.5 } else { 2.0 };
    let tables = if quick { 1_000 } else { 10_000 };
    let mut out = String::new();
    out.push_str("### Proposals per second (`create_database`, in-memory store with injected PUT latency)\n\n| PUT latency | 1 proposer | 3 proposers (total) |\n|---|---|---|\n");
    for latency in [0u64, 20] {
        let one = proposals_per_sec(latency, 1, secs).await;
        let three = proposals_per_sec(latency, 3, secs).await;
        out.push_str(&format!("| {latency} ms | {one:.0}/s | {three:.0}/s |\n"));
    }
    out.push_str("\n### Offset commits per second (one node, group commit: concurrent proposals share an entry)\n\n| PUT latency | committers | commits/s | commits per entry |\n|---|---|---|---|\n");
    for (latency, committers) in [(20u64, 1usize), (20, 64), (20, 256)] {
        let mut rates = Vec::new();
        let mut per = Vec::new();
        for _ in 0..3 {
            let (rate, per_entry) = offset_commits_per_sec(latency, committers, secs).await;
            rates.push(rate);
            per.push(per_entry);
        }
        let span = |v: &[f64]| {
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{min:.0}..{max:.0}")
        };
        out.push_str(&format!(
            "| {latency} ms | {committers} | {} | {} |\n",
            span(&rates),
            span(&per)
        ));
    }
    let failover = failover_ms().await;
    out.push_str(&format!(
        "\n### Lease failover\n\nHeartbeat 100 ms, `lease_timeout_ms` 1,000: the holder stops; another node holds term + 1 after **{failover:.0} ms** (floor: the lease timeout plus up to one heartbeat interval).\n"
    ));
    let (replay, snap, bytes) = startup(tables).await;
    out.push_str(&format!(
        "\n### Start-up with {tables} tables (`file://`)\n\n| full replay ({tables} entries) | from a snapshot ({:.1} MB) | ratio |\n|---|---|---|\n| {:.0} ms | {:.0} ms | {:.1}× faster |\n",
        bytes as f64 / 1e6,
        replay * 1e3,
        snap * 1e3,
        replay / snap
    ));
    print!("{out}");
}
