//! The console: a read-only web UI at `/` of the admin endpoint, drawn in the browser
//! from the JSON API under `/api/v1` that scripts can use too (docs/operations.md).
//!
//! - [`assets`]: the page, its script and the vendored libraries, embedded;
//! - [`cost`]: samples of the node's own counters, as rates and prices;
//! - [`data`]: rows of a table — the newest, a live tail, a lookup — read through
//!   the node's own Flight API as any client would (redirects included);
//! - this file: the routes, and errors as JSON.
//!
//! The cluster, tables and groups views are the service's (`service::console`): the
//! HTTP layer only parses the path and query and encodes the answer. Nothing here
//! writes.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mink_types::{DatabaseName, MinkError, TableName, TablePath};
use serde_json::{Value, json};

use crate::admin::AdminState;
use crate::service::NodeService;

mod assets;
pub mod cost;
mod data;

/// An error as the API answers it: `{"error": {"code": ..., "message": ...}}`.
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_argument",
            message: message.into(),
        }
    }
}

impl From<MinkError> for ApiError {
    fn from(e: MinkError) -> Self {
        let status = match &e {
            MinkError::NotFound(_) => StatusCode::NOT_FOUND,
            MinkError::InvalidArgument { .. }
            | MinkError::SchemaMismatch(_)
            | MinkError::OffsetOutOfRange { .. }
            | MinkError::LimitExceeded { .. } => StatusCode::BAD_REQUEST,
            MinkError::NotLeader { .. }
            | MinkError::Unavailable(_)
            | MinkError::StorageFailure(_)
            | MinkError::Fenced(_) => StatusCode::SERVICE_UNAVAILABLE,
            MinkError::Unimplemented(_) => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status,
            code: e.kind(),
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}

pub(crate) type ApiResult = Result<axum::Json<Value>, ApiError>;

/// The console's routes (merged into the admin endpoint's).
pub fn routes() -> Router<Arc<AdminState>> {
    Router::new()
        .route("/", get(index))
        .route("/console/{*path}", get(asset))
        .route("/api/v1", get(api_index))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/tables", get(tables))
        .route("/api/v1/tables/{db}/{table}", get(table))
        .route("/api/v1/tables/{db}/{table}/rows", get(data::rows))
        .route("/api/v1/tables/{db}/{table}/tail", get(data::tail))
        .route("/api/v1/tables/{db}/{table}/lookup", get(data::lookup))
        .route("/api/v1/groups", get(groups))
        .route("/api/v1/cost", get(cost))
        .route("/api/v1/{*rest}", axum::routing::any(api_not_found))
}

/// The paths the API serves (`GET /api/v1`, and the answer to a path it does not).
const ENDPOINTS: &[&str] = &[
    "/api/v1/cluster",
    "/api/v1/nodes",
    "/api/v1/tables",
    "/api/v1/tables/{database}/{table}",
    "/api/v1/tables/{database}/{table}/rows?limit=&bucket=&partition=",
    "/api/v1/tables/{database}/{table}/tail?from=BUCKET@OFFSET,...&partition=&wait_ms=",
    "/api/v1/tables/{database}/{table}/lookup?key=JSON",
    "/api/v1/groups",
    "/api/v1/cost",
];

async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        assets::INDEX,
    )
        .into_response()
}

async fn asset(Path(path): Path<String>) -> Response {
    match assets::file(&path) {
        Some((content_type, bytes)) => (
            [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            bytes,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("the console has no file {path:?}"),
        )
            .into_response(),
    }
}

async fn api_index() -> axum::Json<Value> {
    axum::Json(json!({ "endpoints": ENDPOINTS }))
}

async fn api_not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "no such API path {:?}; GET /api/v1 lists the endpoints",
        uri.path()
    ))
}

/// The node's service, or 503 while the node starts.
pub(crate) fn service(state: &AdminState) -> Result<Arc<NodeService>, ApiError> {
    state
        .service
        .get()
        .filter(|_| state.ready.load(std::sync::atomic::Ordering::Relaxed))
        .cloned()
        .ok_or(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: "the node is starting".into(),
        })
}

/// A table path from the URL's two segments.
pub(crate) fn table_path(db: &str, table: &str) -> Result<TablePath, ApiError> {
    let database = DatabaseName::new(db.to_string())
        .map_err(|e| ApiError::bad_request(format!("database {db:?}: {e}")))?;
    let name = TableName::new(table)
        .map_err(|e| ApiError::bad_request(format!("table {table:?}: {e}")))?;
    Ok(TablePath::new(database, name))
}

async fn cluster(State(state): State<Arc<AdminState>>) -> ApiResult {
    Ok(axum::Json(service(&state)?.cluster_view().await))
}

async fn nodes(State(state): State<Arc<AdminState>>) -> ApiResult {
    let cluster = service(&state)?.cluster_view().await;
    Ok(axum::Json(json!({ "nodes": cluster["nodes"] })))
}

async fn tables(State(state): State<Arc<AdminState>>) -> ApiResult {
    Ok(axum::Json(service(&state)?.tables_view().await))
}

async fn table(
    State(state): State<Arc<AdminState>>,
    Path((db, table)): Path<(String, String)>,
) -> ApiResult {
    let path = table_path(&db, &table)?;
    Ok(axum::Json(service(&state)?.table_view(&path).await?))
}

async fn groups(State(state): State<Arc<AdminState>>) -> ApiResult {
    let service = service(&state)?;
    let groups = service
        .kafka_groups(mink_flight::actions::KafkaGroups::default())
        .await?;
    Ok(axum::Json(
        json!({ "kafka_database": service.kafka_database_name(), "groups": groups }),
    ))
}

async fn cost(State(state): State<Arc<AdminState>>) -> ApiResult {
    Ok(axum::Json(state.cost.report()))
}

/// Samples the cost counters every [`cost::EVERY`], for as long as the endpoint runs.
pub(crate) async fn sample_costs(state: Arc<AdminState>) {
    let mut every = tokio::time::interval(cost::EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(service) = state.service.get() else {
            continue;
        };
        let report = service.streams().stores().accounting().map(|a| a.report());
        service.record_gauges().await;
        let rendered = state.prometheus.render();
        state
            .cost
            .record(crate::service::now_ms(), report.as_ref(), &rendered);
    }
}
