//! `mink`: the command line of a Mink cluster, over the Rust client and the typed
//! action protocol (`mink_flight::actions`). One module per command group:
//!
//! - [`catalog`]: `db`, `table`;
//! - [`data`]: `write`, `scan`, `tail`, `lookup`, `offsets`;
//! - [`cluster`]: `cluster`, `node`, `lake`;
//! - [`kafka`]: `kafka groups`, `kafka lag`;
//! - [`input`] and [`output`]: the files `write` reads, how rows are printed.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mink_flight::MinkClient;
use mink_types::TablePath;

mod catalog;
mod cluster;
mod data;
mod input;
mod kafka;
mod output;

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
    Db(catalog::DbCommand),
    /// Tables. Example: mink table describe demo.events
    #[command(subcommand)]
    Table(catalog::TableCommand),
    /// Write a CSV, JSON-lines, Arrow IPC or Parquet file into a table.
    /// Example: mink write demo.events --file events.csv
    Write(data::WriteArgs),
    /// Print rows of a table. Example: mink scan demo.events --limit 20
    Scan(data::ScanArgs),
    /// Follow new rows of a table until Ctrl-C. Example: mink tail demo.events
    Tail(data::TailArgs),
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
    Cluster(cluster::ClusterCommand),
    /// The node at --addr. Example: mink node stats
    #[command(subcommand)]
    Node(cluster::NodeCommand),
    /// The table's lake (Apache Iceberg) tiering. Example: mink lake status demo.events
    #[command(subcommand)]
    Lake(cluster::LakeCommand),
    /// Kafka consumer groups and their lag. Example: mink kafka lag orders-app
    #[command(subcommand)]
    Kafka(kafka::KafkaCommand),
}

type CliResult<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn path(text: &str) -> CliResult<TablePath> {
    TablePath::parse(text).map_err(err)
}

/// Runs a typed action at the client's node.
async fn call<R: mink_flight::actions::ActionRequest>(
    client: &MinkClient,
    request: R,
) -> CliResult<R::Answer> {
    client.call(&request).await.map_err(err)
}

async fn run(cli: Cli) -> CliResult<()> {
    let addr = cli.addr.clone();
    let client = MinkClient::connect(&addr).await.map_err(err)?;
    match cli.command {
        Command::Db(c) => catalog::db(&client, c).await,
        Command::Table(c) => catalog::table(&client, c).await,
        Command::Write(args) => data::write(&client, args).await,
        Command::Scan(args) => data::scan(&client, args).await,
        Command::Tail(args) => data::tail(client, args).await,
        Command::Lookup { table, keys } => data::lookup(&client, &table, &keys).await,
        Command::Offsets { table, partition } => data::offsets(&client, &table, partition).await,
        Command::Cluster(c) => cluster::cluster(&client, c).await,
        Command::Node(c) => cluster::node(&client, c).await,
        Command::Lake(c) => cluster::lake(&client, c).await,
        Command::Kafka(c) => kafka::kafka(&client, c).await,
    }
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
