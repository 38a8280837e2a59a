//! Writers and offsets: writer ids from the shared allocator, a table's offsets per
//! bucket (asking the leaders this node is not), and producers' registered offsets.

use mink_flight::actions::{
    BucketOffset, Indexed, ListOffsets, ProducerId, ProducerOffset, ProducerOffsets,
    RegisterProducerOffsets, WriterId,
};

use super::*;

/// Writer ids handed to this node at a time.
const WRITER_ID_BLOCK: u64 = 1_000;

/// How long registered producer offsets live without a new registration.
const PRODUCER_OFFSETS_TTL_MS: i64 = 7 * 24 * 3600 * 1000;

/// Offsets in one `register_producer_offsets`, at most.
const PRODUCER_OFFSETS_MAX: usize = 10_000;

impl NodeService {
    pub(super) async fn init_writer(&self) -> Result<WriterId> {
        Ok(WriterId {
            writer_id: self.next_writer_id().await?,
        })
    }

    /// Each bucket's offset by `r.spec`: this node's tablets answer for the buckets it
    /// leads, the leaders for the others, so any node answers for the whole table.
    pub(crate) async fn list_offsets(&self, r: ListOffsets) -> Result<Vec<BucketOffset>> {
        let table = self.table(&r.path).await?;
        let spec = match r.spec.as_str() {
            "earliest" => OffsetSpec::Earliest,
            "latest" => OffsetSpec::Latest,
            "timestamp" => OffsetSpec::Timestamp(r.timestamp.ok_or_else(|| {
                MinkError::invalid("timestamp", "the timestamp spec needs a timestamp (ms)")
            })?),
            other => {
                return Err(MinkError::invalid(
                    "spec",
                    format!("{other:?} is not earliest, latest or timestamp"),
                ));
            }
        };
        let partition = self.partition_named(&table, r.partition.as_deref())?;
        let buckets: Vec<u32> = r
            .buckets
            .clone()
            .unwrap_or_else(|| (0..table.descriptor.bucket_count).collect());
        let mut out = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            if bucket >= table.descriptor.bucket_count {
                return Err(MinkError::invalid(
                    "buckets",
                    format!("{} has no bucket {bucket}", r.path),
                ));
            }
            let tb = TableBucket::new(table.id, partition, bucket);
            let r = &r;
            let offset = self
                .at_leader(
                    tb,
                    r.forwarded,
                    |tablet| async move { tablet.log().list_offsets(spec).await },
                    |addr| async move {
                        let one = ListOffsets {
                            buckets: Some(vec![bucket]),
                            forwarded: true,
                            ..r.clone()
                        };
                        let answer = self.forwarder.call(&addr, &one).await?;
                        Ok(answer.first().and_then(|b| b.offset))
                    },
                )
                .await?;
            out.push(BucketOffset { bucket: tb, offset });
        }
        Ok(out)
    }

    /// The id of `table`'s partition `name`: required for, and only for, partitioned
    /// tables, and it must exist.
    fn partition_named(&self, table: &TableInfo, name: Option<&str>) -> Result<Option<i64>> {
        match (name, table.descriptor.is_partitioned()) {
            (None, false) => Ok(None),
            (Some(name), true) => Ok(Some(
                table
                    .partitions
                    .get(name)
                    .ok_or_else(|| {
                        MinkError::NotFound(format!("partition {name} of {}", table.path))
                    })?
                    .id,
            )),
            (None, true) => Err(MinkError::invalid(
                "partition",
                format!("{} is partitioned: name the partition", table.path),
            )),
            (Some(_), false) => Err(MinkError::invalid(
                "partition",
                format!("{} is not partitioned", table.path),
            )),
        }
    }

    pub(super) async fn register_producer_offsets(
        &self,
        r: RegisterProducerOffsets,
    ) -> Result<Indexed> {
        if r.offsets.len() > PRODUCER_OFFSETS_MAX {
            return Err(MinkError::LimitExceeded {
                what: "offsets in one register_producer_offsets".into(),
                limit: PRODUCER_OFFSETS_MAX as u64,
                actual: r.offsets.len() as u64,
            });
        }
        let mut offsets = std::collections::BTreeMap::new();
        for (i, o) in r.offsets.iter().enumerate() {
            let bucket = self.producer_bucket(o).await.map_err(|e| match e {
                MinkError::InvalidArgument { field, reason } => MinkError::InvalidArgument {
                    field: format!("offsets[{i}].{field}"),
                    reason,
                },
                other => other,
            })?;
            if o.offset < 0 {
                return Err(MinkError::invalid(
                    format!("offsets[{i}].offset"),
                    "offsets are not negative",
                ));
            }
            if offsets.insert(bucket.stream_name(), o.offset).is_some() {
                return Err(MinkError::invalid(
                    format!("offsets[{i}]"),
                    format!("{bucket} is named twice"),
                ));
            }
        }
        let index = self
            .meta
            .propose(mink_meta::MetaCommand::RegisterProducerOffsets {
                producer_id: r.producer_id,
                offsets,
                at_ms: now_ms(),
                ttl_ms: r.ttl_ms.unwrap_or(PRODUCER_OFFSETS_TTL_MS),
            })
            .await?;
        Ok(Indexed { index })
    }

    /// A producer's offsets, by bucket as clients name it; buckets of tables or
    /// partitions dropped since are left out.
    pub(super) fn get_producer_offsets(&self, r: ProducerId) -> Result<ProducerOffsets> {
        self.meta
            .read(|s| {
                let found = s.producer_offsets.get(&r.producer_id)?;
                let mut offsets: Vec<ProducerOffset> = found
                    .offsets
                    .iter()
                    .filter_map(|(stream, offset)| {
                        let bucket = s.buckets.get(stream)?.bucket;
                        let table = s.tables.get(&bucket.table_id)?;
                        let partition = match bucket.partition_id {
                            None => None,
                            Some(id) => {
                                Some(table.partitions.values().find(|p| p.id == id)?.name.clone())
                            }
                        };
                        Some(ProducerOffset {
                            path: table.path.clone(),
                            partition,
                            bucket: bucket.bucket,
                            offset: *offset,
                        })
                    })
                    .collect();
                offsets.sort_by(|a, b| {
                    (a.path.to_string(), &a.partition, a.bucket).cmp(&(
                        b.path.to_string(),
                        &b.partition,
                        b.bucket,
                    ))
                });
                Some(ProducerOffsets {
                    offsets,
                    expires_at_ms: found.expires_at_ms,
                })
            })
            .ok_or_else(|| MinkError::NotFound(format!("producer offsets of {}", r.producer_id)))
    }

    pub(super) async fn delete_producer_offsets(&self, r: ProducerId) -> Result<Indexed> {
        let index = self
            .meta
            .propose(mink_meta::MetaCommand::DeleteProducerOffsets {
                producer_id: r.producer_id,
            })
            .await?;
        Ok(Indexed { index })
    }

    /// The bucket a producer offset names: the table, its partition by name (required
    /// for, and only for, partitioned tables; it must exist) and a bucket number in
    /// range.
    async fn producer_bucket(&self, o: &ProducerOffset) -> Result<TableBucket> {
        let table = self.table(&o.path).await?;
        let partition = self.partition_named(&table, o.partition.as_deref())?;
        if o.bucket >= table.descriptor.bucket_count {
            return Err(MinkError::invalid(
                "bucket",
                format!("{} has no bucket {}", o.path, o.bucket),
            ));
        }
        Ok(TableBucket::new(table.id, partition, o.bucket))
    }

    /// A writer id from this node's block of the shared allocator (a new block when
    /// it runs out). Kafka producer ids are these too.
    pub(crate) async fn next_writer_id(&self) -> Result<i64> {
        let mut ids = self.writer_ids.lock().await;
        if ids.is_empty() {
            *ids = self.meta.allocate_writer_ids(WRITER_ID_BLOCK).await?;
        }
        let id = ids.start;
        // Writer ids carry a Kafka producer epoch above this (`mink_types::writer`).
        if id > mink_types::WRITER_BASE_MAX {
            return Err(MinkError::LimitExceeded {
                what: "writer ids issued".into(),
                limit: mink_types::WRITER_BASE_MAX as u64,
                actual: id as u64,
            });
        }
        ids.start += 1;
        Ok(id)
    }
}
