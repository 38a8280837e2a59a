//! The node service both listeners front, split by concern:
//!
//! - [`writes`]: the write path (Append, Put, table routing, forwarding of bucket parts);
//! - [`reads`]: scans, tails, KV snapshot reads, a table's endpoints;
//! - [`lookups`]: `lookup` and `prefix_lookup`;
//! - [`actions`]: catalog and cluster actions, writers and offsets;
//! - [`console`]: the views the console draws (cluster, tables, one table);
//! - [`lake_catalog`]: the lake tables as the Iceberg REST catalog serves them;
//! - [`flight`] and [`kafka`]: the two protocol adapters, thin, over the above;
//! - this file: the service itself, its tablets and the lookups of tables and buckets.
//!
//! Anything not built answers `Unimplemented` naming what is missing.

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
    WriteResult,
};
use mink_flight::server::{ReadBatch, ReadBatches, TableEndpoint};
use mink_kv::{KvStore, KvTablet, PutRequest, SnapshotStore};
use mink_log::{AppendRequest, LogTablet, NO_WRITER, OffsetSpec};
use mink_meta::{MetaNode, TableInfo};
use mink_types::{
    ChangeType, IpcEncoded, KeyValue, MinkError, Result, TableBucket, TableDescriptor, TablePath,
    encode_values, split_by_bucket, split_by_partition,
};
use mink_wal::StreamStore;

use crate::MinkConfig;
use crate::tablets::{Tablet, Tablets, snapshot_prefix};
pub(crate) use lake_catalog::CatalogTable;
pub(crate) use leader::Leader;
pub(crate) use submit::{BucketWrite, Sequencing, Submission, submit};

mod actions;
mod console;
mod flight;
mod kafka;
mod lake;
mod lake_catalog;
mod leader;
mod lookups;
mod reads;
mod submit;
mod writes;

/// The node's service.
pub struct NodeService {
    config: MinkConfig,
    meta: MetaNode,
    /// Open tablets and the s3stream service they live on.
    tablets: Arc<Tablets>,
    round_robin: Mutex<HashMap<i64, u32>>,
    writer_ids: tokio::sync::Mutex<std::ops::Range<i64>>,
    forwarder: crate::forward::Forwarder,
    /// The node-wide bound on write requests in progress.
    admission: crate::admission::Admission,
    /// Kafka's consumer groups (membership lives in memory on the lease holder): the
    /// Kafka listener serves them, `kafka_groups` shows them.
    kafka_coordinator: Arc<mink_kafka::groups::Coordinator>,
    /// The files of lake snapshots read last (`Lake` and `Union` reads).
    lake_files: lake::LakeFilesCache,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl NodeService {
    pub fn new(
        config: MinkConfig,
        meta: MetaNode,
        streams: StreamStore,
        kv: Arc<dyn KvStore>,
    ) -> Self {
        let kafka_coordinator = Arc::new(mink_kafka::groups::Coordinator::new(&config.kafka));
        // Offsets of groups with members do not expire (KIP-211).
        let live = kafka_coordinator.clone();
        meta.set_live_groups(Arc::new(move || live.live_groups()));
        Self {
            kafka_coordinator,
            tablets: Arc::new(Tablets::new(config.clone(), meta.clone(), streams, kv)),
            admission: crate::admission::Admission::new(&config.writes),
            config,
            forwarder: crate::forward::Forwarder::new(meta.clone()),
            meta,
            round_robin: Mutex::new(HashMap::new()),
            writer_ids: tokio::sync::Mutex::new(0..0),
            lake_files: lake::LakeFilesCache::default(),
        }
    }

    /// The consumer-group coordinator the Kafka listener serves.
    pub fn kafka_coordinator(&self) -> Arc<mink_kafka::groups::Coordinator> {
        self.kafka_coordinator.clone()
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

    /// Why the node does not serve right now, if it does not.
    pub fn health_problem(&self) -> Option<String> {
        if let Some(e) = self.streams().failure() {
            return Some(format!("the WAL failed: {e}"));
        }
        if let Some(e) = self.meta.heartbeat_error() {
            return Some(format!("the object store refused the last heartbeat: {e}"));
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
    pub(crate) async fn table(&self, path: &TablePath) -> Result<TableInfo> {
        if let Some(t) = self.meta.read(|s| s.table(path).cloned()) {
            return Ok(t);
        }
        self.meta.inner_catch_up().await;
        self.meta
            .read(|s| s.table(path).cloned())
            .ok_or_else(|| MinkError::NotFound(format!("table {path}")))
    }

    /// A table by id, catching up once like [`NodeService::table`].
    pub(crate) async fn table_by_id(&self, id: i64) -> Result<TableInfo> {
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
    pub(crate) async fn tablet(&self, bucket: TableBucket) -> Result<Tablet> {
        match self.known_leader(bucket).await? {
            Leader::Me { epoch } => self.open_tablet(bucket, epoch).await,
            other => Err(other.redirect(bucket).unwrap_or_else(|| {
                MinkError::Internal(format!("{bucket}: a leader elsewhere without a redirect"))
            })),
        }
    }

    /// `bucket`'s tablet, opened under `epoch` (this node leads it under it).
    pub(crate) async fn open_tablet(&self, bucket: TableBucket, epoch: u64) -> Result<Tablet> {
        let table = self.table_by_id(bucket.table_id).await?;
        self.tablets.get(bucket, epoch, table).await
    }

    /// Who leads `bucket`, catching up once for a bucket younger than this node's view
    /// and waiting (bounded by `meta.applied_index_wait_max_ms`) while it has no leader
    /// yet: `Me` or `Other`; `NotFound` for a bucket the view does not know,
    /// `Unavailable` when it still has no leader.
    pub(crate) async fn known_leader(&self, bucket: TableBucket) -> Result<Leader> {
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
        loop {
            match self.leader(bucket) {
                None => return Err(MinkError::NotFound(format!("{bucket}"))),
                Some(Leader::Unknown) => {
                    let wait = tokio::time::timeout_at(deadline, changes.changed()).await;
                    if !matches!(wait, Ok(Ok(()))) {
                        return Err(MinkError::Unavailable(format!(
                            "{bucket} has no leader yet"
                        )));
                    }
                }
                Some(known) => return Ok(known),
            }
        }
    }

    pub(crate) async fn log_tablet(&self, bucket: TableBucket) -> Result<LogTablet> {
        match self.tablet(bucket).await? {
            Tablet::Log(l) => Ok(l),
            Tablet::Kv(_) => Err(MinkError::invalid(
                "descriptor",
                format!("{bucket} belongs to a primary-key table: use Put"),
            )),
        }
    }

    pub(crate) async fn kv_tablet(&self, bucket: TableBucket) -> Result<KvTablet> {
        kv_of(bucket, self.tablet(bucket).await?)
    }
}

/// The KV tablet of a primary-key bucket; a log table's is `InvalidArgument`.
pub(crate) fn kv_of(bucket: TableBucket, tablet: Tablet) -> Result<KvTablet> {
    match tablet {
        Tablet::Kv(k) => Ok(k),
        Tablet::Log(_) => Err(MinkError::invalid(
            "descriptor",
            format!("{bucket} belongs to a log table: use Append"),
        )),
    }
}

/// Columns of `batch` arranged as `schema` (by name; columns it lacks are null).
/// Version `schema_id` of `table`'s schema, or `SchemaMismatch` naming the versions.
pub(crate) fn schema_version(table: &TableInfo, schema_id: i32) -> Result<&mink_types::Schema> {
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

pub(crate) fn as_schema(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
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
