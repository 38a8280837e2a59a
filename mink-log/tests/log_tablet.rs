//! The log tablet on values: idempotence, retries after failures, ordering, tailing,
//! timestamp lookups across segments, recovery of writer windows, TTL.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_log::{AppendRequest, LogConfig, LogTablet, NO_WRITER, OffsetSpec};
use mink_types::{Column, Compression, DataType, MinkError, Schema, TableBucket};
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{StreamStore, WalConfig};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const BUCKET: TableBucket = TableBucket {
    table_id: 1,
    partition_id: None,
    bucket: 0,
};

fn schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("v", DataType::String, true),
        ],
    )
}

fn rows(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_new(
        schema().to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("v{i}")))),
        ],
    )
    .unwrap()
}

fn req(writer: i64, seq: i64, ids: std::ops::Range<i64>) -> AppendRequest {
    AppendRequest {
        writer_id: writer,
        first_sequence: seq,
        last_sequence: seq,
        schema_id: 1,
        change_types: None,
        batch: rows(ids),
        ipc: None,
    }
}

fn wal_config() -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        segment_bytes_max: 1,
        // Failure semantics are tested here: the first failed upload is final.
        upload_retry_budget_ms: 0,
        ..Default::default()
    }
}

struct Env {
    store: Arc<dyn ObjectStore>,
    faulty: FaultyStore,
    node: StreamStore,
    epoch: u64,
}

impl Env {
    async fn new() -> Self {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
        let node = StreamStore::open(store.clone(), "n1", wal_config())
            .await
            .unwrap();
        Self {
            store,
            faulty,
            node,
            epoch: 0,
        }
    }

    /// Opens the bucket's tablet under the next epoch (a new incarnation if asked).
    async fn tablet(&mut self, new_incarnation: bool) -> LogTablet {
        if new_incarnation {
            self.node = StreamStore::open(self.store.clone(), "n1", wal_config())
                .await
                .unwrap();
        }
        self.epoch += 1;
        let stream = self.node.open_stream("t1-b0", self.epoch).await.unwrap();
        LogTablet::open(BUCKET, stream, false, vec![schema()], LogConfig::default())
            .await
            .unwrap()
    }
}

async fn all_ids(tablet: &LogTablet) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut pos = tablet.log_start();
    while pos < tablet.high_watermark() {
        let scan = tablet.scan(pos, 1 << 20).await.unwrap();
        for b in &scan.batches {
            let col = b
                .batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            ids.extend(col.values().iter().copied());
        }
        pos = scan.next_offset(pos);
    }
    ids
}

#[tokio::test]
async fn offsets_are_contiguous_and_a_duplicate_returns_the_original() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    let a = tablet.append(req(7, 0, 0..3)).await.unwrap();
    assert_eq!((a.first_offset, a.last_offset, a.duplicated), (0, 2, false));
    let b = tablet.append(req(7, 1, 3..5)).await.unwrap();
    assert_eq!((b.first_offset, b.last_offset), (3, 4));
    assert!(
        b.commit_timestamp >= a.commit_timestamp,
        "commit timestamps never go back"
    );
    let again = tablet.append(req(7, 0, 0..3)).await.unwrap();
    assert_eq!(
        (again.first_offset, again.last_offset, again.duplicated),
        (0, 2, true)
    );
    assert_eq!(again.commit_timestamp, a.commit_timestamp);
    assert_eq!(tablet.high_watermark(), 5);
    assert_eq!(all_ids(&tablet).await, vec![0, 1, 2, 3, 4]);
    // Without a writer id nothing is deduplicated.
    tablet.append(req(NO_WRITER, 0, 5..6)).await.unwrap();
    tablet.append(req(NO_WRITER, 0, 5..6)).await.unwrap();
    assert_eq!(tablet.high_watermark(), 7);
}

#[tokio::test]
async fn out_of_order_sequences_are_rejected_and_change_nothing() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    tablet.append(req(1, 10, 0..2)).await.unwrap();
    for bad in [12, 9] {
        let err = tablet.append(req(1, bad, 2..4)).await.unwrap_err();
        match err {
            MinkError::OutOfOrderSequence {
                writer_id,
                first_sequence,
                expected,
                ..
            } => assert_eq!((writer_id, first_sequence, expected), (1, bad, 11)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(tablet.high_watermark(), 2);
    assert_eq!(
        tablet.append(req(1, 11, 2..4)).await.unwrap().first_offset,
        2
    );
}

#[tokio::test]
async fn a_retry_after_a_failed_upload_is_written_exactly_once() {
    for landed in [false, true] {
        let mut env = Env::new().await;
        let tablet = env.tablet(false).await;
        tablet.append(req(5, 0, 0..2)).await.unwrap();
        if landed {
            env.faulty.time_out_next_puts(1);
        } else {
            env.faulty.fail_next_puts(1);
        }
        let err = tablet.append(req(5, 1, 2..4)).await.unwrap_err();
        assert!(matches!(err, MinkError::StorageFailure(_)), "{err:?}");
        assert!(tablet.failure().is_some());
        // The node restarts its WAL and reopens the tablet from the log.
        let tablet = env.tablet(true).await;
        let retry = tablet.append(req(5, 1, 2..4)).await.unwrap();
        assert_eq!(retry.duplicated, landed, "landed={landed}");
        assert_eq!((retry.first_offset, retry.last_offset), (2, 3));
        assert_eq!(all_ids(&tablet).await, vec![0, 1, 2, 3], "landed={landed}");
    }
}

/// How long WAL uploads are held (paused time) once [`hold_wal_uploads`] is called.
const WAL_UPLOAD_HELD: Duration = Duration::from_secs(1);

fn hold_wal_uploads(faulty: &FaultyStore) {
    faulty.set_put_delay(Some(Arc::new(|path: &object_store::path::Path| {
        path.as_ref().starts_with("wal/").then_some(WAL_UPLOAD_HELD)
    })));
}

/// A caller that stops waiting for its append (a client that went away mid-request)
/// must not leave the batch pending in the writer window forever: a retry is answered
/// once the original is durable, with its offsets. (Found by the KV model test: the
/// retry of a cancelled Put waited forever.)
#[tokio::test(start_paused = true)]
async fn a_retry_of_an_append_whose_caller_went_away_is_answered() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    hold_wal_uploads(&env.faulty);
    let submitted = tablet.submit(req(7, 0, 0..2)).await.unwrap();
    assert_eq!(submitted.offsets(), (0, 1));
    drop(submitted);
    let retry = tokio::time::timeout(Duration::from_secs(30), tablet.append(req(7, 0, 0..2)))
        .await
        .expect("the retry is answered once the original is durable")
        .unwrap();
    assert!(retry.duplicated);
    assert_eq!((retry.first_offset, retry.last_offset), (0, 1));
    // And once it is durable, a retry is answered at once.
    let again = tablet.append(req(7, 0, 0..2)).await.unwrap();
    assert!(again.duplicated);
    assert_eq!(all_ids(&tablet).await, vec![0, 1]);
}

/// A tablet opened on a stream that moved in place from an older epoch on this node
/// covers that tablet's appends still in flight: they are in the stream below its own
/// offsets, so its writer windows must know them (a retry is a duplicate, not a second
/// copy). (Found by the KV model test: a Put retried on the new tablet was applied
/// twice, and the KV tablet merged over a state that missed the in-flight batch.)
#[tokio::test(start_paused = true)]
async fn a_tablet_reopened_in_place_covers_the_appends_in_flight() {
    let mut env = Env::new().await;
    let old = env.tablet(false).await;
    old.append(req(7, 0, 0..2)).await.unwrap();
    hold_wal_uploads(&env.faulty);
    let in_flight = old.submit(req(7, 1, 2..4)).await.unwrap();
    assert_eq!(in_flight.offsets(), (2, 3));
    let opened_at = tokio::time::Instant::now();
    // The same node opens the bucket under a newer epoch (the stream moves in place).
    let new = env.tablet(false).await;
    assert!(
        opened_at.elapsed() >= WAL_UPLOAD_HELD,
        "the open waited for the append in flight"
    );
    assert_eq!(new.high_watermark(), 4);
    assert_eq!(
        new.writer_window(7).last().map(|e| (e.0, e.2)),
        Some((1, 2))
    );
    let retry = new.append(req(7, 1, 2..4)).await.unwrap();
    assert!(retry.duplicated, "{retry:?}");
    assert_eq!((retry.first_offset, retry.last_offset), (2, 3));
    let original = in_flight.wait().await.unwrap();
    assert_eq!((original.first_offset, original.last_offset), (2, 3));
    env.faulty.set_put_delay(None);
    assert_eq!(new.append(req(7, 2, 4..5)).await.unwrap().first_offset, 4);
    assert_eq!(all_ids(&new).await, vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn recovery_restores_writer_windows() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    for seq in 0..7 {
        tablet
            .append(req(3, seq, seq * 2..seq * 2 + 2))
            .await
            .unwrap();
    }
    tablet.append(req(4, 100, 14..15)).await.unwrap();
    env.node.compact().await.unwrap();
    let before = (tablet.writer_window(3), tablet.writer_window(4));
    drop(tablet);
    let tablet = env.tablet(true).await;
    assert_eq!((tablet.writer_window(3), tablet.writer_window(4)), before);
    assert_eq!(tablet.writer_window(3).len(), 5);
    let dup = tablet.append(req(3, 6, 12..14)).await.unwrap();
    assert!(dup.duplicated);
    assert_eq!(dup.first_offset, 12);
    assert!(matches!(
        tablet.append(req(3, 9, 15..16)).await.unwrap_err(),
        MinkError::OutOfOrderSequence { expected: 7, .. }
    ));
    assert_eq!(
        tablet.append(req(3, 7, 15..16)).await.unwrap().first_offset,
        15
    );
}

/// A log whose compression changed twice holds batches of three codecs, some in
/// segments, some only in the WAL: scans, tails from the middle and a crash recovery
/// read every row once, and the stored bytes show the codecs.
#[tokio::test]
async fn a_log_of_mixed_compressions_reads_and_recovers() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    assert_eq!(tablet.compression(), Compression::Zstd, "the default");
    let mut stored = Vec::new();
    let mut next = 0;
    for (i, compression) in [Compression::None, Compression::Zstd, Compression::Lz4]
        .into_iter()
        .enumerate()
    {
        tablet.set_compression(compression);
        let before = tablet.stored_bytes();
        for seq in 0..4 {
            let seq = i as i64 * 4 + seq;
            tablet.append(req(7, seq, next..next + 1000)).await.unwrap();
            next += 1000;
        }
        if i == 1 {
            // The uncompressed and zstd batches go to segments; lz4's stay in the WAL.
            env.node.compact().await.unwrap();
        }
        stored.push((compression, tablet.stored_bytes() - before));
    }
    // zstd halves these rows at least; lz4, faster, gives up more of the ratio.
    let (plain, zstd, lz4) = (stored[0].1, stored[1].1, stored[2].1);
    assert!(zstd * 2 < plain, "zstd: {zstd} bytes against {plain}");
    assert!(lz4 < plain, "lz4: {lz4} bytes against {plain}");
    assert_eq!(all_ids(&tablet).await, (0..12_000).collect::<Vec<_>>());
    // A read from the middle of the zstd part.
    let scan = tablet.scan(5_500, 1 << 20).await.unwrap();
    let first = scan.batches[0].batch.column(0).as_any();
    let first = first.downcast_ref::<Int64Array>().unwrap();
    assert_eq!(first.value(0), 5_500);
    drop(tablet);
    // A crash: a new incarnation recovers the log, windows included, from every codec.
    let tablet = env.tablet(true).await;
    assert_eq!(all_ids(&tablet).await, (0..12_000).collect::<Vec<_>>());
    assert!(
        tablet
            .append(req(7, 11, 12_000..12_001))
            .await
            .unwrap()
            .duplicated
    );
}

/// A reopen reads batch headers only from the newest writer checkpoint, and rebuilds
/// the same windows as a reopen that reads the whole log.
#[tokio::test]
async fn recovery_starts_from_the_newest_checkpoint() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    for seq in 0..40 {
        tablet
            .append(req(seq % 3, seq / 3, seq..seq + 1))
            .await
            .unwrap();
    }
    let at = tablet.checkpoint().await.unwrap();
    assert_eq!(at, 40);
    for seq in 40..46 {
        tablet
            .append(req(seq % 3, seq / 3, seq..seq + 1))
            .await
            .unwrap();
    }
    let windows: Vec<_> = (0..3).map(|w| tablet.writer_window(w)).collect();
    drop(tablet);
    let tablet = env.tablet(true).await;
    assert_eq!(
        tablet.recovered_from(),
        40,
        "headers read from the checkpoint on"
    );
    assert_eq!(
        (0..3).map(|w| tablet.writer_window(w)).collect::<Vec<_>>(),
        windows
    );
    // A retry of a batch below the checkpoint is still a duplicate.
    let dup = tablet.append(req(0, 12, 36..37)).await.unwrap();
    assert!(dup.duplicated);
    assert_eq!(dup.first_offset, 36);
    // Without checkpoints the same windows come from the log start.
    let store = env.store.clone();
    let doomed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(
        store.list(Some(&object_store::path::Path::from("ckpt"))),
    )
    .await
    .unwrap();
    for m in doomed {
        object_store::ObjectStoreExt::delete(&store, &m.location)
            .await
            .unwrap();
    }
    drop(tablet);
    let tablet = env.tablet(true).await;
    assert_eq!(tablet.recovered_from(), 0);
    assert_eq!(
        (0..3).map(|w| tablet.writer_window(w)).collect::<Vec<_>>(),
        windows
    );
}

/// A clean close (a handover) leaves a checkpoint at the log's end: the next owner
/// reads no batch header. An owner whose recovery read headers writes one at once,
/// not a whole checkpoint interval later (buckets that move more often than the
/// interval would otherwise never get one, and each recovery would read more).
#[tokio::test]
async fn a_handover_and_a_long_recovery_each_leave_a_checkpoint_behind() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    for seq in 0..10 {
        tablet.append(req(1, seq, seq..seq + 1)).await.unwrap();
    }
    let window = tablet.writer_window(1);
    tablet.close().await.unwrap();
    drop(tablet);
    let tablet = env.tablet(false).await;
    assert_eq!(
        tablet.recovered_from(),
        10,
        "no header read after a handover"
    );
    assert_eq!(tablet.writer_window(1), window);
    // Ten more, then a crash (no close): the next owner reads their headers...
    for seq in 10..20 {
        tablet.append(req(1, seq, seq..seq + 1)).await.unwrap();
    }
    drop(tablet);
    let tablet = Arc::new(env.tablet(true).await);
    assert_eq!(tablet.recovered_from(), 10);
    // ...and checkpoints at once, with the default interval of a minute.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let duty = tokio::spawn({
        let tablet = tablet.clone();
        async move {
            tablet
                .run_checkpoints(async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    let ckpt = object_store::path::Path::from("ckpt/t1-b0/00000000000000000020");
    tokio::time::timeout(Duration::from_secs(10), async {
        while object_store::ObjectStoreExt::head(&env.store, &ckpt)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a checkpoint at 20 soon after the open");
    let _ = stop.send(());
    duty.await.unwrap();
    let window = tablet.writer_window(1);
    drop(tablet);
    let tablet = env.tablet(true).await;
    assert_eq!(tablet.recovered_from(), 20);
    assert_eq!(tablet.writer_window(1), window);
}

/// A tablet whose stream was reopened in place under a newer epoch shares the stream,
/// whose end then holds the newer tablet's batches: it writes no checkpoint (its
/// windows lack those batches, and a later owner would read none of their headers).
#[tokio::test]
async fn a_tablet_superseded_in_place_writes_no_checkpoint() {
    let mut env = Env::new().await;
    let old = env.tablet(false).await;
    old.append(req(1, 0, 0..1)).await.unwrap();
    let new = env.tablet(false).await;
    new.append(req(2, 0, 1..2)).await.unwrap();
    assert_eq!(old.high_watermark(), 2, "the stream is shared");
    let refused = old.checkpoint().await.unwrap_err();
    assert!(matches!(refused, MinkError::Fenced(_)), "{refused:?}");
    // The close of the old one (a handover that came late) leaves none either.
    let _ = old.close().await;
    let listed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(
        env.store
            .list(Some(&object_store::path::Path::from("ckpt"))),
    )
    .await
    .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    assert_eq!(new.checkpoint().await.unwrap(), 2);
}

/// A log trimmed past its newest checkpoint took with it every batch the checkpoint
/// describes and those after it up to the log start: a reopen forgets the writers the
/// checkpoint names instead of rebuilding a window that ends before their trimmed
/// batches (their next batch would be refused as out of order, expecting a sequence
/// the writer used long ago: read by the clients as "never written"). A writer whose
/// batches are all trimmed is unknown, as docs/protocol.md says.
#[tokio::test]
async fn a_checkpoint_below_the_log_start_is_not_used() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    for seq in 0..3 {
        tablet.append(req(5, seq, seq..seq + 1)).await.unwrap();
    }
    assert_eq!(tablet.checkpoint().await.unwrap(), 3);
    for seq in 3..5 {
        tablet.append(req(5, seq, seq..seq + 1)).await.unwrap();
    }
    tablet.append(req(6, 0, 5..6)).await.unwrap();
    tablet.append(req(6, 1, 6..7)).await.unwrap();
    env.node.compact().await.unwrap(); // only compacted data is trimmed
    assert_eq!(tablet.trim_before(5).await.unwrap(), 5);
    let six = tablet.writer_window(6);
    drop(tablet);
    let tablet = env.tablet(true).await;
    assert_eq!(tablet.log_start(), 5);
    assert_eq!(
        tablet.recovered_from(),
        5,
        "headers read from the log start"
    );
    assert!(
        tablet.writer_window(5).is_empty(),
        "a writer whose batches are all trimmed is unknown: {:?}",
        tablet.writer_window(5)
    );
    assert_eq!(tablet.writer_window(6), six);
    // The writer goes on as a writer the tablet does not know (a log tablet takes its
    // first batch at any sequence).
    let next = tablet.append(req(5, 5, 7..8)).await.unwrap();
    assert!(!next.duplicated);
    assert_eq!(next.first_offset, 7);
}

/// Kafka's DeleteRecords names any offset, so the log start may fall inside a batch.
/// After a crash (no close, no checkpoint) the next owner reads the log from that
/// start: the batch holding it begins before it, and recovery takes it as the log's
/// first (its writer stays known), instead of refusing it as a gap and never opening.
/// With a checkpoint above the start, recovery reads from the checkpoint as before.
#[tokio::test]
async fn a_log_start_inside_a_batch_survives_a_crash() {
    for checkpointed in [false, true] {
        let mut env = Env::new().await;
        let tablet = env.tablet(false).await;
        tablet.append(req(7, 0, 0..10)).await.unwrap();
        env.node.compact().await.unwrap(); // only compacted data is trimmed
        assert_eq!(tablet.trim_before(5).await.unwrap(), 5);
        if checkpointed {
            assert_eq!(tablet.checkpoint().await.unwrap(), 10);
        }
        drop(tablet); // a crash: nothing closed
        let tablet = env.tablet(true).await;
        assert_eq!(
            (tablet.log_start(), tablet.high_watermark()),
            (5, 10),
            "checkpointed: {checkpointed}"
        );
        assert_eq!(tablet.recovered_from(), if checkpointed { 10 } else { 5 });
        assert_eq!(all_ids(&tablet).await, (5..10).collect::<Vec<_>>());
        // The writer of the batch that holds the start is known: its retry is a
        // duplicate, its next batch follows.
        let again = tablet.append(req(7, 0, 0..10)).await.unwrap();
        assert_eq!(
            (again.first_offset, again.last_offset, again.duplicated),
            (0, 9, true)
        );
        let next = tablet.append(req(7, 1, 10..12)).await.unwrap();
        assert_eq!((next.first_offset, next.last_offset), (10, 11));
        // And it opens again after a second crash, now with two batches to read.
        drop(tablet);
        let tablet = env.tablet(true).await;
        assert_eq!((tablet.log_start(), tablet.high_watermark()), (5, 12));
        assert_eq!(all_ids(&tablet).await, (5..12).collect::<Vec<_>>());
    }
}
#[tokio::test]
async fn a_tail_wakes_when_data_arrives() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    let reader = tablet.clone();
    let waiting =
        tokio::spawn(async move { reader.tail(0, 1, Duration::from_secs(30), 1 << 20).await });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    tablet.append(req(NO_WRITER, 0, 0..4)).await.unwrap();
    // The failsafe timeout only guards the test run; the tail returns on the append.
    let got = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the tail was not woken")
        .unwrap()
        .unwrap();
    assert_eq!(got.batches.len(), 1);
    assert_eq!(got.batches[0].batch.num_rows(), 4);
    assert_eq!(got.high_watermark, 4);

    // With nothing new, the tail returns empty at its deadline.
    let empty = tablet
        .tail(4, 1, Duration::from_millis(20), 1 << 20)
        .await
        .unwrap();
    assert!(empty.batches.is_empty());
    // min_bytes larger than one batch waits for more.
    let reader = tablet.clone();
    let big = tokio::spawn(async move {
        reader
            .tail(4, 10_000, Duration::from_secs(30), 1 << 20)
            .await
    });
    tablet.append(req(NO_WRITER, 0, 4..5)).await.unwrap();
    tokio::task::yield_now().await;
    assert!(!big.is_finished(), "one small batch is below min_bytes");
    for i in 0..50 {
        tablet
            .append(req(NO_WRITER, 0, 5 + i * 20..25 + i * 20))
            .await
            .unwrap();
        if big.is_finished() {
            break;
        }
    }
    let got = tokio::time::timeout(Duration::from_secs(20), big)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(got.bytes() >= 10_000);
}

#[tokio::test]
async fn scans_cut_at_the_requested_offset_and_check_ranges() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    tablet.append(req(NO_WRITER, 0, 0..5)).await.unwrap();
    let scan = tablet.scan(3, 1 << 20).await.unwrap();
    assert_eq!(scan.batches[0].header.base_offset, 3);
    assert_eq!(scan.batches[0].batch.num_rows(), 2);
    assert!(tablet.scan(5, 100).await.unwrap().batches.is_empty());
    assert!(matches!(
        tablet.scan(6, 100).await.unwrap_err(),
        MinkError::OffsetOutOfRange {
            offset: 6,
            high_watermark: 5,
            ..
        }
    ));
}

#[tokio::test]
async fn timestamp_lookups_across_segments() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    let mut appended = Vec::new();
    for i in 0..12i64 {
        appended.push(
            tablet
                .append(req(NO_WRITER, 0, i * 2..i * 2 + 2))
                .await
                .unwrap(),
        );
        if i % 4 == 3 {
            env.node.compact().await.unwrap(); // one segment per compaction
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for a in &appended {
        let expected = appended
            .iter()
            .find(|b| b.commit_timestamp >= a.commit_timestamp)
            .unwrap()
            .first_offset;
        assert_eq!(
            tablet
                .list_offsets(OffsetSpec::Timestamp(a.commit_timestamp))
                .await
                .unwrap(),
            Some(expected)
        );
    }
    let last = appended.last().unwrap().commit_timestamp;
    assert_eq!(
        tablet
            .list_offsets(OffsetSpec::Timestamp(last + 1))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        tablet.list_offsets(OffsetSpec::Earliest).await.unwrap(),
        Some(0)
    );
    assert_eq!(
        tablet.list_offsets(OffsetSpec::Latest).await.unwrap(),
        Some(24)
    );
}

#[tokio::test]
async fn ttl_moves_the_log_start_and_reads_below_it_fail() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    for i in 0..5i64 {
        tablet
            .append(req(NO_WRITER, 0, i * 2..i * 2 + 2))
            .await
            .unwrap();
    }
    env.node.compact().await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let fresh = tablet.append(req(NO_WRITER, 0, 10..12)).await.unwrap();
    env.node.compact().await.unwrap();
    let start = tablet
        .trim_expired(Duration::from_millis(40))
        .await
        .unwrap();
    assert_eq!(start, fresh.first_offset);
    assert_eq!(tablet.log_start(), 10);
    assert!(matches!(
        tablet.scan(0, 100).await.unwrap_err(),
        MinkError::OffsetOutOfRange {
            offset: 0,
            log_start: 10,
            ..
        }
    ));
    assert_eq!(all_ids(&tablet).await, vec![10, 11]);
    assert_eq!(
        tablet.list_offsets(OffsetSpec::Earliest).await.unwrap(),
        Some(10)
    );
}

#[tokio::test]
async fn bad_batches_are_rejected_with_a_reason() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    let mut r = req(NO_WRITER, 0, 0..2);
    r.schema_id = 9;
    assert!(
        tablet
            .append(r)
            .await
            .unwrap_err()
            .to_string()
            .contains("no schema 9")
    );
    let mut r = req(NO_WRITER, 0, 0..2);
    r.change_types = Some(vec![mink_types::ChangeType::Insert; 2]);
    assert!(
        tablet
            .append(r)
            .await
            .unwrap_err()
            .to_string()
            .contains("log table takes no change types")
    );
    let wrong =
        RecordBatch::try_from_iter(vec![("id", Arc::new(StringArray::from(vec!["x"])) as _)])
            .unwrap();
    let mut r = req(NO_WRITER, 0, 0..1);
    r.batch = wrong;
    assert!(matches!(
        tablet.append(r).await.unwrap_err(),
        MinkError::SchemaMismatch(_)
    ));
    assert_eq!(tablet.high_watermark(), 0, "nothing was written");
}

/// A batch that arrives ahead of its writer's next sequence (pipelined requests that
/// reached the tablet out of order) waits for its predecessors up to `REORDER_WAIT`
/// and then takes the offsets after them; a real gap is refused once that has passed.
#[tokio::test]
async fn a_batch_ahead_of_its_predecessors_waits_for_them() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    tablet.append(req(4, 0, 0..2)).await.unwrap();
    // Sequence 2 first, then 1 (as two requests sent 1, 2 may arrive).
    let ahead = {
        let tablet = tablet.clone();
        tokio::spawn(async move { tablet.append(req(4, 2, 4..6)).await })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!ahead.is_finished(), "sequence 2 waits for sequence 1");
    let one = tablet.append(req(4, 1, 2..4)).await.unwrap();
    assert_eq!((one.first_offset, one.last_offset), (2, 3));
    let two = ahead.await.unwrap().unwrap();
    assert_eq!((two.first_offset, two.last_offset), (4, 5));
    assert_eq!(all_ids(&tablet).await, (0..6).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_real_gap_is_refused_after_the_reorder_wait() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    tablet.append(req(4, 0, 0..2)).await.unwrap();
    let started = tokio::time::Instant::now();
    let err = tablet.append(req(4, 3, 2..4)).await.unwrap_err();
    assert!(
        matches!(err, MinkError::OutOfOrderSequence { expected: 1, .. }),
        "{err:?}"
    );
    assert!(started.elapsed() >= mink_log::tablet::REORDER_WAIT);
    // A rewind is refused at once.
    let started = tokio::time::Instant::now();
    tablet.append(req(4, 1, 2..4)).await.unwrap();
    let err = tablet.append(req(4, 0, 9..10)).await;
    assert!(err.is_ok_and(|a| a.duplicated), "sequence 0 is a duplicate");
    let rewind = AppendRequest {
        last_sequence: 1,
        ..req(4, 0, 9..10)
    };
    let err = tablet.append(rewind).await.unwrap_err();
    assert!(matches!(err, MinkError::OutOfOrderSequence { .. }));
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait for a rewind");
    assert_eq!(tablet.high_watermark(), 4);
}

/// A caller whose requests arrive in order (a Kafka connection) is refused a forward
/// gap at once; a batch waiting for its predecessors gives up as soon as the tablet
/// closes, with `Unavailable` rather than an out-of-order refusal at the deadline.
#[tokio::test(start_paused = true)]
async fn in_order_callers_do_not_wait_and_a_close_ends_the_wait() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    tablet.append(req(4, 0, 0..2)).await.unwrap();
    let started = tokio::time::Instant::now();
    let err = tablet.submit_in_order(req(4, 3, 2..4)).await.err().unwrap();
    assert!(
        matches!(err, MinkError::OutOfOrderSequence { expected: 1, .. }),
        "{err:?}"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);

    let waiting = {
        let tablet = tablet.clone();
        tokio::spawn(async move { tablet.append(req(4, 2, 2..4)).await })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished());
    let started = tokio::time::Instant::now();
    tablet.close().await.unwrap();
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, MinkError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < mink_log::tablet::REORDER_WAIT);
}

/// A Kafka producer's sequence wraps from `i32::MAX` to 0. A batch that crosses the
/// wrap (`b ..= b + n - 1` past `i32::MAX`, as the Kafka listener submits it) is
/// followed by the wrapped sequence, before and after a crash; retries on either side
/// of the wrap are duplicates, and a gap after it is refused as one.
#[tokio::test]
async fn a_kafka_producer_goes_on_across_the_sequence_wrap() {
    const MAX: i64 = i32::MAX as i64;
    let batch = |first: i64, last: i64, ids: std::ops::Range<i64>| AppendRequest {
        first_sequence: first,
        last_sequence: last,
        ..req(7, 0, ids)
    };
    let submit = |tablet: LogTablet, req: AppendRequest| async move {
        tablet.submit_producer(req).await?.wait().await
    };
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    // One row standing for the producer's first 2^31 - 3 records.
    submit(tablet.clone(), batch(0, MAX - 3, 0..1))
        .await
        .unwrap();
    let crossing = submit(tablet.clone(), batch(MAX - 2, MAX + 1, 1..5))
        .await
        .unwrap();
    assert_eq!((crossing.first_offset, crossing.last_offset), (1, 4));
    let after = submit(tablet.clone(), batch(1, 2, 5..7)).await.unwrap();
    assert_eq!((after.first_offset, after.duplicated), (5, false));
    let again = submit(tablet.clone(), batch(MAX - 2, MAX + 1, 1..5))
        .await
        .unwrap();
    assert_eq!((again.first_offset, again.duplicated), (1, true));
    let err = submit(tablet.clone(), batch(6, 6, 7..8)).await.unwrap_err();
    assert!(
        matches!(err, MinkError::OutOfOrderSequence { expected: 3, .. }),
        "{err:?}"
    );
    drop(tablet); // a crash: the windows come back from the log
    let tablet = env.tablet(true).await;
    let again = submit(tablet.clone(), batch(1, 2, 5..7)).await.unwrap();
    assert_eq!((again.first_offset, again.duplicated), (5, true));
    let next = submit(tablet.clone(), batch(3, 3, 7..8)).await.unwrap();
    assert_eq!((next.first_offset, next.duplicated), (7, false));
    assert_eq!(all_ids(&tablet).await, (0..8).collect::<Vec<_>>());
}

/// A sequence marker (a primary-key Put that changed nothing) of a Kafka producer that
/// bumped its epoch is logged under the producer's rules: its writer id carries the
/// epoch, which Flight writer rules refuse.
#[tokio::test]
async fn a_producers_sequence_marker_is_logged_under_its_epoch() {
    let env = Env::new().await;
    let stream = env.node.open_stream("t1-b0", 1).await.unwrap();
    let tablet = LogTablet::open(BUCKET, stream, true, vec![schema()], LogConfig::default())
        .await
        .unwrap();
    let bumped = mink_types::writer_id(9, 1).unwrap();
    let first = AppendRequest {
        change_types: Some(vec![mink_types::ChangeType::UpdateAfter]),
        ..req(bumped, 0, 0..1)
    };
    tablet
        .submit_producer(first)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let refused = tablet.submit_marker(bumped, (1, 1), 1, false).await.err();
    assert!(
        matches!(&refused, Some(MinkError::InvalidArgument { field, .. }) if field == "writer_id"),
        "{refused:?}"
    );
    let marker = tablet.submit_marker(bumped, (1, 1), 1, true).await.unwrap();
    let marker = marker.wait().await.unwrap();
    assert_eq!(
        (marker.first_offset, marker.last_offset),
        (2, 1),
        "an empty range"
    );
    let next = AppendRequest {
        change_types: Some(vec![mink_types::ChangeType::UpdateAfter]),
        ..req(bumped, 2, 1..2)
    };
    let next = tablet
        .submit_producer(next)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(next.first_offset, 2);
}

/// A Kafka producer's first batch at a tablet must start at sequence 0: a later one
/// that arrives first is refused (`UnknownWriter`) and changes nothing, so it cannot
/// overtake the first. Other in-order writers may start anywhere (a primary-key tablet
/// rebuilt from a snapshot knows no windows).
#[tokio::test]
async fn a_producer_unknown_to_the_tablet_starts_at_sequence_zero() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    let err = match tablet.submit_producer(req(7, 1, 0..2)).await {
        Err(e) => e,
        Ok(_) => panic!("sequence 1 of an unknown producer was taken"),
    };
    assert!(
        matches!(
            err,
            MinkError::UnknownWriter {
                writer_id: 7,
                first_sequence: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(tablet.high_watermark(), 0);
    for seq in 0..2 {
        let s = tablet
            .submit_producer(req(7, seq, seq * 2..seq * 2 + 2))
            .await
            .unwrap();
        s.wait().await.unwrap();
    }
    // Known now: a retry of sequence 1 is a duplicate, a gap out of order.
    let dup = tablet.submit_producer(req(7, 1, 2..4)).await.unwrap();
    assert!(dup.wait().await.unwrap().duplicated);
    assert!(matches!(
        tablet.submit_producer(req(7, 3, 9..10)).await.map(|_| ()),
        Err(MinkError::OutOfOrderSequence { expected: 2, .. })
    ));
    // Not a producer: an unknown writer may start anywhere.
    let other = tablet.submit_in_order(req(8, 5, 4..6)).await.unwrap();
    other.wait().await.unwrap();
    assert_eq!(all_ids(&tablet).await, (0..6).collect::<Vec<_>>());
}

/// A Kafka producer that bumps its epoch (the Java client does, on its own, to reset
/// its sequences) is a new writer starting at 0; once it has written, batches of the
/// older epoch, retries included, are fenced, and stay fenced across a reopen.
#[tokio::test]
async fn a_newer_producer_epoch_fences_the_older_one() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    let old = mink_types::writer_id(7, 0).unwrap();
    let new = mink_types::writer_id(7, 1).unwrap();
    let put = |writer, seq: i64, ids: std::ops::Range<i64>| {
        let tablet = tablet.clone();
        async move {
            match tablet.submit_producer(req(writer, seq, ids)).await {
                Ok(s) => s.wait().await,
                Err(e) => Err(e),
            }
        }
    };
    put(old, 0, 0..2).await.unwrap();
    put(old, 1, 2..4).await.unwrap();
    // The bump: sequence 0 again, under the new epoch.
    let bumped = put(new, 0, 4..6).await.unwrap();
    assert_eq!(bumped.first_offset, 4);
    for (seq, ids) in [(1, 2..4), (2, 6..8)] {
        let err = put(old, seq, ids).await.unwrap_err();
        assert!(
            matches!(
                err,
                MinkError::WriterFenced {
                    epoch: 0,
                    newer: 1,
                    ..
                }
            ),
            "{err:?}"
        );
    }
    env.node.compact().await.unwrap();
    drop(tablet);
    let tablet = env.tablet(true).await;
    let err = match tablet.submit_producer(req(old, 2, 6..8)).await {
        Err(e) => e,
        Ok(_) => panic!("the old epoch was taken after a reopen"),
    };
    assert!(matches!(err, MinkError::WriterFenced { .. }), "{err:?}");
    let next = tablet.submit_producer(req(new, 1, 6..8)).await.unwrap();
    next.wait().await.unwrap();
    assert_eq!(all_ids(&tablet).await, (0..8).collect::<Vec<_>>());
}

/// Only a Kafka producer's writer id carries an epoch: any other id above the base
/// range is refused, so it cannot fence the writers that share its low bits.
#[tokio::test]
async fn writer_ids_above_the_base_range_are_refused_outside_kafka() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    tablet.append(req(7, 0, 0..2)).await.unwrap();
    let epoch_one = mink_types::writer_id(7, 1).unwrap();
    let err = tablet.append(req(epoch_one, 0, 2..4)).await.unwrap_err();
    assert!(
        matches!(&err, MinkError::InvalidArgument { field, .. } if field == "writer_id"),
        "{err:?}"
    );
    // Writer 7 is not fenced by it.
    tablet.append(req(7, 1, 2..4)).await.unwrap();
    assert_eq!(all_ids(&tablet).await, (0..4).collect::<Vec<_>>());
}

/// A topic-like table: ids and a record-time column.
fn timed_schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("timestamp", DataType::TimestampLtz { precision: 3 }, false),
        ],
    )
}

/// An append of `ids` stamped `ts` to a [`timed_schema`] table, with no writer.
fn timed_append(ids: std::ops::Range<i64>, ts: Vec<i64>) -> AppendRequest {
    let batch = RecordBatch::try_new(
        timed_schema().to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(arrow::array::TimestampMillisecondArray::from(ts).with_timezone("UTC")),
        ],
    )
    .unwrap();
    AppendRequest {
        batch,
        schema_id: 1,
        ..req(NO_WRITER, 0, 0..1)
    }
}

/// A tablet indexed by record time (a Kafka topic's) answers a timestamp lookup with
/// the first row stamped at or after it, whatever order the stamps came in: through
/// segments, the WAL and a new incarnation, against the rows themselves.
#[tokio::test]
async fn record_time_lookups_find_the_first_row_at_or_after_the_time() {
    let timed = timed_schema();
    for seed in 1..=4u64 {
        let mut env = Env::new().await;
        env.epoch += 1;
        let open = |env: &Env| {
            let (node, epoch, timed) = (env.node.clone(), env.epoch, timed.clone());
            async move {
                let stream = node.open_stream("t1-b0", epoch).await.unwrap();
                let t = LogTablet::open(BUCKET, stream, false, vec![timed], LogConfig::default())
                    .await
                    .unwrap();
                t.index_by_record_time("timestamp", Duration::from_secs(3_600));
                t
            }
        };
        let tablet = open(&env).await;
        let mut state = seed;
        let mut next = |n: u64| {
            // xorshift: a fixed sequence per seed.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut stamps: Vec<i64> = Vec::new();
        for b in 0..40 {
            let n = 1 + next(5) as usize;
            let ts: Vec<i64> = (0..n).map(|_| next(1_000) as i64).collect();
            let ids = stamps.len() as i64..(stamps.len() + n) as i64;
            let a = tablet.append(timed_append(ids, ts.clone())).await.unwrap();
            assert_eq!(a.first_offset, stamps.len() as i64);
            stamps.extend(ts);
            if b % 9 == 8 {
                env.node.compact().await.unwrap();
            }
        }
        let check = |tablet: LogTablet, stamps: Vec<i64>| async move {
            for t in (0..=1_001).step_by(7).chain([0, 999, 1_000]) {
                let want = stamps
                    .iter()
                    .position(|&s| s >= t)
                    .map(|i| (i as i64, stamps[i]));
                assert_eq!(
                    tablet.offset_for_time(t).await.unwrap(),
                    want,
                    "seed {seed}, time {t}"
                );
                assert_eq!(
                    tablet.list_offsets(OffsetSpec::Timestamp(t)).await.unwrap(),
                    want.map(|w| w.0)
                );
            }
        };
        check(tablet.clone(), stamps.clone()).await;
        // A row stamped more than the allowed hour ahead is refused, and nothing is
        // appended.
        let ahead = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            + 7_200_000;
        let err = tablet
            .append(timed_append(0..1, vec![ahead]))
            .await
            .unwrap_err();
        assert!(matches!(err, MinkError::InvalidArgument { .. }), "{err}");
        assert_eq!(tablet.high_watermark(), stamps.len() as i64);
        // A new owner finds the same rows (segments and WAL objects keep the index).
        drop(tablet);
        env.node = StreamStore::open(env.store.clone(), "n1", wal_config())
            .await
            .unwrap();
        env.epoch += 1;
        check(open(&env).await, stamps).await;
    }
}

/// Record-time lookups and the TTL raced against appends, compaction and each other
/// on a topic-like tablet (indexed by record time): a lookup's answer is the first
/// row stamped at or after the time among the rows that were there all along, and a
/// trim never removes a row stamped at or after its cutoff. Stamps lag the clock by
/// ~0.9 s with jitter, the TTL is 1 s: batches expire a few at a time while lookups,
/// compactions and appends run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_time_lookups_and_ttl_race_compaction_and_appends() {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    let timed = timed_schema();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let ttl = Duration::from_millis(1_000);
    for seed in 1..=3u64 {
        let mut env = Env::new().await;
        env.epoch += 1;
        let stream = env.node.open_stream("t1-b0", env.epoch).await.unwrap();
        let tablet = LogTablet::open(
            BUCKET,
            stream,
            false,
            vec![timed.clone()],
            LogConfig::default(),
        )
        .await
        .unwrap();
        tablet.index_by_record_time("timestamp", Duration::from_secs(3_600));
        // Every row's stamp, by offset; a batch's stamps go in before it is appended.
        let stamps: Arc<Mutex<Vec<i64>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));

        let appender = {
            let (tablet, stamps, stop) = (tablet.clone(), stamps.clone(), stop.clone());
            tokio::spawn(async move {
                let mut state = seed;
                let mut next = move |n: u64| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state % n
                };
                while !stop.load(Ordering::SeqCst) {
                    let n = 1 + next(5) as usize;
                    let ts: Vec<i64> = (0..n)
                        .map(|_| now_ms() - 1_200 + next(600) as i64)
                        .collect();
                    let first = {
                        let mut s = stamps.lock().unwrap();
                        s.extend(&ts);
                        (s.len() - n) as i64
                    };
                    let a = tablet
                        .append(timed_append(first..first + n as i64, ts))
                        .await
                        .unwrap();
                    assert_eq!(a.first_offset, first, "seed {seed}");
                    tokio::time::sleep(Duration::from_millis(1 + next(3))).await;
                }
            })
        };
        let compactor = {
            let (node, stop) = (env.node.clone(), stop.clone());
            tokio::spawn(async move {
                let mut rounds = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    node.compact().await.unwrap();
                    rounds += 1;
                    tokio::time::sleep(Duration::from_millis(7)).await;
                }
                rounds
            })
        };
        let trimmer = {
            let (tablet, stamps, stop) = (tablet.clone(), stamps.clone(), stop.clone());
            tokio::spawn(async move {
                let mut checked = 0i64;
                while !stop.load(Ordering::SeqCst) {
                    let start = tablet.trim_expired(ttl).await.unwrap();
                    let cutoff = now_ms() - ttl.as_millis() as i64;
                    let stamps = stamps.lock().unwrap().clone();
                    for i in checked..start {
                        assert!(
                            stamps[i as usize] < cutoff,
                            "seed {seed}: row {i} stamped {} trimmed before its time (cutoff {cutoff})",
                            stamps[i as usize]
                        );
                    }
                    checked = checked.max(start);
                    tokio::time::sleep(Duration::from_millis(11)).await;
                }
                checked
            })
        };
        let lookers: Vec<_> = (0..2u64)
            .map(|l| {
                let (tablet, stamps, stop) = (tablet.clone(), stamps.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut state = seed * 31 + l;
                    let mut found = 0u32;
                    let mut lookups = 0u32;
                    while !stop.load(Ordering::SeqCst) {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let t = now_ms() - 1_500 + (state % 1_600) as i64;
                        let hw_before = tablet.high_watermark();
                        let answer = tablet.offset_for_time(t).await.unwrap();
                        let start_after = tablet.log_start();
                        let stamps = stamps.lock().unwrap().clone();
                        // Rows in [start_after, end) were in the log throughout.
                        let end = match answer {
                            Some((o, f)) => {
                                assert!(f >= t, "seed {seed}: found {f} for {t}");
                                assert_eq!(stamps[o as usize], f, "seed {seed}: row {o}");
                                found += 1;
                                o
                            }
                            None => hw_before,
                        };
                        for i in start_after..end {
                            assert!(
                                stamps[i as usize] < t,
                                "seed {seed}: lookup {t} answered {answer:?}, but row {i} \
                                 (stamped {}) was there all along",
                                stamps[i as usize]
                            );
                        }
                        lookups += 1;
                        tokio::task::yield_now().await;
                    }
                    (lookups, found)
                })
            })
            .collect();

        tokio::time::sleep(Duration::from_millis(2_500)).await;
        stop.store(true, Ordering::SeqCst);
        appender.await.unwrap();
        let rounds = compactor.await.unwrap();
        let trimmed = trimmer.await.unwrap();
        let mut lookups = 0;
        for l in lookers {
            let (n, found) = l.await.unwrap();
            assert!(found > 0, "seed {seed}: no lookup found a row");
            lookups += n;
        }
        let rows = stamps.lock().unwrap().len();
        eprintln!(
            "seed {seed}: {rows} rows, {trimmed} trimmed, {rounds} compactions, {lookups} lookups"
        );
        assert!(
            trimmed > 0 && rounds > 10,
            "seed {seed}: the race did not run"
        );
    }
}

/// OffsetForLeaderEpoch's answer: where each epoch ended, found from the epochs the
/// batches were written under, across epochs that wrote nothing.
#[tokio::test]
async fn each_epoch_ends_where_the_next_began() {
    let mut env = Env::new().await;
    let mut seq = 0;
    let mut next = 0;
    // Epoch 1 writes 0..6 in three batches; epoch 2 nothing; epoch 3 writes 6..10;
    // epoch 4 (the current one) writes 10..11.
    let tablet = env.tablet(false).await;
    for rows in [2, 2, 2] {
        tablet.append(req(7, seq, next..next + rows)).await.unwrap();
        (seq, next) = (seq + 1, next + rows);
    }
    drop(tablet);
    drop(env.tablet(false).await); // epoch 2, which writes nothing
    let mut tablet = env.tablet(false).await;
    for rows in [1, 3] {
        tablet.append(req(7, seq, next..next + rows)).await.unwrap();
        (seq, next) = (seq + 1, next + rows);
    }
    tablet = env.tablet(true).await;
    tablet.append(req(7, seq, next..next + 1)).await.unwrap();
    assert_eq!(tablet.epoch(), 4);
    let ends = [
        (0, Some((0, 0))),
        (1, Some((1, 6))),
        (2, Some((1, 6))),
        (3, Some((3, 10))),
        (4, Some((4, 11))),
        (5, None),
    ];
    for (epoch, want) in ends {
        assert_eq!(
            tablet.epoch_end(epoch).await.unwrap(),
            want,
            "epoch {epoch}"
        );
    }
}

/// OffsetForLeaderEpoch raced against trims: while the log start moves up under it
/// (segments deleted, the first batches gone), every answer is still where the epoch
/// ended whenever that boundary was in the log throughout the call, and otherwise
/// within what was retained; a trim is never an error. Seeds replay
/// (`MINK_EPOCH_SEED=S`, `MINK_EPOCH_SEEDS=N`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_ends_hold_while_trims_move_the_log_start() {
    for seed in mink_wal::fault::seeds_from_env("MINK_EPOCH_SEED", "MINK_EPOCH_SEEDS", 10) {
        let mut env = Env::new().await;
        let mut rng = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next_random = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        // Epochs 1..=8, each writing 0 to 3 batches of 1 to 4 rows, compacted after
        // every epoch so that trims delete whole segments.
        let (mut seq, mut next) = (0, 0i64);
        let mut first_of_epoch: Vec<(u64, i64)> = Vec::new(); // (epoch, its first offset)
        let mut tablet = env.tablet(false).await;
        for epoch in 1..=8u64 {
            if epoch > 1 {
                drop(tablet);
                tablet = env.tablet(false).await;
            }
            assert_eq!(tablet.epoch(), epoch);
            let batches = next_random(4);
            if batches > 0 {
                first_of_epoch.push((epoch, next));
            }
            for _ in 0..batches {
                let rows = 1 + next_random(4) as i64;
                tablet.append(req(7, seq, next..next + rows)).await.unwrap();
                (seq, next) = (seq + 1, next + rows);
            }
            env.node.compact().await.unwrap();
        }
        let hw = tablet.high_watermark();
        let current = tablet.epoch();
        // Where `epoch` ended: the first offset of a newer epoch's batch (the high
        // watermark for the current epoch).
        let truth = |epoch: u64| -> i64 {
            if epoch == current {
                return hw;
            }
            first_of_epoch
                .iter()
                .find(|(e, _)| *e > epoch)
                .map_or(hw, |(_, first)| *first)
        };
        let trimmer = {
            let tablet = tablet.clone();
            let node = env.node.clone();
            tokio::spawn(async move {
                for to in 1..=hw {
                    tablet.trim_before(to).await.unwrap();
                    if to % 3 == 0 {
                        node.compact().await.unwrap();
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut answers = 0;
        while !trimmer.is_finished() || answers < 20 {
            let epoch = next_random(current + 1);
            let start_before = tablet.log_start();
            let got = tablet.epoch_end(epoch).await;
            let start_after = tablet.log_start();
            let Some((floor, end)) = got.unwrap_or_else(|e| {
                panic!("seed {seed}: epoch {epoch} with the log start moving {start_before}..{start_after}: {e}")
            }) else {
                panic!("seed {seed}: epoch {epoch} of at most {current} has no answer");
            };
            let want = truth(epoch);
            if want > start_after {
                assert_eq!(end, want, "seed {seed}: where epoch {epoch} ended");
                assert!(
                    floor <= epoch,
                    "seed {seed}: epoch {epoch} answered {floor}"
                );
            } else {
                assert!(
                    (want.min(start_before)..=start_after.max(want)).contains(&end),
                    "seed {seed}: epoch {epoch} ended at {want}, trimmed to {start_before}..{start_after}: answered {end}"
                );
            }
            answers += 1;
            if trimmer.is_finished() && answers >= 20 {
                break;
            }
        }
        trimmer.await.unwrap();
        eprintln!("seed {seed}: {answers} answers while trimming to {hw}");
    }
}

/// A bucket's stored bytes: its uncompacted records, then its segments, down by what
/// a trim deletes.
#[tokio::test]
async fn stored_bytes_follow_appends_compaction_and_trims() {
    let mut env = Env::new().await;
    let tablet = env.tablet(false).await;
    assert_eq!(tablet.stored_bytes(), 0);
    tablet.append(req(7, 0, 0..100)).await.unwrap();
    let held = tablet.stored_bytes();
    assert!(held > 100 * 8, "{held}");
    env.node.compact().await.unwrap();
    let compacted = tablet.stored_bytes();
    assert!(
        compacted > 100 * 8,
        "{compacted}: the segment holds the rows"
    );
    tablet.append(req(7, 1, 100..200)).await.unwrap();
    env.node.compact().await.unwrap();
    let two = tablet.stored_bytes();
    assert!(two > compacted);
    tablet.trim_before(100).await.unwrap();
    assert!(tablet.stored_bytes() < two, "the first segment went");
}
