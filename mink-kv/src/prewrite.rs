//! The prewrite buffer of a KV tablet: every key's versions that the local store may
//! not hold, newest last, and (as a bounded write-back cache) durable versions that the
//! store already holds.
//!
//! A version is its changelog offset, its stored row (`None` for a delete), and where
//! the row sits in a recent Put's batch if it came from one ([`ImageRef`]): an update of
//! the key then takes its `-U` image from that batch instead of decoding the stored row. Three kinds sit in
//! the buffer, told apart by offsets alone:
//! - **staged**: at or above the log's high watermark, not yet durable;
//! - **dirty**: below the high watermark (durable) and at or above `flushed`, the high
//!   watermark of the last store write: the store does not have it yet;
//! - **clean**: below `flushed`: the store has it (or a newer version of the key).
//!
//! A key keeps at most one durable version, its newest: an older one is never read
//! again (reads want the newest version, or the newest below a high watermark that is
//! read under this buffer's lock, see [`Prewrite::stage`]), and a store write would
//! only write the newest. So a key rewritten many times between store writes costs one
//! store write, and the merge reads its old row here instead of from the store.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::RecordBatch;
use mink_types::SchemaId;
use rustc_hash::FxBuildHasher;

/// What the prewrite buffers of a node's KV tablets hold together, against a bound
/// (`kv.prewrite_buffers_bytes_max`): a tablet whose Put finds the node past it writes
/// its durable rows to the store and lets the clean ones go, whatever its own bound.
/// Each such write counts as pressure, which tells idle tablets to give their rows up
/// ([`crate::KvTablet::run_snapshots`]).
#[derive(Debug)]
pub struct WriteBackBudget {
    used: AtomicU64,
    max: u64,
    pressure: AtomicU64,
}

impl WriteBackBudget {
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicU64::new(0),
            max,
            pressure: AtomicU64::new(0),
        })
    }

    /// Bytes held by every buffer on it.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn over(&self) -> bool {
        self.used() > self.max
    }

    /// How many times a buffer let its rows go because of the node's bound, not its own.
    pub(crate) fn pressure(&self) -> u64 {
        self.pressure.load(Ordering::Relaxed)
    }

    fn moved(&self, from: u64, to: u64) {
        if to >= from {
            self.used.fetch_add(to - from, Ordering::Relaxed);
        } else {
            self.used.fetch_sub(from - to, Ordering::Relaxed);
        }
        metrics::gauge!("mink_kv_prewrite_bytes").set(self.used() as f64);
    }
}

/// Where a version's row sits in a recent Put's batch: the batch's generation in
/// [`Images`] and the row's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImageRef {
    pub(crate) batch: u64,
    pub(crate) row: u32,
}

/// One version of a key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Version {
    /// Its offset in the changelog.
    pub(crate) offset: i64,
    /// Its stored row; `None` for a delete.
    pub(crate) value: Option<Vec<u8>>,
    /// The same row in a recent Put's batch, if it came from one.
    pub(crate) image: Option<ImageRef>,
}

/// A key's versions, oldest first.
pub(crate) type Versions = VecDeque<Version>;

/// Recent Put batches of the table's schema whose rows were staged with an
/// [`ImageRef`], oldest first. Bounded in bytes: a batch leaves when newer ones need its
/// room, and a reference into a batch that left (or of another schema) is none.
#[derive(Default)]
struct Images {
    /// `(generation, schema id, batch, bytes)`; generations are consecutive.
    batches: VecDeque<(u64, SchemaId, RecordBatch, u64)>,
    /// The next batch's generation.
    next: u64,
    bytes: u64,
    /// References the merges found their batch for, and found it gone (decayed).
    hits: u64,
    misses: u64,
    /// Puts that offered their batch.
    offered: u64,
}

/// While most references find their batch gone (keys come back after their batches
/// left), one Put's batch in this many is kept: keeping costs a copy of the staged
/// rows and memory, and the sample notices when keys start coming back in time.
const IMAGES_SAMPLE: u64 = 16;

impl Images {
    /// Keeps `batch`, letting the oldest batches go while they hold more than `max`
    /// bytes together; returns its generation, or `None` if it alone is over `max`.
    fn push(&mut self, schema_id: SchemaId, batch: RecordBatch, max: u64) -> Option<u64> {
        let size = batch.get_array_memory_size() as u64;
        if size > max {
            return None;
        }
        self.shrink_to(max - size);
        let generation = self.next;
        self.next += 1;
        self.batches.push_back((generation, schema_id, batch, size));
        self.bytes += size;
        Some(generation)
    }

    /// Batch `generation` if it is still here and of schema `schema_id`.
    fn get(&self, generation: u64, schema_id: SchemaId) -> Option<&RecordBatch> {
        let first = self.batches.front()?.0;
        let (_, id, batch, _) = self
            .batches
            .get(usize::try_from(generation.checked_sub(first)?).ok()?)?;
        (*id == schema_id).then_some(batch)
    }

    /// Lets the oldest batches go until they hold at most `max` bytes.
    fn shrink_to(&mut self, max: u64) {
        while self.bytes > max {
            let Some((_, _, _, freed)) = self.batches.pop_front() else {
                break;
            };
            self.bytes -= freed;
        }
    }
}

/// What a key costs beyond its bytes: the map's slot and the deque.
const KEY_OVERHEAD: u64 = 64;
/// What a version costs beyond its row's bytes.
const VERSION_OVERHEAD: u64 = 32;

fn version_bytes(value: &Option<Vec<u8>>) -> u64 {
    VERSION_OVERHEAD + value.as_ref().map_or(0, |v| v.len() as u64)
}

#[derive(Default)]
pub(crate) struct Prewrite {
    /// Hashed, not ordered: a Put probes it twice per row (its old row, its staging),
    /// and a prefix lookup, which needs order, is rare.
    rows: HashMap<Vec<u8>, Versions, FxBuildHasher>,
    /// What the buffer holds, in bytes (keys, rows and overheads).
    bytes: u64,
    /// Bytes of rows staged since the last store write: what a replay after a crash
    /// would read back beyond the store.
    staged_since_write: u64,
    /// The high watermark of the last store write: versions below it are in the store.
    flushed: i64,
    /// The node's budget, which `bytes` is counted against.
    budget: Option<Arc<WriteBackBudget>>,
    /// Recent Put batches that versions point into (counted in `bytes`).
    images: Images,
}

impl Drop for Prewrite {
    fn drop(&mut self) {
        self.set_bytes(0);
    }
}

impl Prewrite {
    pub(crate) fn get(&self, key: &[u8]) -> Option<&Versions> {
        self.rows.get(key)
    }

    /// The newest version of `key` below `hw`: `Some(None)` a delete, `None` none here.
    pub(crate) fn visible(&self, key: &[u8], hw: i64) -> Option<Option<Vec<u8>>> {
        self.rows
            .get(key)?
            .iter()
            .rev()
            .find(|v| v.offset < hw)
            .map(|v| v.value.clone())
    }

    /// Each key starting with `prefix` and its newest version below `hw`, in key order.
    /// Reads the whole buffer (it is bounded).
    pub(crate) fn visible_with_prefix(
        &self,
        prefix: &[u8],
        hw: i64,
    ) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut found: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .rows
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .filter_map(|(key, versions)| {
                let v = versions.iter().rev().find(|v| v.offset < hw)?;
                Some((key.clone(), v.value.clone()))
            })
            .collect();
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        found
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What the keys and rows hold, without the kept batches: what the buffer's bound
    /// is for.
    pub(crate) fn rows_bytes(&self) -> u64 {
        self.bytes - self.images.bytes
    }

    /// Counts this buffer against `budget` from now on.
    pub(crate) fn set_budget(&mut self, budget: Arc<WriteBackBudget>) {
        let bytes = self.bytes;
        self.set_bytes(0);
        self.budget = Some(budget);
        self.set_bytes(bytes);
    }

    /// Whether the node's buffers together are past their bound.
    pub(crate) fn node_over(&self) -> bool {
        self.budget.as_ref().is_some_and(|b| b.over())
    }

    /// Counts a store write that the node's bound, not this buffer's own, made due.
    pub(crate) fn note_pressure(&self) {
        if let Some(budget) = &self.budget {
            budget.pressure.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The node's [`WriteBackBudget::pressure`] (0 without a budget).
    pub(crate) fn node_pressure(&self) -> u64 {
        self.budget.as_ref().map_or(0, |b| b.pressure())
    }

    fn set_bytes(&mut self, bytes: u64) {
        if let Some(budget) = &self.budget {
            budget.moved(self.bytes, bytes);
        }
        self.bytes = bytes;
    }

    /// The high watermark of the last store write: every version below it is in the
    /// store.
    pub(crate) fn flushed(&self) -> i64 {
        self.flushed
    }

    pub(crate) fn staged_since_write(&self) -> u64 {
        self.staged_since_write
    }

    /// Counts a merge's references to kept batches: `hits` found their batch, `misses`
    /// found it gone.
    pub(crate) fn note_images(&mut self, hits: u64, misses: u64) {
        let images = &mut self.images;
        images.hits += hits;
        images.misses += misses;
        if images.hits + images.misses > 1 << 20 {
            images.hits /= 2;
            images.misses /= 2;
        }
    }

    /// Whether the next Put should offer its batch ([`Prewrite::keep_images`]): yes
    /// while kept batches pay (at least one reference in five finds its batch), else
    /// one Put in [`IMAGES_SAMPLE`].
    pub(crate) fn wants_images(&mut self) -> bool {
        let images = &mut self.images;
        images.offered += 1;
        images.misses <= 4 * images.hits || images.offered.is_multiple_of(IMAGES_SAMPLE)
    }

    /// Keeps `batch` (of schema `schema_id`) for the [`ImageRef`]s of the versions
    /// about to be staged from it, within `max` bytes of batches; returns its
    /// generation, or `None` if it does not fit.
    pub(crate) fn keep_images(
        &mut self,
        schema_id: SchemaId,
        batch: RecordBatch,
        max: u64,
    ) -> Option<u64> {
        let before = self.images.bytes;
        let generation = self.images.push(schema_id, batch, max);
        self.set_bytes(self.bytes - before + self.images.bytes);
        generation
    }

    /// Lets kept batches go, oldest first, until the buffer holds at most `bound`; all
    /// of them while the node's buffers are past their bound. They go first, before
    /// any row, and need no store write.
    pub(crate) fn shed_images(&mut self, bound: u64) {
        let room = if self.node_over() {
            0
        } else {
            bound.saturating_sub(self.rows_bytes())
        };
        let rows = self.rows_bytes();
        self.images.shrink_to(room);
        self.set_bytes(rows + self.images.bytes);
    }

    /// The batch an [`ImageRef`] of generation `generation` points into, if it is
    /// still kept and of schema `schema_id`.
    pub(crate) fn image_batch(&self, generation: u64, schema_id: SchemaId) -> Option<&RecordBatch> {
        self.images.get(generation, schema_id)
    }

    /// Stages `value` as `key`'s version at `offset`. `hw` must be read under this
    /// buffer's lock (the caller holds it): versions superseded by one below `hw` are
    /// dropped, and a lookup that reads its high watermark under the lock too reads one
    /// at least as high, so it never needs a dropped version.
    pub(crate) fn stage<I>(&mut self, rows: I, offset: i64, hw: i64)
    where
        I: IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>, Option<ImageRef>)>,
    {
        let mut bytes = self.bytes;
        for (key, value, image) in rows {
            let added = version_bytes(&value);
            bytes += added;
            self.staged_since_write += added;
            let key_len = key.len() as u64;
            let versions = self.rows.entry(key).or_insert_with(|| {
                bytes += KEY_OVERHEAD + key_len;
                VecDeque::new()
            });
            versions.push_back(Version {
                offset,
                value,
                image,
            });
            bytes -= collapse(versions, hw);
        }
        self.set_bytes(bytes);
    }

    /// The store write of a flush at `hw`: each key's newest version below `hw` that
    /// the store does not have yet (at or above the last write's high watermark).
    /// In key order (a B-tree store writes sorted keys faster).
    pub(crate) fn dirty(&self, hw: i64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let flushed = self.flushed;
        let mut dirty: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .rows
            .iter()
            .filter_map(|(key, versions)| {
                let v = versions.iter().rev().find(|v| v.offset < hw)?;
                (v.offset >= flushed).then(|| (key.clone(), v.value.clone()))
            })
            .collect();
        dirty.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        dirty
    }

    /// After the store took everything below `hw`: each key keeps its newest version
    /// below it (now clean) while the buffer holds at most `bytes_max`; past that, the
    /// kept batches leave first ([`Prewrite::shed_images`]), then, if the rows alone are
    /// still past it, every version below `hw`. Versions at or above `hw` stay.
    pub(crate) fn written(&mut self, hw: i64, bytes_max: u64) {
        self.flushed = self.flushed.max(hw);
        self.shed_images(bytes_max);
        let evict = self.bytes > bytes_max || self.node_over();
        let mut bytes = self.images.bytes;
        let mut staged = 0u64;
        self.rows.retain(|key, versions| {
            if evict {
                versions.retain(|v| v.offset >= hw);
            } else {
                collapse(versions, hw);
            }
            if versions.is_empty() {
                return false;
            }
            bytes += KEY_OVERHEAD + key.len() as u64;
            for v in versions.iter() {
                bytes += version_bytes(&v.value);
                if v.offset >= hw {
                    staged += version_bytes(&v.value);
                }
            }
            true
        });
        self.set_bytes(bytes);
        self.staged_since_write = staged;
    }

    /// Drops everything (a failed tablet).
    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        self.images.shrink_to(0);
        self.set_bytes(0);
        self.staged_since_write = 0;
    }
}

/// Drops the versions of a key superseded by a newer one below `hw`; returns the bytes
/// dropped.
fn collapse(versions: &mut Versions, hw: i64) -> u64 {
    let mut dropped = 0;
    while versions.len() >= 2 && versions[1].offset < hw {
        let dropped_version = versions.pop_front().expect("two versions");
        dropped += version_bytes(&dropped_version.value);
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: u8) -> Option<Vec<u8>> {
        Some(vec![n; 10])
    }

    /// One version of one key, without an image.
    fn stage(p: &mut Prewrite, key: &[u8], value: Option<Vec<u8>>, offset: i64, hw: i64) {
        p.stage([(key.to_vec(), value, None)], offset, hw);
    }

    #[test]
    fn a_key_keeps_only_its_newest_durable_version() {
        let mut p = Prewrite::default();
        stage(&mut p, b"k", row(1), 5, 0);
        stage(&mut p, b"k", row(2), 7, 6);
        // 5 is durable but 7 is not: both stay (a lookup at 6 needs 5).
        assert_eq!(p.get(b"k").unwrap().len(), 2);
        stage(&mut p, b"k", row(3), 9, 8);
        // 7 is durable now: 5 is superseded.
        let offsets: Vec<i64> = p.get(b"k").unwrap().iter().map(|v| v.offset).collect();
        assert_eq!(offsets, vec![7, 9]);
        assert_eq!(p.visible(b"k", 8), Some(row(2)));
        assert_eq!(p.visible(b"k", 7), None);
        assert_eq!(
            p.bytes(),
            KEY_OVERHEAD + 1 + 2 * (VERSION_OVERHEAD + 10),
            "the dropped version's bytes are given back"
        );
    }

    #[test]
    fn a_store_write_takes_only_what_the_store_lacks_and_evicts_past_the_bound() {
        let mut p = Prewrite::default();
        let budget = WriteBackBudget::new(u64::MAX);
        p.set_budget(budget.clone());
        stage(&mut p, b"a", row(1), 1, 0);
        stage(&mut p, b"b", None, 2, 0);
        stage(&mut p, b"c", row(3), 3, 0);
        assert_eq!(budget.used(), p.bytes());
        assert_eq!(
            p.dirty(3),
            vec![(b"a".to_vec(), row(1)), (b"b".to_vec(), None)]
        );
        p.written(3, u64::MAX);
        // Below the bound, written versions stay as clean copies; only `c` is dirty.
        assert_eq!(p.visible(b"a", 10), Some(row(1)));
        assert_eq!(p.dirty(10), vec![(b"c".to_vec(), row(3))]);
        assert_eq!(p.staged_since_write(), VERSION_OVERHEAD + 10);
        // Past the bound, everything the store has leaves.
        p.written(10, 0);
        assert!(p.get(b"a").is_none() && p.get(b"c").is_none());
        assert_eq!(p.bytes(), 0);
        assert_eq!(budget.used(), 0);
        assert!(p.dirty(20).is_empty());
    }

    #[test]
    fn buffers_count_against_their_node_and_give_back_when_dropped() {
        let budget = WriteBackBudget::new(150);
        let mut a = Prewrite::default();
        stage(&mut a, b"a", row(1), 1, 0);
        a.set_budget(budget.clone());
        let mut b = Prewrite::default();
        b.set_budget(budget.clone());
        stage(&mut b, b"b", row(2), 1, 0);
        assert_eq!(budget.used(), a.bytes() + b.bytes());
        assert!(budget.over(), "{} bytes", budget.used());
        // A buffer past the node's bound lets its written rows go, whatever its own.
        a.written(5, u64::MAX);
        assert_eq!(a.bytes(), 0);
        assert!(!budget.over());
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    fn batch(rows: i64) -> RecordBatch {
        let ids = arrow::array::Int64Array::from_iter_values(0..rows);
        RecordBatch::try_from_iter([("id", Arc::new(ids) as arrow::array::ArrayRef)]).unwrap()
    }

    #[test]
    fn image_batches_are_bounded_counted_and_let_go_under_pressure() {
        let mut p = Prewrite::default();
        let budget = WriteBackBudget::new(u64::MAX);
        p.set_budget(budget.clone());
        let size = batch(100).get_array_memory_size() as u64;
        // Room for two batches: the third pushes the first out.
        let max = 2 * size + size / 2;
        let first = p.keep_images(1, batch(100), max).unwrap();
        let second = p.keep_images(1, batch(100), max).unwrap();
        assert_eq!(p.bytes(), 2 * size);
        let third = p.keep_images(1, batch(100), max).unwrap();
        assert!(first < second && second < third);
        assert!(p.image_batch(first, 1).is_none(), "the oldest left");
        assert_eq!(p.image_batch(third, 1).unwrap().num_rows(), 100);
        // Of another schema (the table was altered since): no image.
        assert!(p.image_batch(third, 2).is_none());
        assert!(p.image_batch(third + 1, 1).is_none());
        // A batch bigger than the bound is not kept at all.
        assert_eq!(p.keep_images(1, batch(1000), max), None);
        assert_eq!(p.bytes(), 2 * size);
        assert_eq!(budget.used(), p.bytes());
        p.stage(
            [(
                b"k".to_vec(),
                row(1),
                Some(ImageRef {
                    batch: third,
                    row: 7,
                }),
            )],
            1,
            0,
        );
        assert_eq!(p.get(b"k").unwrap()[0].image.unwrap().row, 7);
        // Below the bound, a store write keeps the batches.
        p.written(2, u64::MAX);
        assert!(p.image_batch(third, 1).is_some());
        assert_eq!(
            p.bytes(),
            2 * size + KEY_OVERHEAD + 1 + VERSION_OVERHEAD + 10
        );
        // Past the bound, the batches go first: the rows stay while they alone fit.
        let rows = p.rows_bytes();
        p.written(2, rows + size);
        assert_eq!(p.bytes(), rows + size, "the older batch left");
        assert!(p.image_batch(second, 1).is_none() && p.image_batch(third, 1).is_some());
        assert_eq!(p.visible(b"k", 10), Some(row(1)), "the clean row stayed");
        // With the node's buffers past theirs, every batch goes, without a store write.
        let tight = WriteBackBudget::new(p.bytes() - 1);
        p.set_budget(tight.clone());
        p.shed_images(u64::MAX);
        assert_eq!((p.bytes(), tight.used()), (rows, rows));
        assert_eq!(p.visible(b"k", 10), Some(row(1)));
        p.set_budget(budget.clone());
        p.keep_images(1, batch(100), max).unwrap();
        // Past it with the rows alone, everything the store has leaves.
        p.written(2, 0);
        assert!(p.image_batch(third, 1).is_none());
        assert_eq!((p.bytes(), budget.used()), (0, 0));
        // A failed tablet's buffer drops them too.
        p.keep_images(1, batch(100), max).unwrap();
        p.clear();
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn batches_are_kept_while_keys_come_back_in_time_else_a_sample() {
        let mut p = Prewrite::default();
        assert!((0..10).all(|_| p.wants_images()), "no evidence yet: keep");
        p.note_images(10, 40);
        assert!(p.wants_images(), "one in five found its batch");
        p.note_images(0, 1);
        let kept = (0..64).filter(|_| p.wants_images()).count();
        assert_eq!(kept, 64 / IMAGES_SAMPLE as usize);
        // The sample's references find their batches: back to keeping every one.
        p.note_images(1, 0);
        assert!((0..10).all(|_| p.wants_images()));
    }
}
