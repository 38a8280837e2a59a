//! Catalog actions: databases, tables and partitions. Each is a proposal to the
//! metadata log (or a read of the view) and any node serves it.

use mink_flight::actions::{
    AlterTable, CreateTable, DatabaseName, Exists, Indexed, ListTables, PartitionCreated,
    PartitionRef, TableCreated, TableRef,
};

use super::*;

impl NodeService {
    pub(super) async fn create_database(&self, r: DatabaseName) -> Result<Indexed> {
        let index = self.meta.create_database(&r.name).await?;
        Ok(Indexed { index })
    }

    pub(super) async fn drop_database(&self, r: DatabaseName) -> Result<Indexed> {
        let index = self.meta.drop_database(&r.name, r.cascade).await?;
        Ok(Indexed { index })
    }

    pub(super) fn list_databases(&self) -> Vec<String> {
        self.meta
            .read(|s| s.databases.keys().cloned().collect::<Vec<_>>())
    }

    pub(super) fn database_exists(&self, r: DatabaseName) -> Exists {
        Exists {
            exists: self.meta.read(|s| s.databases.contains_key(&r.name)),
        }
    }

    /// Creates the table and, on the lease holder, gives its buckets leaders at once.
    pub(super) async fn create_table(&self, r: CreateTable) -> Result<TableCreated> {
        match self.meta.create_table(&r.path, r.descriptor).await {
            Ok((table, index)) => {
                self.meta.assign_now().await;
                Ok(TableCreated {
                    table_id: table.id,
                    index,
                })
            }
            Err(MinkError::AlreadyExists(_)) if r.ignore_if_exists => {
                let table = self.table(&r.path).await?;
                Ok(TableCreated {
                    table_id: table.id,
                    index: self.meta.applied_index(),
                })
            }
            Err(e) => Err(e),
        }
    }

    pub(super) async fn drop_table(&self, r: TableRef) -> Result<Indexed> {
        let dropped = self.table(&r.path).await.map(|t| t.id);
        let index = self
            .meta
            .propose(mink_meta::MetaCommand::DropTable {
                path: r.path.clone(),
            })
            .await?;
        // The table's lake data goes with it (best effort: a later table of the same
        // name purges what is left before its first round).
        let lake = self.lake_table(&r.path);
        tokio::spawn(async move {
            let Ok(id) = dropped else { return };
            if let Err(e) = lake.purge(id).await {
                tracing::warn!(table = %r.path, "the dropped table's lake data stays: {e}");
            }
        });
        Ok(Indexed { index })
    }

    pub(super) fn list_tables(&self, r: ListTables) -> Result<Vec<String>> {
        if !self.meta.read(|s| s.databases.contains_key(&r.database)) {
            return Err(MinkError::NotFound(format!("database {}", r.database)));
        }
        let prefix = format!("{}.", r.database);
        Ok(self.meta.read(|s| {
            s.table_ids
                .keys()
                .filter_map(|p| p.strip_prefix(&prefix).map(str::to_string))
                .collect::<Vec<_>>()
        }))
    }

    pub(super) fn table_exists(&self, r: TableRef) -> Exists {
        Exists {
            exists: self.meta.read(|s| s.table(&r.path).is_some()),
        }
    }

    pub(super) async fn get_table(&self, r: TableRef) -> Result<serde_json::Value> {
        json_value(&self.table(&r.path).await?)
    }

    pub(super) async fn alter_table(&self, r: AlterTable) -> Result<Indexed> {
        let index = self
            .meta
            .propose(mink_meta::MetaCommand::AlterTable {
                path: r.path,
                add_columns: r.add_columns,
                set_properties: r.set_properties,
                set_custom: Default::default(),
                table_id: None,
            })
            .await?;
        Ok(Indexed { index })
    }

    pub(super) async fn create_partition(&self, r: PartitionRef) -> Result<PartitionCreated> {
        let (p, index) = self.meta.create_partition(&r.path, &r.name).await?;
        self.meta.assign_now().await;
        Ok(PartitionCreated {
            partition_id: p.id,
            index,
        })
    }

    pub(super) async fn drop_partition(&self, r: PartitionRef) -> Result<Indexed> {
        let index = self
            .meta
            .propose(mink_meta::MetaCommand::DropPartition {
                path: r.path,
                name: r.name,
            })
            .await?;
        Ok(Indexed { index })
    }

    pub(super) async fn list_partitions(&self, r: TableRef) -> Result<serde_json::Value> {
        let table = self.table(&r.path).await?;
        json_value(&table.partitions.values().collect::<Vec<_>>())
    }
}
