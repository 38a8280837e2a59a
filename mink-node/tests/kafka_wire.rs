//! Kafka requests that no client library on this machine sends, spoken by hand
//! (kafka-protocol's messages) against one node: JoinGroup v9's `skip_assignment`
//! (the Java client's, KIP-814) and IncrementalAlterConfigs naming one resource twice.

mod common;

use common::KafkaConn;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
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
    let created: CreateTopicsResponse = kafka
        .call(
            ApiKey::CreateTopics,
            5,
            &CreateTopicsRequest::default()
                .with_timeout_ms(5_000)
                .with_topics(vec![
                    CreatableTopic::default()
                        .with_name(TopicName(name("twice.v1")))
                        .with_num_partitions(1)
                        .with_replication_factor(1),
                ]),
        )
        .await;
    assert_eq!(created.topics[0].error_code, 0);
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
