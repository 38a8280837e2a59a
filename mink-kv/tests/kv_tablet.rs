//! KV tablets on values: every merge engine, partial updates and deletes, schema
//! evolution, idempotence, recovery by replay on both backends, bad input.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray};
use mink_kv::{
    BeforeImages, KvBackend, KvTablet, PutRequest, SnapshotStore, WriteBackBudget, open_kv_store,
};
use mink_log::{LogConfig, LogTablet, NO_WRITER};
use mink_types::{
    ChangeType, Column, Compression, DataType, MinkError, Schema, TableBucket, TableDescriptor,
    TableProperties,
};
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{StreamStore, WalConfig};
use object_store::ObjectStore;
use object_store::memory::InMemory;

mod failing_store;

use failing_store::{FailingNamespace, SmallDisk, StoreFaults};

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
            Column::new("name", DataType::String, true),
            Column::new("score", DataType::BigInt, true),
        ],
    )
}

fn table(props: &[(&str, &str)]) -> TableDescriptor {
    let mut properties = TableProperties::default();
    for (k, v) in props {
        properties.set(k, v).unwrap();
    }
    let d = TableDescriptor {
        primary_key: vec!["id".into()],
        properties,
        ..TableDescriptor::log_table(schema())
    };
    d.validate().unwrap();
    d
}

struct Env {
    store: Arc<dyn ObjectStore>,
    node: StreamStore,
    epoch: u64,
    dir: tempfile::TempDir,
    backend: KvBackend,
    /// Whether tablets get a snapshot store.
    snapshots: bool,
    /// The snapshot store's upload part size.
    part_bytes: usize,
}

impl Env {
    async fn new(backend: KvBackend) -> Self {
        Self::on(Arc::new(InMemory::new()), backend).await
    }

    /// An environment on `store` (e.g. a fault-injecting wrapper).
    async fn on(store: Arc<dyn ObjectStore>, backend: KvBackend) -> Self {
        // Failure semantics are tested here: the first failed upload is final.
        let config = WalConfig {
            upload_retry_budget_ms: 0,
            ..WalConfig::default()
        };
        let node = StreamStore::open(store.clone(), "n1", config)
            .await
            .unwrap();
        Self {
            store,
            node,
            epoch: 0,
            dir: tempfile::tempdir().unwrap(),
            backend,
            snapshots: true,
            part_bytes: mink_kv::snapshot::SNAPSHOT_PART_BYTES,
        }
    }

    /// Opens the tablet (under the next epoch) on the KV store in `dir`.
    async fn open_in(&mut self, descriptor: &TableDescriptor, dir: &std::path::Path) -> KvTablet {
        self.open_versions(descriptor, std::slice::from_ref(&descriptor.schema), dir)
            .await
            .unwrap()
    }

    /// Opens the tablet (under the next epoch) of a table with these schema versions
    /// on the KV store in `dir`.
    async fn open_versions(
        &mut self,
        descriptor: &TableDescriptor,
        schemas: &[Schema],
        dir: &std::path::Path,
    ) -> mink_types::Result<KvTablet> {
        self.epoch += 1;
        let stream = self.node.open_stream("t1-b0", self.epoch).await.unwrap();
        let log =
            LogTablet::open(BUCKET, stream, true, schemas.to_vec(), LogConfig::default()).await?;
        let kv = open_kv_store(self.backend, dir).unwrap();
        KvTablet::open(
            BUCKET,
            log,
            kv.namespace("t1-b0").unwrap(),
            descriptor.clone(),
            schemas.to_vec(),
            self.snapshots.then(|| self.snapshots()),
        )
        .await
    }

    /// Compacts the WAL and trims `t`'s changelog below `offset`, all of it.
    async fn trim_to(&self, t: &KvTablet, offset: i64) {
        self.node.compact().await.unwrap();
        assert_eq!(t.log().trim_before(offset).await.unwrap(), offset);
    }

    /// Opens the tablet (under the next epoch) on `kv`, one store kept across opens
    /// as the node keeps its own.
    async fn open_on(
        &mut self,
        descriptor: &TableDescriptor,
        kv: &Arc<dyn mink_kv::KvStore>,
    ) -> mink_types::Result<KvTablet> {
        self.epoch += 1;
        let stream = self.node.open_stream("t1-b0", self.epoch).await.unwrap();
        let schemas = vec![descriptor.schema.clone()];
        let log =
            LogTablet::open(BUCKET, stream, true, schemas.clone(), LogConfig::default()).await?;
        KvTablet::open(
            BUCKET,
            log,
            kv.namespace("t1-b0")?,
            descriptor.clone(),
            schemas,
            self.snapshots.then(|| self.snapshots()),
        )
        .await
    }

    /// A new WAL generation in place of a failed one (what the node does by itself
    /// after a failed upload).
    async fn replace_wal(&mut self) {
        let config = WalConfig {
            upload_retry_budget_ms: 0,
            ..WalConfig::default()
        };
        self.node = StreamStore::open(self.store.clone(), "n1", config)
            .await
            .unwrap();
    }

    fn snapshots(&self) -> SnapshotStore {
        SnapshotStore::new(self.store.clone(), "kv/t1/b0", 2).with_part_bytes(self.part_bytes)
    }

    async fn open(&mut self, descriptor: &TableDescriptor) -> KvTablet {
        let dir = self.dir.path().to_path_buf();
        self.open_in(descriptor, &dir).await
    }

    /// Opens the tablet (under the next epoch) on the KV store in `dir`, its namespace
    /// wrapped in one whose writes fail as `faults` say.
    async fn open_failing(
        &mut self,
        descriptor: &TableDescriptor,
        faults: &Arc<StoreFaults>,
    ) -> mink_types::Result<KvTablet> {
        self.epoch += 1;
        let stream = self.node.open_stream("t1-b0", self.epoch).await.unwrap();
        let schemas = vec![descriptor.schema.clone()];
        let log = LogTablet::open(BUCKET, stream, true, schemas.clone(), LogConfig::default())
            .await
            .unwrap();
        let kv = open_kv_store(self.backend, self.dir.path()).unwrap();
        let namespace = Arc::new(FailingNamespace {
            inner: kv.namespace("t1-b0").unwrap(),
            faults: faults.clone(),
        });
        let snapshots = Some(self.snapshots());
        KvTablet::open(
            BUCKET,
            log,
            namespace,
            descriptor.clone(),
            schemas,
            snapshots,
        )
        .await
    }
}

fn batch(rows: &[(i64, Option<&str>, Option<i64>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema().to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

fn put(rows: &[(i64, Option<&str>, Option<i64>)]) -> PutRequest {
    PutRequest {
        writer_id: NO_WRITER,
        batch_sequence: 0,
        kafka: None,
        schema_id: 1,
        target_columns: None,
        changes: None,
        batch: batch(rows),
    }
}

fn delete(ids: &[i64]) -> PutRequest {
    let rows: Vec<_> = ids.iter().map(|i| (*i, None, None)).collect();
    PutRequest {
        changes: Some(vec![ChangeType::Delete; ids.len()]),
        ..put(&rows)
    }
}

type Change = (String, i64, Option<String>, Option<i64>);

/// The whole changelog so far.
async fn changelog(t: &KvTablet) -> Vec<Change> {
    let mut out = Vec::new();
    let log = t.log();
    let mut pos = log.log_start();
    while pos < log.high_watermark() {
        let scan = log.scan(pos, 1 << 20).await.unwrap();
        for b in &scan.batches {
            let ids = b
                .batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            let names = b
                .batch
                .column(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            let scores = b
                .batch
                .column(2)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            for i in 0..b.batch.num_rows() {
                out.push((
                    b.header.change_type(i).to_string(),
                    ids.value(i),
                    (!names.is_null(i)).then(|| names.value(i).to_string()),
                    (!scores.is_null(i)).then(|| scores.value(i)),
                ));
            }
        }
        pos = scan.next_offset(pos);
    }
    out
}

fn c(ct: &str, id: i64, name: Option<&str>, score: Option<i64>) -> Change {
    (ct.into(), id, name.map(Into::into), score)
}

/// Looks up ids; missing ones are `None`.
fn get(t: &KvTablet, ids: &[i64]) -> Vec<Option<(Option<String>, Option<i64>)>> {
    let keys =
        RecordBatch::try_from_iter(vec![("id", Arc::new(Int64Array::from(ids.to_vec())) as _)])
            .unwrap();
    let found = t.lookup(&keys).unwrap();
    let names = found
        .batch
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let scores = found
        .batch
        .column(2)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let mut out = vec![None; ids.len()];
    for (row, key) in found.key_index.iter().enumerate() {
        out[*key as usize] = Some((
            (!names.is_null(row)).then(|| names.value(row).to_string()),
            (!scores.is_null(row)).then(|| scores.value(row)),
        ));
    }
    out
}

fn v(name: Option<&str>, score: Option<i64>) -> Option<(Option<String>, Option<i64>)> {
    Some((name.map(Into::into), score))
}

async fn last_row_changelog_and_state(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[])).await;
    t.put(put(&[(1, Some("a"), Some(10)), (2, Some("b"), Some(20))]))
        .await
        .unwrap();
    t.put(put(&[(1, Some("a"), Some(11))])).await.unwrap();
    let same = t.put(put(&[(2, Some("b"), Some(20))])).await.unwrap();
    assert!(
        same.last_offset < same.first_offset,
        "an unchanged row writes nothing"
    );
    t.put(delete(&[2])).await.unwrap();
    t.put(delete(&[3])).await.unwrap();
    assert_eq!(
        changelog(&t).await,
        vec![
            c("+I", 1, Some("a"), Some(10)),
            c("+I", 2, Some("b"), Some(20)),
            c("-U", 1, Some("a"), Some(10)),
            c("+U", 1, Some("a"), Some(11)),
            c("-D", 2, Some("b"), Some(20)),
        ]
    );
    assert_eq!(
        get(&t, &[1, 2, 3]),
        vec![v(Some("a"), Some(11)), None, None]
    );
    // Two rows of one key in one batch merge in order.
    t.put(put(&[(5, Some("x"), Some(1)), (5, Some("y"), Some(2))]))
        .await
        .unwrap();
    assert_eq!(get(&t, &[5]), vec![v(Some("y"), Some(2))]);
}

/// A key several times in one `last_row` Put: each row is compared with the key's
/// row before it (in the batch, or before the Put), so a repeat of the same row changes
/// nothing and the key ends at its last row, whether its old row was buffered, stored
/// or absent.
async fn a_key_repeated_in_one_put_changes_once_per_difference(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[])).await;
    t.put(put(&[(1, Some("a"), Some(1)), (2, Some("p"), Some(1))]))
        .await
        .unwrap();
    // Key 4's old row is read from the store: the buffer writes it after this Put and
    // lets it go.
    t.set_write_back_bytes(0);
    t.put(put(&[(4, Some("s"), Some(1))])).await.unwrap();
    t.put(put(&[(9, Some("z"), Some(1))])).await.unwrap();
    t.set_write_back_bytes(64 << 20);
    let before = changelog(&t).await.len();
    t.put(put(&[
        (1, Some("b"), Some(1)),
        (1, Some("b"), Some(1)),
        (2, Some("p"), Some(1)),
        (2, Some("q"), Some(1)),
        (2, Some("q"), Some(1)),
        (3, Some("n"), Some(1)),
        (3, Some("n"), Some(1)),
        (4, Some("t"), Some(1)),
        (4, Some("t"), Some(1)),
        (4, Some("s"), Some(1)),
    ]))
    .await
    .unwrap();
    assert_eq!(
        changelog(&t).await[before..],
        [
            c("-U", 1, Some("a"), Some(1)),
            c("+U", 1, Some("b"), Some(1)),
            c("-U", 2, Some("p"), Some(1)),
            c("+U", 2, Some("q"), Some(1)),
            c("+I", 3, Some("n"), Some(1)),
            c("-U", 4, Some("s"), Some(1)),
            c("+U", 4, Some("t"), Some(1)),
            c("-U", 4, Some("t"), Some(1)),
            c("+U", 4, Some("s"), Some(1)),
        ]
    );
    let state = vec![
        v(Some("b"), Some(1)),
        v(Some("q"), Some(1)),
        v(Some("n"), Some(1)),
        v(Some("s"), Some(1)),
    ];
    assert_eq!(get(&t, &[1, 2, 3, 4]), state);
    // The same rows again change nothing, and the state holds through the store.
    let same = t
        .put(put(&[(1, Some("b"), Some(1)), (2, Some("q"), Some(1))]))
        .await
        .unwrap();
    assert!(same.last_offset < same.first_offset);
    t.set_write_back_bytes(0);
    t.put(put(&[(9, Some("y"), Some(1))])).await.unwrap();
    t.put(put(&[(9, Some("x"), Some(1))])).await.unwrap();
    assert_eq!(get(&t, &[1, 2, 3, 4]), state);
}

/// An update's `-U` image comes from the batch its old row was staged from while the
/// buffer keeps that batch, and from the stored row (decoded) once it does not: the
/// changelog is the same either way.
async fn before_images_come_from_kept_batches_then_from_the_store(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[])).await;
    let rows = |name: &'static str, score: i64| {
        (1..=10)
            .map(|id| (id, Some(name), Some(score + id)))
            .collect::<Vec<_>>()
    };
    let changes = |from: &str, from_score: i64, to: &str, to_score: i64| {
        (1..=10)
            .flat_map(|id| {
                [
                    c("-U", id, Some(from), Some(from_score + id)),
                    c("+U", id, Some(to), Some(to_score + id)),
                ]
            })
            .collect::<Vec<_>>()
    };
    t.put(put(&rows("a", 0))).await.unwrap();
    t.put(put(&rows("b", 100))).await.unwrap();
    assert_eq!(
        t.before_images(),
        BeforeImages {
            kept: 10,
            decoded: 0
        }
    );
    // A key twice in one Put: its second row's `-U` is its first.
    t.put(put(&[(1, Some("x"), None), (1, Some("y"), None)]))
        .await
        .unwrap();
    assert_eq!(t.before_images().kept, 12);
    // From now on the buffer writes the store after every Put and keeps nothing: the
    // Put after next reads its old rows from the store, decoded.
    t.set_write_back_bytes(0);
    t.put(put(&rows("c", 200))).await.unwrap();
    assert_eq!(t.before_images().kept, 22);
    t.put(put(&rows("d", 300))).await.unwrap();
    assert_eq!(
        t.before_images(),
        BeforeImages {
            kept: 22,
            decoded: 10
        }
    );
    let log = changelog(&t).await;
    assert_eq!(log[10..30], changes("a", 0, "b", 100)[..]);
    assert_eq!(
        log[30..34],
        [
            c("-U", 1, Some("b"), Some(101)),
            c("+U", 1, Some("x"), None),
            c("-U", 1, Some("x"), None),
            c("+U", 1, Some("y"), None),
        ]
    );
    assert_eq!(
        log[34..36],
        [
            c("-U", 1, Some("y"), None),
            c("+U", 1, Some("c"), Some(201))
        ]
    );
    assert_eq!(log[36..54], changes("b", 100, "c", 200)[2..]);
    assert_eq!(log[54..], changes("c", 200, "d", 300)[..]);
}

/// `changelog_image = wal`: a `last_row` Put of full rows reads nothing and writes each
/// row as a `+U`, changed or not; deletes still read, and emit `-D` with the old row;
/// no `-U` anywhere. Lookups and a reopened tablet (replay) see the same state as with
/// full images.
async fn the_wal_changelog_image_has_no_before_images(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[("changelog_image", "wal")]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(10)), (2, Some("b"), Some(20))]))
        .await
        .unwrap();
    t.put(put(&[(1, Some("a"), Some(11))])).await.unwrap();
    t.put(put(&[(2, Some("b"), Some(20))])).await.unwrap();
    t.put(delete(&[2])).await.unwrap();
    t.put(delete(&[3])).await.unwrap();
    // Two rows of one key in one batch: the last is the key's row.
    t.put(put(&[(5, Some("x"), Some(1)), (5, Some("y"), Some(2))]))
        .await
        .unwrap();
    assert_eq!(
        changelog(&t).await,
        vec![
            c("+U", 1, Some("a"), Some(10)),
            c("+U", 2, Some("b"), Some(20)),
            c("+U", 1, Some("a"), Some(11)),
            c("+U", 2, Some("b"), Some(20)),
            c("-D", 2, Some("b"), Some(20)),
            c("+U", 5, Some("x"), Some(1)),
            c("+U", 5, Some("y"), Some(2)),
        ]
    );
    let want = vec![v(Some("a"), Some(11)), None, None, v(Some("y"), Some(2))];
    assert_eq!(get(&t, &[1, 2, 3, 5]), want);
    drop(t);
    let reopened = env.open(&d).await;
    assert_eq!(get(&reopened, &[1, 2, 3, 5]), want);
}

async fn first_row_and_versioned(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[("merge_engine", "first_row")])).await;
    t.put(put(&[(1, Some("a"), Some(1))])).await.unwrap();
    t.put(put(&[(1, Some("b"), Some(2))])).await.unwrap();
    t.put(delete(&[1])).await.unwrap();
    assert_eq!(changelog(&t).await, vec![c("+I", 1, Some("a"), Some(1))]);
    assert_eq!(get(&t, &[1]), vec![v(Some("a"), Some(1))]);

    let mut env = Env::new(backend).await;
    let t = env
        .open(&table(&[("merge_engine", "versioned(score)")]))
        .await;
    t.put(put(&[(1, Some("v5"), Some(5))])).await.unwrap();
    t.put(put(&[(1, Some("v3"), Some(3))])).await.unwrap();
    t.put(put(&[(1, Some("vnull"), None)])).await.unwrap();
    t.put(put(&[(1, Some("v5b"), Some(5))])).await.unwrap();
    t.put(put(&[(2, Some("null-first"), None)])).await.unwrap();
    assert_eq!(
        changelog(&t).await,
        vec![
            c("+I", 1, Some("v5"), Some(5)),
            c("-U", 1, Some("v5"), Some(5)),
            c("+U", 1, Some("v5b"), Some(5)),
        ]
    );
    assert_eq!(get(&t, &[1, 2]), vec![v(Some("v5b"), Some(5)), None]);
}

async fn aggregation_and_idempotence(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env
        .open(&table(&[
            ("merge_engine", "aggregation"),
            ("aggregation.score", "sum"),
            ("aggregation.name", "listagg(|)"),
        ]))
        .await;
    let mut p = put(&[(1, Some("a"), Some(5))]);
    p.writer_id = 9;
    t.put(p.clone()).await.unwrap();
    // A retry of the same batch is recognised, not summed twice.
    let retry = t.put(p).await.unwrap();
    assert!(retry.duplicated);
    let mut p = put(&[(1, Some("b"), Some(7)), (1, None, None)]);
    p.writer_id = 9;
    p.batch_sequence = 1;
    t.put(p).await.unwrap();
    assert_eq!(get(&t, &[1]), vec![v(Some("a|b"), Some(12))]);
    t.put(delete(&[1])).await.unwrap();
    assert_eq!(
        get(&t, &[1]),
        vec![v(Some("a|b"), Some(12))],
        "aggregation ignores deletes"
    );
}

async fn partial_updates_and_partial_deletes(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[])).await;
    t.put(put(&[(1, Some("a"), Some(10))])).await.unwrap();
    let partial = |rows: &[(i64, Option<i64>)], delete: bool| {
        let batch = RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as _,
            ),
            (
                "score",
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )) as _,
            ),
        ])
        .unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![
                arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
                arrow::datatypes::Field::new("score", arrow::datatypes::DataType::Int64, true),
            ])),
            batch.columns().to_vec(),
        )
        .unwrap();
        PutRequest {
            writer_id: NO_WRITER,
            batch_sequence: 0,
            kafka: None,
            schema_id: 1,
            target_columns: Some(vec!["id".into(), "score".into()]),
            changes: delete.then(|| vec![ChangeType::Delete; rows.len()]),
            batch,
        }
    };
    t.put(partial(&[(1, Some(99)), (2, Some(7))], false))
        .await
        .unwrap();
    assert_eq!(
        get(&t, &[1, 2]),
        vec![v(Some("a"), Some(99)), v(None, Some(7))]
    );
    // Partial delete: score becomes null; row 1 keeps its name, row 2 has nothing left.
    t.put(partial(&[(1, None), (2, None)], true)).await.unwrap();
    assert_eq!(get(&t, &[1, 2]), vec![v(Some("a"), None), None]);
    let log = changelog(&t).await;
    assert_eq!(log.last().unwrap(), &c("-D", 2, None, Some(7)));
}

async fn crash_after_ack_before_flush_recovers_the_acknowledged_state(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    for i in 0..20 {
        t.put(put(&[(i % 7, Some("n"), Some(i))])).await.unwrap();
    }
    t.put(delete(&[3])).await.unwrap();
    let ids: Vec<i64> = (0..7).collect();
    let expected = get(&t, &ids);
    drop(t);
    // A store that never saw a flush (as if the node died right after the acks).
    let empty = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, empty.path()).await;
    assert_eq!(get(&t, &ids), expected);
    // And the original store, reused from its flushed offset.
    let t = env.open(&d).await;
    assert_eq!(get(&t, &ids), expected);
    t.put(put(&[(100, Some("after"), None)])).await.unwrap();
    assert_eq!(get(&t, &[100]), vec![v(Some("after"), None)]);
    let _ = &env.store;
}

/// The prewrite buffer as a write-back cache: durable rows wait in it, ahead of the
/// store, until its bound; a hot key costs one store write however often it changed;
/// a crash loses nothing the buffer held (the replay brings it back).
async fn durable_rows_wait_ahead_of_the_store_until_the_bound(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    assert_eq!(t.store_offset().unwrap(), None);
    t.set_write_back_bytes(1 << 20);
    for i in 0..50 {
        t.put(put(&[
            (1, Some("hot"), Some(i)),
            (100 + i, Some("cold"), None),
        ]))
        .await
        .unwrap();
    }
    t.put(delete(&[100])).await.unwrap();
    // Every Put is acknowledged and visible; the store has none of it.
    assert_eq!(t.store_offset().unwrap(), None);
    let ids: Vec<i64> = [1].into_iter().chain(100..150).collect();
    let expected = get(&t, &ids);
    assert_eq!(expected[0], v(Some("hot"), Some(49)));
    assert_eq!(expected[1], None, "deleted");
    assert_eq!(expected[2], v(Some("cold"), None));
    // A crash here: the reopened tablet replays the whole changelog.
    drop(t);
    let t = env.open(&d).await;
    assert_eq!(get(&t, &ids), expected);
    // A bound of 0 writes the store after every Put.
    t.set_write_back_bytes(0);
    t.put(put(&[(1, Some("hot"), Some(50))])).await.unwrap();
    assert_eq!(t.store_offset().unwrap(), Some(t.log().high_watermark()));
    // A small bound: the store follows, about the bound behind (a version here is
    // ~50 bytes and two offsets, `-U` and `+U`).
    t.set_write_back_bytes(400);
    let mut writes = std::collections::BTreeSet::new();
    for i in 0..20 {
        t.put(put(&[(1, Some("hot"), Some(60 + i))])).await.unwrap();
        let store = t.store_offset().unwrap().unwrap();
        let behind = t.log().high_watermark() - store;
        assert!(behind <= 20, "the store is {behind} offsets behind");
        writes.insert(store);
    }
    assert!(writes.len() >= 2, "the store was written at {writes:?}");
    // A snapshot writes everything first.
    t.set_write_back_bytes(1 << 20);
    t.put(put(&[(2, Some("new"), None)])).await.unwrap();
    assert!(t.store_offset().unwrap() < Some(t.log().high_watermark()));
    let info = t.snapshot().await.unwrap().unwrap();
    assert_eq!(t.store_offset().unwrap(), Some(info.log_offset));
    assert_eq!(info.log_offset, t.log().high_watermark());
    assert_eq!(
        get(&t, &[1, 2]),
        vec![v(Some("hot"), Some(79)), v(Some("new"), None)]
    );
}

/// A store that cannot be written (a full disk) fails neither a durable Put nor its
/// rows: they wait in the buffer, readable, and reach the store once it can be
/// written. Past twice the bound, Puts are refused before they change anything.
async fn a_failing_store_write_fails_no_durable_put(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let failing = Arc::new(StoreFaults::default());
    let t = env.open_failing(&d, &failing).await.unwrap();
    t.set_write_back_bytes(400);
    t.put(put(&[(1, Some("a"), Some(1))])).await.unwrap();
    failing.set(true);
    let store = t.store_offset().unwrap();
    // Under the bound nothing is written; past it the write fails, and the Puts that
    // met it are durable and answered so.
    let mut i = 0;
    let refused = loop {
        match t.put(put(&[(10 + i, Some("b"), Some(i))])).await {
            Ok(_) => i += 1,
            Err(e) => break e,
        }
        assert!(i < 100, "no Put was refused");
    };
    assert!(matches!(refused, MinkError::Unavailable(_)), "{refused}");
    assert!(refused.to_string().contains("No space left"), "{refused}");
    assert!(i >= 3, "only {i} Puts went in before the refusal");
    assert_eq!(t.store_offset().unwrap(), store, "the store took nothing");
    let hw = t.log().high_watermark();
    // The refused Put changed nothing; every acknowledged one reads back.
    assert_eq!(get(&t, &[10 + i]), vec![None]);
    let ids: Vec<i64> = (10..10 + i).collect();
    assert!(get(&t, &ids).iter().all(|r| r.is_some()));
    assert_eq!(t.log().high_watermark(), hw);
    // Once the store can be written, Puts go in again (the tablet tries the store
    // again within a second; a client retries what was refused) and the store
    // catches up.
    failing.set(false);
    t.set_write_back_bytes(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match t.put(put(&[(10 + i, Some("c"), None)])).await {
            Ok(_) => break,
            Err(MinkError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(t.store_offset().unwrap(), Some(t.log().high_watermark()));
    assert_eq!(
        get(&t, &[1, 10 + i]),
        vec![v(Some("a"), Some(1)), v(Some("c"), None)]
    );
    // A crash with rows a failed store write left in the buffer loses nothing either:
    // the tablet does not open while its replay cannot write the store, and once it
    // can, it replays the log.
    failing.set(true);
    t.put(put(&[(1, Some("d"), None)])).await.unwrap();
    assert!(t.store_offset().unwrap() < Some(t.log().high_watermark()));
    drop(t);
    let refused = env
        .open_failing(&d, &failing)
        .await
        .err()
        .expect("opened on a failing store");
    assert!(refused.to_string().contains("No space left"), "{refused}");
    failing.set(false);
    let t = env.open_failing(&d, &failing).await.unwrap();
    assert_eq!(get(&t, &[1]), vec![v(Some("d"), None)]);
    assert!(get(&t, &ids).iter().all(|r| r.is_some()));
}

/// Puts that passed the store check while the buffer had room and then waited for the
/// bucket's put lock are checked again under it: the rows waiting for a failing store
/// stay within twice the bound and one Put, however many Puts were queued.
async fn puts_queued_while_the_store_fails_are_checked_again(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    // The `wal` image keeps no batches: the budget counts the buffer's rows alone.
    let d = table(&[("changelog_image", "wal")]);
    let failing = Arc::new(StoreFaults::default());
    let t = env.open_failing(&d, &failing).await.unwrap();
    let budget = WriteBackBudget::new(u64::MAX);
    t.set_write_back_budget(budget.clone());
    t.set_write_back_bytes(400);
    failing.set(true);
    // Until the buffer is past twice the bound; `one` is what a Put adds to it.
    let (mut i, mut one) = (0, 0);
    loop {
        let before = budget.used();
        match t.put(put(&[(10 + i, Some("b"), Some(i))])).await {
            Ok(_) => one = budget.used() - before,
            Err(MinkError::Unavailable(_)) => break,
            Err(e) => panic!("{e}"),
        }
        i += 1;
        assert!(i < 100, "no Put was refused");
    }
    assert!(one > 4, "a Put added {one} bytes");
    // Room for exactly one more Put.
    let held = budget.used();
    let bound = (held + one / 2).div_ceil(2);
    t.set_write_back_bytes(bound);
    // The first Put stops after its submit, holding the put lock; the others pass the
    // check (the buffer has room) and queue behind it.
    let (pause, first) = hold_in_staging(&t, put(&[(1000, Some("c"), None)])).await;
    let queued: Vec<_> = (0..8)
        .map(|k| {
            let t = t.clone();
            tokio::spawn(async move { t.put(put(&[(2000 + k, Some("d"), None)])).await })
        })
        .collect();
    // On the paused clock a sleep ends once every task is idle: by then each has
    // passed the arrival check and waits for the lock.
    tokio::time::sleep(Duration::from_millis(50)).await;
    pause.release.notify_one();
    first.await.unwrap().unwrap();
    for q in queued {
        let refused = q.await.unwrap().expect_err("a queued Put went in");
        assert!(matches!(refused, MinkError::Unavailable(_)), "{refused}");
    }
    assert!(
        budget.used() <= 2 * bound + one,
        "{} bytes wait for the store, bound {bound}",
        budget.used()
    );
    // The refused Puts changed nothing.
    assert_eq!(get(&t, &[1000]), vec![v(Some("c"), None)]);
    let refused: Vec<i64> = (2000..2008).collect();
    assert!(get(&t, &refused).iter().all(|r| r.is_none()));
}

/// Starts `req` on `t` and returns once it is held between its submit and its
/// staging (`pause_next_staging`), with the pause to release it and the Put's task.
async fn hold_in_staging(
    t: &KvTablet,
    req: PutRequest,
) -> (
    Arc<mink_kv::StagingPause>,
    tokio::task::JoinHandle<mink_types::Result<mink_log::Appended>>,
) {
    let pause = t.pause_next_staging();
    let held = tokio::spawn({
        let t = t.clone();
        async move { t.put(req).await }
    });
    pause.reached.notified().await;
    (pause, held)
}

/// A failing store is tried once per retry interval, not once per caller: flushes
/// queued behind the one that tries (here eight releases, held behind a Put in its
/// staging window) answer its error without writing.
async fn a_failing_store_is_tried_once_per_interval_not_once_per_caller(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let failing = Arc::new(StoreFaults::default());
    let t = env.open_failing(&d, &failing).await.unwrap();
    t.set_write_back_bytes(400);
    failing.set(true);
    let mut i = 0;
    while failing.refused() == 0 {
        t.put(put(&[(10 + i, Some("b"), Some(i))])).await.unwrap();
        i += 1;
        assert!(i < 100, "no store write was tried");
    }
    // Room in the buffer: Puts go in, and only the releases below flush.
    t.set_write_back_bytes(1 << 20);
    tokio::time::advance(Duration::from_millis(1_100)).await;
    let (pause, held) = hold_in_staging(&t, put(&[(1000, Some("c"), None)])).await;
    let releases: Vec<_> = (0..8)
        .map(|_| {
            let t = t.clone();
            tokio::spawn(async move { t.release_write_back().await })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let before = failing.refused();
    pause.release.notify_one();
    held.await.unwrap().unwrap();
    for r in releases {
        let e = r
            .await
            .unwrap()
            .expect_err("a release wrote a failing store");
        assert!(e.to_string().contains("No space left"), "{e}");
    }
    assert_eq!(failing.refused() - before, 1, "store writes tried");
    // A second later it is tried again, and once it can be written it is.
    failing.set(false);
    tokio::time::advance(Duration::from_millis(1_100)).await;
    t.release_write_back().await.unwrap();
    assert_eq!(t.store_offset().unwrap(), Some(t.log().high_watermark()));
}

/// The local store's disk fills up under a tablet (a real full disk, the kernel's
/// ENOSPC): no acknowledged Put is lost, Puts are turned away while the store cannot
/// be written, and once the disk has room the bucket takes Puts again without a
/// restart. On fjall the failed journal write poisons the database for good: the
/// store closes that generation, the tablet fails, and the reopened tablet (what the
/// node does on the next request) reopens the store in place.
async fn a_full_disk_under_the_store_loses_nothing_and_the_store_recovers(backend: KvBackend) {
    let Some(disk) = SmallDisk::mount(8 << 20) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs CAP_SYS_ADMIN)");
        return;
    };
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let kv = mink_kv::open_kv_store(backend, &disk.path().join("kv")).unwrap();
    let mut t = env.open_on(&d, &kv).await.unwrap();
    t.set_write_back_bytes(0);
    // A second bucket on the same store, which only answers lookups from the store.
    let bucket2 = TableBucket {
        table_id: 2,
        partition_id: None,
        bucket: 0,
    };
    let node = env.node.clone();
    let open_second = |epoch| {
        let node = node.clone();
        let (kv, d) = (kv.clone(), d.clone());
        async move {
            let stream = node.open_stream("t2-b0", epoch).await.unwrap();
            let schemas = vec![d.schema.clone()];
            let log = LogTablet::open(bucket2, stream, true, schemas.clone(), LogConfig::default())
                .await
                .unwrap();
            KvTablet::open(bucket2, log, kv.namespace("t2-b0")?, d, schemas, None).await
        }
    };
    let u = open_second(1).await.unwrap();
    u.set_write_back_bytes(0);
    u.put(put(&[(1, Some("u"), Some(1))])).await.unwrap();
    u.release_write_back().await.unwrap();
    let value = "v".repeat(2_000);
    let mut acked = Vec::new();
    for i in 0..5 {
        t.put(put(&[(i, Some(&value), Some(i))])).await.unwrap();
        acked.push(i);
    }
    let filler = disk.fill();
    // Puts until the store's failure has turned some away, the store retried in
    // between.
    let mut errors = Vec::new();
    let mut i = 5;
    while errors.len() < 4 {
        match t.put(put(&[(i, Some(&value), Some(i))])).await {
            Ok(_) => acked.push(i),
            Err(e) => {
                errors.push(e.to_string());
                tokio::time::advance(Duration::from_millis(1_100)).await;
            }
        }
        i += 1;
        assert!(i < 2_000, "the full disk never turned a Put away");
    }
    assert!(
        errors
            .iter()
            .all(|e| e.contains("No space left") || e.contains("poisoned")),
        "{errors:?}"
    );
    if backend == KvBackend::Fjall {
        assert!(
            t.failure().is_some(),
            "fjall poisoned and the tablet carried on"
        );
        // The other bucket's lookup meets the closed store: answered `Unavailable`,
        // and its tablet fails, to be reopened.
        let keys =
            RecordBatch::try_from_iter(vec![("id", Arc::new(Int64Array::from(vec![1])) as _)])
                .unwrap();
        let refused = u.lookup(&keys).expect_err("a lookup on the closed store");
        assert!(matches!(refused, MinkError::Unavailable(_)), "{refused}");
        assert!(
            u.failure().is_some(),
            "a tablet read the closed store and carried on"
        );
    }
    // The disk gets room again: the bucket takes Puts without a restart, its tablet
    // reopened from the log when it failed (as the node reopens a failed tablet).
    std::fs::remove_file(filler).unwrap();
    tokio::time::advance(Duration::from_millis(1_100)).await;
    let mut attempts = 0;
    loop {
        if t.failure().is_some() {
            t = env.open_on(&d, &kv).await.unwrap();
        }
        match t.put(put(&[(i, Some("after"), Some(i))])).await {
            Ok(_) => break,
            Err(e) => errors.push(e.to_string()),
        }
        attempts += 1;
        assert!(
            attempts < 10,
            "no Put went in after the disk had room: {errors:?}"
        );
        tokio::time::advance(Duration::from_millis(1_100)).await;
    }
    let found = get(&t, &acked);
    for (id, row) in acked.iter().zip(found) {
        assert_eq!(row, v(Some(&value), Some(*id)), "key {id}");
    }
    assert_eq!(get(&t, &[i]), vec![v(Some("after"), Some(i))]);
    t.release_write_back().await.unwrap();
    assert_eq!(t.store_offset().unwrap(), Some(t.log().high_watermark()));
    let u = match u.failure() {
        Some(_) => open_second(2).await.unwrap(),
        None => u,
    };
    assert_eq!(get(&u, &[1]), vec![v(Some("u"), Some(1))]);
}

/// While the store fails and new Puts are refused, the retry of an acknowledged Put is
/// still answered as the duplicate it is (with its offsets), not refused.
async fn a_retry_of_an_acknowledged_put_is_a_duplicate_while_the_store_fails(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[("changelog_image", "wal")]);
    let failing = Arc::new(StoreFaults::default());
    let t = env.open_failing(&d, &failing).await.unwrap();
    t.set_write_back_bytes(400);
    let mut acked = put(&[(1, Some("a"), Some(1))]);
    acked.writer_id = 9;
    let first = t.put(acked.clone()).await.unwrap();
    failing.set(true);
    let mut i = 0;
    loop {
        match t.put(put(&[(10 + i, Some("b"), Some(i))])).await {
            Ok(_) => {}
            Err(MinkError::Unavailable(_)) => break,
            Err(e) => panic!("{e}"),
        }
        i += 1;
        assert!(i < 100, "no Put was refused");
    }
    let again = t
        .put(acked)
        .await
        .expect("the retry of an acknowledged Put");
    assert!(again.duplicated);
    assert_eq!(
        (again.first_offset, again.last_offset),
        (first.first_offset, first.last_offset)
    );
    // New Puts are still refused.
    let mut next = put(&[(2, Some("c"), Some(2))]);
    next.writer_id = 9;
    next.batch_sequence = 1;
    assert!(matches!(
        t.put(next).await.unwrap_err(),
        MinkError::Unavailable(_)
    ));
}

/// An idle bucket gives its write-back rows up while the node's buffers are past their
/// bound, so that a busy bucket keeps its cache instead of writing its store after
/// every Put until the idle one's next snapshot.
async fn an_idle_bucket_gives_its_write_back_rows_up_to_a_busy_one(backend: KvBackend) {
    idle_bucket_gives_its_rows_up(backend, true).await;
}

/// The same without a snapshot store: the idle check goes on after the first time a
/// snapshot was due (and could not be written).
async fn an_idle_bucket_without_snapshots_gives_its_rows_up_too(backend: KvBackend) {
    idle_bucket_gives_its_rows_up(backend, false).await;
}

async fn idle_bucket_gives_its_rows_up(backend: KvBackend, snapshots: bool) {
    const BOUND: u64 = 6_000;
    let mut idle_env = Env::new(backend).await;
    idle_env.snapshots = snapshots;
    let mut busy_env = Env::new(backend).await;
    let d = table(&[]);
    let budget = WriteBackBudget::new(BOUND);
    let idle = idle_env.open(&d).await;
    let busy = busy_env.open(&d).await;
    for t in [&idle, &busy] {
        t.set_write_back_bytes(1 << 20);
        t.set_write_back_budget(budget.clone());
    }
    // The idle bucket fills most of the node's bound.
    let mut n = 0;
    while budget.used() < BOUND * 2 / 3 {
        idle.put(put(&[(n, Some("idle"), Some(n))])).await.unwrap();
        n += 1;
    }
    assert!(budget.used() <= BOUND, "{} held", budget.used());
    let idle_rows: Vec<i64> = (0..n).collect();
    // The busy bucket's Puts push the node past it: each writes the store and lets its
    // rows go, while the idle bucket keeps its own. A busy Put's rows take about half
    // the node's bound (a row holds ~130 bytes of the buffer): alone, they fit.
    let busy_rows = (BOUND / 260) as i64;
    let busy_put = |round: i64| {
        put(&(0..busy_rows)
            .map(|i| (1000 + i, Some("busy"), Some(round)))
            .collect::<Vec<_>>())
    };
    for round in 0..3 {
        busy.put(busy_put(round)).await.unwrap();
        assert_eq!(
            busy.store_offset().unwrap(),
            Some(busy.log().high_watermark())
        );
    }
    // Left idle while the busy bucket goes on, the idle bucket gives its rows up (to
    // its store) within its checks.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = {
        let idle = idle.clone();
        tokio::spawn(async move {
            // With a snapshot store none is due during the test (a snapshot would let
            // the rows go too); without one, one is due at once.
            let interval = if snapshots { 3_600_000 } else { 10 };
            idle.run_snapshots(Duration::from_millis(interval), |_| {}, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    if !snapshots {
        // Its first check, with no pressure since it started, lets nothing go, and
        // meets a snapshot due that cannot be written; the checks after it must go on.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut round = 3;
    while idle.store_offset().unwrap() != Some(idle.log().high_watermark()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle bucket still holds {} bytes",
            budget.used()
        );
        busy.put(busy_put(round)).await.unwrap();
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Now the busy bucket's rows stay in its buffer, and every row reads back.
    let before = busy.store_offset().unwrap();
    busy.put(busy_put(round)).await.unwrap();
    assert_eq!(
        busy.store_offset().unwrap(),
        before,
        "the busy bucket wrote its store"
    );
    assert!(budget.used() > 0);
    assert!(
        get(&idle, &idle_rows)
            .iter()
            .enumerate()
            .all(|(i, r)| *r == v(Some("idle"), Some(i as i64)))
    );
    assert_eq!(get(&busy, &[1000]), vec![v(Some("busy"), Some(round))]);
    let _ = stop.send(());
    runner.await.unwrap();
}

async fn schema_evolution_reads_old_rows_with_nulls(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(1))])).await.unwrap();
    let v2 = d
        .schema
        .with_added_columns(&[Column::new("flag", DataType::Boolean, true)])
        .unwrap();
    let d2 = TableDescriptor {
        schema: v2.clone(),
        ..d.clone()
    };
    t.update_table(d2, vec![d.schema.clone(), v2.clone()])
        .unwrap();
    let keys =
        RecordBatch::try_from_iter(vec![("id", Arc::new(Int64Array::from(vec![1])) as _)]).unwrap();
    let found = t.lookup(&keys).unwrap();
    assert_eq!(found.batch.num_columns(), 4);
    assert!(found.batch.column(3).is_null(0));
    // Old schema id is refused after the change; new rows use schema 2.
    assert!(matches!(
        t.put(put(&[(2, None, None)])).await.unwrap_err(),
        MinkError::SchemaMismatch(_)
    ));
    // The same row under schema 2 (the added column null) is no change, although its
    // stored bytes (under schema 1) differ from the new ones.
    let hw = t.log().high_watermark();
    let same = RecordBatch::try_new(
        v2.to_arrow(),
        vec![
            Arc::new(Int64Array::from(vec![1])),
            Arc::new(StringArray::from(vec![Some("a")])),
            Arc::new(Int64Array::from(vec![Some(1)])),
            Arc::new(BooleanArray::from(vec![None::<bool>])),
        ],
    )
    .unwrap();
    t.put(PutRequest {
        schema_id: 2,
        batch: same,
        ..put(&[])
    })
    .await
    .unwrap();
    assert_eq!(
        t.log().high_watermark(),
        hw + 1,
        "a sequence marker, no changelog, for an unchanged row"
    );
    assert!(
        t.log().scan(hw, 1 << 20).await.unwrap().batches.is_empty(),
        "no changelog rows for an unchanged row"
    );
    let b2 = RecordBatch::try_new(
        v2.to_arrow(),
        vec![
            Arc::new(Int64Array::from(vec![1])),
            Arc::new(StringArray::from(vec![Some("a")])),
            Arc::new(Int64Array::from(vec![Some(2)])),
            Arc::new(BooleanArray::from(vec![Some(true)])),
        ],
    )
    .unwrap();
    t.put(PutRequest {
        schema_id: 2,
        batch: b2,
        ..put(&[])
    })
    .await
    .unwrap();
    let found = t.lookup(&keys).unwrap();
    assert!(
        found
            .batch
            .column(3)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .unwrap()
            .value(0)
    );
}

async fn bad_input_is_rejected_and_changes_nothing(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[("merge_engine", "first_row")])).await;
    let hw = t.log().high_watermark();
    let mut wrong_id = put(&[(1, None, None)]);
    wrong_id.schema_id = 7;
    assert!(
        t.put(wrong_id)
            .await
            .unwrap_err()
            .to_string()
            .contains("no schema 7")
    );
    let mut partial = put(&[(1, None, None)]);
    partial.target_columns = Some(vec!["id".into(), "name".into(), "score".into()]);
    assert!(
        t.put(partial)
            .await
            .unwrap_err()
            .to_string()
            .contains("first_row merge engine does not take partial updates")
    );
    let nulls = RecordBatch::try_new(
        Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, true),
            arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, true),
            arrow::datatypes::Field::new("score", arrow::datatypes::DataType::Int64, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![None::<i64>])),
            Arc::new(StringArray::from(vec![None::<&str>])),
            Arc::new(Int64Array::from(vec![None::<i64>])),
        ],
    )
    .unwrap();
    let err = t
        .put(PutRequest {
            batch: nulls,
            ..put(&[])
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("NOT NULL"), "{err}");
    assert_eq!(t.log().high_watermark(), hw);

    let mut env = Env::new(backend).await;
    let t = env.open(&table(&[])).await;
    let mut no_key = put(&[(1, None, None)]);
    no_key.target_columns = Some(vec!["name".into()]);
    assert!(
        t.put(no_key)
            .await
            .unwrap_err()
            .to_string()
            .contains("every primary-key column")
    );
    let mut mismatch = put(&[(1, None, None)]);
    mismatch.changes = Some(vec![]);
    assert!(
        t.put(mismatch)
            .await
            .unwrap_err()
            .to_string()
            .contains("0 change types for 1 rows")
    );
    let d = table(&[("delete_behavior", "disable")]);
    let mut env = Env::new(backend).await;
    let t = env.open(&d).await;
    assert!(
        t.put(delete(&[1]))
            .await
            .unwrap_err()
            .to_string()
            .contains("deletes are disabled")
    );
}

async fn snapshots_plus_replay_equal_the_live_state(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    for i in 0..30 {
        t.put(put(&[(i % 11, Some("s"), Some(i))])).await.unwrap();
    }
    let first = t.snapshot().await.unwrap().unwrap();
    assert_eq!(first.rows, 11);
    assert_eq!(first.log_offset, t.log().high_watermark());
    // The snapshot reads back as Arrow rows of the table.
    let batches = env.snapshots().read(first.log_offset).await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 11);
    // Writes after the snapshot are replayed from its offset.
    t.put(put(&[(50, Some("late"), Some(1))])).await.unwrap();
    t.put(delete(&[0])).await.unwrap();
    for _ in 0..2 {
        t.snapshot().await.unwrap();
    }
    assert_eq!(
        env.snapshots().list().await.unwrap().len(),
        2,
        "two retained"
    );
    let newest = *env.snapshots().list().await.unwrap().last().unwrap();
    // Writes after the newest snapshot come from the changelog.
    t.put(put(&[(60, Some("after"), Some(6))])).await.unwrap();
    t.put(put(&[(1, Some("changed"), None)])).await.unwrap();
    let ids: Vec<i64> = (0..11).chain([50, 60]).collect();
    let live = get(&t, &ids);
    // The changelog below the snapshot goes away.
    env.node.compact().await.unwrap();
    assert_eq!(t.log().trim_before(newest).await.unwrap(), newest);
    drop(t);
    // A fresh node: an empty store must start from the snapshot.
    let fresh = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, fresh.path()).await;
    assert_eq!(get(&t, &ids), live);
}

/// A table whose compression changes between snapshots: an uncompressed snapshot,
/// changelog batches of every codec, a zstd snapshot, then lz4 writes; a fresh node
/// restores the state from the newest snapshot plus the changelog since, and the
/// changelog reads the same as it was written.
async fn compressed_and_mixed_snapshots_and_changelogs_restore(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.log().set_compression(Compression::None);
    for i in 0..20 {
        t.put(put(&[(i % 7, Some("plain"), Some(i))]))
            .await
            .unwrap();
    }
    let plain = t.snapshot().await.unwrap().unwrap();
    t.log().set_compression(Compression::Zstd);
    for i in 0..20 {
        t.put(put(&[(i % 9, Some("zstd"), Some(i))])).await.unwrap();
    }
    let zstd = t.snapshot().await.unwrap().unwrap();
    assert!(zstd.log_offset > plain.log_offset);
    t.log().set_compression(Compression::Lz4);
    t.put(put(&[(40, Some("lz4"), Some(1))])).await.unwrap();
    t.put(delete(&[0])).await.unwrap();
    let ids: Vec<i64> = (0..9).chain([40]).collect();
    let live = get(&t, &ids);
    let written = changelog(&t).await;
    // Both snapshots read back, each in its own codec.
    for s in [plain.log_offset, zstd.log_offset] {
        let rows: usize = env
            .snapshots()
            .read(s)
            .await
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert!(rows > 0);
    }
    env.trim_to(&t, zstd.log_offset).await;
    drop(t);
    let fresh = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, fresh.path()).await;
    assert_eq!(get(&t, &ids), live);
    let after: Vec<Change> = changelog(&t).await;
    assert_eq!(after[..], written[written.len() - after.len()..]);
}

/// A snapshot is uploaded as it is encoded: past one part it goes up as a multipart
/// upload of parts, and loads back the same. A part that fails fails the snapshot and
/// leaves no object behind; the next snapshot lands.
async fn a_snapshot_larger_than_a_part_goes_up_in_parts(backend: KvBackend) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    let mut env = Env::on(Arc::new(faulty.clone()), backend).await;
    env.part_bytes = 4096;
    let d = table(&[]);
    let t = env.open(&d).await;
    let name = "x".repeat(40);
    for chunk in 0..20 {
        let rows: Vec<(i64, Option<&str>, Option<i64>)> = (0..1_000)
            .map(|i| (chunk * 1_000 + i, Some(name.as_str()), Some(i)))
            .collect();
        t.put(put(&rows)).await.unwrap();
    }
    // The first part fails: no snapshot, no object.
    faulty.fail_next_puts(1);
    t.snapshot()
        .await
        .expect_err("a snapshot whose first part fails");
    assert_eq!(env.snapshots().list().await.unwrap(), Vec::<i64>::new());
    let before = faulty
        .counters()
        .puts
        .load(std::sync::atomic::Ordering::Relaxed);
    let snap = t.snapshot().await.unwrap().unwrap();
    let puts = faulty
        .counters()
        .puts
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    assert_eq!(snap.rows, 20_000);
    assert!(
        snap.bytes > 20 * 4096 && puts >= snap.bytes / 4096,
        "{} bytes went up in {puts} requests",
        snap.bytes
    );
    // Read back in ranged GETs of a part each.
    let gets = faulty
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::Relaxed);
    let read = env.snapshots().read(snap.log_offset).await.unwrap();
    let gets = faulty
        .counters()
        .gets
        .load(std::sync::atomic::Ordering::Relaxed)
        - gets;
    assert_eq!(read.iter().map(|b| b.num_rows()).sum::<usize>(), 20_000);
    assert!(read.len() >= 3, "{} batches", read.len());
    assert!(
        gets >= snap.bytes / 4096,
        "{} bytes read in {gets} GETs",
        snap.bytes
    );
    // A fresh node loads it, batch by batch, with nothing left to replay.
    t.put(put(&[(7, Some("after"), Some(-7))])).await.unwrap();
    let ids: Vec<i64> = (0..20_000).step_by(997).chain([7, 19_999]).collect();
    let live = get(&t, &ids);
    env.trim_to(&t, snap.log_offset).await;
    drop(t);
    let fresh = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, fresh.path()).await;
    assert_eq!(get(&t, &ids), live);
}

/// A snapshot's batches end at 8 MiB of stored rows as well as at 8,192 rows: wide
/// rows do not make one batch of the whole state.
async fn a_snapshot_of_wide_rows_is_cut_into_batches_by_bytes(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    let wide = "w".repeat(1 << 20);
    for i in 0..12 {
        t.put(put(&[(i, Some(&wide), Some(i))])).await.unwrap();
    }
    let snap = t.snapshot().await.unwrap().unwrap();
    assert_eq!(snap.rows, 12);
    let batches = env.snapshots().read(snap.log_offset).await.unwrap();
    let rows: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    assert_eq!(rows.iter().sum::<usize>(), 12);
    assert!(rows.len() >= 2 && rows.iter().all(|&n| n <= 8), "{rows:?}");
}

/// A snapshot object cut short at a message boundary (its end-of-stream marker gone)
/// is refused, not read as a smaller state.
async fn a_snapshot_cut_short_is_refused(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    for i in 0..10 {
        t.put(put(&[(i, Some("v"), Some(i))])).await.unwrap();
    }
    let snap = t.snapshot().await.unwrap().unwrap();
    let path = object_store::path::Path::from(snap.location.as_str());
    let whole = object_store::ObjectStoreExt::get(env.store.as_ref(), &path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let cut = whole.slice(..whole.len() - 8);
    object_store::ObjectStoreExt::put(env.store.as_ref(), &path, cut.into())
        .await
        .unwrap();
    let err = env
        .snapshots()
        .read(snap.log_offset)
        .await
        .expect_err("a snapshot without its end");
    assert!(err.to_string().contains("end-of-stream"), "{err}");
}

/// The changelog is the only copy of every row no durable snapshot holds: a trim above
/// the newest snapshot is held back, and a TTL trim writes a snapshot first, so a
/// fresh node (no local store) finds every acknowledged row.
async fn a_trim_never_passes_the_newest_snapshot(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    for i in 0..20 {
        t.put(put(&[(i % 7, Some("v"), Some(i))])).await.unwrap();
    }
    let ids: Vec<i64> = (0..7).collect();
    let live = get(&t, &ids);
    env.node.compact().await.unwrap();
    let hw = t.log().high_watermark();
    // No snapshot yet: nothing may go.
    assert_eq!(t.log().trim_before(hw).await.unwrap(), 0);
    drop(t);
    let fresh = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, fresh.path()).await;
    assert_eq!(get(&t, &ids), live, "a fresh open after a refused trim");

    // A TTL that expires everything: a snapshot is written, then the log trimmed to it.
    t.put(put(&[(100, Some("late"), Some(1))])).await.unwrap();
    env.node.compact().await.unwrap();
    let start = t
        .trim_expired_below(Duration::ZERO, None, |_| {})
        .await
        .unwrap();
    let snapshots = env.snapshots().list().await.unwrap();
    let hw = t.log().high_watermark();
    assert_eq!(snapshots, vec![hw], "a snapshot was written for the trim");
    assert!(
        start > 0 && start <= hw,
        "trimmed to {start}, up to the snapshot"
    );
    // Rows written later stay until a snapshot covers them.
    t.put(put(&[(101, Some("later"), Some(2))])).await.unwrap();
    env.node.compact().await.unwrap();
    assert_eq!(t.log().trim_before(i64::MAX).await.unwrap(), hw);
    let ids: Vec<i64> = (0..7).chain([100, 101]).collect();
    let live = get(&t, &ids);
    drop(t);
    let fresh = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, fresh.path()).await;
    assert_eq!(get(&t, &ids), live, "a fresh open after a TTL trim");
}

/// Retention keeps the newest snapshots by offset, and never the one just written: its
/// writer lets the log be trimmed up to it.
async fn retention_never_deletes_the_snapshot_just_written(backend: KvBackend) {
    let env = Env::new(backend).await;
    let store = env.snapshots();
    let schema = schema();
    for offset in [20, 30, 5] {
        store
            .write(&schema, offset, &[], mink_types::Compression::Zstd)
            .await
            .unwrap();
    }
    assert_eq!(store.list().await.unwrap(), vec![5, 20, 30]);
    store
        .write(&schema, 40, &[], mink_types::Compression::None)
        .await
        .unwrap();
    assert_eq!(store.list().await.unwrap(), vec![30, 40]);
}

/// A changelog trimmed with no snapshot covering what went (by a version without the
/// trim ceiling, or by hand) does not open as a bucket that silently lacks rows.
async fn a_changelog_trimmed_past_every_snapshot_fails_the_open_loudly(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    for i in 0..10 {
        t.put(put(&[(i, Some("v"), Some(i))])).await.unwrap();
    }
    let hw = t.log().high_watermark();
    drop(t);
    // Trim the stream itself, below the tablet.
    env.epoch += 1;
    let stream = env.node.open_stream("t1-b0", env.epoch).await.unwrap();
    env.node.compact().await.unwrap();
    assert_eq!(stream.trim(hw as u64).await.unwrap(), hw as u64);
    drop(stream);
    let fresh = tempfile::tempdir().unwrap();
    let err = env
        .open_versions(&d, std::slice::from_ref(&d.schema), fresh.path())
        .await
        .err()
        .expect("a fresh open of a trimmed changelog without a snapshot");
    assert!(
        matches!(&err, MinkError::Internal(m) if m.contains("no KV snapshot covers")),
        "{err}"
    );
}

/// Readers get the newest snapshot while it is younger than their bound; a new one is
/// written only when none is, and a freshly opened tablet finds the one in the store.
async fn recent_snapshots_are_reused_until_too_old(backend: KvBackend) {
    const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(1)), (2, Some("b"), Some(2))]))
        .await
        .unwrap();
    let first = t.recent_snapshot(HOUR).await.unwrap().unwrap();
    assert_eq!(
        (first.rows, first.log_offset),
        (2, 2),
        "none existed: written"
    );
    t.put(put(&[(3, Some("c"), Some(3))])).await.unwrap();
    let again = t.recent_snapshot(HOUR).await.unwrap().unwrap();
    assert_eq!(
        again, first,
        "recent enough: the same snapshot, not a new one"
    );
    assert_eq!(env.snapshots().list().await.unwrap(), vec![2]);

    // Too old for the bound: a new one covers the later write.
    let renewed = t
        .recent_snapshot(std::time::Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((renewed.rows, renewed.log_offset), (3, 3));
    assert!(renewed.written_at_ms >= first.written_at_ms);
    assert_eq!(env.snapshots().list().await.unwrap(), vec![2, 3]);
    drop(t);

    // A tablet opened afresh (a new leader) finds the newest one in the store.
    let t = env.open(&d).await;
    let found = t.recent_snapshot(HOUR).await.unwrap().unwrap();
    assert_eq!((found.rows, found.log_offset), (3, 3));
    assert_eq!(found.location, renewed.location);
    assert_eq!(env.snapshots().list().await.unwrap(), vec![2, 3]);
    drop(t);

    // One found too old is replaced without being read (here it could not be).
    let path = object_store::path::Path::from(found.location.as_str());
    object_store::ObjectStoreExt::put(env.store.as_ref(), &path, b"not arrow".to_vec().into())
        .await
        .unwrap();
    let t = env.open(&d).await;
    let replaced = t
        .recent_snapshot(std::time::Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((replaced.rows, replaced.log_offset), (3, 3));
}

async fn a_snapshot_from_before_add_column_loads_with_nulls(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(10)), (2, Some("b"), None)]))
        .await
        .unwrap();
    let snap = t.snapshot().await.unwrap().unwrap();
    assert_eq!(snap.rows, 2);
    // ALTER TABLE ADD COLUMN flag.
    let v2 = d
        .schema
        .with_added_columns(&[Column::new("flag", DataType::Boolean, true)])
        .unwrap();
    let d2 = TableDescriptor {
        schema: v2.clone(),
        ..d.clone()
    };
    let versions = [d.schema.clone(), v2.clone()];
    t.update_table(d2.clone(), versions.to_vec()).unwrap();
    let v2_rows = |rows: &[(i64, &str, Option<bool>)]| PutRequest {
        schema_id: 2,
        batch: RecordBatch::try_new(
            v2.to_arrow(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from(vec![None::<i64>; rows.len()])),
                Arc::new(BooleanArray::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap(),
        ..put(&[])
    };
    t.put(v2_rows(&[(3, "c", Some(true))])).await.unwrap();
    // Only the snapshot holds rows 1 and 2 once the log below it is gone.
    env.trim_to(&t, snap.log_offset).await;
    drop(t);

    // A node with an empty local store opens the bucket after the ALTER.
    let fresh = tempfile::tempdir().unwrap();
    let t = env
        .open_versions(&d2, &versions, fresh.path())
        .await
        .expect("a snapshot written before ADD COLUMN loads under the new schema");
    let flags = |t: &KvTablet, ids: &[i64]| {
        let keys =
            RecordBatch::try_from_iter(vec![("id", Arc::new(Int64Array::from(ids.to_vec())) as _)])
                .unwrap();
        let found = t.lookup(&keys).unwrap();
        assert_eq!(found.batch.num_columns(), 4);
        let names = found.batch.column(1).as_string::<i32>();
        let flags = found.batch.column(3).as_boolean();
        let mut out = vec![None; ids.len()];
        for (row, key) in found.key_index.iter().enumerate() {
            out[*key as usize] = Some((
                names.value(row).to_string(),
                (!flags.is_null(row)).then(|| flags.value(row)),
            ));
        }
        out
    };
    assert_eq!(
        flags(&t, &[1, 2, 3]),
        vec![
            Some(("a".to_string(), None)),
            Some(("b".to_string(), None)),
            Some(("c".to_string(), Some(true))),
        ]
    );
    assert_eq!(
        get(&t, &[1, 2]),
        vec![v(Some("a"), Some(10)), v(Some("b"), None)]
    );
    // New writes merge over the rows loaded from the snapshot.
    t.put(v2_rows(&[(1, "a2", Some(false)), (4, "d", None)]))
        .await
        .unwrap();
    assert_eq!(
        flags(&t, &[1, 4]),
        vec![
            Some(("a2".to_string(), Some(false))),
            Some(("d".to_string(), None))
        ]
    );
    // A snapshot written now is under schema 2 and loads as well.
    t.snapshot().await.unwrap().unwrap();
    drop(t);
    let fresh = tempfile::tempdir().unwrap();
    let t = env
        .open_versions(&d2, &versions, fresh.path())
        .await
        .unwrap();
    assert_eq!(
        flags(&t, &[1, 2, 3, 4]),
        vec![
            Some(("a2".to_string(), Some(false))),
            Some(("b".to_string(), None)),
            Some(("c".to_string(), Some(true))),
            Some(("d".to_string(), None)),
        ]
    );
}

async fn a_snapshot_without_a_schema_id_loads_by_its_columns(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(10))])).await.unwrap();
    let snap = t.snapshot().await.unwrap().unwrap();
    // Rewrite it as snapshots were written before they recorded their schema id.
    let batches = env.snapshots().read(snap.log_offset).await.unwrap();
    let mut legacy = Vec::new();
    {
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new(&mut legacy, &d.schema.to_arrow()).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
    }
    let path = object_store::path::Path::from(snap.location.as_str());
    object_store::ObjectStoreExt::put(env.store.as_ref(), &path, legacy.into())
        .await
        .unwrap();
    assert_eq!(
        env.snapshots()
            .read_data(snap.log_offset)
            .await
            .unwrap()
            .schema_id,
        None
    );
    let v2 = d
        .schema
        .with_added_columns(&[Column::new("flag", DataType::Boolean, true)])
        .unwrap();
    let d2 = TableDescriptor {
        schema: v2.clone(),
        ..d.clone()
    };
    let versions = [d.schema.clone(), v2];
    t.update_table(d2.clone(), versions.to_vec()).unwrap();
    env.node.compact().await.unwrap();
    t.log().trim_before(snap.log_offset).await.unwrap();
    drop(t);
    let fresh = tempfile::tempdir().unwrap();
    let t = env
        .open_versions(&d2, &versions, fresh.path())
        .await
        .unwrap();
    assert_eq!(get(&t, &[1]), vec![v(Some("a"), Some(10))]);
    let keys =
        RecordBatch::try_from_iter(vec![("id", Arc::new(Int64Array::from(vec![1])) as _)]).unwrap();
    assert!(t.lookup(&keys).unwrap().batch.column(3).is_null(0));
}

async fn prefix_lookups_use_the_leading_key_columns(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let two_keys = Schema::new(
        1,
        vec![
            Column::new("user", DataType::String, false),
            Column::new("item", DataType::BigInt, false),
            Column::new("qty", DataType::BigInt, true),
        ],
    );
    let d = TableDescriptor {
        primary_key: vec!["user".into(), "item".into()],
        bucket_keys: Some(vec!["user".into()]),
        ..TableDescriptor::log_table(two_keys.clone())
    };
    d.validate().unwrap();
    env.epoch += 1;
    let stream = env.node.open_stream("t1-b0", env.epoch).await.unwrap();
    let log = LogTablet::open(
        BUCKET,
        stream,
        true,
        vec![two_keys.clone()],
        LogConfig::default(),
    )
    .await
    .unwrap();
    let kv = open_kv_store(backend, env.dir.path()).unwrap();
    let t = KvTablet::open(
        BUCKET,
        log,
        kv.namespace("t1-b0").unwrap(),
        d,
        vec![two_keys.clone()],
        None,
    )
    .await
    .unwrap();
    let rows = |users: &[&str], items: &[i64]| {
        RecordBatch::try_new(
            two_keys.to_arrow(),
            vec![
                Arc::new(StringArray::from(users.to_vec())),
                Arc::new(Int64Array::from(items.to_vec())),
                Arc::new(Int64Array::from(items.to_vec())),
            ],
        )
        .unwrap()
    };
    t.put(PutRequest {
        batch: rows(&["ann", "bob", "ann", "annie"], &[2, 1, 1, 9]),
        ..put(&[])
    })
    .await
    .unwrap();
    let mut prefix = Vec::new();
    mink_types::encode_values(
        &[DataType::String],
        &[mink_types::KeyValue::String("ann".into())],
        &mut prefix,
    )
    .unwrap();
    let found = t.prefix_lookup(&prefix, 100).unwrap();
    let items = found
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(
        items.values().to_vec(),
        vec![1, 2],
        "ann's rows in key order, not annie's"
    );
    assert_eq!(t.prefix_lookup(&prefix, 1).unwrap().num_rows(), 1);
}

/// How long a held WAL upload takes (paused time): long enough that a Put issued
/// meanwhile merges over rows staged by one that is not yet durable.
const WAL_UPLOAD_HELD: Duration = Duration::from_secs(10);

/// An environment on a fault-injecting store; WAL uploads are held once
/// [`hold_wal_uploads`] is called.
async fn faulty_env(backend: KvBackend) -> (Env, FaultyStore) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    let env = Env::on(Arc::new(faulty.clone()), backend).await;
    (env, faulty)
}

fn hold_wal_uploads(faulty: &FaultyStore) {
    faulty.set_put_delay(Some(Arc::new(|path: &object_store::path::Path| {
        path.as_ref().starts_with("wal/").then_some(WAL_UPLOAD_HELD)
    })));
}

fn spawn_put(
    t: &KvTablet,
    req: PutRequest,
) -> tokio::task::JoinHandle<(mink_types::Result<mink_log::Appended>, tokio::time::Instant)> {
    let t = t.clone();
    tokio::spawn(async move {
        let result = t.put(req).await;
        (result, tokio::time::Instant::now())
    })
}

/// A Put that changes nothing is logged as a sequence marker (one offset, no rows), so
/// its writer's sequence is as durable as any batch's. After the tablet is reopened
/// (windows rebuilt from the log) the writer goes on after it, and a stale attempt of
/// it that arrives late (parked in some node's admission while the client's retry was
/// acknowledged, then released at the next leader) is a duplicate: it is not merged
/// again over what another writer wrote since. Readers step over the marker: scans
/// return no rows for it, and a KV store rebuilt from the log replays across it.
async fn a_no_op_put_is_durable_and_a_stale_attempt_of_it_changes_nothing(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let writer = |id: i64, seq: i64, rows: &[(i64, Option<&str>, Option<i64>)]| PutRequest {
        writer_id: id,
        batch_sequence: seq,
        kafka: None,
        ..put(rows)
    };
    let t = env.open(&d).await;
    t.put(writer(9, 0, &[(1, Some("a"), Some(1))]))
        .await
        .unwrap();
    let noop = t
        .put(writer(9, 1, &[(1, Some("a"), Some(1))]))
        .await
        .unwrap();
    assert_eq!(
        noop.first_offset,
        noop.last_offset + 1,
        "an empty range: {noop:?}"
    );
    assert_eq!(
        t.log().high_watermark(),
        noop.first_offset,
        "the marker takes one offset"
    );
    // Another writer changes the key after the no-op was acknowledged.
    t.put(writer(10, 0, &[(1, Some("c"), Some(3))]))
        .await
        .unwrap();
    drop(t);

    let dir = tempfile::tempdir().unwrap();
    let t = env.open_in(&d, dir.path()).await;
    assert_eq!(
        get(&t, &[1]),
        vec![v(Some("c"), Some(3))],
        "a store rebuilt from the log replays across the marker"
    );
    let hw = t.log().high_watermark();
    let stale = t
        .put(writer(9, 1, &[(1, Some("a"), Some(1))]))
        .await
        .unwrap();
    assert!(
        stale.duplicated,
        "the stale attempt is a duplicate: {stale:?}"
    );
    assert_eq!(
        (stale.first_offset, stale.last_offset),
        (noop.first_offset, noop.last_offset),
        "answered as the original was"
    );
    assert_eq!(t.log().high_watermark(), hw, "nothing written");
    assert_eq!(get(&t, &[1]), vec![v(Some("c"), Some(3))]);
    // The writer goes on after its no-op.
    let next = t
        .put(writer(9, 2, &[(1, Some("b"), Some(2))]))
        .await
        .unwrap();
    assert!(!next.duplicated);
    assert_eq!(get(&t, &[1]), vec![v(Some("b"), Some(2))]);

    // Scans see rows only; a read that ends at the marker steps past it.
    let scan = t.log().scan(0, 1 << 20).await.unwrap();
    assert_eq!(
        scan.batches
            .iter()
            .map(|b| b.header.base_offset)
            .collect::<Vec<_>>(),
        vec![0, noop.first_offset, next.first_offset],
        "{scan:?}"
    );
    assert!(scan.batches.iter().all(|b| b.batch.num_rows() > 0));
    assert_eq!(scan.next_offset(0), t.log().high_watermark());
    let marker = noop.last_offset;
    let at_marker = t.log().scan(marker, 1).await.unwrap();
    assert_eq!(
        at_marker
            .batches
            .iter()
            .map(|b| b.header.base_offset)
            .collect::<Vec<_>>(),
        vec![noop.first_offset],
        "a read at the marker goes on to the rows after it"
    );

    // A run of markers longer than a read ends the log: a read finds nothing and
    // ends at the high watermark, and a snapshot covers the run (the store's offset
    // goes past markers, which stage nothing).
    let run_from = t.log().high_watermark();
    for seq in 3..40 {
        let same = t
            .put(writer(9, seq, &[(1, Some("b"), Some(2))]))
            .await
            .unwrap();
        assert_eq!(same.first_offset, same.last_offset + 1);
    }
    let hw = t.log().high_watermark();
    assert_eq!(hw, run_from + 37);
    let tail = t.log().scan(run_from, 1).await.unwrap();
    assert!(tail.batches.is_empty());
    assert_eq!(tail.next_offset(run_from), hw);
    assert!(tail.ends_past_rows(), "a reader must step over the run");
    let at_end = t.log().scan(hw, 1).await.unwrap();
    assert!(at_end.batches.is_empty() && !at_end.ends_past_rows());
    let snapshot = t.snapshot().await.unwrap().unwrap();
    assert_eq!(snapshot.log_offset, hw, "the snapshot covers the markers");
    // Rows after the run: a small read steps over all of it to them.
    let after = t
        .put(writer(9, 40, &[(1, Some("d"), Some(4))]))
        .await
        .unwrap();
    let read = t.log().scan(run_from, 1).await.unwrap();
    assert_eq!(
        read.batches
            .iter()
            .map(|b| b.header.base_offset)
            .collect::<Vec<_>>(),
        vec![after.first_offset]
    );
}

/// Pipelined Puts of one writer through a WAL failure: 5 fails with the WAL, the
/// tablet reopens from the log, and 6 arrives before 5 is re-sent. 6 waits for 5 and
/// both land in order; a 6 whose 5 does not come within the wait is refused, never
/// merged first (a 5 re-sent later, under a new writer, would then overwrite it).
async fn a_put_never_overtakes_its_predecessor_after_a_reopen(backend: KvBackend) {
    let (mut env, faulty) = faulty_env(backend).await;
    let d = table(&[]);
    let writer = |seq: i64, name: &str| PutRequest {
        writer_id: 9,
        batch_sequence: seq,
        kafka: None,
        ..put(&[(1, Some(name), Some(seq))])
    };
    let t = env.open(&d).await;
    for seq in 0..5 {
        t.put(writer(seq, "v")).await.unwrap();
    }
    faulty.set_config(FaultConfig {
        put_failure_rate: 1.0,
        ..FaultConfig::default()
    });
    t.put(writer(5, "five")).await.unwrap_err();
    faulty.set_config(FaultConfig::default());
    drop(t);
    env.replace_wal().await;
    let t = env.open(&d).await;
    // 6 first, then 5 a little later: 6 waits for it.
    let six = {
        let t = t.clone();
        tokio::spawn(async move { t.put(writer(6, "six")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let five = t.put(writer(5, "five")).await.unwrap();
    let six = six.await.unwrap().unwrap();
    assert!(five.last_offset < six.first_offset, "{five:?} {six:?}");
    assert_eq!(get(&t, &[1]), vec![v(Some("six"), Some(6))]);
    // 8 with no 7 in sight: refused after the wait, nothing merged.
    let err = t.put(writer(8, "eight")).await.unwrap_err();
    assert!(
        matches!(err, MinkError::OutOfOrderSequence { expected: 7, .. }),
        "{err}"
    );
    assert_eq!(get(&t, &[1]), vec![v(Some("six"), Some(6))]);
}

/// A Kafka producer's Put covers a range of its sequences (one per record): the next
/// must start right after the range, a retry of it is a duplicate, a gap is refused
/// at once, and the writer's place survives a reopen.
async fn a_put_covers_a_range_of_its_writers_sequences(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let writer = |first: i64, last: i64, name: &str| PutRequest {
        writer_id: 9,
        batch_sequence: first,
        kafka: Some(mink_kv::KafkaBatch {
            last_sequence: last,
        }),
        ..put(&[(1, Some(name), Some(first))])
    };
    let t = env.open(&d).await;
    t.put(writer(0, 2, "a")).await.unwrap();
    t.put(writer(3, 4, "b")).await.unwrap();
    assert!(t.put(writer(0, 2, "a")).await.unwrap().duplicated);
    assert_eq!(get(&t, &[1]), vec![v(Some("b"), Some(3))]);
    let err = t.put(writer(7, 8, "gap")).await.unwrap_err();
    assert!(
        matches!(err, MinkError::OutOfOrderSequence { expected: 5, .. }),
        "{err}"
    );
    drop(t);
    let t = env.open(&d).await;
    assert!(t.put(writer(3, 4, "b")).await.unwrap().duplicated);
    t.put(writer(5, 9, "c")).await.unwrap();
    assert_eq!(get(&t, &[1]), vec![v(Some("c"), Some(5))]);
}

async fn a_no_op_put_waits_for_the_staged_write_it_read(backend: KvBackend) {
    let (mut env, faulty) = faulty_env(backend).await;
    let t = env.open(&table(&[])).await;
    hold_wal_uploads(&faulty);
    let start = tokio::time::Instant::now();
    let a = spawn_put(&t, put(&[(1, Some("a"), Some(1))]));
    // A merges, stages its row and submits; its upload is held.
    tokio::time::sleep(Duration::from_millis(1)).await;
    // B writes the same row: against A's staged version it changes nothing.
    let mut same = put(&[(1, Some("a"), Some(1))]);
    same.writer_id = 7;
    let b = spawn_put(&t, same.clone());
    tokio::time::sleep(Duration::from_millis(1)).await;
    // A retry of B is answered as B is: not before B may be.
    let retry = spawn_put(&t, same);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(t.log().high_watermark(), 0, "A's upload is still held");
    assert!(
        !b.is_finished(),
        "B's decision rests on A's staged row; it is acknowledged only once A is durable"
    );
    assert!(!retry.is_finished(), "neither is a retry of B");

    let (a, a_at) = a.await.unwrap();
    let a = a.unwrap();
    assert_eq!((a.first_offset, a.last_offset), (0, 0));
    let (b, b_at) = b.await.unwrap();
    let b = b.unwrap();
    assert!(!b.duplicated);
    assert_eq!(
        (b.first_offset, b.last_offset),
        (2, 1),
        "an empty range after A and B's sequence marker (offset 1)"
    );
    assert!(a_at >= start + WAL_UPLOAD_HELD);
    assert!(b_at >= a_at, "B resolved before A was durable");
    let (retry, _) = retry.await.unwrap();
    let retry = retry.unwrap();
    assert!(retry.duplicated);
    assert_eq!((retry.first_offset, retry.last_offset), (2, 1));
    assert_eq!(changelog(&t).await, vec![c("+I", 1, Some("a"), Some(1))]);
    assert_eq!(get(&t, &[1]), vec![v(Some("a"), Some(1))]);
}

async fn a_no_op_put_fails_when_the_staged_write_it_read_fails(backend: KvBackend) {
    let (mut env, faulty) = faulty_env(backend).await;
    let t = env.open(&table(&[])).await;
    t.put(put(&[(2, Some("b"), Some(2))])).await.unwrap();
    hold_wal_uploads(&faulty);
    faulty.fail_next_puts(1);
    // A upserts 1 and deletes 2; its upload is held, then fails.
    let a = spawn_put(
        &t,
        PutRequest {
            changes: Some(vec![ChangeType::Insert, ChangeType::Delete]),
            ..put(&[(1, Some("a"), Some(1)), (2, None, None)])
        },
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    // B repeats both: against A's staged versions, the same row and a delete of a
    // missing key, so it changes nothing.
    let b = spawn_put(
        &t,
        PutRequest {
            changes: Some(vec![ChangeType::Insert, ChangeType::Delete]),
            ..put(&[(1, Some("a"), Some(1)), (2, None, None)])
        },
    );
    let (a, _) = a.await.unwrap();
    assert!(
        matches!(a, Err(MinkError::StorageFailure(_))),
        "A's upload failed: {a:?}"
    );
    let (b, _) = b.await.unwrap();
    assert!(
        matches!(b, Err(MinkError::StorageFailure(_))),
        "B rested on A, which never became durable, so B is not acknowledged either: {b:?}"
    );
    assert_eq!(t.log().high_watermark(), 1, "only the first Put is durable");
    // Failing dropped the staged rows, acknowledged ones among them: a failed tablet
    // answers no reads (they could be older than what was acknowledged) until it is
    // reopened from the log. (Found by the KV model test.)
    let keys =
        RecordBatch::try_from_iter(vec![("id", Arc::new(Int64Array::from(vec![2])) as _)]).unwrap();
    assert!(matches!(t.lookup(&keys), Err(MinkError::StorageFailure(_))));
    assert!(t.prefix_lookup(&[], 10).is_err());
}

/// A Put durable but not yet flushed when a later one failed the tablet: failing
/// dropped the staged rows, the earlier Put's among them. A flush after that (here a
/// snapshot's) must write nothing, not even the high watermark as the store's offset,
/// so that a reopen on the same store replays the Put from the log instead of skipping
/// it (and no snapshot claims to hold it).
async fn a_failed_tablet_flushes_nothing_so_replay_finds_its_acknowledged_rows(backend: KvBackend) {
    let (mut env, faulty) = faulty_env(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(1))])).await.unwrap();
    // A is durable, its rows staged; its waiter (which flushes) has not run.
    let a = t
        .submit_put(put(&[(2, Some("b"), Some(2))]), None)
        .await
        .unwrap();
    while t.log().high_watermark() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // B's upload fails: the tablet fails and drops what it staged, A's row among it.
    faulty.fail_next_puts(1);
    assert!(t.put(put(&[(3, Some("c"), Some(3))])).await.is_err());
    assert!(t.failure().is_some(), "the tablet failed with B");
    let _ = t.snapshot().await;
    assert_eq!(a.wait().await.unwrap().first_offset, 1, "A was durable");
    drop(t);
    env.replace_wal().await;
    let t = env.open(&d).await;
    assert_eq!(
        get(&t, &[1, 2]),
        vec![v(Some("a"), Some(1)), v(Some("b"), Some(2))],
        "the acknowledged Put is in the reopened tablet"
    );
}

/// A bucket's KV tablet opened again on the same local store while an older one is
/// alive (a reopen after a failure or a leadership move, two opens under different
/// epochs racing, as a node's tablet manager may run them) holds the store from then
/// on: an open under an older epoch is refused, and the older tablet writes (and
/// snapshots) nothing more, since its rows may be older than the store's. (Found by
/// the KV model test: an open under epoch 13 replayed into the store under the live
/// tablet of epoch 14, whose next Put merged over rows from long before.)
async fn a_superseded_tablet_writes_nothing_to_the_store(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let kv = open_kv_store(backend, env.dir.path()).unwrap();
    let snapshots = env.snapshots();
    let open = |log: LogTablet| {
        KvTablet::open(
            BUCKET,
            log,
            kv.namespace("t1-b0").unwrap(),
            d.clone(),
            vec![schema()],
            Some(snapshots.clone()),
        )
    };
    let log = async |env: &mut Env| {
        env.epoch += 1;
        let stream = env.node.open_stream("t1-b0", env.epoch).await.unwrap();
        LogTablet::open(BUCKET, stream, true, vec![schema()], LogConfig::default())
            .await
            .unwrap()
    };
    let older_log = log(&mut env).await;
    let older = open(older_log.clone()).await.unwrap();
    older.put(put(&[(1, Some("a"), Some(1))])).await.unwrap();
    // The same node opens the bucket again under a newer epoch, on the same store.
    let newer = open(log(&mut env).await).await.unwrap();
    newer.put(put(&[(1, Some("b"), Some(2))])).await.unwrap();

    // An open under the older epoch (still running when the newer one finished).
    let stale = open(older_log).await;
    assert!(
        matches!(stale, Err(MinkError::Fenced(_))),
        "{:?}",
        stale.err()
    );
    let snapshot = older.snapshot().await;
    assert!(
        matches!(snapshot, Err(MinkError::Fenced(_))),
        "the older tablet reads no snapshot off a store it no longer holds: {snapshot:?}"
    );
    assert_eq!(get(&newer, &[1]), vec![v(Some("b"), Some(2))]);
    newer.put(put(&[(2, Some("c"), None)])).await.unwrap();
    assert!(newer.snapshot().await.unwrap().is_some());
    drop((older, newer));
    // The store, reopened (as after a restart), holds the newer tablet's state.
    let t = open(log(&mut env).await).await.unwrap();
    assert_eq!(
        get(&t, &[1, 2]),
        vec![v(Some("b"), Some(2)), v(Some("c"), None)]
    );
}

/// Runs each test on both backends; those after `paused:` on paused time (they hold
/// uploads for seconds of virtual time).
/// Puts from several tasks on a multi-threaded runtime, so that flushes run beside
/// merges on the other core (fjall) and snapshots and prefix lookups beside both: the
/// changelog must be exactly the `last_row` changelog of the rows in log order (a `-U`
/// or `-D` image is the key's previous image, `+I` only for a key not present), the
/// lookups at the end answer the last images, and so does the tablet reopened (replay
/// from the flushed offset). The paused, single-threaded tests above cannot interleave
/// a flush with a merge: neither awaits inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_beside_flushes_keep_the_changelog_exact() {
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    const KEYS: i64 = 300;
    let runs = [
        (KvBackend::Fjall, "full"),
        (KvBackend::Redb, "full"),
        (KvBackend::Fjall, "wal"),
    ];
    for (backend, image) in runs {
        let wal = image == "wal";
        for seed in 1..=3u64 {
            let mut env = Env::new(backend).await;
            let d = table(&[("changelog_image", image)]);
            let t = env.open(&d).await;
            // A store write after every Put; frequent ones that evict; rare ones that
            // keep the buffer as a cache of clean rows.
            t.set_write_back_bytes([0, 4_000, 64_000][(seed - 1) as usize]);
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let writers: Vec<_> = (0..4u64)
                .map(|w| {
                    let t = t.clone();
                    tokio::spawn(async move {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 100 + w);
                        for i in 0..120 {
                            let mut ids: Vec<i64> =
                                (0..40).map(|_| rng.random_range(0..KEYS)).collect();
                            ids.sort_unstable();
                            ids.dedup();
                            let req = if rng.random_range(0..8) == 0 {
                                delete(&ids)
                            } else {
                                let name = format!("w{w}-{i}");
                                let rows: Vec<_> = ids
                                    .iter()
                                    .map(|id| {
                                        (*id, Some(name.as_str()), Some(rng.random_range(0..3)))
                                    })
                                    .collect();
                                put(&rows)
                            };
                            t.put(req).await.unwrap();
                        }
                    })
                })
                .collect();
            let readers = {
                let (t, done) = (t.clone(), done.clone());
                tokio::spawn(async move {
                    let mut snapshots = 0;
                    while !done.load(std::sync::atomic::Ordering::SeqCst) {
                        t.snapshot().await.unwrap();
                        t.prefix_lookup(&[], KEYS as usize).unwrap();
                        snapshots += 1;
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                    snapshots
                })
            };
            for w in writers {
                w.await.unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            let snapshots = readers.await.unwrap();

            let mut state: BTreeMap<i64, (Option<String>, Option<i64>)> = BTreeMap::new();
            let log = changelog(&t).await;
            for (n, (ct, id, name, score)) in log.iter().enumerate() {
                let row = (name.clone(), *score);
                let at = format!("{backend:?} {image} seed {seed}, change {n}: {ct} {id} {row:?}");
                match ct.as_str() {
                    "+I" => assert!(
                        state.insert(*id, row).is_none(),
                        "{at}: the key was present"
                    ),
                    "-U" | "-D" => {
                        assert!(!(wal && ct == "-U"), "{at}: a before image");
                        assert_eq!(state.get(id), Some(&row), "{at}: not the key's image");
                        if ct == "-D" {
                            state.remove(id);
                        }
                    }
                    // Without before images an upsert is a +U whether its key is new.
                    "+U" => assert!(
                        state.insert(*id, row).is_some() || wal,
                        "{at}: the key was absent"
                    ),
                    other => panic!("{at}: unexpected change type {other}"),
                }
            }
            let ids: Vec<i64> = (0..KEYS).collect();
            let want: Vec<_> = ids.iter().map(|id| state.get(id).cloned()).collect();
            assert_eq!(
                get(&t, &ids),
                want,
                "{backend:?} {image} seed {seed}: lookups"
            );
            drop(t);
            let reopened = env.open(&d).await;
            assert_eq!(
                get(&reopened, &ids),
                want,
                "{backend:?} {image} seed {seed}: after a reopen"
            );
            eprintln!(
                "{backend:?} {image} seed {seed}: {} changes, {} keys, {snapshots} snapshots",
                log.len(),
                state.len()
            );
        }
    }
}

/// A flush never chooses what to write between a Put's submit and the staging of its
/// rows: it would record a flushed offset past rows that are then in neither the
/// store nor (after a crash) the buffer. The Put is held in that window
/// (`pause_next_staging`) until its changelog is durable, and a flush is started
/// beside it; after both, a crash and a reopen from the store must find the Put's row.
async fn a_flush_waits_for_a_submitted_put_to_stage(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let t = env.open(&d).await;
    t.put(put(&[(1, Some("a"), Some(1))])).await.unwrap();
    t.release_write_back().await.unwrap();
    let before = t.log().high_watermark();
    assert_eq!(t.store_offset().unwrap(), Some(before));

    let (pause, putting) = hold_in_staging(&t, put(&[(1, Some("b"), Some(2))])).await;
    // The Put has its offset; its changelog becomes durable by itself (the WAL
    // uploads it), so a flush choosing now would take a high watermark past it.
    while t.log().high_watermark() <= before {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let flushing = tokio::spawn({
        let t = t.clone();
        async move { t.release_write_back().await }
    });
    // On the paused clock a sleep ends once every task is idle: by then a flush that
    // does not wait has finished.
    tokio::time::sleep(Duration::from_millis(100)).await;
    pause.release.notify_one();
    putting.await.unwrap().unwrap();
    flushing.await.unwrap().unwrap();
    assert_eq!(get(&t, &[1]), vec![v(Some("b"), Some(2))]);
    // A crash: the buffer is lost; the store and the log from its offset remain.
    drop(t);
    let t = env.open(&d).await;
    assert_eq!(get(&t, &[1]), vec![v(Some("b"), Some(2))]);
}

/// A store write in progress holds up no other writer's Put (on a store whose flushes
/// run beside merges): below twice the buffer's bound a Put's wait leaves the rows to
/// the write under way, and past it the wait is the buffer's backpressure. The write
/// runs off the runtime's threads: this test's runtime has one, and the write is held.
async fn a_store_write_in_progress_holds_up_other_puts_only_past_twice_the_bound(
    backend: KvBackend,
) {
    let mut env = Env::new(backend).await;
    let d = table(&[]);
    let faults = Arc::new(StoreFaults::default());
    let t = env.open_failing(&d, &faults).await.unwrap();
    let buffered = WriteBackBudget::new(u64::MAX);
    t.set_write_back_budget(buffered.clone());
    let rows = |from: i64| -> Vec<(i64, Option<&str>, Option<i64>)> {
        (from..from + 100)
            .map(|i| (i, Some("some row"), Some(i)))
            .collect()
    };
    t.set_write_back_bytes(u64::MAX);
    t.put(put(&rows(0))).await.unwrap();
    let first = buffered.used();
    // Past the bound, under twice it (`first` counts the kept batch too): the next
    // Put's wait writes the store, held.
    t.set_write_back_bytes(first / 2);
    let held = faults.hold();
    let flusher = tokio::spawn({
        let t = t.clone();
        async move { t.put(put(&[(1_000, Some("flushes"), None)])).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while faults.held() == 0 {
        assert!(std::time::Instant::now() < deadline, "no store write began");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Another writer's Put merges, is acknowledged, and does not wait for the write.
    tokio::time::timeout(
        Duration::from_secs(30),
        t.put(put(&[(1_001, Some("beside"), None)])),
    )
    .await
    .expect("a Put waited for a store write in progress below twice the bound")
    .unwrap();
    assert_eq!(faults.held(), 1, "the store write is still held");
    assert!(!flusher.is_finished());
    // Past twice the bound, a Put's wait waits for the store.
    let pressed = tokio::spawn({
        let t = t.clone();
        async move { t.put(put(&rows(2_000))).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !pressed.is_finished(),
        "a Put past twice the bound did not wait for the store"
    );
    drop(held);
    flusher.await.unwrap().unwrap();
    pressed.await.unwrap().unwrap();
    // Everything is there, and the store catches up with the next write.
    let ids: Vec<i64> = (0..100).chain(1_000..1_002).chain(2_000..2_100).collect();
    assert!(get(&t, &ids).iter().all(|r| r.is_some()));
    let info = t.snapshot().await.unwrap().unwrap();
    assert_eq!(t.store_offset().unwrap(), Some(info.log_offset));
}

/// The rows whose Puts left their store write to one in progress (above) reach the
/// store when it ends, if they are still due, with no Put after them: the write in
/// progress chose its rows before theirs were staged.
async fn rows_left_to_a_store_write_in_progress_are_written_when_it_ends(backend: KvBackend) {
    let mut env = Env::new(backend).await;
    // No kept batches: the buffer's bytes are its rows'.
    let d = table(&[("changelog_image", "wal")]);
    let faults = Arc::new(StoreFaults::default());
    let t = env.open_failing(&d, &faults).await.unwrap();
    let buffered = WriteBackBudget::new(u64::MAX);
    t.set_write_back_budget(buffered.clone());
    const BOUND: u64 = 20_000;
    t.set_write_back_bytes(BOUND);
    let body = "x".repeat(200);
    let held = faults.hold();
    // A few hot keys, rewritten: the buffer stays small, but the bytes staged since
    // the last store write pass the bound, and a Put's wait writes the store (held).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hot = tokio::spawn({
        let (t, body, stop) = (t.clone(), body.clone(), stop.clone());
        async move {
            for i in 0..1_000 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let rows: Vec<_> = (0..5).map(|k| (k, Some(body.as_str()), Some(i))).collect();
                t.put(put(&rows)).await.unwrap();
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while faults.held() == 0 {
        assert!(std::time::Instant::now() < deadline, "no store write began");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // New keys while it is held, past the bound and under twice it: none of their Puts
    // waits for the store.
    let mut key = 1_000;
    while buffered.used() < BOUND * 13 / 10 {
        t.put(put(&[(key, Some(body.as_str()), None)]))
            .await
            .unwrap();
        key += 1;
    }
    assert!(buffered.used() < 2 * BOUND);
    let hw = t.log().high_watermark();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(held);
    // The write held ends, and the rows after it reach the store with no Put after
    // them.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while t.store_offset().unwrap() < Some(hw) {
        assert!(
            std::time::Instant::now() < deadline,
            "the store stayed at {:?}, behind {hw}, with {} bytes buffered",
            t.store_offset().unwrap(),
            buffered.used()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        buffered.used() <= BOUND,
        "{} bytes buffered",
        buffered.used()
    );
    hot.abort();
    let ids: Vec<i64> = (1_000..key).collect();
    assert!(get(&t, &ids).iter().all(|r| r.is_some()));
}

/// fjall only (these two): redb writes its store under the put lock, so no Put merges
/// beside it.
#[tokio::test]
async fn fjall_a_store_write_in_progress_holds_up_other_puts_only_past_twice_the_bound() {
    a_store_write_in_progress_holds_up_other_puts_only_past_twice_the_bound(KvBackend::Fjall).await
}

#[tokio::test]
async fn fjall_rows_left_to_a_store_write_in_progress_are_written_when_it_ends() {
    rows_left_to_a_store_write_in_progress_are_written_when_it_ends(KvBackend::Fjall).await
}

macro_rules! both {
    ($($name:ident),*; paused: $($paused:ident),*) => {
        mod fjall {
            $( #[tokio::test] async fn $name() { super::$name(mink_kv::KvBackend::Fjall).await } )*
            $( #[tokio::test(start_paused = true)] async fn $paused() { super::$paused(mink_kv::KvBackend::Fjall).await } )*
        }
        mod redb {
            $( #[tokio::test] async fn $name() { super::$name(mink_kv::KvBackend::Redb).await } )*
            $( #[tokio::test(start_paused = true)] async fn $paused() { super::$paused(mink_kv::KvBackend::Redb).await } )*
        }
    };
}

both!(
    last_row_changelog_and_state,
    before_images_come_from_kept_batches_then_from_the_store,
    a_key_repeated_in_one_put_changes_once_per_difference,
    the_wal_changelog_image_has_no_before_images,
    first_row_and_versioned,
    aggregation_and_idempotence,
    partial_updates_and_partial_deletes,
    crash_after_ack_before_flush_recovers_the_acknowledged_state,
    durable_rows_wait_ahead_of_the_store_until_the_bound,
    a_failing_store_write_fails_no_durable_put,
    a_retry_of_an_acknowledged_put_is_a_duplicate_while_the_store_fails,
    an_idle_bucket_gives_its_write_back_rows_up_to_a_busy_one,
    an_idle_bucket_without_snapshots_gives_its_rows_up_too,
    schema_evolution_reads_old_rows_with_nulls,
    bad_input_is_rejected_and_changes_nothing,
    snapshots_plus_replay_equal_the_live_state,
    compressed_and_mixed_snapshots_and_changelogs_restore,
    a_snapshot_larger_than_a_part_goes_up_in_parts,
    a_snapshot_cut_short_is_refused,
    a_snapshot_of_wide_rows_is_cut_into_batches_by_bytes,
    a_trim_never_passes_the_newest_snapshot,
    retention_never_deletes_the_snapshot_just_written,
    a_changelog_trimmed_past_every_snapshot_fails_the_open_loudly,
    recent_snapshots_are_reused_until_too_old,
    a_snapshot_from_before_add_column_loads_with_nulls,
    a_snapshot_without_a_schema_id_loads_by_its_columns,
    prefix_lookups_use_the_leading_key_columns,
    a_no_op_put_is_durable_and_a_stale_attempt_of_it_changes_nothing,
    a_put_never_overtakes_its_predecessor_after_a_reopen,
    a_put_covers_a_range_of_its_writers_sequences,
    a_superseded_tablet_writes_nothing_to_the_store;
    paused:
    a_flush_waits_for_a_submitted_put_to_stage,
    puts_queued_while_the_store_fails_are_checked_again,
    a_no_op_put_waits_for_the_staged_write_it_read,
    a_no_op_put_fails_when_the_staged_write_it_read_fails,
    a_failed_tablet_flushes_nothing_so_replay_finds_its_acknowledged_rows,
    a_failing_store_is_tried_once_per_interval_not_once_per_caller
);

/// fjall only: redb on a full tmpfs writes into the space its file already holds.
#[tokio::test(start_paused = true)]
async fn fjall_a_full_disk_under_the_store_loses_nothing_and_the_store_recovers() {
    a_full_disk_under_the_store_loses_nothing_and_the_store_recovers(KvBackend::Fjall).await
}
