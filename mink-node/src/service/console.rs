//! What the console shows (`crate::console` serves it as JSON under `/api/v1`): the
//! cluster with every node probed, the tables with their rows, one table with its
//! buckets. Built from this node's metadata view plus one `health`/`node_stats` or
//! `bucket_stats` call per other node, each bounded by [`PROBE_TIMEOUT`]: a node that
//! does not answer in time is shown as such, it never holds the page up.

use std::collections::HashMap;

use mink_flight::actions::{BucketStat, BucketStats, Empty, HealthCheck, NodeStats};
use serde_json::{Value, json};

use super::actions::json_value;
use super::*;

/// How long a page waits for another node's answer.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl NodeService {
    /// The nodes, each probed, the lease, and bucket counts.
    pub(crate) async fn cluster_view(&self) -> Value {
        let me = self.meta.node_id().to_string();
        let (nodes, lease, led, tables, buckets, leaderless) = self.meta.read(|s| {
            let mut led: HashMap<String, usize> = HashMap::new();
            for b in s.buckets.values() {
                if let Some(l) = &b.leader {
                    *led.entry(l.clone()).or_default() += 1;
                }
            }
            (
                s.nodes.clone(),
                s.lease.clone(),
                led,
                s.tables.len(),
                s.buckets.len(),
                s.buckets.values().filter(|b| b.leader.is_none()).count(),
            )
        });
        let probes = nodes.iter().map(|(id, info)| {
            let local = *id == me;
            async move {
                if local {
                    let health = self.health();
                    return Ok((json_value(&health)?, self.node_stats()));
                }
                let addr = info.flight_addr.as_str();
                let probe = async {
                    let health = self.forwarder.call(addr, &HealthCheck(Empty {})).await?;
                    let stats = self.forwarder.call(addr, &NodeStats(Empty {})).await?;
                    Ok::<_, MinkError>((json_value(&health)?, stats))
                };
                match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
                    Ok(answer) => answer,
                    Err(_) => Err(MinkError::Unavailable(format!(
                        "no answer within {PROBE_TIMEOUT:?}"
                    ))),
                }
            }
        });
        let probed = futures::future::join_all(probes).await;
        let starting_within =
            std::time::Duration::from_millis(3 * self.config.meta.heartbeat_interval_ms);
        let nodes: Vec<Value> = nodes
            .iter()
            .zip(probed)
            .map(|((id, info), probe)| {
                let (state, problem, stats) = match (&probe, info.alive) {
                    (_, false) => (
                        "down",
                        Some("declared dead by the lease holder".into()),
                        None,
                    ),
                    // Heartbeating but not answering: a node still opening (its
                    // metadata and heartbeat start before its Flight listener).
                    (Err(e), true) if self.meta.heartbeat_fresh(id, starting_within) => (
                        "starting",
                        Some(format!("heartbeating, not serving yet: {e}")),
                        None,
                    ),
                    (Err(e), true) => ("unreachable", Some(e.to_string()), None),
                    (Ok((health, stats)), true) => {
                        let problem = health["problem"].as_str().map(str::to_string);
                        let state = match (&problem, stats["wal_failure"].is_null()) {
                            (_, false) => "replacing_wal",
                            (Some(_), true) => "unavailable",
                            (None, true) => "serving",
                        };
                        (state, problem, Some(stats))
                    }
                };
                json!({
                    "id": id,
                    "flight_addr": info.flight_addr,
                    "kafka_addr": info.kafka_addr,
                    "incarnation": info.incarnation,
                    "alive": info.alive,
                    "state": state,
                    "problem": problem,
                    "this_node": *id == me,
                    "lease_holder": lease.holder.as_deref() == Some(id.as_str()),
                    "buckets_led": led.get(id).copied().unwrap_or(0),
                    "wal": stats.map(|s| s["wal"].clone()),
                    "applied_index": stats.map(|s| s["applied_index"].clone()),
                    "tablets_open": stats.map(|s| s["tablets_open"].clone()),
                })
            })
            .collect();
        json!({
            "node_id": me,
            "applied_index": self.meta.applied_index(),
            "lease": {"term": lease.term, "holder": lease.holder},
            "nodes": nodes,
            "tables": tables,
            "buckets": buckets,
            "buckets_without_leader": leaderless,
        })
    }

    /// Every table with its kind, shape and retained rows: a look that opens
    /// nothing. A bucket whose leader has its tablet open reports its own offsets and
    /// bytes; any other bucket is counted from this node's view of the stream
    /// metadata: its compacted rows and segment bytes (`buckets_from_metadata`), a
    /// lower bound that leaves out what its WAL holds uncompacted. A primary-key
    /// table's bytes include each bucket's newest KV snapshot (`kv_snapshot_bytes`;
    /// the older one kept beside it is not counted).
    pub(crate) async fn tables_view(&self) -> Value {
        let (tables, buckets, snapshot_bytes) = self.meta.read(|s| {
            let mut snapshot_bytes: HashMap<i64, u64> = HashMap::new();
            for b in s.buckets.values() {
                if let Some(bytes) = s
                    .kv_snapshots
                    .get(&b.bucket.stream_name())
                    .and_then(|p| p.bytes)
                {
                    *snapshot_bytes.entry(b.bucket.table_id).or_default() += bytes;
                }
            }
            (
                s.tables.values().cloned().collect::<Vec<TableInfo>>(),
                s.buckets
                    .values()
                    .map(|b| b.bucket)
                    .collect::<Vec<TableBucket>>(),
                snapshot_bytes,
            )
        });
        let stats = self.stats_from_leaders(None, false).await;
        // rows, buckets reporting, bytes, buckets counted from the stream metadata
        let mut rows: HashMap<i64, (i64, usize, u64, usize)> = HashMap::new();
        for s in stats.values() {
            let r = rows.entry(s.bucket.table_id).or_default();
            r.0 += s.high_watermark - s.log_start;
            r.1 += 1;
            r.2 += s.stored_bytes.unwrap_or(0);
        }
        let unreported: Vec<TableBucket> = buckets
            .into_iter()
            .filter(|b| !stats.contains_key(b))
            .collect();
        let compacted = self.streams().metadata().read(|s, _| {
            unreported
                .iter()
                .filter_map(|b| {
                    let m = s.streams.get(&b.stream_name())?;
                    let bytes: u64 = m.segments.iter().map(|seg| seg.bytes).sum();
                    Some((*b, m.committed_end.saturating_sub(m.start_offset), bytes))
                })
                .collect::<Vec<_>>()
        });
        for (bucket, n, bytes) in compacted {
            let r = rows.entry(bucket.table_id).or_default();
            r.0 += n as i64;
            r.2 += bytes;
            r.3 += 1;
        }
        let mut out: Vec<Value> = tables
            .iter()
            .map(|t| {
                let (rows, reporting, log_bytes, from_metadata) =
                    rows.get(&t.id).copied().unwrap_or_default();
                let kv_snapshot_bytes = snapshot_bytes.get(&t.id).copied().unwrap_or(0);
                json!({
                    "database": t.path.database.as_str(),
                    "table": t.path.table.as_str(),
                    "id": t.id,
                    "kind": kind(t),
                    "bucket_count": t.descriptor.bucket_count,
                    "partitions": t.partitions.len(),
                    "partitioned": t.descriptor.is_partitioned(),
                    "schema_id": t.descriptor.schema.schema_id,
                    "columns": t.descriptor.schema.columns.len(),
                    "rows": rows,
                    "bytes": log_bytes + kv_snapshot_bytes,
                    "log_bytes": log_bytes,
                    "kv_snapshot_bytes": kv_snapshot_bytes,
                    "buckets_reporting": reporting,
                    "buckets_from_metadata": from_metadata,
                    "created_at_ms": t.created_at_ms,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (a["database"].as_str(), a["table"].as_str())
                .cmp(&(b["database"].as_str(), b["table"].as_str()))
        });
        json!({ "tables": out })
    }

    /// One table: its definition, schema versions, partitions, and per bucket the
    /// leader and epoch, log start and high watermark (from the leader), lake offset
    /// and lag, and the KV snapshot's offset.
    pub(crate) async fn table_view(&self, path: &TablePath) -> Result<Value> {
        let table = self.table(path).await?;
        let stats = self.stats_from_leaders(Some(path), true).await;
        let partition_names: HashMap<i64, String> = table
            .partitions
            .values()
            .map(|p| (p.id, p.name.clone()))
            .collect();
        let (buckets, lake) = self.meta.read(|s| {
            let lake = s.lake_snapshots.get(&table.id).cloned();
            let mut buckets: Vec<_> = s
                .buckets
                .values()
                .filter(|b| b.bucket.table_id == table.id)
                .map(|b| {
                    let stream = b.bucket.stream_name();
                    (
                        b.clone(),
                        b.leader
                            .as_ref()
                            .and_then(|l| s.nodes.get(l))
                            .map(|n| n.flight_addr.clone()),
                        s.kv_snapshots.get(&stream).cloned(),
                        lake.as_ref()
                            .and_then(|l| l.log_offsets.get(&stream).copied()),
                    )
                })
                .collect();
            buckets.sort_by_key(|(b, ..)| (b.bucket.partition_id, b.bucket.bucket));
            (buckets, lake)
        });
        let buckets: Vec<Value> = buckets
            .into_iter()
            .map(|(b, address, kv, lake_offset)| {
                let stat = stats.get(&b.bucket);
                let hw = stat.map(|s| s.high_watermark);
                let log_bytes = stat.and_then(|s| s.stored_bytes);
                let snapshot_bytes = kv.as_ref().and_then(|kv| kv.bytes);
                json!({
                    "bucket": b.bucket.bucket,
                    "partition_id": b.bucket.partition_id,
                    "partition": b.bucket.partition_id.and_then(|p| partition_names.get(&p)),
                    "stream": b.bucket.stream_name(),
                    "leader": b.leader,
                    "leader_address": address,
                    "leader_epoch": b.epoch,
                    "log_start": stat.map(|s| s.log_start),
                    "high_watermark": hw,
                    "rows": stat.map(|s| s.high_watermark - s.log_start),
                    "bytes": log_bytes.map(|b| b + snapshot_bytes.unwrap_or(0)),
                    "log_bytes": log_bytes,
                    "lake_offset": lake_offset,
                    "lake_lag": hw.map(|hw| (hw - lake_offset.unwrap_or(0)).max(0))
                        .filter(|_| lake.is_some()),
                    "kv_snapshot": kv.map(|kv| json!({
                        "snapshot_id": kv.snapshot_id,
                        "log_offset": kv.log_offset,
                        "changes_since": hw.map(|hw| (hw - kv.log_offset).max(0)),
                        "age_ms": kv.written_at_ms.map(|at| (now_ms() - at).max(0)),
                        "bytes": kv.bytes,
                    })),
                })
            })
            .collect();
        Ok(json!({
            "database": table.path.database.as_str(),
            "table": table.path.table.as_str(),
            "id": table.id,
            "kind": kind(&table),
            "descriptor": json_value(&table.descriptor)?,
            "schemas": json_value(&table.schemas)?,
            "partitions": table.partitions.values().map(|p| json!({"id": p.id, "name": p.name})).collect::<Vec<_>>(),
            "created_at_ms": table.created_at_ms,
            "lake": lake.map(|l| json!({
                "snapshot_id": l.snapshot_id,
                "timestamp_ms": l.timestamp_ms,
                "age_ms": (now_ms() - l.timestamp_ms).max(0),
            })),
            "buckets": buckets,
        }))
    }

    /// `bucket_stats` from every live node (this one directly), merged; a node that
    /// does not answer within [`PROBE_TIMEOUT`] leaves its buckets out.
    async fn stats_from_leaders(
        &self,
        path: Option<&TablePath>,
        open: bool,
    ) -> HashMap<TableBucket, BucketStat> {
        let me = self.meta.node_id().to_string();
        let nodes: Vec<(String, String)> = self.meta.read(|s| {
            s.nodes
                .iter()
                .filter(|(_, n)| n.alive)
                .map(|(id, n)| (id.clone(), n.flight_addr.clone()))
                .collect()
        });
        let request = BucketStats {
            path: path.cloned(),
            open,
        };
        let asks = nodes.iter().map(|(id, addr)| {
            let request = request.clone();
            let local = *id == me;
            async move {
                let answer = if local {
                    tokio::time::timeout(PROBE_TIMEOUT, self.bucket_stats(request)).await
                } else {
                    tokio::time::timeout(PROBE_TIMEOUT, self.forwarder.call(addr, &request)).await
                };
                match answer {
                    Ok(Ok(stats)) => stats,
                    Ok(Err(e)) => {
                        tracing::debug!(node = %id, "bucket_stats: {e}");
                        Vec::new()
                    }
                    Err(_) => Vec::new(),
                }
            }
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .map(|s| (s.bucket, s))
            .collect()
    }
}

fn kind(table: &TableInfo) -> &'static str {
    if table.descriptor.primary_key.is_empty() {
        "log"
    } else {
        "primary_key"
    }
}

/// A bucket of a table, with its partition's name and its offsets when the leader
/// answered.
pub(crate) struct BucketOffsets {
    pub bucket: TableBucket,
    pub partition: Option<String>,
    pub stat: Option<BucketStat>,
}

impl NodeService {
    /// The table and each of its buckets' offsets, from their leaders.
    pub(crate) async fn bucket_offsets(
        &self,
        path: &TablePath,
    ) -> Result<(TableInfo, Vec<BucketOffsets>)> {
        let table = self.table(path).await?;
        let mut stats = self.stats_from_leaders(Some(path), true).await;
        let names: HashMap<i64, String> = table
            .partitions
            .values()
            .map(|p| (p.id, p.name.clone()))
            .collect();
        let mut buckets: Vec<TableBucket> = self.meta.read(|s| {
            s.buckets
                .values()
                .filter(|b| b.bucket.table_id == table.id)
                .map(|b| b.bucket)
                .collect()
        });
        buckets.sort_by_key(|b| (b.partition_id, b.bucket));
        let out = buckets
            .into_iter()
            .map(|bucket| BucketOffsets {
                bucket,
                partition: bucket.partition_id.and_then(|p| names.get(&p).cloned()),
                stat: stats.remove(&bucket),
            })
            .collect();
        Ok((table, out))
    }

    /// The database Kafka topics live in (`kafka.database`).
    pub(crate) fn kafka_database_name(&self) -> &str {
        &self.config.kafka.database
    }

    /// This node's advertised Flight address (what the console's client dials).
    pub(crate) fn own_flight_addr(&self) -> Option<String> {
        let me = self.meta.node_id().to_string();
        self.meta
            .read(|s| s.nodes.get(&me).map(|n| n.flight_addr.clone()))
    }
}
