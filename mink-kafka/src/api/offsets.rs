//! ListOffsets (1-7: EARLIEST, LATEST, by timestamp; MAX_TIMESTAMP and LATEST_TIERED
//! refused), OffsetForLeaderEpoch (2-4: where an epoch ended, for clients validating
//! their position after a leader change) and InitProducerId (0-4: a writer id;
//! transactional ids refused). A `current_leader_epoch` that is not the leader's is
//! FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer), as Kafka answers.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ProducerId,
};

use super::Ctx;
use crate::handler::{OffsetQuery, error_code};

/// Checks the leader epoch a client believes in (`current`; below 0: unchecked)
/// against the partition leader's.
pub(crate) async fn check_leader_epoch(
    ctx: &Ctx,
    topic: &str,
    partition: i32,
    current: i32,
) -> Result<(), ResponseError> {
    if current < 0 {
        return Ok(());
    }
    match ctx.handler.leader_epoch(topic, partition).await {
        Ok(epoch) if current < epoch => Err(ResponseError::FencedLeaderEpoch),
        Ok(epoch) if current > epoch => Err(ResponseError::UnknownLeaderEpoch),
        Ok(_) => Ok(()),
        Err(e) => Err(error_code(&e)),
    }
}

pub(crate) async fn offset_for_leader_epoch(
    ctx: &Ctx,
    r: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::with_capacity(r.topics.len());
    for topic in r.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let out = EpochEndOffset::default()
                .with_partition(p.partition)
                .with_leader_epoch(-1)
                .with_end_offset(-1);
            let checked =
                check_leader_epoch(ctx, &topic.topic, p.partition, p.current_leader_epoch).await;
            let out = match checked {
                Err(code) => out.with_error_code(code.code()),
                Ok(()) => match ctx
                    .handler
                    .epoch_end(&topic.topic, p.partition, p.leader_epoch)
                    .await
                {
                    Ok(Some((epoch, end))) => out.with_leader_epoch(epoch).with_end_offset(end),
                    // An epoch newer than the leader's: UNDEFINED, as Kafka answers.
                    Ok(None) => out,
                    Err(e) => out.with_error_code(error_code(&e).code()),
                },
            };
            partitions.push(out);
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(topic.topic)
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

/// ListOffsets' special timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

pub(crate) async fn list_offsets(ctx: &Ctx, r: ListOffsetsRequest, v: i16) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(r.topics.len());
    for topic in r.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let out =
                ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
            let query = match p.timestamp {
                LATEST => OffsetQuery::Latest,
                EARLIEST => OffsetQuery::Earliest,
                ts if ts >= 0 => OffsetQuery::Timestamp(ts),
                _ => {
                    // MAX_TIMESTAMP (-3), EARLIEST_LOCAL (-4), LATEST_TIERED (-5) and any
                    // other special value: refused.
                    partitions.push(out.with_error_code(ResponseError::UnsupportedVersion.code()));
                    continue;
                }
            };
            // The field exists from v4 on.
            let current = if v >= 4 { p.current_leader_epoch } else { -1 };
            if let Err(code) =
                check_leader_epoch(ctx, &topic.name, p.partition_index, current).await
            {
                partitions.push(out.with_error_code(code.code()));
                continue;
            }
            let out = match ctx
                .handler
                .list_offset(&topic.name, p.partition_index, query)
                .await
            {
                Ok(listed) => {
                    // The field exists from v4 on (and the crate refuses to encode a
                    // field a version lacks).
                    let out = if v >= 4 {
                        out.with_leader_epoch(listed.leader_epoch)
                    } else {
                        out
                    };
                    match listed.offset {
                        Some(offset) => out.with_offset(offset).with_timestamp(listed.timestamp),
                        None => out,
                    }
                }
                Err(e) => out.with_error_code(error_code(&e).code()),
            };
            partitions.push(out);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

pub(crate) async fn init_producer_id(
    ctx: &Ctx,
    r: InitProducerIdRequest,
    _v: i16,
) -> InitProducerIdResponse {
    if r.transactional_id.as_ref().is_some_and(|t| !t.is_empty()) {
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    // A producer re-initialising (KIP-360) gets a new id: the writer window of the old
    // one keeps its sequences, a new id starts from 0.
    match ctx.handler.init_producer_id().await {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => {
            tracing::warn!("kafka InitProducerId: {e}");
            InitProducerIdResponse::default()
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .with_error_code(error_code(&e).code())
        }
    }
}
