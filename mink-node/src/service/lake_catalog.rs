//! What the Iceberg REST catalog ([`crate::iceberg_rest`]) asks of the node: the lake
//! tables by name, and each one's newest metadata version, read from the lake itself
//! (the metadata log's pointer may lag a round).

use mink_lake::LakeVersion;
use mink_wal::ObjectStoreConfig;

use super::*;

/// A lake table as the catalog serves it.
pub(crate) struct CatalogTable {
    /// The absolute location of the metadata file `metadata` was read from.
    pub metadata_location: String,
    pub version: LakeVersion,
}

impl NodeService {
    /// Every database: the catalog's namespaces (one level each).
    pub(crate) fn catalog_namespaces(&self) -> Vec<String> {
        self.meta
            .read(|s| s.databases.keys().cloned().collect::<Vec<_>>())
    }

    pub(crate) fn catalog_namespace_exists(&self, database: &str) -> bool {
        self.meta.read(|s| s.databases.contains_key(database))
    }

    /// The lake-enabled tables of `database`, by name; `None` when there is no such
    /// database.
    pub(crate) fn catalog_tables(&self, database: &str) -> Option<Vec<String>> {
        self.meta.read(|s| {
            s.databases.contains_key(database).then(|| {
                s.tables
                    .values()
                    .filter(|t| {
                        t.path.database.as_str() == database && t.descriptor.properties.lake.enabled
                    })
                    .map(|t| t.path.table.to_string())
                    .collect()
            })
        })
    }

    /// The newest metadata version of `path`'s lake table. `NotFound` for a table that
    /// does not exist, whose lake is off, or whose first round has not yet created
    /// the lake table.
    pub(crate) async fn catalog_table(&self, path: &TablePath) -> Result<CatalogTable> {
        let table = self.table(path).await?;
        if !table.descriptor.properties.lake.enabled {
            return Err(MinkError::NotFound(format!(
                "the lake table of {path} (lake.enabled is off for this table)"
            )));
        }
        let version = self.lake_version(&table, false).await?.ok_or_else(|| {
            MinkError::NotFound(format!(
                "the lake table of {path} (its first tiering round has not created it yet)"
            ))
        })?;
        Ok(CatalogTable {
            metadata_location: self.lake_table(path).metadata_location(version.version),
            version,
        })
    }

    /// The node's object-store settings (the secret included: the catalog decides
    /// what it may serve).
    pub(crate) fn catalog_store(&self) -> &ObjectStoreConfig {
        &self.config.object_store
    }

    /// `iceberg_rest.vend_credentials`.
    pub(crate) fn catalog_vends_credentials(&self) -> bool {
        self.config.iceberg_rest.vend_credentials
    }
}
