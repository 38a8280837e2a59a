//! s3stream on every backend: appends, acks in order, failures, fencing, crash
//! recovery, handover, compaction, reads, trim.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestStore;
use futures::TryStreamExt;
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{Stream, StreamStore, WalConfig, WalError};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

fn config() -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        ..Default::default()
    }
}

fn payload(stream: &str, i: u64) -> Bytes {
    Bytes::from(format!(
        "{stream}:{i}:{}",
        "x".repeat((i % 7) as usize * 10)
    ))
}

/// Every record of `stream` from its start, checked contiguous.
async fn read_all(stream: &Stream) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut pos = stream.start_offset();
    let end = stream.durable_end();
    while pos < end {
        let records = stream.read(pos, 1 << 20).await.unwrap();
        assert!(!records.is_empty(), "no progress at {pos}");
        for r in records {
            assert!(
                r.base <= pos && pos < r.end(),
                "record {}..{} does not hold {pos}",
                r.base,
                r.end()
            );
            assert_eq!(r.base, pos, "whole units from their base");
            out.push((r.base, r.payload.clone()));
            pos = r.end();
        }
    }
    out
}

/// Node `n1` on `store`, holding no payload in memory: every read or compaction of an
/// acknowledged record goes back to the store for it.
async fn uncached(store: Arc<dyn ObjectStore>) -> StreamStore {
    StreamStore::open(
        store,
        "n1",
        WalConfig {
            tail_cache_bytes_max: 0,
            ..config()
        },
    )
    .await
    .unwrap()
}

async fn wal_objects(store: &Arc<dyn ObjectStore>) -> usize {
    store
        .list(Some(&Path::from("wal")))
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .len()
}

async fn appends_get_contiguous_offsets_and_read_back(t: TestStore) {
    let node = StreamStore::open(t.store.clone(), "n1", config())
        .await
        .unwrap();
    let a = node.open_stream("a", 1).await.unwrap();
    let b = node.open_stream("b", 1).await.unwrap();
    let mut pending = Vec::new();
    for i in 0..50u64 {
        for s in [&a, &b] {
            let r = s.reserve(64).await.unwrap();
            pending.push((
                s.name().to_string(),
                i,
                s.append(r, 1, 2, i as i64, payload(s.name(), i)).unwrap(),
            ));
        }
    }
    for (name, i, p) in pending {
        let expected = i * 2..i * 2 + 2;
        assert_eq!(p.offsets, expected, "{name}");
        assert_eq!(p.durable().await.unwrap(), expected);
    }
    for s in [&a, &b] {
        assert_eq!(s.durable_end(), 100);
        let all = read_all(s).await;
        assert_eq!(all.len(), 50);
        for (i, (base, body)) in all.iter().enumerate() {
            assert_eq!(*base, i as u64 * 2);
            assert_eq!(body, &payload(s.name(), i as u64));
        }
    }
    // Group commit: 100 appends in far fewer uploads.
    let uploads = wal_objects(&t.store).await;
    assert!(uploads < 100, "{uploads} WAL objects for 100 appends");
}

async fn acks_come_in_upload_order(t: TestStore) {
    let faulty = FaultyStore::new(t.store.clone(), FaultConfig::default());
    // The first WAL upload is slow, the second fast: it finishes first.
    faulty.set_put_delay(Some(Arc::new(|path: &Path| {
        let name = path.as_ref();
        if name.starts_with("wal/") && name.ends_with("00000000000000000001") {
            Some(Duration::from_millis(400))
        } else {
            None
        }
    })));
    let store: Arc<dyn ObjectStore> = Arc::new(faulty);
    let node = StreamStore::open(
        store.clone(),
        "n1",
        WalConfig {
            linger_ms: Some(1),
            inflight_uploads_max: 4,
            ..config()
        },
    )
    .await
    .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    let first = s
        .append(
            s.reserve(8).await.unwrap(),
            1,
            1,
            0,
            Bytes::from_static(b"first"),
        )
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = s
        .append(
            s.reserve(8).await.unwrap(),
            1,
            1,
            0,
            Bytes::from_static(b"second"),
        )
        .unwrap();
    // Wait until upload 2 has landed while upload 1 is still in flight.
    let second_key = Path::from(format!("wal/n1/{:020}/{:020}", node.wal_id().generation, 2));
    let mut landed = false;
    for _ in 0..200 {
        if store.head(&second_key).await.is_ok() {
            landed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(landed, "upload 2 should land before upload 1");
    assert_eq!(
        s.durable_end(),
        0,
        "nothing is acknowledged while upload 1 is in flight"
    );
    // When upload 2's append resolves, upload 1's must have resolved already.
    assert_eq!(second.durable().await.unwrap(), 1..2);
    let first_now = futures::FutureExt::now_or_never(first.durable());
    assert_eq!(first_now.map(|r| r.unwrap()), Some(0..1));
}

/// Upload errors within the retry budget are invisible to appenders: a PUT that
/// failed, one that landed but timed out, and one whose retry met its own landed
/// object (`AlreadyExists`) are each acknowledged once, and nobody is fenced.
async fn upload_errors_are_retried_and_a_landed_retry_is_not_a_fence(t: TestStore) {
    let faulty = FaultyStore::new(t.store.clone(), FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let node = StreamStore::open(store.clone(), "n1", config())
        .await
        .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    faulty.fail_next_puts(2);
    assert_eq!(
        s.append_durable(1, 1, 0, payload("s", 0)).await.unwrap(),
        0..1
    );
    faulty.time_out_next_puts(1);
    assert_eq!(
        s.append_durable(1, 1, 1, payload("s", 1)).await.unwrap(),
        1..2
    );
    faulty.conflict_after_apply_next_puts(1);
    assert_eq!(
        s.append_durable(1, 2, 2, payload("s", 2)).await.unwrap(),
        2..4
    );
    assert!(node.failure().is_none(), "{:?}", node.failure());
    let node2 = StreamStore::open(store.clone(), "n1", config())
        .await
        .unwrap();
    let s2 = node2.open_stream("s", 2).await.unwrap();
    let bodies: Vec<Bytes> = read_all(&s2).await.into_iter().map(|(_, b)| b).collect();
    assert_eq!(bodies, (0..3).map(|i| payload("s", i)).collect::<Vec<_>>());
}

async fn a_failed_upload_fails_later_appends_and_reopen_recovers(t: TestStore) {
    let faulty = FaultyStore::new(t.store.clone(), FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    // No retries: the first failure is final.
    let config = || WalConfig {
        upload_retry_budget_ms: 0,
        ..config()
    };
    let node = StreamStore::open(store.clone(), "n1", config())
        .await
        .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    for i in 0..5 {
        s.append_durable(1, 1, i, payload("s", i as u64))
            .await
            .unwrap();
    }
    // The next upload is applied but reported as a timeout; the one after fails.
    faulty.time_out_next_puts(1);
    let landed = s.append_durable(1, 1, 5, payload("s", 5)).await;
    assert!(matches!(landed, Err(WalError::Storage(_))), "{landed:?}");
    let later = s.append(s.reserve(8).await.unwrap(), 1, 1, 6, payload("s", 6));
    assert!(later.is_err(), "a failed writer accepts nothing more");
    assert!(node.failure().is_some());

    // Reopen on a new generation under a newer epoch: every acknowledged record is
    // there, and the unacknowledged one too, because its upload completed.
    let node2 = StreamStore::open(store.clone(), "n1", config())
        .await
        .unwrap();
    assert!(node2.wal_id().generation > node.wal_id().generation);
    let s2 = node2.open_stream("s", 2).await.unwrap();
    let all = read_all(&s2).await;
    let bodies: Vec<Bytes> = all.iter().map(|(_, b)| b.clone()).collect();
    assert_eq!(bodies, (0..6).map(|i| payload("s", i)).collect::<Vec<_>>());
    // And appends continue after them.
    assert_eq!(
        s2.append_durable(2, 1, 7, payload("s", 7)).await.unwrap(),
        6..7
    );

    // A PUT that fails without landing leaves nothing behind.
    faulty.fail_next_puts(1);
    assert!(s2.append_durable(2, 1, 8, payload("s", 8)).await.is_err());
    let node3 = StreamStore::open(store.clone(), "n1", config())
        .await
        .unwrap();
    let s3 = node3.open_stream("s", 3).await.unwrap();
    assert_eq!(read_all(&s3).await.len(), 7);
    assert_eq!(s3.durable_end(), 7);
}

/// A node replacing its own failed WAL generation in the same process takes the
/// records that generation acknowledged from memory: with every GET of those WAL
/// objects failing, the takeovers still recover every acknowledged record, and the
/// upload whose outcome was unknown (it landed) is read from the store. With a tail
/// cache too small to hold any payload, the objects are read as before.
async fn a_replacing_generation_takes_what_it_acknowledged_from_memory(t: TestStore) {
    for (round, tail_cache_bytes_max) in [64 << 20, 0].into_iter().enumerate() {
        let id = format!("n{round}");
        let faulty = FaultyStore::new(t.store.clone(), FaultConfig::default());
        let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
        let config = || WalConfig {
            upload_retry_budget_ms: 0,
            tail_cache_bytes_max,
            ..config()
        };
        let node = StreamStore::open(store.clone(), &id, config())
            .await
            .unwrap();
        let names: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|n| format!("{n}{round}"))
            .collect();
        let mut streams = Vec::new();
        for name in &names {
            streams.push(node.open_stream(name, 1).await.unwrap());
        }
        // Nine acknowledged uploads, one record each (WAL sequences 1 to 9), with a
        // compaction after the third so that part of it is compacted.
        for i in 0..9u64 {
            let s = &streams[i as usize % 3];
            s.append_durable(1, 1, 0, payload(&names[i as usize % 3], i))
                .await
                .unwrap();
            if i == 2 {
                node.compact().await.unwrap();
            }
        }
        // The tenth lands but is reported as timed out: the writer fails with its
        // outcome unknown.
        faulty.time_out_next_puts(1);
        assert!(
            streams[0]
                .append_durable(1, 1, 0, payload(&names[0], 9))
                .await
                .is_err()
        );
        assert!(node.failure().is_some());
        let generation = node.wal_id().generation;
        // Every WAL object the failed generation acknowledged (sequences 1 to 9) is
        // unreadable from here on, in the cached run.
        let acknowledged = format!("wal/{id}/{generation:020}/{:019}", 0);
        if tail_cache_bytes_max > 0 {
            faulty.fail_next_gets_under(&acknowledged, u64::MAX);
        }
        let replacement = StreamStore::open_after(&node, store.clone(), &id, config())
            .await
            .unwrap();
        let mut got = Vec::new();
        for name in &names {
            got.push(replacement.open_stream(name, 2).await.unwrap());
        }
        faulty.fail_next_gets_under(&acknowledged, 0);
        for (k, s) in got.iter().enumerate() {
            let mut want: Vec<Bytes> = (0..9u64)
                .filter(|i| *i as usize % 3 == k)
                .map(|i| payload(&names[k], i))
                .collect();
            if k == 0 {
                want.push(payload(&names[0], 9)); // landed, so recovered
            }
            let bodies: Vec<Bytes> = read_all(s).await.into_iter().map(|(_, b)| b).collect();
            assert_eq!(
                bodies, want,
                "stream {} (tail cache {tail_cache_bytes_max})",
                names[k]
            );
        }
        replacement.close_all().await.unwrap();
    }
}

/// A dead node's streams taken over all at once by one node whose recovery budget is
/// two WAL objects (groups of 1 GiB): every takeover completes (none is stuck behind
/// another's permits) and recovers its records; the dead WAL is fenced once (the
/// takeovers fence it one at a time, and the others find the first one's fence).
async fn many_takeovers_at_once_share_a_small_recovery_budget(t: TestStore) {
    let config = || WalConfig {
        group_bytes_max: 1 << 30,
        pending_bytes_max: 1 << 30,
        ..config()
    };
    let dead = StreamStore::open(t.store.clone(), "dead", config())
        .await
        .unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("many{i}")).collect();
    let mut streams = Vec::new();
    for name in &names {
        streams.push(dead.open_stream(name, 1).await.unwrap());
    }
    for round in 0..4u64 {
        for (s, name) in streams.iter().zip(&names) {
            s.append_durable(1, 1, 0, payload(name, round))
                .await
                .unwrap();
        }
    }
    drop(streams); // a crash: nothing closed
    let dead_wal = Path::from(format!("wal/{}", dead.wal_id().node));
    let objects = |store: Arc<dyn ObjectStore>| {
        let dir = dead_wal.clone();
        async move {
            store
                .list(Some(&dir))
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .len()
        }
    };
    let written = objects(t.store.clone()).await;
    let taker = StreamStore::open(t.store.clone(), "taker", config())
        .await
        .unwrap();
    let opens = names.iter().map(|name| taker.open_stream(name, 2));
    let taken = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(opens))
        .await
        .expect("every takeover completes");
    assert_eq!(
        objects(t.store.clone()).await,
        written + 1,
        "twelve takeovers on one node write one fence object"
    );
    for (s, name) in taken.into_iter().zip(&names) {
        let s = s.unwrap();
        let bodies: Vec<Bytes> = read_all(&s).await.into_iter().map(|(_, b)| b).collect();
        assert_eq!(
            bodies,
            (0..4).map(|i| payload(name, i)).collect::<Vec<_>>(),
            "{name}"
        );
    }
    drop(dead);
}

async fn a_takeover_fences_the_old_owner(t: TestStore) {
    let a = StreamStore::open(t.store.clone(), "a", config())
        .await
        .unwrap();
    let b = StreamStore::open(t.store.clone(), "b", config())
        .await
        .unwrap();
    let sa = a.open_stream("s", 1).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..10 {
        acked.push(
            sa.append_durable(1, 1, i, payload("s", i as u64))
                .await
                .unwrap(),
        );
    }
    // B takes over without A closing: A's WAL is fenced.
    let sb = b.open_stream("s", 2).await.unwrap();
    let fences = b.metadata().read(|s, _| s.fences.clone());
    assert_eq!(fences.len(), 1, "{fences:?}");
    let err = sa
        .append_durable(1, 1, 10, payload("s", 10))
        .await
        .unwrap_err();
    assert!(matches!(err, WalError::Fenced(_)), "{err:?}");
    assert!(
        sa.append_durable(1, 1, 11, payload("s", 11)).await.is_err(),
        "A acknowledges nothing more"
    );
    let all = read_all(&sb).await;
    assert_eq!(
        all.len(),
        10,
        "every record A acknowledged is in S as B reads it"
    );
    assert_eq!(
        sb.append_durable(2, 1, 12, payload("s", 12)).await.unwrap(),
        10..11
    );
    // An older epoch cannot open the stream again.
    assert!(matches!(
        a.open_stream("s", 2).await,
        Err(WalError::Fenced(_)) | Err(WalError::Storage(_))
    ));
}

async fn crash_recovery_and_clean_handover(t: TestStore) {
    {
        let a = StreamStore::open(t.store.clone(), "a", config())
            .await
            .unwrap();
        let s = a.open_stream("crash", 1).await.unwrap();
        for i in 0..20 {
            s.append_durable(1, 3, i, payload("crash", i as u64))
                .await
                .unwrap();
        }
        a.compact().await.unwrap(); // part in a segment, part in the WAL
        for i in 20..25 {
            s.append_durable(1, 3, i, payload("crash", i as u64))
                .await
                .unwrap();
        }
        // Dropped without close: a crash.
    }
    let b = StreamStore::open(t.store.clone(), "b", config())
        .await
        .unwrap();
    let s = b.open_stream("crash", 2).await.unwrap();
    let all = read_all(&s).await;
    assert_eq!(all.len(), 25);
    assert_eq!(
        all.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        (0..25).map(|i| i * 3).collect::<Vec<_>>()
    );

    // Clean close, then a handover to C needs no fence.
    s.append_durable(2, 1, 99, Bytes::from_static(b"last"))
        .await
        .unwrap();
    s.close().await.unwrap();
    let fences_before = b.metadata().read(|st, _| st.fences.len());
    let c = StreamStore::open(t.store.clone(), "c", config())
        .await
        .unwrap();
    let s = c.open_stream("crash", 3).await.unwrap();
    c.metadata().catch_up().await.unwrap();
    assert_eq!(
        c.metadata().read(|st, _| st.fences.len()),
        fences_before,
        "a handover writes no fence"
    );
    let all = read_all(&s).await;
    assert_eq!(all.len(), 26);
    assert_eq!(all.last().unwrap().1, Bytes::from_static(b"last"));
}

async fn compaction_keeps_bytes_and_collects_the_wal(t: TestStore) {
    let node = StreamStore::open(
        t.store.clone(),
        "n1",
        WalConfig {
            segment_bytes_max: 200,
            tail_cache_bytes_max: 0,
            ..config()
        },
    )
    .await
    .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    for i in 0..30 {
        s.append_durable(1, 1, 1000 + i, payload("s", i as u64))
            .await
            .unwrap();
    }
    let before = read_all(&s).await;
    let wal_before = wal_objects(&t.store).await;
    assert!(wal_before >= 30, "{wal_before}");
    let segments = node.compact().await.unwrap();
    assert!(segments > 1, "small segment_bytes_max splits: {segments}");
    let after = read_all(&s).await;
    assert_eq!(
        before, after,
        "reads return the same bytes after compaction"
    );
    let wal_after = wal_objects(&t.store).await;
    assert!(
        wal_after < wal_before / 2,
        "WAL objects collected: {wal_before} -> {wal_after}"
    );

    // Timestamp lookups across segments.
    assert_eq!(s.offset_for_timestamp(0).await.unwrap(), Some(0));
    assert_eq!(s.offset_for_timestamp(1017).await.unwrap(), Some(17));
    assert_eq!(s.offset_for_timestamp(5000).await.unwrap(), None);

    // Trim whole segments: the start moves; reads below it fail cleanly.
    let start = s.trim(15).await.unwrap();
    assert_eq!(start, 15);
    assert_eq!(s.start_offset(), 15);
    let err = s.read(3, 100).await.unwrap_err();
    assert!(
        matches!(
            err,
            WalError::OffsetOutOfRange {
                offset: 3,
                start: 15,
                ..
            }
        ),
        "{err:?}"
    );
    let rest = read_all(&s).await;
    assert_eq!(rest.first().unwrap().0, 15);
    assert_eq!(rest.len(), 15);
    // A new owner sees the trimmed start too.
    drop(s);
    let other = StreamStore::open(t.store.clone(), "n2", config())
        .await
        .unwrap();
    let s2 = other.open_stream("s", 2).await.unwrap();
    assert_eq!(s2.start_offset(), 15);
    assert_eq!(read_all(&s2).await, rest);
}

async fn epochs_are_checked(t: TestStore) {
    let node = StreamStore::open(t.store.clone(), "n1", config())
        .await
        .unwrap();
    let s = node.open_stream("s", 5).await.unwrap();
    assert!(matches!(
        s.append_durable(4, 1, 0, Bytes::from_static(b"x")).await,
        Err(WalError::Fenced(_))
    ));
    s.append_durable(5, 1, 0, Bytes::from_static(b"x"))
        .await
        .unwrap();
    // Reopening on the same node under a newer epoch keeps the data.
    let s = node.open_stream("s", 6).await.unwrap();
    assert!(matches!(
        s.append_durable(5, 1, 0, Bytes::from_static(b"y")).await,
        Err(WalError::Fenced(_))
    ));
    assert_eq!(
        s.append_durable(6, 1, 0, Bytes::from_static(b"y"))
            .await
            .unwrap(),
        1..2
    );
    // Opening again under the same epoch (a retried open) returns the open stream;
    // an older epoch is refused.
    let again = node.open_stream("s", 6).await.unwrap();
    assert_eq!(again.next_offset(), 2);
    assert!(matches!(
        node.open_stream("s", 5).await,
        Err(WalError::Fenced(_))
    ));
}

async fn dead_generations_are_collected(t: TestStore) {
    let grace0 = WalConfig {
        dead_wal_grace_ms: 0,
        ..config()
    };
    {
        let a = StreamStore::open(t.store.clone(), "a", grace0.clone())
            .await
            .unwrap();
        let s = a.open_stream("s", 1).await.unwrap();
        let kept = a.open_stream("kept", 1).await.unwrap();
        for i in 0..5 {
            s.append_durable(1, 1, i, payload("s", i as u64))
                .await
                .unwrap();
            kept.append_durable(1, 1, i, payload("kept", i as u64))
                .await
                .unwrap();
        }
        // Crash.
    }
    let count = |prefix: &'static str| {
        let store = t.store.clone();
        async move {
            store
                .list(Some(&Path::from(prefix)))
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .len()
        }
    };
    let b = StreamStore::open(t.store.clone(), "b", grace0.clone())
        .await
        .unwrap();
    let s = b.open_stream("s", 2).await.unwrap();
    assert_eq!(read_all(&s).await.len(), 5);
    // a/1 still owns "kept": nothing of it may go, even once a has restarted.
    let _a2 = StreamStore::open(t.store.clone(), "a", grace0.clone())
        .await
        .unwrap();
    assert_eq!(b.gc_dead_wals().await.unwrap(), 0);
    let before = count("wal/a").await;
    assert!(before > 0);
    // Once "kept" is taken over too, a/1 is dead and unreferenced: its objects go,
    // all but its fence, which a paused process of a/1 must still meet on waking.
    let kept = b.open_stream("kept", 2).await.unwrap();
    assert_eq!(read_all(&kept).await.len(), 5);
    let deleted = b.gc_dead_wals().await.unwrap();
    assert_eq!(deleted, before - 1);
    assert_eq!(count("wal/a").await, 1);
    // Everything is still readable (it was recovered into segments).
    assert_eq!(read_all(&s).await.len(), 5);
    assert_eq!(read_all(&kept).await.len(), 5);

    // An orphan segment (as a rejected commit leaves) goes; named ones stay, and so
    // does one keyed with a newer epoch (a takeover's recovered segment, whose open
    // may still land).
    let pending = Path::from("seg/s/00000000000000000099-9-pending");
    t.store
        .put(&pending, object_store::PutPayload::from_static(b"junk"))
        .await
        .unwrap();
    let orphan = Path::from("seg/s/00000000000000000099-1-orphan");
    t.store
        .put(&orphan, object_store::PutPayload::from_static(b"junk"))
        .await
        .unwrap();
    let segments_before = count("seg/s").await;
    assert_eq!(b.gc_orphan_segments().await.unwrap(), 1);
    assert_eq!(count("seg/s").await, segments_before - 1);
    assert_eq!(read_all(&s).await.len(), 5);
}

/// A stream compacted after every append gets one small segment per round; merging
/// keeps their number bounded, deletes the replaced objects, and changes no byte of
/// what reads, timestamp lookups, trims and the next owner see.
async fn small_segments_are_merged(t: TestStore) {
    let fanin = 4;
    let node = StreamStore::open(
        t.store.clone(),
        "n1",
        WalConfig {
            segment_bytes_max: 4096,
            segment_merge_fanin: fanin,
            tail_cache_bytes_max: 0,
            ..config()
        },
    )
    .await
    .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    let rounds = 48u64;
    for i in 0..rounds {
        s.append_durable(1, 1, 1000 + i as i64, payload("s", i))
            .await
            .unwrap();
        node.compact().await.unwrap();
    }
    let segments = || {
        node.metadata()
            .read(|st, _| st.streams.get("s").map(|m| m.segments.clone()))
            .unwrap()
    };
    let listed = || async {
        t.store
            .list(Some(&Path::from("seg/s")))
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .len()
    };
    let kept = segments();
    // Without merging: one segment per round. With it: runs of `fanin` small ones
    // become one, so far fewer remain.
    assert!(
        kept.len() < rounds as usize / 2,
        "{} segments after {rounds} rounds",
        kept.len()
    );
    assert!(kept.windows(2).all(|w| w[0].end == w[1].base));
    assert_eq!((kept[0].base, kept.last().unwrap().end), (0, rounds));
    assert_eq!(
        listed().await,
        kept.len(),
        "replaced segment objects are deleted"
    );

    let expected: Vec<(u64, Bytes)> = (0..rounds).map(|i| (i, payload("s", i))).collect();
    assert_eq!(read_all(&s).await, expected);
    assert_eq!(s.offset_for_timestamp(1030).await.unwrap(), Some(30));
    assert_eq!(s.offset_for_timestamp(9999).await.unwrap(), None);

    // A trim inside a merged segment keeps it; reads start at the trimmed offset.
    assert_eq!(s.trim(21).await.unwrap(), 21);
    assert_eq!(read_all(&s).await, expected[21..].to_vec());
    drop(s);
    // The next owner sees the merged list.
    let other = StreamStore::open(t.store.clone(), "n2", config())
        .await
        .unwrap();
    let s2 = other.open_stream("s", 2).await.unwrap();
    assert_eq!(read_all(&s2).await, expected[21..].to_vec());
}

/// `node`'s compactor, running as the node runs it, until stopped.
struct Compactor {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Compactor {
    fn start(node: &StreamStore) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let node = node.clone();
        let task = tokio::spawn(async move {
            node.run_compactor(async {
                let _ = stopped.await;
            })
            .await
        });
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

/// A faulty store over `t` whose injected faults hit only stream-metadata entries.
fn metadata_faults(t: &TestStore) -> FaultyStore {
    FaultyStore::new(
        t.store.clone(),
        FaultConfig {
            fault_prefix: Some("streams/log".into()),
            ..FaultConfig::default()
        },
    )
}

/// Defect 2 of issue #11: an open whose `Open` entry landed but whose caller went away
/// (a cancelled request) left the stream owned by this writer in the log and not
/// installed here; every later open answered Corrupt. It is now adopted.
async fn an_open_cancelled_after_it_landed_is_adopted(t: TestStore) {
    let faulty = metadata_faults(&t);
    let node = StreamStore::open(Arc::new(faulty.clone()), "n1", config())
        .await
        .unwrap();
    faulty.hang_after_apply_next_puts(1);
    let cancelled =
        tokio::time::timeout(Duration::from_millis(500), node.open_stream("s", 1)).await;
    assert!(cancelled.is_err(), "the open hangs after its entry landed");
    node.metadata().catch_up().await.unwrap();
    let owner = node
        .metadata()
        .read(|st, _| st.streams.get("s").and_then(|m| m.owner.clone()));
    assert_eq!(owner.as_ref(), Some(node.wal_id()), "the Open landed");

    let s = node
        .open_stream("s", 1)
        .await
        .expect("the ghost is adopted");
    s.append_durable(1, 1, 1, payload("s", 0)).await.unwrap();
    assert_eq!(read_all(&s).await, vec![(0, payload("s", 0))]);
    // A newer epoch moves it in place; the next owner fences and recovers it.
    let s = node.open_stream("s", 2).await.unwrap();
    s.append_durable(2, 1, 2, payload("s", 1)).await.unwrap();
    let other = StreamStore::open(t.store.clone(), "n2", config())
        .await
        .unwrap();
    let s2 = other.open_stream("s", 3).await.unwrap();
    assert_eq!(
        read_all(&s2).await,
        vec![(0, payload("s", 0)), (1, payload("s", 1))]
    );
}

/// Defect 7 of issue #11: a compaction commit that landed while its proposer saw no
/// answer left the local compacted end behind the log's; every later round failed
/// and WAL GC stopped. The next round now adopts it, and the WAL is collected.
async fn a_commit_whose_answer_was_lost_is_adopted(t: TestStore) {
    let faulty = metadata_faults(&t);
    let node = uncached(Arc::new(faulty.clone())).await;
    let s = node.open_stream("s", 1).await.unwrap();
    for i in 0..10 {
        s.append_durable(1, 1, i, payload("s", i as u64))
            .await
            .unwrap();
    }
    let expected = read_all(&s).await;
    let wal_before = wal_objects(&t.store).await;
    faulty.hang_after_apply_next_puts(1);
    let lost = tokio::time::timeout(Duration::from_millis(500), node.compact()).await;
    assert!(lost.is_err(), "the commit hangs after it landed");
    node.metadata().catch_up().await.unwrap();
    let logged_end = node
        .metadata()
        .read(|st, _| st.streams.get("s").map(|m| m.committed_end));
    assert_eq!(logged_end, Some(10), "the Commit landed");

    for i in 10..15 {
        s.append_durable(1, 1, i, payload("s", i as u64))
            .await
            .unwrap();
    }
    node.compact()
        .await
        .expect("the next round adopts the landed commit");
    node.compact().await.expect("and compaction keeps working");
    let segments = node
        .metadata()
        .read(|st, _| st.streams.get("s").map(|m| m.segments.clone()))
        .unwrap();
    assert!(segments.windows(2).all(|w| w[0].end == w[1].base));
    assert_eq!(segments.last().map(|s| s.end), Some(15));
    let wal_after = wal_objects(&t.store).await;
    assert!(
        wal_after < wal_before,
        "WAL objects collected: {wal_before} -> {wal_after}"
    );
    let mut all = expected;
    all.extend((10..15).map(|i| (i, payload("s", i))));
    assert_eq!(read_all(&s).await, all);
}

/// Chaos seed 73: a close whose proposal failed (the store down for longer than the
/// log's retries) left the stream `Closing`, owned by this writer in the log, and
/// nothing closed it again: its `wal_from` stayed where it was while the node went on
/// writing, so the WAL floor stopped rising and the next takeover of the generation
/// read every WAL object written since (4,344 of them, 101 s on moto). The compactor
/// now settles such a close, and the records stay readable by the next owner.
async fn a_close_that_failed_is_settled_by_the_compactor(t: TestStore) {
    let faulty = metadata_faults(&t);
    let node = StreamStore::open(
        Arc::new(faulty.clone()),
        "n1",
        WalConfig {
            compaction_interval_ms: 20,
            ..config()
        },
    )
    .await
    .unwrap();
    let closing = node.open_stream("closing", 1).await.unwrap();
    let busy = node.open_stream("busy", 1).await.unwrap();
    for i in 0..5 {
        closing
            .append_durable(1, 1, i, payload("closing", i as u64))
            .await
            .unwrap();
    }
    faulty.fail_next_puts(1_000);
    let err = closing.clone().close().await.unwrap_err();
    assert!(matches!(err, WalError::Storage(_)), "{err:?}");
    faulty.fail_next_puts(0);
    let wal_from = |node: &StreamStore| {
        node.metadata().read(|st, _| {
            st.streams
                .get("closing")
                .map(|m| (m.owner.clone(), m.wal_from))
        })
    };
    let (owner, stuck_at) = wal_from(&node).unwrap();
    assert_eq!(
        owner.as_ref(),
        Some(node.wal_id()),
        "the close did not land"
    );

    let compactor = Compactor::start(&node);
    // The node's ghost sweep asks every second to open (then close) a stream this
    // WAL owns that no tablet holds, each ask in a task of its own: those opens are
    // refused at once, and never keep the compactor from settling the close.
    let ghost_sweep = {
        let node = node.clone();
        tokio::spawn(async move {
            loop {
                let node = node.clone();
                tokio::spawn(async move {
                    let refused = node.open_stream("closing", 1).await;
                    assert!(refused.is_err() || refused.is_ok_and(|s| s.epoch() == 1));
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    for i in 0..30 {
        busy.append_durable(1, 1, i, payload("busy", i as u64))
            .await
            .unwrap();
    }
    let settled = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            node.metadata().catch_up().await.unwrap();
            if let Some((None, _)) = wal_from(&node) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    ghost_sweep.abort();
    compactor.stop().await;
    assert!(
        settled.is_ok(),
        "the close was never settled: the stream still holds the WAL at {stuck_at} \
         ({:?})",
        wal_from(&node)
    );
    // A clean close: the next owner needs no fence and reads every record.
    let fences = node.metadata().read(|st, _| st.fences.len());
    let other = StreamStore::open(t.store.clone(), "n2", config())
        .await
        .unwrap();
    let reopened = other.open_stream("closing", 2).await.unwrap();
    assert_eq!(
        read_all(&reopened).await,
        (0..5)
            .map(|i| (i, payload("closing", i)))
            .collect::<Vec<_>>()
    );
    other.metadata().catch_up().await.unwrap();
    assert_eq!(other.metadata().read(|st, _| st.fences.len()), fences);
}

/// A close that starts from an earlier close left `Closing` (its `Close` proposed and
/// perhaps still to land) and fails before proposing its own must leave the stream
/// `Closing`: reopened, it would acknowledge appends that a late `Close` then cuts off
/// (the next owner starts from that Close's end, without reading this WAL).
async fn a_failed_second_close_never_reopens_the_stream(t: TestStore) {
    let faulty = metadata_faults(&t);
    let node = StreamStore::open(Arc::new(faulty.clone()), "n1", config())
        .await
        .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    s.append_durable(1, 1, 0, payload("s", 0)).await.unwrap();
    faulty.fail_next_puts(1_000);
    assert!(
        s.clone().close().await.is_err(),
        "the Close is not proposed"
    );
    // The second close cannot write its segment.
    faulty.set_config(FaultConfig {
        fault_prefix: Some("seg/".into()),
        ..FaultConfig::default()
    });
    faulty.fail_next_puts(1_000);
    assert!(s.clone().close().await.is_err(), "no segment is written");
    faulty.fail_next_puts(0);
    let refused = s.append_durable(1, 1, 1, payload("s", 1)).await;
    assert!(
        refused.is_err(),
        "an append was acknowledged on a stream whose Close may still land"
    );
    // Settled by a close that gets through.
    s.clone().close().await.unwrap();
    let other = StreamStore::open(t.store.clone(), "n2", config())
        .await
        .unwrap();
    let s2 = other.open_stream("s", 2).await.unwrap();
    assert_eq!(read_all(&s2).await, vec![(0, payload("s", 0))]);
}

/// Chaos seed 76: a node whose WAL was fenced while it was idle (its buckets had moved
/// away) took over a dead node's streams on that WAL: it fenced the dead WAL, read its
/// objects, and only then had the open refused, for every stream. A retired WAL now
/// refuses the open before doing anything, and retires its writer, so that the node
/// replaces it at once.
async fn a_fenced_idle_wal_opens_nothing_and_fences_nobody(t: TestStore) {
    let a = StreamStore::open(t.store.clone(), "a", config())
        .await
        .unwrap();
    let s = a.open_stream("s", 1).await.unwrap();
    s.append_durable(1, 1, 0, payload("s", 0)).await.unwrap();
    // c crashes with a stream of its own.
    {
        let c = StreamStore::open(t.store.clone(), "c", config())
            .await
            .unwrap();
        let dead = c.open_stream("dead", 1).await.unwrap();
        dead.append_durable(1, 1, 0, payload("dead", 0))
            .await
            .unwrap();
    }
    // b takes "s" over from a: a's WAL is fenced, and a, idle, does not know.
    let b = StreamStore::open(t.store.clone(), "b", config())
        .await
        .unwrap();
    b.open_stream("s", 2).await.unwrap();
    assert!(
        a.failure().is_none(),
        "an idle writer has not met its fence"
    );
    let fences = |node: &StreamStore| node.metadata().read(|st, _| st.fences.len());
    a.metadata().catch_up().await.unwrap();
    let before = fences(&a);
    let err = a.open_stream("dead", 2).await.unwrap_err();
    assert!(matches!(err, WalError::Fenced(_)), "{err:?}");
    assert!(
        a.failure().is_some(),
        "the writer is retired, to be replaced"
    );
    a.metadata().catch_up().await.unwrap();
    assert_eq!(fences(&a), before, "a retired WAL fenced c's for nothing");
    // The stream is b's to take.
    let taken = b.open_stream("dead", 2).await.unwrap();
    assert_eq!(read_all(&taken).await, vec![(0, payload("dead", 0))]);
}

/// A busy node compacts every `compaction_wal_objects_max` WAL objects, whatever the
/// interval: a takeover reads each stream's WAL objects from its `wal_from`, so the
/// count since the last round bounds what a takeover of this node reads.
async fn compaction_follows_the_wal_objects_written(t: TestStore) {
    let node = StreamStore::open(
        t.store.clone(),
        "n1",
        WalConfig {
            compaction_interval_ms: 3_600_000,
            compaction_wal_objects_max: 8,
            ..config()
        },
    )
    .await
    .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    let compactor = Compactor::start(&node);
    let wal_from = |node: &StreamStore| {
        node.metadata()
            .read(|st, _| st.streams.get("s").map_or(0, |m| m.wal_from))
    };
    let mut behind = 0;
    for i in 0..60 {
        // One append at a time: each is a WAL object of its own.
        s.append_durable(1, 1, i, payload("s", i as u64))
            .await
            .unwrap();
        node.metadata().catch_up().await.unwrap();
        behind = behind.max((i + 2).saturating_sub(wal_from(&node) as i64));
    }
    compactor.stop().await;
    assert!(wal_from(&node) > 1, "no round ran in an hour-long interval");
    // A round runs once 8 objects are written since the last began, and takes a few
    // more while it runs; nowhere near the 60 written.
    assert!(
        behind < 40,
        "the stream's WAL position fell {behind} objects behind"
    );
    assert_eq!(read_all(&s).await.len(), 60);
}

/// Found by the concurrent model test (seed 4211): a fencer whose fence write timed
/// out after it landed leaves a stray fence below the one it records, and that is
/// where the owner's writer stops. Dead-WAL GC kept only the recorded fence: it deleted
/// the stray, and the owner — not dead, only cut off — wrote that slot on its next
/// retry and acknowledged a record no takeover would ever recover. Every fence object
/// now stays.
async fn dead_wal_gc_keeps_every_fence_object(t: TestStore) {
    let owner_store = FaultyStore::new(t.store.clone(), FaultConfig::default());
    let owner = StreamStore::open(
        Arc::new(owner_store.clone()),
        "n1",
        WalConfig {
            upload_retry_budget_ms: 60_000,
            ..config()
        },
    )
    .await
    .unwrap();
    let s = owner.open_stream("s", 1).await.unwrap();
    for i in 0..2 {
        s.append_durable(1, 1, i, payload("s", i as u64))
            .await
            .unwrap();
    }
    // The owner is cut off; its next upload (sequence 3) keeps being retried.
    owner_store.set_down(true);
    let pending = {
        let s = s.clone();
        tokio::spawn(async move { s.append_durable(1, 1, 9, payload("s", 2)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;

    // A takeover whose first fence write (at 3) lands but times out: it fences again
    // at 4 and records that one.
    let fencer_store = FaultyStore::new(
        t.store.clone(),
        FaultConfig {
            fault_prefix: Some(format!("wal/{}", owner.wal_id().node)),
            ..FaultConfig::default()
        },
    );
    fencer_store.time_out_next_puts(1);
    let other = StreamStore::open(
        Arc::new(fencer_store),
        "n2",
        WalConfig {
            dead_wal_grace_ms: 0,
            ..config()
        },
    )
    .await
    .unwrap();
    let s2 = other.open_stream("s", 2).await.unwrap();
    other.metadata().catch_up().await.unwrap();
    let recorded = other
        .metadata()
        .read(|st, _| st.fences.get(&owner.wal_id().to_string()).copied());
    assert_eq!(
        recorded,
        Some(4),
        "the stray fence sits at 3, the recorded one at 4"
    );

    // n1 restarts as a new generation: the old one is dead, its WAL collectable.
    let _restarted = StreamStore::open(t.store.clone(), "n1", config())
        .await
        .unwrap();
    other.gc_dead_wals().await.unwrap();

    // The old process comes back: its retry at 3 must meet the stray fence.
    owner_store.set_down(false);
    let outcome = pending.await.unwrap();
    assert!(
        matches!(outcome, Err(WalError::Fenced(_))),
        "the fenced owner acknowledged {outcome:?}"
    );
    assert_eq!(
        read_all(&s2).await,
        vec![(0, payload("s", 0)), (1, payload("s", 1))]
    );
}

/// A restarted node's earlier generation is superseded as soon as the newer one is
/// claimed, before the stream-metadata log names it (its first open), so that a
/// handover does not wait for a close the earlier one will never make.
async fn a_claimed_newer_generation_supersedes_at_once(t: TestStore) {
    let first = StreamStore::open(t.store.clone(), "n1", config())
        .await
        .unwrap();
    let other = StreamStore::open(t.store.clone(), "n2", config())
        .await
        .unwrap();
    let s = first.open_stream("s", 1).await.unwrap();
    s.append_durable(1, 1, 0, payload("s", 0)).await.unwrap();
    let old = first.wal_id().clone();
    assert!(!other.superseded_by_claim(&old).await.unwrap());
    drop(s);
    drop(first); // a crash; the node comes back
    let restarted = StreamStore::open(t.store.clone(), "n1", config())
        .await
        .unwrap();
    assert!(restarted.wal_id().generation > old.generation);
    other.metadata().catch_up().await.unwrap();
    assert!(
        !other.metadata().read(|st, _| st.retired(&old)),
        "the log does not know the newer generation before it opens a stream"
    );
    assert!(other.superseded_by_claim(&old).await.unwrap());
    assert!(!other.superseded_by_claim(restarted.wal_id()).await.unwrap());
    // Another node's claims are its own.
    assert!(!restarted.superseded_by_claim(other.wal_id()).await.unwrap());
}

/// A handover of a tablet that came late, after its stream was reopened in place
/// under a newer epoch on the same node (moved away and back), must not close the
/// stream under the tablet that replaced it: `close_under` the old epoch is refused,
/// and the stream stays open and writable under the new one.
async fn a_late_close_of_an_older_epoch_leaves_the_stream_open(t: TestStore) {
    let node = StreamStore::open(t.store.clone(), "n1", config())
        .await
        .unwrap();
    let old = node.open_stream("s", 1).await.unwrap();
    old.append_durable(1, 1, 1, payload("s", 0)).await.unwrap();
    let new = node.open_stream("s", 2).await.unwrap();
    let refused = old.clone().close_under(1).await.unwrap_err();
    assert!(matches!(refused, WalError::Fenced(_)), "{refused:?}");
    new.append_durable(2, 1, 2, payload("s", 1)).await.unwrap();
    // The holder of the current epoch closes it.
    new.clone().close_under(2).await.unwrap();
    node.metadata().catch_up().await.unwrap();
    let owner = node
        .metadata()
        .read(|st, _| st.streams.get("s").map(|m| m.owner.clone()));
    assert_eq!(owner, Some(None), "closed cleanly");
}

backend_tests! {
    a_late_close_of_an_older_epoch_leaves_the_stream_open => super::a_late_close_of_an_older_epoch_leaves_the_stream_open;
    a_claimed_newer_generation_supersedes_at_once => super::a_claimed_newer_generation_supersedes_at_once;
    a_fenced_idle_wal_opens_nothing_and_fences_nobody => super::a_fenced_idle_wal_opens_nothing_and_fences_nobody;
    a_failed_second_close_never_reopens_the_stream => super::a_failed_second_close_never_reopens_the_stream;
    compaction_follows_the_wal_objects_written => super::compaction_follows_the_wal_objects_written;
    a_close_that_failed_is_settled_by_the_compactor => super::a_close_that_failed_is_settled_by_the_compactor;
    dead_wal_gc_keeps_every_fence_object => super::dead_wal_gc_keeps_every_fence_object;
    an_open_cancelled_after_it_landed_is_adopted => super::an_open_cancelled_after_it_landed_is_adopted;
    a_commit_whose_answer_was_lost_is_adopted => super::a_commit_whose_answer_was_lost_is_adopted;
    small_segments_are_merged => super::small_segments_are_merged;
    dead_generations_are_collected => super::dead_generations_are_collected;
    appends_get_contiguous_offsets_and_read_back => super::appends_get_contiguous_offsets_and_read_back;
    acks_come_in_upload_order => super::acks_come_in_upload_order;
    a_failed_upload_fails_later_appends_and_reopen_recovers => super::a_failed_upload_fails_later_appends_and_reopen_recovers;
    a_replacing_generation_takes_what_it_acknowledged_from_memory => super::a_replacing_generation_takes_what_it_acknowledged_from_memory;
    many_takeovers_at_once_share_a_small_recovery_budget => super::many_takeovers_at_once_share_a_small_recovery_budget;
    upload_errors_are_retried_and_a_landed_retry_is_not_a_fence => super::upload_errors_are_retried_and_a_landed_retry_is_not_a_fence;
    a_takeover_fences_the_old_owner => super::a_takeover_fences_the_old_owner;
    crash_recovery_and_clean_handover => super::crash_recovery_and_clean_handover;
    compaction_keeps_bytes_and_collects_the_wal => super::compaction_keeps_bytes_and_collects_the_wal;
    epochs_are_checked => super::epochs_are_checked;
}

/// Appends to eight streams enqueued one after another, with the writer running
/// between them (a current-thread runtime that yields after each append), as the parts
/// of one table write are. Without a cork the first append is sealed alone and the
/// rest queue behind the uploads in flight; under a cork all eight share one upload.
/// A cork that is never released delays a group by at most `wal.cork_max_ms`: the appends
/// made under it still become durable.
#[tokio::test(flavor = "current_thread")]
async fn a_cork_puts_the_parts_of_one_write_into_one_upload() {
    let t = common::memory();
    // A bound far beyond the test's own pace, however loaded the machine: the counts
    // below do not depend on timing.
    let config = WalConfig {
        cork_max_ms: 1_000,
        ..config()
    };
    let node = StreamStore::open(t.store.clone(), "n1", config)
        .await
        .unwrap();
    let mut streams = Vec::new();
    for i in 0..8 {
        streams.push(node.open_stream(&format!("s{i}"), 1).await.unwrap());
    }
    async fn write(streams: &[Stream], cork: Option<mink_wal::Cork>, round: u64) {
        let mut pending = Vec::new();
        for s in streams {
            let r = s.reserve(64).await.unwrap();
            let appended = s.append(r, 1, 1, 0, payload(s.name(), round)).unwrap();
            pending.push(appended);
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
        }
        drop(cork);
        for p in pending {
            p.durable().await.unwrap();
        }
    }
    let before = wal_objects(&t.store).await;
    write(&streams, None, 0).await;
    let uncorked = wal_objects(&t.store).await - before;
    assert!(
        uncorked > 1,
        "without a cork the writer seals as the appends come: {uncorked} uploads"
    );

    let before = wal_objects(&t.store).await;
    write(&streams, Some(node.cork()), 1).await;
    assert_eq!(
        wal_objects(&t.store).await - before,
        1,
        "one upload under a cork"
    );

    // Clones are holds of their own: the group waits for the last one.
    let cork = node.cork();
    let clones: Vec<_> = streams.iter().map(|_| cork.clone()).collect();
    drop(cork);
    let before = wal_objects(&t.store).await;
    let mut pending = Vec::new();
    for (s, c) in streams.iter().zip(clones) {
        pending.push(
            s.append(s.reserve(64).await.unwrap(), 1, 1, 0, payload(s.name(), 2))
                .unwrap(),
        );
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        drop(c);
    }
    for p in pending {
        p.durable().await.unwrap();
    }
    assert_eq!(wal_objects(&t.store).await - before, 1);

    // A cork held forever delays, never blocks.
    let _stuck = node.cork();
    write(&streams, None, 3).await;
    for s in &streams {
        assert_eq!(read_all(s).await.len(), 4);
    }
}

/// While every upload slot is busy the open group grows only up to `group_bytes_max`:
/// later appends wait in the queue for the next group, so no WAL object is larger
/// than `group_bytes_max` plus one append (and its framing).
#[tokio::test]
async fn a_group_never_outgrows_group_bytes_max() {
    let t = common::memory();
    let faulty = FaultyStore::new(
        t.store.clone(),
        FaultConfig {
            put_latency: Duration::from_millis(20),
            ..FaultConfig::default()
        },
    );
    let store: Arc<dyn ObjectStore> = Arc::new(faulty);
    let config = WalConfig {
        group_bytes_max: 16 << 10,
        inflight_uploads_max: 1,
        linger_ms: Some(5),
        ..config()
    };
    let node = StreamStore::open(store.clone(), "n1", config)
        .await
        .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    let mut pending = Vec::new();
    for i in 0..200u64 {
        let r = s.reserve(1024).await.unwrap();
        pending.push(
            s.append(r, 1, 1, 0, Bytes::from(vec![i as u8; 1024]))
                .unwrap(),
        );
    }
    for p in pending {
        p.durable().await.unwrap();
    }
    let objects: Vec<_> = t
        .store
        .list(Some(&Path::from("wal")))
        .try_collect()
        .await
        .unwrap();
    assert!(objects.len() > 1);
    let largest = objects.iter().map(|o| o.size).max().unwrap();
    assert!(
        largest <= (16 << 10) + 1024 + 256,
        "a WAL object of {largest} bytes with group_bytes_max 16 KiB"
    );
    assert_eq!(read_all(&s).await.len(), 200);
}

/// With a PUT budget, an idle writer still uploads each append at once (the first
/// appends each make their own WAL object), and appends that keep coming faster than
/// the budget share uploads: over the run the writer makes no more uploads than the
/// budget's burst, its rate over the elapsed time, and one per linger (the groups that
/// outwait it go without a token), plus one in flight per slot.
#[tokio::test]
async fn a_put_budget_grows_the_groups_instead_of_the_request_rate() {
    let t = common::memory();
    let faulty = FaultyStore::new(
        t.store.clone(),
        FaultConfig {
            put_latency: Duration::from_millis(5),
            ..FaultConfig::default()
        },
    );
    let store: Arc<dyn ObjectStore> = Arc::new(faulty);
    let (per_s, linger_ms) = (5u32, 400u64);
    let config = WalConfig {
        put_rate_max: Some(per_s),
        linger_ms: Some(linger_ms),
        ..config()
    };
    let node = StreamStore::open(store.clone(), "n1", config)
        .await
        .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    // Idle: one append, one upload, sealed without waiting for a linger.
    for i in 0..3u64 {
        s.append_durable(1, 1, 0, payload("s", i)).await.unwrap();
        assert_eq!(wal_objects(&t.store).await, i as usize + 1);
    }
    // Then 16 appenders, back to back, for 300 appends.
    let started = std::time::Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicU64::new(3));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (s, next) = (s.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= 303 {
                    return;
                }
                s.append_durable(1, 1, 0, payload("s", i)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let uploads = wal_objects(&t.store).await - 3;
    let bound = f64::from(per_s) // the burst (three tokens spent above may have refilled)
        + f64::from(per_s) * elapsed
        + elapsed / (linger_ms as f64 / 1000.0)
        + 1.0
        + 4.0; // upload slots
    assert!(
        (uploads as f64) <= bound,
        "{uploads} uploads in {elapsed:.2} s with a budget of {per_s}/s (bound {bound:.1})"
    );
    assert!(
        uploads < 300,
        "the groups grew: {uploads} uploads for 300 appends"
    );
    assert_eq!(read_all(&s).await.len(), 303);
}

/// A `group_bytes_max` below a group's own header makes every append a group of its
/// own; the writer neither stalls nor panics when idle.
#[tokio::test]
async fn a_tiny_group_bytes_max_uploads_one_append_per_group() {
    let t = common::memory();
    let config = WalConfig {
        group_bytes_max: 1,
        ..config()
    };
    let node = StreamStore::open(t.store.clone(), "n1", config)
        .await
        .unwrap();
    let s = node.open_stream("s", 1).await.unwrap();
    for i in 0..3u64 {
        s.append_durable(1, 1, 0, payload("s", i)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(read_all(&s).await.len(), 3);
}

/// A record evicted from memory is read back from its WAL object by a range read,
/// which has no CRC of its own: the read checks the CRC the record carries, so a payload
/// that rotted in the store is refused by tail reads and by compaction (which would
/// otherwise seal it into a segment under a fresh, matching CRC).
#[tokio::test]
async fn a_rotted_wal_payload_is_refused_not_compacted() {
    let t = common::memory();
    let node = uncached(t.store.clone()).await;
    let s = node.open_stream("s", 1).await.unwrap();
    let body = Bytes::from_static(b"a payload that will rot in the store");
    s.append_durable(1, 1, 1000, body.clone()).await.unwrap();
    let wal: Vec<_> = t
        .store
        .list(Some(&Path::from("wal")))
        .try_collect()
        .await
        .unwrap();
    let [object] = wal.as_slice() else {
        panic!("one WAL object expected, found {}", wal.len());
    };
    let mut bytes = t
        .store
        .get(&object.location)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let at = bytes
        .windows(body.len())
        .position(|w| w == body.as_ref())
        .expect("the payload is in the object");
    bytes[at + 3] ^= 0x20;
    t.store.put(&object.location, bytes.into()).await.unwrap();

    let err = s.read(0, 1 << 20).await.unwrap_err();
    assert!(matches!(err, WalError::Corrupt(_)), "{err:?}");
    let err = node.compact().await.unwrap_err();
    assert!(matches!(err, WalError::Corrupt(_)), "{err:?}");
    let segments: Vec<_> = t
        .store
        .list(Some(&Path::from("seg")))
        .try_collect()
        .await
        .unwrap();
    assert!(
        segments.is_empty(),
        "a rotted payload was sealed: {segments:?}"
    );
}

/// `n` records of stream `s` on `memory`, each compacted into a segment of its own
/// (merging off), then closed cleanly: a log of many small segments, as chaos leaves.
async fn small_segments(memory: &Arc<dyn ObjectStore>, n: u64) -> Vec<(u64, Bytes)> {
    segments_of(memory, n, 1).await
}

/// `n` records of stream `s` on `memory` in segments of `per` records (merging off),
/// then closed cleanly.
async fn segments_of(memory: &Arc<dyn ObjectStore>, n: u64, per: u64) -> Vec<(u64, Bytes)> {
    let writer = StreamStore::open(
        memory.clone(),
        "n1",
        WalConfig {
            segment_merge_fanin: 0,
            ..config()
        },
    )
    .await
    .unwrap();
    let s = writer.open_stream("s", 1).await.unwrap();
    for i in 0..n {
        s.append_durable(1, 1, 1000 + i as i64, payload("s", i))
            .await
            .unwrap();
        if (i + 1) % per == 0 {
            writer.compact().await.unwrap();
        }
    }
    s.close().await.unwrap();
    (0..n).map(|i| (i, payload("s", i))).collect()
}

/// Node `id` over `memory` behind a fault store configured by `faults` (its requests
/// counted), with stream `s` opened under `epoch`: a reader that never read the
/// stream's segments.
async fn reader_over(
    memory: &Arc<dyn ObjectStore>,
    faults: FaultConfig,
    id: &str,
    epoch: u64,
) -> (FaultyStore, StreamStore, Stream) {
    let faulty = FaultyStore::new(memory.clone(), faults);
    let node = StreamStore::open(Arc::new(faulty.clone()), id, config())
        .await
        .unwrap();
    let s = node.open_stream("s", epoch).await.unwrap();
    (faulty, node, s)
}

/// Every record `scan` returns, checked contiguous from `from`.
async fn scan_all(stream: &Stream, from: u64, max_bytes: usize) -> Vec<(u64, Bytes)> {
    let mut scan = stream.scan(from, stream.durable_end(), max_bytes);
    let mut out = Vec::new();
    let mut pos = from;
    while let Some(records) = scan.next().await.unwrap() {
        assert!(!records.is_empty(), "no progress at {pos}");
        for r in records {
            assert!(r.base == pos || (out.is_empty() && r.base < pos && pos < r.end()));
            out.push((r.base, r.payload.clone()));
            pos = r.end();
        }
        assert_eq!(scan.position(), pos);
    }
    assert_eq!(pos, stream.durable_end());
    out
}

/// A scan over many small segments fetches them ahead together, one GET each, and
/// returns exactly what plain reads do. Plain reads take each segment in three round
/// trips, one segment after another: a takeover's log recovery over such a log took
/// 2–4 s on moto (chaos seed 87). Time is tokio's paused clock, so the figures depend
/// on the code only.
#[tokio::test(start_paused = true)]
async fn a_scan_fetches_the_segments_ahead_together_and_returns_what_reads_do() {
    let memory: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let n = 40u64;
    let expected = small_segments(&memory, n).await;
    let latency = Duration::from_millis(100);
    // Each reader is a node that never read these segments, over a store whose GETs
    // take 100 ms.
    let slow = FaultConfig {
        get_latency: latency,
        ..Default::default()
    };
    let reader = |id: &'static str, epoch: u64| reader_over(&memory, slow.clone(), id, epoch);

    let (slow, _node, s) = reader("n2", 2).await;
    let gets = slow
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    assert_eq!(read_all(&s).await, expected);
    let plain = started.elapsed();
    let plain_gets = slow
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::SeqCst)
        - gets;
    assert_eq!(
        plain_gets,
        3 * n,
        "footer, index and records of each segment"
    );
    assert!(plain >= latency * 3 * n as u32, "{plain:?}");
    s.close().await.unwrap();

    let (slow, _node, s) = reader("n3", 3).await;
    let gets = slow
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    assert_eq!(scan_all(&s, 0, 1 << 20).await, expected);
    let scanned = started.elapsed();
    let scan_gets = slow
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::SeqCst)
        - gets;
    assert_eq!(scan_gets, n, "one GET of each whole segment");
    assert!(
        scanned <= latency * (n as u32 / 4),
        "{scanned:?}: the segments ahead were not fetched together"
    );
    // From inside the log, and once the segments' indexes are known.
    assert_eq!(scan_all(&s, 17, 1 << 20).await, expected[17..].to_vec());
    assert_eq!(scan_all(&s, 17, 1).await, expected[17..].to_vec());
    assert_eq!(read_all(&s).await, expected);
}

/// A scan whose segments fetched ahead fail, or were deleted under it, reads the
/// plain way from a fresh view instead, and returns the same records; below the
/// start, it fails as a read does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_whose_fetches_ahead_fail_reads_the_plain_way() {
    let memory: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let expected = small_segments(&memory, 24).await;
    let (faulty, node, s) = reader_over(&memory, FaultConfig::default(), "n2", 2).await;
    // The whole-object GET of the fourth segment fails (the node never read it
    // before); the plain read of it after succeeds.
    let fourth = node
        .metadata()
        .read(|st, _| st.streams.get("s").map(|m| m.segments[3].key.clone()))
        .unwrap();
    faulty.fail_next_gets_under(&fourth, 1);
    assert_eq!(scan_all(&s, 0, 1 << 20).await, expected);
    assert_eq!(
        faulty
            .counters()
            .injected_failures
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    // Segments trimmed away under a scan, fetched ahead or not: below the new start
    // it fails as a plain read does, even with the records in hand.
    let mut scan = s.scan(0, s.durable_end(), 1);
    let first = scan.next().await.unwrap().unwrap();
    assert_eq!((first[0].base, first.len()), (0, 1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.trim(20).await.unwrap();
    match scan.next().await {
        Err(WalError::OffsetOutOfRange { offset, start, .. }) => {
            assert_eq!((offset, start), (1, 20));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(scan_all(&s, 20, 1 << 20).await, expected[20..].to_vec());
}

/// A step of a scan returns about its `max_bytes`, as a plain read's does, also from a
/// segment fetched ahead: the rest waits in the fetched object for the next steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_steps_through_a_fetched_segment_by_its_byte_budget() {
    let memory: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let expected = segments_of(&memory, 30, 5).await;
    let (counted, node, s) = reader_over(&memory, FaultConfig::default(), "n2", 2).await;
    let segments = node
        .metadata()
        .read(|st, _| st.streams.get("s").map(|m| m.segments.len()))
        .unwrap();
    assert_eq!(segments, 6);
    let gets = counted
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::SeqCst);
    let mut scan = s.scan(0, s.durable_end(), 1);
    let mut got = Vec::new();
    while let Some(records) = scan.next().await.unwrap() {
        assert_eq!(records.len(), 1, "one record per step at a 1-byte budget");
        got.extend(records.into_iter().map(|r| (r.base, r.payload)));
    }
    assert_eq!(got, expected);
    assert_eq!(
        counted
            .counters()
            .gets
            .load(std::sync::atomic::Ordering::SeqCst)
            - gets,
        6,
        "one GET per segment"
    );
}

/// Stream-metadata snapshots are written every 1,000 entries of the log, counted from
/// the newest snapshot a node knows of, not from the last it wrote itself: a node
/// that just started wrote a full snapshot (and deleted what it covers) in its first
/// compaction round, which on a joiner fell among its first takeovers and held their
/// metadata catch-ups back (3.6 s of a 12.67 s join in chaos seed 92).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_writes_no_metadata_snapshot_the_log_already_has() {
    let memory: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    // The snapshots' keys (each names the entry it holds the state after).
    let snapshots = || async {
        let mut keys: Vec<String> = memory
            .list(Some(&Path::from("streams/snap")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        keys.sort();
        keys
    };
    let n1 = StreamStore::open(memory.clone(), "n1", config())
        .await
        .unwrap();
    let mut streams = Vec::new();
    for i in 0..1_000 {
        streams.push(n1.open_stream(&format!("s{i}"), 1).await.unwrap());
    }
    n1.compact().await.unwrap();
    let first = snapshots().await;
    assert_eq!(first.len(), 1, "n1 snapshots the first 1,000 entries");
    for i in 1_000..1_005 {
        streams.push(n1.open_stream(&format!("s{i}"), 1).await.unwrap());
    }
    n1.compact().await.unwrap();
    assert_eq!(snapshots().await, first, "not again 5 entries later");

    // A node that starts now loads that snapshot and reads the 5 entries after it:
    // its rounds write none either.
    let n2 = StreamStore::open(memory.clone(), "n2", config())
        .await
        .unwrap();
    let s = n2.open_stream("t", 1).await.unwrap();
    s.append_durable(1, 1, 0, Bytes::from_static(b"x"))
        .await
        .unwrap();
    n2.compact().await.unwrap();
    n2.compact().await.unwrap();
    assert_eq!(
        snapshots().await,
        first,
        "a new node wrote a snapshot the log had"
    );
    assert!(n2.metadata().newest_snapshot() >= 1_000);
}

/// A compaction round collects and writes one stream at a time, so records appended
/// while it writes the first stream's segment would push the later streams' records
/// out of memory if the tail cache held no more than the bytes that start a round,
/// and the round would read them back from their WAL objects (the `file://` ingest
/// bench read back 80% of what a Put run wrote). With the default's room, twice
/// `segment_bytes_max`, it reads nothing back: every WAL GET fails here, and the
/// round still succeeds. The same appends with a cache of `segment_bytes_max` make it
/// read (and fail).
async fn append_round_robin(streams: &[Stream], appended: &mut [usize], bytes: u64, record: usize) {
    let mut futures = Vec::new();
    for i in 0..bytes as usize / record {
        let k = i % streams.len();
        let body = Bytes::from(vec![b'a' + k as u8; record]);
        futures.push(streams[k].append_durable(1, 1, 0, body));
        appended[k] += 1;
    }
    futures::future::try_join_all(futures).await.unwrap();
}

#[tokio::test]
async fn a_compaction_round_reads_nothing_back_when_the_tail_cache_has_room() {
    const TRIGGER: u64 = 64 << 10;
    const RECORD: usize = 4 << 10;
    let default = WalConfig::default();
    assert_eq!(default.tail_cache_bytes_max, 2 * default.segment_bytes_max);
    for (tail_cache_bytes_max, reads_back) in [(2 * TRIGGER, false), (TRIGGER, true)] {
        let t = common::memory();
        let faulty = FaultyStore::new(t.store.clone(), FaultConfig::default());
        let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
        let node = StreamStore::open(
            store,
            "n1",
            WalConfig {
                segment_bytes_max: TRIGGER,
                segment_merge_fanin: 0,
                tail_cache_bytes_max,
                ..config()
            },
        )
        .await
        .unwrap();
        let mut streams = Vec::new();
        for name in ["a", "b", "c", "d"] {
            streams.push(node.open_stream(name, 1).await.unwrap());
        }
        let mut appended = [0usize; 4];
        // A round's worth of uncompacted records, all in memory.
        append_round_robin(&streams, &mut appended, TRIGGER, RECORD).await;
        // Segment uploads take a while, long enough to append a round's worth more
        // while the first is written; WAL objects cannot be read back at all.
        let writing = Arc::new(tokio::sync::Notify::new());
        let told = writing.clone();
        faulty.set_put_delay(Some(Arc::new(move |path: &Path| {
            path.as_ref().starts_with("seg/").then(|| {
                told.notify_one();
                Duration::from_millis(200)
            })
        })));
        faulty.fail_next_gets_under("wal/", u64::MAX);
        let round = tokio::spawn({
            let node = node.clone();
            async move { node.compact().await }
        });
        writing.notified().await;
        append_round_robin(&streams, &mut appended, TRIGGER, RECORD).await;
        let result = round.await.unwrap();
        assert_eq!(
            result.is_err(),
            reads_back,
            "tail cache {tail_cache_bytes_max}: {result:?}"
        );
        faulty.fail_next_gets_under("wal/", 0);
        faulty.set_put_delay(None);
        for (k, s) in streams.iter().enumerate() {
            assert_eq!(read_all(s).await.len(), appended[k]);
        }
    }
}
