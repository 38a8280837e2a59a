//! The redb backend: one table per namespace, plus a `mink-meta` table holding each
//! namespace's flushed offset, written in the same transaction. Commits use
//! `Durability::None`: a crash rolls back to an earlier consistent commit.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mink_types::Result;
use redb::{Database, Durability, ReadableDatabase, TableDefinition};

use crate::store::{
    KvNamespace, KvOp, KvPairs, KvStore, Owner, PairIter, check_namespace, prefix_end, store_error,
};

const META: TableDefinition<&str, i64> = TableDefinition::new("mink-meta");

pub struct RedbStore {
    db: Arc<Database>,
    /// Namespaces handed out, so that every handle of a name shares its [`Owner`].
    open: Mutex<HashMap<String, Arc<RedbNamespace>>>,
}

impl RedbStore {
    pub fn open(dir: &Path) -> Result<Self> {
        let db = Database::create(dir.join("kv.redb")).map_err(store_error)?;
        Ok(Self {
            db: Arc::new(db),
            open: Mutex::new(HashMap::new()),
        })
    }
}

impl KvStore for RedbStore {
    fn namespace(&self, name: &str) -> Result<Arc<dyn KvNamespace>> {
        check_namespace(name)?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ns) = open.get(name) {
            return Ok(ns.clone());
        }
        let ns = RedbNamespace {
            db: self.db.clone(),
            table: format!("b-{name}"),
            name: name.to_string(),
            owner: Owner::new(name),
        };
        // Create the table so that reads find it.
        let mut tx = self.db.begin_write().map_err(store_error)?;
        tx.set_durability(Durability::None).map_err(store_error)?;
        tx.open_table(ns.def()).map_err(store_error)?;
        tx.open_table(META).map_err(store_error)?;
        tx.commit().map_err(store_error)?;
        let ns = Arc::new(ns);
        open.insert(name.to_string(), ns.clone());
        Ok(ns)
    }

    fn drop_namespace(&self, name: &str) -> Result<()> {
        check_namespace(name)?;
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        let table = format!("b-{name}");
        let mut tx = self.db.begin_write().map_err(store_error)?;
        tx.set_durability(Durability::None).map_err(store_error)?;
        tx.delete_table(TableDefinition::<&[u8], &[u8]>::new(&table))
            .map_err(store_error)?;
        tx.open_table(META)
            .map_err(store_error)?
            .remove(name)
            .map_err(store_error)?;
        tx.commit().map_err(store_error)
    }
}

pub struct RedbNamespace {
    db: Arc<Database>,
    table: String,
    name: String,
    owner: Owner,
}

impl RedbNamespace {
    fn def(&self) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
        TableDefinition::new(&self.table)
    }

    fn read<R>(
        &self,
        f: impl FnOnce(&redb::ReadOnlyTable<&'static [u8], &'static [u8]>) -> Result<R>,
    ) -> Result<R> {
        let tx = self.db.begin_read().map_err(store_error)?;
        let table = tx.open_table(self.def()).map_err(store_error)?;
        f(&table)
    }
}

fn collect<'a>(
    iter: impl Iterator<
        Item = std::result::Result<
            (
                redb::AccessGuard<'a, &'static [u8]>,
                redb::AccessGuard<'a, &'static [u8]>,
            ),
            redb::StorageError,
        >,
    >,
    limit: usize,
) -> Result<KvPairs> {
    let mut out = Vec::new();
    for item in iter.take(limit) {
        let (k, v) = item.map_err(store_error)?;
        out.push((k.value().to_vec(), v.value().to_vec()));
    }
    Ok(out)
}

impl KvNamespace for RedbNamespace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(|t| Ok(t.get(key).map_err(store_error)?.map(|v| v.value().to_vec())))
    }

    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.read(|t| {
            keys.iter()
                .map(|k| {
                    Ok(t.get(k.as_slice())
                        .map_err(store_error)?
                        .map(|v| v.value().to_vec()))
                })
                .collect()
        })
    }

    fn write(&self, ops: &[KvOp], flushed_offset: i64) -> Result<()> {
        let mut tx = self.db.begin_write().map_err(store_error)?;
        tx.set_durability(Durability::None).map_err(store_error)?;
        {
            let mut table = tx.open_table(self.def()).map_err(store_error)?;
            for op in ops {
                match op {
                    KvOp::Put(k, v) => {
                        table
                            .insert(k.as_slice(), v.as_slice())
                            .map_err(store_error)?;
                    }
                    KvOp::Delete(k) => {
                        table.remove(k.as_slice()).map_err(store_error)?;
                    }
                }
            }
            let mut meta = tx.open_table(META).map_err(store_error)?;
            meta.insert(self.name.as_str(), flushed_offset)
                .map_err(store_error)?;
        }
        tx.commit().map_err(store_error)
    }

    fn flushed_offset(&self) -> Result<Option<i64>> {
        let tx = self.db.begin_read().map_err(store_error)?;
        let meta = match tx.open_table(META) {
            Ok(m) => m,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(store_error(e)),
        };
        Ok(meta
            .get(self.name.as_str())
            .map_err(store_error)?
            .map(|v| v.value()))
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        self.read(|t| match end {
            Some(end) => collect(t.range(start..end).map_err(store_error)?, limit),
            None => collect(t.range(start..).map_err(store_error)?, limit),
        })
    }

    fn prefix(&self, prefix: &[u8], limit: usize) -> Result<KvPairs> {
        match prefix_end(prefix) {
            Some(end) => self.range(prefix, Some(&end), limit),
            None => self.range(prefix, None, limit),
        }
    }

    fn snapshot(&self) -> Result<PairIter> {
        // A read transaction is a consistent snapshot, and a read-only table's range
        // keeps it alive: the pairs are read as the iterator is driven.
        let tx = self.db.begin_read().map_err(store_error)?;
        let table = tx.open_table(self.def()).map_err(store_error)?;
        let range = table.range::<&[u8]>(..).map_err(store_error)?;
        Ok(Box::new(range.map(|item| {
            let (k, v) = item.map_err(store_error)?;
            Ok((k.value().to_vec(), v.value().to_vec()))
        })))
    }

    fn clear(&self) -> Result<()> {
        let mut tx = self.db.begin_write().map_err(store_error)?;
        tx.set_durability(Durability::None).map_err(store_error)?;
        tx.delete_table(self.def()).map_err(store_error)?;
        tx.open_table(self.def()).map_err(store_error)?;
        tx.open_table(META)
            .map_err(store_error)?
            .remove(self.name.as_str())
            .map_err(store_error)?;
        tx.commit().map_err(store_error)
    }

    fn owner(&self) -> &Owner {
        &self.owner
    }

    /// No: a redb commit beside the merge's read transactions slowed `bench kv` by
    /// ~8% (three alternating pairs of runs, 3 rounds each: 227,000–265,000 upserts/s
    /// between merges, 214,000–240,000 beside them).
    fn flush_beside_merges(&self) -> bool {
        false
    }
}
