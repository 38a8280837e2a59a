//! The query service the Flight SQL door fronts: plan a statement against the nodes'
//! catalog, execute it under the limits of `[query]`.
//!
//! Every statement gets its own session state (the catalog as the nodes have it then)
//! over one shared runtime, whose memory pool (`query.memory_limit_bytes`) all
//! running queries draw from. A query holds one of `query.concurrent_max` permits
//! from planning its execution to its last batch; none left answers
//! RESOURCE_EXHAUSTED at once. A query is cancelled when its stream is dropped (the
//! client went away) or when `query.timeout_ms` passes.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{CatalogProviderList, MemoryCatalogProviderList};
use datafusion::common::{DataFusionError, ParamValues, ScalarValue};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::SessionConfig;
use futures::StreamExt;
use tokio::sync::Semaphore;

use crate::catalog::{CATALOG, MinkCatalog, listing};
use crate::config::QueryLimits;
use crate::engine::{to_schema, without_views};
use crate::errors::QueryError;
use crate::exec::mink_error;
use crate::nodes::Nodes;
use crate::table::ReadLimits;

/// The schema unqualified names resolve in.
pub const DEFAULT_SCHEMA: &str = "default";

pub struct QueryService {
    nodes: Arc<Nodes>,
    cpu: CpuRuntime,
    limits: QueryLimits,
    /// The session every statement starts from (configuration, functions, rules),
    /// built once: a statement's own differs only in its catalog.
    base: datafusion::execution::SessionState,
    running: Arc<Semaphore>,
}

/// A planned statement.
pub struct Planned {
    state: datafusion::execution::SessionState,
    plan: LogicalPlan,
}

impl Planned {
    /// The schema of its rows as clients are given them (no view types).
    pub fn schema(&self) -> SchemaRef {
        without_views(&Arc::new(self.plan.schema().as_arrow().clone()))
    }

    /// Its parameters (`$1`, `$2`, ...) in order, typed where the planner could tell.
    pub fn parameters(&self) -> Result<SchemaRef, QueryError> {
        let fields = self.plan.get_parameter_fields().map_err(QueryError::from)?;
        let mut named: Vec<(usize, String, Field)> = fields
            .into_iter()
            .map(|(name, field)| {
                let position = name
                    .trim_start_matches('$')
                    .parse::<usize>()
                    .unwrap_or(usize::MAX);
                let data_type = field
                    .map(|f| f.data_type().clone())
                    .unwrap_or(datafusion::arrow::datatypes::DataType::Null);
                (position, name.clone(), Field::new(name, data_type, true))
            })
            .collect();
        named.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(Arc::new(Schema::new(
            named.into_iter().map(|(_, _, f)| f).collect::<Vec<_>>(),
        )))
    }
}

impl QueryService {
    pub fn new(nodes: Arc<Nodes>, limits: QueryLimits) -> Result<Arc<Self>, QueryError> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(
                limits.memory_limit_bytes as usize,
            )))
            .build_arc()
            .map_err(QueryError::from)?;
        let base = SessionStateBuilder::new()
            .with_config(session_config(&limits))
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(crate::exec::YieldInJoins))
            .build();
        Ok(Arc::new(Self {
            cpu: CpuRuntime::new()?,
            running: Arc::new(Semaphore::new(limits.concurrent_max)),
            nodes,
            limits,
            base,
        }))
    }

    pub fn nodes(&self) -> &Arc<Nodes> {
        &self.nodes
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.limits.timeout_ms)
    }

    fn read_limits(&self) -> ReadLimits {
        ReadLimits {
            lookup_keys_max: self.limits.lookup_keys_max,
            read_parallelism: self.limits.read_parallelism,
            batch_size: self.limits.batch_size,
            filter_pushdown: self.limits.filter_pushdown,
        }
    }

    /// Plans `sql` (one read-only statement), with `params` bound when given.
    pub async fn plan(
        &self,
        sql: &str,
        params: Option<Vec<ScalarValue>>,
    ) -> Result<Planned, QueryError> {
        tokio::time::timeout(self.timeout(), self.plan_now(sql, params))
            .await
            .map_err(|_| QueryError::Timeout(self.limits.timeout_ms))?
    }

    async fn plan_now(
        &self,
        sql: &str,
        params: Option<Vec<ScalarValue>>,
    ) -> Result<Planned, QueryError> {
        let dialect = self.base.config().options().sql_parser.dialect;
        let mut statement = self.base.sql_to_statement(sql, &dialect)?;
        check_reads_only(&statement, sql)?;
        crate::placeholders::number_positional(&mut statement)?;
        let references = self.base.resolve_table_references(&statement)?;
        let wants_listing = references.iter().any(|r| {
            r.schema()
                .is_some_and(|s| s.eq_ignore_ascii_case("information_schema"))
                || matches!(&statement, datafusion::sql::parser::Statement::Statement(s)
                    if matches!(s.as_ref(), datafusion::sql::sqlparser::ast::Statement::ShowTables { .. }))
        });
        let listed = if wants_listing {
            Some(listing(&self.nodes).await.map_err(mink_error)?)
        } else {
            None
        };
        let catalogs = Arc::new(MemoryCatalogProviderList::new());
        catalogs.register_catalog(
            CATALOG.to_string(),
            Arc::new(MinkCatalog::new(
                self.nodes.clone(),
                self.read_limits(),
                listed,
            )),
        );
        let state = SessionStateBuilder::new_from_existing(self.base.clone())
            .with_catalog_list(catalogs)
            .build();
        let plan = state.statement_to_plan(statement).await?;
        check_read_only(&plan)?;
        let plan = match params {
            Some(values) => plan.with_param_values(ParamValues::from(values))?,
            None => plan,
        };
        Ok(Planned { state, plan })
    }

    /// Runs a planned statement: a stream of batches in [`Planned::schema`].
    ///
    /// The plan runs on the query runtime ([`CpuRuntime`]), not the one serving
    /// gRPC: an operator that computes for long between two yields (a big
    /// aggregation, a cross join) cannot stall the server, its timers or other
    /// queries' I/O. Its batches cross over a small channel; dropping the stream (the
    /// client went away, the timeout passed) aborts the task, which stops at its next
    /// yield point.
    pub async fn execute(&self, planned: Planned) -> Result<SendableRecordBatchStream, QueryError> {
        let permit = self
            .running
            .clone()
            .try_acquire_owned()
            .map_err(|_| QueryError::Busy(self.limits.concurrent_max))?;
        let schema = planned.schema();
        let deadline = tokio::time::Instant::now() + self.timeout();
        let timeout_ms = self.limits.timeout_ms;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch, DataFusionError>>(2);
        let task = self.cpu.spawn(async move {
            let run = async {
                let physical = planned.state.create_physical_plan(&planned.plan).await?;
                datafusion::physical_plan::execute_stream(physical, planned.state.task_ctx())
            };
            let mut stream = match run.await {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            while let Some(item) = stream.next().await {
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        let running = Running {
            rx,
            _task: AbortOnDrop(task),
            _permit: permit,
        };
        let out = schema.clone();
        let batches = futures::stream::unfold(Some(running), move |running| {
            let out = out.clone();
            async move {
                let mut running = running?;
                match tokio::time::timeout_at(deadline, running.rx.recv()).await {
                    Err(_) => Some((
                        Err(DataFusionError::External(Box::new(QueryError::Timeout(
                            timeout_ms,
                        )))),
                        None,
                    )),
                    Ok(None) => None,
                    Ok(Some(Ok(batch))) => Some((
                        to_schema(batch, &out).map_err(DataFusionError::from),
                        Some(running),
                    )),
                    Ok(Some(Err(e))) => Some((Err(e), None)),
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }

    /// Plans and runs `sql`, collecting every batch (tests, small answers).
    pub async fn collect(&self, sql: &str) -> Result<Vec<RecordBatch>, QueryError> {
        let planned = self.plan(sql, None).await?;
        let mut stream = self.execute(planned).await?;
        let mut out = vec![];
        while let Some(b) = stream.next().await {
            out.push(b?);
        }
        Ok(out)
    }
}

/// The session configuration of every statement.
fn session_config(limits: &QueryLimits) -> SessionConfig {
    SessionConfig::new()
        .with_default_catalog_and_schema(CATALOG, DEFAULT_SCHEMA)
        .with_create_default_catalog_and_schema(false)
        .with_information_schema(true)
        .with_batch_size(limits.batch_size)
        .set_bool("datafusion.sql_parser.map_string_types_to_utf8view", false)
        .set_bool(
            "datafusion.execution.parquet.schema_force_view_types",
            false,
        )
}

/// mink-query only reads: DDL, DML and session statements answer UNIMPLEMENTED.
fn check_read_only(plan: &LogicalPlan) -> Result<(), QueryError> {
    let what = match plan {
        LogicalPlan::Ddl(d) => d.name(),
        LogicalPlan::Dml(_) => "INSERT, UPDATE and DELETE",
        LogicalPlan::Copy(_) => "COPY",
        LogicalPlan::Statement(s) => match s {
            datafusion::logical_expr::Statement::Prepare(_) => return Ok(()),
            _ => s.name(),
        },
        _ => return Ok(()),
    };
    Err(QueryError::ReadOnly(what.to_string()))
}

/// A running query: its batches, its task and its slot, released together.
struct Running {
    rx: tokio::sync::mpsc::Receiver<Result<RecordBatch, DataFusionError>>,
    _task: AbortOnDrop,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The runtime queries execute on, apart from the one serving gRPC (one worker per
/// core).
pub struct CpuRuntime(Option<tokio::runtime::Runtime>);

impl CpuRuntime {
    fn new() -> Result<Self, QueryError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("mink-query-exec")
            .enable_all()
            .build()
            .map_err(|e| QueryError::Engine(DataFusionError::IoError(e)))?;
        Ok(Self(Some(runtime)))
    }

    fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.0
            .as_ref()
            .expect("the runtime lives until drop")
            .spawn(future)
    }
}

impl Drop for CpuRuntime {
    fn drop(&mut self) {
        // Dropping a runtime from inside another one would panic; let it wind down
        // on its own threads.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Refuses, before any table is resolved, a statement that is not a query: mink-query
/// only reads.
fn check_reads_only(
    statement: &datafusion::sql::parser::Statement,
    sql: &str,
) -> Result<(), QueryError> {
    use datafusion::sql::parser::Statement as Df;
    use datafusion::sql::sqlparser::ast::Statement as Sql;
    let reads = match statement {
        Df::Statement(s) => {
            matches!(
                s.as_ref(),
                Sql::Query(_)
                    | Sql::ExplainTable { .. }
                    | Sql::ShowTables { .. }
                    | Sql::ShowColumns { .. }
                    | Sql::ShowVariable { .. }
            ) || matches!(s.as_ref(), Sql::Explain { statement, .. } if matches!(statement.as_ref(), Sql::Query(_)))
        }
        Df::Explain(e) => return check_reads_only(&e.statement, sql),
        _ => false,
    };
    if reads {
        return Ok(());
    }
    let kind: Vec<String> = sql
        .split_whitespace()
        .take(2)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    Err(QueryError::ReadOnly(kind.join(" ")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A service with no node: it plans statements that name no table.
    pub(crate) fn service_for_test() -> Arc<QueryService> {
        QueryService::new(Nodes::new(vec![]), QueryLimits::default()).unwrap()
    }

    /// A planned statement that names no table (no node is asked).
    pub(crate) async fn planned_for_test(service: &QueryService) -> Planned {
        service.plan("SELECT 1 AS one", None).await.unwrap()
    }

    #[tokio::test]
    async fn statements_share_the_base_session_but_not_its_catalog() {
        let service = service_for_test();
        let a = service.plan("SELECT 1 AS one", None).await.unwrap();
        let b = service.plan("SELECT upper('x') AS u", None).await.unwrap();
        assert_eq!(a.schema().field(0).name(), "one");
        assert_eq!(b.schema().field(0).name(), "u");
        assert!(
            !Arc::ptr_eq(a.state.catalog_list(), b.state.catalog_list()),
            "each statement has a catalog of its own"
        );
        assert!(
            service.base.catalog_list().catalog(CATALOG).is_none(),
            "the base session never holds a statement's catalog"
        );
    }
}
