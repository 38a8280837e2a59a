//! One lake table on the object store: its Iceberg metadata versions (the catalog),
//! its Parquet data files, commits of tiering rounds and the files a snapshot holds.
//!
//! Layout under the store's root (DESIGN.md):
//!
//! ```text
//! lake/{db}/{table}/metadata/v{N}.metadata.json     version N, created with PutMode::Create
//! lake/{db}/{table}/metadata/version-hint.text      N, best effort (DuckDB and pyiceberg read it)
//! lake/{db}/{table}/metadata/snap-{id}-{token}.avro manifest lists
//! lake/{db}/{table}/metadata/{token}-m{i}.avro      manifests
//! lake/{db}/{table}/data/{stream}/{first:020}-{token}.parquet
//! ```
//!
//! The version objects are the only truth: committing version `N + 1` is a conditional
//! create, so two writers never both win, and a writer that lost re-reads, re-checks and
//! tries again. Every snapshot's summary carries `mink.offsets` (per bucket, the log
//! offset the lake holds rows below) and `mink.commit` (the committing round's token,
//! which tells "my create landed though its answer was lost" from "another writer won").

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType as ArrowType, Date32Type, Int32Type, Int64Type};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, FormatVersion, Literal,
    ManifestContentType, ManifestList, ManifestListWriter, ManifestStatus, ManifestWriterBuilder,
    Operation, PrimitiveLiteral, Snapshot, SnapshotReference, SnapshotRetention, Struct, Summary,
    TableMetadata, TableMetadataBuilder,
};
use mink_types::{LakePartition, MinkError, Result, Schema, TablePath};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;

/// The zstd level of the lake's Parquet data files. Tiering runs in the background,
/// so it can afford more than the write path's level 1.
const LAKE_ZSTD_LEVEL: i32 = 3;

use crate::config::LakeRetention;
use crate::schema::{field_id, iceberg_schema};

/// Summary key: per-bucket log offsets the lake holds rows below (JSON object).
pub const OFFSETS_KEY: &str = "mink.offsets";
/// Summary key: the token of the round that committed the snapshot.
pub const COMMIT_KEY: &str = "mink.commit";
/// Table property: the Mink table id the lake table belongs to.
pub const TABLE_ID_KEY: &str = "mink.table-id";
/// A commit merges the table's manifests into one when it would reference more.
pub const MANIFESTS_MAX: usize = 32;
/// The bytes at the end of a data file fetched first when only some of its columns
/// are read: the footer and its metadata, in one GET for the files Mink writes.
const FOOTER_HINT_BYTES: usize = 64 << 10;
/// Delete files read at once (each is a GET's latency on S3).
const DELETE_READS_IN_FLIGHT: usize = 4;
/// Commit attempts before a round gives up (each lost race re-reads and re-checks).
const COMMIT_ATTEMPTS_MAX: usize = 32;

fn storage(what: impl std::fmt::Display, e: impl std::fmt::Display) -> MinkError {
    MinkError::StorageFailure(format!("lake: {what}: {e}"))
}

fn iceberg_err(what: &str, e: iceberg::Error) -> MinkError {
    MinkError::Internal(format!("lake: {what}: {e}"))
}

fn token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A version of a lake table's metadata.
#[derive(Debug, Clone)]
pub struct LakeVersion {
    /// `N` of `v{N}.metadata.json`.
    pub version: u64,
    pub metadata: TableMetadata,
}

impl LakeVersion {
    /// The per-bucket offsets of snapshot `snapshot_id` (the current one with `None`):
    /// the lake holds exactly the rows of each bucket below its offset. Empty before
    /// the first tiering round.
    pub fn offsets(&self, snapshot_id: Option<i64>) -> Result<BTreeMap<String, i64>> {
        let snapshot = match snapshot_id {
            Some(id) => Some(
                self.metadata
                    .snapshot_by_id(id)
                    .ok_or_else(|| MinkError::NotFound(format!("lake snapshot {id}")))?,
            ),
            None => self.metadata.current_snapshot(),
        };
        let Some(snapshot) = snapshot else {
            return Ok(BTreeMap::new());
        };
        match snapshot.summary().additional_properties.get(OFFSETS_KEY) {
            Some(json) => {
                serde_json::from_str(json).map_err(|e| storage("the offsets of a lake snapshot", e))
            }
            None => Ok(BTreeMap::new()),
        }
    }

    /// The Mink table id the lake table was created for (`mink.table-id`): a lake
    /// table left by a dropped table of the same name has another.
    pub fn table_id(&self) -> Option<i64> {
        self.metadata
            .properties()
            .get(TABLE_ID_KEY)
            .and_then(|v| v.parse().ok())
    }

    /// The current snapshot id, if a round has been committed.
    pub fn snapshot_id(&self) -> Option<i64> {
        self.metadata.current_snapshot_id()
    }

    fn commit_token(&self) -> Option<&str> {
        self.metadata
            .current_snapshot()
            .and_then(|s| s.summary().additional_properties.get(COMMIT_KEY))
            .map(String::as_str)
    }
}

/// The rows of one bucket a tiering round turned into data files.
#[derive(Debug, Clone)]
pub struct TieredBucket {
    /// `TableBucket::stream_name`.
    pub stream: String,
    /// The bucket's lake offset the round read from, as the version the round started
    /// from had it (`None`: not tiered before).
    pub from: Option<i64>,
    /// The offset after the last row tiered.
    pub to: i64,
    /// New data files, and new position delete files (merge-on-read of a primary-key
    /// bucket: they delete the old rows of the keys that changed).
    pub files: Vec<DataFile>,
    /// Locations of the bucket's files (data and deletes) that `files` replace (a
    /// rewrite of a primary-key bucket: the new files hold its whole state). Empty
    /// otherwise.
    pub replaces: Vec<String>,
    /// A compaction of a log bucket's older files, committed with the round as a
    /// snapshot of its own (`replace`: the same rows in fewer files) on top of the
    /// round's: the merged files, and the locations of the files they replace.
    pub compacted: Vec<DataFile>,
    pub compacted_from: Vec<String>,
}

impl TieredBucket {
    /// Every file the round wrote: its new rows' and its compaction's.
    pub fn written(&self) -> Vec<DataFile> {
        self.files.iter().chain(&self.compacted).cloned().collect()
    }

    /// The round without its compaction, and the compaction as a part of its own
    /// (at the offset the round reaches), if there is one.
    fn split_compaction(&self) -> (TieredBucket, Option<TieredBucket>) {
        let round = TieredBucket {
            compacted: Vec::new(),
            compacted_from: Vec::new(),
            ..self.clone()
        };
        let merge = (!self.compacted.is_empty()).then(|| TieredBucket {
            stream: self.stream.clone(),
            from: Some(self.to),
            to: self.to,
            files: self.compacted.clone(),
            replaces: self.compacted_from.clone(),
            compacted: Vec::new(),
            compacted_from: Vec::new(),
        });
        (round, merge)
    }
}

/// What a commit made.
#[derive(Debug, Clone)]
pub struct Committed {
    pub version: u64,
    pub snapshot_id: i64,
    pub timestamp_ms: i64,
    pub metadata_location: String,
    /// Every bucket's offset in the new snapshot.
    pub offsets: BTreeMap<String, i64>,
    /// Buckets left out because another writer tiered them meanwhile (their files
    /// were deleted).
    pub dropped: Vec<String>,
}

/// What a file of a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileContent {
    /// Rows.
    Data,
    /// Iceberg v2 position deletes: `(file_path, pos)` rows naming rows of data files
    /// that are no longer part of the table (merge-on-read of primary-key tables).
    PositionDeletes,
}

/// A file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeFile {
    pub location: String,
    /// Rows of a data file; deleted positions of a delete file.
    pub record_count: u64,
    pub size_bytes: u64,
    pub content: FileContent,
    /// Its Iceberg partition value (every file of a bucket has its partition's).
    pub partition: Struct,
}

/// The files of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct SnapshotFiles {
    pub data: Vec<LakeFile>,
    pub deletes: Vec<LakeFile>,
}

impl SnapshotFiles {
    /// The files of one bucket (`TableBucket::stream_name`).
    pub fn of_stream(&self, stream: &str) -> SnapshotFiles {
        let mine = |files: &[LakeFile]| {
            files
                .iter()
                .filter(|f| f.stream() == Some(stream))
                .cloned()
                .collect()
        };
        SnapshotFiles {
            data: mine(&self.data),
            deletes: mine(&self.deletes),
        }
    }

    /// The files after a commit of `buckets` on top of these: their new files added,
    /// the files they replace gone.
    pub fn after(&self, buckets: &[TieredBucket]) -> SnapshotFiles {
        let replaced: std::collections::HashSet<&str> = buckets
            .iter()
            .flat_map(|b| b.replaces.iter().chain(&b.compacted_from))
            .map(String::as_str)
            .collect();
        let mut out = SnapshotFiles {
            data: self
                .data
                .iter()
                .filter(|f| !replaced.contains(f.location.as_str()))
                .cloned()
                .collect(),
            deletes: self
                .deletes
                .iter()
                .filter(|f| !replaced.contains(f.location.as_str()))
                .cloned()
                .collect(),
        };
        for f in buckets
            .iter()
            .flat_map(|b| b.files.iter().chain(&b.compacted))
        {
            let file = LakeFile {
                location: f.file_path().to_string(),
                record_count: f.record_count(),
                size_bytes: f.file_size_in_bytes(),
                content: if f.content_type() == DataContentType::Data {
                    FileContent::Data
                } else {
                    FileContent::PositionDeletes
                },
                partition: f.partition().clone(),
            };
            match file.content {
                FileContent::Data => out.data.push(file),
                FileContent::PositionDeletes => out.deletes.push(file),
            }
        }
        out
    }

    /// Every file's location, data and deletes.
    pub fn locations(&self) -> Vec<String> {
        self.data
            .iter()
            .chain(&self.deletes)
            .map(|f| f.location.clone())
            .collect()
    }
}

/// The positions (row numbers from 0, across row groups) deleted from each data file,
/// by data file location, each list ascending and without repeats.
pub type DeletedPositions = HashMap<String, Vec<u64>>;

impl LakeFile {
    /// The log offset of the file's first row, from its name (`{first:020}-…`).
    pub fn first_offset(&self) -> Option<i64> {
        let (_, name) = self.location.rsplit_once('/')?;
        name.split_once('-')?.0.parse().ok()
    }

    /// The bucket (`TableBucket::stream_name`) whose rows the file holds: files are
    /// written under `data/{stream}/`.
    pub fn stream(&self) -> Option<&str> {
        let (_, rest) = self.location.rsplit_once("/data/")?;
        rest.split_once('/').map(|(stream, _)| stream)
    }

    /// Written by a merge-on-read round (a delta data file, or a delete file), not by
    /// a rewrite of its bucket.
    pub fn is_delta(&self) -> bool {
        self.content == FileContent::PositionDeletes || self.location.ends_with("-delta.parquet")
    }
}

/// One lake table.
#[derive(Clone)]
pub struct LakeTable {
    store: Arc<dyn ObjectStore>,
    root_url: String,
    prefix: String,
    retention: LakeRetention,
    /// `lake.partition`, in the partition spec of the version this table creates.
    time: Option<LakePartition>,
}

impl std::fmt::Debug for LakeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LakeTable({}/{})", self.root_url, self.prefix)
    }
}

impl LakeTable {
    /// The lake table of `path` in `store`, whose root is `root_url` (the node's
    /// `object_store.url`: locations in Iceberg metadata are absolute).
    pub fn new(store: Arc<dyn ObjectStore>, root_url: &str, path: &TablePath) -> Self {
        Self {
            store,
            root_url: root_url.trim_end_matches('/').to_string(),
            prefix: format!("lake/{}/{}", path.database, path.table),
            retention: LakeRetention::default(),
            time: None,
        }
    }

    /// This table with `lake.partition` (used when it creates the lake table's first
    /// version; a lake table keeps the spec it was created with).
    pub fn with_time_partition(mut self, time: Option<LakePartition>) -> Self {
        self.time = time;
        self
    }

    /// This table with commits that expire snapshots by `retention`.
    pub fn with_retention(mut self, retention: LakeRetention) -> Self {
        self.retention = retention;
        self
    }

    /// The table's location (the Iceberg `location`).
    pub fn location(&self) -> String {
        format!("{}/{}", self.root_url, self.prefix)
    }

    fn metadata_path(&self, version: u64) -> Path {
        Path::from(format!("{}/metadata/v{version}.metadata.json", self.prefix))
    }

    /// The absolute location of version `version`'s metadata file.
    pub fn metadata_location(&self, version: u64) -> String {
        format!("{}/{}", self.root_url, self.metadata_path(version))
    }

    fn hint_path(&self) -> Path {
        Path::from(format!("{}/metadata/version-hint.text", self.prefix))
    }

    /// The object path of an absolute location of this store.
    pub fn path_of(&self, location: &str) -> Result<Path> {
        location
            .strip_prefix(&self.root_url)
            .and_then(|rest| rest.strip_prefix('/'))
            .map(Path::from)
            .ok_or_else(|| {
                MinkError::StorageFailure(format!(
                    "lake location {location:?} is not under {}",
                    self.root_url
                ))
            })
    }

    async fn get(&self, path: &Path) -> Result<Option<Bytes>> {
        match self.store.get(path).await {
            Ok(r) => Ok(Some(r.bytes().await.map_err(|e| storage(path, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(storage(path, e)),
        }
    }

    async fn read_version(&self, version: u64) -> Result<Option<LakeVersion>> {
        let Some(bytes) = self.get(&self.metadata_path(version)).await? else {
            return Ok(None);
        };
        let metadata: TableMetadata = serde_json::from_slice(&bytes)
            .map_err(|e| storage(format!("v{version}.metadata.json"), e))?;
        Ok(Some(LakeVersion { version, metadata }))
    }

    async fn newest_listed(&self) -> Result<Option<u64>> {
        let prefix = Path::from(format!("{}/metadata", self.prefix));
        let objects: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| storage(&prefix, e))?;
        Ok(objects
            .iter()
            .filter_map(|o| o.location.filename())
            .filter_map(version_number)
            .max())
    }

    /// Every object of the lake table.
    async fn list_all(&self) -> Result<Vec<object_store::ObjectMeta>> {
        let prefix = Path::from(self.prefix.clone());
        self.store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| storage(&prefix, e))
    }

    /// The newest metadata version, `None` before the table's first round. `hint` (a
    /// version known to exist, such as the metadata log's pointer) saves reading
    /// `version-hint.text`; either way the versions after it are probed, so a stale
    /// hint costs one GET per version it lags.
    pub async fn load(&self, hint: Option<u64>) -> Result<Option<LakeVersion>> {
        let hint = match hint {
            Some(v) => Some(v),
            None => self
                .get(&self.hint_path())
                .await?
                .and_then(|b| std::str::from_utf8(&b).ok()?.trim().parse().ok()),
        };
        let mut current = match hint {
            Some(v) => self.read_version(v).await?,
            None => None,
        };
        if current.is_none() {
            // No hint, or a hint to an expired version: list.
            current = match self.newest_listed().await? {
                Some(v) => self.read_version(v).await?,
                None => return Ok(None),
            };
        }
        let mut current = current.ok_or_else(|| {
            MinkError::StorageFailure(format!(
                "lake table {}: a listed version vanished",
                self.prefix
            ))
        })?;
        while let Some(next) = self.read_version(current.version + 1).await? {
            current = next;
        }
        Ok(Some(current))
    }

    /// Creates version 1 (no snapshot) for `schema` partitioned by `partition_keys`,
    /// unless a version exists.
    async fn create(
        &self,
        table_id: i64,
        schema: &Schema,
        partition_keys: &[String],
    ) -> Result<()> {
        let iceberg = iceberg_schema(schema)?;
        let mut fields: Vec<serde_json::Value> = partition_keys
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let index = schema.index_of(name).ok_or_else(|| {
                    MinkError::Internal(format!("partition key {name:?} is not a column"))
                })?;
                Ok(serde_json::json!({
                    "source-id": field_id(index),
                    "field-id": 1000 + k as i32,
                    "name": name,
                    "transform": "identity",
                }))
            })
            .collect::<Result<_>>()?;
        if let Some(time) = &self.time {
            let index = crate::transform::column_index(schema, time)?;
            fields.push(serde_json::json!({
                "source-id": field_id(index),
                "field-id": 1000 + fields.len() as i32,
                "name": format!("{}_{}", time.column, time.transform.as_str()),
                "transform": time.transform.as_str(),
            }));
        }
        let partition_fields = fields.len();
        let now = crate::now_ms();
        let json = serde_json::json!({
            "format-version": 2,
            "table-uuid": uuid::Uuid::new_v4().to_string(),
            "location": self.location(),
            "last-sequence-number": 0,
            "last-updated-ms": now,
            "last-column-id": iceberg.highest_field_id(),
            "current-schema-id": iceberg.schema_id(),
            "schemas": [iceberg],
            "default-spec-id": 0,
            "partition-specs": [{"spec-id": 0, "fields": fields}],
            "last-partition-id": 999 + partition_fields as i32,
            "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {"write.format.default": "parquet", TABLE_ID_KEY: table_id.to_string()},
            "snapshots": [],
            "snapshot-log": [],
            "metadata-log": [],
            "refs": {},
        });
        // Parse it back: the crate checks what we wrote is valid v2 metadata.
        let metadata: TableMetadata = serde_json::from_value(json)
            .map_err(|e| MinkError::Internal(format!("lake: new table metadata: {e}")))?;
        let bytes = serde_json::to_vec(&metadata)
            .map_err(|e| MinkError::Internal(format!("lake: new table metadata: {e}")))?;
        let create = PutOptions::from(PutMode::Create);
        match self
            .store
            .put_opts(&self.metadata_path(1), PutPayload::from(bytes), create)
            .await
        {
            // Another node created it (or our own earlier attempt did): either way v1
            // exists and the caller reloads.
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(storage("creating v1.metadata.json", e)),
        }
        self.write_hint(1).await;
        Ok(())
    }

    async fn write_hint(&self, version: u64) {
        let payload = PutPayload::from(version.to_string().into_bytes());
        if let Err(e) = self.store.put(&self.hint_path(), payload).await {
            tracing::debug!(table = %self.prefix, "version-hint.text not written: {e}");
        }
    }

    /// Writes `batches` (lake rows of one bucket, offsets from `first_offset` on, in the
    /// lake's Arrow schema) as one Parquet data file and returns its manifest entry.
    /// `partition` is the Iceberg partition value (empty for unpartitioned tables).
    pub async fn write_data_file(
        &self,
        stream: &str,
        first_offset: i64,
        batches: &[RecordBatch],
        partition: Struct,
    ) -> Result<DataFile> {
        self.write_rows(stream, first_offset, "", batches, partition)
            .await
    }

    /// As [`Self::write_data_file`], for the changed rows a merge-on-read round of a
    /// primary-key bucket adds: named `…-delta.parquet`, so that [`LakeFile::is_delta`]
    /// tells them from the files of a rewrite.
    pub async fn write_delta_file(
        &self,
        stream: &str,
        first_offset: i64,
        batches: &[RecordBatch],
        partition: Struct,
    ) -> Result<DataFile> {
        self.write_rows(stream, first_offset, "-delta", batches, partition)
            .await
    }

    /// `data/{stream}/{first_offset:020}-{token}{suffix}.parquet` of lake rows.
    async fn write_rows(
        &self,
        stream: &str,
        first_offset: i64,
        suffix: &str,
        batches: &[RecordBatch],
        partition: Struct,
    ) -> Result<DataFile> {
        let name = format!("{first_offset:020}-{}{suffix}", token());
        self.write_parquet(stream, &name, batches, partition, DataContentType::Data)
            .await
    }

    /// `data/{stream}/{name}.parquet` of `batches`, and its manifest entry.
    async fn write_parquet(
        &self,
        stream: &str,
        name: &str,
        batches: &[RecordBatch],
        partition: Struct,
        content: DataContentType,
    ) -> Result<DataFile> {
        let Some(first) = batches.first() else {
            return Err(MinkError::Internal("lake: a file of no rows".into()));
        };
        // ZSTD at a fast level: what every engine reading Iceberg decodes, and about
        // a third smaller than Snappy on columnar rows. Files written before (Snappy)
        // stay as they are: each Parquet column chunk names its codec.
        let zstd = parquet::basic::ZstdLevel::try_new(LAKE_ZSTD_LEVEL)
            .map_err(|e| MinkError::Internal(format!("lake: zstd level: {e}")))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(zstd))
            .build();
        let mut writer = ArrowWriter::try_new(Vec::new(), first.schema(), Some(props))
            .map_err(|e| MinkError::Internal(format!("lake: Parquet writer: {e}")))?;
        let mut rows = 0u64;
        for b in batches {
            rows += b.num_rows() as u64;
            writer
                .write(b)
                .map_err(|e| MinkError::Internal(format!("lake: writing Parquet: {e}")))?;
        }
        let bytes = writer
            .into_inner()
            .map_err(|e| MinkError::Internal(format!("lake: closing Parquet: {e}")))?;
        let size = bytes.len() as u64;
        let path = Path::from(format!("{}/data/{stream}/{name}.parquet", self.prefix));
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| storage(&path, e))?;
        DataFileBuilder::default()
            .content(content)
            .file_path(format!("{}/{path}", self.root_url))
            .file_format(DataFileFormat::Parquet)
            .partition(partition)
            .record_count(rows)
            .file_size_in_bytes(size)
            .partition_spec_id(0)
            .build()
            .map_err(|e| MinkError::Internal(format!("lake: data file entry: {e}")))
    }

    /// Deletes every object of the lake table of the dropped table `table_id`. Safe to
    /// race with a new table of the same name and with other purges: after listing, every
    /// listed metadata version is read, and if one belongs to another table (a new
    /// table took the name, so the listing may hold its objects) nothing is deleted.
    /// Objects created after the listing are never deleted. Metadata versions go first,
    /// newest first, so a reader never finds a version whose files are gone.
    pub async fn purge(&self, table_id: i64) -> Result<u64> {
        let objects = self.list_all().await?;
        let version_of = |p: &Path| p.filename().and_then(version_number);
        let mut versions: Vec<u64> = objects
            .iter()
            .filter_map(|o| version_of(&o.location))
            .collect();
        versions.sort_unstable();
        // Each listed version must still be the dropped table's, now and again right
        // before it is deleted: version names are reused by a new table of the same
        // name, which may appear once another purge deleted the old versions. A
        // listed version that is gone means another purge ran: leave the rest to it.
        let owned =
            |read: Option<LakeVersion>| read.is_some_and(|r| r.table_id() == Some(table_id));
        for v in &versions {
            if !owned(self.read_version(*v).await?) {
                tracing::info!(
                    table = %self.prefix,
                    "not purging: v{v} is gone or belongs to another table than the dropped {table_id}"
                );
                return Ok(0);
            }
        }
        let mut deleted = 0;
        for v in versions.iter().rev() {
            if !owned(self.read_version(*v).await?) {
                return Ok(deleted);
            }
            let p = self.metadata_path(*v);
            match self.store.delete(&p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                Err(e) => return Err(storage(&p, e)),
            }
        }
        // What the versions named: listed before any version was deleted, so none of
        // it belongs to a table created since (its objects have unique names).
        for p in objects
            .iter()
            .map(|o| &o.location)
            .filter(|p| version_of(p).is_none())
        {
            match self.store.delete(p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                Err(e) => return Err(storage(p, e)),
            }
        }
        Ok(deleted)
    }

    /// Deletes what no retained snapshot or metadata version needs and is older than
    /// `min_age`: data files of rounds that died before committing (or lost and could
    /// not delete theirs), manifests no retained snapshot lists, manifest lists of
    /// expired snapshots, metadata versions older than the metadata log. Objects younger
    /// than `min_age` are kept whatever they are: a round in flight has written its files
    /// but not yet committed them (a round never runs near `min_age`).
    pub async fn sweep_orphans(&self, min_age: std::time::Duration) -> Result<SweepStats> {
        let Some(version) = self.load(None).await? else {
            return Ok(SweepStats::default());
        };
        let metadata = &version.metadata;
        let mut keep: std::collections::HashSet<String> = std::collections::HashSet::new();
        keep.insert(self.hint_path().to_string());
        // Metadata versions: this one and those its log still names.
        let oldest_logged = metadata
            .metadata_log()
            .iter()
            .filter_map(|m| m.metadata_file.rsplit('/').next().and_then(version_number))
            .min()
            .unwrap_or(version.version);
        let mut manifests_seen = std::collections::HashSet::new();
        // A manifest list (or manifest) missing was expired by a commit newer than the
        // version loaded; every live file is also named by the snapshots that remain.
        for snapshot in metadata.snapshots() {
            keep.insert(self.path_of(snapshot.manifest_list())?.to_string());
            let Some(list) = self.manifest_list_if_any(snapshot.manifest_list()).await? else {
                continue;
            };
            for m in list.entries() {
                if !manifests_seen.insert(m.manifest_path.clone()) {
                    continue;
                }
                keep.insert(self.path_of(&m.manifest_path)?.to_string());
                let Some(bytes) = self.get(&self.path_of(&m.manifest_path)?).await? else {
                    continue;
                };
                let manifest = iceberg::spec::Manifest::parse_avro(&bytes)
                    .map_err(|e| iceberg_err("reading a manifest", e))?;
                for e in manifest.entries() {
                    keep.insert(self.path_of(e.file_path())?.to_string());
                }
            }
        }
        let objects = self.list_all().await?;
        let now = chrono_now();
        let mut stats = SweepStats::default();
        for o in objects {
            let name = o.location.to_string();
            let version_no = o.location.filename().and_then(version_number);
            let needed = match version_no {
                // Newer versions than the one loaded may have been committed since.
                Some(n) => n >= oldest_logged,
                None => keep.contains(&name),
            };
            let age = now.signed_duration_since(o.last_modified);
            let young = age.to_std().map_or(true, |a| a < min_age);
            if needed || young {
                stats.kept += 1;
                continue;
            }
            match self.store.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    stats.deleted += 1;
                    stats.deleted_bytes += o.size;
                }
                Err(e) => return Err(storage(&o.location, e)),
            }
        }
        Ok(stats)
    }

    /// Deletes data files a round wrote but did not commit (best effort: orphans
    /// left by a crash are the orphan sweep's).
    pub async fn delete_files(&self, files: &[DataFile]) {
        for f in files {
            if let Ok(path) = self.path_of(f.file_path())
                && let Err(e) = self.store.delete(&path).await
            {
                tracing::debug!(
                    file = f.file_path(),
                    "uncommitted lake file not deleted: {e}"
                );
            }
        }
    }

    /// Commits one tiering round: one snapshot adding every bucket's files and moving
    /// its offset to `to`. A bucket whose offset in the newest version is no longer its
    /// `from` was tiered by another writer meanwhile (a leader that moved); it is left
    /// out and its files deleted. `None` when nothing was left to commit.
    ///
    /// Each attempt loads the newest version, keeps the buckets still at their `from`
    /// ([`LakeTable::keep_current`]), stages the new version, checks the round's files
    /// are all there ([`LakeTable::files_present`]), and creates the version
    /// ([`LakeTable::create_version`]); a version another writer created first sends
    /// it round again.
    pub async fn commit(
        &self,
        table_id: i64,
        schema: &Schema,
        partition_keys: &[String],
        hint: Option<u64>,
        mut buckets: Vec<TieredBucket>,
    ) -> Result<Option<Committed>> {
        let token = token();
        let mut dropped = Vec::new();
        let mut hint = hint;
        for _ in 0..COMMIT_ATTEMPTS_MAX {
            let Some(current) = self.load(hint).await? else {
                self.create(table_id, schema, partition_keys).await?;
                continue;
            };
            hint = Some(current.version);
            if current.table_id() != Some(table_id) {
                return Err(MinkError::Unavailable(format!(
                    "lake table {} belongs to table id {:?}, not {table_id}; it is being purged",
                    self.prefix,
                    current.table_id()
                )));
            }
            buckets = self.keep_current(&current, buckets, &mut dropped).await?;
            if buckets.is_empty() {
                return Ok(None);
            }
            let staged = self.stage(&current, schema, &buckets, &token).await?;
            if let Err(e) = self.files_present(&buckets).await {
                self.unstage(&staged).await;
                for b in &buckets {
                    self.delete_files(&b.written()).await;
                }
                return Err(e);
            }
            let next = current.version + 1;
            if !self.create_version(next, &staged, &token).await? {
                self.unstage(&staged).await;
                continue;
            }
            return self.committed(next, staged, dropped).await.map(Some);
        }
        for b in &buckets {
            self.delete_files(&b.written()).await;
        }
        Err(MinkError::Unavailable(format!(
            "lake table {}: {COMMIT_ATTEMPTS_MAX} commit attempts lost to other writers",
            self.prefix
        )))
    }

    /// The buckets whose offset in `current` is still their round's `from`; the
    /// others' files are deleted and their streams added to `dropped`.
    async fn keep_current(
        &self,
        current: &LakeVersion,
        buckets: Vec<TieredBucket>,
        dropped: &mut Vec<String>,
    ) -> Result<Vec<TieredBucket>> {
        let offsets = current.offsets(None)?;
        let (keep, lost): (Vec<_>, Vec<_>) = buckets
            .into_iter()
            .partition(|b| offsets.get(&b.stream).copied() == b.from);
        for b in &lost {
            tracing::info!(
                table = %self.prefix,
                stream = %b.stream,
                "another writer tiered this bucket meanwhile; this round's files for it are dropped"
            );
            self.delete_files(&b.written()).await;
            dropped.push(b.stream.clone());
        }
        Ok(keep)
    }

    /// Whether the round's data files are all still there (an orphan sweep deletes
    /// uncommitted files older than its minimum age; a round never runs that long,
    /// and this makes sure): a version never names a missing file.
    async fn files_present(&self, buckets: &[TieredBucket]) -> Result<()> {
        let files: Vec<DataFile> = buckets.iter().flat_map(TieredBucket::written).collect();
        for f in &files {
            let path = self.path_of(f.file_path())?;
            if let Err(e) = self.store.head(&path).await {
                return Err(storage(format!("a data file of this round ({path})"), e));
            }
        }
        Ok(())
    }

    /// Creates version `next` (a conditional create): `true` when this commit's own
    /// create landed, `false` when another writer's version is there. An ambiguous
    /// answer is settled by reading the version back (its commit token tells whose);
    /// when it is not there, a timed-out create may still land, so the staged
    /// manifests stay (the orphan sweep takes them if it never does) and the error is
    /// returned.
    async fn create_version(&self, next: u64, staged: &Staged, token: &str) -> Result<bool> {
        let path = self.metadata_path(next);
        let bytes = serde_json::to_vec(&staged.metadata)
            .map_err(|e| MinkError::Internal(format!("lake: metadata JSON: {e}")))?;
        let put = self
            .store
            .put_opts(
                &path,
                PutPayload::from(bytes),
                PutOptions::from(PutMode::Create),
            )
            .await;
        match put {
            Ok(_) => Ok(true),
            // Lost the race, or our own create landed and its answer was lost (a
            // retried create meets itself): the token tells which.
            Err(object_store::Error::AlreadyExists { .. }) => self.is_ours(next, token).await,
            Err(e) => match self.read_version(next).await {
                Ok(Some(v)) => Ok(v.commit_token() == Some(token)),
                Ok(None) => Err(storage(format!("committing v{next}"), e)),
                Err(read) => Err(storage(
                    format!("committing v{next} (and reading it back: {read})"),
                    e,
                )),
            },
        }
    }

    /// After version `next` landed: the hint moves to it, the manifest lists and
    /// metadata files it expired are deleted, and the commit is described.
    async fn committed(
        &self,
        next: u64,
        staged: Staged,
        dropped: Vec<String>,
    ) -> Result<Committed> {
        self.write_hint(next).await;
        for expired in staged.expired_lists.iter().chain(&staged.expired_metadata) {
            if let Ok(p) = self.path_of(expired) {
                let _ = self.store.delete(&p).await;
            }
        }
        let snapshot = staged
            .metadata
            .current_snapshot()
            .ok_or_else(|| MinkError::Internal("lake: committed no snapshot".into()))?;
        Ok(Committed {
            version: next,
            snapshot_id: snapshot.snapshot_id(),
            timestamp_ms: snapshot.timestamp_ms(),
            metadata_location: self.metadata_location(next),
            offsets: staged.offsets,
            dropped,
        })
    }

    async fn is_ours(&self, version: u64, token: &str) -> Result<bool> {
        Ok(self
            .read_version(version)
            .await?
            .is_some_and(|v| v.commit_token() == Some(token)))
    }

    async fn unstage(&self, staged: &Staged) {
        for p in &staged.written {
            let _ = self.store.delete(p).await;
        }
    }

    async fn manifest_list(&self, location: &str) -> Result<ManifestList> {
        let path = self.path_of(location)?;
        let bytes = self
            .get(&path)
            .await?
            .ok_or_else(|| MinkError::StorageFailure(format!("lake: {location} is missing")))?;
        ManifestList::parse_with_version(&bytes, FormatVersion::V2)
            .map_err(|e| iceberg_err("reading a manifest list", e))
    }

    async fn manifest_list_if_any(&self, location: &str) -> Result<Option<ManifestList>> {
        let Some(bytes) = self.get(&self.path_of(location)?).await? else {
            return Ok(None);
        };
        ManifestList::parse_with_version(&bytes, FormatVersion::V2)
            .map(Some)
            .map_err(|e| iceberg_err("reading a manifest list", e))
    }

    async fn manifest(&self, location: &str) -> Result<iceberg::spec::Manifest> {
        let path = self.path_of(location)?;
        let bytes = self
            .get(&path)
            .await?
            .ok_or_else(|| MinkError::StorageFailure(format!("lake: {location} is missing")))?;
        iceberg::spec::Manifest::parse_avro(&bytes)
            .map_err(|e| iceberg_err("reading a manifest", e))
    }

    /// Stages the round's snapshot on top of `current` and, when buckets compact, a
    /// second one on top of it (`replace`: the merged files for the files they
    /// replace, offsets unchanged), both in the one new metadata version: an engine
    /// reading the table's appends incrementally sees the round's rows as an
    /// `append` and the merge as a `replace`, which it skips.
    async fn stage(
        &self,
        current: &LakeVersion,
        schema: &Schema,
        buckets: &[TieredBucket],
        token: &str,
    ) -> Result<Staged> {
        let mut rounds = Vec::with_capacity(buckets.len());
        let mut merges = Vec::new();
        for b in buckets {
            let (round, merge) = b.split_compaction();
            rounds.push(round);
            merges.extend(merge);
        }
        let location = Some(self.metadata_location(current.version));
        let first = self
            .stage_snapshot(
                &current.metadata,
                location,
                current.offsets(None)?,
                schema,
                &rounds,
                token,
            )
            .await?;
        if merges.is_empty() {
            return Ok(first);
        }
        let offsets = first.offsets.clone();
        let second = match self
            .stage_snapshot(&first.metadata, None, offsets, schema, &merges, token)
            .await
        {
            Ok(second) => second,
            Err(e) => {
                self.unstage(&first).await;
                return Err(e);
            }
        };
        let mut both = second;
        both.written.extend(first.written);
        both.expired_lists.extend(first.expired_lists);
        both.expired_metadata.extend(first.expired_metadata);
        Ok(both)
    }

    /// Writes the manifest and manifest list of a new snapshot on top of `base` (read
    /// from `base_location`, recorded in the metadata log when given) and builds the
    /// new metadata (not yet committed), in phases: the schema, the manifests
    /// ([`Stager::manifests`]), the manifest list, the snapshot, and the snapshots it
    /// expires. `offsets` are the buckets' lake offsets in `base`.
    async fn stage_snapshot(
        &self,
        base: &TableMetadata,
        base_location: Option<String>,
        mut offsets: BTreeMap<String, i64>,
        schema: &Schema,
        buckets: &[TieredBucket],
        token: &str,
    ) -> Result<Staged> {
        let builder = TableMetadataBuilder::new_from_metadata(base.clone(), base_location);
        let (mut builder, schema_ref) = with_schema(base, builder, schema)?;
        let parent = base.current_snapshot();
        let stager = Stager {
            table: self,
            io: FileIO::new_with_memory(),
            token,
            snapshot_id: (uuid::Uuid::new_v4().as_u64_pair().0 >> 1) as i64,
            sequence: base.next_sequence_number(),
            schema: schema_ref.clone(),
            spec: (**base.default_partition_spec()).clone(),
        };
        let previous: Vec<iceberg::spec::ManifestFile> = match parent {
            Some(p) => self
                .manifest_list(p.manifest_list())
                .await?
                .consume_entries()
                .into_iter()
                .collect(),
            None => Vec::new(),
        };
        let manifests = stager.manifests(buckets, previous).await?;
        let (list_location, list_path) = stager
            .manifest_list(parent.map(|p| p.snapshot_id()), manifests.files)
            .await?;
        let mut written = manifests.written;
        written.push(list_path);

        for b in buckets {
            offsets.insert(b.stream.clone(), b.to);
        }
        let mut properties = summary_properties(
            parent.map(|p| &p.summary().additional_properties),
            &manifests.added,
            &manifests.removed,
        );
        properties.insert(
            OFFSETS_KEY.into(),
            serde_json::to_string(&offsets).map_err(|e| MinkError::Internal(e.to_string()))?,
        );
        properties.insert(COMMIT_KEY.into(), token.to_string());
        let compaction = !buckets.is_empty()
            && buckets
                .iter()
                .all(|b| b.from == Some(b.to) && !b.replaces.is_empty());
        let summary = Summary {
            operation: match compaction {
                true => Operation::Replace,
                false => operation_of(&manifests.added, &manifests.removed),
            },
            additional_properties: properties,
        };
        let snapshot = Snapshot::builder()
            .with_snapshot_id(stager.snapshot_id)
            .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
            .with_sequence_number(stager.sequence)
            .with_timestamp_ms(crate::now_ms().max(base.last_updated_ms()))
            .with_manifest_list(list_location)
            .with_summary(summary)
            .with_schema_id(schema_ref.schema_id())
            .build();
        builder = builder
            .add_snapshot(snapshot)
            .map_err(|e| iceberg_err("adding a snapshot", e))?
            .set_ref(
                "main",
                SnapshotReference::new(
                    stager.snapshot_id,
                    SnapshotRetention::branch(None, None, None),
                ),
            )
            .map_err(|e| iceberg_err("moving main", e))?;
        let expired = self.expired(base);
        if !expired.is_empty() {
            let ids: Vec<i64> = expired.iter().map(|s| s.id).collect();
            builder = builder.remove_snapshots(&ids);
        }
        let built = builder
            .build()
            .map_err(|e| iceberg_err("building metadata", e))?;
        Ok(Staged {
            metadata: built.metadata,
            offsets,
            written,
            expired_lists: expired.into_iter().map(|s| s.manifest_list).collect(),
            expired_metadata: built
                .expired_metadata_logs
                .into_iter()
                .map(|m| m.metadata_file)
                .collect(),
        })
    }

    /// The snapshots of `base` a commit now expires, by the table's retention.
    fn expired(&self, base: &TableMetadata) -> Vec<Retained> {
        let snapshots = base
            .snapshots()
            .map(|s| Retained {
                sequence: s.sequence_number(),
                id: s.snapshot_id(),
                timestamp_ms: s.timestamp_ms(),
                manifest_list: s.manifest_list().to_string(),
            })
            .collect();
        expired_snapshots(snapshots, crate::now_ms(), self.retention)
    }

    /// The data files of snapshot `snapshot_id` of `version` (its current snapshot with
    /// `None`).
    pub async fn files(
        &self,
        version: &LakeVersion,
        snapshot_id: Option<i64>,
    ) -> Result<Vec<LakeFile>> {
        Ok(self.contents(version, snapshot_id).await?.data)
    }

    /// The data files and the delete files of snapshot `snapshot_id` of `version` (its
    /// current snapshot with `None`). Equality deletes (which Mink never writes: another
    /// engine committed them) are refused: Mink would read deleted rows as live.
    pub async fn contents(
        &self,
        version: &LakeVersion,
        snapshot_id: Option<i64>,
    ) -> Result<SnapshotFiles> {
        let snapshot = match snapshot_id {
            Some(id) => version.metadata.snapshot_by_id(id).cloned(),
            None => version.metadata.current_snapshot().cloned(),
        };
        let Some(snapshot) = snapshot else {
            return match snapshot_id {
                Some(id) => Err(MinkError::NotFound(format!("lake snapshot {id}"))),
                None => Ok(SnapshotFiles::default()),
            };
        };
        let list = self.manifest_list(snapshot.manifest_list()).await?;
        let mut out = SnapshotFiles::default();
        for m in list.entries() {
            let manifest = self.manifest(&m.manifest_path).await?;
            for e in manifest.entries() {
                if !e.is_alive() {
                    continue;
                }
                let content = match e.content_type() {
                    DataContentType::Data => FileContent::Data,
                    DataContentType::PositionDeletes => FileContent::PositionDeletes,
                    DataContentType::EqualityDeletes => {
                        return Err(MinkError::Unimplemented(format!(
                            "lake table {}: equality delete file {} (Mink writes none: \
                             another engine committed it, and Mink does not apply them)",
                            self.prefix,
                            e.file_path()
                        )));
                    }
                };
                let file = LakeFile {
                    location: e.file_path().to_string(),
                    record_count: e.record_count(),
                    size_bytes: e.file_size_in_bytes(),
                    content,
                    partition: e.data_file().partition().clone(),
                };
                match content {
                    FileContent::Data => out.data.push(file),
                    FileContent::PositionDeletes => out.deletes.push(file),
                }
            }
        }
        Ok(out)
    }

    /// The positions the delete files `deletes` delete, by data file.
    pub async fn read_deletes(&self, deletes: &[LakeFile]) -> Result<DeletedPositions> {
        let mut out = DeletedPositions::new();
        let mut reads = futures::stream::iter(deletes.iter().cloned().map(|file| {
            let lake = self.clone();
            async move {
                let batches = lake.read_file(&file).await?;
                Ok::<_, MinkError>((file, batches))
            }
        }))
        .buffered(DELETE_READS_IN_FLIGHT);
        while let Some((file, batches)) = reads.try_next().await? {
            for b in batches {
                let paths = b
                    .column_by_name("file_path")
                    .and_then(|c| c.as_string_opt::<i32>())
                    .ok_or_else(|| storage(&file.location, "no file_path column of strings"))?;
                let positions = b
                    .column_by_name("pos")
                    .and_then(|c| c.as_primitive_opt::<Int64Type>())
                    .ok_or_else(|| storage(&file.location, "no pos column of longs"))?;
                for i in 0..b.num_rows() {
                    if paths.is_null(i) || positions.is_null(i) || positions.value(i) < 0 {
                        return Err(storage(
                            &file.location,
                            format!("row {i} is not a position"),
                        ));
                    }
                    out.entry(paths.value(i).to_string())
                        .or_default()
                        .push(positions.value(i) as u64);
                }
            }
        }
        for positions in out.values_mut() {
            positions.sort_unstable();
            positions.dedup();
        }
        Ok(out)
    }

    /// Writes a position delete file (Iceberg v2: `file_path`, `pos`, sorted by both)
    /// deleting `positions` (by data file location, each list ascending) and returns its
    /// manifest entry. Named like the bucket's data files, so it lists under its bucket.
    pub async fn write_position_deletes(
        &self,
        stream: &str,
        first_offset: i64,
        positions: &BTreeMap<String, Vec<u64>>,
        partition: Struct,
    ) -> Result<DataFile> {
        let with_id = |f: arrow::datatypes::Field, id: i32| {
            f.with_metadata(HashMap::from([(
                parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(),
                id.to_string(),
            )]))
        };
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            with_id(
                arrow::datatypes::Field::new("file_path", ArrowType::Utf8, false),
                iceberg::metadata_columns::RESERVED_FIELD_ID_DELETE_FILE_PATH,
            ),
            with_id(
                arrow::datatypes::Field::new("pos", ArrowType::Int64, false),
                iceberg::metadata_columns::RESERVED_FIELD_ID_DELETE_FILE_POS,
            ),
        ]));
        let paths = arrow::array::StringArray::from_iter_values(
            positions
                .iter()
                .flat_map(|(path, ps)| std::iter::repeat_n(path.as_str(), ps.len())),
        );
        let pos = arrow::array::Int64Array::from_iter_values(
            positions.values().flatten().map(|p| *p as i64),
        );
        let batch = RecordBatch::try_new(schema, vec![Arc::new(paths), Arc::new(pos)])
            .map_err(|e| MinkError::Internal(format!("lake: position deletes: {e}")))?;
        let name = format!("{first_offset:020}-{}-deletes", token());
        self.write_parquet(
            stream,
            &name,
            &[batch],
            partition,
            DataContentType::PositionDeletes,
        )
        .await
    }

    /// The rows of one data file, in the file's own (lake) Arrow schema.
    pub async fn read_file(&self, file: &LakeFile) -> Result<Vec<RecordBatch>> {
        let path = self.path_of(&file.location)?;
        let bytes = self.get(&path).await?.ok_or_else(|| {
            MinkError::StorageFailure(format!("lake: {} is missing", file.location))
        })?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .map_err(|e| storage(&path, e))?
            .build()
            .map_err(|e| storage(&path, e))?;
        reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| storage(&path, e))
    }

    /// Columns `columns` (indices in the file's own schema) of a data file, in the
    /// file's row order. Only the footer and those columns' chunks are fetched (range
    /// GETs), not the whole file.
    pub async fn read_columns(
        &self,
        file: &LakeFile,
        columns: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        let path = self.path_of(&file.location)?;
        let reader = RangeReader {
            store: self.store.clone(),
            path: path.clone(),
            size: file.size_bytes,
        };
        let builder = parquet::arrow::ParquetRecordBatchStreamBuilder::new(reader)
            .await
            .map_err(|e| storage(&path, e))?;
        let mask = parquet::arrow::ProjectionMask::roots(
            builder.parquet_schema(),
            columns.iter().copied(),
        );
        builder
            .with_projection(mask)
            .build()
            .map_err(|e| storage(&path, e))?
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| storage(&path, e))
    }
}

/// A Parquet file read by ranges: the footer (with a hint large enough for its
/// metadata) and then only the column chunks a projection needs.
struct RangeReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
}

impl parquet::arrow::async_reader::AsyncFileReader for RangeReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Bytes>> {
        Box::pin(async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            let metadata = parquet::file::metadata::ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(FOOTER_HINT_BYTES))
                .load_and_finish(&mut *self, size)
                .await?;
            Ok(Arc::new(metadata))
        })
    }
}

/// `N` of a metadata version's file name `v{N}.metadata.json`.
fn version_number(file_name: &str) -> Option<u64> {
    file_name
        .strip_prefix('v')?
        .strip_suffix(".metadata.json")?
        .parse()
        .ok()
}

/// What an orphan sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepStats {
    pub kept: u64,
    pub deleted: u64,
    pub deleted_bytes: u64,
}

fn chrono_now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

/// A manifest being written.
struct ManifestOut {
    location: String,
    writer: iceberg::spec::ManifestWriter,
    entries: usize,
}

/// The table's newest schema made the current one of `builder` (schema evolution),
/// and the Iceberg schema that is: its id is the builder's to choose (an existing
/// identical schema is reused), so it is learnt first, as the manifests name it too.
fn with_schema(
    base: &TableMetadata,
    builder: TableMetadataBuilder,
    schema: &Schema,
) -> Result<(TableMetadataBuilder, iceberg::spec::SchemaRef)> {
    let wanted = iceberg_schema(schema)?;
    if base.current_schema().as_struct() == wanted.as_struct() {
        return Ok((builder, base.current_schema().clone()));
    }
    let builder = builder
        .add_current_schema(wanted.clone())
        .map_err(|e| iceberg_err("adding a schema", e))?;
    let schema_ref = TableMetadataBuilder::new_from_metadata(base.clone(), None)
        .add_current_schema(wanted)
        .and_then(|b| b.build())
        .map_err(|e| iceberg_err("adding a schema", e))?
        .metadata
        .current_schema()
        .clone();
    Ok((builder, schema_ref))
}

/// A snapshot's operation: `overwrite` when it removes files or adds both data and
/// delete files, `delete` when it adds delete files alone, `append` otherwise.
fn operation_of(added: &Tally, removed: &Tally) -> Operation {
    if removed.any() || (added.delete_files > 0 && added.files > 0) {
        Operation::Overwrite
    } else if added.delete_files > 0 {
        Operation::Delete
    } else {
        Operation::Append
    }
}

/// The data files of one log-table bucket a compaction merges into one: nothing
/// until at least `min_files` of `files` are smaller than `small_bytes` (0 turns
/// compaction off); then the oldest run of two or more files, consecutive in offset
/// order and each beginning where the one before ends (`first + record_count`), that
/// are all small, oldest first. A run without gaps, so that the merged file covers one
/// contiguous range of offsets as every file of a log bucket does (readers give a
/// batch one base offset): a gap (rows trimmed from the log while the lake was off)
/// ends a run. Files whose name holds no offset are never merged. Pure.
pub fn compaction_run(files: &[LakeFile], small_bytes: u64, min_files: usize) -> Vec<LakeFile> {
    let small = |f: &LakeFile| f.size_bytes < small_bytes;
    if min_files == 0 || files.iter().filter(|f| small(f)).count() < min_files {
        return Vec::new();
    }
    let mut ordered: Vec<(i64, &LakeFile)> = Vec::with_capacity(files.len());
    for f in files {
        match f.first_offset() {
            Some(first) if f.content == FileContent::Data => ordered.push((first, f)),
            _ => return Vec::new(),
        }
    }
    ordered.sort_by_key(|(first, _)| *first);
    let mut run: Vec<LakeFile> = Vec::new();
    let mut end = None;
    for (first, f) in ordered {
        let follows = end == Some(first) && run.last().is_none_or(|p| p.partition == f.partition);
        end = Some(first + f.record_count as i64);
        match (small(f), follows) {
            (true, true) => run.push(f.clone()),
            _ if run.len() >= 2 => break,
            (true, false) => run = vec![f.clone()],
            (false, _) => run.clear(),
        }
    }
    if run.len() < 2 {
        run.clear();
    }
    run
}

/// A snapshot as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Retained {
    sequence: i64,
    id: i64,
    timestamp_ms: i64,
    manifest_list: String,
}

/// The snapshots a commit at `now_ms` expires once it adds a new one: beyond the
/// newest `retention.min` (the new one counted), those older than
/// `retention.max_age_ms`, and the oldest beyond `retention.max` whatever their age.
/// Pure.
fn expired_snapshots(
    mut snapshots: Vec<Retained>,
    now_ms: i64,
    retention: LakeRetention,
) -> Vec<Retained> {
    snapshots.sort();
    let kept_at_least = retention.min.saturating_sub(1);
    let candidates = snapshots.len().saturating_sub(kept_at_least);
    let over_max = (snapshots.len() + 1).saturating_sub(retention.max);
    let oldest_kept =
        now_ms.saturating_sub(i64::try_from(retention.max_age_ms).unwrap_or(i64::MAX));
    snapshots
        .into_iter()
        .take(candidates)
        .enumerate()
        .filter(|(i, s)| *i < over_max || s.timestamp_ms < oldest_kept)
        .map(|(_, s)| s)
        .collect()
}

/// Whether a snapshot's manifests are merged into new ones: too many with the new
/// ones, or files are replaced (a replaced file becomes a deleted entry of the merged
/// manifest).
fn merges_manifests(previous: usize, new: usize, replaces: bool) -> bool {
    previous + new > MANIFESTS_MAX || replaces
}

/// What a new snapshot is written with ([`LakeTable::stage`]).
struct Stager<'a> {
    table: &'a LakeTable,
    io: FileIO,
    token: &'a str,
    snapshot_id: i64,
    sequence: i64,
    schema: iceberg::spec::SchemaRef,
    spec: iceberg::spec::PartitionSpec,
}

/// The manifests of a new snapshot ([`Stager::manifests`]).
struct Manifests {
    /// Every manifest the snapshot's list names, new ones first.
    files: Vec<iceberg::spec::ManifestFile>,
    /// The objects written.
    written: Vec<Path>,
    added: Tally,
    removed: Tally,
}

impl Stager<'_> {
    /// A manifest writer of `content` (a manifest holds one kind), the `i`th of the
    /// round.
    fn manifest_out(&self, i: usize, content: ManifestContentType) -> Result<ManifestOut> {
        let location = format!(
            "{}/metadata/{}-m{i}.avro",
            self.table.location(),
            self.token
        );
        let out = self
            .io
            .new_output(&location)
            .map_err(|e| iceberg_err("a manifest", e))?;
        let builder = ManifestWriterBuilder::new(
            out,
            Some(self.snapshot_id),
            self.schema.clone(),
            self.spec.clone(),
        );
        let writer = match content {
            ManifestContentType::Data => builder.build_v2_data(),
            ManifestContentType::Deletes => builder.build_v2_deletes(),
        };
        Ok(ManifestOut {
            location,
            writer,
            entries: 0,
        })
    }

    /// The new files' manifests (data and deletes apart), then the previous
    /// snapshot's, merged into new ones when [`merges_manifests`] says so; each
    /// written to the store.
    async fn manifests(
        &self,
        buckets: &[TieredBucket],
        mut previous: Vec<iceberg::spec::ManifestFile>,
    ) -> Result<Manifests> {
        let mut outs = vec![
            self.manifest_out(0, ManifestContentType::Data)?,
            self.manifest_out(1, ManifestContentType::Deletes)?,
        ];
        let mut added = Tally::default();
        for f in buckets.iter().flat_map(|b| &b.files) {
            added.count(f);
            let out = &mut outs[usize::from(f.content_type() != DataContentType::Data)];
            out.writer
                .add_file(f.clone(), self.sequence)
                .map_err(|e| iceberg_err("a manifest entry", e))?;
            out.entries += 1;
        }
        let replaced: std::collections::HashSet<&str> = buckets
            .iter()
            .flat_map(|b| b.replaces.iter().map(String::as_str))
            .collect();
        let mut removed = Tally::default();
        let new_manifests = outs.iter().filter(|o| o.entries > 0).count();
        if merges_manifests(previous.len(), new_manifests, !replaced.is_empty()) {
            outs.push(self.manifest_out(2, ManifestContentType::Data)?);
            outs.push(self.manifest_out(3, ManifestContentType::Deletes)?);
            for m in &previous {
                let out = &mut outs[if m.content == ManifestContentType::Data {
                    2
                } else {
                    3
                }];
                self.merge(m, out, &replaced, &mut removed).await?;
            }
            previous.clear();
        }
        // Every file the round replaces must still be in the table: a round that read
        // the bucket's files before another writer replaced some of them must not
        // replace them again (its rows would then be in the table twice).
        let found = removed.files + removed.delete_files;
        if found != replaced.len() as u64 {
            return Err(MinkError::Unavailable(format!(
                "lake: {} of the {} files this round replaces are no longer in the table \
                 (another writer changed the bucket); the round is dropped",
                replaced.len() as u64 - found.min(replaced.len() as u64),
                replaced.len()
            )));
        }
        let mut files = Vec::new();
        let mut written = Vec::new();
        for out in outs {
            // A round whose buckets' changes cancelled out (a primary-key bucket whose
            // keys were all deleted) adds no file, and no manifest.
            if out.entries == 0 {
                continue;
            }
            let manifest = out
                .writer
                .write_manifest_file()
                .await
                .map_err(|e| iceberg_err("writing a manifest", e))?;
            written.push(self.upload(&out.location, "a manifest").await?);
            files.push(manifest);
        }
        files.extend(previous);
        Ok(Manifests {
            files,
            written,
            added,
            removed,
        })
    }

    /// Carries manifest `m`'s live entries into `out`: as existing files, or, for the
    /// files in `replaced`, as deleted entries (counted in `removed`).
    async fn merge(
        &self,
        m: &iceberg::spec::ManifestFile,
        out: &mut ManifestOut,
        replaced: &std::collections::HashSet<&str>,
        removed: &mut Tally,
    ) -> Result<()> {
        let manifest = self.table.manifest(&m.manifest_path).await?;
        for entry in manifest.entries() {
            if entry.status() == ManifestStatus::Deleted {
                continue;
            }
            let seq = entry.sequence_number().unwrap_or(m.sequence_number);
            out.entries += 1;
            if replaced.contains(entry.file_path()) {
                removed.count(entry.data_file());
                out.writer
                    .add_delete_file(entry.data_file().clone(), seq, Some(seq))
                    .map_err(|e| iceberg_err("removing a replaced file", e))?;
                continue;
            }
            out.writer
                .add_existing_file(
                    entry.data_file().clone(),
                    entry.snapshot_id().unwrap_or(m.added_snapshot_id),
                    seq,
                    Some(seq),
                )
                .map_err(|e| iceberg_err("merging manifests", e))?;
        }
        Ok(())
    }

    /// Writes the snapshot's manifest list naming `manifests`; its location and path.
    async fn manifest_list(
        &self,
        parent: Option<i64>,
        manifests: Vec<iceberg::spec::ManifestFile>,
    ) -> Result<(String, Path)> {
        let location = format!(
            "{}/metadata/snap-{}-{}.avro",
            self.table.location(),
            self.snapshot_id,
            self.token
        );
        let out = self
            .io
            .new_output(&location)
            .map_err(|e| iceberg_err("a manifest list", e))?;
        let file = out
            .writer()
            .await
            .map_err(|e| iceberg_err("a manifest list", e))?;
        let mut list = ManifestListWriter::v2(file, self.snapshot_id, parent, self.sequence);
        list.add_manifests(manifests.into_iter())
            .map_err(|e| iceberg_err("a manifest list", e))?;
        list.close()
            .await
            .map_err(|e| iceberg_err("a manifest list", e))?;
        let path = self.upload(&location, "a manifest list").await?;
        Ok((location, path))
    }

    /// Copies what was written at `location` in memory to the store.
    async fn upload(&self, location: &str, what: &str) -> Result<Path> {
        let bytes = self
            .io
            .new_input(location)
            .map_err(|e| iceberg_err(what, e))?
            .read()
            .await
            .map_err(|e| iceberg_err(what, e))?;
        let path = self.table.path_of(location)?;
        self.table
            .store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| storage(&path, e))?;
        Ok(path)
    }
}

/// Files a snapshot adds or removes, for its summary.
#[derive(Default)]
struct Tally {
    files: u64,
    rows: u64,
    delete_files: u64,
    deleted_positions: u64,
    bytes: u64,
}

impl Tally {
    fn count(&mut self, f: &DataFile) {
        self.bytes += f.file_size_in_bytes();
        if f.content_type() == DataContentType::Data {
            self.files += 1;
            self.rows += f.record_count();
        } else {
            self.delete_files += 1;
            self.deleted_positions += f.record_count();
        }
    }

    fn any(&self) -> bool {
        self.files + self.delete_files > 0
    }
}

/// A snapshot summary's counts (Iceberg's names; sizes count data and delete files),
/// the totals carried on from the parent's.
fn summary_properties(
    parent: Option<&HashMap<String, String>>,
    added: &Tally,
    removed: &Tally,
) -> HashMap<String, String> {
    let total = |key: &str, added: u64, removed: u64| {
        let before: u64 = parent
            .and_then(|s| s.get(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (before + added).saturating_sub(removed).to_string()
    };
    let mut p: HashMap<String, String> = HashMap::from([
        ("added-data-files".into(), added.files.to_string()),
        ("added-records".into(), added.rows.to_string()),
        ("added-files-size".into(), added.bytes.to_string()),
        (
            "total-data-files".into(),
            total("total-data-files", added.files, removed.files),
        ),
        (
            "total-records".into(),
            total("total-records", added.rows, removed.rows),
        ),
        (
            "total-files-size".into(),
            total("total-files-size", added.bytes, removed.bytes),
        ),
        (
            "total-delete-files".into(),
            total(
                "total-delete-files",
                added.delete_files,
                removed.delete_files,
            ),
        ),
        (
            "total-position-deletes".into(),
            total(
                "total-position-deletes",
                added.deleted_positions,
                removed.deleted_positions,
            ),
        ),
        ("total-equality-deletes".into(), "0".into()),
    ]);
    if added.delete_files > 0 {
        p.insert("added-delete-files".into(), added.delete_files.to_string());
        p.insert(
            "added-position-delete-files".into(),
            added.delete_files.to_string(),
        );
        p.insert(
            "added-position-deletes".into(),
            added.deleted_positions.to_string(),
        );
    }
    if removed.any() {
        p.insert("deleted-data-files".into(), removed.files.to_string());
        p.insert("deleted-records".into(), removed.rows.to_string());
        p.insert("removed-files-size".into(), removed.bytes.to_string());
        p.insert(
            "removed-delete-files".into(),
            removed.delete_files.to_string(),
        );
        p.insert(
            "removed-position-delete-files".into(),
            removed.delete_files.to_string(),
        );
        p.insert(
            "removed-position-deletes".into(),
            removed.deleted_positions.to_string(),
        );
    }
    p
}

struct Staged {
    metadata: TableMetadata,
    offsets: BTreeMap<String, i64>,
    /// Manifests and the manifest list, deleted if the commit loses.
    written: Vec<Path>,
    expired_lists: Vec<String>,
    expired_metadata: Vec<String>,
}

/// The Iceberg partition value of lake rows of one Mink partition: the partition-key
/// columns of the first row (every row of a bucket of a partition has the same) and,
/// with `time`, its time transform of the first row (a file's rows share it: a round
/// cuts a bucket's rows with [`crate::transform::runs`]).
pub fn partition_value(
    schema: &Schema,
    partition_keys: &[String],
    time: Option<&LakePartition>,
    batch: &RecordBatch,
) -> Result<Struct> {
    if partition_keys.is_empty() && time.is_none() {
        return Ok(Struct::empty());
    }
    let mut values = Vec::with_capacity(partition_keys.len() + 1);
    for name in partition_keys {
        let index = schema.index_of(name).ok_or_else(|| {
            MinkError::Internal(format!("partition key {name:?} is not a column"))
        })?;
        let a = batch.column(index);
        if a.is_empty() || a.is_null(0) {
            values.push(None);
            continue;
        }
        let v = match a.data_type() {
            ArrowType::Int32 => PrimitiveLiteral::Int(a.as_primitive::<Int32Type>().value(0)),
            ArrowType::Date32 => PrimitiveLiteral::Int(a.as_primitive::<Date32Type>().value(0)),
            ArrowType::Int64 => PrimitiveLiteral::Long(a.as_primitive::<Int64Type>().value(0)),
            ArrowType::Boolean => PrimitiveLiteral::Boolean(a.as_boolean().value(0)),
            ArrowType::Utf8 => PrimitiveLiteral::String(a.as_string::<i32>().value(0).to_string()),
            other => {
                return Err(MinkError::Internal(format!(
                    "partition key {name:?} has lake type {other}"
                )));
            }
        };
        values.push(Some(Literal::Primitive(v)));
    }
    if let Some(time) = time {
        let column = batch.column(crate::transform::column_index(schema, time)?);
        let value = match column.is_empty() {
            true => None,
            false => crate::transform::values(time.transform, &column.slice(0, 1))?[0],
        };
        values.push(value.map(|v| Literal::Primitive(PrimitiveLiteral::Int(v))));
    }
    Ok(Struct::from_iter(values))
}

#[cfg(test)]
mod stage_tests {
    use super::*;

    fn file(first: i64, size: u64) -> LakeFile {
        LakeFile {
            location: format!("memory:///lake/db/t/data/t1-b0/{first:020}-tok.parquet"),
            record_count: 10,
            size_bytes: size,
            content: FileContent::Data,
            partition: Struct::empty(),
        }
    }

    fn firsts(run: &[LakeFile]) -> Vec<i64> {
        run.iter().map(|f| f.first_offset().unwrap()).collect()
    }

    #[test]
    fn compaction_merges_the_oldest_run_of_small_files_once_enough_are_small() {
        let (small, big) = (100, 10_000);
        // Out of offset order, as manifests list them; a big file splits the runs.
        let files = vec![
            file(40, small),
            file(0, small),
            file(30, big),
            file(10, small),
            file(20, small),
            file(50, small),
        ];
        assert!(compaction_run(&files, 1000, 6).is_empty(), "5 small < 6");
        assert!(compaction_run(&files, 1000, 0).is_empty(), "0 is off");
        assert_eq!(firsts(&compaction_run(&files, 1000, 5)), vec![0, 10, 20]);
        // A lone small file before a big one is no run: the next run is.
        let files = vec![
            file(0, small),
            file(10, big),
            file(20, small),
            file(30, small),
        ];
        assert_eq!(firsts(&compaction_run(&files, 1000, 2)), vec![20, 30]);
        // A gap in offsets (rows trimmed while the lake was off) ends a run.
        let files = vec![
            file(0, small),
            file(10, small),
            file(25, small),
            file(35, small),
        ];
        assert_eq!(firsts(&compaction_run(&files, 1000, 2)), vec![0, 10]);
        let files = vec![file(0, small), file(15, small), file(25, small)];
        assert_eq!(firsts(&compaction_run(&files, 1000, 2)), vec![15, 25]);
        // No run of two: nothing.
        let files = vec![file(0, small), file(10, big), file(20, small)];
        assert!(compaction_run(&files, 1000, 2).is_empty());
        // A file whose name holds no offset, or a delete file: never merged.
        let mut odd = file(0, small);
        odd.location = "memory:///lake/db/t/data/t1-b0/stray.parquet".into();
        assert!(compaction_run(&[odd, file(10, small), file(20, small)], 1000, 2).is_empty());
        let mut deletes = file(0, small);
        deletes.content = FileContent::PositionDeletes;
        assert!(compaction_run(&[deletes, file(10, small), file(20, small)], 1000, 2).is_empty());
    }

    #[test]
    fn a_snapshot_operation_follows_what_it_adds_and_removes() {
        let tally = |files, delete_files| Tally {
            files,
            delete_files,
            ..Tally::default()
        };
        let none = Tally::default();
        assert_eq!(operation_of(&tally(2, 0), &none), Operation::Append);
        assert_eq!(operation_of(&tally(0, 1), &none), Operation::Delete);
        // A merge-on-read round: a delta file and its position deletes.
        assert_eq!(operation_of(&tally(1, 1), &none), Operation::Overwrite);
        // A rewrite: new files replace old ones.
        assert_eq!(
            operation_of(&tally(1, 0), &tally(3, 2)),
            Operation::Overwrite
        );
        assert_eq!(operation_of(&none, &none), Operation::Append);
    }

    /// `n` snapshots committed a minute apart, the newest at `newest_ms`, listed out
    /// of order as a table's metadata may list them.
    fn minutely(n: i64, newest_ms: i64) -> Vec<Retained> {
        (0..n)
            .rev()
            .map(|i| Retained {
                sequence: i,
                id: 100 + i,
                timestamp_ms: newest_ms - (n - 1 - i) * 60_000,
                manifest_list: format!("l{i}"),
            })
            .collect()
    }

    fn ids(expired: &[Retained]) -> Vec<i64> {
        expired.iter().map(|s| s.id).collect()
    }

    #[test]
    fn snapshots_expire_past_their_age_but_the_newest_stay() {
        let now = 1_000_000_000;
        let hour = LakeRetention {
            max_age_ms: 3_600_000,
            min: 10,
            max: 2000,
        };
        // 70 minutely snapshots: the 9 oldest are past the hour (ages 61..69 min;
        // 60 is not older than an hour).
        let expired = expired_snapshots(minutely(70, now), now, hour);
        assert_eq!(ids(&expired), (100..109).collect::<Vec<_>>());
        // Snapshots of a table whose rounds stopped long ago: all past the age, but
        // the newest `min` (with the new one) stay.
        let stale = expired_snapshots(minutely(30, now - 86_400_000), now, hour);
        assert_eq!(
            ids(&stale),
            (100..121).collect::<Vec<_>>(),
            "9 old ones + the new one"
        );
        // Fewer than `min`: nothing expires.
        assert!(expired_snapshots(minutely(5, now - 86_400_000), now, hour).is_empty());
        assert!(expired_snapshots(Vec::new(), now, hour).is_empty());
    }

    #[test]
    fn the_oldest_snapshots_past_the_most_kept_expire_whatever_their_age() {
        let now = 1_000_000_000;
        let day = LakeRetention {
            max_age_ms: 86_400_000,
            min: 10,
            max: 100,
        };
        assert!(expired_snapshots(minutely(99, now), now, day).is_empty());
        let expired = expired_snapshots(minutely(102, now), now, day);
        assert_eq!(
            ids(&expired),
            vec![100, 101, 102],
            "the new one makes three too many"
        );
        assert_eq!(expired[0].manifest_list, "l0");
        // `min` never lets `max` keep fewer than it.
        let tight = LakeRetention {
            max_age_ms: 86_400_000,
            min: 1,
            max: 1,
        };
        assert_eq!(
            ids(&expired_snapshots(minutely(3, now), now, tight)),
            vec![100, 101, 102]
        );
    }

    #[test]
    fn manifests_merge_past_the_limit_or_when_files_are_replaced() {
        assert!(!merges_manifests(MANIFESTS_MAX - 2, 2, false));
        assert!(merges_manifests(MANIFESTS_MAX - 1, 2, false));
        assert!(merges_manifests(0, 1, true));
    }
}
