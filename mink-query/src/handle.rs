//! Statement tickets and prepared-statement handles: stateless, so any mink-query
//! instance serves any of them.
//!
//! `MQ3` · statement id (u64 LE) · applied index (u64 LE) · SQL length (u32 LE) · SQL
//! (UTF-8) · parameters
//! length (u32 LE) · the bound parameters as an Arrow IPC stream of one row (empty
//! when none are bound) · the result schema as an IPC schema message, when the
//! statement was prepared without parameters (empty otherwise): GetFlightInfo of such
//! a handle answers it without planning again.

use std::io::Cursor;

use bytes::{BufMut, Bytes, BytesMut};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use tonic::Status;

use crate::engine::arrow::ipc::reader::StreamReader;
use crate::engine::arrow::ipc::writer::StreamWriter;
use crate::errors::QueryError;

const MAGIC: &[u8; 3] = b"MQ3";
/// Handles of the format before statement ids (read as id 0).
const MAGIC_V2: &[u8; 3] = b"MQ2";

/// A statement id no other statement of this process has, and unlikely in another
/// (a per-process random start): the key of a plan kept for the statement's DoGet,
/// so that two clients' identical statements are two handles.
pub fn next_statement_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}
/// The longest statement served (bytes of SQL).
pub const SQL_BYTES_MAX: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct Handle {
    /// Drawn when the statement was issued ([`next_statement_id`]).
    pub id: u64,
    pub sql: String,
    /// One row of parameter values, as Arrow IPC.
    pub params: Option<Bytes>,
    /// The metadata index the planner had seen: a DoGet elsewhere waits for it.
    pub applied_index: u64,
    /// The result schema as planned at preparation (IPC), while no parameter is bound.
    pub schema: Option<Bytes>,
}

impl Handle {
    pub fn encode(&self) -> Bytes {
        let params = self.params.as_deref().unwrap_or_default();
        let schema = self.schema.as_deref().unwrap_or_default();
        let mut b = BytesMut::with_capacity(27 + self.sql.len() + params.len() + schema.len());
        b.put_slice(MAGIC);
        b.put_u64_le(self.id);
        b.put_u64_le(self.applied_index);
        b.put_u32_le(self.sql.len() as u32);
        b.put_slice(self.sql.as_bytes());
        b.put_u32_le(params.len() as u32);
        b.put_slice(params);
        b.put_slice(schema);
        b.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, Status> {
        let bad = |why: &str| {
            Status::invalid_argument(format!("not a statement handle mink-query issued ({why})"))
        };
        let (id, rest) = if let Some(rest) = bytes.strip_prefix(MAGIC) {
            if rest.len() < 8 {
                return Err(bad("cut short"));
            }
            let id = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
            (id, &rest[8..])
        } else if let Some(rest) = bytes.strip_prefix(MAGIC_V2) {
            (0, rest)
        } else {
            return Err(bad("no MQ3 prefix"));
        };
        if rest.len() < 12 {
            return Err(bad("cut short"));
        }
        let applied_index = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes")) as usize;
        if len > SQL_BYTES_MAX || rest.len() < 12 + len {
            return Err(bad("a statement longer than the handle"));
        }
        let sql = std::str::from_utf8(&rest[12..12 + len])
            .map_err(|_| bad("the statement is not UTF-8"))?
            .to_string();
        let rest = &rest[12 + len..];
        if rest.len() < 4 {
            return Err(bad("cut short"));
        }
        let params_len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if rest.len() < 4 + params_len {
            return Err(bad("parameters longer than the handle"));
        }
        let params = &rest[4..4 + params_len];
        let schema = &rest[4 + params_len..];
        let some = |b: &[u8]| (!b.is_empty()).then(|| Bytes::copy_from_slice(b));
        Ok(Self {
            id,
            sql,
            params: some(params),
            applied_index,
            schema: some(schema),
        })
    }

    /// The handle with `batches` (one row in all) bound as its parameters.
    pub fn bind(self, batches: &[RecordBatch]) -> Result<Self, Status> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows != 1 {
            return Err(Status::invalid_argument(format!(
                "bind exactly one row of parameters (got {rows}); run the statement once per row"
            )));
        }
        let batch = batches
            .iter()
            .find(|b| b.num_rows() == 1)
            .expect("one batch holds the row");
        let mut out = Vec::new();
        {
            let mut w = StreamWriter::try_new(&mut out, &batch.schema())
                .map_err(|e| Status::invalid_argument(format!("the parameters: {e}")))?;
            w.write(batch)
                .and_then(|_| w.finish())
                .map_err(|e| Status::invalid_argument(format!("the parameters: {e}")))?;
        }
        // Bound values may type what the preparation could not (`SELECT $1`): the
        // schema is planned again.
        Ok(Self {
            params: Some(Bytes::from(out)),
            schema: None,
            ..self
        })
    }

    /// The bound values, in parameter order (`$1`, `$2`, ...).
    pub fn parameters(&self) -> Result<Option<Vec<ScalarValue>>, QueryError> {
        let Some(bytes) = &self.params else {
            return Ok(None);
        };
        let bad = |e: String| QueryError::InvalidArgument(format!("the bound parameters: {e}"));
        let reader = StreamReader::try_new(Cursor::new(bytes.to_vec()), None)
            .map_err(|e| bad(e.to_string()))?;
        for batch in reader {
            let batch = batch.map_err(|e| bad(e.to_string()))?;
            if batch.num_rows() == 1 {
                return Ok(Some(crate::flightsql::row_values(&batch)?));
            }
        }
        Err(bad("no row".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn a_handle_round_trips_with_and_without_parameters() {
        let h = Handle {
            id: next_statement_id(),
            sql: "SELECT * FROM db.t WHERE id = $1".into(),
            params: None,
            applied_index: 42,
            schema: Some(Bytes::from_static(b"schema bytes")),
        };
        assert_eq!(Handle::decode(&h.encode()).unwrap(), h);
        let schema = Arc::new(Schema::new(vec![
            Field::new("$1", DataType::Int64, true),
            Field::new("$2", DataType::Utf8, true),
        ]));
        let row = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![7])),
                Arc::new(StringArray::from(vec!["x"])),
            ],
        )
        .unwrap();
        let bound = h.clone().bind(&[row]).unwrap();
        let back = Handle::decode(&bound.encode()).unwrap();
        assert_eq!(back.sql, h.sql);
        assert_eq!(back.schema, None, "binding drops the prepared schema");
        assert_eq!(
            back.parameters().unwrap().unwrap(),
            vec![
                ScalarValue::Int64(Some(7)),
                ScalarValue::Utf8(Some("x".into()))
            ]
        );
    }

    #[test]
    fn identical_statements_get_distinct_handles_and_old_handles_still_read() {
        let h = |id| Handle {
            id,
            sql: "SELECT 1".into(),
            params: None,
            applied_index: 7,
            schema: None,
        };
        let (a, b) = (h(next_statement_id()), h(next_statement_id()));
        assert_ne!(a.encode(), b.encode(), "two clients' identical statements");
        // A handle of the format before ids: MQ2 without the id.
        let mut old = b"MQ2".to_vec();
        old.extend_from_slice(&a.encode()[11..]);
        assert_eq!(Handle::decode(&old).unwrap(), h(0));
    }

    #[test]
    fn garbage_and_cut_handles_are_invalid_arguments() {
        for bytes in [
            &b""[..],
            b"XYZ",
            b"MQ1\x01",
            b"MQ3\x01",
            b"MQ2\0\0\0\0\0\0\0\0\xff\0\0\0abc",
        ] {
            let e = Handle::decode(bytes).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bytes:?}");
        }
    }

    #[test]
    fn binding_needs_exactly_one_row() {
        let h = Handle {
            id: 0,
            sql: "SELECT $1".into(),
            params: None,
            applied_index: 0,
            schema: None,
        };
        let e = h.bind(&[]).unwrap_err();
        assert!(e.message().contains("exactly one row"), "{e}");
    }
}
