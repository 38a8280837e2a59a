//! The node's one WAL writer: group commit, pipelined uploads, acks in upload order.
//!
//! Appends from every stream of the node arrive on one channel. They collect in the
//! open group; a group becomes one WAL object, created with `PutMode::Create` at the
//! next sequence number. A group is sealed once it is `linger_ms` old, or earlier
//! while the PUT budget (`put_rate_max`, [`super::budget`]) has a token for it (at
//! once on an idle node), or when it reaches `group_bytes_max`, whenever fewer than
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
use super::budget::PutBudget;
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
    /// The appender's span (a request's `append`/`put`, or none): told the WAL
    /// sequence of the upload that carries the record (its `wal_seq` field), and
    /// linked from that upload's span, so that one request is followed to its upload.
    pub span: tracing::Span,
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
            Ok(_) => {
                tracing::debug!(
                    attempt,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "uploaded"
                );
                return Ok(());
            }
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

/// When the open group is sealed ([`SealRules::seal_now`]): the writer's limits.
#[derive(Debug, Clone, Copy)]
struct SealRules {
    linger: Duration,
    /// A PUT budget is kept: a group with a token goes before its linger is out.
    budget: bool,
    cork_max: Duration,
    group_bytes_max: u64,
    inflight_max: usize,
}

/// The open group and the uploads, as [`SealRules`] look at them.
#[derive(Debug, Clone, Copy)]
struct GroupState {
    jobs: usize,
    bytes: u64,
    age: Duration,
    /// How long until the PUT budget has a token (zero: it has one, or there is no
    /// budget).
    token_wait: Duration,
    /// A cork is held (see [`Cork`]).
    corks: bool,
    uploads: usize,
    /// Whether appends may still arrive.
    open: bool,
}

impl SealRules {
    /// Whether a cork holds the group back: one is held and the group is younger than
    /// `cork_max`.
    fn corked(&self, g: &GroupState) -> bool {
        g.corks && g.age < self.cork_max
    }

    /// Whether the group takes no more appends for now. An empty group is never full
    /// (its header alone may reach a tiny limit).
    fn full(&self, g: &GroupState) -> bool {
        g.jobs > 0 && g.bytes >= self.group_bytes_max
    }

    /// Whether the group is due, uncorked: it lingered long enough, or the budget
    /// has a token for it.
    fn due(&self, g: &GroupState) -> bool {
        let allowed = g.age >= self.linger || (self.budget && g.token_wait.is_zero());
        allowed && !self.corked(g)
    }

    /// Whether the group is sealed now: it has appends, an upload slot is free, and it
    /// is full, due (see [`SealRules::due`]), or the last one (the channel closed).
    fn seal_now(&self, g: &GroupState) -> bool {
        let due = self.due(g);
        g.jobs > 0 && g.uploads < self.inflight_max && (self.full(g) || due || !g.open)
    }
}

/// What a completed upload of sequence `seq` means, with `next_ack` the sequence the
/// next acknowledgement must have: acknowledged, or why not. A writer retired
/// meanwhile acknowledges nothing more, even an upload that landed; and a hole under
/// an acknowledgement would be a broken writer, which stops rather than acknowledge
/// past it (docs/s3stream.md, "Invariants").
fn upload_outcome(
    result: Result<(), UploadError>,
    retired: bool,
    seq: u64,
    next_ack: u64,
) -> Result<(), UploadError> {
    match result {
        Ok(()) if retired => Err(UploadError::Retired),
        Ok(()) if seq != next_ack => Err(UploadError::Hole { expected: next_ack }),
        result => result,
    }
}

type Upload = std::pin::Pin<Box<dyn Future<Output = Result<(), UploadError>> + Send>>;

/// The writer task's state between events (see the module docs).
struct Writer {
    store: Arc<dyn ObjectStore>,
    wal: WalId,
    shared: Arc<WriterShared>,
    rules: SealRules,
    /// The PUT budget (`wal.put_rate_max`), when one is kept.
    budget: Option<PutBudget>,
    upload_budget: Duration,
    group: Group,
    /// Uploads in flight, completed in sequence order.
    uploads: FuturesOrdered<Upload>,
    /// Their groups, in the same order.
    sealed: VecDeque<Sealed>,
    /// Whether appends may still arrive.
    open: bool,
    /// The sequence the next acknowledged upload must have. Acknowledged WAL objects
    /// are a contiguous run from the first sequence: a takeover fences at the first
    /// free sequence at or above the owner's floor, so an acknowledged object above a
    /// hole would be ignored by everyone (docs/s3stream.md, "Invariants").
    next_ack: u64,
}

pub(crate) async fn run_writer(
    store: Arc<dyn ObjectStore>,
    wal: WalId,
    config: WalConfig,
    shared: Arc<WriterShared>,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    let next_ack = shared.next_seq.load(Ordering::SeqCst);
    let budget = PutBudget::new(config.put_rate(), Instant::now());
    metrics::gauge!("mink_wal_put_rate_max").set(budget.as_ref().map_or(0.0, PutBudget::per_s));
    let mut writer = Writer {
        store,
        wal,
        shared,
        rules: SealRules {
            linger: config.linger(),
            budget: budget.is_some(),
            cork_max: Duration::from_millis(config.cork_max_ms),
            group_bytes_max: config.group_bytes_max,
            inflight_max: config.inflight_uploads_max.max(1) as usize,
        },
        budget,
        upload_budget: Duration::from_millis(config.upload_retry_budget_ms),
        group: Group::new(),
        uploads: FuturesOrdered::new(),
        sealed: VecDeque::new(),
        open: true,
        next_ack,
    };
    if let Err(err) = writer.run(&mut rx).await {
        writer.fail_all(err, rx).await;
    }
}

impl Writer {
    fn group_state(&self) -> GroupState {
        GroupState {
            jobs: self.group.jobs.len(),
            bytes: self.group.builder.len() as u64,
            age: self.group.opened.elapsed(),
            token_wait: self
                .budget
                .as_ref()
                .map_or(Duration::ZERO, |b| b.wait(Instant::now())),
            corks: self.shared.corked(),
            uploads: self.uploads.len(),
            open: self.open,
        }
    }

    /// Seals, uploads and acknowledges until the channel is closed and everything in
    /// it is durable (`Ok`), or until the writer must fail (the error).
    async fn run(&mut self, rx: &mut mpsc::UnboundedReceiver<Job>) -> Result<(), WalError> {
        loop {
            let g = self.group_state();
            if self.rules.seal_now(&g) {
                self.seal();
                continue;
            }
            if !self.open && self.uploads.is_empty() && self.group.jobs.is_empty() {
                return Ok(());
            }
            let (corked, full) = (self.rules.corked(&g), self.rules.full(&g));
            let slot_free = g.uploads < self.rules.inflight_max;
            let lingering = g.jobs > 0 && !self.rules.linger.is_zero() && slot_free && !corked;
            let waiting_on_cork = corked && g.jobs > 0 && slot_free;
            // The group is due at the end of its linger, or at the budget's next token
            // if that comes first.
            let mut due_at = self.group.opened + self.rules.linger;
            if self.rules.budget {
                due_at = due_at.min(Instant::now() + g.token_wait);
            }
            let linger_deadline = tokio::time::Instant::from_std(due_at);
            let cork_deadline =
                tokio::time::Instant::from_std(self.group.opened + self.rules.cork_max);
            let shared = self.shared.clone();
            // Biased, completions first: acknowledgements are never starved by a steady
            // stream of appends, and a seeded test replays the same interleaving.
            tokio::select! {
                biased;
                Some(result) = self.uploads.next(), if !self.uploads.is_empty() => {
                    self.on_uploaded(result, rx).await?;
                }
                () = shared.retire.notified() => return Err(self.retired_error()),
                job = rx.recv(), if self.open && !full => match job {
                    Some(job) => self.gather(job, rx),
                    None => self.open = false,
                },
                // Only while an upload slot is free: a lingered group that waits for a
                // slot would otherwise wake this loop without end. While corked the
                // cork's branches below wake the loop instead (a linger shorter than the
                // cork would otherwise be ready on every pass).
                () = tokio::time::sleep_until(linger_deadline), if lingering => {}
                () = shared.uncorked.notified(), if waiting_on_cork => {}
                () = tokio::time::sleep_until(cork_deadline), if waiting_on_cork => {}
            }
        }
    }

    /// Adds `job` to the open group, and everything already queued before the group
    /// can be sealed: appends enqueued together (the parts of a table write, whose
    /// cork may be gone before this task wakes) share an upload.
    fn gather(&mut self, job: Job, rx: &mut mpsc::UnboundedReceiver<Job>) {
        self.group.add(job);
        self.take_queued(rx);
    }

    /// Moves the queued appends into the open group while it has room.
    fn take_queued(&mut self, rx: &mut mpsc::UnboundedReceiver<Job>) {
        while (self.group.builder.len() as u64) < self.rules.group_bytes_max
            && let Ok(job) = rx.try_recv()
        {
            self.group.add(job);
        }
    }

    /// Seals the open group as the next WAL sequence and starts its upload.
    fn seal(&mut self) {
        if let Some(budget) = &mut self.budget {
            let now = Instant::now();
            budget.spend(now);
            metrics::gauge!("mink_wal_put_budget_tokens").set(budget.tokens(now));
        }
        let group = std::mem::replace(&mut self.group, Group::new());
        let seq = self.shared.next_seq.fetch_add(1, Ordering::SeqCst);
        if self.sealed.is_empty() {
            self.shared.oldest_unacked.store(seq, Ordering::SeqCst);
        }
        let len = group.builder.len();
        let records = group.jobs.len();
        let bytes = group.builder.finish();
        metrics::histogram!("mink_wal_group_records").record(records as f64);
        metrics::histogram!("mink_wal_group_bytes").record(len as f64);
        let span = tracing::debug_span!("wal.upload", wal = %self.wal, seq, bytes = len, records);
        for (job, _) in &group.jobs {
            job.span.record("wal_seq", seq);
            span.follows_from(&job.span);
        }
        self.sealed.push_back(Sealed {
            seq,
            jobs: group.jobs,
            bytes: len,
        });
        let upload = upload(
            self.store.clone(),
            wal_path(&self.wal, seq),
            bytes,
            self.upload_budget,
        );
        self.uploads
            .push_back(Box::pin(tracing::Instrument::instrument(upload, span)));
    }

    /// The oldest upload completed with `result`: acknowledges its appends, then
    /// gathers what their appenders send at once; or answers why the writer must fail
    /// (the group stays first among the unacknowledged).
    async fn on_uploaded(
        &mut self,
        result: Result<(), UploadError>,
        rx: &mut mpsc::UnboundedReceiver<Job>,
    ) -> Result<(), WalError> {
        let Some(sealed) = self.sealed.pop_front() else {
            unreachable!("an upload completed without its group");
        };
        let retired = self.shared.failure().is_some();
        let outcome = upload_outcome(result, retired, sealed.seq, self.next_ack);
        debug_assert!(
            !matches!(outcome, Err(UploadError::Hole { .. })),
            "WAL {}: acknowledgements must follow the sequences with no hole",
            self.wal
        );
        if let Err(e) = outcome {
            let err = self.upload_error(e, sealed.seq);
            self.sealed.push_front(sealed);
            return Err(err);
        }
        self.next_ack += 1;
        metrics::counter!("mink_wal_uploads_total").increment(1);
        metrics::counter!("mink_wal_upload_bytes_total").increment(sealed.bytes as u64);
        for (job, range) in sealed.jobs {
            metrics::histogram!("mink_wal_ack_latency_seconds")
                .record(job.enqueued.elapsed().as_secs_f64());
            job.stream.on_durable(&job.record, sealed.seq, range);
            let _ = job.done.send(Ok(()));
        }
        let oldest = self
            .sealed
            .front()
            .map_or_else(|| self.shared.next_seq.load(Ordering::SeqCst), |s| s.seq);
        self.shared.oldest_unacked.store(oldest, Ordering::SeqCst);
        // The appenders just acknowledged often append again at once. Let them run and
        // gather what they send before sealing, so they ride the next upload instead of
        // waiting for the one after.
        for _ in 0..ACK_GATHER_YIELDS {
            tokio::task::yield_now().await;
            self.take_queued(rx);
        }
        Ok(())
    }

    /// The writer's error for upload `seq`'s failure `e`.
    fn upload_error(&self, e: UploadError, seq: u64) -> WalError {
        let wal = &self.wal;
        match e {
            UploadError::Fenced => {
                metrics::counter!("mink_wal_fenced_total").increment(1);
                WalError::Fenced(format!("WAL {wal} was fenced at sequence {seq}"))
            }
            UploadError::Failed(other) => {
                metrics::counter!("mink_wal_upload_failures_total").increment(1);
                WalError::Storage(format!("WAL {wal} upload {seq} failed: {other}"))
            }
            UploadError::Hole { expected } => WalError::Corrupt(format!(
                "WAL {wal}: upload {seq} completed where {expected} was next"
            )),
            UploadError::Retired => self.retired_error(),
        }
    }

    /// Why the writer was retired ([`WriterShared::retire`]).
    fn retired_error(&self) -> WalError {
        let retired = self
            .shared
            .retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        retired
            .or_else(|| self.shared.failure())
            .unwrap_or_else(|| WalError::Fenced(format!("WAL {} was retired", self.wal)))
    }

    /// Fails every append not acknowledged (uploads in flight, the open group) and
    /// every later one with `err`. Later uploads may still land, but none is
    /// acknowledged: they are dropped first.
    async fn fail_all(self, err: WalError, rx: mpsc::UnboundedReceiver<Job>) {
        let Self {
            shared,
            uploads,
            sealed,
            group,
            ..
        } = self;
        drop(uploads);
        let unacked = sealed.into_iter().map(|s| s.jobs).chain([group.jobs]);
        fail_all(&shared, err, unacked, rx).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: SealRules = SealRules {
        linger: Duration::from_millis(5),
        budget: false,
        cork_max: Duration::from_millis(20),
        group_bytes_max: 1_000,
        inflight_max: 2,
    };

    fn group(jobs: usize, bytes: u64, age_ms: u64) -> GroupState {
        GroupState {
            jobs,
            bytes,
            age: Duration::from_millis(age_ms),
            token_wait: Duration::ZERO,
            corks: false,
            uploads: 0,
            open: true,
        }
    }

    #[test]
    fn a_group_is_sealed_when_full_lingered_or_last_with_a_slot_free() {
        assert!(
            !RULES.seal_now(&group(0, 0, 100)),
            "an empty group is never sealed"
        );
        assert!(!RULES.seal_now(&group(1, 10, 1)), "younger than the linger");
        assert!(RULES.seal_now(&group(1, 10, 5)), "lingered long enough");
        assert!(RULES.seal_now(&group(3, 1_000, 0)), "full");
        let last = GroupState {
            open: false,
            ..group(1, 10, 0)
        };
        assert!(
            RULES.seal_now(&last),
            "the channel closed: nothing more will join"
        );
        let busy = GroupState {
            uploads: 2,
            ..group(3, 5_000, 100)
        };
        assert!(
            !RULES.seal_now(&busy),
            "every upload slot is taken: it keeps growing"
        );
        // An empty group whose header alone reaches a tiny limit is not full.
        assert!(!RULES.full(&group(0, 5_000, 0)));
    }

    #[test]
    fn a_cork_holds_a_lingered_group_until_cork_max_but_not_a_full_one() {
        let corked = |age_ms, bytes| GroupState {
            corks: true,
            ..group(2, bytes, age_ms)
        };
        assert!(RULES.corked(&corked(10, 10)));
        assert!(!RULES.seal_now(&corked(10, 10)), "lingered, but corked");
        assert!(RULES.seal_now(&corked(20, 10)), "the cork is past cork_max");
        assert!(
            RULES.seal_now(&corked(10, 1_000)),
            "a full group goes corked or not"
        );
    }

    #[test]
    fn with_a_budget_a_group_goes_at_once_while_a_token_is_there_else_waits_its_linger() {
        let rules = SealRules {
            budget: true,
            linger: Duration::from_millis(250),
            ..RULES
        };
        let waiting = |age_ms, wait_ms| GroupState {
            token_wait: Duration::from_millis(wait_ms),
            ..group(1, 10, age_ms)
        };
        assert!(rules.seal_now(&waiting(0, 0)), "a token: one PUT per ack");
        assert!(!rules.seal_now(&waiting(40, 60)), "no token: it grows");
        assert!(
            rules.seal_now(&waiting(250, 60)),
            "the linger bounds the wait"
        );
        assert!(
            rules.seal_now(&GroupState {
                bytes: 1_000,
                ..waiting(0, 60)
            }),
            "a full group goes without a token"
        );
        assert!(
            !rules.seal_now(&GroupState {
                corks: true,
                ..waiting(0, 0)
            }),
            "a cork still holds a group that has its token"
        );
        assert!(
            !rules.seal_now(&GroupState {
                uploads: 2,
                ..waiting(0, 0)
            }),
            "a token is no upload slot"
        );
        // Without a budget a token wait means nothing: the linger alone decides.
        assert!(!RULES.seal_now(&waiting(1, 0)));
    }

    #[test]
    fn an_upload_is_acknowledged_only_in_sequence_and_not_once_retired() {
        assert!(upload_outcome(Ok(()), false, 7, 7).is_ok());
        assert!(matches!(
            upload_outcome(Ok(()), true, 7, 7),
            Err(UploadError::Retired)
        ));
        assert!(matches!(
            upload_outcome(Ok(()), false, 8, 7),
            Err(UploadError::Hole { expected: 7 })
        ));
        // A failure stays what it was, retired or not.
        assert!(matches!(
            upload_outcome(Err(UploadError::Fenced), true, 7, 7),
            Err(UploadError::Fenced)
        ));
    }
}
