//! Consumer groups: FindCoordinator (0-4), JoinGroup (0-9), SyncGroup (0-5), Heartbeat
//! (0-4), LeaveGroup (0-5), OffsetCommit (2-8), OffsetFetch (1-8), DescribeGroups
//! (0-5), ListGroups (0-4), DeleteGroups (0-2). The coordinator is the lease holder;
//! other nodes answer NOT_COORDINATOR and clients find it again. Membership is
//! [`crate::groups::Coordinator`]'s; offsets go through the metadata log.

use std::net::SocketAddr;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator as CoordinatorEntry;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;

use super::{Ctx, s};
use crate::groups::{Join, State};
use crate::handler::{CommittedOffset, error_code};

/// The error of "this node does not coordinate groups now".
fn not_coordinator(ctx: &Ctx) -> Option<i16> {
    if ctx.handler.is_coordinator() {
        None
    } else {
        ctx.groups.clear();
        Some(ResponseError::NotCoordinator.code())
    }
}

/// The coordinator broker: the lease holder, when it has a Kafka listener.
fn coordinator_broker(ctx: &Ctx) -> Option<crate::handler::Broker> {
    let cluster = ctx.handler.cluster();
    cluster
        .brokers
        .into_iter()
        .find(|b| b.node_id == cluster.controller_id)
}

pub(crate) fn find_coordinator(
    ctx: &Ctx,
    r: FindCoordinatorRequest,
    v: i16,
) -> FindCoordinatorResponse {
    // Key type 0 is a group; 1, a transaction (not implemented).
    let answer = || -> (i16, Option<String>, i32, String, i32) {
        if r.key_type != 0 {
            return (
                ResponseError::TransactionalIdAuthorizationFailed.code(),
                Some("transactions are not implemented".into()),
                -1,
                String::new(),
                -1,
            );
        }
        match coordinator_broker(ctx) {
            Some(b) => (0, None, b.node_id, b.host, b.port),
            None => (
                ResponseError::CoordinatorNotAvailable.code(),
                Some("no node holds the lease right now".into()),
                -1,
                String::new(),
                -1,
            ),
        }
    };
    if v >= 4 {
        let coordinators = r
            .coordinator_keys
            .iter()
            .map(|k| {
                let (error, message, node, host, port) = answer();
                CoordinatorEntry::default()
                    .with_key(k.clone())
                    .with_node_id(BrokerId(node))
                    .with_host(s(host))
                    .with_port(port)
                    .with_error_code(error)
                    .with_error_message(message.map(s))
            })
            .collect();
        FindCoordinatorResponse::default().with_coordinators(coordinators)
    } else {
        let (error, message, node, host, port) = answer();
        let mut out = FindCoordinatorResponse::default()
            .with_error_code(error)
            .with_node_id(BrokerId(node))
            .with_host(s(host))
            .with_port(port);
        if v >= 1 {
            out = out.with_error_message(message.map(s));
        }
        out
    }
}

pub(crate) async fn join_group(
    ctx: &Ctx,
    r: JoinGroupRequest,
    v: i16,
    client_id: &str,
    peer: SocketAddr,
) -> JoinGroupResponse {
    let fill = |out: JoinGroupResponse| {
        // protocol_name is nullable from v7 only.
        if v < 7 && out.protocol_name.is_none() {
            out.with_protocol_name(Some(s("")))
        } else {
            out
        }
    };
    if let Some(code) = not_coordinator(ctx) {
        return fill(
            JoinGroupResponse::default()
                .with_error_code(code)
                .with_generation_id(-1)
                .with_member_id(r.member_id),
        );
    }
    let joined = ctx
        .groups
        .join(Join {
            group: r.group_id.to_string(),
            member_id: r.member_id.to_string(),
            client_id: client_id.to_string(),
            client_host: format!("/{}", peer.ip()),
            session_timeout_ms: r.session_timeout_ms,
            rebalance_timeout_ms: if v >= 1 {
                r.rebalance_timeout_ms
            } else {
                r.session_timeout_ms
            },
            protocol_type: r.protocol_type.to_string(),
            protocols: r
                .protocols
                .into_iter()
                .map(|p| (p.name.to_string(), p.metadata))
                .collect(),
            member_id_required: v >= 4,
            group_instance_id: if v >= 5 {
                r.group_instance_id.map(|i| i.to_string())
            } else {
                None
            },
        })
        .await;
    let members = joined
        .members
        .into_iter()
        .map(|m| {
            let out = join_group_response::JoinGroupResponseMember::default()
                .with_member_id(s(m.member_id))
                .with_metadata(m.metadata);
            if v >= 5 {
                out.with_group_instance_id(m.group_instance_id.map(s))
            } else {
                out
            }
        })
        .collect();
    let mut out = JoinGroupResponse::default()
        .with_error_code(joined.error)
        .with_generation_id(joined.generation)
        .with_protocol_name(joined.protocol_name.map(s))
        .with_leader(s(joined.leader))
        .with_member_id(s(joined.member_id))
        .with_members(members);
    if v >= 7 {
        out = out.with_protocol_type(joined.protocol_type.map(s));
    }
    if v >= 9 {
        out = out.with_skip_assignment(joined.skip_assignment);
    }
    fill(out)
}

pub(crate) async fn sync_group(ctx: &Ctx, r: SyncGroupRequest, v: i16) -> SyncGroupResponse {
    if let Some(code) = not_coordinator(ctx) {
        return SyncGroupResponse::default().with_error_code(code);
    }
    let instance = r.group_instance_id.as_deref().filter(|_| v >= 3);
    if let Some(e) = ctx.groups.fenced(&r.group_id, &r.member_id, instance) {
        return SyncGroupResponse::default().with_error_code(e.code());
    }
    let synced = ctx
        .groups
        .sync(
            &r.group_id,
            r.generation_id,
            &r.member_id,
            r.assignments
                .into_iter()
                .map(|a| (a.member_id.to_string(), a.assignment))
                .collect(),
        )
        .await;
    let mut out = SyncGroupResponse::default()
        .with_error_code(synced.error)
        .with_assignment(synced.assignment);
    if v >= 5 {
        out = out
            .with_protocol_type(synced.protocol_type.map(s))
            .with_protocol_name(synced.protocol_name.map(s));
    }
    out
}

pub(crate) fn heartbeat(ctx: &Ctx, r: HeartbeatRequest, v: i16) -> HeartbeatResponse {
    let instance = r.group_instance_id.as_deref().filter(|_| v >= 3);
    let code = not_coordinator(ctx).unwrap_or_else(|| {
        ctx.groups
            .fenced(&r.group_id, &r.member_id, instance)
            .or_else(|| {
                ctx.groups
                    .heartbeat(&r.group_id, r.generation_id, &r.member_id)
            })
            .map_or(0, |e| e.code())
    });
    HeartbeatResponse::default().with_error_code(code)
}

pub(crate) fn leave_group(ctx: &Ctx, r: LeaveGroupRequest, v: i16) -> LeaveGroupResponse {
    if let Some(code) = not_coordinator(ctx) {
        return LeaveGroupResponse::default().with_error_code(code);
    }
    if v >= 3 {
        // By instance id where one is named (a static member).
        let results: Vec<Option<ResponseError>> = r
            .members
            .iter()
            .map(|m| {
                let instance = m.group_instance_id.as_deref();
                match ctx
                    .groups
                    .leaving_member(&r.group_id, &m.member_id, instance)
                {
                    Ok(id) => ctx.groups.leave(&r.group_id, &[id])[0],
                    Err(e) => Some(e),
                }
            })
            .collect();
        let members = r
            .members
            .into_iter()
            .zip(results)
            .map(|(m, e)| {
                MemberResponse::default()
                    .with_member_id(m.member_id)
                    .with_group_instance_id(m.group_instance_id)
                    .with_error_code(e.map_or(0, |e| e.code()))
            })
            .collect();
        LeaveGroupResponse::default().with_members(members)
    } else {
        let code =
            ctx.groups.leave(&r.group_id, &[r.member_id.to_string()])[0].map_or(0, |e| e.code());
        LeaveGroupResponse::default().with_error_code(code)
    }
}

/// An OffsetCommit answered with one error for every partition it names.
fn refuse_commit(
    code: i16,
    topics: Vec<offset_commit_request::OffsetCommitRequestTopic>,
) -> OffsetCommitResponse {
    let topics = topics
        .into_iter()
        .map(|t| {
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

pub(crate) async fn offset_commit(
    ctx: &Ctx,
    r: OffsetCommitRequest,
    v: i16,
) -> OffsetCommitResponse {
    let refuse = refuse_commit;
    if let Some(code) = not_coordinator(ctx) {
        return refuse(code, r.topics);
    }
    let instance = r.group_instance_id.as_deref().filter(|_| v >= 7);
    if let Some(e) = ctx
        .groups
        .fenced(&r.group_id, &r.member_id, instance)
        .or_else(|| {
            ctx.groups
                .may_commit(&r.group_id, r.generation_id_or_member_epoch, &r.member_id)
        })
    {
        return refuse(e.code(), r.topics);
    }
    // v2-4 may ask for a retention; -1 (and later versions) is the configured one.
    let retention_ms = if (2..=4).contains(&v) && r.retention_time_ms > 0 {
        r.retention_time_ms
    } else {
        ctx.config.group_offsets_ttl_ms.min(i64::MAX as u64) as i64
    };
    let mut offsets = Vec::new();
    let mut results: Vec<(usize, i32, i16)> = Vec::new();
    for (t, topic) in r.topics.iter().enumerate() {
        let partitions = match ctx.handler.topic(&topic.name, None).await {
            Ok(view) => view.partitions.len() as i32,
            Err(_) => -1,
        };
        for p in &topic.partitions {
            if p.partition_index < 0 || p.partition_index >= partitions {
                results.push((
                    t,
                    p.partition_index,
                    ResponseError::UnknownTopicOrPartition.code(),
                ));
                continue;
            }
            offsets.push(CommittedOffset {
                topic: topic.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                metadata: p
                    .committed_metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            });
            results.push((t, p.partition_index, 0));
        }
    }
    if !offsets.is_empty()
        && let Err(e) = ctx
            .handler
            .commit_offsets(&r.group_id, offsets, retention_ms)
            .await
    {
        tracing::warn!(group = r.group_id.as_str(), "kafka offset commit: {e}");
        let code = match e {
            mink_types::MinkError::InvalidArgument { .. } => ResponseError::InvalidCommitOffsetSize,
            other => match error_code(&other) {
                ResponseError::LeaderNotAvailable => ResponseError::CoordinatorLoadInProgress,
                c => c,
            },
        }
        .code();
        for r in results.iter_mut().filter(|r| r.2 == 0) {
            r.2 = code;
        }
    }
    let mut topics: Vec<OffsetCommitResponseTopic> = r
        .topics
        .iter()
        .map(|t| OffsetCommitResponseTopic::default().with_name(t.name.clone()))
        .collect();
    for (t, partition, code) in results {
        topics[t].partitions.push(
            OffsetCommitResponsePartition::default()
                .with_partition_index(partition)
                .with_error_code(code),
        );
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// Committed offsets of one topic: partition, offset, metadata.
type TopicOffsets = (TopicName, Vec<(i32, i64, String)>);

/// A group's committed offsets for the topics asked (`None`: every one committed).
fn fetch_offsets(
    ctx: &Ctx,
    group: &str,
    topics: Option<Vec<(TopicName, Vec<i32>)>>,
) -> Vec<TopicOffsets> {
    let committed = ctx.handler.committed_offsets(group);
    let find = |topic: &str, partition: i32| {
        committed
            .iter()
            .find(|c| c.topic == topic && c.partition == partition)
            .map_or((-1, String::new()), |c| (c.offset, c.metadata.clone()))
    };
    match topics {
        Some(topics) => topics
            .into_iter()
            .map(|(name, partitions)| {
                let found = partitions
                    .into_iter()
                    .map(|p| {
                        let (offset, metadata) = find(&name, p);
                        (p, offset, metadata)
                    })
                    .collect();
                (name, found)
            })
            .collect(),
        None => {
            let mut out: Vec<TopicOffsets> = Vec::new();
            for c in committed {
                let entry = (c.partition, c.offset, c.metadata);
                match out.iter_mut().find(|(n, _)| n.as_str() == c.topic) {
                    Some((_, list)) => list.push(entry),
                    None => out.push((TopicName(s(c.topic)), vec![entry])),
                }
            }
            out
        }
    }
}

pub(crate) fn offset_fetch(ctx: &Ctx, r: OffsetFetchRequest, v: i16) -> OffsetFetchResponse {
    let coordinator_error = not_coordinator(ctx);
    if v >= 8 {
        let groups = r
            .groups
            .into_iter()
            .map(|g| {
                let out = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                if let Some(code) = coordinator_error {
                    return out.with_error_code(code);
                }
                let topics = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name, t.partition_indexes))
                        .collect()
                });
                let found = fetch_offsets(ctx, &g.group_id, topics)
                    .into_iter()
                    .map(|(name, parts)| {
                        OffsetFetchResponseTopics::default()
                            .with_name(name)
                            .with_partitions(
                                parts
                                    .into_iter()
                                    .map(|(p, offset, metadata)| {
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(offset)
                                            .with_metadata(Some(s(metadata)))
                                    })
                                    .collect(),
                            )
                    })
                    .collect();
                out.with_topics(found)
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let topics: Option<Vec<(TopicName, Vec<i32>)>> = r.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect()
    });
    if let Some(code) = coordinator_error {
        if v >= 2 {
            return OffsetFetchResponse::default().with_error_code(code);
        }
        // v1 has per-partition errors only.
        let topics = topics
            .unwrap_or_default()
            .into_iter()
            .map(|(name, parts): (TopicName, Vec<i32>)| {
                OffsetFetchResponseTopic::default()
                    .with_name(name)
                    .with_partitions(
                        parts
                            .into_iter()
                            .map(|p| {
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(-1)
                                    .with_metadata(Some(s("")))
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect();
        return OffsetFetchResponse::default().with_topics(topics);
    }
    let found = fetch_offsets(ctx, &r.group_id, topics)
        .into_iter()
        .map(|(name, parts)| {
            OffsetFetchResponseTopic::default()
                .with_name(name)
                .with_partitions(
                    parts
                        .into_iter()
                        .map(|(p, offset, metadata)| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(offset)
                                .with_metadata(Some(s(metadata)))
                        })
                        .collect(),
                )
        })
        .collect();
    OffsetFetchResponse::default().with_topics(found)
}

pub(crate) fn describe_groups(
    ctx: &Ctx,
    r: DescribeGroupsRequest,
    v: i16,
) -> DescribeGroupsResponse {
    let coordinator_error = not_coordinator(ctx);
    let groups = r
        .groups
        .into_iter()
        .map(|id| {
            let out = DescribedGroup::default().with_group_id(id.clone());
            if let Some(code) = coordinator_error {
                return out.with_error_code(code);
            }
            match ctx.groups.describe(&id) {
                // A group with committed offsets and no members is Empty; any other
                // unknown group is Dead with no members, as Kafka answers.
                None if ctx.handler.offset_groups().iter().any(|g| **g == *id.0) => out
                    .with_group_state(s("Empty"))
                    .with_protocol_type(s("consumer")),
                None => out.with_group_state(s("Dead")),
                Some(g) => {
                    let members = g
                        .members
                        .into_iter()
                        .map(|m| {
                            let out = DescribedGroupMember::default()
                                .with_member_id(s(m.member_id))
                                .with_client_id(s(m.client_id))
                                .with_client_host(s(m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment);
                            // The field exists from v4 on.
                            if v >= 4 {
                                out.with_group_instance_id(m.group_instance_id.map(s))
                            } else {
                                out
                            }
                        })
                        .collect();
                    out.with_group_state(s(g.state.name()))
                        .with_protocol_type(s(g.protocol_type))
                        .with_protocol_data(s(g.protocol))
                        .with_members(members)
                }
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub(crate) fn list_groups(ctx: &Ctx, r: ListGroupsRequest, v: i16) -> ListGroupsResponse {
    if let Some(code) = not_coordinator(ctx) {
        return ListGroupsResponse::default().with_error_code(code);
    }
    let mut listed: Vec<(String, State, String)> = ctx.groups.list();
    // Groups with committed offsets and no members are Empty consumer groups.
    for g in ctx.handler.offset_groups() {
        if !listed.iter().any(|(id, _, _)| *id == g) {
            listed.push((g, State::Empty, "consumer".into()));
        }
    }
    let groups = listed
        .into_iter()
        .filter(|(_, state, _)| {
            v < 4
                || r.states_filter.is_empty()
                || r.states_filter.iter().any(|f| f.as_str() == state.name())
        })
        .map(|(id, state, protocol_type)| {
            let mut g = ListedGroup::default()
                .with_group_id(GroupId(s(id)))
                .with_protocol_type(s(protocol_type));
            if v >= 4 {
                g = g.with_group_state(s(state.name()));
            }
            g
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub(crate) async fn delete_groups(ctx: &Ctx, r: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let coordinator_error = not_coordinator(ctx);
    let mut results = Vec::new();
    for id in r.groups_names {
        let out = DeletableGroupResult::default().with_group_id(id.clone());
        let code = match coordinator_error {
            Some(code) => code,
            None => match ctx.groups.delete(&id) {
                Err(e) => e.code(),
                Ok(known) => match ctx.handler.delete_group_offsets(&id).await {
                    Ok(()) => 0,
                    // A group that had members and never committed is deleted too.
                    Err(mink_types::MinkError::NotFound(_)) if known => 0,
                    Err(mink_types::MinkError::NotFound(_)) => {
                        ResponseError::GroupIdNotFound.code()
                    }
                    Err(e) => error_code(&e).code(),
                },
            },
        };
        results.push(out.with_error_code(code));
    }
    DeleteGroupsResponse::default().with_results(results)
}
