//! Reads: scans and limit scans of a bucket, KV snapshot reads, the long-poll tail,
//! and a table's endpoints (one scan per bucket, at its leader). A ticket's `columns`
//! are applied by the Flight server to what these return (mink-flight's
//! `projection`).

use super::*;
use futures::StreamExt;

impl NodeService {
    pub(crate) async fn read(&self, ticket: ReadTicket) -> Result<(SchemaRef, ReadBatches)> {
        match ticket {
            // With an `end_offset`, the Flight server reads the range in scans like this.
            ReadTicket::Scan {
                bucket,
                offset,
                max_bytes,
                ..
            } => {
                let columns = ticket.read_columns();
                let table = self.table_by_id(bucket.table_id).await?;
                // Only the columns the read needs are decoded (and decompressed); the
                // Flight server cuts the rows and columns it answers from them.
                let schema = read_schema(table.descriptor.schema.to_arrow(), &columns)?;
                let tablet = self.tablet(bucket).await?;
                let max = max_bytes.unwrap_or(self.config.log.scan_bytes_max) as usize;
                let scan = tablet
                    .log()
                    .scan_columns(offset, max, columns.as_deref())
                    .await?;
                let batches = read_batches(bucket, scan, &schema)?;
                Ok((schema, ReadBatches::Scan(batches)))
            }
            ReadTicket::LimitScan { bucket, limit, .. } => {
                let table = self.table_by_id(bucket.table_id).await?;
                let schema = table.descriptor.schema.to_arrow();
                let tablet = self.tablet(bucket).await?;
                let log = tablet.log();
                let mut pos = log.log_start();
                let mut rows = 0u64;
                let mut out = Vec::new();
                while rows < limit && pos < log.high_watermark() {
                    let scan = log
                        .scan(pos, self.config.log.scan_bytes_max as usize)
                        .await?;
                    pos = scan.next_offset(pos);
                    for b in scan.batches {
                        if rows >= limit {
                            break;
                        }
                        let take = (limit - rows).min(b.batch.num_rows() as u64) as usize;
                        rows += take as u64;
                        let meta = ScanBatch {
                            bucket,
                            base_offset: b.header.base_offset,
                            high_watermark: scan.high_watermark,
                            change_types: (!b.header.change_types.is_empty())
                                .then(|| b.header.change_types[..take].to_vec()),
                            writer_id: (b.header.writer_id != mink_log::NO_WRITER)
                                .then_some(b.header.writer_id),
                            commit_timestamp: Some(b.header.commit_timestamp),
                            next_offset: None,
                        };
                        out.push((as_schema(b.batch.slice(0, take), &schema)?, meta));
                    }
                }
                Ok((schema, ReadBatches::Scan(out)))
            }
            ReadTicket::Snapshot { bucket, filter, .. } => {
                let table = self.table_by_id(bucket.table_id).await?;
                let schema = table.descriptor.schema.to_arrow();
                // A state is brought up to date by the changelog after it: a row left
                // out for its values could be one a later change replaces.
                let key = &table.descriptor.primary_key;
                if let Some(other) = filter
                    .iter()
                    .flat_map(|f| f.columns())
                    .find(|c| !key.iter().any(|k| k == c))
                {
                    return Err(MinkError::invalid(
                        "filter",
                        format!(
                            "a Snapshot filters on primary-key columns only; {other:?} is not one"
                        ),
                    ));
                }
                // A bad filter is refused before a snapshot may be written for the read.
                if let Some(f) = &filter {
                    f.bind(&schema)?;
                }
                let info = self.kv_snapshot(bucket).await?;
                let meta = SnapshotBatch {
                    bucket,
                    log_offset: info.log_offset,
                    written_at_ms: info.written_at_ms,
                };
                let batches = self
                    .kv_snapshot_rows(bucket, &info, &schema)
                    .await?
                    .map(move |b| Ok((b?, meta.clone())))
                    .boxed();
                Ok((schema, ReadBatches::SnapshotStream(batches)))
            }
            ReadTicket::Lake {
                path,
                snapshot_id,
                bucket,
                ..
            } => self.read_lake(&path, snapshot_id, bucket).await,
            ReadTicket::Union { path, bucket, .. } => self.read_union(&path, bucket).await,
        }
    }

    pub(crate) async fn tail(
        &self,
        bucket: TableBucket,
        poll: TailPoll,
    ) -> Result<(SchemaRef, Vec<ReadBatch>, i64)> {
        let table = self.table_by_id(bucket.table_id).await?;
        let schema = table.descriptor.schema.to_arrow();
        let tablet = self.tablet(bucket).await?;
        let wait = Duration::from_millis(poll.max_wait_ms.min(self.config.flight.tail_wait_max_ms));
        let max = poll.max_bytes.unwrap_or(self.config.log.scan_bytes_max) as usize;
        let scan = tablet
            .log()
            .tail(poll.offset, poll.min_bytes as usize, wait, max)
            .await?;
        let high_watermark = scan.high_watermark;
        let batches = read_batches(bucket, scan, &schema)?;
        Ok((schema, batches, high_watermark))
    }

    /// One endpoint per bucket of every partition: a `Scan` of the bucket's rows now,
    /// from its log start to its high watermark (both asked with `list_offsets`, which
    /// asks the leaders of buckets this node does not lead), at its leader.
    pub(crate) async fn table_endpoints(
        &self,
        path: &TablePath,
    ) -> Result<(SchemaRef, Vec<TableEndpoint>)> {
        let table = self.table(path).await?;
        let partitions: Vec<Option<String>> = if table.descriptor.is_partitioned() {
            table.partitions.keys().cloned().map(Some).collect()
        } else {
            vec![None]
        };
        let mut out = Vec::new();
        for partition in partitions {
            let mut ends = Vec::with_capacity(2);
            for spec in ["earliest", "latest"] {
                let offsets = self
                    .list_offsets(mink_flight::actions::ListOffsets {
                        forwarded: false,
                        path: path.clone(),
                        spec: spec.into(),
                        timestamp: None,
                        partition: partition.clone(),
                        buckets: None,
                    })
                    .await?;
                ends.push(offsets);
            }
            let [earliest, latest] = <[Vec<mink_flight::actions::BucketOffset>; 2]>::try_from(ends)
                .map_err(|_| MinkError::Internal("two list_offsets answers".into()))?;
            for (start, end) in earliest.into_iter().zip(latest) {
                debug_assert_eq!(start.bucket, end.bucket);
                let bucket = start.bucket;
                let from = start.offset.unwrap_or(0);
                let to = end.offset.unwrap_or(from).max(from);
                // This node's own address when it leads (the client reads here).
                let leader = match self.leader(bucket) {
                    Some(Leader::Me { .. }) => self.meta.read(|s| {
                        s.nodes
                            .get(self.meta.node_id())
                            .map(|n| n.flight_addr.clone())
                    }),
                    Some(l) => l.address().map(str::to_string),
                    None => None,
                };
                out.push(TableEndpoint {
                    ticket: ReadTicket::Scan {
                        bucket,
                        offset: from,
                        max_bytes: None,
                        end_offset: Some(to),
                        columns: None,
                        filter: None,
                    },
                    leader,
                    rows: to - from,
                });
            }
        }
        Ok((table.descriptor.schema.to_arrow(), out))
    }

    /// The KV snapshot a bucket's state is read from: the newest one while it is younger
    /// than `kv.snapshot_interval_ms`, otherwise a new one (never one per read). A new
    /// one is recorded in the metadata log for other nodes.
    pub(crate) async fn kv_snapshot(&self, bucket: TableBucket) -> Result<mink_kv::SnapshotInfo> {
        let tablet = self.kv_tablet(bucket).await?;
        let age_max = Duration::from_millis(self.config.kv.snapshot_interval_ms);
        let info = tablet
            .recent_snapshot(age_max)
            .await?
            .ok_or_else(|| MinkError::Internal("the KV tablet has no snapshot store".into()))?;
        let snapshot_id = info.log_offset.max(0) as u64;
        let recorded = self.meta.read(|s| {
            s.kv_snapshots
                .get(&bucket.stream_name())
                .map(|p| p.snapshot_id)
        });
        if recorded.is_none_or(|id| id < snapshot_id) {
            let pointer = crate::tablets::snapshot_pointer(&info);
            // Best effort: the snapshot serves this read whether or not it is recorded
            // (a concurrent reader may have recorded it first).
            if let Err(e) = self
                .meta
                .propose(mink_meta::MetaCommand::SetKvSnapshot {
                    bucket: bucket.stream_name(),
                    pointer,
                })
                .await
            {
                tracing::debug!(%bucket, "KV snapshot pointer not recorded: {e}");
            }
        }
        Ok(info)
    }
}

impl NodeService {
    /// The rows of a bucket's KV snapshot `info`, as `schema` (the table's current
    /// one). Streamed as they are read: a bucket's state of any size holds a batch or
    /// two in memory.
    pub(crate) async fn kv_snapshot_rows(
        &self,
        bucket: TableBucket,
        info: &mink_kv::SnapshotInfo,
        schema: &SchemaRef,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let store = SnapshotStore::new(
            self.streams()
                .object_store_for(mink_wal::Purpose::KvSnapshot),
            snapshot_prefix(bucket),
            self.config.kv.snapshots_retained as usize,
        );
        let schema = schema.clone();
        Ok(store
            .open(info.log_offset)
            .await?
            .into_stream()
            .map(move |b| as_schema(b?, &schema))
            .boxed())
    }
}

/// The table's schema cut to `columns` (`None`: whole), in the table's order; a
/// name the table lacks is `InvalidArgument`.
fn read_schema(schema: SchemaRef, columns: &Option<Vec<String>>) -> Result<SchemaRef> {
    let Some(columns) = columns else {
        return Ok(schema);
    };
    if let Some(unknown) = columns.iter().find(|c| schema.index_of(c).is_err()) {
        // The columns read are those answered, then those the filter names.
        return Err(MinkError::invalid(
            "columns or filter",
            format!("the table has no column {unknown:?}"),
        ));
    }
    let wanted: Vec<usize> = (0..schema.fields().len())
        .filter(|i| columns.iter().any(|c| c == schema.field(*i).name()))
        .collect();
    Ok(Arc::new(schema.project(&wanted)?))
}

/// A scan's batches with their `ScanBatch` metadata, arranged as the table's current
/// schema.
pub(super) fn read_batches(
    bucket: TableBucket,
    scan: mink_log::ScanResult,
    schema: &SchemaRef,
) -> Result<Vec<ReadBatch>> {
    let high_watermark = scan.high_watermark;
    // A read that ended in sequence markers (a primary-key Put that changed nothing
    // takes an offset but holds no rows) ends with an empty batch at the offset after
    // them, so that a client going on from `base_offset + rows` steps over them.
    let past_markers = scan.ends_past_rows().then(|| {
        let meta = ScanBatch {
            bucket,
            base_offset: scan.end,
            high_watermark,
            change_types: None,
            writer_id: None,
            commit_timestamp: None,
            next_offset: None,
        };
        (RecordBatch::new_empty(schema.clone()), meta)
    });
    let mut batches: Vec<ReadBatch> = scan
        .batches
        .into_iter()
        .map(|b| {
            let meta = ScanBatch {
                bucket,
                base_offset: b.header.base_offset,
                high_watermark,
                change_types: (!b.header.change_types.is_empty())
                    .then(|| b.header.change_types.clone()),
                writer_id: (b.header.writer_id != mink_log::NO_WRITER)
                    .then_some(b.header.writer_id),
                commit_timestamp: Some(b.header.commit_timestamp),
                next_offset: None,
            };
            Ok((as_schema(b.batch, schema)?, meta))
        })
        .collect::<Result<_>>()?;
    batches.extend(past_markers);
    Ok(batches)
}
