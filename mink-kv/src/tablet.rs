//! The KV tablet of one bucket of a primary-key table: merge, changelog, prewrite
//! buffer, flush, lookups and recovery by replay.
//!
//! A Put: check the writer's sequence (a retry is answered with the original offsets
//! and never merged twice); for each row read the old row from the prewrite buffer,
//! then the store; apply the merge engine and partial-update targets; emit the
//! changelog (`+I`; `-U` then `+U`; `-D`; nothing when unchanged); append it to the
//! log tablet and stage the new rows in the prewrite buffer under the batch's offset.
//! When the append is durable the Put is acknowledged; its rows stay in the buffer
//! (a bounded write-back cache, `prewrite.rs`) until the buffer passes its bound
//! or a snapshot is due, when each key's newest durable version moves into the store
//! together with the high watermark, in one atomic write. Lookups see buffered rows
//! below the high watermark (acknowledged) and the store; never rows above it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use arrow::array::RecordBatch;
use arrow::array::UInt32Array;
use arrow::compute::{interleave_record_batch, take_record_batch};
use mink_log::{AppendRequest, Appended, LogTablet};
use mink_types::{
    ChangeType, ChangelogImage, DeleteBehavior, KeyEncoder, MinkError, Result, Schema, SchemaId,
    TableBucket, TableDescriptor, ValueEncoder,
};
use rustc_hash::FxBuildHasher;

use crate::config::DEFAULT_WRITE_BACK_BYTES;
use crate::merge::{Decision, Merger, target_mask};
use crate::prewrite::{ImageRef, Prewrite, WriteBackBudget};
use crate::recovery::{self, RecoveryStart};
use crate::row::{
    Row, decode_row, encode_row, encode_row_at, row_schema_id, rows_of, rows_to_batch,
};
use crate::snapshot::{SnapshotInfo, SnapshotStore};
use crate::store::{Claim, KvNamespace, KvOp};

/// How often a tablet checks whether it sits idle on write-back rows while the node's
/// buffers are past their bound ([`KvTablet::run_snapshots`]).
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a tablet whose store write failed tries again (each try sorts and writes
/// every dirty row): at most once per this, however many callers want a flush.
const STORE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// One Put batch.
#[derive(Debug, Clone)]
pub struct PutRequest {
    /// The idempotent writer, or `mink_log::NO_WRITER`.
    pub writer_id: i64,
    pub batch_sequence: i64,
    /// A Kafka producer's batch (a compacted topic's Produce), `None` otherwise.
    pub kafka: Option<KafkaBatch>,
    pub schema_id: SchemaId,
    /// Columns of a partial update (the batch holds these columns, in this order).
    pub target_columns: Option<Vec<String>>,
    /// Per row: `+I`/`+U`/`+A` upsert, `-D`/`-U` delete. `None`: every row upserts.
    pub changes: Option<Vec<ChangeType>>,
    pub batch: RecordBatch,
}

/// A Put that is a Kafka producer's batch, with Kafka's rules: it covers a range of
/// sequences (one per record, from `batch_sequence`); its writer id carries the
/// producer epoch (an older epoch is fenced), and a producer the tablet does not know
/// must start at sequence 0 (`UnknownWriter` otherwise); it is never reordered (its
/// connection submits in order: a gap is refused at once); and under `last_row` every
/// record is one change of the changelog, a tombstone a delete, so that each has its
/// offset as in Kafka's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaBatch {
    /// The sequence of the batch's last record.
    pub last_sequence: i64,
}

impl PutRequest {
    /// The last sequence the batch covers.
    pub fn last_sequence(&self) -> i64 {
        self.kafka.map_or(self.batch_sequence, |k| k.last_sequence)
    }
}

/// Rows found by a lookup, with the position of the key each answers.
#[derive(Debug, Clone)]
pub struct LookupResult {
    pub batch: RecordBatch,
    pub key_index: Vec<u32>,
}

struct TableState {
    descriptor: TableDescriptor,
    schemas: HashMap<SchemaId, Schema>,
    merger: Merger,
}

/// A checked Put: the target mask, delete flags, encoded keys, and the schema of the
/// batch's columns (the current one, or its projection to the targets).
type Prepared = (Option<Vec<bool>>, Vec<bool>, Vec<Vec<u8>>, Schema);

/// What a Put's merge produced: the changelog (one change type per row of `batch`;
/// no batch when nothing changed) and the new stored value of every key it changed
/// (`None`: deleted).
struct Merged {
    change_types: Vec<ChangeType>,
    batch: Option<RecordBatch>,
    /// Each key's new stored value and, with `images`, the row of `images` it is.
    staged: Vec<StagedRow>,
    /// The rows the staged values were encoded from, of the table's schema, kept for
    /// the `-U` images of later updates ([`Prewrite::keep_images`]).
    images: Option<RecordBatch>,
}

/// What a `last_row` merge ([`KvTablet::merge_last_row`]) found for one row of its
/// batch: the key's value before this row, compared with the row's new encoding.
enum Old {
    /// No value (a new key, or a deleted one): an insert.
    Absent,
    /// The same stored bytes as the new row: nothing changes.
    Same,
    /// A different value, which sits at `(source, row)` among the merge's sources.
    At(usize, usize),
    /// A different value, in no batch at hand: its stored bytes, to decode.
    Stored(Vec<u8>),
    /// Not in the buffer: read from the store, then one of the above.
    Unstaged,
}

/// What [`KvTablet::old_values`] found for a `last_row` merge's rows.
struct OldValues {
    /// Per row.
    olds: Vec<Old>,
    /// Per row, the key's previous row in the batch.
    previous: Vec<Option<usize>>,
    /// The kept batches old rows sit in, in source order after [`NEW`].
    kept: Vec<RecordBatch>,
    /// Whether this Put should offer its batch to be kept.
    keep: bool,
}

/// The sources of a `last_row` merge's changelog: the old rows it decoded, the Put's
/// batch, then the kept batches old rows sit in.
const DECODED: usize = 0;
const NEW: usize = 1;

/// A key, its new stored value (`None`: deleted), and the row of the merge's kept
/// batch it is, if any.
type StagedRow = (Vec<u8>, Option<Vec<u8>>, Option<u32>);

/// What decides how a Put is merged ([`merge_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PutShape {
    /// A Kafka producer's batch (a compacted topic's Produce).
    kafka: bool,
    /// A partial update (`target_columns`).
    partial: bool,
    /// The table merges with `last_row`.
    last_row: bool,
    /// The batch is of the table's current schema.
    current_schema: bool,
    /// The batch deletes keys.
    deletes: bool,
    image: ChangelogImage,
}

/// How a Put is merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MergePath {
    /// Every record is one change, a tombstone a delete; nothing is read
    /// ([`KvTablet::merge_records`]).
    Records,
    /// Every row a `+U` of itself; nothing is read ([`KvTablet::merge_wal`]).
    Wal,
    /// Column-wise over the batch, old rows read once per key
    /// ([`KvTablet::merge_last_row`]).
    LastRow,
    /// Row by row through the merge engine ([`KvTablet::merge_rows`]).
    Rows { before_images: bool },
}

/// The merge a Put takes. The column-wise paths need a whole-row `last_row` Put of
/// the current schema; of those, a Kafka batch maps each record to one change, and a
/// Put without deletes skips reading old rows when the changelog carries no before
/// images. Everything else goes row by row through the merge engine.
fn merge_path(shape: PutShape) -> MergePath {
    let column_wise = !shape.partial && shape.last_row && shape.current_schema;
    match (column_wise, shape.image) {
        (true, _) if shape.kafka => MergePath::Records,
        (true, ChangelogImage::Wal) if !shape.deletes => MergePath::Wal,
        (true, ChangelogImage::Full) if !shape.deletes => MergePath::LastRow,
        _ => MergePath::Rows {
            before_images: shape.image == ChangelogImage::Full,
        },
    }
}

/// A Put submitted ([`KvTablet::submit_put`]): wait for it to be durable.
#[must_use = "a submitted Put is acknowledged only once `wait` returns"]
pub struct PendingPut {
    tablet: KvTablet,
    step: PendingStep,
}

enum PendingStep {
    /// A retry of a Put already submitted: its outcome.
    Duplicate(mink_log::Submitted),
    /// A Put that changed nothing: its sequence marker, acknowledged in WAL order.
    Empty(mink_log::Submitted),
    /// Its changelog, on its way.
    Written(mink_log::Submitted),
}

impl PendingPut {
    /// Resolves once the Put is durable, with where its changelog landed.
    pub async fn wait(self) -> Result<Appended> {
        let tablet = self.tablet;
        match self.step {
            PendingStep::Duplicate(d) => d.wait().await,
            PendingStep::Empty(e) => e.wait().await.map_err(|e| tablet.fail(e)),
            PendingStep::Written(submitted) => match submitted.wait().await {
                Ok(appended) => {
                    // Durable: that is the Put's answer. A store write that fails here
                    // fails the store, not the Put: the rows stay in the buffer (and
                    // in the log), the next Put's wait tries again, and past twice the
                    // bound Puts are refused until one succeeds (`submit_put`).
                    match tablet.flush_if_due().await {
                        Ok(()) => {}
                        // The tablet failed: a newer one holds the bucket's store.
                        Err(e @ MinkError::Fenced(_)) => {
                            tracing::debug!(bucket = %tablet.inner.bucket, "a store write after a durable Put: {e}");
                        }
                        Err(e) => {
                            tracing::warn!(bucket = %tablet.inner.bucket, "a KV store write failed; the rows wait in the prewrite buffer: {e}");
                        }
                    }
                    metrics::counter!("mink_kv_put_batches_total").increment(1);
                    Ok(appended)
                }
                // The changelog may or may not be in the log.
                Err(e) => Err(tablet.fail(e)),
            },
        }
    }
}

struct Inner {
    bucket: TableBucket,
    log: LogTablet,
    store: Arc<dyn KvNamespace>,
    /// This tablet's claim of `store`: every write goes through it ([`Owner`]).
    ///
    /// [`Owner`]: crate::store::Owner
    claim: Claim,
    table: RwLock<TableState>,
    /// Versions the store may lack, and the newest durable ones it has, bounded by
    /// `write_back_bytes` (see [`Prewrite`]).
    prewrite: Mutex<Prewrite>,
    /// The prewrite buffer's bound: past it (in bytes held, or staged since the last
    /// store write), a Put's wait writes the durable versions to the store.
    write_back_bytes: AtomicU64,
    /// Serializes the merges and submits of this bucket's Puts.
    puts: tokio::sync::Mutex<()>,
    /// Keeps a flush's choice of what to write (the high watermark and the versions
    /// below it) out from between a Put's submit and the staging of its rows: a flush
    /// then would record a flushed offset past rows that are in neither the buffer nor
    /// the store. Held only while the flush chooses, not while it writes. Taken after
    /// `puts` and `store_writes` when held with them. Merges do not wait for flushes
    /// (see [`KvTablet::flush`] for why they may run beside one).
    flushes: tokio::sync::Mutex<()>,
    /// Serializes the store's writers and snapshot readers: flushes, which hold it from
    /// their choice through the store write to the buffer's release of what they
    /// wrote (two at once could write an older version, and an older flushed offset,
    /// over a newer one), the reads of a snapshot, and a release of the buffer's rows.
    /// Where flushes run beside merges (fjall), Puts merge and stage beside a store
    /// write. Taken after `puts`, before `flushes`.
    store_writes: Arc<tokio::sync::Mutex<()>>,
    /// Set by a Put's wait that left its due store write to the one in progress; the
    /// flush that ends next writes again ([`KvTablet::flush`]).
    flush_again: std::sync::atomic::AtomicBool,
    failed: Mutex<Option<MinkError>>,
    /// The error of the last store write and when it failed (`None` once one
    /// succeeds). Tokio's clock: paused tests step over [`STORE_RETRY`].
    store_failure: Mutex<Option<(MinkError, tokio::time::Instant)>>,
    snapshots: Option<SnapshotStore>,
    /// The newest snapshot this tablet wrote or found in the store. The lock is held
    /// across a snapshot write, so concurrent readers share one write.
    latest_snapshot: tokio::sync::Mutex<Option<SnapshotInfo>>,
    /// `-U` images of the column-wise merge: taken from a batch at hand (kept by the
    /// buffer, or earlier in the Put), and decoded from the stored row.
    before_images: [AtomicU64; 2],
    /// A test's pause of the next Put between its submit and its staging
    /// ([`KvTablet::pause_next_staging`]); `staging_paused` says whether one is set.
    staging_pause: Mutex<Option<Arc<StagingPause>>>,
    staging_paused: std::sync::atomic::AtomicBool,
}

/// The batch a Put keeps for later `-U` images: its rows `take`. When it stages every
/// row and its buffers are its own (one the node cut out of a table write), the batch
/// itself, with no copy.
fn kept_batch(batch: RecordBatch, take: Vec<u32>) -> Result<RecordBatch> {
    if take.len() == batch.num_rows() && owns_its_buffers(&batch) {
        return Ok(batch);
    }
    Ok(take_record_batch(&batch, &UInt32Array::from(take))?)
}

/// Whether `batch`'s buffers hold little beyond its rows: kept, it pins about what it
/// is counted as ([`RecordBatch::get_array_memory_size`]), not a larger body it is a
/// view into.
fn owns_its_buffers(batch: &RecordBatch) -> bool {
    let rows: usize = batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or(usize::MAX / 64)
        })
        .sum();
    batch.get_array_memory_size() <= rows.saturating_add(rows / 4).saturating_add(4096)
}

/// A Put held between its submit and the staging of its rows, for tests of what may
/// run in that window ([`KvTablet::pause_next_staging`]).
#[doc(hidden)]
#[derive(Default)]
pub struct StagingPause {
    /// Notified once the Put has its offsets and waits.
    pub reached: tokio::sync::Notify,
    /// Notify it to let the Put stage its rows.
    pub release: tokio::sync::Notify,
}

/// Where a tablet's `-U` images came from ([`KvTablet::before_images`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BeforeImages {
    /// Taken from a batch at hand: kept by the prewrite buffer, or earlier in the Put.
    pub kept: u64,
    /// Decoded from the stored row.
    pub decoded: u64,
}

/// A bucket's KV tablet. Cheap to clone.
#[derive(Clone)]
pub struct KvTablet {
    inner: Arc<Inner>,
}

fn table_state(descriptor: TableDescriptor, schemas: Vec<Schema>) -> Result<TableState> {
    let merger = Merger::new(&descriptor)?;
    let mut map: HashMap<SchemaId, Schema> =
        schemas.into_iter().map(|s| (s.schema_id, s)).collect();
    map.insert(descriptor.schema.schema_id, descriptor.schema.clone());
    Ok(TableState {
        descriptor,
        schemas: map,
        merger,
    })
}

/// The schema version a snapshot's rows are written under: the one it records, or, for
/// a snapshot from before that was recorded, the newest version whose columns match
/// its Arrow schema.
fn snapshot_schema(
    table: &TableState,
    recorded: Option<SchemaId>,
    stream: &arrow::datatypes::Schema,
) -> Option<Schema> {
    match recorded {
        Some(id) => table.schemas.get(&id).cloned(),
        None => table
            .schemas
            .values()
            .filter(|s| s.to_arrow().fields() == stream.fields())
            .max_by_key(|s| s.schema_id)
            .cloned(),
    }
}

impl KvTablet {
    /// Opens the tablet over `log` (already open) and `store`, replaying the changelog
    /// from the store's flushed offset up to the high watermark (after loading the
    /// newest snapshot when the store is behind it).
    pub async fn open(
        bucket: TableBucket,
        log: LogTablet,
        store: Arc<dyn KvNamespace>,
        descriptor: TableDescriptor,
        schemas: Vec<Schema>,
        snapshots: Option<SnapshotStore>,
    ) -> Result<Self> {
        if !descriptor.has_primary_key() {
            return Err(MinkError::invalid(
                "table",
                "a KV tablet needs a primary-key table",
            ));
        }
        // From here on, a tablet of this bucket opened earlier on this store (still
        // alive, or still opening) writes nothing more to it.
        let claim = store.owner().claim(log.epoch())?;
        let tablet = Self {
            inner: Arc::new(Inner {
                bucket,
                log,
                store,
                claim,
                table: RwLock::new(table_state(descriptor, schemas)?),
                prewrite: Mutex::new(Prewrite::default()),
                write_back_bytes: AtomicU64::new(DEFAULT_WRITE_BACK_BYTES),
                puts: tokio::sync::Mutex::new(()),
                store_writes: Arc::new(tokio::sync::Mutex::new(())),
                flush_again: Default::default(),
                flushes: tokio::sync::Mutex::new(()),
                failed: Mutex::new(None),
                store_failure: Mutex::new(None),
                snapshots,
                latest_snapshot: tokio::sync::Mutex::new(None),
                before_images: [AtomicU64::new(0), AtomicU64::new(0)],
                staging_pause: Mutex::new(None),
                staging_paused: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        tablet.recover().await?;
        Ok(tablet)
    }

    fn table(&self) -> std::sync::RwLockReadGuard<'_, TableState> {
        self.inner.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn prewrite(&self) -> MutexGuard<'_, Prewrite> {
        self.inner
            .prewrite
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The bucket this tablet holds.
    pub fn bucket(&self) -> TableBucket {
        self.inner.bucket
    }

    /// The log tablet under this KV tablet.
    pub fn log(&self) -> &LogTablet {
        &self.inner.log
    }

    /// Why the tablet failed, if it did; a failed tablet must be reopened from the log.
    pub fn failure(&self) -> Option<MinkError> {
        self.inner
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Moves the table to a new definition (after `alter_table`).
    pub fn update_table(&self, descriptor: TableDescriptor, schemas: Vec<Schema>) -> Result<()> {
        for s in &schemas {
            self.inner.log.register_schema(s.clone());
        }
        *self.inner.table.write().unwrap_or_else(|e| e.into_inner()) =
            table_state(descriptor, schemas)?;
        Ok(())
    }

    /// Decodes a stored row into schema `current` (the caller's view of the table's
    /// schema: an `alter_table` may land while it works).
    fn decode(&self, bytes: &[u8], current: &Schema) -> Result<Row> {
        let table = self.table();
        let id = row_schema_id(bytes)?;
        let written = table.schemas.get(&id).ok_or_else(|| {
            MinkError::Internal(format!(
                "{}: a stored row names unknown schema {id}",
                self.inner.bucket
            ))
        })?;
        decode_row(bytes, written, current)
    }

    /// The newest version of `key`, staged or not: the prewrite buffer's, then the
    /// store's (the merges' read, under the put lock).
    fn current(&self, key: &[u8], schema: &Schema) -> Result<Option<Row>> {
        let staged = self
            .prewrite()
            .get(key)
            .and_then(|versions| versions.back().map(|v| v.value.clone()));
        self.buffered_or_stored(key, staged, schema)
    }

    /// A key's row from what the prewrite buffer held of it (`Some(None)`: deleted;
    /// `None`: nothing), else from the store. The buffer must be read first: a flush
    /// writes the store before versions leave the buffer, so a version read there is
    /// in the store or still there; read the other way round, a flush in between
    /// could leave only the store's older version.
    fn buffered_or_stored(
        &self,
        key: &[u8],
        staged: Option<Option<Vec<u8>>>,
        schema: &Schema,
    ) -> Result<Option<Row>> {
        match staged {
            Some(Some(bytes)) => Ok(Some(self.decode(&bytes, schema)?)),
            Some(None) => Ok(None),
            None => match self.fail_if_fenced(self.inner.store.get(key))? {
                Some(bytes) => Ok(Some(self.decode(&bytes, schema)?)),
                None => Ok(None),
            },
        }
    }

    /// The high watermark, read under the prewrite buffer's lock (held by the caller
    /// as `_buffer`): the buffer drops a key's versions superseded by a durable one
    /// (`Prewrite::stage`), so a read that wants the newest version below its high
    /// watermark must read one at least as high as the one those drops used.
    fn high_watermark_under(&self, _buffer: &MutexGuard<'_, Prewrite>) -> i64 {
        self.inner.log.high_watermark()
    }

    /// Checks a Put and returns the full-width rows, the target mask and per-row
    /// delete flags.
    fn prepare(&self, req: &PutRequest) -> Result<Prepared> {
        let table = self.table();
        let current = &table.descriptor.schema;
        if req.schema_id != current.schema_id {
            if table.schemas.contains_key(&req.schema_id) {
                return Err(MinkError::SchemaMismatch(format!(
                    "{}: rows are written under schema {}, the table is at schema {}; re-read the table",
                    self.inner.bucket, req.schema_id, current.schema_id
                )));
            }
            return Err(MinkError::invalid(
                "schema_id",
                format!(
                    "{}: the table has no schema {}",
                    self.inner.bucket, req.schema_id
                ),
            ));
        }
        let rows_in = req.batch.num_rows();
        let (mask, batch_schema) = match &req.target_columns {
            Some(targets) => {
                if !table.merger.allows_partial() {
                    return Err(MinkError::invalid(
                        "target_columns",
                        format!(
                            "the {} merge engine does not take partial updates",
                            table.descriptor.properties.merge_engine.name()
                        ),
                    ));
                }
                let mask = target_mask(&table.descriptor, current, targets)?;
                (Some(mask), current.project(targets)?)
            }
            None => (None, current.clone()),
        };
        batch_schema.check_batch(&req.batch)?;
        let deletes: Vec<bool> = match &req.changes {
            None => vec![false; rows_in],
            Some(c) if c.len() != rows_in => {
                return Err(MinkError::invalid(
                    "changes",
                    format!("{} change types for {rows_in} rows", c.len()),
                ));
            }
            Some(c) => c.iter().map(|c| !c.is_addition()).collect(),
        };
        if deletes.iter().any(|d| *d) && table.merger.delete_behavior() == DeleteBehavior::Disable {
            return Err(MinkError::invalid(
                "changes",
                format!(
                    "{}: deletes are disabled on this table (delete_behavior = disable)",
                    self.inner.bucket
                ),
            ));
        }
        // Keys: the primary-key columns as they sit in the batch.
        let key_cols: Vec<usize> = table
            .descriptor
            .primary_key
            .iter()
            .map(|k| {
                batch_schema
                    .index_of(k)
                    .ok_or_else(|| MinkError::invalid("batch", format!("key column {k:?} missing")))
            })
            .collect::<Result<_>>()?;
        let encoder = KeyEncoder::new(&req.batch, &key_cols)?;
        let mut keys = Vec::with_capacity(rows_in);
        for r in 0..rows_in {
            let mut key = Vec::new();
            encoder.encode(r, &mut key)?;
            keys.push(key);
        }
        Ok((mask, deletes, keys, batch_schema))
    }

    /// The rows of a Put, full width (columns outside `batch_schema` null).
    fn full_rows(&self, batch: &RecordBatch, batch_schema: &Schema) -> Result<Vec<Row>> {
        let table = self.table();
        let current = &table.descriptor.schema;
        Ok(rows_of(batch)?
            .into_iter()
            .map(|row| {
                let mut full: Row = vec![None; current.columns.len()];
                for (value, column) in row.into_iter().zip(&batch_schema.columns) {
                    if let Some(i) = current.index_of(&column.name) {
                        full[i] = value;
                    }
                }
                full
            })
            .collect())
    }

    /// The merge of a Put in general: row by row, through the merge engine, each row
    /// seeing the earlier rows of its batch. `before_images`: an update emits its `-U`
    /// (`changelog_image = full`).
    fn merge_rows(
        &self,
        rows: Vec<Row>,
        mask: Option<&[bool]>,
        deletes: Vec<bool>,
        keys: Vec<Vec<u8>>,
        schema: &Schema,
        (merger, before_images): (&Merger, bool),
    ) -> Result<Merged> {
        // Each key this Put changed: its new row and that row's stored encoding
        // (encoded once: compared with the old one, then staged), or `None` if deleted.
        let mut staged: BTreeMap<Vec<u8>, Option<(Row, Vec<u8>)>> = BTreeMap::new();
        let mut changes: Vec<(ChangeType, Row)> = Vec::new();
        for ((row, delete), key) in rows.into_iter().zip(deletes).zip(keys) {
            let (old, old_encoded) = match staged.get(&key) {
                Some(Some((row, encoded))) => (Some(row.clone()), Some(encoded.clone())),
                Some(None) => (None, None),
                None => (self.current(&key, schema)?, None),
            };
            let decision = if delete {
                merger.delete(old.as_ref(), mask)
            } else {
                merger.upsert(old.as_ref(), row, mask)
            };
            match decision {
                Decision::Skip => {}
                Decision::Delete => {
                    if let Some(old) = old {
                        changes.push((ChangeType::Delete, old));
                        staged.insert(key, None);
                    }
                }
                Decision::Write(new) => {
                    let encoded = encode_row(schema, &new)?;
                    match old {
                        None => {
                            changes.push((ChangeType::Insert, new.clone()));
                            staged.insert(key, Some((new, encoded)));
                        }
                        // Unchanged means the same stored encoding, as in
                        // `merge_last_row` (so NaN equals NaN and -0.0 is not 0.0).
                        Some(old)
                            if match old_encoded {
                                Some(o) => o == encoded,
                                None => encode_row(schema, &old)? == encoded,
                            } => {}
                        Some(old) => {
                            if before_images {
                                changes.push((ChangeType::UpdateBefore, old));
                            }
                            changes.push((ChangeType::UpdateAfter, new.clone()));
                            staged.insert(key, Some((new, encoded)));
                        }
                    }
                }
            }
        }
        let batch = if changes.is_empty() {
            None
        } else {
            Some(rows_to_batch(
                schema,
                &changes.iter().map(|(_, r)| r).collect::<Vec<_>>(),
            )?)
        };
        let staged = staged
            .into_iter()
            .map(|(key, new)| (key, new.map(|(_, encoded)| encoded), None))
            .collect();
        Ok(Merged {
            change_types: changes.into_iter().map(|(c, _)| c).collect(),
            batch,
            staged,
            images: None,
        })
    }

    /// What each row of a `last_row` merge replaces ([`KvTablet::merge_last_row`]),
    /// given every row's new encoding: a key's first row against the prewrite buffer
    /// (compared in place, under its lock: nothing is copied out for a row that sits in
    /// a kept batch, returned in source order after [`NEW`]) or one batched store read;
    /// a later row of the same key against the one before it. Also, for each row, the
    /// key's previous row in the batch, and whether this Put should offer its batch to
    /// be kept ([`Prewrite::wants_images`]).
    fn old_values(
        &self,
        keys: &[Vec<u8>],
        encoded: &[Vec<u8>],
        schema: &Schema,
    ) -> Result<OldValues> {
        let mut kept: Vec<RecordBatch> = Vec::new();
        // A kept batch's generation: its source, or `None` once the buffer let it go.
        let mut source_of: HashMap<u64, Option<usize>, FxBuildHasher> = HashMap::default();
        let mut last: HashMap<&[u8], usize, FxBuildHasher> =
            HashMap::with_capacity_and_hasher(keys.len(), FxBuildHasher);
        let mut olds: Vec<Old> = Vec::with_capacity(keys.len());
        let mut previous: Vec<Option<usize>> = Vec::with_capacity(keys.len());
        let mut unstaged: Vec<usize> = Vec::new();
        let (mut hits, mut misses) = (0, 0);
        let keep = {
            let mut prewrite = self.prewrite();
            for (r, key) in keys.iter().enumerate() {
                let before = last.insert(key.as_slice(), r);
                previous.push(before);
                let old = match before {
                    // After its previous row, a key holds that row's encoding (changed
                    // or the same bytes), and that row is its image.
                    Some(p) if encoded[p] == encoded[r] => Old::Same,
                    Some(p) => Old::At(NEW, p),
                    None => match prewrite.get(key).and_then(|v| v.back()) {
                        None => {
                            unstaged.push(r);
                            Old::Unstaged
                        }
                        Some(version) => match &version.value {
                            None => Old::Absent,
                            Some(value) if *value == encoded[r] => Old::Same,
                            Some(value) => {
                                let image = version.image.and_then(|image| {
                                    let source =
                                        source_of.entry(image.batch).or_insert_with(|| {
                                            let batch = prewrite
                                                .image_batch(image.batch, schema.schema_id)?;
                                            kept.push(batch.clone());
                                            Some(NEW + kept.len())
                                        });
                                    match source {
                                        Some(_) => hits += 1,
                                        None => misses += 1,
                                    }
                                    source.map(|source| (source, image.row as usize))
                                });
                                match image {
                                    Some((source, row)) => Old::At(source, row),
                                    None => Old::Stored(value.clone()),
                                }
                            }
                        },
                    },
                };
                olds.push(old);
            }
            prewrite.note_images(hits, misses);
            prewrite.wants_images()
        };
        if !unstaged.is_empty() {
            // In key order: neighbouring reads share the store's pages and blocks.
            unstaged.sort_unstable_by(|a, b| keys[*a].cmp(&keys[*b]));
            let read: Vec<Vec<u8>> = unstaged.iter().map(|r| keys[*r].clone()).collect();
            let values = self.fail_if_fenced(self.inner.store.multi_get(&read))?;
            for (r, value) in unstaged.into_iter().zip(values) {
                olds[r] = match value {
                    None => Old::Absent,
                    Some(value) if value == encoded[r] => Old::Same,
                    Some(value) => Old::Stored(value),
                };
            }
        }
        Ok(OldValues {
            olds,
            previous,
            kept,
            keep,
        })
    }

    /// The merge of a `last_row` Put of full rows without deletes, column-wise: each new
    /// row is encoded for the store straight from the arrays and compared with the old
    /// value as bytes, in place in the prewrite buffer or after one batched store read.
    /// An update's `-U` image is its old row where that sits in a recent Put's batch
    /// (kept by the buffer, [`Prewrite::keep_images`]) or earlier in this one; only old
    /// rows found in neither are decoded. The changelog is interleaved from those
    /// batches by Arrow kernels.
    fn merge_last_row(
        &self,
        batch: &RecordBatch,
        keys: Vec<Vec<u8>>,
        schema: &Schema,
    ) -> Result<Merged> {
        let values = ValueEncoder::new(batch)?;
        let mut size = 0;
        let mut encoded: Vec<Vec<u8>> = (0..batch.num_rows())
            .map(|r| {
                // The next row encodes into a buffer of this one's size.
                let mut row = Vec::with_capacity(size);
                encode_row_at(schema.schema_id, &values, r, &mut row);
                size = row.len();
                row
            })
            .collect();
        let OldValues {
            olds,
            previous,
            kept,
            keep,
        } = self.old_values(&keys, &encoded, schema)?;
        let mut decoded: Vec<Row> = Vec::new();
        let mut change_types = Vec::new();
        let mut indices: Vec<(usize, usize)> = Vec::new();
        // Whether the key's value after this row differs from the one before the Put.
        let mut dirty = vec![false; olds.len()];
        for (r, old) in olds.into_iter().enumerate() {
            // `Some(None)`: an insert; `Some(Some(image))`: an update from that image.
            let change = match old {
                Old::Same | Old::Unstaged => None,
                Old::Absent => Some(None),
                // Encoded from that row under this schema: no decoding.
                Old::At(source, row) => Some(Some((source, row))),
                Old::Stored(old) => {
                    let old_row = self.decode(&old, schema)?;
                    // A row stored under an older schema differs in bytes, not always
                    // in value: compare it encoded under the current one.
                    if row_schema_id(&old)? != schema.schema_id
                        && encode_row(schema, &old_row)? == encoded[r]
                    {
                        None
                    } else {
                        decoded.push(old_row);
                        Some(Some((DECODED, decoded.len() - 1)))
                    }
                }
            };
            dirty[r] = previous[r].is_some_and(|p| dirty[p]);
            let Some(before) = change else { continue };
            dirty[r] = true;
            match before {
                None => change_types.push(ChangeType::Insert),
                Some(image) => {
                    change_types.push(ChangeType::UpdateBefore);
                    indices.push(image);
                    change_types.push(ChangeType::UpdateAfter);
                }
            }
            indices.push((NEW, r));
        }
        let updates = change_types
            .iter()
            .filter(|c| **c == ChangeType::UpdateBefore)
            .count() as u64;
        self.count_before_images(updates - decoded.len() as u64, decoded.len() as u64);
        if indices.is_empty() {
            return Ok(Merged {
                change_types,
                batch: None,
                staged: Vec::new(),
                images: None,
            });
        }
        let new_images = RecordBatch::try_new(schema.to_arrow(), batch.columns().to_vec())?;
        let old_images = rows_to_batch(schema, &decoded.iter().collect::<Vec<_>>())?;
        let mut sources = vec![&old_images, &new_images];
        sources.extend(&kept);
        let changelog = interleave_record_batch(&sources, &indices)?;
        // A key is staged at its last row in the batch, if the Put changed it: the rows
        // after its last change hold the same bytes.
        let mut superseded = vec![false; previous.len()];
        for p in previous.iter().flatten() {
            superseded[*p] = true;
        }
        // The batch kept for later `-U` images holds only the staged rows, copied out
        // of the request, whose buffers may be shared beyond this Put (a Flight body):
        // what it holds is then what it is counted as. A request whose rows are all
        // staged and whose buffers are its own is kept as it is (below).
        let mut take: Vec<u32> = Vec::new();
        // The keys and values move into the buffer, not copied.
        let mut keys = keys;
        let staged = (0..keys.len())
            .filter(|r| dirty[*r] && !superseded[*r])
            .map(|r| {
                let image = keep
                    .then(|| u32::try_from(r).ok())
                    .flatten()
                    .and_then(|row| {
                        take.push(row);
                        u32::try_from(take.len() - 1).ok()
                    });
                let value = std::mem::take(&mut encoded[r]);
                (std::mem::take(&mut keys[r]), Some(value), image)
            })
            .collect();
        let images = match keep {
            true => Some(kept_batch(new_images, take)?),
            false => None,
        };
        Ok(Merged {
            change_types,
            batch: Some(changelog),
            staged,
            images,
        })
    }

    /// The merge of a `last_row` Put of full rows without deletes on a table whose
    /// changelog carries no before images (`changelog_image = wal`): nothing is read.
    /// Every row is a `+U` of itself, and each key's last row in the batch is staged.
    fn merge_wal(
        &self,
        batch: &RecordBatch,
        keys: Vec<Vec<u8>>,
        schema: &Schema,
    ) -> Result<Merged> {
        let values = ValueEncoder::new(batch)?;
        let mut latest: HashMap<Vec<u8>, Vec<u8>, FxBuildHasher> =
            HashMap::with_capacity_and_hasher(keys.len(), FxBuildHasher);
        for (r, key) in keys.into_iter().enumerate() {
            let mut encoded = Vec::new();
            encode_row_at(schema.schema_id, &values, r, &mut encoded);
            latest.insert(key, encoded);
        }
        Ok(Merged {
            change_types: vec![ChangeType::UpdateAfter; batch.num_rows()],
            batch: Some(RecordBatch::try_new(
                schema.to_arrow(),
                batch.columns().to_vec(),
            )?),
            staged: latest
                .into_iter()
                .map(|(k, v)| (k, Some(v), None))
                .collect(),
            images: None,
        })
    }

    fn count_before_images(&self, kept: u64, decoded: u64) {
        for (i, (n, source)) in [(kept, "kept"), (decoded, "decoded")]
            .into_iter()
            .enumerate()
        {
            if n > 0 {
                self.inner.before_images[i].fetch_add(n, Ordering::Relaxed);
                metrics::counter!("mink_kv_before_images_total", "source" => source).increment(n);
            }
        }
    }

    /// How many `-U` images the column-wise merge took from a batch at hand, and how
    /// many it decoded from the stored row, since the tablet opened.
    pub fn before_images(&self) -> BeforeImages {
        BeforeImages {
            kept: self.inner.before_images[0].load(Ordering::Relaxed),
            decoded: self.inner.before_images[1].load(Ordering::Relaxed),
        }
    }

    /// Applies a Put (see the module docs). Returns where its changelog landed.
    pub async fn put(&self, req: PutRequest) -> Result<Appended> {
        self.put_corked(req, None).await
    }

    /// [`KvTablet::put`] as one part of a write over several buckets: `cork` (see
    /// [`mink_wal::Cork`]) is released as soon as the changelog is on its way (or
    /// will not be), so that the parts share one WAL upload.
    pub async fn put_corked(
        &self,
        req: PutRequest,
        cork: Option<mink_wal::Cork>,
    ) -> Result<Appended> {
        self.submit_put(req, cork).await?.wait().await
    }

    /// The first half of a Put: returns once its changelog has its offsets and is on
    /// its way (or it is known to be a duplicate, or to change nothing). Submissions
    /// are ordered: a caller that submits A then B has A merged and logged before B
    /// (a Kafka connection submits its requests' Puts one at a time, as it does its
    /// appends). [`PendingPut::wait`] is the second half, durability.
    ///
    /// Decide, then act: the sequence is checked under the bucket's merge lock
    /// ([`LogTablet::check_sequence`]), the merge reads and decides the changelog
    /// ([`merge_path`] picks how, [`KvTablet::merge`] makes it), and
    /// [`KvTablet::log_and_stage`] submits it and stages the new rows.
    pub async fn submit_put(
        &self,
        req: PutRequest,
        cork: Option<mink_wal::Cork>,
    ) -> Result<PendingPut> {
        let mut cork = cork;
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let prepared = self.prepare(&req)?;
        let kafka = req.kafka.is_some();
        if let Err(refused) = self.check_store_writable().await {
            // A retry of a Put already logged is answered as the duplicate it is: it
            // would change nothing, whatever the store. (Read outside the lock: once a
            // sequence is in its writer's window it stays a duplicate.)
            if let Ok(Some(duplicate)) = self.inner.log.check_sequence(
                req.writer_id,
                req.batch_sequence,
                req.last_sequence(),
                kafka,
            ) {
                return Ok(PendingPut {
                    tablet: self.clone(),
                    step: PendingStep::Duplicate(duplicate),
                });
            }
            return Err(refused);
        }
        // A Put ahead of its writer's next sequence waits a little for the ones before
        // it (pipelined requests may arrive out of order), outside the merge lock so
        // that they can be merged meanwhile; then it is checked under the lock, and a
        // gap still open is refused: a Put is never merged before its predecessor. A
        // Kafka producer's batches arrive in order (one connection submits them one at
        // a time): one ahead is refused at once, as its appends are.
        if !kafka {
            self.inner
                .log
                .await_predecessors(req.writer_id, req.batch_sequence, req.last_sequence())
                .await?;
        }
        let guard = self.inner.puts.lock().await;
        if let Some(duplicate) = self.inner.log.check_sequence(
            req.writer_id,
            req.batch_sequence,
            req.last_sequence(),
            kafka,
        )? {
            drop(guard);
            drop(cork.take());
            return Ok(PendingPut {
                tablet: self.clone(),
                step: PendingStep::Duplicate(duplicate),
            });
        }
        // Puts that passed the store check while the buffer had room may have waited
        // here meanwhile, each with its rows: checked again under the lock, the rows
        // waiting for a failing store stay within twice the bound and one Put.
        if let Some(refusal) = self.store_refusal() {
            drop(guard);
            drop(cork.take());
            return Err(refusal);
        }
        // Everything that can fail is done before the submit: once the changelog is on
        // its way the rows must be staged, and an error would no longer mean "not
        // written" to the client.
        let (schema, merger, image) = {
            let table = self.table();
            (
                table.descriptor.schema.clone(),
                table.merger.clone(),
                table.descriptor.properties.changelog_image,
            )
        };
        let merged = self.merge(&req, prepared, &schema, &merger, image)?;
        let step = self.log_and_stage(&req, merged, &schema, &mut cork).await;
        drop(cork.take());
        drop(guard);
        Ok(PendingPut {
            tablet: self.clone(),
            step: step?,
        })
    }

    /// A Put's changelog and staged rows, by the path [`merge_path`] picks for it.
    fn merge(
        &self,
        req: &PutRequest,
        (mask, deletes, keys, batch_schema): Prepared,
        schema: &Schema,
        merger: &Merger,
        image: ChangelogImage,
    ) -> Result<Merged> {
        let path = merge_path(PutShape {
            kafka: req.kafka.is_some(),
            partial: mask.is_some(),
            last_row: merger.is_last_row(),
            // Not when an alter_table changed the schema since `prepare` checked it.
            current_schema: batch_schema.schema_id == schema.schema_id,
            deletes: deletes.contains(&true),
            image,
        });
        match path {
            MergePath::Records => self.merge_records(&req.batch, &deletes, keys, schema),
            MergePath::Wal => self.merge_wal(&req.batch, keys, schema),
            MergePath::LastRow => self.merge_last_row(&req.batch, keys, schema),
            MergePath::Rows { before_images } => {
                let rows = self.full_rows(&req.batch, &batch_schema)?;
                self.merge_rows(
                    rows,
                    mask.as_deref(),
                    deletes,
                    keys,
                    schema,
                    (merger, before_images),
                )
            }
        }
    }

    /// Submits a merged Put to the log, under the merge lock (held by the caller):
    /// its changelog, then its new rows staged in the prewrite buffer at the
    /// changelog's last offset; or, when it changed nothing, its sequence marker. The
    /// cork is released once the batch is on its way.
    async fn log_and_stage(
        &self,
        req: &PutRequest,
        merged: Merged,
        schema: &Schema,
        cork: &mut Option<mink_wal::Cork>,
    ) -> Result<PendingStep> {
        let Merged {
            change_types,
            batch,
            staged,
            images,
        } = merged;
        // No flush chooses what to write between the submit (offsets) and the staging
        // below (a store write may run meanwhile).
        let flushes = self.inner.flushes.lock().await;
        // A flush that failed the tablet (fenced) while this Put merged cleared the
        // buffer under it: the merge may have read older rows, and "nothing changed"
        // may be as wrong as a changelog. `fail` marks the tablet failed before it
        // clears the buffer, so a merge that read the cleared buffer finds the mark
        // here (and one that read it whole made a true changelog).
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let Some(batch) = batch else {
            // Nothing changed; the writer's sequence still advances, durably: a
            // sequence marker takes its place in the log (no rows). The merge may have
            // read versions staged by Puts whose appends are not durable yet; the
            // marker is acknowledged after them, in WAL order, and fails with them.
            let marker = self
                .inner
                .log
                .submit_marker(
                    req.writer_id,
                    (req.batch_sequence, req.last_sequence()),
                    schema.schema_id,
                    req.kafka.is_some(),
                )
                .await;
            drop(cork.take());
            drop(flushes);
            return Ok(PendingStep::Empty(marker?));
        };
        let append = AppendRequest {
            writer_id: req.writer_id,
            first_sequence: req.batch_sequence,
            last_sequence: req.last_sequence(),
            schema_id: schema.schema_id,
            change_types: Some(change_types),
            batch,
            ipc: None,
        };
        let submitted = if req.kafka.is_some() {
            self.inner.log.submit_producer(append).await
        } else {
            self.inner.log.submit_in_order(append).await
        };
        drop(cork.take());
        let submitted = submitted?;
        if submitted.is_duplicate() {
            // Cannot happen under the put lock; answer as the duplicate it is.
            return Ok(PendingStep::Duplicate(submitted));
        }
        let (_, last_offset) = submitted.offsets();
        if self.inner.staging_paused.load(Ordering::Acquire) {
            self.staging_pause().await;
        }
        let mut prewrite = self.prewrite();
        let hw = self.high_watermark_under(&prewrite);
        // A quarter of the buffer's bound may hold the batches its `-U` images come
        // from; rows staged from a batch that does not fit have none.
        let generation = images.and_then(|images| {
            prewrite.keep_images(schema.schema_id, images, self.write_back_bytes() / 4)
        });
        let staged = staged.into_iter().map(|(key, value, row)| {
            let image = generation
                .zip(row)
                .map(|(batch, row)| ImageRef { batch, row });
            (key, value, image)
        });
        prewrite.stage(staged, last_offset, hw);
        prewrite.shed_images(self.write_back_bytes());
        drop(prewrite);
        drop(flushes);
        Ok(PendingStep::Written(submitted))
    }

    /// A Kafka batch's merge (a compacted topic's Produce under `last_row`): each
    /// record is one change, whatever the key held, so that every record has its
    /// offset as in Kafka's log: `+U` with the record, or `-D` with the tombstone
    /// itself (its key, headers and timestamp; no value). Nothing is read.
    fn merge_records(
        &self,
        batch: &RecordBatch,
        deletes: &[bool],
        keys: Vec<Vec<u8>>,
        schema: &Schema,
    ) -> Result<Merged> {
        let values = ValueEncoder::new(batch)?;
        let mut latest: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::with_capacity(keys.len());
        for (r, key) in keys.into_iter().enumerate() {
            if deletes[r] {
                latest.insert(key, None);
            } else {
                let mut encoded = Vec::new();
                encode_row_at(schema.schema_id, &values, r, &mut encoded);
                latest.insert(key, Some(encoded));
            }
        }
        Ok(Merged {
            change_types: deletes
                .iter()
                .map(|d| {
                    if *d {
                        ChangeType::Delete
                    } else {
                        ChangeType::UpdateAfter
                    }
                })
                .collect(),
            batch: Some(RecordBatch::try_new(
                schema.to_arrow(),
                batch.columns().to_vec(),
            )?),
            staged: latest.into_iter().map(|(k, v)| (k, v, None)).collect(),
            images: None,
        })
    }

    /// A store read's result; `Fenced` fails the tablet: its store was taken over by
    /// a newer tablet, or closed under it (fjall after a failed write, see
    /// `FjallStore`), and the node reopens a failed tablet from the log. The read
    /// itself is answered `Unavailable`: a retry meets the reopened tablet.
    fn fail_if_fenced<T>(&self, read: Result<T>) -> Result<T> {
        match read {
            Err(e @ MinkError::Fenced(_)) => {
                let why = self.fail(e).to_string();
                Err(MinkError::Unavailable(format!(
                    "{}: {why}; retry",
                    self.inner.bucket
                )))
            }
            other => other,
        }
    }

    /// Fails the tablet after an append that did not become durable: staged rows are
    /// dropped and nothing more is accepted; the tablet is reopened from the log.
    /// Returns the error, for the caller to answer with.
    fn fail(&self, e: MinkError) -> MinkError {
        // The failure first: nothing may see the emptied buffer as a serving tablet's.
        *self.inner.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.clone());
        self.prewrite().clear();
        e
    }

    /// Runs `f` on the store as this tablet's claim allows: `Fenced` once a newer
    /// tablet of the bucket claimed the store (see [`crate::store::Owner`]).
    fn with_store<T>(&self, f: impl FnOnce(&dyn KvNamespace) -> Result<T>) -> Result<T> {
        let store = self.inner.store.as_ref();
        store
            .owner()
            .with(self.inner.claim, || f(store))
            .map_err(|e| match e {
                MinkError::Fenced(why) => {
                    MinkError::Fenced(format!("{}: {why}", self.inner.bucket))
                }
                other => other,
            })
    }

    /// Writes each key's newest durable version the store lacks into the store, with
    /// the high watermark as its offset ([`Prewrite::dirty`], [`Prewrite::written`]).
    /// A tablet superseded on its store fails instead: its rows may be older than the
    /// store's.
    ///
    /// Runs beside merges (on another core), in this order: the versions to write are
    /// taken from the buffer, written to the store, and only then may leave the buffer
    /// (past its bound; below it they stay as clean copies). A
    /// merge reads a key from the buffer first and from the store only when the buffer
    /// has no version of it; a key the buffer lacks is in no flush in progress but one
    /// that already wrote it to the store, so the merge reads the newest value either
    /// way. Nothing stages versions while a merge runs but that merge itself, after
    /// it. Flushes are serialized among themselves (`store_writes`): two at once could
    /// write an older version, and an older flushed offset, over a newer one. Puts stage
    /// while the store is written (where flushes run beside merges): they hold
    /// `flushes` from their submit to their
    /// staging, and the flush holds it only while it takes the high watermark and the
    /// versions below it, so every version staged during the write is at or above that
    /// high watermark, which the write and the release after it leave alone.
    ///
    /// A store that prefers its writes between merges
    /// ([`KvNamespace::flush_beside_merges`]) flushes under the put lock as well.
    async fn flush(&self) -> Result<()> {
        let _puts = match self.inner.store.flush_beside_merges() {
            true => None,
            false => Some(self.inner.puts.lock().await),
        };
        // Owned: the store write below runs on a blocking thread with the guard, so a
        // cancelled caller cannot let another flush in while it is under way.
        let writes = self.inner.store_writes.clone().lock_owned().await;
        // A failed tablet dropped its staged rows (some acknowledged, not yet in the
        // store): it writes nothing more, so that the store's offset stays where a
        // replay from the log finds them. A failing flush held this lock.
        if self.failure().is_some() {
            return Ok(());
        }
        // While the store fails it is tried once per STORE_RETRY, not once per caller:
        // the flushes queued behind a failing one (Puts' waits, arrivals, releases,
        // snapshots, all let in at once when the retry was due) answer its error.
        if let Some(e) = self.store_failed_lately() {
            return Err(e);
        }
        let (hw, ops) = {
            let _choice = self.inner.flushes.lock().await;
            let hw = self.inner.log.high_watermark();
            let prewrite = self.prewrite();
            // Again under the buffer's lock: a failure since the check above emptied
            // the buffer (`fail` marks the tablet failed first, then clears it), and
            // writing nothing at `hw` would record an offset past acknowledged rows
            // the store never got. A failure after this read leaves `ops` a true state.
            if self.failure().is_some() {
                return Ok(());
            }
            (hw, prewrite.dirty(hw))
        };
        let ops: Vec<KvOp> = ops
            .into_iter()
            .map(|(key, value)| match value {
                Some(bytes) => KvOp::Put(key, bytes),
                None => KvOp::Delete(key),
            })
            .collect();
        // The write and the buffer's release of what it wrote run on a blocking thread:
        // a store write of a full buffer takes tens of milliseconds, and on a runtime
        // thread it would hold up every task queued behind it there (the Puts whose
        // merges should run beside it among them).
        let tablet = self.clone();
        let write = move || {
            let _writes = writes;
            tablet.write_store(ops, hw)
        };
        let written = match tokio::task::spawn_blocking(write).await {
            Ok(written) => written,
            Err(e) => {
                // A write that panicked fails the store as a refused one does: tried
                // again once per STORE_RETRY, Puts refused past twice the bound.
                let e = MinkError::Internal(format!(
                    "{}: a KV store write did not finish: {e}",
                    self.inner.bucket
                ));
                *self
                    .inner
                    .store_failure
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) =
                    Some((e.clone(), tokio::time::Instant::now()));
                Err(e)
            }
        };
        if written.is_ok() && self.inner.flush_again.swap(false, Ordering::AcqRel) {
            // Puts left their store write to this one while it ran (`flush_if_due`),
            // but it chose its rows before theirs were staged: a task of its own
            // writes them if they are still due, so that this caller's answer does not
            // wait for a second write and the buffer does not stay past its bound when
            // the Puts stop.
            tokio::spawn(self.flush_if_still_due());
        }
        written
    }

    /// [`KvTablet::flush_if_due`] in a task of its own (boxed: it is spawned from
    /// `flush`, which it calls).
    fn flush_if_still_due(&self) -> futures::future::BoxFuture<'static, ()> {
        let tablet = self.clone();
        Box::pin(async move {
            if let Err(e) = tablet.flush_if_due().await {
                tracing::warn!(bucket = %tablet.inner.bucket, "a KV store write failed; the rows wait in the prewrite buffer: {e}");
            }
        })
    }

    /// The store write of a flush ([`KvTablet::flush`], whose `store_writes` guard the
    /// caller holds): `ops` at `hw`, then the buffer lets go of what the store now has.
    fn write_store(&self, ops: Vec<KvOp>, hw: i64) -> Result<()> {
        // With nothing to write, the store's offset still goes to the high watermark
        // when it is behind (sequence markers take offsets and stage nothing): a
        // snapshot then covers them, and an idle bucket is not snapshotted again.
        let write = |store: &dyn KvNamespace| {
            if ops.is_empty() && store.flushed_offset()?.is_some_and(|o| o >= hw) {
                return Ok(());
            }
            store.write(&ops, hw)
        };
        let written = self.with_store(write);
        *self
            .inner
            .store_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = written
            .as_ref()
            .err()
            .map(|e| (e.clone(), tokio::time::Instant::now()));
        match written {
            Ok(()) => {}
            Err(e @ MinkError::Fenced(_)) => return Err(self.fail(e)),
            Err(e) => {
                metrics::counter!("mink_kv_store_write_failures_total").increment(1);
                return Err(e);
            }
        }
        self.prewrite().written(hw, self.write_back_bytes());
        metrics::counter!("mink_kv_store_writes_total").increment(1);
        Ok(())
    }

    /// The offset the local store holds the bucket's state at (`None`: it holds
    /// nothing yet). A replay after a crash starts here; rows from here to the high
    /// watermark are in the prewrite buffer.
    pub fn store_offset(&self) -> Result<Option<i64>> {
        self.inner.store.flushed_offset()
    }

    /// The prewrite buffer's bound in bytes (see [`KvTablet::set_write_back_bytes`]).
    fn write_back_bytes(&self) -> u64 {
        self.inner.write_back_bytes.load(Ordering::Relaxed)
    }

    /// Bounds the prewrite buffer (`kv.prewrite_buffer_bytes_max`): durable rows stay in
    /// it, ahead of the store, until it holds more than `bytes` or `bytes` were staged
    /// since the last store write; then a Put's wait writes them to the store (each
    /// key's newest version once), and, past the bound, the ones the store now has
    /// leave the buffer. While a store write is in progress the buffer may hold up to
    /// twice the bound ([`KvTablet::flush_if_due`]). 0 writes the store after every Put.
    pub fn set_write_back_bytes(&self, bytes: u64) {
        self.inner.write_back_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Counts the prewrite buffer against the node's `budget`: a Put that finds the
    /// node's buffers past it writes the store and lets its clean rows go.
    pub fn set_write_back_budget(&self, budget: Arc<WriteBackBudget>) {
        self.prewrite().set_budget(budget);
    }

    /// Refuses a Put, before anything happens, while the store cannot be written and
    /// the buffer holds more than twice its bound: its rows would wait in memory with
    /// no bound. What the buffer holds is durable (in the log) either way. A store
    /// write is tried first; one that succeeds lets Puts in again.
    async fn check_store_writable(&self) -> Result<()> {
        let Some(refusal) = self.store_refusal() else {
            return Ok(());
        };
        if !self.store_retry_later() {
            return match self.flush().await {
                Ok(()) => Ok(()),
                // Fenced: the answer that redirects the client to the new leader.
                Err(e @ MinkError::Fenced(_)) => Err(e),
                Err(e) => Err(self.store_unavailable(&e)),
            };
        }
        Err(refusal)
    }

    /// The refusal of a Put while the store cannot be written and the rows waiting for
    /// it are past twice the buffer's bound (or the node's buffers past theirs);
    /// `None` otherwise.
    fn store_refusal(&self) -> Option<MinkError> {
        let (error, _) = self
            .inner
            .store_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let full = {
            let prewrite = self.prewrite();
            prewrite.rows_bytes() > self.write_back_bytes().saturating_mul(2)
                || prewrite.node_over()
        };
        full.then(|| self.store_unavailable(&error))
    }

    fn store_unavailable(&self, error: &MinkError) -> MinkError {
        MinkError::Unavailable(format!(
            "{}: the local KV store cannot be written ({error}), and the rows waiting for it \
             are past twice kv.prewrite_buffer_bytes_max or the node's \
             kv.prewrite_buffers_bytes_max; the Put was not applied: retry",
            self.inner.bucket
        ))
    }

    /// Writes the durable rows to the store when the buffer is past its bound. While
    /// the store fails, at most once per [`STORE_RETRY`].
    async fn flush_if_due(&self) -> Result<()> {
        let bound = self.write_back_bytes();
        let (own, node, past_twice) = {
            let mut prewrite = self.prewrite();
            // Kept batches go before rows do, and need no store write.
            prewrite.shed_images(bound);
            let rows = prewrite.rows_bytes();
            (
                rows > bound || prewrite.staged_since_write() > bound,
                prewrite.node_over() && rows > 0,
                rows > bound.saturating_mul(2),
            )
        };
        if !(own || node) || self.store_retry_later() {
            return Ok(());
        }
        // A store write in progress (or a snapshot's read): this Put's wait does not
        // queue behind it, so that the other writers' Puts keep merging beside it
        // instead of all waiting for it. The write chose its rows before these were
        // staged; when it ends, a task of its own writes them if they are still due
        // (`flush_again`, see `flush`), unless a Put's wait gets there first. Past
        // twice the bound, or past the node's, the wait waits: that is the buffer's
        // backpressure.
        if !node && !past_twice && self.inner.store_writes.try_lock().is_err() {
            self.inner.flush_again.store(true, Ordering::Release);
            return Ok(());
        }
        self.flush().await?;
        if node && !own {
            self.prewrite().note_pressure();
        }
        Ok(())
    }

    /// Whether the last store write failed less than [`STORE_RETRY`] ago.
    fn store_retry_later(&self) -> bool {
        self.store_failed_lately().is_some()
    }

    /// The last store write's error when it failed less than [`STORE_RETRY`] ago.
    fn store_failed_lately(&self) -> Option<MinkError> {
        self.inner
            .store_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(_, at)| at.elapsed() < STORE_RETRY)
            .map(|(e, _)| e.clone())
    }

    /// Refuses reads on a failed tablet: failing dropped its staged rows, some of them
    /// acknowledged and not yet in the store, so what it would answer may be older than
    /// what was acknowledged. Reopened from the log, it answers again.
    fn check_readable(&self) -> Result<()> {
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Looks up rows by full primary key. `keys` holds the primary-key columns.
    pub fn lookup(&self, keys: &RecordBatch) -> Result<LookupResult> {
        self.check_readable()?;
        let (schema, pk_names) = {
            let t = self.table();
            (
                t.descriptor.schema.clone(),
                t.descriptor.primary_key.clone(),
            )
        };
        let cols: Vec<usize> = pk_names
            .iter()
            .map(|k| {
                keys.schema().index_of(k).map_err(|_| {
                    MinkError::invalid(
                        "keys",
                        format!("the key batch lacks primary-key column {k:?}"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        for (i, name) in pk_names.iter().enumerate() {
            let expected = schema.column(name).map(|c| c.data_type.to_arrow());
            if Some(keys.column(cols[i]).data_type()) != expected.as_ref() {
                return Err(MinkError::SchemaMismatch(format!(
                    "key column {name:?} has the wrong type"
                )));
            }
        }
        let encoder = KeyEncoder::new(keys, &cols)?;
        let mut encoded = Vec::with_capacity(keys.num_rows());
        for r in 0..keys.num_rows() {
            let mut key = Vec::new();
            encoder.encode(r, &mut key)?;
            encoded.push(key);
        }
        // Every key's newest version below the high watermark (acknowledged), from
        // the buffer, then from the store for the keys it lacks.
        let staged: Vec<Option<Option<Vec<u8>>>> = {
            let prewrite = self.prewrite();
            // Under the buffer's lock: a failure emptied it, and the store alone may
            // be older than acknowledged Puts (see `flush`).
            self.check_readable()?;
            let hw = self.high_watermark_under(&prewrite);
            encoded
                .iter()
                .map(|key| prewrite.visible(key, hw))
                .collect()
        };
        let mut found = Vec::new();
        let mut key_index = Vec::new();
        for (r, (key, staged)) in encoded.iter().zip(staged).enumerate() {
            if let Some(row) = self.buffered_or_stored(key, staged, &schema)? {
                found.push(row);
                key_index.push(r as u32);
            }
        }
        Ok(LookupResult {
            batch: rows_to_batch(&schema, &found.iter().collect::<Vec<_>>())?,
            key_index,
        })
    }

    /// Rows whose key starts with the encoded `prefix` (the bucket key, when it leads
    /// the primary key), at most `limit`, in key order.
    pub fn prefix_lookup(&self, prefix: &[u8], limit: usize) -> Result<RecordBatch> {
        self.check_readable()?;
        let schema = self.table().descriptor.schema.clone();
        // The buffer before the store (see `buffered_or_stored`).
        let staged: Vec<(Vec<u8>, Option<Vec<u8>>)> = {
            let prewrite = self.prewrite();
            self.check_readable()?;
            let hw = self.high_watermark_under(&prewrite);
            prewrite.visible_with_prefix(prefix, hw)
        };
        // Only a staged delete can take one of the store's first `limit` rows away.
        let deletes = staged.iter().filter(|(_, v)| v.is_none()).count();
        let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = self
            .fail_if_fenced(
                self.inner
                    .store
                    .prefix(prefix, limit.saturating_add(deletes)),
            )?
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        merged.extend(staged);
        let rows: Vec<Row> = merged
            .into_values()
            .flatten()
            .take(limit)
            .map(|v| self.decode(&v, &schema))
            .collect::<Result<_>>()?;
        rows_to_batch(&schema, &rows.iter().collect::<Vec<_>>())
    }

    /// Writes a snapshot of the bucket's state to object storage (flushing first).
    /// Returns `None` when the tablet has no snapshot store.
    pub async fn snapshot(&self) -> Result<Option<SnapshotInfo>> {
        let Some(snapshots) = self.inner.snapshots.clone() else {
            return Ok(None);
        };
        let mut latest = self.inner.latest_snapshot.lock().await;
        let info = self.write_snapshot(&snapshots).await?;
        *latest = Some(info.clone());
        Ok(Some(info))
    }

    /// The newest snapshot of the bucket when it was written less than `age_max` ago
    /// (by this tablet, or found in the store, e.g. written by an earlier leader);
    /// otherwise a new one, written now. Readers of a bucket's state use this, so that
    /// reads write at most one snapshot per `age_max` rather than one each; concurrent
    /// callers wait for one write. The state is the bucket's at the snapshot's
    /// `log_offset`: the changelog from there on brings it up to date. Returns `None`
    /// when the tablet has no snapshot store.
    pub async fn recent_snapshot(
        &self,
        age_max: std::time::Duration,
    ) -> Result<Option<SnapshotInfo>> {
        let Some(snapshots) = self.inner.snapshots.clone() else {
            return Ok(None);
        };
        let mut latest = self.inner.latest_snapshot.lock().await;
        // One found in the store has its rows counted only when it is served: one too
        // old is replaced without being read.
        let mut found = None;
        if latest.is_none() {
            found = snapshots.newest_uncounted().await?;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let age_max_ms = i64::try_from(age_max.as_millis()).unwrap_or(i64::MAX);
        let usable = |info: &SnapshotInfo| {
            now_ms.saturating_sub(info.written_at_ms) < age_max_ms
                && info.log_offset <= self.inner.log.high_watermark()
        };
        if let Some(mut info) = found.filter(|info| usable(info)) {
            info.rows = snapshots.count_rows(info.log_offset).await?;
            *latest = Some(info.clone());
            return Ok(Some(info));
        }
        if let Some(info) = latest.as_ref().filter(|info| usable(info)) {
            return Ok(Some(info.clone()));
        }
        let info = self.write_snapshot(&snapshots).await?;
        *latest = Some(info.clone());
        Ok(Some(info))
    }

    /// Writes a snapshot (the caller holds `latest_snapshot`).
    ///
    /// The store's offset and a consistent iterator over it are taken together under
    /// the claim, with no flush between; the rows are then read from that iterator
    /// (an MVCC snapshot of the store) a batch at a time while flushes go on, and
    /// uploaded as they are encoded. Memory holds a batch and the upload's parts, not
    /// the bucket's state.
    async fn write_snapshot(&self, snapshots: &SnapshotStore) -> Result<SnapshotInfo> {
        self.flush().await?;
        let (offset, mut pairs, schema) = {
            let _guard = self.inner.store_writes.lock().await;
            // A failed tablet's store may be behind what it acknowledged (its buffer
            // was dropped): it writes no snapshot.
            if let Some(e) = self.failure() {
                return Err(e);
            }
            let (offset, pairs) = self.with_store(|store| {
                let offset = store
                    .flushed_offset()?
                    .unwrap_or(self.inner.log.log_start());
                Ok((offset, store.snapshot()?))
            })?;
            // The rows the store now has leave the buffer: a bucket that goes idle
            // keeps no cache past its next snapshot.
            self.prewrite().written(offset, 0);
            (offset, pairs, self.table().descriptor.schema.clone())
        };
        // Compressed as the table's log is (its `compression` property).
        let mut writer = snapshots.writer(&schema, offset, self.inner.log.compression())?;
        loop {
            // Reading the store is synchronous (up to SNAPSHOT_BATCH_BYTES of rows read
            // and decoded at a time): on a blocking thread, not a runtime thread.
            let (tablet, schema) = (self.clone(), schema.clone());
            let read = move || {
                let batch = tablet.read_snapshot_batch(&mut pairs, &schema);
                (pairs, batch)
            };
            let (rest, batch) = tokio::task::spawn_blocking(read).await.map_err(|e| {
                MinkError::Internal(format!(
                    "{}: a KV snapshot read did not finish: {e}",
                    self.inner.bucket
                ))
            })?;
            pairs = rest;
            let Some(batch) = batch? else { break };
            writer.write(&batch).await?;
        }
        let info = writer.finish().await?;
        // Every row below the snapshot's offset is durable in it: the changelog below
        // may go (the log never trims above this).
        self.inner.log.allow_trim_to(info.log_offset);
        Ok(info)
    }

    /// The next batch of a snapshot from the store's iterator: up to
    /// `SNAPSHOT_BATCH_ROWS` rows or `SNAPSHOT_BATCH_BYTES` of stored rows; `None` at
    /// its end.
    fn read_snapshot_batch(
        &self,
        pairs: &mut crate::store::PairIter,
        schema: &Schema,
    ) -> Result<Option<RecordBatch>> {
        let mut rows = Vec::with_capacity(crate::snapshot::SNAPSHOT_BATCH_ROWS);
        let mut bytes = 0;
        for pair in pairs.by_ref() {
            let (_, value) = pair?;
            bytes += value.len();
            rows.push(self.decode(&value, schema)?);
            if rows.len() == crate::snapshot::SNAPSHOT_BATCH_ROWS
                || bytes >= crate::snapshot::SNAPSHOT_BATCH_BYTES
            {
                break;
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        rows_to_batch(schema, &rows.iter().collect::<Vec<_>>()).map(Some)
    }

    /// Test hook: the next Put of this tablet that logs a changelog (not a no-op or a
    /// duplicate) stops between its submit (it has its offsets; its changelog is on
    /// its way) and the staging of its rows, until `release` is notified. Whatever a
    /// test runs meanwhile runs in the window the `flushes` lock guards.
    #[doc(hidden)]
    pub fn pause_next_staging(&self) -> Arc<StagingPause> {
        let pause = Arc::new(StagingPause::default());
        let mut armed = self
            .inner
            .staging_pause
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *armed = Some(pause.clone());
        self.inner.staging_paused.store(true, Ordering::Release);
        pause
    }

    async fn staging_pause(&self) {
        let pause = {
            let mut armed = self
                .inner
                .staging_pause
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let pause = armed.take();
            // Under the lock: a pause armed meanwhile keeps the flag set.
            self.inner
                .staging_paused
                .store(armed.is_some(), Ordering::Release);
            pause
        };
        if let Some(pause) = pause {
            // The window this hook opens is the one the `flushes` lock guards: a Put
            // held here must hold it (the test that holds one fails on this panic).
            pause.reached.notify_one();
            assert!(
                self.inner.flushes.try_lock().is_err(),
                "a Put reached its staging without holding the flushes lock"
            );
            pause.release.notified().await;
        }
    }

    /// Writes the durable rows to the store and lets every one go from the buffer (the
    /// rows not durable yet stay): what an idle bucket does when its node's buffers are
    /// pressed ([`KvTablet::run_snapshots`]). Safe beside Puts, flushes and snapshots.
    pub async fn release_write_back(&self) -> Result<()> {
        self.flush().await?;
        let _guard = self.inner.store_writes.lock().await;
        let mut prewrite = self.prewrite();
        let flushed = prewrite.flushed();
        prewrite.written(flushed, 0);
        Ok(())
    }

    /// Writes a snapshot every `interval` until `shutdown` resolves (the node records
    /// each in the metadata log through `on_snapshot`). Between snapshots it checks
    /// every second whether the tablet sat idle while the node's write-back bound made
    /// another tablet let its rows go; then this one gives its own up.
    pub async fn run_snapshots(
        &self,
        interval: std::time::Duration,
        on_snapshot: impl Fn(SnapshotInfo),
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut due = tokio::time::Instant::now() + interval;
        let mut seen = self.inner.log.high_watermark();
        let mut pressure = self.prewrite().node_pressure();
        // Without a snapshot store the idle check goes on, and snapshots stop.
        let mut snapshots = true;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep_until(match snapshots {
                    true => due.min(tokio::time::Instant::now() + IDLE_CHECK),
                    false => tokio::time::Instant::now() + IDLE_CHECK,
                }) => {}
            }
            if self.failure().is_some() {
                return;
            }
            // A tablet idle since the last check gives its write-back rows up when the
            // node's bound made another tablet let its own go meanwhile: the busy ones
            // keep their caches, not the idle ones.
            let hw = self.inner.log.high_watermark();
            let idle = std::mem::replace(&mut seen, hw) == hw;
            let (held, now_pressure) = {
                let prewrite = self.prewrite();
                (prewrite.bytes(), prewrite.node_pressure())
            };
            let pressed = std::mem::replace(&mut pressure, now_pressure) != now_pressure;
            if idle
                && pressed
                && held > 0
                && let Err(e) = self.release_write_back().await
            {
                tracing::warn!(bucket = %self.inner.bucket, "releasing the write-back rows of an idle bucket: {e}");
            }
            if !snapshots || tokio::time::Instant::now() < due {
                continue;
            }
            due = tokio::time::Instant::now() + interval;
            // Nothing new since the last snapshot: an idle bucket costs no request.
            let covered = self
                .inner
                .latest_snapshot
                .lock()
                .await
                .as_ref()
                .map(|s| s.log_offset);
            if covered.is_some_and(|o| o >= self.inner.log.high_watermark()) {
                continue;
            }
            match self.snapshot().await {
                Ok(Some(info)) => on_snapshot(info),
                Ok(None) => snapshots = false,
                Err(e) => tracing::warn!(bucket = %self.inner.bucket, "KV snapshot failed: {e}"),
            }
        }
    }

    /// A TTL round: trims the changelog to what `ttl` expires (never past `keep_from`),
    /// writing a snapshot first when the trim would pass the newest one: the log is
    /// never trimmed above a durable snapshot (see [`crate::recovery`]). Returns the
    /// new log start.
    /// `on_snapshot` is told of a snapshot written for the trim.
    pub async fn trim_expired_below(
        &self,
        ttl: std::time::Duration,
        keep_from: Option<i64>,
        on_snapshot: impl Fn(SnapshotInfo),
    ) -> Result<i64> {
        let log = &self.inner.log;
        let target = log.expired_end(ttl, keep_from).await?;
        if target > log.trim_ceiling() && target > log.log_start() {
            match self.snapshot().await? {
                Some(info) => {
                    tracing::debug!(bucket = %self.inner.bucket, offset = info.log_offset, "KV snapshot written for a TTL trim");
                    on_snapshot(info);
                }
                None => {
                    tracing::debug!(bucket = %self.inner.bucket, "no snapshot store: the changelog is kept whatever its age")
                }
            }
        }
        log.trim_before(target).await
    }

    /// Runs [`KvTablet::trim_expired_below`] every `log.ttl_check_interval_ms` until
    /// `shutdown` resolves; `policy` as for [`LogTablet::run_ttl`].
    pub async fn run_ttl(
        &self,
        policy: impl Fn() -> (Option<std::time::Duration>, Option<i64>),
        on_snapshot: impl Fn(SnapshotInfo) + Clone,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let trim = |ttl, keep_from| {
            let (this, on_snapshot) = (self.clone(), on_snapshot.clone());
            async move { this.trim_expired_below(ttl, keep_from, on_snapshot).await }
        };
        self.inner.log.run_ttl_with(policy, trim, shutdown).await
    }

    /// Brings the local store up to the high watermark: from where it is, or from a
    /// snapshot, or from the log's start, as [`recovery::plan`] decides; then lets
    /// trims go up to the newest snapshot.
    async fn recover(&self) -> Result<()> {
        let log = &self.inner.log;
        let snapshots = match &self.inner.snapshots {
            Some(s) => s.list().await?,
            None => Vec::new(),
        };
        let hw = log.high_watermark();
        let flushed = self.inner.store.flushed_offset()?;
        let from =
            match recovery::plan(self.inner.bucket, flushed, log.log_start(), hw, &snapshots)? {
                RecoveryStart::Store(offset) => offset,
                RecoveryStart::Snapshot(offset) => {
                    self.load_snapshot(offset).await?;
                    offset
                }
                RecoveryStart::LogStart => {
                    // Even with no flushed offset: a crash inside a clear leaves pairs
                    // with none (the offset goes first).
                    self.with_store(|store| store.clear())?;
                    log.log_start()
                }
            };
        if let Some(&newest) = snapshots.iter().filter(|&&s| s <= hw).max() {
            log.allow_trim_to(newest);
        }
        self.replay(from).await
    }

    /// Replaces the store's contents with the snapshot at `offset`.
    async fn load_snapshot(&self, offset: i64) -> Result<()> {
        let Some(snapshots) = self.inner.snapshots.clone() else {
            return Err(MinkError::Internal(format!(
                "{}: a snapshot load without a snapshot store",
                self.inner.bucket
            )));
        };
        let mut reader = snapshots.open(offset).await?;
        // An old snapshot without rows or a schema id reads as any version: nothing.
        let empty = reader.schema_id().is_none() && !reader.has_rows().await?;
        // Rows are stored as the schema version they were written under; reads carry
        // them to the current one (added columns null), as for every stored row.
        let (written, pk) = {
            let table = self.table();
            let written = snapshot_schema(&table, reader.schema_id(), &reader.schema())
                .or_else(|| empty.then(|| table.descriptor.schema.clone()))
                .ok_or_else(|| {
                    let why = match reader.schema_id() {
                        Some(id) => {
                            format!("is written under schema {id}, which the table does not have")
                        }
                        None => {
                            "records no schema id and matches none of the table's schema versions"
                                .into()
                        }
                    };
                    MinkError::Internal(format!(
                        "{}: the KV snapshot at {offset} {why}",
                        self.inner.bucket
                    ))
                })?;
            let pk: Vec<usize> = table
                .descriptor
                .primary_key
                .iter()
                .map(|k| {
                    written.index_of(k).ok_or_else(|| {
                        MinkError::Internal(format!(
                            "{}: schema {} of the KV snapshot at {offset} lacks key column {k:?}",
                            self.inner.bucket, written.schema_id
                        ))
                    })
                })
                .collect::<Result<_>>()?;
            (written, pk)
        };
        // A crash from here on leaves the store with no flushed offset: the next open
        // loads the snapshot again.
        self.with_store(|store| store.clear())?;
        let mut key = Vec::new();
        while let Some(batch) = reader.next().await? {
            written.check_batch(&batch).map_err(|e| {
                MinkError::Internal(format!(
                    "{}: the KV snapshot at {offset}: {e}",
                    self.inner.bucket
                ))
            })?;
            let encoder = KeyEncoder::new(&batch, &pk)?;
            let mut ops = Vec::with_capacity(batch.num_rows());
            for (i, row) in rows_of(&batch)?.iter().enumerate() {
                encoder.encode(i, &mut key)?;
                ops.push(KvOp::Put(key.clone(), encode_row(&written, row)?));
            }
            // The offset is recorded only with the last batch below.
            self.with_store(|store| store.write(&ops, -1))?;
        }
        self.with_store(|store| store.write(&[], offset))?;
        tracing::info!(bucket = %self.inner.bucket, offset = offset, "KV store loaded from a snapshot");
        Ok(())
    }

    /// Replays the changelog from `pos` (where the store is consistent) to the high
    /// watermark.
    async fn replay(&self, mut pos: i64) -> Result<()> {
        let log = &self.inner.log;
        let hw = log.high_watermark();
        let mut replayed = 0u64;
        let mut reader = log.scan_to(pos, hw)?;
        while let Some(scan) = reader.next().await? {
            let mut ops = Vec::new();
            for b in &scan.batches {
                let schema = {
                    let t = self.table();
                    t.schemas.get(&b.header.schema_id).cloned().ok_or_else(|| {
                        MinkError::Internal(format!(
                            "{}: changelog names unknown schema {}",
                            self.inner.bucket, b.header.schema_id
                        ))
                    })?
                };
                let pk: Vec<usize> = self
                    .table()
                    .descriptor
                    .primary_key
                    .iter()
                    .filter_map(|k| schema.index_of(k))
                    .collect();
                let encoder = KeyEncoder::new(&b.batch, &pk)?;
                let rows = rows_of(&b.batch)?;
                let mut key = Vec::new();
                for (i, row) in rows.iter().enumerate() {
                    encoder.encode(i, &mut key)?;
                    match b.header.change_type(i) {
                        ChangeType::Insert | ChangeType::UpdateAfter | ChangeType::AppendOnly => {
                            ops.push(KvOp::Put(key.clone(), encode_row(&schema, row)?))
                        }
                        ChangeType::Delete => ops.push(KvOp::Delete(key.clone())),
                        ChangeType::UpdateBefore => {}
                    }
                }
                replayed += b.batch.num_rows() as u64;
            }
            let next = scan.next_offset(pos);
            self.with_store(|store| store.write(&ops, next))?;
            pos = next;
        }
        tracing::debug!(bucket = %self.inner.bucket, replayed, high_watermark = hw, "KV tablet recovered");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_kept_without_a_copy_only_when_it_owns_its_buffers() {
        use arrow::array::{ArrayRef, Int64Array, StringArray};
        let whole = RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..1_000)) as ArrayRef,
            ),
            (
                "name",
                Arc::new(StringArray::from_iter_values(
                    (0..1_000).map(|i| format!("row {i} {}", "x".repeat(100))),
                )) as ArrayRef,
            ),
        ])
        .unwrap();
        assert!(owns_its_buffers(&whole));
        // A bucket's rows cut out of a table write by `take`: buffers of its own.
        let taken = take_record_batch(&whole, &UInt32Array::from_iter_values(0..100)).unwrap();
        assert!(owns_its_buffers(&taken));
        // A view into a larger body (a slice, as a decoded Flight body's arrays are).
        assert!(!owns_its_buffers(&whole.slice(0, 100)));
    }

    fn shape() -> PutShape {
        PutShape {
            kafka: false,
            partial: false,
            last_row: true,
            current_schema: true,
            deletes: false,
            image: ChangelogImage::Full,
        }
    }

    #[test]
    fn a_whole_row_last_row_put_merges_column_wise() {
        assert_eq!(merge_path(shape()), MergePath::LastRow);
        let wal = PutShape {
            image: ChangelogImage::Wal,
            ..shape()
        };
        assert_eq!(merge_path(wal), MergePath::Wal, "nothing to read");
        let kafka = PutShape {
            kafka: true,
            deletes: true,
            ..wal
        };
        assert_eq!(
            merge_path(kafka),
            MergePath::Records,
            "a Kafka batch, tombstones and all"
        );
    }

    #[test]
    fn deletes_partial_updates_other_engines_and_old_schemas_go_row_by_row() {
        let full = MergePath::Rows {
            before_images: true,
        };
        for other in [
            PutShape {
                deletes: true,
                ..shape()
            },
            PutShape {
                partial: true,
                ..shape()
            },
            PutShape {
                last_row: false,
                ..shape()
            },
            PutShape {
                current_schema: false,
                ..shape()
            },
            PutShape {
                kafka: true,
                last_row: false,
                ..shape()
            },
        ] {
            assert_eq!(merge_path(other), full, "{other:?}");
        }
        let wal_deletes = PutShape {
            deletes: true,
            image: ChangelogImage::Wal,
            ..shape()
        };
        assert_eq!(
            merge_path(wal_deletes),
            MergePath::Rows {
                before_images: false
            },
            "a delete reads its old row even without before images"
        );
    }
}
