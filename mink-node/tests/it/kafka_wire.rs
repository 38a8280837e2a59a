//! Kafka requests that no client library on this machine sends, spoken by hand
//! (kafka-protocol's messages) against one node: JoinGroup v9's `skip_assignment`
//! (the Java client's, KIP-814) and IncrementalAlterConfigs naming one resource twice.

use crate::common;

use common::KafkaConn;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use mink_flight::MinkClient;
use mink_flight::actions::{GetTable, TableInfo, TableRef};
use mink_node::node::Node;
use mink_types::TablePath;

fn name(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

async fn node(dir: &std::path::Path) -> Node {
    let mut c = common::config(dir, &dir.join("objects"), "n0");
    c.kafka.initial_rebalance_delay_ms = 0;
    Node::start(c).await.unwrap()
}

/// A static consumer `instance` joining `g` without a member id, at JoinGroup v9.
async fn join(kafka: &mut KafkaConn, instance: &str) -> JoinGroupResponse {
    kafka
        .call(
            ApiKey::JoinGroup,
            9,
            &JoinGroupRequest::default()
                .with_group_id(GroupId(name("g")))
                .with_session_timeout_ms(30_000)
                .with_rebalance_timeout_ms(30_000)
                .with_member_id(name(""))
                .with_group_instance_id(Some(name(instance)))
                .with_protocol_type(name("consumer"))
                .with_protocols(vec![
                    JoinGroupRequestProtocol::default()
                        .with_name(name("range"))
                        .with_metadata(bytes::Bytes::from_static(b"subscription")),
                ]),
        )
        .await
}

async fn sync(
    kafka: &mut KafkaConn,
    joined: &JoinGroupResponse,
    instance: &str,
    assignments: Vec<(StrBytes, &'static [u8])>,
) -> SyncGroupResponse {
    kafka
        .call(
            ApiKey::SyncGroup,
            5,
            &SyncGroupRequest::default()
                .with_group_id(GroupId(name("g")))
                .with_generation_id(joined.generation_id)
                .with_member_id(joined.member_id.clone())
                .with_group_instance_id(Some(name(instance)))
                .with_protocol_type(Some(name("consumer")))
                .with_protocol_name(joined.protocol_name.clone())
                .with_assignments(
                    assignments
                        .into_iter()
                        .map(|(member, bytes)| {
                            SyncGroupRequestAssignment::default()
                                .with_member_id(member)
                                .with_assignment(bytes::Bytes::from_static(bytes))
                        })
                        .collect(),
                ),
        )
        .await
}

/// KIP-814: a static leader that restarts into a Stable group is answered with the
/// members and `skip_assignment`, keeps the generation, and its SyncGroup without an
/// assignment returns the one it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_static_leader_is_told_to_skip_the_assignment() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let mut kafka = KafkaConn::connect(node.kafka_addr.unwrap()).await;
    let first = join(&mut kafka, "i-a").await;
    assert_eq!(first.error_code, 0);
    assert_eq!(first.leader, first.member_id);
    assert!(!first.skip_assignment, "a new group: the leader assigns");
    let synced = sync(
        &mut kafka,
        &first,
        "i-a",
        vec![(first.member_id.clone(), b"all")],
    )
    .await;
    assert_eq!(synced.error_code, 0);

    // The process restarts: a join under its instance id, without a member id.
    let again = join(&mut kafka, "i-a").await;
    assert_eq!(again.error_code, 0);
    assert_eq!(again.generation_id, first.generation_id, "no rebalance");
    assert_ne!(again.member_id, first.member_id);
    assert_eq!(again.leader, again.member_id, "it still leads");
    assert!(again.skip_assignment);
    assert_eq!(again.members.len(), 1, "it learns the members");
    let synced = sync(&mut kafka, &again, "i-a", vec![]).await;
    assert_eq!(synced.error_code, 0);
    assert_eq!(synced.assignment.as_ref(), b"all", "its assignment");
    node.stop().await;
}

/// The custom properties (Kafka configs) of `kafka.twice.v1`.
async fn custom(client: &MinkClient) -> std::collections::BTreeMap<String, String> {
    let answer = client
        .call(&GetTable(TableRef {
            path: TablePath::parse("kafka.twice.v1").unwrap(),
        }))
        .await
        .unwrap();
    TableInfo::from_answer(answer)
        .unwrap()
        .descriptor
        .properties
        .custom
}

/// IncrementalAlterConfigs naming one topic twice is INVALID_REQUEST for both, and
/// neither list of changes is applied; the topic alone in a request is altered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_named_twice_in_incremental_alter_configs_is_refused_both_times() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let mut kafka = KafkaConn::connect(node.kafka_addr.unwrap()).await;
    assert_eq!(kafka.create_topic("twice.v1", 1, &[]).await, 0);
    let set = |value: &str| {
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(name("twice.v1"))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(name("segment.bytes"))
                    .with_config_operation(0)
                    .with_value(Some(name(value))),
            ])
    };
    let alter = |resources| {
        IncrementalAlterConfigsRequest::default()
            .with_resources(resources)
            .with_validate_only(false)
    };
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    let before = custom(&client).await;
    for v in [0, 1] {
        let answer: IncrementalAlterConfigsResponse = kafka
            .call(
                ApiKey::IncrementalAlterConfigs,
                v,
                &alter(vec![set("1048576"), set("2097152")]),
            )
            .await;
        assert_eq!(answer.responses.len(), 2);
        for r in &answer.responses {
            assert_eq!(r.error_code, ResponseError::InvalidRequest.code(), "{r:?}");
            let message = r.error_message.as_ref().unwrap();
            assert!(message.contains("more than once"), "{message}");
        }
        assert_eq!(custom(&client).await, before, "nothing applied");
    }
    let answer: IncrementalAlterConfigsResponse = kafka
        .call(
            ApiKey::IncrementalAlterConfigs,
            1,
            &alter(vec![set("1048576")]),
        )
        .await;
    assert_eq!(answer.responses[0].error_code, 0, "{:?}", answer.responses);
    assert_eq!(
        custom(&client)
            .await
            .get("kafka.segment.bytes")
            .map(String::as_str),
        Some("1048576")
    );
    node.stop().await;
}

/// Produces keyed records (a `None` value is a tombstone) to partition 0 of `topic` as
/// producer `(id, epoch)` from `first_sequence`: the error code and the base offset.
async fn produce(
    kafka: &mut KafkaConn,
    topic: &str,
    producer: (i64, i16),
    first_sequence: i32,
    records: &[(&str, Option<&str>)],
) -> (i16, i64) {
    let records: Vec<_> = records
        .iter()
        .map(|(k, v)| {
            (
                Some(bytes::Bytes::from(k.to_string())),
                v.map(|v| bytes::Bytes::from(v.to_string())),
            )
        })
        .collect();
    let p = kafka
        .produce_records(topic, producer, first_sequence, &records)
        .await;
    (p.error_code, p.base_offset)
}

/// An idempotent producer on a compacted topic is held to Kafka's rules as on a log
/// topic: a bumped epoch writes (and fences the older one), a gap is
/// OUT_OF_ORDER_SEQUENCE, an unknown producer that does not start at 0 is
/// UNKNOWN_PRODUCER_ID, a retry is answered with its original offset; and every
/// record takes an offset, a tombstone of a key that never existed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_holds_idempotent_producers_to_kafkas_rules() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let mut kafka = KafkaConn::connect(node.kafka_addr.unwrap()).await;
    let created = kafka
        .create_topic("ledger.v1", 1, &[("cleanup.policy", "compact")])
        .await;
    assert_eq!(created, 0);
    let (id, _) = kafka.init_producer().await;
    let topic = "ledger.v1";
    let code = |e: ResponseError| e.code();
    assert_eq!(
        produce(
            &mut kafka,
            topic,
            (id, 0),
            0,
            &[("a", Some("1")), ("b", Some("2"))]
        )
        .await,
        (0, 0)
    );
    // The producer bumped its epoch (as clients do after a failed batch): it writes,
    // from sequence 0 again, and the older epoch is fenced.
    assert_eq!(
        produce(&mut kafka, topic, (id, 1), 0, &[("a", Some("3"))]).await,
        (0, 2)
    );
    let (fenced, _) = produce(&mut kafka, topic, (id, 0), 2, &[("c", Some("4"))]).await;
    assert_eq!(fenced, code(ResponseError::InvalidProducerEpoch));
    let (gap, _) = produce(&mut kafka, topic, (id, 1), 5, &[("c", Some("4"))]).await;
    assert_eq!(gap, code(ResponseError::OutOfOrderSequenceNumber));
    let (other, _) = kafka.init_producer().await;
    let (unknown, _) = produce(&mut kafka, topic, (other, 0), 3, &[("c", Some("4"))]).await;
    assert_eq!(unknown, code(ResponseError::UnknownProducerId));
    // A tombstone of a key that never existed takes its offset; its retry is answered
    // with it.
    assert_eq!(
        produce(&mut kafka, topic, (id, 1), 1, &[("never", None)]).await,
        (0, 3)
    );
    assert_eq!(
        produce(&mut kafka, topic, (id, 1), 1, &[("never", None)]).await,
        (0, 3)
    );
    assert_eq!(
        produce(
            &mut kafka,
            topic,
            (id, 1),
            2,
            &[("b", None), ("c", Some("5"))]
        )
        .await,
        (0, 4)
    );
    node.stop().await;
}
