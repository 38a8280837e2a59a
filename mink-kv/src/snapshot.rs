//! KV snapshots on object storage: a bucket's whole state at one log offset, as an
//! Arrow IPC stream of the table's schema at the time, at
//! `{prefix}/{offset:020}.arrow`. The newest `retain` are kept. Recovery loads the
//! newest snapshot into the local store and replays the changelog from its offset.
//!
//! The table may be altered after a snapshot is written, so the stream's schema
//! metadata records the schema id its rows are written under
//! ([`SCHEMA_ID_METADATA_KEY`]); a loader reads them as that schema version and lets
//! the schema-evolution rules carry them to the current one, as for stored rows.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use futures::TryStreamExt;
use mink_types::{MinkError, Result, Schema, SchemaId};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// Rows per Arrow batch in a snapshot.
pub const SNAPSHOT_BATCH_ROWS: usize = 8_192;

/// The Arrow schema metadata key holding the schema id a snapshot's rows are written
/// under (decimal). Snapshots written before it was recorded lack it.
pub const SCHEMA_ID_METADATA_KEY: &str = "mink.schema_id";

/// A snapshot read back: its rows, and the schema id they were written under when the
/// snapshot records it.
#[derive(Debug, Clone)]
pub struct SnapshotData {
    pub schema_id: Option<SchemaId>,
    pub batches: Vec<RecordBatch>,
}

/// Where one bucket's snapshots live.
#[derive(Clone)]
pub struct SnapshotStore {
    pub store: Arc<dyn ObjectStore>,
    /// e.g. `kv/t3/p-/b1` (see `TableBucket`).
    pub prefix: String,
    /// Snapshots kept (at least 1).
    pub retain: usize,
}

/// A written snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The log offset the snapshot covers: replay starts here.
    pub log_offset: i64,
    pub location: String,
    pub rows: u64,
    pub bytes: u64,
    /// When it was written (its object's last-modified time for one found in the
    /// store), in milliseconds since the epoch.
    pub written_at_ms: i64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn storage(e: object_store::Error) -> MinkError {
    MinkError::StorageFailure(format!("KV snapshot: {e}"))
}

impl SnapshotStore {
    fn path(&self, offset: i64) -> Path {
        Path::from(format!("{}/{offset:020}.arrow", self.prefix))
    }

    /// Snapshot offsets, oldest first.
    pub async fn list(&self) -> Result<Vec<i64>> {
        let mut offsets: Vec<i64> = self
            .store
            .list(Some(&Path::from(self.prefix.as_str())))
            .try_filter_map(|m| async move {
                Ok(m.location
                    .filename()
                    .and_then(|f| f.strip_suffix(".arrow"))
                    .and_then(|f| f.parse::<i64>().ok()))
            })
            .try_collect()
            .await
            .map_err(storage)?;
        offsets.sort_unstable();
        Ok(offsets)
    }

    /// Writes batches as the snapshot at `offset`, then deletes all but the newest
    /// `retain`.
    pub async fn write(
        &self,
        schema: &Schema,
        offset: i64,
        batches: &[RecordBatch],
    ) -> Result<SnapshotInfo> {
        let mut buf = Vec::new();
        {
            let arrow = schema.to_arrow();
            let mut metadata = arrow.metadata().clone();
            metadata.insert(
                SCHEMA_ID_METADATA_KEY.to_string(),
                schema.schema_id.to_string(),
            );
            let arrow = arrow.as_ref().clone().with_metadata(metadata);
            let mut writer = StreamWriter::try_new(&mut buf, &arrow)?;
            for b in batches {
                writer.write(b)?;
            }
            writer.finish()?;
        }
        let bytes = buf.len() as u64;
        let path = self.path(offset);
        self.store
            .put(&path, PutPayload::from(buf))
            .await
            .map_err(storage)?;
        let offsets = self.list().await?;
        let keep = self.retain.max(1);
        if offsets.len() > keep {
            // Never the one just written: its writer lets the log be trimmed up to it
            // (snapshots above it, from another history, would otherwise push it out).
            for old in offsets[..offsets.len() - keep]
                .iter()
                .filter(|o| **o != offset)
            {
                match self.store.delete(&self.path(*old)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => tracing::warn!("could not delete old KV snapshot {old}: {e}"),
                }
            }
        }
        metrics::counter!("mink_kv_snapshots_written_total").increment(1);
        Ok(SnapshotInfo {
            log_offset: offset,
            location: path.to_string(),
            rows: batches.iter().map(|b| b.num_rows() as u64).sum(),
            bytes,
            written_at_ms: now_ms(),
        })
    }

    /// The newest snapshot, or `None` when there is none. It is read back to count
    /// its rows.
    pub async fn newest(&self) -> Result<Option<SnapshotInfo>> {
        let found: Vec<(i64, object_store::ObjectMeta)> = self
            .store
            .list(Some(&Path::from(self.prefix.as_str())))
            .try_filter_map(|m| async move {
                Ok(m.location
                    .filename()
                    .and_then(|f| f.strip_suffix(".arrow"))
                    .and_then(|f| f.parse::<i64>().ok())
                    .map(|offset| (offset, m)))
            })
            .try_collect()
            .await
            .map_err(storage)?;
        let Some((offset, meta)) = found.into_iter().max_by_key(|(offset, _)| *offset) else {
            return Ok(None);
        };
        let rows = self
            .read(offset)
            .await?
            .iter()
            .map(|b| b.num_rows() as u64)
            .sum();
        Ok(Some(SnapshotInfo {
            log_offset: offset,
            location: meta.location.to_string(),
            rows,
            bytes: meta.size,
            written_at_ms: meta.last_modified.timestamp_millis(),
        }))
    }

    /// Reads the snapshot at `offset` as Arrow batches.
    pub async fn read(&self, offset: i64) -> Result<Vec<RecordBatch>> {
        Ok(self.read_data(offset).await?.batches)
    }

    /// Reads the snapshot at `offset` with the schema id its rows are written under.
    pub async fn read_data(&self, offset: i64) -> Result<SnapshotData> {
        let bytes = self
            .store
            .get(&self.path(offset))
            .await
            .map_err(storage)?
            .bytes()
            .await
            .map_err(storage)?;
        let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
        let schema_id = reader
            .schema()
            .metadata()
            .get(SCHEMA_ID_METADATA_KEY)
            .map(|id| {
                id.parse::<SchemaId>().map_err(|_| {
                    MinkError::Internal(format!(
                        "KV snapshot at {offset}: schema id {id:?} is not a number"
                    ))
                })
            })
            .transpose()?;
        let batches = reader
            .map(|b| b.map_err(|e| MinkError::Internal(format!("KV snapshot at {offset}: {e}"))))
            .collect::<Result<_>>()?;
        Ok(SnapshotData { schema_id, batches })
    }
}
