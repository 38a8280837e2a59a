//! The admin HTTP endpoint: `/health` (200 when the node serves, 503 while it starts
//! or when it has lost the object store), Prometheus `/metrics`, the console at `/`
//! and its JSON API under `/api/v1` (`crate::console`); with
//! `testing.fault_injection`, `POST /fault` (a test facility of the chaos harness).

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
            let handle = object_store_buckets(PrometheusBuilder::new())
                .install_recorder()
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder().handle());
            zero_counters();
            handle
        })
        .clone()
}

/// Counters of things that should not happen are reported from the start, at 0, so
/// that a dashboard (deploy/grafana) and an alert see a series before the first event.
fn zero_counters() {
    use mink_wal::accounting::{Op, Purpose};
    for name in [
        "mink_wal_upload_retries_total",
        "mink_wal_upload_failures_total",
        "mink_node_writes_refused_overloaded_total",
        "mink_kv_store_write_failures_total",
        "mink_kv_store_reopens_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for source in ["kept", "decoded"] {
        metrics::counter!("mink_kv_before_images_total", "source" => source).increment(0);
    }
    for op in Op::ALL {
        for purpose in Purpose::ALL {
            metrics::counter!(
                "mink_object_store_failures_total",
                "op" => op.as_str(),
                "purpose" => purpose.as_str()
            )
            .increment(0);
        }
    }
}

/// Object-store latency as a histogram (aggregatable across nodes), from 1 ms to 10 s;
/// other histograms render as summaries.
fn object_store_buckets(builder: PrometheusBuilder) -> PrometheusBuilder {
    const SECONDS: [f64; 14] = [
        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
    ];
    let matcher = metrics_exporter_prometheus::Matcher::Full(
        "mink_object_store_request_duration_seconds".into(),
    );
    match builder.set_buckets_for_metric(matcher, &SECONDS) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("object-store latency buckets: {e}");
            PrometheusBuilder::new()
        }
    }
}

/// What the endpoint reports on.
pub struct AdminState {
    pub ready: AtomicBool,
    /// The fault injector in front of the object store, when `testing.fault_injection`.
    pub fault: OnceLock<mink_wal::fault::FaultyStore>,
    pub service: OnceLock<Arc<NodeService>>,
    pub prometheus: PrometheusHandle,
    /// The console's cost samples.
    pub cost: crate::console::cost::CostHistory,
    /// The console's Flight client to this node.
    pub client: tokio::sync::OnceCell<mink_flight::MinkClient>,
}

impl AdminState {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            ready: AtomicBool::new(false),
            fault: OnceLock::new(),
            service: OnceLock::new(),
            prometheus: prometheus(),
            cost: Default::default(),
            client: tokio::sync::OnceCell::new(),
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
            serde_json::json!({"status": "unavailable", "problem": problem}).to_string(),
        ),
    }
}

async fn metrics_page(State(state): State<Arc<AdminState>>) -> String {
    let Some(service) = state.service.get() else {
        return state.prometheus.render();
    };
    service.record_gauges().await;
    let mut text = state.prometheus.render();
    text.push_str(&service.consumer_lag_metrics().await);
    text
}

/// What `POST /fault` sets: every field optional, absent means off.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FaultBody {
    put_failure_rate: f64,
    put_ambiguous_rate: f64,
    put_conflict_rate: f64,
    get_failure_rate: f64,
    put_latency_ms: u64,
    jitter_ms: u64,
    /// Every request fails at once.
    down: bool,
    seed: u64,
}

/// Replaces the injected faults (an empty object turns them off).
async fn set_fault(State(state): State<Arc<AdminState>>, body: String) -> (StatusCode, String) {
    let Some(faulty) = state.fault.get() else {
        return (
            StatusCode::NOT_FOUND,
            "fault injection is off (testing.fault_injection)".into(),
        );
    };
    let body: FaultBody =
        match serde_json::from_str(if body.trim().is_empty() { "{}" } else { &body }) {
            Ok(b) => b,
            Err(e) => return (StatusCode::BAD_REQUEST, format!("fault body: {e}")),
        };
    let rates = [
        body.put_failure_rate,
        body.put_ambiguous_rate,
        body.put_conflict_rate,
        body.get_failure_rate,
    ];
    if rates.iter().any(|r| !(0.0..=1.0).contains(r)) {
        return (StatusCode::BAD_REQUEST, "rates are between 0 and 1".into());
    }
    faulty.set_config(mink_wal::fault::FaultConfig {
        put_latency: std::time::Duration::from_millis(body.put_latency_ms),
        jitter: std::time::Duration::from_millis(body.jitter_ms),
        put_failure_rate: body.put_failure_rate,
        put_ambiguous_rate: body.put_ambiguous_rate,
        put_conflict_rate: body.put_conflict_rate,
        get_failure_rate: body.get_failure_rate,
        seed: body.seed,
        ..Default::default()
    });
    faulty.set_down(body.down);
    tracing::warn!(?body, "injected object-store faults changed");
    (StatusCode::OK, "ok".into())
}

/// Serves the endpoint until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let sampler = tokio::spawn(crate::console::sample_costs(state.clone()));
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_page))
        .route("/fault", axum::routing::post(set_fault))
        .merge(crate::console::routes())
        .with_state(state);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("the admin endpoint stopped: {e}");
    }
    sampler.abort();
}
