//! The admin HTTP endpoint: `/health` (200 when the node serves, 503 while it starts
//! or when it has lost the object store) and Prometheus `/metrics`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::service::NodeService;

/// The process's Prometheus recorder (installed once; every node of the process shares it).
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder().handle())
        })
        .clone()
}

/// What the endpoint reports on.
pub struct AdminState {
    pub ready: AtomicBool,
    pub service: OnceLock<Arc<NodeService>>,
    pub prometheus: PrometheusHandle,
}

impl AdminState {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            ready: AtomicBool::new(false),
            service: OnceLock::new(),
            prometheus: prometheus(),
        })
    }
}

async fn health(State(state): State<Arc<AdminState>>) -> (StatusCode, String) {
    let Some(service) = state
        .service
        .get()
        .filter(|_| state.ready.load(Ordering::Relaxed))
    else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"starting"}"#.into(),
        );
    };
    match service.health_problem() {
        None => (StatusCode::OK, r#"{"status":"serving"}"#.into()),
        Some(problem) => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "unavailable", "reason": problem}).to_string(),
        ),
    }
}

async fn metrics_page(State(state): State<Arc<AdminState>>) -> String {
    if let Some(service) = state.service.get() {
        service.record_gauges().await;
    }
    state.prometheus.render()
}

/// Serves the endpoint until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_page))
        .with_state(state);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("the admin endpoint stopped: {e}");
    }
}
