//! Kafka record batches (v2) to and from Arrow rows of a topic table.
//!
//! A topic is a log table with four columns (spec/protocols.txt): `key BYTES`,
//! `value BYTES`, `headers BYTES`, `timestamp TIMESTAMP_LTZ(3) NOT NULL`. Each record is
//! one row. `headers` holds the record's headers in Kafka's own record-header encoding
//! (a zigzag varint count, then per header a varint key length and the UTF-8 key, a
//! varint value length, -1 for null, and the value); null when a record has none.
//! A record without a timestamp (-1) gets the time it arrived.
//!
//! Decoding and encoding, CRC and compression are kafka-protocol's
//! ([`RecordBatchDecoder`], [`RecordBatchEncoder`]); this module maps fields.

use std::sync::Arc;

use arrow::array::{Array, BinaryArray, BinaryBuilder, RecordBatch, TimestampMillisecondArray};
use arrow::datatypes::SchemaRef;
use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use mink_types::{Column, DataType, Schema};

/// The four columns of a topic table, in order.
pub fn topic_columns() -> Vec<Column> {
    vec![
        Column::new("key", DataType::Bytes, true),
        Column::new("value", DataType::Bytes, true),
        Column::new("headers", DataType::Bytes, true),
        Column::new("timestamp", DataType::TimestampLtz { precision: 3 }, false),
    ]
}

/// The Arrow schema of a topic's rows.
pub fn topic_schema() -> SchemaRef {
    Schema::new(1, topic_columns()).to_arrow()
}

/// Whether a table with these columns began as a topic: its first four columns are
/// the topic columns (`alter_table` only appends columns, so this holds for the
/// table's life).
pub fn starts_as_topic(columns: &[Column]) -> bool {
    columns.len() >= 4 && is_topic(&columns[..4])
}

/// Whether a table with these columns is a topic.
pub fn is_topic(columns: &[Column]) -> bool {
    let want = topic_columns();
    columns.len() == want.len()
        && columns.iter().zip(&want).all(|(c, w)| {
            c.name == w.name && c.data_type == w.data_type && c.nullable == w.nullable
        })
}

/// Why a produced record set was refused: the Kafka error and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    pub code: ResponseError,
    pub message: String,
}

impl RecordError {
    fn new(code: ResponseError, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

/// One produced batch, as rows.
#[derive(Debug, Clone)]
pub struct ProducedBatch {
    /// The producer id (-1 without an idempotent producer).
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub compression: Compression,
    pub rows: RecordBatch,
}

/// The byte of a record batch that holds its format version (magic).
const MAGIC_OFFSET: usize = 16;
/// Bytes of a v2 record batch header.
const BATCH_HEADER_BYTES: usize = 61;

/// Decodes the records of one partition of a Produce request: exactly one record
/// batch v2 (as Kafka requires from Produce v3 on), its CRC checked, decompressed,
/// each record a row. `now_ms` stamps records without a timestamp.
///
/// A record without a timestamp gets `now_ms`; one stamped after `latest_ms` is
/// INVALID_TIMESTAMP (Kafka's `message.timestamp.after.max.ms`): a topic is indexed
/// and expired by its record timestamps, and a far-future one would pin both.
pub fn decode_produce(
    records: &Bytes,
    now_ms: i64,
    latest_ms: i64,
) -> Result<ProducedBatch, RecordError> {
    let corrupt = |m: String| RecordError::new(ResponseError::CorruptMessage, m);
    if records.len() < BATCH_HEADER_BYTES {
        return Err(corrupt(format!(
            "{} bytes cannot hold a record batch (its header alone is {BATCH_HEADER_BYTES})",
            records.len()
        )));
    }
    let magic = records[MAGIC_OFFSET] as i8;
    if magic != 2 {
        return Err(RecordError::new(
            ResponseError::UnsupportedForMessageFormat,
            format!("message format v{magic} is not supported; send record batches v2"),
        ));
    }
    let infos = RecordBatchDecoder::decode_batch_info(&mut records.clone())
        .map_err(|e| corrupt(format!("record batch: {e}")))?;
    let [info] = infos.as_slice() else {
        return Err(RecordError::new(
            ResponseError::InvalidRecord,
            format!(
                "{} record batches in one partition; a Produce carries exactly one",
                infos.len()
            ),
        ));
    };
    if info.transactional {
        return Err(RecordError::new(
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactional produce is not implemented",
        ));
    }
    if info.control {
        return Err(RecordError::new(
            ResponseError::InvalidRecord,
            "control batches are not accepted from producers",
        ));
    }
    if info.record_count <= 0 {
        return Err(RecordError::new(
            ResponseError::InvalidRecord,
            format!("a record batch of {} records", info.record_count),
        ));
    }
    let mut buf = records.clone();
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| corrupt(format!("{e}")))?;
    if set.records.len() != info.record_count as usize {
        return Err(corrupt(format!(
            "the batch header counts {} records, the batch holds {}",
            info.record_count,
            set.records.len()
        )));
    }
    if let Some(r) = set.records.iter().find(|r| r.timestamp > latest_ms) {
        return Err(RecordError::new(
            ResponseError::InvalidTimestamp,
            format!(
                "record {} has timestamp {}, more than kafka.timestamp_after_max_ms ahead of this broker's clock (at most {latest_ms})",
                r.offset, r.timestamp
            ),
        ));
    }
    let rows = rows_of(&set.records, now_ms)?;
    Ok(ProducedBatch {
        producer_id: info.producer_id,
        producer_epoch: info.producer_epoch,
        base_sequence: info.base_sequence,
        compression: info.compression,
        rows,
    })
}

fn rows_of(records: &[Record], now_ms: i64) -> Result<RecordBatch, RecordError> {
    // Sized up front: a builder that grows copies everything it holds each time.
    let bytes = |f: fn(&Record) -> usize| records.iter().map(f).sum::<usize>();
    let mut keys = BinaryBuilder::with_capacity(
        records.len(),
        bytes(|r| r.key.as_ref().map_or(0, |k| k.len())),
    );
    let mut values = BinaryBuilder::with_capacity(
        records.len(),
        bytes(|r| r.value.as_ref().map_or(0, |v| v.len())),
    );
    let mut headers = BinaryBuilder::new();
    let mut timestamps = Vec::with_capacity(records.len());
    for r in records {
        keys.append_option(r.key.as_deref());
        values.append_option(r.value.as_deref());
        if r.headers.is_empty() {
            headers.append_null();
        } else {
            let mut out = Vec::new();
            encode_headers(
                r.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())),
                &mut out,
            );
            headers.append_value(&out);
        }
        timestamps.push(if r.timestamp < 0 { now_ms } else { r.timestamp });
    }
    let timestamps = TimestampMillisecondArray::from(timestamps).with_timezone("UTC");
    RecordBatch::try_new(
        topic_schema(),
        vec![
            Arc::new(keys.finish()),
            Arc::new(values.finish()),
            Arc::new(headers.finish()),
            Arc::new(timestamps),
        ],
    )
    .map_err(|e| RecordError::new(ResponseError::InvalidRecord, e.to_string()))
}

/// Encodes `(key, value)` headers in Kafka's record-header encoding.
pub fn encode_headers<'a>(
    headers: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    out: &mut Vec<u8>,
) {
    put_varint(out, headers.len() as i64);
    for (k, v) in headers {
        put_varint(out, k.len() as i64);
        out.extend_from_slice(k);
        match v {
            Some(v) => {
                put_varint(out, v.len() as i64);
                out.extend_from_slice(v);
            }
            None => put_varint(out, -1),
        }
    }
}

/// One record header: its key and value (null allowed).
pub type Header = (String, Option<Vec<u8>>);

/// Headers encoded by [`encode_headers`]; an error names what is malformed.
pub fn decode_headers(mut bytes: &[u8]) -> Result<Vec<Header>, String> {
    let count = get_varint(&mut bytes)?;
    if count < 0 || count as usize > bytes.len() {
        return Err(format!("a header count of {count}"));
    }
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count {
        let len = get_varint(&mut bytes)?;
        let key =
            take(&mut bytes, len, i, "key")?.ok_or_else(|| format!("header {i} has a null key"))?;
        let key = String::from_utf8(key).map_err(|_| format!("header {i}: key is not UTF-8"))?;
        let len = get_varint(&mut bytes)?;
        let value = take(&mut bytes, len, i, "value")?;
        out.push((key, value));
    }
    if !bytes.is_empty() {
        return Err(format!("{} bytes after the last header", bytes.len()));
    }
    Ok(out)
}

fn take(bytes: &mut &[u8], len: i64, i: i64, what: &str) -> Result<Option<Vec<u8>>, String> {
    if len == -1 {
        return Ok(None);
    }
    if len < 0 || len as usize > bytes.len() {
        return Err(format!(
            "header {i}: a {what} length of {len} with {} bytes left",
            bytes.len()
        ));
    }
    let (head, rest) = bytes.split_at(len as usize);
    *bytes = rest;
    Ok(Some(head.to_vec()))
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn get_varint(bytes: &mut &[u8]) -> Result<i64, String> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes
            .split_first()
            .ok_or_else(|| "a varint runs past the end".to_string())?;
        *bytes = rest;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    Err("a varint longer than 10 bytes".into())
}

/// Encodes rows of a topic (as [`topic_schema`]) read from offset `base_offset` as one
/// record batch v2, uncompressed, appended to `out`. `leader_epoch` is the bucket's.
pub fn encode_fetched(
    base_offset: i64,
    rows: &RecordBatch,
    leader_epoch: i32,
    out: &mut BytesMut,
) -> Result<(), String> {
    if rows.num_rows() == 0 {
        return Ok(());
    }
    let column = |name: &str| {
        rows.column_by_name(name)
            .ok_or_else(|| format!("the rows lack a {name} column"))
    };
    let binary = |name: &str| -> Result<&BinaryArray, String> {
        column(name)?
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(|| format!("the {name} column is not BYTES"))
    };
    let (keys, values, headers) = (binary("key")?, binary("value")?, binary("headers")?);
    let timestamps = column("timestamp")?
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .ok_or_else(|| "the timestamp column is not TIMESTAMP_LTZ(3)".to_string())?;
    let mut records = Vec::with_capacity(rows.num_rows());
    for i in 0..rows.num_rows() {
        let mut record_headers = kafka_protocol::indexmap::IndexMap::new();
        if headers.is_valid(i) {
            for (k, v) in decode_headers(headers.value(i))
                .map_err(|e| format!("offset {}: headers: {e}", base_offset + i as i64))?
            {
                record_headers.insert(StrBytes::from_string(k), v.map(Bytes::from));
            }
        }
        records.push(Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: leader_epoch,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: base_offset + i as i64,
            // The encoder keeps records in one batch while offset - sequence is
            // constant; the batch's base sequence comes out as -1 (no producer).
            sequence: i as i32 - 1,
            timestamp: if timestamps.is_valid(i) {
                timestamps.value(i)
            } else {
                -1
            },
            key: keys
                .is_valid(i)
                .then(|| Bytes::copy_from_slice(keys.value(i))),
            value: values
                .is_valid(i)
                .then(|| Bytes::copy_from_slice(values.value(i))),
            headers: record_headers,
        });
    }
    RecordBatchEncoder::encode(
        out,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| e.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record of producer 7, epoch 0, at sequence `10 + offset`.
    pub(crate) fn record(
        offset: i64,
        key: &str,
        value: &str,
        ts: i64,
        headers: &[(&str, &str)],
    ) -> Record {
        let mut h = kafka_protocol::indexmap::IndexMap::new();
        for (k, v) in headers {
            h.insert(
                StrBytes::from_string(k.to_string()),
                Some(Bytes::from(v.to_string())),
            );
        }
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: 10 + offset as i32,
            timestamp: ts,
            key: Some(Bytes::from(key.to_string())),
            value: Some(Bytes::from(value.to_string())),
            headers: h,
        }
    }

    /// `records` as one record batch v2.
    pub(crate) fn produced(records: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    #[test]
    fn a_batch_round_trips_through_rows_with_every_compression() {
        let records = vec![
            record(0, "k0", "v0", 1_700_000_000_000, &[("h", "x"), ("i", "y")]),
            record(1, "k1", "v1", 1_700_000_000_001, &[]),
            record(2, "k2", "v2", -1, &[]),
        ];
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let batch = decode_produce(&produced(&records, compression), 42, i64::MAX).unwrap();
            assert_eq!(batch.compression, compression);
            assert_eq!(batch.producer_id, 7);
            assert_eq!(batch.base_sequence, 10);
            assert_eq!(batch.rows.num_rows(), 3);
            assert_eq!(batch.rows.schema(), topic_schema());
            // Back out as a fetched batch at offset 100.
            let mut out = BytesMut::new();
            encode_fetched(100, &batch.rows, 3, &mut out).unwrap();
            let set = RecordBatchDecoder::decode(&mut out.freeze()).unwrap();
            assert_eq!(set.records.len(), 3);
            let r = &set.records;
            assert_eq!(
                r.iter().map(|r| r.offset).collect::<Vec<_>>(),
                [100, 101, 102]
            );
            assert_eq!(r[0].timestamp, 1_700_000_000_000);
            assert_eq!(r[1].timestamp, 1_700_000_000_001);
            assert_eq!(r[2].timestamp, 42, "no timestamp: the arrival time");
            assert_eq!(r[1].key.as_deref(), Some(&b"k1"[..]));
            assert_eq!(r[2].value.as_deref(), Some(&b"v2"[..]));
            assert_eq!(r[0].headers.len(), 2);
            assert_eq!(
                r[0].headers
                    .get(&StrBytes::from_static_str("i"))
                    .unwrap()
                    .as_deref(),
                Some(&b"y"[..])
            );
            assert!(r[1].headers.is_empty());
            assert_eq!(r[0].partition_leader_epoch, 3);
            assert_eq!(r[0].producer_id, -1);
        }
    }

    #[test]
    fn a_record_stamped_too_far_ahead_is_refused() {
        let records = [
            record(0, "k", "v", 1_000, &[]),
            record(1, "k", "v", 2_001, &[]),
        ];
        let err = decode_produce(&produced(&records, Compression::None), 0, 2_000).unwrap_err();
        assert_eq!(err.code, ResponseError::InvalidTimestamp);
        assert!(err.message.contains("timestamp 2001"), "{err}");
        let ok = decode_produce(&produced(&records, Compression::None), 0, 2_001).unwrap();
        assert_eq!(ok.rows.num_rows(), 2);
    }

    #[test]
    fn a_corrupted_batch_is_refused_with_a_precise_error() {
        let good = produced(&[record(0, "k", "v", 1, &[])], Compression::None);
        let mut bad = good.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let err = decode_produce(&Bytes::from(bad), 0, i64::MAX).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage);
        assert!(
            err.message.contains("Cyclic redundancy check failed"),
            "{err}"
        );

        let err = decode_produce(&good.slice(..20), 0, i64::MAX).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage);
        assert!(err.message.contains("cannot hold a record batch"), "{err}");

        let mut truncated = good.to_vec();
        truncated.truncate(good.len() - 3);
        let err = decode_produce(&Bytes::from(truncated), 0, i64::MAX).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage, "{err}");

        let mut v1 = good.to_vec();
        v1[MAGIC_OFFSET] = 1;
        let err = decode_produce(&Bytes::from(v1), 0, i64::MAX).unwrap_err();
        assert_eq!(err.code, ResponseError::UnsupportedForMessageFormat);

        let mut two = good.to_vec();
        two.extend_from_slice(&good);
        let err = decode_produce(&Bytes::from(two), 0, i64::MAX).unwrap_err();
        assert_eq!(err.code, ResponseError::InvalidRecord);
        assert!(err.message.contains("2 record batches"), "{err}");

        let mut txn = record(0, "k", "v", 1, &[]);
        txn.transactional = true;
        let err = decode_produce(&produced(&[txn], Compression::None), 0, i64::MAX).unwrap_err();
        assert_eq!(err.code, ResponseError::TransactionalIdAuthorizationFailed);
    }

    #[test]
    fn headers_round_trip_and_malformed_headers_are_named() {
        let mut out = Vec::new();
        encode_headers(
            [(&b"a"[..], Some(&b"1"[..])), (&b"b"[..], None)].into_iter(),
            &mut out,
        );
        assert_eq!(
            decode_headers(&out).unwrap(),
            vec![("a".into(), Some(b"1".to_vec())), ("b".into(), None)]
        );
        assert!(
            decode_headers(&out[..out.len() - 1])
                .unwrap_err()
                .contains("runs past the end")
        );
        assert_eq!(decode_headers(&[0x04]).unwrap_err(), "a header count of 2");
        let mut extra = out.clone();
        extra.push(0);
        assert!(
            decode_headers(&extra)
                .unwrap_err()
                .contains("after the last header")
        );
    }

    #[test]
    fn only_the_four_column_schema_is_a_topic() {
        assert!(is_topic(&topic_columns()));
        let mut other = topic_columns();
        other[3].nullable = true;
        assert!(!is_topic(&other));
        assert!(!is_topic(&topic_columns()[..3]));
    }
}
