//! Writes and reads a log table through the Rust client.
//!
//! ```sh
//! cargo run --release --bin mink-node &        # a node on 127.0.0.1:9120
//! cargo run -p mink-flight --example quickstart  # or MINK_ADDR=host:port
//! ```

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::util::pretty::pretty_format_batches;
use mink_flight::MinkClient;
use mink_types::{Column, DataType, MinkError, Schema, TableDescriptor, TablePath};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("MINK_ADDR").unwrap_or_else(|_| "127.0.0.1:9120".into());
    let client = MinkClient::connect(&addr).await?;
    match client.create_database("demo").await {
        Ok(()) | Err(MinkError::AlreadyExists(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let path = TablePath::parse("demo.events")?;
    let descriptor = TableDescriptor {
        bucket_keys: Some(vec!["id".into()]),
        bucket_count: 2,
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("msg", DataType::String, true),
            ],
        ))
    };
    match client.create_table(&path, &descriptor).await {
        Ok(_) | Err(MinkError::AlreadyExists(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let batch = RecordBatch::try_new(
        descriptor.schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(StringArray::from(vec!["hello", "from", "mink"])),
        ],
    )?;
    // Buckets get leaders right after the table is created; retry briefly if not yet.
    let mut written = None;
    for _ in 0..50 {
        match client.append(&path, &batch).await {
            Ok(w) => {
                written = Some(w);
                break;
            }
            Err(MinkError::Unavailable(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
    for w in written.ok_or("no bucket leader appeared")? {
        println!(
            "{}: offsets {}..={}",
            w.bucket, w.first_offset, w.last_offset
        );
    }
    let rows = client.scan_table(&path).await?;
    println!("{}", pretty_format_batches(&rows)?);
    Ok(())
}
