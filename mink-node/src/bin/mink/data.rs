//! `mink write`, `scan`, `tail`, `lookup` and `offsets`: rows in and out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use clap::Args;
use mink_flight::MinkClient;
use mink_flight::actions::{BucketOffset, ListOffsets};
use mink_types::{TableBucket, TablePath};

use crate::catalog::table_meta;
use crate::input::{FileFormat, read_file};
use crate::output::{OutputFormat, displayable, print_batches};
use crate::{CliResult, call, err, path};

#[derive(Debug, Args)]
pub struct WriteArgs {
    table: String,
    #[arg(long)]
    file: PathBuf,
    /// The file's format (default: from its extension).
    #[arg(long, value_enum)]
    format: Option<FileFormat>,
    /// Route rows on this machine (the Rust client) instead of letting the node route.
    #[arg(long)]
    client_routing: bool,
    /// Rows per batch.
    #[arg(long, default_value_t = 8192)]
    batch_rows: usize,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    table: String,
    /// Only this partition.
    #[arg(long)]
    partition: Option<String>,
    /// Only this bucket.
    #[arg(long)]
    bucket: Option<u32>,
    /// Start at this offset (per bucket).
    #[arg(long, default_value_t = 0)]
    from: i64,
    /// At most this many rows.
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long, value_enum, default_value = "table")]
    format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    table: String,
    /// Only this bucket number (default: every bucket; of a partitioned table, every
    /// bucket of every partition, including partitions created while it runs).
    #[arg(long)]
    bucket: Option<u32>,
}

/// Each bucket's offset of `table` (of one partition) by `spec`.
async fn offsets_of(
    client: &MinkClient,
    table: &TablePath,
    spec: &str,
    partition: Option<String>,
    buckets: Option<Vec<u32>>,
) -> CliResult<Vec<BucketOffset>> {
    call(
        client,
        ListOffsets {
            forwarded: false,
            path: table.clone(),
            spec: spec.into(),
            timestamp: None,
            partition,
            buckets,
        },
    )
    .await
}

pub async fn write(client: &MinkClient, args: WriteArgs) -> CliResult<()> {
    let table = path(&args.table)?;
    let (d, _) = table_meta(client, &table).await?;
    let schema = d.schema.to_arrow();
    let batches = read_file(&args.file, args.format, &schema, args.batch_rows.max(1))?;
    let total: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rows {per_sec}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    if total < 100_000 {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut per_bucket: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
    let mut note = |bucket: TableBucket, first: i64, last: i64| {
        let key = format!(
            "bucket {}{}",
            bucket.bucket,
            bucket
                .partition_id
                .map(|p| format!(" of partition {p}"))
                .unwrap_or_default()
        );
        let e = per_bucket.entry(key).or_insert((first, last));
        e.0 = e.0.min(first);
        e.1 = e.1.max(last);
    };
    for batch in &batches {
        let written = if args.client_routing {
            if d.has_primary_key() {
                client.put(&table, batch, None, None).await
            } else {
                client.append(&table, batch).await
            }
            .map_err(err)?
        } else {
            client.write_table(&table, batch, None).await.map_err(err)?
        };
        for w in written {
            note(w.bucket, w.first_offset, w.last_offset);
        }
        bar.inc(batch.num_rows() as u64);
    }
    bar.finish_and_clear();
    println!("wrote {total} rows to {table}");
    for (bucket, (first, last)) in per_bucket {
        println!("  {bucket}: offsets {first}..={last}");
    }
    Ok(())
}

pub async fn scan(client: &MinkClient, args: ScanArgs) -> CliResult<()> {
    let table = path(&args.table)?;
    let (d, meta) = table_meta(client, &table).await?;
    let mut out: Vec<RecordBatch> = Vec::new();
    let mut rows = 0usize;
    for b in &meta.buckets {
        let bucket = b.bucket;
        if args.bucket.is_some_and(|n| n != bucket.bucket) {
            continue;
        }
        if args.partition.is_some() && b.partition != args.partition {
            continue;
        }
        let mut offset = args.from;
        loop {
            if args.limit.is_some_and(|l| rows >= l) {
                break;
            }
            let batches = client.scan(&table, bucket, offset).await.map_err(err)?;
            let Some((last, m)) = batches.last() else {
                break;
            };
            let next = m.base_offset + last.num_rows() as i64;
            let done = next >= m.high_watermark;
            for (batch, _) in batches {
                let take = args
                    .limit
                    .map_or(batch.num_rows(), |l| (l - rows).min(batch.num_rows()));
                rows += take;
                out.push(batch.slice(0, take));
            }
            offset = next;
            if done {
                break;
            }
        }
    }
    print_batches(&d.schema.to_arrow(), &out, args.format)
}

/// Follows each bucket (of every partition, for a partitioned table, including those
/// created meanwhile) from its latest offset until Ctrl-C.
pub async fn tail(client: MinkClient, args: TailArgs) -> CliResult<()> {
    let table = path(&args.table)?;
    let (d, meta) = table_meta(&client, &table).await?;
    let mut buckets = Vec::new();
    for entry in &meta.buckets {
        let bucket = entry.bucket;
        if args.bucket.is_some_and(|n| n != bucket.bucket) {
            continue;
        }
        let latest = offsets_of(
            &client,
            &table,
            "latest",
            entry.partition.clone(),
            Some(vec![bucket.bucket]),
        )
        .await?;
        let offset = latest.first().and_then(|o| o.offset).unwrap_or(0);
        buckets.push((bucket, offset));
    }
    let client = Arc::new(client);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<RecordBatch>(64);
    let follow = |bucket: TableBucket, mut offset: i64| {
        let (client, tx, table) = (client.clone(), tx.clone(), table.clone());
        tokio::spawn(async move {
            loop {
                match client
                    .poll(&table, bucket, offset, Duration::from_secs(20))
                    .await
                {
                    Ok((batches, next)) => {
                        offset = next;
                        for b in batches {
                            if tx.send(b).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("mink: tail of {bucket}: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    };
    let mut followed = std::collections::HashSet::new();
    for (bucket, offset) in buckets {
        followed.insert(bucket);
        follow(bucket, offset);
    }
    // A partitioned table grows partitions: follow each new one from its start.
    let mut refresh = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            batch = rx.recv() => match batch {
                Some(b) => println!("{}", pretty_format_batches(&[displayable(&b)?]).map_err(err)?),
                None => return Ok(()),
            },
            _ = refresh.tick(), if d.is_partitioned() => {
                let Ok((_, meta)) = table_meta(&client, &table).await else {
                    continue;
                };
                for entry in &meta.buckets {
                    if args.bucket.is_none_or(|n| n == entry.bucket.bucket)
                        && followed.insert(entry.bucket)
                    {
                        follow(entry.bucket, 0);
                    }
                }
            }
        }
    }
}

pub async fn lookup(client: &MinkClient, table: &str, keys: &[String]) -> CliResult<()> {
    let table = path(table)?;
    let (d, _) = table_meta(client, &table).await?;
    let mut values = Vec::new();
    for key in &d.primary_key {
        let found = keys
            .iter()
            .find_map(|k| {
                k.split_once('=')
                    .filter(|(n, _)| n == key)
                    .map(|(_, v)| v.to_string())
            })
            .ok_or_else(|| {
                format!("give every primary-key column as name=value; {key} is missing")
            })?;
        values.push(serde_json::Value::String(found));
    }
    let found = client.lookup(&table, vec![values]).await.map_err(err)?;
    if found.iter().all(|b| b.num_rows() == 0) {
        return Err(format!("no row of {table} has that key"));
    }
    print_batches(&d.schema.to_arrow(), &found, OutputFormat::Table)
}

pub async fn offsets(client: &MinkClient, table: &str, partition: Option<String>) -> CliResult<()> {
    let table = path(table)?;
    let earliest = offsets_of(client, &table, "earliest", partition.clone(), None).await?;
    let latest = offsets_of(client, &table, "latest", partition, None).await?;
    let show = |o: Option<i64>| o.map_or("null".to_string(), |o| o.to_string());
    println!("{:<10} {:>12} {:>12}", "bucket", "earliest", "latest");
    for (e, l) in earliest.iter().zip(&latest) {
        println!(
            "{:<10} {:>12} {:>12}",
            e.bucket.bucket,
            show(e.offset),
            show(l.offset)
        );
    }
    Ok(())
}
