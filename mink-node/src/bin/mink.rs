//! `mink`: the command line of a Mink cluster, over the Rust client.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::pretty::pretty_format_batches;
use clap::{Args, Parser, Subcommand, ValueEnum};
use mink_flight::MinkClient;
use mink_flight::client::status_to_error;
use mink_types::{
    Column, DataType, Schema, TableBucket, TableDescriptor, TablePath, TableProperties,
};

/// The command line of a Mink cluster.
///
/// Example: mink table create demo.events --column id:BIGINT:not-null --column msg:STRING --buckets 4
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// A node's Flight address (host:port); any node of the cluster serves.
    #[arg(
        long,
        global = true,
        env = "MINK_ADDR",
        default_value = "localhost:9120"
    )]
    addr: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Databases. Example: mink db create demo
    #[command(subcommand)]
    Db(DbCommand),
    /// Tables. Example: mink table describe demo.events
    #[command(subcommand)]
    Table(TableCommand),
    /// Write a CSV, JSON-lines, Arrow IPC or Parquet file into a table.
    /// Example: mink write demo.events --file events.csv
    Write(WriteArgs),
    /// Print rows of a table. Example: mink scan demo.events --limit 20
    Scan(ScanArgs),
    /// Follow new rows of a table until Ctrl-C. Example: mink tail demo.events
    Tail(TailArgs),
    /// Rows of a primary-key table by key. Example: mink lookup demo.users id=42
    Lookup {
        table: String,
        /// Key columns as name=value, in any order.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Earliest and latest offsets of every bucket (of one partition of a partitioned
    /// table). Example: mink offsets demo.events
    Offsets {
        table: String,
        /// The partition (partitioned tables), e.g. 2026-11-29.
        #[arg(long)]
        partition: Option<String>,
    },
    /// The cluster. Example: mink cluster describe
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The node at --addr. Example: mink node stats
    #[command(subcommand)]
    Node(NodeCommand),
    /// The table's lake (Apache Iceberg) tiering. Example: mink lake status demo.events
    #[command(subcommand)]
    Lake(LakeCommand),
}

#[derive(Debug, Subcommand)]
enum LakeCommand {
    /// The newest lake snapshot (id, files, rows, bytes, metadata location) and, per
    /// bucket, the lake's offset, the log's high watermark and the lag in rows.
    /// Example: mink lake status demo.events
    Status { table: String },
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Example: mink db create demo
    Create { name: String },
    /// Example: mink db list
    List,
    /// Example: mink db drop demo --cascade
    Drop {
        name: String,
        /// Drop its tables too.
        #[arg(long)]
        cascade: bool,
    },
}

#[derive(Debug, Subcommand)]
enum TableCommand {
    /// Example: mink table create demo.users --column id:BIGINT:not-null --column name:STRING --primary-key id
    Create(CreateTableArgs),
    /// Example: mink table list demo
    List { database: String },
    /// Example: mink table describe demo.users
    Describe { table: String },
    /// Example: mink table alter demo.users --add-column note:STRING --property log_ttl=3d
    Alter {
        table: String,
        /// A nullable column to add at the end: name:TYPE.
        #[arg(long = "add-column")]
        add_columns: Vec<String>,
        /// A property as key=value.
        #[arg(long = "property")]
        properties: Vec<String>,
    },
    /// Example: mink table drop demo.users
    Drop { table: String },
}

#[derive(Debug, Args)]
struct CreateTableArgs {
    table: String,
    /// A table definition as JSON or TOML (a TableDescriptor, see docs/protocol.md).
    #[arg(long, conflicts_with = "columns")]
    schema: Option<PathBuf>,
    /// A column: name:TYPE, or name:TYPE:not-null.
    #[arg(long = "column")]
    columns: Vec<String>,
    /// Primary-key columns, comma separated.
    #[arg(long, value_delimiter = ',')]
    primary_key: Vec<String>,
    /// Partition-key columns, comma separated.
    #[arg(long, value_delimiter = ',')]
    partition_key: Vec<String>,
    /// Bucket-key columns, comma separated.
    #[arg(long, value_delimiter = ',')]
    bucket_key: Vec<String>,
    /// Buckets per table (or partition).
    #[arg(long, default_value_t = 1)]
    buckets: u32,
    /// A property as key=value (log_ttl, merge_engine, aggregation.COLUMN, delete_behavior, changelog_image, lake.enabled, lake.freshness).
    #[arg(long = "property")]
    properties: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FileFormat {
    Csv,
    Json,
    Arrow,
    Parquet,
}

#[derive(Debug, Args)]
struct WriteArgs {
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

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OutputFormat {
    Table,
    Json,
    Csv,
    Arrow,
}

#[derive(Debug, Args)]
struct ScanArgs {
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
struct TailArgs {
    table: String,
    /// Only this bucket number (default: every bucket; of a partitioned table, every
    /// bucket of every partition, including partitions created while it runs).
    #[arg(long)]
    bucket: Option<u32>,
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Nodes, their addresses and the lease. Example: mink cluster describe
    Describe,
    /// Whether the node at --addr serves. Example: mink cluster health
    Health,
    /// Even out bucket leadership (on the lease holder). Example: mink cluster rebalance
    Rebalance,
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// The node's counters, with its object-store requests by operation and purpose
    /// (docs/operations.md). Example: mink node stats
    Stats,
}

type CliResult<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn path(text: &str) -> CliResult<TablePath> {
    TablePath::parse(text).map_err(err)
}

fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn parse_column(spec: &str, nullable_default: bool) -> CliResult<Column> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (name, ty, nullable) = match parts.as_slice() {
        [name, ty] => (*name, *ty, nullable_default),
        [name, ty, flag] if flag.eq_ignore_ascii_case("not-null") => (*name, *ty, false),
        [name, ty, flag] if flag.eq_ignore_ascii_case("null") => (*name, *ty, true),
        _ => {
            return Err(format!(
                "column {spec:?}: expected name:TYPE or name:TYPE:not-null"
            ));
        }
    };
    let ty: DataType = ty.parse().map_err(err)?;
    Ok(Column::new(name, ty, nullable))
}

fn descriptor_from_args(a: &CreateTableArgs) -> CliResult<TableDescriptor> {
    if let Some(file) = &a.schema {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let d: TableDescriptor = if file.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?
        } else {
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?
        };
        return Ok(d);
    }
    if a.columns.is_empty() {
        return Err("give the columns with --column name:TYPE (or a --schema file)".into());
    }
    let mut columns = a
        .columns
        .iter()
        .map(|c| parse_column(c, true))
        .collect::<CliResult<Vec<_>>>()?;
    // Primary-key columns are NOT NULL whatever the flag said.
    for c in &mut columns {
        if a.primary_key.contains(&c.name) {
            c.nullable = false;
        }
    }
    let mut properties = TableProperties::default();
    for p in &a.properties {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| format!("property {p:?}: expected key=value"))?;
        properties.set(k, v).map_err(err)?;
    }
    Ok(TableDescriptor {
        schema: Schema::new(1, columns),
        primary_key: a.primary_key.clone(),
        partition_keys: a.partition_key.clone(),
        bucket_keys: (!a.bucket_key.is_empty()).then(|| a.bucket_key.clone()),
        bucket_count: a.buckets,
        bucketing: Default::default(),
        properties,
        comment: None,
    })
}

async fn table_meta(
    client: &MinkClient,
    table: &TablePath,
) -> CliResult<(TableDescriptor, serde_json::Value)> {
    let meta: serde_json::Value = client
        .action("metadata", serde_json::json!({"path": table}))
        .await
        .map_err(err)?;
    let d: TableDescriptor =
        serde_json::from_value(meta["table"]["descriptor"].clone()).map_err(err)?;
    Ok((d, meta))
}

/// Reads a file as batches of the table's schema (columns by name, cast as needed).
fn read_file(
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
    batches
        .into_iter()
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

/// Writes one batch through the node (AppendTable / PutTable); returns its answer.
async fn write_routed(
    addr: &str,
    table: &TablePath,
    primary_key: bool,
    schema_id: i32,
    batch: &RecordBatch,
) -> CliResult<serde_json::Value> {
    let descriptor = if primary_key {
        mink_flight::protocol::WriteDescriptor::PutTable {
            path: table.clone(),
            schema_id,
            target_columns: None,
        }
    } else {
        mink_flight::protocol::WriteDescriptor::AppendTable {
            path: table.clone(),
            schema_id,
        }
    };
    let data = mink_flight::client::encode_write(batch, Some(&descriptor), &Default::default())
        .map_err(err)?;
    let mut flight = mink_flight::client::connect(addr).await.map_err(err)?;
    let mut results = flight
        .do_put(futures::stream::iter(data))
        .await
        .map_err(|s| status_to_error(s).to_string())?
        .into_inner();
    let answer = results
        .message()
        .await
        .map_err(|s| status_to_error(s).to_string())?
        .ok_or("the node answered nothing")?;
    serde_json::from_slice(&answer.app_metadata).map_err(err)
}

async fn run(cli: Cli) -> CliResult<()> {
    let addr = cli.addr.clone();
    let client = MinkClient::connect(&addr).await.map_err(err)?;
    let action = |name: &'static str, body: serde_json::Value| {
        let client = &client;
        async move {
            client
                .action::<serde_json::Value>(name, body)
                .await
                .map_err(err)
        }
    };
    match cli.command {
        Command::Db(DbCommand::Create { name }) => {
            action("create_database", serde_json::json!({"name": name})).await?;
            println!("created database {name}");
        }
        Command::Db(DbCommand::List) => {
            for name in action("list_databases", serde_json::json!({}))
                .await?
                .as_array()
                .into_iter()
                .flatten()
            {
                println!("{}", name.as_str().unwrap_or_default());
            }
        }
        Command::Db(DbCommand::Drop { name, cascade }) => {
            action(
                "drop_database",
                serde_json::json!({"name": name, "cascade": cascade}),
            )
            .await?;
            println!("dropped database {name}");
        }
        Command::Table(TableCommand::Create(args)) => {
            let table = path(&args.table)?;
            let descriptor = descriptor_from_args(&args)?;
            descriptor.validate().map_err(err)?;
            let id = client
                .create_table(&table, &descriptor)
                .await
                .map_err(err)?;
            println!("created table {table} (id {id})");
        }
        Command::Table(TableCommand::List { database }) => {
            for name in action("list_tables", serde_json::json!({"database": database}))
                .await?
                .as_array()
                .into_iter()
                .flatten()
            {
                println!("{database}.{}", name.as_str().unwrap_or_default());
            }
        }
        Command::Table(TableCommand::Describe { table }) => {
            let table = path(&table)?;
            let (d, meta) = table_meta(&client, &table).await?;
            println!("table {table} (id {})", meta["table"]["id"]);
            for c in &d.schema.columns {
                let key = if d.primary_key.contains(&c.name) {
                    "  primary key"
                } else {
                    ""
                };
                println!(
                    "  {:<24} {:<20} {}{key}",
                    c.name,
                    c.data_type.to_string(),
                    if c.nullable { "NULL" } else { "NOT NULL" }
                );
            }
            println!("schema id: {}", d.schema.schema_id);
            if d.is_partitioned() {
                println!("partition keys: {}", d.partition_keys.join(", "));
            }
            println!(
                "bucket keys: {}",
                if d.bucket_keys().is_empty() {
                    "(round-robin)".into()
                } else {
                    d.bucket_keys().join(", ")
                }
            );
            println!("buckets: {} ({:?})", d.bucket_count, d.bucketing);
            println!("log_ttl: {}", d.properties.log_ttl);
            if d.has_primary_key() {
                println!("merge engine: {}", d.properties.merge_engine.name());
            }
            for b in meta["buckets"].as_array().into_iter().flatten() {
                println!(
                    "  bucket {}{}: leader {} ({}), epoch {}",
                    b["bucket"]["bucket"],
                    b["partition"]
                        .as_str()
                        .map(|p| format!(" of {p}"))
                        .unwrap_or_default(),
                    b["leader"].as_str().unwrap_or("none"),
                    b["leader_address"].as_str().unwrap_or("-"),
                    b["epoch"]
                );
            }
        }
        Command::Table(TableCommand::Alter {
            table,
            add_columns,
            properties,
        }) => {
            let add: Vec<Column> = add_columns
                .iter()
                .map(|c| parse_column(c, true))
                .collect::<CliResult<_>>()?;
            let mut set = serde_json::Map::new();
            for p in &properties {
                let (k, v) = p
                    .split_once('=')
                    .ok_or_else(|| format!("property {p:?}: expected key=value"))?;
                set.insert(k.into(), v.into());
            }
            action(
                "alter_table",
                serde_json::json!({"path": table, "add_columns": add, "set_properties": set}),
            )
            .await?;
            println!("altered table {table}");
        }
        Command::Table(TableCommand::Drop { table }) => {
            action("drop_table", serde_json::json!({"path": table})).await?;
            println!("dropped table {table}");
        }
        Command::Write(args) => {
            let table = path(&args.table)?;
            let (d, _) = table_meta(&client, &table).await?;
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
            let mut note = |bucket: &serde_json::Value, first: i64, last: i64| {
                let key = format!(
                    "bucket {}{}",
                    bucket["bucket"],
                    bucket["partition_id"]
                        .as_i64()
                        .map(|p| format!(" of partition {p}"))
                        .unwrap_or_default()
                );
                let e = per_bucket.entry(key).or_insert((first, last));
                e.0 = e.0.min(first);
                e.1 = e.1.max(last);
            };
            for batch in &batches {
                if args.client_routing {
                    let written = if d.has_primary_key() {
                        client.put(&table, batch, None, None).await
                    } else {
                        client.append(&table, batch).await
                    }
                    .map_err(err)?;
                    for w in written {
                        note(
                            &serde_json::to_value(w.bucket).unwrap_or_default(),
                            w.first_offset,
                            w.last_offset,
                        );
                    }
                } else {
                    let answer = write_routed(
                        &addr,
                        &table,
                        d.has_primary_key(),
                        d.schema.schema_id,
                        batch,
                    )
                    .await?;
                    for b in answer["Routed"]["buckets"].as_array().into_iter().flatten() {
                        note(
                            &b["bucket"],
                            b["first_offset"].as_i64().unwrap_or(0),
                            b["last_offset"].as_i64().unwrap_or(-1),
                        );
                    }
                }
                bar.inc(batch.num_rows() as u64);
            }
            bar.finish_and_clear();
            println!("wrote {total} rows to {table}");
            for (bucket, (first, last)) in per_bucket {
                println!("  {bucket}: offsets {first}..={last}");
            }
        }
        Command::Scan(args) => {
            let table = path(&args.table)?;
            let (d, meta) = table_meta(&client, &table).await?;
            let mut out: Vec<RecordBatch> = Vec::new();
            let mut rows = 0usize;
            for b in meta["buckets"].as_array().into_iter().flatten() {
                let bucket: TableBucket =
                    serde_json::from_value(b["bucket"].clone()).map_err(err)?;
                if args.bucket.is_some_and(|n| n != bucket.bucket) {
                    continue;
                }
                if let Some(p) = &args.partition
                    && b["partition"].as_str() != Some(p.as_str())
                {
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
            print_batches(&d.schema.to_arrow(), &out, args.format)?;
        }
        Command::Tail(args) => {
            let table = path(&args.table)?;
            let (d, meta) = table_meta(&client, &table).await?;
            // Each bucket (of every partition, for a partitioned table) from its latest
            // offset.
            let mut buckets = Vec::new();
            for entry in meta["buckets"].as_array().into_iter().flatten() {
                let Ok(bucket) = serde_json::from_value::<TableBucket>(entry["bucket"].clone())
                else {
                    continue;
                };
                if args.bucket.is_some_and(|n| n != bucket.bucket) {
                    continue;
                }
                let latest = client
                    .action::<serde_json::Value>(
                        "list_offsets",
                        serde_json::json!({"path": table, "spec": "latest",
                            "buckets": [bucket.bucket], "partition": entry["partition"]}),
                    )
                    .await
                    .map_err(err)?;
                buckets.push((bucket, latest[0]["offset"].as_i64().unwrap_or(0)));
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
                        for entry in meta["buckets"].as_array().into_iter().flatten() {
                            if let Ok(bucket) =
                                serde_json::from_value::<TableBucket>(entry["bucket"].clone())
                                && args.bucket.is_none_or(|n| n == bucket.bucket)
                                && followed.insert(bucket)
                            {
                                follow(bucket, 0);
                            }
                        }
                    }
                }
            }
        }
        Command::Lookup { table, keys } => {
            let table = path(&table)?;
            let (d, _) = table_meta(&client, &table).await?;
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
            print_batches(&d.schema.to_arrow(), &found, OutputFormat::Table)?;
        }
        Command::Offsets { table, partition } => {
            let earliest = action(
                "list_offsets",
                serde_json::json!({"path": table, "spec": "earliest", "partition": partition}),
            )
            .await?;
            let latest = action(
                "list_offsets",
                serde_json::json!({"path": table, "spec": "latest", "partition": partition}),
            )
            .await?;
            println!("{:<10} {:>12} {:>12}", "bucket", "earliest", "latest");
            for (e, l) in earliest
                .as_array()
                .into_iter()
                .flatten()
                .zip(latest.as_array().into_iter().flatten())
            {
                println!(
                    "{:<10} {:>12} {:>12}",
                    e["bucket"]["bucket"].to_string(),
                    e["offset"].to_string(),
                    l["offset"].to_string()
                );
            }
        }
        Command::Cluster(ClusterCommand::Describe) => {
            print_json(&action("describe_cluster", serde_json::json!({})).await?)
        }
        Command::Cluster(ClusterCommand::Health) => {
            print_json(&action("health", serde_json::json!({})).await?)
        }
        Command::Cluster(ClusterCommand::Rebalance) => {
            print_json(&action("rebalance", serde_json::json!({})).await?)
        }
        Command::Node(NodeCommand::Stats) => {
            print_json(&action("node_stats", serde_json::json!({})).await?)
        }
        Command::Lake(LakeCommand::Status { table }) => {
            path(&table)?;
            let snapshot = match action("lake_snapshot", serde_json::json!({"path": table})).await {
                Ok(s) => s,
                Err(e) if e.starts_with("not found") => {
                    serde_json::json!({"snapshot": null, "why": e})
                }
                Err(e) => return Err(e),
            };
            let info = action("get_table", serde_json::json!({"path": table})).await?;
            let partitioned = info["descriptor"]["partition_keys"]
                .as_array()
                .is_some_and(|k| !k.is_empty());
            let partitions: Vec<Option<String>> = if partitioned {
                action("list_partitions", serde_json::json!({"path": table}))
                    .await?
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["name"].as_str().map(|n| Some(n.to_string())))
                    .collect()
            } else {
                vec![None]
            };
            let mut buckets = Vec::new();
            for partition in partitions {
                let latest = action(
                    "list_offsets",
                    serde_json::json!({"path": table, "spec": "latest", "partition": partition}),
                )
                .await?;
                for l in latest.as_array().into_iter().flatten() {
                    let bucket: mink_types::TableBucket =
                        serde_json::from_value(l["bucket"].clone()).map_err(err)?;
                    let hw = l["offset"].as_i64();
                    let lake = snapshot["offsets"][bucket.stream_name()].as_i64();
                    buckets.push(serde_json::json!({
                        "partition": partition,
                        "bucket": bucket.bucket,
                        "lake_offset": lake,
                        "high_watermark": hw,
                        "lag_rows": hw.map(|h| h - lake.unwrap_or(0)),
                    }));
                }
            }
            print_json(&serde_json::json!({"snapshot": snapshot, "buckets": buckets}))
        }
    }
    Ok(())
}

/// `batch` as Arrow's text formatters can show it: they parse time zones and, without
/// the chrono-tz feature, know offsets only, so TIMESTAMP_LTZ columns (zone "UTC")
/// are shown with the equal offset "+00:00".
fn displayable(batch: &RecordBatch) -> CliResult<RecordBatch> {
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

fn print_batches(
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = e.lines().next().unwrap_or_default().to_string();
            eprintln!("mink: {line}");
            ExitCode::FAILURE
        }
    }
}
