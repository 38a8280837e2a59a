//! The catalog `mink`: one schema per Mink database, one table per Mink table.
//!
//! Built for each statement, so that every statement sees the catalog as the nodes
//! have it then (DDL through any node is visible to the next statement). Tables are
//! fetched when the planner names them (`get_table`); the listing of databases and
//! tables is fetched only for statements that read `information_schema`.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::TableProvider;
use mink_flight::actions::{Empty, ListDatabases, ListTables};
use mink_types::MinkError;

use crate::exec::mink_error;
use crate::nodes::Nodes;
use crate::table::{ReadLimits, fetch};

/// The catalog's name.
pub const CATALOG: &str = "mink";

/// Every database and its tables.
pub type Listing = BTreeMap<String, Vec<String>>;

/// Lists every database and table (for `information_schema` and GetTables).
pub async fn listing(nodes: &Nodes) -> mink_types::Result<Listing> {
    let mut out = Listing::new();
    for db in nodes.call(&ListDatabases(Empty {})).await? {
        let tables = match nodes
            .call(&ListTables {
                database: db.clone(),
            })
            .await
        {
            Ok(t) => t,
            // Dropped between the two calls.
            Err(MinkError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        out.insert(db, tables);
    }
    Ok(out)
}

#[derive(Debug)]
pub struct MinkCatalog {
    nodes: Arc<Nodes>,
    limits: ReadLimits,
    listing: Option<Arc<Listing>>,
}

impl MinkCatalog {
    pub fn new(nodes: Arc<Nodes>, limits: ReadLimits, listing: Option<Listing>) -> Self {
        Self {
            nodes,
            limits,
            listing: listing.map(Arc::new),
        }
    }
}

impl CatalogProvider for MinkCatalog {
    fn schema_names(&self) -> Vec<String> {
        self.listing
            .as_ref()
            .map(|l| l.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if let Some(l) = &self.listing
            && !l.contains_key(name)
        {
            return None;
        }
        Some(Arc::new(MinkSchema {
            nodes: self.nodes.clone(),
            limits: self.limits,
            database: name.to_string(),
            tables: self
                .listing
                .as_ref()
                .and_then(|l| l.get(name).cloned())
                .unwrap_or_default(),
        }))
    }
}

#[derive(Debug)]
struct MinkSchema {
    nodes: Arc<Nodes>,
    limits: ReadLimits,
    database: String,
    /// Listed tables (only when the statement reads `information_schema`).
    tables: Vec<String>,
}

#[async_trait]
impl SchemaProvider for MinkSchema {
    fn table_names(&self) -> Vec<String> {
        self.tables.clone()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        let table = fetch(&self.nodes, &self.database, name, self.limits)
            .await
            .map_err(|e| match e {
                // An unqualified name: say where it was looked for.
                MinkError::NotFound(what) if self.database == crate::service::DEFAULT_SCHEMA => {
                    MinkError::NotFound(format!(
                        "{what} (a name without a database is looked up in \"{}\"; write database.table)",
                        crate::service::DEFAULT_SCHEMA
                    ))
                }
                other => other,
            })
            .map_err(mink_error)?;
        Ok(Some(Arc::new(table)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.tables.iter().any(|t| t == name)
    }
}
