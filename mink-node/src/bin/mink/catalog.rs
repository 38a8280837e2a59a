//! `mink db` and `mink table`: the catalog.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use mink_flight::MinkClient;
use mink_flight::actions::{
    AlterTable, DatabaseName, DropDatabase, DropTable, ListDatabases, ListTables, Metadata,
    TableMetadata, TableRef,
};
use mink_types::{Column, DataType, Schema, TableDescriptor, TablePath, TableProperties};

use crate::{CliResult, call, err, path};

#[derive(Debug, Subcommand)]
pub enum DbCommand {
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
pub enum TableCommand {
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
pub struct CreateTableArgs {
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
    /// A property as key=value (log_ttl, merge_engine, aggregation.COLUMN, delete_behavior, changelog_image, compression, lake.enabled, lake.freshness).
    #[arg(long = "property")]
    properties: Vec<String>,
}

pub async fn db(client: &MinkClient, command: DbCommand) -> CliResult<()> {
    match command {
        DbCommand::Create { name } => {
            client.create_database(&name).await.map_err(err)?;
            println!("created database {name}");
        }
        DbCommand::List => {
            for name in call(client, ListDatabases(Default::default())).await? {
                println!("{name}");
            }
        }
        DbCommand::Drop { name, cascade } => {
            call(
                client,
                DropDatabase(DatabaseName {
                    name: name.clone(),
                    cascade,
                }),
            )
            .await?;
            println!("dropped database {name}");
        }
    }
    Ok(())
}

pub async fn table(client: &MinkClient, command: TableCommand) -> CliResult<()> {
    match command {
        TableCommand::Create(args) => {
            let table = path(&args.table)?;
            let descriptor = descriptor_from_args(&args)?;
            descriptor.validate().map_err(err)?;
            let id = client
                .create_table(&table, &descriptor)
                .await
                .map_err(err)?;
            println!("created table {table} (id {id})");
        }
        TableCommand::List { database } => {
            let names = call(
                client,
                ListTables {
                    database: database.clone(),
                },
            )
            .await?;
            for name in names {
                println!("{database}.{name}");
            }
        }
        TableCommand::Describe { table } => describe(client, &path(&table)?).await?,
        TableCommand::Alter {
            table,
            add_columns,
            properties,
        } => {
            let table = path(&table)?;
            let add_columns: Vec<Column> = add_columns
                .iter()
                .map(|c| parse_column(c, true))
                .collect::<CliResult<_>>()?;
            let mut set_properties = std::collections::BTreeMap::new();
            for p in &properties {
                let (k, v) = p
                    .split_once('=')
                    .ok_or_else(|| format!("property {p:?}: expected key=value"))?;
                set_properties.insert(k.to_string(), v.to_string());
            }
            call(
                client,
                AlterTable {
                    path: table.clone(),
                    add_columns,
                    set_properties,
                },
            )
            .await?;
            println!("altered table {table}");
        }
        TableCommand::Drop { table } => {
            let table = path(&table)?;
            call(
                client,
                DropTable(TableRef {
                    path: table.clone(),
                }),
            )
            .await?;
            println!("dropped table {table}");
        }
    }
    Ok(())
}

async fn describe(client: &MinkClient, table: &TablePath) -> CliResult<()> {
    let (d, meta) = table_meta(client, table).await?;
    println!("table {table} (id {})", meta.table["id"]);
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
    for b in &meta.buckets {
        println!(
            "  bucket {}{}: leader {} ({}), epoch {}",
            b.bucket.bucket,
            b.partition
                .as_deref()
                .map(|p| format!(" of {p}"))
                .unwrap_or_default(),
            b.leader.as_deref().unwrap_or("none"),
            b.leader_address.as_deref().unwrap_or("-"),
            b.epoch
        );
    }
    Ok(())
}

/// A table's descriptor and its `metadata` (buckets and leaders).
pub async fn table_meta(
    client: &MinkClient,
    table: &TablePath,
) -> CliResult<(TableDescriptor, TableMetadata)> {
    let meta = call(
        client,
        Metadata(TableRef {
            path: table.clone(),
        }),
    )
    .await?;
    let d: TableDescriptor =
        serde_json::from_value(meta.table["descriptor"].clone()).map_err(err)?;
    Ok((d, meta))
}

pub fn parse_column(spec: &str, nullable_default: bool) -> CliResult<Column> {
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
