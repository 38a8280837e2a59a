//! Refusals: APIs that are not built answer their own error, never a dropped
//! connection. None of them is listed in ApiVersions.
//!
//! - Transactions (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit):
//!   TRANSACTIONAL_ID_AUTHORIZATION_FAILED (per partition where the response has them), as
//!   InitProducerId answers a transactional id (a client cannot get further).
//! - SASL: UNSUPPORTED_SASL_MECHANISM (handshake, no mechanisms offered),
//!   ILLEGAL_SASL_STATE (authenticate).
//! - ACLs: SECURITY_DISABLED.
//! - Quotas and the KIP-848 consumer protocol:
//!   UNSUPPORTED_VERSION with a message saying what is not implemented.
//!
//! APIs whose responses carry one result per item of the request echo those items.

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;

use super::{Body, s};
use crate::frame::encode;

/// Whether `key` has a refusal (at any version kafka-protocol knows).
pub(crate) fn refused(key: ApiKey) -> bool {
    crate::versions::REFUSED.contains(&key)
}

/// The refusal of `key` at `v` (a version kafka-protocol knows); `body` is the
/// request body, read only by refusals that echo the request's items.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per refused Kafka API: the refusals read as one table"
)]
pub(crate) fn refusal(key: ApiKey, v: i16, mut body: Bytes) -> Option<Body> {
    let unsupported = ResponseError::UnsupportedVersion.code();
    let txn = ResponseError::TransactionalIdAuthorizationFailed.code();
    let security = ResponseError::SecurityDisabled.code();
    Some(match key {
        ApiKey::AddOffsetsToTxn => encode(
            key,
            &AddOffsetsToTxnResponse::default().with_error_code(txn),
            v,
        ),
        ApiKey::EndTxn => encode(key, &EndTxnResponse::default().with_error_code(txn), v),
        ApiKey::AddPartitionsToTxn => {
            let r = AddPartitionsToTxnRequest::decode(&mut body, v).ok()?;
            let topic_results =
                |topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic]| {
                    topics
                        .iter()
                        .map(|t| {
                            AddPartitionsToTxnTopicResult::default()
                                .with_name(t.name.clone())
                                .with_results_by_partition(
                                    t.partitions
                                        .iter()
                                        .map(|p| {
                                            AddPartitionsToTxnPartitionResult::default()
                                                .with_partition_index(*p)
                                                .with_partition_error_code(txn)
                                        })
                                        .collect(),
                                )
                        })
                        .collect::<Vec<_>>()
                };
            let response = if v >= 4 {
                AddPartitionsToTxnResponse::default()
                    .with_error_code(txn)
                    .with_results_by_transaction(
                        r.transactions
                            .iter()
                            .map(|t| {
                                AddPartitionsToTxnResult::default()
                                    .with_transactional_id(t.transactional_id.clone())
                                    .with_topic_results(topic_results(&t.topics))
                            })
                            .collect(),
                    )
            } else {
                AddPartitionsToTxnResponse::default()
                    .with_results_by_topic_v3_and_below(topic_results(&r.v3_and_below_topics))
            };
            encode(key, &response, v)
        }
        ApiKey::TxnOffsetCommit => {
            let r = TxnOffsetCommitRequest::decode(&mut body, v).ok()?;
            let topics = r
                .topics
                .iter()
                .map(|t| {
                    TxnOffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    TxnOffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(txn)
                                })
                                .collect(),
                        )
                })
                .collect();
            encode(
                key,
                &TxnOffsetCommitResponse::default().with_topics(topics),
                v,
            )
        }
        ApiKey::SaslHandshake => encode(
            key,
            &SaslHandshakeResponse::default()
                .with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
            v,
        ),
        ApiKey::SaslAuthenticate => encode(
            key,
            &SaslAuthenticateResponse::default()
                .with_error_code(ResponseError::IllegalSaslState.code())
                .with_error_message(Some(s("SASL is not implemented"))),
            v,
        ),
        ApiKey::DescribeAcls => encode(
            key,
            &DescribeAclsResponse::default()
                .with_error_code(security)
                .with_error_message(Some(s("ACLs are not implemented"))),
            v,
        ),
        ApiKey::CreateAcls => {
            let r = CreateAclsRequest::decode(&mut body, v).ok()?;
            let results = r
                .creations
                .iter()
                .map(|_| {
                    AclCreationResult::default()
                        .with_error_code(security)
                        .with_error_message(Some(s("ACLs are not implemented")))
                })
                .collect();
            encode(key, &CreateAclsResponse::default().with_results(results), v)
        }
        ApiKey::DeleteAcls => {
            let r = DeleteAclsRequest::decode(&mut body, v).ok()?;
            let results = r
                .filters
                .iter()
                .map(|_| {
                    DeleteAclsFilterResult::default()
                        .with_error_code(security)
                        .with_error_message(Some(s("ACLs are not implemented")))
                })
                .collect();
            encode(
                key,
                &DeleteAclsResponse::default().with_filter_results(results),
                v,
            )
        }
        ApiKey::DescribeClientQuotas => encode(
            key,
            &DescribeClientQuotasResponse::default()
                .with_error_code(unsupported)
                .with_error_message(Some(s("quotas are not implemented"))),
            v,
        ),
        ApiKey::AlterClientQuotas => {
            let r = AlterClientQuotasRequest::decode(&mut body, v).ok()?;
            let entries = r
                .entries
                .iter()
                .map(|e| {
                    EntryData::default()
                        .with_error_code(unsupported)
                        .with_error_message(Some(s("quotas are not implemented")))
                        .with_entity(
                            e.entity
                                .iter()
                                .map(|d| {
                                    EntityData::default()
                                        .with_entity_type(d.entity_type.clone())
                                        .with_entity_name(d.entity_name.clone())
                                })
                                .collect(),
                        )
                })
                .collect();
            encode(
                key,
                &AlterClientQuotasResponse::default().with_entries(entries),
                v,
            )
        }
        ApiKey::ConsumerGroupHeartbeat => encode(
            key,
            &ConsumerGroupHeartbeatResponse::default()
                .with_error_code(unsupported)
                .with_error_message(Some(s(
                    "the KIP-848 consumer protocol is not implemented; use the classic protocol",
                ))),
            v,
        ),
        _ => return None,
    })
}
