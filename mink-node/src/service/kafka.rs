//! The Kafka adapter: [`KafkaHandler`] over the node service. Topics are log tables
//! of the Kafka database (`kafka.database`) with the four topic columns; partitions are
//! buckets; brokers are the nodes with a Kafka listener; the controller is the lease
//! holder. Produce and Fetch reach the same log tablets as Flight's Append and Tail.

use std::time::Duration;

use mink_kafka::KafkaHandler;
use mink_kafka::handler::{
    Broker, ClusterView, CommittedOffset, Fetched, FetchedBatch, ListedOffset, OffsetQuery,
    PartitionView, PendingProduce, Produced, ProducerBatch, TopicView,
};
use mink_kafka::records::{OffsetDeltas, compacted_topic_columns, is_topic, topic_columns};
use mink_kafka::topic_config::{self, TopicConfigs};
use mink_types::table::ChangelogImage;
use mink_types::{BucketingRule, ChangeType, DatabaseName, LogTtl, Schema, TableName};

use super::*;

/// A node's Kafka broker id: a stable hash of its node id (FNV-1a, 31 bits), the same
/// on every node and across restarts.
pub(crate) fn broker_id(node_id: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in node_id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h & 0x7fff_ffff) as i32
}

/// `host:port` split for a broker entry.
fn host_port(addr: &str) -> Option<(String, i32)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port.parse().ok()?,
    ))
}

impl NodeService {
    /// Rows written through Flight to a table Kafka serves as a topic: their headers
    /// must be what a Kafka consumer can read (`mink_kafka::records::check_headers`),
    /// or every fetch of the partition would stop at them. The Kafka adapter's check,
    /// which the Flight write path asks of every log table's rows.
    pub(super) fn check_topic_rows(&self, table: &TableInfo, batch: &RecordBatch) -> Result<()> {
        if table.path.database.as_str() == self.config.kafka.database && is_kafka_topic(table) {
            mink_kafka::records::check_headers(batch)
                .map_err(|e| MinkError::invalid("headers", e))?;
        }
        Ok(())
    }

    /// The table path of a topic; an invalid Mink name is `InvalidArgument` on `topic`.
    pub(super) fn topic_path(&self, topic: &str) -> Result<TablePath> {
        let invalid = |e: MinkError| {
            MinkError::invalid(
                "topic",
                format!("{topic:?} is not a valid Mink table name ({e})"),
            )
        };
        Ok(TablePath::new(
            DatabaseName::new(self.config.kafka.database.clone()).map_err(invalid)?,
            TableName::new(topic).map_err(invalid)?,
        ))
    }

    /// A topic's table: it must exist and have the topic columns.
    async fn topic_table(&self, topic: &str) -> Result<TableInfo> {
        let path = self.topic_path(topic)?;
        let table = self.table(&path).await.map_err(|e| match e {
            MinkError::NotFound(_) => MinkError::NotFound(format!("topic {topic}")),
            other => other,
        })?;
        if !is_kafka_topic(&table) {
            return Err(MinkError::NotFound(format!(
                "topic {topic}: {path} is a table, not a topic (its columns are not key, value, headers, timestamp)"
            )));
        }
        Ok(table)
    }

    fn topic_view(&self, table: &TableInfo) -> TopicView {
        let partitions = self.meta.read(|s| {
            (0..table.descriptor.bucket_count)
                .map(|b| {
                    let bucket = TableBucket::new(table.id, None, b);
                    let state = s.buckets.get(&bucket.stream_name());
                    PartitionView {
                        partition: b as i32,
                        leader_id: state
                            .and_then(|st| st.leader.as_deref())
                            .map_or(-1, broker_id),
                        leader_epoch: state.map_or(0, |st| st.epoch.min(i32::MAX as u64) as i32),
                    }
                })
                .collect()
        });
        TopicView {
            name: table.path.table.to_string(),
            partitions,
            retention_ms: table
                .descriptor
                .properties
                .log_ttl
                .0
                .map(|d| d.as_millis() as i64),
            configs: topic_configs(table),
            table_id: Some(table.id),
        }
    }

    /// The bucket of a topic partition.
    async fn topic_bucket(&self, topic: &str, partition: i32) -> Result<TableBucket> {
        let mut table = self.topic_table(topic).await?;
        if partition as u32 >= table.descriptor.bucket_count && partition >= 0 {
            // The topic may have grown (CreatePartitions) beyond this node's view.
            self.meta.inner_catch_up().await;
            table = self.topic_table(topic).await?;
        }
        if partition < 0 || partition as u32 >= table.descriptor.bucket_count {
            return Err(MinkError::NotFound(format!(
                "partition {partition} of topic {topic} ({} partitions)",
                table.descriptor.bucket_count
            )));
        }
        Ok(TableBucket::new(table.id, None, partition as u32))
    }

    fn topic_descriptor(partitions: u32, configs: &TopicConfigs) -> Result<TableDescriptor> {
        let mut d = if configs.compacted() {
            // A compacted topic: a primary-key table keyed by the record key, its
            // partitions the buckets Kafka's default partitioner gives the keys, its
            // changelog one row per record (no before-images) kept until retention.ms
            // says otherwise (docs/kafka.md, "Compacted topics").
            let mut d = TableDescriptor::log_table(Schema::new(1, compacted_topic_columns()));
            d.primary_key = vec!["key".into()];
            d.bucket_keys = Some(vec!["key".into()]);
            d.bucketing = BucketingRule::Kafka;
            d.properties.changelog_image = ChangelogImage::Wal;
            d.properties.log_ttl = LogTtl(None);
            d
        } else {
            TableDescriptor::log_table(Schema::new(1, topic_columns()))
        };
        d.bucket_count = partitions;
        d.properties.custom = configs
            .kept
            .iter()
            .map(|(k, v)| (format!("{}{k}", topic_config::PREFIX), v.clone()))
            .collect();
        match configs.retention_ms {
            None => {}
            Some(-1) => d.properties.log_ttl = LogTtl(None),
            Some(ms) if ms > 0 => {
                d.properties.log_ttl = LogTtl(Some(Duration::from_millis(ms as u64)))
            }
            Some(ms) => {
                return Err(MinkError::invalid(
                    "retention.ms",
                    format!("{ms} is neither positive nor -1"),
                ));
            }
        }
        d.validate()?;
        Ok(d)
    }

    /// The log of a topic partition's bucket: a log table's, or a compacted topic's
    /// changelog.
    async fn topic_log(&self, bucket: TableBucket) -> Result<LogTablet> {
        match self.tablet(bucket).await? {
            Tablet::Log(l) => Ok(l),
            Tablet::Kv(k) => Ok(k.log().clone()),
        }
    }

    /// Produce to a compacted topic: the batch is a Put of its keys (see
    /// [`compacted_put`]) under Kafka's producer rules (`mink_kv::KafkaBatch`),
    /// submitted before this returns and awaited after, as appends are.
    #[allow(clippy::too_many_arguments)]
    async fn produce_compacted(
        &self,
        topic: &str,
        partition: i32,
        bucket: TableBucket,
        table: &TableInfo,
        rows: RecordBatch,
        producer: Option<ProducerBatch>,
        admitted: crate::admission::Admitted,
    ) -> Result<PendingProduce> {
        let (batch, changes) = compacted_put(topic, partition, table, &rows)?;
        let tablet = self.write_target(bucket).await?;
        let (writer_id, first_sequence, last_sequence) = match producer {
            Some(p) => (p.producer_id, p.first_sequence, p.last_sequence),
            None => (NO_WRITER, 0, 0),
        };
        let request = PutRequest {
            writer_id,
            batch_sequence: first_sequence,
            kafka: Some(mink_kv::KafkaBatch { last_sequence }),
            schema_id: table.descriptor.schema.schema_id,
            target_columns: None,
            changes,
            batch,
        };
        let log_append_time = is_log_append_time(table);
        // Submitted here, in the connection's produce turn, so that the producer's
        // batches are merged in the order it sent them; durability is awaited after.
        let submitted = match submit(bucket, &tablet, BucketWrite::Put(request), None).await {
            Ok(s) => s,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        Ok(produced(submitted, admitted, log_append_time))
    }

    /// Creates the Kafka database when it is missing.
    async fn kafka_database(&self) -> Result<()> {
        let db = &self.config.kafka.database;
        if self.meta.read(|s| s.databases.contains_key(db)) {
            return Ok(());
        }
        match self.meta.create_database(db).await {
            Ok(_) | Err(MinkError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A topic's Kafka configs, kept with its table (`mink_kafka::topic_config`).
fn topic_configs(table: &TableInfo) -> std::collections::BTreeMap<String, String> {
    table
        .descriptor
        .properties
        .custom
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(topic_config::PREFIX)?.to_string(), v.clone())))
        .collect()
}

/// Whether a topic's records carry their commit time (`message.timestamp.type`).
fn is_log_append_time(table: &TableInfo) -> bool {
    topic_config::is_log_append_time(&table.descriptor.properties.custom)
}

/// Whether a table is a topic: an unpartitioned log table with the topic columns, or
/// a compacted topic's primary-key table.
pub(crate) fn is_kafka_topic(table: &TableInfo) -> bool {
    let d = &table.descriptor;
    if d.is_partitioned() {
        return false;
    }
    if d.has_primary_key() {
        is_compacted_topic(d) && d.schema.columns == compacted_topic_columns()
    } else {
        is_topic(&d.schema.columns)
    }
}

/// Whether a table is a compacted topic's: keyed by the record key, bucketed as Kafka
/// partitions keys.
fn is_compacted_topic(d: &TableDescriptor) -> bool {
    d.primary_key == ["key"] && d.bucketing == BucketingRule::Kafka
}

/// A produced batch of a compacted topic as a Put: every record has a key of this
/// partition (INVALID_RECORD otherwise, as Kafka refuses a record without a key); a
/// record without a value (a tombstone) deletes its key, every other upserts it.
fn compacted_put(
    topic: &str,
    partition: i32,
    table: &TableInfo,
    rows: &RecordBatch,
) -> Result<(RecordBatch, Option<Vec<ChangeType>>)> {
    use arrow::array::{Array, BinaryArray};
    let column = |name: &str| {
        rows.column_by_name(name)
            .ok_or_else(|| MinkError::Internal(format!("produced rows lack {name}")))
    };
    let keys = column("key")?
        .as_any()
        .downcast_ref::<BinaryArray>()
        .ok_or_else(|| MinkError::Internal("produced keys are not BYTES".into()))?;
    let count = table.descriptor.bucket_count;
    for row in 0..rows.num_rows() {
        if keys.is_null(row) {
            return Err(MinkError::invalid(
                "record",
                format!(
                    "record {row} has no key: compacted topic {topic} keeps the latest value \
                     per key and accepts no record without one"
                ),
            ));
        }
        let belongs = mink_types::bucketing::kafka_partition(keys.value(row), count);
        if belongs as i32 != partition {
            return Err(MinkError::invalid(
                "record",
                format!(
                    "record {row}'s key belongs to partition {belongs} of compacted topic \
                     {topic}, not {partition}: each key lives in the partition Kafka's \
                     default partitioner gives it (murmur2 of the key; librdkafka: \
                     partitioner=murmur2_random)"
                ),
            ));
        }
    }
    let values = column("value")?;
    let changes = (values.null_count() > 0).then(|| {
        (0..rows.num_rows())
            .map(|i| {
                if values.is_null(i) {
                    ChangeType::Delete
                } else {
                    ChangeType::UpdateAfter
                }
            })
            .collect()
    });
    // The rows as the table keeps them: the key NOT NULL (checked above).
    let batch = RecordBatch::try_new(table.descriptor.schema.to_arrow(), rows.columns().to_vec())
        .map_err(|e| MinkError::Internal(format!("a compacted topic's rows: {e}")))?;
    Ok((batch, changes))
}

/// A compacted topic's changelog batch as Kafka records: an upsert is the record, a
/// delete a tombstone (the key without a value); a before-image (`-U`, not written
/// under the topic's `wal` image) is skipped, its offset left out.
fn compacted_fetched(
    rows: RecordBatch,
    changes: &[ChangeType],
) -> Result<(RecordBatch, Option<OffsetDeltas>)> {
    use arrow::array::{Array, BinaryArray, BooleanArray};
    if changes.len() != rows.num_rows() {
        return Err(MinkError::Internal(format!(
            "a changelog batch of {} rows with {} change types",
            rows.num_rows(),
            changes.len()
        )));
    }
    let schema = rows.schema();
    let value_at = schema
        .index_of("value")
        .map_err(|e| MinkError::Internal(format!("a compacted topic's changelog: {e}")))?;
    let mut rows = rows;
    if changes.contains(&ChangeType::Delete) {
        let values = rows
            .column(value_at)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(|| MinkError::Internal("changelog values are not BYTES".into()))?;
        let tombstones: BinaryArray = (0..values.len())
            .map(|i| {
                (changes[i] != ChangeType::Delete && values.is_valid(i)).then(|| values.value(i))
            })
            .collect();
        let mut columns = rows.columns().to_vec();
        columns[value_at] = std::sync::Arc::new(tombstones);
        rows = RecordBatch::try_new(schema.clone(), columns)
            .map_err(|e| MinkError::Internal(format!("tombstones: {e}")))?;
    }
    if !changes.contains(&ChangeType::UpdateBefore) {
        return Ok((rows, None));
    }
    let keep: BooleanArray = changes
        .iter()
        .map(|c| Some(*c != ChangeType::UpdateBefore))
        .collect();
    let deltas = changes
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != ChangeType::UpdateBefore)
        .map(|(i, _)| i as i32)
        .collect();
    let kept = arrow::compute::filter_record_batch(&rows, &keep)
        .map_err(|e| MinkError::Internal(format!("skipping before-images: {e}")))?;
    Ok((
        kept,
        Some(OffsetDeltas {
            deltas,
            last: changes.len() as i32 - 1,
        }),
    ))
}

#[async_trait]
impl KafkaHandler for NodeService {
    fn broker_id(&self) -> i32 {
        broker_id(self.meta.node_id())
    }

    fn cluster(&self) -> ClusterView {
        let (brokers, holder) = self.meta.read(|s| {
            let brokers = s
                .nodes
                .iter()
                .filter(|(_, n)| n.alive)
                .filter_map(|(id, n)| {
                    let (host, port) = host_port(&n.kafka_addr)?;
                    Some(Broker {
                        node_id: broker_id(id),
                        host,
                        port,
                    })
                })
                .collect::<Vec<_>>();
            (brokers, s.lease.holder.clone())
        });
        ClusterView {
            // The same on every node of the cluster: all share one object store.
            cluster_id: format!(
                "mink-{:08x}",
                broker_id(&self.config.object_store.url) as u32
            ),
            controller_id: holder.as_deref().map_or(-1, broker_id),
            brokers,
        }
    }

    async fn topics(&self) -> Result<Vec<TopicView>> {
        let prefix = format!("{}.", self.config.kafka.database);
        let tables: Vec<TableInfo> = self.meta.read(|s| {
            s.tables
                .values()
                .filter(|t| t.path.to_string().starts_with(&prefix))
                .filter(|t| is_kafka_topic(t))
                .cloned()
                .collect()
        });
        Ok(tables.iter().map(|t| self.topic_view(t)).collect())
    }

    async fn topic(&self, name: &str, create_partitions: Option<u32>) -> Result<TopicView> {
        match (self.topic_table(name).await, create_partitions) {
            (Ok(table), _) => Ok(self.topic_view(&table)),
            (Err(MinkError::NotFound(why)), Some(partitions)) if why == format!("topic {name}") => {
                match self
                    .create_topic(name, partitions, &TopicConfigs::default(), false)
                    .await
                {
                    Ok(()) | Err(MinkError::AlreadyExists(_)) => {}
                    Err(e) => return Err(e),
                }
                let table = self.topic_table(name).await?;
                Ok(self.topic_view(&table))
            }
            (Err(e), _) => Err(e),
        }
    }

    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        configs: &TopicConfigs,
        validate_only: bool,
    ) -> Result<()> {
        let path = self.topic_path(name)?;
        let descriptor = Self::topic_descriptor(partitions, configs)?;
        if self.meta.read(|s| s.table(&path).is_some()) {
            return Err(MinkError::AlreadyExists(format!("topic {name}")));
        }
        if validate_only {
            return Ok(());
        }
        self.kafka_database().await?;
        self.meta.create_table(&path, descriptor).await?;
        self.meta.assign_now().await;
        Ok(())
    }

    async fn alter_topic_configs(
        &self,
        topic: &str,
        table_id: Option<i64>,
        alter: &mink_kafka::topic_config::TopicAlter,
        validate_only: bool,
    ) -> Result<()> {
        let table = self.topic_table(topic).await?;
        if alter.is_empty() {
            return Ok(());
        }
        let mut set_properties = std::collections::BTreeMap::new();
        if let Some(retention) = alter.retention_ms {
            let ttl = match retention {
                // A compacted topic's changelog is kept by default (topic_descriptor).
                None if table.descriptor.has_primary_key() => LogTtl(None),
                None => mink_types::table::TableProperties::default().log_ttl,
                Some(-1) => LogTtl(None),
                Some(ms) => LogTtl(Some(Duration::from_millis(ms.max(1) as u64))),
            };
            set_properties.insert("log_ttl".to_string(), ttl.to_string());
        }
        let command = mink_meta::MetaCommand::AlterTable {
            path: table.path.clone(),
            add_columns: vec![],
            set_properties,
            set_custom: alter.custom.clone(),
            table_id,
        };
        if validate_only {
            return self.meta.read(|s| {
                use mink_wal::LogState;
                s.validate(&command)
            });
        }
        self.meta.propose(command).await?;
        Ok(())
    }

    async fn create_partitions(
        &self,
        topic: &str,
        partitions: u32,
        validate_only: bool,
    ) -> Result<()> {
        let table = self.topic_table(topic).await?;
        if validate_only {
            // The checks the metadata log makes, without the entry.
            let command = mink_meta::MetaCommand::AddBuckets {
                path: table.path.clone(),
                bucket_count: partitions,
            };
            return self.meta.read(|s| {
                use mink_wal::LogState;
                s.validate(&command)
            });
        }
        self.meta.add_buckets(&table.path, partitions).await?;
        Ok(())
    }

    async fn delete_records(&self, topic: &str, partition: i32, offset: i64) -> Result<i64> {
        let bucket = self.topic_bucket(topic, partition).await?;
        let table = self.table_by_id(bucket.table_id).await?;
        // As Kafka: a compacted topic's records are not deleted by offset (its
        // changelog expires by retention.ms; its current values stay).
        if table.descriptor.has_primary_key() {
            return Err(MinkError::LimitExceeded {
                what: format!(
                    "records deleted from compacted topic {topic} (cleanup.policy=compact: \
                     a tombstone deletes a key)"
                ),
                limit: 0,
                actual: 1,
            });
        }
        let tablet = match self.log_tablet(bucket).await {
            Ok(t) => t,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        let hw = tablet.high_watermark();
        let offset = if offset == -1 { hw } else { offset };
        if offset > hw {
            return Err(MinkError::OffsetOutOfRange {
                bucket,
                offset,
                log_start: tablet.log_start(),
                high_watermark: hw,
            });
        }
        // A lake-tiered topic's log is trimmed only behind its lake, after the grace
        // its Union reads need (the TTL duty's rule): a delete cannot honour both.
        if table.descriptor.properties.lake.enabled {
            return Err(MinkError::LimitExceeded {
                what: format!(
                    "records deleted from lake-tiered topic {topic} (its retention trims it behind the lake)"
                ),
                limit: 0,
                actual: 1,
            });
        }
        // A trim goes no further than what is compacted into segments: rows still in
        // the WAL are compacted first (every open stream's; only when needed, so a
        // request naming many partitions compacts about once).
        if offset > tablet.compacted_end() {
            self.streams()
                .compact()
                .await
                .map_err(|e| MinkError::StorageFailure(format!("compacting before a trim: {e}")))?;
        }
        tablet.trim_before(offset).await
    }

    async fn delete_topic(&self, name: &str) -> Result<()> {
        let table = self.topic_table(name).await?;
        self.meta
            .propose(mink_meta::MetaCommand::DropTable { path: table.path })
            .await?;
        Ok(())
    }

    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        rows: RecordBatch,
        producer: Option<ProducerBatch>,
        sent_bytes: usize,
    ) -> Result<PendingProduce> {
        // Held until the append resolves (see `crate::admission`). Not waited for: a
        // produce request admits its partitions one after another and holds each until
        // the response, so waiting here would hold earlier partitions' bytes while
        // waiting for more; a full node refuses at once (LEADER_NOT_AVAILABLE, which
        // producers retry after their backoff).
        let admitted = self
            .admission
            .admit_now(rows.get_array_memory_size() as u64)?;
        let bucket = self.topic_bucket(topic, partition).await?;
        let table = self.table_by_id(bucket.table_id).await?;
        // The topic's own max.message.bytes (the listener's limit was checked before).
        if let Some(max) = topic_config::max_message_bytes(&table.descriptor.properties.custom)
            .filter(|max| sent_bytes > *max)
        {
            return Err(MinkError::LimitExceeded {
                what: format!("record batch bytes (topic {topic}'s max.message.bytes)"),
                limit: max as u64,
                actual: sent_bytes as u64,
            });
        }
        if table.descriptor.has_primary_key() {
            return self
                .produce_compacted(topic, partition, bucket, &table, rows, producer, admitted)
                .await;
        }
        let log_append_time = is_log_append_time(&table);
        let tablet = self.write_target(bucket).await?;
        let (writer_id, first_sequence, last_sequence) = match producer {
            Some(p) => (p.producer_id, p.first_sequence, p.last_sequence),
            None => (NO_WRITER, 0, 0),
        };
        let request = AppendRequest {
            writer_id,
            first_sequence,
            last_sequence,
            schema_id: table.descriptor.schema.schema_id,
            change_types: None,
            batch: rows,
            ipc: None,
        };
        // An idempotent producer's first batch at this bucket must start at sequence
        // 0 (`LogTablet::submit_producer`).
        let order = if writer_id == NO_WRITER {
            Sequencing::Ordered
        } else {
            Sequencing::Producer
        };
        let write = BucketWrite::Append { request, order };
        let submitted = match submit(bucket, &tablet, write, None).await {
            Ok(s) => s,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        Ok(produced(submitted, admitted, log_append_time))
    }

    async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
        max_bytes: usize,
    ) -> Result<Fetched> {
        let bucket = self.topic_bucket(topic, partition).await?;
        let table = self.table_by_id(bucket.table_id).await?;
        let schema = table.descriptor.schema.to_arrow();
        let compacted = table.descriptor.has_primary_key();
        let tablet = self.topic_log(bucket).await?;
        let scan = tablet.tail(offset, 1, max_wait, max_bytes).await?;
        let batches = scan
            .batches
            .into_iter()
            .map(|b| {
                let rows = as_schema(b.batch, &schema)?;
                let (rows, offsets) = if compacted {
                    compacted_fetched(rows, &b.header.change_types)?
                } else {
                    (rows, None)
                };
                Ok(FetchedBatch {
                    base_offset: b.header.base_offset,
                    leader_epoch: b.header.leader_epoch.clamp(0, i32::MAX as i64) as i32,
                    commit_timestamp: b.header.commit_timestamp,
                    rows,
                    offsets,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Fetched {
            batches,
            high_watermark: scan.high_watermark,
            log_start_offset: scan.log_start,
            log_append_time: is_log_append_time(&table),
        })
    }

    async fn leader_epoch(&self, topic: &str, partition: i32) -> Result<i32> {
        let bucket = self.topic_bucket(topic, partition).await?;
        let tablet = self.topic_log(bucket).await?;
        Ok(tablet.epoch().min(i32::MAX as u64) as i32)
    }

    async fn epoch_end(
        &self,
        topic: &str,
        partition: i32,
        epoch: i32,
    ) -> Result<Option<(i32, i64)>> {
        let bucket = self.topic_bucket(topic, partition).await?;
        let tablet = self.topic_log(bucket).await?;
        if epoch < 0 {
            return Ok(None);
        }
        Ok(tablet
            .epoch_end(epoch as u64)
            .await?
            .map(|(e, end)| (e.min(i32::MAX as u64) as i32, end)))
    }

    async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        query: OffsetQuery,
    ) -> Result<ListedOffset> {
        let bucket = self.topic_bucket(topic, partition).await?;
        let tablet = self.topic_log(bucket).await?;
        let (offset, timestamp) = match query {
            OffsetQuery::Earliest => (tablet.list_offsets(OffsetSpec::Earliest).await?, -1),
            OffsetQuery::Latest => (tablet.list_offsets(OffsetSpec::Latest).await?, -1),
            // The first record stamped at or after `ts`, by the records' own
            // timestamps (a topic's tablet is indexed by them; a LogAppendTime
            // topic's by commit time, which its records carry).
            OffsetQuery::Timestamp(ts) => match tablet.offset_for_time(ts).await? {
                Some((offset, found)) => (Some(offset), found),
                None => (None, -1),
            },
        };
        Ok(ListedOffset {
            offset,
            timestamp,
            leader_epoch: tablet.epoch().min(i32::MAX as u64) as i32,
        })
    }

    async fn init_producer_id(&self) -> Result<i64> {
        self.next_writer_id().await
    }

    fn is_coordinator(&self) -> bool {
        self.meta.is_lease_holder()
    }

    async fn commit_offsets(
        &self,
        group: &str,
        offsets: Vec<CommittedOffset>,
        retention_ms: i64,
    ) -> Result<()> {
        let offsets = offsets
            .into_iter()
            .map(|o| {
                (
                    format!("{}/{}", o.topic, o.partition),
                    (o.offset, o.metadata),
                )
            })
            .collect();
        self.meta
            .commit_group_offsets(group, offsets, retention_ms)
            .await?;
        Ok(())
    }

    fn committed_offsets(&self, group: &str) -> Vec<CommittedOffset> {
        let now = now_ms();
        self.meta.read(|s| {
            s.group_offsets
                .get(group)
                .into_iter()
                .flatten()
                .filter(|(_, o)| o.expires_at_ms > now)
                .filter_map(|(key, o)| {
                    let (topic, partition) = key.rsplit_once('/')?;
                    Some(CommittedOffset {
                        topic: topic.to_string(),
                        partition: partition.parse().ok()?,
                        offset: o.offset,
                        metadata: o.metadata.clone(),
                    })
                })
                .collect()
        })
    }

    fn offset_groups(&self) -> Vec<String> {
        self.meta
            .read(|s| s.group_offsets.keys().cloned().collect())
    }

    async fn group_emptied(&self, group: &str) -> Result<()> {
        // Only the coordinator's view of a group counts, and only offsets to keep.
        if !self.meta.is_lease_holder() || !self.meta.read(|s| s.group_offsets.contains_key(group))
        {
            return Ok(());
        }
        self.meta.touch_group_offsets(group).await?;
        Ok(())
    }

    async fn delete_group_offsets(&self, group: &str) -> Result<()> {
        self.meta
            .propose(mink_meta::MetaCommand::DeleteGroup {
                group: group.to_string(),
            })
            .await?;
        Ok(())
    }
}

/// A submitted Produce's answer, once durable; `admitted` (its bytes, see
/// `crate::admission`) is held until then.
fn produced(
    submitted: Submission,
    admitted: crate::admission::Admitted,
    log_append_time: bool,
) -> PendingProduce {
    Box::pin(async move {
        let _admitted = admitted;
        let log = submitted.log().clone();
        let appended = submitted.wait().await?;
        Ok(Produced {
            base_offset: appended.first_offset,
            log_start_offset: log.log_start(),
            duplicated: appended.duplicated,
            log_append_time: log_append_time.then_some(appended.commit_timestamp),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compacted topic's changelog as records: upserts as they are, a delete as a
    /// tombstone, a before-image skipped with its offset; a batch without before-images
    /// keeps one record per offset.
    #[test]
    fn a_compacted_changelog_is_fetched_as_records_and_tombstones() {
        use arrow::array::{Array, BinaryArray, TimestampMillisecondArray};
        let schema = Schema::new(1, compacted_topic_columns()).to_arrow();
        let rows = |n: usize| {
            let keys: Vec<&[u8]> = [&b"a"[..], b"a", b"a", b"b"][..n].to_vec();
            let values: Vec<&[u8]> = [&b"1"[..], b"1", b"2", b"9"][..n].to_vec();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    std::sync::Arc::new(BinaryArray::from_iter_values(keys)),
                    std::sync::Arc::new(BinaryArray::from_iter_values(values)),
                    std::sync::Arc::new(BinaryArray::from_iter(vec![None::<&[u8]>; n])),
                    std::sync::Arc::new(
                        TimestampMillisecondArray::from(vec![1; n]).with_timezone("UTC"),
                    ),
                ],
            )
            .unwrap()
        };
        use ChangeType::{Delete, Insert, UpdateAfter, UpdateBefore};
        let (got, offsets) =
            compacted_fetched(rows(4), &[Insert, UpdateBefore, UpdateAfter, Delete]).unwrap();
        assert_eq!(
            offsets,
            Some(OffsetDeltas {
                deltas: vec![0, 2, 3],
                last: 3
            })
        );
        let values = got
            .column(1)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        let values: Vec<Option<&[u8]>> = (0..values.len())
            .map(|i| values.is_valid(i).then(|| values.value(i)))
            .collect();
        assert_eq!(values, vec![Some(&b"1"[..]), Some(b"2"), None]);
        let (same, offsets) = compacted_fetched(rows(2), &[UpdateAfter, UpdateAfter]).unwrap();
        assert_eq!((same.num_rows(), offsets), (2, None));
        assert!(compacted_fetched(rows(2), &[UpdateAfter]).is_err());
    }

    #[test]
    fn broker_ids_are_stable_and_not_negative() {
        assert_eq!(broker_id("node-1"), broker_id("node-1"));
        assert_ne!(broker_id("node-1"), broker_id("node-2"));
        for n in ["", "a", "node-1", "a-very-long-node-name-0123456789"] {
            assert!(broker_id(n) >= 0);
        }
        assert_eq!(
            host_port("127.0.0.1:9092"),
            Some(("127.0.0.1".into(), 9092))
        );
        assert_eq!(host_port("[::1]:9092"), Some(("::1".into(), 9092)));
        assert_eq!(host_port("nope"), None);
    }
}
