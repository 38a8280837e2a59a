//! A concurrent model test of s3stream: several nodes on one seeded fault store race
//! appends, takeovers from live owners, in-place epoch moves, clean handovers,
//! compaction, WAL GC, trim, crashes and cancelled opens, in interleavings chosen by
//! the seed (a current-thread runtime with paused time, so a seed replays).
//!
//! The checker, after the faults stop and a fresh node takes every stream over:
//! - every acknowledged record is readable at its acknowledged offset (unless trimmed);
//! - offsets are contiguous; no payload appears twice; nothing appears that was never
//!   appended;
//! - no two appends were ever acknowledged at one offset of one stream (two owners
//!   acknowledging at once);
//! - no task panicked (a debug assertion of the WAL writer, say).
//!
//! `MINK_MODEL_SEEDS=N` runs seeds `0..N` (default 40), `MINK_MODEL_SEED=S` replays
//! one; a failure names its seed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mink_wal::fault::{FaultConfig, FaultyStore, VirtualClock};
use mink_wal::{Record, Stream, StreamStore, WalConfig, WalError, WalResult};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NODES: usize = 3;
const STREAMS: usize = 3;
const APPENDERS: usize = 4;
/// Virtual time during which faults and background work race the appenders.
const CHAOS: Duration = Duration::from_secs(3);

static PANICKED: AtomicBool = AtomicBool::new(false);

fn wal_config() -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        // Small: compaction splits runs, and merges runs of three or more small
        // segments (a one-record segment is about 110 bytes), racing reads, trims,
        // takeovers and orphan GC.
        segment_bytes_max: 2_000,
        segment_merge_fanin: 2,
        dead_wal_grace_ms: 0,
        upload_retry_budget_ms: 300,
        inflight_uploads_max: 3,
        // Evict at once: reads and compaction fetch payloads from WAL objects, which
        // GC deletes under them.
        tail_cache_bytes_max: 256,
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
        put_conflict_rate: 0.03,
        get_failure_rate: 0.01,
        seed,
        ..Default::default()
    }
}

/// One incarnation of a node: its own view of the shared store (so that a crash can
/// cut it off) and its s3stream service.
#[derive(Clone)]
struct Incarnation {
    faulty: FaultyStore,
    streams: StreamStore,
}

#[derive(Clone)]
struct Holder {
    epoch: u64,
    stream: Stream,
    /// The WAL writer it was opened on, for the checker's messages.
    wal: String,
}

#[derive(Default)]
struct Model {
    /// The newest epoch handed out per stream (the metadata service's leader epochs).
    epochs: Vec<u64>,
    /// Who appends to each stream now, as the controller last decided.
    holders: Vec<Option<Holder>>,
    nodes: Vec<Incarnation>,
    /// Acknowledged appends: stream -> base offset -> (end, payload).
    acked: Vec<BTreeMap<u64, (u64, Bytes)>>,
    /// Who acknowledged each append (payload -> "wal@epoch"), for messages.
    acked_by: std::collections::HashMap<Bytes, String>,
    /// Appends whose outcome is unknown.
    maybe: HashSet<Bytes>,
    /// The highest start offset a trim of each stream returned.
    trimmed: Vec<u64>,
    violations: Vec<String>,
    events: BTreeMap<&'static str, u64>,
}

impl Model {
    fn count(&mut self, what: &'static str) {
        *self.events.entry(what).or_default() += 1;
    }

    fn next_epoch(&mut self, stream: usize) -> u64 {
        self.epochs[stream] += 1;
        self.epochs[stream]
    }

    fn ack(&mut self, stream: usize, range: Range<u64>, payload: Bytes, by: String) {
        let acked = &mut self.acked[stream];
        if let Some((_, (end, other))) = acked.range(..range.end).next_back()
            && *end > range.start
        {
            let other_by = self.acked_by.get(other).cloned().unwrap_or_default();
            self.violations.push(format!(
                "stream {stream}: offsets {range:?} acknowledged for {payload:?} by {by} overlap \
                 an acknowledged append ending at {end} ({other:?} by {other_by}): two owners \
                 acknowledged at once"
            ));
        }
        self.acked_by.insert(payload.clone(), by);
        acked.insert(range.start, (range.end, payload));
    }
}

type Shared = Arc<Mutex<Model>>;

fn lock(model: &Shared) -> std::sync::MutexGuard<'_, Model> {
    model.lock().unwrap_or_else(|e| e.into_inner())
}

fn stream_name(s: usize) -> String {
    format!("s{s}")
}

async fn start_node(
    memory: &Arc<dyn ObjectStore>,
    clock: &VirtualClock,
    node: usize,
    seed: u64,
) -> Incarnation {
    let faulty = FaultyStore::new(memory.clone(), faults(seed)).with_clock(clock.clone());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    // A start may meet injected faults: retry as a supervisor would.
    loop {
        match StreamStore::open(store.clone(), &format!("n{node}"), wal_config()).await {
            Ok(streams) => {
                return Incarnation { faulty, streams };
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

async fn appender(model: Shared, id: usize, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed ^ (0xA99E_D000 + id as u64));
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let s = rng.random_range(0..STREAMS);
        let holder = lock(&model).holders[s].clone();
        let Some(holder) = holder else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        n += 1;
        let payload = Bytes::from(format!("a{id}-{n}-{}", "x".repeat(rng.random_range(0..40))));
        let count = rng.random_range(1..4u32);
        let append = holder
            .stream
            .append_durable(holder.epoch, count, n as i64, payload.clone());
        // Now and then the caller goes away mid-append.
        let outcome = if rng.random_bool(0.05) {
            let wait = Duration::from_micros(rng.random_range(0..3_000));
            tokio::time::timeout(wait, append).await.ok()
        } else {
            Some(append.await)
        };
        let failed = {
            let mut m = lock(&model);
            match outcome {
                Some(Ok(range)) => {
                    if range.end - range.start != count as u64 {
                        m.violations
                            .push(format!("append of {count} records got offsets {range:?}"));
                    }
                    m.ack(
                        s,
                        range,
                        payload,
                        format!("{}@{}", holder.wal, holder.epoch),
                    );
                    m.count("acked");
                    false
                }
                Some(Err(_)) | None => {
                    m.maybe.insert(payload);
                    m.count("append failed or cancelled");
                    true
                }
            }
        };
        if failed {
            let pause = Duration::from_micros(rng.random_range(500..5_000));
            tokio::time::sleep(pause).await;
        }
    }
}

/// Reads racing everything else: whatever a read returns must be what was
/// acknowledged at those offsets; a read may fail (injected GET failures, a stream
/// taken over, below the start) but never find the stream corrupt, even when the
/// object it was reading is deleted under it by GC or trim.
async fn reader(model: Shared, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EAD_E500);
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_micros(rng.random_range(200..3_000))).await;
        let s = rng.random_range(0..STREAMS);
        let Some(holder) = lock(&model).holders[s].clone() else {
            continue;
        };
        let end = holder.stream.durable_end();
        if end == 0 {
            continue;
        }
        let at = rng.random_range(0..end);
        let max_bytes = rng.random_range(1..2_000);
        // Plain reads, and scans to the end (segments fetched ahead together), which
        // must return what plain reads would.
        let scanned = rng.random_bool(0.5);
        let read = if !scanned {
            holder.stream.read(at, max_bytes).await
        } else {
            scan(&holder.stream, at, end, max_bytes).await
        };
        let mut m = lock(&model);
        match read {
            Ok(records) => {
                m.count(if scanned { "scans" } else { "reads" });
                let mut expect = None;
                for r in records {
                    if let Some(next) = expect
                        && r.base != next
                    {
                        m.violations.push(format!(
                            "s{s}: a read at {at} skipped from {next} to {}",
                            r.base
                        ));
                    }
                    expect = Some(r.end());
                    let acked = m.acked[s].get(&r.base).cloned();
                    if let Some((end, payload)) = acked
                        && (end != r.end() || payload != r.payload)
                    {
                        m.violations.push(format!(
                            "s{s}: a read at {at} found {:?} at {}..{} where {payload:?} was acknowledged at ..{end}",
                            r.payload,
                            r.base,
                            r.end()
                        ));
                    }
                }
            }
            Err(WalError::Corrupt(e)) => {
                m.violations
                    .push(format!("s{s}: a read at {at} found corruption: {e}"));
            }
            Err(WalError::OffsetOutOfRange { .. }) => m.count("read below the start"),
            Err(_) => m.count("read failed (injected)"),
        }
    }
}

/// Every record a scan of `stream` from `at` to `end` returns, in one list.
async fn scan(stream: &Stream, at: u64, end: u64, max_bytes: usize) -> WalResult<Vec<Record>> {
    let mut scan = stream.scan(at, end, max_bytes);
    let mut out = Vec::new();
    while let Some(records) = scan.next().await? {
        out.extend(records);
    }
    Ok(out)
}

/// Opens `s` on `target` under a new epoch, perhaps cancelling the open at an await
/// point; on success it becomes the stream's holder.
async fn open_on(model: Shared, target: Incarnation, s: usize, cancel_after: Option<Duration>) {
    let epoch = lock(&model).next_epoch(s);
    let name = stream_name(s);
    let open = target.streams.open_stream(&name, epoch);
    let outcome = match cancel_after {
        Some(after) => tokio::time::timeout(after, open).await.ok(),
        None => Some(open.await),
    };
    let mut m = lock(&model);
    match outcome {
        Some(Ok(stream)) => {
            m.count("opened");
            // Only a newer epoch replaces the holder: opens race.
            if m.holders[s].as_ref().is_none_or(|h| h.epoch < epoch) {
                let wal = target.streams.wal_id().to_string();
                m.holders[s] = Some(Holder { epoch, stream, wal });
            }
        }
        Some(Err(WalError::Corrupt(e))) => {
            m.violations
                .push(format!("open of s{s} under {epoch}: corrupt: {e}"));
        }
        Some(Err(_)) => m.count("open failed"),
        None => m.count("open cancelled"),
    }
}

async fn controller(
    model: Shared,
    memory: Arc<dyn ObjectStore>,
    clock: VirtualClock,
    seed: u64,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC0_47_20_11);
    let mut tasks = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1..25))).await;
        let roll = rng.random_range(0..100);
        let s = rng.random_range(0..STREAMS);
        let n = rng.random_range(0..NODES);
        let target = lock(&model).nodes[n].clone();
        let m2 = model.clone();
        match roll {
            // Take over from a live owner (or move in place when it is the same node).
            0..=24 => {
                let cancel = rng
                    .random_bool(0.25)
                    .then(|| Duration::from_micros(rng.random_range(0..20_000)));
                lock(&model).count("takeover");
                tasks.push(tokio::spawn(open_on(m2, target, s, cancel)));
            }
            // A clean handover: close, then open elsewhere.
            25..=39 => {
                let holder = lock(&model).holders[s].clone();
                lock(&model).count("handover");
                tasks.push(tokio::spawn(async move {
                    if let Some(h) = holder {
                        let _ = h.stream.close().await;
                    }
                    open_on(m2, target, s, None).await;
                }));
            }
            40..=59 => {
                lock(&model).count("compact");
                let m2 = model.clone();
                tasks.push(tokio::spawn(async move {
                    let before = target.streams.segment_merges();
                    let _ = target.streams.compact().await;
                    if target.streams.segment_merges() > before {
                        lock(&m2).count("merge");
                    }
                }));
            }
            60..=67 => {
                lock(&model).count("gc");
                tasks.push(tokio::spawn(async move {
                    let _ = target.streams.gc_dead_wals().await;
                    let _ = target.streams.gc_orphan_segments().await;
                }));
            }
            68..=75 => {
                let holder = lock(&model).holders[s].clone();
                if let Some(h) = holder {
                    let to = rng.random_range(0..=h.stream.durable_end());
                    lock(&model).count("trim");
                    tasks.push(tokio::spawn(async move {
                        if let Ok(start) = h.stream.trim(to).await {
                            let mut m = lock(&m2);
                            m.trimmed[s] = m.trimmed[s].max(start);
                        }
                    }));
                }
            }
            // A crash: the incarnation is cut off from the store for good; the node
            // comes back as a new incarnation.
            76..=81 => {
                lock(&model).count("crash");
                target.faulty.set_down(true);
                let fresh = start_node(&memory, &clock, n, rng.random()).await;
                lock(&model).nodes[n] = fresh;
            }
            // A pause: the owner stalls (a GC pause, a slow network) while others go on.
            82..=89 => {
                lock(&model).count("pause");
                let stall = Duration::from_millis(rng.random_range(20..200));
                target
                    .faulty
                    .set_put_delay(Some(Arc::new(move |_| Some(stall))));
                let faulty = target.faulty.clone();
                let resume = Duration::from_millis(rng.random_range(10..100));
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(resume).await;
                    faulty.set_put_delay(None);
                }));
            }
            // A burst of faults on one node's metadata appends.
            _ => {
                lock(&model).count("meta faults");
                let which = rng.random_range(0..3);
                match which {
                    0 => target.faulty.fail_next_puts(2),
                    1 => target.faulty.time_out_next_puts(2),
                    _ => target.faulty.conflict_after_apply_next_puts(2),
                }
            }
        }
        tasks.retain(|t| !t.is_finished());
    }
    for t in tasks {
        if let Err(e) = t.await
            && e.is_panic()
        {
            PANICKED.store(true, Ordering::SeqCst);
        }
    }
}

/// Every record of `stream` from its start, with contiguity checked.
async fn read_all(
    stream: &Stream,
    s: usize,
    violations: &mut Vec<String>,
) -> Vec<(u64, u64, Bytes)> {
    let mut out = Vec::new();
    let mut pos = stream.start_offset();
    let end = stream.durable_end();
    while pos < end {
        let records = match stream.read(pos, 1 << 20).await {
            Ok(r) => r,
            Err(e) => {
                violations.push(format!("s{s}: read at {pos} failed: {e}"));
                return out;
            }
        };
        if records.is_empty() {
            violations.push(format!("s{s}: no progress at {pos} below the end {end}"));
            return out;
        }
        for r in records {
            // The start offset may fall inside a unit (trim takes any offset): the
            // first unit read may begin before it.
            let first = out.is_empty() && r.base <= pos && pos < r.end();
            if r.base != pos && !first {
                violations.push(format!(
                    "s{s}: record at {} where {pos} was expected",
                    r.base
                ));
                return out;
            }
            out.push((r.base, r.end(), r.payload.clone()));
            pos = r.end();
        }
    }
    out
}

async fn run_seed(seed: u64) -> Result<BTreeMap<&'static str, u64>, String> {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // Object ages follow the paused clock, so age-based GC depends on the seed only.
    let clock = VirtualClock::new();
    let model: Shared = Arc::new(Mutex::new(Model {
        epochs: vec![0; STREAMS],
        holders: vec![None; STREAMS],
        acked: vec![BTreeMap::new(); STREAMS],
        trimmed: vec![0; STREAMS],
        ..Default::default()
    }));
    for n in 0..NODES {
        let node = start_node(
            &memory,
            &clock,
            n,
            seed.wrapping_mul(1_000_003).wrapping_add(n as u64),
        )
        .await;
        lock(&model).nodes.push(node);
    }
    for s in 0..STREAMS {
        let target = lock(&model).nodes[s % NODES].clone();
        open_on(model.clone(), target, s, None).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for id in 0..APPENDERS {
        tasks.push(tokio::spawn(appender(
            model.clone(),
            id,
            seed,
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(reader(model.clone(), seed, stop.clone())));
    tasks.push(tokio::spawn(controller(
        model.clone(),
        memory.clone(),
        clock.clone(),
        seed,
        stop.clone(),
    )));
    tokio::time::sleep(CHAOS).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        if let Err(e) = t.await
            && e.is_panic()
        {
            PANICKED.store(true, Ordering::SeqCst);
        }
    }
    // Settle: faults off, then a fresh node takes every stream over.
    let nodes: Vec<Incarnation> = lock(&model).nodes.clone();
    for n in &nodes {
        n.faulty.set_put_delay(None);
        n.faulty.set_config(FaultConfig::default());
        n.faulty.fail_next_puts(0);
        n.faulty.time_out_next_puts(0);
        n.faulty.conflict_after_apply_next_puts(0);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let checker = StreamStore::open(memory.clone(), "checker", wal_config())
        .await
        .map_err(|e| format!("checker start: {e}"))?;
    let (mut violations, epochs, acked, maybe, trimmed, events) = {
        let mut m = lock(&model);
        (
            std::mem::take(&mut m.violations),
            m.epochs.clone(),
            m.acked.clone(),
            m.maybe.clone(),
            m.trimmed.clone(),
            m.events.clone(),
        )
    };
    for s in 0..STREAMS {
        let stream = match checker.open_stream(&stream_name(s), epochs[s] + 1).await {
            Ok(stream) => stream,
            Err(e) => {
                violations.push(format!("s{s}: the checker cannot take it over: {e}"));
                continue;
            }
        };
        let before = violations.len();
        let records = read_all(&stream, s, &mut violations).await;
        if violations.len() > before {
            let meta = checker
                .metadata()
                .read(|st, _| st.streams.get(&stream_name(s)).cloned());
            violations.push(format!("s{s} as the log has it: {meta:#?}"));
        }
        let by_base: HashMap<u64, (u64, &Bytes)> =
            records.iter().map(|(b, e, p)| (*b, (*e, p))).collect();
        let mut seen = HashSet::new();
        for (base, _, payload) in &records {
            if !seen.insert(payload.clone()) {
                violations.push(format!("s{s}: {payload:?} appears twice (again at {base})"));
            }
            let was_acked = acked[s].get(base).is_some_and(|(_, p)| p == payload);
            if !was_acked && !maybe.contains(payload) {
                violations.push(format!(
                    "s{s}: {payload:?} at {base} was never appended there"
                ));
            }
        }
        let start = stream.start_offset().max(trimmed[s]);
        for (base, (end, payload)) in &acked[s] {
            if *end <= start {
                continue;
            }
            match by_base.get(base) {
                Some((e, p)) if e == end && *p == payload => {}
                other => violations.push(format!(
                    "s{s}: acknowledged {payload:?} at {base}..{end} is lost (found {other:?})"
                )),
            }
        }
    }
    if PANICKED.load(Ordering::SeqCst) {
        violations.push("a task panicked (see the output above)".into());
    }
    if violations.is_empty() {
        Ok(events)
    } else {
        Err(violations.join("\n"))
    }
}

fn run_one(seed: u64) -> Result<BTreeMap<&'static str, u64>, String> {
    // MINK_MODEL_TRACE=filter (e.g. "mink_wal=debug") prints the library's log of a
    // replayed seed, with virtual timestamps.
    if let Ok(filter) = std::env::var("MINK_MODEL_TRACE") {
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_test_writer()
            .finish();
        return tracing::subscriber::with_default(subscriber, || run_seed_on_runtime(seed));
    }
    run_seed_on_runtime(seed)
}

fn run_seed_on_runtime(seed: u64) -> Result<BTreeMap<&'static str, u64>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(run_seed(seed))
}

#[test]
fn concurrent_owners_never_lose_an_acknowledged_record() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        previous(info);
    }));
    let seeds = mink_wal::fault::seeds_from_env("MINK_MODEL_SEED", "MINK_MODEL_SEEDS", 50);
    let started = std::time::Instant::now();
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in &seeds {
        match run_one(*seed) {
            Ok(events) => {
                for (k, v) in events {
                    *totals.entry(k).or_default() += v;
                }
            }
            Err(why) => panic!("seed {seed} failed (replay: MINK_MODEL_SEED={seed}):\n{why}"),
        }
    }
    eprintln!(
        "{} seeds in {:.1} s: {totals:?}",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        totals.get("acked").copied().unwrap_or(0) > seeds.len() as u64 * 10,
        "the appenders made progress: {totals:?}"
    );
}
