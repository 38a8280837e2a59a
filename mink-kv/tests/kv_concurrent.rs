//! A concurrent model test of the KV tablet: writers race Puts (upserts, deletes,
//! partial updates) on one small key set of one bucket, idempotent writers with
//! sequences and plain ones, while the WAL under it meets seeded faults (latency,
//! jitter, failed and ambiguous uploads with a short retry budget, so failures do reach
//! the tablet), the tablet is reopened under new epochs (in place on the same node and
//! its KV store, on the other node, after a clean handover), nodes crash and come back
//! on the same local disk or a fresh one, a failed WAL is replaced by a new generation,
//! a node's local KV store refuses a few writes (a full disk: the store writes of Puts,
//! snapshots, releases and replays fail), and KV snapshots, releases of the write-back
//! rows (an idle bucket under node pressure), compactions and lookups race the writes.
//! Interleavings are chosen by the seed (a current-thread runtime with paused time, so
//! a seed replays).
//!
//! The changelog is the source of truth for which Puts landed; the model is the merge
//! engine of the seed's table (`last_row`, `first_row`, `versioned`, `aggregation`),
//! written here independently of `mink_kv::merge`. After the faults stop, a fresh node
//! takes the bucket over, and the checker walks the changelog from its start:
//! - every batch is the changelog of exactly one Put (an idempotent writer's by its
//!   writer id and sequence, a plain writer's by its offsets when acknowledged, else by
//!   its content), and equals what the merge engine makes of that Put over the state
//!   of every batch before it (`+I`, `-U`/`+U`, `-D`, nothing when unchanged);
//! - no Put lands twice (a retried sequence is never applied twice);
//! - every acknowledged Put is in the changelog, at the offsets it was answered with;
//!   a Put whose outcome was unknown (an error, a cancelled call) may or may not be;
//! - every acknowledged Put that changed nothing (an empty offset range at `at`)
//!   changes nothing over the state of the batches below `at`, and `at` is a batch
//!   boundary of the log (what it rested on became durable);
//! - replaying the changelog (`+I`/`+U` put, `-D` delete) gives the model's state, and
//!   lookups on the tablet reopened from the log alone, from the newest snapshot plus
//!   replay, and from each node's local store plus replay all answer that state;
//! - every snapshot in object storage holds exactly the state at its offset;
//! - every lookup made while the writers ran (on the bucket's current, unfailed
//!   tablet, after each acknowledgement and at random times) answered exactly the state
//!   at that tablet's high watermark, and that high watermark covered every Put
//!   acknowledged before it;
//! - no Put hung (a retry waiting forever), no task panicked.
//!
//! `MINK_MODEL_SEEDS=N` runs seeds `0..N` (default 30), `MINK_MODEL_SEED=S` replays
//! one; a failure names its seed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use mink_kv::{
    KvBackend, KvStore, KvTablet, PutRequest, SnapshotStore, WriteBackBudget, open_kv_store,
};
use mink_log::{LogBatch, LogConfig, LogTablet, NO_WRITER};
use mink_types::{ChangeType, MinkError, TableBucket};
use mink_wal::fault::{FaultConfig, FaultyStore, VirtualClock};
use mink_wal::{StreamStore, WalConfig};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod failing_store;
mod kv_model;

use failing_store::{FailingStore, STORE_FAULT, StoreFaults};

use kv_model::{
    Change, Engine, PutSpec, State, Val, apply, merge, random_put, request, rows_of, schema,
};

const BUCKET: TableBucket = TableBucket {
    table_id: 1,
    partition_id: None,
    bucket: 0,
};
const STREAM: &str = "t1-b0";
const NODES: usize = 2;
/// Writers with an idempotent writer id and sequences, and plain ones.
const IDEMPOTENT_WRITERS: usize = 3;
const PLAIN_WRITERS: usize = 2;
/// Keys every writer touches.
const SHARED_KEYS: [i64; 5] = [0, 1, 2, 3, 4];
/// Keys only one writer touches: `100 * (writer + 1) + i` for `i` below this (more
/// for `first_row`, where a key is written once and then never changes).
fn private_keys(engine: Engine) -> i64 {
    match engine {
        Engine::FirstRow => 40,
        _ => 3,
    }
}
/// Attempts of one sequence before an idempotent writer gives it up and retires (with
/// backoff, long enough to outlast a reopen most of the time, as a client's retries do).
const ATTEMPTS_MAX: u32 = 6;
/// Virtual time during which faults and reopens race the writers.
const CHAOS: Duration = Duration::from_secs(3);
/// A Put (or a task at the end) that takes longer than this has hung.
const HUNG: Duration = Duration::from_secs(60);
/// How long the controller may take to finish after the stop: it waits for each of its
/// own tasks up to [`HUNG`] (a restart retrying opens through faults takes a while of
/// virtual time), so one bound of `HUNG` for all of them together was too tight (seed
/// 75 of 100 reported a hang that was only the sum of a few slow tasks).
const CONTROLLER_HUNG: Duration = Duration::from_secs(600);

static PANICKED: AtomicBool = AtomicBool::new(false);

fn wal_config() -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        segment_bytes_max: 4096,
        dead_wal_grace_ms: 0,
        // Short: an upload that keeps failing fails the WAL, and the tablet with it.
        upload_retry_budget_ms: 200,
        inflight_uploads_max: 3,
        ..Default::default()
    }
}

fn faults(seed: u64) -> FaultConfig {
    FaultConfig {
        put_latency: Duration::from_millis(2),
        get_latency: Duration::from_millis(1),
        list_latency: Duration::from_millis(1),
        delete_latency: Duration::from_millis(1),
        jitter: Duration::from_millis(6),
        put_failure_rate: 0.03,
        put_ambiguous_rate: 0.03,
        put_conflict_rate: 0.02,
        get_failure_rate: 0.01,
        seed,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------
// The workload.

fn keys_of(engine: Engine, writer: usize) -> Vec<i64> {
    let mut keys = SHARED_KEYS.to_vec();
    keys.extend((0..private_keys(engine)).map(|i| 100 * (writer as i64 + 1) + i));
    keys
}

fn all_keys(engine: Engine) -> Vec<i64> {
    let mut keys = SHARED_KEYS.to_vec();
    for w in 0..IDEMPOTENT_WRITERS + PLAIN_WRITERS {
        keys.extend(keys_of(engine, w).split_off(SHARED_KEYS.len()));
    }
    keys
}

fn lookup(tablet: &KvTablet, keys: &[i64]) -> mink_types::Result<State> {
    let batch = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(keys.to_vec())) as ArrayRef,
    )])?;
    let found = tablet.lookup(&batch)?;
    Ok(rows_of(&found.batch).into_iter().collect())
}

// ---------------------------------------------------------------------------------
// The cluster under test.

/// One incarnation of a node: its view of the shared store, its s3stream service and
/// its local KV store.
#[derive(Clone)]
struct Incarnation {
    /// Tells incarnations of a node apart.
    id: u64,
    faulty: FaultyStore,
    streams: StreamStore,
    kv: Arc<dyn KvStore>,
    /// How many of the local store's next writes fail, as on a full disk.
    store_faults: Arc<StoreFaults>,
    dir: PathBuf,
}

/// The bucket's tablet as a node holds it. Holding the node's KV store too tells when
/// every user of a crashed node's store is gone (its disk can then be reopened); a
/// task must own the whole of it (an `async move` block that uses only `held.tablet`
/// captures only that field).
#[derive(Clone)]
struct Held {
    tablet: KvTablet,
    epoch: u64,
    node: usize,
    _kv: Arc<dyn KvStore>,
}

impl Held {
    fn failed(&self) -> bool {
        self.tablet.failure().is_some()
    }
}

struct PutRecord {
    spec: PutSpec,
    writer_id: i64,
    sequence: i64,
    /// The offsets it was acknowledged at (an empty range for a Put that changed
    /// nothing); `None` while unknown.
    acked: Option<(i64, i64)>,
}

/// A lookup of `keys` on the current tablet, at its high watermark.
struct Seen {
    high_watermark: i64,
    keys: Vec<i64>,
    state: State,
    why: &'static str,
}

#[derive(Default)]
struct Model {
    engine: Option<Engine>,
    backend: Option<KvBackend>,
    /// The tablets' prewrite bound (`KvTablet::set_write_back_bytes`): 0 writes the
    /// store after every Put; the others keep durable rows ahead of it (`u64::MAX - 1`:
    /// unbounded, but under a node budget of 3,000 bytes).
    write_back: u64,
    epoch: u64,
    next_writer_id: i64,
    next_put: u64,
    nodes: Vec<Option<Incarnation>>,
    current: Option<Held>,
    puts: BTreeMap<u64, PutRecord>,
    by_sequence: HashMap<(i64, i64), u64>,
    seen: Vec<Seen>,
    violations: Vec<String>,
    events: BTreeMap<&'static str, u64>,
    /// What happened when (virtual ms), printed for a failed seed with
    /// `MINK_MODEL_TRACE=1`.
    trace: Vec<String>,
    started: Option<tokio::time::Instant>,
}

impl Model {
    fn trace(&mut self, what: impl FnOnce() -> String) {
        if std::env::var_os("MINK_MODEL_TRACE").is_some() {
            let at = self.started.map_or(0, |s| s.elapsed().as_millis());
            let line = format!("{at:>6} ms  {}", what());
            if std::env::var_os("MINK_MODEL_TRACE").is_some_and(|v| v == "live") {
                eprintln!("{line}");
            }
            self.trace.push(line);
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.events.entry(what).or_default() += 1;
    }

    fn engine(&self) -> Engine {
        self.engine.unwrap_or(Engine::LastRow)
    }
}

type Shared = Arc<Mutex<Model>>;

fn lock(model: &Shared) -> std::sync::MutexGuard<'_, Model> {
    model.lock().unwrap_or_else(|e| e.into_inner())
}

fn snapshots(store: Arc<dyn ObjectStore>) -> SnapshotStore {
    // Every snapshot is kept: the checker reads each. Small parts: the snapshots
    // go up as multipart uploads of a few parts, through the faults.
    SnapshotStore::new(store, "kv/t1/b0", 1_000_000).with_part_bytes(256)
}

/// Starts a WAL generation of `node`, retrying through injected faults as the node
/// does; `None` after `attempts` failures (the node is down).
async fn start_streams(faulty: &FaultyStore, node: usize, attempts: u32) -> Option<StreamStore> {
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    for _ in 0..attempts {
        match StreamStore::open(store.clone(), &format!("n{node}"), wal_config()).await {
            Ok(streams) => return Some(streams),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    None
}

fn open_store(backend: KvBackend, dir: &std::path::Path) -> mink_types::Result<Arc<dyn KvStore>> {
    // The previous incarnation's files are released when its last handle drops; a
    // backend may let go of its lock a moment later.
    for _ in 0..100 {
        if let Ok(kv) = open_kv_store(backend, dir) {
            return Ok(kv);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    open_kv_store(backend, dir)
}

async fn start_node(
    memory: &Arc<dyn ObjectStore>,
    clock: &VirtualClock,
    node: usize,
    seed: u64,
    backend: KvBackend,
    dir: PathBuf,
) -> Incarnation {
    let faulty = FaultyStore::new(memory.clone(), faults(seed)).with_clock(clock.clone());
    let streams = start_streams(&faulty, node, u32::MAX)
        .await
        .expect("a node with faults but not down starts");
    let store_faults = Arc::new(StoreFaults::default());
    let kv = Arc::new(FailingStore {
        inner: open_store(backend, &dir).unwrap(),
        faults: store_faults.clone(),
    });
    Incarnation {
        id: seed,
        faulty,
        streams,
        kv,
        store_faults,
        dir,
    }
}

/// Opens the bucket on `node` under a new epoch; on success the tablet becomes the
/// bucket's current one (unless a newer open won meanwhile).
async fn open_on(model: Shared, node: usize) {
    let (inc, epoch, engine) = {
        let mut m = lock(&model);
        m.epoch += 1;
        (m.nodes[node].clone(), m.epoch, m.engine())
    };
    let Some(inc) = inc else {
        lock(&model).trace(|| format!("no open on n{node} under epoch {epoch}: it is down"));
        return;
    };
    if inc.streams.failure().is_some() {
        // The node replaces a failed WAL with a new generation, keeping its store.
        lock(&model).count("wal replaced");
        lock(&model).trace(|| format!("n{node}: its failed WAL is replaced"));
        let (id, faulty) = (inc.id, inc.faulty.clone());
        drop(inc);
        let Some(streams) = start_streams(&faulty, node, 20).await else {
            return;
        };
        let mut m = lock(&model);
        if let Some(Some(live)) = m.nodes.get_mut(node)
            && live.id == id
            && live.streams.failure().is_some()
        {
            live.streams = streams;
        }
        return;
    }
    let (id, faulty, streams) = (inc.id, inc.faulty.clone(), inc.streams.clone());
    // The local store is taken only once the stream is open: a crash meanwhile must
    // not wait for an open that is still meeting a store that is down.
    drop(inc);
    let same_incarnation = |model: &Shared| {
        lock(model).nodes[node]
            .as_ref()
            .filter(|i| i.id == id)
            .map(|i| i.kv.clone())
            .ok_or_else(|| MinkError::Unavailable(format!("n{node} crashed")))
    };
    let write_back = lock(&model).write_back;
    let opened = async {
        let stream = streams
            .open_stream(STREAM, epoch)
            .await
            .map_err(|e| mink_log::wal_error(BUCKET, e))?;
        let log =
            LogTablet::open(BUCKET, stream, true, vec![schema()], LogConfig::default()).await?;
        let kv = same_incarnation(&model)?;
        let tablet = KvTablet::open(
            BUCKET,
            log,
            kv.namespace(STREAM)?,
            engine.descriptor(),
            vec![schema()],
            Some(snapshots(Arc::new(faulty))),
        )
        .await?;
        tablet.set_write_back_bytes(write_back);
        if write_back == u64::MAX - 1 {
            // Unbounded by the tablet, bounded by its node.
            tablet.set_write_back_budget(WriteBackBudget::new(3_000));
        }
        Ok::<_, MinkError>((tablet, kv))
    }
    .await;
    let mut m = lock(&model);
    m.trace(|| match &opened {
        Ok((t, _)) => format!(
            "open on n{node} under epoch {epoch}: high watermark {}",
            t.log().high_watermark()
        ),
        Err(e) => format!("open on n{node} under epoch {epoch} failed: {e}"),
    });
    match opened {
        Ok((tablet, kv)) => {
            m.count("opened");
            let live = m.nodes[node].as_ref().is_some_and(|i| i.id == id);
            if live && m.current.as_ref().is_none_or(|c| c.epoch < epoch) {
                m.current = Some(Held {
                    tablet,
                    epoch,
                    node,
                    _kv: kv,
                });
            }
        }
        // A store that refuses writes fails the open's replay, as a full disk would.
        Err(MinkError::Internal(e)) if !e.contains(STORE_FAULT) => {
            m.violations.push(format!(
                "open on n{node} under epoch {epoch}: internal error: {e}"
            ));
        }
        Err(_) => m.count("open failed"),
    }
}

/// A crash of `node`: the incarnation is cut off from the store at once; once every
/// user of its local store is gone, the node comes back as a new incarnation on the
/// same disk (its store at whatever offset it had flushed) or on a fresh one.
async fn restart(
    model: Shared,
    world: World,
    old: Incarnation,
    node: usize,
    seed: u64,
    same_disk: bool,
) {
    old.faulty.set_down(true);
    let Incarnation { kv, dir, .. } = old;
    let started = tokio::time::Instant::now();
    let mut drained = true;
    while Arc::strong_count(&kv) > 1 {
        if started.elapsed() > HUNG {
            lock(&model).violations.push(format!(
                "n{node} crashed, and a user of its tablets is still running {HUNG:?} later"
            ));
            drained = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(kv);
    let backend = lock(&model).backend.unwrap_or_default();
    let dir = if same_disk && drained {
        dir
    } else {
        world.root.join(format!("n{node}-{seed}"))
    };
    let fresh = start_node(
        &world.memory,
        &world.clock,
        node,
        seed,
        backend,
        dir.clone(),
    )
    .await;
    let mut m = lock(&model);
    m.trace(|| format!("n{node} restarted on {}", dir.display()));
    m.nodes[node] = Some(fresh);
}

fn record_lookup(model: &Shared, keys: Vec<i64>, why: &'static str) {
    let current = lock(model).current.clone();
    let Some(held) = current else { return };
    if held.failed() {
        // It dropped its staged rows: it must answer no reads until reopened.
        if lookup(&held.tablet, &keys).is_ok() {
            lock(model).violations.push(format!(
                "the failed tablet of epoch {} answered a lookup",
                held.epoch
            ));
        }
        return;
    }
    let high_watermark = held.tablet.log().high_watermark();
    let result = lookup(&held.tablet, &keys);
    let mut m = lock(model);
    match result {
        Ok(state) => m.seen.push(Seen {
            high_watermark,
            keys,
            state,
            why,
        }),
        Err(e) => m.violations.push(format!(
            "a lookup on the tablet of epoch {} failed: {e}",
            held.epoch
        )),
    }
}

enum Attempt {
    /// The bucket has no tablet now (being reopened): nothing was sent.
    NoTablet,
    /// The caller went away mid-Put: perhaps submitted, perhaps not.
    Cancelled,
    Done(mink_types::Result<mink_log::Appended>),
}

/// Runs one Put attempt on the current tablet.
async fn attempt(model: &Shared, rng: &mut StdRng, id: u64, req: PutRequest, who: &str) -> Attempt {
    let Some(held) = lock(model).current.clone() else {
        return Attempt::NoTablet;
    };
    {
        let mut m = lock(model);
        let spec = format!("{:?}", m.puts[&id].spec);
        m.trace(|| format!("{who}: put {id} on epoch {}: {spec}", held.epoch));
    }
    let outcome = attempt_on(model, rng, &held, req, who).await;
    if let Attempt::Done(Err(e)) = &outcome {
        let mut m = lock(model);
        m.count(match e.kind() {
            "fenced" => "put failed: fenced",
            "unavailable" => "put failed: unavailable",
            "storage_failure" => "put failed: storage failure",
            "out_of_order_sequence" => "put failed: out of order",
            _ => "put failed: other",
        });
        if let MinkError::Internal(why) = e {
            m.violations.push(format!(
                "{who}: put {id} failed with an internal error: {why}"
            ));
        }
    }
    lock(model).trace(|| match &outcome {
        Attempt::Done(Ok(a)) => format!(
            "{who}: put {id} acknowledged at {}..={}{}",
            a.first_offset,
            a.last_offset,
            if a.duplicated { " (duplicate)" } else { "" }
        ),
        Attempt::Done(Err(e)) => format!("{who}: put {id} failed: {e}"),
        _ => format!("{who}: put {id} cancelled"),
    });
    outcome
}

async fn attempt_on(
    model: &Shared,
    rng: &mut StdRng,
    held: &Held,
    req: PutRequest,
    who: &str,
) -> Attempt {
    let put = held.tablet.put(req);
    // Now and then the caller goes away mid-Put (a client's timeout).
    if rng.random_bool(0.03) {
        let wait = Duration::from_micros(rng.random_range(0..5_000));
        return match tokio::time::timeout(wait, put).await {
            Ok(outcome) => Attempt::Done(outcome),
            Err(_) => {
                lock(model).count("put cancelled");
                Attempt::Cancelled
            }
        };
    }
    match tokio::time::timeout(HUNG, put).await {
        Ok(outcome) => Attempt::Done(outcome),
        Err(_) => {
            lock(model).violations.push(format!(
                "{who}: a Put on the tablet of epoch {} hung for {HUNG:?}",
                held.epoch
            ));
            Attempt::Cancelled
        }
    }
}

/// Checks, after an acknowledgement, that the current tablet covers it, and records a
/// lookup of every key.
fn after_ack(model: &Shared, acked: &mink_log::Appended, keys: &[i64], who: &str) {
    let current = lock(model).current.clone();
    if let Some(held) = current
        && !held.failed()
    {
        let hw = held.tablet.log().high_watermark();
        if hw <= acked.last_offset {
            lock(model).violations.push(format!(
                "{who}: acknowledged at {}..={}, but the current tablet (epoch {}) has its \
                 high watermark at {hw}",
                acked.first_offset, acked.last_offset, held.epoch
            ));
        }
    }
    record_lookup(model, keys.to_vec(), "after an acknowledgement");
}

fn new_put(model: &Shared, rng: &mut StdRng, keys: &[i64], writer_id: i64, sequence: i64) -> u64 {
    let mut m = lock(model);
    m.next_put += 1;
    let id = m.next_put;
    let spec = random_put(rng, m.engine(), id, keys);
    m.puts.insert(
        id,
        PutRecord {
            spec,
            writer_id,
            sequence,
            acked: None,
        },
    );
    if writer_id != NO_WRITER {
        m.by_sequence.insert((writer_id, sequence), id);
    }
    id
}

fn acknowledge(model: &Shared, id: u64, a: &mink_log::Appended, who: &str) {
    let mut m = lock(model);
    m.count(if a.first_offset > a.last_offset {
        "acked unchanged"
    } else {
        "acked"
    });
    if a.duplicated {
        m.count("answered as a duplicate");
    }
    let record = m.puts.get_mut(&id).expect("a recorded put");
    if let Some(before) = record.acked
        && before != (a.first_offset, a.last_offset)
    {
        let msg = format!(
            "{who}: put {id} acknowledged at {before:?} and again at {:?}",
            (a.first_offset, a.last_offset)
        );
        m.violations.push(msg);
        return;
    }
    record.acked = Some((a.first_offset, a.last_offset));
}

/// A writer's pause between Puts. Without it a run of Puts that change nothing (and
/// so are acknowledged at once) would never let virtual time advance.
async fn think(rng: &mut StdRng) {
    tokio::time::sleep(Duration::from_micros(rng.random_range(100..2_000))).await;
}

async fn idempotent_writer(model: Shared, w: usize, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x1D_E000 + w as u64));
    let keys = keys_of(lock(&model).engine(), w);
    let new_writer = |model: &Shared| {
        let mut m = lock(model);
        m.next_writer_id += 1;
        m.next_writer_id
    };
    let mut writer_id = new_writer(&model);
    let mut sequence = 0;
    'puts: while !stop.load(Ordering::SeqCst) {
        let id = new_put(&model, &mut rng, &keys, writer_id, sequence);
        let req = request(&lock(&model).puts[&id].spec, writer_id, sequence);
        let who = format!("writer {writer_id} sequence {sequence}");
        let mut attempts = 0;
        loop {
            let failed = match attempt(&model, &mut rng, id, req.clone(), &who).await {
                Attempt::NoTablet => {
                    if stop.load(Ordering::SeqCst) {
                        break 'puts;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                Attempt::Done(Ok(a)) => {
                    acknowledge(&model, id, &a, &who);
                    after_ack(&model, &a, &keys, &who);
                    sequence += 1;
                    think(&mut rng).await;
                    break;
                }
                Attempt::Done(Err(MinkError::OutOfOrderSequence { .. })) => {
                    // The leader's window no longer follows this writer: a fresh one.
                    lock(&model).count("out of order");
                    writer_id = new_writer(&model);
                    sequence = 0;
                    break;
                }
                Attempt::Done(Err(_)) => {
                    lock(&model).count("put failed");
                    true
                }
                // Perhaps submitted: retried with the same sequence, as a client does.
                Attempt::Cancelled => false,
            };
            attempts += 1;
            if attempts >= ATTEMPTS_MAX || stop.load(Ordering::SeqCst) {
                // Given up with its outcome unknown: the writer id is retired.
                writer_id = new_writer(&model);
                sequence = 0;
                lock(&model).count("writer retired");
                break;
            }
            if failed {
                let backoff = 5_000 << attempts.min(5);
                let pause = Duration::from_micros(rng.random_range(backoff / 2..backoff));
                tokio::time::sleep(pause).await;
            }
        }
    }
}

async fn plain_writer(model: Shared, w: usize, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x91A1_0000 + w as u64));
    let keys = keys_of(lock(&model).engine(), w);
    let who = format!("plain writer {w}");
    while !stop.load(Ordering::SeqCst) {
        if lock(&model).current.is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let id = new_put(&model, &mut rng, &keys, NO_WRITER, 0);
        let req = request(&lock(&model).puts[&id].spec, NO_WRITER, 0);
        match attempt(&model, &mut rng, id, req, &who).await {
            Attempt::Done(Ok(a)) => {
                acknowledge(&model, id, &a, &who);
                after_ack(&model, &a, &keys, &who);
                think(&mut rng).await;
            }
            Attempt::NoTablet => {}
            // Not retried: a plain writer's retry could apply the rows twice.
            Attempt::Done(Err(_)) | Attempt::Cancelled => {
                lock(&model).count("put failed");
                let pause = Duration::from_micros(rng.random_range(2_000..20_000));
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// What every node incarnation starts from: the shared store, the clock of object
/// ages, the directory of local disks.
#[derive(Clone)]
struct World {
    memory: Arc<dyn ObjectStore>,
    clock: VirtualClock,
    root: PathBuf,
}

struct Controller {
    model: Shared,
    world: World,
    seed: u64,
}

impl Controller {
    async fn run(self, stop: Arc<AtomicBool>) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0xC0_47_20_11);
        let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let mut opening: Option<tokio::task::JoinHandle<()>> = None;
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..25))).await;
            let model = self.model.clone();
            // The node reopens a failed (or missing) tablet on the next request.
            let (current, live): (Option<Held>, Vec<usize>) = {
                let m = lock(&model);
                let live = (0..NODES).filter(|n| m.nodes[*n].is_some()).collect();
                (m.current.clone(), live)
            };
            let idle = opening.as_ref().is_none_or(|t| t.is_finished());
            if idle
                && !live.is_empty()
                && current
                    .as_ref()
                    .is_none_or(|c| c.failed() || c.tablet.log().failure().is_some())
            {
                let n = live[rng.random_range(0..live.len())];
                lock(&model).count("reopen after a failure");
                opening = Some(tokio::spawn(open_on(model.clone(), n)));
                continue;
            }
            let n = rng.random_range(0..NODES);
            match rng.random_range(0..100) {
                // A new epoch: in place on the same node, or a takeover by the other.
                0..=4 => {
                    lock(&model).count("reopen");
                    tasks.push(tokio::spawn(open_on(model, n)));
                }
                // A clean handover: close, then open (perhaps elsewhere).
                5..=7 => {
                    if let Some(held) = current {
                        lock(&model).count("handover");
                        lock(&model).trace(|| {
                            format!("handover: close of epoch {} on n{}", held.epoch, held.node)
                        });
                        tasks.push(tokio::spawn(async move {
                            let closed = held.tablet.log().close().await;
                            lock(&model).trace(|| {
                                format!("handover: close of epoch {}: {closed:?}", held.epoch)
                            });
                            drop(held);
                            open_on(model, n).await;
                        }));
                    }
                }
                8..=9 => {
                    let old = {
                        let mut m = lock(&model);
                        let old = m.nodes[n].take();
                        if old.is_some() {
                            m.count("crash");
                            if m.current.as_ref().is_some_and(|c| c.node == n) {
                                m.current = None;
                            }
                        }
                        old
                    };
                    if let Some(old) = old {
                        lock(&model).trace(|| format!("n{n} crashes"));
                        old.faulty.set_down(true);
                        tasks.push(tokio::spawn(restart(
                            model,
                            self.world.clone(),
                            old,
                            n,
                            rng.random(),
                            rng.random_bool(0.6),
                        )));
                    }
                }
                20..=34 => {
                    if let Some(held) = current {
                        lock(&model).count("snapshot");
                        lock(&model).trace(|| {
                            format!("snapshot by epoch {} on n{}", held.epoch, held.node)
                        });
                        tasks.push(tokio::spawn(async move {
                            let written = held.tablet.snapshot().await;
                            lock(&model)
                                .trace(|| format!("snapshot by epoch {}: {written:?}", held.epoch));
                            match written {
                                Ok(_) => lock(&model).count("snapshot written"),
                                Err(MinkError::Internal(e)) if !e.contains(STORE_FAULT) => {
                                    lock(&model)
                                        .violations
                                        .push(format!("a snapshot failed: internal error: {e}"))
                                }
                                Err(_) => lock(&model).count("snapshot failed"),
                            }
                            // The whole of it (its store too), not only the fields used.
                            drop(held);
                        }));
                    }
                }
                35..=54 => {
                    let keys = all_keys(lock(&model).engine());
                    record_lookup(&model, keys, "at a random time");
                }
                55..=64 => {
                    let streams = lock(&model).nodes[n].as_ref().map(|i| i.streams.clone());
                    if let Some(streams) = streams {
                        lock(&model).count("compact");
                        tasks.push(tokio::spawn(async move {
                            let _ = streams.compact().await;
                        }));
                    }
                }
                65..=74 => {
                    let inc = lock(&model).nodes[n].clone();
                    if let Some(inc) = inc {
                        lock(&model).count("fault burst");
                        lock(&model).trace(|| format!("n{n}: a burst of upload faults"));
                        match rng.random_range(0..3) {
                            0 => inc.faulty.fail_next_puts(rng.random_range(1..4)),
                            1 => inc.faulty.time_out_next_puts(rng.random_range(1..4)),
                            _ => inc.faulty.conflict_after_apply_next_puts(2),
                        }
                    }
                }
                // A stall: uploads are slow for a while (a GC pause, a slow network).
                75..=79 => {
                    let faulty = lock(&model).nodes[n].as_ref().map(|i| i.faulty.clone());
                    if let Some(faulty) = faulty {
                        lock(&model).count("stall");
                        let stall = Duration::from_millis(rng.random_range(20..150));
                        faulty.set_put_delay(Some(Arc::new(move |_| Some(stall))));
                        let resume = Duration::from_millis(rng.random_range(10..100));
                        tasks.push(tokio::spawn(async move {
                            tokio::time::sleep(resume).await;
                            faulty.set_put_delay(None);
                        }));
                    }
                }
                // An idle bucket's rows let go under its node's pressure, beside
                // everything else.
                80..=85 => {
                    if let Some(held) = current {
                        lock(&model).count("release");
                        tasks.push(tokio::spawn(async move {
                            let released = held.tablet.release_write_back().await;
                            lock(&model)
                                .trace(|| format!("release by epoch {}: {released:?}", held.epoch));
                            if let Err(MinkError::Internal(e)) = &released
                                && !e.contains(STORE_FAULT)
                            {
                                lock(&model)
                                    .violations
                                    .push(format!("a release failed: internal error: {e}"));
                            }
                            drop(held);
                        }));
                    }
                }
                // The node's local store refuses its next writes (a full disk).
                86..=89 => {
                    let faults = lock(&model).nodes[n]
                        .as_ref()
                        .map(|i| i.store_faults.clone());
                    if let Some(faults) = faults {
                        let writes = rng.random_range(1..4);
                        lock(&model).count("store write faults");
                        lock(&model)
                            .trace(|| format!("n{n}: its store fails its next {writes} writes"));
                        faults.fail_next(writes);
                    }
                }
                _ => {}
            }
            tasks.retain(|t| !t.is_finished());
        }
        tasks.extend(opening);
        for t in tasks {
            join(&self.model, t, "a controller task").await;
        }
    }
}

async fn join(model: &Shared, task: tokio::task::JoinHandle<()>, what: &str) {
    join_within(model, task, what, HUNG).await
}

async fn join_within(
    model: &Shared,
    task: tokio::task::JoinHandle<()>,
    what: &str,
    hung: Duration,
) {
    match tokio::time::timeout(hung, task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_panic() => {
            PANICKED.store(true, Ordering::SeqCst);
        }
        Ok(Err(_)) => {}
        Err(_) => lock(model)
            .violations
            .push(format!("{what} did not finish within {hung:?} of the stop")),
    }
}

// ---------------------------------------------------------------------------------
// The checker.

/// The whole changelog, from the log start, with the sequence markers of Puts that
/// changed nothing.
async fn changelog(log: &LogTablet) -> mink_types::Result<Vec<LogBatch>> {
    let mut out = Vec::new();
    let mut pos = log.log_start();
    while pos < log.high_watermark() {
        let scan = log.scan_with_markers(pos, 1 << 20).await?;
        let next = scan.next_offset(pos);
        out.extend(scan.batches);
        if next == pos {
            return Err(MinkError::Internal(format!("no progress at {pos}")));
        }
        pos = next;
    }
    Ok(out)
}

/// Per key, the state after each batch that changed it: `(batch end, value)`.
#[derive(Default)]
struct History {
    keys: HashMap<i64, Vec<(i64, Option<Val>)>>,
}

impl History {
    fn at(&self, key: i64, offset: i64) -> Option<Val> {
        self.keys
            .get(&key)
            .and_then(|h| h.iter().rev().find(|(end, _)| *end <= offset))
            .and_then(|(_, v)| v.clone())
    }

    fn state_at(&self, offset: i64) -> State {
        self.keys
            .keys()
            .filter_map(|k| self.at(*k, offset).map(|v| (*k, v)))
            .collect()
    }
}

fn diff(what: &str, got: &State, want: &State) -> Option<String> {
    if got == want {
        return None;
    }
    let mut lines = vec![format!("{what} differs from the model:")];
    let keys: std::collections::BTreeSet<&i64> = got.keys().chain(want.keys()).collect();
    for k in keys {
        let (g, w) = (got.get(k), want.get(k));
        if g != w {
            lines.push(format!("  key {k}: got {g:?}, want {w:?}"));
        }
    }
    Some(lines.join("\n"))
}

/// Walks the changelog through the model; returns the final state and the history.
fn walk(
    engine: Engine,
    batches: &[LogBatch],
    puts: &BTreeMap<u64, PutRecord>,
    by_sequence: &HashMap<(i64, i64), u64>,
    end: i64,
    violations: &mut Vec<String>,
) -> (State, History) {
    let mut state = State::new();
    let mut history = History::default();
    let mut applied: HashSet<u64> = HashSet::new();
    let plain_acked: HashMap<i64, u64> = puts
        .iter()
        .filter(|(_, p)| p.writer_id == NO_WRITER)
        .filter_map(|(id, p)| match p.acked {
            Some((first, last)) if first <= last => Some((first, *id)),
            _ => None,
        })
        .collect();
    let mut unchanged: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for (id, p) in puts {
        if let Some((first, last)) = p.acked
            && first > last
        {
            unchanged.entry(first).or_default().push(*id);
        }
    }
    let check_unchanged = |at: i64, ids: &[u64], state: &State, violations: &mut Vec<String>| {
        for id in ids {
            let (changes, _) = merge(engine, state, &puts[id].spec);
            if !changes.is_empty() {
                violations.push(format!(
                    "put {id} was acknowledged as changing nothing at {at}, but over the \
                         state there it makes {changes:?} ({:?})",
                    puts[id].spec
                ));
            }
        }
    };
    let mut expected_base = batches.first().map_or(0, |b| b.header.base_offset);
    for b in batches {
        let h = &b.header;
        let (base, last) = (h.base_offset, h.end_offset() - 1);
        if base != expected_base {
            violations.push(format!(
                "a batch at {base} where {expected_base} was expected"
            ));
        }
        expected_base = h.end_offset();
        // Puts acknowledged as changing nothing at or below this batch's start.
        while let Some((&at, _)) = unchanged.first_key_value()
            && at <= base
        {
            let ids = unchanged.remove(&at).unwrap_or_default();
            if at < base {
                violations.push(format!(
                    "puts {ids:?} were acknowledged as changing nothing at {at}, which is no \
                     batch boundary of the log"
                ));
            }
            check_unchanged(at, &ids, &state, violations);
        }
        if h.is_marker() {
            // A Put that changed nothing: it must change nothing over the state here,
            // and be in the log once.
            let Some(&id) = by_sequence.get(&(h.writer_id, h.first_sequence)) else {
                if h.writer_id != NO_WRITER {
                    violations.push(format!(
                        "the sequence marker at {base} (writer {}, sequence {}) is no Put's",
                        h.writer_id, h.first_sequence
                    ));
                }
                continue;
            };
            if !applied.insert(id) {
                violations.push(format!(
                    "put {id} is in the log twice, again as a marker at {base}"
                ));
            }
            if let Some(acked) = puts[&id].acked
                && acked != (base + 1, base)
            {
                violations.push(format!(
                    "put {id} was acknowledged at {acked:?} but is a sequence marker at {base}"
                ));
            }
            check_unchanged(base + 1, &[id], &state, violations);
            continue;
        }
        let rows: Vec<Change> = rows_of(&b.batch)
            .into_iter()
            .enumerate()
            .map(|(i, (k, v))| (h.change_type(i), k, v))
            .collect();
        let found = if h.writer_id != NO_WRITER {
            if h.first_sequence != h.last_sequence {
                violations.push(format!(
                    "the batch at {base} covers sequences {}..={}",
                    h.first_sequence, h.last_sequence
                ));
            }
            by_sequence.get(&(h.writer_id, h.first_sequence)).copied()
        } else if let Some(id) = plain_acked.get(&base) {
            Some(*id)
        } else {
            // A plain Put whose outcome was unknown: the one whose changelog this is.
            puts.iter()
                .filter(|(id, p)| {
                    p.writer_id == NO_WRITER && p.acked.is_none() && !applied.contains(id)
                })
                .find(|(_, p)| merge(engine, &state, &p.spec).0 == rows)
                .map(|(id, _)| *id)
        };
        let Some(id) = found else {
            violations.push(format!(
                "the batch at {base}..={last} (writer {}, sequence {}) is no Put's: {rows:?}",
                h.writer_id, h.first_sequence
            ));
            // Apply it as it is, to go on.
            for (ct, k, v) in &rows {
                match ct {
                    ChangeType::Delete => {
                        state.remove(k);
                    }
                    ChangeType::UpdateBefore => {}
                    _ => {
                        state.insert(*k, v.clone());
                    }
                }
            }
            continue;
        };
        let put = &puts[&id];
        if !applied.insert(id) {
            violations.push(format!(
                "put {id} (writer {}, sequence {}) is in the log twice, again at {base}",
                put.writer_id, put.sequence
            ));
        }
        match put.acked {
            Some(acked) if acked != (base, last) => violations.push(format!(
                "put {id} (writer {}, sequence {}) was acknowledged at {acked:?} but is in the \
                 log at {:?}",
                put.writer_id,
                put.sequence,
                (base, last)
            )),
            _ => {}
        }
        let (changes, changed) = merge(engine, &state, &put.spec);
        if changes != rows {
            violations.push(format!(
                "the batch at {base} of put {id} (writer {}, sequence {}) holds {rows:?}; over \
                 the state before it the merge engine makes {changes:?}\n  put: {:?}\n  \
                 state: {:?}",
                put.writer_id,
                put.sequence,
                put.spec,
                put.spec
                    .rows
                    .iter()
                    .map(|r| (r.key, state.get(&r.key)))
                    .collect::<Vec<_>>()
            ));
        }
        apply(&mut state, &changed);
        for (k, v) in changed {
            history.keys.entry(k).or_default().push((h.end_offset(), v));
        }
    }
    for (at, ids) in std::mem::take(&mut unchanged) {
        if at != end {
            violations.push(format!(
                "puts {ids:?} were acknowledged as changing nothing at {at}, but the log ends at \
                 {end}: they rest on state that never became durable"
            ));
        }
        check_unchanged(at, &ids, &state, violations);
    }
    for (id, p) in puts {
        if let Some((first, last)) = p.acked
            && first <= last
            && !applied.contains(id)
        {
            violations.push(format!(
                "put {id} (writer {}, sequence {}) acknowledged at {first}..={last} is not in \
                 the log",
                p.writer_id, p.sequence
            ));
        }
    }
    (state, history)
}

/// The state by replaying the changelog as recovery does (`+I`/`+U` put, `-D` delete).
fn replay(batches: &[LogBatch]) -> State {
    let mut state = State::new();
    for b in batches {
        for (i, (k, v)) in rows_of(&b.batch).into_iter().enumerate() {
            match b.header.change_type(i) {
                ChangeType::Delete => {
                    state.remove(&k);
                }
                ChangeType::UpdateBefore => {}
                _ => {
                    state.insert(k, v);
                }
            }
        }
    }
    state
}

async fn run_seed(seed: u64) -> Result<BTreeMap<&'static str, u64>, String> {
    let engine = Engine::of_seed(seed);
    let backend = if (seed / 5).is_multiple_of(2) {
        KvBackend::Fjall
    } else {
        KvBackend::Redb
    };
    let root = tempfile::tempdir().map_err(|e| e.to_string())?;
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = VirtualClock::new();
    let model: Shared = Arc::new(Mutex::new(Model {
        engine: Some(engine),
        backend: Some(backend),
        write_back: [0, 300, 4_000, u64::MAX, u64::MAX - 1][(seed / 10 % 5) as usize],
        started: Some(tokio::time::Instant::now()),
        ..Default::default()
    }));
    for n in 0..NODES {
        let node = start_node(
            &memory,
            &clock,
            n,
            seed.wrapping_mul(1_000_003).wrapping_add(n as u64),
            backend,
            root.path().join(format!("n{n}")),
        )
        .await;
        lock(&model).nodes.push(Some(node));
    }
    while lock(&model).current.is_none() {
        open_on(model.clone(), 0).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..IDEMPOTENT_WRITERS {
        tasks.push(tokio::spawn(idempotent_writer(
            model.clone(),
            w,
            seed,
            stop.clone(),
        )));
    }
    for w in IDEMPOTENT_WRITERS..IDEMPOTENT_WRITERS + PLAIN_WRITERS {
        tasks.push(tokio::spawn(plain_writer(
            model.clone(),
            w,
            seed,
            stop.clone(),
        )));
    }
    let controller = Controller {
        model: model.clone(),
        world: World {
            memory: memory.clone(),
            clock: clock.clone(),
            root: root.path().to_path_buf(),
        },
        seed,
    };
    tasks.push(tokio::spawn(controller.run(stop.clone())));
    tokio::time::sleep(CHAOS).await;
    stop.store(true, Ordering::SeqCst);
    let controller = tasks.pop();
    for t in tasks {
        join(&model, t, "a writer").await;
    }
    if let Some(controller) = controller {
        join_within(&model, controller, "the controller", CONTROLLER_HUNG).await;
    }

    // Settle: faults off; every tablet let go, so that each node's store can be
    // reopened by the checker.
    let nodes: Vec<Incarnation> = {
        let mut m = lock(&model);
        m.current = None;
        m.nodes.iter().flatten().cloned().collect()
    };
    for n in &nodes {
        n.faulty.set_put_delay(None);
        n.faulty.set_config(FaultConfig::default());
        n.faulty.fail_next_puts(0);
        n.faulty.time_out_next_puts(0);
        n.faulty.conflict_after_apply_next_puts(0);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut m = std::mem::take(&mut *lock(&model));
    let mut violations = std::mem::take(&mut m.violations);
    let checker = StreamStore::open(memory.clone(), "checker", wal_config())
        .await
        .map_err(|e| format!("checker start: {e}"))?;
    let stream = checker
        .open_stream(STREAM, m.epoch + 1)
        .await
        .map_err(|e| format!("the checker cannot take the bucket over: {e}"))?;
    let log = LogTablet::open(BUCKET, stream, true, vec![schema()], LogConfig::default())
        .await
        .map_err(|e| format!("the checker cannot open the log: {e}"))?;
    if log.log_start() != 0 {
        violations.push(format!("the log starts at {}, not 0", log.log_start()));
    }
    let end = log.high_watermark();
    let batches = changelog(&log)
        .await
        .map_err(|e| format!("reading the changelog: {e}"))?;
    let (state, history) = walk(
        engine,
        &batches,
        &m.puts,
        &m.by_sequence,
        end,
        &mut violations,
    );
    violations.extend(diff("replaying the changelog", &replay(&batches), &state));

    // The tablet recovered three ways, each must answer the model's state.
    let keys = all_keys(engine);
    let mut recovered: Vec<(String, tempfile::TempDir, Option<SnapshotStore>)> = vec![
        (
            "from the log alone".into(),
            tempfile::tempdir().map_err(|e| e.to_string())?,
            None,
        ),
        (
            "from the newest snapshot and the log".into(),
            tempfile::tempdir().map_err(|e| e.to_string())?,
            Some(snapshots(memory.clone())),
        ),
    ];
    let descriptor = engine.descriptor();
    for (how, dir, snaps) in recovered.drain(..) {
        let kv = open_kv_store(backend, dir.path()).map_err(|e| e.to_string())?;
        match KvTablet::open(
            BUCKET,
            log.clone(),
            kv.namespace(STREAM).map_err(|e| e.to_string())?,
            descriptor.clone(),
            vec![schema()],
            snaps,
        )
        .await
        {
            Ok(t) => match lookup(&t, &keys) {
                Ok(got) => {
                    violations.extend(diff(&format!("the tablet reopened {how}"), &got, &state))
                }
                Err(e) => violations.push(format!("a lookup on the tablet reopened {how}: {e}")),
            },
            Err(e) => violations.push(format!("reopening the tablet {how}: {e}")),
        }
    }
    // Each node's own store, from its flushed offset.
    m.nodes.clear();
    for (i, n) in nodes.into_iter().enumerate() {
        let Incarnation { kv, dir, .. } = n;
        if Arc::strong_count(&kv) > 1 {
            violations.push(format!("node store {i} is still in use after the stop"));
            continue;
        }
        drop(kv);
        let kv = match open_store(backend, &dir) {
            Ok(kv) => kv,
            Err(e) => {
                violations.push(format!("reopening node store {i}: {e}"));
                continue;
            }
        };
        match KvTablet::open(
            BUCKET,
            log.clone(),
            kv.namespace(STREAM).map_err(|e| e.to_string())?,
            descriptor.clone(),
            vec![schema()],
            None,
        )
        .await
        {
            Ok(t) => match lookup(&t, &keys) {
                Ok(got) => violations.extend(diff(
                    &format!("the tablet reopened on node store {i}"),
                    &got,
                    &state,
                )),
                Err(e) => violations.push(format!("a lookup on node store {i}: {e}")),
            },
            Err(e) => violations.push(format!("reopening the tablet on node store {i}: {e}")),
        }
    }
    // Every snapshot holds the state at its offset.
    let snaps = snapshots(memory.clone());
    let offsets = snaps.list().await.map_err(|e| e.to_string())?;
    for offset in &offsets {
        if *offset > end {
            violations.push(format!("a snapshot at {offset}, beyond the log end {end}"));
            continue;
        }
        match snaps.read(*offset).await {
            Ok(batches) => {
                let got: State = batches.iter().flat_map(rows_of).collect();
                violations.extend(diff(
                    &format!("the snapshot at {offset}"),
                    &got,
                    &history.state_at(*offset),
                ));
            }
            Err(e) => violations.push(format!("reading the snapshot at {offset}: {e}")),
        }
    }
    // Every lookup made during the run answered the state at its high watermark.
    for (i, seen) in m.seen.iter().enumerate() {
        let want: State = seen
            .keys
            .iter()
            .filter_map(|k| history.at(*k, seen.high_watermark).map(|v| (*k, v)))
            .collect();
        if let Some(d) = diff(
            &format!(
                "lookup {i} ({}) at high watermark {}",
                seen.why, seen.high_watermark
            ),
            &seen.state,
            &want,
        ) {
            violations.push(d);
        }
    }
    if PANICKED.load(Ordering::SeqCst) {
        violations.push("a task panicked (see the output above)".into());
    }
    m.count("seeds");
    *m.events.entry("batches").or_default() += batches.len() as u64;
    *m.events.entry("snapshots checked").or_default() += offsets.len() as u64;
    *m.events.entry("lookups checked").or_default() += m.seen.len() as u64;
    if violations.is_empty() && std::env::var_os("MINK_MODEL_SEED").is_some() {
        eprintln!("{}", m.trace.join("\n"));
    }
    if violations.is_empty() {
        Ok(m.events)
    } else {
        violations.truncate(20);
        if !m.trace.is_empty() {
            for b in &batches {
                let h = &b.header;
                let rows: Vec<String> = rows_of(&b.batch)
                    .into_iter()
                    .enumerate()
                    .map(|(i, (k, v))| {
                        format!("{} {k} {:?} {:?}", h.change_type(i), v.name, v.score)
                    })
                    .collect();
                m.trace.push(format!(
                    "log {}..={}: writer {} sequence {}: {}",
                    h.base_offset,
                    h.end_offset() - 1,
                    h.writer_id,
                    h.first_sequence,
                    rows.join(", ")
                ));
            }
            violations.push(format!("trace:\n{}", m.trace.join("\n")));
        }
        Err(format!(
            "{engine:?} on {backend:?}:\n{}",
            violations.join("\n")
        ))
    }
}

fn run_one(seed: u64) -> Result<BTreeMap<&'static str, u64>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(run_seed(seed))
}

#[test]
fn concurrent_writers_match_the_merge_engine_over_the_changelog() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        previous(info);
    }));
    let seeds = mink_wal::fault::seeds_from_env("MINK_MODEL_SEED", "MINK_MODEL_SEEDS", 30);
    let started = std::time::Instant::now();
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failed = Vec::new();
    for seed in &seeds {
        match run_one(*seed) {
            Ok(events) => {
                for (k, v) in events {
                    *totals.entry(k).or_default() += v;
                }
            }
            Err(why) => {
                eprintln!("seed {seed} failed (replay: MINK_MODEL_SEED={seed}):\n{why}\n");
                failed.push(*seed);
                if std::env::var("MINK_MODEL_KEEP_GOING").is_err() {
                    break;
                }
            }
        }
    }
    eprintln!(
        "{} seeds in {:.1} s: {totals:?}",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failed.is_empty(), "failed seeds: {failed:?}");
    assert!(
        totals.get("acked").copied().unwrap_or(0) > seeds.len() as u64 * 10,
        "the writers made progress: {totals:?}"
    );
}
