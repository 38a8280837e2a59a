//! ListOffsets (1-7: EARLIEST, LATEST, by timestamp; MAX_TIMESTAMP and LATEST_TIERED
//! refused) and InitProducerId (0-4: a writer id; transactional ids refused).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse,
    ProducerId,
};

use super::Ctx;
use crate::handler::{OffsetQuery, error_code};

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
