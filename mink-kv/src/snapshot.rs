//! KV snapshots on object storage: a bucket's whole state at one log offset, as an
//! Arrow IPC stream of the table's schema at the time, at
//! `{prefix}/{offset:020}.arrow`. The newest `retain` are kept. Recovery loads the
//! newest snapshot into the local store and replays the changelog from its offset.
//!
//! The table may be altered after a snapshot is written, so the stream's schema
//! metadata records the schema id its rows are written under
//! ([`SCHEMA_ID_METADATA_KEY`]); a loader reads them as that schema version and lets
//! the schema-evolution rules carry them to the current one, as for stored rows.
//!
//! A snapshot is as large as the bucket's state, so neither side holds it whole: a
//! [`SnapshotWriter`] encodes batch by batch and uploads with one PUT up to
//! `part_bytes`, as a multipart upload of `part_bytes` parts beyond it; a
//! [`SnapshotReader`] decodes the object's bytes as they arrive. Either holds a few
//! batches and parts in memory, whatever the snapshot's size.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mink_types::{Compression, MinkError, Result, Schema, SchemaId};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

/// Rows per Arrow batch in a snapshot, at most.
pub const SNAPSHOT_BATCH_ROWS: usize = 8_192;

/// Stored bytes per Arrow batch in a snapshot, at most (past it the batch ends early,
/// after at least one row): wide rows do not make a batch of 8,192 rows gigabytes.
pub const SNAPSHOT_BATCH_BYTES: usize = 8 << 20;

/// The size of a snapshot's upload parts: a snapshot up to this is one PUT, a larger
/// one a multipart upload of parts this size (S3 wants at least 5 MiB but the last).
pub const SNAPSHOT_PART_BYTES: usize = 8 << 20;

/// Parts of one snapshot uploaded at once.
const SNAPSHOT_PARTS_IN_FLIGHT: usize = 2;

/// The Arrow schema metadata key holding the schema id a snapshot's rows are written
/// under (decimal). Snapshots written before it was recorded lack it.
pub const SCHEMA_ID_METADATA_KEY: &str = "mink.schema_id";

/// A snapshot read back whole: its rows, and the schema id they were written under
/// when the snapshot records it. For tests and small snapshots; a loader streams
/// ([`SnapshotStore::open`]).
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
    /// Upload part size ([`SNAPSHOT_PART_BYTES`]).
    part_bytes: usize,
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
    pub fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<String>, retain: usize) -> Self {
        Self {
            store,
            prefix: prefix.into(),
            retain,
            part_bytes: SNAPSHOT_PART_BYTES,
        }
    }

    /// The same store with upload parts of `bytes` (tests: multipart uploads of small
    /// snapshots).
    pub fn with_part_bytes(mut self, bytes: usize) -> Self {
        self.part_bytes = bytes.max(1);
        self
    }

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

    /// Starts the snapshot at `offset`, of rows written under `schema`, their IPC
    /// bodies compressed as `compression` says (Arrow IPC body compression: the
    /// snapshot's reader, and any Arrow reader, decodes each batch as it was written).
    pub fn writer(
        &self,
        schema: &Schema,
        offset: i64,
        compression: Compression,
    ) -> Result<SnapshotWriter> {
        let arrow = schema.to_arrow();
        let mut metadata = arrow.metadata().clone();
        metadata.insert(
            SCHEMA_ID_METADATA_KEY.to_string(),
            schema.schema_id.to_string(),
        );
        let arrow = arrow.as_ref().clone().with_metadata(metadata);
        let path = self.path(offset);
        Ok(SnapshotWriter {
            ipc: StreamWriter::try_new_with_options(Vec::new(), &arrow, compression.ipc_options())?,
            upload: Some(
                BufWriter::with_capacity(self.store.clone(), path.clone(), self.part_bytes)
                    .with_max_concurrency(SNAPSHOT_PARTS_IN_FLIGHT),
            ),
            store: self.clone(),
            path,
            offset,
            rows: 0,
            bytes: 0,
        })
    }

    /// Writes batches as the snapshot at `offset`, then deletes all but the newest
    /// `retain` ([`SnapshotStore::writer`] for batches that are not all in memory).
    pub async fn write(
        &self,
        schema: &Schema,
        offset: i64,
        batches: &[RecordBatch],
        compression: Compression,
    ) -> Result<SnapshotInfo> {
        let mut writer = self.writer(schema, offset, compression)?;
        for b in batches {
            writer.write(b).await?;
        }
        writer.finish().await
    }

    /// Deletes all but the newest `retain` snapshots, never the one at `written`: its
    /// writer lets the log be trimmed up to it (snapshots above it, from another
    /// history, would otherwise push it out).
    async fn retire(&self, written: i64) -> Result<()> {
        let offsets = self.list().await?;
        let keep = self.retain.max(1);
        if offsets.len() > keep {
            for old in offsets[..offsets.len() - keep]
                .iter()
                .filter(|o| **o != written)
            {
                match self.store.delete(&self.path(*old)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => tracing::warn!("could not delete old KV snapshot {old}: {e}"),
                }
            }
        }
        Ok(())
    }

    /// The newest snapshot as listed, its `rows` not counted (0): reading a large
    /// snapshot through costs what reading the state does
    /// ([`SnapshotStore::count_rows`]).
    pub async fn newest_uncounted(&self) -> Result<Option<SnapshotInfo>> {
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
        Ok(found
            .into_iter()
            .max_by_key(|(offset, _)| *offset)
            .map(|(offset, meta)| SnapshotInfo {
                log_offset: offset,
                location: meta.location.to_string(),
                rows: 0,
                bytes: meta.size,
                written_at_ms: meta.last_modified.timestamp_millis(),
            }))
    }

    /// The rows of the snapshot at `offset`, read through one batch at a time.
    pub async fn count_rows(&self, offset: i64) -> Result<u64> {
        let mut reader = self.open(offset).await?;
        let mut rows = 0;
        while let Some(b) = reader.next().await? {
            rows += b.num_rows() as u64;
        }
        Ok(rows)
    }

    /// Reads the snapshot at `offset` whole, as Arrow batches.
    pub async fn read(&self, offset: i64) -> Result<Vec<RecordBatch>> {
        Ok(self.read_data(offset).await?.batches)
    }

    /// Reads the snapshot at `offset` whole, with the schema id its rows are written
    /// under.
    pub async fn read_data(&self, offset: i64) -> Result<SnapshotData> {
        let mut reader = self.open(offset).await?;
        let mut batches = Vec::new();
        while let Some(b) = reader.next().await? {
            batches.push(b);
        }
        Ok(SnapshotData {
            schema_id: reader.schema_id(),
            batches,
        })
    }

    /// Opens the snapshot at `offset` for reading batch by batch: its schema is read
    /// here, its rows as [`SnapshotReader::next`] asks for them.
    pub async fn open(&self, offset: i64) -> Result<SnapshotReader> {
        let path = self.path(offset);
        let meta = self.store.head(&path).await.map_err(storage)?;
        let mut reader = SnapshotReader {
            offset,
            store: self.store.clone(),
            path,
            size: meta.size,
            etag: meta.e_tag,
            received: 0,
            range_bytes: self.part_bytes as u64,
            pending: Buffer::from(Vec::<u8>::new()),
            decoder: StreamDecoder::new(),
            tail: Vec::with_capacity(EOS.len()),
            schema_id: None,
            first: None,
        };
        // The schema message comes first; a batch decoded with it waits for `next`.
        while reader.decoder.schema().is_none() && !reader.drained() {
            reader.fill().await?;
            reader.first = reader.decode()?;
        }
        let schema = reader
            .decoder
            .schema()
            .ok_or_else(|| reader.corrupt("no schema"))?;
        reader.schema_id = schema
            .metadata()
            .get(SCHEMA_ID_METADATA_KEY)
            .map(|id| {
                id.parse::<SchemaId>()
                    .map_err(|_| reader.corrupt(&format!("schema id {id:?} is not a number")))
            })
            .transpose()?;
        Ok(reader)
    }
}

/// A snapshot being written ([`SnapshotStore::writer`]). Dropped before
/// [`SnapshotWriter::finish`] (an error, a cancelled request), it aborts its multipart
/// upload, so that no parts linger in the store.
pub struct SnapshotWriter {
    ipc: StreamWriter<Vec<u8>>,
    upload: Option<BufWriter>,
    store: SnapshotStore,
    path: Path,
    offset: i64,
    rows: u64,
    bytes: u64,
}

impl SnapshotWriter {
    /// Adds `batch` to the snapshot; its bytes leave for the store a part at a time.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.ipc.write(batch)?;
        self.rows += batch.num_rows() as u64;
        self.send().await
    }

    /// Hands the bytes encoded so far to the upload, which waits while
    /// `SNAPSHOT_PARTS_IN_FLIGHT` parts are uploading.
    async fn send(&mut self) -> Result<()> {
        let bytes = std::mem::take(self.ipc.get_mut());
        if bytes.is_empty() {
            return Ok(());
        }
        self.bytes += bytes.len() as u64;
        let upload = self.upload.as_mut().ok_or_else(|| {
            MinkError::Internal("KV snapshot: a write after the upload ended".into())
        })?;
        upload.put(Bytes::from(bytes)).await.map_err(storage)
    }

    /// Completes the snapshot's object, then deletes all but the newest `retain`.
    pub async fn finish(mut self) -> Result<SnapshotInfo> {
        self.ipc.finish()?;
        self.send().await?;
        let mut upload = self
            .upload
            .take()
            .ok_or_else(|| MinkError::Internal("KV snapshot: the upload ended twice".into()))?;
        // Completed in a task of its own: a caller cancelled meanwhile (a read that
        // asked for this snapshot, gone) does not strand the parts in flight; the task
        // completes the object, or aborts the upload when that fails.
        tokio::spawn(async move { upload.shutdown().await })
            .await
            .map_err(|e| MinkError::Internal(format!("KV snapshot: the upload task: {e}")))?
            .map_err(|e| MinkError::StorageFailure(format!("KV snapshot: {e}")))?;
        self.store.retire(self.offset).await?;
        metrics::counter!("mink_kv_snapshots_written_total").increment(1);
        Ok(SnapshotInfo {
            log_offset: self.offset,
            location: self.path.to_string(),
            rows: self.rows,
            bytes: self.bytes,
            written_at_ms: now_ms(),
        })
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        let Some(mut upload) = self.upload.take() else {
            return;
        };
        // Nothing is uploaded before the first part is full; past it, the parts sent
        // are aborted (without a runtime, the store's own expiry of incomplete uploads
        // must clean them up).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let path = self.path.clone();
            runtime.spawn(async move {
                if let Err(e) = upload.abort().await {
                    tracing::warn!("could not abort the KV snapshot upload to {path}: {e}");
                }
            });
        }
    }
}

/// The end-of-stream marker an Arrow IPC stream ends with: a continuation and a zero
/// length. A snapshot without it was cut short.
const EOS: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

/// A snapshot being read ([`SnapshotStore::open`]). The object is fetched in ranged
/// GETs of `part_bytes`, each read whole as it arrives (a request's timeout covers a
/// range, not the time a slow consumer takes over the whole state), and all of one
/// version (`If-Match` its etag). The bytes are decoded as they come.
pub struct SnapshotReader {
    offset: i64,
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    etag: Option<String>,
    /// Bytes fetched so far.
    received: u64,
    range_bytes: u64,
    /// Bytes received and not decoded yet.
    pending: Buffer,
    decoder: StreamDecoder,
    /// The last bytes received (up to `EOS.len()`).
    tail: Vec<u8>,
    schema_id: Option<SchemaId>,
    /// A batch decoded ahead of `next` (with the schema, or by `has_rows`).
    first: Option<RecordBatch>,
}

impl SnapshotReader {
    /// The schema the snapshot's rows are written in.
    pub fn schema(&self) -> SchemaRef {
        self.decoder
            .schema()
            .expect("a snapshot reader is opened with its schema")
    }

    /// The schema id the rows are written under, when the snapshot records it.
    pub fn schema_id(&self) -> Option<SchemaId> {
        self.schema_id
    }

    /// Whether the snapshot has a batch left to read (it is kept for `next`).
    pub async fn has_rows(&mut self) -> Result<bool> {
        if self.first.is_none() {
            self.first = self.next().await?;
        }
        Ok(self.first.is_some())
    }

    /// The next batch; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<RecordBatch>> {
        if let Some(b) = self.first.take() {
            return Ok(Some(b));
        }
        loop {
            self.fill().await?;
            if let Some(b) = self.decode()? {
                return Ok(Some(b));
            }
            if self.drained() {
                self.decoder
                    .finish()
                    .map_err(|e| self.corrupt(&e.to_string()))?;
                if self.tail != EOS {
                    return Err(self.corrupt("the stream has no end-of-stream marker"));
                }
                return Ok(None);
            }
        }
    }

    /// The batches as a stream.
    pub fn into_stream(self) -> BoxStream<'static, Result<RecordBatch>> {
        futures::stream::try_unfold(self, |mut reader| async move {
            Ok(reader.next().await?.map(|b| (b, reader)))
        })
        .boxed()
    }

    /// Every byte of the object is fetched and decoded.
    fn drained(&self) -> bool {
        self.received >= self.size && self.pending.is_empty()
    }

    /// Fetches the next range once every byte received is decoded.
    async fn fill(&mut self) -> Result<()> {
        if !self.pending.is_empty() || self.received >= self.size {
            return Ok(());
        }
        let end = (self.received + self.range_bytes).min(self.size);
        let options = GetOptions {
            range: Some((self.received..end).into()),
            if_match: self.etag.clone(),
            ..Default::default()
        };
        let bytes = self
            .store
            .get_opts(&self.path, options)
            .await
            .map_err(storage)?
            .bytes()
            .await
            .map_err(storage)?;
        if bytes.len() as u64 != end - self.received {
            return Err(self.corrupt(&format!(
                "asked for bytes {}..{end}, got {}",
                self.received,
                bytes.len()
            )));
        }
        self.received = end;
        let keep = EOS.len().saturating_sub(bytes.len());
        let from = self.tail.len().saturating_sub(keep);
        self.tail.drain(..from);
        self.tail
            .extend_from_slice(&bytes[bytes.len().saturating_sub(EOS.len())..]);
        self.pending = Buffer::from(bytes);
        Ok(())
    }

    /// Decodes from the bytes received: a batch, or `None` once they are all used.
    fn decode(&mut self) -> Result<Option<RecordBatch>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let offset = self.offset;
        self.decoder
            .decode(&mut self.pending)
            .map_err(|e| MinkError::Internal(format!("KV snapshot at {offset}: {e}")))
    }

    fn corrupt(&self, what: &str) -> MinkError {
        MinkError::Internal(format!("KV snapshot at {}: {what}", self.offset))
    }
}
