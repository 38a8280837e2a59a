//! The one place that knows which Arrow and DataFusion this crate is built on.
//!
//! mink-query runs DataFusion 54.1, which is on arrow 58; the nodes (and `mink-types`,
//! `mink-flight`) are on arrow 60. The two majors never exchange values: a node's rows
//! reach this crate as Arrow IPC bytes on the Flight wire and are decoded here by
//! arrow 58, and the one Arrow value the shared crates make for us, a table's schema,
//! crosses as IPC bytes too ([`schema_of`]). Moving to a DataFusion on arrow 60 is a
//! version bump in Cargo.toml and this file (docs/decisions.md).

use std::io::Cursor;
use std::sync::Arc;

pub use arrow_flight58 as flight;
pub use arrow58 as arrow;

use arrow58::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow58::record_batch::RecordBatch;
use mink_types::{MinkError, Result};

/// A Mink schema as an arrow 58 schema: arrow 60's mapping (`mink-types`), carried
/// across as an IPC schema message.
pub fn schema_of(schema: &mink_types::Schema) -> Result<SchemaRef> {
    let arrow60 = schema.to_arrow();
    let mut bytes = Vec::new();
    {
        let mut writer = arrow60::ipc::writer::StreamWriter::try_new(&mut bytes, &arrow60)
            .map_err(|e| MinkError::Internal(format!("schema to IPC: {e}")))?;
        writer
            .finish()
            .map_err(|e| MinkError::Internal(format!("schema to IPC: {e}")))?;
    }
    let reader = arrow58::ipc::reader::StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| MinkError::Internal(format!("schema from IPC: {e}")))?;
    Ok(reader.schema())
}

/// The batches of an Arrow IPC stream (a `lookup` answer).
pub fn batches_of_ipc(bytes: Vec<u8>) -> Result<Vec<RecordBatch>> {
    if bytes.is_empty() {
        return Ok(vec![]);
    }
    let reader = arrow58::ipc::reader::StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| MinkError::Internal(format!("an IPC answer: {e}")))?;
    reader
        .map(|b| b.map_err(|e| MinkError::Internal(format!("an IPC answer: {e}"))))
        .collect()
}

/// A schema whose view types are the plain ones (`Utf8View` → `Utf8`, `BinaryView`
/// → `Binary`): what Flight SQL clients are given (the JDBC and ODBC drivers, and
/// older ADBC ones, do not read views).
pub fn without_views(schema: &SchemaRef) -> SchemaRef {
    if !schema.fields().iter().any(|f| has_view(f.data_type())) {
        return schema.clone();
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(plain(f.data_type())))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

fn has_view(t: &DataType) -> bool {
    plain(t) != *t
}

fn plain(t: &DataType) -> DataType {
    match t {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        DataType::List(f) => DataType::List(Arc::new(
            f.as_ref().clone().with_data_type(plain(f.data_type())),
        )),
        DataType::LargeList(f) => DataType::LargeList(Arc::new(
            f.as_ref().clone().with_data_type(plain(f.data_type())),
        )),
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| f.as_ref().clone().with_data_type(plain(f.data_type())))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `batch` in `schema` (the same columns, views cast to plain types).
pub fn to_schema(batch: RecordBatch, schema: &SchemaRef) -> arrow58::error::Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| arrow58::compute::cast(c, f.data_type()))
        .collect::<arrow58::error::Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mink_types::{Column, DataType as MinkType};

    #[test]
    fn a_mink_schema_crosses_to_arrow_58_with_its_types_and_nullability() {
        let schema = mink_types::Schema::new(
            0,
            vec![
                Column::new("id", MinkType::BigInt, false),
                Column::new("name", MinkType::String, true),
                Column::new("at", MinkType::TimestampLtz { precision: 3 }, true),
                Column::new(
                    "price",
                    MinkType::Decimal {
                        precision: 10,
                        scale: 2,
                    },
                    true,
                ),
            ],
        );
        let got = schema_of(&schema).unwrap();
        assert_eq!(got.fields().len(), 4);
        assert_eq!(got.field(0).data_type(), &DataType::Int64);
        assert!(!got.field(0).is_nullable());
        assert_eq!(got.field(1).data_type(), &DataType::Utf8);
        assert_eq!(
            got.field(2).data_type(),
            &DataType::Timestamp(
                arrow58::datatypes::TimeUnit::Millisecond,
                Some("UTC".into())
            )
        );
        assert_eq!(got.field(3).data_type(), &DataType::Decimal128(10, 2));
    }

    #[test]
    fn views_become_plain_types_at_the_boundary() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("n", DataType::Int32, false),
        ]));
        let plain = without_views(&schema);
        assert_eq!(plain.field(0).data_type(), &DataType::Utf8);
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(arrow58::array::StringViewArray::from(vec!["a", "b"])),
                Arc::new(arrow58::array::Int32Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let cast = to_schema(batch, &plain).unwrap();
        assert_eq!(cast.schema(), plain);
    }
}
