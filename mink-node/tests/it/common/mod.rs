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
    c.listeners = mink_node::config::Listeners::ephemeral();
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

    /// A new idempotent producer: (id, epoch).
    pub async fn init_producer(&mut self) -> (i64, i16) {
        use kafka_protocol::messages::{
            ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId,
        };
        let r: InitProducerIdResponse = self
            .call(
                ApiKey::InitProducerId,
                4,
                &InitProducerIdRequest::default()
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
            .await;
        assert_eq!(r.error_code, 0);
        (r.producer_id.0, r.producer_epoch)
    }

    /// Produces `records` (key, value; a `None` value is a tombstone) to partition 0
    /// of `topic` as producer `(id, epoch)` from `first_sequence`: the partition's
    /// answer.
    pub async fn produce_records(
        &mut self,
        topic: &str,
        producer: (i64, i16),
        first_sequence: i32,
        records: &[(Option<bytes::Bytes>, Option<bytes::Bytes>)],
    ) -> kafka_protocol::messages::produce_response::PartitionProduceResponse {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
        use kafka_protocol::protocol::StrBytes;
        use kafka_protocol::records::{
            Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: producer.0,
                producer_epoch: producer.1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: first_sequence + i as i32,
                timestamp: now,
                key: key.clone(),
                value: value.clone(),
                headers: Default::default(),
            })
            .collect();
        let mut batch = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut batch,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(batch.freeze())),
                    ]),
            ]);
        let r: ProduceResponse = self.call(ApiKey::Produce, 9, &request).await;
        r.responses[0].partition_responses[0].clone()
    }

    /// Creates `topic` with `partitions` and `configs` (CreateTopics v5): its error
    /// code.
    pub async fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> i16 {
        use kafka_protocol::messages::create_topics_request::{
            CreatableTopic, CreatableTopicConfig,
        };
        use kafka_protocol::messages::{
            ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName,
        };
        use kafka_protocol::protocol::StrBytes;
        let name = |s: &str| StrBytes::from_string(s.to_string());
        let created: CreateTopicsResponse = self
            .call(
                ApiKey::CreateTopics,
                5,
                &CreateTopicsRequest::default()
                    .with_timeout_ms(5_000)
                    .with_topics(vec![
                        CreatableTopic::default()
                            .with_name(TopicName(name(topic)))
                            .with_num_partitions(partitions)
                            .with_replication_factor(1)
                            .with_configs(
                                configs
                                    .iter()
                                    .map(|(k, v)| {
                                        CreatableTopicConfig::default()
                                            .with_name(name(k))
                                            .with_value(Some(name(v)))
                                    })
                                    .collect(),
                            ),
                    ]),
            )
            .await;
        created.topics[0].error_code
    }
}

/// Starts the node binary (node id `n0`) on `flight` (port 0 for any), with `extra`
/// environment, and returns it with the address it reports; its log is drained in the
/// background.
pub fn spawn_node(
    data: &std::path::Path,
    store: &std::path::Path,
    flight: &str,
    extra: &[(&str, &str)],
) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_mink-node"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("MINK_NODE_ID", "n0")
        .env("MINK_DATA_DIR", data)
        .env(
            "MINK_OBJECT_STORE__URL",
            format!("file://{}", store.display()),
        )
        .env("MINK_LISTENERS__FLIGHT", flight)
        .env("MINK_LISTENERS__ADMIN", "127.0.0.1:0")
        .env("MINK_LISTENERS__KAFKA", "127.0.0.1:0")
        .env("MINK_LISTENERS__ICEBERG_REST", "127.0.0.1:0")
        .env("MINK_META__HEARTBEAT_INTERVAL_MS", "200")
        .env("MINK_META__LEASE_TIMEOUT_MS", "2000")
        .env("MINK_META__NODE_SESSION_TIMEOUT_MS", "3000")
        .env("MINK_META__TAIL_IDLE_INTERVAL_MAX_MS", "200")
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mink-node binary starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let marker = "Flight listening on ";
    let addr = loop {
        let line = lines
            .next()
            .expect("the node reports its Flight address before exiting")
            .unwrap();
        if let Some(at) = line.find(marker) {
            let rest = &line[at + marker.len()..];
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}
