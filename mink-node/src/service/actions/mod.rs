//! Actions: one `match` over the typed protocol (`mink_flight::actions::Action`) to one
//! function per action, grouped as spec/protocols.txt groups them:
//!
//! - [`catalog`]: databases, tables, partitions;
//! - [`cluster`]: metadata, describe_cluster, get_config, node_stats, rebalance, health;
//! - [`writers`]: init_writer, list_offsets, producer offsets;
//! - [`snapshots`]: latest_kv_snapshot, lake_snapshot;
//! - [`console`]: bucket_stats, kafka_groups (what the console shows of other nodes);
//! - `lookup` and `prefix_lookup` in [`super::lookups`].
//!
//! Each function takes its request type and returns its answer type; only this
//! dispatcher turns answers into bytes.

use mink_flight::actions::{Action, Answer, IpcAnswer};

use super::*;

mod catalog;
mod cluster;
mod console;
mod snapshots;
mod writers;

/// Encodes an action's answer for the wire.
fn answer<A: Answer>(answered: Result<A>) -> Result<Vec<u8>> {
    answered?.to_body()
}

impl NodeService {
    /// Runs one action.
    pub(crate) async fn action(&self, action: Action) -> Result<Vec<u8>> {
        match action {
            // Catalog.
            Action::CreateDatabase(r) => answer(self.create_database(r.0).await),
            Action::DropDatabase(r) => answer(self.drop_database(r.0).await),
            Action::ListDatabases(_) => answer(Ok(self.list_databases())),
            Action::DatabaseExists(r) => answer(Ok(self.database_exists(r.0))),
            Action::CreateTable(r) => answer(self.create_table(r).await),
            Action::DropTable(r) => answer(self.drop_table(r.0).await),
            Action::ListTables(r) => answer(self.list_tables(r)),
            Action::TableExists(r) => answer(Ok(self.table_exists(r.0))),
            Action::GetTable(r) => answer(self.get_table(r.0).await),
            Action::AlterTable(r) => answer(self.alter_table(r).await),
            Action::CreatePartition(r) => answer(self.create_partition(r.0).await),
            Action::DropPartition(r) => answer(self.drop_partition(r.0).await),
            Action::ListPartitions(r) => answer(self.list_partitions(r.0).await),
            // Cluster.
            Action::Metadata(r) => answer(self.metadata(&r.0.path).await),
            Action::DescribeCluster(_) => answer(Ok(self.describe_cluster())),
            Action::GetConfig(_) => answer(json_value(&self.config.redacted())),
            Action::NodeStats(_) => answer(Ok(self.node_stats())),
            Action::Rebalance(r) => answer(self.rebalance(r).await),
            Action::Health(_) => answer(Ok(self.health())),
            Action::BucketStats(r) => answer(self.bucket_stats(r).await),
            Action::KafkaGroups(r) => answer(self.kafka_groups(r).await),
            // Writers and offsets.
            Action::InitWriter(_) => answer(self.init_writer().await),
            Action::ListOffsets(r) => answer(self.list_offsets(r).await),
            Action::RegisterProducerOffsets(r) => answer(self.register_producer_offsets(r).await),
            Action::GetProducerOffsets(r) => answer(self.get_producer_offsets(r.0)),
            Action::DeleteProducerOffsets(r) => answer(self.delete_producer_offsets(r.0).await),
            // Lookups.
            Action::Lookup(r) => answer(self.lookup(r).await.map(IpcAnswer)),
            Action::PrefixLookup(r) => answer(self.prefix_lookup(r).await.map(IpcAnswer)),
            // Snapshots.
            Action::LatestKvSnapshot(r) => answer(self.latest_kv_snapshot(r.0.bucket).await),
            Action::LakeSnapshot(r) => answer(self.lake_snapshot_json(&r.0.path).await),
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
}

/// A value as JSON (for answers the protocol keeps as JSON: the catalog's own shapes).
pub(super) fn json_value<T: serde::Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| MinkError::Internal(e.to_string()))
}
