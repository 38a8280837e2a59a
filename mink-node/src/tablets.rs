//! The tablet manager: which buckets this node has open, opening them, and letting
//! them go.
//!
//! - **Opening is per bucket and runs on its own task.** A request for a bucket being
//!   opened waits at most [`OPEN_WAIT`] and then answers `Unavailable`; other buckets,
//!   and the admin endpoint, never wait for it. A caller that goes away does not
//!   cancel the open (a cancelled open could leave the stream half-opened), and an
//!   open that fails is retried by the next request.
//! - **Leadership moves are handovers.** When the metadata view says another node
//!   leads a bucket this node has open, the tablet is dropped at once (no more writes)
//!   and its stream closed cleanly, so the new leader opens it without fencing anyone.
//!   A new leader whose stream is still held by a live node waits up to
//!   [`handover_wait`] for that close before it takes the stream over (fencing).
//! - **Background duties** run per open tablet: log TTL trim, writer-state
//!   checkpoints (so the next open reads only what came after) and, for primary-key
//!   tables, KV snapshots every `kv.snapshot_interval_ms` when the bucket changed
//!   (recorded in the metadata log). They stop when the tablet is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use mink_kv::{KvStore, KvTablet, SnapshotStore};
use mink_log::LogTablet;
use mink_meta::MetaNode;
use mink_meta::TableInfo;
use mink_types::{MinkError, Result, TableBucket};
use mink_wal::StreamStore;
use tokio::sync::watch;

use crate::MinkConfig;

/// How long a request waits for a bucket being opened before it answers `Unavailable`.
pub const OPEN_WAIT: Duration = Duration::from_secs(3);

/// How long a new leader waits for the previous leader, alive, to close the bucket's
/// stream (a handover) before it takes the stream over and fences that node's WAL, at
/// least. An idle previous leader learns of the move at its next metadata listing,
/// up to `meta.tail_idle_interval_max_ms` later, so the wait is never shorter than
/// that plus [`HANDOVER_CLOSE_MARGIN`].
pub const HANDOVER_WAIT: Duration = Duration::from_secs(3);

/// What a previous leader has for closing the stream once it knows (a flush, a last
/// compaction, one metadata append).
pub const HANDOVER_CLOSE_MARGIN: Duration = Duration::from_secs(2);

/// How often a handover that waits reads the previous owner's generation claims.
const CLAIMS_READ_EVERY: Duration = Duration::from_secs(1);

/// How long a new leader waits for a live previous leader's handover.
pub fn handover_wait(config: &MinkConfig) -> Duration {
    HANDOVER_WAIT
        .max(Duration::from_millis(config.meta.tail_idle_interval_max_ms) + HANDOVER_CLOSE_MARGIN)
}

#[derive(Clone)]
pub(crate) enum Tablet {
    Log(LogTablet),
    Kv(KvTablet),
}

impl Tablet {
    pub(crate) fn log(&self) -> &LogTablet {
        match self {
            Tablet::Log(l) => l,
            Tablet::Kv(k) => k.log(),
        }
    }

    fn failed(&self) -> bool {
        match self {
            Tablet::Log(l) => l.failure().is_some(),
            Tablet::Kv(k) => k.failure().is_some() || k.log().failure().is_some(),
        }
    }
}

/// A tablet being opened (its stream recovered, its KV state restored): counted in
/// `mink_node_tablets_opening` while it lasts, timed into `mink_node_tablet_open_seconds`.
struct OpeningTablet(std::time::Instant);

impl OpeningTablet {
    fn start() -> Self {
        metrics::gauge!("mink_node_tablets_opening").increment(1.0);
        Self(std::time::Instant::now())
    }
}

/// Tablet opens taking at least this long are logged with their duration.
const SLOW_OPEN: Duration = Duration::from_secs(1);

impl Drop for OpeningTablet {
    fn drop(&mut self) {
        metrics::gauge!("mink_node_tablets_opening").decrement(1.0);
        metrics::histogram!("mink_node_tablet_open_seconds").record(self.0.elapsed().as_secs_f64());
    }
}

type OpenOutcome = Option<std::result::Result<(), MinkError>>;

enum Slot {
    Open {
        epoch: u64,
        /// Schema versions the tablet knows.
        versions: usize,
        tablet: Tablet,
        /// Dropped (or set) when the tablet is let go: its background duties stop.
        _stop: watch::Sender<bool>,
    },
    Opening {
        epoch: u64,
        done: watch::Receiver<OpenOutcome>,
    },
}

/// The node's open tablets and the s3stream service they live on.
pub(crate) struct Tablets {
    config: MinkConfig,
    meta: MetaNode,
    kv: Arc<dyn KvStore>,
    /// What the KV tablets' prewrite buffers hold together (`kv.prewrite_buffers_bytes_max`).
    write_back: Arc<mink_kv::WriteBackBudget>,
    streams: RwLock<StreamStore>,
    slots: Mutex<HashMap<TableBucket, Slot>>,
}

impl Tablets {
    pub(crate) fn new(
        config: MinkConfig,
        meta: MetaNode,
        streams: StreamStore,
        kv: Arc<dyn KvStore>,
    ) -> Self {
        Self {
            write_back: mink_kv::WriteBackBudget::new(config.kv.prewrite_buffers_bytes_max),
            config,
            meta,
            kv,
            streams: RwLock::new(streams),
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<TableBucket, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn streams(&self) -> StreamStore {
        self.streams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts a new WAL generation in place of a failed one and lets every tablet go:
    /// each bucket reopens on its next request, on the new generation.
    pub(crate) fn replace_streams(&self, streams: StreamStore) {
        let mut slots = self.slots();
        *self.streams.write().unwrap_or_else(|e| e.into_inner()) = streams;
        slots.clear();
    }

    /// Open tablets (for gauges and stats).
    pub(crate) fn open_count(&self) -> usize {
        self.slots()
            .values()
            .filter(|s| matches!(s, Slot::Open { .. }))
            .count()
    }

    /// The open tablets' logs, without opening anything (for stats).
    pub(crate) fn open_logs(&self) -> Vec<(TableBucket, LogTablet)> {
        self.slots()
            .iter()
            .filter_map(|(bucket, slot)| match slot {
                Slot::Open { tablet, .. } => Some((*bucket, tablet.log().clone())),
                Slot::Opening { .. } => None,
            })
            .collect()
    }

    /// The tablet of `bucket` under `epoch` (the caller checked that this node leads
    /// it), opening it when needed; `table` is the bucket's table as this node knows it.
    pub(crate) async fn get(
        self: &Arc<Self>,
        bucket: TableBucket,
        epoch: u64,
        table: TableInfo,
    ) -> Result<Tablet> {
        let mut done = {
            let mut slots = self.slots();
            match slots.get_mut(&bucket) {
                Some(Slot::Open {
                    epoch: e,
                    versions,
                    tablet,
                    ..
                }) if *e == epoch && !tablet.failed() => {
                    // The table's compression may have been altered (a store of a byte).
                    tablet
                        .log()
                        .set_compression(table.descriptor.properties.compression);
                    if *versions != table.schemas.len() {
                        // The table was altered: teach the tablet the new schema.
                        match tablet {
                            Tablet::Log(l) => {
                                for schema in &table.schemas {
                                    l.register_schema(schema.clone());
                                }
                            }
                            Tablet::Kv(k) => {
                                k.update_table(table.descriptor.clone(), table.schemas.clone())?
                            }
                        }
                        *versions = table.schemas.len();
                    }
                    return Ok(tablet.clone());
                }
                Some(Slot::Opening { epoch: e, done }) if *e == epoch => done.clone(),
                _ => {
                    // Absent, failed, or under an older epoch: open it (again).
                    let (tx, rx) = watch::channel(None);
                    slots.insert(
                        bucket,
                        Slot::Opening {
                            epoch,
                            done: rx.clone(),
                        },
                    );
                    let this = self.clone();
                    tokio::spawn(async move {
                        let outcome = this.open(bucket, epoch, table).await;
                        let _ = tx.send(Some(outcome));
                    });
                    rx
                }
            }
        };
        let waited = tokio::time::timeout(OPEN_WAIT, done.wait_for(|d| d.is_some())).await;
        let outcome = match waited {
            Ok(Ok(outcome)) => outcome.clone(),
            Ok(Err(_)) => Some(Err(MinkError::Unavailable(format!(
                "{bucket} is being opened"
            )))),
            Err(_) => {
                return Err(MinkError::Unavailable(format!(
                    "{bucket} is being opened (recovering its log); retry"
                )));
            }
        };
        match outcome {
            Some(Ok(())) => match self.slots().get(&bucket) {
                Some(Slot::Open {
                    epoch: e, tablet, ..
                }) if *e == epoch => Ok(tablet.clone()),
                _ => Err(MinkError::Unavailable(format!(
                    "{bucket} moved while it was opened; retry"
                ))),
            },
            Some(Err(e)) => Err(e),
            None => Err(MinkError::Unavailable(format!("{bucket} is being opened"))),
        }
    }

    /// Opens `bucket` and installs it; on failure removes the opening mark, so that the
    /// next request tries again.
    async fn open(
        self: &Arc<Self>,
        bucket: TableBucket,
        epoch: u64,
        table: TableInfo,
    ) -> Result<()> {
        let _opening = OpeningTablet::start();
        let started = tokio::time::Instant::now();
        let opened = self.open_tablet(bucket, epoch, &table).await;
        let took = started.elapsed();
        if took >= SLOW_OPEN && opened.is_err() {
            // A slow success is logged by `open_tablet`, with its phases.
            tracing::info!(%bucket, epoch, took_ms = took.as_millis() as u64, "a slow tablet open that failed");
        }
        let mut slots = self.slots();
        let ours =
            matches!(slots.get(&bucket), Some(Slot::Opening { epoch: e, .. }) if *e == epoch);
        match opened {
            Ok(tablet) if ours => {
                let (stop, stopped) = watch::channel(false);
                self.start_duties(&tablet, &table, stopped);
                slots.insert(
                    bucket,
                    Slot::Open {
                        epoch,
                        versions: table.schemas.len(),
                        tablet,
                        _stop: stop,
                    },
                );
                Ok(())
            }
            Ok(_) => Ok(()), // let go meanwhile (a WAL replacement): nothing to install
            Err(e) => {
                if ours {
                    slots.remove(&bucket);
                }
                tracing::warn!(%bucket, epoch, "opening the tablet failed: {e}");
                Err(e)
            }
        }
    }

    async fn open_tablet(
        &self,
        bucket: TableBucket,
        epoch: u64,
        table: &TableInfo,
    ) -> Result<Tablet> {
        let streams = self.streams();
        let name = bucket.stream_name();
        let pk = table.descriptor.has_primary_key();
        // The local KV store first: while it cannot be opened (reopening after a
        // failed write) the open fails before it opens the stream.
        let ns = if pk {
            Some(self.kv.namespace(&name)?)
        } else {
            None
        };
        // Phases, for the log line of a slow open: the recovery tail after a failover.
        let started = tokio::time::Instant::now();
        let handover_catch_up = self.await_handover(&streams, &name).await?;
        let handover = started.elapsed();
        let stream = streams
            .open_stream(&name, epoch)
            .await
            .map_err(|e| mink_log::wal_error(bucket, e))?;
        let stream_opened = started.elapsed();
        let slow = |kv: Duration| {
            let took = started.elapsed();
            if took >= SLOW_OPEN {
                let ms = |d: Duration| d.as_millis() as u64;
                tracing::info!(
                    %bucket,
                    epoch,
                    took_ms = ms(took),
                    handover_ms = ms(handover),
                    handover_catch_up_ms = ms(handover_catch_up),
                    stream_ms = ms(stream_opened - handover),
                    log_ms = ms(took.saturating_sub(stream_opened + kv)),
                    kv_ms = ms(kv),
                    "a slow tablet open"
                );
            }
        };
        let log = LogTablet::open(
            bucket,
            stream,
            pk,
            table.schemas.clone(),
            self.config.log.clone(),
        )
        .await?;
        let d = &table.descriptor;
        log.set_compression(d.properties.compression);
        let log_append_time = mink_kafka::topic_config::is_log_append_time(&d.properties.custom);
        if table.path.database.as_str() == self.config.kafka.database
            && !pk
            && !d.is_partitioned()
            && !log_append_time
            && mink_kafka::records::starts_as_topic(&d.schema.columns)
        {
            // A topic is found and expired by its records' timestamps, as in Kafka
            // (by commit time when its records carry that: LogAppendTime). Decided by
            // how the table began, so that every owner of the bucket decides the same
            // after columns are added.
            log.index_by_record_time(
                "timestamp",
                Duration::from_millis(self.config.kafka.timestamp_after_max_ms),
            );
        }
        let Some(ns) = ns else {
            slow(Duration::ZERO);
            return Ok(Tablet::Log(log));
        };
        let log_opened = started.elapsed();
        let snapshots = SnapshotStore::new(
            streams.object_store_for(mink_wal::Purpose::KvSnapshot),
            snapshot_prefix(bucket),
            self.config.kv.snapshots_retained as usize,
        );
        let kv = KvTablet::open(
            bucket,
            log,
            ns,
            table.descriptor.clone(),
            table.schemas.clone(),
            Some(snapshots),
        )
        .await?;
        kv.set_write_back_bytes(self.config.kv.prewrite_buffer_bytes_max);
        kv.set_write_back_budget(self.write_back.clone());
        slow(started.elapsed() - log_opened);
        Ok(Tablet::Kv(kv))
    }

    /// Waits (bounded) while the stream is held open by a live node that is not this
    /// one: it is closing the stream in a handover, and fencing it would take down
    /// every other bucket it leads. Decided on a fresh view of the stream metadata:
    /// nothing tails that log on an idle node, so the view may predate the stream's
    /// last open elsewhere (a bucket moved away and back), and a stale "nobody holds
    /// it" would fence the live holder.
    ///
    /// Returns how long the catch-up took (the slow-open log line tells it from the
    /// wait).
    async fn await_handover(&self, streams: &StreamStore, name: &str) -> Result<Duration> {
        let started = tokio::time::Instant::now();
        streams.metadata().catch_up().await.map_err(|e| {
            MinkError::Unavailable(format!(
                "stream {name}: reading the stream metadata before the open: {e}"
            ))
        })?;
        let caught_up = started.elapsed();
        let me = self.meta.node_id().to_string();
        let deadline = tokio::time::Instant::now() + handover_wait(&self.config);
        let mut claims_read: Option<tokio::time::Instant> = None;
        loop {
            let owner = streams
                .metadata()
                .read(|s, _| s.streams.get(name).and_then(|m| m.owner.clone()));
            let Some(owner) = owner else {
                return Ok(caught_up);
            };
            if owner.node == me {
                return Ok(caught_up);
            }
            // A generation that was fenced, or replaced by a newer one of its node
            // (a restart, a failed WAL), closes nothing, however alive its node is.
            let node_alive = self
                .meta
                .read(|s| s.nodes.get(&owner.node).is_some_and(|n| n.alive));
            let mut retired = streams.metadata().read(|s, _| s.retired(&owner));
            // A restarted node is alive again at once, but the stream-metadata log
            // names its new generation only at its first open: the claims tell
            // sooner (read at most once a second; a failed read proves nothing). A
            // dead node's need no reading: it closes nothing either way.
            if node_alive
                && !retired
                && claims_read.is_none_or(|at| at.elapsed() >= CLAIMS_READ_EVERY)
            {
                claims_read = Some(tokio::time::Instant::now());
                retired = streams.superseded_by_claim(&owner).await.unwrap_or(false);
            }
            let alive = node_alive && !retired;
            if !alive || tokio::time::Instant::now() >= deadline {
                if alive {
                    tracing::info!(stream = name, %owner, "the previous leader did not hand over in time; taking over");
                }
                return Ok(caught_up);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = streams.metadata().catch_up().await;
        }
    }

    /// Starts the tablet's background duties: TTL trim, and KV snapshots.
    fn start_duties(&self, tablet: &Tablet, table: &TableInfo, stopped: watch::Receiver<bool>) {
        let stop = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        {
            let tablet = tablet.clone();
            let log = tablet.log().clone();
            let meta = self.meta.clone();
            let meta_for_kv = self.meta.clone();
            let table_id = table.id;
            let rx = stopped.clone();
            let grace = Duration::from_millis(self.config.lake.trim_grace_ms);
            tokio::spawn(async move {
                let stream = log.bucket().stream_name();
                // Offsets the metadata log recorded for this bucket's lake, and when
                // this tablet first saw each.
                let seen = std::sync::Mutex::new(std::collections::VecDeque::<(
                    std::time::Instant,
                    i64,
                )>::new());
                // The TTL, and for a lake-tiered table an offset the trim must not
                // pass: the newest the metadata log has recorded for the bucket's lake
                // (which never runs ahead of the lake) for at least `lake.trim_grace_ms`
                // (a `Union` read that began on the snapshot before still finds the
                // log rows it needs). Nothing the lake lacks is trimmed.
                let policy = move || {
                    let (ttl, pointer) = meta.read(|s| {
                        let Some(t) = s.tables.get(&table_id) else {
                            return (None, None);
                        };
                        let props = &t.descriptor.properties;
                        let pointer = props.lake.enabled.then(|| {
                            s.lake_snapshots
                                .get(&table_id)
                                .and_then(|p| p.log_offsets.get(&stream).copied())
                                .unwrap_or(0)
                        });
                        (props.log_ttl.0, pointer)
                    });
                    let keep_from = pointer.map(|offset| {
                        let now = std::time::Instant::now();
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        if seen.back().is_none_or(|(_, o)| *o != offset) {
                            seen.push_back((now, offset));
                        }
                        while seen.len() >= 2 && now.duration_since(seen[1].0) >= grace {
                            seen.pop_front();
                        }
                        match seen.front() {
                            Some((at, o)) if now.duration_since(*at) >= grace => *o,
                            _ => 0,
                        }
                    });
                    (ttl, keep_from)
                };
                match tablet {
                    Tablet::Log(log) => log.run_ttl(policy, stop(rx)).await,
                    // A primary-key table's changelog is trimmed only below a durable
                    // KV snapshot (one is written first when the trim needs it).
                    Tablet::Kv(kv) => {
                        let record = record_kv_snapshot(meta_for_kv, kv.bucket());
                        kv.run_ttl(policy, record, stop(rx)).await
                    }
                }
            });
        }
        {
            let log = tablet.log().clone();
            let rx = stopped.clone();
            tokio::spawn(async move { log.run_checkpoints(stop(rx)).await });
        }
        // Periodic KV snapshots, each recorded in the metadata log. (They were off while
        // an interop run with a 1 ms interval read a snapshot claiming more than it
        // held; that was two tablets sharing a KV namespace, fixed by the namespace
        // claim, and the KV model test checks every snapshot against the model.)
        if let Tablet::Kv(kv) = tablet {
            let kv = kv.clone();
            let meta = self.meta.clone();
            let interval = Duration::from_millis(self.config.kv.snapshot_interval_ms.max(1));
            let rx = stopped;
            tokio::spawn(async move {
                let record = record_kv_snapshot(meta, kv.bucket());
                kv.run_snapshots(interval, record, stop(rx)).await;
            });
        }
    }

    /// Streams the log says this node's WAL owns, of buckets it does not lead, that no
    /// tablet holds: ghosts of opens whose outcome was lost (or tablets already let
    /// go). They are adopted and closed, so that the new leader needs no fence and the
    /// WAL floor they hold down rises again.
    fn close_ghosts(&self, me: &str) {
        let streams = self.streams();
        let wal = streams.wal_id().clone();
        let held: std::collections::HashSet<String> =
            self.slots().keys().map(|b| b.stream_name()).collect();
        let owned: Vec<(String, u64)> = streams.metadata().read(|s, _| {
            s.owned_by(&wal)
                .map(|(name, m)| (name.clone(), m.epoch))
                .collect()
        });
        for (name, epoch) in owned {
            let led_here = self.meta.read(|s| {
                s.buckets
                    .get(&name)
                    .is_some_and(|b| b.leader.as_deref() == Some(me))
            });
            // A close of ours that failed unsettled is the compactor's to finish.
            if led_here || held.contains(&name) || streams.is_closing(&name) {
                continue;
            }
            let streams = streams.clone();
            tokio::spawn(async move {
                match streams.open_stream(&name, epoch).await {
                    // Under the epoch it adopted: should the bucket come back and its
                    // stream be reopened in place meanwhile, the close is refused
                    // rather than closing the stream under its new tablet.
                    Ok(stream) => match stream.close_under(epoch).await {
                        Ok(()) => tracing::info!(
                            stream = name,
                            "closed a stream of a bucket led elsewhere"
                        ),
                        Err(e) => tracing::debug!(stream = name, "closing a ghost stream: {e}"),
                    },
                    Err(e) => tracing::debug!(stream = name, "adopting a ghost stream: {e}"),
                }
            });
        }
    }

    /// Lets go of every open tablet whose bucket this node no longer leads, closing its
    /// stream cleanly, whenever the metadata view changes; until `shutdown`.
    pub(crate) async fn run_handovers(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.meta.subscribe();
        loop {
            let me = self.meta.node_id().to_string();
            let lost: Vec<(TableBucket, Tablet)> = {
                let mut slots = self.slots();
                let gone: Vec<TableBucket> = slots
                    .iter()
                    .filter(|(bucket, slot)| {
                        matches!(slot, Slot::Open { .. })
                            && self.meta.read(|s| {
                                s.buckets
                                    .get(&bucket.stream_name())
                                    .is_none_or(|b| b.leader.as_deref() != Some(me.as_str()))
                            })
                    })
                    .map(|(b, _)| *b)
                    .collect();
                gone.into_iter()
                    .filter_map(|b| match slots.remove(&b) {
                        Some(Slot::Open { tablet, .. }) => Some((b, tablet)),
                        _ => None,
                    })
                    .collect()
            };
            self.close_ghosts(&me);
            for (bucket, tablet) in lost {
                tokio::spawn(async move {
                    metrics::counter!("mink_node_handovers_total").increment(1);
                    match tablet.log().close().await {
                        Ok(()) => tracing::info!(%bucket, "handed the bucket over (stream closed)"),
                        Err(e) => {
                            tracing::warn!(%bucket, "closing the stream of a bucket led elsewhere now: {e}")
                        }
                    }
                });
            }
            // Also on a timer: a bucket lost while it was being opened is let go once
            // its open completes, even if nothing changes afterwards.
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                changed = changes.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// Records each KV snapshot of `bucket` in the metadata log (`SetKvSnapshot`), unless
/// the log already points at one as new; in the background, so that a slow proposal
/// holds no duty up.
fn record_kv_snapshot(
    meta: MetaNode,
    bucket: TableBucket,
) -> impl Fn(mink_kv::SnapshotInfo) + Clone {
    move |info: mink_kv::SnapshotInfo| {
        let meta = meta.clone();
        tokio::spawn(async move {
            let snapshot_id = info.log_offset.max(0) as u64;
            let newer = meta.read(|s| {
                s.kv_snapshots
                    .get(&bucket.stream_name())
                    .is_none_or(|p| p.snapshot_id < snapshot_id)
            });
            if !newer {
                return;
            }
            let pointer = snapshot_pointer(&info);
            let command = mink_meta::MetaCommand::SetKvSnapshot {
                bucket: bucket.stream_name(),
                pointer,
            };
            if let Err(e) = meta.propose(command).await {
                tracing::debug!(%bucket, "KV snapshot pointer not recorded: {e}");
            }
        });
    }
}

/// Where a bucket's KV snapshots live.
pub(crate) fn snapshot_prefix(bucket: TableBucket) -> String {
    format!(
        "kv/{}/{}/{}",
        bucket.table_id,
        bucket
            .partition_id
            .map_or("-".to_string(), |p| p.to_string()),
        bucket.bucket
    )
}

/// The metadata log's pointer to a KV snapshot just written: its id is the offset it
/// covers (snapshots of a bucket are ordered by it).
pub(crate) fn snapshot_pointer(
    info: &mink_kv::SnapshotInfo,
) -> mink_meta::state::KvSnapshotPointer {
    mink_meta::state::KvSnapshotPointer {
        snapshot_id: info.log_offset.max(0) as u64,
        log_offset: info.log_offset,
        location: info.location.clone(),
        written_at_ms: Some(info.written_at_ms),
        bytes: Some(info.bytes),
    }
}
