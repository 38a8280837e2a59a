//! The fjall backend: one keyspace per namespace, plus a `meta` keyspace holding each
//! namespace's flushed offset, written in the same cross-keyspace batch.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, Readable};
use mink_types::Result;

use crate::store::{
    KvNamespace, KvOp, KvPairs, KvStore, Owner, PairIter, check_namespace, prefix_end, store_error,
};

pub struct FjallStore {
    db: Database,
    meta: Keyspace,
    open: Mutex<HashMap<String, Arc<FjallNamespace>>>,
}

impl FjallStore {
    pub fn open(dir: &Path) -> Result<Self> {
        // No fsync: the changelog on object storage is the durable copy.
        let db = Database::builder(dir.join("fjall"))
            .manual_journal_persist(true)
            .open()
            .map_err(store_error)?;
        let meta = db
            .keyspace("mink-meta", KeyspaceCreateOptions::default)
            .map_err(store_error)?;
        Ok(Self {
            db,
            meta,
            open: Mutex::new(HashMap::new()),
        })
    }
}

impl KvStore for FjallStore {
    fn namespace(&self, name: &str) -> Result<Arc<dyn KvNamespace>> {
        check_namespace(name)?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ns) = open.get(name) {
            return Ok(ns.clone());
        }
        let keyspace = self
            .db
            .keyspace(&format!("b-{name}"), KeyspaceCreateOptions::default)
            .map_err(store_error)?;
        let ns = Arc::new(FjallNamespace {
            db: self.db.clone(),
            keyspace,
            meta: self.meta.clone(),
            name: name.to_string(),
            owner: Owner::new(name),
        });
        open.insert(name.to_string(), ns.clone());
        Ok(ns)
    }

    fn drop_namespace(&self, name: &str) -> Result<()> {
        let ns = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        let ns = match ns {
            Some(ns) => ns,
            None => {
                check_namespace(name)?;
                if !self.db.keyspace_exists(&format!("b-{name}")) {
                    return Ok(());
                }
                Arc::new(FjallNamespace {
                    db: self.db.clone(),
                    keyspace: self
                        .db
                        .keyspace(&format!("b-{name}"), KeyspaceCreateOptions::default)
                        .map_err(store_error)?,
                    meta: self.meta.clone(),
                    name: name.to_string(),
                    owner: Owner::new(name),
                })
            }
        };
        self.meta.remove(name).map_err(store_error)?;
        let keyspace = ns.keyspace.clone();
        drop(ns);
        self.db.delete_keyspace(keyspace).map_err(store_error)
    }
}

pub struct FjallNamespace {
    db: Database,
    keyspace: Keyspace,
    meta: Keyspace,
    name: String,
    owner: Owner,
}

fn collect(iter: fjall::Iter, limit: usize) -> Result<KvPairs> {
    let mut out = Vec::new();
    for guard in iter.take(limit) {
        let (k, v) = guard.into_inner().map_err(store_error)?;
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

impl KvNamespace for FjallNamespace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .keyspace
            .get(key)
            .map_err(store_error)?
            .map(|v| v.to_vec()))
    }

    fn write(&self, ops: &[KvOp], flushed_offset: i64) -> Result<()> {
        let mut batch = self.db.batch();
        for op in ops {
            match op {
                KvOp::Put(k, v) => batch.insert(&self.keyspace, k.as_slice(), v.as_slice()),
                KvOp::Delete(k) => batch.remove(&self.keyspace, k.as_slice()),
            }
        }
        batch.insert(
            &self.meta,
            self.name.as_str(),
            flushed_offset.to_le_bytes().as_slice(),
        );
        batch.commit().map_err(|e| match e {
            // fjall refuses every write of the database after one journal write failed.
            fjall::Error::Poisoned => store_error(
                "fjall refuses every write since a journal write failed (poisoned): \
                 restart the node once the disk has room",
            ),
            e => store_error(e),
        })
    }

    fn flushed_offset(&self) -> Result<Option<i64>> {
        Ok(self
            .meta
            .get(self.name.as_str())
            .map_err(store_error)?
            .and_then(|v| v.as_ref().try_into().ok().map(i64::from_le_bytes)))
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        match end {
            Some(end) => collect(self.keyspace.range(start..end), limit),
            None => collect(self.keyspace.range(start..), limit),
        }
    }

    fn prefix(&self, prefix: &[u8], limit: usize) -> Result<KvPairs> {
        match prefix_end(prefix) {
            Some(end) => self.range(prefix, Some(&end), limit),
            None => self.range(prefix, None, limit),
        }
    }

    fn snapshot(&self) -> Result<PairIter> {
        let snapshot = self.db.snapshot();
        let iter = snapshot.iter(&self.keyspace);
        Ok(Box::new(iter.map(|g| {
            g.into_inner()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(store_error)
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
        self.meta.remove(self.name.as_str()).map_err(store_error)?;
        self.db
            .persist(fjall::PersistMode::SyncAll)
            .map_err(store_error)?;
        self.keyspace.clear().map_err(store_error)
    }

    fn owner(&self) -> &Owner {
        &self.owner
    }
}
