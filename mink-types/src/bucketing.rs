//! Bucketing: which bucket each row of a batch goes to, computed for the whole batch.
//!
//! - [`BucketingRule::Hash`]: murmur3 x86 32-bit with seed 0 over the canonical key
//!   encoding ([`crate::key`]) of the bucket-key columns, then
//!   `(h & 0x7fffffff) % bucket_count`.
//! - [`BucketingRule::Iceberg`]: Iceberg's bucket transform of the single bucket-key
//!   column (spec, "Bucket Transform Details" and Appendix B): integers and longs hash
//!   as 8-byte little-endian longs, dates as days, times as microseconds of the day,
//!   timestamps as microseconds since the epoch (nanosecond values are floored to
//!   microseconds), decimals as the minimal big-endian two's complement of the
//!   unscaled value, strings as UTF-8, bytes as themselves.
//! - [`BucketingRule::Kafka`]: Kafka's default partitioner (the Java client's and
//!   kafka-python's; librdkafka's `murmur2_random`) over the single BYTES bucket key:
//!   murmur2 with seed `0x9747b28c` of the bytes, then `(h & 0x7fffffff) % bucket_count`.
//!   A compacted topic's partitions are its buckets, so a key's partition is the
//!   bucket its latest value is looked up in.
//!
//! Tables without bucket keys are bucketed round-robin per batch by the router; that
//! needs state and lives with the router, not here.

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Decimal128Type, Int8Type, Int16Type, Int32Type, Int64Type,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};

use crate::key::KeyEncoder;
use crate::{BucketId, BucketingRule, KeyValue, MinkError, Result};

/// murmur3 x86 32-bit, seed 0, as Iceberg and Mink's hash rule use it.
pub fn murmur3_32(bytes: &[u8]) -> i32 {
    let mut reader = bytes;
    // Reading from a slice cannot fail.
    murmur3::murmur3_32(&mut reader, 0).map_or(0, |h| h as i32)
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), seed
/// `0x9747b28c`: what its default partitioner hashes a record key with.
pub fn kafka_murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives a record `key` among `count`.
pub fn kafka_partition(key: &[u8], count: u32) -> BucketId {
    to_bucket(kafka_murmur2(key), count)
}

fn to_bucket(hash: i32, bucket_count: u32) -> BucketId {
    ((hash & i32::MAX) as u32) % bucket_count
}

/// The bucket of one encoded bucket key under the `hash` rule.
pub fn hash_bucket(encoded_key: &[u8], bucket_count: u32) -> BucketId {
    to_bucket(murmur3_32(encoded_key), bucket_count)
}

/// The minimal big-endian two's complement bytes of `v` (Java's `BigInteger.toByteArray`).
fn minimal_be_bytes(v: i128) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let mut start = 0;
    while start < 15 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        if (b == 0x00 && next & 0x80 == 0) || (b == 0xFF && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    bytes[start..].to_vec()
}

fn hash_long(v: i64) -> i32 {
    murmur3_32(&v.to_le_bytes())
}

/// Iceberg's 32-bit hash of a key value. Times and timestamps must already be in
/// microseconds; see [`iceberg_hash_column`] for the unit conversion from Arrow.
pub fn iceberg_hash(value: &KeyValue) -> Result<i32> {
    Ok(match value {
        KeyValue::TinyInt(v) => hash_long(*v as i64),
        KeyValue::SmallInt(v) => hash_long(*v as i64),
        KeyValue::Int(v) | KeyValue::Date(v) => hash_long(*v as i64),
        KeyValue::BigInt(v) | KeyValue::Time(v) | KeyValue::Timestamp(v) => hash_long(*v),
        KeyValue::Decimal(v) => murmur3_32(&minimal_be_bytes(*v)),
        KeyValue::String(v) => murmur3_32(v.as_bytes()),
        KeyValue::Bytes(v) => murmur3_32(v),
        other => {
            return Err(MinkError::invalid(
                "bucketing",
                format!("the iceberg rule cannot hash {other:?}"),
            ));
        }
    })
}

fn micros(v: i64, unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => v.saturating_mul(1_000_000),
        TimeUnit::Millisecond => v.saturating_mul(1_000),
        TimeUnit::Microsecond => v,
        TimeUnit::Nanosecond => v.div_euclid(1_000),
    }
}

/// Iceberg's hash of every row of `array` (which must hold no nulls).
pub fn iceberg_hash_column(array: &dyn Array) -> Result<Vec<i32>> {
    let n = array.len();
    macro_rules! longs {
        ($t:ty, $f:expr) => {{
            let a = array.as_primitive::<$t>();
            (0..n).map(|i| hash_long($f(a.value(i)))).collect()
        }};
    }
    Ok(match array.data_type() {
        ArrowType::Int8 => longs!(Int8Type, |v: i8| v as i64),
        ArrowType::Int16 => longs!(Int16Type, |v: i16| v as i64),
        ArrowType::Int32 => longs!(Int32Type, |v: i32| v as i64),
        ArrowType::Int64 => longs!(Int64Type, |v: i64| v),
        ArrowType::Date32 => longs!(Date32Type, |v: i32| v as i64),
        ArrowType::Time32(TimeUnit::Second) => {
            longs!(Time32SecondType, |v: i32| micros(
                v as i64,
                TimeUnit::Second
            ))
        }
        ArrowType::Time32(TimeUnit::Millisecond) => {
            longs!(Time32MillisecondType, |v: i32| micros(
                v as i64,
                TimeUnit::Millisecond
            ))
        }
        ArrowType::Time64(TimeUnit::Microsecond) => longs!(Time64MicrosecondType, |v: i64| v),
        ArrowType::Time64(TimeUnit::Nanosecond) => {
            longs!(Time64NanosecondType, |v: i64| micros(
                v,
                TimeUnit::Nanosecond
            ))
        }
        ArrowType::Timestamp(TimeUnit::Second, _) => {
            longs!(TimestampSecondType, |v: i64| micros(v, TimeUnit::Second))
        }
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => {
            longs!(TimestampMillisecondType, |v: i64| micros(
                v,
                TimeUnit::Millisecond
            ))
        }
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => {
            longs!(TimestampMicrosecondType, |v: i64| v)
        }
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => {
            longs!(TimestampNanosecondType, |v: i64| micros(
                v,
                TimeUnit::Nanosecond
            ))
        }
        ArrowType::Decimal128(_, _) => {
            let a = array.as_primitive::<Decimal128Type>();
            (0..n)
                .map(|i| murmur3_32(&minimal_be_bytes(a.value(i))))
                .collect()
        }
        ArrowType::Utf8 => {
            let a = array.as_string::<i32>();
            (0..n).map(|i| murmur3_32(a.value(i).as_bytes())).collect()
        }
        ArrowType::Binary => {
            let a = array.as_binary::<i32>();
            (0..n).map(|i| murmur3_32(a.value(i))).collect()
        }
        other => {
            return Err(MinkError::invalid(
                "bucketing",
                format!("the iceberg rule cannot hash Arrow type {other}"),
            ));
        }
    })
}

/// The rows of a batch that go to one bucket, in their original order.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketRows {
    pub bucket: BucketId,
    pub rows: UInt32Array,
}

/// The bucket of every row of `batch`, from the bucket-key columns at `key_indices`.
/// Fails on a null in a key column (naming the column and row).
pub fn bucket_per_row(
    batch: &RecordBatch,
    key_indices: &[usize],
    rule: BucketingRule,
    bucket_count: u32,
) -> Result<Vec<BucketId>> {
    if bucket_count == 0 {
        return Err(MinkError::invalid("bucket_count", "must be at least 1"));
    }
    if key_indices.is_empty() {
        return Err(MinkError::invalid(
            "bucket_keys",
            "bucketing by key needs at least one bucket key",
        ));
    }
    match rule {
        BucketingRule::Hash => {
            let encoder = KeyEncoder::new(batch, key_indices)?;
            let mut key = Vec::with_capacity(64);
            (0..batch.num_rows())
                .map(|row| {
                    encoder.encode(row, &mut key)?;
                    Ok(hash_bucket(&key, bucket_count))
                })
                .collect()
        }
        BucketingRule::Kafka => {
            let [index] = key_indices else {
                return Err(MinkError::invalid(
                    "bucketing",
                    "the kafka rule needs exactly one bucket key",
                ));
            };
            KeyEncoder::new(batch, key_indices)?;
            let column = batch.column(*index);
            let keys = column.as_binary_opt::<i32>().ok_or_else(|| {
                MinkError::invalid("bucketing", "the kafka rule buckets a BYTES column")
            })?;
            Ok(keys
                .iter()
                .map(|k| kafka_partition(k.unwrap_or_default(), bucket_count))
                .collect())
        }
        BucketingRule::Iceberg => {
            let [index] = key_indices else {
                return Err(MinkError::invalid(
                    "bucketing",
                    "the iceberg rule needs exactly one bucket key",
                ));
            };
            // Reuse the encoder's null check and its error message.
            KeyEncoder::new(batch, key_indices)?;
            Ok(iceberg_hash_column(batch.column(*index).as_ref())?
                .into_iter()
                .map(|h| to_bucket(h, bucket_count))
                .collect())
        }
    }
}

/// Splits `batch` into per-bucket row selections (buckets in ascending order, rows
/// in their original order). Use `arrow::compute::take_record_batch` to cut them out.
pub fn split_by_bucket(
    batch: &RecordBatch,
    key_indices: &[usize],
    rule: BucketingRule,
    bucket_count: u32,
) -> Result<Vec<BucketRows>> {
    let per_row = bucket_per_row(batch, key_indices, rule, bucket_count)?;
    let mut counts = vec![0usize; bucket_count as usize];
    for b in &per_row {
        counts[*b as usize] += 1;
    }
    let mut selections: Vec<Vec<u32>> = counts.iter().map(|c| Vec::with_capacity(*c)).collect();
    for (row, b) in per_row.iter().enumerate() {
        selections[*b as usize].push(row as u32);
    }
    Ok(selections
        .into_iter()
        .enumerate()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(bucket, rows)| BucketRows {
            bucket: bucket as BucketId,
            rows: UInt32Array::from(rows),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow::array::{
        ArrayRef, BinaryArray, Date32Array, Decimal128Array, Int32Array, Int64Array, StringArray,
        Time64MicrosecondArray, TimestampMicrosecondArray, TimestampNanosecondArray,
    };

    fn one(array: ArrayRef) -> i32 {
        iceberg_hash_column(array.as_ref()).unwrap()[0]
    }

    /// Iceberg specification, Appendix B, "32-bit Hash Requirements".
    #[test]
    fn iceberg_published_vectors() {
        assert_eq!(one(Arc::new(Int32Array::from(vec![34]))), 2017239379);
        assert_eq!(one(Arc::new(Int64Array::from(vec![34i64]))), 2017239379);
        let decimal = Decimal128Array::from(vec![1420i128])
            .with_precision_and_scale(9, 2)
            .unwrap();
        assert_eq!(one(Arc::new(decimal)), -500754589);
        // 2017-11-16 is day 17486.
        assert_eq!(one(Arc::new(Date32Array::from(vec![17486]))), -653330422);
        // 22:31:08 in microseconds of the day.
        let time = 81_068_000_000i64;
        assert_eq!(
            one(Arc::new(Time64MicrosecondArray::from(vec![time]))),
            -662762989
        );
        // 2017-11-16T22:31:08 and 2017-11-16T14:31:08-08:00.
        let ts = 1_510_871_468_000_000i64;
        assert_eq!(
            one(Arc::new(TimestampMicrosecondArray::from(vec![ts]))),
            -2047944441
        );
        let tstz = TimestampMicrosecondArray::from(vec![ts]).with_timezone("UTC");
        assert_eq!(one(Arc::new(tstz)), -2047944441);
        // Nanoseconds floor to the same microsecond.
        let ns = TimestampNanosecondArray::from(vec![ts * 1000 + 999]);
        assert_eq!(one(Arc::new(ns)), -2047944441);
        assert_eq!(
            one(Arc::new(StringArray::from(vec!["iceberg"]))),
            1210000089
        );
        let bytes: &[u8] = &[0, 1, 2, 3];
        assert_eq!(one(Arc::new(BinaryArray::from(vec![bytes]))), -188683207);
    }

    #[test]
    fn minimal_twos_complement() {
        assert_eq!(minimal_be_bytes(1420), vec![0x05, 0x8C]);
        assert_eq!(minimal_be_bytes(0), vec![0x00]);
        assert_eq!(minimal_be_bytes(-1), vec![0xFF]);
        assert_eq!(minimal_be_bytes(128), vec![0x00, 0x80]);
        assert_eq!(minimal_be_bytes(-129), vec![0xFF, 0x7F]);
    }

    #[test]
    fn iceberg_values_hash_like_columns() {
        assert_eq!(iceberg_hash(&KeyValue::Int(34)).unwrap(), 2017239379);
        assert_eq!(
            iceberg_hash(&KeyValue::String("iceberg".into())).unwrap(),
            1210000089
        );
        assert!(iceberg_hash(&KeyValue::Double(1.0)).is_err());
    }

    #[test]
    fn hash_rule_uses_the_key_encoding() {
        let batch = RecordBatch::try_from_iter(vec![(
            "id",
            Arc::new(Int64Array::from(vec![1i64, 2, 3, 4, 5, 6, 7, 8])) as ArrayRef,
        )])
        .unwrap();
        let per_row = bucket_per_row(&batch, &[0], BucketingRule::Hash, 4).unwrap();
        for (row, bucket) in per_row.iter().enumerate() {
            let mut key = Vec::new();
            crate::key::encode_values(
                &[crate::DataType::BigInt],
                &[KeyValue::BigInt(row as i64 + 1)],
                &mut key,
            )
            .unwrap();
            let h = murmur3::murmur3_32(&mut key.as_slice(), 0).unwrap();
            assert_eq!(*bucket, (h & 0x7fff_ffff) % 4);
        }
        // A frozen vector, so the rule never changes by accident: BIGINT 1 is
        // 80 00 00 00 00 00 00 01.
        assert_eq!(murmur3_32(&[0x80, 0, 0, 0, 0, 0, 0, 1]) as u32, {
            let mut r: &[u8] = &[0x80, 0, 0, 0, 0, 0, 0, 1];
            murmur3::murmur3_32(&mut r, 0).unwrap()
        });

        let split = split_by_bucket(&batch, &[0], BucketingRule::Hash, 4).unwrap();
        let total: usize = split.iter().map(|b| b.rows.len()).sum();
        assert_eq!(total, 8);
        for sel in &split {
            for row in sel.rows.values() {
                assert_eq!(per_row[*row as usize], sel.bucket);
            }
            assert!(sel.rows.values().windows(2).all(|w| w[0] < w[1]));
        }
    }

    /// Kafka's `UtilsTest.testMurmur2`, and the partitions its default partitioner
    /// gives (`toPositive(murmur2(key)) % n`).
    #[test]
    fn kafka_murmur2_is_kafkas() {
        for (key, hash) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(
                kafka_murmur2(key),
                hash,
                "{:?}",
                String::from_utf8_lossy(key)
            );
        }
        assert_eq!(
            kafka_partition(b"21", 3),
            ((-973_932_308i32 & i32::MAX) % 3) as u32
        );
        let batch = RecordBatch::try_from_iter(vec![(
            "key",
            Arc::new(BinaryArray::from(vec![&b"21"[..], b"abc", b""])) as ArrayRef,
        )])
        .unwrap();
        let got = bucket_per_row(&batch, &[0], BucketingRule::Kafka, 7).unwrap();
        let want: Vec<u32> = [&b"21"[..], b"abc", b""]
            .iter()
            .map(|k| kafka_partition(k, 7))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn null_keys_are_rejected() {
        let batch = RecordBatch::try_from_iter(vec![(
            "k",
            Arc::new(StringArray::from(vec![Some("a"), None])) as ArrayRef,
        )])
        .unwrap();
        for rule in [BucketingRule::Hash, BucketingRule::Iceberg] {
            let err = bucket_per_row(&batch, &[0], rule, 3).unwrap_err();
            assert!(err.to_string().contains("row 1 is null"), "{err}");
        }
        assert!(bucket_per_row(&batch, &[0], BucketingRule::Hash, 0).is_err());
    }
}
