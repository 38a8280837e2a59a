//! Reading the files `mink write` takes: CSV, JSON lines, Arrow IPC, Parquet, as
//! batches of the table's schema.

use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use clap::ValueEnum;

use crate::CliResult;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FileFormat {
    Csv,
    Json,
    Arrow,
    Parquet,
}

/// Reads a file as batches of the table's schema (columns by name, cast as needed).
pub fn read_file(
    file: &Path,
    format: Option<FileFormat>,
    schema: &SchemaRef,
    batch_rows: usize,
) -> CliResult<Vec<RecordBatch>> {
    let format = match format {
        Some(f) => f,
        None => match file
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("csv") => FileFormat::Csv,
            Some("json" | "jsonl" | "ndjson") => FileFormat::Json,
            Some("arrow" | "ipc" | "feather" | "arrows") => FileFormat::Arrow,
            Some("parquet") => FileFormat::Parquet,
            _ => {
                return Err(format!(
                    "{}: cannot tell the format; pass --format",
                    file.display()
                ));
            }
        },
    };
    let open = || std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()));
    let bad = |e: &dyn std::fmt::Display| {
        format!(
            "{}: not a valid {format:?} file for this table: {e}",
            file.display()
        )
    };
    let batches: Vec<RecordBatch> = match format {
        FileFormat::Csv => arrow::csv::ReaderBuilder::new(schema.clone())
            .with_header(true)
            .with_batch_size(batch_rows)
            .build(open()?)
            .map_err(|e| bad(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&e))?,
        FileFormat::Json => arrow::json::ReaderBuilder::new(schema.clone())
            .with_batch_size(batch_rows)
            .build(std::io::BufReader::new(open()?))
            .map_err(|e| bad(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&e))?,
        FileFormat::Arrow => match arrow::ipc::reader::FileReader::try_new(open()?, None) {
            Ok(r) => r.collect::<Result<_, _>>().map_err(|e| bad(&e))?,
            Err(_) => arrow::ipc::reader::StreamReader::try_new(open()?, None)
                .map_err(|e| bad(&e))?
                .collect::<Result<_, _>>()
                .map_err(|e| bad(&e))?,
        },
        FileFormat::Parquet => {
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(open()?)
                .map_err(|e| bad(&e))?
                .with_batch_size(batch_rows)
                .build()
                .map_err(|e| bad(&e))?
                .collect::<Result<_, _>>()
                .map_err(|e| bad(&e))?
        }
    };
    // Every format in batches of at most `batch_rows` (an Arrow file's batches are as
    // its writer made them: one of millions of rows would exceed a log batch).
    let rows = batch_rows.max(1);
    batches
        .into_iter()
        .flat_map(|b| {
            (0..b.num_rows().div_ceil(rows))
                .map(move |i| b.slice(i * rows, rows.min(b.num_rows() - i * rows)))
        })
        .map(|b| conform(b, schema).map_err(|e| bad(&e)))
        .collect()
}

/// The batch's columns by name, cast to the table's types (a missing nullable column is null).
fn conform(
    batch: RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.schema().index_of(f.name()) {
            Ok(i) => arrow::compute::cast(batch.column(i), f.data_type()),
            Err(_) if f.is_nullable() => Ok(arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
            Err(_) => Err(arrow::error::ArrowError::SchemaError(format!(
                "the file has no column {:?}",
                f.name()
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}
