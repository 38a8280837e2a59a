//! Start-up, serving and shutdown of a node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use futures::StreamExt;
use mink_flight::FlightServer;
use mink_meta::MetaNode;
use mink_wal::{Accounting, Purpose, Stores, StreamStore};
use object_store::ObjectStore;
use object_store::path::Path;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::MinkConfig;
use crate::service::NodeService;

/// A running node.
pub struct Node {
    pub config: MinkConfig,
    /// The object store as given (behind the fault injector with
    /// `testing.fault_injection`), uncounted: for tests and tools that inspect it.
    pub store: Arc<dyn ObjectStore>,
    /// Every object-store request this node makes, by operation and purpose.
    pub accounting: Arc<Accounting>,
    pub meta: MetaNode,
    service: Arc<NodeService>,
    /// The address the Flight listener is bound to.
    pub flight_addr: SocketAddr,
    /// The address the admin HTTP endpoint is bound to.
    pub admin_addr: SocketAddr,
    /// The address the Kafka listener is bound to (`None` with `kafka.enabled` off).
    pub kafka_addr: Option<SocketAddr>,
    /// The address the Iceberg REST catalog is bound to (`None` with
    /// `iceberg_rest.enabled` off).
    pub iceberg_rest_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Node {
    /// Creates the data directory, opens the object store and proves it answers,
    /// binds the Flight listener, joins the cluster (metadata log, WAL) and serves.
    pub async fn start(config: MinkConfig) -> anyhow::Result<Self> {
        if config.testing.fault_injection {
            return Self::start_faulty(config).await;
        }
        let store = mink_wal::open_object_store(&config.object_store)?;
        Self::start_with_store(config, store).await
    }

    /// [`Node::start`] with the object store behind a fault injector that the admin
    /// endpoint's `POST /fault` configures (a test facility; `testing.fault_injection`).
    async fn start_faulty(config: MinkConfig) -> anyhow::Result<Self> {
        let store = mink_wal::open_object_store(&config.object_store)?;
        let faulty = mink_wal::fault::FaultyStore::new(store.clone(), Default::default());
        // The injector above the accounting: what it fails never reaches the store and
        // is not a request.
        let accounting = Accounting::new();
        let stores = Stores::with_faults(store, accounting.clone(), &faulty);
        Self::start_inner(
            config,
            Arc::new(faulty.clone()),
            stores,
            accounting,
            Some(faulty),
        )
        .await
    }

    /// [`Node::start`] on a given object store (benchmarks wrap one with latency).
    /// Requests to it are counted as the node's (faults the given store injects count
    /// as failed requests).
    pub async fn start_with_store(
        config: MinkConfig,
        store: Arc<dyn ObjectStore>,
    ) -> anyhow::Result<Self> {
        let accounting = Accounting::new();
        let stores = Stores::accounted(store.clone(), accounting.clone());
        Self::start_inner(config, store, stores, accounting, None).await
    }

    /// Starts a node, in order: the data directory and a probe of the store; the
    /// listeners (the admin endpoint first, answering 503 until the node serves; the
    /// Kafka listener before the node registers, so that it advertises the bound
    /// address); the metadata node, the WAL and the KV store under one service; the
    /// node's duties; then Flight and Kafka are served.
    async fn start_inner(
        config: MinkConfig,
        store: Arc<dyn ObjectStore>,
        stores: Stores,
        accounting: Arc<Accounting>,
        fault: Option<mink_wal::fault::FaultyStore>,
    ) -> anyhow::Result<Self> {
        prepare(&config, &stores).await?;
        let (shutdown, _) = watch::channel(false);
        let listeners = Listeners::bind(&config).await?;
        let (admin_addr, flight_addr, kafka_addr) = listeners.addresses()?;
        let admin = crate::admin::AdminState::new();
        if let Some(faulty) = fault {
            tracing::warn!(
                "testing.fault_injection is on: POST /fault injects object-store faults"
            );
            let _ = admin.fault.set(faulty);
        }
        let mut tasks = vec![tokio::spawn(crate::admin::serve(
            listeners.admin,
            admin.clone(),
            stopped(&shutdown),
        ))];
        let advertised = config
            .advertised
            .flight
            .clone()
            .unwrap_or_else(|| flight_addr.to_string());
        let advertised_kafka = match (&config.advertised.kafka, kafka_addr) {
            (Some(a), _) => a.clone(),
            (None, Some(bound)) => bound.to_string(),
            // No listener: nothing to advertise, and no broker entry for this node.
            (None, None) => String::new(),
        };
        // The WAL first: registering makes this node a candidate for buckets (a dead
        // node's among them), and it can open none before its WAL generation is
        // claimed and the stream metadata read (seconds on a loaded store; chaos seed
        // 84: five buckets given to a joining node 3.4 s before it could serve).
        let streams = StreamStore::open(stores.clone(), &config.node_id, config.wal.clone())
            .await
            .map_err(|e| anyhow::anyhow!("starting the WAL: {e}"))?;
        let meta = MetaNode::open(
            stores.clone(),
            &config.node_id,
            &advertised,
            &advertised_kafka,
            config.meta.clone(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("joining the cluster: {e}"))?;
        let kv = mink_kv::open_kv_store(config.kv.backend, &config.data_dir.join("kv"))
            .map_err(|e| anyhow::anyhow!("opening the KV store: {e}"))?;
        let service = Arc::new(NodeService::new(
            config.clone(),
            meta.clone(),
            streams.clone(),
            kv,
        ));
        let _ = admin.service.set(service.clone());
        tasks.extend(spawn_duties(&service, &meta, stores, &config, &shutdown));
        tasks.push(serve_flight(listeners.flight, &service, &config, &shutdown));
        if let Some(listener) = listeners.kafka {
            let handler: Arc<dyn mink_kafka::KafkaHandler> = service.clone();
            tasks.push(tokio::spawn(mink_kafka::server::serve(
                listener,
                handler,
                config.kafka.clone(),
                service.kafka_coordinator(),
                stopped(&shutdown),
            )));
        }
        let iceberg_rest_addr = match listeners.iceberg_rest {
            Some(listener) => {
                let addr = listener.local_addr()?;
                tasks.push(tokio::spawn(crate::iceberg_rest::serve(
                    listener,
                    service.clone(),
                    stopped(&shutdown),
                )));
                Some(addr)
            }
            None => None,
        };
        admin
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(addr = %flight_addr, "Flight listening on {flight_addr}");
        if let Some(addr) = kafka_addr {
            tracing::info!(addr = %addr, "Kafka listening on {addr}");
        }
        if let Some(addr) = iceberg_rest_addr {
            tracing::info!(addr = %addr, "Iceberg REST catalog listening on {addr}");
        }
        tracing::info!(addr = %admin_addr, "admin HTTP listening on {admin_addr} (/health, /metrics)");
        Ok(Self {
            config,
            store,
            accounting,
            meta,
            service,
            flight_addr,
            admin_addr,
            kafka_addr,
            iceberg_rest_addr,
            shutdown,
            tasks,
        })
    }

    /// The node's current s3stream service (it changes when a failed WAL is replaced).
    pub fn streams(&self) -> StreamStore {
        self.service.streams()
    }

    /// Stops serving, closes every stream cleanly (a handover: the next owner needs
    /// no fence), releases the lease and stops the metadata tasks.
    pub async fn stop(self) {
        self.shutdown.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
        if let Err(e) = self.service.streams().close_all().await {
            tracing::warn!("closing streams: {e}");
        }
        self.meta.shutdown(true).await;
    }
}

/// Resolves once `shutdown` says stop.
fn stopped(shutdown: &watch::Sender<bool>) -> impl std::future::Future<Output = ()> + use<> {
    let mut rx = shutdown.subscribe();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// Creates the data directory and proves, with one cheap request, that the object
/// store is reachable and the credentials work.
async fn prepare(config: &MinkConfig, stores: &Stores) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir).map_err(|e| {
        anyhow::anyhow!(
            "data_dir {}: cannot create it: {e}",
            config.data_dir.display()
        )
    })?;
    let probe = Path::from("meta/nodes");
    let mut listing = stores.get(Purpose::Meta).list(Some(&probe));
    if let Some(Err(e)) = listing.next().await {
        anyhow::bail!(
            "object store {} is not usable: {e}",
            config.object_store.url
        );
    }
    Ok(())
}

/// The node's listeners, bound (`None` for Kafka with `kafka.enabled` off, and for
/// the Iceberg REST catalog with `iceberg_rest.enabled` off).
struct Listeners {
    admin: TcpListener,
    flight: TcpListener,
    kafka: Option<TcpListener>,
    iceberg_rest: Option<TcpListener>,
}

impl Listeners {
    async fn bind(config: &MinkConfig) -> anyhow::Result<Self> {
        let bind = |name: &'static str, addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("listeners.{name} {addr}: cannot bind: {e}"))
        };
        let admin = bind("admin", config.listeners.admin).await?;
        let flight = bind("flight", config.listeners.flight).await?;
        let kafka = match config.kafka.enabled {
            true => Some(bind("kafka", config.listeners.kafka).await?),
            false => None,
        };
        let iceberg_rest = match config.iceberg_rest.enabled {
            true => Some(bind("iceberg_rest", config.listeners.iceberg_rest).await?),
            false => None,
        };
        Ok(Self {
            admin,
            flight,
            kafka,
            iceberg_rest,
        })
    }

    /// The bound addresses: admin, Flight, Kafka.
    fn addresses(&self) -> anyhow::Result<(SocketAddr, SocketAddr, Option<SocketAddr>)> {
        Ok((
            self.admin.local_addr()?,
            self.flight.local_addr()?,
            self.kafka.as_ref().map(|l| l.local_addr()).transpose()?,
        ))
    }
}

/// The node's duties, each on a task of its own until shutdown: bucket handovers,
/// lake tiering, coming back when declared dead while alive, and the WAL's compactor
/// and replacement ([`supervise_wal`]).
fn spawn_duties(
    service: &Arc<NodeService>,
    meta: &MetaNode,
    stores: Stores,
    config: &MinkConfig,
    shutdown: &watch::Sender<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let handovers = {
        let (service, stop) = (service.clone(), shutdown.subscribe());
        tokio::spawn(async move { service.run_handovers(stop).await })
    };
    let tiering = {
        let (service, stop) = (service.clone(), shutdown.subscribe());
        tokio::spawn(async move { service.run_lake_tiering(stop).await })
    };
    let revive = tokio::spawn(revive_if_declared_dead(
        meta.clone(),
        Duration::from_millis(config.meta.heartbeat_interval_ms.max(10)),
        shutdown.subscribe(),
    ));
    let wal = tokio::spawn(supervise_wal(
        service.clone(),
        meta.clone(),
        stores,
        config.clone(),
        shutdown.subscribe(),
    ));
    vec![handovers, tiering, revive, wal]
}

/// Serves Flight on `listener` until shutdown.
fn serve_flight(
    listener: TcpListener,
    service: &Arc<NodeService>,
    config: &MinkConfig,
    shutdown: &watch::Sender<bool>,
) -> tokio::task::JoinHandle<()> {
    let max = config.flight.message_bytes_max as usize;
    let flight = FlightServiceServer::new(FlightServer::new(service.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    // Without TCP_NODELAY small answers wait for delayed ACKs (~40 ms each).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let stop = stopped(shutdown);
    let concurrent = config.flight.concurrent_streams_max;
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(concurrent)
            .add_service(flight)
            .serve_with_incoming_shutdown(incoming, stop)
            .await;
        if let Err(e) = served {
            tracing::error!("the Flight server stopped: {e}");
        }
    })
}

/// Runs the compactor of the node's WAL and replaces the WAL when it fails: a WAL
/// that cannot complete an upload within its retry budget, or that was fenced, is
/// replaced, not mourned. The node opens a new generation (retrying while the store
/// does not answer), registers a new incarnation (new leader epochs for every bucket
/// it leads) and swaps the new WAL in; each bucket then reopens on its next request,
/// recovering what the old generation acknowledged. No restart, no operator.
async fn supervise_wal(
    service: Arc<NodeService>,
    meta: MetaNode,
    stores: Stores,
    config: MinkConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let streams = service.streams();
        let compactor = {
            let streams = streams.clone();
            let mut stop = shutdown.clone();
            tokio::spawn(async move {
                streams
                    .run_compactor(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
            })
        };
        let why = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            why = streams.failed() => why,
        };
        compactor.abort();
        metrics::counter!("mink_wal_replacements_total").increment(1);
        tracing::warn!(wal = %streams.wal_id(), "the WAL failed ({why}); replacing it with a new generation");
        let mut pause = Duration::from_millis(100);
        let mut replacement = None;
        // How long each step took in all (attempts included), for the log line below:
        // a replacement is the node's recovery time after a store outage.
        let failed_at = tokio::time::Instant::now();
        let (mut opening, mut registering) = (Duration::ZERO, Duration::ZERO);
        loop {
            if replacement.is_none() {
                let t = tokio::time::Instant::now();
                let opened = StreamStore::open_after(
                    &streams,
                    stores.clone(),
                    &config.node_id,
                    config.wal.clone(),
                )
                .await;
                opening += t.elapsed();
                match opened {
                    Ok(new) => replacement = Some(new),
                    Err(e) => tracing::warn!("opening a new WAL generation: {e}; retrying"),
                }
            }
            if replacement.is_some() {
                let t = tokio::time::Instant::now();
                let registered = meta.reincarnate().await;
                registering += t.elapsed();
                match registered {
                    Ok(_) => break,
                    Err(e) => tracing::warn!("registering a new incarnation: {e}; retrying"),
                }
            }
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
        let Some(replacement) = replacement else {
            return;
        };
        tracing::info!(
            wal = %replacement.wal_id(),
            took_ms = failed_at.elapsed().as_millis() as u64,
            opening_ms = opening.as_millis() as u64,
            registering_ms = registering.as_millis() as u64,
            "the new WAL generation serves"
        );
        service.replace_streams(replacement).await;
        // The failed generation's streams and the service hold each other: without
        // this, every replaced generation would stay in memory for good.
        streams.release();
    }
}

/// A node the cluster declared dead (its heartbeats stalled: a long pause, a network
/// partition) that is in fact alive comes back as a new incarnation instead of
/// staying a zombie that serves nothing. Its old buckets have moved (their new leaders
/// fenced its WAL, which `supervise_wal` replaces); the lease holder gives it buckets
/// again as for any live node.
async fn revive_if_declared_dead(
    meta: MetaNode,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(every) => {}
        }
        let me = meta.node_id().to_string();
        let declared_dead = meta.read(|s| s.nodes.get(&me).is_some_and(|n| !n.alive));
        if declared_dead {
            metrics::counter!("mink_node_revivals_total").increment(1);
            tracing::warn!("this node was declared dead; registering again as a new incarnation");
            if let Err(e) = meta.reincarnate().await {
                tracing::warn!("registering again: {e}");
            }
        }
    }
}

/// Registers for Ctrl-C and SIGTERM at once (so a signal sent during start-up is
/// not lost) and returns a future that resolves on the first of them. Call it inside
/// the runtime, before starting anything.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (term, int) => {
                    tracing::warn!(
                        "cannot listen for signals ({:?}, {:?}); waiting for Ctrl-C only",
                        term.err(),
                        int.err()
                    );
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async move {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
