//! Writer windows: the last batches of each idempotent writer, as sequence ranges,
//! so that a retried batch is recognised and answered with its original offsets.
//!
//! A Mink batch is one sequence (`first == last`); a Kafka batch covers
//! `base_sequence ..= base_sequence + count - 1`. A batch whose range equals one in
//! the window is a duplicate. Otherwise its first sequence must follow the last one of
//! the window. A writer the window does not know may start anywhere on a log tablet;
//! on a primary-key tablet it must start at 0 ([`Windows::check`]'s `start_anywhere`).
//!
//! Why a primary-key tablet is strict: a client may pipeline Puts, and a Put's order
//! is its meaning (last writer wins). If sequence `n + 1` were taken while `n` is still
//! undecided (refused by a failed WAL and about to be re-sent, say), `n` would then be
//! refused as a rewind, and a client re-sending it under a new writer would apply it
//! after `n + 1`. So `n + 1` is taken only once `n` is in the window (or a duplicate);
//! a batch ahead of it waits a little for it ([`crate::tablet::REORDER_WAIT`]) and is
//! refused as out of order otherwise.
//!
//! A batch that changes nothing (a primary-key Put merged into no change) is logged as
//! a sequence marker of no rows (docs/log-format.md), so windows rebuilt from the log
//! after a reopen end at every writer's last acknowledged sequence, and a stale attempt
//! of such a batch is a duplicate there, not a new batch merged out of order.
//!
//! Kafka sequences wrap: a producer's sequence is an `i32` that goes from `i32::MAX`
//! to 0 (Kafka's `DefaultRecordBatch`), so a batch of `n` records at base `b` covers
//! `b ..= b + n - 1` as Mink stores it (past `i32::MAX` when it crosses the wrap), and
//! the sequence after it is `(b + n) mod 2^31` ([`Rules::next_after`]). A Flight
//! writer's sequence is an `i64` that never wraps.
//!
//! Epochs: a writer id is `base | epoch << 48` (a Kafka producer id and its
//! epoch; Flight writers have epoch 0, so their id is the base; `mink_types::writer`). Each epoch of a base
//! is a writer of its own, with its own window. Once a batch of a newer epoch of a
//! base is in, batches of older epochs are fenced ([`Windows::fenced`]): a producer
//! that bumped its epoch re-sends what was unacknowledged under the new one, so a late
//! copy under the old epoch must not land too.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use mink_types::{MinkError, TableBucket, split_writer};
use tokio::sync::watch;

/// Batches remembered per writer.
pub const WINDOW_BATCHES: usize = 5;
/// Writers remembered per bucket; beyond it the writer idle the longest is forgotten.
pub const WRITERS_MAX: usize = 100_000;

/// The outcome of an append, shared with duplicates that arrive while it is pending.
pub type Outcome = Option<Result<(), MinkError>>;

#[derive(Debug, Clone)]
pub struct Entry {
    pub first_sequence: i64,
    pub last_sequence: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub commit_timestamp: i64,
    /// `Some` while the append is not yet durable.
    pub pending: Option<Arc<watch::Sender<Outcome>>>,
}

/// What to do with a batch.
#[derive(Debug)]
pub enum Check {
    /// Append it.
    New,
    /// A retry of this entry.
    Duplicate(Entry),
    /// A gap or a rewind; `expected` is the sequence that would follow.
    OutOfOrder { expected: i64 },
}

/// What a tablet does with a writer's batch ([`Windows::decide`]).
#[derive(Debug)]
pub enum Decision {
    /// Append it.
    Append,
    /// A retry of this entry: answered with its offsets once it is durable.
    Duplicate(Entry),
    /// Ahead of its writer's next sequence: wait for the predecessors, then decide
    /// again.
    Wait,
}

/// The rules a writer's batch is admitted under, by who sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// A Kafka producer: its id carries an epoch, and a producer the window does not
    /// know must start at sequence 0 (`UnknownWriter` otherwise). Any other writer id
    /// must have epoch 0.
    pub producer: bool,
    /// Whether a writer the window does not know may start at any sequence (a log
    /// tablet) or only at 0 (a primary-key tablet; see the module docs).
    pub start_anywhere: bool,
}

impl Rules {
    /// The sequence that follows a batch ending at `last`: Kafka's wraps to 0 after
    /// `i32::MAX`.
    pub fn next_after(&self, last: i64) -> i64 {
        if self.producer {
            mink_types::kafka_sequence_after(last)
        } else {
            last + 1
        }
    }

    /// Whether a batch starting at `first` is ahead of `expected` (a gap its
    /// predecessors may fill) rather than behind it (a rewind). Kafka's sequences
    /// compare on the circle, as Kafka compares them: ahead by less than half of it.
    pub fn is_ahead(&self, first: i64, expected: i64) -> bool {
        if self.producer {
            mink_types::kafka_sequence_ahead(first, expected)
        } else {
            first > expected
        }
    }
}

#[derive(Debug, Default)]
pub struct Windows {
    writers: HashMap<i64, VecDeque<Entry>>,
    /// The newest epoch of each base that has had a batch of an epoch above 0.
    newest_epoch: HashMap<i64, i64>,
}

impl Windows {
    /// Decides what to do with `writer`'s batch `first..=last`. A writer the window
    /// does not know starts anywhere when `rules.start_anywhere`, else at 0 (see the
    /// module docs).
    pub fn check(&self, writer: i64, (first, last): (i64, i64), rules: Rules) -> Check {
        let Some(window) = self.writers.get(&writer) else {
            if rules.start_anywhere || first == 0 {
                return Check::New;
            }
            return Check::OutOfOrder { expected: 0 };
        };
        if let Some(entry) = window
            .iter()
            .find(|e| e.first_sequence == first && e.last_sequence == last)
        {
            return Check::Duplicate(entry.clone());
        }
        match window
            .back()
            .map(|latest| rules.next_after(latest.last_sequence))
        {
            Some(expected) if first != expected => Check::OutOfOrder { expected },
            _ => Check::New,
        }
    }

    /// Decides what a tablet does with `writer`'s batch `first..=last` on `bucket`,
    /// under `rules`: append it, answer it as a duplicate, wait (only when `may_wait`,
    /// and only for a batch ahead of its writer's next sequence, whose predecessors
    /// may still arrive), or refuse it.
    pub fn decide(
        &self,
        bucket: TableBucket,
        writer: i64,
        (first, last): (i64, i64),
        rules: Rules,
        may_wait: bool,
    ) -> Result<Decision, MinkError> {
        Ok(match self.admit(bucket, writer, (first, last), rules)? {
            Check::New => Decision::Append,
            Check::Duplicate(entry) => Decision::Duplicate(entry),
            Check::OutOfOrder { expected } if may_wait && rules.is_ahead(first, expected) => {
                Decision::Wait
            }
            Check::OutOfOrder { expected } => {
                return Err(MinkError::OutOfOrderSequence {
                    bucket,
                    writer_id: writer,
                    first_sequence: first,
                    expected,
                });
            }
        })
    }

    /// [`Windows::decide`] up to the window check: a refusal that no wait can change
    /// (a writer id out of range, a fenced epoch, an unknown producer past 0) is the
    /// error; otherwise the [`Windows::check`].
    fn admit(
        &self,
        bucket: TableBucket,
        writer: i64,
        (first, last): (i64, i64),
        rules: Rules,
    ) -> Result<Check, MinkError> {
        let epoch = split_writer(writer).1;
        // Only a Kafka producer's id carries an epoch; any other writer id above the
        // base range would fence writers sharing its low bits.
        if !rules.producer && epoch != 0 {
            return Err(MinkError::invalid(
                "writer_id",
                format!(
                    "{writer} is above the largest writer id, {}",
                    mink_types::WRITER_BASE_MAX
                ),
            ));
        }
        if let Some(newer) = self.fenced(writer) {
            return Err(MinkError::WriterFenced {
                bucket,
                writer_id: writer,
                epoch,
                newer,
            });
        }
        if rules.producer && first != 0 && !self.knows(writer) {
            return Err(MinkError::UnknownWriter {
                bucket,
                writer_id: writer,
                first_sequence: first,
            });
        }
        Ok(self.check(writer, (first, last), rules))
    }

    /// The newer epoch of `writer`'s base that fences it, if one has written.
    pub fn fenced(&self, writer: i64) -> Option<i64> {
        let (base, epoch) = split_writer(writer);
        self.newest_epoch
            .get(&base)
            .copied()
            .filter(|newest| *newest > epoch)
    }

    /// Whether the tablet holds a window for `writer`.
    pub fn knows(&self, writer: i64) -> bool {
        self.writers.contains_key(&writer)
    }

    /// [`Windows::push`] of a batch [`Windows::check`] took as new: it follows the
    /// writer's last sequence (or starts the writer). Recovery, which replays the log
    /// from where it begins (a writer's earlier batches may be trimmed, or in logs
    /// written before sequence markers, missing), pushes with [`Windows::push`].
    pub fn push_next(&mut self, writer: i64, entry: Entry, rules: Rules) {
        debug_assert!(
            self.writers
                .get(&writer)
                .and_then(|w| w.back())
                .is_none_or(|last| entry.first_sequence == rules.next_after(last.last_sequence)),
            "writer {writer}: sequence {} does not follow its window {:?}",
            entry.first_sequence,
            self.writers
                .get(&writer)
                .and_then(|w| w.back())
                .map(|e| e.last_sequence)
        );
        self.push(writer, entry);
    }

    pub fn push(&mut self, writer: i64, entry: Entry) {
        if !self.writers.contains_key(&writer) && self.writers.len() >= WRITERS_MAX {
            // Forget the writer whose latest batch is the oldest.
            if let Some(idle) = self
                .writers
                .iter()
                .min_by_key(|(_, w)| w.back().map_or(i64::MIN, |e| e.commit_timestamp))
                .map(|(id, _)| *id)
            {
                self.writers.remove(&idle);
                let (base, epoch) = split_writer(idle);
                if self.newest_epoch.get(&base) == Some(&epoch) {
                    self.newest_epoch.remove(&base);
                }
            }
        }
        let (base, epoch) = split_writer(writer);
        if epoch > 0 && self.newest_epoch.get(&base).is_none_or(|n| *n < epoch) {
            self.newest_epoch.insert(base, epoch);
            // The older epochs of this producer id are fenced from now on: their
            // windows would only take room (a librdkafka producer bumps its epoch on
            // every permanent produce error).
            for older in 0..epoch {
                self.writers
                    .remove(&(base | older << mink_types::WRITER_EPOCH_SHIFT));
            }
        }
        let window = self.writers.entry(writer).or_default();
        window.push_back(entry);
        while window.len() > WINDOW_BATCHES {
            window.pop_front();
        }
    }

    /// Marks the entry whose outcome is `outcome` durable. Found by its outcome, not
    /// its offset: a batch that wrote nothing has an empty range at the offset the
    /// writer's next batch starts at.
    pub fn complete(&mut self, writer: i64, outcome: &Arc<watch::Sender<Outcome>>) {
        if let Some(e) = self.writers.get_mut(&writer).and_then(|w| {
            w.iter_mut()
                .find(|e| e.pending.as_ref().is_some_and(|p| Arc::ptr_eq(p, outcome)))
        }) {
            e.pending = None;
        }
    }

    /// Every writer's window, oldest entry first (for checkpoints).
    pub fn entries(&self) -> Vec<(i64, Vec<Entry>)> {
        let mut out: Vec<(i64, Vec<Entry>)> = self
            .writers
            .iter()
            .map(|(w, e)| (*w, e.iter().cloned().collect()))
            .collect();
        out.sort_by_key(|(w, _)| *w);
        out
    }

    /// The number of writers remembered.
    pub fn writers(&self) -> usize {
        self.writers.len()
    }

    /// A writer's window, oldest first (for tests and inspection).
    pub fn window(&self, writer: i64) -> Vec<Entry> {
        self.writers
            .get(&writer)
            .map(|w| w.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(first: i64, last: i64, offset: i64) -> Entry {
        Entry {
            first_sequence: first,
            last_sequence: last,
            first_offset: offset,
            last_offset: offset + (last - first),
            commit_timestamp: offset,
            pending: None,
        }
    }

    #[test]
    fn duplicates_gaps_and_the_first_batch() {
        let mut w = Windows::default();
        assert!(
            matches!(w.check(1, (17, 17), FLIGHT_LOG), Check::New),
            "a writer's first batch may start anywhere"
        );
        w.push(1, entry(17, 17, 0));
        assert!(matches!(w.check(1, (18, 18), FLIGHT_LOG), Check::New));
        assert!(
            matches!(w.check(1, (17, 17), FLIGHT_LOG), Check::Duplicate(e) if e.first_offset == 0)
        );
        assert!(matches!(
            w.check(1, (20, 20), FLIGHT_LOG),
            Check::OutOfOrder { expected: 18 }
        ));
        assert!(matches!(
            w.check(1, (16, 16), FLIGHT_LOG),
            Check::OutOfOrder { expected: 18 }
        ));
        // Kafka-style ranges.
        w.push(1, entry(18, 27, 1));
        assert!(
            matches!(w.check(1, (18, 27), FLIGHT_LOG), Check::Duplicate(e) if e.last_offset == 10)
        );
        assert!(matches!(
            w.check(1, (18, 20), FLIGHT_LOG),
            Check::OutOfOrder { expected: 28 }
        ));
        assert!(matches!(w.check(1, (28, 30), FLIGHT_LOG), Check::New));
    }

    #[test]
    fn a_strict_window_takes_an_unknown_writer_only_from_zero() {
        let mut w = Windows::default();
        assert!(matches!(
            w.check(1, (6, 6), FLIGHT_PK),
            Check::OutOfOrder { expected: 0 }
        ));
        assert!(matches!(w.check(1, (0, 0), FLIGHT_PK), Check::New));
        w.push(1, entry(0, 0, 0));
        // A known writer follows its window either way; a gap is never skipped.
        assert!(matches!(
            w.check(1, (2, 2), FLIGHT_PK),
            Check::OutOfOrder { expected: 1 }
        ));
        assert!(matches!(
            w.check(1, (2, 2), FLIGHT_LOG),
            Check::OutOfOrder { expected: 1 }
        ));
        assert!(matches!(w.check(1, (1, 1), FLIGHT_PK), Check::New));
        assert!(matches!(w.check(1, (0, 0), FLIGHT_PK), Check::Duplicate(_)));
    }

    const BUCKET: TableBucket = TableBucket {
        table_id: 1,
        partition_id: None,
        bucket: 0,
    };
    const FLIGHT_LOG: Rules = Rules {
        producer: false,
        start_anywhere: true,
    };
    const FLIGHT_PK: Rules = Rules {
        producer: false,
        start_anywhere: false,
    };
    const PRODUCER: Rules = Rules {
        producer: true,
        start_anywhere: true,
    };

    #[test]
    fn admit_refuses_what_no_wait_can_change_and_checks_the_rest() {
        let mut w = Windows::default();
        let epoch1 = mink_types::writer_id(7, 1).unwrap();
        // A writer id with an epoch is a Kafka producer's only.
        assert!(matches!(
            w.admit(BUCKET, epoch1, (0, 0), FLIGHT_LOG),
            Err(MinkError::InvalidArgument { field, .. }) if field == "writer_id"
        ));
        assert!(matches!(
            w.admit(BUCKET, epoch1, (0, 0), PRODUCER),
            Ok(Check::New)
        ));
        // An unknown producer starts at 0; an unknown Flight writer anywhere on a log
        // tablet, at 0 on a primary-key one (a gap, not a refusal: it may wait).
        assert!(matches!(
            w.admit(BUCKET, epoch1, (3, 4), PRODUCER),
            Err(MinkError::UnknownWriter {
                first_sequence: 3,
                ..
            })
        ));
        assert!(matches!(
            w.admit(BUCKET, 9, (3, 3), FLIGHT_LOG),
            Ok(Check::New)
        ));
        assert!(matches!(
            w.admit(BUCKET, 9, (3, 3), FLIGHT_PK),
            Ok(Check::OutOfOrder { expected: 0 })
        ));
        // A newer epoch fences the older one of its base, whatever its sequence.
        w.push(epoch1, entry(0, 0, 0));
        let epoch0 = 7;
        assert!(matches!(
            w.admit(BUCKET, epoch0, (0, 0), PRODUCER),
            Err(MinkError::WriterFenced {
                epoch: 0,
                newer: 1,
                ..
            })
        ));
        // A known producer follows its window.
        assert!(matches!(
            w.admit(BUCKET, epoch1, (0, 0), PRODUCER),
            Ok(Check::Duplicate(_))
        ));
        assert!(matches!(
            w.admit(BUCKET, epoch1, (2, 2), PRODUCER),
            Ok(Check::OutOfOrder { expected: 1 })
        ));
        assert!(matches!(
            w.admit(BUCKET, epoch1, (1, 5), PRODUCER),
            Ok(Check::New)
        ));
    }

    #[test]
    fn decide_waits_only_for_a_batch_ahead_and_only_when_allowed() {
        let mut w = Windows::default();
        w.push(9, entry(0, 0, 0));
        assert!(matches!(
            w.decide(BUCKET, 9, (1, 1), FLIGHT_PK, true),
            Ok(Decision::Append)
        ));
        assert!(matches!(
            w.decide(BUCKET, 9, (0, 0), FLIGHT_PK, true),
            Ok(Decision::Duplicate(e)) if e.first_offset == 0
        ));
        assert!(matches!(
            w.decide(BUCKET, 9, (3, 3), FLIGHT_PK, true),
            Ok(Decision::Wait)
        ));
        assert!(matches!(
            w.decide(BUCKET, 9, (3, 3), FLIGHT_PK, false),
            Err(MinkError::OutOfOrderSequence {
                first_sequence: 3,
                expected: 1,
                ..
            })
        ));
        // A rewind never waits: its predecessors are in already.
        let mut short = Windows::default();
        short.push(9, entry(5, 5, 0));
        assert!(matches!(
            short.decide(BUCKET, 9, (4, 4), FLIGHT_PK, true),
            Err(MinkError::OutOfOrderSequence { expected: 6, .. })
        ));
        // A refusal of the writer itself does not wait either.
        assert!(matches!(
            w.decide(
                BUCKET,
                mink_types::writer_id(9, 1).unwrap(),
                (3, 3),
                PRODUCER,
                true
            ),
            Err(MinkError::UnknownWriter { .. })
        ));
    }

    #[test]
    fn a_newer_epoch_fences_the_older_ones_of_its_base() {
        let mut w = Windows::default();
        let old = 7;
        let new = mink_types::writer_id(7, 1).unwrap();
        w.push(old, entry(0, 0, 0));
        assert_eq!(w.fenced(old), None);
        assert!(!w.knows(new));
        w.push(new, entry(0, 0, 1));
        assert_eq!(w.fenced(old), Some(1));
        assert_eq!(w.fenced(new), None);
        assert!(!w.knows(old), "a fenced epoch's window is dropped");
        assert_eq!(w.writers(), 1);
        assert_eq!(w.fenced(8), None, "another base");
        assert_eq!(split_writer(new), (7, 1));
    }

    #[test]
    fn only_the_last_five_batches_are_kept() {
        let mut w = Windows::default();
        for s in 0..8 {
            w.push(3, entry(s, s, s * 10));
        }
        let kept: Vec<i64> = w.window(3).iter().map(|e| e.first_sequence).collect();
        assert_eq!(kept, vec![3, 4, 5, 6, 7]);
        assert!(matches!(
            w.check(3, (2, 2), FLIGHT_LOG),
            Check::OutOfOrder { expected: 8 }
        ));
    }

    /// Kafka's producer sequence goes from `i32::MAX` to 0. A batch that ends at the
    /// wrap or crosses it (`b ..= b + n - 1` past `i32::MAX`) is followed by the
    /// wrapped sequence; its retry is still a duplicate; a gap across the wrap is
    /// ahead (it may wait), a rewind across it is behind.
    #[test]
    fn kafka_sequences_wrap_after_i32_max() {
        const MAX: i64 = i32::MAX as i64;
        let mut w = Windows::default();
        w.push(7, entry(MAX - 4, MAX, 0));
        assert!(matches!(w.check(7, (0, 2), PRODUCER), Check::New));
        assert!(matches!(
            w.check(7, (MAX + 1, MAX + 3), PRODUCER),
            Check::OutOfOrder { expected: 0 }
        ));
        assert!(matches!(
            w.check(7, (MAX - 4, MAX), PRODUCER),
            Check::Duplicate(e) if e.first_offset == 0
        ));
        // A batch that crosses the wrap.
        w.push_next(7, entry(0, 2, 5), PRODUCER);
        w.push(8, entry(MAX - 1, MAX + 2, 0));
        assert!(matches!(w.check(8, (2, 2), PRODUCER), Check::New));
        assert!(matches!(
            w.check(8, (MAX - 1, MAX + 2), PRODUCER),
            Check::Duplicate(_)
        ));
        // Ahead and behind on the circle.
        assert!(PRODUCER.is_ahead(1, MAX));
        assert!(PRODUCER.is_ahead(5, 3));
        assert!(!PRODUCER.is_ahead(MAX, 1), "a rewind across the wrap");
        assert!(!PRODUCER.is_ahead(3, 3));
        assert!(matches!(
            w.decide(BUCKET, 8, (5, 5), PRODUCER, true),
            Ok(Decision::Wait)
        ));
        // A Flight writer's sequence is an i64 that does not wrap.
        w.push(9, entry(MAX, MAX, 0));
        assert!(matches!(
            w.check(9, (MAX + 1, MAX + 1), FLIGHT_LOG),
            Check::New
        ));
        assert!(matches!(
            w.check(9, (0, 0), FLIGHT_LOG),
            Check::OutOfOrder { .. }
        ));
        assert_eq!(FLIGHT_LOG.next_after(MAX), MAX + 1);
        assert_eq!(PRODUCER.next_after(MAX), 0);
        assert_eq!(PRODUCER.next_after(MAX + 2), 2);
    }
}
