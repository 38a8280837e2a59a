//! The node service both listeners front: catalog actions through the metadata log,
//! the tablet manager, the write path for log tables, and reads.
//!
//! Built so far: catalog and cluster actions, `init_writer`, `list_offsets`, `lookup`;
//! `Append`/`AppendTable` for log tables and `Put`/`PutTable` for primary-key tables
//! (unpartitioned); `Scan`. Anything
//! else answers `Unimplemented` naming what is missing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{RecordBatch, new_null_array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use mink_flight::MinkService;
use mink_flight::protocol::{
    BucketWritten, ReadTicket, ScanBatch, SnapshotBatch, TailPoll, WriteBatch, WriteDescriptor,
    WriteResult, parse_json,
};
use mink_flight::server::{ReadBatch, ReadBatches, TableEndpoint};
use mink_kv::{KvStore, KvTablet, PutRequest, SnapshotStore};
use mink_log::{AppendRequest, LogTablet, NO_WRITER, OffsetSpec};
use mink_meta::{MetaNode, TableInfo};
use mink_types::{
    ChangeType, KeyValue, MinkError, Result, TableBucket, TableDescriptor, TablePath,
    encode_values, split_by_bucket, split_by_partition,
};
use mink_wal::StreamStore;
use serde::Deserialize;

use crate::MinkConfig;
use crate::tablets::{Tablet, Tablets};

/// A bucket's open tablet: a log, or a log under a KV tablet.
/// How long a forwarded bucket write may take, redirects and retries included.
const FORWARD_DEADLINE: Duration = Duration::from_secs(30);

/// Writer ids handed to this node at a time.
const WRITER_ID_BLOCK: u64 = 1_000;

/// The node's service.
pub struct NodeService {
    config: MinkConfig,
    meta: MetaNode,
    /// Open tablets and the s3stream service they live on.
    tablets: Arc<Tablets>,
    round_robin: Mutex<HashMap<i64, u32>>,
    writer_ids: tokio::sync::Mutex<std::ops::Range<i64>>,
    forwarder: crate::forward::Forwarder,
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

/// How long registered producer offsets live without a new registration.
const PRODUCER_OFFSETS_TTL_MS: i64 = 7 * 24 * 3600 * 1000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

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
}

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
struct PrefixLookupBody {
    path: TablePath,
    /// Bucket-key values, in bucket-key order.
    prefix: Vec<serde_json::Value>,
    #[serde(default)]
    limit: Option<usize>,
}

/// Keys (and prefix-lookup rows) in one lookup, at most.
const LOOKUP_KEYS_MAX: usize = 10_000;

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
struct LookupBody {
    path: TablePath,
    /// Primary-key values, one array per key, in primary-key column order.
    keys: Vec<Vec<serde_json::Value>>,
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
    pub fn new(
        config: MinkConfig,
        meta: MetaNode,
        streams: StreamStore,
        kv: Arc<dyn KvStore>,
    ) -> Self {
        Self {
            tablets: Arc::new(Tablets::new(config.clone(), meta.clone(), streams, kv)),
            config,
            meta,
            round_robin: Mutex::new(HashMap::new()),
            writer_ids: tokio::sync::Mutex::new(0..0),
            forwarder: crate::forward::Forwarder::default(),
        }
    }

    /// The current s3stream service.
    pub fn streams(&self) -> StreamStore {
        self.tablets.streams()
    }

    /// Puts a new WAL generation in place of a failed one. Every open tablet is
    /// dropped: the next request reopens its bucket on the new generation under the
    /// bucket's new leader epoch (the caller registered a new incarnation first),
    /// recovering from the old generation as after a crash.
    pub async fn replace_streams(&self, streams: StreamStore) {
        self.tablets.replace_streams(streams);
    }

    /// Lets go of buckets led elsewhere now, closing their streams (handovers), until
    /// `shutdown` is set.
    pub async fn run_handovers(&self, shutdown: tokio::sync::watch::Receiver<bool>) {
        self.tablets.clone().run_handovers(shutdown).await
    }

    /// A write that failed because this node's stream of `bucket` was fenced or moved
    /// to a newer epoch: answered as `NotLeader` with the new leader when leadership
    /// moved (the client follows the redirect), `Unavailable` (retry) otherwise.
    async fn redirect_stale(&self, bucket: TableBucket, err: MinkError) -> MinkError {
        if !matches!(err, MinkError::Fenced(_)) {
            return err;
        }
        self.meta.inner_catch_up().await;
        let me = self.meta.node_id().to_string();
        let (leader, addr) = self.meta.read(|s| {
            let leader = s
                .buckets
                .get(&bucket.stream_name())
                .and_then(|b| b.leader.clone());
            let addr = leader
                .as_ref()
                .and_then(|l| s.nodes.get(l))
                .map(|n| n.flight_addr.clone());
            (leader, addr)
        });
        match leader {
            Some(l) if l != me => MinkError::NotLeader {
                bucket,
                leader: addr,
            },
            _ => MinkError::Unavailable(format!(
                "{bucket}: the bucket is being reopened ({err}); retry"
            )),
        }
    }

    /// Why the node does not serve right now, if it does not.
    pub fn health_problem(&self) -> Option<String> {
        if let Some(e) = self.streams().failure() {
            return Some(format!("the WAL failed: {e}"));
        }
        if !self.meta.heartbeat_ok() {
            return Some("the object store does not answer heartbeats".into());
        }
        None
    }

    /// Sets the gauges `/metrics` reports: applied index, lease, buckets led, tablets.
    pub async fn record_gauges(&self) {
        let me = self.meta.node_id().to_string();
        let (applied, holder, led) = self.meta.read(|s| {
            (
                s.lease.term,
                s.lease.holder.as_deref() == Some(me.as_str()),
                s.buckets
                    .values()
                    .filter(|b| b.leader.as_deref() == Some(me.as_str()))
                    .count(),
            )
        });
        metrics::gauge!("mink_meta_applied_index").set(self.meta.applied_index() as f64);
        metrics::gauge!("mink_meta_lease_term").set(applied as f64);
        metrics::gauge!("mink_meta_lease_holder").set(if holder { 1.0 } else { 0.0 });
        metrics::gauge!("mink_node_buckets_led").set(led as f64);
        metrics::gauge!("mink_node_tablets_open").set(self.tablets.open_count() as f64);
    }

    /// A table by path. A node that does not know it catches up with the metadata log
    /// once before answering NotFound: the table may be younger than its view.
    async fn table(&self, path: &TablePath) -> Result<TableInfo> {
        if let Some(t) = self.meta.read(|s| s.table(path).cloned()) {
            return Ok(t);
        }
        self.meta.inner_catch_up().await;
        self.meta
            .read(|s| s.table(path).cloned())
            .ok_or_else(|| MinkError::NotFound(format!("table {path}")))
    }

    /// A table by id, catching up once like [`NodeService::table`].
    async fn table_by_id(&self, id: i64) -> Result<TableInfo> {
        if let Some(t) = self.meta.read(|s| s.tables.get(&id).cloned()) {
            return Ok(t);
        }
        self.meta.inner_catch_up().await;
        self.meta
            .read(|s| s.tables.get(&id).cloned())
            .ok_or_else(|| MinkError::NotFound(format!("table id {id}")))
    }

    /// The tablet of `bucket`, opened under the bucket's current epoch when this node
    /// leads it; `NotLeader` (with the leader's address) or `Unavailable` otherwise.
    async fn tablet(&self, bucket: TableBucket) -> Result<Tablet> {
        if self
            .meta
            .read(|s| !s.buckets.contains_key(&bucket.stream_name()))
        {
            // Perhaps younger than this node's view.
            self.meta.inner_catch_up().await;
        }
        // A bucket just created gets its leader within moments: wait for it (bounded)
        // rather than fail the first write to a new table.
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.config.meta.applied_index_wait_max_ms);
        let mut changes = self.meta.subscribe();
        let state = loop {
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
                Some(l) if l == self.meta.node_id() => break state,
                Some(_) => {
                    return Err(MinkError::NotLeader {
                        bucket,
                        leader: leader_addr,
                    });
                }
                None => {
                    let wait = tokio::time::timeout_at(deadline, changes.changed()).await;
                    if !matches!(wait, Ok(Ok(()))) {
                        return Err(MinkError::Unavailable(format!(
                            "{bucket} has no leader yet"
                        )));
                    }
                }
            }
        };
        let table = self.table_by_id(bucket.table_id).await?;
        self.tablets.get(bucket, state.epoch, table).await
    }

    async fn log_tablet(&self, bucket: TableBucket) -> Result<LogTablet> {
        match self.tablet(bucket).await? {
            Tablet::Log(l) => Ok(l),
            Tablet::Kv(_) => Err(MinkError::invalid(
                "descriptor",
                format!("{bucket} belongs to a primary-key table: use Put"),
            )),
        }
    }

    async fn kv_tablet(&self, bucket: TableBucket) -> Result<KvTablet> {
        match self.tablet(bucket).await? {
            Tablet::Kv(k) => Ok(k),
            Tablet::Log(_) => Err(MinkError::invalid(
                "descriptor",
                format!("{bucket} belongs to a log table: use Append"),
            )),
        }
    }

    /// A bucket-addressed write must carry only rows of that bucket (when the table
    /// has bucket keys): otherwise lookups would look for them elsewhere.
    async fn check_rows_belong(&self, bucket: TableBucket, batch: &RecordBatch) -> Result<()> {
        let table = self.table_by_id(bucket.table_id).await?;
        let d = &table.descriptor;
        let keys = d.bucket_keys();
        if keys.is_empty() {
            return Ok(());
        }
        let indices: Vec<usize> = keys
            .iter()
            .map(|k| {
                batch.schema().index_of(k).map_err(|_| {
                    MinkError::invalid("batch", format!("the batch lacks bucket-key column {k:?}"))
                })
            })
            .collect::<Result<_>>()?;
        let per_row = mink_types::bucket_per_row(batch, &indices, d.bucketing, d.bucket_count)?;
        if let Some((row, other)) = per_row
            .iter()
            .enumerate()
            .find(|(_, b)| **b != bucket.bucket)
        {
            return Err(MinkError::invalid(
                "batch",
                format!(
                    "row {row} belongs to bucket {other}, not to {bucket}; route rows by their bucket keys"
                ),
            ));
        }
        Ok(())
    }

    fn sequence(writer: Option<i64>, meta: &WriteBatch) -> Result<(i64, i64)> {
        match (writer, meta.batch_sequence) {
            (Some(w), Some(s)) => Ok((w, s)),
            (Some(_), None) => Err(MinkError::invalid(
                "batch_sequence",
                "a write with a writer_id needs a batch_sequence",
            )),
            (None, s) => Ok((NO_WRITER, s.unwrap_or(0))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn put(
        &self,
        bucket: TableBucket,
        schema_id: i32,
        writer: Option<i64>,
        target_columns: Option<Vec<String>>,
        batch: RecordBatch,
        changes: Option<Vec<ChangeType>>,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        let (writer_id, batch_sequence) = Self::sequence(writer, meta)?;
        self.check_rows_belong(bucket, &batch).await?;
        // A primary-key table keeps rows of its current schema: rows of an older
        // version are read with the evolution rules (added columns null) first.
        let table = self.table_by_id(bucket.table_id).await?;
        let current = &table.descriptor.schema;
        let (schema_id, batch) = if schema_id == current.schema_id {
            (schema_id, batch)
        } else {
            let old = schema_version(&table, schema_id)?;
            match &target_columns {
                Some(_) => (current.schema_id, batch),
                None => {
                    old.check_batch(&batch)?;
                    (current.schema_id, as_schema(batch, &current.to_arrow())?)
                }
            }
        };
        let tablet = match self.kv_tablet(bucket).await {
            Ok(t) => t,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        let appended = match tablet
            .put(PutRequest {
                writer_id,
                batch_sequence,
                schema_id,
                target_columns,
                changes,
                batch,
            })
            .await
        {
            Ok(a) => a,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        Ok(BucketWritten {
            bucket,
            first_offset: appended.first_offset,
            last_offset: appended.last_offset,
            duplicated: appended.duplicated,
        })
    }

    async fn append(
        &self,
        bucket: TableBucket,
        schema_id: i32,
        writer: Option<i64>,
        batch: RecordBatch,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        let tablet = match self.log_tablet(bucket).await {
            Ok(t) => t,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        let (writer_id, sequence) = Self::sequence(writer, meta)?;
        self.check_rows_belong(bucket, &batch).await?;
        let appended = match tablet
            .append(AppendRequest {
                writer_id,
                first_sequence: sequence,
                last_sequence: sequence,
                schema_id,
                change_types: None,
                batch,
            })
            .await
        {
            Ok(a) => a,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        Ok(BucketWritten {
            bucket,
            first_offset: appended.first_offset,
            last_offset: appended.last_offset,
            duplicated: appended.duplicated,
        })
    }

    /// Writes a bucket's part at its leader, following redirects (`NotLeader` names
    /// the new leader) and retrying while the leader answers `Unavailable` (the bucket
    /// is being opened), both refusals before anything was written; within
    /// [`FORWARD_DEADLINE`]. A forwarded write that outlives it answers `Unavailable`.
    async fn forwarded(
        &self,
        addr: &str,
        bucket: TableBucket,
        descriptor: &WriteDescriptor,
        part: &RecordBatch,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        let deadline = tokio::time::Instant::now() + FORWARD_DEADLINE;
        let mut addr = addr.to_string();
        let mut pause = Duration::from_millis(50);
        loop {
            let attempt = tokio::time::timeout_at(
                deadline,
                self.forwarded_once(&addr, bucket, descriptor, part, meta),
            )
            .await;
            match attempt {
                Err(_) => {
                    return Err(MinkError::Unavailable(format!(
                        "{bucket}: the leader at {addr} did not answer within {FORWARD_DEADLINE:?}"
                    )));
                }
                Ok(Err(MinkError::NotLeader {
                    leader: Some(next), ..
                })) if next != addr => addr = next,
                Ok(Err(MinkError::Unavailable(why)))
                    if tokio::time::Instant::now() + pause < deadline =>
                {
                    tracing::debug!(%bucket, %addr, "forwarded write refused ({why}); retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Ok(other) => return other,
            }
        }
    }

    async fn forwarded_once(
        &self,
        addr: &str,
        bucket: TableBucket,
        descriptor: &WriteDescriptor,
        part: &RecordBatch,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        match self.forwarder.write(addr, descriptor, part, meta).await? {
            WriteResult::Written {
                first_offset,
                last_offset,
                duplicated,
            } => Ok(BucketWritten {
                bucket,
                first_offset,
                last_offset,
                duplicated,
            }),
            other => Err(MinkError::Internal(format!(
                "{addr} answered a bucket write with {other:?}"
            ))),
        }
    }

    /// Where each row of a table-addressed batch goes: partitions first (created on
    /// demand), then buckets (hash of the bucket keys, or round-robin per batch).
    /// Returns each bucket with the original row indices it gets. With `create` false,
    /// rows of partitions that do not exist are left out (lookups: such keys have no row).
    async fn route(
        &self,
        table: &TableInfo,
        batch: &RecordBatch,
        create: bool,
    ) -> Result<Vec<(TableBucket, Vec<u32>)>> {
        let d = &table.descriptor;
        let column = |k: &String| {
            batch
                .schema()
                .index_of(k)
                .map_err(|_| MinkError::invalid("batch", format!("the batch lacks column {k:?}")))
        };
        let mut parts: Vec<(Option<i64>, Vec<u32>)> = Vec::new();
        if d.is_partitioned() {
            let keys: Vec<usize> = d.partition_keys.iter().map(column).collect::<Result<_>>()?;
            for p in split_by_partition(batch, &keys)? {
                let known = self.meta.read(|s| {
                    s.table(&table.path)
                        .and_then(|t| t.partitions.get(&p.name).map(|p| p.id))
                });
                let id = match known {
                    Some(id) => id,
                    None if !create => continue,
                    None => {
                        let (info, _) = self.meta.create_partition(&table.path, &p.name).await?;
                        self.meta.assign_now().await;
                        info.id
                    }
                };
                parts.push((Some(id), p.rows.values().to_vec()));
            }
        } else {
            parts.push((None, (0..batch.num_rows() as u32).collect()));
        }
        let bucket_keys: Vec<usize> = d.bucket_keys().iter().map(column).collect::<Result<_>>()?;
        let mut out = Vec::new();
        for (partition, rows) in parts {
            if bucket_keys.is_empty() {
                let bucket = {
                    let mut rr = self.round_robin.lock().unwrap_or_else(|e| e.into_inner());
                    let next = rr.entry(table.id).or_insert(0);
                    let b = *next % d.bucket_count;
                    *next = next.wrapping_add(1);
                    b
                };
                out.push((TableBucket::new(table.id, partition, bucket), rows));
                continue;
            }
            let sub = take_record_batch(batch, &arrow::array::UInt32Array::from(rows.clone()))?;
            for part in split_by_bucket(&sub, &bucket_keys, d.bucketing, d.bucket_count)? {
                let original = part
                    .rows
                    .values()
                    .iter()
                    .map(|i| rows[*i as usize])
                    .collect();
                out.push((TableBucket::new(table.id, partition, part.bucket), original));
            }
        }
        Ok(out)
    }

    async fn append_table(
        &self,
        path: &TablePath,
        schema_id: i32,
        batch: RecordBatch,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let table = self.table(path).await?;
        let d = &table.descriptor;
        if d.has_primary_key() {
            return Err(MinkError::invalid(
                "descriptor",
                format!("{path} has a primary key: write it with PutTable"),
            ));
        }
        // Rows of an older schema version keep its id: it travels with them, and
        // readers see them through the evolution rules (added columns null).
        schema_version(&table, schema_id)?.check_batch(&batch)?;
        let mut results = Vec::new();
        for (bucket, rows) in self.route(&table, &batch, true).await? {
            let part = take_record_batch(&batch, &arrow::array::UInt32Array::from(rows))?;
            let written = match self
                .append(bucket, schema_id, None, part.clone(), meta)
                .await
            {
                Err(MinkError::NotLeader {
                    leader: Some(addr), ..
                }) => {
                    let descriptor = WriteDescriptor::Append {
                        bucket,
                        schema_id,
                        writer_id: None,
                    };
                    self.forwarded(&addr, bucket, &descriptor, &part, meta)
                        .await?
                }
                other => other?,
            };
            results.push(written);
        }
        Ok(WriteResult::Routed { buckets: results })
    }

    async fn put_table(
        &self,
        path: &TablePath,
        schema_id: i32,
        target_columns: Option<Vec<String>>,
        batch: RecordBatch,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let table = self.table(path).await?;
        let d = &table.descriptor;
        if !d.has_primary_key() {
            return Err(MinkError::invalid(
                "descriptor",
                format!("{path} has no primary key: write it with AppendTable"),
            ));
        }
        if let Some(c) = &meta.changes
            && c.len() != batch.num_rows()
        {
            return Err(MinkError::invalid(
                "changes",
                format!("{} change types for {} rows", c.len(), batch.num_rows()),
            ));
        }
        let mut results = Vec::new();
        for (bucket, rows) in self.route(&table, &batch, true).await? {
            let changes = meta
                .changes
                .as_ref()
                .map(|c| rows.iter().map(|i| c[*i as usize]).collect());
            let part = take_record_batch(&batch, &arrow::array::UInt32Array::from(rows))?;
            let result = self
                .put(
                    bucket,
                    schema_id,
                    None,
                    target_columns.clone(),
                    part.clone(),
                    changes.clone(),
                    meta,
                )
                .await;
            let written = match result {
                Err(MinkError::NotLeader {
                    leader: Some(addr), ..
                }) => {
                    let descriptor = WriteDescriptor::Put {
                        bucket,
                        schema_id,
                        writer_id: None,
                        target_columns: target_columns.clone(),
                    };
                    let meta = WriteBatch {
                        batch_sequence: None,
                        changes,
                    };
                    self.forwarded(&addr, bucket, &descriptor, &part, &meta)
                        .await?
                }
                other => other?,
            };
            results.push(written);
        }
        Ok(WriteResult::Routed { buckets: results })
    }

    /// Rows by primary key, answered as an Arrow IPC stream of the found rows (grouped
    /// by bucket, missing keys skipped). Every key's bucket must be led here.
    async fn lookup(&self, body: LookupBody) -> Result<Vec<u8>> {
        let table = self.table(&body.path).await?;
        let d = &table.descriptor;
        if !d.has_primary_key() {
            return Err(MinkError::invalid(
                "path",
                format!("{} has no primary key", body.path),
            ));
        }
        if body.keys.len() > LOOKUP_KEYS_MAX {
            return Err(MinkError::LimitExceeded {
                what: "keys in one lookup".into(),
                limit: LOOKUP_KEYS_MAX as u64,
                actual: body.keys.len() as u64,
            });
        }
        let pk_types: Vec<mink_types::DataType> = d
            .primary_key
            .iter()
            .map(|k| {
                d.schema
                    .column(k)
                    .map(|c| c.data_type)
                    .ok_or_else(|| MinkError::Internal(format!("no column {k}")))
            })
            .collect::<Result<_>>()?;
        let mut values = Vec::with_capacity(body.keys.len());
        for (i, key) in body.keys.iter().enumerate() {
            if key.len() != pk_types.len() {
                return Err(MinkError::invalid(
                    format!("keys[{i}]"),
                    format!("{} values for {} key columns", key.len(), pk_types.len()),
                ));
            }
            values.push(json_key_values(&pk_types, key, &format!("keys[{i}]"))?);
        }
        let fields: Vec<arrow::datatypes::Field> = d
            .primary_key
            .iter()
            .zip(&pk_types)
            .map(|(n, t)| arrow::datatypes::Field::new(n, t.to_arrow(), false))
            .collect();
        let key_schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let columns = (0..pk_types.len())
            .map(|c| {
                mink_types::key::key_values_to_array(
                    pk_types[c],
                    &values.iter().map(|k| &k[c]).collect::<Vec<_>>(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let keys = RecordBatch::try_new_with_options(
            key_schema,
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(values.len())),
        )?;
        let schema = d.schema.to_arrow();
        let mut found = Vec::new();
        // Partition (existing ones only), then bucket; each bucket asked where it is led.
        for (bucket, rows) in self.route(&table, &keys, false).await? {
            match self.kv_tablet(bucket).await {
                Ok(tablet) => {
                    let sub = take_record_batch(&keys, &arrow::array::UInt32Array::from(rows))?;
                    found.push(tablet.lookup(&sub)?.batch);
                }
                Err(MinkError::NotLeader {
                    leader: Some(addr), ..
                }) => {
                    let subset: Vec<_> = rows
                        .iter()
                        .map(|r| body.keys[*r as usize].clone())
                        .collect();
                    let body = serde_json::json!({"path": body.path, "keys": subset});
                    found.extend(self.forwarded_rows(&addr, "lookup", &body).await?);
                }
                Err(e) => return Err(e),
            }
        }
        ipc_stream(&schema, &found)
    }

    /// Rows whose primary key starts with the given bucket-key values (the bucket key
    /// must lead the primary key), as an Arrow IPC stream, at most `limit` rows.
    async fn prefix_lookup(&self, body: PrefixLookupBody) -> Result<Vec<u8>> {
        let table = self.table(&body.path).await?;
        let d = &table.descriptor;
        if !d.has_primary_key() {
            return Err(MinkError::invalid(
                "path",
                format!("{} has no primary key", body.path),
            ));
        }
        // The prefix is the leading primary-key columns that pick the partition and the
        // bucket; the rows found share them and differ in the columns after.
        let mut leading: Vec<String> = d.partition_keys.clone();
        leading.extend(d.bucket_keys());
        let k = leading.len();
        let mut head: Vec<&String> = d.primary_key.iter().take(k).collect();
        head.sort();
        let mut wanted: Vec<&String> = leading.iter().collect();
        wanted.sort();
        if d.primary_key.len() <= k || head != wanted {
            return Err(MinkError::invalid(
                "path",
                format!(
                    "{}: prefix lookups need the partition and bucket keys ({}) to lead a longer primary key ({})",
                    body.path,
                    leading.join(", "),
                    d.primary_key.join(", ")
                ),
            ));
        }
        let columns = &d.primary_key[..k];
        if body.prefix.len() != k {
            return Err(MinkError::invalid(
                "prefix",
                format!(
                    "{} values for {k} leading primary-key columns ({}: the partition and bucket-key columns)",
                    body.prefix.len(),
                    columns.join(", ")
                ),
            ));
        }
        let types: Vec<mink_types::DataType> = columns
            .iter()
            .map(|k| {
                d.schema
                    .column(k)
                    .map(|c| c.data_type)
                    .ok_or_else(|| MinkError::Internal(format!("no column {k}")))
            })
            .collect::<Result<_>>()?;
        let values = json_key_values(&types, &body.prefix, "prefix")?;
        let mut encoded = Vec::new();
        encode_values(&types, &values, &mut encoded)?;
        let prefix_row = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(
                columns
                    .iter()
                    .zip(&types)
                    .map(|(n, t)| arrow::datatypes::Field::new(n, t.to_arrow(), false))
                    .collect::<Vec<_>>(),
            )),
            values
                .iter()
                .zip(&types)
                .map(|(v, t)| mink_types::key::key_values_to_array(*t, &[v]))
                .collect::<Result<Vec<_>>>()?,
        )?;
        let schema = d.schema.to_arrow();
        let mut found = Vec::new();
        // One bucket (none when the partition does not exist), asked where it is led.
        if let Some((bucket, _)) = self.route(&table, &prefix_row, false).await?.pop() {
            match self.kv_tablet(bucket).await {
                Ok(tablet) => {
                    let limit = body.limit.unwrap_or(LOOKUP_KEYS_MAX).min(LOOKUP_KEYS_MAX);
                    found.push(tablet.prefix_lookup(&encoded, limit)?);
                }
                Err(MinkError::NotLeader {
                    leader: Some(addr), ..
                }) => {
                    let body = serde_json::json!({"path": body.path, "prefix": body.prefix,
                        "limit": body.limit});
                    found.extend(self.forwarded_rows(&addr, "prefix_lookup", &body).await?);
                }
                Err(e) => return Err(e),
            }
        }
        ipc_stream(&schema, &found)
    }

    /// The rows another node's lookup action answers (an Arrow IPC stream).
    async fn forwarded_rows(
        &self,
        addr: &str,
        action: &str,
        body: &serde_json::Value,
    ) -> Result<Vec<RecordBatch>> {
        let ipc = self.forwarder.action_raw(addr, action, body).await?;
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)?;
        reader.map(|b| Ok(b?)).collect()
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

    /// The KV snapshot a bucket's state is read from: the newest one while it is younger
    /// than `kv.snapshot_interval_ms`, otherwise a new one (never one per read). A new
    /// one is recorded in the metadata log for other nodes.
    async fn kv_snapshot(&self, bucket: TableBucket) -> Result<mink_kv::SnapshotInfo> {
        let tablet = self.kv_tablet(bucket).await?;
        let age_max = Duration::from_millis(self.config.kv.snapshot_interval_ms);
        let info = tablet
            .recent_snapshot(age_max)
            .await?
            .ok_or_else(|| MinkError::Internal("the KV tablet has no snapshot store".into()))?;
        let snapshot_id = info.log_offset.max(0) as u64;
        let recorded = self.meta.read(|s| {
            s.kv_snapshots
                .get(&bucket.stream_name())
                .map(|p| p.snapshot_id)
        });
        if recorded.is_none_or(|id| id < snapshot_id) {
            let pointer = mink_meta::state::KvSnapshotPointer {
                snapshot_id,
                log_offset: info.log_offset,
                location: info.location.clone(),
            };
            // Best effort: the snapshot serves this read whether or not it is recorded
            // (a concurrent reader may have recorded it first).
            if let Err(e) = self
                .meta
                .propose(mink_meta::MetaCommand::SetKvSnapshot {
                    bucket: bucket.stream_name(),
                    pointer,
                })
                .await
            {
                tracing::debug!(%bucket, "KV snapshot pointer not recorded: {e}");
            }
        }
        Ok(info)
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

/// Key values typed by person or program as JSON (`1`, `"ann"`), as `types`.
fn json_key_values(
    types: &[mink_types::DataType],
    json: &[serde_json::Value],
    field: &str,
) -> Result<Vec<KeyValue>> {
    json.iter()
        .zip(types)
        .map(|(v, ty)| match v {
            serde_json::Value::String(s) => KeyValue::parse(*ty, s),
            serde_json::Value::Null => {
                Err(MinkError::invalid(field, "key values must not be null"))
            }
            other => KeyValue::parse(*ty, &other.to_string()),
        })
        .collect()
}

/// `batches` as one Arrow IPC stream of `schema`.
fn ipc_stream(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut out, schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// A scan's batches with their `ScanBatch` metadata, arranged as the table's current
/// schema.
fn read_batches(
    bucket: TableBucket,
    scan: mink_log::ScanResult,
    schema: &SchemaRef,
) -> Result<Vec<ReadBatch>> {
    let high_watermark = scan.high_watermark;
    scan.batches
        .into_iter()
        .map(|b| {
            let meta = ScanBatch {
                bucket,
                base_offset: b.header.base_offset,
                high_watermark,
                change_types: (!b.header.change_types.is_empty())
                    .then(|| b.header.change_types.clone()),
            };
            Ok((as_schema(b.batch, schema)?, meta))
        })
        .collect()
}

/// Where a bucket's KV snapshots live.
pub(crate) fn snapshot_prefix(bucket: TableBucket) -> String {
    format!(
        "kv/{}/{}/{}",
        bucket.table_id,
        bucket
            .partition_id
            .map_or("-".to_string(), |p| p.to_string()),
        bucket.bucket
    )
}

/// Columns of `batch` arranged as `schema` (by name; columns it lacks are null).
/// Version `schema_id` of `table`'s schema, or `SchemaMismatch` naming the versions.
fn schema_version(table: &TableInfo, schema_id: i32) -> Result<&mink_types::Schema> {
    table
        .schemas
        .iter()
        .find(|s| s.schema_id == schema_id)
        .ok_or_else(|| {
            MinkError::SchemaMismatch(format!(
                "{} has no schema {schema_id} (its versions are 1 to {})",
                table.path, table.descriptor.schema.schema_id
            ))
        })
}

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
                            .action(&addr, "rebalance", &serde_json::json!({"forwarded": true}))
                            .await?;
                        json(&answer)
                    }
                    None => {
                        let moved = self.meta.rebalance().await?;
                        json(&serde_json::json!({"moved": moved}))
                    }
                }
            }
            "init_writer" => {
                let mut ids = self.writer_ids.lock().await;
                if ids.is_empty() {
                    *ids = self.meta.allocate_writer_ids(WRITER_ID_BLOCK).await?;
                }
                let id = ids.start;
                ids.start += 1;
                json(&serde_json::json!({"writer_id": id}))
            }
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
                let table = self.table(&b.path).await?;
                let pointer = self
                    .meta
                    .read(|s| s.lake_snapshots.get(&table.id).cloned())
                    .ok_or_else(|| {
                        MinkError::NotFound(format!(
                            "a lake snapshot of {} (lake tiering does not exist yet)",
                            b.path
                        ))
                    })?;
                json(&pointer)
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
                let table = self.table_by_id(bucket.table_id).await?;
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
            WriteDescriptor::Put {
                bucket,
                schema_id,
                writer_id,
                target_columns,
            } => {
                let changes = meta.changes.clone();
                let w = self
                    .put(
                        *bucket,
                        *schema_id,
                        *writer_id,
                        target_columns.clone(),
                        batch,
                        changes,
                        &meta,
                    )
                    .await?;
                Ok(WriteResult::Written {
                    first_offset: w.first_offset,
                    last_offset: w.last_offset,
                    duplicated: w.duplicated,
                })
            }
            WriteDescriptor::PutTable {
                path,
                schema_id,
                target_columns,
            } => {
                self.put_table(path, *schema_id, target_columns.clone(), batch, &meta)
                    .await
            }
        }
    }

    async fn read(&self, ticket: ReadTicket) -> Result<(SchemaRef, ReadBatches)> {
        match ticket {
            // With an `end_offset`, the Flight server reads the range in scans like this.
            ReadTicket::Scan {
                bucket,
                offset,
                max_bytes,
                end_offset: _,
            } => {
                let table = self.table_by_id(bucket.table_id).await?;
                let schema = table.descriptor.schema.to_arrow();
                let tablet = self.tablet(bucket).await?;
                let max = max_bytes.unwrap_or(self.config.log.scan_bytes_max) as usize;
                let scan = tablet.log().scan(offset, max).await?;
                let batches = read_batches(bucket, scan, &schema)?;
                Ok((schema, ReadBatches::Scan(batches)))
            }
            ReadTicket::LimitScan { bucket, limit } => {
                let table = self.table_by_id(bucket.table_id).await?;
                let schema = table.descriptor.schema.to_arrow();
                let tablet = self.tablet(bucket).await?;
                let log = tablet.log();
                let mut pos = log.log_start();
                let mut rows = 0u64;
                let mut out = Vec::new();
                while rows < limit && pos < log.high_watermark() {
                    let scan = log
                        .scan(pos, self.config.log.scan_bytes_max as usize)
                        .await?;
                    pos = scan.next_offset(pos);
                    for b in scan.batches {
                        if rows >= limit {
                            break;
                        }
                        let take = (limit - rows).min(b.batch.num_rows() as u64) as usize;
                        rows += take as u64;
                        let meta = ScanBatch {
                            bucket,
                            base_offset: b.header.base_offset,
                            high_watermark: scan.high_watermark,
                            change_types: (!b.header.change_types.is_empty())
                                .then(|| b.header.change_types[..take].to_vec()),
                        };
                        out.push((as_schema(b.batch.slice(0, take), &schema)?, meta));
                    }
                }
                Ok((schema, ReadBatches::Scan(out)))
            }
            ReadTicket::Snapshot { bucket } => {
                let table = self.table_by_id(bucket.table_id).await?;
                let schema = table.descriptor.schema.to_arrow();
                let info = self.kv_snapshot(bucket).await?;
                let store = SnapshotStore {
                    store: self
                        .streams()
                        .object_store_for(mink_wal::Purpose::KvSnapshot),
                    prefix: snapshot_prefix(bucket),
                    retain: self.config.kv.snapshots_retained as usize,
                };
                let batches = store
                    .read(info.log_offset)
                    .await?
                    .into_iter()
                    .map(|b| {
                        let meta = SnapshotBatch {
                            bucket,
                            log_offset: info.log_offset,
                            written_at_ms: info.written_at_ms,
                        };
                        Ok((as_schema(b, &schema)?, meta))
                    })
                    .collect::<Result<_>>()?;
                Ok((schema, ReadBatches::Snapshot(batches)))
            }
            ReadTicket::Union { .. } | ReadTicket::Lake { .. } => Err(MinkError::Unimplemented(
                "lake tiering does not exist yet, so Union and Lake tickets are not implemented"
                    .into(),
            )),
        }
    }

    async fn tail(
        &self,
        bucket: TableBucket,
        poll: TailPoll,
    ) -> Result<(SchemaRef, Vec<ReadBatch>, i64)> {
        let table = self.table_by_id(bucket.table_id).await?;
        let schema = table.descriptor.schema.to_arrow();
        let tablet = self.tablet(bucket).await?;
        let wait = Duration::from_millis(poll.max_wait_ms.min(self.config.flight.tail_wait_max_ms));
        let max = poll.max_bytes.unwrap_or(self.config.log.scan_bytes_max) as usize;
        let scan = tablet
            .log()
            .tail(poll.offset, poll.min_bytes as usize, wait, max)
            .await?;
        let high_watermark = scan.high_watermark;
        let batches = read_batches(bucket, scan, &schema)?;
        Ok((schema, batches, high_watermark))
    }

    async fn table_schema(&self, path: &TablePath) -> Result<SchemaRef> {
        Ok(self.table(path).await?.descriptor.schema.to_arrow())
    }

    /// One endpoint per bucket of every partition: a `Scan` of the bucket's rows now,
    /// from its log start to its high watermark (both asked with `list_offsets`, which
    /// asks the leaders of buckets this node does not lead), at its leader.
    async fn table_endpoints(&self, path: &TablePath) -> Result<(SchemaRef, Vec<TableEndpoint>)> {
        #[derive(Deserialize)]
        struct BucketOffset {
            bucket: TableBucket,
            offset: Option<i64>,
        }
        let table = self.table(path).await?;
        let partitions: Vec<Option<String>> = if table.descriptor.is_partitioned() {
            table.partitions.keys().cloned().map(Some).collect()
        } else {
            vec![None]
        };
        let mut out = Vec::new();
        for partition in partitions {
            let mut ends = Vec::with_capacity(2);
            for spec in ["earliest", "latest"] {
                let body = serde_json::json!({"path": path, "spec": spec, "partition": partition});
                let answer = self.action("list_offsets", &json(&body)?).await?;
                let offsets: Vec<BucketOffset> = parse_json("list_offsets answer", &answer)?;
                ends.push(offsets);
            }
            let [earliest, latest] = <[Vec<BucketOffset>; 2]>::try_from(ends)
                .map_err(|_| MinkError::Internal("two list_offsets answers".into()))?;
            for (start, end) in earliest.into_iter().zip(latest) {
                debug_assert_eq!(start.bucket, end.bucket);
                let bucket = start.bucket;
                let from = start.offset.unwrap_or(0);
                let to = end.offset.unwrap_or(from).max(from);
                let leader = self.meta.read(|s| {
                    s.buckets
                        .get(&bucket.stream_name())
                        .and_then(|b| b.leader.as_ref())
                        .and_then(|l| s.nodes.get(l))
                        .map(|n| n.flight_addr.clone())
                });
                out.push(TableEndpoint {
                    ticket: ReadTicket::Scan {
                        bucket,
                        offset: from,
                        max_bytes: None,
                        end_offset: Some(to),
                    },
                    leader,
                    rows: to - from,
                });
            }
        }
        Ok((table.descriptor.schema.to_arrow(), out))
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
