//! `mink cluster`, `mink node` and `mink lake`: what the cluster and its lake are doing.

use clap::Subcommand;
use mink_flight::MinkClient;
use mink_flight::actions::{
    BucketMove, DescribeCluster, GetTable, HealthCheck, LakeSnapshot, ListPartitions, NodeStats,
    Rebalance, TableRef,
};
use mink_types::TableBucket;

use crate::{CliResult, call, path};

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Nodes, their addresses and the lease. Example: mink cluster describe
    Describe,
    /// Whether the node at --addr serves. Example: mink cluster health
    Health,
    /// Even out bucket leadership (on the lease holder), or move named buckets.
    /// Example: mink cluster rebalance --move 3:0=n2 (table 3, bucket 0, to node n2)
    Rebalance {
        /// A bucket to move: TABLE_ID:BUCKET=NODE, or TABLE_ID:PARTITION_ID:BUCKET=NODE.
        #[arg(long = "move")]
        moves: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// The node's counters, with its object-store requests by operation and purpose
    /// (docs/operations.md). Example: mink node stats
    Stats,
}

#[derive(Debug, Subcommand)]
pub enum LakeCommand {
    /// The newest lake snapshot (id, files, rows, bytes, metadata location) and, per
    /// bucket, the lake's offset, the log's high watermark and the lag in rows.
    /// Example: mink lake status demo.events
    Status { table: String },
}

fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// `TABLE_ID:BUCKET=NODE` or `TABLE_ID:PARTITION_ID:BUCKET=NODE`.
fn parse_move(text: &str) -> CliResult<BucketMove> {
    let bad = || {
        format!("move {text:?}: expected TABLE_ID:BUCKET=NODE or TABLE_ID:PARTITION_ID:BUCKET=NODE")
    };
    let (bucket, to) = text.split_once('=').ok_or_else(bad)?;
    let numbers: Vec<&str> = bucket.split(':').collect();
    let n = |s: &str| s.parse::<i64>().map_err(|_| bad());
    let bucket = match numbers.as_slice() {
        [table, bucket] => TableBucket::new(n(table)?, None, n(bucket)? as u32),
        [table, partition, bucket] => {
            TableBucket::new(n(table)?, Some(n(partition)?), n(bucket)? as u32)
        }
        _ => return Err(bad()),
    };
    if to.is_empty() {
        return Err(bad());
    }
    Ok(BucketMove {
        bucket,
        to: to.to_string(),
    })
}

pub async fn cluster(client: &MinkClient, command: ClusterCommand) -> CliResult<()> {
    match command {
        ClusterCommand::Describe => {
            print_json(&call(client, DescribeCluster(Default::default())).await?)
        }
        ClusterCommand::Health => print_json(&call(client, HealthCheck(Default::default())).await?),
        ClusterCommand::Rebalance { moves } => {
            let moves = if moves.is_empty() {
                None
            } else {
                Some(
                    moves
                        .iter()
                        .map(|m| parse_move(m))
                        .collect::<CliResult<_>>()?,
                )
            };
            let request = Rebalance {
                forwarded: false,
                moves,
            };
            print_json(&call(client, request).await?)
        }
    }
    Ok(())
}

pub async fn node(client: &MinkClient, command: NodeCommand) -> CliResult<()> {
    match command {
        NodeCommand::Stats => print_json(&call(client, NodeStats(Default::default())).await?),
    }
    Ok(())
}

pub async fn lake(client: &MinkClient, command: LakeCommand) -> CliResult<()> {
    let LakeCommand::Status { table } = command;
    let table = path(&table)?;
    let at = || TableRef {
        path: table.clone(),
    };
    let snapshot = match call(client, LakeSnapshot(at())).await {
        Ok(s) => s,
        Err(e) if e.starts_with("not found") => serde_json::json!({"snapshot": null, "why": e}),
        Err(e) => return Err(e),
    };
    let info = call(client, GetTable(at())).await?;
    let partitioned = info["descriptor"]["partition_keys"]
        .as_array()
        .is_some_and(|k| !k.is_empty());
    let partitions: Vec<Option<String>> = if partitioned {
        call(client, ListPartitions(at()))
            .await?
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str().map(|n| Some(n.to_string())))
            .collect()
    } else {
        vec![None]
    };
    let mut buckets = Vec::new();
    for partition in partitions {
        let latest = call(
            client,
            mink_flight::actions::ListOffsets {
                forwarded: false,
                path: table.clone(),
                spec: "latest".into(),
                timestamp: None,
                partition: partition.clone(),
                buckets: None,
            },
        )
        .await?;
        for l in latest {
            let lake = snapshot["offsets"][l.bucket.stream_name()].as_i64();
            buckets.push(serde_json::json!({
                "partition": partition,
                "bucket": l.bucket.bucket,
                "lake_offset": lake,
                "high_watermark": l.offset,
                "lag_rows": l.offset.map(|h| h - lake.unwrap_or(0)),
            }));
        }
    }
    print_json(&serde_json::json!({"snapshot": snapshot, "buckets": buckets}));
    Ok(())
}
