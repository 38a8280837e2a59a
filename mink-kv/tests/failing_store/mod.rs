//! A local KV store whose writes can be made to fail, as on a full disk, and a real
//! small disk to fill up: the KV tablet's tests (`kv_tablet.rs`), its model test
//! (`kv_concurrent.rs`) and the store's (`store.rs`) share it. Each test crate uses
//! part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use mink_kv::store::{KvPairs, PairIter};
use mink_kv::{KvNamespace, KvOp, KvStore, Owner};
use mink_types::{MinkError, Result};

/// What a refused write says: what a full disk says (a store error is `Internal`).
pub const STORE_FAULT: &str = "No space left on device (os error 28)";

/// Which writes of a [`FailingStore`] or [`FailingNamespace`] fail: every one while
/// set, and the next few.
#[derive(Default)]
pub struct StoreFaults {
    failing: AtomicBool,
    next: AtomicU32,
    /// Writes refused so far.
    refused: AtomicU32,
    /// While `true`, writes wait here (on the thread that writes) before they go on;
    /// the count is of writes waiting.
    gate: Mutex<(bool, u32)>,
    opened: Condvar,
}

impl StoreFaults {
    /// Holds every write from now on until [`StoreFaults::release`], or until the
    /// guard is dropped (a test that fails while writes are held must not leave its
    /// runtime waiting for them at shutdown).
    pub fn hold(self: &Arc<Self>) -> HeldWrites {
        self.gate.lock().unwrap().0 = true;
        HeldWrites(self.clone())
    }

    /// Lets the held writes go on.
    pub fn release(&self) {
        self.gate.lock().unwrap().0 = false;
        self.opened.notify_all();
    }

    /// Writes held now.
    pub fn held(&self) -> u32 {
        self.gate.lock().unwrap().1
    }

    fn pass_gate(&self) {
        let mut gate = self.gate.lock().unwrap();
        gate.1 += 1;
        while gate.0 {
            gate = self.opened.wait(gate).unwrap();
        }
        gate.1 -= 1;
    }

    /// Every write fails while `failing`.
    pub fn set(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// The next `writes` writes fail.
    pub fn fail_next(&self, writes: u32) {
        self.next.store(writes, Ordering::SeqCst);
    }

    /// Writes refused so far.
    pub fn refused(&self) -> u32 {
        self.refused.load(Ordering::SeqCst)
    }

    fn fails(&self) -> bool {
        let fails = self.failing.load(Ordering::SeqCst)
            || self
                .next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if fails {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        fails
    }
}

/// Releases the writes held by [`StoreFaults::hold`] when dropped.
pub struct HeldWrites(Arc<StoreFaults>);

impl Drop for HeldWrites {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A store whose namespaces are [`FailingNamespace`]s sharing one [`StoreFaults`].
pub struct FailingStore {
    pub inner: Arc<dyn KvStore>,
    pub faults: Arc<StoreFaults>,
}

impl KvStore for FailingStore {
    fn namespace(&self, name: &str) -> Result<Arc<dyn KvNamespace>> {
        Ok(Arc::new(FailingNamespace {
            inner: self.inner.namespace(name)?,
            faults: self.faults.clone(),
        }))
    }

    fn drop_namespace(&self, name: &str) -> Result<()> {
        self.inner.drop_namespace(name)
    }
}

/// A namespace whose writes fail as its [`StoreFaults`] say; everything else passes
/// through.
pub struct FailingNamespace {
    pub inner: Arc<dyn KvNamespace>,
    pub faults: Arc<StoreFaults>,
}

impl KvNamespace for FailingNamespace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }
    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.inner.multi_get(keys)
    }
    fn write(&self, ops: &[KvOp], flushed_offset: i64) -> Result<()> {
        self.faults.pass_gate();
        if self.faults.fails() {
            return Err(MinkError::Internal(format!("KV store: {STORE_FAULT}")));
        }
        self.inner.write(ops, flushed_offset)
    }
    fn flushed_offset(&self) -> Result<Option<i64>> {
        self.inner.flushed_offset()
    }
    fn range(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        self.inner.range(start, end, limit)
    }
    fn prefix(&self, prefix: &[u8], limit: usize) -> Result<KvPairs> {
        self.inner.prefix(prefix, limit)
    }
    fn snapshot(&self) -> Result<PairIter> {
        self.inner.snapshot()
    }
    fn clear(&self) -> Result<()> {
        self.inner.clear()
    }
    fn owner(&self) -> &Owner {
        self.inner.owner()
    }
    fn flush_beside_merges(&self) -> bool {
        self.inner.flush_beside_merges()
    }
}

/// A small tmpfs, mounted for a test and unmounted after it; `None` where mounting is
/// not allowed (it needs CAP_SYS_ADMIN).
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        status.success().then_some(Self { dir })
    }

    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Writes a file until the disk is full; returns it.
    pub fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).and_then(|()| f.flush()).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
