//! Writer ids of idempotent writers, and the epoch a Kafka producer's id carries.
//!
//! A writer id is `base | epoch << WRITER_EPOCH_SHIFT`: a Flight writer's id is a base
//! with epoch 0; a Kafka producer's is its producer id (the base, from the same
//! allocator) with its producer epoch. Each epoch of a base is a writer of its own;
//! a newer one fences the older ones (mink-log's writer windows).

/// Bits of a writer id below its epoch.
pub const WRITER_EPOCH_SHIFT: u32 = 48;
/// The largest base: writer ids from the allocator stay below it.
pub const WRITER_BASE_MAX: i64 = (1 << WRITER_EPOCH_SHIFT) - 1;

/// Kafka producer sequences are `i32`s taken modulo this: `i32::MAX` is followed by 0
/// (Kafka's `DefaultRecordBatch`). Mink keeps a batch of `n` records at base `b` as
/// `b ..= b + n - 1`, past `i32::MAX` when the batch crosses the wrap.
pub const KAFKA_SEQUENCE_MODULUS: i64 = 1 << 31;

/// The Kafka sequence after a batch that ends at `last` (wrapped to 0 after
/// `i32::MAX`).
pub fn kafka_sequence_after(last: i64) -> i64 {
    (last + 1).rem_euclid(KAFKA_SEQUENCE_MODULUS)
}

/// Whether Kafka sequence `a` is ahead of `b` on the circle of sequences: by more than
/// nothing and less than half of it, as Kafka compares them across the wrap.
pub fn kafka_sequence_ahead(a: i64, b: i64) -> bool {
    let distance = (a - b).rem_euclid(KAFKA_SEQUENCE_MODULUS);
    distance > 0 && distance < KAFKA_SEQUENCE_MODULUS / 2
}

/// A writer id's base and epoch.
pub fn split_writer(writer: i64) -> (i64, i64) {
    (writer & WRITER_BASE_MAX, writer >> WRITER_EPOCH_SHIFT)
}

/// The writer id of `base` at `epoch`; `None` when the base is outside
/// `0..=WRITER_BASE_MAX` or the epoch is negative.
pub fn writer_id(base: i64, epoch: i16) -> Option<i64> {
    ((0..=WRITER_BASE_MAX).contains(&base) && epoch >= 0)
        .then(|| base | i64::from(epoch) << WRITER_EPOCH_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_ids_carry_their_epoch() {
        assert_eq!(writer_id(7, 0), Some(7));
        let w = writer_id(7, 3).unwrap();
        assert!(w > 0);
        assert_eq!(split_writer(w), (7, 3));
        assert_eq!(
            split_writer(writer_id(WRITER_BASE_MAX, i16::MAX).unwrap()),
            (WRITER_BASE_MAX, i64::from(i16::MAX))
        );
        assert_eq!(writer_id(WRITER_BASE_MAX + 1, 0), None);
        assert_eq!(writer_id(-1, 0), None);
        assert_eq!(writer_id(7, -1), None);
    }
}
