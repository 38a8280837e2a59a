//! The node service both listeners front: catalog actions through the metadata log,
//! the tablet manager, the write path for log tables, and reads.
//!
//! Built so far: catalog and cluster actions; `Append` (a bucket, on its leader) and
//! `AppendTable` (routed by this node) for unpartitioned log tables; `Scan`. Anything
//! else answers `Unimplemented` naming what is missing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use arrow::array::{RecordBatch, new_null_array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use mink_flight::MinkService;
use mink_flight::protocol::{
    BucketWritten, ReadTicket, ScanBatch, WriteBatch, WriteDescriptor, WriteResult, parse_json,
};
use mink_flight::server::ReadBatch;
use mink_log::{AppendRequest, LogTablet, NO_WRITER};
use mink_meta::{MetaNode, TableInfo};
use mink_types::{MinkError, Result, TableBucket, TableDescriptor, TablePath, split_by_bucket};
use mink_wal::StreamStore;
use serde::Deserialize;

use crate::MinkConfig;

/// The node's service.
pub struct NodeService {
    config: MinkConfig,
    meta: MetaNode,
    streams: StreamStore,
    tablets: tokio::sync::Mutex<HashMap<TableBucket, (u64, LogTablet)>>,
    round_robin: Mutex<HashMap<i64, u32>>,
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| MinkError::Internal(e.to_string()))
}

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTableBody {
    path: TablePath,
    descriptor: TableDescriptor,
    #[serde(default)]
    ignore_if_exists: bool,
}

impl NodeService {
    pub fn new(config: MinkConfig, meta: MetaNode, streams: StreamStore) -> Self {
        Self {
            config,
            meta,
            streams,
            tablets: tokio::sync::Mutex::new(HashMap::new()),
            round_robin: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self, path: &TablePath) -> Result<TableInfo> {
        self.meta
            .read(|s| s.table(path).cloned())
            .ok_or_else(|| MinkError::NotFound(format!("table {path}")))
    }

    fn table_by_id(&self, id: i64) -> Result<TableInfo> {
        self.meta
            .read(|s| s.tables.get(&id).cloned())
            .ok_or_else(|| MinkError::NotFound(format!("table id {id}")))
    }

    /// The log tablet of `bucket`, opened under the bucket's current epoch when this
    /// node leads it.
    async fn tablet(&self, bucket: TableBucket) -> Result<LogTablet> {
        let (state, leader_addr) = self.meta.read(|s| {
            let b = s.buckets.get(&bucket.stream_name()).cloned();
            let addr = b
                .as_ref()
                .and_then(|b| b.leader.as_ref())
                .and_then(|l| s.nodes.get(l))
                .map(|n| n.flight_addr.clone());
            (b, addr)
        });
        let state = state.ok_or_else(|| MinkError::NotFound(format!("{bucket}")))?;
        match state.leader.as_deref() {
            Some(l) if l == self.meta.node_id() => {}
            Some(_) => {
                return Err(MinkError::NotLeader {
                    bucket,
                    leader: leader_addr,
                });
            }
            None => {
                return Err(MinkError::Unavailable(format!(
                    "{bucket} has no leader yet"
                )));
            }
        }
        let mut tablets = self.tablets.lock().await;
        if let Some((epoch, tablet)) = tablets.get(&bucket)
            && *epoch == state.epoch
            && tablet.failure().is_none()
        {
            return Ok(tablet.clone());
        }
        let table = self.table_by_id(bucket.table_id)?;
        if table.descriptor.has_primary_key() {
            return Err(MinkError::Unimplemented(format!(
                "writes to primary-key table {} over Flight are not wired to KV tablets yet",
                table.path
            )));
        }
        let stream = self
            .streams
            .open_stream(&bucket.stream_name(), state.epoch)
            .await
            .map_err(|e| mink_log::wal_error(bucket, e))?;
        let tablet = LogTablet::open(
            bucket,
            stream,
            false,
            table.schemas.clone(),
            self.config.log.clone(),
        )
        .await?;
        tablets.insert(bucket, (state.epoch, tablet.clone()));
        Ok(tablet)
    }

    async fn append(
        &self,
        bucket: TableBucket,
        schema_id: i32,
        writer: Option<i64>,
        batch: RecordBatch,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        let tablet = self.tablet(bucket).await?;
        let writer_id = writer.unwrap_or(NO_WRITER);
        let sequence = match (writer, meta.batch_sequence) {
            (Some(_), Some(s)) => s,
            (Some(_), None) => {
                return Err(MinkError::invalid(
                    "batch_sequence",
                    "a write with a writer_id needs a batch_sequence",
                ));
            }
            (None, s) => s.unwrap_or(0),
        };
        let appended = tablet
            .append(AppendRequest {
                writer_id,
                first_sequence: sequence,
                last_sequence: sequence,
                schema_id,
                change_types: None,
                batch,
            })
            .await?;
        Ok(BucketWritten {
            bucket,
            first_offset: appended.first_offset,
            last_offset: appended.last_offset,
            duplicated: appended.duplicated,
        })
    }

    async fn append_table(
        &self,
        path: &TablePath,
        schema_id: i32,
        batch: RecordBatch,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let table = self.table(path)?;
        let d = &table.descriptor;
        if d.has_primary_key() {
            return Err(MinkError::invalid(
                "descriptor",
                format!("{path} has a primary key: write it with PutTable"),
            ));
        }
        if d.is_partitioned() {
            return Err(MinkError::Unimplemented(format!(
                "AppendTable to partitioned table {path} (partition routing is not built yet)"
            )));
        }
        if schema_id != d.schema.schema_id {
            return Err(MinkError::SchemaMismatch(format!(
                "{path} is at schema {}, the batch claims {schema_id}",
                d.schema.schema_id
            )));
        }
        d.schema.check_batch(&batch)?;
        let keys = d.bucket_keys();
        let mut results = Vec::new();
        if keys.is_empty() {
            let bucket = {
                let mut rr = self.round_robin.lock().unwrap_or_else(|e| e.into_inner());
                let next = rr.entry(table.id).or_insert(0);
                let b = *next % d.bucket_count;
                *next = next.wrapping_add(1);
                b
            };
            results.push(
                self.append(
                    TableBucket::new(table.id, None, bucket),
                    schema_id,
                    None,
                    batch,
                    meta,
                )
                .await?,
            );
        } else {
            let indices: Vec<usize> = keys
                .iter()
                .map(|k| {
                    d.schema
                        .index_of(k)
                        .ok_or_else(|| MinkError::Internal(format!("bucket key {k} missing")))
                })
                .collect::<Result<_>>()?;
            for part in split_by_bucket(&batch, &indices, d.bucketing, d.bucket_count)? {
                let rows = take_record_batch(&batch, &part.rows)?;
                results.push(
                    self.append(
                        TableBucket::new(table.id, None, part.bucket),
                        schema_id,
                        None,
                        rows,
                        meta,
                    )
                    .await?,
                );
            }
        }
        Ok(WriteResult::Routed { buckets: results })
    }

    fn metadata_json(&self, path: &TablePath) -> Result<serde_json::Value> {
        let table = self.table(path)?;
        let buckets = self.meta.read(|s| {
            s.buckets_of(table.id, None)
                .into_iter()
                .map(|b| {
                    serde_json::json!({
                        "bucket": b.bucket,
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

/// Columns of `batch` arranged as `schema` (by name; columns it lacks are null).
fn as_schema(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.schema().index_of(f.name()) {
            Ok(i) => batch.column(i).clone(),
            Err(_) => new_null_array(f.data_type(), batch.num_rows()),
        })
        .collect();
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

#[async_trait]
impl MinkService for NodeService {
    fn applied_index(&self) -> u64 {
        self.meta.applied_index()
    }

    async fn wait_applied(&self, index: u64) -> Result<()> {
        self.meta
            .wait_for(
                index,
                Duration::from_millis(self.config.meta.applied_index_wait_max_ms),
            )
            .await
            .map(|_| ())
    }

    async fn action(&self, name: &str, body: &[u8]) -> Result<Vec<u8>> {
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
                        let table = self.table(&b.path)?;
                        json(
                            &serde_json::json!({"table_id": table.id, "index": self.meta.applied_index()}),
                        )
                    }
                    Err(e) => Err(e),
                }
            }
            "drop_table" => {
                let b: PathBody = parse_json("drop_table body", body)?;
                let index = self
                    .meta
                    .propose(mink_meta::MetaCommand::DropTable { path: b.path })
                    .await?;
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
                json(&self.table(&b.path)?)
            }
            "metadata" => {
                let b: PathBody = parse_json("metadata body", body)?;
                json(&self.metadata_json(&b.path)?)
            }
            "describe_cluster" => {
                let (nodes, lease) = self.meta.read(|s| (s.nodes.clone(), s.lease.clone()));
                json(&serde_json::json!({"nodes": nodes, "lease": lease}))
            }
            "health" => json(&serde_json::json!({
                "status": "serving",
                "node_id": self.meta.node_id(),
                "applied_index": self.meta.applied_index(),
            })),
            "get_config" => json(&self.config),
            "rebalance" => {
                let moved = self.meta.rebalance().await?;
                json(&serde_json::json!({"moved": moved}))
            }
            other => Err(MinkError::Unimplemented(format!(
                "the {other} action is not built yet"
            ))),
        }
    }

    async fn write(
        &self,
        descriptor: &WriteDescriptor,
        batch: RecordBatch,
        meta: WriteBatch,
    ) -> Result<WriteResult> {
        match descriptor {
            WriteDescriptor::Append {
                bucket,
                schema_id,
                writer_id,
            } => {
                let table = self.table_by_id(bucket.table_id)?;
                if table.descriptor.has_primary_key() {
                    return Err(MinkError::invalid(
                        "descriptor",
                        format!("{} has a primary key: use Put", table.path),
                    ));
                }
                let w = self
                    .append(*bucket, *schema_id, *writer_id, batch, &meta)
                    .await?;
                Ok(WriteResult::Written {
                    first_offset: w.first_offset,
                    last_offset: w.last_offset,
                    duplicated: w.duplicated,
                })
            }
            WriteDescriptor::AppendTable { path, schema_id } => {
                self.append_table(path, *schema_id, batch, &meta).await
            }
            WriteDescriptor::Put { .. } | WriteDescriptor::PutTable { .. } => {
                Err(MinkError::Unimplemented(
                    "Put and PutTable (primary-key tables over Flight) are not built yet".into(),
                ))
            }
        }
    }

    async fn read(&self, ticket: ReadTicket) -> Result<(SchemaRef, Vec<ReadBatch>)> {
        match ticket {
            ReadTicket::Scan {
                bucket,
                offset,
                max_bytes,
            } => {
                let table = self.table_by_id(bucket.table_id)?;
                let schema = table.descriptor.schema.to_arrow();
                let tablet = self.tablet(bucket).await?;
                let max = max_bytes.unwrap_or(self.config.log.scan_bytes_max) as usize;
                let scan = tablet.scan(offset, max).await?;
                let batches = scan
                    .batches
                    .into_iter()
                    .map(|b| {
                        let meta = ScanBatch {
                            bucket,
                            base_offset: b.header.base_offset,
                            high_watermark: scan.high_watermark,
                            change_types: (!b.header.change_types.is_empty())
                                .then(|| b.header.change_types.clone()),
                        };
                        Ok((as_schema(b.batch, &schema)?, meta))
                    })
                    .collect::<Result<_>>()?;
                Ok((schema, batches))
            }
            ReadTicket::LimitScan { .. } => Err(MinkError::Unimplemented(
                "the LimitScan ticket is not built yet".into(),
            )),
            ReadTicket::Snapshot { .. } => Err(MinkError::Unimplemented(
                "the Snapshot ticket is not built yet".into(),
            )),
            ReadTicket::Union { .. } | ReadTicket::Lake { .. } => Err(MinkError::Unimplemented(
                "lake tiering does not exist yet, so Union and Lake tickets are not implemented"
                    .into(),
            )),
        }
    }

    async fn table_schema(&self, path: &TablePath) -> Result<SchemaRef> {
        Ok(self.table(path)?.descriptor.schema.to_arrow())
    }

    async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>> {
        Ok(self.meta.read(|s| {
            s.tables
                .values()
                .map(|t| (t.path.clone(), t.descriptor.schema.to_arrow()))
                .collect()
        }))
    }
}
