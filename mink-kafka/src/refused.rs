//! Batches of idempotent producers that were refused as not persisted (or are still
//! on their way), remembered per partition and producer (id and epoch) so that a
//! later batch of the same producer that finds a gap is refused the same retriable
//! way instead of as a sequence error.
//!
//! Why: a producer pipelines batches. When batch N is refused with a retriable error
//! (the WAL upload failed and the bucket's tablet is being reopened), batch N+1 may
//! already be on its way and reach the reopened tablet before N is retried. The
//! tablet sees a gap and answers OUT_OF_ORDER_SEQUENCE_NUMBER, or, if N was the
//! producer's first batch there, UNKNOWN_PRODUCER_ID. librdkafka answers both by
//! bumping its epoch (or failing fatally) and re-sending every unacknowledged record
//! as new: a record that was in fact written once is then written twice (librdkafka
//! #4953). A Kafka broker does not meet this because a leader change fails every
//! in-flight batch alike. Refusing N+1 the way N was refused does the same here: the
//! producer retries N, N+1, ... in order under the same epoch and nothing is
//! duplicated.
//!
//! A batch counts from when it is submitted, not only from its refusal: the refusal
//! of N is learnt when N's append resolves, and nothing orders that before N+1
//! reaching a reopened tablet.
//!
//! Only a gap such a batch explains is answered so: it must lie in the gap, between
//! what the tablet expects and the late batch. A gap with no unwritten batch behind it
//! stays a sequence error. Entries are forgotten once a batch of the producer at or
//! past the remembered sequence is written, after [`REFUSAL_TTL`], and beyond
//! [`REFUSALS_MAX`] (then the sequence error is the answer).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use mink_types::{KAFKA_SEQUENCE_MODULUS, kafka_sequence_ahead};

/// How long a refusal is remembered: well past the retry backoff of a client, short
/// of a producer that gave up on the batch for good.
pub const REFUSAL_TTL: Duration = Duration::from_secs(120);
/// Refusals remembered per node.
pub const REFUSALS_MAX: usize = 10_000;
/// How often a full memory is swept for expired entries at most.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Unwritten batches kept per producer and partition: a producer has at most 5
/// in flight, and retries them.
const FIRSTS_MAX: usize = 16;

#[derive(Debug)]
struct Unwritten {
    /// The first sequences of the batches submitted or refused since the producer
    /// last wrote past them.
    firsts: BTreeSet<i64>,
    at: Instant,
}

type Key = (String, i32, i64);

/// See the module docs.
#[derive(Debug, Default)]
pub struct RefusedBatches {
    entries: Mutex<HashMap<Key, Unwritten>>,
    /// When the entries were last swept for expired ones (only when full).
    swept: Mutex<Option<Instant>>,
}

/// Whether a Produce error code means "not written, send it again": what librdkafka
/// retries in order under the same epoch.
pub fn is_retriable_refusal(code: ResponseError) -> bool {
    matches!(
        code,
        ResponseError::NotLeaderOrFollower
            | ResponseError::LeaderNotAvailable
            | ResponseError::KafkaStorageError
            | ResponseError::RequestTimedOut
    )
}

impl RefusedBatches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Unwritten>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `writer`'s batch starting at `first_sequence` is not known to be
    /// written: it was submitted, or refused with a retriable error.
    pub fn unwritten(&self, topic: &str, partition: i32, writer: i64, first_sequence: i64) {
        let now = Instant::now();
        let mut entries = self.lock();
        let key = (topic.to_string(), partition, writer);
        if !entries.contains_key(&key) && entries.len() >= REFUSALS_MAX {
            // Full: sweep what expired, at most once a second (a sweep walks them all,
            // under the lock every produce takes); when nothing could be swept, this
            // batch goes unremembered.
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            if swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY) {
                *swept = Some(now);
                entries.retain(|_, u| now.duration_since(u.at) < REFUSAL_TTL);
            }
            if entries.len() >= REFUSALS_MAX {
                metrics::counter!("mink_kafka_unremembered_batches_total").increment(1);
                return;
            }
        }
        let entry = entries.entry(key).or_insert_with(|| Unwritten {
            firsts: BTreeSet::new(),
            at: now,
        });
        entry.at = now;
        entry.firsts.insert(first_sequence);
        if entry.firsts.len() > FIRSTS_MAX {
            entry.firsts.pop_last();
        }
    }

    /// Forgets `writer`'s batch starting at `first_sequence`: it failed for good (a
    /// retry of it cannot come, so it explains no gap).
    pub fn forget(&self, topic: &str, partition: i32, writer: i64, first_sequence: i64) {
        let mut entries = self.lock();
        let key = (topic.to_string(), partition, writer);
        if let Some(entry) = entries.get_mut(&key) {
            entry.firsts.remove(&first_sequence);
            if entry.firsts.is_empty() {
                entries.remove(&key);
            }
        }
    }

    /// Forgets `writer`'s batches up to `last_sequence`: written (a later batch is
    /// only written after them). Sequences compare on Kafka's circle (they wrap after
    /// `i32::MAX`).
    pub fn written(&self, topic: &str, partition: i32, writer: i64, last_sequence: i64) {
        let mut entries = self.lock();
        let key = (topic.to_string(), partition, writer);
        if let Some(entry) = entries.get_mut(&key) {
            entry
                .firsts
                .retain(|f| kafka_sequence_ahead(*f, last_sequence));
            if entry.firsts.is_empty() {
                entries.remove(&key);
            }
        }
    }

    /// The unwritten first sequence that explains why `writer`'s batch starting at
    /// `first_sequence` is ahead of the partition: the tablet expects `expected`
    /// (`None`: it does not know the writer, so it expects its first batch), and a
    /// batch in between was refused as not persisted or is still on its way.
    pub fn explains(
        &self,
        topic: &str,
        partition: i32,
        writer: i64,
        first_sequence: i64,
        expected: Option<i64>,
    ) -> Option<i64> {
        let mut entries = self.lock();
        let key = (topic.to_string(), partition, writer);
        // A rewind (a retry overlapping what is written) is no gap. Sequences compare
        // on Kafka's circle: the gap may span the wrap after `i32::MAX`.
        if expected.is_some_and(|from| !kafka_sequence_ahead(first_sequence, from)) {
            return None;
        }
        let entry = entries.get(&key)?;
        if entry.at.elapsed() >= REFUSAL_TTL {
            entries.remove(&key);
            return None;
        }
        // In the gap: at or after what the tablet expects (anything before the batch
        // when it expects the writer's first), before the batch; the lowest explains.
        let in_gap = |f: i64| {
            kafka_sequence_ahead(first_sequence, f)
                && expected.is_none_or(|from| f == from || kafka_sequence_ahead(f, from))
        };
        let from = expected.unwrap_or(first_sequence);
        entry
            .firsts
            .iter()
            .copied()
            .filter(|f| in_gap(*f))
            .min_by_key(|f| (f - from).rem_euclid(KAFKA_SEQUENCE_MODULUS))
    }

    /// The number of refusals remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gap_the_refusal_lies_in_is_explained() {
        let r = RefusedBatches::default();
        assert_eq!(r.explains("t", 0, 7, 5, Some(3)), None, "nothing refused");
        r.unwritten("t", 0, 7, 3);
        assert_eq!(r.explains("t", 0, 7, 5, Some(3)), Some(3));
        assert_eq!(r.explains("t", 0, 7, 5, None), Some(3), "an unknown writer");
        // Another partition, another producer or epoch: not explained.
        assert_eq!(r.explains("t", 1, 7, 5, Some(3)), None);
        assert_eq!(r.explains("u", 0, 7, 5, Some(3)), None);
        assert_eq!(r.explains("t", 0, 8, 5, Some(3)), None);
        // The refused batch was written after all (the tablet expects past it), or
        // the late batch is not past the refused one: a real gap or a rewind.
        assert_eq!(r.explains("t", 0, 7, 9, Some(4)), None);
        assert_eq!(r.explains("t", 0, 7, 3, Some(1)), None);
        assert_eq!(r.explains("t", 0, 7, 2, Some(1)), None);
        // A rewind (a retry overlapping written batches, a sequence that wrapped) is
        // not a gap.
        assert_eq!(r.explains("t", 0, 7, 2, Some(5)), None);
        assert_eq!(r.explains("t", 0, 7, 0, Some(1 << 31)), None);
        assert_eq!(r.explains("t", 0, 7, 3, Some(3)), None);
        // Several unwritten batches (pipelined, then refused): the lowest in the gap
        // explains it.
        r.unwritten("t", 0, 7, 5);
        r.unwritten("t", 0, 7, 8);
        assert_eq!(r.explains("t", 0, 7, 6, Some(3)), Some(3));
        assert_eq!(r.explains("t", 0, 7, 9, Some(4)), Some(5));
        // A write that does not reach an unwritten batch keeps it; one that does
        // forgets it and everything before.
        r.written("t", 0, 7, 2);
        assert_eq!(r.explains("t", 0, 7, 6, Some(3)), Some(3));
        r.written("t", 0, 7, 4);
        assert_eq!(r.explains("t", 0, 7, 6, Some(5)), Some(5));
        assert_eq!(r.explains("t", 0, 7, 9, Some(6)), Some(8));
        r.written("t", 0, 7, 8);
        assert_eq!(r.explains("t", 0, 7, 10, Some(9)), None);
        assert!(r.is_empty());
        // Across the wrap after i32::MAX: a gap from MAX - 1 to 2 holds MAX and 0; a
        // write up to past the wrap forgets what it reached.
        let max = i64::from(i32::MAX);
        r.unwritten("t", 0, 9, max);
        r.unwritten("t", 0, 9, 0);
        assert_eq!(r.explains("t", 0, 9, 2, Some(max - 1)), Some(max));
        assert_eq!(r.explains("t", 0, 9, 2, Some(0)), Some(0));
        assert_eq!(
            r.explains("t", 0, 9, max - 3, Some(max - 1)),
            None,
            "a rewind"
        );
        r.written("t", 0, 9, max);
        assert_eq!(r.explains("t", 0, 9, 2, Some(max - 1)), Some(0));
        r.written("t", 0, 9, max + 1);
        assert_eq!(r.explains("t", 0, 9, 2, Some(max - 1)), None);
        // A batch that failed for good explains nothing.
        r.unwritten("t", 0, 7, 10);
        r.forget("t", 0, 7, 10);
        assert_eq!(r.explains("t", 0, 7, 12, Some(10)), None);
        assert!(r.is_empty());
    }

    #[test]
    fn refusals_are_bounded() {
        let r = RefusedBatches::default();
        for writer in 0..(REFUSALS_MAX as i64 + 10) {
            r.unwritten("t", 0, writer, 0);
        }
        assert_eq!(r.len(), REFUSALS_MAX);
        // An entry already held is still updated when full.
        r.unwritten("t", 0, 0, 3);
        assert_eq!(r.explains("t", 0, 0, 4, Some(1)), Some(3));
        // So are the batches of one producer.
        for first in 0..100 {
            r.unwritten("t", 0, 1, first);
        }
        assert_eq!(r.explains("t", 0, 1, 200, Some(0)), Some(0));
        assert_eq!(r.explains("t", 0, 1, 200, Some(FIRSTS_MAX as i64)), None);
    }

    #[test]
    fn the_retriable_codes_are_the_not_persisted_ones() {
        assert!(is_retriable_refusal(ResponseError::KafkaStorageError));
        assert!(is_retriable_refusal(ResponseError::LeaderNotAvailable));
        assert!(!is_retriable_refusal(
            ResponseError::OutOfOrderSequenceNumber
        ));
        assert!(!is_retriable_refusal(ResponseError::InvalidRecord));
    }
}
