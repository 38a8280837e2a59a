//! What the node does for the Kafka listener: the [`KafkaHandler`] trait `mink-node`
//! implements, in Kafka's terms (topics, partitions, brokers) with rows as Arrow
//! batches of the four topic columns ([`crate::records::topic_schema`]). It knows
//! nothing of tablets or storage; the listener knows nothing of them either.

use std::time::Duration;

use arrow::array::RecordBatch;
use async_trait::async_trait;
use futures::future::BoxFuture;
use kafka_protocol::error::ResponseError;
use mink_types::MinkError;

/// A node with a Kafka listener, as clients reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

/// The brokers of the cluster and who coordinates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Stable for the life of the cluster's storage.
    pub cluster_id: String,
    /// The lease holder's broker id (-1 while nobody holds the lease).
    pub controller_id: i32,
    /// Every live node with a Kafka listener, this one included.
    pub brokers: Vec<Broker>,
}

/// One partition of a topic: a bucket and its leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    pub partition: i32,
    /// The leader's broker id, or -1 while the bucket has none.
    pub leader_id: i32,
    /// The bucket's leader epoch (never decreasing).
    pub leader_epoch: i32,
}

/// A topic: a log table of the Kafka database with the four topic columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicView {
    pub name: String,
    pub partitions: Vec<PartitionView>,
    /// The table's `log_ttl` in milliseconds; `None` keeps rows forever.
    pub retention_ms: Option<i64>,
    /// Its other configs, as created (`crate::topic_config`).
    pub configs: std::collections::BTreeMap<String, String>,
    /// The table behind it (`None` before it exists): a change computed from this
    /// view applies to that table only.
    pub table_id: Option<i64>,
}

/// An idempotent producer's batch: `producer_id` is the writer id (the producer id
/// with its epoch, `mink_types::writer_id`), then its sequence range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub producer_id: i64,
    pub first_sequence: i64,
    pub last_sequence: i64,
}

/// Where a produced batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    pub base_offset: i64,
    pub log_start_offset: i64,
    pub duplicated: bool,
    /// The commit time, for a topic whose `message.timestamp.type` is LogAppendTime.
    pub log_append_time: Option<i64>,
}

/// A produce that has its offsets and resolves once it is durable.
pub type PendingProduce = BoxFuture<'static, Result<Produced, MinkError>>;

/// Rows read from a partition.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub batches: Vec<FetchedBatch>,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// The topic's `message.timestamp.type` is LogAppendTime: batches carry their
    /// commit time.
    pub log_append_time: bool,
}

/// One batch of a partition's rows.
#[derive(Debug, Clone)]
pub struct FetchedBatch {
    /// The offset of its first row.
    pub base_offset: i64,
    /// The leader epoch it was written under, stamped on the record batch (what a
    /// client asks OffsetForLeaderEpoch about after a leader change).
    pub leader_epoch: i32,
    /// When the log committed it (ms).
    pub commit_timestamp: i64,
    pub rows: RecordBatch,
    /// Where its rows sit when not one per offset from `base_offset` (a compacted
    /// topic's changelog without its before-images).
    pub offsets: Option<crate::records::OffsetDeltas>,
}

/// Which offset ListOffsets asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetQuery {
    Earliest,
    Latest,
    /// The first offset whose timestamp is at or after this one (ms).
    Timestamp(i64),
}

/// The answer of ListOffsets for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedOffset {
    pub offset: Option<i64>,
    /// For a query by timestamp, the found record's timestamp; else -1.
    pub timestamp: i64,
    /// The bucket's leader epoch.
    pub leader_epoch: i32,
}

/// One committed offset of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub metadata: String,
}

/// What the node does for the Kafka listener.
#[async_trait]
pub trait KafkaHandler: Send + Sync + 'static {
    /// This node's broker id.
    fn broker_id(&self) -> i32;
    /// The brokers and the controller, from this node's metadata view.
    fn cluster(&self) -> ClusterView;
    /// Every topic.
    async fn topics(&self) -> Result<Vec<TopicView>, MinkError>;
    /// A topic by name, created first with `create_partitions` partitions when it does
    /// not exist and that is given. `NotFound` when it does not exist (or is a table
    /// that is not a topic); `InvalidArgument` when the name is no valid Mink name.
    async fn topic(
        &self,
        name: &str,
        create_partitions: Option<u32>,
    ) -> Result<TopicView, MinkError>;
    /// Creates a topic (`validate_only`: checks and creates nothing).
    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        configs: &crate::topic_config::TopicConfigs,
        validate_only: bool,
    ) -> Result<(), MinkError>;
    /// Deletes a topic.
    async fn delete_topic(&self, name: &str) -> Result<(), MinkError>;
    /// Changes a topic's configs (IncrementalAlterConfigs; `validate_only`: checks
    /// only), computed from a view of table `table_id`. `NotFound` for an unknown
    /// topic; `InvalidArgument` when the table refuses the change, or is no longer
    /// that table.
    async fn alter_topic_configs(
        &self,
        topic: &str,
        table_id: Option<i64>,
        alter: &crate::topic_config::TopicAlter,
        validate_only: bool,
    ) -> Result<(), MinkError>;
    /// Grows a topic to `partitions` partitions (`validate_only`: checks only);
    /// `InvalidArgument` with the reason when the table cannot grow so.
    async fn create_partitions(
        &self,
        topic: &str,
        partitions: u32,
        validate_only: bool,
    ) -> Result<(), MinkError>;
    /// Deletes the records of a partition this node leads below `offset` (-1: the
    /// high watermark) by moving its log start there (a lake-tiered topic's no
    /// further than its lake). Returns the new log start. `OffsetOutOfRange` above
    /// the high watermark.
    async fn delete_records(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<i64, MinkError>;
    /// Appends one batch of rows to a partition this node leads. Returns once the rows
    /// have their offsets (calls made one after another get ascending offsets); the
    /// returned future resolves when they are durable.
    /// `sent_bytes` is the record batch's size as sent: over the topic's
    /// `max.message.bytes` it is `LimitExceeded` (MESSAGE_TOO_LARGE).
    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        rows: RecordBatch,
        producer: Option<ProducerBatch>,
        sent_bytes: usize,
    ) -> Result<PendingProduce, MinkError>;
    /// Reads a partition this node leads from `offset`: about `max_bytes`, waiting up to
    /// `max_wait` for anything to arrive (woken by the high watermark).
    async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
        max_bytes: usize,
    ) -> Result<Fetched, MinkError>;
    /// An offset of a partition this node leads (`None` when no row is that recent),
    /// with the bucket's leader epoch.
    async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        query: OffsetQuery,
    ) -> Result<ListedOffset, MinkError>;
    /// The leader epoch of a partition this node leads (what a request's
    /// `current_leader_epoch` is checked against).
    async fn leader_epoch(&self, topic: &str, partition: i32) -> Result<i32, MinkError>;
    /// Where `epoch` ended in a partition this node leads, as OffsetForLeaderEpoch
    /// answers: the newest epoch at or below it that wrote a retained batch, and the
    /// offset where the next epoch began (the high watermark for the current one).
    /// `None` when `epoch` is newer than the leader's.
    async fn epoch_end(
        &self,
        topic: &str,
        partition: i32,
        epoch: i32,
    ) -> Result<Option<(i32, i64)>, MinkError>;
    /// A new producer id (a writer id from the shared allocator).
    async fn init_producer_id(&self) -> Result<i64, MinkError>;
    /// Whether this node coordinates consumer groups now (it holds the lease).
    fn is_coordinator(&self) -> bool;
    /// Commits a group's offsets through the metadata log, kept `retention_ms`.
    async fn commit_offsets(
        &self,
        group: &str,
        offsets: Vec<CommittedOffset>,
        retention_ms: i64,
    ) -> Result<(), MinkError>;
    /// A group's committed offsets that have not expired, from the metadata view.
    fn committed_offsets(&self, group: &str) -> Vec<CommittedOffset>;
    /// The groups that have committed offsets.
    fn offset_groups(&self) -> Vec<String>;
    /// A group's last member left: its committed offsets are kept for their retention
    /// from now (KIP-211; while it had members they did not expire).
    async fn group_emptied(&self, group: &str) -> Result<(), MinkError>;
    /// Deletes a group's committed offsets (`NotFound` when it has none).
    async fn delete_group_offsets(&self, group: &str) -> Result<(), MinkError>;
}

/// Mink's error as a Kafka error code.
pub fn error_code(err: &MinkError) -> ResponseError {
    match err {
        MinkError::NotLeader { .. } | MinkError::Fenced(_) => ResponseError::NotLeaderOrFollower,
        MinkError::Unavailable(_) => ResponseError::LeaderNotAvailable,
        MinkError::NotFound(_) => ResponseError::UnknownTopicOrPartition,
        MinkError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        MinkError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        MinkError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        // librdkafka answers it by starting over under a new producer id.
        MinkError::UnknownWriter { .. } => ResponseError::UnknownProducerId,
        MinkError::WriterFenced { .. } => ResponseError::InvalidProducerEpoch,
        MinkError::InvalidArgument { .. } | MinkError::SchemaMismatch(_) => {
            ResponseError::InvalidRequest
        }
        MinkError::LimitExceeded { .. } => ResponseError::PolicyViolation,
        MinkError::StorageFailure(_) => ResponseError::KafkaStorageError,
        MinkError::Unimplemented(_) => ResponseError::UnsupportedVersion,
        _ => ResponseError::UnknownServerError,
    }
}
