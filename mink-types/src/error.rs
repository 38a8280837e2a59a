//! The one error type every Mink crate above `mink-wal` speaks.
//!
//! Each variant maps to one protocol code (gRPC status, Kafka error code), so the
//! variant is chosen for what the *client* should do, and the fields carry the
//! context an operator needs (table, bucket, offset).

use serde::{Deserialize, Serialize};

use crate::TableBucket;

/// A `Result` with [`MinkError`].
pub type Result<T, E = MinkError> = std::result::Result<T, E>;

/// Every error a Mink request can end in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MinkError {
    /// This node does not lead `bucket`. `leader` is the leader's advertised address
    /// when the node's metadata view knows one; the client retries there.
    #[error("not the leader of {bucket}; {}", match leader {
        Some(addr) => format!("the leader is {addr}"),
        None => "no leader is known yet".to_string(),
    })]
    NotLeader {
        bucket: TableBucket,
        leader: Option<String>,
    },
    /// The target exists but cannot serve right now (a bucket being opened, the
    /// object store unreachable). Retry later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A request or a definition is invalid. `field` names what is wrong
    /// (`primary_key[1]`, `bucket_count`, `request body`).
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// The named database, table, partition, bucket, writer or group does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The named object exists already.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// Rows do not match the schema they claim (wrong schema id, columns, types).
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// A writer's batch sequence does not follow its window: a gap or a rewind.
    #[error(
        "out-of-order sequence from writer {writer_id} on {bucket}: got {first_sequence}, expected {expected}"
    )]
    OutOfOrderSequence {
        bucket: TableBucket,
        writer_id: i64,
        first_sequence: i64,
        expected: i64,
    },
    /// A batch from a writer the bucket has no window for (new, or forgotten: its
    /// batches trimmed away or its window evicted) that does not start at sequence 0,
    /// where the caller asked for a strict start (Kafka producers): an earlier batch
    /// may still be in flight, and accepting this one would let it overtake. The
    /// writer starts over under a new id.
    #[error(
        "writer {writer_id} is unknown to {bucket} and its batch starts at sequence {first_sequence}, not 0"
    )]
    UnknownWriter {
        bucket: TableBucket,
        writer_id: i64,
        first_sequence: i64,
    },
    /// A batch of a writer epoch older than one the bucket has seen for the same base
    /// id (a Kafka producer that bumped its epoch): a zombie's late batch, refused.
    #[error(
        "writer {writer_id} is fenced on {bucket}: epoch {epoch} of its producer id is older than epoch {newer}"
    )]
    WriterFenced {
        bucket: TableBucket,
        writer_id: i64,
        epoch: i64,
        newer: i64,
    },
    /// A read below the log start or above the high watermark.
    #[error(
        "offset {offset} is out of range for {bucket}: the log holds [{log_start}, {high_watermark})"
    )]
    OffsetOutOfRange {
        bucket: TableBucket,
        offset: i64,
        log_start: i64,
        high_watermark: i64,
    },
    /// Another owner took over (a newer epoch or a fenced WAL); this one must stop.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The object store failed or timed out; nothing was acknowledged.
    #[error("storage failure: {0}")]
    StorageFailure(String),
    /// A configured limit was exceeded.
    #[error("limit exceeded: {what} is {actual}, the limit is {limit}")]
    LimitExceeded {
        what: String,
        limit: u64,
        actual: u64,
    },
    /// A capability that is part of the protocol but not built yet.
    #[error("not implemented: {0}")]
    Unimplemented(String),
    /// A bug or a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),
}

impl MinkError {
    /// Shorthand for [`MinkError::InvalidArgument`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A stable, machine-readable name of the variant (`not_leader`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotLeader { .. } => "not_leader",
            Self::Unavailable(_) => "unavailable",
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::NotFound(_) => "not_found",
            Self::AlreadyExists(_) => "already_exists",
            Self::SchemaMismatch(_) => "schema_mismatch",
            Self::OutOfOrderSequence { .. } => "out_of_order_sequence",
            Self::UnknownWriter { .. } => "unknown_writer",
            Self::WriterFenced { .. } => "writer_fenced",
            Self::OffsetOutOfRange { .. } => "offset_out_of_range",
            Self::Fenced(_) => "fenced",
            Self::StorageFailure(_) => "storage_failure",
            Self::LimitExceeded { .. } => "limit_exceeded",
            Self::Unimplemented(_) => "unimplemented",
            Self::Internal(_) => "internal",
        }
    }

    /// Whether a client may retry the same request (with the same sequence) later. It
    /// speaks for writes with a writer id, whose retries the leader deduplicates; a
    /// write without one (a table write) that failed with `StorageFailure` may have
    /// landed, and sending it again may write its rows twice.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Self::NotLeader { .. }
                | Self::Unavailable(_)
                | Self::StorageFailure(_)
                | Self::Fenced(_)
        )
    }
}

impl From<arrow::error::ArrowError> for MinkError {
    fn from(err: arrow::error::ArrowError) -> Self {
        Self::invalid("arrow data", err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_context() {
        let bucket = TableBucket::new(7, Some(3), 2);
        let err = MinkError::NotLeader {
            bucket,
            leader: Some("10.0.0.2:9120".into()),
        };
        assert_eq!(
            err.to_string(),
            "not the leader of table 7 partition 3 bucket 2; the leader is 10.0.0.2:9120"
        );
        let err = MinkError::OffsetOutOfRange {
            bucket: TableBucket::new(1, None, 0),
            offset: 5,
            log_start: 10,
            high_watermark: 20,
        };
        assert_eq!(
            err.to_string(),
            "offset 5 is out of range for table 1 bucket 0: the log holds [10, 20)"
        );
        assert_eq!(
            MinkError::invalid("bucket_count", "must be at least 1").to_string(),
            "invalid bucket_count: must be at least 1"
        );
    }

    #[test]
    fn errors_round_trip_through_json() {
        let errors = vec![
            MinkError::NotLeader {
                bucket: TableBucket::new(1, None, 4),
                leader: None,
            },
            MinkError::OutOfOrderSequence {
                bucket: TableBucket::new(1, None, 4),
                writer_id: 9,
                first_sequence: 12,
                expected: 10,
            },
            MinkError::UnknownWriter {
                bucket: TableBucket::new(1, None, 4),
                writer_id: 9,
                first_sequence: 3,
            },
            MinkError::LimitExceeded {
                what: "request bytes".into(),
                limit: 10,
                actual: 11,
            },
            MinkError::invalid("schema_id", "unknown"),
        ];
        for err in errors {
            let json = serde_json::to_string(&err).unwrap();
            let back: MinkError = serde_json::from_str(&json).unwrap();
            assert_eq!(back, err);
        }
        let json = serde_json::to_value(MinkError::NotFound("table db.t".into())).unwrap();
        assert_eq!(json, serde_json::json!({"not_found": "table db.t"}));
    }
}
