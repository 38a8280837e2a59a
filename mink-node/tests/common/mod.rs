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

/// A Kafka connection that speaks the protocol by hand (kafka-protocol's messages),
/// one request at a time.
pub struct KafkaConn {
    stream: tokio::net::TcpStream,
    correlation: i32,
}

impl KafkaConn {
    pub async fn connect(addr: std::net::SocketAddr) -> Self {
        Self {
            stream: tokio::net::TcpStream::connect(addr).await.unwrap(),
            correlation: 0,
        }
    }

    pub async fn call<Req, Resp>(
        &mut self,
        key: kafka_protocol::messages::ApiKey,
        v: i16,
        req: &Req,
    ) -> Resp
    where
        Req: kafka_protocol::protocol::Encodable,
        Resp: kafka_protocol::protocol::Decodable,
    {
        use kafka_protocol::messages::{RequestHeader, ResponseHeader};
        use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.correlation += 1;
        let mut body = bytes::BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(v)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("node-test")))
            .encode(&mut body, key.request_header_version(v))
            .unwrap();
        req.encode(&mut body, v).unwrap();
        self.stream
            .write_all(&(body.len() as i32).to_be_bytes())
            .await
            .unwrap();
        self.stream.write_all(&body).await.unwrap();
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).await.unwrap();
        let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut frame).await.unwrap();
        let mut frame = bytes::Bytes::from(frame);
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(v)).unwrap();
        assert_eq!(header.correlation_id, self.correlation);
        Resp::decode(&mut frame, v).unwrap()
    }
}
