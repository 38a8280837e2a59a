//! Rows for the console's data page: the newest rows of a table or bucket (a bounded
//! scan from `high watermark - limit`), a live tail (a long poll over several buckets
//! at once, answered as soon as any has rows), and a primary-key lookup. Reads go
//! through this node's own Flight API with the Rust client, so a bucket led elsewhere
//! is read at its leader exactly as a client would read it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use axum::extract::{Path, Query, State};
use futures::StreamExt;
use mink_flight::MinkClient;
use mink_types::{MinkError, TableBucket, TablePath};
use serde_json::{Map, Value, json};

use super::{ApiError, ApiResult, service, table_path};
use crate::admin::AdminState;

/// Rows one `rows` answer holds at most.
pub const ROWS_MAX: usize = 1_000;
const ROWS_DEFAULT: usize = 50;
/// A tail waits this long for rows by default, and at most [`TAIL_WAIT_MAX`].
const TAIL_WAIT_DEFAULT: Duration = Duration::from_secs(10);
const TAIL_WAIT_MAX: Duration = Duration::from_secs(30);
/// Buckets one tail follows at most.
pub const TAIL_BUCKETS_MAX: usize = 256;
/// A lookup key's JSON, at most.
const KEY_BYTES_MAX: usize = 64 * 1024;

type Params = Query<HashMap<String, String>>;

/// The console's Flight client, to this node (made on first use).
async fn client(state: &AdminState) -> Result<&MinkClient, ApiError> {
    let service = service(state)?;
    state
        .client
        .get_or_try_init(|| async {
            let addr = service
                .own_flight_addr()
                .ok_or_else(|| MinkError::Unavailable("this node is not registered yet".into()))?;
            MinkClient::connect(&addr).await
        })
        .await
        .map_err(ApiError::from)
}

fn number<T: std::str::FromStr>(params: &Params, name: &str) -> Result<Option<T>, ApiError> {
    params
        .get(name)
        .map(|v| {
            v.parse()
                .map_err(|_| ApiError::bad_request(format!("{name}={v:?} is not a number")))
        })
        .transpose()
}

/// `GET /api/v1/tables/{db}/{table}/rows?limit=&bucket=&partition=`: the newest rows
/// of each bucket chosen, newest first, at most `limit` in all.
pub async fn rows(
    State(state): State<Arc<AdminState>>,
    Path((db, table)): Path<(String, String)>,
    params: Params,
) -> ApiResult {
    let path = table_path(&db, &table)?;
    let limit = number::<usize>(&params, "limit")?.unwrap_or(ROWS_DEFAULT);
    if limit == 0 || limit > ROWS_MAX {
        return Err(ApiError::bad_request(format!(
            "limit={limit}: between 1 and {ROWS_MAX}"
        )));
    }
    let only_bucket = number::<u32>(&params, "bucket")?;
    let only_partition = params.get("partition");
    let (info, buckets) = service(&state)?.bucket_offsets(&path).await?;
    if let Some(b) = only_bucket.filter(|b| *b >= info.descriptor.bucket_count) {
        return Err(ApiError::bad_request(format!(
            "{path} has {} buckets: no bucket {b}",
            info.descriptor.bucket_count
        )));
    }
    if let Some(p) = only_partition.filter(|p| !info.partitions.contains_key(*p)) {
        return Err(ApiError::not_found(format!("partition {p} of {path}")));
    }
    let client = client(&state).await?;
    let mut rows = Vec::new();
    let mut watermarks = Vec::new();
    for b in buckets {
        if only_bucket.is_some_and(|x| x != b.bucket.bucket)
            || only_partition.is_some_and(|p| b.partition.as_ref() != Some(p))
        {
            continue;
        }
        let Some(stat) = b.stat else {
            watermarks.push(json!({"bucket": b.bucket.bucket, "partition": b.partition, "high_watermark": null}));
            continue;
        };
        watermarks.push(json!({"bucket": b.bucket.bucket, "partition": b.partition, "high_watermark": stat.high_watermark, "log_start": stat.log_start}));
        let from = (stat.high_watermark - limit as i64).max(stat.log_start);
        if from >= stat.high_watermark {
            continue;
        }
        let read = client.scan(&path, b.bucket, from).await?;
        let mut taken = 0;
        for (batch, meta) in read {
            let mut batch_rows = rows_json(&batch)?;
            batch_rows.truncate(limit - taken);
            taken += batch_rows.len();
            for (i, mut row) in batch_rows.into_iter().enumerate() {
                decorate(
                    &mut row,
                    b.bucket,
                    b.partition.as_deref(),
                    meta.base_offset + i as i64,
                );
                if let Some(ct) = meta.change_types.as_ref().and_then(|c| c.get(i)) {
                    row.insert("_change_type".into(), json!(ct.to_string()));
                }
                row.insert("_commit_timestamp".into(), json!(meta.commit_timestamp));
                rows.push(Value::Object(row));
            }
            if taken >= limit {
                break;
            }
        }
    }
    // Newest first across buckets.
    rows.sort_by(|a, b| {
        let key = |r: &Value| (r["_commit_timestamp"].as_i64(), r["_offset"].as_i64());
        key(b).cmp(&key(a))
    });
    rows.truncate(limit);
    Ok(axum::Json(json!({
        "columns": info.descriptor.schema.columns.iter().map(|c| &c.name).collect::<Vec<_>>(),
        "rows": rows,
        "buckets": watermarks,
    })))
}

/// `GET /api/v1/tables/{db}/{table}/tail?from=B@O,...&partition=&wait_ms=`: waits until
/// any of the buckets has rows at or past its offset (or `wait_ms` passes), and answers
/// those rows and every bucket's next offset.
pub async fn tail(
    State(state): State<Arc<AdminState>>,
    Path((db, table)): Path<(String, String)>,
    params: Params,
) -> ApiResult {
    let path = table_path(&db, &table)?;
    let wait = number::<u64>(&params, "wait_ms")?
        .map(Duration::from_millis)
        .unwrap_or(TAIL_WAIT_DEFAULT);
    if wait > TAIL_WAIT_MAX {
        return Err(ApiError::bad_request(format!(
            "wait_ms: at most {}",
            TAIL_WAIT_MAX.as_millis()
        )));
    }
    let cursors = parse_cursors(params.get("from").map(String::as_str).unwrap_or(""))?;
    let info = service(&state)?.table(&path).await?;
    if let Some(b) = cursors.keys().find(|b| **b >= info.descriptor.bucket_count) {
        return Err(ApiError::bad_request(format!(
            "{path} has {} buckets: no bucket {b}",
            info.descriptor.bucket_count
        )));
    }
    let partition = match (params.get("partition"), info.descriptor.is_partitioned()) {
        (None, false) => None,
        (Some(p), true) => Some(
            info.partitions
                .get(p)
                .ok_or_else(|| ApiError::not_found(format!("partition {p} of {path}")))?
                .id,
        ),
        (None, true) => {
            return Err(ApiError::bad_request(format!(
                "{path} is partitioned: name the partition"
            )));
        }
        (Some(_), false) => {
            return Err(ApiError::bad_request(format!("{path} is not partitioned")));
        }
    };
    let client = client(&state).await?;
    let mut polls: futures::stream::FuturesUnordered<_> = cursors
        .iter()
        .map(|(bucket, offset)| {
            let tb = TableBucket::new(info.id, partition, *bucket);
            let path = &path;
            async move {
                let answer = client.poll_with_offsets(path, tb, *offset, wait).await;
                (tb, answer)
            }
        })
        .collect();
    let mut next: BTreeMap<String, i64> =
        cursors.iter().map(|(b, o)| (b.to_string(), *o)).collect();
    let mut rows = Vec::new();
    while let Some((tb, answer)) = polls.next().await {
        let (batches, next_offset) = answer?;
        next.insert(tb.bucket.to_string(), next_offset);
        for (base_offset, batch) in &batches {
            // Row by row from the batch's own first offset: offsets skip between
            // batches past sequence markers.
            for (at, mut row) in (*base_offset..).zip(rows_json(batch)?) {
                decorate(
                    &mut row,
                    tb,
                    params.get("partition").map(String::as_str),
                    at,
                );
                rows.push(Value::Object(row));
            }
        }
        if !rows.is_empty() {
            // The first bucket with rows answers; the others' polls are dropped.
            break;
        }
    }
    Ok(axum::Json(json!({ "rows": rows, "next": next })))
}

/// `B@O,B@O`: bucket → offset to read from.
fn parse_cursors(from: &str) -> Result<BTreeMap<u32, i64>, ApiError> {
    let mut out = BTreeMap::new();
    for part in from.split(',').filter(|p| !p.is_empty()) {
        let parsed = part
            .split_once('@')
            .and_then(|(b, o)| Some((b.parse::<u32>().ok()?, o.parse::<i64>().ok()?)))
            .filter(|(_, o)| *o >= 0);
        let (b, o) = parsed.ok_or_else(|| {
            ApiError::bad_request(format!(
                "from: {part:?} is not BUCKET@OFFSET (e.g. from=0@120,1@98)"
            ))
        })?;
        out.insert(b, o);
    }
    if out.is_empty() {
        return Err(ApiError::bad_request(
            "from: name at least one BUCKET@OFFSET (e.g. from=0@120)",
        ));
    }
    if out.len() > TAIL_BUCKETS_MAX {
        return Err(MinkError::LimitExceeded {
            what: "buckets in one tail".into(),
            limit: TAIL_BUCKETS_MAX as u64,
            actual: out.len() as u64,
        }
        .into());
    }
    Ok(out)
}

/// `GET /api/v1/tables/{db}/{table}/lookup?key=JSON`: the row of one primary key
/// (a JSON array of the key's values in key order; a scalar for a one-column key).
pub async fn lookup(
    State(state): State<Arc<AdminState>>,
    Path((db, table)): Path<(String, String)>,
    params: Params,
) -> ApiResult {
    let path: TablePath = table_path(&db, &table)?;
    let key = params
        .get("key")
        .ok_or_else(|| ApiError::bad_request("key: the primary key's values, as JSON"))?;
    if key.len() > KEY_BYTES_MAX {
        return Err(MinkError::LimitExceeded {
            what: "key bytes".into(),
            limit: KEY_BYTES_MAX as u64,
            actual: key.len() as u64,
        }
        .into());
    }
    let key: Value = serde_json::from_str(key)
        .map_err(|e| ApiError::bad_request(format!("key is not JSON: {e}")))?;
    let values = match key {
        Value::Array(values) => values,
        scalar => vec![scalar],
    };
    let batches = client(&state).await?.lookup(&path, vec![values]).await?;
    let mut rows = Vec::new();
    for batch in &batches {
        rows.extend(rows_json(batch)?.into_iter().map(Value::Object));
    }
    Ok(axum::Json(
        json!({ "found": !rows.is_empty(), "rows": rows }),
    ))
}

/// A batch's rows as JSON objects, nulls included.
fn rows_json(batch: &RecordBatch) -> Result<Vec<Map<String, Value>>, ApiError> {
    if batch.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let mut writer = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::JsonArray>(Vec::new());
    writer
        .write(batch)
        .and_then(|_| writer.finish())
        .map_err(|e| MinkError::Internal(format!("rows as JSON: {e}")))?;
    serde_json::from_slice(&writer.into_inner())
        .map_err(|e| MinkError::Internal(format!("rows as JSON: {e}")).into())
}

fn decorate(
    row: &mut Map<String, Value>,
    bucket: TableBucket,
    partition: Option<&str>,
    offset: i64,
) {
    row.insert("_bucket".into(), json!(bucket.bucket));
    if let Some(p) = partition {
        row.insert("_partition".into(), json!(p));
    }
    row.insert("_offset".into(), json!(offset));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_cursors_parse_and_bad_ones_are_refused() {
        let c = parse_cursors("0@120,3@0").unwrap_or_else(|_| panic!("parses"));
        assert_eq!(c.into_iter().collect::<Vec<_>>(), vec![(0, 120), (3, 0)]);
        for bad in ["", "0", "x@1", "0@-1", "0@1,,z"] {
            assert!(parse_cursors(bad).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..=TAIL_BUCKETS_MAX).map(|b| format!("{b}@0")).collect();
        assert!(parse_cursors(&many.join(",")).is_err());
    }
}
