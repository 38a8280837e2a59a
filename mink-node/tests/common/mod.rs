//! Helpers shared by the node's integration tests: node configurations, the `events` log
//! table and its rows.
#![allow(dead_code)] // each test crate uses its own subset

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use mink_node::MinkConfig;
use mink_types::{Column, DataType, Schema, TableDescriptor};

/// Node `id` of a cluster on the `shared` file store, its data under `dir/id`, on
/// loopback ports the OS chooses, with short heartbeats and lease timeouts.
pub fn config(dir: &std::path::Path, shared: &std::path::Path, id: &str) -> MinkConfig {
    let mut c = MinkConfig {
        node_id: id.into(),
        data_dir: dir.join(id),
        ..MinkConfig::default()
    };
    c.object_store.url = format!("file://{}", shared.display());
    c.listeners.flight = "127.0.0.1:0".parse().unwrap();
    c.listeners.admin = "127.0.0.1:0".parse().unwrap();
    c.listeners.kafka = "127.0.0.1:0".parse().unwrap();
    c.meta.heartbeat_interval_ms = 100;
    c.meta.lease_timeout_ms = 1_000;
    c.meta.node_session_timeout_ms = 1_500;
    c.meta.tail_idle_interval_max_ms = 100;
    c
}

/// Retries while bucket leaders are being assigned.
pub async fn settle<T, F, Fut>(f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = mink_types::Result<T>>,
{
    let mut last = None;
    for _ in 0..100 {
        match f().await {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never settled: {last:?}");
}

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

/// The Prometheus page of a node's admin endpoint.
pub fn scrape_metrics(admin: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(admin).unwrap();
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut page = String::new();
    conn.read_to_string(&mut page).unwrap();
    page
}
