//! Lake tiering to Apache Iceberg v2 on the same object store.
//!
//! A lake table is an Iceberg table at `lake/{db}/{table}` whose catalog is the object
//! store itself: metadata versions `v{N}.metadata.json` committed by conditional create
//! and a best-effort `version-hint.text`, the layout DuckDB's `iceberg_scan` and
//! pyiceberg's `StaticTable` read. The `iceberg` crate is used at arm's length, as the
//! codec of Iceberg's JSON and Avro (metadata, manifests, manifest lists); no Arrow value
//! crosses into it (it builds against another arrow). Data files are Parquet written and
//! read with the workspace's `parquet`, carrying Iceberg field ids.
//!
//! - [`schema`]: Mink types as Iceberg types, field ids, rows to and from the lake;
//! - [`table`]: one lake table: load, commit a round, list and read its files.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod config;
pub mod schema;
pub mod table;
pub mod transform;

/// The manifest entry of a data file (the `iceberg` crate's, which callers only pass
/// back to [`LakeTable::commit`] and [`LakeTable::delete_files`]).
pub use iceberg::spec::DataFile;

pub use config::{LakeConfig, LakeRetention};
pub use schema::{
    LakeRows, from_lake_batch, iceberg_schema, lake_arrow_schema, lake_columns, to_current_lake,
    to_lake_batch,
};
pub use table::{
    Committed, DeletedPositions, FileContent, LakeFile, LakeTable, LakeVersion, SnapshotFiles,
    SweepStats, TieredBucket, compaction_run, partition_value,
};

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
