//! A fault and latency injecting object store, for tests and benchmarks.
//!
//! Wraps any store. Every decision comes from one seeded RNG, so a test that fixes the
//! seed and the order of its requests sees the same faults every run. Faults:
//! - latency per operation kind, plus seeded jitter;
//! - a failure rate for PUTs (the PUT is not applied) and GETs;
//! - an ambiguous-timeout rate for PUTs: the PUT **is applied** and then reported as a
//!   timeout, which is what a real timeout may be;
//! - a rate of conditional creates that are applied and then answered
//!   `AlreadyExists`: what object_store's own retry of a create whose response was
//!   lost sees;
//! - "fail the next N PUTs", "time out the next N PUTs (applied)" and "conflict after
//!   applying the next N PUTs";
//! - faults limited to paths under one prefix, and a "down" switch that fails every
//!   request at once (a dead or partitioned node);
//! - a per-path PUT delay hook, to reorder uploads on purpose.
//!
//! It also counts requests and bytes by kind, which benchmarks report.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A per-path PUT delay: return `Some(d)` to delay that PUT by `d` instead of the
/// configured latency.
pub type PutDelayFn = Arc<dyn Fn(&Path) -> Option<Duration> + Send + Sync>;

/// What to inject.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    pub put_latency: Duration,
    pub get_latency: Duration,
    pub list_latency: Duration,
    pub delete_latency: Duration,
    /// Extra latency, uniform in `[0, jitter)`, added to every delayed request.
    pub jitter: Duration,
    /// Probability that a PUT fails without being applied.
    pub put_failure_rate: f64,
    /// Probability that a PUT is applied and then reported as timed out.
    pub put_ambiguous_rate: f64,
    /// Probability that a conditional create is applied and then answered
    /// `AlreadyExists` (a retry meeting its own landed attempt).
    pub put_conflict_rate: f64,
    /// Probability that a GET fails.
    pub get_failure_rate: f64,
    /// When set, injected failures hit only paths under this prefix (latency still
    /// applies everywhere).
    pub fault_prefix: Option<String>,
    /// Seed of the RNG behind every random decision.
    pub seed: u64,
}

/// A clock of object modification times that follows tokio's clock (paused in
/// deterministic tests) instead of the wall clock: stores sharing one report the time
/// a PUT was applied, in virtual milliseconds, as `last_modified`. Age-based GC then
/// depends on the seed only.
#[derive(Clone)]
pub struct VirtualClock {
    started: tokio::time::Instant,
    times: Arc<Mutex<std::collections::HashMap<Path, i64>>>,
}

impl VirtualClock {
    /// Milliseconds since the epoch at which this clock starts.
    const BASE_MS: i64 = 1_800_000_000_000;

    pub fn new() -> Self {
        Self {
            started: tokio::time::Instant::now(),
            times: Arc::default(),
        }
    }

    fn now_ms(&self) -> i64 {
        Self::BASE_MS + self.started.elapsed().as_millis() as i64
    }

    fn record(&self, path: &Path) {
        let now = self.now_ms();
        self.times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.clone(), now);
    }

    fn patch(&self, meta: &mut ObjectMeta) {
        let at = self
            .times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&meta.location)
            .copied()
            .unwrap_or(Self::BASE_MS);
        if let Some(t) = chrono::DateTime::from_timestamp_millis(at) {
            meta.last_modified = t;
        }
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The seeds a seeded model test runs: the environment variable `one` replays a single
/// seed; otherwise `many` (or `default`) seeds from 0. A failing seed is printed with the
/// variable that replays it.
pub fn seeds_from_env(one: &str, many: &str, default: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var(one).ok().and_then(|v| v.parse().ok()) {
        return vec![seed];
    }
    let n = std::env::var(many)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

/// Request counters.
#[derive(Debug, Default)]
pub struct FaultCounters {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub injected_failures: AtomicU64,
}

struct State {
    config: FaultConfig,
    rng: StdRng,
    fail_next_puts: u64,
    ambiguous_next_puts: u64,
    conflict_next_puts: u64,
    hang_next_puts: u64,
    fail_next_gets: u64,
    /// Where the `fail_next_gets` failures hit (any path with `None`).
    fail_gets_under: Option<String>,
    down: bool,
    put_delay: Option<PutDelayFn>,
}

impl State {
    fn targets(&self, path: &Path) -> bool {
        self.config
            .fault_prefix
            .as_deref()
            .is_none_or(|p| path.as_ref().starts_with(p))
    }
}

/// The wrapper. Cheap to clone; clones share faults and counters.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    clock: Option<VirtualClock>,
    state: Arc<Mutex<State>>,
    counters: Arc<FaultCounters>,
}

enum PutFate {
    Fail,
    Ambiguous,
    Conflict,
    Hang,
    Normal,
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: what.to_string().into(),
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, config: FaultConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Self {
            inner,
            clock: None,
            state: Arc::new(Mutex::new(State {
                config,
                rng,
                fail_next_puts: 0,
                ambiguous_next_puts: 0,
                conflict_next_puts: 0,
                hang_next_puts: 0,
                fail_next_gets: 0,
                fail_gets_under: None,
                down: false,
                put_delay: None,
            })),
            counters: Arc::new(FaultCounters::default()),
        }
    }

    /// A wrapper of `inner` that shares this one's faults, configuration, RNG, clock
    /// and counters: one injector over several stores (the node puts one over each
    /// purpose's accounted handle, see [`crate::accounting::Stores::with_faults`]).
    pub fn over(&self, inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            clock: self.clock.clone(),
            state: self.state.clone(),
            counters: self.counters.clone(),
        }
    }

    /// Reports modification times from `clock` (shared by every store over the same
    /// objects) instead of the wrapped store's wall clock.
    pub fn with_clock(mut self, clock: VirtualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    fn applied(&self, path: &Path) {
        if let Some(clock) = &self.clock {
            clock.record(path);
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// Replaces the configuration (the RNG keeps its position).
    pub fn set_config(&self, config: FaultConfig) {
        self.with(|s| s.config = config);
    }

    /// The next `n` PUTs fail without being applied.
    pub fn fail_next_puts(&self, n: u64) {
        self.with(|s| s.fail_next_puts = n);
    }

    /// The next `n` PUTs are applied, then reported as timed out.
    pub fn time_out_next_puts(&self, n: u64) {
        self.with(|s| s.ambiguous_next_puts = n);
    }

    /// The next `n` conditional creates are applied, then answered `AlreadyExists`.
    pub fn conflict_after_apply_next_puts(&self, n: u64) {
        self.with(|s| s.conflict_next_puts = n);
    }

    /// The next `n` PUTs are applied, then never answered: the caller can only give
    /// up (a timeout, a cancelled request) without knowing the outcome.
    pub fn hang_after_apply_next_puts(&self, n: u64) {
        self.with(|s| s.hang_next_puts = n);
    }

    /// The next `n` GETs of paths under `prefix` fail (whatever the fault prefix).
    pub fn fail_next_gets_under(&self, prefix: &str, n: u64) {
        self.with(|s| {
            s.fail_next_gets = n;
            s.fail_gets_under = Some(prefix.to_string());
        });
    }

    /// While down, every request fails at once and nothing is applied.
    pub fn set_down(&self, down: bool) {
        self.with(|s| s.down = down);
    }

    fn is_down(&self) -> bool {
        self.with(|s| s.down)
    }

    /// Installs (or removes) a per-path PUT delay.
    pub fn set_put_delay(&self, delay: Option<PutDelayFn>) {
        self.with(|s| s.put_delay = delay);
    }

    pub fn counters(&self) -> &FaultCounters {
        &self.counters
    }

    fn delay(&self, base: impl Fn(&FaultConfig) -> Duration) -> Duration {
        self.with(|s| {
            let base = base(&s.config);
            let jitter = s.config.jitter;
            if jitter.is_zero() {
                base
            } else {
                base + jitter.mul_f64(s.rng.random::<f64>())
            }
        })
    }

    fn put_fate(&self, path: &Path) -> (PutFate, Duration) {
        self.with(|s| {
            let delay = s
                .put_delay
                .as_ref()
                .and_then(|f| f(path))
                .unwrap_or(s.config.put_latency);
            let delay = if s.config.jitter.is_zero() {
                delay
            } else {
                delay + s.config.jitter.mul_f64(s.rng.random::<f64>())
            };
            let fate = if s.down {
                PutFate::Fail
            } else if !s.targets(path) {
                PutFate::Normal
            } else if s.fail_next_puts > 0 {
                s.fail_next_puts -= 1;
                PutFate::Fail
            } else if s.ambiguous_next_puts > 0 {
                s.ambiguous_next_puts -= 1;
                PutFate::Ambiguous
            } else if s.conflict_next_puts > 0 {
                s.conflict_next_puts -= 1;
                PutFate::Conflict
            } else if s.hang_next_puts > 0 {
                s.hang_next_puts -= 1;
                PutFate::Hang
            } else {
                let roll: f64 = s.rng.random();
                let c = &s.config;
                if roll < c.put_failure_rate {
                    PutFate::Fail
                } else if roll < c.put_failure_rate + c.put_ambiguous_rate {
                    PutFate::Ambiguous
                } else if roll < c.put_failure_rate + c.put_ambiguous_rate + c.put_conflict_rate {
                    PutFate::Conflict
                } else {
                    PutFate::Normal
                }
            };
            (fate, delay)
        })
    }

    fn get_fails(&self, path: &Path) -> bool {
        self.with(|s| {
            if s.down {
                return true;
            }
            if s.fail_next_gets > 0
                && s.fail_gets_under
                    .as_deref()
                    .is_none_or(|p| path.as_ref().starts_with(p))
            {
                s.fail_next_gets -= 1;
                return true;
            }
            let rate = s.config.get_failure_rate;
            rate > 0.0 && s.targets(path) && s.rng.random::<f64>() < rate
        })
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

/// A multipart upload through a [`FaultyStore`]: each part and the completion meet the
/// store's PUT faults (counted as PUTs), as the requests they are on S3. A failed part
/// is not uploaded; an ambiguous one is, and then fails; an ambiguous completion
/// completes the object, and then fails.
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    store: FaultyStore,
    location: Path,
}

impl fmt::Debug for FaultyUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyUpload({})", self.location)
    }
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> object_store::UploadPart {
        let counters = self.store.counters.clone();
        counters.puts.fetch_add(1, Ordering::Relaxed);
        counters
            .put_bytes
            .fetch_add(data.content_length() as u64, Ordering::Relaxed);
        let (fate, delay) = self.store.put_fate(&self.location);
        if matches!(fate, PutFate::Fail) {
            // The part is never handed to the store (some stores start on the call).
            return Box::pin(async move {
                sleep(delay).await;
                counters.injected_failures.fetch_add(1, Ordering::Relaxed);
                Err(injected("injected upload part failure"))
            });
        }
        let part = self.inner.put_part(data);
        Box::pin(async move {
            sleep(delay).await;
            match fate {
                PutFate::Fail => unreachable!("answered above"),
                PutFate::Ambiguous => {
                    counters.injected_failures.fetch_add(1, Ordering::Relaxed);
                    part.await?;
                    Err(injected("injected upload part timeout (the part was sent)"))
                }
                PutFate::Hang => {
                    part.await?;
                    std::future::pending().await
                }
                PutFate::Conflict | PutFate::Normal => part.await,
            }
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.store.counters.puts.fetch_add(1, Ordering::Relaxed);
        let (fate, delay) = self.store.put_fate(&self.location);
        sleep(delay).await;
        let counters = &self.store.counters;
        match fate {
            PutFate::Fail => {
                counters.injected_failures.fetch_add(1, Ordering::Relaxed);
                Err(injected("injected upload completion failure"))
            }
            PutFate::Ambiguous => {
                counters.injected_failures.fetch_add(1, Ordering::Relaxed);
                if self.inner.complete().await.is_ok() {
                    self.store.applied(&self.location);
                }
                Err(injected(
                    "injected upload completion timeout (the object was completed)",
                ))
            }
            PutFate::Hang => {
                if self.inner.complete().await.is_ok() {
                    self.store.applied(&self.location);
                }
                std::future::pending().await
            }
            PutFate::Conflict | PutFate::Normal => {
                let done = self.inner.complete().await?;
                self.store.applied(&self.location);
                Ok(done)
            }
        }
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        if self.store.is_down() {
            return Err(injected("injected: the store is down"));
        }
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .put_bytes
            .fetch_add(payload.content_length() as u64, Ordering::Relaxed);
        let (fate, delay) = self.put_fate(location);
        sleep(delay).await;
        match fate {
            PutFate::Fail => {
                self.counters
                    .injected_failures
                    .fetch_add(1, Ordering::Relaxed);
                Err(injected("injected PUT failure"))
            }
            PutFate::Ambiguous => {
                self.counters
                    .injected_failures
                    .fetch_add(1, Ordering::Relaxed);
                // Applied, then "timed out": the caller cannot tell.
                if self.inner.put_opts(location, payload, opts).await.is_ok() {
                    self.applied(location);
                }
                Err(injected("injected PUT timeout (the PUT was applied)"))
            }
            PutFate::Conflict => {
                let create = matches!(opts.mode, object_store::PutMode::Create);
                let applied = self.inner.put_opts(location, payload, opts).await?;
                self.applied(location);
                if !create {
                    return Ok(applied);
                }
                self.counters
                    .injected_failures
                    .fetch_add(1, Ordering::Relaxed);
                Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "injected: a retry met its own landed create".into(),
                })
            }
            PutFate::Hang => {
                if self.inner.put_opts(location, payload, opts).await.is_ok() {
                    self.applied(location);
                }
                std::future::pending().await
            }
            PutFate::Normal => {
                let done = self.inner.put_opts(location, payload, opts).await?;
                self.applied(location);
                Ok(done)
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if self.is_down() {
            return Err(injected("injected: the store is down"));
        }
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner,
            store: self.clone(),
            location: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        sleep(self.delay(|c| c.get_latency)).await;
        if self.get_fails(location) {
            self.counters
                .injected_failures
                .fetch_add(1, Ordering::Relaxed);
            return Err(injected("injected GET failure"));
        }
        let mut got = self.inner.get_opts(location, options).await?;
        if let Some(clock) = &self.clock {
            clock.patch(&mut got.meta);
        }
        Ok(got)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        sleep(self.delay(|c| c.get_latency)).await;
        if self.get_fails(location) {
            self.counters
                .injected_failures
                .fetch_add(1, Ordering::Relaxed);
            return Err(injected("injected GET failure"));
        }
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let delay = self.delay(|c| c.delete_latency);
        let counters = self.counters.clone();
        if self.is_down() {
            return locations
                .map(|_| Err(injected("injected: the store is down")))
                .boxed();
        }
        let locations = locations
            .then(move |l| {
                counters.deletes.fetch_add(1, Ordering::Relaxed);
                async move {
                    sleep(delay).await;
                    l
                }
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let delay = self.delay(|c| c.list_latency);
        if self.is_down() {
            return futures::stream::once(async { Err(injected("injected: the store is down")) })
                .boxed();
        }
        let inner = self.inner.list(prefix);
        let clock = self.clock.clone();
        futures::stream::once(async move {
            sleep(delay).await;
            inner
        })
        .flatten()
        .map(move |m| {
            m.map(|mut m| {
                if let Some(clock) = &clock {
                    clock.patch(&mut m);
                }
                m
            })
        })
        .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let delay = self.delay(|c| c.list_latency);
        if self.is_down() {
            return futures::stream::once(async { Err(injected("injected: the store is down")) })
                .boxed();
        }
        let inner = self.inner.list_with_offset(prefix, offset);
        let clock = self.clock.clone();
        futures::stream::once(async move {
            sleep(delay).await;
            inner
        })
        .flatten()
        .map(move |m| {
            m.map(|mut m| {
                if let Some(clock) = &clock {
                    clock.patch(&mut m);
                }
                m
            })
        })
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        sleep(self.delay(|c| c.list_latency)).await;
        if self.is_down() {
            return Err(injected("injected: the store is down"));
        }
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        if self.is_down() {
            return Err(injected("injected: the store is down"));
        }
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn injected_faults_are_deterministic_and_counted() {
        let store = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        store.fail_next_puts(2);
        let p = Path::from("a");
        assert!(store.put(&p, PutPayload::from_static(b"x")).await.is_err());
        assert!(store.put(&p, PutPayload::from_static(b"x")).await.is_err());
        assert!(store.get(&p).await.is_err(), "failed PUTs are not applied");
        store.put(&p, PutPayload::from_static(b"x")).await.unwrap();

        store.time_out_next_puts(1);
        let q = Path::from("b");
        assert!(store.put(&q, PutPayload::from_static(b"y")).await.is_err());
        let got = store.get(&q).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"y", "an ambiguous timeout applies the PUT");
        assert_eq!(store.counters().puts.load(Ordering::Relaxed), 4);
        assert_eq!(
            store.counters().injected_failures.load(Ordering::Relaxed),
            3
        );

        let fates = |seed| {
            let s = FaultyStore::new(
                Arc::new(InMemory::new()),
                FaultConfig {
                    put_failure_rate: 0.5,
                    seed,
                    ..Default::default()
                },
            );
            (0..32)
                .map(|i| matches!(s.put_fate(&Path::from(format!("{i}"))).0, PutFate::Fail))
                .collect::<Vec<_>>()
        };
        assert_eq!(fates(7), fates(7));
        assert_ne!(fates(7), fates(8));
    }

    /// Multipart uploads meet the same faults as PUTs: a failed part is never sent, an
    /// ambiguous completion completes the object, a down store refuses the upload.
    #[tokio::test]
    async fn multipart_parts_and_completions_meet_put_faults() {
        let store = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let p = Path::from("m");
        let mut upload = store.put_multipart(&p).await.unwrap();
        store.fail_next_puts(1);
        assert!(
            upload
                .put_part(PutPayload::from_static(b"one"))
                .await
                .is_err()
        );
        upload.abort().await.unwrap();
        assert!(store.get(&p).await.is_err(), "nothing was completed");

        let mut upload = store.put_multipart(&p).await.unwrap();
        upload
            .put_part(PutPayload::from_static(b"one"))
            .await
            .unwrap();
        store.time_out_next_puts(1);
        assert!(upload.complete().await.is_err());
        let got = store.get(&p).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"one", "an ambiguous completion completes");
        // Two parts and one completion.
        assert_eq!(store.counters().puts.load(Ordering::Relaxed), 3);

        store.set_down(true);
        assert!(store.put_multipart(&Path::from("n")).await.is_err());
    }
}
