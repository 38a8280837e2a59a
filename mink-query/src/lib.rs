//! `mink-query`: Flight SQL over Apache DataFusion, a client of the Mink nodes.
//!
//! A statement is planned against the catalog the nodes have now ([`catalog`]), each
//! table a [`table::MinkTable`] whose reads ([`access`], [`exec`]) go to the nodes over
//! Flight ([`nodes`]); the Flight SQL door ([`flightsql`]) is a thin adapter over the
//! [`service::QueryService`]. Nothing here touches object storage or tablets.
//!
//! - [`engine`]: the one place that names the Arrow and DataFusion versions.
//! - [`config`]: `mink-query.toml`, `MINK_QUERY_*`.
//! - [`merge`]: a primary-key bucket's state from its snapshot and changelog.
//! - [`handle`]: stateless statement handles; [`plans`]: a plan kept for the DoGet
//!   that follows its GetFlightInfo or preparation; [`bindings`]: parameters bound to
//!   a prepared handle, for clients that execute the handle they prepared.
//! - [`placeholders`]: drivers' `?` parameters numbered as DataFusion binds them.
//! - [`sqlmeta`]: GetSqlInfo, GetXdbcTypeInfo and key-command schemas.
//! - [`errors`]: errors and their gRPC statuses.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod access;
pub mod bindings;
pub mod catalog;
pub mod config;
pub mod engine;
pub mod errors;
pub mod exec;
pub mod flightsql;
pub mod handle;
pub mod merge;
pub mod nodes;
pub mod placeholders;
pub mod plans;
pub mod pushdown;
pub mod service;
pub mod sqlmeta;
pub mod table;

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_stream_compat::TcpIncoming;

pub use config::QueryConfig;

/// A running mink-query.
pub struct QueryServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl QueryServer {
    /// Binds `config.listen` and serves until [`QueryServer::stop`].
    pub async fn start(config: QueryConfig) -> anyhow::Result<Self> {
        let nodes = nodes::Nodes::with_leader_wait(
            config.nodes.clone(),
            std::time::Duration::from_millis(config.query.leader_wait_ms),
        );
        match nodes.discover().await {
            Ok(n) => tracing::info!(nodes = n, "found the cluster"),
            // The nodes may come later: every call tries the configured ones again.
            Err(e) => tracing::warn!("no node answered yet ({e}); serving anyway"),
        }
        let service = service::QueryService::new(nodes, config.query.clone())?;
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = flightsql::FlightSqlServer::new(service).into_service();
        // Small answers (a point query's) must not wait out Nagle and delayed ACKs.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        tracing::info!("Flight SQL listening on {addr}");
        Ok(Self { addr, task, stop })
    }

    /// Stops serving and waits for the server to end.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

mod tokio_stream_compat {
    pub use tonic::transport::server::TcpIncoming;
}
