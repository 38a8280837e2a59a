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

use futures::StreamExt;
use mink_lake::{
    Committed, LakeTable, LakeVersion, TieredBucket, from_lake_batch, lake_arrow_schema,
    partition_value, to_lake_batch,
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
    offsets: HashMap<TableId, BTreeMap<String, i64>>,
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
    }

    /// The metadata version the metadata log last recorded for a table (a hint).
    fn lake_hint(&self, table_id: TableId) -> Option<u64> {
        self.meta
            .read(|s| s.lake_snapshots.get(&table_id).map(|p| p.version))
            .filter(|v| *v > 0)
    }

    /// The newest lake version of a table that belongs to it. A lake table left by a
    /// dropped table of the same name is purged (its `drop_table` purge failed or has
    /// not run yet), and this answers `Unavailable` until that is done.
    async fn lake_version(&self, table: &TableInfo) -> Result<Option<LakeVersion>> {
        let lake = self.lake_table(&table.path);
        let version = lake.load(self.lake_hint(table.id)).await?;
        match version {
            Some(v) if v.table_id() != Some(table.id) => {
                let stale = v.table_id().unwrap_or(-1);
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
            other => Ok(other),
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
            for table in tables {
                if *shutdown.borrow() {
                    return;
                }
                let now = Instant::now();
                self.maybe_sweep(&table, &mut state, now).await;
                if state.due.get(&table.id).is_some_and(|t| now < *t) {
                    continue;
                }
                state
                    .due
                    .insert(table.id, now + table.descriptor.properties.lake.freshness);
                let started = Instant::now();
                match self.tier_table(&table, &mut state).await {
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

    /// One round of `table` for the buckets this node leads; `None` when there was
    /// nothing new to tier (then no object-store request is made) or another writer
    /// tiered everything first.
    pub(crate) async fn tier_table(
        &self,
        table: &TableInfo,
        state: &mut LakeState,
    ) -> Result<Option<Committed>> {
        if table.descriptor.has_primary_key() {
            return Ok(None);
        }
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
        for bucket in buckets {
            let log = match self.log_tablet(bucket).await {
                Ok(log) => log,
                Err(e) => {
                    tracing::debug!(%bucket, "not tiered this round: {e}");
                    continue;
                }
            };
            let lake_end = known.and_then(|k| k.get(&bucket.stream_name()).copied());
            if known.is_none() || lake_end.unwrap_or(log.log_start()) < log.high_watermark() {
                tablets.push((bucket, log));
            }
        }
        if tablets.is_empty() {
            return Ok(None);
        }
        let lake = self.lake_table(&table.path);
        let current = self.lake_version(table).await?;
        let offsets = match &current {
            Some(v) => v.offsets(None)?,
            None => BTreeMap::new(),
        };
        let schema = &table.descriptor.schema;
        let arrow_schema = schema.to_arrow();
        let lake_schema = lake_arrow_schema(schema);
        let target = self.config.lake.file_bytes_target as usize;
        let scan_max = self.config.log.scan_bytes_max as usize;
        let mut tiered = Vec::new();
        for (bucket, log) in tablets {
            let stream = bucket.stream_name();
            let from = offsets.get(&stream).copied();
            let start = log.log_start();
            let mut pos = from.unwrap_or(start);
            if pos < start {
                tracing::warn!(
                    %bucket,
                    "rows {pos}..{start} were trimmed from the log before they reached the lake"
                );
                pos = start;
            }
            let end = log.high_watermark();
            if pos >= end {
                continue;
            }
            let mut files = Vec::new();
            let (mut pending, mut pending_bytes, mut file_first) = (Vec::new(), 0usize, pos);
            let written: Result<()> = async {
                while pos < end {
                    let scan = log.scan(pos, scan_max).await?;
                    let next = scan.next_offset(pos).min(end);
                    for b in scan.batches {
                        let base = b.header.base_offset;
                        if base >= end {
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
                        pending_bytes += rows.get_array_memory_size();
                        pending.push(rows);
                        if pending_bytes >= target {
                            let partition = partition_value(
                                schema,
                                &table.descriptor.partition_keys,
                                &pending[0],
                            )?;
                            files.push(
                                lake.write_data_file(&stream, file_first, &pending, partition)
                                    .await?,
                            );
                            pending.clear();
                            pending_bytes = 0;
                            file_first = base + take as i64;
                        }
                    }
                    if next <= pos {
                        break;
                    }
                    pos = next;
                }
                if !pending.is_empty() {
                    let partition =
                        partition_value(schema, &table.descriptor.partition_keys, &pending[0])?;
                    files.push(
                        lake.write_data_file(&stream, file_first, &pending, partition)
                            .await?,
                    );
                }
                Ok(())
            }
            .await;
            if let Err(e) = written {
                lake.delete_files(&files).await;
                for t in &tiered {
                    let t: &TieredBucket = t;
                    lake.delete_files(&t.files).await;
                }
                return Err(e);
            }
            if !files.is_empty() {
                metrics::counter!("mink_lake_tiered_rows_total")
                    .increment((pos - from.unwrap_or(start).max(start)) as u64);
                tiered.push(TieredBucket {
                    stream,
                    from,
                    to: pos,
                    files,
                });
            }
        }
        if tiered.is_empty() {
            state.offsets.insert(table.id, offsets);
            return Ok(None);
        }
        let committed = lake
            .commit(
                table.id,
                schema,
                &table.descriptor.partition_keys,
                current.as_ref().map(|v| v.version),
                tiered,
            )
            .await?;
        let Some(c) = committed else {
            state.offsets.remove(&table.id);
            return Ok(None);
        };
        state.offsets.insert(table.id, c.offsets.clone());
        self.record_lake_pointer(table.id, &c).await;
        Ok(Some(c))
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
        let version = self.lake_version(&table).await?;
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
        }))
    }

    /// The rows of a lake snapshot, one batch per row group read, each with its bucket
    /// and base offset (rows of a data file are one bucket's, in offset order).
    async fn lake_stream(
        &self,
        table: &TableInfo,
        version: Option<LakeVersion>,
        snapshot_id: Option<i64>,
    ) -> Result<futures::stream::BoxStream<'static, Result<ReadBatch>>> {
        let Some(version) = version else {
            if snapshot_id.is_some() {
                return Err(MinkError::NotFound(format!(
                    "lake snapshot {snapshot_id:?} of {}",
                    table.path
                )));
            }
            return Ok(futures::stream::empty().boxed());
        };
        let lake = self.lake_table(&table.path);
        let mut files = lake.files(&version, snapshot_id).await?;
        // Data file names are `{stream}/{first offset:020}-…`: by name is by bucket,
        // then offset, so each bucket's rows stream in offset order.
        files.sort_by(|a, b| a.location.cmp(&b.location));
        let offsets = version.offsets(snapshot_id)?;
        let schema = table.descriptor.schema.clone();
        let table_id = table.id;
        let stream = futures::stream::iter(files)
            .then(move |file| {
                let lake = lake.clone();
                async move { lake.read_file(&file).await }
            })
            .flat_map(move |read| {
                let out: Vec<Result<ReadBatch>> = match read {
                    Err(e) => vec![Err(e)],
                    Ok(batches) => batches
                        .iter()
                        .map(|b| {
                            let rows = from_lake_batch(&schema, b)?;
                            let (Some(bucket), Some(base)) = (
                                rows.buckets.values().first().copied(),
                                rows.offsets.values().first().copied(),
                            ) else {
                                return Ok(None);
                            };
                            let stream = offsets
                                .keys()
                                .filter_map(|s| parse_stream(s, table_id))
                                .find(|tb| tb.bucket == bucket as u32);
                            let tb =
                                stream.unwrap_or(TableBucket::new(table_id, None, bucket as u32));
                            let hw = offsets.get(&tb.stream_name()).copied().unwrap_or(base);
                            Ok(Some((
                                rows.batch,
                                ScanBatch {
                                    bucket: tb,
                                    base_offset: base,
                                    high_watermark: hw,
                                    change_types: None,
                                },
                            )))
                        })
                        .filter_map(|r| r.transpose())
                        .collect(),
                };
                futures::stream::iter(out)
            });
        Ok(stream.boxed())
    }

    /// DoGet `Lake`.
    pub(crate) async fn read_lake(
        &self,
        path: &TablePath,
        snapshot_id: Option<i64>,
    ) -> Result<(SchemaRef, ReadBatches)> {
        let table = self.table(path).await?;
        let version = self.lake_version(&table).await?;
        let stream = self.lake_stream(&table, version, snapshot_id).await?;
        Ok((
            table.descriptor.schema.to_arrow(),
            ReadBatches::Stream(stream),
        ))
    }

    /// DoGet `Union`: the newest lake snapshot, then each bucket's log from the offset
    /// that snapshot holds rows below up to its high watermark now (read at its
    /// leader): every row once.
    pub(crate) async fn read_union(&self, path: &TablePath) -> Result<(SchemaRef, ReadBatches)> {
        let table = self.table(path).await?;
        let version = self.lake_version(&table).await?;
        let offsets = match &version {
            Some(v) => v.offsets(None)?,
            None => BTreeMap::new(),
        };
        let lake_part = self.lake_stream(&table, version, None).await?;
        // Every bucket of every partition, from its lake offset (the log start when
        // the lake has none of it).
        let buckets: Vec<TableBucket> = self.meta.read(|s| {
            s.buckets
                .values()
                .filter(|b| b.bucket.table_id == table.id)
                .map(|b| b.bucket)
                .collect()
        });
        let mut log_parts = Vec::new();
        for bucket in buckets {
            let from = offsets.get(&bucket.stream_name()).copied();
            log_parts.push(self.bucket_log_from(bucket, from).await?);
        }
        let stream = lake_part.chain(futures::stream::iter(log_parts).flatten());
        Ok((
            table.descriptor.schema.to_arrow(),
            ReadBatches::Stream(stream.boxed()),
        ))
    }

    /// A bucket's log from `from` (its log start with `None`) to its high watermark
    /// now, at its leader: here, or forwarded.
    async fn bucket_log_from(
        &self,
        bucket: TableBucket,
        from: Option<i64>,
    ) -> Result<futures::stream::BoxStream<'static, Result<ReadBatch>>> {
        #[derive(Deserialize)]
        struct BucketOffset {
            bucket: TableBucket,
            offset: Option<i64>,
        }
        let table = self.table_by_id(bucket.table_id).await?;
        let partition = match bucket.partition_id {
            Some(id) => table
                .partitions
                .values()
                .find(|p| p.id == id)
                .map(|p| p.name.clone()),
            None => None,
        };
        let mut ends = Vec::with_capacity(2);
        for spec in ["earliest", "latest"] {
            let body =
                serde_json::json!({"path": table.path, "spec": spec, "partition": partition});
            let answer = self.action("list_offsets", &json(&body)?).await?;
            let offsets: Vec<BucketOffset> = parse_json("list_offsets answer", &answer)?;
            ends.push(
                offsets
                    .into_iter()
                    .find(|o| o.bucket == bucket)
                    .and_then(|o| o.offset),
            );
        }
        let (start, end) = (ends[0].unwrap_or(0), ends[1].unwrap_or(0));
        let from = from.unwrap_or(start);
        if from < start {
            return Err(MinkError::Internal(format!(
                "{bucket}: the log starts at {start}, above the lake's offset {from}: rows \
                 {from}..{start} are in neither (they were trimmed before tiering)"
            )));
        }
        if from >= end {
            return Ok(futures::stream::empty().boxed());
        }
        let leader = self.meta.read(|s| {
            s.buckets
                .get(&bucket.stream_name())
                .and_then(|b| b.leader.clone())
                .map(|l| (s.nodes.get(&l).map(|n| n.flight_addr.clone()), l))
        });
        let here = leader
            .as_ref()
            .is_some_and(|(_, l)| l == self.meta.node_id());
        if here {
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
        let Some((Some(addr), _)) = leader else {
            return Err(MinkError::Unavailable(format!(
                "{bucket} has no leader right now"
            )));
        };
        let ticket = ReadTicket::Scan {
            bucket,
            offset: from,
            max_bytes: None,
            end_offset: Some(end),
        };
        self.forwarder.read(&addr, &ticket).await
    }
}
