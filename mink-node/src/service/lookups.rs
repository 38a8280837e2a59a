//! Lookups by primary key and by bucket-key prefix, forwarded to the leader of each
//! bucket this node does not lead.

use super::*;

/// Keys (and prefix-lookup rows) in one lookup, at most.
pub(crate) const LOOKUP_KEYS_MAX: usize = 10_000;

pub(crate) use mink_flight::actions::{Lookup as LookupBody, PrefixLookup as PrefixLookupBody};

impl NodeService {
    /// Rows by primary key, answered as an Arrow IPC stream of the found rows (grouped
    /// by bucket, missing keys skipped). Every key's bucket must be led here.
    pub(crate) async fn lookup(&self, body: LookupBody) -> Result<Vec<u8>> {
        let table = self.table(&body.path).await?;
        let d = &table.descriptor;
        if !d.has_primary_key() {
            return Err(MinkError::invalid(
                "path",
                format!("{} has no primary key", body.path),
            ));
        }
        if body.keys.len() > LOOKUP_KEYS_MAX {
            return Err(MinkError::LimitExceeded {
                what: "keys in one lookup".into(),
                limit: LOOKUP_KEYS_MAX as u64,
                actual: body.keys.len() as u64,
            });
        }
        let pk_types: Vec<mink_types::DataType> = d
            .primary_key
            .iter()
            .map(|k| {
                d.schema
                    .column(k)
                    .map(|c| c.data_type)
                    .ok_or_else(|| MinkError::Internal(format!("no column {k}")))
            })
            .collect::<Result<_>>()?;
        let mut values = Vec::with_capacity(body.keys.len());
        for (i, key) in body.keys.iter().enumerate() {
            if key.len() != pk_types.len() {
                return Err(MinkError::invalid(
                    format!("keys[{i}]"),
                    format!("{} values for {} key columns", key.len(), pk_types.len()),
                ));
            }
            values.push(json_key_values(&pk_types, key, &format!("keys[{i}]"))?);
        }
        let fields: Vec<arrow::datatypes::Field> = d
            .primary_key
            .iter()
            .zip(&pk_types)
            .map(|(n, t)| arrow::datatypes::Field::new(n, t.to_arrow(), false))
            .collect();
        let key_schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let columns = (0..pk_types.len())
            .map(|c| {
                mink_types::key::key_values_to_array(
                    pk_types[c],
                    &values.iter().map(|k| &k[c]).collect::<Vec<_>>(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let keys = RecordBatch::try_new_with_options(
            key_schema,
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(values.len())),
        )?;
        let schema = d.schema.to_arrow();
        let mut found = Vec::new();
        // Partition (existing ones only), then bucket; each bucket asked where it is led.
        for (bucket, rows) in self.route(&table, &keys, false).await? {
            let (rows, keys, body) = (&rows, &keys, &body);
            let batches = self
                .at_leader(
                    bucket,
                    body.forwarded,
                    |tablet| async move {
                        let rows =
                            arrow::array::UInt32Array::from_iter_values(rows.iter().copied());
                        let sub = take_record_batch(keys, &rows)?;
                        Ok(vec![kv_of(bucket, tablet)?.lookup(&sub)?.batch])
                    },
                    // Built only when the bucket is led elsewhere.
                    |addr| async move {
                        let forward = LookupBody {
                            path: body.path.clone(),
                            keys: rows
                                .iter()
                                .map(|r| body.keys[*r as usize].clone())
                                .collect(),
                            forwarded: true,
                        };
                        self.forwarded_rows(&addr, &forward).await
                    },
                )
                .await?;
            found.extend(batches);
        }
        ipc_stream(&schema, &found)
    }

    /// Rows whose primary key starts with the given bucket-key values (the bucket key
    /// must lead the primary key), as an Arrow IPC stream, at most `limit` rows.
    pub(crate) async fn prefix_lookup(&self, body: PrefixLookupBody) -> Result<Vec<u8>> {
        let table = self.table(&body.path).await?;
        let d = &table.descriptor;
        if !d.has_primary_key() {
            return Err(MinkError::invalid(
                "path",
                format!("{} has no primary key", body.path),
            ));
        }
        // The prefix is the leading primary-key columns that pick the partition and the
        // bucket; the rows found share them and differ in the columns after.
        let mut leading: Vec<String> = d.partition_keys.clone();
        leading.extend(d.bucket_keys());
        let k = leading.len();
        let mut head: Vec<&String> = d.primary_key.iter().take(k).collect();
        head.sort();
        let mut wanted: Vec<&String> = leading.iter().collect();
        wanted.sort();
        if d.primary_key.len() <= k || head != wanted {
            return Err(MinkError::invalid(
                "path",
                format!(
                    "{}: prefix lookups need the partition and bucket keys ({}) to lead a longer primary key ({})",
                    body.path,
                    leading.join(", "),
                    d.primary_key.join(", ")
                ),
            ));
        }
        let columns = &d.primary_key[..k];
        if body.prefix.len() != k {
            return Err(MinkError::invalid(
                "prefix",
                format!(
                    "{} values for {k} leading primary-key columns ({}: the partition and bucket-key columns)",
                    body.prefix.len(),
                    columns.join(", ")
                ),
            ));
        }
        let types: Vec<mink_types::DataType> = columns
            .iter()
            .map(|k| {
                d.schema
                    .column(k)
                    .map(|c| c.data_type)
                    .ok_or_else(|| MinkError::Internal(format!("no column {k}")))
            })
            .collect::<Result<_>>()?;
        let values = json_key_values(&types, &body.prefix, "prefix")?;
        let mut encoded = Vec::new();
        encode_values(&types, &values, &mut encoded)?;
        let prefix_row = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(
                columns
                    .iter()
                    .zip(&types)
                    .map(|(n, t)| arrow::datatypes::Field::new(n, t.to_arrow(), false))
                    .collect::<Vec<_>>(),
            )),
            values
                .iter()
                .zip(&types)
                .map(|(v, t)| mink_types::key::key_values_to_array(*t, &[v]))
                .collect::<Result<Vec<_>>>()?,
        )?;
        let schema = d.schema.to_arrow();
        let mut found = Vec::new();
        // One bucket (none when the partition does not exist), asked where it is led.
        if let Some((bucket, _)) = self.route(&table, &prefix_row, false).await?.pop() {
            let body = &body;
            let batches = self
                .at_leader(
                    bucket,
                    body.forwarded,
                    |tablet| async {
                        let limit = body.limit.unwrap_or(LOOKUP_KEYS_MAX).min(LOOKUP_KEYS_MAX);
                        Ok(vec![kv_of(bucket, tablet)?.prefix_lookup(&encoded, limit)?])
                    },
                    |addr| async move {
                        let forward = PrefixLookupBody {
                            forwarded: true,
                            ..body.clone()
                        };
                        self.forwarded_rows(&addr, &forward).await
                    },
                )
                .await?;
            found.extend(batches);
        }
        ipc_stream(&schema, &found)
    }

    /// The rows another node's lookup action answers (an Arrow IPC stream).
    pub(crate) async fn forwarded_rows<R>(
        &self,
        addr: &str,
        request: &R,
    ) -> Result<Vec<RecordBatch>>
    where
        R: mink_flight::actions::ActionRequest<Answer = mink_flight::actions::IpcAnswer>,
    {
        let ipc = self.forwarder.call(addr, request).await?.0;
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)?;
        reader.map(|b| Ok(b?)).collect()
    }
}

/// Key values typed by person or program as JSON (`1`, `"ann"`), as `types`.
fn json_key_values(
    types: &[mink_types::DataType],
    json: &[serde_json::Value],
    field: &str,
) -> Result<Vec<KeyValue>> {
    json.iter()
        .zip(types)
        .map(|(v, ty)| match v {
            serde_json::Value::String(s) => KeyValue::parse(*ty, s),
            serde_json::Value::Null => {
                Err(MinkError::invalid(field, "key values must not be null"))
            }
            other => KeyValue::parse(*ty, &other.to_string()),
        })
        .collect()
}

/// `batches` as one Arrow IPC stream of `schema`.
fn ipc_stream(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut out, schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    drop(writer);
    Ok(out)
}
