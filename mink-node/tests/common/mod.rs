//! Helpers shared by the node's integration tests: the `events` log table and its rows.
#![allow(dead_code)] // each test crate uses its own subset

use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use mink_types::{Column, DataType, Schema, TableDescriptor};

/// `events(id BIGINT NOT NULL, msg STRING)`, bucketed by id over `buckets` buckets.
pub fn events_in(buckets: u32) -> TableDescriptor {
    TableDescriptor {
        bucket_keys: Some(vec!["id".into()]),
        bucket_count: buckets,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("msg", DataType::String, true),
            ],
        ))
    }
}

/// Rows of `events` with the given ids.
pub fn rows(ids: std::ops::Range<i64>) -> RecordBatch {
    let schema = events_in(1).schema.to_arrow();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("m{i}")))),
        ],
    )
    .unwrap()
}

/// The ids of `batches`, sorted.
pub fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect();
    out.sort();
    out
}
