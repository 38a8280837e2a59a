//! Rows as values, their compact encoding in the store, and conversion to and from
//! Arrow.
//!
//! Stored value: schema id (i32 LE), column count (u16 LE), a null bitmap (bit i set =
//! column i is null), then every non-null column in the canonical key encoding of its
//! type (self-delimiting; see docs/key-encoding.md). A row written under an older
//! schema reads back under a newer one with the added (nullable) columns null.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, Time32MillisecondType, Time32SecondType,
    Time64MicrosecondType, Time64NanosecondType, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use mink_types::{
    DataType, KeyValue, MinkError, Result, Schema, SchemaId, ValueEncoder, decode_key,
};

/// One column's value; `None` is null.
pub type Value = Option<KeyValue>;
/// One row, a value per column of its schema.
pub type Row = Vec<Value>;

/// The value of `array` at `row`.
pub fn value_at(array: &dyn Array, row: usize) -> Result<Value> {
    if array.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match array.data_type() {
        ArrowType::Boolean => KeyValue::Boolean(array.as_boolean().value(row)),
        ArrowType::Int8 => KeyValue::TinyInt(array.as_primitive::<Int8Type>().value(row)),
        ArrowType::Int16 => KeyValue::SmallInt(array.as_primitive::<Int16Type>().value(row)),
        ArrowType::Int32 => KeyValue::Int(array.as_primitive::<Int32Type>().value(row)),
        ArrowType::Int64 => KeyValue::BigInt(array.as_primitive::<Int64Type>().value(row)),
        ArrowType::Float32 => KeyValue::Float(array.as_primitive::<Float32Type>().value(row)),
        ArrowType::Float64 => KeyValue::Double(array.as_primitive::<Float64Type>().value(row)),
        ArrowType::Decimal128(_, _) => {
            KeyValue::Decimal(array.as_primitive::<Decimal128Type>().value(row))
        }
        ArrowType::Utf8 => KeyValue::String(array.as_string::<i32>().value(row).to_string()),
        ArrowType::Binary => KeyValue::Bytes(array.as_binary::<i32>().value(row).to_vec()),
        ArrowType::Date32 => KeyValue::Date(array.as_primitive::<Date32Type>().value(row)),
        ArrowType::Time32(TimeUnit::Second) => {
            KeyValue::Time(array.as_primitive::<Time32SecondType>().value(row) as i64)
        }
        ArrowType::Time32(_) => {
            KeyValue::Time(array.as_primitive::<Time32MillisecondType>().value(row) as i64)
        }
        ArrowType::Time64(TimeUnit::Microsecond) => {
            KeyValue::Time(array.as_primitive::<Time64MicrosecondType>().value(row))
        }
        ArrowType::Time64(_) => {
            KeyValue::Time(array.as_primitive::<Time64NanosecondType>().value(row))
        }
        ArrowType::Timestamp(TimeUnit::Second, _) => {
            KeyValue::Timestamp(array.as_primitive::<TimestampSecondType>().value(row))
        }
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => {
            KeyValue::Timestamp(array.as_primitive::<TimestampMillisecondType>().value(row))
        }
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => {
            KeyValue::Timestamp(array.as_primitive::<TimestampMicrosecondType>().value(row))
        }
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => {
            KeyValue::Timestamp(array.as_primitive::<TimestampNanosecondType>().value(row))
        }
        other => {
            return Err(MinkError::invalid(
                "column",
                format!("Arrow type {other} is not a Mink type"),
            ));
        }
    }))
}

/// Every row of `batch`.
pub fn rows_of(batch: &RecordBatch) -> Result<Vec<Row>> {
    (0..batch.num_rows())
        .map(|r| {
            batch
                .columns()
                .iter()
                .map(|c| value_at(c.as_ref(), r))
                .collect()
        })
        .collect()
}

fn column_array(ty: DataType, values: Vec<&Value>) -> Result<ArrayRef> {
    mink_types::key::values_to_array(ty, &values.iter().map(|v| v.as_ref()).collect::<Vec<_>>())
}

/// A batch of `schema`'s columns from rows.
pub fn rows_to_batch(schema: &Schema, rows: &[&Row]) -> Result<RecordBatch> {
    let columns = schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| column_array(c.data_type, rows.iter().map(|r| &r[i]).collect()))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.to_arrow(), columns)?)
}

/// Encodes a row of `schema` for the store.
pub fn encode_row(schema: &Schema, row: &Row) -> Result<Vec<u8>> {
    let n = schema.columns.len();
    let mut out = Vec::with_capacity(8 + n * 8);
    out.extend_from_slice(&schema.schema_id.to_le_bytes());
    out.extend_from_slice(&(n as u16).to_le_bytes());
    let mut bitmap = vec![0u8; n.div_ceil(8)];
    for (i, v) in row.iter().enumerate() {
        if v.is_none() {
            bitmap[i / 8] |= 1 << (i % 8);
        }
    }
    out.extend_from_slice(&bitmap);
    let mut buf = Vec::new();
    for (v, c) in row.iter().zip(&schema.columns) {
        if let Some(v) = v {
            buf.clear();
            v.encode(c.data_type, &mut buf)?;
            out.extend_from_slice(&buf);
        }
    }
    Ok(out)
}

/// [`encode_row`] of row `row` of the batch behind `values` (whose columns are those of
/// schema `schema_id`, in order), read straight from the arrays. Clears `out` first.
pub fn encode_row_at(schema_id: SchemaId, values: &ValueEncoder, row: usize, out: &mut Vec<u8>) {
    let n = values.len();
    out.clear();
    out.extend_from_slice(&schema_id.to_le_bytes());
    out.extend_from_slice(&(n as u16).to_le_bytes());
    let bitmap_at = out.len();
    out.resize(bitmap_at + n.div_ceil(8), 0);
    for i in 0..n {
        if values.is_null(i, row) {
            out[bitmap_at + i / 8] |= 1 << (i % 8);
        } else {
            values.encode(i, row, out);
        }
    }
}

/// The schema id a stored row was written under.
pub fn row_schema_id(bytes: &[u8]) -> Result<SchemaId> {
    let id: [u8; 4] = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| MinkError::Internal("stored row truncated".into()))?;
    Ok(i32::from_le_bytes(id))
}

/// Decodes a stored row written under `written` and returns it under `current`
/// (columns matched by name; columns added since are null).
pub fn decode_row(bytes: &[u8], written: &Schema, current: &Schema) -> Result<Row> {
    let bad = |why: &str| MinkError::Internal(format!("stored row: {why}"));
    if bytes.len() < 6 {
        return Err(bad("truncated"));
    }
    let n = u16::from_le_bytes([bytes[4], bytes[5]]) as usize;
    if n != written.columns.len() {
        return Err(bad("column count does not match its schema"));
    }
    let bitmap_len = n.div_ceil(8);
    let bitmap = bytes
        .get(6..6 + bitmap_len)
        .ok_or_else(|| bad("truncated bitmap"))?;
    let is_null = |i: usize| bitmap[i / 8] & (1 << (i % 8)) != 0;
    let types: Vec<DataType> = (0..n)
        .filter(|i| !is_null(*i))
        .map(|i| written.columns[i].data_type)
        .collect();
    let mut values = decode_key(&types, &bytes[6 + bitmap_len..])?.into_iter();
    let mut row: Row = (0..n)
        .map(|i| if is_null(i) { None } else { values.next() })
        .collect();
    if written.schema_id == current.schema_id {
        return Ok(row);
    }
    Ok(current
        .columns
        .iter()
        .map(|c| {
            written
                .index_of(&c.name)
                .and_then(|i| row.get_mut(i).and_then(Option::take))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mink_types::Column;

    #[test]
    fn rows_round_trip_and_evolve() {
        let v1 = Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("name", DataType::String, true),
                Column::new("ts", DataType::TimestampLtz { precision: 3 }, true),
                Column::new(
                    "price",
                    DataType::Decimal {
                        precision: 10,
                        scale: 2,
                    },
                    true,
                ),
            ],
        );
        let row: Row = vec![
            Some(KeyValue::BigInt(7)),
            None,
            Some(KeyValue::Timestamp(1_700_000_000_000)),
            Some(KeyValue::Decimal(1999)),
        ];
        let bytes = encode_row(&v1, &row).unwrap();
        assert_eq!(row_schema_id(&bytes).unwrap(), 1);
        assert_eq!(decode_row(&bytes, &v1, &v1).unwrap(), row);
        let v2 = v1
            .with_added_columns(&[Column::new("note", DataType::String, true)])
            .unwrap();
        let evolved = decode_row(&bytes, &v1, &v2).unwrap();
        assert_eq!(evolved.len(), 5);
        assert_eq!(evolved[4], None);
        assert_eq!(&evolved[..4], &row[..]);

        let batch = rows_to_batch(&v1, &[&row, &row]).unwrap();
        assert_eq!(batch.num_rows(), 2);
        // Straight from the arrays: the same bytes.
        let values = ValueEncoder::new(&batch).unwrap();
        let mut out = vec![9; 3];
        encode_row_at(1, &values, 1, &mut out);
        assert_eq!(out, bytes);
        v1.check_batch(&batch).unwrap();
        assert_eq!(rows_of(&batch).unwrap(), vec![row.clone(), row]);
    }
}
