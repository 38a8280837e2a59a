//! Actions: catalog (databases, tables, partitions) and cluster (metadata,
//! describe_cluster, health, rebalance) actions, writers and offsets (init_writer,
//! list_offsets, producer offsets) and the catalog lookups Flight's discovery uses.

use super::lookups::{LookupBody, PrefixLookupBody};
use super::*;

/// Writer ids handed to this node at a time.
const WRITER_ID_BLOCK: u64 = 1_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameBody {
    name: String,
    #[serde(default)]
    cascade: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathBody {
    path: TablePath,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DatabaseBody {
    database: String,
}

/// How long registered producer offsets live without a new registration.
const PRODUCER_OFFSETS_TTL_MS: i64 = 7 * 24 * 3600 * 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterTableBody {
    path: TablePath,
    #[serde(default)]
    add_columns: Vec<mink_types::Column>,
    #[serde(default)]
    set_properties: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProducerOffsetsBody {
    producer_id: String,
    offsets: Vec<ProducerOffset>,
    #[serde(default)]
    ttl_ms: Option<i64>,
}

/// One bucket's offset of a producer, as clients name the bucket: table path,
/// partition name (partitioned tables only) and bucket number.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProducerOffset {
    path: TablePath,
    #[serde(default)]
    partition: Option<String>,
    bucket: u32,
    offset: i64,
}

/// Offsets in one `register_producer_offsets`, at most.
const PRODUCER_OFFSETS_MAX: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProducerIdBody {
    producer_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RebalanceBody {
    /// Set by a node forwarding the request to the lease holder: not forwarded again.
    #[serde(default)]
    forwarded: bool,
    /// Explicit moves instead of evening out: each bucket to the named live node.
    #[serde(default)]
    moves: Option<Vec<BucketMove>>,
}

/// One bucket to move in `rebalance` (an operator's reassignment).
#[derive(Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct BucketMove {
    bucket: TableBucket,
    to: String,
}

/// Moves named in one `rebalance`, at most.
const BUCKET_MOVES_MAX: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketBody {
    bucket: TableBucket,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartitionBody {
    path: TablePath,
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListOffsetsBody {
    path: TablePath,
    /// `earliest`, `latest` or `timestamp`.
    spec: String,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(default)]
    buckets: Option<Vec<u32>>,
    /// The partition, by name (partitioned tables only, and then required).
    #[serde(default)]
    partition: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTableBody {
    path: TablePath,
    descriptor: TableDescriptor,
    #[serde(default)]
    ignore_if_exists: bool,
}

impl NodeService {
    pub(crate) async fn action(&self, name: &str, body: &[u8]) -> Result<Vec<u8>> {
        let body: &[u8] = if body.is_empty() { b"{}" } else { body };
        match name {
            "create_database" => {
                let b: NameBody = parse_json("create_database body", body)?;
                let index = self.meta.create_database(&b.name).await?;
                json(&serde_json::json!({"index": index}))
            }
            "drop_database" => {
                let b: NameBody = parse_json("drop_database body", body)?;
                let index = self.meta.drop_database(&b.name, b.cascade).await?;
                json(&serde_json::json!({"index": index}))
            }
            "list_databases" => json(
                &self
                    .meta
                    .read(|s| s.databases.keys().cloned().collect::<Vec<_>>()),
            ),
            "database_exists" => {
                let b: NameBody = parse_json("database_exists body", body)?;
                json(
                    &serde_json::json!({"exists": self.meta.read(|s| s.databases.contains_key(&b.name))}),
                )
            }
            "create_table" => {
                let b: CreateTableBody = parse_json("create_table body", body)?;
                match self.meta.create_table(&b.path, b.descriptor).await {
                    Ok((table, index)) => {
                        self.meta.assign_now().await;
                        json(&serde_json::json!({"table_id": table.id, "index": index}))
                    }
                    Err(MinkError::AlreadyExists(_)) if b.ignore_if_exists => {
                        let table = self.table(&b.path).await?;
                        json(
                            &serde_json::json!({"table_id": table.id, "index": self.meta.applied_index()}),
                        )
                    }
                    Err(e) => Err(e),
                }
            }
            "drop_table" => {
                let b: PathBody = parse_json("drop_table body", body)?;
                let dropped = self.table(&b.path).await.map(|t| t.id);
                let index = self
                    .meta
                    .propose(mink_meta::MetaCommand::DropTable {
                        path: b.path.clone(),
                    })
                    .await?;
                // The table's lake data goes with it (best effort: a later table of the
                // same name purges what is left before its first round).
                let lake = self.lake_table(&b.path);
                tokio::spawn(async move {
                    let Ok(id) = dropped else { return };
                    if let Err(e) = lake.purge(id).await {
                        tracing::warn!(table = %b.path, "the dropped table's lake data stays: {e}");
                    }
                });
                json(&serde_json::json!({"index": index}))
            }
            "list_tables" => {
                let b: DatabaseBody = parse_json("list_tables body", body)?;
                if !self.meta.read(|s| s.databases.contains_key(&b.database)) {
                    return Err(MinkError::NotFound(format!("database {}", b.database)));
                }
                let prefix = format!("{}.", b.database);
                json(&self.meta.read(|s| {
                    s.table_ids
                        .keys()
                        .filter_map(|p| p.strip_prefix(&prefix).map(str::to_string))
                        .collect::<Vec<_>>()
                }))
            }
            "table_exists" => {
                let b: PathBody = parse_json("table_exists body", body)?;
                json(&serde_json::json!({"exists": self.meta.read(|s| s.table(&b.path).is_some())}))
            }
            "get_table" => {
                let b: PathBody = parse_json("get_table body", body)?;
                json(&self.table(&b.path).await?)
            }
            "metadata" => {
                let b: PathBody = parse_json("metadata body", body)?;
                json(&self.metadata_json(&b.path).await?)
            }
            "describe_cluster" => {
                let (nodes, lease) = self.meta.read(|s| (s.nodes.clone(), s.lease.clone()));
                json(&serde_json::json!({"nodes": nodes, "lease": lease}))
            }
            "health" => {
                let problem = self.health_problem();
                json(&serde_json::json!({
                    "status": if problem.is_some() { "unavailable" } else { "serving" },
                    "problem": problem,
                    "node_id": self.meta.node_id(),
                    "applied_index": self.meta.applied_index(),
                }))
            }
            "get_config" => json(&self.config.redacted()),
            "rebalance" => {
                let b: RebalanceBody = parse_json("rebalance body", body)?;
                let (_, holder) = self.meta.lease();
                let holder_addr = holder
                    .as_deref()
                    .filter(|h| *h != self.meta.node_id() && !b.forwarded)
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
                match holder_addr {
                    // The holder runs it (spec/protocols.txt); its answer is ours. Sent
                    // marked, so that a holder whose view has moved on answers
                    // Unavailable instead of forwarding it again.
                    Some(addr) => {
                        let answer = self
                            .forwarder
                            .action(
                                &addr,
                                "rebalance",
                                &serde_json::json!({"forwarded": true, "moves": b.moves}),
                            )
                            .await?;
                        json(&answer)
                    }
                    None => {
                        let moved = match b.moves {
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
                        json(&serde_json::json!({"moved": moved}))
                    }
                }
            }
            "init_writer" => json(&serde_json::json!({"writer_id": self.next_writer_id().await?})),
            "list_offsets" => {
                let b: ListOffsetsBody = parse_json("list_offsets body", body)?;
                let table = self.table(&b.path).await?;
                let spec = match b.spec.as_str() {
                    "earliest" => OffsetSpec::Earliest,
                    "latest" => OffsetSpec::Latest,
                    "timestamp" => OffsetSpec::Timestamp(b.timestamp.ok_or_else(|| {
                        MinkError::invalid("timestamp", "the timestamp spec needs a timestamp (ms)")
                    })?),
                    other => {
                        return Err(MinkError::invalid(
                            "spec",
                            format!("{other:?} is not earliest, latest or timestamp"),
                        ));
                    }
                };
                let partition = match (&b.partition, table.descriptor.is_partitioned()) {
                    (None, false) => None,
                    (Some(name), true) => Some(
                        table
                            .partitions
                            .get(name)
                            .ok_or_else(|| {
                                MinkError::NotFound(format!("partition {name} of {}", b.path))
                            })?
                            .id,
                    ),
                    (None, true) => {
                        return Err(MinkError::invalid(
                            "partition",
                            format!("{} is partitioned: name the partition", b.path),
                        ));
                    }
                    (Some(_), false) => {
                        return Err(MinkError::invalid(
                            "partition",
                            format!("{} is not partitioned", b.path),
                        ));
                    }
                };
                let buckets: Vec<u32> = b
                    .buckets
                    .unwrap_or_else(|| (0..table.descriptor.bucket_count).collect());
                let mut out = Vec::new();
                for bucket in buckets {
                    if bucket >= table.descriptor.bucket_count {
                        return Err(MinkError::invalid(
                            "buckets",
                            format!("{} has no bucket {bucket}", b.path),
                        ));
                    }
                    let tb = TableBucket::new(table.id, partition, bucket);
                    let offset = match self.tablet(tb).await {
                        Ok(tablet) => serde_json::json!(tablet.log().list_offsets(spec).await?),
                        // Another node leads it: ask that node, so any node answers
                        // for the whole table.
                        Err(MinkError::NotLeader {
                            leader: Some(addr), ..
                        }) => {
                            let mut one: serde_json::Value = parse_json("list_offsets body", body)?;
                            one["buckets"] = serde_json::json!([bucket]);
                            let answer = self.forwarder.action(&addr, "list_offsets", &one).await?;
                            answer[0]["offset"].clone()
                        }
                        Err(e) => return Err(e),
                    };
                    out.push(serde_json::json!({"bucket": tb, "offset": offset}));
                }
                json(&out)
            }
            "lookup" => {
                let b: LookupBody = parse_json("lookup body", body)?;
                self.lookup(b).await
            }
            "alter_table" => {
                let b: AlterTableBody = parse_json("alter_table body", body)?;
                let index = self
                    .meta
                    .propose(mink_meta::MetaCommand::AlterTable {
                        path: b.path,
                        add_columns: b.add_columns,
                        set_properties: b.set_properties,
                    })
                    .await?;
                json(&serde_json::json!({"index": index}))
            }
            "register_producer_offsets" => {
                let b: ProducerOffsetsBody = parse_json("register_producer_offsets body", body)?;
                if b.offsets.len() > PRODUCER_OFFSETS_MAX {
                    return Err(MinkError::LimitExceeded {
                        what: "offsets in one register_producer_offsets".into(),
                        limit: PRODUCER_OFFSETS_MAX as u64,
                        actual: b.offsets.len() as u64,
                    });
                }
                let mut offsets = std::collections::BTreeMap::new();
                for (i, o) in b.offsets.iter().enumerate() {
                    let bucket = self.producer_bucket(o).await.map_err(|e| match e {
                        MinkError::InvalidArgument { field, reason } => {
                            MinkError::InvalidArgument {
                                field: format!("offsets[{i}].{field}"),
                                reason,
                            }
                        }
                        other => other,
                    })?;
                    if o.offset < 0 {
                        return Err(MinkError::invalid(
                            format!("offsets[{i}].offset"),
                            "offsets are not negative",
                        ));
                    }
                    if offsets.insert(bucket.stream_name(), o.offset).is_some() {
                        return Err(MinkError::invalid(
                            format!("offsets[{i}]"),
                            format!("{bucket} is named twice"),
                        ));
                    }
                }
                let index = self
                    .meta
                    .propose(mink_meta::MetaCommand::RegisterProducerOffsets {
                        producer_id: b.producer_id,
                        offsets,
                        at_ms: now_ms(),
                        ttl_ms: b.ttl_ms.unwrap_or(PRODUCER_OFFSETS_TTL_MS),
                    })
                    .await?;
                json(&serde_json::json!({"index": index}))
            }
            "get_producer_offsets" => {
                let b: ProducerIdBody = parse_json("get_producer_offsets body", body)?;
                let found = self
                    .meta
                    .read(|s| {
                        let found = s.producer_offsets.get(&b.producer_id)?;
                        // By bucket as clients name it; buckets of tables or partitions
                        // dropped since are left out.
                        let mut offsets: Vec<ProducerOffset> = found
                            .offsets
                            .iter()
                            .filter_map(|(stream, offset)| {
                                let bucket = s.buckets.get(stream)?.bucket;
                                let table = s.tables.get(&bucket.table_id)?;
                                let partition = match bucket.partition_id {
                                    None => None,
                                    Some(id) => Some(
                                        table
                                            .partitions
                                            .values()
                                            .find(|p| p.id == id)?
                                            .name
                                            .clone(),
                                    ),
                                };
                                Some(ProducerOffset {
                                    path: table.path.clone(),
                                    partition,
                                    bucket: bucket.bucket,
                                    offset: *offset,
                                })
                            })
                            .collect();
                        offsets.sort_by(|a, b| {
                            (a.path.to_string(), &a.partition, a.bucket).cmp(&(
                                b.path.to_string(),
                                &b.partition,
                                b.bucket,
                            ))
                        });
                        Some(serde_json::json!({
                            "offsets": offsets,
                            "expires_at_ms": found.expires_at_ms,
                        }))
                    })
                    .ok_or_else(|| {
                        MinkError::NotFound(format!("producer offsets of {}", b.producer_id))
                    })?;
                json(&found)
            }
            "delete_producer_offsets" => {
                let b: ProducerIdBody = parse_json("delete_producer_offsets body", body)?;
                let index = self
                    .meta
                    .propose(mink_meta::MetaCommand::DeleteProducerOffsets {
                        producer_id: b.producer_id,
                    })
                    .await?;
                json(&serde_json::json!({"index": index}))
            }
            "latest_kv_snapshot" => {
                let b: BucketBody = parse_json("latest_kv_snapshot body", body)?;
                let info = self.kv_snapshot(b.bucket).await?;
                json(&serde_json::json!({
                    "log_offset": info.log_offset,
                    "location": info.location,
                    "rows": info.rows,
                    "bytes": info.bytes,
                    "written_at_ms": info.written_at_ms,
                }))
            }
            "lake_snapshot" => {
                let b: PathBody = parse_json("lake_snapshot body", body)?;
                json(&self.lake_snapshot_json(&b.path).await?)
            }
            "node_stats" => json(&serde_json::json!({
                "node_id": self.meta.node_id(),
                "incarnation": self.meta.incarnation(),
                "wal": self.streams().wal_id().to_string(),
                "wal_failure": self.streams().failure().map(|e| e.to_string()),
                "tablets_open": self.tablets.open_count(),
                "applied_index": self.meta.applied_index(),
                "lease": self.meta.lease(),
                "object_store": self.streams().stores().accounting().map(|a| a.report()),
            })),
            "prefix_lookup" => {
                let b: PrefixLookupBody = parse_json("prefix_lookup body", body)?;
                self.prefix_lookup(b).await
            }
            "list_partitions" => {
                let b: PathBody = parse_json("list_partitions body", body)?;
                let table = self.table(&b.path).await?;
                json(&table.partitions.values().collect::<Vec<_>>())
            }
            "create_partition" => {
                let b: PartitionBody = parse_json("create_partition body", body)?;
                let (p, index) = self.meta.create_partition(&b.path, &b.name).await?;
                self.meta.assign_now().await;
                json(&serde_json::json!({"partition_id": p.id, "index": index}))
            }
            "drop_partition" => {
                let b: PartitionBody = parse_json("drop_partition body", body)?;
                let index = self
                    .meta
                    .propose(mink_meta::MetaCommand::DropPartition {
                        path: b.path,
                        name: b.name,
                    })
                    .await?;
                json(&serde_json::json!({"index": index}))
            }
            other => Err(MinkError::Unimplemented(format!(
                "the {other} action is not built yet"
            ))),
        }
    }

    pub(crate) async fn table_schema(&self, path: &TablePath) -> Result<SchemaRef> {
        Ok(self.table(path).await?.descriptor.schema.to_arrow())
    }

    pub(crate) async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>> {
        Ok(self.meta.read(|s| {
            s.tables
                .values()
                .map(|t| (t.path.clone(), t.descriptor.schema.to_arrow()))
                .collect()
        }))
    }

    /// The bucket a producer offset names: the table, its partition by name (required
    /// for, and only for, partitioned tables; it must exist) and a bucket number in
    /// range.
    async fn producer_bucket(&self, o: &ProducerOffset) -> Result<TableBucket> {
        let table = self.table(&o.path).await?;
        let partition = match (&o.partition, table.descriptor.is_partitioned()) {
            (None, false) => None,
            (Some(name), true) => Some(
                table
                    .partitions
                    .get(name)
                    .ok_or_else(|| MinkError::NotFound(format!("partition {name} of {}", o.path)))?
                    .id,
            ),
            (None, true) => {
                return Err(MinkError::invalid(
                    "partition",
                    format!("{} is partitioned: name the partition", o.path),
                ));
            }
            (Some(_), false) => {
                return Err(MinkError::invalid(
                    "partition",
                    format!("{} is not partitioned", o.path),
                ));
            }
        };
        if o.bucket >= table.descriptor.bucket_count {
            return Err(MinkError::invalid(
                "bucket",
                format!("{} has no bucket {}", o.path, o.bucket),
            ));
        }
        Ok(TableBucket::new(table.id, partition, o.bucket))
    }

    /// A writer id from this node's block of the shared allocator (a new block when
    /// it runs out). Kafka producer ids are these too.
    pub(crate) async fn next_writer_id(&self) -> Result<i64> {
        let mut ids = self.writer_ids.lock().await;
        if ids.is_empty() {
            *ids = self.meta.allocate_writer_ids(WRITER_ID_BLOCK).await?;
        }
        let id = ids.start;
        // Writer ids carry a Kafka producer epoch above this (`mink_types::writer`).
        if id > mink_types::WRITER_BASE_MAX {
            return Err(MinkError::LimitExceeded {
                what: "writer ids issued".into(),
                limit: mink_types::WRITER_BASE_MAX as u64,
                actual: id as u64,
            });
        }
        ids.start += 1;
        Ok(id)
    }

    async fn metadata_json(&self, path: &TablePath) -> Result<serde_json::Value> {
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
                .map(|b| {
                    serde_json::json!({
                        "bucket": b.bucket,
                        "partition": b.bucket.partition_id.and_then(|p| partition_names.get(&p)),
                        "leader": b.leader,
                        "leader_address": b.leader.as_ref().and_then(|l| s.nodes.get(l)).map(|n| n.flight_addr.clone()),
                        "epoch": b.epoch,
                    })
                })
                .collect::<Vec<_>>()
        });
        Ok(serde_json::json!({"table": table, "buckets": buckets}))
    }
}
