//! A primary-key bucket's state at a cut: its KV snapshot (the state at the
//! snapshot's log offset) with the changelog from there to the cut applied, newest
//! image last. The changelog carries whole rows as the merge engine made them, so
//! whatever the engine (last row, partial update, aggregation), the state is the last
//! `+I`/`+U` image of each key not followed by a `-D`; `-U` rows carry nothing new.

use std::collections::HashMap;

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::{DataFusionError, Result};
use mink_types::ChangeType;

/// The state of one bucket, built from batches of `schema`.
pub struct BucketState {
    schema: SchemaRef,
    key_columns: Vec<usize>,
    converter: RowConverter,
    batches: Vec<RecordBatch>,
    /// Each live key's newest image: (batch, row).
    live: HashMap<OwnedRow, (usize, usize)>,
    /// Bytes held by the batches and keys (for the memory pool).
    bytes: usize,
}

impl BucketState {
    pub fn new(schema: SchemaRef, key_columns: Vec<usize>) -> Result<Self> {
        let fields = key_columns
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect();
        Ok(Self {
            converter: RowConverter::new(fields)?,
            schema,
            key_columns,
            batches: vec![],
            live: HashMap::new(),
            bytes: 0,
        })
    }

    /// Bytes this state holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Rows of a KV snapshot: every row is live.
    pub fn snapshot(&mut self, batch: RecordBatch) -> Result<usize> {
        let n = batch.num_rows();
        self.apply(batch, |_| Some(true), n)
    }

    /// Rows of the changelog, with their change types (one per row).
    pub fn changes(&mut self, batch: RecordBatch, types: &[ChangeType]) -> Result<usize> {
        if types.len() != batch.num_rows() {
            return Err(DataFusionError::Internal(format!(
                "a changelog batch of {} rows with {} change types",
                batch.num_rows(),
                types.len()
            )));
        }
        let n = batch.num_rows();
        self.apply(
            batch,
            |row| match types[row] {
                ChangeType::Insert | ChangeType::UpdateAfter | ChangeType::AppendOnly => Some(true),
                ChangeType::Delete => Some(false),
                ChangeType::UpdateBefore => None,
            },
            n,
        )
    }

    /// Applies rows: `Some(true)` makes the row its key's image, `Some(false)`
    /// deletes the key, `None` skips the row. Returns the bytes added.
    fn apply(
        &mut self,
        batch: RecordBatch,
        what: impl Fn(usize) -> Option<bool>,
        rows: usize,
    ) -> Result<usize> {
        if rows == 0 {
            return Ok(0);
        }
        let keys: Vec<ArrayRef> = self
            .key_columns
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let converted = self.converter.convert_columns(&keys)?;
        let index = self.batches.len();
        let before = self.bytes;
        self.bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        for row in 0..rows {
            match what(row) {
                Some(true) => {
                    let key = converted.row(row).owned();
                    let key_bytes = key.as_ref().len() + 32;
                    if self.live.insert(key, (index, row)).is_none() {
                        self.bytes += key_bytes;
                    }
                }
                Some(false) => {
                    self.live.remove(&converted.row(row).owned());
                }
                None => {}
            }
        }
        Ok(self.bytes - before)
    }

    /// The live rows, in batches of at most `batch_size`.
    pub fn finish(self, batch_size: usize) -> Result<Vec<RecordBatch>> {
        let mut picks: Vec<(usize, usize)> = self.live.into_values().collect();
        // In log order: the output does not depend on the hash map's order.
        picks.sort_unstable();
        let columns: Vec<Vec<&dyn Array>> = (0..self.schema.fields().len())
            .map(|c| {
                self.batches
                    .iter()
                    .map(|b| b.column(c).as_ref())
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut out = Vec::new();
        for chunk in picks.chunks(batch_size.max(1)) {
            let arrays = columns
                .iter()
                .map(|arrays| interleave(arrays, chunk))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            out.push(RecordBatch::try_new(self.schema.clone(), arrays)?);
        }
        Ok(out)
    }
}

/// Key column positions of `names` in `schema`.
pub fn key_columns(schema: &SchemaRef, names: &[String]) -> Result<Vec<usize>> {
    names
        .iter()
        .map(|n| {
            schema
                .index_of(n)
                .map_err(|_| DataFusionError::Internal(format!("key column {n:?} is missing")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]))
    }

    fn batch(ids: &[i64], vs: &[&str]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(vs.to_vec())),
            ],
        )
        .unwrap()
    }

    fn rows(state: BucketState) -> Vec<(i64, String)> {
        let mut out = vec![];
        for b in state.finish(2).unwrap() {
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let vs = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..b.num_rows() {
                out.push((ids.value(i), vs.value(i).to_string()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn the_changelog_after_a_snapshot_updates_inserts_and_deletes() {
        use ChangeType::*;
        let mut s = BucketState::new(schema(), vec![0]).unwrap();
        s.snapshot(batch(&[1, 2, 3], &["a", "b", "c"])).unwrap();
        s.changes(
            batch(&[2, 2, 4, 3], &["b", "B", "d", "c"]),
            &[UpdateBefore, UpdateAfter, Insert, Delete],
        )
        .unwrap();
        s.changes(batch(&[3], &["again"]), &[Insert]).unwrap();
        assert_eq!(
            rows(s),
            vec![
                (1, "a".into()),
                (2, "B".into()),
                (3, "again".into()),
                (4, "d".into())
            ]
        );
    }

    #[test]
    fn change_types_must_match_the_rows() {
        let mut s = BucketState::new(schema(), vec![0]).unwrap();
        assert!(s.changes(batch(&[1], &["a"]), &[]).is_err());
    }

    #[test]
    fn an_empty_bucket_has_no_rows_and_the_bytes_are_counted() {
        let s = BucketState::new(schema(), vec![0]).unwrap();
        assert!(s.finish(10).unwrap().is_empty());
        let mut s = BucketState::new(schema(), vec![0]).unwrap();
        let added = s.snapshot(batch(&[1], &["a"])).unwrap();
        assert!(added > 0 && s.bytes() == added);
    }
}
