//! The lake: tiering rounds (a duty of every node, for the buckets it leads), and the
//! reads that use it: `Lake`, `Union` and `lake_snapshot`.
//!
//! A round of a table on a node reads each bucket it leads from the bucket's lake
//! offset (in the newest lake snapshot's `mink.offsets`) to the high watermark, writes
//! the rows as Parquet data files, and commits them all in one Iceberg snapshot whose
//! summary moves those buckets' offsets (mink-lake's `commit`, a conditional create of
//! the next metadata version). Then it records the pointer in the metadata log. A bucket
//! that moved to another leader meanwhile, and was tiered there, is left out of the
//! commit: a bucket's rows enter the lake once. Until the pointer is recorded the log
//! keeps the rows (the TTL trim stops at the recorded offset), so a `Union` read (lake
//! snapshot + log from its offsets) never meets a gap.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use mink_lake::{
    Committed, DeletedPositions, LakeFile, LakeTable, LakeVersion, SnapshotFiles, TieredBucket,
    compaction_run, from_lake_batch, lake_arrow_schema, lake_columns, partition_value,
    to_current_lake, to_lake_batch,
};
use mink_types::{TableId, TablePath};

use super::reads::read_batches;
use super::*;

/// What a node remembers of a lake table between rounds: the offsets of the newest
/// version it saw, so that a round with nothing new costs no request.
#[derive(Default)]
pub(crate) struct LakeState {
    due: HashMap<TableId, Instant>,
    sweep_due: HashMap<TableId, Instant>,
    /// Tables whose last round stopped short of the high watermark
    /// (`lake.round_bytes_max`): their next round runs at once.
    backlog: std::collections::HashSet<TableId>,
    offsets: HashMap<TableId, BTreeMap<String, i64>>,
    /// Primary-key buckets' key indexes, by stream, within `lake.key_index_bytes_max`.
    indexes: HashMap<String, KeyIndex>,
    /// A primary-key table's files at the version this node's last round committed
    /// (when it committed right on top of the version it read): the next round, if the
    /// version is still that one, reads no manifest.
    /// Keyed by version and snapshot id (random): a lake purged and rebuilt to the same
    /// version number meanwhile does not match.
    contents: HashMap<TableId, (u64, i64, SnapshotFiles)>,
}

/// A primary-key table's key columns as comparable rows (arrow's row format), to find
/// the rows of one key across a changelog and the lake's files.
struct KeyColumns {
    indices: Vec<usize>,
    converter: arrow::row::RowConverter,
}

/// The last change of each key in a changelog: `Some((batch, row))` stands, `None` was
/// deleted.
type LastChanges = HashMap<arrow::row::OwnedRow, Option<(usize, usize)>>;

impl KeyColumns {
    fn new(table: &TableInfo) -> Result<Self> {
        let schema = &table.descriptor.schema;
        let mut indices = Vec::new();
        let mut fields = Vec::new();
        for name in &table.descriptor.primary_key {
            let i = schema.index_of(name).ok_or_else(|| {
                MinkError::Internal(format!("primary-key column {name:?} is not in the schema"))
            })?;
            indices.push(i);
            fields.push(arrow::row::SortField::new(
                schema.columns[i].data_type.to_arrow(),
            ));
        }
        Ok(Self {
            indices,
            converter: arrow::row::RowConverter::new(fields)?,
        })
    }

    fn rows(&self, batch: &RecordBatch) -> Result<arrow::row::Rows> {
        let columns: Vec<_> = self
            .indices
            .iter()
            .map(|i| batch.column(*i).clone())
            .collect();
        Ok(self.converter.convert_columns(&columns)?)
    }

    /// The keys of lake rows (a file's, or a projection of its key columns).
    fn lake_rows(
        &self,
        schema: &mink_types::Schema,
        batch: &RecordBatch,
    ) -> Result<arrow::row::Rows> {
        let columns = lake_columns(schema, batch, &self.indices)?;
        Ok(self.converter.convert_columns(&columns)?)
    }

    /// Applies a changelog in order: `+I`, `+U` (and `+A`) make a key's row the one
    /// that stands, `-D` deletes it, `-U` (the old image, always followed by its `+U`)
    /// changes nothing.
    fn collapse(&self, changes: &[(RecordBatch, Vec<ChangeType>)]) -> Result<LastChanges> {
        let mut last = LastChanges::new();
        for (i, (batch, types)) in changes.iter().enumerate() {
            let rows = self.rows(batch)?;
            for j in 0..batch.num_rows() {
                match types.get(j).copied().unwrap_or(ChangeType::Insert) {
                    ChangeType::UpdateBefore => {}
                    ChangeType::Delete => {
                        last.insert(rows.row(j).owned(), None);
                    }
                    _ => {
                        last.insert(rows.row(j).owned(), Some((i, j)));
                    }
                }
            }
        }
        Ok(last)
    }

    /// Which rows of `batch` keep their place: those whose key has no later change.
    fn unchanged(
        &self,
        batch: &RecordBatch,
        last: &LastChanges,
    ) -> Result<arrow::array::BooleanArray> {
        let rows = self.rows(batch)?;
        Ok((0..batch.num_rows())
            .map(|j| Some(!last.contains_key(&rows.row(j).owned())))
            .collect())
    }
}

/// What the lake holds of a primary-key bucket when its round starts: its files, and
/// the key index this node kept of them (if any).
struct BucketLake {
    files: SnapshotFiles,
    index: Option<KeyIndex>,
}

/// One primary-key bucket's round: where it writes, what the lake holds of the
/// bucket, and the changes it tiers.
struct PkRound<'a> {
    lake: &'a LakeTable,
    table: &'a TableInfo,
    stream: String,
    current: SnapshotFiles,
    keys: KeyColumns,
    last: LastChanges,
    /// The rows that stand (lake rows, in offset order).
    standing: Option<RecordBatch>,
}

/// Where each live key of a primary-key bucket's lake is, kept by the bucket's leader
/// between rounds so that a merge-on-read round need not read the bucket's key
/// columns. Used only while it describes exactly the bucket's files: another writer's
/// round (a leader that moved), a rewrite or a lost commit makes the next round build
/// it again from the files.
#[derive(Default)]
pub(crate) struct KeyIndex {
    /// The bucket's files (data and deletes), sorted, as the index knows them.
    files: Vec<String>,
    /// Data file locations, by the number `keys` gives.
    data: Vec<String>,
    /// Each live key's encoded bytes: its data file's number and its position there.
    keys: HashMap<Box<[u8]>, (u32, u64)>,
    bytes: usize,
}

impl KeyIndex {
    /// Memory per key beside the key's bytes: the map's slot (box, file, position)
    /// and control byte at its load factor, and the key's allocation.
    const OVERHEAD: usize = 80;

    fn describes(&self, files: &SnapshotFiles) -> bool {
        let mut locations = files.locations();
        locations.sort_unstable();
        locations == self.files
    }

    fn insert(&mut self, key: &[u8], file: u32, pos: u64) {
        if self.keys.insert(key.into(), (file, pos)).is_none() {
            self.bytes += key.len() + Self::OVERHEAD;
        }
    }

    fn remove(&mut self, key: &[u8]) -> Option<(u32, u64)> {
        let found = self.keys.remove(key);
        if found.is_some() {
            self.bytes -= key.len() + Self::OVERHEAD;
        }
        found
    }
}

/// Whose a lake table is, to a table of id `table_id` at its path.
#[derive(Debug, PartialEq, Eq)]
enum LakeOwner {
    This,
    /// A dropped table's (or one without `mink.table-id`: -1): to purge.
    Older(TableId),
    /// A table created after this one (table ids only grow): the caller's catalog is
    /// behind, and the lake is not its to touch.
    Newer(TableId),
}

fn lake_owner(lake_table_id: Option<TableId>, table_id: TableId) -> LakeOwner {
    match lake_table_id {
        Some(id) if id == table_id => LakeOwner::This,
        Some(id) if id > table_id => LakeOwner::Newer(id),
        other => LakeOwner::Older(other.unwrap_or(-1)),
    }
}

/// Lake files a round or a read fetches at once.
const LAKE_READS_IN_FLIGHT: usize = 4;

/// Data files to read, and the positions deleted from them.
#[derive(Clone, Default)]
struct LakeFiles {
    data: Vec<LakeFile>,
    deleted: Arc<DeletedPositions>,
}

/// Lake snapshots whose files (manifests read, delete files applied) are kept.
const LAKE_SNAPSHOTS_CACHED: usize = 8;

/// The files of the lake snapshots read last, by table and snapshot id. A query's
/// parts (a `Lake` ticket per bucket) arrive together and would each read the
/// snapshot's manifest list, manifests and delete files again; a snapshot's files
/// never change (snapshot ids are random, so a lake purged and rebuilt does not
/// match), so they are read once. Parts that arrive together wait for the one read.
#[derive(Default)]
pub(crate) struct LakeFilesCache {
    entries: Mutex<std::collections::VecDeque<LakeFilesEntry>>,
}

type LakeFilesEntry = ((TableId, i64), Arc<tokio::sync::OnceCell<LakeFiles>>);

impl LakeFilesCache {
    /// The cell of a snapshot's files, the most recently used; the least recently
    /// used beyond [`LAKE_SNAPSHOTS_CACHED`] are dropped. A read that fails leaves
    /// the cell empty for the next caller to try.
    fn cell(&self, key: (TableId, i64)) -> Arc<tokio::sync::OnceCell<LakeFiles>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = entries.iter().position(|(k, _)| *k == key) {
            let entry = entries.remove(i).expect("found above");
            let cell = entry.1.clone();
            entries.push_back(entry);
            return cell;
        }
        let cell = Arc::new(tokio::sync::OnceCell::new());
        entries.push_back((key, cell.clone()));
        while entries.len() > LAKE_SNAPSHOTS_CACHED {
            entries.pop_front();
        }
        cell
    }
}

impl LakeFiles {
    /// The files of `bucket` alone; an error when a file names no bucket (the whole
    /// table must then be read at once).
    fn of_bucket(&self, bucket: TableBucket) -> Result<LakeFiles> {
        if let Some(f) = self.data.iter().find(|f| f.stream().is_none()) {
            return Err(MinkError::Internal(format!(
                "lake file {} names no bucket: read the whole table at once",
                f.location
            )));
        }
        Ok(self.of_stream(&bucket.stream_name()))
    }

    fn of_stream(&self, stream: &str) -> LakeFiles {
        LakeFiles {
            data: self
                .data
                .iter()
                .filter(|f| f.stream() == Some(stream))
                .cloned()
                .collect(),
            deleted: self.deleted.clone(),
        }
    }
}

/// `batch`, rows `start..` of a file, less the rows at `deleted` (ascending positions).
fn without_positions(batch: &RecordBatch, start: u64, deleted: &[u64]) -> Result<RecordBatch> {
    let end = start + batch.num_rows() as u64;
    let from = deleted.partition_point(|p| *p < start);
    let to = deleted.partition_point(|p| *p < end);
    if from == to {
        return Ok(batch.clone());
    }
    let mut keep = vec![true; batch.num_rows()];
    for p in &deleted[from..to] {
        keep[(p - start) as usize] = false;
    }
    Ok(arrow::compute::filter_record_batch(
        batch,
        &arrow::array::BooleanArray::from(keep),
    )?)
}

/// Lake rows whose `__offset` (the second-last column) is `offset` in every row.
fn at_offset(rows: RecordBatch, offset: i64) -> Result<RecordBatch> {
    let mut columns = rows.columns().to_vec();
    let at = columns.len() - 2;
    columns[at] = Arc::new(arrow::array::Int64Array::from_value(
        offset,
        rows.num_rows(),
    ));
    Ok(RecordBatch::try_new(rows.schema(), columns)?)
}

/// The log offset of the first of lake rows (`__offset`, the second-last column).
fn first_offset(rows: &RecordBatch) -> i64 {
    rows.column(rows.num_columns() - 2)
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .filter(|o| !o.is_empty())
        .map_or(0, |o| o.value(0))
}

fn parse_stream(stream: &str, table_id: TableId) -> Option<TableBucket> {
    let rest = stream.strip_prefix(&format!("t{table_id}-"))?;
    let (partition, bucket) = match rest.split_once("-b") {
        Some((p, b)) => (Some(p.strip_prefix('p')?.parse().ok()?), b),
        None => (None, rest.strip_prefix('b')?),
    };
    Some(TableBucket::new(table_id, partition, bucket.parse().ok()?))
}

impl NodeService {
    pub(crate) fn lake_table(&self, path: &TablePath) -> LakeTable {
        LakeTable::new(
            self.streams().object_store_for(mink_wal::Purpose::Lake),
            &self.config.object_store.url,
            path,
        )
        .with_retention(self.config.lake.retention())
    }

    /// The metadata version the metadata log last recorded for a table (a hint).
    fn lake_hint(&self, table_id: TableId) -> Option<u64> {
        self.meta
            .read(|s| s.lake_snapshots.get(&table_id).map(|p| p.version))
            .filter(|v| *v > 0)
    }

    /// The newest lake version of a table that belongs to it. A lake table left by a
    /// dropped table of the same name (its `drop_table` purge failed or has not run
    /// yet) is no lake of this table: reads see none, and a tiering round (`purge`)
    /// purges it and answers `Unavailable` until that is done. A lake table of a
    /// *newer* table is never purged: this node's catalog is behind (the table was
    /// dropped and its name taken since), and the round fails until it catches up.
    pub(super) async fn lake_version(
        &self,
        table: &TableInfo,
        purge: bool,
    ) -> Result<Option<LakeVersion>> {
        let lake = self.lake_table(&table.path);
        let version = lake.load(self.lake_hint(table.id)).await?;
        let Some(v) = version else {
            return Ok(None);
        };
        match lake_owner(v.table_id(), table.id) {
            LakeOwner::This => Ok(Some(v)),
            _ if !purge => Ok(None),
            LakeOwner::Newer(newer) => Err(MinkError::Unavailable(format!(
                "the lake table of {} belongs to table id {newer}, newer than {}: this \
                 node's catalog is behind; not tiering it",
                table.path, table.id
            ))),
            LakeOwner::Older(stale) => {
                tracing::info!(
                    table = %table.path,
                    "the lake table is a dropped table's (id {stale}); purging it"
                );
                lake.purge(stale).await?;
                Err(MinkError::Unavailable(format!(
                    "the lake table of {} held a dropped table's data (id {stale}); it was purged, try again",
                    table.path
                )))
            }
        }
    }

    /// Runs tiering rounds of every lake-enabled table this node leads buckets of, each
    /// table every `lake.freshness`, until `shutdown` is set.
    pub async fn run_lake_tiering(
        self: Arc<Self>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let interval = Duration::from_millis(self.config.lake.check_interval_ms.max(10));
        let mut state = LakeState::default();
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let me = self.meta.node_id().to_string();
            let tables: Vec<TableInfo> = self.meta.read(|s| {
                s.tables
                    .values()
                    .filter(|t| t.descriptor.properties.lake.enabled)
                    .filter(|t| {
                        s.buckets.values().any(|b| {
                            b.bucket.table_id == t.id && b.leader.as_deref() == Some(me.as_str())
                        })
                    })
                    .cloned()
                    .collect()
            });
            state.due.retain(|id, _| tables.iter().any(|t| t.id == *id));
            state
                .sweep_due
                .retain(|id, _| tables.iter().any(|t| t.id == *id));
            state
                .offsets
                .retain(|id, _| tables.iter().any(|t| t.id == *id));
            // Key indexes of buckets led elsewhere now are of no use here.
            let led: std::collections::HashSet<String> = self.meta.read(|s| {
                s.buckets
                    .values()
                    .filter(|b| b.leader.as_deref() == Some(me.as_str()))
                    .map(|b| b.bucket.stream_name())
                    .collect()
            });
            state.indexes.retain(|stream, _| led.contains(stream));
            state
                .contents
                .retain(|id, _| tables.iter().any(|t| t.id == *id));
            for table in tables {
                if *shutdown.borrow() {
                    return;
                }
                let now = Instant::now();
                self.maybe_sweep(&table, &mut state, now).await;
                if !state.backlog.remove(&table.id)
                    && state.due.get(&table.id).is_some_and(|t| now < *t)
                {
                    continue;
                }
                state
                    .due
                    .insert(table.id, now + table.descriptor.properties.lake.freshness);
                let started = Instant::now();
                let round = std::panic::AssertUnwindSafe(self.tier_table(&table, &mut state));
                let round = futures::FutureExt::catch_unwind(round)
                    .await
                    .unwrap_or_else(|_| {
                        Err(MinkError::Internal(
                            "the round panicked (a bug: please report it)".into(),
                        ))
                    });
                match round {
                    Ok(Some(c)) => {
                        metrics::counter!("mink_lake_rounds_total", "outcome" => "committed")
                            .increment(1);
                        metrics::histogram!("mink_lake_round_seconds")
                            .record(started.elapsed().as_secs_f64());
                        tracing::debug!(
                            table = %table.path,
                            version = c.version,
                            snapshot = c.snapshot_id,
                            "lake round committed"
                        );
                    }
                    Ok(None) => {}
                    Err(e) => {
                        metrics::counter!("mink_lake_rounds_total", "outcome" => "failed")
                            .increment(1);
                        // Try again at the next check, not a whole freshness later.
                        state.due.remove(&table.id);
                        state.offsets.remove(&table.id);
                        tracing::warn!(table = %table.path, "lake round failed: {e}");
                    }
                }
            }
        }
    }

    /// The orphan sweep of a table, every `lake.orphan_sweep_interval_ms`, by the
    /// leader of its first bucket (one node per table; two would be harmless).
    async fn maybe_sweep(&self, table: &TableInfo, state: &mut LakeState, now: Instant) {
        let me = self.meta.node_id();
        let first_here = self.meta.read(|s| {
            s.buckets
                .values()
                .filter(|b| b.bucket.table_id == table.id)
                .min_by_key(|b| b.bucket)
                .is_some_and(|b| b.leader.as_deref() == Some(me))
        });
        if !first_here {
            return;
        }
        let interval = Duration::from_millis(self.config.lake.orphan_sweep_interval_ms);
        // The first sweep waits an interval too: a restart loop costs no sweeps.
        let due = *state.sweep_due.entry(table.id).or_insert(now + interval);
        if now < due {
            return;
        }
        state.sweep_due.insert(table.id, now + interval);
        let min_age = Duration::from_millis(self.config.lake.orphan_min_age_ms);
        match self.lake_table(&table.path).sweep_orphans(min_age).await {
            Ok(stats) => {
                metrics::counter!("mink_lake_orphans_deleted_total").increment(stats.deleted);
                if stats.deleted > 0 {
                    tracing::info!(
                        table = %table.path,
                        deleted = stats.deleted,
                        bytes = stats.deleted_bytes,
                        "lake orphan sweep"
                    );
                }
            }
            Err(e) => tracing::warn!(table = %table.path, "lake orphan sweep failed: {e}"),
        }
    }

    /// What a node keeps of a committed round for the next: the offsets, the table's
    /// files (when the commit went right on top of version `read`, so that they are
    /// `after`), and the key indexes of the buckets it holds, within the budget.
    fn remember_round(
        &self,
        state: &mut LakeState,
        table_id: TableId,
        read: u64,
        c: &Committed,
        after: Option<SnapshotFiles>,
        indexes: Vec<(String, KeyIndex)>,
    ) {
        state.offsets.insert(table_id, c.offsets.clone());
        // Right on top of the version read, every bucket in: the files are known.
        let on_top = read + 1 == c.version;
        if let Some(after) = after.filter(|_| on_top && c.dropped.is_empty()) {
            state
                .contents
                .insert(table_id, (c.version, c.snapshot_id, after));
        }
        // The indexes of the buckets this commit holds, within the node's budget.
        let budget = self.config.lake.key_index_bytes_max as usize;
        for (stream, index) in indexes {
            let used: usize = state.indexes.values().map(|i| i.bytes).sum();
            if !c.dropped.contains(&stream) && used + index.bytes <= budget {
                state.indexes.insert(stream, index);
            }
        }
    }

    /// The buckets of `table` this node leads that have rows the lake lacks, as far as
    /// it knows (all of them before its first round of the table), with their logs.
    async fn buckets_due(
        &self,
        table: &TableInfo,
        state: &LakeState,
    ) -> Vec<(TableBucket, LogTablet)> {
        let me = self.meta.node_id().to_string();
        let buckets: Vec<TableBucket> = self.meta.read(|s| {
            s.buckets
                .values()
                .filter(|b| b.bucket.table_id == table.id && b.leader.as_deref() == Some(&me))
                .map(|b| b.bucket)
                .collect()
        });
        // Which buckets have rows the lake lacks, as far as this node knows.
        let known = state.offsets.get(&table.id);
        let mut tablets = Vec::new();
        let mut lag = 0i64;
        for bucket in buckets {
            let log = match self.tablet(bucket).await {
                Ok(t) => t.log().clone(),
                Err(e) => {
                    tracing::debug!(%bucket, "not tiered this round: {e}");
                    continue;
                }
            };
            let lake_end = known.and_then(|k| k.get(&bucket.stream_name()).copied());
            lag += (log.high_watermark() - lake_end.unwrap_or(log.log_start())).max(0);
            if known.is_none() || lake_end.unwrap_or(log.log_start()) < log.high_watermark() {
                tablets.push((bucket, log));
            }
        }
        // Rows of this node's buckets the lake lacked when the round began (as far as
        // the node knew: after a restart, until its first round, all of the log).
        metrics::gauge!("mink_lake_lag_rows", "table" => table.path.to_string()).set(lag as f64);
        tablets
    }

    /// One round of `table` for the buckets this node leads; `None` when there was
    /// nothing new to tier (then no object-store request is made) or another writer
    /// tiered everything first.
    pub(crate) async fn tier_table(
        &self,
        table: &TableInfo,
        state: &mut LakeState,
    ) -> Result<Option<Committed>> {
        let tablets = self.buckets_due(table, state).await;
        if tablets.is_empty() {
            return Ok(None);
        }
        let lake = self
            .lake_table(&table.path)
            .with_time_partition(table.descriptor.properties.lake.partition.clone());
        let current = self.lake_version(table, true).await?;
        let offsets = match &current {
            Some(v) => v.offsets(None)?,
            None => BTreeMap::new(),
        };
        let (wants_files, existing) = self
            .known_files(&lake, table, current.as_ref(), state)
            .await?;
        let mut tiered: Vec<TieredBucket> = Vec::new();
        let mut indexes: Vec<(String, KeyIndex)> = Vec::new();
        for (bucket, log) in tablets {
            let stream = bucket.stream_name();
            let from = offsets.get(&stream).copied();
            let round = if table.descriptor.has_primary_key() {
                let now = BucketLake {
                    files: existing.of_stream(&stream),
                    index: state.indexes.remove(&stream),
                };
                match self
                    .tier_pk_bucket(&lake, table, bucket, &log, from, now)
                    .await
                {
                    // Nothing tiered: the index is as good as before.
                    Ok((None, short, Some(index))) => {
                        state.indexes.insert(stream.clone(), index);
                        Ok((None, short))
                    }
                    // Kept only once the commit holds the round.
                    Ok((round, short, index)) => {
                        indexes.extend(index.map(|i| (stream.clone(), i)));
                        Ok((round, short))
                    }
                    Err(e) => Err(e),
                }
            } else {
                let files = existing.of_stream(&stream);
                self.tier_log_bucket(&lake, table, bucket, &log, from, &files)
                    .await
            };
            match round {
                Ok((round, short)) => {
                    if short {
                        state.backlog.insert(table.id);
                    }
                    tiered.extend(round);
                }
                Err(e) => {
                    for t in &tiered {
                        lake.delete_files(&t.written()).await;
                    }
                    return Err(e);
                }
            }
        }
        if tiered.is_empty() {
            state.offsets.insert(table.id, offsets);
            return Ok(None);
        }
        let after = wants_files.then(|| existing.after(&tiered));
        let merged: Vec<(String, usize)> = match table.descriptor.has_primary_key() {
            true => Vec::new(),
            false => tiered
                .iter()
                .map(|t| (t.stream.clone(), t.compacted_from.len()))
                .collect(),
        };
        let committed = lake
            .commit(
                table.id,
                &table.descriptor.schema,
                &table.descriptor.partition_keys,
                current.as_ref().map(|v| v.version),
                tiered,
            )
            .await?;
        let Some(c) = committed else {
            state.offsets.remove(&table.id);
            return Ok(None);
        };
        let compacted: usize = merged
            .iter()
            .filter(|(stream, _)| !c.dropped.contains(stream))
            .map(|(_, n)| n)
            .sum();
        metrics::counter!("mink_lake_compacted_files_total").increment(compacted as u64);
        let read = current.as_ref().map_or(0, |v| v.version);
        self.remember_round(state, table.id, read, &c, after, indexes);
        self.record_lake_pointer(table.id, &c).await;
        Ok(Some(c))
    }

    /// The files of the lake's current version `current`, where the round needs them
    /// (to merge a primary-key table on read, or to compact a log table whose files
    /// may be due): remembered from this node's last commit when it is still the
    /// current one, else read from the manifests. Whether they were needed, and them
    /// (none when not).
    async fn known_files(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        current: Option<&LakeVersion>,
        state: &mut LakeState,
    ) -> Result<(bool, SnapshotFiles)> {
        let known = state.contents.remove(&table.id);
        // The files are needed to merge on read, and to compact a log table's buckets
        // (only once the table has enough files for any bucket to qualify).
        let wants_files = table.descriptor.has_primary_key()
            || current.is_some_and(|v| self.compaction_may_apply(v, table));
        let existing = match (current, wants_files, known) {
            (Some(v), true, Some((version, snapshot, files)))
                if version == v.version && Some(snapshot) == v.snapshot_id() =>
            {
                files
            }
            (Some(v), true, _) => lake.contents(v, None).await?,
            _ => SnapshotFiles::default(),
        };
        Ok((wants_files, existing))
    }

    /// Reads a bucket's log from `pos` towards `end`, whole batches, until about
    /// `max_bytes` of lake rows: each batch as the table's current schema sees it and as
    /// lake rows, with its change types; and the offset after the last row read.
    async fn read_for_lake(
        &self,
        table: &TableInfo,
        bucket: TableBucket,
        log: &LogTablet,
        mut pos: i64,
        end: i64,
        max_bytes: usize,
    ) -> Result<(Vec<(RecordBatch, RecordBatch, Vec<ChangeType>)>, i64)> {
        let schema = &table.descriptor.schema;
        let arrow_schema = schema.to_arrow();
        let lake_schema = lake_arrow_schema(schema);
        let scan_max = self.config.log.scan_bytes_max as usize;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while pos < end && bytes < max_bytes {
            let scan = log.scan(pos, scan_max).await?;
            // Where the read goes on when every batch is taken: past trailing sequence
            // markers too (they hold no rows, so stepping over one loses nothing).
            let read_end = scan.next_offset(pos).min(end);
            let mut next = pos;
            let mut stopped = false;
            for b in scan.batches {
                let base = b.header.base_offset;
                if base >= end || bytes >= max_bytes {
                    next = next.max(base.min(end));
                    stopped = true;
                    break;
                }
                let take = ((end - base) as usize).min(b.batch.num_rows());
                let batch = as_schema(b.batch.slice(0, take), &arrow_schema)?;
                let rows = to_lake_batch(
                    schema,
                    &lake_schema,
                    &batch,
                    bucket.bucket,
                    base,
                    b.header.commit_timestamp,
                )?;
                bytes += rows.get_array_memory_size();
                let mut changes = b.header.change_types.clone();
                changes.truncate(take);
                out.push((batch, rows, changes));
                next = base + take as i64;
            }
            if !stopped {
                next = next.max(read_end);
            }
            if next <= pos {
                break;
            }
            pos = next;
        }
        Ok((out, pos))
    }

    /// Where a round of a bucket starts: its lake offset, or the log start when the lake
    /// has none of it (or the log was trimmed past it while the lake was off).
    fn round_start(bucket: TableBucket, log: &LogTablet, from: Option<i64>) -> i64 {
        let start = log.log_start();
        let pos = from.unwrap_or(start);
        if pos < start {
            tracing::warn!(
                %bucket,
                "rows {pos}..{start} were trimmed from the log before they reached the lake \
                 (lake.enabled was off meanwhile); the lake goes on from {start}"
            );
            return start;
        }
        pos
    }

    /// A data file of `batches` (lake rows of one bucket).
    async fn write_lake_file(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        stream: &str,
        batches: &[RecordBatch],
    ) -> Result<mink_lake::DataFile> {
        let first = first_offset(&batches[0]);
        let partition = partition_value(
            &table.descriptor.schema,
            &table.descriptor.partition_keys,
            table.descriptor.properties.lake.partition.as_ref(),
            &batches[0],
        )?;
        lake.write_data_file(stream, first, batches, partition)
            .await
    }

    /// Lake rows of a log bucket as data files added to `files`: one file, or, with
    /// a `lake.partition`, one per run of rows of one partition value.
    async fn write_lake_runs(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        stream: &str,
        rows: Vec<RecordBatch>,
        files: &mut Vec<mink_lake::DataFile>,
    ) -> Result<()> {
        let time = table.descriptor.properties.lake.partition.as_ref();
        for run in mink_lake::transform::runs(&table.descriptor.schema, time, rows)? {
            files.push(self.write_lake_file(lake, table, stream, &run).await?);
        }
        Ok(())
    }

    /// Whether any bucket of a log table's lake version `v` may have enough small
    /// files to compact: the snapshot summary counts its data files. Never while the
    /// lake's schema has columns this node's catalog does not know yet (it lags an
    /// `alter_table`): the merged file would be written without them.
    fn compaction_may_apply(&self, v: &LakeVersion, table: &TableInfo) -> bool {
        let known = match mink_lake::iceberg_schema(&table.descriptor.schema) {
            Ok(s) => s.highest_field_id(),
            Err(_) => return false,
        };
        if v.metadata.current_schema().highest_field_id() > known {
            return false;
        }
        let min = self.config.lake.compact_files_min as u64;
        let files = v.metadata.current_snapshot().and_then(|s| {
            s.summary()
                .additional_properties
                .get("total-data-files")
                .and_then(|n| n.parse::<u64>().ok())
        });
        min > 0 && files.is_some_and(|n| n >= min)
    }

    /// A compaction of a log table's bucket whose lake holds `files`: the oldest run
    /// of consecutive small files ([`compaction_run`]), read one file at a time until
    /// about `lake.file_bytes_target` of rows (so at most that plus one small file in
    /// memory), written as one file. The new file and the locations it replaces;
    /// `None` when nothing is due (or the run's first file alone reaches the target).
    async fn compact_log_bucket(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        stream: &str,
        files: &SnapshotFiles,
    ) -> Result<Option<(mink_lake::DataFile, Vec<String>)>> {
        let config = &self.config.lake;
        let run = compaction_run(
            &files.data,
            config.compact_small_file_bytes,
            config.compact_files_min as usize,
        );
        let (Some(first), Some(partition)) = (
            run.first().and_then(LakeFile::first_offset),
            run.first().map(|f| f.partition.clone()),
        ) else {
            return Ok(None);
        };
        let lake_schema = lake_arrow_schema(&table.descriptor.schema);
        let target = config.file_bytes_target as usize;
        let (mut rows, mut bytes, mut replaced) = (Vec::new(), 0usize, Vec::new());
        for f in &run {
            if bytes >= target {
                break;
            }
            for b in lake.read_file(f).await? {
                let b = to_current_lake(&lake_schema, &b)?;
                bytes += b.get_array_memory_size();
                rows.push(b);
            }
            replaced.push(f.location.clone());
        }
        // One file already as large as the target: nothing to gain by merging.
        if replaced.len() < 2 {
            return Ok(None);
        }
        let merged = lake
            .write_data_file(stream, first, &rows, partition)
            .await?;
        Ok(Some((merged, replaced)))
    }

    /// A log table's bucket: its new rows appended as new files, one file's rows in
    /// memory at a time, at most `lake.round_bytes_max` per round (the rest is the next
    /// round's, which then runs at once); and, when the bucket's lake `files` have
    /// enough small ones, a compaction of the oldest of them
    /// ([`Self::compact_log_bucket`]) in the same commit. Only a round that tiers rows
    /// compacts: its commit moves the bucket's offset, so a concurrent round of another
    /// node (a bucket moving) that read the same files loses the commit race and drops
    /// its whole part, compaction included. Also says whether it stopped short.
    async fn tier_log_bucket(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        bucket: TableBucket,
        log: &LogTablet,
        from: Option<i64>,
        existing: &SnapshotFiles,
    ) -> Result<(Option<TieredBucket>, bool)> {
        let first = Self::round_start(bucket, log, from);
        let end = log.high_watermark();
        if first >= end {
            return Ok((None, false));
        }
        let stream = bucket.stream_name();
        let target = self.config.lake.file_bytes_target as usize;
        let round_max = self.config.lake.round_bytes_max as usize;
        let (mut pos, mut total, mut files) = (first, 0usize, Vec::new());
        while pos < end && total < round_max {
            let read = self
                .read_for_lake(table, bucket, log, pos, end, target)
                .await;
            let written = match read {
                Ok((rows, next)) if next > pos => {
                    let rows: Vec<RecordBatch> = rows.into_iter().map(|(_, l, _)| l).collect();
                    total += rows
                        .iter()
                        .map(|r| r.get_array_memory_size())
                        .sum::<usize>();
                    self.write_lake_runs(lake, table, &stream, rows, &mut files)
                        .await
                        .map(|()| next)
                }
                Ok(_) => break,
                Err(e) => Err(e),
            };
            match written {
                Ok(next) => pos = next,
                Err(e) => {
                    lake.delete_files(&files).await;
                    return Err(e);
                }
            }
        }
        if files.is_empty() {
            return Ok((None, false));
        }
        let (compacted, compacted_from) = match self
            .compact_log_bucket(lake, table, &stream, existing)
            .await
        {
            Ok(Some((merged, replaced))) => (vec![merged], replaced),
            Ok(None) => (Vec::new(), Vec::new()),
            // The rows are tiered all the same; the next round tries again.
            Err(e) => {
                tracing::warn!(%bucket, "compacting the lake files: {e}");
                (Vec::new(), Vec::new())
            }
        };
        metrics::counter!("mink_lake_tiered_rows_total").increment((pos - first) as u64);
        Ok((
            Some(TieredBucket {
                stream,
                from,
                to: pos,
                files,
                replaces: Vec::new(),
                compacted,
                compacted_from,
            }),
            pos < end,
        ))
    }

    /// A primary-key table's bucket: its changelog since the lake offset (at most
    /// `lake.round_bytes_max` of it per round, held in memory) collapsed to the last
    /// change of each key, then either merged on read (the rows that stand in a new
    /// delta file, position deletes for the old rows of every key that changed) or,
    /// once deletes or delta files pass `lake.rewrite_*`, the bucket rewritten (its
    /// whole state in new files that replace all of its files). Also the bucket's key
    /// index after the round, to keep should the round commit.
    async fn tier_pk_bucket(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        bucket: TableBucket,
        log: &LogTablet,
        from: Option<i64>,
        now: BucketLake,
    ) -> Result<(Option<TieredBucket>, bool, Option<KeyIndex>)> {
        let BucketLake {
            files: current,
            index,
        } = now;
        if from.unwrap_or(0) < log.log_start() {
            // The changelog no longer holds every change the lake lacks: the bucket's
            // state comes from a KV snapshot instead; the next round goes on from it.
            let seeded = self
                .pk_seed(lake, table, bucket, (from, log.log_start()), &current)
                .await?;
            return Ok((Some(seeded), true, None));
        }
        let first = Self::round_start(bucket, log, from);
        let end = log.high_watermark();
        if first >= end {
            return Ok((None, false, index));
        }
        let round_max = self.config.lake.round_bytes_max as usize;
        let (read, to) = self
            .read_for_lake(table, bucket, log, first, end, round_max)
            .await?;
        if to <= first {
            return Ok((None, false, index));
        }
        let keys = KeyColumns::new(table)?;
        let changes: Vec<(RecordBatch, Vec<ChangeType>)> = read
            .iter()
            .map(|(m, _, c)| (m.clone(), c.clone()))
            .collect();
        let last = keys.collapse(&changes)?;
        drop(changes);
        // The rows that stand, in offset order.
        let mut standing: Vec<(usize, usize)> = last.values().filter_map(|v| *v).collect();
        standing.sort_unstable();
        let lake_rows: Vec<&RecordBatch> = read.iter().map(|(_, l, _)| l).collect();
        let standing = if standing.is_empty() {
            None
        } else {
            Some(arrow::compute::interleave_record_batch(
                &lake_rows, &standing,
            )?)
        };
        let round = PkRound {
            lake,
            table,
            stream: bucket.stream_name(),
            current,
            keys,
            last,
            standing,
        };
        let rewrite = !round.current.data.is_empty() && self.rewrite_due(&round.current);
        let mut files = Vec::new();
        let result = if round.current.data.is_empty() || rewrite {
            self.pk_rewrite(&round, &mut files).await
        } else {
            self.pk_merge_on_read(&round, index, &mut files).await
        };
        let index = match result {
            Ok(index) => index,
            Err(e) => {
                lake.delete_files(&files).await;
                return Err(e);
            }
        };
        if rewrite {
            metrics::counter!("mink_lake_rewrites_total").increment(1);
        }
        metrics::counter!("mink_lake_tiered_rows_total").increment((to - first) as u64);
        Ok((
            Some(TieredBucket {
                stream: round.stream,
                from,
                to,
                files,
                replaces: if rewrite {
                    round.current.locations()
                } else {
                    Vec::new()
                },
                compacted: Vec::new(),
                compacted_from: Vec::new(),
            }),
            to < end,
            index,
        ))
    }

    /// A primary-key bucket whose lake lacks changes its changelog no longer holds:
    /// `from` (the lake's offset of the bucket, `None` with none) is below the log
    /// start, because the lake was turned on, or back on, after the changelog was
    /// trimmed behind a KV snapshot. Rebuilding from the changelog would leave out
    /// every key last changed below the log start. The bucket's state in a KV snapshot
    /// at or above the log start (the log is never trimmed above its newest snapshot)
    /// becomes the bucket's lake files instead, replacing what the lake held of it, at
    /// the snapshot's offset; rounds go on from there. The rows carry the snapshot's
    /// last offset and write time as `__offset` and `__timestamp` (their own changes
    /// are gone from the log). One file's rows are in memory at a time.
    async fn pk_seed(
        &self,
        lake: &LakeTable,
        table: &TableInfo,
        bucket: TableBucket,
        (from, log_start): (Option<i64>, i64),
        current: &SnapshotFiles,
    ) -> Result<TieredBucket> {
        let info = self.kv_snapshot(bucket).await?;
        if info.log_offset < log_start {
            return Err(MinkError::Internal(format!(
                "{bucket}: the newest KV snapshot is at {}, below the log start {log_start}",
                info.log_offset
            )));
        }
        match from {
            None => tracing::info!(
                %bucket,
                snapshot = info.log_offset,
                "the changelog starts at {log_start}: the lake's first round of the bucket \
                 is its KV snapshot"
            ),
            Some(from) => tracing::warn!(
                %bucket,
                snapshot = info.log_offset,
                "changes {from}..{log_start} were trimmed from the changelog before they \
                 reached the lake (lake.enabled was off meanwhile): the bucket's lake files \
                 are rebuilt from its KV snapshot"
            ),
        }
        let schema = &table.descriptor.schema;
        let lake_schema = lake_arrow_schema(schema);
        let stream = bucket.stream_name();
        let target = self.config.lake.file_bytes_target as usize;
        let mut rows = self
            .kv_snapshot_rows(bucket, &info, &schema.to_arrow())
            .await?;
        let offset = (info.log_offset - 1).max(0);
        let mut files = Vec::new();
        let written: Result<()> = async {
            let (mut pending, mut bytes) = (Vec::new(), 0usize);
            while let Some(batch) = rows.next().await {
                let batch = batch?;
                if batch.num_rows() == 0 {
                    continue;
                }
                let lake_rows = to_lake_batch(
                    schema,
                    &lake_schema,
                    &batch,
                    bucket.bucket,
                    0,
                    info.written_at_ms,
                )?;
                let lake_rows = at_offset(lake_rows, offset)?;
                bytes += lake_rows.get_array_memory_size();
                pending.push(lake_rows);
                if bytes >= target {
                    files.push(self.write_lake_file(lake, table, &stream, &pending).await?);
                    (pending, bytes) = (Vec::new(), 0);
                }
            }
            if !pending.is_empty() {
                files.push(self.write_lake_file(lake, table, &stream, &pending).await?);
            }
            Ok(())
        }
        .await;
        if let Err(e) = written {
            lake.delete_files(&files).await;
            return Err(e);
        }
        metrics::counter!("mink_lake_seeded_buckets_total").increment(1);
        Ok(TieredBucket {
            stream,
            from,
            to: info.log_offset,
            files,
            replaces: current.locations(),
            compacted: Vec::new(),
            compacted_from: Vec::new(),
        })
    }

    /// Whether a primary-key bucket's merge-on-read files have piled up enough that
    /// this round rewrites it: deleted rows at `lake.rewrite_deleted_percent` of its
    /// data rows, or more than `lake.rewrite_files_max` delta and delete files.
    fn rewrite_due(&self, files: &SnapshotFiles) -> bool {
        let rows: u64 = files.data.iter().map(|f| f.record_count).sum();
        let deleted: u64 = files.deletes.iter().map(|f| f.record_count).sum();
        let deltas = files
            .data
            .iter()
            .chain(&files.deletes)
            .filter(|f| f.is_delta())
            .count();
        let config = &self.config.lake;
        deleted * 100 >= rows.max(1) * u64::from(config.rewrite_deleted_percent)
            || deltas > config.rewrite_files_max as usize
    }

    /// Merge-on-read: the rows that stand as one delta file, and one position delete
    /// file naming, in the bucket's data files, the live row of every key that changed.
    /// Where those rows are comes from the bucket's key index when it describes exactly
    /// the bucket's files; otherwise from the key columns of the bucket's data files
    /// (range reads), which also build the index. Returns the index after the round.
    async fn pk_merge_on_read(
        &self,
        round: &PkRound<'_>,
        index: Option<KeyIndex>,
        files: &mut Vec<mink_lake::DataFile>,
    ) -> Result<Option<KeyIndex>> {
        let (lake, current) = (round.lake, &round.current);
        let (mut index, mut positions) = match index.filter(|i| i.describes(current)) {
            Some(mut index) => {
                let mut positions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
                for key in round.last.keys() {
                    if let Some((file, pos)) = index.remove(key.row().data()) {
                        positions
                            .entry(index.data[file as usize].clone())
                            .or_default()
                            .push(pos);
                    }
                }
                (Some(index), positions)
            }
            None => self.pk_scan_keys(round).await?,
        };
        for p in positions.values_mut() {
            p.sort_unstable();
        }
        // Every file of a bucket is in the bucket's partition.
        let Some(partition) = current.data.first().map(|f| f.partition.clone()) else {
            return Ok(None);
        };
        // The two files are written at once; either written is the caller's to delete
        // should the other fail.
        let delta = async {
            match &round.standing {
                Some(rows) => lake
                    .write_delta_file(
                        &round.stream,
                        first_offset(rows),
                        std::slice::from_ref(rows),
                        partition.clone(),
                    )
                    .await
                    .map(Some),
                None => Ok(None),
            }
        };
        let deletes = async {
            if positions.is_empty() {
                return Ok(None);
            }
            lake.write_position_deletes(&round.stream, 0, &positions, partition.clone())
                .await
                .map(Some)
        };
        let (delta, deletes) = tokio::join!(delta, deletes);
        let mut first_error = None;
        let mut delta_location = None;
        for (i, written) in [delta, deletes].into_iter().enumerate() {
            match written {
                Ok(Some(f)) => {
                    if i == 0 {
                        delta_location = Some(f.file_path().to_string());
                    }
                    if let Some(index) = index.as_mut() {
                        index.files.push(f.file_path().to_string());
                    }
                    files.push(f);
                }
                Ok(None) => {}
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let Some(mut index) = index else {
            return Ok(None);
        };
        if let (Some(rows), Some(location)) = (&round.standing, delta_location) {
            let number = index.data.len() as u32;
            index.data.push(location);
            let keys = round.keys.lake_rows(&round.table.descriptor.schema, rows)?;
            for j in 0..rows.num_rows() {
                index.insert(keys.row(j).data(), number, j as u64);
            }
        }
        index.files.sort_unstable();
        let budget = self.config.lake.key_index_bytes_max as usize;
        Ok((index.bytes <= budget).then_some(index))
    }

    /// Scans the key columns of a bucket's data files (a few read at once, by ranges),
    /// less the positions its delete files delete: the positions of the live rows of
    /// the keys the round changed (every such row, should a key have two), and the key
    /// index of the other live rows, unless it outgrew `lake.key_index_bytes_max`
    /// (then the scan goes on without it: memory stays within the budget).
    async fn pk_scan_keys(
        &self,
        round: &PkRound<'_>,
    ) -> Result<(Option<KeyIndex>, BTreeMap<String, Vec<u64>>)> {
        let (lake, current) = (round.lake, &round.current);
        let schema = &round.table.descriptor.schema;
        let budget = self.config.lake.key_index_bytes_max as usize;
        let deleted = lake.read_deletes(&current.deletes).await?;
        let changed: std::collections::HashSet<&[u8]> =
            round.last.keys().map(|k| k.row().data()).collect();
        let mut columns = round.keys.indices.clone();
        columns.sort_unstable();
        columns.dedup();
        let mut index = Some(KeyIndex {
            files: current.locations(),
            data: current.data.iter().map(|f| f.location.clone()).collect(),
            ..KeyIndex::default()
        });
        if let Some(i) = index.as_mut() {
            i.files.sort_unstable();
        }
        let mut positions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut reads = futures::stream::iter(current.data.iter().cloned().enumerate().map(
            |(number, file)| {
                let (lake, columns) = (lake.clone(), columns.clone());
                async move {
                    let batches = lake.read_columns(&file, &columns).await?;
                    Ok::<_, MinkError>((number as u32, file, batches))
                }
            },
        ))
        .buffered(LAKE_READS_IN_FLIGHT);
        while let Some((number, file, batches)) = reads.try_next().await? {
            let gone = deleted.get(&file.location).map_or(&[][..], Vec::as_slice);
            let mut pos = 0u64;
            for b in batches {
                let rows = round.keys.lake_rows(schema, &b)?;
                for j in 0..b.num_rows() {
                    let p = pos + j as u64;
                    if gone.binary_search(&p).is_ok() {
                        continue;
                    }
                    let key = rows.row(j);
                    if changed.contains(key.data()) {
                        positions.entry(file.location.clone()).or_default().push(p);
                    } else if let Some(i) = index.as_mut() {
                        i.insert(key.data(), number, p);
                        if i.bytes > budget {
                            index = None;
                        }
                    }
                }
                pos += b.num_rows() as u64;
            }
        }
        metrics::counter!("mink_lake_key_index_scans_total").increment(1);
        Ok((index, positions))
    }

    /// A rewrite (copy-on-write): the rows of the bucket's files that are neither
    /// deleted nor changed (read one file at a time), then the rows that stand, in new
    /// files cut at `lake.file_bytes_target`. Returns the key index of the new files
    /// (unless it outgrew `lake.key_index_bytes_max`).
    async fn pk_rewrite(
        &self,
        round: &PkRound<'_>,
        files: &mut Vec<mink_lake::DataFile>,
    ) -> Result<Option<KeyIndex>> {
        let (lake, table, stream) = (round.lake, round.table, round.stream.as_str());
        let schema = &table.descriptor.schema;
        let lake_schema = lake_arrow_schema(schema);
        let target = self.config.lake.file_bytes_target as usize;
        let budget = self.config.lake.key_index_bytes_max as usize;
        let deleted = lake.read_deletes(&round.current.deletes).await?;
        let mut index = Some(KeyIndex::default());
        let mut pending: Vec<RecordBatch> = Vec::new();
        let (mut pending_bytes, mut pending_rows) = (0usize, 0u64);
        // The rows of the file being filled: their keys, at their positions in it.
        let add = |index: &mut Option<KeyIndex>, rows: &arrow::row::Rows, js: &[usize], at: u64| {
            if let Some(i) = index.as_mut() {
                let number = i.data.len() as u32;
                for (k, j) in js.iter().enumerate() {
                    i.insert(rows.row(*j).data(), number, at + k as u64);
                }
            }
            if index.as_ref().is_some_and(|i| i.bytes > budget) {
                *index = None;
            }
        };
        for file in &round.current.data {
            let gone = deleted.get(&file.location).map_or(&[][..], Vec::as_slice);
            let mut pos = 0u64;
            for b in lake.read_file(file).await? {
                let b = to_current_lake(&lake_schema, &b)?;
                let rows = round.keys.lake_rows(schema, &b)?;
                let kept: Vec<usize> = (0..b.num_rows())
                    .filter(|j| {
                        gone.binary_search(&(pos + *j as u64)).is_err()
                            && !round.last.contains_key(&rows.row(*j).owned())
                    })
                    .collect();
                pos += b.num_rows() as u64;
                if kept.is_empty() {
                    continue;
                }
                add(&mut index, &rows, &kept, pending_rows);
                let keep: arrow::array::BooleanArray = {
                    let mut mask = vec![false; b.num_rows()];
                    for j in &kept {
                        mask[*j] = true;
                    }
                    mask.into()
                };
                let kept_rows = arrow::compute::filter_record_batch(&b, &keep)?;
                pending_bytes += kept_rows.get_array_memory_size();
                pending_rows += kept_rows.num_rows() as u64;
                pending.push(kept_rows);
                if pending_bytes >= target {
                    let f = self.write_lake_file(lake, table, stream, &pending).await?;
                    if let Some(i) = index.as_mut() {
                        i.data.push(f.file_path().to_string());
                    }
                    files.push(f);
                    pending.clear();
                    (pending_bytes, pending_rows) = (0, 0);
                }
            }
        }
        if let Some(rows) = &round.standing {
            let keys = round.keys.lake_rows(schema, rows)?;
            let all: Vec<usize> = (0..rows.num_rows()).collect();
            add(&mut index, &keys, &all, pending_rows);
            pending.push(rows.clone());
        }
        if !pending.is_empty() {
            let f = self.write_lake_file(lake, table, stream, &pending).await?;
            if let Some(i) = index.as_mut() {
                i.data.push(f.file_path().to_string());
            }
            files.push(f);
        }
        Ok(index.map(|mut i| {
            i.files = i.data.clone();
            i.files.sort_unstable();
            i
        }))
    }

    /// Records a committed snapshot in the metadata log (best effort: the next round,
    /// or a read, records a newer one; until then the TTL keeps the rows).
    async fn record_lake_pointer(&self, table_id: TableId, c: &Committed) {
        let pointer = mink_meta::state::LakeSnapshotPointer {
            snapshot_id: c.snapshot_id,
            location: c.metadata_location.clone(),
            log_offsets: c.offsets.clone(),
            version: c.version,
            timestamp_ms: c.timestamp_ms,
        };
        let newer = self.meta.read(|s| {
            s.lake_snapshots
                .get(&table_id)
                .is_none_or(|p| p.version < c.version)
        });
        if !newer {
            return;
        }
        if let Err(e) = self
            .meta
            .propose(mink_meta::MetaCommand::SetLakeSnapshot { table_id, pointer })
            .await
        {
            tracing::debug!(table_id, "lake snapshot pointer not recorded: {e}");
        }
    }

    /// `lake_snapshot`: the newest lake snapshot of a table, read from the lake itself
    /// (the metadata log's pointer may lag a round).
    pub(crate) async fn lake_snapshot_json(&self, path: &TablePath) -> Result<serde_json::Value> {
        let table = self.table(path).await?;
        let version = self.lake_version(&table, false).await?;
        let Some(v) = version.filter(|v| v.snapshot_id().is_some()) else {
            return Err(MinkError::NotFound(format!(
                "a lake snapshot of {path}{}",
                if table.descriptor.properties.lake.enabled {
                    " (no tiering round has committed yet)"
                } else {
                    " (lake.enabled is off for this table)"
                }
            )));
        };
        let snapshot = v
            .metadata
            .current_snapshot()
            .ok_or_else(|| MinkError::Internal("a lake version without its snapshot".into()))?;
        let summary = &snapshot.summary().additional_properties;
        let number = |key: &str| summary.get(key).and_then(|n| n.parse::<u64>().ok());
        Ok(serde_json::json!({
            "snapshot_id": snapshot.snapshot_id(),
            "timestamp_ms": snapshot.timestamp_ms(),
            "offsets": v.offsets(None)?,
            "version": v.version,
            "metadata_location": self.lake_table(path).metadata_location(v.version),
            "files": number("total-data-files"),
            "records": number("total-records"),
            "bytes": number("total-files-size"),
            "delete_files": number("total-delete-files").unwrap_or(0),
            "position_deletes": number("total-position-deletes").unwrap_or(0),
            "added_bytes": number("added-files-size"),
            "added_records": number("added-records"),
        }))
    }

    /// The rows of lake data files, one batch per row group read, less the rows their
    /// delete files delete, as the table's current schema sees them, each with the
    /// bucket it belongs to and its first offset. Files are read one at a time as the
    /// stream is consumed.
    fn lake_rows(
        &self,
        table: &TableInfo,
        files: LakeFiles,
    ) -> futures::stream::BoxStream<'static, Result<(RecordBatch, TableBucket, i64)>> {
        let lake = self.lake_table(&table.path);
        let schema = table.descriptor.schema.clone();
        let table_id = table.id;
        let deleted = files.deleted;
        futures::stream::iter(files.data)
            .map(move |file| {
                let lake = lake.clone();
                async move {
                    let bucket = file
                        .stream()
                        .and_then(|s| parse_stream(s, table_id))
                        .ok_or_else(|| {
                            MinkError::StorageFailure(format!(
                                "lake file {} is not under data/<bucket>/",
                                file.location
                            ))
                        });
                    (bucket, lake.read_file(&file).await, file.location)
                }
            })
            // The next file's GET overlaps the reader's work on this one.
            .buffered(2)
            .flat_map(move |(bucket, read, location)| {
                let gone = deleted.get(&location).map_or(&[][..], Vec::as_slice);
                let out: Vec<Result<(RecordBatch, TableBucket, i64)>> = match (bucket, read) {
                    (Err(e), _) | (_, Err(e)) => vec![Err(e)],
                    (Ok(bucket), Ok(batches)) => {
                        let mut pos = 0u64;
                        batches
                            .iter()
                            .filter_map(|b| {
                                let start = pos;
                                pos += b.num_rows() as u64;
                                let b = match without_positions(b, start, gone) {
                                    Ok(b) => b,
                                    Err(e) => return Some(Err(e)),
                                };
                                (b.num_rows() > 0).then(|| {
                                    let rows = from_lake_batch(&schema, &b)?;
                                    let base = rows.offsets.value(0);
                                    Ok((rows.batch, bucket, base))
                                })
                            })
                            .collect()
                    }
                };
                futures::stream::iter(out)
            })
            .boxed()
    }

    /// The files of a snapshot (the newest with `None`): data files by bucket, then
    /// offset, and the positions its delete files delete.
    async fn snapshot_files(
        &self,
        table: &TableInfo,
        version: &LakeVersion,
        snapshot_id: Option<i64>,
    ) -> Result<LakeFiles> {
        let id = match snapshot_id {
            // An expired snapshot is gone, cached or not.
            Some(id) if version.metadata.snapshot_by_id(id).is_none() => {
                return Err(MinkError::NotFound(format!("lake snapshot {id}")));
            }
            Some(id) => id,
            None => match version.metadata.current_snapshot() {
                Some(s) => s.snapshot_id(),
                None => return Ok(LakeFiles::default()),
            },
        };
        let cell = self.lake_files.cell((table.id, id));
        let files = cell
            .get_or_try_init(|| async {
                let lake = self.lake_table(&table.path);
                let contents = lake.contents(version, Some(id)).await?;
                let deleted = lake.read_deletes(&contents.deletes).await?;
                let mut data = contents.data;
                // Data file names are `{stream}/{first offset:020}-…`: by name is by
                // bucket, then offset, so each bucket's rows stream in offset order.
                data.sort_by(|a, b| a.location.cmp(&b.location));
                Ok::<_, MinkError>(LakeFiles {
                    data,
                    deleted: Arc::new(deleted),
                })
            })
            .await?;
        Ok(files.clone())
    }

    /// DoGet `Lake`: a log table's rows with `ScanBatch` metadata; a primary-key
    /// table's state at the snapshot with `SnapshotBatch` metadata (its `log_offset` is
    /// the bucket's offset in the snapshot). With `only`, that bucket's files alone: it
    /// may be a bucket of a partition dropped since, whose rows the snapshot still holds.
    pub(crate) async fn read_lake(
        &self,
        path: &TablePath,
        snapshot_id: Option<i64>,
        only: Option<TableBucket>,
    ) -> Result<(SchemaRef, ReadBatches)> {
        let table = self.table(path).await?;
        if let Some(bucket) = only
            && (bucket.table_id != table.id
                || bucket.bucket >= table.descriptor.bucket_count
                || bucket.partition_id.is_some() != table.descriptor.is_partitioned())
        {
            return Err(MinkError::NotFound(format!(
                "{bucket} is not a bucket of {} (table id {})",
                table.path, table.id
            )));
        }
        let schema = table.descriptor.schema.to_arrow();
        let Some(version) = self.lake_version(&table, false).await? else {
            if let Some(id) = snapshot_id {
                return Err(MinkError::NotFound(format!("lake snapshot {id} of {path}")));
            }
            let empty = if table.descriptor.has_primary_key() {
                ReadBatches::SnapshotStream(futures::stream::empty().boxed())
            } else {
                ReadBatches::Stream(futures::stream::empty().boxed())
            };
            return Ok((schema, empty));
        };
        let files = self.snapshot_files(&table, &version, snapshot_id).await?;
        let files = match only {
            None => files,
            Some(bucket) => files.of_bucket(bucket)?,
        };
        let offsets = version.offsets(snapshot_id)?;
        let rows = self.lake_rows(&table, files);
        if table.descriptor.has_primary_key() {
            let written_at_ms = match snapshot_id {
                Some(id) => version
                    .metadata
                    .snapshot_by_id(id)
                    .map(|s| s.timestamp_ms()),
                None => version
                    .metadata
                    .current_snapshot()
                    .map(|s| s.timestamp_ms()),
            }
            .unwrap_or(0);
            let stream = rows.map(move |r| {
                r.map(|(batch, bucket, _)| {
                    let log_offset = offsets.get(&bucket.stream_name()).copied().unwrap_or(0);
                    (
                        batch,
                        SnapshotBatch {
                            bucket,
                            log_offset,
                            written_at_ms,
                        },
                    )
                })
            });
            return Ok((schema, ReadBatches::SnapshotStream(stream.boxed())));
        }
        let stream = rows.map(move |r| {
            r.map(|(batch, bucket, base)| {
                let high_watermark = offsets.get(&bucket.stream_name()).copied().unwrap_or(base);
                (
                    batch,
                    ScanBatch {
                        bucket,
                        base_offset: base,
                        high_watermark,
                        change_types: None,
                        writer_id: None,
                        commit_timestamp: None,
                        next_offset: None,
                    },
                )
            })
        });
        Ok((schema, ReadBatches::Stream(stream.boxed())))
    }

    /// DoGet `Union`: the newest lake snapshot, then each bucket's log from the offset
    /// that snapshot holds rows below up to its high watermark now (read at its
    /// leader): every row once. A primary-key table's answer is its state now, merged
    /// by key (latest change wins, deletes applied), with `SnapshotBatch` metadata.
    /// With `only`, that bucket's part: its files of the snapshot and its log past
    /// them (buckets hold disjoint rows, so parts read from different snapshots still
    /// make every row once).
    pub(crate) async fn read_union(
        &self,
        path: &TablePath,
        only: Option<TableBucket>,
    ) -> Result<(SchemaRef, ReadBatches)> {
        let table = self.table(path).await?;
        if let Some(bucket) = only {
            union_bucket_of(&table, bucket)?;
        }
        let schema = table.descriptor.schema.to_arrow();
        // The snapshot, then each bucket's log from its offset in it. Should the log
        // already start above that offset (a newer round committed and the TTL trimmed
        // meanwhile), the newer snapshot holds those rows: read again.
        let mut attempt = 0;
        let (offsets, files, ends) = loop {
            let version = self.lake_version(&table, false).await?;
            let offsets = match &version {
                Some(v) => v.offsets(None)?,
                None => BTreeMap::new(),
            };
            let ends = self.bucket_ends(&table, only).await?;
            let gap = ends.iter().find(|(b, (start, _))| {
                offsets.get(&b.stream_name()).copied().unwrap_or(*start) < *start
            });
            if let Some((bucket, (start, _))) = gap {
                attempt += 1;
                if attempt < 3 {
                    continue;
                }
                return Err(MinkError::Unavailable(format!(
                    "{bucket}: the log starts at {start}, above the lake's offset {}: the rows \
                     between are in neither (the TTL trimmed them while lake.enabled was off)",
                    offsets[&bucket.stream_name()]
                )));
            }
            let files = match &version {
                Some(v) => self.snapshot_files(&table, v, None).await?,
                None => LakeFiles::default(),
            };
            let files = match only {
                None => files,
                Some(bucket) => files.of_bucket(bucket)?,
            };
            break (offsets, files, ends);
        };
        let buckets: Vec<(TableBucket, i64, i64)> = ends
            .into_iter()
            .map(|(b, (start, end))| {
                let from = offsets.get(&b.stream_name()).copied().unwrap_or(start);
                (b, from, end)
            })
            .collect();
        if table.descriptor.has_primary_key() {
            let mut parts = Vec::new();
            for (bucket, from, end) in buckets {
                let mine = files.of_stream(&bucket.stream_name());
                parts.push(self.merged_bucket(&table, bucket, from, end, mine).await?);
            }
            let stream = futures::stream::iter(parts).flatten();
            return Ok((schema, ReadBatches::SnapshotStream(stream.boxed())));
        }
        let lake_part = self.lake_rows(&table, files).map({
            let offsets = offsets.clone();
            move |r| {
                r.map(|(batch, bucket, base)| {
                    let high_watermark =
                        offsets.get(&bucket.stream_name()).copied().unwrap_or(base);
                    (
                        batch,
                        ScanBatch {
                            bucket,
                            base_offset: base,
                            high_watermark,
                            change_types: None,
                            writer_id: None,
                            commit_timestamp: None,
                            next_offset: None,
                        },
                    )
                })
            }
        });
        let mut log_parts = Vec::new();
        for (bucket, from, end) in buckets {
            log_parts.push(self.bucket_log_from(bucket, from, end).await?);
        }
        let stream = lake_part.chain(futures::stream::iter(log_parts).flatten());
        Ok((schema, ReadBatches::Stream(stream.boxed())))
    }

    /// A primary-key bucket's state now: its changelog since the lake offset (held in
    /// memory: at most about a freshness interval of changes) collapsed by key, then
    /// the lake rows whose key did not change (streamed), then the rows that stand.
    async fn merged_bucket(
        &self,
        table: &TableInfo,
        bucket: TableBucket,
        from: i64,
        end: i64,
        files: LakeFiles,
    ) -> Result<futures::stream::BoxStream<'static, Result<(RecordBatch, SnapshotBatch)>>> {
        let log: Vec<ReadBatch> = self
            .bucket_log_from(bucket, from, end)
            .await?
            .try_collect()
            .await?;
        let keys = Arc::new(KeyColumns::new(table)?);
        let changes: Vec<(RecordBatch, Vec<ChangeType>)> = log
            .into_iter()
            .map(|(b, m)| {
                let types = m
                    .change_types
                    .unwrap_or_else(|| vec![ChangeType::Insert; b.num_rows()]);
                (b, types)
            })
            .collect();
        let last = Arc::new(keys.collapse(&changes)?);
        let meta = SnapshotBatch {
            bucket,
            log_offset: end,
            written_at_ms: now_ms(),
        };
        let standing: Vec<(usize, usize)> = last.values().filter_map(|v| *v).collect();
        let tail = if standing.is_empty() {
            None
        } else {
            let refs: Vec<&RecordBatch> = changes.iter().map(|(b, _)| b).collect();
            Some(arrow::compute::interleave_record_batch(&refs, &standing)?)
        };
        let lake_meta = meta.clone();
        let lake_part = self.lake_rows(table, files).map(move |r| {
            let (batch, _, _) = r?;
            let keep = keys.unchanged(&batch, &last)?;
            Ok((
                arrow::compute::filter_record_batch(&batch, &keep)?,
                lake_meta.clone(),
            ))
        });
        let tail_part = futures::stream::iter(tail.map(|b| Ok((b, meta))));
        Ok(lake_part.chain(tail_part).boxed())
    }

    /// Every bucket's log start and high watermark now (`list_offsets` once per
    /// partition and end: the leaders of the buckets this node does not lead are asked).
    async fn bucket_ends(
        &self,
        table: &TableInfo,
        only: Option<TableBucket>,
    ) -> Result<BTreeMap<TableBucket, (i64, i64)>> {
        let partitions: Vec<Option<String>> = match only {
            Some(bucket) => vec![union_bucket_of(table, bucket)?],
            None if table.descriptor.is_partitioned() => {
                table.partitions.keys().cloned().map(Some).collect()
            }
            None => vec![None],
        };
        let buckets = only.map(|b| vec![b.bucket]);
        let mut out = BTreeMap::new();
        for partition in partitions {
            let mut ends = Vec::with_capacity(2);
            for spec in ["earliest", "latest"] {
                let offsets = self
                    .list_offsets(mink_flight::actions::ListOffsets {
                        forwarded: false,
                        path: table.path.clone(),
                        spec: spec.into(),
                        timestamp: None,
                        partition: partition.clone(),
                        buckets: buckets.clone(),
                    })
                    .await?;
                ends.push(offsets);
            }
            let latest = ends.pop().unwrap_or_default();
            let earliest = ends.pop().unwrap_or_default();
            for (e, l) in earliest.into_iter().zip(latest) {
                let start = e.offset.unwrap_or(0);
                out.insert(e.bucket, (start, l.offset.unwrap_or(start).max(start)));
            }
        }
        Ok(out)
    }

    /// A bucket's log `[from, end)` at its leader: here, or forwarded.
    async fn bucket_log_from(
        &self,
        bucket: TableBucket,
        from: i64,
        end: i64,
    ) -> Result<futures::stream::BoxStream<'static, Result<ReadBatch>>> {
        if from >= end {
            return Ok(futures::stream::empty().boxed());
        }
        let table = self.table_by_id(bucket.table_id).await?;
        let leader = self.leader(bucket);
        if matches!(leader, Some(Leader::Me { .. })) {
            let tablet = self.tablet(bucket).await?;
            let schema = table.descriptor.schema.to_arrow();
            let max = self.config.log.scan_bytes_max as usize;
            let stream = futures::stream::unfold(Some(from), move |pos| {
                let tablet = tablet.clone();
                let schema = schema.clone();
                async move {
                    let pos = pos.filter(|p| *p < end)?;
                    let read = async {
                        let scan = tablet.log().scan(pos, max).await?;
                        let next = scan.next_offset(pos);
                        let mut batches = read_batches(bucket, scan, &schema)?;
                        batches.retain(|(_, m)| m.base_offset < end);
                        for (b, m) in batches.iter_mut() {
                            let take = ((end - m.base_offset) as usize).min(b.num_rows());
                            *b = b.slice(0, take);
                            if let Some(c) = m.change_types.as_mut() {
                                c.truncate(take);
                            }
                        }
                        Ok::<_, MinkError>((batches, (next > pos).then_some(next)))
                    }
                    .await;
                    Some(match read {
                        Ok((batches, next)) => (
                            futures::stream::iter(batches.into_iter().map(Ok)).boxed(),
                            next,
                        ),
                        Err(e) => (futures::stream::iter(vec![Err(e)]).boxed(), None),
                    })
                }
            })
            .flatten();
            return Ok(stream.boxed());
        }
        let Some(addr) = leader
            .as_ref()
            .and_then(Leader::address)
            .map(str::to_string)
        else {
            return Err(MinkError::Unavailable(format!(
                "{bucket} has no leader right now"
            )));
        };
        let ticket = ReadTicket::Scan {
            bucket,
            offset: from,
            max_bytes: None,
            end_offset: Some(end),
            columns: None,
            filter: None,
        };
        // A table's read is this node's to answer: a bucket that moved under it is a
        // reason to retry the read, not a redirect its client could follow.
        let moved = move |e| match e {
            MinkError::NotLeader { .. } => {
                MinkError::Unavailable(format!("{bucket} moved during the read ({e}); retry"))
            }
            e => e,
        };
        let stream = self.forwarder.read(&addr, &ticket).await.map_err(moved)?;
        Ok(stream.map_err(moved).boxed())
    }
}

/// The partition name of `bucket`, a bucket of `table` (`None` for a table without
/// partitions); NotFound when it is not one of the table's buckets (an id of a dropped
/// table of the same name, a partition dropped since, a bucket beyond the count).
fn union_bucket_of(table: &TableInfo, bucket: TableBucket) -> Result<Option<String>> {
    let not_found = || {
        MinkError::NotFound(format!(
            "{bucket} is not a bucket of {} (table id {})",
            table.path, table.id
        ))
    };
    if bucket.table_id != table.id || bucket.bucket >= table.descriptor.bucket_count {
        return Err(not_found());
    }
    match bucket.partition_id {
        None if !table.descriptor.is_partitioned() => Ok(None),
        Some(id) if table.descriptor.is_partitioned() => table
            .partitions
            .iter()
            .find(|(_, p)| p.id == id)
            .map(|(name, _)| Some(name.clone()))
            .ok_or_else(not_found),
        _ => Err(not_found()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parts_of_one_snapshot_read_its_files_once() {
        let cache = LakeFilesCache::default();
        let reads = std::sync::atomic::AtomicUsize::new(0);
        // Four parts of one snapshot at once: one read, the others wait for it.
        let read = |key| {
            let cell = cache.cell(key);
            let reads = &reads;
            async move {
                cell.get_or_try_init(|| async {
                    reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, MinkError>(LakeFiles::default())
                })
                .await
                .map(|_| ())
            }
        };
        futures::future::try_join_all((0..4).map(|_| read((7, 1))))
            .await
            .unwrap();
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A failed read leaves nothing behind: the next part reads again.
        let cell = cache.cell((7, 2));
        let failed = cell
            .get_or_try_init(|| async { Err(MinkError::Unavailable("503".into())) })
            .await;
        assert!(failed.is_err());
        read((7, 2)).await.unwrap();
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Used last is kept longest: snapshot 1, used again, outlives the others.
        read((7, 1)).await.unwrap();
        for id in 3..3 + LAKE_SNAPSHOTS_CACHED as i64 - 1 {
            read((7, id)).await.unwrap();
        }
        let before = reads.load(std::sync::atomic::Ordering::SeqCst);
        read((7, 1)).await.unwrap();
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), before);
        read((7, 2)).await.unwrap();
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), before + 1);
    }

    #[test]
    fn a_lake_of_a_newer_table_is_never_anothers_to_purge() {
        assert_eq!(lake_owner(Some(7), 7), LakeOwner::This);
        assert_eq!(lake_owner(Some(3), 7), LakeOwner::Older(3));
        assert_eq!(lake_owner(None, 7), LakeOwner::Older(-1));
        // A node whose catalog still shows the dropped table 7 meets table 9's lake.
        assert_eq!(lake_owner(Some(9), 7), LakeOwner::Newer(9));
    }

    #[test]
    fn positions_are_dropped_within_their_batch() {
        let batch = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![
                arrow::datatypes::Field::new("x", arrow::datatypes::DataType::Int64, false),
            ])),
            vec![Arc::new(arrow::array::Int64Array::from_iter_values(10..15))],
        )
        .unwrap();
        // Rows 10..15 of a file: 9 and 15 are another batch's, 11 and 14 are here.
        let kept = without_positions(&batch, 10, &[9, 11, 14, 15]).unwrap();
        let kept = kept
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap();
        assert_eq!(kept.values(), &[10, 12, 13]);
        assert_eq!(without_positions(&batch, 10, &[]).unwrap().num_rows(), 5);
    }
}
