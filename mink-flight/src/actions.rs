//! The typed action protocol: every DoAction of spec/protocols.txt as one request type
//! with its wire name and its answer, in one list.
//!
//! A Flight action is a name and a JSON body. Each request type here is that body
//! (serde, the JSON docs/protocol.md shows) and implements [`ActionRequest`], which
//! names the action and its answer. [`Action`] is the tagged union the server
//! dispatches on (one `match`, one function per action), [`ACTIONS`] the name list
//! ListActions answers, and the Rust client's [`call`](crate::MinkClient::call) sends
//! any request and decodes its answer. The list is written once, in [`actions!`]; the
//! three lists that were kept in step by hand (server, client, CLI) derive from it.
//!
//! Arrow-free: the answers of `lookup` and `prefix_lookup` are Arrow IPC streams, kept
//! here as bytes ([`IpcAnswer`]), so that a crate on another Arrow major (mink-query)
//! can speak the protocol and decode the rows with its own Arrow.

use std::collections::BTreeMap;

use mink_types::{BucketId, Column, MinkError, Result, TableBucket, TableDescriptor, TablePath};
use serde::{Deserialize, Serialize};

use crate::protocol::parse_json;

/// An action's request: its body on the wire, its name and its answer.
pub trait ActionRequest: Serialize + Send + Sync {
    /// The action's name on the wire.
    const NAME: &'static str;
    /// What the action answers.
    type Answer: Answer;
}

/// An action's answer as it travels: JSON of a serde type, or the raw bytes of an
/// Arrow IPC stream ([`IpcAnswer`]).
pub trait Answer: Sized + Send {
    fn to_body(&self) -> Result<Vec<u8>>;
    fn from_body(action: &str, body: Vec<u8>) -> Result<Self>;
}

macro_rules! json_answers {
    ($($ty:ty),* $(,)?) => {
        $(impl Answer for $ty {
            fn to_body(&self) -> Result<Vec<u8>> {
                serde_json::to_vec(self).map_err(|e| MinkError::Internal(e.to_string()))
            }
            fn from_body(action: &str, body: Vec<u8>) -> Result<Self> {
                serde_json::from_slice(&body)
                    .map_err(|e| MinkError::Internal(format!("{action} answered: {e}")))
            }
        })*
    };
}

/// The rows a lookup found, as an Arrow IPC stream (decode with the Arrow of the
/// reader's choice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcAnswer(pub Vec<u8>);

impl Answer for IpcAnswer {
    fn to_body(&self) -> Result<Vec<u8>> {
        Ok(self.0.clone())
    }
    fn from_body(_: &str, body: Vec<u8>) -> Result<Self> {
        Ok(Self(body))
    }
}

// ---- answers ------------------------------------------------------------------

/// The metadata index a proposal landed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Indexed {
    pub index: u64,
}

/// Whether a database or table exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exists {
    pub exists: bool,
}

/// A created (or, with `ignore_if_exists`, existing) table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCreated {
    pub table_id: i64,
    pub index: u64,
}

/// A created partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionCreated {
    pub partition_id: i64,
    pub index: u64,
}

/// A new writer id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterId {
    pub writer_id: i64,
}

/// One bucket's offset (`None`: no row at or after the timestamp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketOffset {
    pub bucket: TableBucket,
    pub offset: Option<i64>,
}

/// Buckets moved by a `rebalance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub moved: u64,
}

/// A bucket's latest KV snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSnapshotInfo {
    pub log_offset: i64,
    pub location: String,
    pub rows: u64,
    pub bytes: u64,
    pub written_at_ms: i64,
}

/// A producer's registered offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerOffsets {
    pub offsets: Vec<ProducerOffset>,
    pub expires_at_ms: i64,
}

/// Whether a node serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `serving` or `unavailable`.
    pub status: String,
    pub problem: Option<String>,
    pub node_id: String,
    pub applied_index: u64,
}

/// One bucket of a table's `metadata`: where its leader is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketMetadata {
    pub bucket: TableBucket,
    /// The partition's name, for a partitioned table.
    pub partition: Option<String>,
    pub leader: Option<String>,
    pub leader_address: Option<String>,
    pub epoch: u64,
}

/// A table's `metadata`: the table as the node knows it (its id, path, descriptor,
/// schema versions, partitions; kept as JSON here, the catalog's own shape) and its
/// buckets with their leaders, which is how a client routes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableMetadata {
    pub table: serde_json::Value,
    pub buckets: Vec<BucketMetadata>,
}

/// A table as `get_table` answers it (the node's catalog entry). Unknown fields are
/// ignored, so that a reader keeps working when the node adds some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    pub id: mink_types::TableId,
    pub path: TablePath,
    /// The current definition; `descriptor.schema` is the newest schema.
    pub descriptor: TableDescriptor,
    /// Every schema version, oldest first.
    pub schemas: Vec<mink_types::Schema>,
    /// By name.
    pub partitions: BTreeMap<String, PartitionInfo>,
    pub created_at_ms: i64,
}

/// A partition of a partitioned table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionInfo {
    pub id: mink_types::PartitionId,
    pub name: String,
}

impl TableInfo {
    /// `get_table`'s answer, typed.
    pub fn from_answer(answer: serde_json::Value) -> Result<Self> {
        serde_json::from_value(answer)
            .map_err(|e| MinkError::Internal(format!("get_table answered: {e}")))
    }
}

json_answers!(
    Vec<BucketStat>,
    Vec<KafkaGroup>,
    Indexed,
    Exists,
    TableCreated,
    PartitionCreated,
    WriterId,
    Vec<BucketOffset>,
    Moved,
    KvSnapshotInfo,
    ProducerOffsets,
    Health,
    TableMetadata,
    Vec<String>,
    serde_json::Value,
);

// ---- requests -----------------------------------------------------------------

/// No fields (`{}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// `create_database`, `drop_database` (with `cascade`), `database_exists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseName {
    pub name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cascade: bool,
}

/// A table by path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableRef {
    pub path: TablePath,
}

/// `list_tables`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListTables {
    pub database: String,
}

/// `create_table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTable {
    pub path: TablePath,
    pub descriptor: TableDescriptor,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_if_exists: bool,
}

/// `alter_table`: columns to add, properties to set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlterTable {
    pub path: TablePath,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_columns: Vec<Column>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set_properties: BTreeMap<String, String>,
}

/// `create_partition`, `drop_partition`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionRef {
    pub path: TablePath,
    pub name: String,
}

/// `list_offsets`: `spec` is `earliest`, `latest` or `timestamp` (with `timestamp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListOffsets {
    pub path: TablePath,
    pub spec: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<BucketId>>,
    /// Set by a node forwarding the request to a bucket's leader: never forwarded again
    /// (the receiver serves it, or answers `NotLeader`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded: bool,
}

/// One bucket's offset of a producer, as clients name the bucket: table path,
/// partition name (partitioned tables only) and bucket number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerOffset {
    pub path: TablePath,
    #[serde(default)]
    pub partition: Option<String>,
    pub bucket: BucketId,
    pub offset: i64,
}

/// `register_producer_offsets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterProducerOffsets {
    pub producer_id: String,
    pub offsets: Vec<ProducerOffset>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<i64>,
}

/// `get_producer_offsets`, `delete_producer_offsets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerId {
    pub producer_id: String,
}

/// `lookup`: primary-key values, one array per key, in primary-key column order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lookup {
    pub path: TablePath,
    pub keys: Vec<Vec<serde_json::Value>>,
    /// Set by a node forwarding the request to a bucket's leader: never forwarded again
    /// (the receiver serves it, or answers `NotLeader`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded: bool,
}

/// `prefix_lookup`: bucket-key values, in bucket-key order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixLookup {
    pub path: TablePath,
    pub prefix: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Set by a node forwarding the request to a bucket's leader: never forwarded again
    /// (the receiver serves it, or answers `NotLeader`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded: bool,
}

/// A bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketRef {
    pub bucket: TableBucket,
}

/// One bucket to move in `rebalance` (an operator's reassignment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketMove {
    pub bucket: TableBucket,
    pub to: String,
}

/// `rebalance`: even out leadership, or the named `moves`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rebalance {
    /// Set by a node forwarding the request to the lease holder: not forwarded again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moves: Option<Vec<BucketMove>>,
}

/// `bucket_stats`: the offsets of the buckets this node leads, of one table or of
/// every table. With `open`, a bucket whose tablet is not open yet is opened; without,
/// it is left out (a cheap look that wakes nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketStats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<TablePath>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
}

/// `kafka_groups`: every consumer group, from the lease holder (which coordinates
/// them); any other node forwards it there, marked, as `rebalance`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaGroups {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded: bool,
}

// ---- answers of the console's actions ---------------------------------------------

/// One bucket as its leader sees it (`bucket_stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketStat {
    pub bucket: TableBucket,
    /// The leader epoch the tablet is open under.
    pub epoch: u64,
    /// The first retained offset.
    pub log_start: i64,
    /// The next offset to be written: every offset below it is acknowledged.
    pub high_watermark: i64,
    /// The bytes its log keeps on object storage (segments, and what the WAL holds
    /// uncompacted); absent from nodes that predate it.
    #[serde(default)]
    pub stored_bytes: Option<u64>,
}

/// A consumer group (`kafka_groups`): members from the coordinator's memory, offsets
/// from the metadata log, lag against each partition's high watermark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaGroup {
    pub group_id: String,
    /// Kafka's names: `Empty`, `PreparingRebalance`, `CompletingRebalance`, `Stable`.
    pub state: String,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<KafkaGroupMember>,
    pub offsets: Vec<KafkaGroupOffset>,
}

/// A member of a consumer group and what it was assigned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaGroupMember {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    /// By topic; empty until the member's first SyncGroup, or for a protocol other
    /// than `consumer`.
    pub assignment: Vec<KafkaTopicPartitions>,
}

/// Partitions of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaTopicPartitions {
    pub topic: String,
    pub partitions: Vec<i32>,
}

/// A committed offset and the partition's lag behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaGroupOffset {
    pub topic: String,
    pub partition: i32,
    pub committed: i64,
    /// `None` when the topic or partition no longer exists, or its leader did not
    /// answer.
    pub high_watermark: Option<i64>,
    /// `high_watermark - committed`, at least 0.
    pub lag: Option<i64>,
}

// ---- the list -------------------------------------------------------------------

/// Declares every action once: its variant of [`Action`], its request type and answer,
/// its wire name and its ListActions description.
macro_rules! actions {
    ($( $variant:ident($request:ty) -> $answer:ty, $name:literal, $about:literal; )*) => {
        /// Every action, as the server receives it.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Action {
            $( $variant($request), )*
        }

        /// Every action the protocol has, with a one-line description (ListActions).
        pub const ACTIONS: &[(&str, &str)] = &[ $( ($name, $about), )* ];

        $(
            impl ActionRequest for $request {
                const NAME: &'static str = $name;
                type Answer = $answer;
            }
        )*

        impl Action {
            /// Parses an action from its wire name and JSON body (an empty body is `{}`).
            pub fn parse(name: &str, body: &[u8]) -> Result<Action> {
                let body: &[u8] = if body.is_empty() { b"{}" } else { body };
                match name {
                    $( $name => Ok(Action::$variant(parse_json(concat!($name, " body"), body)?)), )*
                    other => Err(MinkError::invalid(
                        "action",
                        format!("unknown action {:?}; ListActions names every one", mink_types::names::quote(other)),
                    )),
                }
            }

            /// The action's wire name.
            pub fn name(&self) -> &'static str {
                match self {
                    $( Action::$variant(_) => $name, )*
                }
            }
        }
    };
}

/// Several actions share a request type (a table by path, say); the variants are what
/// the server matches on, the request types what the client sends.
macro_rules! shared_request {
    ($($wrapper:ident($inner:ty): $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(transparent)]
            pub struct $wrapper(pub $inner);
        )*
    };
}

shared_request! {
    CreateDatabase(DatabaseName): "`create_database`.";
    DropDatabase(DatabaseName): "`drop_database`.";
    DatabaseExists(DatabaseName): "`database_exists`.";
    ListDatabases(Empty): "`list_databases`.";
    DropTable(TableRef): "`drop_table`.";
    TableExists(TableRef): "`table_exists`.";
    GetTable(TableRef): "`get_table`.";
    ListPartitions(TableRef): "`list_partitions`.";
    CreatePartition(PartitionRef): "`create_partition`.";
    DropPartition(PartitionRef): "`drop_partition`.";
    InitWriter(Empty): "`init_writer`.";
    GetProducerOffsets(ProducerId): "`get_producer_offsets`.";
    DeleteProducerOffsets(ProducerId): "`delete_producer_offsets`.";
    LatestKvSnapshot(BucketRef): "`latest_kv_snapshot`.";
    LakeSnapshot(TableRef): "`lake_snapshot`.";
    Metadata(TableRef): "`metadata`.";
    DescribeCluster(Empty): "`describe_cluster`.";
    GetConfig(Empty): "`get_config`.";
    NodeStats(Empty): "`node_stats`.";
    HealthCheck(Empty): "`health`.";
}

actions! {
    InitWriter(InitWriter) -> WriterId, "init_writer", "Allocate an idempotent writer id";
    ListOffsets(ListOffsets) -> Vec<BucketOffset>, "list_offsets", "Earliest, latest or by-timestamp offsets of buckets";
    RegisterProducerOffsets(RegisterProducerOffsets) -> Indexed, "register_producer_offsets", "Register a producer's offsets";
    GetProducerOffsets(GetProducerOffsets) -> ProducerOffsets, "get_producer_offsets", "Read a producer's offsets";
    DeleteProducerOffsets(DeleteProducerOffsets) -> Indexed, "delete_producer_offsets", "Delete a producer's offsets";
    Lookup(Lookup) -> IpcAnswer, "lookup", "Rows by primary key";
    PrefixLookup(PrefixLookup) -> IpcAnswer, "prefix_lookup", "Rows by bucket-key prefix";
    CreateDatabase(CreateDatabase) -> Indexed, "create_database", "Create a database";
    DropDatabase(DropDatabase) -> Indexed, "drop_database", "Drop a database";
    ListDatabases(ListDatabases) -> Vec<String>, "list_databases", "List databases";
    DatabaseExists(DatabaseExists) -> Exists, "database_exists", "Whether a database exists";
    CreateTable(CreateTable) -> TableCreated, "create_table", "Create a table";
    DropTable(DropTable) -> Indexed, "drop_table", "Drop a table";
    ListTables(ListTables) -> Vec<String>, "list_tables", "List the tables of a database";
    TableExists(TableExists) -> Exists, "table_exists", "Whether a table exists";
    GetTable(GetTable) -> serde_json::Value, "get_table", "A table's definition";
    AlterTable(AlterTable) -> Indexed, "alter_table", "Add columns or change properties";
    CreatePartition(CreatePartition) -> PartitionCreated, "create_partition", "Create a partition";
    DropPartition(DropPartition) -> Indexed, "drop_partition", "Drop a partition";
    ListPartitions(ListPartitions) -> serde_json::Value, "list_partitions", "List a table's partitions";
    LatestKvSnapshot(LatestKvSnapshot) -> KvSnapshotInfo, "latest_kv_snapshot", "The latest KV snapshot of a bucket";
    LakeSnapshot(LakeSnapshot) -> serde_json::Value, "lake_snapshot", "The latest lake snapshot of a table";
    Metadata(Metadata) -> TableMetadata, "metadata", "A table's buckets and their leaders";
    DescribeCluster(DescribeCluster) -> serde_json::Value, "describe_cluster", "Nodes and the lease";
    GetConfig(GetConfig) -> serde_json::Value, "get_config", "The node's effective configuration";
    NodeStats(NodeStats) -> serde_json::Value, "node_stats", "The node's counters";
    Rebalance(Rebalance) -> Moved, "rebalance", "Even out bucket leadership, or move named buckets";
    Health(HealthCheck) -> Health, "health", "Whether the node serves";
    BucketStats(BucketStats) -> Vec<BucketStat>, "bucket_stats", "Log start and high watermark of the buckets this node leads";
    KafkaGroups(KafkaGroups) -> Vec<KafkaGroup>, "kafka_groups", "Consumer groups with members, assignments and lag";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `body` as action `name` and serializes it back: the wire JSON of
    /// docs/protocol.md round-trips unchanged.
    fn round_trip(name: &str, body: &str) {
        let action = Action::parse(name, body.as_bytes()).unwrap();
        assert_eq!(action.name(), name);
        let again = match &action {
            Action::CreateDatabase(r) => serde_json::to_value(r),
            Action::DropDatabase(r) => serde_json::to_value(r),
            Action::CreateTable(r) => serde_json::to_value(r),
            Action::ListOffsets(r) => serde_json::to_value(r),
            Action::Lookup(r) => serde_json::to_value(r),
            Action::PrefixLookup(r) => serde_json::to_value(r),
            Action::Rebalance(r) => serde_json::to_value(r),
            Action::RegisterProducerOffsets(r) => serde_json::to_value(r),
            Action::AlterTable(r) => serde_json::to_value(r),
            Action::ListTables(r) => serde_json::to_value(r),
            Action::LatestKvSnapshot(r) => serde_json::to_value(r),
            Action::CreatePartition(r) => serde_json::to_value(r),
            Action::InitWriter(r) => serde_json::to_value(r),
            Action::BucketStats(r) => serde_json::to_value(r),
            Action::KafkaGroups(r) => serde_json::to_value(r),
            other => panic!("add {} to the round trip", other.name()),
        }
        .unwrap();
        let want: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(again, want, "{name}");
    }

    #[test]
    fn the_documented_bodies_round_trip() {
        round_trip("create_database", r#"{"name": "db"}"#);
        round_trip("drop_database", r#"{"name": "db", "cascade": true}"#);
        round_trip("init_writer", "{}");
        round_trip("list_tables", r#"{"database": "db"}"#);
        round_trip("bucket_stats", r#"{"path": "db.t", "open": true}"#);
        round_trip("bucket_stats", "{}");
        round_trip("kafka_groups", "{}");
        round_trip(
            "list_offsets",
            r#"{"path": "db.t", "spec": "timestamp", "timestamp": 1700000000000, "buckets": [0, 2]}"#,
        );
        round_trip("lookup", r#"{"path": "db.users", "keys": [[1], [2]]}"#);
        round_trip(
            "prefix_lookup",
            r#"{"path": "db.users", "prefix": ["eu"], "limit": 10}"#,
        );
        round_trip(
            "rebalance",
            r#"{"moves": [{"bucket": {"table_id": 1, "partition_id": null, "bucket": 0}, "to": "n2"}]}"#,
        );
        round_trip(
            "register_producer_offsets",
            r#"{"producer_id": "p", "offsets": [{"path": "db.t", "partition": null, "bucket": 0, "offset": 5}]}"#,
        );
        round_trip(
            "alter_table",
            r#"{"path": "db.t", "set_properties": {"log_ttl": "1d"}}"#,
        );
        round_trip(
            "latest_kv_snapshot",
            r#"{"bucket": {"table_id": 1, "partition_id": null, "bucket": 0}}"#,
        );
        round_trip(
            "create_partition",
            r#"{"path": "db.t", "name": "2026-01-01"}"#,
        );
    }

    #[test]
    fn an_empty_body_is_an_empty_object_and_bad_bodies_say_why() {
        assert_eq!(Action::parse("health", b"").unwrap().name(), "health");
        let err = Action::parse("create_database", b"{\"nam\": 1}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("create_database body"), "{err}");
        assert!(!err.contains("malformed JSON"), "{err}");
        let err = Action::parse("make_coffee", b"{}").unwrap_err().to_string();
        assert!(err.contains("unknown action"), "{err}");
    }

    #[test]
    fn every_action_is_listed_once() {
        let mut names: Vec<&str> = ACTIONS.iter().map(|(n, _)| *n).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a name listed twice");
        assert_eq!(count, 30);
        assert_eq!(<CreateTable as ActionRequest>::NAME, "create_table");
    }
}
