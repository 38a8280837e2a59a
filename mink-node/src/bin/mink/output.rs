//! How the CLI prints rows.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::pretty::pretty_format_batches;
use clap::ValueEnum;

use crate::{CliResult, err};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    Csv,
    Arrow,
}

/// `batch` as Arrow's text formatters can show it: they parse time zones and, without
/// the chrono-tz feature, know offsets only, so TIMESTAMP_LTZ columns (zone "UTC")
/// are shown with the equal offset "+00:00".
pub fn displayable(batch: &RecordBatch) -> CliResult<RecordBatch> {
    use arrow::datatypes::{DataType as ArrowType, Field, Schema};
    let utc = |t: &ArrowType| match t {
        ArrowType::Timestamp(unit, Some(tz)) if tz.as_ref() == "UTC" => {
            Some(ArrowType::Timestamp(*unit, Some("+00:00".into())))
        }
        _ => None,
    };
    let schema = batch.schema();
    if !schema.fields().iter().any(|f| utc(f.data_type()).is_some()) {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        match utc(f.data_type()) {
            Some(t) => {
                columns.push(arrow::compute::cast(c, &t).map_err(err)?);
                fields.push(Field::new(f.name(), t, f.is_nullable()));
            }
            None => {
                columns.push(c.clone());
                fields.push(f.as_ref().clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(err)
}

pub fn print_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: OutputFormat,
) -> CliResult<()> {
    let stdout = std::io::stdout();
    let shown = || -> CliResult<Vec<RecordBatch>> { batches.iter().map(displayable).collect() };
    match format {
        OutputFormat::Table => {
            if batches.iter().all(|b| b.num_rows() == 0) {
                println!("(no rows)");
            } else {
                println!("{}", pretty_format_batches(&shown()?).map_err(err)?);
            }
        }
        OutputFormat::Json => {
            let mut writer = arrow::json::LineDelimitedWriter::new(stdout.lock());
            for b in &shown()? {
                writer.write(b).map_err(err)?;
            }
            writer.finish().map_err(err)?;
        }
        OutputFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(stdout.lock());
            for b in &shown()? {
                writer.write(b).map_err(err)?;
            }
        }
        OutputFormat::Arrow => {
            let mut writer =
                arrow::ipc::writer::StreamWriter::try_new(stdout.lock(), schema).map_err(err)?;
            for b in batches {
                writer.write(b).map_err(err)?;
            }
            writer.finish().map_err(err)?;
        }
    }
    Ok(())
}
