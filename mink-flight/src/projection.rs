//! The columns a read answers: a ticket's `columns`, applied to what the service read
//! before anything is encoded, so that the columns a reader did not ask for never
//! cross the wire (a TPC-H scan needs 4 of `lineitem`'s 16).

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::StreamExt;
use mink_types::MinkError;

use crate::server::ReadBatches;

/// A read cut to some of its table's columns, by name, in the order asked.
#[derive(Debug, Clone)]
pub struct Projection {
    columns: Arc<[String]>,
    schema: SchemaRef,
}

impl Projection {
    /// The projection of `schema` to `columns`; `None` when every column is wanted.
    /// A name the table lacks, or one named twice, is `InvalidArgument`.
    pub fn of(schema: &SchemaRef, columns: Option<&[String]>) -> Result<Option<Self>, MinkError> {
        let Some(columns) = columns else {
            return Ok(None);
        };
        let mut seen = HashSet::with_capacity(columns.len());
        let mut indices = Vec::with_capacity(columns.len());
        for name in columns {
            if !seen.insert(name.as_str()) {
                return Err(MinkError::invalid(
                    "columns",
                    format!("column {name:?} is named twice"),
                ));
            }
            indices.push(schema.index_of(name).map_err(|_| {
                MinkError::invalid("columns", format!("the table has no column {name:?}"))
            })?);
        }
        let schema = Arc::new(
            schema
                .project(&indices)
                .map_err(|e| MinkError::Internal(format!("projecting a read: {e}")))?,
        );
        Ok(Some(Self {
            columns: columns.into(),
            schema,
        }))
    }

    /// The schema of the projected rows.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// `batch` (in the table's schema) cut to the projection's columns; the row
    /// count stays, also without any column.
    pub fn apply(&self, batch: &RecordBatch) -> Result<RecordBatch, MinkError> {
        let batch_schema = batch.schema();
        let indices = self
            .columns
            .iter()
            .map(|name| {
                batch_schema
                    .index_of(name)
                    .map_err(|_| MinkError::Internal(format!("a batch read lacks column {name:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let columns = indices.iter().map(|i| batch.column(*i).clone()).collect();
        let options =
            arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)
            .map_err(|e| MinkError::Internal(format!("projecting a read: {e}")))
    }

    /// Every batch of a read, projected (streams as they stream).
    pub fn apply_read(&self, batches: ReadBatches) -> Result<ReadBatches, MinkError> {
        Ok(match batches {
            ReadBatches::Scan(batches) => ReadBatches::Scan(
                batches
                    .into_iter()
                    .map(|(b, meta)| Ok((self.apply(&b)?, meta)))
                    .collect::<Result<_, MinkError>>()?,
            ),
            ReadBatches::Stream(batches) => {
                let this = self.clone();
                ReadBatches::Stream(
                    batches
                        .map(move |item| item.and_then(|(b, meta)| Ok((this.apply(&b)?, meta))))
                        .boxed(),
                )
            }
            ReadBatches::SnapshotStream(batches) => {
                let this = self.clone();
                ReadBatches::SnapshotStream(
                    batches
                        .map(move |item| item.and_then(|(b, meta)| Ok((this.apply(&b)?, meta))))
                        .boxed(),
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn table() -> (SchemaRef, RecordBatch) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("msg", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
                Arc::new(Int64Array::from(vec![10, 20, 30])),
            ],
        )
        .unwrap();
        (schema, batch)
    }

    #[test]
    fn a_projection_answers_the_columns_asked_in_their_order() {
        let (schema, batch) = table();
        assert!(Projection::of(&schema, None).unwrap().is_none());
        let p = Projection::of(&schema, Some(&["n".into(), "id".into()]))
            .unwrap()
            .unwrap();
        let out = p.apply(&batch).unwrap();
        assert_eq!(out.schema().field(0).name(), "n");
        assert_eq!(out.schema(), *p.schema());
        assert_eq!(out.num_columns(), 2);
        assert_eq!(out.column(1).as_ref(), batch.column(0).as_ref());
        // No column: the rows are still counted.
        let none = Projection::of(&schema, Some(&[])).unwrap().unwrap();
        let out = none.apply(&batch).unwrap();
        assert_eq!((out.num_columns(), out.num_rows()), (0, 3));
    }

    #[test]
    fn an_unknown_or_repeated_column_is_refused_naming_it() {
        let (schema, _) = table();
        let e = Projection::of(&schema, Some(&["nope".into()])).unwrap_err();
        assert!(
            matches!(&e, MinkError::InvalidArgument { field, reason } if field == "columns" && reason.contains("nope")),
            "{e:?}"
        );
        let e = Projection::of(&schema, Some(&["id".into(), "id".into()])).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}
