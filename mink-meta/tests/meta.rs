//! Three MetaNodes sharing one store: catalog races, read-your-writes, the lease and
//! its failover, dead nodes, snapshots; and three processes on one `file://` store.

use std::sync::Arc;
use std::time::Duration;

use mink_meta::{MetaCommand, MetaConfig, MetaNode, MetaState};
use mink_types::{Column, DataType, MinkError, Schema, TableDescriptor, TablePath};
use object_store::ObjectStore;
use object_store::memory::InMemory;

fn config() -> MetaConfig {
    MetaConfig {
        heartbeat_interval_ms: 100,
        lease_timeout_ms: 1_000,
        node_session_timeout_ms: 1_500,
        tail_idle_interval_max_ms: 100,
        snapshot_every_entries: 1_000,
        applied_index_wait_max_ms: 5_000,
        ..MetaConfig::default()
    }
}

fn table(buckets: u32) -> TableDescriptor {
    TableDescriptor {
        bucket_count: buckets,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![Column::new("v", DataType::BigInt, true)],
        ))
    }
}

async fn node(store: &Arc<dyn ObjectStore>, name: &str) -> MetaNode {
    MetaNode::open(
        store.clone(),
        name,
        &format!("{name}:9120"),
        &format!("{name}:9092"),
        config(),
    )
    .await
    .unwrap()
}

async fn three() -> (Arc<dyn ObjectStore>, Vec<MetaNode>) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut nodes = Vec::new();
    for n in ["a", "b", "c"] {
        nodes.push(node(&store, n).await);
    }
    (store, nodes)
}

async fn settle(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn concurrent_creates_of_one_table_have_one_winner() {
    let (_store, nodes) = three().await;
    nodes[0].create_database("db").await.unwrap();
    let path = TablePath::parse("db.orders").unwrap();
    let (r0, r1, r2) = tokio::join!(
        nodes[0].create_table(&path, table(2)),
        nodes[1].create_table(&path, table(3)),
        nodes[2].create_table(&path, table(4)),
    );
    let results = [r0.map(|r| r.0), r1.map(|r| r.0), r2.map(|r| r.0)];
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(ok.len(), 1, "{results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, MinkError::AlreadyExists(_)), "{e:?}");
        }
    }
    // Duplicate databases too.
    assert!(matches!(
        nodes[1].create_database("db").await,
        Err(MinkError::AlreadyExists(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn read_your_writes_across_nodes() {
    let (_store, nodes) = three().await;
    nodes[0].create_database("db").await.unwrap();
    let path = TablePath::parse("db.t").unwrap();
    let (_, index) = nodes[0].create_table(&path, table(1)).await.unwrap();
    // Node b may not have seen it yet; waiting on the index makes it so.
    nodes[1]
        .wait_for(index, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(nodes[1].read(|s| s.table(&path).is_some()));
    assert!(nodes[1].applied_index() >= index);
    // An index nobody reaches times out with a clear error.
    let err = nodes[2]
        .wait_for(index + 1_000, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, MinkError::Unavailable(_)), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn partitions_created_on_demand_by_two_nodes_are_one() {
    let (_store, nodes) = three().await;
    nodes[0].create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    let mut d = TableDescriptor::log_table(Schema::new(
        1,
        vec![
            Column::new("day", DataType::String, false),
            Column::new("v", DataType::BigInt, true),
        ],
    ));
    d.partition_keys = vec!["day".into()];
    d.bucket_count = 2;
    nodes[0].create_table(&path, d).await.unwrap();
    let (a, b) = tokio::join!(
        nodes[1].create_partition(&path, "2026-11-29"),
        nodes[2].create_partition(&path, "2026-11-29")
    );
    let (a, b) = (a.unwrap().0, b.unwrap().0);
    assert_eq!(a, b);
    nodes[0].inner_catch_up().await;
    let (partitions, buckets) = nodes[0].read(|s| {
        let t = s.table(&path).unwrap();
        (t.partitions.len(), s.buckets_of(t.id, Some(a.id)).len())
    });
    assert_eq!((partitions, buckets), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn the_lease_fails_over_and_the_old_holder_is_fenced() {
    let (_store, nodes) = three().await;
    settle(2).await;
    let (term, holder) = nodes[0].lease();
    let holder = holder.expect("someone holds the lease");
    assert_eq!(term, 1);
    let old = nodes
        .iter()
        .find(|n| n.node_id() == holder)
        .unwrap()
        .clone();
    assert!(old.is_lease_holder());
    // The holder stops (no goodbye): after lease_timeout another node takes term 2.
    old.shutdown(false).await;
    settle(5).await;
    let others: Vec<&MetaNode> = nodes.iter().filter(|n| n.node_id() != holder).collect();
    others[0].inner_catch_up().await;
    let (term2, holder2) = others[0].lease();
    assert_eq!(term2, 2);
    let holder2 = holder2.unwrap();
    assert_ne!(holder2, holder);
    // The old holder's proposals under its term are rejected.
    let err = old
        .propose(MetaCommand::ExpireOffsets {
            term: 1,
            now_ms: 0,
            live_groups: Default::default(),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, MinkError::Fenced(_)), "{err:?}");
    assert!(
        !old.is_lease_holder(),
        "the old holder has stepped down in its view"
    );
}

#[tokio::test(start_paused = true)]
async fn buckets_get_leaders_and_move_off_a_dead_node_with_new_epochs() {
    let (_store, nodes) = three().await;
    settle(2).await;
    nodes[0].create_database("db").await.unwrap();
    let path = TablePath::parse("db.t").unwrap();
    let (t, _) = nodes[0].create_table(&path, table(6)).await.unwrap();
    settle(2).await;
    let view = |n: &MetaNode| {
        n.read(|s| {
            s.buckets_of(t.id, None)
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        })
    };
    nodes[0].inner_catch_up().await;
    let before = view(&nodes[0]);
    for b in &before {
        assert!(b.leader.is_some(), "{b:?}");
        assert_eq!(b.epoch, 1);
    }
    for n in ["a", "b", "c"] {
        let led = before
            .iter()
            .filter(|b| b.leader.as_deref() == Some(n))
            .count();
        assert_eq!(led, 2, "balanced by count: {before:?}");
    }
    // Kill a node that does not hold the lease.
    let (_, holder) = nodes[0].lease();
    let victim = nodes
        .iter()
        .find(|n| Some(n.node_id().to_string()) != holder)
        .unwrap()
        .clone();
    victim.shutdown(false).await;
    settle(6).await;
    let survivor = nodes
        .iter()
        .find(|n| n.node_id() != victim.node_id())
        .unwrap();
    survivor.inner_catch_up().await;
    let after = view(survivor);
    for (b0, b1) in before.iter().zip(&after) {
        assert_ne!(b1.leader.as_deref(), Some(victim.node_id()), "{after:?}");
        if b0.leader.as_deref() == Some(victim.node_id()) {
            assert!(b1.epoch > b0.epoch, "moved buckets get a higher epoch");
        } else {
            assert_eq!(b1.epoch, b0.epoch, "unmoved buckets keep theirs");
        }
    }
    assert!(!survivor.read(|s| s.nodes[victim.node_id()].alive));
}

#[tokio::test(start_paused = true)]
async fn a_restart_from_a_snapshot_reproduces_the_state() {
    let (store, nodes) = three().await;
    settle(2).await;
    nodes[0].create_database("db").await.unwrap();
    for i in 0..20 {
        nodes[i % 3]
            .create_table(&TablePath::parse(&format!("db.t{i}")).unwrap(), table(2))
            .await
            .unwrap();
    }
    nodes[1].allocate_writer_ids(100).await.unwrap();
    settle(2).await;
    let writer = mink_wal::ObjectLog::open(store.clone(), "meta", MetaState::default())
        .await
        .unwrap();
    let at = writer.write_snapshot().await.unwrap();
    let replayed = writer.read(|s, _| serde_json::to_string(s).unwrap());
    let fresh = mink_wal::ObjectLog::open(store.clone(), "meta", MetaState::default())
        .await
        .unwrap();
    assert_eq!(fresh.applied_index(), at);
    assert_eq!(
        fresh.read(|s, _| serde_json::to_string(s).unwrap()),
        replayed
    );
}

#[tokio::test(start_paused = true)]
async fn writer_ids_come_in_disjoint_blocks() {
    let (_store, nodes) = three().await;
    let (a, b, c) = tokio::join!(
        nodes[0].allocate_writer_ids(10),
        nodes[1].allocate_writer_ids(10),
        nodes[2].allocate_writer_ids(10)
    );
    let mut blocks = vec![a.unwrap(), b.unwrap(), c.unwrap()];
    blocks.sort_by_key(|r| r.start);
    assert_eq!(blocks, vec![0..10, 10..20, 20..30]);
}

#[tokio::test(start_paused = true)]
async fn invalid_proposals_are_rejected_before_they_are_appended() {
    let (_store, nodes) = three().await;
    let path = TablePath::parse("nodb.t").unwrap();
    assert!(matches!(
        nodes[0].create_table(&path, table(1)).await,
        Err(MinkError::NotFound(_))
    ));
    nodes[0].create_database("db").await.unwrap();
    let mut bad = table(1);
    bad.bucket_count = 0;
    let err = nodes[0]
        .create_table(&TablePath::parse("db.t").unwrap(), bad)
        .await
        .unwrap_err();
    assert!(
        matches!(err, MinkError::InvalidArgument { ref field, .. } if field == "bucket_count"),
        "{err:?}"
    );
    // Table ids are assigned when a CreateTable entry is applied: none was appended.
    nodes[0].inner_catch_up().await;
    assert_eq!(nodes[0].read(|s| (s.next_table_id, s.tables.len())), (0, 0));
}

/// Child half of `three_processes_race_for_one_table`.
#[tokio::test]
#[ignore = "run as a child process by three_processes_race_for_one_table"]
async fn child_process() {
    let (Ok(url), Ok(id)) = (
        std::env::var("MINKTEST_CHILD_URL"),
        std::env::var("MINKTEST_CHILD_ID"),
    ) else {
        return;
    };
    let store = mink_wal::open_object_store(&mink_wal::ObjectStoreConfig {
        url,
        ..Default::default()
    })
    .unwrap();
    let meta = node(&store, &format!("p{id}")).await;
    let _ = meta.create_database("db").await;
    let path = TablePath::parse("db.contested").unwrap();
    match meta.create_table(&path, table(1)).await {
        Ok(_) => println!("RESULT won"),
        Err(MinkError::AlreadyExists(_)) => println!("RESULT lost"),
        Err(e) => panic!("{e}"),
    }
    meta.shutdown(true).await;
}

#[tokio::test]
async fn three_processes_race_for_one_table() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|id| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "child_process", "--nocapture"])
                .env("MINKTEST_CHILD_URL", &url)
                .env("MINKTEST_CHILD_ID", id.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut won = 0;
    let mut lost = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        won += text.matches("RESULT won").count();
        lost += text.matches("RESULT lost").count();
    }
    assert_eq!((won, lost), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn rebalance_evens_out_buckets_on_the_lease_holder_only() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = node(&store, "a").await;
    settle(2).await;
    a.create_database("db").await.unwrap();
    let (t, _) = a
        .create_table(&TablePath::parse("db.t").unwrap(), table(6))
        .await
        .unwrap();
    settle(2).await;
    assert!(a.read(|s| {
        s.buckets_of(t.id, None)
            .iter()
            .all(|b| b.leader.as_deref() == Some("a"))
    }));
    let b = node(&store, "b").await;
    let c = node(&store, "c").await;
    settle(1).await;
    assert!(
        matches!(b.rebalance().await, Err(MinkError::Unavailable(_))),
        "only the holder rebalances"
    );
    assert_eq!(a.rebalance().await.unwrap(), 4);
    c.inner_catch_up().await;
    let leaders: Vec<(String, u64)> = c.read(|s| {
        s.buckets_of(t.id, None)
            .iter()
            .map(|b| (b.leader.clone().unwrap(), b.epoch))
            .collect()
    });
    for n in ["a", "b", "c"] {
        assert_eq!(
            leaders.iter().filter(|(l, _)| l == n).count(),
            2,
            "{leaders:?}"
        );
    }
    assert_eq!(
        leaders.iter().filter(|(_, e)| *e == 2).count(),
        4,
        "moved buckets have epoch 2"
    );
    assert_eq!(a.rebalance().await.unwrap(), 0, "nothing left to move");
}

#[tokio::test(start_paused = true)]
async fn concurrent_assignments_assign_each_bucket_once() {
    // Every object-store request takes time, so concurrent callers interleave between
    // reading the view and appending their plan.
    let faulty = mink_wal::fault::FaultyStore::new(
        Arc::new(InMemory::new()),
        mink_wal::fault::FaultConfig {
            put_latency: Duration::from_millis(20),
            get_latency: Duration::from_millis(5),
            list_latency: Duration::from_millis(5),
            ..Default::default()
        },
    );
    let store: Arc<dyn ObjectStore> = Arc::new(faulty);
    let mut nodes = Vec::new();
    for n in ["a", "b", "c"] {
        nodes.push(node(&store, n).await);
    }
    settle(2).await;
    let holder = nodes
        .iter()
        .find(|n| n.is_lease_holder())
        .expect("someone holds the lease")
        .clone();
    holder.create_database("db").await.unwrap();
    let (t, _) = holder
        .create_table(&TablePath::parse("db.t").unwrap(), table(6))
        .await
        .unwrap();
    // Callers after create_table (the node service calls it so that writes need not
    // wait), alongside the lease loop's own call on the new entry.
    futures::future::join_all((0..4).map(|_| holder.assign_now())).await;
    settle(2).await;
    holder.inner_catch_up().await;
    let buckets: Vec<(Option<String>, u64)> = holder.read(|s| {
        s.buckets_of(t.id, None)
            .iter()
            .map(|b| (b.leader.clone(), b.epoch))
            .collect()
    });
    assert!(
        buckets.iter().all(|(_, epoch)| *epoch == 1),
        "each bucket is assigned once (epoch 1): {buckets:?}"
    );
    for n in ["a", "b", "c"] {
        assert_eq!(
            buckets
                .iter()
                .filter(|(l, _)| l.as_deref() == Some(n))
                .count(),
            2,
            "balanced by count: {buckets:?}"
        );
    }
}

/// Concurrent proposals of one node share entries (group commit): far fewer PUTs than
/// proposals, every valid one applied once, an invalid one answered with its own
/// rejection without failing the others, and the other nodes apply them all.
#[tokio::test]
async fn concurrent_proposals_of_a_node_are_committed_in_batches() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = mink_wal::fault::FaultyStore::new(
        inner,
        mink_wal::fault::FaultConfig {
            put_latency: Duration::from_millis(20),
            ..Default::default()
        },
    );
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let a = node(&store, "a").await;
    let b = node(&store, "b").await;
    a.create_database("dup").await.unwrap();
    let before = faulty
        .counters()
        .puts
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut tasks = Vec::new();
    for i in 0..100 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let name = if i == 50 {
                "dup".to_string()
            } else {
                format!("d{i}")
            };
            a.create_database(&name).await
        }));
    }
    let mut ok = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(i, 50, "{e}");
                assert!(matches!(e, MinkError::AlreadyExists(_)), "{e:?}");
            }
        }
    }
    assert_eq!(ok, 99);
    let puts = faulty
        .counters()
        .puts
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    // Heartbeats put too; the 99 databases took far fewer than 99.
    assert!(puts < 40, "{puts} PUTs for 99 proposals");
    b.inner_catch_up().await;
    let dbs = b.read(|s| s.databases.len());
    assert_eq!(dbs, 100, "the other node applies every batched command");
    // Two proposals that conflict only with each other: the second waits for the
    // first's entry, then is answered against it (exactly one database).
    let (x, y) = tokio::join!(a.create_database("same"), a.create_database("same"));
    assert!(x.is_ok() != y.is_ok(), "{x:?} {y:?}");
    let e = x.err().or(y.err()).unwrap();
    assert!(matches!(e, MinkError::AlreadyExists(_)), "{e:?}");
    // A batch inside a batch, or an empty one, is never valid.
    let nested = MetaCommand::Batch {
        commands: vec![MetaCommand::Batch { commands: vec![] }],
    };
    assert!(a.propose(nested).await.is_err());
}
