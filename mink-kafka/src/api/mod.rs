//! Request dispatch: one module per group of APIs, each building its response for the
//! request's version (kafka-protocol refuses to encode a field a version lacks).

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreatePartitionsRequest, CreateTopicsRequest, DeleteGroupsRequest,
    DeleteRecordsRequest, DeleteTopicsRequest, DescribeClusterRequest, DescribeConfigsRequest,
    DescribeGroupsRequest, FetchRequest, FindCoordinatorRequest, HeartbeatRequest,
    IncrementalAlterConfigsRequest, InitProducerIdRequest, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListOffsetsRequest, MetadataRequest, OffsetCommitRequest,
    OffsetFetchRequest, OffsetForLeaderEpochRequest, ProduceRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use tokio::sync::oneshot;

use crate::KafkaConfig;
pub(crate) use crate::frame::{Body, Header, encode};
use crate::groups::Coordinator;
use crate::handler::KafkaHandler;
use crate::versions;

mod fetch;
mod groups;
mod metadata;
mod offsets;
mod produce;
mod refuse;
mod topics;

/// What every request handler reaches.
pub(crate) struct Ctx {
    pub handler: Arc<dyn KafkaHandler>,
    pub config: KafkaConfig,
    /// Consumer groups, while this node holds the lease.
    pub groups: Arc<Coordinator>,
    /// Idempotent producers' batches refused as not persisted (`crate::refused`).
    pub refused: crate::refused::RefusedBatches,
}

/// A decoded request.
pub(crate) enum Request {
    ApiVersions,
    Metadata(MetadataRequest),
    DescribeCluster(DescribeClusterRequest),
    Produce(ProduceRequest),
    Fetch(FetchRequest),
    ListOffsets(ListOffsetsRequest),
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    InitProducerId(InitProducerIdRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    CreatePartitions(CreatePartitionsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    DeleteRecords(DeleteRecordsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    DescribeGroups(DescribeGroupsRequest),
    ListGroups(ListGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
    /// An API that is not built: its error response, ready.
    Refused(Body),
}

/// The produce ordering of a connection: wait for the previous Produce to have its
/// offsets, then signal the next.
pub(crate) type ProduceTurn = (Option<oneshot::Receiver<()>>, oneshot::Sender<()>);

fn malformed(key: ApiKey, version: i16, e: impl std::fmt::Display) -> String {
    format!("{key:?} v{version}: a malformed request: {e}")
}

/// Decodes a request body of `key` at `version`. An API or version not served (and
/// not refused with an error of its own) is an error: the connection closes.
pub(crate) fn decode_body(key: ApiKey, version: i16, buf: &mut Bytes) -> Result<Request, String> {
    if key == ApiKey::ApiVersions {
        if version > versions::API_VERSIONS_MAX {
            // KIP-511: the body of a newer version is not read; the answer lists ours.
            return Ok(Request::ApiVersions);
        }
        ApiVersionsRequest::decode(buf, version).map_err(|e| malformed(key, version, e))?;
        return Ok(Request::ApiVersions);
    }
    if !versions::is_supported(key, version) {
        let range = key.valid_versions();
        if (range.min..=range.max).contains(&version) && refuse::refused(key) {
            return refuse::refusal(key, version, buf.clone())
                .map(Request::Refused)
                .ok_or_else(|| malformed(key, version, "the request to refuse"));
        }
        return Err(match versions::supported(key) {
            Some((min, max)) => {
                format!("{key:?} v{version} is not served (versions {min}-{max} are)")
            }
            None => format!("{key:?} is not served (ApiVersions lists what is)"),
        });
    }
    let m = |e| malformed(key, version, e);
    if key == ApiKey::DescribeConfigs && version == 0 {
        // v1 without `include_synonyms` (kafka-protocol 0.18 knows 1-4).
        let mut v1 = bytes::BytesMut::from(&buf[..]);
        v1.extend_from_slice(&[0]);
        *buf = Bytes::new();
        let r = DescribeConfigsRequest::decode(&mut v1.freeze(), 1).map_err(m)?;
        return Ok(Request::DescribeConfigs(r));
    }
    Ok(match key {
        ApiKey::Metadata => Request::Metadata(MetadataRequest::decode(buf, version).map_err(m)?),
        ApiKey::DescribeCluster => {
            Request::DescribeCluster(DescribeClusterRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::Produce => Request::Produce(ProduceRequest::decode(buf, version).map_err(m)?),
        ApiKey::Fetch => Request::Fetch(FetchRequest::decode(buf, version).map_err(m)?),
        ApiKey::ListOffsets => {
            Request::ListOffsets(ListOffsetsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::OffsetForLeaderEpoch => Request::OffsetForLeaderEpoch(
            OffsetForLeaderEpochRequest::decode(buf, version).map_err(m)?,
        ),
        ApiKey::InitProducerId => {
            Request::InitProducerId(InitProducerIdRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::CreateTopics => {
            Request::CreateTopics(CreateTopicsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::DeleteTopics => {
            Request::DeleteTopics(DeleteTopicsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::IncrementalAlterConfigs => Request::IncrementalAlterConfigs(
            IncrementalAlterConfigsRequest::decode(buf, version).map_err(m)?,
        ),
        ApiKey::CreatePartitions => {
            Request::CreatePartitions(CreatePartitionsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::DeleteRecords => {
            Request::DeleteRecords(DeleteRecordsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::DescribeConfigs => {
            Request::DescribeConfigs(DescribeConfigsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::FindCoordinator => {
            Request::FindCoordinator(FindCoordinatorRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::JoinGroup => Request::JoinGroup(JoinGroupRequest::decode(buf, version).map_err(m)?),
        ApiKey::SyncGroup => Request::SyncGroup(SyncGroupRequest::decode(buf, version).map_err(m)?),
        ApiKey::Heartbeat => Request::Heartbeat(HeartbeatRequest::decode(buf, version).map_err(m)?),
        ApiKey::LeaveGroup => {
            Request::LeaveGroup(LeaveGroupRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::OffsetCommit => {
            Request::OffsetCommit(OffsetCommitRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::OffsetFetch => {
            Request::OffsetFetch(OffsetFetchRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::DescribeGroups => {
            Request::DescribeGroups(DescribeGroupsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::ListGroups => {
            Request::ListGroups(ListGroupsRequest::decode(buf, version).map_err(m)?)
        }
        ApiKey::DeleteGroups => {
            Request::DeleteGroups(DeleteGroupsRequest::decode(buf, version).map_err(m)?)
        }
        other => return Err(format!("{other:?} has no handler")),
    })
}

/// Serves one request; `None` when no response is sent (Produce with acks=0).
pub(crate) async fn handle(
    ctx: &Ctx,
    header: Header,
    request: Request,
    turn: Option<ProduceTurn>,
) -> Option<Body> {
    let v = header.version;
    let key = header.key;
    Some(match request {
        Request::ApiVersions => {
            let (response, version) = versions::api_versions(v);
            encode(key, &response, version)
        }
        Request::Metadata(r) => encode(key, &metadata::metadata(ctx, r, v).await, v),
        Request::DescribeCluster(r) => encode(key, &metadata::describe_cluster(ctx, r, v), v),
        Request::Produce(r) => {
            let acks = r.acks;
            let response = produce::produce(ctx, r, v, turn).await;
            if acks == 0 {
                return None;
            }
            encode(key, &response, v)
        }
        Request::Fetch(r) => encode(key, &fetch::fetch(ctx, r, v).await, v),
        Request::ListOffsets(r) => encode(key, &offsets::list_offsets(ctx, r, v).await, v),
        Request::OffsetForLeaderEpoch(r) => {
            encode(key, &offsets::offset_for_leader_epoch(ctx, r).await, v)
        }
        Request::InitProducerId(r) => encode(key, &offsets::init_producer_id(ctx, r, v).await, v),
        Request::CreateTopics(r) => encode(key, &topics::create_topics(ctx, r, v).await, v),
        Request::DeleteTopics(r) => encode(key, &topics::delete_topics(ctx, r, v).await, v),
        Request::DescribeConfigs(r) if v == 0 => {
            topics::describe_configs_v0(&topics::describe_configs(ctx, r, 1).await)
        }
        Request::DescribeConfigs(r) => encode(key, &topics::describe_configs(ctx, r, v).await, v),
        Request::CreatePartitions(r) => encode(key, &topics::create_partitions(ctx, r).await, v),
        Request::IncrementalAlterConfigs(r) => {
            encode(key, &topics::incremental_alter_configs(ctx, r).await, v)
        }
        Request::DeleteRecords(r) => encode(key, &topics::delete_records(ctx, r).await, v),
        Request::FindCoordinator(r) => encode(key, &groups::find_coordinator(ctx, r, v), v),
        Request::JoinGroup(r) => {
            let client_id = header
                .header
                .client_id
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_default();
            let response = groups::join_group(ctx, r, v, &client_id, header.peer).await;
            encode(key, &response, v)
        }
        Request::SyncGroup(r) => encode(key, &groups::sync_group(ctx, r, v).await, v),
        Request::Heartbeat(r) => encode(key, &groups::heartbeat(ctx, r, v), v),
        Request::LeaveGroup(r) => encode(key, &groups::leave_group(ctx, r, v), v),
        Request::OffsetCommit(r) => encode(key, &groups::offset_commit(ctx, r, v).await, v),
        Request::OffsetFetch(r) => encode(key, &groups::offset_fetch(ctx, r, v), v),
        Request::DescribeGroups(r) => encode(key, &groups::describe_groups(ctx, r, v), v),
        Request::ListGroups(r) => encode(key, &groups::list_groups(ctx, r, v), v),
        Request::DeleteGroups(r) => encode(key, &groups::delete_groups(ctx, r).await, v),
        Request::Refused(body) => body,
    })
}

/// A string for a response field.
pub(crate) fn s(text: impl Into<String>) -> StrBytes {
    StrBytes::from_string(text.into())
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
