//! `MetaNode`: one node's view of the metadata log, its heartbeat, the lease, and —
//! while it holds the lease — the coordinator's duties.
//!
//! - **View.** The metadata `ObjectLog` applied to `MetaState`; a tailer keeps it
//!   fresh, backing off while idle; `wait_for(index)` serves `mink-min-applied-index`.
//! - **Heartbeat.** Every `heartbeat_interval_ms` the node overwrites
//!   `meta/nodes/{node}` with a counter. Liveness is judged by whether that object
//!   *changes* (its ETag, size or modification time), on the observer's own clock, so
//!   clocks need not agree. Observers read no heartbeat: the tailer's listing of
//!   `meta/` shows every heartbeat object beside the new entries
//!   ([`ObjectLog::beside`]), so liveness costs no request of its own, and silence
//!   grows only between listings (a node that cannot list declares nobody dead).
//! - **Lease.** A node takes the lease (`AcquireLease` with term + 1, one winner per
//!   term by conditional create) when there is no holder or the holder's heartbeat has
//!   not changed for `lease_timeout_ms`. Every duty of the holder is a proposal carrying
//!   its term; the state machine rejects a stale term, so a deposed holder that has not
//!   noticed yet cannot act.
//! - **Duties.** Assign leaders to buckets that have none (balanced by count over live
//!   nodes), declare nodes dead whose heartbeat stopped for `node_session_timeout_ms`
//!   and move their buckets (new epochs), expire group and producer offsets, write
//!   snapshots of the metadata log, and `rebalance` on request.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mink_types::{MinkError, Result, TableDescriptor, TablePath};
use mink_wal::{Appended, ObjectLog, Purpose, Stores, WalError};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::MetaConfig;
use crate::state::{MetaCommand, MetaState, PartitionInfo, TableInfo};

/// Bucket moves in one `AssignBuckets` proposal, at most.
const ASSIGNMENTS_PER_PROPOSAL_MAX: usize = 1_000;

fn storage(e: WalError) -> MinkError {
    match e {
        WalError::Storage(e) => MinkError::StorageFailure(format!("metadata log: {e}")),
        other => MinkError::Internal(format!("metadata log: {other}")),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where heartbeat objects live, beside the metadata log (sorting after `meta/log/`,
/// so the tailer's listing shows them).
const HEARTBEATS: &str = "meta/nodes";

/// What a node last saw of another node's heartbeat object (its version: ETag, size,
/// modification time; `None` while absent), and when that changed.
struct Seen {
    version: Option<(Option<String>, u64, i64)>,
    changed_at: Instant,
    /// Whether a change was seen (not only the first sight).
    changed: bool,
}

struct Inner {
    node: String,
    /// Grows when the node comes back as a new incarnation without a restart (after
    /// its WAL was replaced).
    incarnation: AtomicU64,
    /// The handle for heartbeat objects (purpose `heartbeat`).
    store: Arc<dyn ObjectStore>,
    log: ObjectLog<MetaState>,
    config: MetaConfig,
    heartbeat: AtomicU64,
    seen: Mutex<HashMap<String, Seen>>,
    /// The tailer's latest listing of what is beside the metadata log: heartbeats.
    beside: watch::Receiver<Arc<mink_wal::objectlog::BesideListing>>,
    /// Serializes this node's proposals whose result is read back from the state.
    proposing: tokio::sync::Mutex<()>,
    /// Serializes the lease holder's duties that plan from the view and propose the
    /// plan (`assign_now`, the duty round with its dead-node moves, `rebalance`). Two
    /// plans made from one view would both be applied: every bucket in both would get
    /// two new epochs and perhaps flip leaders. Each duty reads the lease and its plan
    /// only once it holds this lock, so it plans from a view that includes the
    /// previous duty's proposals (a node's own appends are applied before `propose`
    /// returns).
    duties: tokio::sync::Mutex<()>,
    shutdown: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    last_snapshot: AtomicU64,
    /// Why the last heartbeat write failed; `None` when it succeeded (the object store
    /// answers).
    heartbeat_error: Mutex<Option<String>>,
    /// Proposals waiting for the committer (group commit), each with its answer.
    queue: Mutex<Vec<Proposal>>,
    /// Whether a committer task is draining `queue`.
    committing: std::sync::atomic::AtomicBool,
    /// The consumer groups with members on this node's coordinator, whose offsets do
    /// not expire (KIP-211); set by the node that runs the Kafka listener.
    live_groups: std::sync::OnceLock<LiveGroups>,
}

/// Names the consumer groups that have members now.
pub type LiveGroups = Arc<dyn Fn() -> BTreeSet<String> + Send + Sync>;

type Proposal = (MetaCommand, tokio::sync::oneshot::Sender<Result<u64>>);

/// One node's metadata service. Cheap to clone.
#[derive(Clone)]
pub struct MetaNode {
    inner: Arc<Inner>,
}

impl MetaNode {
    /// Opens the metadata log (from its latest snapshot), registers this node as a new
    /// incarnation, and starts the tailer, the heartbeat and the lease loop. `stores`
    /// is a bare store or one handle per purpose (the log's requests count as `meta`,
    /// heartbeats as `heartbeat`).
    pub async fn open(
        stores: impl Into<Stores>,
        node: &str,
        flight_addr: &str,
        kafka_addr: &str,
        config: MetaConfig,
    ) -> Result<Self> {
        config
            .validate()
            .map_err(|e| MinkError::invalid("meta config", e))?;
        let stores: Stores = stores.into();
        let store = stores.get(Purpose::Heartbeat);
        let log = ObjectLog::open(stores.get(Purpose::Meta), "meta", MetaState::default())
            .await
            .map_err(storage)?;
        let mut incarnation = log.read(|s, _| s.nodes.get(node).map_or(0, |n| n.incarnation)) + 1;
        loop {
            let command = MetaCommand::RegisterNode {
                node: node.to_string(),
                flight_addr: flight_addr.to_string(),
                kafka_addr: kafka_addr.to_string(),
                incarnation,
            };
            match log.append(&command).await.map_err(storage)? {
                Appended::At(_) => break,
                Appended::Rejected(MinkError::InvalidArgument { field, .. })
                    if field == "incarnation" =>
                {
                    incarnation =
                        log.read(|s, _| s.nodes.get(node).map_or(0, |n| n.incarnation)) + 1;
                }
                Appended::Rejected(e) => return Err(e),
            }
        }
        let beside = log.beside();
        let meta = Self {
            inner: Arc::new(Inner {
                node: node.to_string(),
                incarnation: AtomicU64::new(incarnation),
                store,
                log,
                config,
                heartbeat: AtomicU64::new(0),
                seen: Mutex::new(HashMap::new()),
                beside,
                proposing: tokio::sync::Mutex::new(()),
                duties: tokio::sync::Mutex::new(()),
                shutdown: watch::channel(false).0,
                tasks: Mutex::new(Vec::new()),
                last_snapshot: AtomicU64::new(0),
                heartbeat_error: Mutex::new(None),
                queue: Mutex::new(Vec::new()),
                committing: std::sync::atomic::AtomicBool::new(false),
                live_groups: std::sync::OnceLock::new(),
            }),
        };
        meta.beat().await;
        let tasks = vec![
            tokio::spawn(meta.clone().tail_loop()),
            tokio::spawn(meta.clone().heartbeat_loop()),
            tokio::spawn(meta.clone().lease_loop()),
        ];
        *meta.inner.tasks.lock().unwrap_or_else(|e| e.into_inner()) = tasks;
        tracing::info!(node, incarnation, "metadata node started");
        Ok(meta)
    }

    pub fn node_id(&self) -> &str {
        &self.inner.node
    }

    /// This process's incarnation of the node.
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation.load(Ordering::SeqCst)
    }

    /// Registers this node again as a new incarnation, keeping its addresses: every
    /// bucket it leads gets a new leader epoch, so streams it had open under the old
    /// epochs can be reopened by a new WAL generation (a takeover from the old one)
    /// and nothing the old incarnation held open is ever used again. Returns the new
    /// incarnation.
    pub async fn reincarnate(&self) -> Result<u64> {
        let node = self.inner.node.clone();
        loop {
            self.inner_catch_up().await;
            let (incarnation, flight_addr, kafka_addr) = self.read(|s| {
                let n = s.nodes.get(&node);
                (
                    n.map_or(0, |n| n.incarnation) + 1,
                    n.map(|n| n.flight_addr.clone()).unwrap_or_default(),
                    n.map(|n| n.kafka_addr.clone()).unwrap_or_default(),
                )
            });
            let command = MetaCommand::RegisterNode {
                node: node.clone(),
                flight_addr,
                kafka_addr,
                incarnation,
            };
            match self.inner.log.append(&command).await.map_err(storage)? {
                Appended::At(_) => {
                    self.inner.incarnation.store(incarnation, Ordering::SeqCst);
                    tracing::info!(node, incarnation, "registered as a new incarnation");
                    return Ok(incarnation);
                }
                Appended::Rejected(MinkError::InvalidArgument { field, .. })
                    if field == "incarnation" => {}
                Appended::Rejected(e) => return Err(e),
            }
        }
    }

    /// The index of the last applied metadata entry (`mink-applied-index`).
    pub fn applied_index(&self) -> u64 {
        self.inner.log.applied_index()
    }

    /// Reads the applied state.
    pub fn read<R>(&self, f: impl FnOnce(&MetaState) -> R) -> R {
        self.inner.log.read(|s, _| f(s))
    }

    /// A copy of the applied state and its index.
    pub fn snapshot(&self) -> (MetaState, u64) {
        self.inner.log.read(|s, i| (s.clone(), i))
    }

    /// Changes of the applied index.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.log.subscribe()
    }

    /// Waits (at most `timeout`, capped by `applied_index_wait_max_ms`) until `index`
    /// is applied (`mink-min-applied-index`). Returns the applied index.
    pub async fn wait_for(&self, index: u64, timeout: Duration) -> Result<u64> {
        let cap = Duration::from_millis(self.inner.config.applied_index_wait_max_ms);
        let reached = self
            .inner
            .log
            .wait_for(index, timeout.min(cap))
            .await
            .map_err(storage)?;
        if reached < index {
            return Err(MinkError::Unavailable(format!(
                "metadata index {index} not applied within {:?} (at {reached})",
                timeout.min(cap)
            )));
        }
        Ok(reached)
    }

    /// Validates and appends a command. Returns its index (and the command is applied
    /// to this node's view when it returns).
    ///
    /// Group commit: while one append is in flight, the node's other proposals queue,
    /// and the next append carries all of them as one `Batch` entry (each validated
    /// after the ones before it; one that is invalid is answered with its rejection and
    /// left out). So a node makes one PUT per round trip, not per proposal. The commit
    /// runs on a task of its own: a caller that goes away cancels nothing.
    pub async fn propose(&self, command: MetaCommand) -> Result<u64> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((command, tx));
        self.kick_committer();
        rx.await
            .map_err(|_| MinkError::Internal("the metadata committer went away".into()))?
    }

    /// Proposes several commands queued together, so that the committer appends them
    /// in one `Batch` entry when they fit (each validated on the state the ones before
    /// it leave). Returns each one's index, or the first error.
    pub async fn propose_all(&self, commands: Vec<MetaCommand>) -> Result<Vec<u64>> {
        let answers: Vec<_> = {
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            commands
                .into_iter()
                .map(|command| {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    queue.push((command, tx));
                    rx
                })
                .collect()
        };
        self.kick_committer();
        let mut indexes = Vec::with_capacity(answers.len());
        for rx in answers {
            indexes.push(
                rx.await.map_err(|_| {
                    MinkError::Internal("the metadata committer went away".into())
                })??,
            );
        }
        Ok(indexes)
    }

    fn kick_committer(&self) {
        if self.inner.committing.swap(true, Ordering::AcqRel) {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            loop {
                let batch: Vec<Proposal> = {
                    let mut queue = node.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                    let n = queue.len().min(crate::state::BATCH_COMMANDS_MAX);
                    queue.drain(..n).collect()
                };
                if batch.is_empty() {
                    node.inner.committing.store(false, Ordering::Release);
                    // A proposal queued between the drain and the store found the flag
                    // set and left it to us: take it, unless another committer has.
                    let queued = !node
                        .inner
                        .queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty();
                    if queued && !node.inner.committing.swap(true, Ordering::AcqRel) {
                        continue;
                    }
                    return;
                }
                // A panic (a bug) fails this batch's callers, who see their answer
                // dropped, and never the node's later proposals.
                let committed = std::panic::AssertUnwindSafe(node.commit(batch));
                match futures::FutureExt::catch_unwind(committed).await {
                    Ok(deferred) if !deferred.is_empty() => {
                        let mut queue = node.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                        let later = std::mem::take(&mut *queue);
                        *queue = deferred.into_iter().chain(later).collect();
                    }
                    Ok(_) => {}
                    Err(_) => {
                        tracing::error!("the metadata committer panicked (a bug); its batch failed")
                    }
                }
            }
        });
    }

    async fn append_one(&self, command: &MetaCommand) -> Result<u64> {
        match self.inner.log.append(command).await.map_err(storage)? {
            Appended::At(index) => {
                metrics::counter!("mink_meta_proposals_total").increment(1);
                Ok(index)
            }
            Appended::Rejected(e) => Err(e),
        }
    }

    /// Appends queued proposals: one alone as itself, several as one `Batch` entry.
    /// Returns proposals deferred to the next entry: valid against the log, but not
    /// after the batch members before them (`CreateDatabase x` twice): answering them
    /// now would report an outcome that depends on an entry not yet written.
    async fn commit(&self, mut batch: Vec<Proposal>) -> Vec<Proposal> {
        use mink_wal::LogState;
        if batch.len() == 1 {
            let (command, tx) = batch.pop().expect("one proposal");
            let _ = tx.send(self.append_one(&command).await);
            return Vec::new();
        }
        for _ in 0..3 {
            // Leave out what the view rejects, answering it now; but a view may lag
            // the log (another node's entry this node has not read yet), so a
            // rejection counts only after catching up.
            let mut caught_up = false;
            let (valid, rejected, deferred) = loop {
                let base = self.read(|s| s.clone());
                let mut scratch = base.clone();
                let mut valid = Vec::with_capacity(batch.len());
                let mut rejected = Vec::new();
                let mut deferred = Vec::new();
                for (command, tx) in batch.drain(..) {
                    match scratch.validate(&command) {
                        Ok(()) => {
                            scratch.apply(0, &command);
                            valid.push((command, tx));
                        }
                        Err(_) if base.validate(&command).is_ok() => {
                            deferred.push((command, tx));
                        }
                        Err(e) => rejected.push((command, tx, e)),
                    }
                }
                if rejected.is_empty() || caught_up {
                    break (valid, rejected, deferred);
                }
                caught_up = true;
                if let Err(e) = self.inner.log.catch_up().await {
                    // The rejections stand on a view that may be stale: say so.
                    let e = storage(e);
                    for (_, tx, _) in rejected {
                        let _ = tx.send(Err(MinkError::StorageFailure(format!(
                            "the metadata log could not be read to validate the proposal: {e}"
                        ))));
                    }
                    break (valid, Vec::new(), deferred);
                }
                batch = valid
                    .into_iter()
                    .chain(deferred)
                    .chain(rejected.into_iter().map(|(c, tx, _)| (c, tx)))
                    .collect();
            };
            for (_, tx, e) in rejected {
                let _ = tx.send(Err(e));
            }
            if valid.len() <= 1 {
                for (command, tx) in valid {
                    let _ = tx.send(self.append_one(&command).await);
                }
                return deferred;
            }
            let entry = MetaCommand::Batch {
                commands: valid.iter().map(|(c, _)| c.clone()).collect(),
            };
            match self.inner.log.append(&entry).await {
                Ok(Appended::At(index)) => {
                    metrics::counter!("mink_meta_proposals_total").increment(valid.len() as u64);
                    metrics::counter!("mink_meta_batches_total").increment(1);
                    for (_, tx) in valid {
                        let _ = tx.send(Ok(index));
                    }
                    return deferred;
                }
                // Another node's entry came first and the view moved: validate again.
                Ok(Appended::Rejected(_)) => batch = valid.into_iter().chain(deferred).collect(),
                Err(e) => {
                    let e = storage(e);
                    for (_, tx) in valid {
                        let _ = tx.send(Err(e.clone()));
                    }
                    return deferred;
                }
            }
        }
        for (command, tx) in batch {
            let _ = tx.send(self.append_one(&command).await);
        }
        Vec::new()
    }

    /// Applies every entry appended so far (a forced catch-up).
    pub async fn inner_catch_up(&self) {
        if let Err(e) = self.inner.log.catch_up().await {
            tracing::debug!("catch-up: {e}");
        }
    }

    /// Whether the last heartbeat reached the object store.
    pub fn heartbeat_ok(&self) -> bool {
        self.heartbeat_error().is_none()
    }

    /// Why the last heartbeat did not reach the object store (the store's error), if it
    /// did not.
    pub fn heartbeat_error(&self) -> Option<String> {
        self.inner
            .heartbeat_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this node holds the lease in its current view.
    pub fn is_lease_holder(&self) -> bool {
        self.read(|s| s.lease.holder.as_deref() == Some(self.inner.node.as_str()))
    }

    /// The current lease term and holder.
    pub fn lease(&self) -> (u64, Option<String>) {
        self.read(|s| (s.lease.term, s.lease.holder.clone()))
    }

    // ---- catalog -------------------------------------------------------------

    pub async fn create_database(&self, name: &str) -> Result<u64> {
        self.propose(MetaCommand::CreateDatabase {
            name: name.to_string(),
        })
        .await
    }

    pub async fn drop_database(&self, name: &str, cascade: bool) -> Result<u64> {
        self.propose(MetaCommand::DropDatabase {
            name: name.to_string(),
            cascade,
        })
        .await
    }

    /// Creates a table; returns it as applied.
    pub async fn create_table(
        &self,
        path: &TablePath,
        descriptor: TableDescriptor,
    ) -> Result<(TableInfo, u64)> {
        let index = self
            .propose(MetaCommand::CreateTable {
                path: path.clone(),
                descriptor,
                at_ms: now_ms(),
            })
            .await?;
        let table = self
            .read(|s| s.table(path).cloned())
            .ok_or_else(|| MinkError::NotFound(format!("table {path} (dropped meanwhile)")))?;
        self.await_leaders(table.id).await;
        Ok((table, index))
    }

    /// Adds buckets to an unpartitioned log table without bucket keys (see
    /// `MetaCommand::AddBuckets`) and waits (bounded) for their leaders.
    pub async fn add_buckets(&self, path: &TablePath, bucket_count: u32) -> Result<u64> {
        let index = self
            .propose(MetaCommand::AddBuckets {
                path: path.clone(),
                bucket_count,
            })
            .await?;
        if let Some(id) = self.read(|s| s.table(path).map(|t| t.id)) {
            self.assign_now().await;
            self.await_leaders(id).await;
        }
        Ok(index)
    }

    /// Waits (bounded) until every bucket of table `id` has a leader. The lease holder
    /// assigns at once; another node's new table reaches the holder at the holder's
    /// next metadata listing, up to `tail_idle_interval_max_ms` later on an idle
    /// cluster, and a table whose buckets have no leader yet cannot be written, read
    /// or tailed. So a `create_table` answers once its buckets are led (or after
    /// that interval plus 2 s, when they are not: writes then wait for them as before).
    async fn await_leaders(&self, id: i64) {
        let wait = Duration::from_millis(self.inner.config.tail_idle_interval_max_ms)
            + Duration::from_secs(2);
        let deadline = Instant::now() + wait;
        let mut changes = self.subscribe();
        let led = |s: &MetaState| {
            s.buckets
                .values()
                .filter(|b| b.bucket.table_id == id)
                .all(|b| b.leader.is_some())
        };
        while !self.read(led) {
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// Creates a partition, or finds it when it exists.
    pub async fn create_partition(
        &self,
        path: &TablePath,
        name: &str,
    ) -> Result<(PartitionInfo, u64)> {
        if let Some(p) = self.read(|s| s.table(path).and_then(|t| t.partitions.get(name).cloned()))
        {
            return Ok((p, self.applied_index()));
        }
        let index = self
            .propose(MetaCommand::CreatePartition {
                path: path.clone(),
                name: name.to_string(),
            })
            .await?;
        let p = self
            .read(|s| s.table(path).and_then(|t| t.partitions.get(name).cloned()))
            .ok_or_else(|| {
                MinkError::NotFound(format!("partition {name} of {path} (dropped meanwhile)"))
            })?;
        Ok((p, index))
    }

    /// Takes a block of `count` writer ids from the shared allocator.
    pub async fn allocate_writer_ids(&self, count: u64) -> Result<std::ops::Range<i64>> {
        let _one_at_a_time = self.inner.proposing.lock().await;
        self.propose(MetaCommand::AllocateWriterIds {
            node: self.inner.node.clone(),
            count,
        })
        .await?;
        let (start, count) = self
            .read(|s| s.writer_blocks.get(&self.inner.node).copied())
            .ok_or_else(|| {
                MinkError::Internal("writer-id block missing after allocation".into())
            })?;
        Ok(start..start + count as i64)
    }

    /// Tells the lease holder's offset expiry which consumer groups have members:
    /// their offsets are kept (KIP-211). Set once; later calls are ignored.
    pub fn set_live_groups(&self, groups: LiveGroups) {
        let _ = self.inner.live_groups.set(groups);
    }

    /// A group's last member left: its offsets are kept for their retention from now
    /// (KIP-211).
    pub async fn touch_group_offsets(&self, group: &str) -> Result<u64> {
        self.propose(MetaCommand::TouchGroupOffsets {
            group: group.to_string(),
            at_ms: now_ms(),
        })
        .await
    }

    /// Commits group offsets, kept for `retention_ms` after this commit, or, while the
    /// group has members, after it became empty (the Kafka layer passes the requested
    /// retention or `group_offsets_ttl_ms`).
    pub async fn commit_group_offsets(
        &self,
        group: &str,
        offsets: BTreeMap<String, (i64, String)>,
        retention_ms: i64,
    ) -> Result<u64> {
        self.propose(MetaCommand::CommitGroupOffsets {
            group: group.to_string(),
            offsets,
            at_ms: now_ms(),
            retention_ms,
        })
        .await
    }

    // ---- lease-holder duties ---------------------------------------------------

    /// When this node holds the lease, gives buckets without a leader one now (after
    /// `create_table`, so that writes need not wait for the next duty round).
    pub async fn assign_now(&self) {
        let _duty = self.inner.duties.lock().await;
        let (term, holder) = self.lease();
        if holder.as_deref() != Some(self.inner.node.as_str()) {
            return;
        }
        let assignments = self.read(plan_orphans);
        for chunk in assignments.chunks(ASSIGNMENTS_PER_PROPOSAL_MAX) {
            if let Err(e) = self
                .propose(MetaCommand::AssignBuckets {
                    term,
                    assignments: chunk.to_vec(),
                })
                .await
            {
                tracing::debug!("assigning buckets: {e}");
                return;
            }
        }
    }

    /// Evens out bucket counts over live nodes with the fewest moves. Only the lease
    /// holder can; others get `NotLeader`-style `Unavailable` naming the holder.
    pub async fn rebalance(&self) -> Result<usize> {
        self.reassign("rebalance runs", plan_rebalance).await
    }

    /// Moves each bucket (by stream name) to the named live node, as an operator asks
    /// (`rebalance` with `moves`): the current leader hands it over, the new one opens
    /// it under a new epoch. Only the lease holder can. Returns the buckets moved (a
    /// bucket already led by its target is not).
    pub async fn move_buckets(&self, moves: Vec<(String, String)>) -> Result<usize> {
        self.reassign("moving buckets runs", |s| {
            moves
                .into_iter()
                .filter(|(bucket, to)| {
                    s.buckets
                        .get(bucket)
                        .is_none_or(|b| b.leader.as_deref() != Some(to.as_str()))
                })
                .collect()
        })
        .await
    }

    /// Proposes the moves `plan` makes from the view, under the duty lock and the
    /// lease's term, on the lease holder only (`what` names the duty in the refusal).
    async fn reassign(
        &self,
        what: &str,
        plan: impl FnOnce(&MetaState) -> Vec<(String, String)>,
    ) -> Result<usize> {
        let _duty = self.inner.duties.lock().await;
        let (term, holder) = self.lease();
        if holder.as_deref() != Some(self.inner.node.as_str()) {
            return Err(MinkError::Unavailable(format!(
                "{what} on the lease holder ({})",
                holder.unwrap_or_else(|| "none yet".into())
            )));
        }
        let moves = self.read(plan);
        for chunk in moves.chunks(ASSIGNMENTS_PER_PROPOSAL_MAX) {
            self.propose(MetaCommand::AssignBuckets {
                term,
                assignments: chunk.to_vec(),
            })
            .await?;
        }
        Ok(moves.len())
    }

    /// Stops the background tasks without a goodbye (as a crash would), or, with
    /// `clean`, releasing the lease first.
    pub async fn shutdown(&self, clean: bool) {
        if clean {
            let (term, holder) = self.lease();
            if holder.as_deref() == Some(self.inner.node.as_str()) {
                let _ = self
                    .propose(MetaCommand::ReleaseLease {
                        node: self.inner.node.clone(),
                        term,
                    })
                    .await;
            }
        }
        self.inner.shutdown.send_replace(true);
        for task in self
            .inner
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }

    async fn stopped(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    async fn tail_loop(self) {
        let max = Duration::from_millis(self.inner.config.tail_idle_interval_max_ms);
        let min = Duration::from_millis(20).min(max);
        let me = self.clone();
        self.inner.log.run_tailer(min, max, me.stopped()).await;
    }

    /// Overwrites `nodes/{node}` with the next counter value.
    async fn beat(&self) {
        let n = self.inner.heartbeat.fetch_add(1, Ordering::Relaxed) + 1;
        let body = serde_json::json!({
            "node": self.inner.node,
            "incarnation": self.inner.incarnation,
            "beat": n,
            "at_ms": now_ms(),
        })
        .to_string();
        let path = Path::from(format!("{HEARTBEATS}/{}", self.inner.node));
        let error = match self.inner.store.put(&path, PutPayload::from(body)).await {
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("heartbeat failed: {e}");
                Some(e.to_string())
            }
        };
        *self
            .inner
            .heartbeat_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = error;
    }

    async fn heartbeat_loop(self) {
        let interval = Duration::from_millis(self.inner.config.heartbeat_interval_ms);
        loop {
            tokio::select! {
                _ = self.stopped() => return,
                _ = tokio::time::sleep(interval) => self.beat().await,
            }
        }
    }

    /// How long `node`'s heartbeat object has been unchanged, on our clock, as the
    /// tailer's latest listing shows it (no request of its own). Measured up to that
    /// listing, not to now: while listings fail, nobody's silence grows.
    fn silent_for(&self, node: &str) -> Duration {
        let listing = self.inner.beside.borrow().clone();
        let path = Path::from(format!("{HEARTBEATS}/{node}"));
        let version = listing
            .objects
            .iter()
            .find(|m| m.location == path)
            .map(|m| {
                (
                    m.e_tag.clone(),
                    m.size,
                    m.last_modified.timestamp_nanos_opt().unwrap_or_default(),
                )
            });
        let mut seen = self.inner.seen.lock().unwrap_or_else(|e| e.into_inner());
        let entry = seen.entry(node.to_string()).or_insert_with(|| Seen {
            version: version.clone(),
            changed_at: listing.at,
            changed: false,
        });
        if entry.version != version {
            entry.version = version;
            entry.changed_at = entry.changed_at.max(listing.at);
            entry.changed = true;
        }
        listing.at.saturating_duration_since(entry.changed_at)
    }

    /// Whether `node`'s heartbeat was seen to change within the last `within` (by
    /// the tailer's listings): it is running, whether or not it serves yet. A node
    /// first looked at now has not been seen to change.
    pub fn heartbeat_fresh(&self, node: &str, within: Duration) -> bool {
        let silent = self.silent_for(node);
        let seen = self.inner.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(node).is_some_and(|s| s.changed) && silent < within
    }

    async fn lease_loop(self) {
        let interval = Duration::from_millis(self.inner.config.heartbeat_interval_ms);
        let mut last_expire = Instant::now();
        let mut applied = self.subscribe();
        let mut next_round = Instant::now();
        loop {
            if Instant::now() >= next_round {
                // A round at once: a lone node takes a free lease without waiting.
                if let Err(e) = self.lease_round(&mut last_expire).await {
                    tracing::debug!(node = %self.inner.node, "lease round: {e}");
                }
                next_round = Instant::now() + interval;
            }
            tokio::select! {
                _ = self.stopped() => return,
                _ = tokio::time::sleep_until(next_round) => {}
                // New entries (a table, a partition) may have made buckets without a
                // leader: the holder assigns them at once instead of next round.
                changed = applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.assign_now().await;
                }
            }
        }
    }

    async fn lease_round(&self, last_expire: &mut Instant) -> Result<()> {
        let (term, holder) = self.lease();
        if holder.as_deref() != Some(self.inner.node.as_str()) {
            // A new holder waits a whole round before it expires offsets: its Kafka
            // coordinator starts empty, and the groups' members need a moment to find
            // it and rejoin before their offsets count as live ones (KIP-211).
            *last_expire = Instant::now();
        }
        match holder {
            Some(h) if h == self.inner.node => self.duties(last_expire).await,
            Some(h) => {
                let silent = self.silent_for(&h);
                if silent >= Duration::from_millis(self.inner.config.lease_timeout_ms) {
                    tracing::info!(node = %self.inner.node, holder = %h, ?silent, "taking over the lease");
                    self.acquire(term + 1).await?;
                }
                Ok(())
            }
            None => self.acquire(term + 1).await,
        }
    }

    async fn acquire(&self, term: u64) -> Result<()> {
        match self
            .propose(MetaCommand::AcquireLease {
                node: self.inner.node.clone(),
                term,
            })
            .await
        {
            Ok(_) => {
                metrics::counter!("mink_meta_lease_acquired_total").increment(1);
                tracing::info!(node = %self.inner.node, term, "holding the lease");
                Ok(())
            }
            // Someone else took this term first: fine.
            Err(MinkError::Fenced(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One round of the lease holder's duties, under the duty lock; the term is the
    /// one held when the turn came (a stale one is rejected by the state machine).
    async fn duties(&self, last_expire: &mut Instant) -> Result<()> {
        let _duty = self.inner.duties.lock().await;
        let (term, holder) = self.lease();
        if holder.as_deref() != Some(self.inner.node.as_str()) {
            return Ok(());
        }
        // Dead nodes.
        let others: Vec<String> = self.read(|s| {
            s.nodes
                .iter()
                .filter(|(n, info)| info.alive && **n != self.inner.node)
                .map(|(n, _)| n.clone())
                .collect()
        });
        let session = Duration::from_millis(self.inner.config.node_session_timeout_ms);
        let dead: Vec<String> = others
            .into_iter()
            .filter(|node| self.silent_for(node) >= session)
            .collect();
        for node in &dead {
            tracing::warn!(%node, "declaring a node dead: its heartbeat stopped");
        }
        // Buckets without a live leader, the dead nodes' among them: their `NodeDown`s
        // and the new leaders go in one entry of the log (one append on a failover's
        // path where there were two, and every node learns both at once).
        // Further chunks of a large plan follow one by one, each after the ones before
        // landed (an entry stays within one chunk's size).
        let assignments = self.read(|s| plan_orphans_without(s, &dead));
        let mut chunks = assignments
            .chunks(ASSIGNMENTS_PER_PROPOSAL_MAX)
            .map(|chunk| MetaCommand::AssignBuckets {
                term,
                assignments: chunk.to_vec(),
            });
        let first: Vec<MetaCommand> = dead
            .into_iter()
            .map(|node| MetaCommand::NodeDown { term, node })
            .chain(chunks.next())
            .collect();
        if !first.is_empty() {
            self.propose_all(first).await?;
        }
        for command in chunks {
            self.propose(command).await?;
        }
        if last_expire.elapsed()
            >= Duration::from_millis(self.inner.config.offsets_expire_interval_ms)
        {
            *last_expire = Instant::now();
            let now_ms = now_ms();
            if self.read(|s| s.has_expired_offsets(now_ms)) {
                let live_groups = self
                    .inner
                    .live_groups
                    .get()
                    .map(|f| f())
                    .unwrap_or_default();
                self.propose(MetaCommand::ExpireOffsets {
                    term,
                    now_ms,
                    live_groups,
                })
                .await?;
            }
        }
        // Snapshots of the metadata log.
        let applied = self.applied_index();
        let last = self.inner.last_snapshot.load(Ordering::Relaxed);
        if applied >= last + self.inner.config.snapshot_every_entries {
            let at = self.inner.log.write_snapshot().await.map_err(storage)?;
            self.inner.last_snapshot.store(at, Ordering::Relaxed);
            if let Err(e) = self.inner.log.delete_covered(at).await {
                tracing::debug!("metadata cleanup: {e}");
            }
        }
        Ok(())
    }
}

/// Live nodes and how many buckets each leads.
fn load(state: &MetaState) -> BTreeMap<String, usize> {
    load_without(state, &[])
}

/// Buckets led by each live node, `down` counted as dead.
fn load_without(state: &MetaState, down: &[String]) -> BTreeMap<String, usize> {
    let mut load: BTreeMap<String, usize> = state
        .nodes
        .iter()
        .filter(|(name, n)| n.alive && !down.contains(name))
        .map(|(n, _)| (n.clone(), 0))
        .collect();
    for b in state.buckets.values() {
        if let Some(count) = b.leader.as_ref().and_then(|l| load.get_mut(l)) {
            *count += 1;
        }
    }
    load
}

fn least_loaded(load: &BTreeMap<String, usize>) -> Option<String> {
    load.iter()
        .min_by_key(|(n, c)| (**c, (*n).clone()))
        .map(|(n, _)| n.clone())
}

/// Buckets with no live leader, each given to the live node leading the fewest.
pub fn plan_orphans(state: &MetaState) -> Vec<(String, String)> {
    plan_orphans_without(state, &[])
}

/// [`plan_orphans`] with the nodes `down` counted as dead (about to be declared so).
pub fn plan_orphans_without(state: &MetaState, down: &[String]) -> Vec<(String, String)> {
    let mut load = load_without(state, down);
    let mut out = Vec::new();
    for (key, b) in &state.buckets {
        let live = b.leader.as_ref().is_some_and(|l| load.contains_key(l));
        if live {
            continue;
        }
        let Some(node) = least_loaded(&load) else {
            return out;
        };
        *load.entry(node.clone()).or_default() += 1;
        out.push((key.clone(), node));
    }
    out
}

/// The fewest moves that leave every live node within one bucket of the others.
pub fn plan_rebalance(state: &MetaState) -> Vec<(String, String)> {
    let mut load = load(state);
    let mut moves = Vec::new();
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, b) in &state.buckets {
        if let Some(l) = b.leader.as_ref().filter(|l| load.contains_key(*l)) {
            by_node.entry(l.clone()).or_default().push(key.clone());
        }
    }
    loop {
        let (Some((max_node, max)), Some((min_node, min))) = (
            load.iter()
                .max_by_key(|(n, c)| (**c, std::cmp::Reverse((*n).clone())))
                .map(|(n, c)| (n.clone(), *c)),
            load.iter()
                .min_by_key(|(n, c)| (**c, (*n).clone()))
                .map(|(n, c)| (n.clone(), *c)),
        ) else {
            return moves;
        };
        if max <= min + 1 {
            return moves;
        }
        let Some(bucket) = by_node.get_mut(&max_node).and_then(|v| v.pop()) else {
            return moves;
        };
        if let Some(c) = load.get_mut(&max_node) {
            *c -= 1;
        }
        *load.entry(min_node.clone()).or_default() += 1;
        moves.push((bucket, min_node));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{BucketState, NodeInfo};
    use mink_types::TableBucket;

    fn state(leaders: &[Option<&str>], nodes: &[(&str, bool)]) -> MetaState {
        let mut s = MetaState::default();
        for (n, alive) in nodes {
            s.nodes.insert(
                n.to_string(),
                NodeInfo {
                    flight_addr: String::new(),
                    kafka_addr: String::new(),
                    incarnation: 1,
                    alive: *alive,
                },
            );
        }
        for (i, l) in leaders.iter().enumerate() {
            let bucket = TableBucket::new(1, None, i as u32);
            s.buckets.insert(
                bucket.stream_name(),
                BucketState {
                    bucket,
                    leader: l.map(str::to_string),
                    epoch: 1,
                },
            );
        }
        s
    }

    #[test]
    fn orphans_go_to_the_least_loaded_live_nodes() {
        let s = state(
            &[Some("a"), Some("a"), None, Some("dead"), None],
            &[("a", true), ("b", true), ("dead", false)],
        );
        let plan = plan_orphans(&s);
        let to: Vec<&str> = plan.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(to, vec!["b", "b", "a"]);
        // With `a` about to be declared dead, its buckets are orphans too.
        let plan = plan_orphans_without(&s, &["a".to_string()]);
        let to: Vec<&str> = plan.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(to, vec!["b"; 5]);
    }

    #[test]
    fn rebalance_moves_the_fewest_buckets() {
        let s = state(&[Some("a"); 6], &[("a", true), ("b", true), ("c", true)]);
        let moves = plan_rebalance(&s);
        assert_eq!(moves.len(), 4);
        let to_b = moves.iter().filter(|(_, n)| n == "b").count();
        let to_c = moves.iter().filter(|(_, n)| n == "c").count();
        assert_eq!((to_b, to_c), (2, 2));
        let balanced = state(
            &[Some("a"), Some("b"), Some("c"), Some("a")],
            &[("a", true), ("b", true), ("c", true)],
        );
        assert!(plan_rebalance(&balanced).is_empty());
    }
}
