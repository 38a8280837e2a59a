//! The node's one WAL writer: group commit, pipelined uploads, acks in upload order.
//!
//! Appends from every stream of the node arrive on one channel. They collect in the
//! open group; a group becomes one WAL object, created with `PutMode::Create` at the
//! next sequence number. A group is sealed once it is `linger_ms` old (at once with
//! the default 0) or reaches `group_bytes_max`, whenever fewer than
//! `inflight_uploads_max` uploads run; while all upload slots are busy it keeps
//! growing up to `group_bytes_max` (appends then wait in the queue, and appenders are
//! pushed back by `pending_bytes_max`), so the group that follows a finished upload
//! carries what arrived meanwhile, and no WAL object is larger than `group_bytes_max`
//! plus one append. Completions are taken strictly in
//! sequence order (`FuturesOrdered`), so an append is acknowledged only once its upload
//! and every earlier one completed.
//!
//! A caller about to enqueue several appends that belong together (a table write
//! spanning buckets) holds a [`Cork`] while it does: a group is not sealed while a
//! cork is held, for at most `wal.cork_max_ms` after the group's first append, so the
//! parts ride one upload instead of queueing behind each other's.
//!
//! An upload that fails or times out is retried, with backoff, for up to
//! `upload_retry_budget_ms`; later groups wait behind it. A conditional create that
//! answers `AlreadyExists` is resolved by reading the object back (the ambiguity rule
//! of DESIGN.md): our own bytes mean an earlier attempt landed (object_store retries
//! a create whose response was lost, and that retry sees our own object); anything
//! else is a fence. The first upload that cannot be completed fails its group, every
//! later group and every later append: the writer is then dead and the node must
//! reopen its streams under a new generation.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, oneshot, watch};

use super::StreamInner;
use super::meta::WalId;
use crate::config::WalConfig;
use crate::error::{WalError, WalResult};
use crate::format::{Record, WalObjectBuilder};

/// Scheduler yields after an acknowledgement during which new appends are gathered
/// into the open group (see `run_writer`). A few microseconds, no timer.
const ACK_GATHER_YIELDS: usize = 4;

/// The object key of WAL sequence `seq` of `wal`.
pub fn wal_path(wal: &WalId, seq: u64) -> Path {
    Path::from(format!("wal/{}/{:020}/{seq:020}", wal.node, wal.generation))
}

/// The key prefix of `wal`'s objects.
pub fn wal_dir(wal: &WalId) -> Path {
    Path::from(format!("wal/{}/{:020}", wal.node, wal.generation))
}

/// One append on its way to a WAL object.
pub(crate) struct Job {
    pub stream: Arc<StreamInner>,
    pub epoch: u64,
    /// The record, with its payload's CRC32C computed by the appender (off the
    /// writer's task).
    pub record: Record,
    pub done: oneshot::Sender<WalResult<()>>,
    pub enqueued: Instant,
    pub _permit: OwnedSemaphorePermit,
}

/// Shared view of the writer's progress.
pub(crate) struct WriterShared {
    /// The sequence number the next sealed group gets.
    pub next_seq: AtomicU64,
    /// The lowest sequence whose upload has not been acknowledged (or `next_seq`).
    pub oldest_unacked: AtomicU64,
    /// Set once, when the writer fails or is fenced.
    pub failed: watch::Sender<Option<WalError>>,
    /// Corks held (see [`Cork`]).
    pub corks: AtomicUsize,
    /// Signalled when the last cork is released.
    pub uncorked: Notify,
    /// Why the writer must stop although no upload failed (the stream metadata says
    /// its WAL is fenced or replaced), set by [`WriterShared::retire`].
    retired: std::sync::Mutex<Option<WalError>>,
    retire: Notify,
}

impl WriterShared {
    pub fn new(failed: watch::Sender<Option<WalError>>) -> Self {
        Self {
            next_seq: AtomicU64::new(1),
            oldest_unacked: AtomicU64::new(1),
            failed,
            corks: AtomicUsize::new(0),
            uncorked: Notify::new(),
            retired: std::sync::Mutex::new(None),
            retire: Notify::new(),
        }
    }

    /// Makes the writer fail as a failed upload would (every append not acknowledged
    /// yet fails, and every later one), for `why`: the stream metadata says this WAL is
    /// fenced or superseded, so nothing it writes from here on would count. An idle
    /// writer would otherwise never learn it (it learns at its next upload).
    pub fn retire(&self, why: WalError) {
        self.retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why.clone());
        // Seen at once by appenders and by the node, which replaces the WAL; the
        // writer's task then fails what it holds and acknowledges nothing more.
        self.failed.send_if_modified(|failed| {
            let unset = failed.is_none();
            if unset {
                *failed = Some(why);
            }
            unset
        });
        self.retire.notify_one();
    }

    pub fn failure(&self) -> Option<WalError> {
        self.failed.borrow().clone()
    }

    fn corked(&self) -> bool {
        self.corks.load(Ordering::SeqCst) > 0
    }
}

/// Holds back the sealing of the open WAL group while held (at most `wal.cork_max_ms`),
/// so that appends enqueued meanwhile share one upload. Each clone is a hold of its
/// own; the group may be sealed once every clone is dropped. Take one before
/// enqueueing the parts of one write and drop each part's clone as soon as that part
/// is enqueued (or will not be), never while waiting for durability.
pub struct Cork {
    shared: Arc<WriterShared>,
}

impl Cork {
    pub(crate) fn new(shared: Arc<WriterShared>) -> Self {
        shared.corks.fetch_add(1, Ordering::SeqCst);
        Self { shared }
    }
}

impl Clone for Cork {
    fn clone(&self) -> Self {
        Self::new(self.shared.clone())
    }
}

impl Drop for Cork {
    fn drop(&mut self) {
        if self.shared.corks.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.uncorked.notify_one();
        }
    }
}

impl std::fmt::Debug for Cork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cork")
    }
}

struct Sealed {
    seq: u64,
    jobs: Vec<(Job, std::ops::Range<u64>)>,
    bytes: usize,
}

struct Group {
    builder: WalObjectBuilder,
    jobs: Vec<(Job, std::ops::Range<u64>)>,
    opened: Instant,
}

impl Group {
    fn add(&mut self, job: Job) {
        let range = self.builder.push(&job.stream.name, job.epoch, &job.record);
        if self.jobs.is_empty() {
            self.opened = Instant::now();
        }
        self.jobs.push((job, range));
    }

    fn new() -> Self {
        Self {
            builder: WalObjectBuilder::default(),
            jobs: Vec::new(),
            opened: Instant::now(),
        }
    }
}

/// Why an upload could not be completed.
enum UploadError {
    /// The slot holds a fence (someone else's object).
    Fenced,
    /// Errors for longer than the retry budget.
    Failed(object_store::Error),
    /// The upload may have landed, but the writer was retired meanwhile
    /// ([`WriterShared::retire`]): it is not acknowledged.
    Retired,
    /// It completed out of sequence (a broken writer): not acknowledged, and the writer
    /// stops.
    Hole { expected: u64 },
}

/// The pause before retry `attempt` (from 1) of an upload.
fn upload_backoff(attempt: u32) -> Duration {
    Duration::from_millis((50u64 << attempt.saturating_sub(1).min(6)).min(2_000))
}

/// Creates WAL object `path` with `bytes`, retrying errors within `budget`, and
/// resolving `AlreadyExists` by reading the object back.
async fn upload(
    store: Arc<dyn ObjectStore>,
    path: Path,
    bytes: PutPayload,
    budget: Duration,
) -> Result<(), UploadError> {
    let started = tokio::time::Instant::now();
    let mut attempt = 0u32;
    loop {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let error = match store.put_opts(&path, bytes.clone(), opts).await {
            Ok(_) => return Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                match read_back(&store, &path, &bytes).await {
                    Ok(true) => {
                        tracing::debug!(%path, "an earlier attempt of this upload had landed");
                        return Ok(());
                    }
                    Ok(false) => return Err(UploadError::Fenced),
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        attempt += 1;
        let pause = upload_backoff(attempt);
        if started.elapsed() + pause > budget {
            return Err(UploadError::Failed(error));
        }
        metrics::counter!("mink_wal_upload_retries_total").increment(1);
        tracing::debug!(%path, attempt, "WAL upload failed, retrying: {error}");
        tokio::time::sleep(pause).await;
    }
}

/// Whether the object at `path` holds exactly `bytes`.
async fn read_back(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    bytes: &PutPayload,
) -> object_store::Result<bool> {
    let got = store.get(path).await?.bytes().await?;
    if got.len() != bytes.content_length() {
        return Ok(false);
    }
    let mut at = 0;
    for chunk in bytes.iter() {
        if got[at..at + chunk.len()] != chunk[..] {
            return Ok(false);
        }
        at += chunk.len();
    }
    Ok(true)
}

#[expect(
    clippy::too_many_lines,
    reason = "to split into a pure decision and its action (issue 28, decide/act on the hot paths)"
)]
pub(crate) async fn run_writer(
    store: Arc<dyn ObjectStore>,
    wal: WalId,
    config: WalConfig,
    shared: Arc<WriterShared>,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    let linger = Duration::from_millis(config.linger_ms);
    let cork_max = Duration::from_millis(config.cork_max_ms);
    let inflight_max = config.inflight_uploads_max.max(1) as usize;
    let mut group = Group::new();
    let mut inflight = FuturesOrdered::new();
    let mut inflight_seqs: VecDeque<u64> = VecDeque::new();
    let mut inflight_jobs: VecDeque<Sealed> = VecDeque::new();
    let mut open = true;
    // The sequence the next acknowledged upload must have. Acknowledged WAL objects are
    // a contiguous run from the first sequence: a takeover fences at the first free
    // sequence at or above the owner's floor, so an acknowledged object above a hole
    // would be ignored by everyone (docs/s3stream.md, "Invariants").
    let mut next_ack = shared.next_seq.load(Ordering::SeqCst);
    loop {
        // Seal and upload while the rules allow.
        let age = group.opened.elapsed();
        let corked = shared.corked() && age < cork_max;
        let due = age >= linger && !corked;
        // An empty group is never full (its header alone may reach a tiny limit).
        let full = !group.jobs.is_empty() && group.builder.len() as u64 >= config.group_bytes_max;
        if !group.jobs.is_empty() && inflight.len() < inflight_max && (full || due || !open) {
            let sealed = std::mem::replace(&mut group, Group::new());
            let seq = shared.next_seq.fetch_add(1, Ordering::SeqCst);
            if inflight_seqs.is_empty() {
                shared.oldest_unacked.store(seq, Ordering::SeqCst);
            }
            inflight_seqs.push_back(seq);
            let len = sealed.builder.len();
            let bytes = sealed.builder.finish();
            metrics::histogram!("mink_wal_group_records").record(sealed.jobs.len() as f64);
            metrics::histogram!("mink_wal_group_bytes").record(len as f64);
            let path = wal_path(&wal, seq);
            let store = store.clone();
            inflight_jobs.push_back(Sealed {
                seq,
                jobs: sealed.jobs,
                bytes: len,
            });
            let budget = Duration::from_millis(config.upload_retry_budget_ms);
            let span = tracing::debug_span!("wal.upload", %wal, seq, bytes = len, records = inflight_jobs.back().map_or(0, |s| s.jobs.len()));
            inflight.push_back(tracing::Instrument::instrument(
                upload(store, path, bytes, budget),
                span,
            ));
            continue;
        }
        if !open && inflight.is_empty() && group.jobs.is_empty() {
            return;
        }
        let linger_deadline = tokio::time::Instant::from_std(group.opened + linger);
        let cork_deadline = tokio::time::Instant::from_std(group.opened + cork_max);
        let waiting_on_cork = corked && !group.jobs.is_empty() && inflight.len() < inflight_max;
        // Biased, completions first: acknowledgements are never starved by a steady
        // stream of appends, and a seeded test replays the same interleaving.
        tokio::select! {
            biased;
            Some(result) = inflight.next(), if !inflight.is_empty() => {
                inflight_seqs.pop_front();
                let Some(sealed) = inflight_jobs.pop_front() else {
                    unreachable!("an upload completed without its group");
                };
                // Retired meanwhile: nothing more is acknowledged, even an upload
                // that landed.
                let result = match (result, shared.failure()) {
                    (Ok(_), Some(_)) => Err(UploadError::Retired),
                    // A hole under this acknowledgement would be a broken writer: it
                    // stops (tests panic on it) rather than acknowledge past the hole.
                    (Ok(_), None) if sealed.seq != next_ack => {
                        debug_assert_eq!(sealed.seq, next_ack, "WAL {wal}: acknowledgements must follow the sequences with no hole");
                        Err(UploadError::Hole { expected: next_ack })
                    }
                    (result, _) => result,
                };
                match result {
                    Ok(_) => {
                        next_ack += 1;
                        metrics::counter!("mink_wal_uploads_total").increment(1);
                        metrics::counter!("mink_wal_upload_bytes_total").increment(sealed.bytes as u64);
                        for (job, range) in sealed.jobs {
                            metrics::histogram!("mink_wal_ack_latency_seconds").record(job.enqueued.elapsed().as_secs_f64());
                            job.stream.on_durable(&job.record, sealed.seq, range);
                            let _ = job.done.send(Ok(()));
                        }
                        let oldest = inflight_seqs.front().copied().unwrap_or_else(|| shared.next_seq.load(Ordering::SeqCst));
                        shared.oldest_unacked.store(oldest, Ordering::SeqCst);
                        // The appenders just acknowledged often append again at once.
                        // Let them run and gather what they send before sealing, so they
                        // ride the next upload instead of waiting for the one after.
                        for _ in 0..ACK_GATHER_YIELDS {
                            tokio::task::yield_now().await;
                            while (group.builder.len() as u64) < config.group_bytes_max
                                && let Ok(job) = rx.try_recv()
                            {
                                group.add(job);
                            }
                        }
                    }
                    Err(e) => {
                        let err = match e {
                            UploadError::Fenced => {
                                metrics::counter!("mink_wal_fenced_total").increment(1);
                                WalError::Fenced(format!("WAL {wal} was fenced at sequence {}", sealed.seq))
                            }
                            UploadError::Failed(other) => {
                                metrics::counter!("mink_wal_upload_failures_total").increment(1);
                                WalError::Storage(format!("WAL {wal} upload {} failed: {other}", sealed.seq))
                            }
                            UploadError::Hole { expected } => WalError::Corrupt(format!(
                                "WAL {wal}: upload {} completed where {expected} was next",
                                sealed.seq
                            )),
                            UploadError::Retired => shared
                                .failure()
                                .unwrap_or_else(|| WalError::Fenced(format!("WAL {wal} was retired"))),
                        };
                        // Later uploads may still land, but none is acknowledged.
                        drop(inflight);
                        let unacked = std::iter::once(sealed).chain(inflight_jobs).map(|s| s.jobs);
                        fail_all(&shared, err, unacked.chain([group.jobs]), rx).await;
                        return;
                    }
                }
            },
            _ = shared.retire.notified() => {
                let err = shared
                    .retired
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_else(|| WalError::Fenced(format!("WAL {wal} was retired")));
                drop(inflight);
                let unacked = inflight_jobs.into_iter().map(|s| s.jobs);
                fail_all(&shared, err, unacked.chain([group.jobs]), rx).await;
                return;
            },
            job = rx.recv(), if open && !full => match job {
                Some(job) => {
                    group.add(job);
                    // Everything already queued joins the group before it can be
                    // sealed: appends enqueued together (the parts of a table write,
                    // whose cork may be gone before this task wakes) share an upload.
                    while (group.builder.len() as u64) < config.group_bytes_max
                        && let Ok(job) = rx.try_recv()
                    {
                        group.add(job);
                    }
                }
                None => open = false,
            },
            // Only while an upload slot is free: a lingered group that waits for a slot
            // would otherwise wake this loop without end.
            // While corked the cork's branches below wake the loop instead (a linger
            // shorter than the cork would otherwise be ready on every pass).
            _ = tokio::time::sleep_until(linger_deadline), if !group.jobs.is_empty() && !linger.is_zero() && inflight.len() < inflight_max && !corked => {}
            _ = shared.uncorked.notified(), if waiting_on_cork => {}
            _ = tokio::time::sleep_until(cork_deadline), if waiting_on_cork => {}
        }
    }
}

/// Fails the writer for good with `err`: every append of `unacked` (uploads in flight
/// and the open group) and every one queued or sent later.
async fn fail_all(
    shared: &WriterShared,
    err: WalError,
    unacked: impl Iterator<Item = Vec<(Job, std::ops::Range<u64>)>>,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    tracing::warn!("{err}; failing every later append");
    shared.failed.send_replace(Some(err.clone()));
    for (job, _) in unacked.flatten() {
        let _ = job.done.send(Err(err.clone()));
    }
    rx.close();
    while let Some(job) = rx.recv().await {
        let _ = job.done.send(Err(err.clone()));
    }
}
