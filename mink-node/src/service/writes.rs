//! The write path of spec/writes.txt: bucket writes (Append, Put) on the leader,
//! table writes routed by this node (AppendTable, PutTable) with the parts it does
//! not lead forwarded to their leaders.

use super::*;
use mink_wal::Cork;

/// A bucket's open tablet: a log, or a log under a KV tablet.
/// How long a forwarded bucket write may take, redirects and retries included.
const FORWARD_DEADLINE: Duration = Duration::from_secs(30);

impl NodeService {
    pub(crate) async fn write(
        &self,
        descriptor: &WriteDescriptor,
        batch: RecordBatch,
        ipc: Option<IpcEncoded>,
        meta: WriteBatch,
    ) -> Result<WriteResult> {
        match descriptor {
            WriteDescriptor::Append {
                bucket,
                schema_id,
                writer_id,
            } => {
                let table = self.table_by_id(bucket.table_id).await?;
                if table.descriptor.has_primary_key() {
                    return Err(MinkError::invalid(
                        "descriptor",
                        format!("{} has a primary key: use Put", table.path),
                    ));
                }
                self.check_topic_rows(&table, &batch)?;
                let w = self
                    .append(*bucket, *schema_id, *writer_id, batch, ipc, &meta, None)
                    .await?;
                Ok(WriteResult::Written {
                    first_offset: w.first_offset,
                    last_offset: w.last_offset,
                    duplicated: w.duplicated,
                })
            }
            WriteDescriptor::AppendTable { path, schema_id } => {
                self.append_table(path, *schema_id, batch, ipc, &meta).await
            }
            WriteDescriptor::Put {
                bucket,
                schema_id,
                writer_id,
                target_columns,
            } => {
                let changes = meta.changes.clone();
                let w = self
                    .put(
                        *bucket,
                        *schema_id,
                        *writer_id,
                        target_columns.clone(),
                        batch,
                        changes,
                        &meta,
                        None,
                    )
                    .await?;
                Ok(WriteResult::Written {
                    first_offset: w.first_offset,
                    last_offset: w.last_offset,
                    duplicated: w.duplicated,
                })
            }
            WriteDescriptor::PutTable {
                path,
                schema_id,
                target_columns,
            } => {
                self.put_table(path, *schema_id, target_columns.clone(), batch, &meta)
                    .await
            }
        }
    }

    /// A bucket-addressed write must carry only rows of that bucket (when the table
    /// has bucket keys): otherwise lookups would look for them elsewhere.
    pub(crate) async fn check_rows_belong(
        &self,
        bucket: TableBucket,
        batch: &RecordBatch,
    ) -> Result<()> {
        let table = self.table_by_id(bucket.table_id).await?;
        let d = &table.descriptor;
        let keys = d.bucket_keys();
        if keys.is_empty() {
            return Ok(());
        }
        let indices: Vec<usize> = keys
            .iter()
            .map(|k| {
                batch.schema().index_of(k).map_err(|_| {
                    MinkError::invalid("batch", format!("the batch lacks bucket-key column {k:?}"))
                })
            })
            .collect::<Result<_>>()?;
        let per_row = mink_types::bucket_per_row(batch, &indices, d.bucketing, d.bucket_count)?;
        if let Some((row, other)) = per_row
            .iter()
            .enumerate()
            .find(|(_, b)| **b != bucket.bucket)
        {
            return Err(MinkError::invalid(
                "batch",
                format!(
                    "row {row} belongs to bucket {other}, not to {bucket}; route rows by their bucket keys"
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn sequence(writer: Option<i64>, meta: &WriteBatch) -> Result<(i64, i64)> {
        match (writer, meta.batch_sequence) {
            (Some(w), Some(s)) => Ok((w, s)),
            (Some(_), None) => Err(MinkError::invalid(
                "batch_sequence",
                "a write with a writer_id needs a batch_sequence",
            )),
            (None, s) => Ok((NO_WRITER, s.unwrap_or(0))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[tracing::instrument(level = "debug", name = "put", skip_all, fields(%bucket, writer = ?writer, sequence = ?meta.batch_sequence, wal_seq = tracing::field::Empty))]
    pub(crate) async fn put(
        &self,
        bucket: TableBucket,
        schema_id: i32,
        writer: Option<i64>,
        target_columns: Option<Vec<String>>,
        batch: RecordBatch,
        changes: Option<Vec<ChangeType>>,
        meta: &WriteBatch,
        cork: Option<Cork>,
    ) -> Result<BucketWritten> {
        // Admitted where the rows enter their tablet, held until durable: a table write
        // holds nothing while its parts for other leaders are forwarded (they are
        // admitted there), so two nodes forwarding to each other never wait on each
        // other's permits (see `crate::admission`).
        let _admitted = self
            .admission
            .admit(batch.get_array_memory_size() as u64)
            .await?;
        let (writer_id, batch_sequence) = Self::sequence(writer, meta)?;
        self.check_rows_belong(bucket, &batch).await?;
        // A primary-key table keeps rows of its current schema: rows of an older
        // version are read with the evolution rules (added columns null) first.
        let table = self.table_by_id(bucket.table_id).await?;
        let current = &table.descriptor.schema;
        let (schema_id, batch) = if schema_id == current.schema_id {
            (schema_id, batch)
        } else {
            let old = schema_version(&table, schema_id)?;
            match &target_columns {
                Some(_) => (current.schema_id, batch),
                None => {
                    old.check_batch(&batch)?;
                    (current.schema_id, as_schema(batch, &current.to_arrow())?)
                }
            }
        };
        let tablet = self.write_target(bucket).await?;
        let request = PutRequest {
            writer_id,
            batch_sequence,
            kafka: None,
            schema_id,
            target_columns,
            changes,
            batch,
        };
        let appended = self
            .submit_and_wait(bucket, &tablet, BucketWrite::Put(request), cork, writer)
            .await?;
        Ok(BucketWritten {
            bucket,
            first_offset: appended.first_offset,
            last_offset: appended.last_offset,
            duplicated: appended.duplicated,
        })
    }

    /// A Flight write through the front door (`submit.rs`), waited for at once.
    ///
    /// A write refused at its submit was not appended: its tablet assigns offsets and
    /// hands the batch to the WAL last, and every refusal comes before that (a Put's
    /// merge, its store checks, the log's sequence and capacity checks, a WAL that
    /// will not take it). Its error goes back as it is, redirected when stale, and a
    /// retry writes the rows once. Only a write whose durability could not be settled
    /// is answered by [`NodeService::after_write_error`].
    async fn submit_and_wait(
        &self,
        bucket: TableBucket,
        tablet: &Tablet,
        write: BucketWrite,
        cork: Option<Cork>,
        writer: Option<i64>,
    ) -> Result<mink_log::Appended> {
        let submission = match submit(bucket, tablet, write, cork).await {
            Ok(s) => s,
            Err(e) => return Err(self.redirect_stale(bucket, e).await),
        };
        let appended = match submission.wait().await {
            Ok(a) => a,
            Err(e) => return Err(self.after_write_error(bucket, writer, e).await),
        };
        // Inside the request's `append`/`put` span, which now holds `wal_seq`: the WAL
        // upload that carried the rows (a duplicate's is its original's, not this span's).
        tracing::debug!(
            first_offset = appended.first_offset,
            last_offset = appended.last_offset,
            duplicated = appended.duplicated,
            "written"
        );
        Ok(appended)
    }

    /// The error of a write its tablet took whose durability could not be settled.
    /// With a writer id a retry is deduplicated, so a stale leader redirects as usual.
    /// Without one, the rows may have been recorded (an upload that landed before the WAL failed or was fenced is
    /// recovered by the next leader): a redirect would invite a retry that writes them
    /// twice, so the caller hears that the outcome is unknown instead.
    async fn after_write_error(
        &self,
        bucket: TableBucket,
        writer: Option<i64>,
        e: MinkError,
    ) -> MinkError {
        match (writer, self.redirect_stale(bucket, e).await) {
            (None, e @ (MinkError::NotLeader { .. } | MinkError::Unavailable(_))) => {
                outcome_unknown(bucket, &e)
            }
            (_, e) => e,
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[tracing::instrument(level = "debug", name = "append", skip_all, fields(%bucket, writer = ?writer, sequence = ?meta.batch_sequence, wal_seq = tracing::field::Empty))]
    pub(crate) async fn append(
        &self,
        bucket: TableBucket,
        schema_id: i32,
        writer: Option<i64>,
        batch: RecordBatch,
        ipc: Option<IpcEncoded>,
        meta: &WriteBatch,
        cork: Option<Cork>,
    ) -> Result<BucketWritten> {
        // As in `put`: admitted at the tablet, held until durable.
        let bytes = ipc
            .as_ref()
            .map_or_else(|| batch.get_array_memory_size(), |i| i.len());
        let _admitted = self.admission.admit(bytes as u64).await?;
        let tablet = self.write_target(bucket).await?;
        let (writer_id, sequence) = Self::sequence(writer, meta)?;
        self.check_rows_belong(bucket, &batch).await?;
        let request = AppendRequest {
            writer_id,
            first_sequence: sequence,
            last_sequence: sequence,
            schema_id,
            change_types: None,
            batch,
            ipc,
        };
        let write = BucketWrite::Append {
            request,
            order: Sequencing::Pipelined,
        };
        let appended = self
            .submit_and_wait(bucket, &tablet, write, cork, writer)
            .await?;
        Ok(BucketWritten {
            bucket,
            first_offset: appended.first_offset,
            last_offset: appended.last_offset,
            duplicated: appended.duplicated,
        })
    }

    /// Writes a bucket's part at its leader, following redirects (`NotLeader` names
    /// the new leader), a refusal before anything was written, and, for a write with
    /// a writer id, retrying while the leader answers `Unavailable` (the bucket is
    /// being opened); within [`FORWARD_DEADLINE`]. A forwarded write that outlives it,
    /// or whose call failed mid-way (`Forwarder::write`), answers `Unavailable` with a
    /// writer id and "outcome unknown" (`StorageFailure`) without one.
    pub(crate) async fn forwarded(
        &self,
        addr: &str,
        bucket: TableBucket,
        descriptor: &WriteDescriptor,
        part: &RecordBatch,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        let deadline = tokio::time::Instant::now() + FORWARD_DEADLINE;
        let idempotent = match descriptor {
            WriteDescriptor::Append { writer_id, .. } | WriteDescriptor::Put { writer_id, .. } => {
                writer_id.is_some()
            }
            _ => false,
        };
        let mut addr = addr.to_string();
        let mut pause = Duration::from_millis(50);
        loop {
            let attempt = tokio::time::timeout_at(
                deadline,
                self.forwarded_once(&addr, bucket, descriptor, part, meta),
            )
            .await;
            match attempt {
                Err(_) => {
                    let e = MinkError::Unavailable(format!(
                        "{bucket}: the leader at {addr} did not answer within {FORWARD_DEADLINE:?}"
                    ));
                    return Err(if idempotent {
                        e
                    } else {
                        outcome_unknown(bucket, &e)
                    });
                }
                // A redirect is a refusal before anything was written. It may point
                // back here when this node's view is the stale one: catch the view up
                // and pause first, so that two views that disagree cannot bounce the
                // write in a tight loop.
                Ok(Err(MinkError::NotLeader {
                    leader: Some(next), ..
                })) if next != addr && tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(%bucket, %addr, %next, "forwarded write redirected");
                    self.meta.inner_catch_up().await;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    addr = next;
                }
                // Without a writer id only a redirect is safe to follow: an
                // Unavailable may be a connection lost after the leader recorded it.
                Ok(Err(MinkError::Unavailable(why)))
                    if idempotent && tokio::time::Instant::now() + pause < deadline =>
                {
                    tracing::debug!(%bucket, %addr, "forwarded write refused ({why}); retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Ok(other) => return other,
            }
        }
    }

    pub(crate) async fn forwarded_once(
        &self,
        addr: &str,
        bucket: TableBucket,
        descriptor: &WriteDescriptor,
        part: &RecordBatch,
        meta: &WriteBatch,
    ) -> Result<BucketWritten> {
        match self.forwarder.write(addr, descriptor, part, meta).await? {
            WriteResult::Written {
                first_offset,
                last_offset,
                duplicated,
            } => Ok(BucketWritten {
                bucket,
                first_offset,
                last_offset,
                duplicated,
            }),
            other => Err(MinkError::Internal(format!(
                "{addr} answered a bucket write with {other:?}"
            ))),
        }
    }

    /// Where each row of a table-addressed batch goes: partitions first (created on
    /// demand), then buckets (hash of the bucket keys, or round-robin per batch).
    /// Returns each bucket with the original row indices it gets. With `create` false,
    /// rows of partitions that do not exist are left out (lookups: such keys have no row).
    pub(crate) async fn route(
        &self,
        table: &TableInfo,
        batch: &RecordBatch,
        create: bool,
    ) -> Result<Vec<(TableBucket, Vec<u32>)>> {
        let d = &table.descriptor;
        let column = |k: &String| {
            batch
                .schema()
                .index_of(k)
                .map_err(|_| MinkError::invalid("batch", format!("the batch lacks column {k:?}")))
        };
        let mut parts: Vec<(Option<i64>, Vec<u32>)> = Vec::new();
        if d.is_partitioned() {
            let keys: Vec<usize> = d.partition_keys.iter().map(column).collect::<Result<_>>()?;
            for p in split_by_partition(batch, &keys)? {
                let known = self.meta.read(|s| {
                    s.table(&table.path)
                        .and_then(|t| t.partitions.get(&p.name).map(|p| p.id))
                });
                let id = match known {
                    Some(id) => id,
                    None if !create => continue,
                    None => {
                        let (info, _) = self.meta.create_partition(&table.path, &p.name).await?;
                        self.meta.assign_now().await;
                        info.id
                    }
                };
                parts.push((Some(id), p.rows.values().to_vec()));
            }
        } else {
            parts.push((None, (0..batch.num_rows() as u32).collect()));
        }
        let bucket_keys: Vec<usize> = d.bucket_keys().iter().map(column).collect::<Result<_>>()?;
        let mut out = Vec::new();
        for (partition, rows) in parts {
            if bucket_keys.is_empty() {
                let bucket = {
                    let mut rr = self.round_robin.lock().unwrap_or_else(|e| e.into_inner());
                    let next = rr.entry(table.id).or_insert(0);
                    let b = *next % d.bucket_count;
                    *next = next.wrapping_add(1);
                    b
                };
                out.push((TableBucket::new(table.id, partition, bucket), rows));
                continue;
            }
            let sub = take_record_batch(batch, &arrow::array::UInt32Array::from(rows.clone()))?;
            for part in split_by_bucket(&sub, &bucket_keys, d.bucketing, d.bucket_count)? {
                let original = part
                    .rows
                    .values()
                    .iter()
                    .map(|i| rows[*i as usize])
                    .collect();
                out.push((TableBucket::new(table.id, partition, part.bucket), original));
            }
        }
        Ok(out)
    }

    pub(crate) async fn append_table(
        &self,
        path: &TablePath,
        schema_id: i32,
        batch: RecordBatch,
        ipc: Option<IpcEncoded>,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let table = self.table(path).await?;
        let d = &table.descriptor;
        if d.has_primary_key() {
            return Err(MinkError::invalid(
                "descriptor",
                format!("{path} has a primary key: write it with PutTable"),
            ));
        }
        // Rows of an older schema version keep its id: it travels with them, and
        // readers see them through the evolution rules (added columns null).
        schema_version(&table, schema_id)?.check_batch(&batch)?;
        self.check_topic_rows(&table, &batch)?;
        // Every bucket's part at once (local appends and forwards alike): a write
        // spanning N buckets costs one PUT of latency, not N. The answer waits for all.
        // The cork keeps the WAL from sealing a group until every local part is on its
        // way, so that they share one upload.
        let mut parts = Vec::new();
        // Routed first: routing may create a partition (a metadata proposal), and a
        // cork held meanwhile would hold back every group of the node.
        let routed = self.route(&table, &batch, true).await?;
        let cork = self.streams().cork();
        // One part holding every row in order is the batch as it came: its client
        // encoding goes into the log as it is.
        let whole = routed.len() == 1
            && routed[0].1.len() == batch.num_rows()
            && routed[0]
                .1
                .iter()
                .enumerate()
                .all(|(i, r)| *r as usize == i);
        let mut ipc = if whole { ipc } else { None };
        for (bucket, rows) in routed {
            let part = if whole {
                batch.clone()
            } else {
                take_record_batch(&batch, &arrow::array::UInt32Array::from(rows))?
            };
            let cork = cork.clone();
            let ipc = ipc.take();
            parts.push(async move {
                match self
                    .append(bucket, schema_id, None, part.clone(), ipc, meta, Some(cork))
                    .await
                {
                    Err(MinkError::NotLeader {
                        leader: Some(addr), ..
                    }) => {
                        let descriptor = WriteDescriptor::Append {
                            bucket,
                            schema_id,
                            writer_id: None,
                        };
                        self.forwarded(&addr, bucket, &descriptor, &part, meta)
                            .await
                    }
                    other => other,
                }
                .map_err(table_write_error)
            });
        }
        drop(cork);
        let results = futures::future::join_all(parts).await;
        Ok(WriteResult::Routed {
            buckets: table_write_answer(path, results)?,
        })
    }

    pub(crate) async fn put_table(
        &self,
        path: &TablePath,
        schema_id: i32,
        target_columns: Option<Vec<String>>,
        batch: RecordBatch,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let table = self.table(path).await?;
        let d = &table.descriptor;
        if !d.has_primary_key() {
            return Err(MinkError::invalid(
                "descriptor",
                format!("{path} has no primary key: write it with AppendTable"),
            ));
        }
        if let Some(c) = &meta.changes
            && c.len() != batch.num_rows()
        {
            return Err(MinkError::invalid(
                "changes",
                format!("{} change types for {} rows", c.len(), batch.num_rows()),
            ));
        }
        // Every bucket's part at once, corked, as for AppendTable.
        let mut parts = Vec::new();
        let routed = self.route(&table, &batch, true).await?;
        let cork = self.streams().cork();
        for (bucket, rows) in routed {
            let changes: Option<Vec<_>> = meta
                .changes
                .as_ref()
                .map(|c| rows.iter().map(|i| c[*i as usize]).collect());
            let part = take_record_batch(&batch, &arrow::array::UInt32Array::from(rows))?;
            let target_columns = target_columns.clone();
            let cork = cork.clone();
            parts.push(async move {
                let result = self
                    .put(
                        bucket,
                        schema_id,
                        None,
                        target_columns.clone(),
                        part.clone(),
                        changes.clone(),
                        meta,
                        Some(cork),
                    )
                    .await;
                match result {
                    Err(MinkError::NotLeader {
                        leader: Some(addr), ..
                    }) => {
                        let descriptor = WriteDescriptor::Put {
                            bucket,
                            schema_id,
                            writer_id: None,
                            target_columns,
                        };
                        let meta = WriteBatch {
                            batch_sequence: None,
                            changes,
                        };
                        self.forwarded(&addr, bucket, &descriptor, &part, &meta)
                            .await
                    }
                    other => other,
                }
                .map_err(table_write_error)
            });
        }
        drop(cork);
        let results = futures::future::join_all(parts).await;
        Ok(WriteResult::Routed {
            buckets: table_write_answer(path, results)?,
        })
    }
}

/// The answer of a write without a writer id whose outcome is unknown: its rows may be
/// in the log, and a retry could write them twice.
fn outcome_unknown(bucket: TableBucket, e: &MinkError) -> MinkError {
    MinkError::StorageFailure(format!(
        "{bucket}: the write's outcome is unknown ({e}); without a writer id it is not retried"
    ))
}

/// The answer of a table write (no writer id) from its parts': each part's error is a
/// refusal of that part alone, so when another part landed, or one's outcome is
/// unknown, the write as a whole is neither done nor refused: it answers
/// `StorageFailure`, naming the buckets that landed, and invites no retry.
fn table_write_answer(
    path: &TablePath,
    results: Vec<Result<BucketWritten>>,
) -> Result<Vec<BucketWritten>> {
    let landed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|w| w.bucket.to_string()))
        .collect();
    let Some(first) = results.iter().find_map(|r| r.as_ref().err()) else {
        return Ok(results.into_iter().flatten().collect());
    };
    if landed.is_empty() {
        // Nothing landed: a part that failed other than by a refusal (its outcome
        // unknown, an internal error) is the answer, or else the refusal (every part
        // refused: a retry writes the rows once).
        let other = results.iter().find_map(|r| match r {
            Err(MinkError::Unavailable(_) | MinkError::NotLeader { .. }) | Ok(_) => None,
            Err(e) => Some(e),
        });
        return Err(other.unwrap_or(first).clone());
    }
    Err(MinkError::StorageFailure(format!(
        "{path}: the table write is partly written: it landed in {}, and a part failed \
         ({first}); without a writer id it is not retried",
        landed.join(", ")
    )))
}

/// A part's error as the answer of a whole table write. A `NotLeader` left over (a
/// bucket with no leader right now, or a redirect not followed) tells a client "not
/// written; retry", which other parts of the same write may contradict: it answers
/// `Unavailable` instead, as any failure of a table write whose parts may have landed.
fn table_write_error(e: MinkError) -> MinkError {
    match e {
        MinkError::NotLeader { bucket, .. } => MinkError::Unavailable(format!(
            "{bucket} has no reachable leader right now ({e}); retry"
        )),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(bucket: u32) -> Result<BucketWritten> {
        Ok(BucketWritten {
            bucket: TableBucket::new(1, None, bucket),
            first_offset: 0,
            last_offset: 9,
            duplicated: false,
        })
    }

    /// A table write without a writer id says "retry" only when no part landed and
    /// none may have: otherwise a retry would write the landed parts twice.
    #[test]
    fn a_table_write_that_partly_landed_invites_no_retry() {
        let path = TablePath::parse("db.t").unwrap();
        let refused = || Err(MinkError::Unavailable("b1: overloaded; retry".into()));
        let unknown = || Err(MinkError::StorageFailure("b1: outcome is unknown".into()));
        assert_eq!(
            table_write_answer(&path, vec![written(0), written(1)])
                .unwrap()
                .len(),
            2
        );
        let partly = table_write_answer(&path, vec![written(0), refused()]).unwrap_err();
        assert!(
            matches!(&partly, MinkError::StorageFailure(m) if m.contains("landed in table 1 bucket 0")),
            "{partly}"
        );
        let none = table_write_answer(&path, vec![refused(), refused()]).unwrap_err();
        assert!(matches!(none, MinkError::Unavailable(_)), "{none}");
        let maybe = table_write_answer(&path, vec![refused(), unknown()]).unwrap_err();
        assert!(matches!(maybe, MinkError::StorageFailure(_)), "{maybe}");
        // Nothing landed, but a part failed other than by a refusal: not "retry".
        let internal = || Err(MinkError::Internal("b1: h2 stream reset".into()));
        let odd = table_write_answer(&path, vec![refused(), internal()]).unwrap_err();
        assert!(matches!(odd, MinkError::Internal(_)), "{odd}");
    }
}
