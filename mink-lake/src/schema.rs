//! Mink schemas as Iceberg schemas, and rows between the log's Arrow types and the
//! lake's.
//!
//! | Mink | Iceberg | Parquet (Arrow) |
//! |---|---|---|
//! | BOOLEAN | boolean | Boolean |
//! | TINYINT, SMALLINT, INT | int | Int32 |
//! | BIGINT | long | Int64 |
//! | FLOAT, DOUBLE | float, double | Float32, Float64 |
//! | DECIMAL(p,s) | decimal(p,s) | Decimal128(p,s) |
//! | STRING, BYTES | string, binary | Utf8, Binary |
//! | DATE | date | Date32 |
//! | TIME(p) | time | Time64(µs) |
//! | TIMESTAMP(p) | timestamp | Timestamp(µs) |
//! | TIMESTAMP_LTZ(p) | timestamptz | Timestamp(µs, UTC) |
//!
//! Iceberg v2 keeps time and timestamps in microseconds: a precision above 6 loses its
//! nanoseconds in the lake (the log keeps them). Field ids are stable: the column at
//! position `i` is field `i + 1` (Mink only ever appends columns), and the lake's own
//! columns `__bucket`, `__offset`, `__timestamp` are fields [`SYSTEM_FIELD_ID_BASE`]`+ 1..=3`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use iceberg::spec::{NestedField, PrimitiveType, Schema as IcebergSchema, Type};
use mink_types::{DataType, LAKE_SYSTEM_COLUMNS, MinkError, Result, Schema};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

/// The lake's own columns have field ids above this (and far above the 1,024 columns a
/// Mink table may have).
pub const SYSTEM_FIELD_ID_BASE: i32 = 100_000;
/// Field id of `__bucket`.
pub const BUCKET_FIELD_ID: i32 = SYSTEM_FIELD_ID_BASE + 1;
/// Field id of `__offset`.
pub const OFFSET_FIELD_ID: i32 = SYSTEM_FIELD_ID_BASE + 2;
/// Field id of `__timestamp`.
pub const TIMESTAMP_FIELD_ID: i32 = SYSTEM_FIELD_ID_BASE + 3;

const UTC: &str = "UTC";

/// The field id of the column at `index`.
pub fn field_id(index: usize) -> i32 {
    index as i32 + 1
}

fn primitive(ty: DataType) -> PrimitiveType {
    match ty {
        DataType::Boolean => PrimitiveType::Boolean,
        DataType::TinyInt | DataType::SmallInt | DataType::Int => PrimitiveType::Int,
        DataType::BigInt => PrimitiveType::Long,
        DataType::Float => PrimitiveType::Float,
        DataType::Double => PrimitiveType::Double,
        DataType::Decimal { precision, scale } => PrimitiveType::Decimal {
            precision: precision as u32,
            scale: scale as u32,
        },
        DataType::String => PrimitiveType::String,
        DataType::Bytes => PrimitiveType::Binary,
        DataType::Date => PrimitiveType::Date,
        DataType::Time { .. } => PrimitiveType::Time,
        DataType::Timestamp { .. } => PrimitiveType::Timestamp,
        DataType::TimestampLtz { .. } => PrimitiveType::Timestamptz,
    }
}

/// The Arrow type a column has in the lake's Parquet files.
pub fn lake_arrow_type(ty: DataType) -> ArrowType {
    match ty {
        DataType::TinyInt | DataType::SmallInt | DataType::Int => ArrowType::Int32,
        DataType::Time { .. } => ArrowType::Time64(TimeUnit::Microsecond),
        DataType::Timestamp { .. } => ArrowType::Timestamp(TimeUnit::Microsecond, None),
        DataType::TimestampLtz { .. } => {
            ArrowType::Timestamp(TimeUnit::Microsecond, Some(UTC.into()))
        }
        other => other.to_arrow(),
    }
}

/// The Iceberg schema of a Mink schema: its columns, then the lake's own columns.
/// The Iceberg schema id is the Mink schema id.
pub fn iceberg_schema(schema: &Schema) -> Result<IcebergSchema> {
    let mut fields: Vec<Arc<NestedField>> = schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let ty = Type::Primitive(primitive(c.data_type));
            let mut f = if c.nullable {
                NestedField::optional(field_id(i), &c.name, ty)
            } else {
                NestedField::required(field_id(i), &c.name, ty)
            };
            if let Some(doc) = &c.comment {
                f = f.with_doc(doc);
            }
            Arc::new(f)
        })
        .collect();
    let [bucket, offset, timestamp] = LAKE_SYSTEM_COLUMNS;
    fields.push(Arc::new(NestedField::required(
        BUCKET_FIELD_ID,
        bucket,
        Type::Primitive(PrimitiveType::Int),
    )));
    fields.push(Arc::new(NestedField::required(
        OFFSET_FIELD_ID,
        offset,
        Type::Primitive(PrimitiveType::Long),
    )));
    fields.push(Arc::new(NestedField::required(
        TIMESTAMP_FIELD_ID,
        timestamp,
        Type::Primitive(PrimitiveType::Timestamptz),
    )));
    IcebergSchema::builder()
        .with_schema_id(schema.schema_id)
        .with_fields(fields)
        .build()
        .map_err(|e| MinkError::Internal(format!("the Iceberg schema of a table: {e}")))
}

fn with_id(field: Field, id: i32) -> Field {
    field.with_metadata(HashMap::from([(
        PARQUET_FIELD_ID_META_KEY.to_string(),
        id.to_string(),
    )]))
}

/// The Arrow schema of the lake's Parquet files for `schema`, with field ids.
pub fn lake_arrow_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            with_id(
                Field::new(&c.name, lake_arrow_type(c.data_type), c.nullable),
                field_id(i),
            )
        })
        .collect();
    let [bucket, offset, timestamp] = LAKE_SYSTEM_COLUMNS;
    fields.push(with_id(
        Field::new(bucket, ArrowType::Int32, false),
        BUCKET_FIELD_ID,
    ));
    fields.push(with_id(
        Field::new(offset, ArrowType::Int64, false),
        OFFSET_FIELD_ID,
    ));
    fields.push(with_id(
        Field::new(
            timestamp,
            ArrowType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
            false,
        ),
        TIMESTAMP_FIELD_ID,
    ));
    Arc::new(ArrowSchema::new(fields))
}

fn cast_error(what: &str, e: impl std::fmt::Display) -> MinkError {
    MinkError::Internal(format!("converting {what} for the lake: {e}"))
}

/// One log batch as lake rows: `batch` (in `schema`, the table's current schema) with
/// the lake's types, plus bucket, offsets from `base_offset` and the commit timestamp.
pub fn to_lake_batch(
    schema: &Schema,
    lake_schema: &SchemaRef,
    batch: &RecordBatch,
    bucket: u32,
    base_offset: i64,
    commit_timestamp_ms: i64,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.columns.len() + 3);
    for (i, c) in schema.columns.iter().enumerate() {
        let from = batch.column(i);
        let to = lake_arrow_type(c.data_type);
        columns.push(if from.data_type() == &to {
            from.clone()
        } else {
            cast(from, &to).map_err(|e| cast_error(&c.name, e))?
        });
    }
    columns.push(Arc::new(Int32Array::from(vec![bucket as i32; rows])));
    columns.push(Arc::new(Int64Array::from_iter_values(
        base_offset..base_offset + rows as i64,
    )));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(vec![commit_timestamp_ms * 1000; rows]).with_timezone(UTC),
    ));
    RecordBatch::try_new(lake_schema.clone(), columns).map_err(|e| cast_error("a batch", e))
}

/// The column index of each field id of a batch read from a lake file.
fn columns_by_id(batch: &RecordBatch) -> HashMap<i32, usize> {
    batch
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(i, f)| id_of(f).map(|id| (id, i)))
        .collect()
}

/// A batch read from a lake file (any schema version) in the current lake schema,
/// matched by field id: columns the file predates are null, system columns kept. Used
/// to rewrite files (copy-on-write of primary-key tables).
pub fn to_current_lake(lake_schema: &SchemaRef, batch: &RecordBatch) -> Result<RecordBatch> {
    let by_id = columns_by_id(batch);
    let mut columns = Vec::with_capacity(lake_schema.fields().len());
    for field in lake_schema.fields() {
        let column = id_of(field)
            .and_then(|id| by_id.get(&id))
            .map(|i| batch.column(*i).clone());
        columns.push(match column {
            Some(a) if a.data_type() == field.data_type() => a,
            Some(a) => cast(&a, field.data_type()).map_err(|e| cast_error(field.name(), e))?,
            None => arrow::array::new_null_array(field.data_type(), batch.num_rows()),
        });
    }
    RecordBatch::try_new(lake_schema.clone(), columns).map_err(|e| {
        MinkError::StorageFailure(format!("a lake data file does not fit the table: {e}"))
    })
}

/// Rows read from a lake file, as the table's schema sees them.
#[derive(Debug, Clone)]
pub struct LakeRows {
    /// The rows in the table's current Arrow schema (columns a file predates are null).
    pub batch: RecordBatch,
    /// The bucket each row came from.
    pub buckets: Int32Array,
    /// The log offset of each row.
    pub offsets: Int64Array,
}

fn id_of(field: &Field) -> Option<i32> {
    field
        .metadata()
        .get(PARQUET_FIELD_ID_META_KEY)
        .and_then(|v| v.parse().ok())
}

/// Converts a batch read from a lake file (any schema version) to `schema` by field id.
pub fn from_lake_batch(schema: &Schema, batch: &RecordBatch) -> Result<LakeRows> {
    let by_id = columns_by_id(batch);
    let column = |id: i32| by_id.get(&id).map(|i| batch.column(*i).clone());
    let target = schema.to_arrow();
    let mut columns = Vec::with_capacity(schema.columns.len());
    for (i, (c, field)) in schema.columns.iter().zip(target.fields()).enumerate() {
        columns.push(match column(field_id(i)) {
            Some(a) if a.data_type() == field.data_type() => a,
            Some(a) => cast(&a, field.data_type()).map_err(|e| cast_error(&c.name, e))?,
            None => arrow::array::new_null_array(field.data_type(), batch.num_rows()),
        });
    }
    let system = |id: i32, name: &str| {
        column(id).ok_or_else(|| {
            MinkError::StorageFailure(format!("a lake data file has no {name} column"))
        })
    };
    let buckets = system(BUCKET_FIELD_ID, "__bucket")?;
    let offsets = system(OFFSET_FIELD_ID, "__offset")?;
    let buckets = buckets
        .as_any()
        .downcast_ref::<Int32Array>()
        .ok_or_else(|| MinkError::StorageFailure("__bucket is not an int column".into()))?
        .clone();
    let offsets = offsets
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| MinkError::StorageFailure("__offset is not a long column".into()))?
        .clone();
    let batch = RecordBatch::try_new(target, columns).map_err(|e| {
        MinkError::StorageFailure(format!("a lake data file does not fit the table: {e}"))
    })?;
    Ok(LakeRows {
        batch,
        buckets,
        offsets,
    })
}

/// Columns `indices` of the table (`schema`) out of lake rows (a whole file's or a
/// projection of it), as the table's types: found by field id, cast where the lake's
/// type differs. A column the file lacks (added later) is all null.
pub fn lake_columns(
    schema: &Schema,
    batch: &RecordBatch,
    indices: &[usize],
) -> Result<Vec<ArrayRef>> {
    let by_id = columns_by_id(batch);
    let target = schema.to_arrow();
    indices
        .iter()
        .map(|&i| {
            let field = target.field(i);
            Ok(
                match by_id.get(&field_id(i)).map(|j| batch.column(*j).clone()) {
                    Some(a) if a.data_type() == field.data_type() => a,
                    Some(a) => cast(&a, field.data_type())
                        .map_err(|e| cast_error(&schema.columns[i].name, e))?,
                    None => arrow::array::new_null_array(field.data_type(), batch.num_rows()),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int8Array, StringArray, TimestampNanosecondArray};
    use mink_types::Column;

    fn schema() -> Schema {
        Schema::new(
            1,
            vec![
                Column::new("id", DataType::TinyInt, false),
                Column::new("name", DataType::String, true),
                Column::new("at", DataType::TimestampLtz { precision: 9 }, true),
            ],
        )
    }

    #[test]
    fn field_ids_are_positions_and_system_columns_follow() {
        let s = iceberg_schema(&schema()).unwrap();
        assert_eq!(s.schema_id(), 1);
        let ids: Vec<i32> = s.as_struct().fields().iter().map(|f| f.id).collect();
        assert_eq!(
            ids,
            vec![
                1,
                2,
                3,
                BUCKET_FIELD_ID,
                OFFSET_FIELD_ID,
                TIMESTAMP_FIELD_ID
            ]
        );
        let arrow = lake_arrow_schema(&schema());
        assert_eq!(id_of(arrow.field(2)), Some(3));
        assert_eq!(arrow.field(0).data_type(), &ArrowType::Int32);
    }

    #[test]
    fn rows_round_trip_through_lake_types() {
        let mink = schema();
        let batch = RecordBatch::try_new(
            mink.to_arrow(),
            vec![
                Arc::new(Int8Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(
                    TimestampNanosecondArray::from(vec![Some(1_000_000_000), None])
                        .with_timezone(UTC),
                ),
            ],
        )
        .unwrap();
        let lake = lake_arrow_schema(&mink);
        let l = to_lake_batch(&mink, &lake, &batch, 3, 40, 1234).unwrap();
        assert_eq!(l.num_columns(), 6);
        let back = from_lake_batch(&mink, &l).unwrap();
        assert_eq!(back.batch, batch);
        assert_eq!(back.offsets.values(), &[40, 41]);
        assert_eq!(back.buckets.values(), &[3, 3]);
        // A newer schema reads the old file with the added column null.
        let newer = mink
            .with_added_columns(&[Column::new("extra", DataType::BigInt, true)])
            .unwrap();
        let back = from_lake_batch(&newer, &l).unwrap();
        assert_eq!(back.batch.column(3).null_count(), 2);
    }
}
