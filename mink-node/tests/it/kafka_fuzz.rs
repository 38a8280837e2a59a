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
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
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
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use mink_node::MinkConfig;
use mink_node::node::Node;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;

// As in the node's binary: kafka-protocol sizes arrays from their wire counts
// (docs/kafka.md), which mimalloc survives by reserving without committing.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One node on its own file store (`common::config`), its Kafka waits kept short: a
/// mutated request may ask to wait.
fn config(dir: &std::path::Path) -> MinkConfig {
    let mut c = common::config(dir, &dir.join("objects"), "n0");
    c.kafka.fetch_max_wait_cap_ms = 200;
    // A mutated JoinGroup names new groups: none waits for more members.
    c.kafka.initial_rebalance_delay_ms = 0;
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
    produce_to("fuzz", v, records)
}

/// The compacted topic damaged batches go to as well (a primary-key table: its
/// records reach the Put path).
const COMPACTED: &str = "fuzz.compacted";

/// A Produce request at `v` of `records` to partition 0 of `topic`.
fn produce_to(topic: &str, v: i16, records: Bytes) -> Vec<u8> {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(name(topic)))
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

/// A well-formed request of one API at one version; `live` when it speaks for the
/// live group member (its group, member id and generation).
struct Template {
    key: ApiKey,
    v: i16,
    body: Vec<u8>,
    live: bool,
}

/// The member the group templates speak for: joined and synced for real, so that
/// their mutations reach the coordinator's paths past "unknown member".
#[derive(Clone, Debug)]
struct Live {
    group: String,
    member: String,
    generation: i32,
}

/// Every version of `key` in `versions`, each built by `build(v)`.
fn each_version<R: Encodable + HeaderVersion>(
    out: &mut Vec<Template>,
    key: ApiKey,
    versions: std::ops::RangeInclusive<i16>,
    live: bool,
    build: impl Fn(i16) -> R,
) {
    for v in versions {
        out.push(Template {
            key,
            v,
            body: frame(key, v, &build(v)),
            live,
        });
    }
}

/// The versions of `key` the node serves.
fn served(key: ApiKey) -> std::ops::RangeInclusive<i16> {
    let (min, max) = mink_kafka::versions::supported(key).expect("a served API");
    min..=max
}

/// Every version kafka-protocol knows of `key` (for the refused APIs).
fn known(key: ApiKey) -> std::ops::RangeInclusive<i16> {
    let r = key.valid_versions();
    r.min..=r.max
}

/// One well-formed request of every API the node serves at every version it serves
/// (`every_served_version_has_a_template` holds this to the node's table), and of
/// every refused API at every version kafka-protocol knows.
fn templates(live: &Live) -> Vec<Template> {
    let topic = || TopicName(name("fuzz"));
    let group = || GroupId(name("g"));
    let live_group = || GroupId(name(&live.group));
    let member = || name(&live.member);
    let mut out = Vec::new();
    let o = &mut out;
    each_version(
        o,
        ApiKey::ApiVersions,
        served(ApiKey::ApiVersions),
        false,
        |_| ApiVersionsRequest::default(),
    );
    each_version(o, ApiKey::Metadata, served(ApiKey::Metadata), false, |_| {
        MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic())),
        ]))
    });
    for v in served(ApiKey::Produce) {
        o.push(Template {
            key: ApiKey::Produce,
            v,
            body: produce(v, records()),
            live: false,
        });
    }
    each_version(o, ApiKey::Fetch, served(ApiKey::Fetch), false, |_| {
        FetchRequest::default()
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
            ])
    });
    each_version(
        o,
        ApiKey::ListOffsets,
        served(ApiKey::ListOffsets),
        false,
        |_| {
            ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![
                    ListOffsetsTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![
                            ListOffsetsPartition::default()
                                .with_partition_index(0)
                                .with_timestamp(-2),
                        ]),
                ])
        },
    );
    each_version(
        o,
        ApiKey::OffsetForLeaderEpoch,
        served(ApiKey::OffsetForLeaderEpoch),
        false,
        |_| {
            OffsetForLeaderEpochRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![
                    OffsetForLeaderTopic::default()
                        .with_topic(topic())
                        .with_partitions(vec![
                            OffsetForLeaderPartition::default()
                                .with_partition(0)
                                .with_current_leader_epoch(-1)
                                .with_leader_epoch(0),
                        ]),
                ])
        },
    );
    each_version(
        o,
        ApiKey::InitProducerId,
        served(ApiKey::InitProducerId),
        false,
        |_| InitProducerIdRequest::default().with_transaction_timeout_ms(60_000),
    );
    each_version(
        o,
        ApiKey::FindCoordinator,
        served(ApiKey::FindCoordinator),
        false,
        |v| {
            if v < 4 {
                FindCoordinatorRequest::default().with_key(name("g"))
            } else {
                FindCoordinatorRequest::default().with_coordinator_keys(vec![name("g")])
            }
        },
    );
    // The live member joins again: a rebalance, after which it must join and sync
    // once more (`ensure_live`).
    each_version(o, ApiKey::JoinGroup, served(ApiKey::JoinGroup), true, |v| {
        let req = JoinGroupRequest::default()
            .with_group_id(live_group())
            .with_member_id(member())
            .with_session_timeout_ms(30_000)
            .with_protocol_type(name("consumer"))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(name("range"))
                    .with_metadata(Bytes::from_static(b"\0\0\0\0")),
            ]);
        if v >= 1 {
            req.with_rebalance_timeout_ms(1_000)
        } else {
            req
        }
    });
    each_version(
        o,
        ApiKey::SyncGroup,
        served(ApiKey::SyncGroup),
        true,
        |_| {
            SyncGroupRequest::default()
                .with_group_id(live_group())
                .with_generation_id(live.generation)
                .with_member_id(member())
                .with_assignments(vec![
                    SyncGroupRequestAssignment::default()
                        .with_member_id(member())
                        .with_assignment(Bytes::from_static(b"\0\0")),
                ])
        },
    );
    each_version(
        o,
        ApiKey::Heartbeat,
        served(ApiKey::Heartbeat),
        true,
        |_| {
            HeartbeatRequest::default()
                .with_group_id(live_group())
                .with_generation_id(live.generation)
                .with_member_id(member())
        },
    );
    each_version(
        o,
        ApiKey::LeaveGroup,
        served(ApiKey::LeaveGroup),
        true,
        |v| {
            let req = LeaveGroupRequest::default().with_group_id(live_group());
            if v < 3 {
                req.with_member_id(member())
            } else {
                req.with_members(vec![MemberIdentity::default().with_member_id(member())])
            }
        },
    );
    each_version(
        o,
        ApiKey::OffsetCommit,
        served(ApiKey::OffsetCommit),
        true,
        |_| {
            OffsetCommitRequest::default()
                .with_group_id(live_group())
                .with_generation_id_or_member_epoch(live.generation)
                .with_member_id(member())
                .with_topics(vec![
                    OffsetCommitRequestTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(0)
                                .with_committed_offset(1),
                        ]),
                ])
        },
    );
    each_version(
        o,
        ApiKey::OffsetFetch,
        served(ApiKey::OffsetFetch),
        false,
        |v| {
            if v < 8 {
                OffsetFetchRequest::default()
                    .with_group_id(live_group())
                    .with_topics(Some(vec![
                        OffsetFetchRequestTopic::default()
                            .with_name(topic())
                            .with_partition_indexes(vec![0]),
                    ]))
            } else {
                OffsetFetchRequest::default().with_groups(vec![
                    OffsetFetchRequestGroup::default()
                        .with_group_id(live_group())
                        .with_topics(Some(vec![
                            OffsetFetchRequestTopics::default()
                                .with_name(topic())
                                .with_partition_indexes(vec![0]),
                        ])),
                ])
            }
        },
    );
    each_version(
        o,
        ApiKey::DescribeGroups,
        served(ApiKey::DescribeGroups),
        false,
        |_| DescribeGroupsRequest::default().with_groups(vec![live_group(), group()]),
    );
    each_version(
        o,
        ApiKey::ListGroups,
        served(ApiKey::ListGroups),
        false,
        |_| ListGroupsRequest::default(),
    );
    // Not the live group: deleting a group with members is refused anyway, and a
    // mutated name may hit it.
    each_version(
        o,
        ApiKey::DeleteGroups,
        served(ApiKey::DeleteGroups),
        false,
        |_| DeleteGroupsRequest::default().with_groups_names(vec![group()]),
    );
    each_version(
        o,
        ApiKey::CreateTopics,
        served(ApiKey::CreateTopics),
        false,
        |_| {
            CreateTopicsRequest::default()
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
                ])
        },
    );
    each_version(
        o,
        ApiKey::DeleteTopics,
        served(ApiKey::DeleteTopics),
        false,
        |v| {
            let req = DeleteTopicsRequest::default().with_timeout_ms(5_000);
            if v < 6 {
                req.with_topic_names(vec![TopicName(name("made"))])
            } else {
                req.with_topics(vec![
                    DeleteTopicState::default().with_name(Some(TopicName(name("made")))),
                ])
            }
        },
    );
    each_version(
        o,
        ApiKey::IncrementalAlterConfigs,
        served(ApiKey::IncrementalAlterConfigs),
        false,
        |_| {
            use kafka_protocol::messages::incremental_alter_configs_request::{
                AlterConfigsResource, AlterableConfig,
            };
            IncrementalAlterConfigsRequest::default()
                .with_validate_only(true)
                .with_resources(vec![
                    AlterConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(name("fuzz"))
                        .with_configs(vec![
                            AlterableConfig::default()
                                .with_name(name("retention.ms"))
                                .with_value(Some(name("60000"))),
                        ]),
                ])
        },
    );
    each_version(
        o,
        ApiKey::CreatePartitions,
        served(ApiKey::CreatePartitions),
        false,
        |_| {
            CreatePartitionsRequest::default()
                .with_timeout_ms(5_000)
                .with_validate_only(true)
                .with_topics(vec![
                    CreatePartitionsTopic::default()
                        .with_name(topic())
                        .with_count(3),
                ])
        },
    );
    each_version(
        o,
        ApiKey::DeleteRecords,
        served(ApiKey::DeleteRecords),
        false,
        |_| {
            DeleteRecordsRequest::default()
                .with_timeout_ms(5_000)
                .with_topics(vec![
                    DeleteRecordsTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![
                            DeleteRecordsPartition::default()
                                .with_partition_index(0)
                                .with_offset(1),
                        ]),
                ])
        },
    );
    let describe = || {
        DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(name("fuzz")),
        ])
    };
    each_version(o, ApiKey::DescribeConfigs, 1..=4, false, |_| describe());
    // v0 (which kafka-protocol cannot write): v1's body without include_synonyms.
    let mut v0 = frame(ApiKey::DescribeConfigs, 1, &describe());
    v0.pop();
    let at = 2; // the header's api version, after the key
    v0[at..at + 2].copy_from_slice(&0i16.to_be_bytes());
    o.push(Template {
        key: ApiKey::DescribeConfigs,
        v: 0,
        body: v0,
        live: false,
    });
    each_version(
        o,
        ApiKey::DescribeCluster,
        served(ApiKey::DescribeCluster),
        false,
        |_| DescribeClusterRequest::default(),
    );
    refused_templates(o);
    out
}

/// The refused APIs (answered with their error, never a dropped connection), with an
/// item in each request whose refusal echoes its items.
fn refused_templates(o: &mut Vec<Template>) {
    use kafka_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    let txn_topic = || {
        AddPartitionsToTxnTopic::default()
            .with_name(TopicName(name("fuzz")))
            .with_partitions(vec![0, 1])
    };
    each_version(
        o,
        ApiKey::AddPartitionsToTxn,
        known(ApiKey::AddPartitionsToTxn),
        false,
        |v| {
            if v < 4 {
                AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(TransactionalId(name("t")))
                    .with_v3_and_below_topics(vec![txn_topic()])
            } else {
                AddPartitionsToTxnRequest::default().with_transactions(vec![
                    AddPartitionsToTxnTransaction::default()
                        .with_transactional_id(TransactionalId(name("t")))
                        .with_topics(vec![txn_topic()]),
                ])
            }
        },
    );
    each_version(
        o,
        ApiKey::AddOffsetsToTxn,
        known(ApiKey::AddOffsetsToTxn),
        false,
        |_| AddOffsetsToTxnRequest::default(),
    );
    each_version(o, ApiKey::EndTxn, known(ApiKey::EndTxn), false, |_| {
        EndTxnRequest::default()
    });
    each_version(
        o,
        ApiKey::TxnOffsetCommit,
        known(ApiKey::TxnOffsetCommit),
        false,
        |_| {
            TxnOffsetCommitRequest::default()
                .with_group_id(GroupId(name("g")))
                .with_topics(vec![
                    TxnOffsetCommitRequestTopic::default()
                        .with_name(TopicName(name("fuzz")))
                        .with_partitions(vec![
                            TxnOffsetCommitRequestPartition::default().with_committed_offset(3),
                        ]),
                ])
        },
    );
    each_version(
        o,
        ApiKey::SaslHandshake,
        known(ApiKey::SaslHandshake),
        false,
        |_| SaslHandshakeRequest::default().with_mechanism(name("PLAIN")),
    );
    each_version(
        o,
        ApiKey::SaslAuthenticate,
        known(ApiKey::SaslAuthenticate),
        false,
        |_| SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0u\0p")),
    );
    each_version(
        o,
        ApiKey::DescribeAcls,
        known(ApiKey::DescribeAcls),
        false,
        |_| DescribeAclsRequest::default(),
    );
    each_version(
        o,
        ApiKey::CreateAcls,
        known(ApiKey::CreateAcls),
        false,
        |_| {
            CreateAclsRequest::default().with_creations(vec![
                AclCreation::default()
                    .with_resource_type(2)
                    .with_resource_name(name("fuzz")),
            ])
        },
    );
    each_version(
        o,
        ApiKey::DeleteAcls,
        known(ApiKey::DeleteAcls),
        false,
        |_| DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()]),
    );
    each_version(
        o,
        ApiKey::DescribeClientQuotas,
        known(ApiKey::DescribeClientQuotas),
        false,
        |_| DescribeClientQuotasRequest::default(),
    );
    each_version(
        o,
        ApiKey::AlterClientQuotas,
        known(ApiKey::AlterClientQuotas),
        false,
        |_| {
            AlterClientQuotasRequest::default().with_entries(vec![
                EntryData::default()
                    .with_entity(vec![EntityData::default().with_entity_type(name("user"))])
                    .with_ops(vec![OpData::default().with_key(name("producer_byte_rate"))]),
            ])
        },
    );
    each_version(
        o,
        ApiKey::ConsumerGroupHeartbeat,
        known(ApiKey::ConsumerGroupHeartbeat),
        false,
        |_| ConsumerGroupHeartbeatRequest::default().with_group_id(GroupId(name("g"))),
    );
}

#[test]
fn every_served_version_has_a_template() {
    let live = Live {
        group: "live".into(),
        member: "m".into(),
        generation: 1,
    };
    let templates = templates(&live);
    for (key, min, max) in mink_kafka::versions::SUPPORTED {
        for v in *min..=*max {
            assert!(
                templates.iter().any(|t| t.key == *key && t.v == v),
                "{key:?} v{v} is served but has no fuzz template"
            );
        }
    }
    for key in mink_kafka::versions::REFUSED {
        assert!(
            templates.iter().any(|t| t.key == *key),
            "{key:?} is refused but has no fuzz template"
        );
    }
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

/// Sends one frame on a fresh connection and reads the answer (its frame body), or
/// None if the connection closed or nothing came within two seconds. Waiting for the
/// answer keeps one request's work from overlapping the next, so that a panic is
/// blamed on the request that caused it (a request that waits longer, as a mutated
/// JoinGroup may, still overlaps).
async fn send(addr: std::net::SocketAddr, body: &[u8]) -> Option<Vec<u8>> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    s.write_all(&frame).await.ok()?;
    let answer = async {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.ok()?;
        let mut response = vec![0u8; usize::try_from(i32::from_be_bytes(len)).ok()?];
        s.read_exact(&mut response).await.ok()?;
        Some(response)
    };
    tokio::time::timeout(Duration::from_secs(2), answer)
        .await
        .ok()
        .flatten()
}

/// `req` at `v`, sent and its answer decoded; the node must answer it.
async fn call<Req, Resp>(addr: std::net::SocketAddr, key: ApiKey, v: i16, req: &Req) -> Resp
where
    Req: Encodable + HeaderVersion,
    Resp: Decodable,
{
    let response = send(addr, &frame(key, v, req))
        .await
        .unwrap_or_else(|| panic!("{key:?} v{v} was not answered"));
    let mut response = Bytes::from(response);
    ResponseHeader::decode(&mut response, key.response_header_version(v)).unwrap();
    Resp::decode(&mut response, v).unwrap()
}

/// A member of a new group (`live-N`), joined and synced as a consumer does.
async fn join_live(addr: std::net::SocketAddr, groups: &mut u32) -> Live {
    *groups += 1;
    let group = format!("live-{groups}");
    let join = |member: &str| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(name(&group)))
            .with_member_id(name(member))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(1_000)
            .with_protocol_type(name("consumer"))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(name("range"))
                    .with_metadata(Bytes::from_static(b"\0\0\0\0")),
            ])
    };
    let first: JoinGroupResponse = call(addr, ApiKey::JoinGroup, 5, &join("")).await;
    assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
    let member = first.member_id.to_string();
    let joined: JoinGroupResponse = call(addr, ApiKey::JoinGroup, 5, &join(&member)).await;
    assert_eq!(joined.error_code, 0, "{group}: join");
    assert_eq!(
        joined.leader.as_str(),
        member,
        "{group}: the only member leads"
    );
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(name(&group)))
        .with_generation_id(joined.generation_id)
        .with_member_id(name(&member))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(name(&member))
                .with_assignment(Bytes::from_static(b"\0\0")),
        ]);
    let synced: SyncGroupResponse = call(addr, ApiKey::SyncGroup, 3, &sync).await;
    assert_eq!(synced.error_code, 0, "{group}: sync");
    Live {
        group,
        member,
        generation: joined.generation_id,
    }
}

/// Whether the live member is still a member of a stable group (a mutated request
/// may have made it leave or started a rebalance).
async fn live_ok(addr: std::net::SocketAddr, live: &Live) -> bool {
    let beat = HeartbeatRequest::default()
        .with_group_id(GroupId(name(&live.group)))
        .with_generation_id(live.generation)
        .with_member_id(name(&live.member));
    let r: HeartbeatResponse = call(addr, ApiKey::Heartbeat, 4, &beat).await;
    r.error_code == 0
}

/// The unmutated Produce is accepted: its batch is one valid batch, so damaged copies
/// of it reach the record decoder.
async fn produce_accepted(addr: std::net::SocketAddr) {
    let mut response = Bytes::from(
        send(addr, &produce(9, records()))
            .await
            .expect("the Produce is answered"),
    );
    ResponseHeader::decode(&mut response, ApiKey::Produce.response_header_version(9)).unwrap();
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
    let mut groups = 0;
    let mut live = join_live(addr, &mut groups).await;
    let mut templates = templates(&live);
    // The valid requests first (a topic with records, a made topic, the live member's
    // requests against a live member), each answered: the templates are requests the
    // node serves, so their mutations reach its decoders and handlers. The live
    // member's heartbeats and offset commits succeed at every version.
    for i in 0..templates.len() {
        if templates[i].live && !live_ok(addr, &live).await {
            live = join_live(addr, &mut groups).await;
            templates = self::templates(&live);
        }
        let t = &templates[i];
        let answer = send(addr, &t.body).await;
        let answer = answer.unwrap_or_else(|| panic!("{:?} v{} was not answered", t.key, t.v));
        let mut answer = Bytes::from(answer);
        ResponseHeader::decode(&mut answer, t.key.response_header_version(t.v)).unwrap();
        match t.key {
            ApiKey::Heartbeat => {
                let r = HeartbeatResponse::decode(&mut answer, t.v).unwrap();
                assert_eq!(r.error_code, 0, "Heartbeat v{} of a live member", t.v);
            }
            ApiKey::OffsetCommit => {
                let r = OffsetCommitResponse::decode(&mut answer, t.v).unwrap();
                let code = r.topics[0].partitions[0].error_code;
                assert_eq!(code, 0, "OffsetCommit v{} of a live member", t.v);
            }
            _ => {}
        }
    }
    produce_accepted(addr).await;
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(5_000)
        .with_topics(vec![
            CreatableTopic::default()
                .with_name(TopicName(name(COMPACTED)))
                .with_num_partitions(1)
                .with_replication_factor(1)
                .with_configs(vec![
                    CreatableTopicConfig::default()
                        .with_name(name("cleanup.policy"))
                        .with_value(Some(name("compact"))),
                ]),
        ]);
    let mut created = Bytes::from(
        send(addr, &frame(ApiKey::CreateTopics, 5, &create))
            .await
            .expect("CreateTopics answered"),
    );
    ResponseHeader::decode(
        &mut created,
        ApiKey::CreateTopics.response_header_version(5),
    )
    .unwrap();
    let created = CreateTopicsResponse::decode(&mut created, 5).unwrap();
    assert_eq!(created.topics[0].error_code, 0, "{:?}", created.topics[0]);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next = 0;
    let mut rejoins = 0;
    for i in 0..requests {
        // One request in four is a Produce whose record batch is damaged (its CRC made
        // to match), so that the damage reaches the record decoder. The rest cycle
        // through the templates, the live member's sent for a live member.
        let (key, v, mutated) = if i % 4 == 0 {
            let v = if i % 8 == 0 { 3 } else { 9 };
            let topic = if i % 16 == 4 { COMPACTED } else { "fuzz" };
            (
                ApiKey::Produce,
                v,
                produce_to(topic, v, damaged_records(&mut rng)),
            )
        } else {
            let at = next % templates.len();
            next += 1;
            if templates[at].live && !live_ok(addr, &live).await {
                live = join_live(addr, &mut groups).await;
                templates = self::templates(&live);
                rejoins += 1;
            }
            let t = &templates[at];
            (t.key, t.v, mutate(&mut rng, &t.body))
        };
        let _answer = send(addr, &mutated).await;
        assert_eq!(
            panics.load(Ordering::SeqCst),
            0,
            "seed {seed}, request {i}: {key:?} v{v} mutated to {mutated:02x?} panicked"
        );
    }
    eprintln!(
        "{requests} mutated requests over {} templates; the live member joined again {rejoins} times",
        templates.len()
    );
    still_serves(addr).await;
    // Requests still running (waits, uploads) and the node's shutdown: a panic there
    // counts too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    node.stop().await;
    assert_eq!(panics.load(Ordering::SeqCst), 0, "seed {seed}");
}
