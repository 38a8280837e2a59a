//! Mutated Kafka requests against a real node: whatever the bytes of a well-formed
//! request of any served API are changed to (bytes flipped, counts and lengths set to
//! their extremes, the frame cut short or padded), the node answers the request or
//! closes that connection. No task of the node panics, and it keeps serving.
//!
//! The seed is `MINK_FUZZ_SEED` (default 1), the number of requests
//! `MINK_FUZZ_REQUESTS` (default 3,000): a failing seed replays.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use mink_node::MinkConfig;
use mink_node::node::Node;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

// As in the node's binary: kafka-protocol sizes arrays from their wire counts
// (docs/kafka.md), which mimalloc survives by reserving without committing.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One node on its own file store (`common::config`), its Kafka waits kept short: a
/// mutated request may ask to wait.
fn config(dir: &std::path::Path) -> MinkConfig {
    let mut c = common::config(dir, &dir.join("objects"), "n0");
    c.kafka.fetch_max_wait_cap_ms = 200;
    c
}

fn name(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A request frame body: header (for the key's header version) and `req` at `v`.
fn frame<R: Encodable + HeaderVersion>(key: ApiKey, v: i16, req: &R) -> Vec<u8> {
    let mut body = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(v)
        .with_correlation_id(7)
        .with_client_id(Some(name("fuzz")))
        .encode(&mut body, R::header_version(v))
        .unwrap();
    req.encode(&mut body, v)
        .unwrap_or_else(|e| panic!("{key:?} v{v}: {e}"));
    body.to_vec()
}

fn records() -> Bytes {
    let record = |i: i64| Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: i,
        sequence: i as i32,
        timestamp: 1_700_000_000_000 + i,
        key: Some(Bytes::from(format!("k{i}"))),
        value: Some(Bytes::from(format!("value {i}"))),
        headers: [(name("h"), Some(Bytes::from_static(b"v")))]
            .into_iter()
            .collect(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record(0), record(1), record(2)],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// A Produce request at `v` of `records` to partition 0 of the fuzzed topic.
fn produce(v: i16, records: Bytes) -> Vec<u8> {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(name("fuzz")))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(records)),
                ]),
        ]);
    frame(ApiKey::Produce, v, &req)
}

/// The record batch damaged past its length, with its length and CRC set to match: a
/// mutated request's batch otherwise fails one of them before a record is read.
fn damaged_records(rng: &mut StdRng) -> Bytes {
    let mut batch = mutate(rng, &records()[12..]);
    batch.splice(0..0, records()[..12].iter().copied());
    if batch.len() >= 61 {
        let length = (batch.len() - 12) as i32;
        batch[8..12].copy_from_slice(&length.to_be_bytes());
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
    }
    Bytes::from(batch)
}

/// One well-formed request of every API the node serves, at its lowest and highest
/// served versions where their layouts differ.
fn templates() -> Vec<(ApiKey, i16, Vec<u8>)> {
    let topic = || TopicName(name("fuzz"));
    let group = || GroupId(name("g"));
    let mut out = Vec::new();
    for v in [0, 3] {
        out.push((
            ApiKey::ApiVersions,
            v,
            frame(ApiKey::ApiVersions, v, &ApiVersionsRequest::default()),
        ));
    }
    for v in [1, 12] {
        let req = MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic())),
        ]));
        out.push((ApiKey::Metadata, v, frame(ApiKey::Metadata, v, &req)));
    }
    for v in [3, 9] {
        out.push((ApiKey::Produce, v, produce(v, records())));
    }
    for v in [4, 12] {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(100)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(topic())
                    .with_partitions(vec![
                        FetchPartition::default()
                            .with_partition(0)
                            .with_partition_max_bytes(1 << 20),
                    ]),
            ]);
        out.push((ApiKey::Fetch, v, frame(ApiKey::Fetch, v, &req)));
    }
    for v in [1, 7] {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(topic())
                    .with_partitions(vec![
                        ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(-2),
                    ]),
            ]);
        out.push((ApiKey::ListOffsets, v, frame(ApiKey::ListOffsets, v, &req)));
    }
    out.push((
        ApiKey::InitProducerId,
        4,
        frame(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        ),
    ));
    for v in [0, 4] {
        let req = if v < 4 {
            FindCoordinatorRequest::default().with_key(name("g"))
        } else {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![name("g")])
        };
        out.push((
            ApiKey::FindCoordinator,
            v,
            frame(ApiKey::FindCoordinator, v, &req),
        ));
    }
    let join = JoinGroupRequest::default()
        .with_group_id(group())
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(name("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(name("range"))
                .with_metadata(Bytes::from_static(b"\0\0\0\0")),
        ]);
    out.push((ApiKey::JoinGroup, 5, frame(ApiKey::JoinGroup, 5, &join)));
    let sync = SyncGroupRequest::default()
        .with_group_id(group())
        .with_generation_id(1)
        .with_member_id(name("m"))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(name("m"))
                .with_assignment(Bytes::from_static(b"\0\0")),
        ]);
    out.push((ApiKey::SyncGroup, 3, frame(ApiKey::SyncGroup, 3, &sync)));
    let beat = HeartbeatRequest::default()
        .with_group_id(group())
        .with_generation_id(1)
        .with_member_id(name("m"));
    out.push((ApiKey::Heartbeat, 3, frame(ApiKey::Heartbeat, 3, &beat)));
    let leave = LeaveGroupRequest::default()
        .with_group_id(group())
        .with_members(vec![MemberIdentity::default().with_member_id(name("m"))]);
    out.push((ApiKey::LeaveGroup, 3, frame(ApiKey::LeaveGroup, 3, &leave)));
    for v in [2, 8] {
        let req = OffsetCommitRequest::default()
            .with_group_id(group())
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(name(""))
            .with_topics(vec![
                OffsetCommitRequestTopic::default()
                    .with_name(topic())
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(1),
                    ]),
            ]);
        out.push((
            ApiKey::OffsetCommit,
            v,
            frame(ApiKey::OffsetCommit, v, &req),
        ));
    }
    for v in [1, 8] {
        let req = if v < 8 {
            OffsetFetchRequest::default()
                .with_group_id(group())
                .with_topics(Some(vec![
                    OffsetFetchRequestTopic::default()
                        .with_name(topic())
                        .with_partition_indexes(vec![0]),
                ]))
        } else {
            OffsetFetchRequest::default().with_groups(vec![
                OffsetFetchRequestGroup::default()
                    .with_group_id(group())
                    .with_topics(Some(vec![
                        OffsetFetchRequestTopics::default()
                            .with_name(topic())
                            .with_partition_indexes(vec![0]),
                    ])),
            ])
        };
        out.push((ApiKey::OffsetFetch, v, frame(ApiKey::OffsetFetch, v, &req)));
    }
    let describe = DescribeGroupsRequest::default().with_groups(vec![group()]);
    out.push((
        ApiKey::DescribeGroups,
        5,
        frame(ApiKey::DescribeGroups, 5, &describe),
    ));
    out.push((
        ApiKey::ListGroups,
        4,
        frame(ApiKey::ListGroups, 4, &ListGroupsRequest::default()),
    ));
    let delete = DeleteGroupsRequest::default().with_groups_names(vec![group()]);
    out.push((
        ApiKey::DeleteGroups,
        2,
        frame(ApiKey::DeleteGroups, 2, &delete),
    ));
    for v in [2, 7] {
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(5_000)
            .with_topics(vec![
                CreatableTopic::default()
                    .with_name(TopicName(name("made")))
                    .with_num_partitions(2)
                    .with_replication_factor(1)
                    .with_configs(vec![
                        CreatableTopicConfig::default()
                            .with_name(name("retention.ms"))
                            .with_value(Some(name("60000"))),
                    ]),
            ]);
        out.push((
            ApiKey::CreateTopics,
            v,
            frame(ApiKey::CreateTopics, v, &req),
        ));
    }
    let drop = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(name("made"))])
        .with_timeout_ms(5_000);
    out.push((
        ApiKey::DeleteTopics,
        3,
        frame(ApiKey::DeleteTopics, 3, &drop),
    ));
    let configs = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(name("fuzz")),
    ]);
    out.push((
        ApiKey::DescribeConfigs,
        4,
        frame(ApiKey::DescribeConfigs, 4, &configs),
    ));
    out.push((
        ApiKey::DescribeCluster,
        1,
        frame(
            ApiKey::DescribeCluster,
            1,
            &DescribeClusterRequest::default(),
        ),
    ));
    out
}

/// `body` changed at random: bytes flipped, a 1-, 2- or 4-byte field set to an
/// extreme (where counts, lengths and varints live), cut short or padded. The request
/// header (api key and version) is left alone three times in four, so that the change
/// reaches the API's decoder and handler.
fn mutate(rng: &mut StdRng, body: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    let from = if rng.random_bool(0.75) { 4 } else { 0 }.min(out.len());
    for _ in 0..rng.random_range(1..=4) {
        if out.len() <= from {
            break;
        }
        let at = rng.random_range(from..out.len());
        match rng.random_range(0..6) {
            0 => out[at] ^= 1 << rng.random_range(0..8),
            1 => out[at] = rng.random(),
            2 => {
                let extreme: [u8; 4] = match rng.random_range(0..5) {
                    0 => 0x7FFF_FFFFu32.to_be_bytes(),
                    1 => 0x8000_0000u32.to_be_bytes(),
                    2 => 0xFFFF_FFFFu32.to_be_bytes(),
                    3 => [0, 0, 0, 0],
                    _ => [0xFF, 0xFF, 0xFF, 0x0F],
                };
                let n = [1, 2, 4][rng.random_range(0..3)].min(out.len() - at);
                out[at..at + n].copy_from_slice(&extreme[4 - n..]);
            }
            3 => out.truncate(at),
            4 => {
                let n = rng.random_range(1..16);
                out.extend((0..n).map(|_| rng.random::<u8>()));
            }
            _ => out[at] = 0x80 | rng.random::<u8>(),
        }
    }
    out
}

/// Sends one frame on a fresh connection; what came back, if anything, within a short
/// while (whether the request was answered or its connection closed does not matter
/// here, only that the node survives it).
async fn send(addr: std::net::SocketAddr, body: &[u8]) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    if s.write_all(&frame).await.is_err() {
        return false;
    }
    let mut len = [0u8; 4];
    matches!(
        tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut len)).await,
        Ok(Ok(_))
    )
}

/// The unmutated Produce is accepted: its batch is one valid batch, so damaged copies
/// of it reach the record decoder.
async fn produce_accepted(addr: std::net::SocketAddr) {
    use kafka_protocol::protocol::Decodable;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = produce(9, records());
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    s.write_all(&frame).await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut response = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut response).await.unwrap();
    let mut response = Bytes::from(response);
    ResponseHeader::decode(&mut response, ProduceRequest::header_version(9) - 1).unwrap();
    let r = ProduceResponse::decode(&mut response, 9).unwrap();
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 0, "{:?}", p.error_message);
}

/// One valid request answered: the node still serves.
async fn still_serves(addr: std::net::SocketAddr) {
    let body = frame(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(name("fuzz")))),
        ])),
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    s.write_all(&frame).await.unwrap();
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len))
        .await
        .expect("the node answers a valid request after the fuzzing")
        .unwrap();
    assert!(i32::from_be_bytes(len) > 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_of_every_api_never_panic_the_node() {
    let panics = Arc::new(AtomicUsize::new(0));
    {
        let panics = panics.clone();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            panics.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    }
    let seed: u64 = std::env::var("MINK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let requests: usize = std::env::var("MINK_FUZZ_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3_000);
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with_store(
        config(dir.path()),
        mink_wal::open_object_store(&config(dir.path()).object_store).unwrap(),
    )
    .await
    .unwrap();
    let addr = node.kafka_addr.expect("the Kafka listener");
    let templates = templates();
    // The valid requests first (a topic with records, a group, a made topic), each
    // answered: the templates are requests the node serves, so their mutations reach
    // its decoders and handlers. A JoinGroup may wait out its rebalance instead.
    for (key, v, body) in &templates {
        let answered = send(addr, body).await;
        assert!(
            answered || *key == ApiKey::JoinGroup,
            "{key:?} v{v} was not answered"
        );
    }
    produce_accepted(addr).await;
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..requests {
        // One request in four is a Produce whose record batch is damaged (its CRC made
        // to match), so that the damage reaches the record decoder.
        let (key, v, mutated) = if i % 4 == 0 {
            let v = if i % 8 == 0 { 3 } else { 9 };
            (ApiKey::Produce, v, produce(v, damaged_records(&mut rng)))
        } else {
            let (key, v, body) = &templates[i % templates.len()];
            (*key, *v, mutate(&mut rng, body))
        };
        let _answered = send(addr, &mutated).await;
        assert_eq!(
            panics.load(Ordering::SeqCst),
            0,
            "seed {seed}, request {i}: {key:?} v{v} mutated to {mutated:02x?} panicked"
        );
    }
    still_serves(addr).await;
    // Requests still running (waits, uploads) and the node's shutdown: a panic there
    // counts too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    node.stop().await;
    assert_eq!(panics.load(Ordering::SeqCst), 0, "seed {seed}");
}
