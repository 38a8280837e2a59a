//! The fjall backend: one keyspace per namespace, plus a `meta` keyspace holding each
//! namespace's flushed offset, written in the same cross-keyspace batch.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, Readable};
use mink_types::{MinkError, Result};

use crate::store::{
    KvNamespace, KvOp, KvPairs, KvStore, Owner, PairIter, check_namespace, prefix_end, store_error,
};

/// The node's fjall database, reopened in place after it poisons itself.
///
/// fjall refuses every write of a database after one journal write failed (a full
/// disk), for good ("poisoned"). The first write that meets the poisoning **closes**
/// this generation: every namespace handed out so far is dropped from the map and its
/// handles let go, so each of its operations answers `Fenced` from then on, and the
/// tablets holding them fail and reopen (the node reopens a failed tablet on its next
/// request). The next [`KvStore::namespace`] opens the database again, once the old
/// one's last handle is gone (fjall locks its directory while open; a KV snapshot
/// still reading the old one holds it until it ends). A reopened database recovers
/// its journal: it may be behind what the closed one had taken (journal bytes that
/// never reached the disk), which is why every tablet reopens from its store's
/// flushed offset and the log, never carrying on with what it believed the store
/// held.
pub struct FjallStore {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
}

struct State {
    /// `None` while closed after a poisoning, until reopened.
    open: Option<Open>,
    /// Bumped at every close: a namespace closes the store only for its generation.
    generation: u64,
    namespaces: HashMap<String, Arc<FjallNamespace>>,
    /// Every name's [`Owner`], kept across generations: one per name, as the trait
    /// promises, so that the epoch order of the tablets survives a reopen.
    owners: HashMap<String, Arc<Owner>>,
    /// A reopen is running (outside the lock).
    reopening: bool,
    /// When the last reopen failed: the next waits [`REOPEN_RETRY`].
    reopen_failed_at: Option<std::time::Instant>,
}

/// How often a closed store tries to reopen.
const REOPEN_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
struct Open {
    db: Database,
    meta: Keyspace,
}

impl Open {
    fn new(dir: &Path) -> Result<Self> {
        // No fsync: the changelog on object storage is the durable copy.
        let db = Database::builder(dir.join("fjall"))
            .manual_journal_persist(true)
            .open()
            .map_err(fjall_error)?;
        let meta = db
            .keyspace("mink-meta", KeyspaceCreateOptions::default)
            .map_err(fjall_error)?;
        Ok(Self { db, meta })
    }

    fn keyspace(&self, name: &str) -> Result<Keyspace> {
        self.db
            .keyspace(&format!("b-{name}"), KeyspaceCreateOptions::default)
            .map_err(fjall_error)
    }
}

impl FjallStore {
    pub fn open(dir: &Path) -> Result<Self> {
        let open = Open::new(dir)?;
        Ok(Self {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                state: Mutex::new(State {
                    open: Some(open),
                    generation: 0,
                    namespaces: HashMap::new(),
                    owners: HashMap::new(),
                    reopening: false,
                    reopen_failed_at: None,
                }),
            }),
        })
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open database, reopened first when a poisoning closed it. The reopen runs
    /// outside the lock (it recovers fjall's journal, and waits a little for the
    /// directory's lock), one at a time, at most once per [`REOPEN_RETRY`]; callers
    /// meanwhile are answered `Unavailable` at once.
    fn current(&self) -> Result<Open> {
        let unavailable = |why: &str| {
            MinkError::Unavailable(format!(
                "the local KV store is reopening after a failed write ({why}); retry"
            ))
        };
        {
            let mut state = self.state();
            if let Some(open) = &state.open {
                return Ok(open.clone());
            }
            if state.reopening {
                return Err(unavailable("another open is trying"));
            }
            if state
                .reopen_failed_at
                .is_some_and(|at| at.elapsed() < REOPEN_RETRY)
            {
                return Err(unavailable("the last try failed less than a second ago"));
            }
            state.reopening = true;
        }
        let opened = Open::new(&self.dir);
        let mut state = self.state();
        state.reopening = false;
        match opened {
            Ok(open) => {
                tracing::warn!(
                    dir = %self.dir.display(),
                    "local KV store reopened after a failed write"
                );
                metrics::counter!("mink_kv_store_reopens_total").increment(1);
                state.reopen_failed_at = None;
                state.open = Some(open.clone());
                Ok(open)
            }
            Err(e) => {
                state.reopen_failed_at = Some(std::time::Instant::now());
                Err(unavailable(&format!(
                    "it cannot be opened yet: {e}; a write stalled in fjall when its \
                     background work died keeps the old one open, and then only a restart \
                     frees it"
                )))
            }
        }
    }

    /// Closes generation `generation` after a write met its poisoning: every namespace
    /// of it lets its handles go and answers `Fenced` from then on.
    fn close(&self, generation: u64) {
        let mut state = self.state();
        if state.generation != generation || state.open.is_none() {
            return;
        }
        tracing::error!(
            dir = %self.dir.display(),
            "the local KV store refuses every write since a journal write failed \
             (fjall: poisoned); its tablets reopen, and the store reopens with them"
        );
        state.open = None;
        state.generation += 1;
        for (_, ns) in state.namespaces.drain() {
            *ns.handles.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

impl KvStore for FjallStore {
    fn namespace(&self, name: &str) -> Result<Arc<dyn KvNamespace>> {
        check_namespace(name)?;
        if let Some(ns) = self.shared.state().namespaces.get(name) {
            return Ok(ns.clone());
        }
        self.shared.current()?;
        let mut state = self.shared.state();
        if let Some(ns) = state.namespaces.get(name) {
            return Ok(ns.clone());
        }
        // Closed again since: the next call reopens.
        let Some(open) = state.open.clone() else {
            return Err(MinkError::Unavailable(
                "the local KV store was closed after a failed write; retry".into(),
            ));
        };
        let keyspace = open.keyspace(name)?;
        let owner = state
            .owners
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Owner::new(name)))
            .clone();
        let ns = Arc::new(FjallNamespace {
            handles: RwLock::new(Some(Handles {
                db: open.db,
                keyspace,
                meta: open.meta,
            })),
            shared: Arc::downgrade(&self.shared),
            generation: state.generation,
            name: name.to_string(),
            owner,
        });
        state.namespaces.insert(name.to_string(), ns.clone());
        Ok(ns)
    }

    fn drop_namespace(&self, name: &str) -> Result<()> {
        check_namespace(name)?;
        let open = self.shared.current()?;
        let generation = {
            let mut state = self.shared.state();
            if let Some(ns) = state.namespaces.remove(name) {
                *ns.handles.write().unwrap_or_else(|e| e.into_inner()) = None;
            }
            state.owners.remove(name);
            state.generation
        };
        if !open.db.keyspace_exists(&format!("b-{name}")) {
            return Ok(());
        }
        let keyspace = open.keyspace(name)?;
        let poisoned = |e| write_error(&self.shared, generation, name, e);
        open.meta.remove(name).map_err(poisoned)?;
        open.db.delete_keyspace(keyspace).map_err(poisoned)
    }
}

/// A write's error; one that met the database's poisoning closes `generation`.
fn write_error(shared: &Shared, generation: u64, name: &str, e: fjall::Error) -> MinkError {
    match e {
        fjall::Error::Poisoned => {
            shared.close(generation);
            MinkError::Fenced(format!(
                "KV namespace {name}: fjall refuses every write since a journal write failed \
                 (poisoned); the store is reopened and the tablet reopens from the log"
            ))
        }
        e => fjall_error(e),
    }
}

/// A fjall error: a full disk is a condition to wait out and retry (`Unavailable`,
/// naming it), not a bug; anything else is `Internal`.
fn fjall_error(e: fjall::Error) -> MinkError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
        {
            return MinkError::Unavailable(format!(
                "the local KV store's disk is full ({e}); retry"
            ));
        }
        source = s.source();
    }
    store_error(e)
}

pub struct FjallNamespace {
    /// `None` once its generation of the database is closed.
    handles: RwLock<Option<Handles>>,
    /// Weak: the store's map holds its namespaces.
    shared: Weak<Shared>,
    generation: u64,
    name: String,
    owner: Arc<Owner>,
}

#[derive(Clone)]
struct Handles {
    db: Database,
    keyspace: Keyspace,
    meta: Keyspace,
}

impl FjallNamespace {
    /// This namespace's handles, while its generation of the database is open.
    fn handles(&self) -> Result<Handles> {
        self.reading(|h| Ok(h.clone()))
    }

    /// Runs a read on this namespace's handles (under their lock: no clones per read),
    /// while its generation of the database is open.
    fn reading<T>(&self, f: impl FnOnce(&Handles) -> Result<T>) -> Result<T> {
        let handles = self.handles.read().unwrap_or_else(|e| e.into_inner());
        match handles.as_ref() {
            Some(h) => f(h),
            None => Err(MinkError::Fenced(format!(
                "KV namespace {}: the local KV store was closed after a failed write and \
                 is reopened; the tablet reopens from the log",
                self.name
            ))),
        }
    }

    /// A write's error; one that met the database's poisoning closes it.
    fn write_error(&self, e: fjall::Error) -> MinkError {
        match self.shared.upgrade() {
            Some(shared) => write_error(&shared, self.generation, &self.name, e),
            None => fjall_error(e),
        }
    }
}

fn collect(iter: fjall::Iter, limit: usize) -> Result<KvPairs> {
    let mut out = Vec::new();
    for guard in iter.take(limit) {
        let (k, v) = guard.into_inner().map_err(fjall_error)?;
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

impl KvNamespace for FjallNamespace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.reading(|h| {
            Ok(h.keyspace
                .get(key)
                .map_err(fjall_error)?
                .map(|v| v.to_vec()))
        })
    }

    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.reading(|h| {
            keys.iter()
                .map(|k| Ok(h.keyspace.get(k).map_err(fjall_error)?.map(|v| v.to_vec())))
                .collect()
        })
    }

    fn write(&self, ops: &[KvOp], flushed_offset: i64) -> Result<()> {
        let h = self.handles()?;
        let mut batch = h.db.batch();
        for op in ops {
            match op {
                KvOp::Put(k, v) => batch.insert(&h.keyspace, k.as_slice(), v.as_slice()),
                KvOp::Delete(k) => batch.remove(&h.keyspace, k.as_slice()),
            }
        }
        batch.insert(
            &h.meta,
            self.name.as_str(),
            flushed_offset.to_le_bytes().as_slice(),
        );
        batch.commit().map_err(|e| self.write_error(e))
    }

    fn flushed_offset(&self) -> Result<Option<i64>> {
        self.reading(|h| {
            Ok(h.meta
                .get(self.name.as_str())
                .map_err(fjall_error)?
                .and_then(|v| v.as_ref().try_into().ok().map(i64::from_le_bytes)))
        })
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        self.reading(|h| match end {
            Some(end) => collect(h.keyspace.range(start..end), limit),
            None => collect(h.keyspace.range(start..), limit),
        })
    }

    fn prefix(&self, prefix: &[u8], limit: usize) -> Result<KvPairs> {
        match prefix_end(prefix) {
            Some(end) => self.range(prefix, Some(&end), limit),
            None => self.range(prefix, None, limit),
        }
    }

    fn snapshot(&self) -> Result<PairIter> {
        let h = self.handles()?;
        let snapshot = h.db.snapshot();
        let iter = snapshot.iter(&h.keyspace);
        // The iterator keeps the handles: a fjall iterator alone does not hold its
        // database open, and a reopen under it would reuse its files' ids.
        Ok(Box::new(iter.map(move |g| {
            let _open = &h;
            g.into_inner()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(fjall_error)
        })))
    }

    fn clear(&self) -> Result<()> {
        // The flushed offset goes first, and reaches the disk before the pairs go: the
        // journal is written out only when persisted (`manual_journal_persist`), while
        // a keyspace's clear writes its new, empty version at once. A crash must not
        // leave an offset over an emptied keyspace (the open would replay from it over
        // nothing, or over old journal entries fjall replays into the empty tree). An
        // offset gone over old pairs is safe: every open that finds no offset clears
        // the store before it loads or replays (see `KvTablet::recover`).
        let h = self.handles()?;
        h.meta
            .remove(self.name.as_str())
            .map_err(|e| self.write_error(e))?;
        h.db.persist(fjall::PersistMode::SyncAll)
            .map_err(|e| self.write_error(e))?;
        h.keyspace.clear().map_err(|e| self.write_error(e))
    }

    fn owner(&self) -> &Owner {
        &self.owner
    }
}
