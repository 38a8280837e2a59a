//! `MinkReadExec`: the leaf of every plan over a Mink table. One DataFusion
//! partition per read part (a bucket, or one whole-table read any node answers),
//! each streamed from the node as DataFusion pulls it, at most
//! `query.read_parallelism` of them at once per query.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Int64Array, StringArray, TimestampMillisecondArray, new_null_array,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::stats::Precision;
use datafusion::common::{DataFusionError, Result, Statistics};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use mink_flight::actions::{BucketRef, LatestKvSnapshot, Lookup, PrefixLookup};
use mink_flight::filter::Filter;
use mink_flight::protocol::{ReadTicket, ScanBatch, SnapshotBatch};
use mink_types::{MinkError, TableBucket, TablePath};
use tokio::sync::Semaphore;

use crate::engine::batches_of_ipc;
use crate::merge::BucketState;
use crate::nodes::{Nodes, resumable};

/// How many times a bucket's KV snapshot read starts over after its bucket moved or
/// its node went away.
const SNAPSHOT_RESTARTS_MAX: usize = 5;

/// The system columns of a `$changelog` read, after the table's own.
pub const CHANGELOG_COLUMNS: [&str; 3] = ["_change_type", "_log_offset", "_commit_timestamp"];

/// One piece of a read: one DataFusion partition.
#[derive(Debug, Clone)]
pub enum Part {
    /// Rows of a bucket's log at its leader (a log table; a `$changelog`).
    Log { addr: String, ticket: ReadTicket },
    /// A primary-key bucket's state at `end_offset`: its KV snapshot and the
    /// changelog since, merged here.
    State {
        addr: String,
        bucket: TableBucket,
        end_offset: i64,
    },
    /// A read any node answers (`Union`, `Lake`).
    Any { ticket: ReadTicket },
    /// A primary-key point query.
    Lookup { keys: Vec<Vec<serde_json::Value>> },
    /// A primary-key prefix query.
    PrefixLookup { prefix: Vec<serde_json::Value> },
}

/// How the read came to be, for `EXPLAIN`.
#[derive(Debug, Clone)]
pub struct Describe {
    pub read: &'static str,
    pub detail: String,
    /// About how many rows the read yields (before the filters above it), as far as
    /// planning knows: the planner's statistics (join order, build sides).
    pub rows: Option<u64>,
    /// Whether `rows` is exact (then DataFusion may answer `count(*)` from it).
    pub rows_exact: bool,
}

impl Describe {
    /// A read whose row count, when known, is an estimate.
    pub fn estimated(read: &'static str, detail: impl Into<String>, rows: Option<u64>) -> Self {
        Self {
            read,
            detail: detail.into(),
            rows,
            rows_exact: false,
        }
    }
}

#[derive(Debug)]
pub struct MinkReadExec {
    nodes: Arc<Nodes>,
    path: TablePath,
    parts: Vec<Part>,
    /// The rows as the read yields them: the table's columns (those asked of the
    /// nodes, when the projection is pushed), plus the changelog's.
    full: SchemaRef,
    /// The table columns asked of the nodes (`None`: all): the projection's, and for
    /// a state merge the key's too.
    columns: Option<Vec<String>>,
    /// The rows asked of the nodes (`None`: all): the filters they can apply.
    filter: Option<Filter>,
    /// Primary-key columns (in `full`), for state merges.
    key_columns: Vec<usize>,
    changelog: bool,
    describe: Describe,
    parallelism: Arc<Semaphore>,
    batch_size: usize,
    properties: Arc<PlanProperties>,
}

impl MinkReadExec {
    #[expect(clippy::too_many_arguments, reason = "a plan node's fields, set once")]
    pub fn new(
        nodes: Arc<Nodes>,
        path: TablePath,
        parts: Vec<Part>,
        full: SchemaRef,
        (projection, filter): (Option<Vec<usize>>, Option<Filter>),
        key_columns: Vec<usize>,
        changelog: bool,
        describe: Describe,
        read_parallelism: usize,
        batch_size: usize,
    ) -> Result<Self> {
        let output = match &projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full.clone(),
        };
        let own = if changelog {
            full.fields().len() - CHANGELOG_COLUMNS.len()
        } else {
            full.fields().len()
        };
        let asked: Option<Vec<usize>> = projection.as_ref().map(|p| {
            (0..own)
                .filter(|i| p.contains(i) || key_columns.contains(i))
                .collect()
        });
        let columns = asked.as_ref().map(|asked| {
            asked
                .iter()
                .map(|i| full.field(*i).name().clone())
                .collect::<Vec<_>>()
        });
        // The rows as the nodes send them: the columns asked, then a changelog's own.
        let (full, key_columns) = match asked {
            Some(mut asked) => {
                asked.extend(own..full.fields().len());
                let keys = key_columns
                    .iter()
                    .map(|k| asked.iter().position(|i| i == k))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| DataFusionError::Internal("a key column was not read".into()))?;
                (Arc::new(full.project(&asked)?), keys)
            }
            None => (full, key_columns),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(output),
            Partitioning::UnknownPartitioning(parts.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            nodes,
            path,
            parts,
            full,
            columns,
            filter,
            key_columns,
            changelog,
            describe,
            parallelism: Arc::new(Semaphore::new(read_parallelism.max(1))),
            batch_size,
            properties: Arc::new(properties),
        })
    }

    /// The parts of this read (tests and EXPLAIN).
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }
}

impl DisplayAs for MinkReadExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "MinkReadExec: table={}, read={}, parts={}",
            self.path,
            self.describe.read,
            self.parts.len()
        )?;
        if !self.describe.detail.is_empty() {
            write!(f, ", {}", self.describe.detail)?;
        }
        if let Some(columns) = &self.columns {
            write!(f, ", columns=[{}]", columns.join(", "))?;
        }
        if let Some(filter) = &self.filter {
            write!(f, ", filter=[{filter}]")?;
        }
        if let Some(rows) = self.describe.rows {
            write!(f, ", rows~{rows}")?;
        }
        Ok(())
    }
}

pub fn mink_error(e: MinkError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl ExecutionPlan for MinkReadExec {
    fn name(&self) -> &str {
        "MinkReadExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    /// The read's row count ([`Describe::rows`]) for the whole read: DataFusion
    /// orders joins and picks build sides by it, and answers `count(*)` from an exact
    /// one.
    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema());
        if let (None, Some(rows)) = (partition, self.describe.rows) {
            let rows = usize::try_from(rows).unwrap_or(usize::MAX);
            stats.num_rows = if self.describe.rows_exact {
                Precision::Exact(rows)
            } else {
                Precision::Inexact(rows)
            };
        }
        Ok(Arc::new(stats))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "MinkReadExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let output = self.schema();
        let Some(part) = self.parts.get(partition).cloned() else {
            // A read of nothing (every partition pruned) still has one partition.
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                output,
                futures::stream::empty(),
            )));
        };
        let read = Read {
            nodes: self.nodes.clone(),
            path: self.path.clone(),
            full: self.full.clone(),
            output: self.schema(),
            columns: self.columns.clone(),
            filter: self.filter.clone(),
            key_columns: self.key_columns.clone(),
            changelog: self.changelog,
            batch_size: self.batch_size,
        };
        let parallelism = self.parallelism.clone();
        let stream = futures::stream::once(async move {
            let permit = parallelism
                .acquire_owned()
                .await
                .map_err(|_| DataFusionError::Internal("the read was closed".into()))?;
            let rows = read.part(part, context).await?;
            // The permit is held while the part streams.
            Ok::<_, DataFusionError>(rows.map(move |b| {
                let _held = &permit;
                b
            }))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(output, stream)))
    }
}

/// What a part needs to run, detached from the plan.
struct Read {
    nodes: Arc<Nodes>,
    path: TablePath,
    full: SchemaRef,
    /// The rows handed to DataFusion (`full`, projected).
    output: SchemaRef,
    /// The table columns asked of the nodes (`None`: all).
    columns: Option<Vec<String>>,
    /// The rows asked of the nodes (`None`: all).
    filter: Option<Filter>,
    key_columns: Vec<usize>,
    changelog: bool,
    batch_size: usize,
}

type Rows = futures::stream::BoxStream<'static, Result<RecordBatch>>;

impl Read {
    async fn part(self, part: Part, context: Arc<TaskContext>) -> Result<Rows> {
        match part {
            Part::Log { addr, ticket } => {
                let ticket = ticket
                    .with_columns(self.columns.clone())
                    .with_filter(self.filter.clone());
                let batches = self.nodes.read(&addr, &ticket).await.map_err(mink_error)?;
                Ok(batches
                    .map(move |item| {
                        let (batch, meta) = item.map_err(mink_error)?;
                        self.log_rows(batch, &meta)
                    })
                    .boxed())
            }
            Part::Any { ticket } => {
                let ticket = ticket
                    .with_columns(self.columns.clone())
                    .with_filter(self.filter.clone());
                let batches = self.nodes.read_any(&ticket).await.map_err(mink_error)?;
                Ok(batches
                    .map(move |item| {
                        let (batch, _) = item.map_err(mink_error)?;
                        self.output(batch)
                    })
                    .boxed())
            }
            Part::Lookup { keys } => {
                let found = self
                    .nodes
                    .call_waiting(&Lookup {
                        forwarded: false,
                        path: self.path.clone(),
                        keys,
                    })
                    .await
                    .map_err(mink_error)?;
                self.ipc_rows(found.0)
            }
            Part::PrefixLookup { prefix } => {
                let found = self
                    .nodes
                    .call_waiting(&PrefixLookup {
                        forwarded: false,
                        path: self.path.clone(),
                        prefix,
                        limit: None,
                    })
                    .await
                    .map_err(mink_error)?;
                self.ipc_rows(found.0)
            }
            Part::State {
                addr,
                bucket,
                end_offset,
            } => self.state(addr, bucket, end_offset, context).await,
        }
    }

    fn ipc_rows(self, bytes: Vec<u8>) -> Result<Rows> {
        let batches = batches_of_ipc(bytes).map_err(mink_error)?;
        let out = batches
            .into_iter()
            .map(|b| self.output(b))
            .collect::<Vec<_>>();
        Ok(futures::stream::iter(out).boxed())
    }

    /// A bucket's state: the snapshot, then the changelog up to the cut, merged
    /// under the query's memory pool.
    async fn state(
        self,
        addr: String,
        bucket: TableBucket,
        end_offset: i64,
        context: Arc<TaskContext>,
    ) -> Result<Rows> {
        let table_columns = self.full.fields().len();
        let reservation =
            MemoryConsumer::new(format!("MinkState[{bucket}]")).register(context.memory_pool());
        // The snapshot, read whole; a read that stops (the bucket moved, its node went
        // away) starts over from an empty state at the bucket's leader.
        let mut addr = addr;
        let mut restarts = 0;
        let (mut state, from) = loop {
            reservation.free();
            let mut state = BucketState::new(self.full.clone(), self.key_columns.clone())?;
            let (mut snapshot, at) = self
                .nodes
                .open_waiting(
                    &addr,
                    &ReadTicket::Snapshot {
                        bucket,
                        columns: self.columns.clone(),
                        filter: self.filter.clone(),
                    },
                )
                .await
                .map_err(mink_error)?;
            addr = at;
            let mut from: Option<i64> = None;
            let mut stopped = None;
            while let Some(item) = snapshot.next().await {
                let (batch, meta) = match item {
                    Ok(item) => item,
                    Err(e) if resumable(&e) && restarts < SNAPSHOT_RESTARTS_MAX => {
                        stopped = Some(e);
                        break;
                    }
                    Err(e) => return Err(mink_error(e)),
                };
                let meta: SnapshotBatch = parse_meta(&meta)?;
                from = Some(meta.log_offset);
                let added = state.snapshot(align(batch, &self.full, table_columns)?)?;
                reservation.try_grow(added)?;
            }
            match stopped {
                None => break (state, from),
                Some(e) => {
                    tracing::debug!(%bucket, "a snapshot read stopped ({e}); reading it again");
                    restarts += 1;
                    if let MinkError::NotLeader {
                        leader: Some(to), ..
                    } = e
                    {
                        addr = to;
                    }
                }
            }
        };
        // A snapshot of no rows may come without a batch to carry its offset: the
        // `latest_kv_snapshot` action answers the same snapshot.
        let from = match from {
            Some(offset) => offset,
            None => {
                self.nodes
                    .call_at(&addr, &LatestKvSnapshot(BucketRef { bucket }))
                    .await
                    .map_err(mink_error)?
                    .log_offset
            }
        };
        if from < end_offset {
            let mut changes = self
                .nodes
                .read(
                    &addr,
                    &ReadTicket::Scan {
                        bucket,
                        offset: from,
                        max_bytes: None,
                        end_offset: Some(end_offset),
                        columns: self.columns.clone(),
                        filter: self.filter.clone(),
                    },
                )
                .await
                .map_err(mink_error)?;
            while let Some(item) = changes.next().await {
                let (batch, meta) = item.map_err(mink_error)?;
                let meta: ScanBatch = parse_meta(&meta)?;
                let types = meta.change_types.unwrap_or_default();
                let added = state.changes(align(batch, &self.full, table_columns)?, &types)?;
                reservation.try_grow(added)?;
            }
        }
        let rows = state.finish(self.batch_size)?;
        let out: Vec<Result<RecordBatch>> = rows.into_iter().map(|b| self.output(b)).collect();
        // The reservation lives as long as the rows are being handed out.
        Ok(futures::stream::iter(out)
            .map(move |b| {
                let _held = &reservation;
                b
            })
            .boxed())
    }

    /// A log batch as rows of `full`: the table's columns, and for a `$changelog` the
    /// change type, offset and commit time of each row.
    fn log_rows(&self, batch: RecordBatch, meta: &[u8]) -> Result<RecordBatch> {
        if !self.changelog {
            return self.output(batch);
        }
        let meta: ScanBatch = parse_meta(meta)?;
        let own = self.full.fields().len() - CHANGELOG_COLUMNS.len();
        let batch = align(batch, &self.full, own)?;
        let n = batch.num_rows();
        let types = meta.change_types.unwrap_or_default();
        let change: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| types.get(i).map_or("+A", |t| t.short_string())),
        ));
        let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..n as i64).map(|i| meta.base_offset + i),
        ));
        let committed: ArrayRef = Arc::new(
            TimestampMillisecondArray::from(vec![meta.commit_timestamp; n]).with_timezone("UTC"),
        );
        let mut columns = batch.columns()[..own].to_vec();
        columns.extend([change, offsets, committed]);
        self.output(RecordBatch::try_new(self.full.clone(), columns)?)
    }

    /// `batch` (the full schema's columns, or those asked of the nodes) as the
    /// projected rows, its columns found by name.
    fn output(&self, batch: RecordBatch) -> Result<RecordBatch> {
        align(batch, &self.output, self.output.fields().len())
    }
}

fn parse_meta<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| DataFusionError::Internal(format!("a node's batch metadata: {e}")))
}

/// `batch` with the first `columns` fields of `schema`, found by name: a column the
/// batch lacks (added to the table after the batch was written) is null, a type that
/// differs is cast. A batch already in the schema passes as is.
pub fn align(batch: RecordBatch, schema: &SchemaRef, columns: usize) -> Result<RecordBatch> {
    let target: Vec<_> = schema.fields()[..columns].to_vec();
    let same = batch.num_columns() == columns
        && batch
            .schema()
            .fields()
            .iter()
            .zip(&target)
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    let target_schema = if columns == schema.fields().len() {
        schema.clone()
    } else {
        Arc::new(datafusion::arrow::datatypes::Schema::new(target.clone()))
    };
    let options = datafusion::arrow::record_batch::RecordBatchOptions::new()
        .with_row_count(Some(batch.num_rows()));
    if same {
        // With the row count: a projection may keep no column (`count(*)`).
        return Ok(RecordBatch::try_new_with_options(
            target_schema,
            batch.columns().to_vec(),
            &options,
        )?);
    }
    let arrays = target
        .iter()
        .map(|f| match batch.schema().index_of(f.name()) {
            Ok(i) => Ok(datafusion::arrow::compute::cast(
                batch.column(i),
                f.data_type(),
            )?),
            Err(_) => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new_with_options(
        target_schema,
        arrays,
        &options,
    )?)
}

/// Makes operators that emit many batches per input batch (joins, unnest) yield to
/// the runtime between batches, by wrapping them in DataFusion's `CooperativeExec`.
/// DataFusion yields only at its leaves; a cross join emits for long after its inputs
/// are read, and a query that never yields cannot be cancelled (a timeout, a client
/// that went away) until it ends.
#[derive(Debug, Default)]
pub struct YieldInJoins;

impl datafusion::physical_optimizer::PhysicalOptimizerRule for YieldInJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &datafusion::config::ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::physical_plan::coop::CooperativeExec;
        plan.transform_up(|node| {
            let name = node.name();
            if name.contains("Join") || name == "UnnestExec" {
                Ok(Transformed::yes(
                    Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>
                ))
            } else {
                Ok(Transformed::no(node))
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "YieldInJoins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
