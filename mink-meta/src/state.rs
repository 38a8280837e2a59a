//! The metadata state machine: every node applies the same commands in the same order
//! and reaches the same state. Commands are validated against the state before they
//! are appended ([`LogState::validate`]), so the log holds no invalid entry, and
//! applying one never fails.

use std::collections::{BTreeMap, BTreeSet};

use mink_types::{
    Column, MinkError, PartitionId, Result, Schema, SchemaId, TableBucket, TableDescriptor,
    TableId, TablePath, validate_name,
};
use mink_wal::LogState;
use serde::{Deserialize, Serialize};

/// Writer ids handed out in one allocation, at most.
pub const WRITER_ID_BLOCK_MAX: u64 = 100_000;
/// Partitions one table may have.
pub const PARTITIONS_MAX: usize = 10_000;

/// A registered node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub flight_addr: String,
    pub kafka_addr: String,
    /// Grows with every restart; each incarnation writes its own WAL generation.
    pub incarnation: u64,
    /// False once the lease holder declared it dead; true again when it registers.
    pub alive: bool,
}

/// The lease: who coordinates the cluster, under which term.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// Grows by one with every acquisition.
    pub term: u64,
    pub holder: Option<String>,
}

/// A partition of a partitioned table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionInfo {
    pub id: PartitionId,
    pub name: String,
}

/// A table as the catalog knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    pub id: TableId,
    pub path: TablePath,
    /// The current definition; `descriptor.schema` is the newest schema.
    pub descriptor: TableDescriptor,
    /// Every schema version, oldest first.
    pub schemas: Vec<Schema>,
    pub partitions: BTreeMap<String, PartitionInfo>,
    pub created_at_ms: i64,
}

impl TableInfo {
    pub fn schema(&self, id: SchemaId) -> Option<&Schema> {
        self.schemas.iter().find(|s| s.schema_id == id)
    }
}

/// Who leads a bucket, under which epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketState {
    pub bucket: TableBucket,
    pub leader: Option<String>,
    /// Grows with every change of leader (and every restart of the leader).
    pub epoch: u64,
}

/// One committed Kafka group offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupOffset {
    pub offset: i64,
    pub metadata: String,
    pub committed_at_ms: i64,
    pub expires_at_ms: i64,
    /// How long the offset is kept once its group has no members (KIP-211); 0 in
    /// entries written before it was kept, which count it from the commit.
    #[serde(default)]
    pub retention_ms: i64,
}

impl GroupOffset {
    fn retention(&self) -> i64 {
        if self.retention_ms > 0 {
            self.retention_ms
        } else {
            self.expires_at_ms.saturating_sub(self.committed_at_ms)
        }
    }
}

/// Offsets a producer registered (exactly-once sinks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerOffsets {
    /// By bucket (`TableBucket::stream_name`).
    pub offsets: BTreeMap<String, i64>,
    pub expires_at_ms: i64,
}

/// Where a bucket's latest KV snapshot is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSnapshotPointer {
    pub snapshot_id: u64,
    /// The log offset the snapshot covers (replay starts here).
    pub log_offset: i64,
    pub location: String,
    /// When the snapshot was written (ms). Absent in pointers recorded before it was
    /// kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_at_ms: Option<i64>,
    /// The snapshot's size on the object store. Absent in pointers recorded before it
    /// was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// Where a table's latest lake snapshot is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LakeSnapshotPointer {
    pub snapshot_id: i64,
    /// The metadata file (`.../v{N}.metadata.json`) holding the snapshot.
    pub location: String,
    /// Log offsets tiered, by bucket: the lake holds each bucket's rows below its offset.
    pub log_offsets: BTreeMap<String, i64>,
    /// `N` of the metadata file: pointers only move forward.
    #[serde(default)]
    pub version: u64,
    /// When the snapshot was committed.
    #[serde(default)]
    pub timestamp_ms: i64,
}

/// Every command of the metadata log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaCommand {
    /// A node starts (a new incarnation): buckets it led get new epochs.
    RegisterNode {
        node: String,
        flight_addr: String,
        kafka_addr: String,
        incarnation: u64,
    },
    /// Take the lease under `term` (the current term + 1).
    AcquireLease {
        node: String,
        term: u64,
    },
    /// Give the lease up (clean shutdown).
    ReleaseLease {
        node: String,
        term: u64,
    },
    /// The lease holder declares a node dead.
    NodeDown {
        term: u64,
        node: String,
    },
    CreateDatabase {
        name: String,
    },
    DropDatabase {
        name: String,
        cascade: bool,
    },
    CreateTable {
        path: TablePath,
        descriptor: TableDescriptor,
        at_ms: i64,
    },
    AlterTable {
        path: TablePath,
        add_columns: Vec<Column>,
        set_properties: BTreeMap<String, String>,
        /// Custom properties set (`Some`) or removed (`None`): a Kafka topic's
        /// configs altered by IncrementalAlterConfigs.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        set_custom: BTreeMap<String, Option<String>>,
        /// The table the change was computed for, when it was computed from a view
        /// of it (IncrementalAlterConfigs checks a topic's configs first): a table
        /// dropped and created again under the same path meanwhile refuses it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        table_id: Option<TableId>,
    },
    DropTable {
        path: TablePath,
    },
    /// More buckets for an unpartitioned log table that spreads its rows round-robin
    /// (no bucket keys: a Kafka topic's partitions, which producers choose): buckets
    /// `old..bucket_count` are added, without leaders until the holder assigns them.
    AddBuckets {
        path: TablePath,
        bucket_count: u32,
    },
    /// Creating a partition that exists is a no-op, so two nodes creating one on
    /// demand both succeed.
    CreatePartition {
        path: TablePath,
        name: String,
    },
    DropPartition {
        path: TablePath,
        name: String,
    },
    /// The lease holder moves buckets: each named bucket gets `leader`, epoch + 1.
    AssignBuckets {
        term: u64,
        assignments: Vec<(String, String)>,
    },
    /// Hands `count` writer ids to `node`.
    AllocateWriterIds {
        node: String,
        count: u64,
    },
    RegisterProducerOffsets {
        producer_id: String,
        offsets: BTreeMap<String, i64>,
        at_ms: i64,
        ttl_ms: i64,
    },
    DeleteProducerOffsets {
        producer_id: String,
    },
    CommitGroupOffsets {
        group: String,
        /// `topic/partition` → offset, metadata.
        offsets: BTreeMap<String, (i64, String)>,
        at_ms: i64,
        retention_ms: i64,
    },
    DeleteGroup {
        group: String,
    },
    /// A group's last member left at `at_ms`: its offsets are kept for their
    /// retention from then (KIP-211), not from their commits.
    TouchGroupOffsets {
        group: String,
        at_ms: i64,
    },
    /// The lease holder drops group and producer offsets that expired by `now_ms`.
    /// The offsets of `live_groups` (groups with members on the coordinator) never
    /// expire: those due are kept for their retention from `now_ms` (KIP-211).
    ExpireOffsets {
        term: u64,
        now_ms: i64,
        #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
        live_groups: BTreeSet<String>,
    },
    SetKvSnapshot {
        bucket: String,
        pointer: KvSnapshotPointer,
    },
    SetLakeSnapshot {
        table_id: TableId,
        pointer: LakeSnapshotPointer,
    },
    /// Several commands of one node in one entry (group commit): valid only if each is
    /// valid after the ones before it; applied in order, all at the entry's index.
    Batch {
        commands: Vec<MetaCommand>,
    },
}

/// The most commands one `Batch` entry carries.
pub const BATCH_COMMANDS_MAX: usize = 512;

/// The whole cluster metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    pub nodes: BTreeMap<String, NodeInfo>,
    pub lease: LeaseState,
    pub databases: BTreeMap<String, i64>,
    pub tables: BTreeMap<TableId, TableInfo>,
    /// `db.table` → id.
    pub table_ids: BTreeMap<String, TableId>,
    /// By `TableBucket::stream_name`.
    pub buckets: BTreeMap<String, BucketState>,
    pub next_table_id: TableId,
    pub next_partition_id: PartitionId,
    pub next_writer_id: i64,
    /// The last block of writer ids each node got: `[start, start + count)`.
    pub writer_blocks: BTreeMap<String, (i64, u64)>,
    pub producer_offsets: BTreeMap<String, ProducerOffsets>,
    pub group_offsets: BTreeMap<String, BTreeMap<String, GroupOffset>>,
    pub kv_snapshots: BTreeMap<String, KvSnapshotPointer>,
    pub lake_snapshots: BTreeMap<TableId, LakeSnapshotPointer>,
}

fn not_found(what: impl Into<String>) -> MinkError {
    MinkError::NotFound(what.into())
}

impl MetaState {
    /// Whether `ExpireOffsets` at `now_ms` would change anything (the holder proposes
    /// it only then: an entry that changes nothing still costs requests on every node).
    /// A due offset of a live group counts: its expiry moves.
    pub fn has_expired_offsets(&self, now_ms: i64) -> bool {
        self.group_offsets
            .values()
            .flat_map(|g| g.values())
            .any(|o| o.expires_at_ms <= now_ms)
            || self
                .producer_offsets
                .values()
                .any(|p| p.expires_at_ms <= now_ms)
    }

    pub fn table(&self, path: &TablePath) -> Option<&TableInfo> {
        self.table_ids
            .get(&path.to_string())
            .and_then(|id| self.tables.get(id))
    }

    fn table_or_err(&self, path: &TablePath) -> Result<&TableInfo> {
        self.table(path)
            .ok_or_else(|| not_found(format!("table {path}")))
    }

    fn check_term(&self, term: u64) -> Result<()> {
        if term != self.lease.term || self.lease.holder.is_none() {
            return Err(MinkError::Fenced(format!(
                "lease term {term} is not the current term {}",
                self.lease.term
            )));
        }
        Ok(())
    }

    /// The buckets of a table (of one partition, or of the unpartitioned table).
    pub fn buckets_of(&self, table: TableId, partition: Option<PartitionId>) -> Vec<&BucketState> {
        self.buckets
            .values()
            .filter(|b| b.bucket.table_id == table && b.bucket.partition_id == partition)
            .collect()
    }

    /// Buckets `numbers` of a table (or of one partition), without leaders yet.
    fn add_buckets(
        &mut self,
        table: TableId,
        partition: Option<PartitionId>,
        numbers: std::ops::Range<u32>,
    ) {
        for b in numbers {
            let bucket = TableBucket::new(table, partition, b);
            self.buckets.insert(
                bucket.stream_name(),
                BucketState {
                    bucket,
                    leader: None,
                    epoch: 0,
                },
            );
        }
    }

    /// Removes a table's buckets (all, or one partition's) and their KV snapshot
    /// pointers.
    fn remove_buckets(&mut self, table: TableId, partition: Option<PartitionId>) {
        self.buckets.retain(|_, b| {
            b.bucket.table_id != table
                || (partition.is_some() && b.bucket.partition_id != partition)
        });
        let buckets = &self.buckets;
        self.kv_snapshots.retain(|k, _| buckets.contains_key(k));
    }
}

impl LogState for MetaState {
    type Entry = MetaCommand;
    type Rejection = MinkError;

    #[expect(
        clippy::too_many_lines,
        reason = "one arm per metadata command: the state machine's validation reads as one table"
    )]
    fn validate(&self, command: &MetaCommand) -> Result<()> {
        match command {
            MetaCommand::Batch { commands } => {
                if commands.is_empty() || commands.len() > BATCH_COMMANDS_MAX {
                    return Err(MinkError::invalid(
                        "batch",
                        format!(
                            "{} commands; 1..={BATCH_COMMANDS_MAX} go in one",
                            commands.len()
                        ),
                    ));
                }
                let mut scratch = self.clone();
                for (i, c) in commands.iter().enumerate() {
                    if matches!(c, MetaCommand::Batch { .. }) {
                        return Err(MinkError::invalid(
                            format!("batch[{i}]"),
                            "a batch in a batch",
                        ));
                    }
                    scratch.validate(c)?;
                    scratch.apply(0, c);
                }
                Ok(())
            }
            MetaCommand::RegisterNode {
                node,
                flight_addr,
                incarnation,
                ..
            } => {
                validate_name("node id", node)?;
                if flight_addr.is_empty() {
                    return Err(MinkError::invalid("flight_addr", "must not be empty"));
                }
                if let Some(existing) = self.nodes.get(node)
                    && *incarnation <= existing.incarnation
                {
                    return Err(MinkError::invalid(
                        "incarnation",
                        format!(
                            "node {node} is at incarnation {}; {incarnation} is not newer",
                            existing.incarnation
                        ),
                    ));
                }
                Ok(())
            }
            MetaCommand::AcquireLease { node, term } => {
                if !self.nodes.get(node).is_some_and(|n| n.alive) {
                    return Err(not_found(format!("live node {node}")));
                }
                if *term != self.lease.term + 1 {
                    return Err(MinkError::Fenced(format!(
                        "lease term {term} does not follow the current term {}",
                        self.lease.term
                    )));
                }
                Ok(())
            }
            MetaCommand::ReleaseLease { node, term } | MetaCommand::NodeDown { term, node } => {
                self.check_term(*term)?;
                if matches!(command, MetaCommand::ReleaseLease { .. })
                    && self.lease.holder.as_ref() != Some(node)
                {
                    return Err(MinkError::Fenced(format!("{node} does not hold the lease")));
                }
                if !self.nodes.contains_key(node) {
                    return Err(not_found(format!("node {node}")));
                }
                Ok(())
            }
            MetaCommand::CreateDatabase { name } => {
                validate_name("database name", name)?;
                if self.databases.contains_key(name) {
                    return Err(MinkError::AlreadyExists(format!("database {name}")));
                }
                Ok(())
            }
            MetaCommand::DropDatabase { name, cascade } => {
                if !self.databases.contains_key(name) {
                    return Err(not_found(format!("database {name}")));
                }
                let prefix = format!("{name}.");
                if !cascade && self.table_ids.keys().any(|p| p.starts_with(&prefix)) {
                    return Err(MinkError::invalid(
                        "database",
                        format!("database {name} is not empty; drop its tables or use cascade"),
                    ));
                }
                Ok(())
            }
            MetaCommand::CreateTable {
                path, descriptor, ..
            } => {
                if !self.databases.contains_key(path.database.as_str()) {
                    return Err(not_found(format!("database {}", path.database)));
                }
                if self.table(path).is_some() {
                    return Err(MinkError::AlreadyExists(format!("table {path}")));
                }
                descriptor.validate()?;
                if descriptor.schema.schema_id != 1 {
                    return Err(MinkError::invalid(
                        "schema.schema_id",
                        "a new table starts at schema 1",
                    ));
                }
                Ok(())
            }
            MetaCommand::AlterTable {
                path,
                add_columns,
                set_properties,
                set_custom,
                table_id,
            } => {
                let table = self.table_or_err(path)?;
                if let Some(id) = table_id
                    && *id != table.id
                {
                    return Err(MinkError::invalid(
                        "alter_table",
                        format!(
                            "table {path} was dropped and created again since the change was \
                             computed (table {id}, now {}): look again",
                            table.id
                        ),
                    ));
                }
                if add_columns.is_empty() && set_properties.is_empty() && set_custom.is_empty() {
                    return Err(MinkError::invalid("alter_table", "nothing to change"));
                }
                let mut next = table.descriptor.clone();
                if !add_columns.is_empty() {
                    next.schema = next.schema.with_added_columns(add_columns)?;
                }
                for (k, v) in set_properties {
                    next.properties.set(k, v)?;
                }
                if next.properties.lake.partition != table.descriptor.properties.lake.partition {
                    return Err(MinkError::invalid(
                        "properties.lake.partition",
                        "is set when the table is created: the lake's partition spec and the \
                         files already written under it would disagree",
                    ));
                }
                set_custom_properties(&mut next.properties.custom, set_custom);
                next.validate()
            }
            MetaCommand::DropTable { path } => self.table_or_err(path).map(|_| ()),
            MetaCommand::AddBuckets { path, bucket_count } => {
                let d = &self.table_or_err(path)?.descriptor;
                let why = if d.has_primary_key() {
                    Some("a primary-key table's keys are hashed over its buckets".to_string())
                } else if d.is_partitioned() {
                    Some("a partitioned table's buckets are per partition".to_string())
                } else if d.bucket_keys.as_ref().is_some_and(|k| !k.is_empty()) {
                    Some("its rows are hashed over its buckets by bucket keys".to_string())
                } else if *bucket_count <= d.bucket_count {
                    Some(format!(
                        "it has {} buckets; give more than that",
                        d.bucket_count
                    ))
                } else if *bucket_count > mink_types::table::BUCKET_COUNT_MAX {
                    Some(format!(
                        "{bucket_count} buckets; at most {}",
                        mink_types::table::BUCKET_COUNT_MAX
                    ))
                } else {
                    None
                };
                match why {
                    Some(why) => Err(MinkError::invalid(
                        "bucket_count",
                        format!("{path} cannot have {bucket_count} buckets: {why}"),
                    )),
                    None => Ok(()),
                }
            }
            MetaCommand::CreatePartition { path, name } => {
                let table = self.table_or_err(path)?;
                if !table.descriptor.is_partitioned() {
                    return Err(MinkError::invalid(
                        "partition",
                        format!("table {path} is not partitioned"),
                    ));
                }
                validate_name("partition name", name)?;
                if !table.partitions.contains_key(name) && table.partitions.len() >= PARTITIONS_MAX
                {
                    return Err(MinkError::LimitExceeded {
                        what: format!("partitions of {path}"),
                        limit: PARTITIONS_MAX as u64,
                        actual: table.partitions.len() as u64 + 1,
                    });
                }
                Ok(())
            }
            MetaCommand::DropPartition { path, name } => {
                let table = self.table_or_err(path)?;
                if !table.partitions.contains_key(name) {
                    return Err(not_found(format!("partition {name} of {path}")));
                }
                Ok(())
            }
            MetaCommand::AssignBuckets { term, assignments } => {
                self.check_term(*term)?;
                for (bucket, node) in assignments {
                    if !self.buckets.contains_key(bucket) {
                        return Err(not_found(format!("bucket {bucket}")));
                    }
                    if !self.nodes.get(node).is_some_and(|n| n.alive) {
                        return Err(not_found(format!("live node {node}")));
                    }
                }
                Ok(())
            }
            MetaCommand::AllocateWriterIds { node, count } => {
                if !self.nodes.contains_key(node) {
                    return Err(not_found(format!("node {node}")));
                }
                if *count == 0 || *count > WRITER_ID_BLOCK_MAX {
                    return Err(MinkError::invalid(
                        "count",
                        format!("must be within 1..={WRITER_ID_BLOCK_MAX}"),
                    ));
                }
                Ok(())
            }
            MetaCommand::RegisterProducerOffsets {
                producer_id,
                offsets,
                ttl_ms,
                ..
            } => {
                if producer_id.is_empty() || producer_id.len() > 256 {
                    return Err(MinkError::invalid("producer_id", "must be 1 to 256 bytes"));
                }
                if *ttl_ms <= 0 {
                    return Err(MinkError::invalid("ttl_ms", "must be positive"));
                }
                for bucket in offsets.keys() {
                    if !self.buckets.contains_key(bucket) {
                        return Err(not_found(format!("bucket {bucket}")));
                    }
                }
                Ok(())
            }
            MetaCommand::DeleteProducerOffsets { producer_id } => {
                if !self.producer_offsets.contains_key(producer_id) {
                    return Err(not_found(format!("producer offsets of {producer_id}")));
                }
                Ok(())
            }
            MetaCommand::CommitGroupOffsets {
                group,
                retention_ms,
                ..
            } => {
                if group.is_empty() || group.len() > 256 {
                    return Err(MinkError::invalid("group", "must be 1 to 256 bytes"));
                }
                if *retention_ms <= 0 {
                    return Err(MinkError::invalid("retention_ms", "must be positive"));
                }
                Ok(())
            }
            MetaCommand::DeleteGroup { group } => {
                if !self.group_offsets.contains_key(group) {
                    return Err(not_found(format!("group {group}")));
                }
                Ok(())
            }
            // A group whose offsets expired meanwhile: nothing to keep, no error.
            MetaCommand::TouchGroupOffsets { .. } => Ok(()),
            MetaCommand::ExpireOffsets { term, .. } => self.check_term(*term),
            MetaCommand::SetKvSnapshot { bucket, pointer } => {
                if !self.buckets.contains_key(bucket) {
                    return Err(not_found(format!("bucket {bucket}")));
                }
                if self
                    .kv_snapshots
                    .get(bucket)
                    .is_some_and(|p| p.snapshot_id >= pointer.snapshot_id)
                {
                    return Err(MinkError::invalid("snapshot_id", "snapshot ids only grow"));
                }
                Ok(())
            }
            MetaCommand::SetLakeSnapshot { table_id, pointer } => {
                if !self.tables.contains_key(table_id) {
                    return Err(not_found(format!("table id {table_id}")));
                }
                if self
                    .lake_snapshots
                    .get(table_id)
                    .is_some_and(|p| p.version >= pointer.version)
                {
                    return Err(MinkError::invalid(
                        "version",
                        "lake snapshot pointers only move forward",
                    ));
                }
                Ok(())
            }
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one arm per metadata command: the state machine's apply reads as one table"
    )]
    fn apply(&mut self, index: u64, command: &MetaCommand) {
        match command {
            MetaCommand::RegisterNode {
                node,
                flight_addr,
                kafka_addr,
                incarnation,
            } => {
                self.nodes.insert(
                    node.clone(),
                    NodeInfo {
                        flight_addr: flight_addr.clone(),
                        kafka_addr: kafka_addr.clone(),
                        incarnation: *incarnation,
                        alive: true,
                    },
                );
                // A new incarnation never reuses an epoch of the previous one.
                for b in self.buckets.values_mut() {
                    if b.leader.as_ref() == Some(node) {
                        b.epoch += 1;
                    }
                }
            }
            MetaCommand::AcquireLease { node, term } => {
                self.lease = LeaseState {
                    term: *term,
                    holder: Some(node.clone()),
                };
            }
            MetaCommand::ReleaseLease { .. } => self.lease.holder = None,
            MetaCommand::NodeDown { node, .. } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.alive = false;
                }
                if self.lease.holder.as_ref() == Some(node) {
                    self.lease.holder = None;
                }
            }
            MetaCommand::CreateDatabase { name } => {
                self.databases.insert(name.clone(), index as i64);
            }
            MetaCommand::DropDatabase { name, .. } => {
                self.databases.remove(name);
                let prefix = format!("{name}.");
                let doomed: Vec<TableId> = self
                    .table_ids
                    .iter()
                    .filter(|(p, _)| p.starts_with(&prefix))
                    .map(|(_, id)| *id)
                    .collect();
                for id in doomed {
                    if let Some(t) = self.tables.remove(&id) {
                        self.table_ids.remove(&t.path.to_string());
                    }
                    self.remove_buckets(id, None);
                }
            }
            MetaCommand::CreateTable {
                path,
                descriptor,
                at_ms,
            } => {
                self.next_table_id += 1;
                let id = self.next_table_id;
                let mut descriptor = descriptor.clone();
                if descriptor.bucket_keys.is_none() && descriptor.has_primary_key() {
                    descriptor.bucket_keys = Some(descriptor.bucket_keys());
                }
                self.table_ids.insert(path.to_string(), id);
                if !descriptor.is_partitioned() {
                    self.add_buckets(id, None, 0..descriptor.bucket_count);
                }
                self.tables.insert(
                    id,
                    TableInfo {
                        id,
                        path: path.clone(),
                        schemas: vec![descriptor.schema.clone()],
                        descriptor,
                        partitions: BTreeMap::new(),
                        created_at_ms: *at_ms,
                    },
                );
            }
            MetaCommand::AlterTable {
                path,
                add_columns,
                set_properties,
                set_custom,
                table_id,
            } => {
                let Some(id) = self.table_ids.get(&path.to_string()).copied() else {
                    return;
                };
                if table_id.is_some_and(|expected| expected != id) {
                    return;
                }
                if let Some(t) = self.tables.get_mut(&id) {
                    if !add_columns.is_empty()
                        && let Ok(next) = t.descriptor.schema.with_added_columns(add_columns)
                    {
                        t.descriptor.schema = next.clone();
                        t.schemas.push(next);
                    }
                    for (k, v) in set_properties {
                        let _ = t.descriptor.properties.set(k, v);
                    }
                    set_custom_properties(&mut t.descriptor.properties.custom, set_custom);
                }
            }
            MetaCommand::AddBuckets { path, bucket_count } => {
                let Some(id) = self.table_ids.get(&path.to_string()).copied() else {
                    return;
                };
                let Some(old) = self.tables.get(&id).map(|t| t.descriptor.bucket_count) else {
                    return;
                };
                self.add_buckets(id, None, old..*bucket_count);
                if let Some(t) = self.tables.get_mut(&id) {
                    t.descriptor.bucket_count = *bucket_count;
                }
            }
            MetaCommand::DropTable { path } => {
                if let Some(id) = self.table_ids.remove(&path.to_string()) {
                    self.tables.remove(&id);
                    self.lake_snapshots.remove(&id);
                    self.remove_buckets(id, None);
                }
            }
            MetaCommand::CreatePartition { path, name } => {
                let Some(id) = self.table_ids.get(&path.to_string()).copied() else {
                    return;
                };
                let exists = self
                    .tables
                    .get(&id)
                    .is_some_and(|t| t.partitions.contains_key(name));
                if exists {
                    return;
                }
                self.next_partition_id += 1;
                let pid = self.next_partition_id;
                let mut count = 0;
                if let Some(t) = self.tables.get_mut(&id) {
                    t.partitions.insert(
                        name.clone(),
                        PartitionInfo {
                            id: pid,
                            name: name.clone(),
                        },
                    );
                    count = t.descriptor.bucket_count;
                }
                self.add_buckets(id, Some(pid), 0..count);
            }
            MetaCommand::DropPartition { path, name } => {
                let Some(id) = self.table_ids.get(&path.to_string()).copied() else {
                    return;
                };
                let removed = self
                    .tables
                    .get_mut(&id)
                    .and_then(|t| t.partitions.remove(name));
                if let Some(p) = removed {
                    self.remove_buckets(id, Some(p.id));
                }
            }
            MetaCommand::AssignBuckets { assignments, .. } => {
                for (bucket, node) in assignments {
                    if let Some(b) = self.buckets.get_mut(bucket) {
                        b.leader = Some(node.clone());
                        b.epoch += 1;
                    }
                }
            }
            MetaCommand::AllocateWriterIds { node, count } => {
                let start = self.next_writer_id;
                self.next_writer_id += *count as i64;
                self.writer_blocks.insert(node.clone(), (start, *count));
            }
            MetaCommand::RegisterProducerOffsets {
                producer_id,
                offsets,
                at_ms,
                ttl_ms,
            } => {
                self.producer_offsets.insert(
                    producer_id.clone(),
                    ProducerOffsets {
                        offsets: offsets.clone(),
                        expires_at_ms: at_ms.saturating_add(*ttl_ms),
                    },
                );
            }
            MetaCommand::DeleteProducerOffsets { producer_id } => {
                self.producer_offsets.remove(producer_id);
            }
            MetaCommand::CommitGroupOffsets {
                group,
                offsets,
                at_ms,
                retention_ms,
            } => {
                let entry = self.group_offsets.entry(group.clone()).or_default();
                for (key, (offset, metadata)) in offsets {
                    entry.insert(
                        key.clone(),
                        GroupOffset {
                            offset: *offset,
                            metadata: metadata.clone(),
                            committed_at_ms: *at_ms,
                            expires_at_ms: at_ms.saturating_add(*retention_ms),
                            retention_ms: *retention_ms,
                        },
                    );
                }
            }
            MetaCommand::DeleteGroup { group } => {
                self.group_offsets.remove(group);
            }
            MetaCommand::TouchGroupOffsets { group, at_ms } => {
                for o in self.group_offsets.get_mut(group).into_iter().flatten() {
                    let o = o.1;
                    // Fixed before the expiry moves (old entries derive it from both).
                    o.retention_ms = o.retention();
                    o.expires_at_ms = o.expires_at_ms.max(at_ms.saturating_add(o.retention_ms));
                }
            }
            MetaCommand::ExpireOffsets {
                now_ms,
                live_groups,
                ..
            } => {
                for (group, offsets) in self.group_offsets.iter_mut() {
                    if live_groups.contains(group) {
                        for o in offsets.values_mut() {
                            if o.expires_at_ms <= *now_ms {
                                o.retention_ms = o.retention();
                                o.expires_at_ms = now_ms.saturating_add(o.retention_ms);
                            }
                        }
                        continue;
                    }
                    offsets.retain(|_, o| o.expires_at_ms > *now_ms);
                }
                self.group_offsets.retain(|_, o| !o.is_empty());
                self.producer_offsets
                    .retain(|_, p| p.expires_at_ms > *now_ms);
            }
            MetaCommand::SetKvSnapshot { bucket, pointer } => {
                self.kv_snapshots.insert(bucket.clone(), pointer.clone());
            }
            MetaCommand::SetLakeSnapshot { table_id, pointer } => {
                self.lake_snapshots.insert(*table_id, pointer.clone());
            }
            MetaCommand::Batch { commands } => {
                for c in commands {
                    self.apply(index, c);
                }
            }
        }
    }
}

/// Sets (`Some`) or removes (`None`) custom table properties.
fn set_custom_properties(
    custom: &mut BTreeMap<String, String>,
    changes: &BTreeMap<String, Option<String>>,
) {
    for (k, v) in changes {
        match v {
            Some(v) => {
                custom.insert(k.clone(), v.clone());
            }
            None => {
                custom.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mink_wal::objectlog::LogState;

    use super::*;

    const DAY: i64 = 24 * 3600 * 1000;

    fn commit(state: &mut MetaState, group: &str, at_ms: i64) {
        let offsets = BTreeMap::from([("t/0".to_string(), (7, String::new()))]);
        state.apply(
            1,
            &MetaCommand::CommitGroupOffsets {
                group: group.into(),
                offsets,
                at_ms,
                retention_ms: 7 * DAY,
            },
        );
    }

    fn expire(state: &mut MetaState, now_ms: i64, live: &[&str]) {
        let command = MetaCommand::ExpireOffsets {
            term: 0,
            now_ms,
            live_groups: live.iter().map(|g| g.to_string()).collect(),
        };
        if state.has_expired_offsets(now_ms) {
            state.apply(2, &command);
        }
    }

    /// KIP-211: a group's offsets never expire while it has members, and their
    /// retention counts from the moment it became empty.
    #[test]
    fn offsets_of_a_group_with_members_are_kept_and_expire_after_it_empties() {
        let mut s = MetaState::default();
        commit(&mut s, "quiet", 0);
        commit(&mut s, "gone", 0);
        // Day 7: both due; "quiet" still has members, "gone" has none.
        expire(&mut s, 7 * DAY, &["quiet"]);
        assert!(s.group_offsets.contains_key("quiet"));
        assert!(!s.group_offsets.contains_key("gone"));
        // Its expiry moved a retention ahead, not the retention itself.
        let o = &s.group_offsets["quiet"]["t/0"];
        assert_eq!((o.expires_at_ms, o.retention_ms), (14 * DAY, 7 * DAY));
        assert!(!s.has_expired_offsets(13 * DAY));
        // It empties on day 10: kept until day 17, then gone.
        s.apply(
            3,
            &MetaCommand::TouchGroupOffsets {
                group: "quiet".into(),
                at_ms: 10 * DAY,
            },
        );
        expire(&mut s, 16 * DAY, &[]);
        assert!(s.group_offsets.contains_key("quiet"));
        expire(&mut s, 17 * DAY, &[]);
        assert!(s.group_offsets.is_empty());
        // Touching a group without offsets is no error and changes nothing.
        let touch = MetaCommand::TouchGroupOffsets {
            group: "never".into(),
            at_ms: 0,
        };
        assert!(s.validate(&touch).is_ok());
        s.apply(4, &touch);
        assert!(s.group_offsets.is_empty());
    }

    #[test]
    fn only_tables_whose_rows_do_not_move_get_more_buckets() {
        use mink_types::{Column, DataType, Schema, TableDescriptor};
        let mut s = MetaState::default();
        let schema = Schema::new(1, vec![Column::new("id", DataType::BigInt, false)]);
        let create = |s: &mut MetaState, name: &str, d: TableDescriptor| {
            s.apply(1, &MetaCommand::CreateDatabase { name: "db".into() });
            let path = TablePath::parse(&format!("db.{name}")).unwrap();
            s.apply(
                2,
                &MetaCommand::CreateTable {
                    path: path.clone(),
                    descriptor: d,
                    at_ms: 0,
                },
            );
            path
        };
        let log = create(&mut s, "log", TableDescriptor::log_table(schema.clone()));
        let mut keyed = TableDescriptor::log_table(schema.clone());
        keyed.bucket_keys = Some(vec!["id".into()]);
        let keyed = create(&mut s, "keyed", keyed);
        let grow = |path: &TablePath, n| MetaCommand::AddBuckets {
            path: path.clone(),
            bucket_count: n,
        };
        assert!(
            s.validate(&grow(&keyed, 4)).is_err(),
            "hashed rows would move"
        );
        assert!(s.validate(&grow(&log, 1)).is_err(), "it has one already");
        assert!(
            s.validate(&grow(&log, mink_types::table::BUCKET_COUNT_MAX + 1))
                .is_err()
        );
        s.validate(&grow(&log, 3)).unwrap();
        s.apply(3, &grow(&log, 3));
        assert_eq!(s.table(&log).unwrap().descriptor.bucket_count, 3);
        let id = s.table(&log).unwrap().id;
        let buckets: Vec<u32> = s
            .buckets
            .values()
            .filter(|b| b.bucket.table_id == id)
            .map(|b| b.bucket.bucket)
            .collect();
        assert_eq!(buckets, [0, 1, 2]);
    }

    #[test]
    fn custom_properties_are_set_and_removed_within_their_bounds() {
        use mink_types::{Column, DataType, Schema, TableDescriptor};
        let mut s = MetaState::default();
        s.apply(1, &MetaCommand::CreateDatabase { name: "db".into() });
        let path = TablePath::parse("db.t").unwrap();
        let mut d = TableDescriptor::log_table(Schema::new(
            1,
            vec![Column::new("id", DataType::BigInt, false)],
        ));
        d.properties
            .custom
            .insert("kafka.segment.bytes".into(), "1024".into());
        s.apply(
            2,
            &MetaCommand::CreateTable {
                path: path.clone(),
                descriptor: d,
                at_ms: 0,
            },
        );
        let id = s.table(&path).unwrap().id;
        let alter = |custom: &[(&str, Option<&str>)]| MetaCommand::AlterTable {
            path: path.clone(),
            add_columns: vec![],
            set_properties: BTreeMap::from([("log_ttl".to_string(), "1h".to_string())]),
            set_custom: custom
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect(),
            table_id: Some(id),
        };
        let change = alter(&[
            ("kafka.segment.bytes", None),
            ("kafka.max.message.bytes", Some("2048")),
        ]);
        s.validate(&change).unwrap();
        s.apply(3, &change);
        let props = &s.table(&path).unwrap().descriptor.properties;
        assert_eq!(
            props.custom,
            BTreeMap::from([("kafka.max.message.bytes".into(), "2048".into())])
        );
        assert_eq!(props.log_ttl.to_string(), "1h");
        // Over the bound of a custom value: refused, nothing changed.
        let long = "x".repeat(mink_types::table::CUSTOM_VALUE_BYTES_MAX + 1);
        assert!(
            s.validate(&alter(&[("kafka.big", Some(long.as_str()))]))
                .is_err()
        );
        // Entries written before the fields existed read as changing no custom property,
        // for whichever table the path names.
        let old =
            r#"{"alter_table":{"path":"db.t","add_columns":[],"set_properties":{"log_ttl":"2h"}}}"#;
        let old: MetaCommand = serde_json::from_str(old).unwrap();
        assert!(matches!(
            &old,
            MetaCommand::AlterTable { set_custom, table_id: None, .. } if set_custom.is_empty()
        ));
        // A change computed for the table before it was dropped and created again is
        // refused, and applied it changes nothing.
        let descriptor = s.table(&path).unwrap().descriptor.clone();
        s.apply(4, &MetaCommand::DropTable { path: path.clone() });
        s.apply(
            5,
            &MetaCommand::CreateTable {
                path: path.clone(),
                descriptor,
                at_ms: 0,
            },
        );
        assert_ne!(s.table(&path).unwrap().id, id);
        let stale = alter(&[("kafka.max.message.bytes", Some("4096"))]);
        let refused = s.validate(&stale).unwrap_err().to_string();
        assert!(refused.contains("dropped and created again"), "{refused}");
        let before = s.table(&path).unwrap().descriptor.clone();
        s.apply(6, &stale);
        assert_eq!(s.table(&path).unwrap().descriptor, before);
    }

    /// Entries written before offsets kept their retention count it from the commit.
    #[test]
    fn old_offsets_without_a_retention_keep_the_one_they_were_written_with() {
        let old = r#"{"offset": 3, "metadata": "", "committed_at_ms": 100, "expires_at_ms": 600}"#;
        let o: GroupOffset = serde_json::from_str(old).unwrap();
        assert_eq!((o.retention_ms, o.retention()), (0, 500));
        // Kept alive or touched, it keeps that retention: the expiry moves, the
        // retention does not grow with it.
        let mut s = MetaState::default();
        s.group_offsets
            .entry("g".into())
            .or_default()
            .insert("t/0".into(), o);
        for now in [600, 1_100, 1_600] {
            expire(&mut s, now, &["g"]);
        }
        assert_eq!(s.group_offsets["g"]["t/0"].expires_at_ms, 2_100);
        s.apply(
            5,
            &MetaCommand::TouchGroupOffsets {
                group: "g".into(),
                at_ms: 2_000,
            },
        );
        assert_eq!(s.group_offsets["g"]["t/0"].expires_at_ms, 2_500);
        let old_expire = r#"{"expire_offsets": {"term": 2, "now_ms": 5}}"#;
        let c: MetaCommand = serde_json::from_str(old_expire).unwrap();
        assert!(
            matches!(c, MetaCommand::ExpireOffsets { live_groups, .. } if live_groups.is_empty())
        );
    }
}
