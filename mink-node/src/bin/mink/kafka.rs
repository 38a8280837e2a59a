//! `mink kafka`: consumer groups and their lag, as `kafka-consumer-groups` shows them.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Field, Schema};
use clap::Subcommand;
use mink_flight::MinkClient;
use mink_flight::actions::{KafkaGroup, KafkaGroups};

use crate::output::{OutputFormat, print_batches};
use crate::{CliResult, call, err};

#[derive(Debug, Subcommand)]
pub enum KafkaCommand {
    /// Every consumer group: state, members, partitions with commits, total lag.
    /// Example: mink kafka groups
    Groups {
        #[arg(long, value_enum, default_value = "table")]
        format: OutputFormat,
    },
    /// A group's committed offset, the log end and the lag of each partition, with
    /// the member it is assigned to. Example: mink kafka lag orders-app
    Lag {
        group: String,
        #[arg(long, value_enum, default_value = "table")]
        format: OutputFormat,
    },
}

pub async fn kafka(client: &MinkClient, command: KafkaCommand) -> CliResult<()> {
    let groups = call(client, KafkaGroups { forwarded: false }).await?;
    match command {
        KafkaCommand::Groups { format } => show(groups_batch(&groups)?, format),
        KafkaCommand::Lag { group, format } => {
            let found = groups
                .iter()
                .find(|g| g.group_id == group)
                .ok_or_else(|| format!("consumer group {group:?} does not exist"))?;
            show(lag_batch(found)?, format)
        }
    }
}

fn show(batch: RecordBatch, format: OutputFormat) -> CliResult<()> {
    print_batches(&batch.schema(), &[batch], format)
}

fn strings(values: Vec<String>) -> ArrayRef {
    Arc::new(StringArray::from(values))
}

fn numbers(values: Vec<Option<i64>>) -> ArrayRef {
    Arc::new(Int64Array::from(values))
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> CliResult<RecordBatch> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .map_err(err)
}

/// The total lag of a group, `None` when a partition's is unknown.
fn total_lag(g: &KafkaGroup) -> Option<i64> {
    g.offsets.iter().map(|o| o.lag).sum()
}

fn groups_batch(groups: &[KafkaGroup]) -> CliResult<RecordBatch> {
    batch(vec![
        (
            "group",
            strings(groups.iter().map(|g| g.group_id.clone()).collect()),
        ),
        (
            "state",
            strings(groups.iter().map(|g| g.state.clone()).collect()),
        ),
        (
            "members",
            numbers(
                groups
                    .iter()
                    .map(|g| Some(g.members.len() as i64))
                    .collect(),
            ),
        ),
        (
            "partitions",
            numbers(
                groups
                    .iter()
                    .map(|g| Some(g.offsets.len() as i64))
                    .collect(),
            ),
        ),
        ("lag", numbers(groups.iter().map(total_lag).collect())),
    ])
}

fn lag_batch(g: &KafkaGroup) -> CliResult<RecordBatch> {
    let owner = |topic: &str, partition: i32| {
        g.members.iter().find(|m| {
            m.assignment
                .iter()
                .any(|a| a.topic == topic && a.partitions.contains(&partition))
        })
    };
    let rows = &g.offsets;
    let of = |f: &dyn Fn(&mink_flight::actions::KafkaGroupMember) -> String| {
        strings(
            rows.iter()
                .map(|o| {
                    owner(&o.topic, o.partition)
                        .map(f)
                        .unwrap_or_else(|| "-".into())
                })
                .collect(),
        )
    };
    batch(vec![
        (
            "topic",
            strings(rows.iter().map(|o| o.topic.clone()).collect()),
        ),
        (
            "partition",
            numbers(rows.iter().map(|o| Some(o.partition.into())).collect()),
        ),
        (
            "current_offset",
            numbers(rows.iter().map(|o| Some(o.committed)).collect()),
        ),
        (
            "log_end_offset",
            numbers(rows.iter().map(|o| o.high_watermark).collect()),
        ),
        ("lag", numbers(rows.iter().map(|o| o.lag).collect())),
        ("consumer_id", of(&|m| m.member_id.clone())),
        ("client_id", of(&|m| m.client_id.clone())),
        ("host", of(&|m| m.client_host.clone())),
    ])
}
