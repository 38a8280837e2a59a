//! WAL objects read by takeovers, shared within a node.
//!
//! When a node fails, every bucket it led moves at once, and the nodes that take them
//! over each recover their streams from the same dead WAL: each takeover reads the
//! WAL's objects from its stream's `wal_from` to the fence, and they are mostly the
//! same objects (one group commit holds records of many streams). On a slow store
//! (a single moto process, a throttled S3) those reads, once per stream, were the
//! recovery tail: ten takeovers of one WAL took 17–21 s each in chaos seed 62.
//!
//! So a node reads each object once: a read already in flight is joined, and an
//! object read recently is kept (at most [`KEPT_BYTES_MAX`], for [`KEPT_FOR`]) for the
//! takeovers that come a little later. WAL objects never change once created (each is
//! a conditional create; a fence is one too), so a kept copy is the object. Only
//! successful reads are shared: a missing object or an error is every reader's own
//! (a takeover answers "missing" by reading the stream metadata afresh).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// Bytes of recently read WAL objects kept for later takeovers, at most.
pub(crate) const KEPT_BYTES_MAX: u64 = 64 << 20;

/// How long a read object is kept for later takeovers.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(30);

#[derive(Default)]
pub(crate) struct SharedReads {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    in_flight: HashMap<Path, Weak<OnceCell<Bytes>>>,
    kept: VecDeque<(Path, Bytes, Instant)>,
    kept_bytes: u64,
}

impl Inner {
    fn evict(&mut self, now: Instant) {
        while let Some((_, bytes, at)) = self.kept.front() {
            if self.kept_bytes <= KEPT_BYTES_MAX && now.duration_since(*at) < KEPT_FOR {
                break;
            }
            self.kept_bytes -= bytes.len() as u64;
            self.kept.pop_front();
        }
    }
}

impl SharedReads {
    /// Drops every kept copy (reads in flight finish for their readers).
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.kept.clear();
        inner.kept_bytes = 0;
    }

    /// The object at `path`, from a copy kept or a read in flight when there is one,
    /// otherwise read from `store` (and kept).
    pub(crate) async fn get(
        &self,
        store: &Arc<dyn ObjectStore>,
        path: &Path,
    ) -> object_store::Result<Bytes> {
        let cell = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.evict(Instant::now());
            if let Some((_, bytes, _)) = inner.kept.iter().find(|(p, _, _)| p == path) {
                metrics::counter!("mink_wal_recovery_reads_shared_total").increment(1);
                return Ok(bytes.clone());
            }
            inner.in_flight.retain(|_, w| w.strong_count() > 0);
            match inner.in_flight.get(path).and_then(Weak::upgrade) {
                Some(cell) => {
                    metrics::counter!("mink_wal_recovery_reads_shared_total").increment(1);
                    cell
                }
                None => {
                    let cell = Arc::new(OnceCell::new());
                    inner.in_flight.insert(path.clone(), Arc::downgrade(&cell));
                    cell
                }
            }
        };
        let mut read_here = false;
        let bytes = cell
            .get_or_try_init(|| async {
                read_here = true;
                store.get(path).await?.bytes().await
            })
            .await?
            .clone();
        if read_here {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.kept_bytes += bytes.len() as u64;
            inner
                .kept
                .push_back((path.clone(), bytes.clone(), Instant::now()));
            inner.evict(Instant::now());
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    use crate::fault::{FaultConfig, FaultyStore};

    #[tokio::test(start_paused = true)]
    async fn concurrent_and_later_readers_share_one_get() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faulty = FaultyStore::new(
            inner,
            FaultConfig {
                get_latency: Duration::from_millis(100),
                ..Default::default()
            },
        );
        let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
        let path = Path::from("wal/n/1/1");
        store
            .put(&path, PutPayload::from_static(b"object"))
            .await
            .unwrap();
        let reads = SharedReads::default();
        let (a, b) = tokio::join!(reads.get(&store, &path), reads.get(&store, &path));
        assert_eq!(
            (a.unwrap(), b.unwrap()),
            (Bytes::from("object"), Bytes::from("object"))
        );
        assert_eq!(reads.get(&store, &path).await.unwrap(), "object");
        assert_eq!(
            faulty
                .counters()
                .gets
                .load(std::sync::atomic::Ordering::Relaxed),
            1,
            "one GET for three readers"
        );
        // Kept for a while only.
        tokio::time::sleep(KEPT_FOR).await;
        reads.get(&store, &path).await.unwrap();
        assert_eq!(
            faulty
                .counters()
                .gets
                .load(std::sync::atomic::Ordering::Relaxed),
            2
        );
    }

    #[tokio::test]
    async fn a_missing_object_is_not_shared() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let reads = SharedReads::default();
        let path = Path::from("wal/n/1/9");
        assert!(matches!(
            reads.get(&store, &path).await,
            Err(object_store::Error::NotFound { .. })
        ));
        store
            .put(&path, PutPayload::from_static(b"late"))
            .await
            .unwrap();
        assert_eq!(reads.get(&store, &path).await.unwrap(), "late");
    }
}
