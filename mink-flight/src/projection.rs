//! The columns a read answers: a ticket's `columns`, applied to what the service read
//! before anything is encoded, so that the columns a reader did not ask for never
//! cross the wire (a TPC-H scan needs 4 of `lineitem`'s 16); and [`ReadShape`], a
//! ticket's `filter` and `columns` together.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use futures::StreamExt;
use mink_types::MinkError;

use crate::filter::{BoundFilter, Filter};
use crate::server::{ReadBatch, ReadBatches};

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
}

/// Counts rows a read's filter kept on the node (`/metrics`).
fn left_out(rows: usize) {
    if rows > 0 {
        metrics::counter!("mink_flight_read_filtered_rows_total").increment(rows as u64);
    }
}

/// What a read answers: the rows its `filter` keeps (evaluated on the table's
/// columns), then the columns its `columns` name.
#[derive(Debug, Clone)]
pub struct ReadShape {
    filter: Option<BoundFilter>,
    projection: Option<Projection>,
    schema: SchemaRef,
}

impl ReadShape {
    /// The shape of a read of `schema` (the table's); `InvalidArgument` for a column
    /// or filter the table cannot answer.
    pub fn of(
        schema: &SchemaRef,
        columns: Option<&[String]>,
        filter: Option<&Filter>,
    ) -> Result<Self, MinkError> {
        let projection = Projection::of(schema, columns)?;
        let filter = filter.map(|f| f.bind(schema)).transpose()?;
        Ok(Self {
            schema: projection
                .as_ref()
                .map_or_else(|| schema.clone(), |p| p.schema().clone()),
            filter,
            projection,
        })
    }

    /// The schema of the rows answered.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether the read answers what was read, unchanged.
    pub fn is_whole(&self) -> bool {
        self.filter.is_none() && self.projection.is_none()
    }

    fn columns(&self, batch: &RecordBatch) -> Result<RecordBatch, MinkError> {
        match &self.projection {
            Some(p) => p.apply(batch),
            None => Ok(batch.clone()),
        }
    }

    /// A scan's batch shaped; `None` when the filter kept none of its rows. A
    /// filtered batch says where the rows it was cut from end (`next_offset`), and
    /// keeps the change types of the rows it kept.
    pub fn scan_batch(&self, (batch, mut meta): ReadBatch) -> Result<Option<ReadBatch>, MinkError> {
        let Some(filter) = &self.filter else {
            return Ok(Some((self.columns(&batch)?, meta)));
        };
        meta.next_offset
            .get_or_insert(meta.base_offset + batch.num_rows() as i64);
        let (kept, mask) = filter.apply(&batch)?;
        left_out(batch.num_rows() - kept.num_rows());
        if let (Some(mask), Some(types)) = (&mask, meta.change_types.as_mut()) {
            let mut i = 0;
            types.retain(|_| {
                let keep = mask.is_valid(i) && mask.value(i);
                i += 1;
                keep
            });
        }
        if kept.num_rows() == 0 {
            return Ok(None);
        }
        Ok(Some((self.columns(&kept)?, meta)))
    }

    /// A state's batch shaped. One the filter empties is still sent: its metadata
    /// (`SnapshotBatch`: the offset the state is at) is what a reader merges the
    /// changelog from, and a state read must never look like a state that has none.
    fn state_batch(&self, batch: RecordBatch) -> Result<RecordBatch, MinkError> {
        let kept = match &self.filter {
            Some(f) => {
                let kept = f.apply(&batch)?.0;
                left_out(batch.num_rows() - kept.num_rows());
                kept
            }
            None => batch,
        };
        self.columns(&kept)
    }

    /// Every batch of a read, shaped (streams as they stream). Batches the filter
    /// empties are left out, but for the last of a `Scan` answer that would
    /// otherwise be empty (a reader stepping through a bucket learns from its
    /// `next_offset` where to go on) and a state's (their metadata says what the
    /// state is).
    pub fn apply_read(&self, batches: ReadBatches) -> Result<ReadBatches, MinkError> {
        if self.is_whole() {
            return Ok(batches);
        }
        Ok(match batches {
            ReadBatches::Scan(batches) => {
                let mut last = None;
                let mut out = Vec::with_capacity(batches.len());
                for (batch, meta) in batches {
                    let next = meta.base_offset + batch.num_rows() as i64;
                    match self.scan_batch((batch, meta.clone()))? {
                        Some(b) => out.push(b),
                        None => last = Some((next, meta)),
                    }
                }
                if let (true, Some((next, mut meta))) = (out.is_empty(), last) {
                    meta.next_offset = Some(meta.next_offset.unwrap_or(next));
                    meta.change_types = meta.change_types.map(|_| vec![]);
                    out.push((RecordBatch::new_empty(self.schema.clone()), meta));
                }
                ReadBatches::Scan(out)
            }
            ReadBatches::Stream(batches) => {
                let this = self.clone();
                ReadBatches::Stream(
                    batches
                        .filter_map(move |item| {
                            let out = item.and_then(|b| this.scan_batch(b)).transpose();
                            futures::future::ready(out)
                        })
                        .boxed(),
                )
            }
            ReadBatches::SnapshotStream(batches) => {
                let this = self.clone();
                ReadBatches::SnapshotStream(
                    batches
                        .map(move |item| {
                            item.and_then(|(b, meta)| Ok((this.state_batch(b)?, meta)))
                        })
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
