//! CreateTopics (2-7), DeleteTopics (1-6), CreatePartitions (0-3), DeleteRecords
//! (0-2) and DescribeConfigs (1-4). A topic is a
//! log table of the Kafka database; `retention.ms` is its `log_ttl`, its other configs
//! are `crate::topic_config`'s. Replication factors are accepted and ignored:
//! durability is the object store's.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, TopicName,
};
use mink_types::MinkError;

use super::metadata::topic_error;
use super::{Ctx, s};
use crate::handler::TopicView;
use crate::topic_config::ConfigType;

/// DescribeConfigs resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Config sources: a topic's own setting, and a default.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;

/// A topic's settings in Kafka's terms: name, value, source, type. `retention.ms`
/// and every config the topic was created with are its own; the rest show their
/// defaults (crate::topic_config).
/// Whether IncrementalAlterConfigs refuses to change the config (the timestamp type
/// stays as the topic was created).
fn read_only(name: &str) -> bool {
    name == "message.timestamp.type"
}

fn topic_configs(t: &TopicView, message_bytes_max: u64) -> Vec<(String, String, i8, i8)> {
    let kind =
        |name: &str| crate::topic_config::config_type(name).map_or(ConfigType::String, |k| k) as i8;
    let mut out = vec![(
        "retention.ms".to_string(),
        t.retention_ms.unwrap_or(-1).to_string(),
        SOURCE_TOPIC,
        ConfigType::Long as i8,
    )];
    for (name, value) in &t.configs {
        out.push((name.clone(), value.clone(), SOURCE_TOPIC, kind(name)));
    }
    for (name, value) in crate::topic_config::defaults(message_bytes_max) {
        if !t.configs.contains_key(name) {
            out.push((name.to_string(), value, SOURCE_DEFAULT, kind(name)));
        }
    }
    out
}

pub(crate) async fn create_topics(
    ctx: &Ctx,
    r: CreateTopicsRequest,
    v: i16,
) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let out = CreatableTopicResult::default().with_name(t.name.clone());
        let fail = |code: ResponseError, message: String| {
            out.clone()
                .with_error_code(code.code())
                .with_error_message(Some(s(message)))
        };
        let partitions = if t.num_partitions == -1 {
            ctx.config.default_partitions as i32
        } else {
            t.num_partitions
        };
        if partitions < 1 {
            results.push(fail(
                ResponseError::InvalidPartitions,
                format!("{} partitions; give at least 1", t.num_partitions),
            ));
            continue;
        }
        if !t.assignments.is_empty() {
            results.push(fail(
                ResponseError::InvalidReplicaAssignment,
                "replica assignments are not supported: the metadata log assigns leaders".into(),
            ));
            continue;
        }
        let configs = t.configs.iter().map(|c| {
            (
                c.name.to_string(),
                c.value.as_ref().map(|v| v.as_str().to_string()),
            )
        });
        let configs = match crate::topic_config::parse(configs, ctx.config.message_bytes_max()) {
            Ok(c) => c,
            Err(e) => {
                results.push(fail(ResponseError::InvalidConfig, e));
                continue;
            }
        };
        match ctx
            .handler
            .create_topic(&t.name, partitions as u32, &configs, r.validate_only)
            .await
        {
            Ok(()) => {
                let mut ok = out.clone();
                if v >= 5 {
                    let view = TopicView {
                        name: t.name.to_string(),
                        partitions: vec![],
                        retention_ms: configs.retention_ms.filter(|ms| *ms > 0),
                        configs: configs.kept.clone(),
                        table_id: None,
                    };
                    let configs = topic_configs(&view, ctx.config.message_bytes_max())
                        .into_iter()
                        .map(|(name, value, source, _)| {
                            CreatableTopicConfigs::default()
                                .with_read_only(read_only(&name))
                                .with_name(s(name))
                                .with_value(Some(s(value)))
                                .with_config_source(source)
                        })
                        .collect();
                    ok = ok
                        .with_num_partitions(partitions)
                        .with_replication_factor(1)
                        .with_configs(Some(configs));
                }
                results.push(ok);
            }
            Err(e) => results.push(fail(topic_error(&e), e.to_string())),
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

pub(crate) async fn delete_topics(
    ctx: &Ctx,
    r: DeleteTopicsRequest,
    v: i16,
) -> DeleteTopicsResponse {
    let names: Vec<Option<TopicName>> = if v >= 6 {
        r.topics.into_iter().map(|t| t.name).collect()
    } else {
        r.topic_names.into_iter().map(Some).collect()
    };
    let mut responses = Vec::with_capacity(names.len());
    for name in names {
        let out = DeletableTopicResult::default().with_name(name.clone());
        let Some(name) = name else {
            responses.push(out.with_error_code(ResponseError::UnknownTopicId.code()));
            continue;
        };
        match ctx.handler.delete_topic(&name).await {
            Ok(()) => responses.push(out),
            Err(e) => {
                let mut out = out.with_error_code(topic_error(&e).code());
                if v >= 5 {
                    out = out.with_error_message(Some(s(e.to_string())));
                }
                responses.push(out);
            }
        }
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

pub(crate) async fn describe_configs(
    ctx: &Ctx,
    r: DescribeConfigsRequest,
    v: i16,
) -> DescribeConfigsResponse {
    let mut results = Vec::with_capacity(r.resources.len());
    for resource in r.resources {
        let out = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        let wanted = |name: &str| {
            resource
                .configuration_keys
                .as_ref()
                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == name))
        };
        match resource.resource_type {
            RESOURCE_TOPIC => match ctx.handler.topic(&resource.resource_name, None).await {
                Ok(view) => {
                    let configs = topic_configs(&view, ctx.config.message_bytes_max())
                        .into_iter()
                        .filter(|(name, ..)| wanted(name))
                        .map(|(name, value, source, kind)| {
                            let mut c = DescribeConfigsResourceResult::default()
                                .with_read_only(read_only(&name))
                                .with_name(s(name))
                                .with_value(Some(s(value)))
                                .with_config_source(source);
                            if v >= 3 {
                                c = c.with_config_type(kind);
                            }
                            c
                        })
                        .collect();
                    results.push(out.with_configs(configs));
                }
                Err(e) => results.push(
                    out.with_error_code(topic_error(&e).code())
                        .with_error_message(Some(s(e.to_string()))),
                ),
            },
            // A broker has no settings a client can read here.
            RESOURCE_BROKER => results.push(out),
            other => results.push(
                out.with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(s(format!(
                        "resource type {other} is not served (topics 2 and brokers 4 are)"
                    )))),
            ),
        }
    }
    DescribeConfigsResponse::default().with_results(results)
}

/// IncrementalAlterConfigs (0-1): a topic's configs set or deleted under the rules of
/// CreateTopics (`topic_config::alter`), all of one resource or none; a broker's are
/// not alterable (its settings are the node's configuration file).
pub(crate) async fn incremental_alter_configs(
    ctx: &Ctx,
    r: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::with_capacity(r.resources.len());
    // A resource named twice is refused both times, as Kafka's broker refuses it:
    // which of its two lists of changes would win is not the client's to guess.
    let mut named = std::collections::HashMap::new();
    for resource in &r.resources {
        *named
            .entry((resource.resource_type, resource.resource_name.to_string()))
            .or_insert(0usize) += 1;
    }
    for resource in r.resources {
        let out = AlterConfigsResourceResponse::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        let fail = |code: ResponseError, message: String| {
            out.clone()
                .with_error_code(code.code())
                .with_error_message(Some(s(message)))
        };
        if named[&(resource.resource_type, resource.resource_name.to_string())] > 1 {
            responses.push(fail(
                ResponseError::InvalidRequest,
                format!(
                    "resource {} appears more than once in the request",
                    resource.resource_name.as_str()
                ),
            ));
            continue;
        }
        match resource.resource_type {
            RESOURCE_TOPIC => {}
            RESOURCE_BROKER => {
                responses.push(fail(
                    ResponseError::PolicyViolation,
                    "a broker's configs are the node's configuration (mink.toml, MINK_*), not alterable over Kafka".into(),
                ));
                continue;
            }
            other => {
                responses.push(fail(
                    ResponseError::InvalidRequest,
                    format!("resource type {other} is not served (topics 2 are)"),
                ));
                continue;
            }
        }
        let topic = resource.resource_name.as_str();
        let view = match ctx.handler.topic(topic, None).await {
            Ok(view) => view,
            Err(e) => {
                responses.push(fail(topic_error(&e), e.to_string()));
                continue;
            }
        };
        let current = view
            .configs
            .iter()
            .map(|(k, v)| (format!("{}{k}", crate::topic_config::PREFIX), v.clone()))
            .collect();
        let ops = resource.configs.into_iter().map(|c| {
            (
                c.name.to_string(),
                c.config_operation,
                c.value.map(|v| v.to_string()),
            )
        });
        let alter = match crate::topic_config::alter(&current, ops, ctx.config.message_bytes_max())
        {
            Ok(alter) => alter,
            Err(crate::topic_config::AlterRefused::Request(why)) => {
                responses.push(fail(ResponseError::InvalidRequest, why));
                continue;
            }
            Err(crate::topic_config::AlterRefused::Config(why)) => {
                responses.push(fail(ResponseError::InvalidConfig, why));
                continue;
            }
        };
        match ctx
            .handler
            .alter_topic_configs(topic, view.table_id, &alter, r.validate_only)
            .await
        {
            Ok(()) => responses.push(out),
            Err(e @ MinkError::InvalidArgument { .. }) => {
                responses.push(fail(ResponseError::InvalidConfig, e.to_string()));
            }
            Err(e) => responses.push(fail(topic_error(&e), e.to_string())),
        }
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// CreatePartitions (0-3): a topic grows by buckets (`MetaCommand::AddBuckets`); a
/// count at or below the current one, or replica assignments, are refused as Kafka
/// refuses them.
pub(crate) async fn create_partitions(
    ctx: &Ctx,
    r: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let out = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let fail = |code: ResponseError, message: String| {
            out.clone()
                .with_error_code(code.code())
                .with_error_message(Some(s(message)))
        };
        if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            results.push(fail(
                ResponseError::InvalidReplicaAssignment,
                "replica assignments are not supported: the metadata log assigns leaders".into(),
            ));
            continue;
        }
        let current = match ctx.handler.topic(&t.name, None).await {
            Ok(view) => view.partitions.len() as i32,
            Err(e) => {
                results.push(fail(topic_error(&e), e.to_string()));
                continue;
            }
        };
        if t.count <= current {
            results.push(fail(
                ResponseError::InvalidPartitions,
                format!(
                    "topic {} has {current} partitions; it can only grow (asked for {})",
                    &*t.name, t.count
                ),
            ));
            continue;
        }
        match ctx
            .handler
            .create_partitions(&t.name, t.count as u32, r.validate_only)
            .await
        {
            Ok(()) => results.push(out),
            Err(e @ MinkError::InvalidArgument { .. }) => {
                results.push(fail(ResponseError::InvalidPartitions, e.to_string()));
            }
            Err(e) => results.push(fail(topic_error(&e), e.to_string())),
        }
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// The most partitions one DeleteRecords may name (each may compact the leader's
/// streams): more are refused with POLICY_VIOLATION.
pub const DELETE_RECORDS_PARTITIONS_MAX: usize = 1_000;

/// DeleteRecords (0-2): each partition's log start moves to the offset asked for
/// (-1: the high watermark); the answer is the new log start (its low watermark). A
/// partition named twice is deleted once; a lake-tiered topic's records are refused
/// (POLICY_VIOLATION: its retention trims it behind the lake).
pub(crate) async fn delete_records(ctx: &Ctx, r: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let named: usize = r.topics.iter().map(|t| t.partitions.len()).sum();
    let too_many = named > DELETE_RECORDS_PARTITIONS_MAX;
    let mut seen = std::collections::HashSet::new();
    let mut topics = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let out = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            if !seen.insert((t.name.clone(), p.partition_index)) {
                continue;
            }
            let out = if too_many {
                out.with_error_code(ResponseError::PolicyViolation.code())
            } else if p.offset < -1 {
                out.with_error_code(ResponseError::OffsetOutOfRange.code())
            } else {
                match ctx
                    .handler
                    .delete_records(&t.name, p.partition_index, p.offset)
                    .await
                {
                    Ok(start) => out.with_low_watermark(start),
                    Err(e) => out.with_error_code(crate::handler::error_code(&e).code()),
                }
            };
            partitions.push(out);
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// A DescribeConfigs answer as v0 has it, written by hand (kafka-protocol 0.18 knows
/// 1-4): v1's, with `is_default` (the config's source is the default) where v1 has
/// its source, and no synonyms.
pub(crate) fn describe_configs_v0(r: &DescribeConfigsResponse) -> crate::frame::Body {
    use bytes::BufMut;
    fn string(out: &mut bytes::BytesMut, s: &str) {
        let bytes = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
        out.put_i16(bytes.len() as i16);
        out.put_slice(bytes);
    }
    fn nullable(out: &mut bytes::BytesMut, s: Option<&str>) {
        match s {
            Some(s) => string(out, s),
            None => out.put_i16(-1),
        }
    }
    let mut out = bytes::BytesMut::new();
    out.put_i32(r.throttle_time_ms);
    out.put_i32(r.results.len() as i32);
    for result in &r.results {
        out.put_i16(result.error_code);
        nullable(&mut out, result.error_message.as_deref());
        out.put_i8(result.resource_type);
        string(&mut out, &result.resource_name);
        out.put_i32(result.configs.len() as i32);
        for c in &result.configs {
            string(&mut out, &c.name);
            nullable(&mut out, c.value.as_deref());
            out.put_u8(u8::from(c.read_only));
            out.put_u8(u8::from(c.config_source == SOURCE_DEFAULT));
            out.put_u8(u8::from(c.is_sensitive));
        }
    }
    crate::frame::Body {
        version: 0,
        bytes: out.freeze(),
    }
}
