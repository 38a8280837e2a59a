//! ObjectLog: total order under concurrent appenders, validation, ambiguous
//! timeouts, snapshots and deletion, across processes.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::TestStore;
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{Appended, LogState, ObjectLog, ObjectLogOptions};
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};

/// A registry of unique names in the order they were appended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Registry {
    order: Vec<String>,
    names: BTreeSet<String>,
}

impl LogState for Registry {
    type Entry = String;
    type Rejection = String;

    fn validate(&self, name: &String) -> Result<(), String> {
        if self.names.contains(name) {
            Err(format!("{name} exists"))
        } else {
            Ok(())
        }
    }

    fn apply(&mut self, _index: u64, name: &String) {
        self.names.insert(name.clone());
        self.order.push(name.clone());
    }
}

async fn open(store: &TestStore) -> ObjectLog<Registry> {
    ObjectLog::open(store.store.clone(), "meta", Registry::default())
        .await
        .unwrap()
}

/// A handle that deletes entries under a snapshot at once and lists before every
/// append.
async fn eager(store: Arc<dyn object_store::ObjectStore>) -> ObjectLog<Registry> {
    let options = ObjectLogOptions {
        delete_grace: Duration::ZERO,
        list_refresh: Duration::ZERO,
    };
    ObjectLog::open_with(store, "meta", Registry::default(), options)
        .await
        .unwrap()
}

fn scale(store: &TestStore) -> (usize, usize) {
    // moto answers one request at a time; keep the S3 case small.
    if store.url.starts_with("s3://") {
        (4, 40)
    } else {
        (8, 200)
    }
}

async fn concurrent_appenders_agree_on_one_total_order(store: TestStore) {
    let (writers, per_writer) = scale(&store);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let log = Arc::new(open(&store).await);
        tasks.push(tokio::spawn(async move {
            for n in 0..per_writer {
                match log.append(&format!("w{w}-{n}")).await.unwrap() {
                    Appended::At(_) => {}
                    Appended::Rejected(r) => panic!("unexpected rejection {r}"),
                }
            }
            log
        }));
    }
    let mut logs = Vec::new();
    for t in tasks {
        logs.push(t.await.unwrap());
    }
    let reader = open(&store).await;
    let order = reader.read(|s, i| {
        assert_eq!(i as usize, s.order.len());
        s.order.clone()
    });
    assert_eq!(order.len(), writers * per_writer, "every entry present");
    assert_eq!(
        order.iter().collect::<BTreeSet<_>>().len(),
        order.len(),
        "no entry twice"
    );
    for w in 0..writers {
        let mine: Vec<usize> = order
            .iter()
            .filter_map(|n| n.strip_prefix(&format!("w{w}-")))
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(
            mine,
            (0..per_writer).collect::<Vec<_>>(),
            "each writer's entries in its order"
        );
    }
    for log in logs {
        log.catch_up().await.unwrap();
        assert_eq!(
            log.read(|s, _| s.order.clone()),
            order,
            "every reader sees the same order"
        );
    }
}

async fn a_duplicate_is_rejected_and_not_appended(store: TestStore) {
    let a = open(&store).await;
    let b = open(&store).await;
    let name = "orders".to_string();
    let (ra, rb) = tokio::join!(a.append(&name), b.append(&name));
    let outcomes = [ra.unwrap(), rb.unwrap()];
    let at = outcomes
        .iter()
        .filter(|o| matches!(o, Appended::At(_)))
        .count();
    let rejected = outcomes
        .iter()
        .filter(|o| matches!(o, Appended::Rejected(_)))
        .count();
    assert_eq!((at, rejected), (1, 1));
    let reader = open(&store).await;
    assert_eq!(
        reader.read(|s, i| (s.order.clone(), i)),
        (vec!["orders".to_string()], 1)
    );
}

async fn an_ambiguous_timeout_appends_once(store: TestStore) {
    let faulty = FaultyStore::new(store.store.clone(), FaultConfig::default());
    let log = ObjectLog::open(Arc::new(faulty.clone()), "meta", Registry::default())
        .await
        .unwrap();
    log.append(&"a".to_string()).await.unwrap();
    faulty.time_out_next_puts(1);
    let outcome = log.append(&"b".to_string()).await.unwrap();
    assert!(matches!(outcome, Appended::At(2)), "{outcome:?}");
    faulty.fail_next_puts(2);
    let outcome = log.append(&"c".to_string()).await.unwrap();
    assert!(matches!(outcome, Appended::At(3)), "{outcome:?}");
    let reader = open(&store).await;
    assert_eq!(reader.read(|s, _| s.order.clone()), vec!["a", "b", "c"]);
}

/// The writer's own entry lands, its answer is lost, and the read after finding it
/// fails once: the entry stays found (the writer neither appends it again nor reports
/// it rejected as a duplicate of itself).
async fn a_found_entry_survives_a_failed_read_after_it(store: TestStore) {
    let faulty = FaultyStore::new(store.store.clone(), FaultConfig::default());
    let log = ObjectLog::open(Arc::new(faulty.clone()), "meta", Registry::default())
        .await
        .unwrap();
    log.append(&"a".to_string()).await.unwrap();
    faulty.time_out_next_puts(1);
    faulty.fail_next_gets_under("meta/log/00000000000000000003", 1);
    let outcome = log.append(&"b".to_string()).await.unwrap();
    assert!(matches!(outcome, Appended::At(2)), "{outcome:?}");
    let reader = open(&store).await;
    assert_eq!(reader.read(|s, _| s.order.clone()), vec!["a", "b"]);
}

async fn snapshots_let_entries_go_and_lagging_writers_catch_up(store: TestStore) {
    let lagging = eager(store.store.clone()).await;
    let busy = eager(store.store.clone()).await;
    lagging.append(&"x0".to_string()).await.unwrap();
    for i in 1..10 {
        busy.append(&format!("x{i}")).await.unwrap();
    }
    let snap = busy.write_snapshot().await.unwrap();
    assert_eq!(snap, 10);
    let deleted = busy.delete_covered(snap).await.unwrap();
    assert_eq!(deleted, 10);

    // The lagging writer must not recreate a deleted index: it lands at 11 and sees all.
    let outcome = lagging.append(&"late".to_string()).await.unwrap();
    assert!(matches!(outcome, Appended::At(11)), "{outcome:?}");
    assert_eq!(lagging.read(|s, _| s.order.len()), 11);

    // A fresh reader starts from the snapshot.
    let fresh = open(&store).await;
    let order = fresh.read(|s, _| s.order.clone());
    assert_eq!(order.len(), 11);
    assert_eq!(order.last().unwrap(), "late");
    assert_eq!(fresh.read(|s, _| s.clone()), lagging.read(|s, _| s.clone()));
}

async fn waiting_for_an_index_sees_other_writers(store: TestStore) {
    let a = open(&store).await;
    let b = open(&store).await;
    b.append(&"one".to_string()).await.unwrap();
    assert_eq!(a.applied_index(), 0);
    let reached = a.wait_for(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(reached, 1);
    let timed_out = a.wait_for(5, Duration::from_millis(50)).await.unwrap();
    assert_eq!(timed_out, 1);
}

/// A handle opened from an earlier one's view reads only what came after it, and ends
/// where a fresh open does: after plain entries, and after entries deleted under a
/// snapshot the earlier view never read.
async fn reopening_from_an_earlier_view_ends_where_a_fresh_open_does(store: TestStore) {
    let earlier = eager(store.store.clone()).await;
    let other = eager(store.store.clone()).await;
    for i in 0..3 {
        earlier.append(&format!("a{i}")).await.unwrap();
    }
    for i in 0..4 {
        other.append(&format!("b{i}")).await.unwrap();
    }
    assert_eq!(earlier.applied_index(), 3);
    assert_eq!(other.applied_index(), 7);
    // What the earlier view holds is not read again: with those entries gone (and no
    // snapshot covering them, which a fresh open could not get past), it still opens.
    for i in 1..=3u64 {
        let path = object_store::path::Path::from(format!("meta/log/{i:020}"));
        store.store.delete(&path).await.unwrap();
    }
    let reopened = ObjectLog::open_from(store.store.clone(), "meta", &earlier)
        .await
        .unwrap();
    assert_eq!(reopened.applied_index(), 7);
    assert_eq!(
        reopened.read(|s, _| s.clone()),
        other.read(|s, _| s.clone())
    );

    // Entries the earlier view has not read go under a snapshot.
    for i in 4..9 {
        other.append(&format!("b{i}")).await.unwrap();
    }
    let snap = other.write_snapshot().await.unwrap();
    assert_eq!(snap, 12);
    other.delete_covered(snap).await.unwrap();
    other.append(&"after".to_string()).await.unwrap();
    let reopened = ObjectLog::open_from(store.store.clone(), "meta", &earlier)
        .await
        .unwrap();
    assert_eq!(reopened.applied_index(), 13);
    let fresh = open(&store).await;
    assert_eq!(
        reopened.read(|s, _| s.clone()),
        fresh.read(|s, _| s.clone())
    );
    assert_eq!(fresh.read(|s, _| s.order.len()), 13);
    // And it appends after them.
    let outcome = reopened.append(&"last".to_string()).await.unwrap();
    assert!(matches!(outcome, Appended::At(14)), "{outcome:?}");
}

/// An entry a catch-up listed but that was deleted under a snapshot before its GET
/// (another node's `delete_covered`) makes the catch-up list again and load that
/// snapshot. It used to stop there as if caught up, a view short of the log that then
/// took the freed index for its own next append.
#[tokio::test(start_paused = true)]
async fn an_entry_deleted_between_listing_and_reading_is_caught_up_through_its_snapshot() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    // Reads through `slow` take 200 ms: the window in which the deletion lands.
    let slow: Arc<dyn object_store::ObjectStore> = Arc::new(FaultyStore::new(
        inner.clone(),
        FaultConfig {
            get_latency: Duration::from_millis(200),
            ..Default::default()
        },
    ));
    let earlier = eager(inner.clone()).await;
    let other = eager(inner.clone()).await;
    earlier.append(&"a".to_string()).await.unwrap();
    for i in 0..4 {
        other.append(&format!("b{i}")).await.unwrap();
    }
    let (reopened, ()) = tokio::join!(ObjectLog::open_from(slow, "meta", &earlier), async {
        // After the reopen's listing, before its reads.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(other.write_snapshot().await.unwrap(), 5);
        other.delete_covered(5).await.unwrap();
    });
    let reopened = reopened.unwrap();
    assert_eq!(reopened.applied_index(), 5);
    assert_eq!(
        reopened.read(|s, _| s.clone()),
        other.read(|s, _| s.clone())
    );
    let outcome = reopened.append(&"next".to_string()).await.unwrap();
    assert!(matches!(outcome, Appended::At(6)), "{outcome:?}");
}

/// An appender paused between its freshness check and its conditional create (here a
/// read that takes 11 minutes) for longer than `delete_grace - list_refresh`: meanwhile
/// another writer appended, snapshotted and deleted the entries under the snapshot, so
/// the index the appender probed is free again. Creating it would put an entry under
/// the snapshot that every reader skips; the appender lists again instead.
#[tokio::test(start_paused = true)]
async fn an_appender_paused_past_the_delete_grace_lists_again_before_it_creates() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let clock = mink_wal::fault::VirtualClock::new();
    let paused = FaultyStore::new(inner.clone(), FaultConfig::default()).with_clock(clock.clone());
    let other_store: Arc<dyn object_store::ObjectStore> =
        Arc::new(FaultyStore::new(inner.clone(), FaultConfig::default()).with_clock(clock));
    let options = ObjectLogOptions::default();
    let appender = ObjectLog::open_with(
        Arc::new(paused.clone()),
        "meta",
        Registry::default(),
        options.clone(),
    )
    .await
    .unwrap();
    let other = ObjectLog::open_with(other_store, "meta", Registry::default(), options.clone())
        .await
        .unwrap();
    paused.set_config(FaultConfig {
        get_latency: options.delete_grace + Duration::from_secs(60),
        ..Default::default()
    });
    let late = "late".to_string();
    let (outcome, ()) = tokio::join!(appender.append(&late), async {
        // While the appender's probe of entry 1 is on its way.
        tokio::time::sleep(Duration::from_secs(1)).await;
        other.append(&"b1".to_string()).await.unwrap();
        other.append(&"b2".to_string()).await.unwrap();
        assert_eq!(other.write_snapshot().await.unwrap(), 2);
        tokio::time::sleep(options.delete_grace + Duration::from_secs(5)).await;
        assert_eq!(other.delete_covered(2).await.unwrap(), 2);
        paused.set_config(FaultConfig::default());
    });
    let outcome = outcome.unwrap();
    assert!(matches!(outcome, Appended::At(3)), "{outcome:?}");
    let fresh = ObjectLog::open(inner, "meta", Registry::default())
        .await
        .unwrap();
    assert_eq!(fresh.applied_index(), 3);
    assert!(
        fresh.read(|s, _| s.names.contains("late")),
        "the entry is seen by every reader"
    );
}

/// Catch-ups queued behind one another join a listing that began after they asked:
/// eight at once make three listings, not nine, and each still sees every entry
/// appended before it was called.
async fn catch_ups_queued_at_once_share_a_listing(store: TestStore) {
    let faulty = FaultyStore::new(
        store.store.clone(),
        FaultConfig {
            list_latency: Duration::from_millis(100),
            ..FaultConfig::default()
        },
    );
    let writer = open(&store).await;
    let reader = ObjectLog::open(Arc::new(faulty.clone()), "meta", Registry::default())
        .await
        .unwrap();
    writer.append(&"one".to_string()).await.unwrap();
    let before = faulty
        .counters()
        .lists
        .load(std::sync::atomic::Ordering::Relaxed);
    let caught = futures::future::join_all((0..8).map(|_| reader.catch_up())).await;
    for index in caught {
        assert_eq!(
            index.unwrap(),
            1,
            "every catch-up sees the entry appended before it"
        );
    }
    let lists = faulty
        .counters()
        .lists
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    // The first catch-up lists twice (the new entry, then to see it was the last),
    // the second once (nothing new); the six behind them join the second's. Each
    // listing on its own would be nine.
    assert_eq!(lists, 3, "catch-ups queued at once list three times");
    // A catch-up called after the last listing began lists again, and sees what was
    // appended since.
    writer.append(&"two".to_string()).await.unwrap();
    assert_eq!(reader.catch_up().await.unwrap(), 2);
}

backend_tests! {
    catch_ups_queued_at_once_share_a_listing => super::catch_ups_queued_at_once_share_a_listing;
    concurrent_appenders_agree_on_one_total_order => super::concurrent_appenders_agree_on_one_total_order;
    a_duplicate_is_rejected_and_not_appended => super::a_duplicate_is_rejected_and_not_appended;
    an_ambiguous_timeout_appends_once => super::an_ambiguous_timeout_appends_once;
    a_found_entry_survives_a_failed_read_after_it => super::a_found_entry_survives_a_failed_read_after_it;
    snapshots_let_entries_go_and_lagging_writers_catch_up => super::snapshots_let_entries_go_and_lagging_writers_catch_up;
    waiting_for_an_index_sees_other_writers => super::waiting_for_an_index_sees_other_writers;
    reopening_from_an_earlier_view_ends_where_a_fresh_open_does => super::reopening_from_an_earlier_view_ends_where_a_fresh_open_does;
}

/// The child half of `several_processes_agree_on_one_total_order`: run by the test
/// binary itself in another process.
#[tokio::test]
#[ignore = "run as a child process by several_processes_agree_on_one_total_order"]
async fn child_appender() {
    let (Ok(url), Ok(id)) = (
        std::env::var("MINKTEST_CHILD_URL"),
        std::env::var("MINKTEST_CHILD_ID"),
    ) else {
        return;
    };
    let store = mink_wal::open_object_store(&common::config(&url)).unwrap();
    let log = ObjectLog::open(store, "meta", Registry::default())
        .await
        .unwrap();
    for n in 0..100 {
        assert!(matches!(
            log.append(&format!("p{id}-{n}")).await.unwrap(),
            Appended::At(_)
        ));
    }
}

#[tokio::test]
async fn several_processes_agree_on_one_total_order() {
    let store = common::file();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|id| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "child_appender", "--nocapture"])
                .env("MINKTEST_CHILD_URL", &store.url)
                .env("MINKTEST_CHILD_ID", id.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let reader = open(&store).await;
    let order = reader.read(|s, _| s.order.clone());
    assert_eq!(order.len(), 300);
    for id in 0..3 {
        let mine: Vec<usize> = order
            .iter()
            .filter_map(|n| n.strip_prefix(&format!("p{id}-")))
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(mine, (0..100).collect::<Vec<_>>());
    }
}
