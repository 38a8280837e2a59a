//! The canonical key encoding: key columns read straight from Arrow arrays into bytes
//! whose order is the order of the values (memcomparable).
//!
//! A key is the concatenation of its columns' encodings, in key order. Every column
//! encoding is self-delimiting, so the encoding of a bucket-key prefix of a primary key
//! is a byte prefix of the primary key's encoding (prefix lookups rely on it).
//!
//! | type | bytes |
//! |---|---|
//! | BOOLEAN | 1: `0x00` false, `0x01` true |
//! | TINYINT, SMALLINT, INT, BIGINT | 1, 2, 4, 8: big-endian two's complement with the sign bit flipped |
//! | DATE, TIME(0..=3) | 4: as INT (days; seconds or milliseconds of the day) |
//! | TIME(4..=9), TIMESTAMP(p), TIMESTAMP_LTZ(p) | 8: as BIGINT (in the Arrow unit of `p`) |
//! | FLOAT, DOUBLE | 4, 8: IEEE 754 bits, big-endian; sign bit flipped for positive values, all bits flipped for negative ones (the order of `total_cmp`) |
//! | DECIMAL(p,s) | 16: the unscaled i128, as BIGINT |
//! | STRING, BYTES | the bytes with every `0x00` written as `0x00 0xFF`, then the terminator `0x00 0x01` |
//!
//! There is no null: a null in a key column is an error. The encoding is stable: it is
//! stored in KV tablets and hashed for bucketing, so changing it is a format change.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Date32Array, Decimal128Array,
    Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, RecordBatch,
    StringArray, Time32MillisecondArray, Time32SecondArray, Time64MicrosecondArray,
    Time64NanosecondArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray,
};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, Time32MillisecondType, Time32SecondType,
    Time64MicrosecondType, Time64NanosecondType, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use serde::{Deserialize, Serialize};

use crate::{DataType, MinkError, Result};

/// The longest encoded key, in bytes. Longer keys are rejected.
pub const KEY_BYTES_MAX: usize = 64 * 1024;

/// One decoded key-column value. Times and timestamps are integers in the Arrow unit of
/// the column's precision; decimals are unscaled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyValue {
    Boolean(bool),
    TinyInt(i8),
    SmallInt(i16),
    Int(i32),
    BigInt(i64),
    Float(f32),
    Double(f64),
    Decimal(i128),
    String(String),
    Bytes(Vec<u8>),
    Date(i32),
    Time(i64),
    Timestamp(i64),
}

impl KeyValue {
    /// The order of the values, which the encoding preserves. Values of different
    /// variants are never compared by Mink; they order by variant for totality.
    pub fn cmp_value(&self, other: &KeyValue) -> Ordering {
        use KeyValue::*;
        match (self, other) {
            (Boolean(a), Boolean(b)) => a.cmp(b),
            (TinyInt(a), TinyInt(b)) => a.cmp(b),
            (SmallInt(a), SmallInt(b)) => a.cmp(b),
            (Int(a), Int(b)) | (Date(a), Date(b)) => a.cmp(b),
            (BigInt(a), BigInt(b)) | (Time(a), Time(b)) | (Timestamp(a), Timestamp(b)) => a.cmp(b),
            (Float(a), Float(b)) => a.total_cmp(b),
            (Double(a), Double(b)) => a.total_cmp(b),
            (Decimal(a), Decimal(b)) => a.cmp(b),
            (String(a), String(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Bytes(a), Bytes(b)) => a.cmp(b),
            (a, b) => a.variant().cmp(&b.variant()),
        }
    }

    fn variant(&self) -> u8 {
        match self {
            KeyValue::Boolean(_) => 0,
            KeyValue::TinyInt(_) => 1,
            KeyValue::SmallInt(_) => 2,
            KeyValue::Int(_) => 3,
            KeyValue::BigInt(_) => 4,
            KeyValue::Float(_) => 5,
            KeyValue::Double(_) => 6,
            KeyValue::Decimal(_) => 7,
            KeyValue::String(_) => 8,
            KeyValue::Bytes(_) => 9,
            KeyValue::Date(_) => 10,
            KeyValue::Time(_) => 11,
            KeyValue::Timestamp(_) => 12,
        }
    }

    /// Whether this value is of type `ty`.
    pub fn matches(&self, ty: DataType) -> bool {
        matches!(
            (self, ty),
            (KeyValue::Boolean(_), DataType::Boolean)
                | (KeyValue::TinyInt(_), DataType::TinyInt)
                | (KeyValue::SmallInt(_), DataType::SmallInt)
                | (KeyValue::Int(_), DataType::Int)
                | (KeyValue::BigInt(_), DataType::BigInt)
                | (KeyValue::Float(_), DataType::Float)
                | (KeyValue::Double(_), DataType::Double)
                | (KeyValue::Decimal(_), DataType::Decimal { .. })
                | (KeyValue::String(_), DataType::String)
                | (KeyValue::Bytes(_), DataType::Bytes)
                | (KeyValue::Date(_), DataType::Date)
                | (KeyValue::Time(_), DataType::Time { .. })
                | (
                    KeyValue::Timestamp(_),
                    DataType::Timestamp { .. } | DataType::TimestampLtz { .. }
                )
        )
    }

    /// Appends the canonical encoding of this value as a column of type `ty`.
    pub fn encode(&self, ty: DataType, out: &mut Vec<u8>) -> Result<()> {
        if !self.matches(ty) {
            return Err(MinkError::invalid(
                "key value",
                format!("{self:?} is not of type {ty}"),
            ));
        }
        match *self {
            KeyValue::Boolean(v) => out.push(v as u8),
            KeyValue::TinyInt(v) => out.push((v as u8) ^ 0x80),
            KeyValue::SmallInt(v) => out.extend_from_slice(&((v as u16) ^ (1 << 15)).to_be_bytes()),
            KeyValue::Int(v) | KeyValue::Date(v) => put_i32(out, v),
            KeyValue::BigInt(v) | KeyValue::Timestamp(v) => put_i64(out, v),
            KeyValue::Time(v) => match time_width(ty) {
                4 => put_i32(out, v as i32),
                _ => put_i64(out, v),
            },
            KeyValue::Float(v) => put_f32(out, v),
            KeyValue::Double(v) => put_f64(out, v),
            KeyValue::Decimal(v) => {
                out.extend_from_slice(&((v as u128) ^ (1 << 127)).to_be_bytes())
            }
            KeyValue::String(ref v) => put_bytes(out, v.as_bytes()),
            KeyValue::Bytes(ref v) => put_bytes(out, v),
        }
        Ok(())
    }

    /// Parses a value of type `ty` from text, as typed on a command line (`id=42`).
    /// Dates are `YYYY-MM-DD` or days since the epoch; times and timestamps are
    /// integers in the column's unit; BYTES are taken as UTF-8.
    pub fn parse(ty: DataType, text: &str) -> Result<KeyValue> {
        let bad = |e: String| {
            MinkError::invalid("key value", format!("{text:?} is not of type {ty}: {e}"))
        };
        Ok(match ty {
            DataType::Boolean => KeyValue::Boolean(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::TinyInt => KeyValue::TinyInt(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::SmallInt => {
                KeyValue::SmallInt(text.parse().map_err(|e| bad(format!("{e}")))?)
            }
            DataType::Int => KeyValue::Int(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::BigInt => KeyValue::BigInt(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::Float => KeyValue::Float(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::Double => KeyValue::Double(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::Decimal { .. } => {
                KeyValue::Decimal(text.parse().map_err(|e| bad(format!("{e}")))?)
            }
            DataType::String => KeyValue::String(text.to_string()),
            DataType::Bytes => KeyValue::Bytes(text.as_bytes().to_vec()),
            DataType::Date => KeyValue::Date(match text.parse::<i32>() {
                Ok(days) => days,
                Err(_) => {
                    use arrow::compute::kernels::cast_utils::Parser;
                    arrow::datatypes::Date32Type::parse(text)
                        .ok_or_else(|| bad("neither YYYY-MM-DD nor days since 1970-01-01".into()))?
                }
            }),
            DataType::Time { .. } => KeyValue::Time(text.parse().map_err(|e| bad(format!("{e}")))?),
            DataType::Timestamp { .. } | DataType::TimestampLtz { .. } => {
                KeyValue::Timestamp(text.parse().map_err(|e| bad(format!("{e}")))?)
            }
        })
    }
}

fn time_width(ty: DataType) -> usize {
    match ty {
        DataType::Time { precision } if precision <= 3 => 4,
        _ => 8,
    }
}

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&((v as u32) ^ (1 << 31)).to_be_bytes());
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes());
}

fn put_f32(out: &mut Vec<u8>, v: f32) {
    let bits = v.to_bits();
    let bits = if bits >> 31 == 1 {
        !bits
    } else {
        bits ^ (1 << 31)
    };
    out.extend_from_slice(&bits.to_be_bytes());
}

fn put_f64(out: &mut Vec<u8>, v: f64) {
    let bits = v.to_bits();
    let bits = if bits >> 63 == 1 {
        !bits
    } else {
        bits ^ (1 << 63)
    };
    out.extend_from_slice(&bits.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    out.reserve(v.len() + 2);
    let mut rest = v;
    // Zero bytes are rare: find them with memchr (SIMD) rather than byte by byte.
    while let Some(zero) = memchr::memchr(0, rest) {
        out.extend_from_slice(&rest[..=zero]);
        out.push(0xFF);
        rest = &rest[zero + 1..];
    }
    out.extend_from_slice(rest);
    out.extend_from_slice(&[0x00, 0x01]);
}

/// One key column, downcast once so that encoding a row is a match and a copy.
enum KeyColumn<'a> {
    Boolean(&'a BooleanArray),
    Int8(&'a Int8Array),
    Int16(&'a Int16Array),
    Int32(&'a Int32Array),
    Int64(&'a Int64Array),
    Float32(&'a Float32Array),
    Float64(&'a Float64Array),
    Decimal(&'a Decimal128Array),
    Utf8(&'a StringArray),
    Binary(&'a BinaryArray),
    Date32(&'a Date32Array),
    Time32S(&'a Time32SecondArray),
    Time32Ms(&'a Time32MillisecondArray),
    Time64Us(&'a Time64MicrosecondArray),
    Time64Ns(&'a Time64NanosecondArray),
    TsS(&'a TimestampSecondArray),
    TsMs(&'a TimestampMillisecondArray),
    TsUs(&'a TimestampMicrosecondArray),
    TsNs(&'a TimestampNanosecondArray),
}

impl<'a> KeyColumn<'a> {
    fn new(name: &str, array: &'a dyn Array) -> Result<Self> {
        Ok(match array.data_type() {
            ArrowType::Boolean => KeyColumn::Boolean(array.as_boolean()),
            ArrowType::Int8 => KeyColumn::Int8(array.as_primitive::<Int8Type>()),
            ArrowType::Int16 => KeyColumn::Int16(array.as_primitive::<Int16Type>()),
            ArrowType::Int32 => KeyColumn::Int32(array.as_primitive::<Int32Type>()),
            ArrowType::Int64 => KeyColumn::Int64(array.as_primitive::<Int64Type>()),
            ArrowType::Float32 => KeyColumn::Float32(array.as_primitive::<Float32Type>()),
            ArrowType::Float64 => KeyColumn::Float64(array.as_primitive::<Float64Type>()),
            ArrowType::Decimal128(_, _) => {
                KeyColumn::Decimal(array.as_primitive::<Decimal128Type>())
            }
            ArrowType::Utf8 => KeyColumn::Utf8(array.as_string::<i32>()),
            ArrowType::Binary => KeyColumn::Binary(array.as_binary::<i32>()),
            ArrowType::Date32 => KeyColumn::Date32(array.as_primitive::<Date32Type>()),
            ArrowType::Time32(TimeUnit::Second) => {
                KeyColumn::Time32S(array.as_primitive::<Time32SecondType>())
            }
            ArrowType::Time32(TimeUnit::Millisecond) => {
                KeyColumn::Time32Ms(array.as_primitive::<Time32MillisecondType>())
            }
            ArrowType::Time64(TimeUnit::Microsecond) => {
                KeyColumn::Time64Us(array.as_primitive::<Time64MicrosecondType>())
            }
            ArrowType::Time64(TimeUnit::Nanosecond) => {
                KeyColumn::Time64Ns(array.as_primitive::<Time64NanosecondType>())
            }
            ArrowType::Timestamp(TimeUnit::Second, _) => {
                KeyColumn::TsS(array.as_primitive::<TimestampSecondType>())
            }
            ArrowType::Timestamp(TimeUnit::Millisecond, _) => {
                KeyColumn::TsMs(array.as_primitive::<TimestampMillisecondType>())
            }
            ArrowType::Timestamp(TimeUnit::Microsecond, _) => {
                KeyColumn::TsUs(array.as_primitive::<TimestampMicrosecondType>())
            }
            ArrowType::Timestamp(TimeUnit::Nanosecond, _) => {
                KeyColumn::TsNs(array.as_primitive::<TimestampNanosecondType>())
            }
            other => {
                return Err(MinkError::invalid(
                    format!("key column {name:?}"),
                    format!("Arrow type {other} cannot be a key"),
                ));
            }
        })
    }

    fn encode(&self, row: usize, out: &mut Vec<u8>) {
        match self {
            KeyColumn::Boolean(a) => out.push(a.value(row) as u8),
            KeyColumn::Int8(a) => out.push((a.value(row) as u8) ^ 0x80),
            KeyColumn::Int16(a) => {
                out.extend_from_slice(&((a.value(row) as u16) ^ (1 << 15)).to_be_bytes())
            }
            KeyColumn::Int32(a) => put_i32(out, a.value(row)),
            KeyColumn::Date32(a) => put_i32(out, a.value(row)),
            KeyColumn::Time32S(a) => put_i32(out, a.value(row)),
            KeyColumn::Time32Ms(a) => put_i32(out, a.value(row)),
            KeyColumn::Int64(a) => put_i64(out, a.value(row)),
            KeyColumn::Time64Us(a) => put_i64(out, a.value(row)),
            KeyColumn::Time64Ns(a) => put_i64(out, a.value(row)),
            KeyColumn::TsS(a) => put_i64(out, a.value(row)),
            KeyColumn::TsMs(a) => put_i64(out, a.value(row)),
            KeyColumn::TsUs(a) => put_i64(out, a.value(row)),
            KeyColumn::TsNs(a) => put_i64(out, a.value(row)),
            KeyColumn::Float32(a) => put_f32(out, a.value(row)),
            KeyColumn::Float64(a) => put_f64(out, a.value(row)),
            KeyColumn::Decimal(a) => {
                out.extend_from_slice(&((a.value(row) as u128) ^ (1 << 127)).to_be_bytes())
            }
            KeyColumn::Utf8(a) => put_bytes(out, a.value(row).as_bytes()),
            KeyColumn::Binary(a) => put_bytes(out, a.value(row)),
        }
    }
}

/// Encodes the key columns of a batch, row by row, into a caller-owned buffer.
pub struct KeyEncoder<'a> {
    columns: Vec<KeyColumn<'a>>,
}

impl<'a> KeyEncoder<'a> {
    /// Prepares the columns at `indices` of `batch`. Fails when a column holds a null
    /// (naming the column and the first null row) or has a type that cannot be a key.
    pub fn new(batch: &'a RecordBatch, indices: &[usize]) -> Result<Self> {
        let schema = batch.schema_ref();
        let columns = indices
            .iter()
            .map(|&i| {
                let name = schema.field(i).name();
                let array = batch.column(i).as_ref();
                if array.null_count() > 0 {
                    let row = (0..array.len()).find(|r| array.is_null(*r)).unwrap_or(0);
                    return Err(MinkError::invalid(
                        format!("key column {name:?}"),
                        format!("row {row} is null; key columns must not hold nulls"),
                    ));
                }
                KeyColumn::new(name, array)
            })
            .collect::<Result<_>>()?;
        Ok(Self { columns })
    }

    /// Clears `out` and writes the key of `row` into it.
    pub fn encode(&self, row: usize, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        for column in &self.columns {
            column.encode(row, out);
        }
        if out.len() > KEY_BYTES_MAX {
            return Err(MinkError::LimitExceeded {
                what: format!("the encoded key of row {row}"),
                limit: KEY_BYTES_MAX as u64,
                actual: out.len() as u64,
            });
        }
        Ok(())
    }
}

/// Encodes the values of every column of a batch, row by row, in the canonical encoding
/// of [`KeyValue::encode`], straight from the arrays (no [`KeyValue`] in between).
/// Unlike [`KeyEncoder`] it takes nulls: the caller asks [`ValueEncoder::is_null`]
/// first and records them itself.
pub struct ValueEncoder<'a> {
    columns: Vec<(&'a dyn Array, KeyColumn<'a>)>,
}

impl<'a> ValueEncoder<'a> {
    /// Prepares every column of `batch`; fails on a type that is not a Mink type.
    pub fn new(batch: &'a RecordBatch) -> Result<Self> {
        let schema = batch.schema_ref();
        let columns = batch
            .columns()
            .iter()
            .enumerate()
            .map(|(i, array)| {
                let array = array.as_ref();
                Ok((array, KeyColumn::new(schema.field(i).name(), array)?))
            })
            .collect::<Result<_>>()?;
        Ok(Self { columns })
    }

    /// Columns.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// Whether `column` is null at `row`.
    pub fn is_null(&self, column: usize, row: usize) -> bool {
        self.columns[column].0.is_null(row)
    }

    /// Appends the encoding of `column` at `row` (not null) to `out`.
    pub fn encode(&self, column: usize, row: usize, out: &mut Vec<u8>) {
        self.columns[column].1.encode(row, out)
    }
}

/// Encodes a key given as values (a lookup typed by a person, say).
pub fn encode_values(types: &[DataType], values: &[KeyValue], out: &mut Vec<u8>) -> Result<()> {
    if types.len() != values.len() {
        return Err(MinkError::invalid(
            "key",
            format!("{} values for {} key columns", values.len(), types.len()),
        ));
    }
    out.clear();
    for (value, ty) in values.iter().zip(types) {
        value.encode(*ty, out)?;
    }
    Ok(())
}

/// Decodes a key of the given column types. Fails on truncation, a bad escape or
/// trailing bytes.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per data type of the key encoding"
)]
pub fn decode_key(types: &[DataType], mut bytes: &[u8]) -> Result<Vec<KeyValue>> {
    let truncated = || MinkError::invalid("encoded key", "truncated");
    fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
        let (head, rest) = bytes.split_first_chunk::<N>()?;
        *bytes = rest;
        Some(*head)
    }
    let mut values = Vec::with_capacity(types.len());
    for ty in types {
        let value = match ty {
            DataType::Boolean => match take::<1>(&mut bytes).ok_or_else(truncated)?[0] {
                0 => KeyValue::Boolean(false),
                1 => KeyValue::Boolean(true),
                b => {
                    return Err(MinkError::invalid(
                        "encoded key",
                        format!("bad BOOLEAN byte {b}"),
                    ));
                }
            },
            DataType::TinyInt => {
                KeyValue::TinyInt((take::<1>(&mut bytes).ok_or_else(truncated)?[0] ^ 0x80) as i8)
            }
            DataType::SmallInt => KeyValue::SmallInt(
                (u16::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?) ^ (1 << 15)) as i16,
            ),
            DataType::Int | DataType::Date => {
                let v = (u32::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?) ^ (1 << 31))
                    as i32;
                if *ty == DataType::Int {
                    KeyValue::Int(v)
                } else {
                    KeyValue::Date(v)
                }
            }
            DataType::Time { .. } if time_width(*ty) == 4 => KeyValue::Time(
                (u32::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?) ^ (1 << 31)) as i32
                    as i64,
            ),
            DataType::BigInt
            | DataType::Time { .. }
            | DataType::Timestamp { .. }
            | DataType::TimestampLtz { .. } => {
                let v = (u64::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?) ^ (1 << 63))
                    as i64;
                match ty {
                    DataType::BigInt => KeyValue::BigInt(v),
                    DataType::Time { .. } => KeyValue::Time(v),
                    _ => KeyValue::Timestamp(v),
                }
            }
            DataType::Float => {
                let bits = u32::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?);
                let bits = if bits >> 31 == 1 {
                    bits ^ (1 << 31)
                } else {
                    !bits
                };
                KeyValue::Float(f32::from_bits(bits))
            }
            DataType::Double => {
                let bits = u64::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?);
                let bits = if bits >> 63 == 1 {
                    bits ^ (1 << 63)
                } else {
                    !bits
                };
                KeyValue::Double(f64::from_bits(bits))
            }
            DataType::Decimal { .. } => KeyValue::Decimal(
                (u128::from_be_bytes(take(&mut bytes).ok_or_else(truncated)?) ^ (1 << 127)) as i128,
            ),
            DataType::String | DataType::Bytes => {
                let mut raw = Vec::new();
                loop {
                    let zero = memchr::memchr(0, bytes).ok_or_else(truncated)?;
                    if raw.is_empty() {
                        raw.reserve(zero);
                    }
                    raw.extend_from_slice(&bytes[..zero]);
                    match bytes.get(zero + 1) {
                        Some(0xFF) => raw.push(0),
                        Some(0x01) => {
                            bytes = &bytes[zero + 2..];
                            break;
                        }
                        Some(b) => {
                            return Err(MinkError::invalid(
                                "encoded key",
                                format!("bad escape 0x00 0x{b:02x}"),
                            ));
                        }
                        None => return Err(truncated()),
                    }
                    bytes = &bytes[zero + 2..];
                }
                if *ty == DataType::String {
                    KeyValue::String(
                        String::from_utf8(raw).map_err(|_| {
                            MinkError::invalid("encoded key", "STRING is not UTF-8")
                        })?,
                    )
                } else {
                    KeyValue::Bytes(raw)
                }
            }
        };
        values.push(value);
    }
    if !bytes.is_empty() {
        return Err(MinkError::invalid(
            "encoded key",
            format!("{} trailing bytes", bytes.len()),
        ));
    }
    Ok(values)
}

/// Builds an Arrow array of type `ty` from key values (for key batches of lookups).
pub fn key_values_to_array(ty: DataType, values: &[&KeyValue]) -> Result<ArrayRef> {
    values_to_array(ty, &values.iter().map(|v| Some(*v)).collect::<Vec<_>>())
}

/// Builds an Arrow array of type `ty` from values, `None` being null; a value of
/// another type is an error.
pub fn values_to_array(ty: DataType, values: &[Option<&KeyValue>]) -> Result<ArrayRef> {
    let mismatch = |other: &KeyValue| {
        MinkError::invalid("key value", format!("{other:?} is not of type {ty}"))
    };
    // `$take` reads a value out of its variant: a copy, or a borrow for strings and
    // bytes (the array copies each value once).
    macro_rules! build {
        ($variant:ident, $array:ty) => {
            build!($variant, $array, Clone::clone)
        };
        ($variant:ident, $array:ty, $take:expr) => {{
            let vals = values
                .iter()
                .map(|v| match v {
                    None => Ok(None),
                    Some(KeyValue::$variant(x)) => Ok(Some($take(x))),
                    Some(other) => Err(mismatch(other)),
                })
                .collect::<Result<Vec<_>>>()?;
            <$array>::from_iter(vals)
        }};
    }
    let array: ArrayRef = match ty {
        DataType::Boolean => Arc::new(build!(Boolean, BooleanArray)),
        DataType::TinyInt => Arc::new(build!(TinyInt, Int8Array)),
        DataType::SmallInt => Arc::new(build!(SmallInt, Int16Array)),
        DataType::Int => Arc::new(build!(Int, Int32Array)),
        DataType::BigInt => Arc::new(build!(BigInt, Int64Array)),
        DataType::Float => Arc::new(build!(Float, Float32Array)),
        DataType::Double => Arc::new(build!(Double, Float64Array)),
        DataType::Decimal { precision, scale } => Arc::new(
            build!(Decimal, Decimal128Array).with_precision_and_scale(precision, scale as i8)?,
        ),
        DataType::String => Arc::new(build!(String, StringArray, String::as_str)),
        DataType::Bytes => Arc::new(build!(Bytes, BinaryArray, Vec::as_slice)),
        DataType::Date => Arc::new(build!(Date, Date32Array)),
        DataType::Time { .. } => {
            let array = build!(Time, Int64Array);
            match ty.to_arrow() {
                ArrowType::Time32(unit) => {
                    let narrow = arrow::compute::cast(&array, &ArrowType::Int32)?;
                    arrow::compute::cast(&narrow, &ArrowType::Time32(unit))?
                }
                other => arrow::compute::cast(&array, &other)?,
            }
        }
        DataType::Timestamp { .. } | DataType::TimestampLtz { .. } => {
            let array = build!(Timestamp, Int64Array);
            arrow::compute::cast(&array, &ty.to_arrow())?
        }
    };
    Ok(array)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_parse_from_calendar_days_or_day_numbers() {
        let day = |t| KeyValue::parse(DataType::Date, t);
        assert_eq!(day("2026-11-29").unwrap(), KeyValue::Date(20_786));
        assert_eq!(day("20786").unwrap(), KeyValue::Date(20_786));
        assert_eq!(day("1969-12-31").unwrap(), KeyValue::Date(-1));
        let err = day("2026-13-01").unwrap_err().to_string();
        assert!(err.contains("YYYY-MM-DD"), "{err}");
    }
    use arrow::datatypes::{Field, Schema as ArrowSchema};
    use proptest::prelude::*;

    fn key_types() -> Vec<DataType> {
        vec![
            DataType::Boolean,
            DataType::TinyInt,
            DataType::SmallInt,
            DataType::Int,
            DataType::BigInt,
            DataType::Float,
            DataType::Double,
            DataType::Decimal {
                precision: 38,
                scale: 4,
            },
            DataType::String,
            DataType::Bytes,
            DataType::Date,
            DataType::Time { precision: 3 },
            DataType::Time { precision: 9 },
            DataType::Timestamp { precision: 6 },
            DataType::TimestampLtz { precision: 3 },
        ]
    }

    fn value_of(ty: DataType) -> BoxedStrategy<KeyValue> {
        match ty {
            DataType::Boolean => any::<bool>().prop_map(KeyValue::Boolean).boxed(),
            DataType::TinyInt => any::<i8>().prop_map(KeyValue::TinyInt).boxed(),
            DataType::SmallInt => any::<i16>().prop_map(KeyValue::SmallInt).boxed(),
            DataType::Int => any::<i32>().prop_map(KeyValue::Int).boxed(),
            DataType::BigInt => any::<i64>().prop_map(KeyValue::BigInt).boxed(),
            DataType::Float => any::<f32>().prop_map(KeyValue::Float).boxed(),
            DataType::Double => any::<f64>().prop_map(KeyValue::Double).boxed(),
            DataType::Decimal { .. } => (-(10i128.pow(38) - 1)..10i128.pow(38))
                .prop_map(KeyValue::Decimal)
                .boxed(),
            DataType::String => "[a\\x00b\\u{e9}]{0,6}".prop_map(KeyValue::String).boxed(),
            DataType::Bytes => proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1), Just(0xFF), any::<u8>()],
                0..6,
            )
            .prop_map(KeyValue::Bytes)
            .boxed(),
            DataType::Date => any::<i32>().prop_map(KeyValue::Date).boxed(),
            DataType::Time { precision } if precision <= 3 => {
                (0i64..86_400_000).prop_map(KeyValue::Time).boxed()
            }
            DataType::Time { .. } => (0i64..86_400_000_000_000).prop_map(KeyValue::Time).boxed(),
            DataType::Timestamp { .. } | DataType::TimestampLtz { .. } => {
                any::<i64>().prop_map(KeyValue::Timestamp).boxed()
            }
        }
    }

    /// Key types, then two rows of values of those types.
    fn two_keys() -> impl Strategy<Value = (Vec<DataType>, Vec<KeyValue>, Vec<KeyValue>)> {
        proptest::collection::vec(proptest::sample::select(key_types()), 1..4).prop_flat_map(
            |types| {
                let row = types.iter().map(|t| value_of(*t)).collect::<Vec<_>>();
                (Just(types), row.clone(), row)
            },
        )
    }

    fn batch_of(types: &[DataType], rows: &[&[KeyValue]]) -> RecordBatch {
        let fields: Vec<Field> = types
            .iter()
            .enumerate()
            .map(|(i, t)| Field::new(format!("k{i}"), t.to_arrow(), false))
            .collect();
        let columns = types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                key_values_to_array(*t, &rows.iter().map(|r| &r[i]).collect::<Vec<_>>()).unwrap()
            })
            .collect();
        RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap()
    }

    fn same(a: &[KeyValue], b: &[KeyValue]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.cmp_value(y) == Ordering::Equal)
    }

    proptest! {
        #[test]
        fn encoding_round_trips_and_preserves_order((types, a, b) in two_keys()) {
            let batch = batch_of(&types, &[&a, &b]);
            let indices: Vec<usize> = (0..types.len()).collect();
            let encoder = KeyEncoder::new(&batch, &indices).unwrap();
            let (mut ea, mut eb) = (Vec::new(), Vec::new());
            encoder.encode(0, &mut ea).unwrap();
            encoder.encode(1, &mut eb).unwrap();

            // Array encoding equals value encoding.
            let mut from_values = Vec::new();
            encode_values(&types, &a, &mut from_values).unwrap();
            prop_assert_eq!(&ea, &from_values);

            // Round trip.
            prop_assert!(same(&decode_key(&types, &ea).unwrap(), &a));
            prop_assert!(same(&decode_key(&types, &eb).unwrap(), &b));

            // Byte order equals value order.
            let value_order = a
                .iter()
                .zip(&b)
                .map(|(x, y)| x.cmp_value(y))
                .find(|o| *o != Ordering::Equal)
                .unwrap_or(Ordering::Equal);
            prop_assert_eq!(ea.cmp(&eb), value_order);

            // A key prefix encodes to a byte prefix.
            let mut prefix = Vec::new();
            encode_values(&types[..1], &a[..1], &mut prefix).unwrap();
            prop_assert!(ea.starts_with(&prefix));
        }
    }

    #[test]
    fn known_encodings() {
        let mut out = Vec::new();
        encode_values(
            &[DataType::Int, DataType::String],
            &[KeyValue::Int(-1), KeyValue::String("a\0b".into())],
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            vec![0x7F, 0xFF, 0xFF, 0xFF, b'a', 0x00, 0xFF, b'b', 0x00, 0x01]
        );
    }

    #[test]
    fn nulls_and_bad_bytes_are_rejected() {
        let batch = RecordBatch::try_from_iter(vec![(
            "id",
            Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef,
        )])
        .unwrap();
        let err = KeyEncoder::new(&batch, &[0]).err().unwrap();
        assert_eq!(
            err.to_string(),
            "invalid key column \"id\": row 1 is null; key columns must not hold nulls"
        );
        assert!(decode_key(&[DataType::BigInt], &[1, 2, 3]).is_err());
        assert!(decode_key(&[DataType::String], b"ab").is_err());
        assert!(decode_key(&[DataType::String], &[b'a', 0, 7]).is_err());
        assert!(
            decode_key(&[DataType::Boolean], &[1, 1])
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
        assert!(
            KeyValue::Int(1)
                .encode(DataType::BigInt, &mut out_vec())
                .is_err()
        );
    }

    fn out_vec() -> Vec<u8> {
        Vec::new()
    }

    #[test]
    fn values_parse_from_text() {
        assert_eq!(
            KeyValue::parse(DataType::BigInt, "42").unwrap(),
            KeyValue::BigInt(42)
        );
        assert_eq!(
            KeyValue::parse(DataType::String, "x").unwrap(),
            KeyValue::String("x".into())
        );
        let err = KeyValue::parse(DataType::Int, "4x").unwrap_err();
        assert!(
            err.to_string().contains("\"4x\" is not of type INT"),
            "{err}"
        );
    }
}
