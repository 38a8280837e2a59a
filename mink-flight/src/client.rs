//! The Rust client: connects to any node, routes rows on the client (partition, then
//! bucket) from the table's metadata, keeps one idempotent sequence per bucket under a
//! writer id from `init_writer` with up to five appends of a bucket in flight (a
//! pipeline, see `PipeState`), retries with the same sequence after a failure or a
//! `NotLeader` (refreshing its routing), retires the writer id when a write's outcome
//! is unknown, its caller's cancellation included (a sequence is never reused for
//! another batch while the leader may hold it), and reads, tails, looks up and
//! administers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightData, FlightDescriptor, SchemaAsIpc, Ticket};
use futures::{StreamExt, TryStreamExt};
use mink_types::{
    ChangeType, MinkError, Result, TableBucket, TableDescriptor, TablePath, split_by_bucket,
    split_by_partition,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::protocol::{
    BucketWritten, ReadTicket, Redirect, ScanBatch, WriteBatch, WriteDescriptor, WriteResult,
};

/// Attempts of one bucket write (with the same sequence) before the error is
/// returned: with the backoff, about 30 s (like a producer's delivery timeout).
const WRITE_ATTEMPTS_MAX: u32 = 24;

/// The longest one bucket write of a call takes, waits for earlier batches of its
/// pipeline included; then it fails (`Unavailable`), and its writer is retired if the
/// batch may have been sent.
const WRITE_DEADLINE: Duration = Duration::from_secs(45);

#[derive(Debug, Clone, Deserialize)]
struct PartitionMeta {
    id: i64,
}

#[derive(Debug, Clone, Deserialize)]
struct TableMeta {
    id: i64,
    descriptor: TableDescriptor,
    #[serde(default)]
    partitions: HashMap<String, PartitionMeta>,
}

#[derive(Debug, Clone, Deserialize)]
struct BucketMeta {
    bucket: TableBucket,
    leader_address: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Metadata {
    table: TableMeta,
    buckets: Vec<BucketMeta>,
}

/// What a failed bucket write says about its sequence: whether the leader may hold the
/// batch under it. A sequence may be reused for a *different* batch only when the
/// leader certainly did not record it; otherwise the leader would answer that batch
/// as a duplicate with the old offsets and its rows would be lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteFailure {
    /// Retry the same batch with the same sequence (refreshing the routing): the
    /// leader answers a retry of a recorded batch with its original offsets.
    /// `maybe_recorded` is false only for `NotLeader`, which a node answers before it
    /// touches its log.
    Retry { maybe_recorded: bool },
    /// Refused by validation before anything was recorded: the sequence is still
    /// free and the writer stays in use.
    Refused,
    /// Perhaps recorded and a retry would not tell, or the writer's sequence no
    /// longer matches the leader's: the writer is retired.
    Unknown,
}

/// Whether the leader refused a batch as out of order (its sequence does not follow
/// the writer's last one; nothing was recorded), as the client sees it.
fn is_out_of_order(e: &MinkError) -> bool {
    match e {
        MinkError::OutOfOrderSequence { .. } => true,
        MinkError::InvalidArgument { field, .. } => field == "batch_sequence",
        _ => false,
    }
}

/// A writer-sequence refusal (`OutOfOrderSequence`, `UnknownWriter`, `WriterFenced`)
/// from a status's details, where the node put it (see `server::status`).
fn writer_error(details: &[u8]) -> Option<MinkError> {
    match serde_json::from_slice::<MinkError>(details).ok()? {
        e @ (MinkError::OutOfOrderSequence { .. }
        | MinkError::UnknownWriter { .. }
        | MinkError::WriterFenced { .. }) => Some(e),
        _ => None,
    }
}

/// Whether `e` says the leader's window of the writer ends before sequences the
/// client had acknowledged: it expects a sequence above 0 (it knows the writer) but
/// below the batch's first. A batch of the writer that any attempt recorded would be
/// in that window (a recorded batch is either durable, and rebuilt into the window
/// of every later incarnation of the tablet, or lost with the incarnation that held
/// it), and the window can never reach it: the batch was not written and never will
/// be under this writer. It happens when a primary-key tablet reopens after Puts that
/// changed nothing, which leave no log record.
fn window_behind_acknowledged(e: &MinkError) -> bool {
    matches!(
        e,
        MinkError::OutOfOrderSequence { first_sequence, expected, .. }
            if 0 < *expected && expected < first_sequence
    )
}

/// Classifies an error of one bucket write attempt, as the client sees it (after
/// [`status_to_error`], so transport failures are here too).
///
/// - `NotLeader`: refused; retry at the leader. `Unavailable` (also every gRPC code
///   without a Mink meaning: transport errors, deadlines, `Unknown`), `StorageFailure`
///   and `Fenced` (the WAL failed or was fenced: the batch may be in an upload that
///   landed): perhaps recorded; retry, as [`MinkError::is_retriable`] says.
/// - `InvalidArgument`, `SchemaMismatch`, `NotFound`, `AlreadyExists`,
///   `LimitExceeded`, `Unimplemented`: the checks of a write (descriptor, schema,
///   batch, table and bucket, limits) that a node makes before it submits the batch
///   to its log: refused.
/// - `OutOfOrderSequence` (from a node before it put the error in the status details:
///   `InvalidArgument` on `batch_sequence`), `UnknownWriter`, `WriterFenced`: not
///   recorded by this attempt, but the leader's window no longer follows this writer
///   (it lost a batch that wrote nothing when it restarted, say), so every later
///   sequence would be refused too: unknown, retire the writer (and see
///   [`MinkClient::write_bucket`] for when the batch goes again).
/// - `Internal` (a node's error after its log took the batch, such as a failed KV
///   flush after the changelog is durable, or a transport failure tonic reports as
///   `INTERNAL`), `OffsetOutOfRange` and anything else: unknown.
fn classify_write_error(e: &MinkError) -> WriteFailure {
    match e {
        MinkError::NotLeader { .. } => WriteFailure::Retry {
            maybe_recorded: false,
        },
        e if e.is_retriable() => WriteFailure::Retry {
            maybe_recorded: true,
        },
        MinkError::InvalidArgument { field, .. } if field == "batch_sequence" => {
            WriteFailure::Unknown
        }
        MinkError::InvalidArgument { .. }
        | MinkError::SchemaMismatch(_)
        | MinkError::NotFound(_)
        | MinkError::AlreadyExists(_)
        | MinkError::LimitExceeded { .. }
        | MinkError::Unimplemented(_) => WriteFailure::Refused,
        _ => WriteFailure::Unknown,
    }
}

/// The attempts of one bucket write so far ([`MinkClient::write_bucket`]).
#[derive(Debug, Default)]
struct Attempts {
    /// Whether the next attempt looks the leader up again (after a stale answer).
    refresh: bool,
    /// Whether the next attempt waits first (a backoff).
    pause: bool,
    /// Whether an attempt may have been recorded: a refusal of a later one then does
    /// not free the sequence.
    maybe_recorded: bool,
    /// The last failure, returned when the attempts run out.
    last: Option<MinkError>,
}

impl Attempts {
    /// After `e`: the next attempt backs off and looks the leader up again.
    fn back_off(&mut self, e: MinkError) {
        self.refresh = true;
        self.pause = true;
        self.last = Some(e);
    }
}

/// What a bucket write attempt knew when it failed ([`after_failure`]).
#[derive(Debug, Clone, Copy, Default)]
struct Facts {
    /// An earlier batch of the writer in this bucket was in flight when the attempt
    /// was sent, or still is.
    overtaken: bool,
    /// An earlier batch of the writer in this bucket was resolved without an
    /// acknowledgement (an unknown outcome, a caller gone, or refused behind a later
    /// sequence).
    unacknowledged_before: bool,
    /// An earlier attempt of this batch may have been recorded.
    maybe_recorded: bool,
}

/// What a bucket write does after a failed attempt ([`after_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFailure {
    /// It overtook an earlier batch in flight (not recorded): send it again at once
    /// once the earlier ones are resolved.
    AfterEarlier,
    /// Retry the same sequence after a backoff, at a leader looked up again;
    /// `maybe_recorded`: whether this attempt may have been recorded.
    Retry { maybe_recorded: bool },
    /// Not recorded, and the leader's window no longer follows this writer: retire
    /// it and send the batch again under a new one.
    Restart,
    /// Refused before recording: return the error; the sequence is free again.
    Free,
    /// Its outcome is unknown: return the error and retire the writer.
    Retire,
}

/// Decides what a bucket write does after attempt error `e` (docs/protocol.md,
/// "Writes", holds the rules; [`classify_write_error`] reads the error).
fn after_failure(e: &MinkError, facts: Facts) -> AfterFailure {
    if is_out_of_order(e) {
        if facts.overtaken {
            return AfterFailure::AfterEarlier;
        }
        // Not recorded, and nothing of this writer before it is in flight or
        // unacknowledged: the leader's window does not follow this writer any more.
        // An attempt that may have been recorded does not change that when the window
        // ends before sequences acknowledged to this writer.
        if !facts.unacknowledged_before && (!facts.maybe_recorded || window_behind_acknowledged(e))
        {
            return AfterFailure::Restart;
        }
    }
    match classify_write_error(e) {
        WriteFailure::Retry { maybe_recorded } => AfterFailure::Retry { maybe_recorded },
        WriteFailure::Refused if !facts.maybe_recorded => AfterFailure::Free,
        WriteFailure::Refused | WriteFailure::Unknown => AfterFailure::Retire,
    }
}

/// How one writer's attempt at a bucket write ended, when it did not succeed.
enum WriteEnd {
    Failed(MinkError),
    /// Refused before recording, and safe to send again under a new writer.
    Restart(MinkError),
}

/// Batches of one bucket an append keeps in flight at most: the leader's writer
/// window (`mink_log::window::WINDOW_BATCHES`), so that a retry of the oldest is still
/// recognised as a duplicate however many later ones landed.
const APPEND_PIPELINE_DEPTH: usize = 5;

/// Batches of one bucket a Put keeps in flight: one. A primary-key tablet no longer
/// takes a Put past an undecided predecessor (`mink_log::window`), so more would be
/// safe; whether they pay is measured before this changes (a bucket merges its Puts one
/// at a time).
const PUT_PIPELINE_DEPTH: usize = 1;

/// One bucket's sequences of the current writer id: a pipeline of up to `depth`
/// batches in flight, in sequence order.
///
/// - A writer's first batch in a bucket goes alone (a leader takes a writer's first
///   batch at any sequence, so a later one must not overtake it); once one is
///   acknowledged, up to `depth`. The same holds at a leader that has not acknowledged
///   a batch of this writer yet (the bucket moved): the earliest batch goes first.
/// - A batch that overtook an earlier one in flight (`OutOfOrderSequence`) waits for
///   the earlier ones and is sent again; a retry after a failed attempt also waits for
///   every earlier batch first, and no batch is sent to another leader than the one
///   earlier batches in flight went to, so a new leader sees a writer's batches in
///   order.
/// - A new writer id (after a retirement) starts once the old one has nothing in flight.
#[derive(Debug, Default)]
struct PipeState {
    writer_id: Option<i64>,
    next: i64,
    /// Sequences handed out and not resolved yet, with the leader each was last sent to.
    unresolved: std::collections::BTreeMap<i64, Option<String>>,
    /// The leader that acknowledged a batch of `writer_id` in this bucket, last.
    acked_by: Option<String>,
    /// A write of this writer whose caller went away mid-write (a dropped future: a
    /// timeout around `append`): the leader may hold its sequence, so the writer is
    /// retired before the next batch is admitted.
    abandoned: Option<i64>,
    /// A writer with a batch in this bucket resolved without an acknowledgement and
    /// without freeing its sequence (an unknown outcome, or a refusal behind which a
    /// later sequence was handed out): an out-of-order answer to a later batch may be
    /// that batch's doing.
    unacknowledged: Option<i64>,
}

#[derive(Debug, Default)]
struct Pipeline {
    state: std::sync::Mutex<PipeState>,
    changed: tokio::sync::Notify,
}

impl Pipeline {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `ready` holds of the state (checked on every change).
    async fn wait_until(&self, mut ready: impl FnMut(&PipeState) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if ready(&self.lock()) {
                return;
            }
            changed.await;
        }
    }
}

/// One admitted batch of a pipeline. Dropped unresolved (its caller went away), it
/// marks its writer abandoned.
struct Admitted {
    pipe: Arc<Pipeline>,
    writer_id: i64,
    sequence: i64,
    resolved: bool,
}

impl Admitted {
    /// Waits until no earlier sequence of this writer is in flight.
    async fn wait_for_earlier(&self) {
        let sequence = self.sequence;
        self.pipe
            .wait_until(|st| st.unresolved.range(..sequence).next().is_none())
            .await;
    }

    fn earlier_in_flight(&self) -> bool {
        self.pipe
            .lock()
            .unresolved
            .range(..self.sequence)
            .next()
            .is_some()
    }

    /// Whether this batch must wait for the earlier ones before it goes to `leader`:
    /// an earlier batch in flight went to another leader, or `leader` has not
    /// acknowledged a batch of this writer yet.
    fn must_follow_earlier(&self, leader: &str) -> bool {
        let st = self.pipe.lock();
        st.acked_by.as_deref() != Some(leader)
            || st
                .unresolved
                .range(..self.sequence)
                .any(|(_, to)| to.as_deref().is_some_and(|to| to != leader))
    }

    /// What this batch's pipeline says of its failed attempt ([`after_failure`]):
    /// `had_earlier` whether an earlier batch was in flight when it was sent.
    fn facts(&self, had_earlier: bool, maybe_recorded: bool) -> Facts {
        let st = self.pipe.lock();
        Facts {
            overtaken: had_earlier || st.unresolved.range(..self.sequence).next().is_some(),
            unacknowledged_before: st.unacknowledged == Some(self.writer_id)
                || st.abandoned == Some(self.writer_id),
            maybe_recorded,
        }
    }

    fn sending_to(&self, leader: &str) {
        if let Some(to) = self.pipe.lock().unresolved.get_mut(&self.sequence) {
            *to = Some(leader.to_string());
        }
    }

    /// Resolves the batch; `acked_by` the leader that acknowledged it, if one did.
    fn resolve(mut self, acked_by: Option<&str>) {
        self.resolved = true;
        let mut st = self.pipe.lock();
        st.unresolved.remove(&self.sequence);
        match acked_by {
            Some(leader) if st.writer_id == Some(self.writer_id) => {
                st.acked_by = Some(leader.to_string());
            }
            Some(_) => {}
            None => st.unacknowledged = Some(self.writer_id),
        }
        drop(st);
        self.pipe.changed.notify_waiters();
    }

    /// Resolves a batch that was certainly not recorded and hands its sequence out
    /// again, if no later one was handed out; otherwise leaves it unresolved and
    /// answers false.
    fn try_free(&mut self) -> bool {
        let mut st = self.pipe.lock();
        if st.writer_id != Some(self.writer_id) || st.next != self.sequence + 1 {
            return false;
        }
        st.unresolved.remove(&self.sequence);
        st.next = self.sequence;
        self.resolved = true;
        drop(st);
        self.pipe.changed.notify_waiters();
        true
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.resolved {
            return;
        }
        let mut st = self.pipe.lock();
        st.unresolved.remove(&self.sequence);
        st.abandoned = Some(self.writer_id);
        drop(st);
        self.pipe.changed.notify_waiters();
    }
}

/// How long the client routes by a table's metadata before it reads it again.
pub const ROUTING_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// A client of a Mink cluster.
pub struct MinkClient {
    bootstrap: String,
    connections: tokio::sync::Mutex<HashMap<String, FlightServiceClient<Channel>>>,
    /// Each table's metadata, with when it was read: refreshed after a stale answer,
    /// and after [`ROUTING_MAX_AGE`] (a table may have grown buckets: a Kafka topic
    /// given more partitions).
    routing: tokio::sync::Mutex<HashMap<TablePath, (Metadata, std::time::Instant)>>,
    /// The writer id in use; replaced after a write whose outcome is unknown.
    writer_id: tokio::sync::Mutex<Option<i64>>,
    /// Per bucket, the sequences of the current writer and the batches in flight
    /// (see [`PipeState`]).
    sequences: std::sync::Mutex<HashMap<TableBucket, Arc<Pipeline>>>,
    /// Append batches of one bucket in flight at most (1..=[`APPEND_PIPELINE_DEPTH`]).
    append_depth: usize,
    /// How long a table's metadata routes writes before it is read again
    /// ([`ROUTING_MAX_AGE`] unless set).
    routing_max_age: std::time::Duration,
    /// Writer ids given up (see `retire_writer`): a pipeline never starts again under
    /// one, even for a caller that read it before it was retired.
    retired: std::sync::Mutex<std::collections::HashSet<i64>>,
    round_robin: std::sync::Mutex<HashMap<i64, u32>>,
    /// The highest `mink-applied-index` any node answered with: sent back as
    /// `mink-min-applied-index`, so every node serves at least what this client saw.
    applied_index: std::sync::atomic::AtomicU64,
}

/// A gRPC status back into Mink's error.
/// `LimitExceeded` from its text (`limit exceeded: {what} is {actual}, the limit is
/// {limit}`), so that it prints as the server said it; another text is kept whole.
fn limit_exceeded(message: &str) -> MinkError {
    let parsed = message
        .strip_prefix("limit exceeded: ")
        .and_then(|m| m.rsplit_once(", the limit is "))
        .and_then(|(head, limit)| {
            let (what, actual) = head.rsplit_once(" is ")?;
            Some((what, actual.parse().ok()?, limit.parse().ok()?))
        });
    match parsed {
        Some((what, actual, limit)) => MinkError::LimitExceeded {
            what: what.to_string(),
            limit,
            actual,
        },
        None => MinkError::LimitExceeded {
            what: message.to_string(),
            limit: 0,
            actual: 0,
        },
    }
}

pub fn status_to_error(status: tonic::Status) -> MinkError {
    let message = status.message().to_string();
    // The server's message is a MinkError's text; drop the prefix the variant adds back.
    let strip = |prefix: &str| message.strip_prefix(prefix).unwrap_or(&message).to_string();
    if status.code() == tonic::Code::FailedPrecondition
        && let Some(e) = writer_error(status.details())
    {
        return e;
    }
    match status.code() {
        tonic::Code::FailedPrecondition if message.starts_with("not the leader") => {
            match serde_json::from_slice::<Redirect>(status.details()) {
                Ok(r) => MinkError::NotLeader {
                    bucket: r.bucket,
                    leader: r.to,
                },
                Err(_) => MinkError::Unavailable(message),
            }
        }
        tonic::Code::FailedPrecondition if message.starts_with("out-of-order") => {
            MinkError::invalid("batch_sequence", message)
        }
        tonic::Code::InvalidArgument => match message
            .strip_prefix("invalid ")
            .and_then(|m| m.split_once(": "))
        {
            Some((field, reason)) => MinkError::invalid(field, reason),
            None => match message.strip_prefix("schema mismatch: ") {
                Some(m) => MinkError::SchemaMismatch(m.to_string()),
                None => MinkError::invalid("request", message),
            },
        },
        tonic::Code::NotFound => MinkError::NotFound(strip("not found: ")),
        tonic::Code::AlreadyExists => MinkError::AlreadyExists(strip("already exists: ")),
        tonic::Code::Unimplemented => MinkError::Unimplemented(strip("not implemented: ")),
        tonic::Code::Aborted => MinkError::Fenced(strip("fenced: ")),
        tonic::Code::ResourceExhausted => limit_exceeded(&message),
        tonic::Code::Internal | tonic::Code::OutOfRange => {
            MinkError::Internal(strip("internal error: "))
        }
        // A node's `StorageFailure` travels as UNAVAILABLE as well; its text tells it
        // apart. For a table write (no writer id) it means the outcome is unknown, where
        // `Unavailable` means nothing was written.
        tonic::Code::Unavailable if message.starts_with("storage failure: ") => {
            MinkError::StorageFailure(strip("storage failure: "))
        }
        _ => MinkError::Unavailable(strip("unavailable: ")),
    }
}

/// Whether a failed write's `status` is a node's own answer, or a connection that
/// could not be made (nothing was sent; tonic keeps its `ConnectError` in the status's
/// source chain), rather than a failure of the call after it was sent: a transport
/// error, an HTTP/2 reset or a deadline, which carry no Mink error and may come after
/// the node wrote the rows. A node's `Unavailable` and `StorageFailure` travel as
/// UNAVAILABLE and are told from a transport's by their text; a node's `Internal`
/// counts as a failed call (the rows may have been written before it).
pub fn node_answered(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        source = e.source();
    }
    let message = status.message();
    message.starts_with("unavailable: ")
        || message.starts_with("storage failure: ")
        || !(message.starts_with("h2 protocol error")
            || matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Internal
            ))
}

/// A failed write without a writer id (a table write), as its caller must read it: a
/// node's own answer as it is (a refusal such as `Unavailable` or `NotLeader` wrote
/// nothing; `StorageFailure` means the outcome is unknown), and a call that failed
/// after it was sent ([`node_answered`]) as `StorageFailure`, since nothing would
/// deduplicate a second attempt of rows the node may have written.
pub fn writerless_write_error(status: tonic::Status) -> MinkError {
    let answered = node_answered(&status);
    let e = status_to_error(status);
    if answered {
        return e;
    }
    MinkError::StorageFailure(format!(
        "the write's outcome is unknown ({e}); without a writer id it is not retried"
    ))
}

/// The messages of a one-batch DoPut: the schema (carrying the descriptor) and the
/// batch (carrying its `WriteBatch`).
pub fn encode_write(
    batch: &RecordBatch,
    descriptor: Option<&WriteDescriptor>,
    meta: &WriteBatch,
) -> Result<Vec<FlightData>> {
    let options = IpcWriteOptions::default();
    let mut schema = FlightData::from(SchemaAsIpc::new(&batch.schema(), &options));
    if let Some(d) = descriptor {
        let cmd = serde_json::to_vec(d).map_err(|e| MinkError::Internal(e.to_string()))?;
        schema.flight_descriptor = Some(FlightDescriptor::new_cmd(cmd));
    }
    let (_, encoded) = IpcDataGenerator::default().encode(
        batch,
        &mut DictionaryTracker::new(false),
        &options,
        &mut IpcWriteContext::default(),
    )?;
    let meta = serde_json::to_vec(meta).map_err(|e| MinkError::Internal(e.to_string()))?;
    Ok(vec![
        schema,
        FlightData::from(encoded).with_app_metadata(meta),
    ])
}

/// A Flight connection to `addr` (`host:port`) without message-size limits.
pub async fn connect(addr: &str) -> Result<FlightServiceClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .map_err(|e| MinkError::invalid("address", format!("{addr}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| MinkError::Unavailable(format!("cannot connect to {addr}: {e}")))?;
    Ok(FlightServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

impl MinkClient {
    /// A request carrying `mink-min-applied-index` (read-your-writes across nodes).
    fn request<T>(&self, body: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(body);
        let index = self
            .applied_index
            .load(std::sync::atomic::Ordering::Relaxed);
        if index > 0
            && let Ok(v) = index.to_string().parse()
        {
            request
                .metadata_mut()
                .insert(crate::server::MIN_APPLIED_INDEX_HEADER, v);
        }
        request
    }

    /// Remembers the applied index a response carries.
    fn saw<T>(&self, response: &tonic::Response<T>) {
        if let Some(index) = response
            .metadata()
            .get(crate::server::APPLIED_INDEX_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            self.applied_index
                .fetch_max(index, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sets how many append batches of one bucket may be in flight at once (like a
    /// Kafka producer's `max.in.flight.requests.per.connection`), from 1 to the
    /// leader's writer window (5, the default). Batches of one bucket are appended in
    /// the order their calls took sequences either way.
    pub fn with_append_pipeline_depth(mut self, depth: usize) -> Self {
        self.append_depth = depth.clamp(1, APPEND_PIPELINE_DEPTH);
        self
    }

    /// Routes by a table's metadata for at most `age` before reading it again (a
    /// round-robin table that grew buckets is written across all of them after
    /// that); [`ROUTING_MAX_AGE`] by default.
    pub fn with_routing_max_age(mut self, age: std::time::Duration) -> Self {
        self.routing_max_age = age;
        self
    }

    /// Connects to any node of the cluster (`host:port`).
    pub async fn connect(addr: &str) -> Result<Self> {
        let client = Self {
            bootstrap: addr.to_string(),
            connections: tokio::sync::Mutex::new(HashMap::new()),
            routing: tokio::sync::Mutex::new(HashMap::new()),
            writer_id: tokio::sync::Mutex::new(None),
            sequences: std::sync::Mutex::new(HashMap::new()),
            append_depth: APPEND_PIPELINE_DEPTH,
            routing_max_age: ROUTING_MAX_AGE,
            retired: std::sync::Mutex::new(std::collections::HashSet::new()),
            round_robin: std::sync::Mutex::new(HashMap::new()),
            applied_index: std::sync::atomic::AtomicU64::new(0),
        };
        client.connection(addr).await?;
        Ok(client)
    }

    async fn connection(&self, addr: &str) -> Result<FlightServiceClient<Channel>> {
        let mut connections = self.connections.lock().await;
        if let Some(c) = connections.get(addr) {
            return Ok(c.clone());
        }
        let client = connect(addr).await?;
        connections.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// Runs an action on the bootstrap node; returns its raw result body.
    pub async fn action_raw(&self, name: &str, body: &serde_json::Value) -> Result<Vec<u8>> {
        let mut client = self.connection(&self.bootstrap.clone()).await?;
        let action = Action {
            r#type: name.to_string(),
            body: serde_json::to_vec(body)
                .map_err(|e| MinkError::Internal(e.to_string()))?
                .into(),
        };
        let response = client
            .do_action(self.request(action))
            .await
            .map_err(status_to_error)?;
        self.saw(&response);
        let mut results = response.into_inner();
        let first = results
            .message()
            .await
            .map_err(status_to_error)?
            .ok_or_else(|| MinkError::Internal(format!("the {name} action answered nothing")))?;
        Ok(first.body.to_vec())
    }

    /// Runs an action with a JSON result.
    pub async fn action<R: DeserializeOwned>(
        &self,
        name: &str,
        body: serde_json::Value,
    ) -> Result<R> {
        let bytes = self.action_raw(name, &body).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| MinkError::Internal(format!("{name} answered: {e}")))
    }

    /// Runs any action of the typed protocol ([`crate::actions`]) at the bootstrap node
    /// and decodes its answer.
    pub async fn call<R: crate::actions::ActionRequest>(&self, request: &R) -> Result<R::Answer> {
        let body = serde_json::to_value(request).map_err(|e| MinkError::Internal(e.to_string()))?;
        let bytes = self.action_raw(R::NAME, &body).await?;
        <R::Answer as crate::actions::Answer>::from_body(R::NAME, bytes)
    }

    pub async fn create_database(&self, name: &str) -> Result<()> {
        use crate::actions::{CreateDatabase, DatabaseName};
        self.call(&CreateDatabase(DatabaseName {
            name: name.to_string(),
            cascade: false,
        }))
        .await
        .map(|_| ())
    }

    /// Creates a table; returns its id.
    pub async fn create_table(
        &self,
        path: &TablePath,
        descriptor: &TableDescriptor,
    ) -> Result<i64> {
        let created = self
            .call(&crate::actions::CreateTable {
                path: path.clone(),
                descriptor: descriptor.clone(),
                ignore_if_exists: false,
            })
            .await?;
        Ok(created.table_id)
    }

    async fn metadata(&self, path: &TablePath, refresh: bool) -> Result<Metadata> {
        if !refresh
            && let Some((m, read_at)) = self.routing.lock().await.get(path)
            && read_at.elapsed() < self.routing_max_age
        {
            return Ok(m.clone());
        }
        let meta: Metadata = self
            .action("metadata", serde_json::json!({"path": path}))
            .await?;
        self.routing
            .lock()
            .await
            .insert(path.clone(), (meta.clone(), std::time::Instant::now()));
        Ok(meta)
    }

    /// This client's writer id (from `init_writer`; a new one after a write whose
    /// outcome is unknown).
    pub async fn writer_id(&self) -> Result<i64> {
        let mut current = self.writer_id.lock().await;
        if let Some(id) = *current {
            return Ok(id);
        }
        let id = self
            .call(&crate::actions::InitWriter(crate::actions::Empty {}))
            .await?
            .writer_id;
        *current = Some(id);
        Ok(id)
    }

    /// Gives up `writer_id` after a write that may or may not have landed: its
    /// sequences can no longer be trusted, and a new writer starts afresh in every
    /// bucket (a writer's first batch is accepted at any sequence), as Kafka bumps a
    /// producer's epoch.
    async fn retire_writer(&self, writer_id: i64) {
        self.retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(writer_id);
        let mut current = self.writer_id.lock().await;
        if *current == Some(writer_id) {
            *current = None;
        }
    }

    /// Rows of `batch` per bucket (partitions created on demand), as the node routes.
    async fn route(
        &self,
        path: &TablePath,
        batch: &RecordBatch,
    ) -> Result<Vec<(TableBucket, RecordBatch)>> {
        let mut meta = self.metadata(path, false).await?;
        let d = meta.table.descriptor.clone();
        let column = |k: &String| {
            batch
                .schema()
                .index_of(k)
                .map_err(|_| MinkError::invalid("batch", format!("the batch lacks column {k:?}")))
        };
        let mut parts: Vec<(Option<i64>, RecordBatch)> = Vec::new();
        if d.is_partitioned() {
            let keys: Vec<usize> = d.partition_keys.iter().map(column).collect::<Result<_>>()?;
            for p in split_by_partition(batch, &keys)? {
                if !meta.table.partitions.contains_key(&p.name) {
                    let _: serde_json::Value = self
                        .action(
                            "create_partition",
                            serde_json::json!({"path": path, "name": p.name}),
                        )
                        .await?;
                    meta = self.metadata(path, true).await?;
                }
                let id = meta
                    .table
                    .partitions
                    .get(&p.name)
                    .map(|p| p.id)
                    .ok_or_else(|| {
                        MinkError::Unavailable(format!("partition {} not visible yet", p.name))
                    })?;
                parts.push((Some(id), take_record_batch(batch, &p.rows)?));
            }
        } else {
            parts.push((None, batch.clone()));
        }
        let keys: Vec<usize> = d.bucket_keys().iter().map(column).collect::<Result<_>>()?;
        let mut out = Vec::new();
        for (partition, part) in parts {
            if keys.is_empty() {
                let bucket = {
                    let mut rr = self.round_robin.lock().unwrap_or_else(|e| e.into_inner());
                    let next = rr.entry(meta.table.id).or_insert(0);
                    let b = *next % d.bucket_count;
                    *next = next.wrapping_add(1);
                    b
                };
                out.push((TableBucket::new(meta.table.id, partition, bucket), part));
                continue;
            }
            for rows in split_by_bucket(&part, &keys, d.bucketing, d.bucket_count)? {
                out.push((
                    TableBucket::new(meta.table.id, partition, rows.bucket),
                    take_record_batch(&part, &rows.rows)?,
                ));
            }
        }
        Ok(out)
    }

    async fn leader_of(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        refresh: bool,
    ) -> Result<String> {
        let find = |meta: &Metadata| {
            meta.buckets
                .iter()
                .find(|b| b.bucket == bucket)
                .and_then(|b| b.leader_address.clone())
        };
        if let Some(leader) = find(&self.metadata(path, refresh).await?) {
            return Ok(leader);
        }
        // A bucket younger than the cached routing (a new partition), or one that had no
        // leader when it was cached: look again.
        if !refresh && let Some(leader) = find(&self.metadata(path, true).await?) {
            return Ok(leader);
        }
        Err(MinkError::Unavailable(format!(
            "{bucket} has no leader yet"
        )))
    }

    /// Drops the cached routing of `path` after an answer that says it is stale.
    async fn stale_routing<T>(&self, path: &TablePath, result: Result<T>) -> Result<T> {
        if matches!(
            result,
            Err(MinkError::NotLeader { .. }
                | MinkError::Unavailable(_)
                | MinkError::StorageFailure(_))
        ) {
            self.routing.lock().await.remove(path);
        }
        result
    }

    /// Writes one bucket's rows at its leader with the bucket's next sequence, with up
    /// to `depth` batches of the bucket in flight (see [`PipeState`]); retries with the
    /// same sequence after `NotLeader` (refreshing the routing) or an unavailable
    /// leader. A failure that leaves the sequence's fate unknown retires the writer
    /// (see [`classify_write_error`]), so the next batch never reuses a sequence the
    /// leader may hold; so does a write whose caller went away mid-write.
    ///
    /// A batch refused as out of order with nothing before it in flight, that no
    /// attempt may have recorded or whose refusal expects a sequence the client had
    /// acknowledged (see [`window_behind_acknowledged`]), goes once more under a new
    /// writer: the leader's window lost this writer's latest sequences (a primary-key
    /// tablet reopened after Puts that changed nothing, which leave no log record), and
    /// the batch itself was not written.
    async fn write_bucket(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        make: impl Fn(i64) -> WriteDescriptor,
        batch: &RecordBatch,
        changes: Option<Vec<ChangeType>>,
        depth: usize,
    ) -> Result<BucketWritten> {
        match self
            .write_bucket_once(path, bucket, &make, batch, changes.clone(), depth)
            .await
        {
            Err(WriteEnd::Restart(e)) => {
                tracing::debug!(%bucket, "a new writer after an out-of-order refusal: {e}");
                match self
                    .write_bucket_once(path, bucket, &make, batch, changes, depth)
                    .await
                {
                    Ok(written) => Ok(written),
                    Err(WriteEnd::Failed(e) | WriteEnd::Restart(e)) => Err(e),
                }
            }
            Err(WriteEnd::Failed(e)) => Err(e),
            Ok(written) => Ok(written),
        }
    }

    /// [`MinkClient::write_bucket`] under one writer id: attempts at the leader until
    /// one is acknowledged, or [`after_failure`] ends the write.
    async fn write_bucket_once(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        make: &impl Fn(i64) -> WriteDescriptor,
        batch: &RecordBatch,
        changes: Option<Vec<ChangeType>>,
        depth: usize,
    ) -> Result<BucketWritten, WriteEnd> {
        let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
        let late =
            || MinkError::Unavailable(format!("{bucket}: not written within {WRITE_DEADLINE:?}"));
        let pipe = self.pipeline(bucket);
        let mut admitted = match tokio::time::timeout_at(deadline, self.admit(&pipe, depth)).await {
            Ok(admitted) => admitted.map_err(WriteEnd::Failed)?,
            Err(_) => return Err(WriteEnd::Failed(late())),
        };
        let (writer_id, sequence) = (admitted.writer_id, admitted.sequence);
        let meta = WriteBatch {
            batch_sequence: Some(sequence),
            changes,
        };
        let descriptor = make(writer_id);
        let mut attempts = Attempts::default();
        for attempt in 0..WRITE_ATTEMPTS_MAX {
            if attempts.pause {
                tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
            }
            let leader = match self.leader_of(path, bucket, attempts.refresh).await {
                Ok(l) => l,
                Err(e) => {
                    attempts.back_off(e);
                    continue;
                }
            };
            // A new leader sees this writer's batches in order.
            if (attempts.refresh || admitted.must_follow_earlier(&leader))
                && tokio::time::timeout_at(deadline, admitted.wait_for_earlier())
                    .await
                    .is_err()
            {
                attempts.last = Some(late());
                break;
            }
            admitted.sending_to(&leader);
            // An out-of-order answer means "overtaken" if an earlier batch was in flight
            // when this one was sent, even if it was resolved by the time the answer came.
            let had_earlier = admitted.earlier_in_flight();
            let answer =
                tokio::time::timeout_at(deadline, self.put_at(&leader, &descriptor, batch, &meta))
                    .await;
            let Ok(answer) = answer else {
                // Perhaps recorded: unknown.
                attempts.last = Some(late());
                break;
            };
            let e = match answer {
                Ok(WriteResult::Written {
                    first_offset,
                    last_offset,
                    duplicated,
                }) => {
                    admitted.resolve(Some(&leader));
                    return Ok(BucketWritten {
                        bucket,
                        first_offset,
                        last_offset,
                        duplicated,
                    });
                }
                Ok(other) => MinkError::Internal(format!(
                    "{bucket}: a bucket write with sequence {sequence} answered {other:?}"
                )),
                Err(e) => e,
            };
            match after_failure(&e, admitted.facts(had_earlier, attempts.maybe_recorded)) {
                AfterFailure::AfterEarlier => {
                    if tokio::time::timeout_at(deadline, admitted.wait_for_earlier())
                        .await
                        .is_err()
                    {
                        attempts.last = Some(late());
                        break;
                    }
                    attempts.pause = false;
                    attempts.last = Some(e);
                }
                AfterFailure::Retry { maybe_recorded } => {
                    attempts.maybe_recorded |= maybe_recorded;
                    attempts.back_off(e);
                }
                AfterFailure::Restart => {
                    self.retire_writer(writer_id).await;
                    admitted.resolve(None);
                    return Err(WriteEnd::Restart(e));
                }
                // The sequence is free again, unless a later batch took the next one;
                // then the leader will refuse that one as out of order, and this
                // writer is done.
                AfterFailure::Free if admitted.try_free() => return Err(WriteEnd::Failed(e)),
                AfterFailure::Free | AfterFailure::Retire => {
                    self.retire_writer(writer_id).await;
                    admitted.resolve(None);
                    return Err(WriteEnd::Failed(e));
                }
            }
        }
        // Perhaps written, perhaps not: this writer's sequences are unknown from here.
        self.retire_writer(writer_id).await;
        admitted.resolve(None);
        Err(WriteEnd::Failed(attempts.last.unwrap_or_else(|| {
            MinkError::Unavailable(format!("{bucket}: no attempt made"))
        })))
    }

    /// `bucket`'s pipeline of the current writer (see [`PipeState`]).
    fn pipeline(&self, bucket: TableBucket) -> Arc<Pipeline> {
        self.sequences
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(bucket)
            .or_default()
            .clone()
    }

    /// Takes the next sequence of `pipe` for a batch, once the pipeline has room (see
    /// [`PipeState`]).
    async fn admit(&self, pipe: &Arc<Pipeline>, depth: usize) -> Result<Admitted> {
        loop {
            // Retired before the mark is cleared: a caller that goes away meanwhile
            // leaves the mark for the next one.
            let abandoned = pipe.lock().abandoned;
            if let Some(writer_id) = abandoned {
                self.retire_writer(writer_id).await;
                let mut st = pipe.lock();
                if st.abandoned == Some(writer_id) {
                    st.abandoned = None;
                    // Batches of the writer still in flight here must still see that
                    // an earlier one's outcome is unknown (`Facts`).
                    st.unacknowledged = Some(writer_id);
                }
            }
            let writer_id = self.writer_id().await?;
            let changed = pipe.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // Ok(sequence), or Err(whether to look again at once rather than wait).
            let admission: std::result::Result<i64, bool> = {
                let mut st = pipe.lock();
                // A writer id read before another task retired it is never used again:
                // a pipe reset to it would start at sequence 0, which its leader may
                // hold for another batch.
                let retired = self
                    .retired
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(&writer_id);
                if st.abandoned.is_some() || retired {
                    Err(true)
                } else {
                    if st.writer_id != Some(writer_id) && st.unresolved.is_empty() {
                        *st = PipeState {
                            writer_id: Some(writer_id),
                            ..PipeState::default()
                        };
                    }
                    // The sequences in flight span at most `depth` (the leader's
                    // window), so a retry of the oldest is still known as a duplicate
                    // however many later ones landed.
                    let oldest = st.unresolved.keys().next().copied().unwrap_or(st.next);
                    let room = if st.acked_by.is_some() {
                        depth.max(1)
                    } else {
                        1
                    };
                    if st.writer_id == Some(writer_id) && st.next < oldest + room as i64 {
                        let sequence = st.next;
                        st.next += 1;
                        st.unresolved.insert(sequence, None);
                        Ok(sequence)
                    } else {
                        Err(false)
                    }
                }
            };
            match admission {
                Ok(sequence) => {
                    return Ok(Admitted {
                        pipe: pipe.clone(),
                        writer_id,
                        sequence,
                        resolved: false,
                    });
                }
                // The abandoned mark is handled at the top; a retirement under way
                // finishes meanwhile.
                Err(true) => tokio::task::yield_now().await,
                Err(false) => changed.await,
            }
        }
    }

    async fn put_at(
        &self,
        addr: &str,
        descriptor: &WriteDescriptor,
        batch: &RecordBatch,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let mut client = self.connection(addr).await?;
        let data = encode_write(batch, Some(descriptor), meta)?;
        // A table write carries no writer id: a call that failed after it was sent
        // leaves its outcome unknown (`writerless_write_error`).
        let writerless = matches!(
            descriptor,
            WriteDescriptor::AppendTable { .. } | WriteDescriptor::PutTable { .. }
        );
        let error = move |s: tonic::Status| match writerless {
            true => writerless_write_error(s),
            false => status_to_error(s),
        };
        let response = client
            .do_put(self.request(futures::stream::iter(data)))
            .await
            .map_err(error)?;
        self.saw(&response);
        let mut results = response.into_inner();
        let first = results
            .message()
            .await
            .map_err(error)?
            .ok_or_else(|| match writerless {
                true => MinkError::StorageFailure(
                    "the node ended the write with no answer: its outcome is unknown; \
                     without a writer id it is not retried"
                        .into(),
                ),
                false => MinkError::Internal("a write answered nothing".into()),
            })?;
        serde_json::from_slice(&first.app_metadata)
            .map_err(|e| MinkError::Internal(format!("a write answered: {e}")))
    }

    /// Writes rows to a table through the node this client bootstraps from, which
    /// routes them (`AppendTable` for a log table, `PutTable` for a primary-key table,
    /// with `changes` per row if given), as pyarrow and `mink write` do: one request
    /// however many buckets the rows span. Not idempotent: a write that fails may have
    /// landed in some buckets, and writing it again writes those rows again. The error
    /// says which: `NotLeader` or `Unavailable`, nothing was written; `StorageFailure`,
    /// the outcome is unknown (the node's message names the buckets that landed, if
    /// any), which is also how a call that failed after it was sent reads (a
    /// connection lost mid-request, a deadline: [`writerless_write_error`]).
    pub async fn write_table(
        &self,
        path: &TablePath,
        batch: &RecordBatch,
        changes: Option<Vec<ChangeType>>,
    ) -> Result<Vec<BucketWritten>> {
        let d = self.metadata(path, false).await?.table.descriptor;
        let descriptor = if d.has_primary_key() {
            WriteDescriptor::PutTable {
                path: path.clone(),
                schema_id: d.schema.schema_id,
                target_columns: None,
            }
        } else if changes.is_some() {
            return Err(MinkError::invalid(
                "changes",
                format!("{path} has no primary key: its rows carry no change types"),
            ));
        } else {
            WriteDescriptor::AppendTable {
                path: path.clone(),
                schema_id: d.schema.schema_id,
            }
        };
        let meta = WriteBatch {
            batch_sequence: None,
            changes,
        };
        let bootstrap = self.bootstrap.clone();
        let result = self.put_at(&bootstrap, &descriptor, batch, &meta).await;
        match self.stale_routing(path, result).await? {
            WriteResult::Routed { buckets } => Ok(buckets),
            other => Err(MinkError::Internal(format!(
                "a table write answered {other:?}"
            ))),
        }
    }

    /// Appends rows to a log table, routed on the client. Each bucket's part is
    /// written exactly once: it is retried with the same sequence (about 30 s) until
    /// acknowledged. The call is not atomic across buckets: when it fails, some buckets
    /// may hold their rows, and calling it again writes those rows again.
    pub async fn append(
        &self,
        path: &TablePath,
        batch: &RecordBatch,
    ) -> Result<Vec<BucketWritten>> {
        let first = self.append_once(path, batch).await;
        if self.table_replaced(path, &first).await? {
            return self.append_once(path, batch).await;
        }
        first
    }

    /// Whether `result` failed because the routing names a table that was dropped
    /// and `path` now names another (a new table of the same name): then nothing was
    /// written to the table `path` names and the call can be made again, once. The
    /// stale routing is dropped either way.
    async fn table_replaced<T>(&self, path: &TablePath, result: &Result<T>) -> Result<bool> {
        let Err(MinkError::NotFound(what)) = result else {
            return Ok(false);
        };
        let Some(id) = what
            .strip_prefix("table id ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|id| id.parse::<i64>().ok())
        else {
            return Ok(false);
        };
        let cached = self.routing.lock().await.remove(path);
        let was = cached.map(|r| r.0.table.id);
        if was != Some(id) {
            return Ok(false);
        }
        Ok(self
            .metadata(path, true)
            .await
            .is_ok_and(|m| m.table.id != id))
    }

    async fn append_once(
        &self,
        path: &TablePath,
        batch: &RecordBatch,
    ) -> Result<Vec<BucketWritten>> {
        let schema_id = self
            .metadata(path, false)
            .await?
            .table
            .descriptor
            .schema
            .schema_id;
        // Every bucket's part at once (each bucket keeps its own order).
        let parts = self.route(path, batch).await?;
        futures::future::try_join_all(parts.into_iter().map(|(bucket, rows)| async move {
            let make = |writer_id| WriteDescriptor::Append {
                bucket,
                schema_id,
                writer_id: Some(writer_id),
            };
            self.write_bucket(path, bucket, make, &rows, None, self.append_depth)
                .await
        }))
        .await
    }

    /// Upserts (or, with `changes`, deletes) rows of a primary-key table; with
    /// `target_columns`, a partial update.
    pub async fn put(
        &self,
        path: &TablePath,
        batch: &RecordBatch,
        changes: Option<Vec<ChangeType>>,
        target_columns: Option<Vec<String>>,
    ) -> Result<Vec<BucketWritten>> {
        let first = self
            .put_once(path, batch, changes.clone(), target_columns.clone())
            .await;
        if self.table_replaced(path, &first).await? {
            return self.put_once(path, batch, changes, target_columns).await;
        }
        first
    }

    async fn put_once(
        &self,
        path: &TablePath,
        batch: &RecordBatch,
        changes: Option<Vec<ChangeType>>,
        target_columns: Option<Vec<String>>,
    ) -> Result<Vec<BucketWritten>> {
        let schema_id = self
            .metadata(path, false)
            .await?
            .table
            .descriptor
            .schema
            .schema_id;
        if let Some(c) = &changes
            && c.len() != batch.num_rows()
        {
            return Err(MinkError::invalid(
                "changes",
                format!("{} change types for {} rows", c.len(), batch.num_rows()),
            ));
        }
        // Route row indices so the changes follow their rows.
        let indices = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
        let with_index = RecordBatch::try_new(
            std::sync::Arc::new(arrow::datatypes::Schema::new(
                batch
                    .schema()
                    .fields()
                    .iter()
                    .cloned()
                    .chain(std::iter::once(std::sync::Arc::new(
                        arrow::datatypes::Field::new(
                            "__mink_row",
                            arrow::datatypes::DataType::UInt32,
                            false,
                        ),
                    )))
                    .collect::<Vec<_>>(),
            )),
            batch
                .columns()
                .iter()
                .cloned()
                .chain(std::iter::once(
                    std::sync::Arc::new(indices) as arrow::array::ArrayRef
                ))
                .collect(),
        )?;
        let mut writes = Vec::new();
        for (bucket, rows) in self.route(path, &with_index).await? {
            let n = rows.num_columns();
            let row_ids = rows
                .column(n - 1)
                .as_any()
                .downcast_ref::<UInt32Array>()
                .cloned();
            let rows = rows.project(&(0..n - 1).collect::<Vec<_>>())?;
            let part_changes = match (&changes, row_ids) {
                (Some(c), Some(ids)) => Some(ids.values().iter().map(|i| c[*i as usize]).collect()),
                _ => None,
            };
            let targets = target_columns.clone();
            let make = move |writer_id| WriteDescriptor::Put {
                bucket,
                schema_id,
                writer_id: Some(writer_id),
                target_columns: targets.clone(),
            };
            writes.push(async move {
                self.write_bucket(path, bucket, make, &rows, part_changes, PUT_PIPELINE_DEPTH)
                    .await
            });
        }
        futures::future::try_join_all(writes).await
    }

    /// Reads a bucket from `offset` at its leader.
    pub async fn scan(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        offset: i64,
    ) -> Result<Vec<(RecordBatch, ScanBatch)>> {
        let leader = self.leader_of(path, bucket, false).await?;
        let ticket = ReadTicket::Scan {
            bucket,
            offset,
            max_bytes: None,
            end_offset: None,
            columns: None,
            filter: None,
        };
        let result = self.read_at(&leader, &ticket).await;
        self.stale_routing(path, result).await
    }

    async fn read_at(
        &self,
        addr: &str,
        ticket: &ReadTicket,
    ) -> Result<Vec<(RecordBatch, ScanBatch)>> {
        self.read_at_as(addr, ticket).await
    }

    /// A read whose batches carry metadata `M` (`ScanBatch` or `SnapshotBatch`).
    async fn read_at_as<M: DeserializeOwned>(
        &self,
        addr: &str,
        ticket: &ReadTicket,
    ) -> Result<Vec<(RecordBatch, M)>> {
        let mut client = self.connection(addr).await?;
        let ticket = Ticket {
            ticket: serde_json::to_vec(ticket)
                .map_err(|e| MinkError::Internal(e.to_string()))?
                .into(),
        };
        let response = client
            .do_get(self.request(ticket))
            .await
            .map_err(status_to_error)?;
        self.saw(&response);
        let stream = response.into_inner();
        let mut decoder = FlightDataDecoder::new(
            stream.map_err(|e| arrow_flight::error::FlightError::Tonic(Box::new(e))),
        );
        let mut out = Vec::new();
        while let Some(item) = decoder.next().await {
            let decoded = item.map_err(|e| match e {
                arrow_flight::error::FlightError::Tonic(s) => status_to_error(*s),
                other => MinkError::Internal(other.to_string()),
            })?;
            if let DecodedPayload::RecordBatch(batch) = decoded.payload {
                let meta: M = serde_json::from_slice(&decoded.inner.app_metadata)
                    .map_err(|e| MinkError::Internal(format!("batch metadata: {e}")))?;
                out.push((batch, meta));
            }
        }
        Ok(out)
    }

    /// A read any node answers (`Lake`, `Union`), at the bootstrap node.
    pub async fn read_any(&self, ticket: &ReadTicket) -> Result<Vec<(RecordBatch, ScanBatch)>> {
        self.read_at(&self.bootstrap.clone(), ticket).await
    }

    /// A primary-key table's `Lake` or `Union` read (its state, with `SnapshotBatch`
    /// metadata), at the bootstrap node.
    pub async fn read_state_any(
        &self,
        ticket: &ReadTicket,
    ) -> Result<Vec<(RecordBatch, crate::protocol::SnapshotBatch)>> {
        self.read_at_as(&self.bootstrap.clone(), ticket).await
    }

    /// Every row of a table (all buckets, all partitions), read at the leaders.
    pub async fn scan_table(&self, path: &TablePath) -> Result<Vec<RecordBatch>> {
        let meta = self.metadata(path, true).await?;
        let mut out = Vec::new();
        for b in &meta.buckets {
            let Some(leader) = &b.leader_address else {
                return Err(MinkError::Unavailable(format!(
                    "{} has no leader yet",
                    b.bucket
                )));
            };
            let mut offset = 0;
            loop {
                let batches = self
                    .read_at(
                        leader,
                        &ReadTicket::Scan {
                            bucket: b.bucket,
                            offset,
                            max_bytes: None,
                            end_offset: None,
                            columns: None,
                            filter: None,
                        },
                    )
                    .await?;
                let Some((last, meta)) = batches.last() else {
                    break;
                };
                let next = meta.base_offset + last.num_rows() as i64;
                let done = next >= meta.high_watermark;
                out.extend(batches.into_iter().map(|(b, _)| b));
                offset = next;
                if done {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Long poll: waits up to `max_wait` for rows of `bucket` from `offset`; returns
    /// them and the offset to poll from next.
    pub async fn poll(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        offset: i64,
        max_wait: Duration,
    ) -> Result<(Vec<RecordBatch>, i64)> {
        let (batches, next) = self
            .poll_with_offsets(path, bucket, offset, max_wait)
            .await?;
        Ok((batches.into_iter().map(|(_, b)| b).collect(), next))
    }

    /// [`MinkClient::poll`] with each batch's first offset (row `i` is at that offset
    /// plus `i`; offsets may skip between batches, past sequence markers), batches of
    /// no rows left out.
    pub async fn poll_with_offsets(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        offset: i64,
        max_wait: Duration,
    ) -> Result<(Vec<(i64, RecordBatch)>, i64)> {
        let result = self.poll_leader(path, bucket, offset, max_wait).await;
        self.stale_routing(path, result).await
    }

    async fn poll_leader(
        &self,
        path: &TablePath,
        bucket: TableBucket,
        offset: i64,
        max_wait: Duration,
    ) -> Result<(Vec<(i64, RecordBatch)>, i64)> {
        let leader = self.leader_of(path, bucket, false).await?;
        let mut client = self.connection(&leader).await?;
        let cmd = serde_json::to_vec(&crate::protocol::ExchangeDescriptor::Tail { bucket })
            .map_err(|e| MinkError::Internal(e.to_string()))?;
        let poll = serde_json::to_vec(&crate::protocol::TailPoll {
            offset,
            max_wait_ms: max_wait.as_millis() as u64,
            min_bytes: 1,
            max_bytes: None,
        })
        .map_err(|e| MinkError::Internal(e.to_string()))?;
        let first = FlightData {
            flight_descriptor: Some(FlightDescriptor::new_cmd(cmd)),
            app_metadata: poll.into(),
            ..Default::default()
        };
        let mut stream = client
            .do_exchange(self.request(futures::stream::iter(vec![first])))
            .await
            .map_err(status_to_error)?
            .into_inner();
        // Decoded by hand: the answer ends with a metadata-only `TailEnd` message.
        let mut schema: Option<arrow::datatypes::SchemaRef> = None;
        let mut batches = Vec::new();
        while let Some(data) = stream.message().await.map_err(status_to_error)? {
            if data.data_header.is_empty() {
                if let Ok(crate::protocol::TailEnd::TailEnd { next_offset, .. }) =
                    serde_json::from_slice(&data.app_metadata)
                {
                    return Ok((batches, next_offset));
                }
                continue;
            }
            match &schema {
                None => {
                    schema = Some(std::sync::Arc::new(arrow::datatypes::Schema::try_from(
                        &data,
                    )?))
                }
                Some(s) => {
                    let meta: ScanBatch =
                        serde_json::from_slice(&data.app_metadata).map_err(|e| {
                            MinkError::Internal(format!("a tail batch's metadata: {e}"))
                        })?;
                    let batch = arrow_flight::utils::flight_data_to_arrow_batch(
                        &data,
                        s.clone(),
                        &HashMap::new(),
                    )?;
                    if batch.num_rows() > 0 {
                        batches.push((meta.base_offset, batch));
                    }
                }
            }
        }
        Err(MinkError::Unavailable(
            "the tail ended without an answer".into(),
        ))
    }

    /// Rows by primary key (values in key-column order), as found.
    pub async fn lookup(
        &self,
        path: &TablePath,
        keys: Vec<Vec<serde_json::Value>>,
    ) -> Result<Vec<RecordBatch>> {
        let found = self
            .call(&crate::actions::Lookup {
                forwarded: false,
                path: path.clone(),
                keys,
            })
            .await?;
        let reader =
            arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(found.0), None)?;
        reader
            .map(|b| b.map_err(|e| MinkError::Internal(e.to_string())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_error_reads_back_as_the_server_wrote_it() {
        let sent = MinkError::LimitExceeded {
            what: "table 1 bucket 0: encoded batch bytes".into(),
            limit: 16_777_216,
            actual: 50_413_134,
        };
        let status = tonic::Status::resource_exhausted(sent.to_string());
        let back = status_to_error(status);
        assert_eq!(back, sent);
        assert_eq!(back.to_string(), sent.to_string());
        let odd = status_to_error(tonic::Status::resource_exhausted("too many"));
        assert!(matches!(odd, MinkError::LimitExceeded { ref what, .. } if what == "too many"));
    }

    /// `StorageFailure` and `Unavailable` share UNAVAILABLE on the wire; a table write's
    /// "outcome unknown" must not read back as `Unavailable`'s "nothing was written".
    #[test]
    fn a_storage_failure_reads_back_as_itself_not_as_unavailable() {
        let sent = MinkError::StorageFailure(
            "table 1 bucket 0: the write's outcome is unknown; it is not retried".into(),
        );
        let back = status_to_error(crate::server::status(sent.clone()));
        assert_eq!(back, sent);
        let refusal = MinkError::Unavailable("table 1 bucket 0 is opening".into());
        assert_eq!(
            status_to_error(crate::server::status(refusal.clone())),
            refusal
        );
        let transport = status_to_error(tonic::Status::unavailable("connection reset"));
        assert!(
            matches!(transport, MinkError::Unavailable(_)),
            "{transport:?}"
        );
    }

    /// A table write (no writer id) hears "outcome unknown" for a call that failed after
    /// it was sent, and a node's answers, or a connection never made, as they are.
    #[test]
    fn a_table_write_tells_a_nodes_refusal_from_a_failed_call() {
        let node = |e: MinkError| writerless_write_error(crate::server::status(e));
        let bucket = TableBucket::new(1, None, 0);
        for answer in [
            MinkError::Unavailable(format!("{bucket} is opening")),
            MinkError::NotLeader {
                bucket,
                leader: Some("127.0.0.1:9120".into()),
            },
            MinkError::invalid("rows", "a null key"),
            MinkError::StorageFailure(format!("{bucket}: the outcome is unknown")),
        ] {
            assert_eq!(node(answer.clone()), answer);
        }
        for failed in [
            tonic::Status::unavailable("connection reset by peer"),
            tonic::Status::deadline_exceeded("timeout expired"),
            tonic::Status::cancelled("operation was canceled"),
            tonic::Status::internal("h2 protocol error: stream reset"),
            tonic::Status::resource_exhausted("h2 protocol error: enhance your calm"),
        ] {
            let e = writerless_write_error(failed);
            assert!(
                matches!(&e, MinkError::StorageFailure(m) if m.contains("outcome is unknown")),
                "{e:?}"
            );
        }
        let refused = tonic::Status::from_error(Box::new(tonic::ConnectError(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        )));
        let e = writerless_write_error(refused);
        assert!(matches!(e, MinkError::Unavailable(_)), "{e:?}");
    }

    #[test]
    fn a_writer_sequence_error_reads_back_from_the_status_details_even_when_forwarded() {
        let sent = MinkError::OutOfOrderSequence {
            bucket: TableBucket::new(1, None, 2),
            writer_id: 7,
            first_sequence: 12,
            expected: 10,
        };
        let status = crate::server::status(sent.clone());
        assert_eq!(status_to_error(status.clone()), sent);
        // A node forwarding the answer prefixes its own address to the message.
        let forwarded = tonic::Status::with_details(
            status.code(),
            format!("127.0.0.1:9120: {}", status.message()),
            status.details().to_vec().into(),
        );
        assert_eq!(status_to_error(forwarded), sent);
        // Without details (an older node): the text, as a batch_sequence refusal.
        let bare = status_to_error(tonic::Status::failed_precondition(sent.to_string()));
        assert!(is_out_of_order(&bare), "{bare:?}");
    }

    fn out_of_order(first_sequence: i64, expected: i64) -> MinkError {
        MinkError::OutOfOrderSequence {
            bucket: TableBucket::new(1, None, 0),
            writer_id: 3,
            first_sequence,
            expected,
        }
    }

    #[test]
    fn after_failure_follows_the_write_rules() {
        let clean = Facts::default();
        let recorded = Facts {
            maybe_recorded: true,
            ..Facts::default()
        };
        let unacknowledged = Facts {
            unacknowledged_before: true,
            ..Facts::default()
        };
        let overtaken = Facts {
            overtaken: true,
            maybe_recorded: true,
            unacknowledged_before: true,
        };
        let unavailable = MinkError::Unavailable("connection refused".into());
        let not_leader = MinkError::NotLeader {
            bucket: TableBucket::new(1, None, 0),
            leader: None,
        };
        let invalid = MinkError::invalid("batch", "a null key");
        let internal = MinkError::Internal("the KV flush failed".into());
        let cases = [
            // Overtaking an earlier batch in flight explains any out-of-order answer.
            (out_of_order(5, 4), overtaken, AfterFailure::AfterEarlier),
            // The window lost the writer, and no attempt may have been recorded.
            (out_of_order(5, 4), clean, AfterFailure::Restart),
            (out_of_order(5, 0), clean, AfterFailure::Restart),
            // An attempt may have been recorded: only a window behind acknowledged
            // sequences proves it was not.
            (out_of_order(5, 4), recorded, AfterFailure::Restart),
            (out_of_order(5, 0), recorded, AfterFailure::Retire),
            (out_of_order(5, 6), recorded, AfterFailure::Retire),
            // An earlier batch of the bucket unacknowledged: the refusal may be its doing.
            (out_of_order(5, 4), unacknowledged, AfterFailure::Retire),
            (
                MinkError::invalid("batch_sequence", "out-of-order sequence …"),
                recorded,
                AfterFailure::Retire,
            ),
            (
                unavailable.clone(),
                clean,
                AfterFailure::Retry {
                    maybe_recorded: true,
                },
            ),
            (
                not_leader,
                recorded,
                AfterFailure::Retry {
                    maybe_recorded: false,
                },
            ),
            (invalid.clone(), clean, AfterFailure::Free),
            (invalid, recorded, AfterFailure::Retire),
            (internal, clean, AfterFailure::Retire),
        ];
        for (e, facts, expected) in cases {
            assert_eq!(after_failure(&e, facts), expected, "{e:?} with {facts:?}");
        }
        assert!(!window_behind_acknowledged(&unavailable));
    }
}
