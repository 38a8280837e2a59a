//! The Flight SQL door: a thin adapter from Flight SQL's commands to the
//! [`QueryService`].
//!
//! Stateless: a statement's ticket and a prepared statement's handle carry the SQL,
//! its bound parameters and the metadata index its planner had seen ([`Handle`]), so
//! any mink-query instance behind one address serves any of them, and closing a
//! prepared statement frees nothing. Planning runs at GetFlightInfo (to answer the
//! schema) and again at DoGet, which fixes each bucket's cut. Endpoints carry no
//! location: the client reads them on the connection it has.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use futures::{Stream, StreamExt, TryStreamExt};
use mink_flight::actions::{Empty, ListDatabases, TableInfo, TableRef};
use mink_types::TablePath;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::bindings::Bindings;
use crate::catalog::{CATALOG, listing};
use crate::engine::arrow::ipc::writer::IpcWriteOptions;
use crate::engine::flight::encode::FlightDataEncoderBuilder;
use crate::engine::flight::error::FlightError;
use crate::engine::flight::flight_service_server::FlightService;
use crate::engine::flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use crate::engine::flight::sql::{
    ActionBeginSavepointRequest, ActionBeginSavepointResult, ActionBeginTransactionRequest,
    ActionBeginTransactionResult, ActionCancelQueryRequest, ActionCancelQueryResult,
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, ActionCreatePreparedSubstraitPlanRequest,
    ActionEndSavepointRequest, ActionEndTransactionRequest, Any, CommandGetCatalogs,
    CommandGetCrossReference, CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys,
    CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandGetXdbcTypeInfo, CommandPreparedStatementQuery, CommandPreparedStatementUpdate,
    CommandStatementIngest, CommandStatementQuery, CommandStatementSubstraitPlan,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use crate::engine::flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket,
};
use crate::engine::schema_of;
use crate::errors::{QueryError, engine_status};
use crate::handle::Handle;
use crate::plans::Plans;
use crate::service::QueryService;
use crate::sqlmeta::{
    FOREIGN_KEYS_SCHEMA, PRIMARY_KEYS_SCHEMA, SQL_INFO, XDBC_TYPES, no_foreign_keys,
    primary_key_rows,
};

type DoGetStream =
    Pin<Box<dyn Stream<Item = Result<crate::engine::flight::FlightData, Status>> + Send>>;

/// The Flight SQL server over a [`QueryService`].
#[derive(Clone)]
pub struct FlightSqlServer {
    service: Arc<QueryService>,
    /// Plans made for a GetFlightInfo or a preparation, for the DoGet that follows.
    plans: Arc<Plans>,
    /// Parameters bound to prepared handles, for clients that execute the handle
    /// they prepared rather than the one the binding answered.
    bindings: Arc<Bindings>,
}

impl FlightSqlServer {
    pub fn new(service: Arc<QueryService>) -> Self {
        Self {
            service,
            plans: Arc::default(),
            bindings: Arc::default(),
        }
    }

    /// The server as a tonic service (no message-size limit on what clients send:
    /// parameter batches are checked by the handle's own bound).
    pub fn into_service(
        self,
    ) -> crate::engine::flight::flight_service_server::FlightServiceServer<Self> {
        crate::engine::flight::flight_service_server::FlightServiceServer::new(self)
            .max_decoding_message_size(16 << 20)
            .max_encoding_message_size(usize::MAX)
    }

    async fn plan(&self, handle: &Handle) -> Result<crate::service::Planned, Status> {
        self.service.nodes().saw_index(handle.applied_index);
        let params = handle.parameters().map_err(Status::from)?;
        Ok(self.service.plan(&handle.sql, params).await?)
    }

    fn info(
        &self,
        schema: &SchemaRef,
        ticket: Vec<u8>,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(format!("the schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// Runs the statement of `handle` (its bytes as a client sent them): the plan
    /// kept for it when there is one, a new one otherwise.
    async fn run(&self, handle: &[u8]) -> Result<Response<DoGetStream>, Status> {
        let planned = match self.plans.take(handle) {
            Some(planned) => planned,
            None => self.plan(&Handle::decode(handle)?).await?,
        };
        let schema = planned.schema();
        let stream = self.service.execute(planned).await?;
        let batches = stream.map_err(|e| FlightError::Tonic(Box::new(engine_status(&e))));
        Ok(Response::new(encode(schema, batches)))
    }

    fn statement(&self, sql: String, params: Option<Bytes>) -> Handle {
        Handle {
            id: crate::handle::next_statement_id(),
            sql,
            params,
            applied_index: self.service.nodes().applied_index(),
            schema: None,
        }
    }

    async fn table_info(&self, db: &str, table: &str) -> Result<TableInfo, Status> {
        let path = TablePath::parse(&format!("{db}.{table}"))
            .map_err(|e| Status::not_found(format!("table {db}.{table}: {e}")))?;
        let answer = self
            .service
            .nodes()
            .call(&mink_flight::actions::GetTable(TableRef { path }))
            .await
            .map_err(QueryError::from)?;
        Ok(TableInfo::from_answer(answer).map_err(QueryError::from)?)
    }
}

fn encode(
    schema: SchemaRef,
    batches: impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static,
) -> DoGetStream {
    FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches)
        .map_err(Status::from)
        .boxed()
}

fn one<E: std::fmt::Display>(
    batch: Result<RecordBatch, E>,
) -> Result<Response<DoGetStream>, Status> {
    let batch = batch.map_err(|e| Status::internal(e.to_string()))?;
    let schema = batch.schema();
    Ok(Response::new(encode(
        schema,
        futures::stream::iter([Ok(batch)]),
    )))
}

fn schema_bytes(schema: &SchemaRef) -> Result<Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: datafusion::arrow::error::ArrowError| Status::internal(e.to_string()))?;
    Ok(bytes)
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!(
        "not implemented: {what}; mink-query serves read-only SQL (queries, prepared queries, catalog browsing)"
    ))
}

/// The parameters bound by a DoPut: one row.
async fn parameters(stream: PeekableFlightDataStream) -> Result<Vec<RecordBatch>, Status> {
    let batches: Vec<RecordBatch> =
        crate::engine::flight::decode::FlightRecordBatchStream::new_from_flight_data(
            // The stream itself, not `into_inner`: that drops the message the server
            // peeked at, which is the schema.
            stream.map_err(FlightError::from),
        )
        .try_collect()
        .await
        .map_err(|e| Status::invalid_argument(format!("the parameters: {e}")))?;
    Ok(batches)
}

#[tonic::async_trait]
impl FlightSqlService for FlightSqlServer {
    type FlightService = FlightSqlServer;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if query.transaction_id.is_some() {
            return Err(unimplemented("transactions"));
        }
        let handle = self.statement(query.query, None);
        let planned = self.plan(&handle).await?;
        let schema = planned.schema();
        let ticket = TicketStatementQuery {
            statement_handle: handle.encode(),
        };
        self.plans.keep(ticket.statement_handle.clone(), planned);
        self.info(
            &schema,
            ticket.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.run(&ticket.statement_handle).await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        mut cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        cmd.prepared_statement_handle = self.bindings.resolve(&cmd.prepared_statement_handle);
        let handle = Handle::decode(&cmd.prepared_statement_handle)?;
        if let Some(schema) = handle.schema.clone() {
            // Prepared without parameters: the schema planned then (DoGet takes that
            // plan, or plans again, and fixes the cut).
            let info = FlightInfo {
                schema,
                ..FlightInfo::new()
            }
            .with_endpoint(
                FlightEndpoint::new().with_ticket(Ticket::new(cmd.as_any().encode_to_vec())),
            )
            .with_descriptor(request.into_inner());
            return Ok(Response::new(info));
        }
        let planned = self.plan(&handle).await?;
        let schema = planned.schema();
        self.plans
            .keep(cmd.prepared_statement_handle.clone(), planned);
        self.info(&schema, cmd.as_any().encode_to_vec(), request.into_inner())
    }

    async fn do_get_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.run(&self.bindings.resolve(&cmd.prepared_statement_handle))
            .await
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        if query.transaction_id.is_some() {
            return Err(unimplemented("transactions"));
        }
        let mut handle = self.statement(query.query, None);
        let planned = self.plan(&handle).await?;
        let dataset_schema = schema_bytes(&planned.schema())?;
        let parameters = planned.parameters()?;
        let parameter_schema = schema_bytes(&parameters)?;
        let without_parameters = parameters.fields().is_empty();
        if without_parameters {
            handle.schema = Some(dataset_schema.clone());
        }
        let prepared_statement_handle = handle.encode();
        if without_parameters {
            // ADBC prepares every statement it executes: its DoGet follows at once.
            self.plans.keep(prepared_statement_handle.clone(), planned);
        }
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle,
            dataset_schema,
            parameter_schema,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        // Handles are stateless: only a binding kept for an older client goes.
        self.bindings.forget(&query.prepared_statement_handle);
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let handle = Handle::decode(&cmd.prepared_statement_handle)?;
        let batches = parameters(request.into_inner()).await?;
        let bound = Handle::bind(handle, &batches)?.encode();
        self.bindings
            .remember(cmd.prepared_statement_handle, bound.clone());
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(bound),
        })
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut b = query.into_builder();
        b.append(CATALOG);
        one(b.build())
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let databases = self
            .service
            .nodes()
            .call(&ListDatabases(Empty {}))
            .await
            .map_err(QueryError::from)?;
        let mut b = query.into_builder();
        for db in databases {
            b.append(CATALOG, db);
        }
        one(b.build())
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let include_schema = query.include_schema;
        let listed = listing(self.service.nodes())
            .await
            .map_err(QueryError::from)?;
        let mut b = query.into_builder();
        let empty = datafusion::arrow::datatypes::Schema::empty();
        for (db, tables) in listed {
            for table in tables {
                if include_schema {
                    let info = match self.table_info(&db, &table).await {
                        Ok(info) => info,
                        // Dropped since it was listed.
                        Err(s) if s.code() == tonic::Code::NotFound => continue,
                        Err(s) => return Err(s),
                    };
                    let schema = schema_of(&info.descriptor.schema).map_err(QueryError::from)?;
                    b.append(CATALOG, &db, &table, "TABLE", &schema)
                        .map_err(|e| Status::internal(e.to_string()))?;
                } else {
                    b.append(CATALOG, &db, &table, "TABLE", &empty)
                        .map_err(|e| Status::internal(e.to_string()))?;
                }
            }
        }
        one(b.build())
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut b = query.into_builder();
        b.append("TABLE");
        one(b.build())
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&SQL_INFO).schema();
        self.info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one(query.into_builder(&SQL_INFO).build())
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(
            &PRIMARY_KEYS_SCHEMA,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        if query.catalog.as_deref().is_some_and(|c| c != CATALOG) {
            return one(primary_key_rows(CATALOG, "", "", &[]));
        }
        let Some(db) = query.db_schema.as_deref() else {
            return Err(Status::invalid_argument(
                "GetPrimaryKeys needs db_schema: the Mink database of the table",
            ));
        };
        let info = self.table_info(db, &query.table).await?;
        one(primary_key_rows(
            CATALOG,
            db,
            &query.table,
            &info.descriptor.primary_key,
        ))
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(
            &FOREIGN_KEYS_SCHEMA,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one::<Status>(Ok(no_foreign_keys()))
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(
            &FOREIGN_KEYS_SCHEMA,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one::<Status>(Ok(no_foreign_keys()))
    }

    async fn get_flight_info_cross_reference(
        &self,
        query: CommandGetCrossReference,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(
            &FOREIGN_KEYS_SCHEMA,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_cross_reference(
        &self,
        _query: CommandGetCrossReference,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one::<Status>(Ok(no_foreign_keys()))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder(&XDBC_TYPES).schema();
        self.info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one(query.into_builder(&XDBC_TYPES).build())
    }

    async fn get_flight_info_substrait_plan(
        &self,
        _query: CommandStatementSubstraitPlan,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(unimplemented("Substrait plans"))
    }

    async fn do_put_statement_update(
        &self,
        _ticket: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(unimplemented("updates (CommandStatementUpdate)"))
    }

    async fn do_put_statement_ingest(
        &self,
        _ticket: CommandStatementIngest,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(unimplemented(
            "bulk ingestion (write through a node: Flight DoPut or Kafka)",
        ))
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(unimplemented("prepared updates"))
    }

    async fn do_put_substrait_plan(
        &self,
        _query: CommandStatementSubstraitPlan,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(unimplemented("Substrait plans"))
    }

    async fn do_action_create_prepared_substrait_plan(
        &self,
        _query: ActionCreatePreparedSubstraitPlanRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        Err(unimplemented("Substrait plans"))
    }

    async fn do_action_begin_transaction(
        &self,
        _query: ActionBeginTransactionRequest,
        _request: Request<Action>,
    ) -> Result<ActionBeginTransactionResult, Status> {
        Err(unimplemented("transactions"))
    }

    async fn do_action_end_transaction(
        &self,
        _query: ActionEndTransactionRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        Err(unimplemented("transactions"))
    }

    async fn do_action_begin_savepoint(
        &self,
        _query: ActionBeginSavepointRequest,
        _request: Request<Action>,
    ) -> Result<ActionBeginSavepointResult, Status> {
        Err(unimplemented("savepoints"))
    }

    async fn do_action_end_savepoint(
        &self,
        _query: ActionEndSavepointRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        Err(unimplemented("savepoints"))
    }

    async fn do_action_cancel_query(
        &self,
        _query: ActionCancelQueryRequest,
        _request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        Err(unimplemented(
            "CancelQuery (a query is cancelled when its client stops reading it)",
        ))
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Err(Status::invalid_argument(format!(
            "not a Flight SQL ticket mink-query issued: {}",
            message.type_url
        )))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// Parameter values of a bound batch (row 0).
///
/// A union value (flightsql-dbapi sends every parameter as a dense union of the
/// types a Python value may have) is the value of its member.
pub fn row_values(batch: &RecordBatch) -> Result<Vec<ScalarValue>, QueryError> {
    batch
        .columns()
        .iter()
        .map(|c| {
            let value = ScalarValue::try_from_array(c, 0).map_err(QueryError::from)?;
            Ok(match value {
                ScalarValue::Union(Some((_, member)), _, _) => *member,
                ScalarValue::Union(None, _, _) => ScalarValue::Null,
                other => other,
            })
        })
        .collect()
}
