//! The log tablet of one bucket: appends with idempotent writers, the high watermark,
//! scans, the long-poll tail, offset lookups, recovery and TTL.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::{Array, RecordBatch, TimestampMillisecondArray};
use arrow::datatypes::SchemaRef;
use mink_types::{
    ChangeType, Compression, IpcEncoded, MinkError, Result, Schema, SchemaId, TableBucket,
};
use mink_wal::{Stream, WalError};
use tokio::sync::{Semaphore, watch};

use crate::batch::{self, ATTR_CHANGE_TYPES, BatchHeader, LogBatch, NO_WRITER};
use crate::config::LogConfig;
use crate::window::{Check, Decision, Entry, Outcome, Rules, Windows};

/// One batch to append.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    /// The idempotent writer, or [`NO_WRITER`].
    pub writer_id: i64,
    pub first_sequence: i64,
    pub last_sequence: i64,
    pub schema_id: SchemaId,
    /// One per row for primary-key tables (the changelog); `None` for log tables.
    pub change_types: Option<Vec<ChangeType>>,
    pub batch: RecordBatch,
    /// `batch` as the client encoded it, when the caller decoded it from these bytes
    /// and it goes into the log unchanged: stored as it is (see
    /// [`batch::encode_from_ipc`]) instead of being encoded again.
    pub ipc: Option<IpcEncoded>,
}

/// Where a batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub first_offset: i64,
    pub last_offset: i64,
    pub duplicated: bool,
    pub commit_timestamp: i64,
}

/// The stream records, first and last offset of a batch of `rows` at `base`: its rows,
/// or, for a sequence marker (no rows), one record answered as the empty range after it.
fn record_offsets(base: i64, rows: i64) -> (u32, i64, i64) {
    if rows == 0 {
        (1, base + 1, base)
    } else {
        (rows as u32, base, base + rows - 1)
    }
}

/// Rows read from the log.
#[derive(Debug, Clone)]
pub struct ScanResult {
    /// The batches of rows read; sequence markers (see [`batch::ATTR_MARKER`]) are
    /// left out, so offsets may skip one between batches.
    pub batches: Vec<LogBatch>,
    /// The offset the read began at.
    pub from: i64,
    /// The offset after the last record read, markers included: where the next read
    /// starts. Past the last batch's end when the read ended in markers.
    pub end: i64,
    pub high_watermark: i64,
    pub log_start: i64,
}

impl ScanResult {
    /// Encoded bytes of the batches.
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(|b| b.size).sum()
    }

    /// The offset after the last record read (`from` when nothing was read): where a
    /// reader goes on. Use it, not the last batch's end, which stops short of
    /// trailing sequence markers.
    pub fn next_offset(&self, from: i64) -> i64 {
        self.end.max(from)
    }

    /// Whether the read went on past its last batch of rows (or, without any, past
    /// where it began): it ended in sequence markers, which a reader going on from its
    /// last batch's end must step over.
    pub fn ends_past_rows(&self) -> bool {
        self.end
            > self
                .batches
                .last()
                .map_or(self.from, |b| b.header.end_offset())
    }
}

/// A read of a log to a given end ([`LogTablet::scan_to`]).
pub struct LogScan<'a> {
    tablet: &'a LogTablet,
    scan: mink_wal::Scan,
}

impl LogScan<'_> {
    /// The next batches (sequence markers left out, so maybe none), or `None` at the
    /// end. Each result's `end` is where the next begins.
    pub async fn next(&mut self) -> Result<Option<ScanResult>> {
        let from = self.scan.position() as i64;
        let Some(records) = self
            .scan
            .next()
            .await
            .map_err(|e| self.tablet.read_error(from, e))?
        else {
            return Ok(None);
        };
        // Every record: the scan's position has moved past them all.
        let mut result = self.tablet.scan_result(from, &records, usize::MAX, None)?;
        result.batches.retain(|b| !b.header.is_marker());
        Ok(Some(result))
    }
}

/// Which offset `list_offsets` looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start.
    Earliest,
    /// The high watermark.
    Latest,
    /// The first offset whose timestamp is at or after this one (ms): the commit
    /// timestamp, or for a tablet indexed by record time
    /// ([`LogTablet::index_by_record_time`]) the row's own.
    Timestamp(i64),
}

/// This tablet appends under its own epoch, after every batch it recovered. A newer
/// epoch's batches mean a newer open of the stream (in place on this node) appended
/// while this one recovered: this one is superseded, and would only be refused at its
/// first append.
fn not_superseded(bucket: TableBucket, epoch: u64, last_epoch: i64) -> Result<()> {
    if last_epoch > epoch as i64 {
        return Err(MinkError::Fenced(format!(
            "{bucket}: opened under epoch {epoch}, superseded while it recovered: the log \
             holds batches of epoch {last_epoch}"
        )));
    }
    Ok(())
}

/// How long a clean close waits for its checkpoint (see [`LogTablet::close`]).
const CLOSE_CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

struct State {
    windows: Windows,
    last_commit_timestamp: i64,
    failed: Option<MinkError>,
    /// Where the last recovery started reading batch headers.
    recovered_from: i64,
    /// The offset of the newest writer checkpoint known to cover this log (the one
    /// recovery started from, or one this tablet wrote): the next owner reads batch
    /// headers from there on.
    checkpointed: i64,
}

struct Inner {
    bucket: TableBucket,
    stream: Stream,
    epoch: u64,
    /// The durable end when the tablet opened: where its epoch's batches begin (the
    /// open waits for a previous tablet's appends in flight, so every batch from here
    /// on is of this epoch).
    opened_at: i64,
    primary_key: bool,
    config: LogConfig,
    schemas: RwLock<HashMap<SchemaId, (Schema, SchemaRef)>>,
    state: Mutex<State>,
    inflight: Arc<Semaphore>,
    /// Signalled whenever a writer's window takes a new batch, and when the tablet
    /// fails or closes (see [`REORDER_WAIT`]).
    advanced: tokio::sync::Notify,
    /// Set by [`LogTablet::close`]: batches waiting for their predecessors give up.
    closing: std::sync::atomic::AtomicBool,
    /// The column whose values index the log by time instead of the commit
    /// timestamp (a Kafka topic's record timestamps), and how far ahead of the clock
    /// its values may be; see [`LogTablet::index_by_record_time`].
    record_time: std::sync::OnceLock<(String, Duration)>,
    /// The highest offset a trim may move the log start to. Unbounded for a log table.
    /// For a primary-key table it starts at the log start and is raised only by
    /// [`LogTablet::allow_trim_to`] once a durable KV snapshot covers the rows below:
    /// the changelog is the only copy of every row no snapshot holds, so no trim
    /// (TTL, lake, a caller's) may drop it first.
    trim_ceiling: std::sync::atomic::AtomicI64,
    /// How new batches are compressed ([`Compression`] as `compression_code` maps it),
    /// the table's `compression` property, set by [`LogTablet::set_compression`].
    compression: std::sync::atomic::AtomicU8,
}

fn compression_code(c: Compression) -> u8 {
    match c {
        Compression::Zstd => 0,
        Compression::Lz4 => 1,
        Compression::None => 2,
    }
}

fn compression_of(code: u8) -> Compression {
    match code {
        0 => Compression::Zstd,
        1 => Compression::Lz4,
        _ => Compression::None,
    }
}

/// How long a batch that arrives ahead of its writer's next sequence waits for the
/// batches before it. A client keeps several batches of a bucket in flight, each its
/// own request; requests may reach the tablet in another order than they were sent,
/// and the batch that overtook its predecessors waits here for them rather than
/// being refused (and sent again one round trip later). A real gap is refused once
/// this has passed.
pub const REORDER_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A bucket's log. Cheap to clone.
#[derive(Clone)]
pub struct LogTablet {
    inner: Arc<Inner>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A batch's record-time column ([`LogTablet::index_by_record_time`]), if it has one
/// of milliseconds.
fn record_times<'a>(batch: &'a RecordBatch, column: &str) -> Option<&'a TimestampMillisecondArray> {
    batch
        .column_by_name(column)?
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
}

/// Maps mink-wal's errors to Mink's, with the bucket for context.
pub fn wal_error(bucket: TableBucket, err: WalError) -> MinkError {
    match err {
        WalError::Storage(e) => MinkError::StorageFailure(format!("{bucket}: {e}")),
        WalError::Fenced(e) => MinkError::Fenced(format!("{bucket}: {e}")),
        WalError::Closed(e) => MinkError::Unavailable(format!("{bucket}: {e}")),
        WalError::OffsetOutOfRange { offset, start, .. } => MinkError::OffsetOutOfRange {
            bucket,
            offset: offset as i64,
            log_start: start as i64,
            high_watermark: -1,
        },
        WalError::TooLarge(e) => MinkError::LimitExceeded {
            what: format!("{bucket}: {e}"),
            limit: mink_wal::stream::PAYLOAD_BYTES_MAX as u64,
            actual: 0,
        },
        WalError::Corrupt(e) => MinkError::Internal(format!("{bucket}: {e}")),
        WalError::Config(e) => MinkError::invalid("stream", format!("{bucket}: {e}")),
    }
}

impl LogTablet {
    /// Opens the tablet on `stream` (open under `epoch`), registering `schemas`, and
    /// rebuilds the writer windows and the last commit timestamp from the log.
    pub async fn open(
        bucket: TableBucket,
        stream: Stream,
        primary_key: bool,
        schemas: Vec<Schema>,
        config: LogConfig,
    ) -> Result<Self> {
        config
            .validate()
            .map_err(|e| MinkError::invalid("log config", e))?;
        let epoch = stream.epoch();
        let trim_ceiling = if primary_key {
            stream.start_offset() as i64
        } else {
            i64::MAX
        };
        let tablet = Self {
            inner: Arc::new(Inner {
                bucket,
                opened_at: stream.durable_end() as i64,
                stream,
                epoch,
                primary_key,
                inflight: Arc::new(Semaphore::new(config.inflight_appends_max as usize)),
                advanced: tokio::sync::Notify::new(),
                closing: std::sync::atomic::AtomicBool::new(false),
                record_time: std::sync::OnceLock::new(),
                trim_ceiling: std::sync::atomic::AtomicI64::new(trim_ceiling),
                compression: std::sync::atomic::AtomicU8::new(compression_code(
                    Compression::default(),
                )),
                config,
                schemas: RwLock::new(HashMap::new()),
                state: Mutex::new(State {
                    windows: Windows::default(),
                    last_commit_timestamp: i64::MIN,
                    failed: None,
                    recovered_from: 0,
                    checkpointed: 0,
                }),
            }),
        };
        for schema in schemas {
            tablet.register_schema(schema);
        }
        tablet.recover().await?;
        Ok(tablet)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn bucket(&self) -> TableBucket {
        self.inner.bucket
    }

    /// Closes the tablet's stream cleanly (a handover): pending appends complete,
    /// everything is compacted, and the next leader opens it without fencing anyone.
    /// Before the close, once the appends are durable, a writer checkpoint at the end
    /// (unless one is there), so that the next leader, which opens as soon as the
    /// close is recorded, finds it and reads no batch header. Best effort, within
    /// [`CLOSE_CHECKPOINT_WAIT`]: without it the next leader reads from the newest
    /// checkpoint, as after a crash.
    pub async fn close(&self) -> Result<()> {
        self.inner
            .closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.inner.advanced.notify_waiters();
        if self.inner.stream.flush().await.is_ok()
            && self.failure().is_none()
            && self.high_watermark() > self.lock().checkpointed
        {
            match tokio::time::timeout(CLOSE_CHECKPOINT_WAIT, self.checkpoint()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(bucket = %self.inner.bucket, "checkpoint at close failed: {e}")
                }
                Err(_) => tracing::warn!(
                    bucket = %self.inner.bucket,
                    "checkpoint at close took over {CLOSE_CHECKPOINT_WAIT:?}; not waiting"
                ),
            }
        }
        self.inner
            .stream
            .clone()
            .close_under(self.inner.epoch)
            .await
            .map_err(|e| wal_error(self.inner.bucket, e))
    }

    /// Indexes the log by the rows' own time, as Kafka's time index does: each batch
    /// appended from now on is found by the greatest value of `column` (a
    /// millisecond timestamp column) in it rather than by its commit timestamp, and
    /// [`OffsetSpec::Timestamp`] answers the first row whose `column` is at or after
    /// the time. TTL then expires by the same time (Kafka's `retention.ms`). A batch
    /// with a value more than `max_ahead` past this node's clock is refused: it would
    /// hold the TTL back for good. Set before the first append; batches appended
    /// earlier stay indexed by commit time. A later call changes nothing.
    pub fn index_by_record_time(&self, column: &str, max_ahead: Duration) {
        let _ = self.inner.record_time.set((column.to_string(), max_ahead));
    }

    /// The greatest record time of a batch, for a tablet indexed by record time;
    /// `InvalidArgument` when it is too far ahead.
    fn record_time_of(&self, batch: &RecordBatch) -> Result<Option<i64>> {
        let Some((column, max_ahead)) = self.inner.record_time.get() else {
            return Ok(None);
        };
        let Some(times) = record_times(batch, column) else {
            return Ok(None);
        };
        let max = arrow::compute::max(times);
        let latest = now_ms().saturating_add(max_ahead.as_millis().min(i64::MAX as u128) as i64);
        if let Some(t) = max.filter(|t| *t > latest) {
            return Err(MinkError::invalid(
                column,
                format!(
                    "{}: a row is stamped {t}, more than {} ms ahead of this node's clock (at most {latest})",
                    self.inner.bucket,
                    max_ahead.as_millis()
                ),
            ));
        }
        Ok(max)
    }

    /// The epoch the tablet's stream is open under.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// How batches appended from now on are compressed: the table's `compression`
    /// property (after `alter_table` too). Batches already written stay as they are;
    /// reads decode each as it was written.
    pub fn set_compression(&self, compression: Compression) {
        self.inner
            .compression
            .store(compression_code(compression), Ordering::Relaxed);
    }

    /// How batches appended now are compressed.
    pub fn compression(&self) -> Compression {
        compression_of(self.inner.compression.load(Ordering::Relaxed))
    }

    /// Adds a schema version (after `alter_table`).
    pub fn register_schema(&self, schema: Schema) {
        let arrow = schema.to_arrow();
        self.inner
            .schemas
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(schema.schema_id, (schema, arrow));
    }

    fn arrow_schema(&self, id: SchemaId) -> Option<SchemaRef> {
        self.inner
            .schemas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .map(|(_, a)| a.clone())
    }

    /// The end of durable data: readers never see past it.
    pub fn high_watermark(&self) -> i64 {
        self.inner.stream.durable_end() as i64
    }

    /// The end of what is compacted into segments: a trim goes no further.
    pub fn compacted_end(&self) -> i64 {
        self.inner.stream.committed_end() as i64
    }

    /// The bytes the bucket's log keeps on object storage (`Stream::stored_bytes`).
    pub fn stored_bytes(&self) -> u64 {
        self.inner.stream.stored_bytes()
    }

    /// The first readable offset.
    pub fn log_start(&self) -> i64 {
        self.inner.stream.start_offset() as i64
    }

    /// Why the tablet failed, if it did. A failed tablet acknowledges nothing more and
    /// must be reopened from the log (under a newer epoch).
    pub fn failure(&self) -> Option<MinkError> {
        self.lock().failed.clone()
    }

    /// The writer window of `writer` (inspection and tests).
    pub fn writer_window(&self, writer: i64) -> Vec<(i64, i64, i64, i64)> {
        self.lock()
            .windows
            .window(writer)
            .iter()
            .map(|e| {
                (
                    e.first_sequence,
                    e.last_sequence,
                    e.first_offset,
                    e.last_offset,
                )
            })
            .collect()
    }

    fn validate(&self, req: &AppendRequest) -> Result<()> {
        let bucket = self.inner.bucket;
        let schemas = self.inner.schemas.read().unwrap_or_else(|e| e.into_inner());
        let Some((schema, _)) = schemas.get(&req.schema_id) else {
            return Err(MinkError::invalid(
                "schema_id",
                format!("{bucket}: the table has no schema {}", req.schema_id),
            ));
        };
        schema.check_batch(&req.batch)?;
        if req.batch.num_rows() == 0 {
            return Err(MinkError::invalid(
                "batch",
                "a batch needs at least one row",
            ));
        }
        if req.batch.num_rows() > i32::MAX as usize {
            return Err(MinkError::LimitExceeded {
                what: "rows in one batch".into(),
                limit: i32::MAX as u64,
                actual: req.batch.num_rows() as u64,
            });
        }
        match (&req.change_types, self.inner.primary_key) {
            (Some(c), true) if c.len() == req.batch.num_rows() => {}
            (Some(c), true) => {
                return Err(MinkError::invalid(
                    "changes",
                    format!("{} change types for {} rows", c.len(), req.batch.num_rows()),
                ));
            }
            (None, true) => {
                return Err(MinkError::invalid(
                    "changes",
                    "a primary-key table's log needs change types",
                ));
            }
            (Some(_), false) => {
                return Err(MinkError::invalid(
                    "changes",
                    "a log table takes no change types",
                ));
            }
            (None, false) => {}
        }
        if req.writer_id != NO_WRITER {
            if req.writer_id < 0 {
                return Err(MinkError::invalid(
                    "writer_id",
                    format!("{} is not a writer id", req.writer_id),
                ));
            }
            if req.first_sequence < 0 || req.last_sequence < req.first_sequence {
                return Err(MinkError::invalid(
                    "batch_sequence",
                    format!(
                        "sequences {}..={} are not a range",
                        req.first_sequence, req.last_sequence
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Appends one batch: checks the writer window, assigns offsets and the commit
    /// timestamp, and resolves once the batch (and every earlier one of the node) is
    /// durable. Many appends may be in flight; they are acknowledged in order.
    pub async fn append(&self, req: AppendRequest) -> Result<Appended> {
        self.submit(req).await?.wait().await
    }

    /// [`LogTablet::append`] as one part of a write over several buckets: `cork` (see
    /// [`mink_wal::Cork`]) is released as soon as the batch is on its way, so that the
    /// parts share one WAL upload.
    pub async fn append_corked(
        &self,
        req: AppendRequest,
        cork: mink_wal::Cork,
    ) -> Result<Appended> {
        let submitted = self.submit(req).await;
        drop(cork);
        submitted?.wait().await
    }

    /// The first half of [`LogTablet::append`]: returns once the batch has its offsets
    /// and is on its way (or is known to be a duplicate). Submissions are ordered: a
    /// caller that submits A then B gets A's offsets below B's.
    ///
    /// A batch that is ahead of its writer's next sequence waits up to
    /// [`REORDER_WAIT`] for its predecessors (pipelined requests may arrive out of
    /// order); see [`LogTablet::submit_in_order`] for callers whose requests cannot.
    pub async fn submit(&self, req: AppendRequest) -> Result<Submitted> {
        self.submit_within(req, REORDER_WAIT, false).await
    }

    /// [`LogTablet::submit`] for a caller whose requests reach the tablet in the order
    /// they were sent (a Kafka connection takes its requests' offsets one at a time):
    /// a batch ahead of its writer's next sequence is refused at once, since waiting
    /// could only hold up the request behind it that fills the gap.
    pub async fn submit_in_order(&self, req: AppendRequest) -> Result<Submitted> {
        self.submit_within(req, Duration::ZERO, false).await
    }

    /// [`LogTablet::submit_in_order`] for a Kafka producer: besides, a writer the
    /// tablet has no window for must start at sequence 0 (`UnknownWriter` otherwise,
    /// which a Kafka client answers by starting over under a new producer id). A
    /// producer pipelines batches from its first one on; if its first batch was
    /// refused (a leader moving) and the second reached the new leader first, taking
    /// the second as the writer's first would make the retried first out of order for
    /// good. Kafka brokers hold producers to the same rule.
    pub async fn submit_producer(&self, req: AppendRequest) -> Result<Submitted> {
        self.submit_within(req, Duration::ZERO, true).await
    }

    /// Waits, until `deadline`, while `req` is ahead of its writer's next sequence.
    /// Returns at once otherwise (the caller checks again under the lock), and with an
    /// error when the tablet failed or is closing.
    async fn wait_for_predecessors(
        &self,
        (writer_id, first, last): (i64, i64, i64),
        rules: Rules,
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        if writer_id == NO_WRITER {
            return Ok(());
        }
        loop {
            let advanced = self.inner.advanced.notified();
            tokio::pin!(advanced);
            advanced.as_mut().enable();
            self.check_waitable()?;
            let ahead = {
                let state = self.lock();
                matches!(
                    state.windows.check(writer_id, (first, last), rules),
                    Check::OutOfOrder { expected } if rules.is_ahead(first, expected)
                )
            };
            if !ahead || tokio::time::Instant::now() >= deadline {
                return Ok(());
            }
            let _ = tokio::time::timeout_at(deadline, advanced).await;
        }
    }

    /// Whether a writer the tablet has no window for may start at any sequence: on a
    /// log tablet, yes; on a primary-key tablet only at 0 (see [`crate::window`]).
    fn starts_anywhere(&self) -> bool {
        !self.inner.primary_key
    }

    /// Waits, up to [`REORDER_WAIT`], while `writer`'s batch `first..=last` is ahead
    /// of the writer's next sequence (its predecessors may still arrive). A KV tablet
    /// calls it before it takes its merge lock and checks the batch with
    /// [`LogTablet::check_sequence`].
    pub async fn await_predecessors(&self, writer_id: i64, first: i64, last: i64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + REORDER_WAIT;
        self.wait_for_predecessors((writer_id, first, last), self.rules(false), deadline)
            .await
    }

    /// An error when the tablet failed or is closing: a waiting batch gives up.
    fn check_waitable(&self) -> Result<()> {
        if let Some(e) = &self.lock().failed {
            return Err(e.clone());
        }
        if self.inner.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(MinkError::Unavailable(format!(
                "{}: the tablet is closing",
                self.inner.bucket
            )));
        }
        Ok(())
    }

    /// The admission rules of a batch: a Kafka producer's when `producer` (see
    /// [`LogTablet::submit_producer`]), a Flight writer's otherwise.
    fn rules(&self, producer: bool) -> Rules {
        Rules {
            producer,
            start_anywhere: self.starts_anywhere(),
        }
    }

    /// Submits `req`: encodes it outside the lock, waits (up to `reorder_wait`) for
    /// its writer's predecessors and for an append slot and WAL memory, then decides
    /// under the tablet lock ([`Windows::decide`]) and, for a new batch, stamps and
    /// appends it there ([`LogTablet::append_locked`]); its durability is settled on a
    /// task of its own ([`LogTablet::settle_when_durable`]). `producer`: see
    /// [`LogTablet::submit_producer`].
    async fn submit_within(
        &self,
        req: AppendRequest,
        reorder_wait: Duration,
        producer: bool,
    ) -> Result<Submitted> {
        self.validate(&req)?;
        let encoded = self.encode(&req)?;
        let record_time = self.record_time_of(&req.batch)?;
        self.submit_encoded(req, encoded, record_time, reorder_wait, producer)
            .await
    }

    /// [`LogTablet::submit_within`] of a checked and encoded batch (a batch of rows,
    /// or a sequence marker of no rows).
    async fn submit_encoded(
        &self,
        req: AppendRequest,
        encoded: bytes::BytesMut,
        record_time: Option<i64>,
        reorder_wait: Duration,
        producer: bool,
    ) -> Result<Submitted> {
        let bucket = self.inner.bucket;
        // Wait for predecessors before taking a slot and memory: a batch that waits
        // must not hold what its predecessor needs to be submitted.
        let reorder_deadline = tokio::time::Instant::now() + reorder_wait;
        let sequences = (req.first_sequence, req.last_sequence);
        let rules = self.rules(producer);
        self.wait_for_predecessors(
            (req.writer_id, sequences.0, sequences.1),
            rules,
            reorder_deadline,
        )
        .await?;
        let slot = self
            .inner
            .inflight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| MinkError::Unavailable(format!("{bucket}: the tablet is closing")))?;
        let reservation = self
            .inner
            .stream
            .reserve(encoded.len())
            .await
            .map_err(|e| wal_error(bucket, e))?;
        let mut staged = Some((encoded, reservation, slot));
        loop {
            let advanced = self.inner.advanced.notified();
            tokio::pin!(advanced);
            advanced.as_mut().enable();
            self.check_waitable()?;
            {
                let mut state = self.lock();
                if let Some(e) = &state.failed {
                    return Err(e.clone());
                }
                let decision = if req.writer_id == NO_WRITER {
                    Decision::Append
                } else {
                    let may_wait = tokio::time::Instant::now() < reorder_deadline;
                    state
                        .windows
                        .decide(bucket, req.writer_id, sequences, rules, may_wait)?
                };
                let step = match decision {
                    Decision::Wait => None,
                    Decision::Duplicate(entry) => Some(Step::Duplicate(entry)),
                    Decision::Append => {
                        // Stamp and submit under the lock; durability is settled apart.
                        let (encoded, reservation, slot) =
                            staged.take().expect("a batch is appended once");
                        let (step, outcome, pending, base) = self.append_locked(
                            &mut state,
                            (&req, rules),
                            encoded,
                            reservation,
                            record_time,
                        )?;
                        drop(state);
                        let rows = req.batch.num_rows() as i64;
                        self.settle_when_durable(
                            (req.writer_id, base, rows),
                            outcome,
                            pending,
                            slot,
                        );
                        Some(step)
                    }
                };
                if let Some(step) = step {
                    return Ok(Submitted {
                        tablet: self.clone(),
                        step,
                    });
                }
            }
            // Ahead of its predecessors: wait for them a while, then decide again.
            let _ = tokio::time::timeout_at(reorder_deadline, advanced).await;
        }
    }

    /// `req` encoded as a log batch (offset and time stamped later, under the lock),
    /// within `batch_bytes_max`, decoded and encoded.
    fn encode(&self, req: &AppendRequest) -> Result<bytes::BytesMut> {
        let header = BatchHeader {
            base_offset: 0,
            record_count: req.batch.num_rows() as i32,
            commit_timestamp: 0,
            leader_epoch: self.inner.epoch as i64,
            schema_id: req.schema_id,
            writer_id: req.writer_id,
            first_sequence: req.first_sequence,
            last_sequence: req.last_sequence,
            attributes: if self.inner.primary_key {
                ATTR_CHANGE_TYPES
            } else {
                0
            },
            change_types: req.change_types.clone().unwrap_or_default(),
        };
        // The limit bounds a batch's rows as they are in memory, compressed or not: a
        // read decodes a stored batch whole.
        let limit = self.inner.config.batch_bytes_max;
        let decoded = batch::decoded_bytes(&req.batch) as u64;
        if decoded > limit {
            return Err(MinkError::LimitExceeded {
                what: format!("{}: batch bytes (uncompressed)", self.inner.bucket),
                limit,
                actual: decoded,
            });
        }
        let compression = self.compression();
        let encoded = match &req.ipc {
            Some(ipc) => batch::encode_from_ipc(&header, &req.batch, ipc, compression)?,
            None => batch::encode(&header, &req.batch, compression)?,
        };
        if encoded.len() as u64 > self.inner.config.batch_bytes_max {
            return Err(MinkError::LimitExceeded {
                what: format!("{}: encoded batch bytes", self.inner.bucket),
                limit: self.inner.config.batch_bytes_max,
                actual: encoded.len() as u64,
            });
        }
        Ok(encoded)
    }

    /// Stamps a new batch with the stream's next offset and the commit time and
    /// appends it to the stream, under the tablet lock (`state`), so that offsets,
    /// times and window entries follow the order of appends. A failed append fails
    /// the tablet.
    fn append_locked(
        &self,
        state: &mut State,
        (req, rules): (&AppendRequest, Rules),
        mut encoded: bytes::BytesMut,
        reservation: mink_wal::Reservation,
        record_time: Option<i64>,
    ) -> Result<(
        Step,
        Arc<watch::Sender<Outcome>>,
        mink_wal::PendingAppend,
        i64,
    )> {
        let rows = req.batch.num_rows() as i64;
        let base = self.inner.stream.next_offset() as i64;
        let (records, first, last) = record_offsets(base, rows);
        let ts = now_ms().max(state.last_commit_timestamp);
        batch::stamp(&mut encoded, base, ts, self.inner.epoch as i64);
        let crc = batch::whole_crc(&encoded);
        let pending = self
            .inner
            .stream
            .append_with_crc(
                reservation,
                self.inner.epoch,
                records,
                record_time.unwrap_or(ts),
                encoded.freeze(),
                crc,
            )
            .map_err(|e| {
                let err = wal_error(self.inner.bucket, e);
                state.failed = Some(err.clone());
                self.inner.advanced.notify_waiters();
                err
            })?;
        state.last_commit_timestamp = ts;
        let outcome = Arc::new(watch::channel(None).0);
        if req.writer_id != NO_WRITER {
            state.windows.push_next(
                req.writer_id,
                Entry {
                    first_sequence: req.first_sequence,
                    last_sequence: req.last_sequence,
                    first_offset: first,
                    last_offset: last,
                    commit_timestamp: ts,
                    pending: Some(outcome.clone()),
                },
                rules,
            );
            self.inner.advanced.notify_waiters();
        }
        let step = Step::New {
            first,
            last,
            ts,
            outcome: outcome.clone(),
        };
        Ok((step, outcome, pending, base))
    }

    /// Records the outcome of the append at offsets `base..base + rows` once the
    /// stream answers `pending` ([`LogTablet::complete`]), on a task of its own; `slot`
    /// (an append in flight, against `inflight_appends_max`) is held until then.
    fn settle_when_durable(
        &self,
        (writer_id, base, rows): (i64, i64, i64),
        outcome: Arc<watch::Sender<Outcome>>,
        pending: mink_wal::PendingAppend,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let tablet = self.clone();
        tokio::spawn(async move {
            let result = match pending.durable().await {
                Ok(range) => {
                    debug_assert_eq!(
                        range.start as i64, base,
                        "the stream assigned another offset"
                    );
                    metrics::counter!("mink_log_appended_rows_total").increment(rows as u64);
                    Ok(())
                }
                Err(e) => Err(wal_error(tablet.inner.bucket, e)),
            };
            tablet.complete(writer_id, &outcome, result);
            drop(slot);
        });
    }

    /// Records the outcome of an append (or of a batch that wrote nothing): its window
    /// entry stops being pending, or the tablet fails; then every waiter (the caller,
    /// retries of the batch) learns it. Runs on a task of its own per batch, not in
    /// [`Submitted::wait`]: a caller that stops waiting (a client that went away) must
    /// not leave the batch pending forever, with every retry of it waiting on it.
    fn complete(&self, writer_id: i64, outcome: &Arc<watch::Sender<Outcome>>, result: Result<()>) {
        {
            let mut state = self.lock();
            match &result {
                Ok(()) => state.windows.complete(writer_id, outcome),
                Err(e) => {
                    state.failed.get_or_insert_with(|| e.clone());
                    self.inner.advanced.notify_waiters();
                }
            }
        }
        outcome.send_replace(Some(result));
    }

    /// Checks a writer's batch against its window without appending: `Ok(None)` when
    /// new, `Ok(Some(_))` for a duplicate (wait on it for the original offsets),
    /// `OutOfOrderSequence` otherwise. A KV tablet checks before it merges, so that a
    /// retried Put is never merged twice. `kafka`: a Kafka producer's batch, under the
    /// rules of [`LogTablet::submit_producer`] (its writer id carries an epoch, an
    /// older epoch is `WriterFenced`, an unknown producer must start at 0).
    pub fn check_sequence(
        &self,
        writer_id: i64,
        first: i64,
        last: i64,
        kafka: bool,
    ) -> Result<Option<Submitted>> {
        if writer_id == NO_WRITER {
            return Ok(None);
        }
        let state = self.lock();
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        match state.windows.decide(
            self.inner.bucket,
            writer_id,
            (first, last),
            self.rules(kafka),
            false,
        )? {
            Decision::Append | Decision::Wait => Ok(None),
            Decision::Duplicate(entry) => Ok(Some(Submitted {
                tablet: self.clone(),
                step: Step::Duplicate(entry),
            })),
        }
    }

    /// Logs a writer's batch that produced no rows (a Put that changed nothing) as a
    /// **sequence marker** ([`batch::ATTR_MARKER`]): a record of one offset and no
    /// rows, so that the sequence is as durable as any other batch's. A window rebuilt
    /// from the log after a restart or a move then knows it, and a stale attempt of
    /// the batch that reaches the next leader late (parked in a node's admission while
    /// the client's retry was acknowledged) is answered as a duplicate instead of
    /// being merged again, out of order. Readers never see it as rows
    /// ([`LogTablet::scan`] leaves it out); it is answered with an empty range
    /// (`first_offset` = its offset + 1 = `last_offset` + 1).
    ///
    /// "Nothing changed" was decided over everything submitted before it (a KV
    /// tablet's merge reads rows staged by appends that are not durable yet); the
    /// marker is acknowledged in WAL order, so only once all of that is durable, and it
    /// fails if any of it fails. The caller checked the sequence under its own lock
    /// ([`LogTablet::check_sequence`]), so the batch is not ahead of its writer.
    /// `kafka`: the writer is a Kafka producer (as for [`LogTablet::check_sequence`]).
    pub async fn submit_marker(
        &self,
        writer_id: i64,
        (first, last): (i64, i64),
        schema_id: SchemaId,
        kafka: bool,
    ) -> Result<Submitted> {
        let bucket = self.inner.bucket;
        if !self.inner.primary_key {
            return Err(MinkError::Internal(format!(
                "{bucket}: a sequence marker is logged for a primary-key tablet's Put only"
            )));
        }
        let arrow = self.arrow_schema(schema_id).ok_or_else(|| {
            MinkError::invalid(
                "schema_id",
                format!("{bucket}: the table has no schema {schema_id}"),
            )
        })?;
        let header = BatchHeader {
            base_offset: 0,
            record_count: 1,
            commit_timestamp: 0,
            leader_epoch: self.inner.epoch as i64,
            schema_id,
            writer_id,
            first_sequence: first,
            last_sequence: last,
            attributes: batch::ATTR_MARKER,
            change_types: vec![],
        };
        let req = AppendRequest {
            writer_id,
            first_sequence: first,
            last_sequence: last,
            schema_id,
            change_types: Some(vec![]),
            batch: RecordBatch::new_empty(arrow),
            ipc: None,
        };
        self.submit_encoded(
            req,
            batch::encode_marker(&header),
            None,
            Duration::ZERO,
            kafka,
        )
        .await
    }

    /// Decodes a stream record into a batch, checking that its header agrees with
    /// where the stream holds it.
    fn decode(&self, record: &mink_wal::Record, columns: Option<&[String]>) -> Result<LogBatch> {
        let decoded = batch::decode_columns(&record.payload, |id| self.arrow_schema(id), columns)?;
        if decoded.header.base_offset != record.base as i64
            || decoded.header.record_count as u32 != record.count
        {
            return Err(MinkError::Internal(format!(
                "{}: the batch at stream offset {} claims offsets {}..{}",
                self.inner.bucket,
                record.base,
                decoded.header.base_offset,
                decoded.header.end_offset()
            )));
        }
        Ok(decoded)
    }

    /// Reads batches from `from` up to the high watermark, about `max_bytes` (at
    /// least one batch, capped by `scan_bytes_max`). A batch that begins before `from`
    /// is cut to start at it. `from` below the log start or above the high watermark
    /// is `OffsetOutOfRange`.
    ///
    /// Sequence markers are left out, and a read that found nothing but markers goes
    /// on past them: a result without batches ends at the high watermark (markers
    /// hold no rows, so a long run of them must not look like the end of the log to
    /// a reader that stops at an empty read, as a Kafka fetch or a tail would).
    pub async fn scan(&self, from: i64, max_bytes: usize) -> Result<ScanResult> {
        self.scan_columns(from, max_bytes, None).await
    }

    /// [`LogTablet::scan`] decoding only the columns named (`None`: all; see
    /// [`batch::decode_columns`]): the rest of each batch is never decompressed. The
    /// byte budget counts the columns decoded.
    pub async fn scan_columns(
        &self,
        from: i64,
        max_bytes: usize,
        columns: Option<&[String]>,
    ) -> Result<ScanResult> {
        let mut result = self.scan_marked(from, max_bytes, columns).await?;
        result.batches.retain(|b| !b.header.is_marker());
        while result.batches.is_empty() && result.end < result.high_watermark {
            result = self.scan_marked(result.end, max_bytes, columns).await?;
            result.batches.retain(|b| !b.header.is_marker());
        }
        result.from = from;
        Ok(result)
    }

    /// `OffsetOutOfRange` for a read from `from`, with the log's current bounds.
    fn out_of_range(&self, from: i64) -> MinkError {
        MinkError::OffsetOutOfRange {
            bucket: self.inner.bucket,
            offset: from,
            log_start: self.log_start(),
            high_watermark: self.high_watermark(),
        }
    }

    /// Refuses a read from below the log start or above the high watermark.
    fn check_read_from(&self, from: i64) -> Result<()> {
        if from < self.log_start() || from > self.high_watermark() {
            return Err(self.out_of_range(from));
        }
        Ok(())
    }

    /// The error of a stream read from `from`: below the start is the log's
    /// `OffsetOutOfRange`.
    fn read_error(&self, from: i64, e: WalError) -> MinkError {
        match e {
            WalError::OffsetOutOfRange { .. } => self.out_of_range(from),
            e => wal_error(self.inner.bucket, e),
        }
    }

    /// [`LogTablet::scan`] with the sequence markers kept (each a batch of no rows over
    /// its one offset, [`BatchHeader::is_marker`]): for readers of batch headers rather
    /// than rows, to whom every offset is some batch's.
    pub async fn scan_with_markers(&self, from: i64, max_bytes: usize) -> Result<ScanResult> {
        self.scan_marked(from, max_bytes, None).await
    }

    async fn scan_marked(
        &self,
        from: i64,
        max_bytes: usize,
        columns: Option<&[String]>,
    ) -> Result<ScanResult> {
        self.check_read_from(from)?;
        let max_bytes = max_bytes
            .min(self.inner.config.scan_bytes_max as usize)
            .max(1);
        let records = self
            .inner
            .stream
            .read(from as u64, max_bytes)
            .await
            .map_err(|e| self.read_error(from, e))?;
        self.scan_result(from, &records, max_bytes, columns)
    }

    /// The batches of `records`, read from `from` (a batch that begins before it is
    /// cut to start at it), sequence markers kept, decoded until they hold `max_bytes`
    /// of Arrow memory (at least one): a read's byte budget bounds the stored bytes it
    /// fetches, and a compressed batch may decode to many times its stored size. The
    /// result ends after the last record decoded.
    fn scan_result(
        &self,
        from: i64,
        records: &[mink_wal::Record],
        max_bytes: usize,
        columns: Option<&[String]>,
    ) -> Result<ScanResult> {
        let mut batches = Vec::with_capacity(records.len());
        let (mut end, mut decoded) = (from, 0usize);
        for record in records {
            if decoded >= max_bytes {
                break;
            }
            let mut b = self.decode(record, columns)?;
            decoded += batch::decoded_bytes(&b.batch);
            end = record.end() as i64;
            if b.header.base_offset < from {
                let skip = (from - b.header.base_offset) as usize;
                b.batch = b.batch.slice(skip, b.batch.num_rows() - skip);
                if !b.header.change_types.is_empty() {
                    b.header.change_types.drain(..skip);
                }
                b.header.base_offset = from;
                b.header.record_count -= skip as i32;
            }
            batches.push(b);
        }
        Ok(ScanResult {
            batches,
            from,
            end,
            high_watermark: self.high_watermark(),
            log_start: self.log_start(),
        })
    }

    /// A read of the log from `from` to `to` in order, for a reader that reads it all
    /// (a KV tablet's replay): as [`LogTablet::scan`] step by step, but with the
    /// segments ahead fetched together ([`mink_wal::Scan`]).
    pub fn scan_to(&self, from: i64, to: i64) -> Result<LogScan<'_>> {
        self.check_read_from(from)?;
        let hw = self.high_watermark();
        let max_bytes = self.inner.config.scan_bytes_max as usize;
        Ok(LogScan {
            tablet: self,
            scan: self.inner.stream.scan(
                from as u64,
                to.min(hw).max(from) as u64,
                max_bytes.max(1),
            ),
        })
    }

    /// Long-poll: returns once at least `min_bytes` (and at least one batch) are
    /// readable from `from`, or after `max_wait` with whatever is there (maybe
    /// nothing). Woken by the high watermark, never by polling.
    pub async fn tail(
        &self,
        from: i64,
        min_bytes: usize,
        max_wait: Duration,
        max_bytes: usize,
    ) -> Result<ScanResult> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut hw = self.inner.stream.subscribe();
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            let available = self.high_watermark();
            let expired = tokio::time::Instant::now() >= deadline;
            if available > from || expired {
                let result = self.scan(from, max_bytes).await?;
                if result.bytes() >= min_bytes.max(1) || expired {
                    return Ok(result);
                }
            }
            tokio::select! {
                changed = hw.changed() => {
                    if changed.is_err() {
                        return Err(MinkError::Unavailable(format!("{}: the stream closed", self.inner.bucket)));
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// EARLIEST (log start), LATEST (high watermark) or the first offset whose
    /// timestamp is at or after a time (see [`OffsetSpec::Timestamp`]); `None` when
    /// every row is older.
    pub async fn list_offsets(&self, spec: OffsetSpec) -> Result<Option<i64>> {
        Ok(match spec {
            OffsetSpec::Earliest => Some(self.log_start()),
            OffsetSpec::Latest => Some(self.high_watermark()),
            OffsetSpec::Timestamp(ts) => self.offset_for_time(ts).await?.map(|(o, _)| o),
        })
    }

    /// The first durable offset whose timestamp is at or after `ts`, with that
    /// timestamp: the row's own on a tablet indexed by record time, else the
    /// batch's commit timestamp is at or after `ts` and `ts` is returned.
    ///
    /// By record time, as Kafka's time index: the stream finds the first batch whose
    /// greatest record time is at or after `ts` (every batch before it holds only
    /// earlier rows), and that batch is read for its first such row. Batches appended
    /// before the tablet was indexed by record time are indexed by commit time; past
    /// one of those the batches after it are read until a row qualifies.
    pub async fn offset_for_time(&self, ts: i64) -> Result<Option<(i64, i64)>> {
        let bucket = self.inner.bucket;
        let Some(found) = self
            .inner
            .stream
            .offset_for_timestamp(ts)
            .await
            .map_err(|e| wal_error(bucket, e))?
            .map(|o| o as i64)
            .filter(|o| *o < self.high_watermark())
        else {
            return Ok(None);
        };
        let Some((column, _)) = self.inner.record_time.get() else {
            return Ok(Some((found, ts)));
        };
        let mut from = found;
        loop {
            from = from.max(self.log_start());
            if from >= self.high_watermark() {
                return Ok(None);
            }
            let scan = match self
                .scan(from, self.inner.config.scan_bytes_max as usize)
                .await
            {
                // Trimmed past `from` meanwhile: go on from the new log start.
                Err(MinkError::OffsetOutOfRange { .. }) if self.log_start() > from => continue,
                scan => scan?,
            };
            for b in &scan.batches {
                let Some(times) = record_times(&b.batch, column) else {
                    continue;
                };
                if let Some(i) =
                    (0..times.len()).find(|&i| times.is_valid(i) && times.value(i) >= ts)
                {
                    return Ok(Some((b.header.base_offset + i as i64, times.value(i))));
                }
            }
            let next = scan.next_offset(from);
            if next <= from {
                return Ok(None);
            }
            from = next;
        }
    }

    /// Where `epoch` ended in this log, as Kafka's OffsetForLeaderEpoch answers: the
    /// newest epoch at or below `epoch` that wrote a retained batch (`epoch` itself
    /// when none did), and the offset where the next epoch's first batch begins (the
    /// high watermark when no later epoch wrote one). `None` when `epoch` is newer
    /// than the one this tablet is open under.
    ///
    /// A batch carries the epoch it was written under, and epochs only grow along
    /// the log (a new leader appends after its predecessor's end). The epoch before
    /// the current one ends where this tablet opened (one read to learn its floor);
    /// an older one's end is found by bisection below that: one small read per step,
    /// about log2 of the retained rows. Clients ask after a leader change, not per
    /// fetch.
    pub async fn epoch_end(&self, epoch: u64) -> Result<Option<(u64, i64)>> {
        if epoch > self.inner.epoch {
            return Ok(None);
        }
        let hw = self.high_watermark();
        if epoch == self.inner.epoch {
            return Ok(Some((epoch, hw)));
        }
        // The epoch of the batch holding `offset` (trimmed meanwhile: from the start,
        // which may move again while it is read).
        let epoch_at = |offset: i64| async move {
            let mut at = offset;
            let scan = loop {
                match self.scan_with_markers(at, 1).await {
                    Err(MinkError::OffsetOutOfRange { log_start, .. }) if log_start > at => {
                        at = log_start;
                    }
                    scan => break scan?,
                }
            };
            Ok::<_, MinkError>(scan.batches.first().map(|b| {
                (
                    b.header.leader_epoch.max(0) as u64,
                    b.header.base_offset,
                    b.header.end_offset(),
                )
            }))
        };
        // Every batch from where this tablet opened is of its epoch: the common
        // question (the epoch before this one) takes one read.
        let opened = self.inner.opened_at.clamp(self.log_start(), hw);
        if opened > self.log_start()
            && let Some((e, _, _)) = epoch_at(opened - 1).await?
            && e <= epoch
        {
            return Ok(Some((e, opened)));
        }
        // The first offset written under an epoch above `epoch`: in [lo, hi).
        let (mut lo, mut hi) = (self.log_start(), opened);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match epoch_at(mid).await? {
                Some((e, base, _)) if e > epoch => hi = base.min(mid),
                Some((_, _, end)) => lo = end.max(mid + 1),
                None => break,
            }
        }
        // A trim meanwhile may have left `lo` below the new log start.
        let end = lo.max(self.log_start()).min(hw);
        let floor = if end > self.log_start() {
            match epoch_at(end - 1).await? {
                Some((e, _, _)) if e <= epoch => e,
                _ => epoch,
            }
        } else {
            epoch
        };
        Ok(Some((floor, end)))
    }

    /// Lets trims move the log start up to `offset` (never lowers what was allowed).
    /// A primary-key table's KV tablet calls it once a durable snapshot covers every
    /// row below `offset`.
    pub fn allow_trim_to(&self, offset: i64) {
        self.inner
            .trim_ceiling
            .fetch_max(offset, std::sync::atomic::Ordering::SeqCst);
    }

    /// The highest offset a trim may move the log start to (see
    /// [`LogTablet::allow_trim_to`]).
    pub fn trim_ceiling(&self) -> i64 {
        self.inner
            .trim_ceiling
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Moves the log start to `offset`, or less: at most the compacted end and at most
    /// the [trim ceiling](LogTablet::trim_ceiling); whole segments below it are
    /// deleted. Returns the new log start.
    pub async fn trim_before(&self, offset: i64) -> Result<i64> {
        let target = offset.min(self.trim_ceiling()).max(0) as u64;
        let start = self
            .inner
            .stream
            .trim(target)
            .await
            .map_err(|e| wal_error(self.inner.bucket, e))?;
        Ok(start as i64)
    }

    /// Trims data whose commit timestamp is older than `ttl` (whole segments are
    /// deleted; only compacted data can go). Returns the new log start.
    pub async fn trim_expired(&self, ttl: Duration) -> Result<i64> {
        self.trim_expired_below(ttl, None).await
    }

    /// The offset a TTL trim would move the log start to: the first row younger than
    /// `ttl` (the durable end when none is), at most the compacted end (only
    /// compacted data can go), never past `keep_from` (a lake-tiered table keeps what
    /// the lake lacks). The trim ceiling is not applied here.
    pub async fn expired_end(&self, ttl: Duration, keep_from: Option<i64>) -> Result<i64> {
        let cutoff = now_ms() - ttl.as_millis() as i64;
        let stream = &self.inner.stream;
        let target = match stream
            .offset_for_timestamp(cutoff)
            .await
            .map_err(|e| wal_error(self.inner.bucket, e))?
        {
            Some(offset) => offset,
            None => stream.durable_end(),
        }
        .min(stream.committed_end()) as i64;
        Ok(match keep_from {
            Some(keep) => target.min(keep.max(0)),
            None => target,
        })
    }

    /// As [`LogTablet::trim_expired`], but never past `keep_from`: rows at or above it
    /// stay whatever their age (a lake-tiered table keeps what the lake lacks).
    pub async fn trim_expired_below(&self, ttl: Duration, keep_from: Option<i64>) -> Result<i64> {
        let target = self.expired_end(ttl, keep_from).await?;
        self.trim_before(target).await
    }

    /// Trims expired data every `log.ttl_check_interval_ms` until `shutdown` resolves.
    /// `policy` is read each round (it changes with `alter_table`): the TTL (`None`
    /// keeps all) and an offset the trim must not pass (`keep_from`).
    pub async fn run_ttl(
        &self,
        policy: impl Fn() -> (Option<Duration>, Option<i64>),
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let trim = |ttl, keep_from| {
            let this = self.clone();
            async move { this.trim_expired_below(ttl, keep_from).await }
        };
        self.run_ttl_with(policy, trim, shutdown).await
    }

    /// [`LogTablet::run_ttl`] with another trim round (a primary-key table's KV tablet
    /// writes a snapshot first when the trim would need one).
    pub async fn run_ttl_with<F: std::future::Future<Output = Result<i64>>>(
        &self,
        policy: impl Fn() -> (Option<Duration>, Option<i64>),
        trim: impl Fn(Duration, Option<i64>) -> F,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let interval = Duration::from_millis(self.inner.config.ttl_check_interval_ms.max(1));
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
            if self.failure().is_some() {
                return;
            }
            if let (Some(ttl), keep_from) = policy()
                && let Err(e) = trim(ttl, keep_from).await
            {
                tracing::warn!(bucket = %self.inner.bucket, "TTL trim failed: {e}");
            }
        }
    }

    /// Rebuilds writer windows and the last commit timestamp by reading the log's
    /// headers from its start. (A checkpoint of writer state would bound this; see
    /// docs/log-format.md.)
    async fn recover(&self) -> Result<()> {
        let bucket = self.inner.bucket;
        // The stream may have moved here in place from an older epoch on this node,
        // with that tablet's appends still in flight: they are part of the stream,
        // below the offsets this tablet assigns. Recovery waits for them, so that the
        // writer windows (and a KV tablet's replay) cover every batch the stream holds;
        // otherwise a retry of one would be appended again and a merge would miss it.
        self.inner
            .stream
            .flush()
            .await
            .map_err(|e| wal_error(bucket, e))?;
        let end = self.inner.stream.durable_end();
        let mut pos = self.inner.stream.start_offset();
        let mut windows = Windows::default();
        let mut last_ts = i64::MIN;
        let mut last_epoch = i64::MIN;
        let mut batches = 0u64;
        let store = self
            .inner
            .stream
            .object_store_for(mink_wal::Purpose::Checkpoint);
        // A checkpoint below the log start describes batches that are all trimmed, and
        // misses those between it and the start: its windows would end before the
        // writers' trimmed batches. Without it those writers are unknown, as writers
        // whose batches are all trimmed are.
        if let Some(c) = crate::checkpoint::latest(&store, self.inner.stream.name(), end as i64)
            .await
            .filter(|c| c.offset >= pos as i64)
        {
            windows = c.windows();
            last_ts = c.last_commit_timestamp;
            pos = pos.max(c.offset.max(0) as u64);
            tracing::debug!(%bucket, from = c.offset, "recovering writer state from a checkpoint");
        }
        let from = pos;
        // Segments are fetched ahead, several at once: one after another, a recovery
        // over many small segments took seconds on a slow store (docs/s3stream.md).
        let mut scan = self.inner.stream.scan(pos, end, 8 << 20);
        while let Some(records) = scan.next().await.map_err(|e| wal_error(bucket, e))? {
            for record in records {
                let (h, _) = batch::decode_header(&record.payload)?;
                if h.base_offset != record.base as i64 {
                    return Err(MinkError::Internal(format!(
                        "{bucket}: the batch at stream offset {} claims offset {}",
                        record.base, h.base_offset
                    )));
                }
                // The invariants an append keeps, checked where the log is read back:
                // offsets contiguous, and leader epochs never going back along the log
                // (a new leader appends after its predecessor's end, under a newer
                // epoch). Either broken would mean a corrupt log, not a retry.
                // The log start may fall inside a batch (Kafka's DeleteRecords names
                // any offset): the first batch read may begin before it.
                let holds_start = batches == 0 && record.base < pos && pos < record.end();
                if record.base != pos && !holds_start {
                    return Err(MinkError::Internal(format!(
                        "{bucket}: recovery read a batch at offset {} where {pos} was next",
                        record.base
                    )));
                }
                if h.leader_epoch < last_epoch {
                    return Err(MinkError::Internal(format!(
                        "{bucket}: the batch at offset {} was written under epoch {}, after one \
                         of epoch {last_epoch}",
                        record.base, h.leader_epoch
                    )));
                }
                last_epoch = h.leader_epoch;
                last_ts = last_ts.max(h.commit_timestamp);
                if h.writer_id != NO_WRITER {
                    let rows = if h.is_marker() {
                        0
                    } else {
                        i64::from(h.record_count)
                    };
                    let (_, first_offset, last_offset) = record_offsets(h.base_offset, rows);
                    windows.push(
                        h.writer_id,
                        Entry {
                            first_sequence: h.first_sequence,
                            last_sequence: h.last_sequence,
                            first_offset,
                            last_offset,
                            commit_timestamp: h.commit_timestamp,
                            pending: None,
                        },
                    );
                }
                pos = record.end();
                batches += 1;
            }
        }
        not_superseded(bucket, self.inner.epoch, last_epoch)?;
        let mut state = self.lock();
        state.windows = windows;
        state.last_commit_timestamp = last_ts;
        state.recovered_from = from as i64;
        state.checkpointed = from as i64;
        drop(state);
        metrics::counter!("mink_log_recovery_batches_read_total").increment(batches);
        tracing::debug!(%bucket, batches, from, high_watermark = end, "log tablet recovered");
        Ok(())
    }

    /// Where the last recovery started reading batch headers (a checkpoint's offset, or
    /// the log start).
    pub fn recovered_from(&self) -> i64 {
        self.lock().recovered_from
    }

    /// Writes a writer-state checkpoint at the high watermark (see
    /// [`crate::checkpoint`]). Returns its offset.
    pub async fn checkpoint(&self) -> Result<i64> {
        let checkpoint = {
            let state = self.lock();
            let hw = self.high_watermark();
            // A tablet superseded in place (a newer open of the stream on this node)
            // shares the stream, whose end then holds batches its windows lack: its
            // checkpoint would leave them out. Epochs only grow, so the stream still
            // under this tablet's epoch after `hw` was read means `hw` is this one's.
            let now = self.inner.stream.epoch();
            if now != self.inner.epoch {
                return Err(MinkError::Fenced(format!(
                    "{}: no checkpoint: the stream is open under epoch {now}, not {}",
                    self.inner.bucket, self.inner.epoch
                )));
            }
            crate::checkpoint::Checkpoint::of(&state.windows, hw, state.last_commit_timestamp)
        };
        crate::checkpoint::write(
            &self
                .inner
                .stream
                .object_store_for(mink_wal::Purpose::Checkpoint),
            self.inner.stream.name(),
            &checkpoint,
        )
        .await
        .map_err(|e| {
            MinkError::StorageFailure(format!("{}: checkpoint: {e}", self.inner.bucket))
        })?;
        metrics::counter!("mink_log_checkpoints_total").increment(1);
        let mut state = self.lock();
        state.checkpointed = state.checkpointed.max(checkpoint.offset);
        Ok(checkpoint.offset)
    }

    /// Writes a checkpoint every `log.checkpoint_interval_ms` while appends arrive,
    /// until `shutdown` resolves; the first at once when the open's recovery read batch
    /// headers: a bucket that moves more often than the interval would otherwise never
    /// get one, and each owner's recovery would read more of the log than the last.
    pub async fn run_checkpoints(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let interval = Duration::from_millis(self.inner.config.checkpoint_interval_ms.max(1));
        let mut wait = if self.high_watermark() > self.lock().checkpointed {
            Duration::ZERO
        } else {
            interval
        };
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = interval;
            if self.failure().is_some() {
                return;
            }
            if self.high_watermark() <= self.lock().checkpointed {
                continue; // idle: no request
            }
            if let Err(e) = self.checkpoint().await {
                tracing::warn!(bucket = %self.inner.bucket, "writer checkpoint failed: {e}")
            }
        }
    }
}

enum Step {
    /// A retry of this window entry: answered as the original is.
    Duplicate(Entry),
    /// A new batch at `first..=last` (the empty range after a sequence marker,
    /// [`LogTablet::submit_marker`]), resolved through `outcome` by its own task.
    New {
        first: i64,
        last: i64,
        ts: i64,
        outcome: Arc<watch::Sender<Outcome>>,
    },
}

fn step_offsets(step: &Step) -> (i64, i64) {
    match step {
        Step::Duplicate(e) => (e.first_offset, e.last_offset),
        Step::New { first, last, .. } => (*first, *last),
    }
}

/// A batch with its offsets, on its way to durability ([`LogTablet::submit`]).
/// Dropping it does not abandon the batch: its outcome is recorded all the same.
pub struct Submitted {
    tablet: LogTablet,
    step: Step,
}

impl Submitted {
    /// The offsets the batch got (or, for a duplicate, had).
    pub fn offsets(&self) -> (i64, i64) {
        step_offsets(&self.step)
    }

    /// Whether this is a retry of a batch already in the log (or in flight).
    pub fn is_duplicate(&self) -> bool {
        matches!(self.step, Step::Duplicate(_))
    }

    /// Resolves once the batch is durable (for a duplicate still in flight, once the
    /// original is), or with the error that failed it.
    pub async fn wait(self) -> Result<Appended> {
        let (appended, outcome) = match self.step {
            Step::Duplicate(entry) => {
                metrics::counter!("mink_log_duplicate_batches_total").increment(1);
                let appended = Appended {
                    first_offset: entry.first_offset,
                    last_offset: entry.last_offset,
                    duplicated: true,
                    commit_timestamp: entry.commit_timestamp,
                };
                match entry.pending {
                    None => return Ok(appended),
                    Some(pending) => (appended, pending),
                }
            }
            Step::New {
                first,
                last,
                ts,
                outcome,
            } => (
                Appended {
                    first_offset: first,
                    last_offset: last,
                    duplicated: false,
                    commit_timestamp: ts,
                },
                outcome,
            ),
        };
        let mut rx = outcome.subscribe();
        loop {
            if let Some(result) = rx.borrow_and_update().clone() {
                // The other side of the acknowledgement: readers see what was acked.
                debug_assert!(
                    result.is_err() || self.tablet.high_watermark() > appended.last_offset,
                    "{}: acknowledged up to {} with the high watermark at {}",
                    self.tablet.inner.bucket,
                    appended.last_offset,
                    self.tablet.high_watermark()
                );
                return result.map(|()| appended);
            }
            if rx.changed().await.is_err() {
                return Err(MinkError::Unavailable(format!(
                    "{}: the original append vanished",
                    self.tablet.inner.bucket
                )));
            }
        }
    }
}
