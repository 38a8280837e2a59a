//! Cluster actions: a table's buckets and leaders (how clients route), the nodes and
//! the lease, this node's configuration, counters and health, and `rebalance`, which
//! the lease holder runs.

use mink_flight::actions::{BucketMetadata, Health, Moved, Rebalance, TableMetadata};

use super::*;

/// Moves named in one `rebalance`, at most.
const BUCKET_MOVES_MAX: usize = 10_000;

impl NodeService {
    /// A table and its buckets with their leaders' addresses.
    pub(crate) async fn metadata(&self, path: &TablePath) -> Result<TableMetadata> {
        let table = self.table(path).await?;
        let partition_names: HashMap<i64, String> = table
            .partitions
            .values()
            .map(|p| (p.id, p.name.clone()))
            .collect();
        let buckets = self.meta.read(|s| {
            s.buckets
                .values()
                .filter(|b| b.bucket.table_id == table.id)
                .map(|b| BucketMetadata {
                    bucket: b.bucket,
                    partition: b
                        .bucket
                        .partition_id
                        .and_then(|p| partition_names.get(&p).cloned()),
                    leader: b.leader.clone(),
                    leader_address: b
                        .leader
                        .as_ref()
                        .and_then(|l| s.nodes.get(l))
                        .map(|n| n.flight_addr.clone()),
                    epoch: b.epoch,
                })
                .collect::<Vec<_>>()
        });
        Ok(TableMetadata {
            table: json_value(&table)?,
            buckets,
        })
    }

    pub(super) fn describe_cluster(&self) -> serde_json::Value {
        let (nodes, lease) = self.meta.read(|s| (s.nodes.clone(), s.lease.clone()));
        serde_json::json!({"nodes": nodes, "lease": lease})
    }

    pub(crate) fn node_stats(&self) -> serde_json::Value {
        serde_json::json!({
            "node_id": self.meta.node_id(),
            "incarnation": self.meta.incarnation(),
            "wal": self.streams().wal_id().to_string(),
            "wal_failure": self.streams().failure().map(|e| e.to_string()),
            "tablets_open": self.tablets.open_count(),
            "applied_index": self.meta.applied_index(),
            "lease": self.meta.lease(),
            "object_store": self.streams().stores().accounting().map(|a| a.report()),
        })
    }

    pub(crate) fn health(&self) -> Health {
        let problem = self.health_problem();
        Health {
            status: if problem.is_some() {
                "unavailable"
            } else {
                "serving"
            }
            .into(),
            problem,
            node_id: self.meta.node_id().to_string(),
            applied_index: self.meta.applied_index(),
        }
    }

    /// Runs on the lease holder (spec/protocols.txt): any other node forwards it there,
    /// marked, so that a holder whose view has moved on answers `Unavailable` instead
    /// of forwarding it again.
    pub(super) async fn rebalance(&self, r: Rebalance) -> Result<Moved> {
        let (_, holder) = self.meta.lease();
        let holder_addr = holder
            .as_deref()
            .filter(|h| *h != self.meta.node_id() && !r.forwarded)
            .map(|h| {
                self.meta
                    .read(|s| s.nodes.get(h).map(|n| n.flight_addr.clone()))
                    .ok_or_else(|| {
                        MinkError::Unavailable(format!(
                            "the lease holder {h} has no address in this node's view"
                        ))
                    })
            })
            .transpose()?;
        if let Some(addr) = holder_addr {
            let forwarded = Rebalance {
                forwarded: true,
                ..r
            };
            return self.forwarder.call(&addr, &forwarded).await;
        }
        let moved = match r.moves {
            None => self.meta.rebalance().await?,
            Some(moves) => {
                if moves.len() > BUCKET_MOVES_MAX {
                    return Err(MinkError::LimitExceeded {
                        what: "moves in one rebalance".into(),
                        limit: BUCKET_MOVES_MAX as u64,
                        actual: moves.len() as u64,
                    });
                }
                let moves = moves
                    .into_iter()
                    .map(|m| (m.bucket.stream_name(), m.to))
                    .collect();
                self.meta.move_buckets(moves).await?
            }
        };
        Ok(Moved {
            moved: moved as u64,
        })
    }
}
