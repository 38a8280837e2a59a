//! s3stream: streams of records on object storage, written through one group-commit
//! WAL per node, compacted into per-stream segments.
//!
//! - A **stream** is an ordered sequence of records with offsets. An append carries
//!   `(record_count, timestamp, payload)` and gets `[base, base + record_count)`.
//! - A stream is **opened under an epoch**, recorded with its owner (a node's WAL
//!   writer, [`WalId`]) in the stream-metadata [`ObjectLog`]. Opening with an epoch that
//!   is not newer fails; appends under another epoch fail.
//! - Each node has **one WAL writer** ([`writer`]); acknowledgements come strictly in
//!   upload order; a failed upload fails everything after it.
//! - Taking over a stream whose owner did not close it **fences** the owner's WAL and
//!   **recovers** the stream's records from it ([`takeover`]). A clean
//!   [`Stream::close`] compacts everything first, so the next owner needs no fence.
//! - **Compaction** ([`compact`]) rewrites WAL data into per-stream segments and
//!   commits them; WAL objects no stream needs are deleted.
//! - **Reads** ([`read`]) come from memory, then segments, then WAL objects.
//!
//! docs/s3stream.md explains the protocol and why each step is safe.

mod budget;
mod compact;
pub mod meta;
mod read;
mod remembered;
mod scan;
mod shared_reads;
mod takeover;
mod writer;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot, watch};

pub use meta::{SegmentMeta, StreamCommand, StreamMeta, StreamsState, WalId};

use crate::accounting::{Purpose, Stores};
use crate::config::WalConfig;
use crate::error::{WalError, WalResult};
use crate::format::Record;
use crate::objectlog::{Appended, ObjectLog};
pub use scan::Scan;
pub use writer::Cork;
use writer::{Job, WriterShared};

/// Collection of dead WAL generations and orphan segments runs every this many
/// compaction ticks at first and after any round that had work...
const GC_EVERY_TICKS_MIN: u64 = 10;
/// ... and backs off, doubling while a pass finds nothing to delete, to this many
/// (an hour at the default 30 s interval): what it collects appears only after
/// restarts and rejected commits, and waits out a 10-minute grace anyway.
const GC_EVERY_TICKS_MAX: u64 = 120;
/// A compaction round that takes this long is logged.
const SLOW_ROUND: Duration = Duration::from_secs(2);
/// After a compaction round failed, the next waits at least this long (or the interval,
/// if shorter), however often uploads ask for one (`compaction_wal_objects_max`).
const FAILED_ROUND_PAUSE: Duration = Duration::from_secs(1);

/// The largest payload one append may carry: 256 MiB.
pub const PAYLOAD_BYTES_MAX: usize = 256 << 20;

/// Where a stream stands.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    Open,
    /// No more appends; being closed.
    Closing,
    Closed,
    /// The WAL failed or the stream was taken over: nothing more is acknowledged.
    Failed(WalError),
}

impl Status {
    /// Whether the stream takes appends and trims; the error says why not.
    fn check_open(&self, stream: &str) -> WalResult<()> {
        match self {
            Status::Open => Ok(()),
            Status::Failed(e) => Err(e.clone()),
            Status::Closing | Status::Closed => {
                Err(WalError::Closed(format!("stream {stream} is closed")))
            }
        }
    }
}

/// A record held in memory: payload present unless evicted, WAL position present
/// while not yet compacted.
#[derive(Debug, Clone)]
struct Held {
    record: Record,
    /// `None` once evicted from memory.
    payload: Option<Bytes>,
    /// The WAL object and payload range, while the record is not compacted.
    wal: Option<(u64, Range<u64>)>,
    /// The payload's length.
    len: u64,
}

struct StreamState {
    epoch: u64,
    status: Status,
    next_offset: u64,
    acked_end: u64,
    start_offset: u64,
    committed_end: u64,
    committed_wal_from: u64,
    segments: Vec<SegmentMeta>,
    /// Acknowledged records, oldest first: uncompacted ones (with a WAL position) and
    /// a tail of compacted ones kept for reads.
    held: VecDeque<Held>,
    held_bytes: u64,
}

pub(crate) struct StreamInner {
    name: String,
    state: Mutex<StreamState>,
    acked: watch::Sender<u64>,
    store: Arc<StoreInner>,
}

impl StreamInner {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the writer, in upload order, once the record's upload and every
    /// earlier one completed.
    fn on_durable(&self, record: &Record, seq: u64, payload_range: Range<u64>) {
        let mut state = self.lock();
        debug_assert_eq!(
            record.base, state.acked_end,
            "acks must arrive in offset order"
        );
        state.acked_end = record.end();
        let len = record.payload.len() as u64;
        state.held_bytes += len;
        state.held.push_back(Held {
            record: Record {
                payload: Bytes::new(),
                ..record.clone()
            },
            payload: Some(record.payload.clone()),
            wal: Some((seq, payload_range)),
            len,
        });
        let end = state.acked_end;
        self.store.held_bytes.fetch_add(len, Ordering::Relaxed);
        self.store.evict(&mut state);
        let uncompacted = self
            .store
            .uncompacted_bytes
            .fetch_add(len, Ordering::Relaxed)
            + len;
        drop(state);
        self.acked.send_replace(end);
        let objects_since = seq.saturating_sub(self.store.compacted_from.load(Ordering::Relaxed));
        if uncompacted >= self.store.config.segment_bytes_max
            || objects_since >= self.store.config.compaction_wal_objects_max
        {
            self.store.compact_soon.notify_one();
        }
    }
}

/// Reads an evicted record's payload back from WAL object `seq`, checked against the
/// CRC the record carries (a range read has no CRC of its own).
async fn fetch_evicted(
    store: &StoreInner,
    record: &Record,
    seq: u64,
    range: Range<u64>,
) -> WalResult<Bytes> {
    let payload = store
        .store
        .get_range(&writer::wal_path(&store.wal, seq), range)
        .await?;
    if crc32c::crc32c(&payload) != record.crc {
        return Err(WalError::Corrupt(format!(
            "WAL object {seq}: payload CRC mismatch at offset {}",
            record.base
        )));
    }
    Ok(payload)
}

pub(crate) struct StoreInner {
    /// The handle for WAL objects (purpose `wal`): uploads, fences, recovery, reads
    /// of uncompacted records.
    store: Arc<dyn ObjectStore>,
    /// The handle for segments (purpose `segment`).
    segment_store: Arc<dyn ObjectStore>,
    /// The handle for garbage collection (purpose `gc`).
    gc_store: Arc<dyn ObjectStore>,
    /// Every purpose's handle, for companions ([`Stream::object_store_for`]).
    stores: Stores,
    wal: WalId,
    config: WalConfig,
    meta: ObjectLog<StreamsState>,
    /// Open streams, by name (ordered, so that every pass over them is reproducible).
    streams: Mutex<BTreeMap<String, Arc<StreamInner>>>,
    /// One lock per stream name: opens and closes of one stream on this node run one
    /// at a time.
    open_locks: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    jobs: mpsc::UnboundedSender<Job>,
    budget: Arc<Semaphore>,
    writer: Arc<WriterShared>,
    held_bytes: AtomicU64,
    uncompacted_bytes: AtomicU64,
    compact_soon: Notify,
    compaction: tokio::sync::Mutex<()>,
    /// Own WAL objects below this were deleted.
    gc_floor: AtomicU64,
    /// The oldest unacknowledged WAL sequence when the last compaction round that
    /// finished began: what a takeover of an open stream reads starts at or above it
    /// (`compaction_wal_objects_max`).
    compacted_from: AtomicU64,
    /// Set when a compaction round had work since the collector last looked: the
    /// collector then does not back off.
    gc_nudged: std::sync::atomic::AtomicBool,
    /// Segment merges recorded by this writer.
    merges: AtomicU64,
    segment_indexes: Mutex<HashMap<String, Arc<Vec<crate::format::IndexEntry>>>>,
    /// WAL objects takeovers read, shared between the takeovers of one dead WAL.
    recovery_reads: shared_reads::SharedReads,
    /// WAL objects all takeovers of this node may hold at once, read or being read
    /// (`takeover::recovery_budget`): each takeover's reads in flight are bounded by
    /// bytes, and so are all of theirs together.
    recovery_budget: Arc<Semaphore>,
    /// Segment bytes all [`Scan`]s of this node hold fetched ahead (`scan::BUDGET_BYTES`).
    scan_budget: Arc<Semaphore>,
    /// What the failed generation this one replaced acknowledged (and what that one
    /// still kept of the generation before it, ...), for the takeovers of their
    /// streams, until they are done (`remembered`). At most `REMEMBERED_MAX`.
    remembered: Mutex<Vec<Arc<remembered::Remembered>>>,
    /// One fence of a WAL at a time on this node, by owner (`fence_lock`), with the
    /// last one's failure.
    fencing: Mutex<HashMap<String, FenceLock>>,
}

impl StoreInner {
    /// Drops payloads of the oldest held records of `state` while the node holds more
    /// than `tail_cache_bytes_max`. Compacted records leave memory entirely;
    /// uncompacted ones keep their WAL position.
    fn evict(&self, state: &mut StreamState) {
        let max = self.config.tail_cache_bytes_max;
        while self.held_bytes.load(Ordering::Relaxed) > max {
            let Some(victim) = state.held.iter_mut().find(|h| h.payload.is_some()) else {
                return;
            };
            let len = victim.payload.take().map_or(0, |p| p.len() as u64);
            state.held_bytes -= len;
            self.held_bytes.fetch_sub(len, Ordering::Relaxed);
            while state
                .held
                .front()
                .is_some_and(|h| h.payload.is_none() && h.wal.is_none())
            {
                state.held.pop_front();
            }
        }
    }

    /// Whether a compaction round has anything to do, judged without a request:
    /// records not yet in a segment, an open stream whose WAL position would move (so
    /// that an idle stream does not pin the WAL), WAL objects below the floor the log
    /// gives not yet deleted, or a stream-metadata snapshot due. An idle node skips
    /// the round (and its catch-up of the stream-metadata log) entirely. Work a
    /// compaction round takes on must be reported here.
    fn compaction_due(&self) -> bool {
        let oldest = self.writer.oldest_unacked.load(Ordering::SeqCst);
        let fanin = self.config.segment_merge_fanin as usize;
        let streams_due = self.lock_streams().values().any(|s| {
            let state = s.lock();
            state.status == Status::Open
                && (state.committed_wal_from < oldest
                    || state.held.iter().any(|h| h.wal.is_some())
                    // A merge left for later (refused, or over the round's budget).
                    || compact::merge_run(&state.segments, fanin, self.config.segment_bytes_max)
                        .is_some())
        });
        streams_due
            || self.meta.read(|s, _| s.wal_floor(&self.wal)) > self.gc_floor.load(Ordering::SeqCst)
            || self.meta.applied_index() >= self.meta.newest_snapshot() + 1_000
    }

    /// Warns, at most every 30 s, of the streams this WAL owns in the log whose
    /// `wal_from` trails the writer by more than four `compaction_wal_objects_max`:
    /// a takeover of them reads every WAL object since, and compaction should have
    /// moved them on. Names each with what this node knows of it (chaos seed 77: a
    /// generation's streams stopped moving for minutes without a failed round).
    fn report_lagging_streams(&self, reported: &mut Option<std::time::Instant>) {
        if reported.is_some_and(|at| at.elapsed() < Duration::from_secs(30)) {
            return;
        }
        let oldest = self.writer.oldest_unacked.load(Ordering::SeqCst);
        let bound = self.config.compaction_wal_objects_max.saturating_mul(4);
        let lagging: Vec<(String, u64)> = self.meta.read(|s, _| {
            s.owned_by(&self.wal)
                .filter(|(_, m)| oldest.saturating_sub(m.wal_from) > bound)
                .map(|(name, m)| (name.clone(), m.wal_from))
                .collect()
        });
        if lagging.is_empty() {
            return;
        }
        *reported = Some(std::time::Instant::now());
        let streams = self.lock_streams();
        for (name, wal_from) in lagging {
            let local = streams.get(&name).map(|s| {
                let state = s.lock();
                format!(
                    "{:?}, epoch {}, committed_wal_from {}, {} held ({} uncompacted)",
                    state.status,
                    state.epoch,
                    state.committed_wal_from,
                    state.held.len(),
                    state.held.iter().filter(|h| h.wal.is_some()).count()
                )
            });
            tracing::warn!(
                wal = %self.wal,
                stream = name,
                wal_from,
                oldest_unacked = oldest,
                local = local.as_deref().unwrap_or("not open here"),
                "a stream's WAL position trails the writer: a takeover would read every object since"
            );
        }
    }

    /// The lock the takeovers of `owner`'s streams on this node fence it under: they
    /// start together when a node dies, and each would otherwise list the WAL, write
    /// a fence object past the others' and propose it, for all but one to be refused
    /// and look again (seconds each on a loaded store). Under the lock, the first
    /// fences and the rest find its fence recorded. Locks no takeover holds are
    /// dropped.
    fn fence_lock(&self, owner: &WalId) -> FenceLock {
        let mut locks = self.fencing.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(owner.to_string()).or_default().clone()
    }

    fn lock_streams(&self) -> MutexGuard<'_, BTreeMap<String, Arc<StreamInner>>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `stream`'s records acknowledged by `owner`, when `owner` is a failed
    /// generation of this node that this one replaced (or that one did, ...) and its
    /// memory of the stream agrees with a view at `committed_end`: the first WAL
    /// sequence not acknowledged and the records below it (see `remembered`).
    fn remembered(
        &self,
        owner: &WalId,
        stream: &str,
        committed_end: u64,
    ) -> Option<(u64, remembered::StreamMemory)> {
        let kept = self
            .lock_remembered()
            .iter()
            .find(|k| &k.wal == owner)
            .cloned()?;
        let memory = kept.for_takeover(owner, stream, committed_end)?;
        Some((kept.unknown_from, memory))
    }

    fn lock_remembered(&self) -> MutexGuard<'_, Vec<Arc<remembered::Remembered>>> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the remembered records of `stream` (taken over or adopted here).
    fn forget_remembered(&self, stream: &str) {
        let mut kept = self.lock_remembered();
        for k in kept.iter() {
            k.forget(stream);
        }
        kept.retain(|k| !k.spent());
    }

    /// Lets go of the failed generations' records of streams another node took over,
    /// and of a generation's records once every stream of it was taken over here or
    /// their time is up. Run by every compaction tick, so that they are not kept for
    /// streams that never reopen here (one metadata read per remembered stream).
    fn drop_spent_remembered(&self) {
        let kept: Vec<_> = self.lock_remembered().clone();
        for k in &kept {
            k.retain(|stream| {
                self.meta.read(|s, _| {
                    s.streams
                        .get(stream)
                        .is_some_and(|m| m.owner.as_ref() == Some(&k.wal))
                })
            });
        }
        self.lock_remembered().retain(|k| {
            let spent = k.spent();
            if spent {
                tracing::debug!(wal = %k.wal, "forgetting the failed WAL generation's records");
            }
            !spent
        });
    }

    /// The lock that serializes opens and closes of `name` on this node.
    fn open_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.open_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// Forgets `stream` locally, if it is still the one installed under `name`. Only
    /// for streams the metadata says this writer no longer owns: a stream this writer
    /// owns stays installed, so that its records are never orphaned in the WAL.
    fn remove_stream(&self, name: &str, stream: &Arc<StreamInner>) {
        let mut streams = self.lock_streams();
        if streams.get(name).is_some_and(|s| Arc::ptr_eq(s, stream)) {
            streams.remove(name);
        }
    }
}

/// A node's s3stream service: its WAL writer and the streams it has open.
#[derive(Clone)]
pub struct StreamStore {
    inner: Arc<StoreInner>,
}

/// The lock the takeovers of one owner's streams fence it under, holding when the
/// last fence under it failed and why: the takeovers queued behind a fence that
/// failed (a store outage) fail at once too, rather than each retrying in turn.
type FenceLock = Arc<tokio::sync::Mutex<Option<(Instant, WalError)>>>;

/// Where the generations of `node` are claimed (`walgen/{node}/{generation:020}`).
fn claims_dir(node: &str) -> Path {
    Path::from(format!("walgen/{node}"))
}

/// Claims the next WAL generation of `node` by conditional create. The claim holds a
/// random token, so a create that fails ambiguously is resolved by reading it back.
async fn claim_generation(store: &Arc<dyn ObjectStore>, node: &str) -> WalResult<u64> {
    let dir = claims_dir(node);
    let mut highest = 0u64;
    let mut listing = store.list(Some(&dir));
    while let Some(meta) = listing.try_next().await? {
        if let Some(g) = meta.location.filename().and_then(|f| f.parse::<u64>().ok()) {
            highest = highest.max(g);
        }
    }
    let token = uuid::Uuid::new_v4().to_string();
    let mut generation = highest + 1;
    let mut errors = 0;
    while errors < 8 {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let path = dir.clone().join(format!("{generation:020}"));
        match store
            .put_opts(&path, PutPayload::from(token.clone().into_bytes()), opts)
            .await
        {
            Ok(_) => return Ok(generation),
            Err(object_store::Error::AlreadyExists { .. }) => generation += 1,
            Err(e) => {
                errors += 1;
                tracing::debug!("claiming WAL generation {generation} of {node}: {e}");
                match store.get(&path).await {
                    Ok(got) => {
                        if got.bytes().await?.as_ref() == token.as_bytes() {
                            return Ok(generation);
                        }
                        generation += 1;
                    }
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => tracing::debug!("reading back the claim: {e}"),
                }
            }
        }
    }
    Err(WalError::Storage(format!(
        "cannot claim a WAL generation for node {node}"
    )))
}

impl StreamStore {
    /// Starts node `node`'s s3stream service on `stores` (a bare store, or one handle
    /// per purpose so that requests are counted): claims a new WAL generation, opens
    /// the stream-metadata log and starts the WAL writer.
    pub async fn open(stores: impl Into<Stores>, node: &str, config: WalConfig) -> WalResult<Self> {
        Self::open_inner(stores.into(), node, config, None).await
    }

    /// [`StreamStore::open`] for a node replacing `failed`, its failed generation, in
    /// the same process: the stream metadata is read on from `failed`'s view instead
    /// of from the latest snapshot, so that the replacement costs the entries since
    /// (a snapshot interval of them took seconds on a slow store), and the records
    /// `failed` acknowledged are taken over from memory, not read back from its WAL
    /// (`remembered`: only its uploads of unknown outcome are read).
    pub async fn open_after(
        failed: &StreamStore,
        stores: impl Into<Stores>,
        node: &str,
        config: WalConfig,
    ) -> WalResult<Self> {
        Self::open_inner(stores.into(), node, config, Some(&failed.inner)).await
    }

    async fn open_inner(
        stores: Stores,
        node: &str,
        config: WalConfig,
        earlier: Option<&StoreInner>,
    ) -> WalResult<Self> {
        let store = stores.get(Purpose::Wal);
        // What the failed generation acknowledged (the snapshot is exact whenever it
        // is taken: `remembered`), and what it still kept of the ones before it.
        let remembered: Vec<_> = earlier
            .map(|e| {
                let mut kept = vec![Arc::new(remembered::Remembered::of(e))];
                kept.extend(e.lock_remembered().iter().filter(|k| !k.spent()).cloned());
                kept.truncate(remembered::REMEMBERED_MAX);
                kept
            })
            .unwrap_or_default();
        config.validate().map_err(WalError::Config)?;
        if node.is_empty() || node.contains('/') {
            return Err(WalError::Config(format!(
                "node id {node:?} must be non-empty without '/'"
            )));
        }
        let started = tokio::time::Instant::now();
        let generation = claim_generation(&store, node).await?;
        let claimed = started.elapsed();
        let wal = WalId {
            node: node.to_string(),
            generation,
        };
        let meta = match earlier {
            Some(earlier) => {
                ObjectLog::open_from(stores.get(Purpose::Meta), "streams", &earlier.meta).await?
            }
            None => {
                ObjectLog::open(
                    stores.get(Purpose::Meta),
                    "streams",
                    StreamsState::default(),
                )
                .await?
            }
        };
        let metadata_read = started.elapsed() - claimed;
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Arc::new(WriterShared::new(watch::channel(None).0));
        let inner = Arc::new(StoreInner {
            store: store.clone(),
            segment_store: stores.get(Purpose::Segment),
            gc_store: stores.get(Purpose::Gc),
            stores: stores.clone(),
            wal: wal.clone(),
            budget: Arc::new(Semaphore::new(
                config.pending_bytes_max.min(u32::MAX as u64) as usize,
            )),
            config: config.clone(),
            meta,
            streams: Mutex::new(BTreeMap::new()),
            open_locks: Mutex::new(BTreeMap::new()),
            jobs: tx,
            writer: writer.clone(),
            held_bytes: AtomicU64::new(0),
            uncompacted_bytes: AtomicU64::new(0),
            compact_soon: Notify::new(),
            compaction: tokio::sync::Mutex::new(()),
            gc_floor: AtomicU64::new(1),
            compacted_from: AtomicU64::new(1),
            gc_nudged: std::sync::atomic::AtomicBool::new(false),
            merges: AtomicU64::new(0),
            segment_indexes: Mutex::new(HashMap::new()),
            recovery_reads: shared_reads::SharedReads::default(),
            fencing: Mutex::new(HashMap::new()),
            recovery_budget: Arc::new(Semaphore::new(takeover::recovery_budget(
                config.group_bytes_max,
            ))),
            scan_budget: Arc::new(Semaphore::new(scan::budget_permits())),
            remembered: Mutex::new(remembered),
        });
        tokio::spawn(writer::run_writer(store, wal, config, writer, rx));
        tracing::info!(
            wal = %inner.wal,
            claim_ms = claimed.as_millis() as u64,
            streams_log_ms = metadata_read.as_millis() as u64,
            streams_log_index = inner.meta.applied_index(),
            "s3stream WAL writer started"
        );
        Ok(Self { inner })
    }

    /// Lets go of what this service holds once it failed and its replacement serves
    /// (the node calls it after the swap): its streams, each of which holds the
    /// service (so that the two would keep each other alive after the node dropped
    /// both), the records it remembered of earlier generations, and the WAL objects
    /// its takeovers read. What the replacement took from it (`open_after`) it keeps
    /// on its own. A service that has not failed is left as it is.
    pub fn release(&self) {
        if self.failure().is_none() {
            return;
        }
        let streams = std::mem::take(&mut *self.inner.lock_streams());
        for stream in streams.values() {
            let mut state = stream.lock();
            if !matches!(state.status, Status::Failed(_) | Status::Closed) {
                state.status = Status::Failed(WalError::Fenced(format!(
                    "WAL {} was replaced",
                    self.inner.wal
                )));
            }
        }
        self.inner.lock_remembered().clear();
        self.inner.recovery_reads.clear();
        tracing::debug!(wal = %self.inner.wal, streams = streams.len(), "released a failed WAL generation");
    }

    /// A hold on the sealing of the WAL group (see [`Cork`]): take it before enqueueing
    /// the parts of one write over several streams, so that they share one upload.
    pub fn cork(&self) -> Cork {
        Cork::new(self.inner.writer.clone())
    }

    /// This incarnation's WAL writer.
    pub fn wal_id(&self) -> &WalId {
        &self.inner.wal
    }

    /// Whether a newer generation of `wal`'s node has been claimed (one LIST of the
    /// node's claims after `wal`'s own): the node restarted, or replaced that WAL.
    /// Such a generation closes nothing. The stream-metadata log says so too, but only
    /// once the newer generation names itself in a command (its first open), which a
    /// restarted node whose buckets all moved away may not make for a long time.
    pub async fn superseded_by_claim(&self, wal: &WalId) -> WalResult<bool> {
        let dir = claims_dir(&wal.node);
        let own = dir.clone().join(format!("{:020}", wal.generation));
        let mut newer = self.inner.store.list_with_offset(Some(&dir), &own);
        while let Some(meta) = newer.try_next().await? {
            let generation = meta.location.filename().and_then(|f| f.parse::<u64>().ok());
            if generation.is_some_and(|g| g > wal.generation) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether `name` is open here with a close that failed before it settled: the
    /// compactor closes it again (see `docs/s3stream.md`), nobody else need.
    pub fn is_closing(&self, name: &str) -> bool {
        self.inner
            .lock_streams()
            .get(name)
            .is_some_and(|s| s.lock().status == Status::Closing)
    }

    /// Why the WAL writer stopped, if it did. A failed writer acknowledges nothing
    /// more; open a new `StreamStore` (a new generation) and reopen the streams under
    /// newer epochs.
    pub fn failure(&self) -> Option<WalError> {
        self.inner.writer.failure()
    }

    /// Resolves once the WAL writer has failed or been fenced, with why. The node
    /// then replaces this service with a new generation.
    pub async fn failed(&self) -> WalError {
        let mut rx = self.inner.writer.failed.subscribe();
        loop {
            if let Some(e) = rx.borrow_and_update().clone() {
                return e;
            }
            if rx.changed().await.is_err() {
                return WalError::Storage("the WAL writer stopped".into());
            }
        }
    }

    /// The object store this service writes to, as the handle for `purpose` (its
    /// requests are counted under that purpose when the stores count).
    pub fn object_store_for(&self, purpose: Purpose) -> Arc<dyn ObjectStore> {
        self.inner.stores.get(purpose)
    }

    /// Every purpose's handle of the store (and the node's request counters).
    pub fn stores(&self) -> &Stores {
        &self.inner.stores
    }

    /// The stream-metadata log (read-only use: inspection, tests, tooling).
    pub fn metadata(&self) -> &ObjectLog<StreamsState> {
        &self.inner.meta
    }

    /// Opens `name` under `epoch` on this node: creates it, takes it over from its
    /// previous owner (fencing that owner's WAL and recovering from it), or reopens
    /// it after a clean close. `epoch` must be newer than any epoch the stream was
    /// opened under.
    pub async fn open_stream(&self, name: &str, epoch: u64) -> WalResult<Stream> {
        takeover::open_stream(&self.inner, name, epoch).await
    }

    /// Compacts every open stream now. Returns the number of segments written.
    pub async fn compact(&self) -> WalResult<usize> {
        compact::compact_all(&self.inner).await
    }

    /// How many segment merges this writer has recorded.
    pub fn segment_merges(&self) -> u64 {
        self.inner.merges.load(Ordering::Relaxed)
    }

    /// Deletes WAL objects of dead generations (see `docs/s3stream.md`). Returns the
    /// number of objects deleted.
    pub async fn gc_dead_wals(&self) -> WalResult<usize> {
        compact::gc_dead_wals(&self.inner).await
    }

    /// Deletes segment objects of this node's streams that no metadata names (left
    /// by rejected commits) and that are older than `dead_wal_grace_ms`.
    pub async fn gc_orphan_segments(&self) -> WalResult<usize> {
        compact::gc_orphan_segments(&self.inner).await
    }

    /// Runs compaction every `compaction_interval_ms`, or sooner when the node holds
    /// `segment_bytes_max` of uncompacted data (or has written
    /// `compaction_wal_objects_max` WAL objects since the last round), until `shutdown`
    /// resolves; a tick with nothing to compact makes no request. Each tick first
    /// closes again the streams whose close failed before it was settled. Garbage
    /// collection runs beside it on a task of its own (`run_gc`).
    pub async fn run_compactor(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let interval = Duration::from_millis(self.inner.config.compaction_interval_ms.max(1));
        let gc = {
            let this = self.clone();
            tokio::spawn(async move { this.run_gc(interval).await })
        };
        // The collector stops with the compactor, however it returns.
        let _gc = AbortOnDrop(gc);
        let mut failed = false;
        let mut lag_reported: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
                _ = self.inner.compact_soon.notified() => {}
            }
            if std::mem::take(&mut failed) {
                // A round that failed (the store down, say) is not tried again at
                // every upload that asks for one.
                tokio::select! {
                    biased;
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(interval.min(FAILED_ROUND_PAUSE)) => {}
                }
            }
            if self.failure().is_some() {
                return;
            }
            self.inner.drop_spent_remembered();
            compact::settle_closes(&self.inner).await;
            if self.inner.compaction_due() {
                self.inner.gc_nudged.store(true, Ordering::Relaxed);
                let started = std::time::Instant::now();
                match self.compact().await {
                    Ok(segments) => {
                        let took = started.elapsed();
                        metrics::histogram!("mink_wal_compaction_seconds")
                            .record(took.as_secs_f64());
                        if took >= SLOW_ROUND {
                            // Streams' WAL positions lag by about this long of uploads,
                            // and a takeover reads them all (docs/reliability.md).
                            tracing::info!(wal = %self.inner.wal, segments, took_ms = took.as_millis() as u64, "a slow compaction round");
                        }
                    }
                    Err(e) => {
                        failed = true;
                        tracing::warn!(wal = %self.inner.wal, "compaction failed: {e}");
                    }
                }
            }
            self.inner.report_lagging_streams(&mut lag_reported);
        }
    }

    /// Collection of dead WAL generations and orphan segments, on a task of its own
    /// beside the compactor: every tenth compaction interval, backing off to every
    /// 120th while it finds nothing and nothing is written. A pass over a dead
    /// generation of thousands of objects takes minutes on a slow store; run inside the
    /// compaction loop, it held every round back meanwhile (chaos seed 77: 2.7 minutes
    /// without a round, after which a takeover read 5,305 objects).
    async fn run_gc(&self, interval: Duration) {
        let mut every = GC_EVERY_TICKS_MIN;
        loop {
            tokio::time::sleep(interval.saturating_mul(every as u32)).await;
            if self.failure().is_some() {
                return;
            }
            let written = self.inner.gc_nudged.swap(false, Ordering::Relaxed);
            let mut deleted = 0;
            match self.gc_dead_wals().await {
                Ok(n) => deleted += n,
                Err(e) => {
                    tracing::warn!(wal = %self.inner.wal, "dead WAL collection failed: {e}")
                }
            }
            match self.gc_orphan_segments().await {
                Ok(n) => deleted += n,
                Err(e) => {
                    tracing::warn!(wal = %self.inner.wal, "orphan segment collection failed: {e}")
                }
            }
            every = if deleted == 0 && !written {
                (every * 2).min(GC_EVERY_TICKS_MAX)
            } else {
                GC_EVERY_TICKS_MIN
            };
        }
    }

    /// Closes every open stream cleanly (for a graceful shutdown).
    pub async fn close_all(&self) -> WalResult<()> {
        let streams: Vec<Arc<StreamInner>> = self.inner.lock_streams().values().cloned().collect();
        for stream in streams {
            Stream { inner: stream }.close().await?;
        }
        Ok(())
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A reservation of WAL backlog bytes, taken before an append (back-pressure).
pub struct Reservation {
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// An append that has an offset range and is on its way to object storage.
pub struct PendingAppend {
    pub offsets: Range<u64>,
    done: oneshot::Receiver<WalResult<()>>,
}

impl PendingAppend {
    /// Resolves once the append is durable (and every earlier one of the node).
    pub async fn durable(self) -> WalResult<Range<u64>> {
        match self.done.await {
            Ok(Ok(())) => Ok(self.offsets),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(WalError::Storage("the WAL writer stopped".into())),
        }
    }
}

/// One open stream. Cheap to clone.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl Stream {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The object store the stream lives on, as the handle for `purpose` (for
    /// companions such as checkpoints).
    pub fn object_store_for(&self, purpose: Purpose) -> Arc<dyn ObjectStore> {
        self.inner.store.stores.get(purpose)
    }

    /// The epoch the stream is open under.
    pub fn epoch(&self) -> u64 {
        self.inner.lock().epoch
    }

    /// The offset the next append gets.
    pub fn next_offset(&self) -> u64 {
        self.inner.lock().next_offset
    }

    /// The end of acknowledged (durable) records.
    pub fn durable_end(&self) -> u64 {
        self.inner.lock().acked_end
    }

    /// The first readable offset.
    pub fn start_offset(&self) -> u64 {
        self.inner.lock().start_offset
    }

    /// The bytes the stream keeps on object storage: its segments' (a partly trimmed
    /// first segment whole, as it is stored) and its acknowledged records not yet
    /// compacted (their payloads, in the WAL objects). What the console and
    /// `bucket_stats` report as a bucket's size.
    pub fn stored_bytes(&self) -> u64 {
        let state = self.inner.lock();
        let segments: u64 = state.segments.iter().map(|s| s.bytes).sum();
        let uncompacted: u64 = state
            .held
            .iter()
            .filter(|h| h.wal.is_some())
            .map(|h| h.len)
            .sum();
        segments + uncompacted
    }

    /// The end of what is compacted into segments and committed: a trim goes no
    /// further.
    pub fn committed_end(&self) -> u64 {
        self.inner.lock().committed_end
    }

    /// A receiver of the durable end, updated after every acknowledgement.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.acked.subscribe()
    }

    /// Reserves `bytes` of WAL backlog, waiting while the node's backlog is full.
    pub async fn reserve(&self, bytes: usize) -> WalResult<Reservation> {
        if bytes > PAYLOAD_BYTES_MAX {
            return Err(WalError::TooLarge(format!(
                "a payload of {bytes} bytes exceeds the limit of {PAYLOAD_BYTES_MAX}"
            )));
        }
        let max = self
            .inner
            .store
            .config
            .pending_bytes_max
            .min(u32::MAX as u64) as usize;
        let permits = bytes.clamp(1, max) as u32;
        let permit = self
            .inner
            .store
            .budget
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| WalError::Storage("the WAL writer stopped".into()))?;
        Ok(Reservation { permit })
    }

    /// Enqueues an append and returns its offsets at once; [`PendingAppend::durable`]
    /// resolves when it is durable. Offsets follow the order of calls.
    pub fn append(
        &self,
        reservation: Reservation,
        epoch: u64,
        record_count: u32,
        timestamp_ms: i64,
        payload: Bytes,
    ) -> WalResult<PendingAppend> {
        // Off the writer's task and outside the stream's lock.
        let payload_crc = crc32c::crc32c(&payload);
        self.append_with_crc(
            reservation,
            epoch,
            record_count,
            timestamp_ms,
            payload,
            payload_crc,
        )
    }

    /// [`Stream::append`] of a payload whose CRC32C the caller already knows (a log
    /// batch carries one over all but its first bytes, so the whole CRC is a combine,
    /// not a second pass over the rows). A wrong CRC makes the WAL object unreadable:
    /// debug builds check it.
    pub fn append_with_crc(
        &self,
        reservation: Reservation,
        epoch: u64,
        record_count: u32,
        timestamp_ms: i64,
        payload: Bytes,
        payload_crc: u32,
    ) -> WalResult<PendingAppend> {
        debug_assert_eq!(
            crc32c::crc32c(&payload),
            payload_crc,
            "append_with_crc was given a wrong CRC"
        );
        if record_count == 0 {
            return Err(WalError::Config(
                "an append needs at least one record".into(),
            ));
        }
        if let Some(e) = self.inner.store.writer.failure() {
            return Err(e);
        }
        let mut state = self.inner.lock();
        state.status.check_open(&self.inner.name)?;
        if epoch != state.epoch {
            return Err(WalError::Fenced(format!(
                "stream {} is open under epoch {}, not {epoch}",
                self.inner.name, state.epoch
            )));
        }
        let base = state.next_offset;
        let record = Record {
            base,
            count: record_count,
            timestamp_ms,
            payload,
            crc: payload_crc,
        };
        let (done, rx) = oneshot::channel();
        let job = Job {
            stream: self.inner.clone(),
            epoch,
            record,
            done,
            enqueued: Instant::now(),
            span: tracing::Span::current(),
            _permit: reservation.permit,
        };
        self.inner
            .store
            .jobs
            .send(job)
            .map_err(|_| WalError::Storage("the WAL writer stopped".into()))?;
        state.next_offset = base + record_count as u64;
        Ok(PendingAppend {
            offsets: base..state.next_offset,
            done: rx,
        })
    }

    /// Reserve, append and wait until durable.
    pub async fn append_durable(
        &self,
        epoch: u64,
        record_count: u32,
        timestamp_ms: i64,
        payload: Bytes,
    ) -> WalResult<Range<u64>> {
        let reservation = self.reserve(payload.len()).await?;
        self.append(reservation, epoch, record_count, timestamp_ms, payload)?
            .durable()
            .await
    }

    /// Waits until every append enqueued so far is durable (or failed).
    pub async fn flush(&self) -> WalResult<()> {
        let target = self.next_offset();
        let mut rx = self.subscribe();
        loop {
            if *rx.borrow_and_update() >= target {
                return Ok(());
            }
            if let Some(e) = self.inner.store.writer.failure() {
                return Err(e);
            }
            let mut failed = self.inner.store.writer.failed.subscribe();
            tokio::select! {
                biased;
                changed = rx.changed() => if changed.is_err() { return Err(WalError::Storage("stream dropped".into())); },
                _ = failed.changed() => {}
            }
        }
    }

    /// Reads whole appended units from `offset` (the first may begin before it) up to
    /// the durable end, about `max_bytes` of payload (at least one unit).
    pub async fn read(&self, offset: u64, max_bytes: usize) -> WalResult<Vec<Record>> {
        read::read(&self.inner, offset, max_bytes).await
    }

    /// A read of every unit from `offset` (the first may begin before it) up to `end`,
    /// in order, that fetches the segments ahead of it together (each in one GET,
    /// within a per-scan and a per-node byte budget): for recoveries that read a whole
    /// log back. It returns what plain [`Stream::read`]s would.
    pub fn scan(&self, offset: u64, end: u64, max_bytes: usize) -> Scan {
        Scan::new(self.inner.clone(), offset, end, max_bytes)
    }

    /// The first offset whose append timestamp is at or after `timestamp_ms`, or
    /// `None` when every durable record is older.
    pub async fn offset_for_timestamp(&self, timestamp_ms: i64) -> WalResult<Option<u64>> {
        read::offset_for_timestamp(&self.inner, timestamp_ms).await
    }

    /// Moves the start offset to `start` (at most the compacted end); segments wholly
    /// below it are deleted. Returns the new start offset.
    pub async fn trim(&self, start: u64) -> WalResult<u64> {
        compact::trim(&self.inner, start).await
    }

    /// Closes the stream cleanly: waits for pending appends, compacts everything into
    /// segments and records the close, so the next owner needs no fence.
    pub async fn close(self) -> WalResult<()> {
        compact::close(&self.inner, None).await
    }

    /// [`Stream::close`] by the holder of `epoch`: refused (`Fenced`) once the stream
    /// was reopened in place under a newer epoch (on this node, sharing the stream),
    /// decided under the stream's open lock, so a late handover of an old tablet never
    /// closes the stream under the tablet that replaced it.
    pub async fn close_under(self, epoch: u64) -> WalResult<()> {
        compact::close(&self.inner, Some(epoch)).await
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.inner.name)
    }
}

/// Appends to the stream-metadata log, mapping a rejection to an error.
async fn propose(store: &StoreInner, command: &StreamCommand) -> WalResult<Result<u64, String>> {
    Ok(match store.meta.append(command).await? {
        Appended::At(index) => Ok(index),
        Appended::Rejected(why) => Err(why),
    })
}
