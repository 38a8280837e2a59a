//! Metadata (1-12) and DescribeCluster (0-1): brokers are the nodes with Kafka
//! listeners, the controller is the lease holder, leaders come from the metadata view.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
    TopicName,
};
use mink_types::MinkError;

use super::{Ctx, s};
use crate::handler::{TopicView, error_code};

/// The error of a topic that could not be looked up or created.
pub(crate) fn topic_error(e: &MinkError) -> ResponseError {
    match e {
        MinkError::InvalidArgument { .. } => ResponseError::InvalidTopicException,
        other => error_code(other),
    }
}

pub(crate) async fn metadata(ctx: &Ctx, r: MetadataRequest, v: i16) -> MetadataResponse {
    let cluster = ctx.handler.cluster();
    // v4+ says whether to create unknown topics; older versions always may.
    let may_create = ctx.config.auto_create_topics && (v < 4 || r.allow_auto_topic_creation);
    let create = may_create.then_some(ctx.config.default_partitions);
    let mut topics = Vec::new();
    match r.topics {
        None => match ctx.handler.topics().await {
            Ok(all) => topics.extend(all.iter().map(|t| topic(t, v))),
            Err(e) => tracing::warn!("kafka metadata: listing topics: {e}"),
        },
        Some(requested) => {
            for t in requested {
                let Some(name) = t.name else {
                    // Topic ids (v10+) are not assigned: such a topic is unknown.
                    topics.push(
                        MetadataResponseTopic::default()
                            .with_error_code(ResponseError::UnknownTopicId.code()),
                    );
                    continue;
                };
                match ctx.handler.topic(&name, create).await {
                    Ok(view) => topics.push(topic(&view, v)),
                    Err(e) => topics.push(
                        MetadataResponseTopic::default()
                            .with_name(Some(name))
                            .with_error_code(topic_error(&e).code()),
                    ),
                }
            }
        }
    }
    let brokers = cluster
        .brokers
        .iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.node_id))
                .with_host(s(b.host.clone()))
                .with_port(b.port)
        })
        .collect();
    let mut response = MetadataResponse::default()
        .with_brokers(brokers)
        .with_topics(topics)
        .with_controller_id(BrokerId(cluster.controller_id));
    if v >= 2 {
        response = response.with_cluster_id(Some(s(cluster.cluster_id)));
    }
    response
}

fn topic(t: &TopicView, v: i16) -> MetadataResponseTopic {
    let partitions = t
        .partitions
        .iter()
        .map(|p| {
            let leader = BrokerId(p.leader_id);
            let mut out = MetadataResponsePartition::default()
                .with_partition_index(p.partition)
                .with_leader_id(leader)
                .with_replica_nodes(vec![leader])
                .with_isr_nodes(vec![leader]);
            if p.leader_id < 0 {
                out = out
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_replica_nodes(vec![])
                    .with_isr_nodes(vec![]);
            }
            if v >= 7 {
                out = out.with_leader_epoch(p.leader_epoch);
            }
            out
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(s(t.name.clone()))))
        .with_partitions(partitions)
}

pub(crate) fn describe_cluster(
    ctx: &Ctx,
    r: DescribeClusterRequest,
    v: i16,
) -> DescribeClusterResponse {
    let cluster = ctx.handler.cluster();
    let mut response = DescribeClusterResponse::default();
    // Endpoint type 1 is brokers; 2 (controllers) has no separate endpoints here.
    if v >= 1 {
        response = response.with_endpoint_type(r.endpoint_type);
        if r.endpoint_type != 1 {
            return response
                .with_error_code(ResponseError::UnsupportedEndpointType.code())
                .with_error_message(Some(s(format!(
                    "endpoint type {} is not served; Mink has brokers (1) only",
                    r.endpoint_type
                ))));
        }
    }
    let brokers = cluster
        .brokers
        .iter()
        .map(|b| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.node_id))
                .with_host(s(b.host.clone()))
                .with_port(b.port)
        })
        .collect();
    response
        .with_cluster_id(s(cluster.cluster_id))
        .with_controller_id(BrokerId(cluster.controller_id))
        .with_brokers(brokers)
}
