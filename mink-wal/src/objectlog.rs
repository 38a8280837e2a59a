//! `ObjectLog`: a totally ordered log of objects, appended by conditional create.
//!
//! Entry `i` (from 1) is the object `{prefix}/log/{i:020}`. To append, a writer
//! validates its entry against the state at the last applied index `k` and creates
//! `k+1` with `PutMode::Create`. On `AlreadyExists` it reads and applies the entries it
//! missed, validates again, and retries. So the log holds no entry that was invalid
//! when appended, any process may append, and every reader applies the same entries in
//! the same order to a deterministic [`LogState`].
//!
//! Every entry carries a random writer token. A create that fails ambiguously (a
//! timeout, say) may have landed; the writer resolves it by catching up and looking
//! for its token, so an entry is never appended twice by one `append` call.
//!
//! Snapshots: `{prefix}/snap/{i:020}` holds the state after entry `i`. Readers start
//! from the latest snapshot; entries a snapshot covers may be deleted
//! ([`ObjectLog::delete_covered`]), and a reader that finds them gone reloads from the
//! snapshot.
//!
//! Deleting entries opens one hazard: a writer whose view is older than a deleted
//! entry could probe `k+1`, find nothing, and create it again. Two rules close it:
//! only entries older than `delete_grace` are deleted, and a writer lists (which
//! detects deleted entries and loads the snapshot) whenever its last listing is older
//! than `list_refresh`, which must be well below `delete_grace`. An entry a writer has
//! not seen was then created after its last listing, so it is too young to be gone.
//! The create itself must leave while that still holds: a writer whose last listing
//! is older than `delete_grace - list_refresh` when it is about to create (it was
//! paused, or a read was slow) lists again first, and the create has `list_refresh`
//! to land (test: `an_appender_paused_past_the_delete_grace_lists_again_before_it_creates`).
//!
//! Tailing costs one LIST per catch-up: the listing covers all of `{prefix}/` from the
//! next entry on, so it also shows every snapshot (no second listing to find one) and
//! the objects kept beside the log whose keys sort after `{prefix}/log/` (the
//! metadata service keeps heartbeats under `{prefix}/nodes/`), which
//! [`ObjectLog::beside`] publishes: liveness is read from the tail for free.
//!
//! Entry format: `b"MKL1"`, CRC32C (u32 LE) of the rest, the 16-byte token, then the
//! entry as JSON.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Mutex, Notify, watch};

use crate::error::{WalError, WalResult};

const MAGIC: &[u8; 4] = b"MKL1";
const HEADER_LEN: usize = 4 + 4 + 16;
/// Conflicts (someone else appended first) one `append` call tolerates.
const APPEND_CONFLICTS_MAX: u32 = 1_000;
/// Storage errors one `append` call tolerates before giving up.
const APPEND_STORAGE_RETRIES_MAX: u32 = 8;

/// A deterministic state machine fed by an [`ObjectLog`].
pub trait LogState: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {
    type Entry: Serialize + DeserializeOwned + Send + Sync;
    type Rejection: Send;

    /// Whether `entry` may be appended after the entries applied so far.
    fn validate(&self, entry: &Self::Entry) -> Result<(), Self::Rejection>;

    /// Applies an entry that validated against exactly this state. Must be
    /// deterministic: every reader applies every entry.
    fn apply(&mut self, index: u64, entry: &Self::Entry);
}

/// The outcome of [`ObjectLog::append`].
#[derive(Debug)]
pub enum Appended<R> {
    /// Appended at this index and applied locally.
    At(u64),
    /// The state machine rejected the entry; nothing was appended.
    Rejected(R),
}

/// Objects under the log's prefix beside the log and its snapshots (keys sorting after
/// `{prefix}/log/`), as one listing saw them.
#[derive(Debug, Clone)]
pub struct BesideListing {
    /// When the listing was requested (tokio's clock).
    pub at: tokio::time::Instant,
    pub objects: Vec<ObjectMeta>,
}

#[derive(Clone)]
struct Applied<S> {
    index: u64,
    state: S,
}

/// Timings of an [`ObjectLog`].
#[derive(Debug, Clone)]
pub struct ObjectLogOptions {
    /// Entries younger than this are never deleted, even under a snapshot. Default 10 min.
    pub delete_grace: Duration,
    /// An appender lists the log when its last listing is older than this. Must be well
    /// below `delete_grace`. Default 1 min.
    pub list_refresh: Duration,
}

impl Default for ObjectLogOptions {
    fn default() -> Self {
        Self {
            delete_grace: Duration::from_secs(600),
            list_refresh: Duration::from_secs(60),
        }
    }
}

/// One object log and this process's view of it.
pub struct ObjectLog<S: LogState> {
    store: Arc<dyn ObjectStore>,
    options: ObjectLogOptions,
    /// When the last successful listing catch-up started.
    /// (tokio's clock, so that paused-time tests can stretch the gap.)
    last_listed: std::sync::Mutex<tokio::time::Instant>,
    /// `{prefix}`: a catch-up lists it from the next entry on.
    root: Path,
    log_dir: Path,
    snap_dir: Path,
    /// What the last listing saw beside the log.
    beside: watch::Sender<Arc<BesideListing>>,
    /// Written to read the store's clock (ages of entries are judged by it).
    clock_key: String,
    view: RwLock<Arc<Applied<S>>>,
    /// Serializes catch-up and appends of this process.
    writer: Mutex<()>,
    applied_tx: watch::Sender<u64>,
    poke: Notify,
    /// The index of the newest snapshot this process loaded, wrote or saw listed.
    newest_snapshot: AtomicU64,
}

fn encode_entry<E: Serialize>(token: &[u8; 16], entry: &E) -> WalResult<Bytes> {
    let json = serde_json::to_vec(entry)
        .map_err(|e| WalError::Corrupt(format!("cannot encode entry: {e}")))?;
    let mut buf = Vec::with_capacity(HEADER_LEN + json.len());
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(token);
    buf.extend_from_slice(&json);
    let crc = crc32c::crc32c(&buf[8..]);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(Bytes::from(buf))
}

fn decode_entry<E: DeserializeOwned>(path: &Path, bytes: &[u8]) -> WalResult<([u8; 16], E)> {
    let bad = |why: &str| WalError::Corrupt(format!("object log entry {path}: {why}"));
    if bytes.len() < HEADER_LEN {
        return Err(bad("truncated"));
    }
    if &bytes[..4] != MAGIC {
        return Err(bad("wrong magic"));
    }
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if crc32c::crc32c(&bytes[8..]) != crc {
        return Err(bad("CRC mismatch"));
    }
    let mut token = [0u8; 16];
    token.copy_from_slice(&bytes[8..24]);
    let entry =
        serde_json::from_slice(&bytes[HEADER_LEN..]).map_err(|e| bad(&format!("bad JSON: {e}")))?;
    Ok((token, entry))
}

fn index_of(path: &Path) -> Option<u64> {
    path.filename()?.parse().ok()
}

impl<S: LogState> ObjectLog<S> {
    /// Opens the log under `prefix`: loads the latest snapshot (or starts from
    /// `initial`) and applies every entry after it.
    pub async fn open(store: Arc<dyn ObjectStore>, prefix: &str, initial: S) -> WalResult<Self> {
        Self::open_with(store, prefix, initial, ObjectLogOptions::default()).await
    }

    /// [`ObjectLog::open`] with explicit timings.
    pub async fn open_with(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        initial: S,
        options: ObjectLogOptions,
    ) -> WalResult<Self> {
        let log = Self::unopened(store, prefix, 0, initial, options)?;
        {
            let _guard = log.writer.lock().await;
            log.load_latest_snapshot(0).await?;
            log.catch_up_locked(None).await?;
        }
        Ok(log)
    }

    /// Opens the log under `prefix` again, from the view of an earlier handle of it in
    /// this process (`earlier`, the state after its entry `index`): only the entries
    /// after that are read (or a newer snapshot and the entries after it), where
    /// [`ObjectLog::open`] reads the latest snapshot and every entry after it. The
    /// result is the same: a view is always a prefix of the log.
    pub async fn open_from(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        earlier: &Self,
    ) -> WalResult<Self> {
        let (index, state) = earlier.read(|s, i| (i, s.clone()));
        let log = Self::unopened(store, prefix, index, state, earlier.options.clone())?;
        {
            let _guard = log.writer.lock().await;
            // A snapshot newer than the view is read instead of the entries it covers,
            // so this never reads more than a fresh open.
            log.load_latest_snapshot(index).await?;
            log.catch_up_locked(None).await?;
        }
        Ok(log)
    }

    /// A handle at `state` (after entry `index`) that has read nothing yet.
    fn unopened(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        index: u64,
        state: S,
        options: ObjectLogOptions,
    ) -> WalResult<Self> {
        if options.list_refresh * 2 > options.delete_grace {
            return Err(WalError::Config(
                "object log: list_refresh must be at most half of delete_grace".into(),
            ));
        }
        let log = Self {
            store,
            options,
            last_listed: std::sync::Mutex::new(tokio::time::Instant::now()),
            root: Path::from(prefix),
            log_dir: Path::from(format!("{prefix}/log")),
            snap_dir: Path::from(format!("{prefix}/snap")),
            beside: watch::channel(Arc::new(BesideListing {
                at: tokio::time::Instant::now(),
                objects: Vec::new(),
            }))
            .0,
            clock_key: format!("{prefix}/clock"),
            view: RwLock::new(Arc::new(Applied { index, state })),
            writer: Mutex::new(()),
            applied_tx: watch::channel(index).0,
            poke: Notify::new(),
            newest_snapshot: AtomicU64::new(0),
        };
        Ok(log)
    }

    fn entry_path(&self, index: u64) -> Path {
        self.log_dir.clone().join(format!("{index:020}"))
    }

    /// Applies one entry in place. The state is cloned only while a reader holds the
    /// previous version (`Arc::make_mut`), so a large state is not copied per entry.
    fn apply_entry(&self, index: u64, entry: &S::Entry) {
        {
            let mut view = self.view.write().unwrap_or_else(|e| e.into_inner());
            let applied = Arc::make_mut(&mut view);
            debug_assert_eq!(applied.index + 1, index, "entries apply in order");
            applied.state.apply(index, entry);
            applied.index = index;
        }
        self.applied_tx.send_replace(index);
    }

    fn current(&self) -> Arc<Applied<S>> {
        self.view.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The index of the last applied entry (0 before the first).
    pub fn applied_index(&self) -> u64 {
        self.current().index
    }

    /// Reads the applied state.
    pub fn read<R>(&self, f: impl FnOnce(&S, u64) -> R) -> R {
        let view = self.current();
        f(&view.state, view.index)
    }

    /// A receiver of the applied index, changed after every apply.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    /// The objects beside the log (keys under the prefix that sort after `log/` and
    /// are not snapshots) as the latest listing saw them; changed after every listing.
    pub fn beside(&self) -> watch::Receiver<Arc<BesideListing>> {
        self.beside.subscribe()
    }

    /// Wakes a running tailer ([`ObjectLog::run_tailer`]) at once.
    pub fn poke(&self) {
        self.poke.notify_one();
    }

    /// Loads the newest snapshot whose index is above `above`, if any.
    async fn load_latest_snapshot(&self, above: u64) -> WalResult<bool> {
        let mut latest: Option<(u64, Path)> = None;
        let mut listing = self.store.list(Some(&self.snap_dir));
        while let Some(meta) = listing.try_next().await? {
            if let Some(i) = index_of(&meta.location)
                && latest.as_ref().is_none_or(|(j, _)| i > *j)
            {
                latest = Some((i, meta.location));
            }
        }
        if let Some((i, _)) = &latest {
            self.newest_snapshot.fetch_max(*i, Ordering::Relaxed);
        }
        let Some((index, path)) = latest.filter(|(i, _)| *i > above) else {
            return Ok(false);
        };
        self.load_snapshot(index, &path).await?;
        Ok(true)
    }

    /// Loads the snapshot at `path`, which holds the state after entry `index`.
    async fn load_snapshot(&self, index: u64, path: &Path) -> WalResult<()> {
        let bytes = self.store.get(path).await?.bytes().await?;
        let state: S = serde_json::from_slice(&bytes)
            .map_err(|e| WalError::Corrupt(format!("snapshot {path}: {e}")))?;
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Applied { index, state });
        self.applied_tx.send_replace(index);
        self.newest_snapshot.fetch_max(index, Ordering::Relaxed);
        Ok(())
    }

    /// Applies entries after the applied index by reading `applied + 1`,
    /// `applied + 2`, ... until one is missing: one GET per new entry, cheap when a
    /// writer knows it is only a little behind. Returns the index at which `token` was
    /// found, if it was. Falls back to listing when the next entry was deleted under
    /// a snapshot.
    async fn probe_locked(&self, token: Option<&[u8; 16]>) -> WalResult<Option<u64>> {
        let mut found = None;
        // A read that fails after our own entry was found and applied must not lose
        // it: the caller would append the entry again.
        match self.probe_into(token, &mut found).await {
            Err(_) if found.is_some() => Ok(found),
            other => other,
        }
    }

    async fn probe_into(
        &self,
        token: Option<&[u8; 16]>,
        found: &mut Option<u64>,
    ) -> WalResult<Option<u64>> {
        let mut index = self.applied_index();
        loop {
            let path = self.entry_path(index + 1);
            let bytes = match self.store.get(&path).await {
                Ok(got) => got.bytes().await?,
                Err(object_store::Error::NotFound { .. }) => break,
                Err(e) => return Err(e.into()),
            };
            let (entry_token, entry): ([u8; 16], S::Entry) = decode_entry(&path, &bytes)?;
            self.apply_entry(index + 1, &entry);
            index += 1;
            if token == Some(&entry_token) {
                *found = Some(index);
            }
        }
        Ok(*found)
    }

    /// Applies every entry after the applied index, found by listing the prefix with
    /// `start_after` the applied entry (one LIST that also shows the snapshots and the
    /// objects beside the log). Returns the index at which `token` was found, if it was.
    ///
    /// Only a listing that ran to its end counts as one (`last_listed`: the staleness
    /// rules, and catch-ups that join it): one that failed after finding `token`
    /// answers it found, as in `probe_locked`, but may have stopped short of entries
    /// that had landed.
    async fn catch_up_locked(&self, token: Option<&[u8; 16]>) -> WalResult<Option<u64>> {
        let started = tokio::time::Instant::now();
        let mut found = None;
        match self.list_and_apply_into(token, &mut found).await {
            Ok(found) => {
                *self.last_listed.lock().unwrap_or_else(|e| e.into_inner()) = started;
                Ok(found)
            }
            Err(_) if found.is_some() => Ok(found),
            Err(e) => Err(e),
        }
    }

    async fn list_and_apply_into(
        &self,
        token: Option<&[u8; 16]>,
        found: &mut Option<u64>,
    ) -> WalResult<Option<u64>> {
        loop {
            let applied = self.applied_index();
            let at = tokio::time::Instant::now();
            let listed: Vec<ObjectMeta> = self
                .store
                .list_with_offset(Some(&self.root), &self.entry_path(applied))
                .try_collect()
                .await?;
            let mut indices = Vec::new();
            let mut newest_snapshot: Option<(u64, Path)> = None;
            let mut beside = Vec::new();
            for meta in listed {
                if meta.location.prefix_matches(&self.log_dir) {
                    indices.extend(index_of(&meta.location));
                } else if meta.location.prefix_matches(&self.snap_dir) {
                    if let Some(i) = index_of(&meta.location)
                        && newest_snapshot.as_ref().is_none_or(|(j, _)| i > *j)
                    {
                        newest_snapshot = Some((i, meta.location));
                    }
                } else {
                    beside.push(meta);
                }
            }
            if let Some((i, _)) = &newest_snapshot {
                self.newest_snapshot.fetch_max(*i, Ordering::Relaxed);
            }
            self.beside.send_replace(Arc::new(BesideListing {
                at,
                objects: beside,
            }));
            indices.retain(|i| *i > applied);
            indices.sort_unstable();
            if indices.first() != Some(&(applied + 1)) {
                // Either we are caught up, or the next entries were deleted under a
                // snapshot we have not read: a newer snapshot tells (the same listing
                // shows every snapshot).
                if let Some((index, path)) = newest_snapshot.filter(|(i, _)| *i > applied) {
                    self.load_snapshot(index, &path).await?;
                    continue;
                }
                if indices.is_empty() {
                    return Ok(*found);
                }
                // A listing taken while entries are created may miss one it should
                // hold (directory walks are not snapshots). Read it directly.
                let before = self.applied_index();
                if let Some(i) = self.probe_locked(token).await? {
                    *found = Some(i);
                }
                if self.applied_index() > before {
                    continue;
                }
                return Err(WalError::Corrupt(format!(
                    "object log {}: entry {} is missing and no snapshot covers it",
                    self.log_dir,
                    applied + 1
                )));
            }
            // The contiguous run after `applied`, fetched CATCH_UP_GETS at a time (a
            // node catching up after a restart reads up to a snapshot interval of
            // entries: one GET after another took seconds on S3) and applied in order.
            let run: Vec<u64> = indices
                .iter()
                .enumerate()
                .take_while(|(n, i)| **i == applied + 1 + *n as u64)
                .map(|(_, i)| *i)
                .collect();
            let mut fetched = futures::stream::iter(run)
                .map(|i| {
                    let path = self.entry_path(i);
                    async move {
                        let got = match self.store.get(&path).await {
                            Ok(got) => got.bytes().await.map(Some),
                            Err(object_store::Error::NotFound { .. }) => Ok(None),
                            Err(e) => Err(e),
                        };
                        (i, path, got)
                    }
                })
                .buffered(CATCH_UP_GETS);
            let mut index = applied;
            let mut vanished = false;
            while let Some((i, path, got)) = fetched.next().await {
                let Some(bytes) = got? else {
                    // Deleted under a snapshot since we listed: list again (the next
                    // listing shows that snapshot).
                    vanished = true;
                    break;
                };
                let (entry_token, entry): ([u8; 16], S::Entry) = decode_entry(&path, &bytes)?;
                self.apply_entry(i, &entry);
                index = i;
                if token == Some(&entry_token) {
                    *found = Some(i);
                }
            }
            // Nothing new, and nothing that vanished: caught up. (Returning after a
            // vanished first entry would leave this handle at a view whose next index
            // no longer exists, and stamp the listing as fresh: an append within
            // `list_refresh` would then only probe, find the index free and create
            // it again under the snapshot that covers it.)
            if index == applied && !vanished {
                return Ok(*found);
            }
        }
    }

    /// Applies every entry appended since the last call. Returns the applied index.
    pub async fn catch_up(&self) -> WalResult<u64> {
        let asked = tokio::time::Instant::now();
        let _guard = self.writer.lock().await;
        // A listing that began after this call did, and finished while it waited for
        // the lock, saw every entry this one would: join it instead of listing again.
        // (Catch-ups queue behind each other and behind appends: a node's takeovers
        // all catch up at once, and on a slow store each listing takes seconds.)
        // Strictly after: an instant equal to `asked` may have been read before it.
        if *self.last_listed.lock().unwrap_or_else(|e| e.into_inner()) > asked {
            return Ok(self.applied_index());
        }
        self.catch_up_locked(None).await?;
        Ok(self.applied_index())
    }

    /// Validates `entry` and appends it (see the module docs).
    ///
    /// Each round catches up (a listing when the last is stale or the round asks for
    /// one, else a probe; either looks for this append's token once a create may have
    /// landed), validates the entry against the view, and creates the next entry
    /// ([`ObjectLog::create_entry`]). What a create's outcome leads to is decided by
    /// [`Attempts::after_create`]; its counters bound every retry.
    pub async fn append(&self, entry: &S::Entry) -> WalResult<Appended<S::Rejection>> {
        let token: [u8; 16] = *uuid::Uuid::new_v4().as_bytes();
        let payload = encode_entry(&token, entry)?;
        let _guard = self.writer.lock().await;
        let mut attempts = Attempts::default();
        loop {
            let look_for = attempts.maybe_landed.then_some(&token);
            let found = if std::mem::take(&mut attempts.list) || self.listing_is_stale() {
                self.catch_up_locked(look_for).await
            } else {
                self.probe_locked(look_for).await
            };
            let found = match found {
                Ok(found) => found,
                Err(WalError::Storage(e))
                    if attempts.storage_errors < APPEND_STORAGE_RETRIES_MAX =>
                {
                    attempts.storage_errors += 1;
                    tracing::debug!("object log catch-up failed, retrying: {e}");
                    tokio::time::sleep(backoff(attempts.storage_errors)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(index) = found {
                return Ok(Appended::At(index));
            }
            let next = {
                let view = self.current();
                if let Err(rejection) = view.state.validate(entry) {
                    return Ok(Appended::Rejected(rejection));
                }
                view.index + 1
            };
            // The view must still be young enough when the create is sent: a process
            // paused since its check (or slowed by a read) for longer than
            // `delete_grace - list_refresh` could otherwise re-create an entry deleted
            // under a snapshot meanwhile, which every reader would skip. So the create
            // leaves within that of the last listing, and has `list_refresh` left to
            // land. (A log that deletes with no grace, as some tests do, has no such
            // window to keep.)
            if self.too_old_to_create() {
                attempts.stale_creates += 1;
                if attempts.stale_creates > APPEND_STORAGE_RETRIES_MAX {
                    return Err(WalError::Storage(format!(
                        "object log {}: every catch-up took longer than delete_grace - \
                         list_refresh; appending on so old a view is not safe",
                        self.log_dir
                    )));
                }
                tracing::debug!(log = %self.log_dir, "the view went stale before the create; listing again");
                attempts.list = true;
                continue;
            }
            let created = self.create_entry(next, &payload).await;
            match attempts.after_create(created, &self.log_dir) {
                AfterCreate::Landed => {
                    self.apply_entry(next, entry);
                    // What follows one's own entry (others' answers to it) is likely
                    // soon: the tailer polls fast again instead of at its idle pace.
                    self.poke();
                    return Ok(Appended::At(next));
                }
                AfterCreate::Again { pause } => {
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                }
                AfterCreate::GiveUp(e) => return Err(e),
            }
        }
    }

    /// Creates entry `next` (a conditional create). It must land within
    /// `list_refresh` of being sent: object_store retries a failed request within the
    /// call (minutes, by default), and a retry that lands late could still meet an
    /// index freed under a snapshot meanwhile. A create cut off here is ambiguous, as
    /// any failed one.
    async fn create_entry(&self, next: u64, payload: &Bytes) -> object_store::Result<()> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let path = self.entry_path(next);
        let create = self
            .store
            .put_opts(&path, PutPayload::from(payload.clone()), opts);
        let created = if self.options.list_refresh.is_zero() {
            create.await
        } else {
            match tokio::time::timeout(self.options.list_refresh, create).await {
                Ok(created) => created,
                Err(_) => Err(object_store::Error::Generic {
                    store: "object log",
                    source: format!(
                        "the create of entry {next} took longer than list_refresh ({:?})",
                        self.options.list_refresh
                    )
                    .into(),
                }),
            }
        };
        created.map(|_| ())
    }

    fn listed_ago(&self) -> Duration {
        self.last_listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Whether the last listing is older than `list_refresh` (see the module docs).
    fn listing_is_stale(&self) -> bool {
        self.listed_ago() > self.options.list_refresh
    }

    /// Whether the last listing is too old for a create to be sent on its view: older
    /// than `delete_grace - list_refresh`.
    fn too_old_to_create(&self) -> bool {
        let limit = self
            .options
            .delete_grace
            .saturating_sub(self.options.list_refresh);
        !limit.is_zero() && self.listed_ago() > limit
    }

    /// Writes a snapshot of the applied state. Returns its index.
    pub async fn write_snapshot(&self) -> WalResult<u64> {
        let view = self.current();
        let json = serde_json::to_vec(&view.state)
            .map_err(|e| WalError::Corrupt(format!("cannot encode snapshot: {e}")))?;
        let path = self.snap_dir.clone().join(format!("{:020}", view.index));
        self.store.put(&path, PutPayload::from(json)).await?;
        self.newest_snapshot
            .fetch_max(view.index, Ordering::Relaxed);
        Ok(view.index)
    }

    /// The index of the newest snapshot of the log this process knows of: loaded,
    /// written, or seen in a listing (0 for none). Another process may have written a
    /// newer one since.
    pub fn newest_snapshot(&self) -> u64 {
        self.newest_snapshot.load(Ordering::Relaxed)
    }

    /// Deletes entries at or below `index` that are older than `delete_grace`, which a
    /// snapshot must cover, and snapshots older than the one covering them.
    pub async fn delete_covered(&self, index: u64) -> WalResult<usize> {
        // Ages by the store's clock, not this node's.
        let now = crate::store::store_now_ms(&self.store, &self.clock_key).await?;
        let grace = now.saturating_sub(self.options.delete_grace.as_millis() as i64);
        let mut snaps: Vec<u64> = self
            .store
            .list(Some(&self.snap_dir))
            .try_filter_map(|m| async move { Ok(index_of(&m.location)) })
            .try_collect()
            .await?;
        snaps.sort_unstable();
        let Some(&covering) = snaps.iter().rev().find(|s| **s >= index) else {
            return Err(WalError::Config(format!(
                "object log {}: no snapshot covers entry {index}",
                self.log_dir
            )));
        };
        let old_snaps = snaps
            .iter()
            .filter(|s| **s < covering)
            .map(|s| self.snap_dir.clone().join(format!("{s:020}")));
        let entries: Vec<Path> = self
            .store
            .list(Some(&self.log_dir))
            .try_filter_map(|m| async move {
                let old = m.last_modified.timestamp_millis() <= grace;
                Ok(index_of(&m.location)
                    .filter(|i| *i <= index && old)
                    .map(|_| m.location))
            })
            .try_collect()
            .await?;
        let all: Vec<Path> = entries.into_iter().chain(old_snaps).collect();
        let count = all.len();
        let stream = futures::stream::iter(all.into_iter().map(Ok)).boxed();
        let _: Vec<Path> = self.store.delete_stream(stream).try_collect().await?;
        Ok(count)
    }

    /// Waits until the applied index reaches `index`, catching up as needed, for at
    /// most `timeout`. Returns the applied index, which may be lower on timeout.
    pub async fn wait_for(&self, index: u64, timeout: Duration) -> WalResult<u64> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.subscribe();
        let mut pause = Duration::from_millis(5);
        loop {
            if self.applied_index() >= index {
                return Ok(self.applied_index());
            }
            self.catch_up().await?;
            if self.applied_index() >= index {
                return Ok(self.applied_index());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(self.applied_index());
            }
            let _ = tokio::time::timeout(pause.min(deadline - now), rx.changed()).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Tails the log until `shutdown` resolves: catches up every `interval_min` while
    /// entries arrive, backing off to `interval_max` while idle; [`ObjectLog::poke`]
    /// wakes it early. Storage errors are logged and retried.
    pub async fn run_tailer(
        &self,
        interval_min: Duration,
        interval_max: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut interval = interval_min;
        loop {
            let before = self.applied_index();
            match self.catch_up().await {
                Ok(after) if after > before => interval = interval_min,
                Ok(_) => interval = (interval * 2).min(interval_max),
                Err(e) => {
                    tracing::warn!("object log {}: tail failed: {e}", self.log_dir);
                    interval = interval_max;
                }
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = self.poke.notified() => interval = interval_min,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// Entries one catch-up fetches at once.
const CATCH_UP_GETS: usize = 16;

/// What one [`ObjectLog::append`] has met so far: the counts its limits bound, whether
/// one of its creates may have landed (so catch-ups look for its token), and whether
/// the next round must list rather than probe.
#[derive(Debug, Default)]
struct Attempts {
    conflicts: u32,
    storage_errors: u32,
    stale_creates: u32,
    maybe_landed: bool,
    list: bool,
}

/// What an append does after a create ([`Attempts::after_create`]).
#[derive(Debug)]
enum AfterCreate {
    /// The entry is ours at the index it was created at.
    Landed,
    /// Another round, after `pause`.
    Again {
        pause: Option<Duration>,
    },
    GiveUp(WalError),
}

impl Attempts {
    /// The decision after a create, and what the next round must know. A conflict is
    /// someone else's entry, or ours (object_store retries a create whose response
    /// was lost, and that retry meets our own object): the catch-up looks for our
    /// token either way, and every few conflicts it lists, since the next entry may
    /// have been deleted under a snapshot, which probing cannot see past. Any other
    /// failure is ambiguous (it may have landed): the next round lists and looks for
    /// the token, after a backoff.
    fn after_create(&mut self, created: object_store::Result<()>, log_dir: &Path) -> AfterCreate {
        match created {
            Ok(()) => AfterCreate::Landed,
            Err(object_store::Error::AlreadyExists { .. }) => {
                self.maybe_landed = true;
                self.conflicts += 1;
                self.list = self.conflicts.is_multiple_of(8);
                if self.conflicts > APPEND_CONFLICTS_MAX {
                    return AfterCreate::GiveUp(WalError::Storage(format!(
                        "object log {log_dir}: gave up after {} conflicting appends",
                        self.conflicts
                    )));
                }
                AfterCreate::Again { pause: None }
            }
            Err(e) => {
                self.maybe_landed = true;
                self.list = true;
                self.storage_errors += 1;
                if self.storage_errors > APPEND_STORAGE_RETRIES_MAX {
                    return AfterCreate::GiveUp(e.into());
                }
                AfterCreate::Again {
                    pause: Some(backoff(self.storage_errors)),
                }
            }
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((10u64 << attempt.min(6)).min(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> object_store::Error {
        object_store::Error::AlreadyExists {
            path: "log/1".into(),
            source: "exists".into(),
        }
    }

    fn failure() -> object_store::Error {
        object_store::Error::Generic {
            store: "test",
            source: "503".into(),
        }
    }

    #[test]
    fn a_landed_create_is_applied() {
        let mut a = Attempts::default();
        assert!(matches!(
            a.after_create(Ok(()), &Path::from("log")),
            AfterCreate::Landed
        ));
        assert!(!a.maybe_landed);
    }

    /// A conflict may be our own create met by a retry: the token is looked for from
    /// then on, every eighth conflict lists, and the limit ends the append.
    #[test]
    fn conflicts_look_for_the_token_list_now_and_then_and_are_bounded() {
        let mut a = Attempts::default();
        for n in 1..=APPEND_CONFLICTS_MAX {
            let next = a.after_create(Err(conflict()), &Path::from("log"));
            assert!(
                matches!(next, AfterCreate::Again { pause: None }),
                "{n}: {next:?}"
            );
            assert!(a.maybe_landed);
            assert_eq!(a.list, n.is_multiple_of(8), "{n}");
            a.list = false;
        }
        let last = a.after_create(Err(conflict()), &Path::from("log"));
        assert!(
            matches!(&last, AfterCreate::GiveUp(WalError::Storage(m)) if m.contains("conflicting appends")),
            "{last:?}"
        );
    }

    /// Any other failure is ambiguous: list next, look for the token, back off, and
    /// give up past the retry limit with the store's error.
    #[test]
    fn an_ambiguous_create_lists_backs_off_and_is_bounded() {
        let mut a = Attempts::default();
        for n in 1..=APPEND_STORAGE_RETRIES_MAX {
            let next = a.after_create(Err(failure()), &Path::from("log"));
            assert!(
                matches!(next, AfterCreate::Again { pause: Some(p) } if p == backoff(n)),
                "{n}: {next:?}"
            );
            assert!(a.maybe_landed && a.list);
        }
        assert!(matches!(
            a.after_create(Err(failure()), &Path::from("log")),
            AfterCreate::GiveUp(WalError::Storage(_))
        ));
    }
}
