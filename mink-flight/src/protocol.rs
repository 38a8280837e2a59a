//! The JSON messages of Mink's Flight protocol (docs/protocol.md): descriptors,
//! per-batch metadata, tickets, results and the redirect. Serde externally tagged
//! enums with snake_case fields: `{"AppendTable": {"path": "db.t", "schema_id": 1}}`.

use mink_types::{BucketId, ChangeType, MinkError, Result, SchemaId, TableBucket, TablePath};
use serde::{Deserialize, Serialize};

use crate::filter::Filter;

/// The most bytes a JSON body (descriptor, ticket, action) may have.
pub const JSON_BYTES_MAX: usize = 1 << 20;

/// What a DoPut stream writes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum WriteDescriptor {
    /// A log table's bucket, on its leader.
    Append {
        bucket: TableBucket,
        schema_id: SchemaId,
        #[serde(default)]
        writer_id: Option<i64>,
    },
    /// A primary-key table's bucket, on its leader.
    Put {
        bucket: TableBucket,
        schema_id: SchemaId,
        #[serde(default)]
        writer_id: Option<i64>,
        #[serde(default)]
        target_columns: Option<Vec<String>>,
    },
    /// A log table, routed by the receiving node.
    AppendTable {
        path: TablePath,
        schema_id: SchemaId,
    },
    /// A primary-key table, routed by the receiving node.
    PutTable {
        path: TablePath,
        schema_id: SchemaId,
        #[serde(default)]
        target_columns: Option<Vec<String>>,
    },
}

/// The app metadata of each batch of a DoPut stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteBatch {
    /// The batch's sequence for idempotence (with a writer id).
    #[serde(default)]
    pub batch_sequence: Option<i64>,
    /// Per row, for Put: upsert (`+I`, `+U`) or delete (`-D`, `-U`).
    #[serde(default)]
    pub changes: Option<Vec<ChangeType>>,
}

/// Where one bucket's rows landed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketWritten {
    pub bucket: TableBucket,
    pub first_offset: i64,
    pub last_offset: i64,
    pub duplicated: bool,
}

/// The answer to each DoPut batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteResult {
    Written {
        first_offset: i64,
        last_offset: i64,
        duplicated: bool,
    },
    Routed {
        buckets: Vec<BucketWritten>,
    },
}

/// What a DoGet reads.
///
/// Every read takes an optional `columns`: the table columns to answer, by name, in
/// that order (a projection; none: every column, an empty list: rows without columns,
/// for counting). A name the table lacks is `InvalidArgument`.
///
/// Every read but `LimitScan` takes an optional `filter` ([`Filter`]): only the rows
/// for which it holds are answered, evaluated on the node before the projection (so
/// it may name columns the projection leaves out). A `Scan`'s batches then carry
/// `next_offset`. A `Snapshot` (a primary-key bucket's state, which a reader brings
/// up to date with the changelog) takes filters on primary-key columns only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ReadTicket {
    /// A bucket's log from `offset`: one scan of at most `max_bytes` (capped by
    /// `log.scan_bytes_max`), or, with `end_offset`, every row below `end_offset`, read
    /// in as many scans as that takes and streamed as they are read (the tickets of
    /// GetFlightInfo's endpoints).
    Scan {
        bucket: TableBucket,
        offset: i64,
        #[serde(default)]
        max_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end_offset: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        columns: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    /// The first `limit` rows of a bucket.
    LimitScan {
        bucket: TableBucket,
        limit: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        columns: Option<Vec<String>>,
    },
    /// The latest KV snapshot of a bucket.
    Snapshot {
        bucket: TableBucket,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        columns: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    /// The table's newest lake snapshot and, for each bucket, the log from the offset
    /// the snapshot holds rows below: every row once, no gap. Any node answers. With
    /// `bucket`, that bucket's part alone (its lake files and its log past them), so
    /// that a reader can read the buckets in parallel: each part is whole on its own.
    Union {
        path: TablePath,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bucket: Option<TableBucket>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        columns: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    /// The lake only: snapshot `snapshot_id`, or the newest. Any node answers. With
    /// `bucket`, that bucket's files of the snapshot alone (a reader that fixes the
    /// snapshot id reads the buckets in parallel, every row once).
    Lake {
        path: TablePath,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot_id: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bucket: Option<TableBucket>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        columns: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
}

impl ReadTicket {
    /// The columns the read answers (`None`: all of them).
    pub fn columns(&self) -> Option<&[String]> {
        match self {
            ReadTicket::Scan { columns, .. }
            | ReadTicket::LimitScan { columns, .. }
            | ReadTicket::Snapshot { columns, .. }
            | ReadTicket::Union { columns, .. }
            | ReadTicket::Lake { columns, .. } => columns.as_deref(),
        }
    }

    /// The table columns a read must decode to answer (`None`: all): those it
    /// answers and those its filter reads.
    pub fn read_columns(&self) -> Option<Vec<String>> {
        let mut columns = self.columns()?.to_vec();
        for c in self.filter().map(Filter::columns).unwrap_or_default() {
            if !columns.iter().any(|have| have == c) {
                columns.push(c.to_string());
            }
        }
        Some(columns)
    }

    /// The rows the read answers (`None`: all of them).
    pub fn filter(&self) -> Option<&Filter> {
        match self {
            ReadTicket::Scan { filter, .. }
            | ReadTicket::Snapshot { filter, .. }
            | ReadTicket::Union { filter, .. }
            | ReadTicket::Lake { filter, .. } => filter.as_ref(),
            ReadTicket::LimitScan { .. } => None,
        }
    }

    /// The read answering only the rows `wanted` holds for (`None`: all). A
    /// `LimitScan` takes no filter: it is left as it is.
    pub fn with_filter(mut self, wanted: Option<Filter>) -> Self {
        match &mut self {
            ReadTicket::Scan { filter, .. }
            | ReadTicket::Snapshot { filter, .. }
            | ReadTicket::Union { filter, .. }
            | ReadTicket::Lake { filter, .. } => *filter = wanted,
            ReadTicket::LimitScan { .. } => {}
        }
        self
    }

    /// The read answering only `wanted` (`None`: every column).
    pub fn with_columns(mut self, wanted: Option<Vec<String>>) -> Self {
        match &mut self {
            ReadTicket::Scan { columns, .. }
            | ReadTicket::LimitScan { columns, .. }
            | ReadTicket::Snapshot { columns, .. }
            | ReadTicket::Union { columns, .. }
            | ReadTicket::Lake { columns, .. } => *columns = wanted,
        }
        self
    }
}

/// The descriptor of a DoExchange tail: which bucket to follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ExchangeDescriptor {
    Tail { bucket: TableBucket },
}

/// One long poll of a tail, as the app metadata of a client message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailPoll {
    /// Read from here.
    pub offset: i64,
    /// Wait at most this long for `min_bytes` (capped by `flight.tail_wait_max_ms`).
    #[serde(default)]
    pub max_wait_ms: u64,
    /// Return as soon as this many bytes are readable (at least one batch).
    #[serde(default)]
    pub min_bytes: u64,
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// The message that ends the answer to one poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TailEnd {
    TailEnd {
        next_offset: i64,
        high_watermark: i64,
    },
}

/// The app metadata of each DoGet batch of a scan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanBatch {
    pub bucket: TableBucket,
    pub base_offset: i64,
    pub high_watermark: i64,
    /// Per row, for primary-key tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_types: Option<Vec<ChangeType>>,
    /// The idempotent writer that appended the batch, when it had one (for a Kafka
    /// producer its producer id and epoch, `mink_types::split_writer`). Absent for
    /// rows read from the lake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_id: Option<i64>,
    /// When the leader committed the batch (milliseconds since the epoch, the same
    /// clock `list_offsets` by timestamp searches). Absent for rows read from the lake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_timestamp: Option<i64>,
    /// The offset after the batch's last row as stored, when a ticket's `filter` may
    /// have removed rows (a reader going on from this batch goes on from here, not
    /// from `base_offset` plus the rows it holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<i64>,
}

/// The app metadata of each DoGet batch of a `Snapshot` read: the rows are the
/// bucket's state at `log_offset`, from a KV snapshot written at `written_at_ms` (at
/// most `kv.snapshot_interval_ms` before the read). A `Scan` from `log_offset` brings
/// it up to date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotBatch {
    pub bucket: TableBucket,
    pub log_offset: i64,
    pub written_at_ms: i64,
}

/// The body of a NotLeader status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    pub bucket: TableBucket,
    pub to: Option<String>,
}

/// A bucket number in a routed result.
pub type Bucket = BucketId;

/// Parses a JSON body, naming what it was for in the error.
pub fn parse_json<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    if bytes.len() > JSON_BYTES_MAX {
        return Err(MinkError::LimitExceeded {
            what: format!("{what} bytes"),
            limit: JSON_BYTES_MAX as u64,
            actual: bytes.len() as u64,
        });
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            // Not JSON at all.
            Category::Syntax | Category::Eof | Category::Io => {
                MinkError::invalid(what, format!("malformed JSON: {e}"))
            }
            // Well-formed JSON whose content is wrong (a field, a name, a value): say
            // what is wrong, not that the JSON is.
            Category::Data => MinkError::invalid(what, e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_the_documented_json() {
        let d: WriteDescriptor = parse_json(
            "descriptor",
            br#"{"AppendTable": {"path": "db.t", "schema_id": 1}}"#,
        )
        .unwrap();
        assert_eq!(
            d,
            WriteDescriptor::AppendTable {
                path: TablePath::parse("db.t").unwrap(),
                schema_id: 1
            }
        );
        let t: ReadTicket = parse_json(
            "ticket",
            br#"{"Scan": {"bucket": {"table_id": 1, "partition_id": null, "bucket": 0}, "offset": 0}}"#,
        )
        .unwrap();
        assert!(matches!(
            t,
            ReadTicket::Scan {
                offset: 0,
                max_bytes: None,
                end_offset: None,
                ..
            }
        ));
        let w = serde_json::to_string(&WriteResult::Written {
            first_offset: 0,
            last_offset: 9,
            duplicated: false,
        })
        .unwrap();
        assert_eq!(
            w,
            r#"{"Written":{"first_offset":0,"last_offset":9,"duplicated":false}}"#
        );
        let err = parse_json::<WriteDescriptor>("descriptor", b"{nope").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid descriptor: malformed JSON"),
            "{err}"
        );
        assert!(
            parse_json::<WriteDescriptor>("descriptor", br#"{"Append": {"bucket": 1}}"#).is_err()
        );
        // Well-formed JSON with a bad value: the error says what is wrong with it.
        let err = parse_json::<WriteDescriptor>(
            "descriptor",
            br#"{"AppendTable": {"path": "db.no/pe", "schema_id": 1}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("malformed JSON"), "{err}");
        assert!(err.contains("table name"), "{err}");
        let s = serde_json::to_string(&SnapshotBatch {
            bucket: TableBucket::new(1, None, 0),
            log_offset: 42,
            written_at_ms: 1_700_000_000_000,
        })
        .unwrap();
        assert_eq!(
            s,
            r#"{"bucket":{"table_id":1,"partition_id":null,"bucket":0},"log_offset":42,"written_at_ms":1700000000000}"#
        );
    }
}
