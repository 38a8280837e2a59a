//! The nodes, as mink-query reaches them: Flight calls with Mink's JSON actions and
//! tickets, rows decoded by arrow 58.
//!
//! Any node answers actions and `GetFlightInfo`; reads of a bucket go to its leader
//! (the endpoint's location), and a leader that moved answers `NotLeader` with the new
//! address, which [`Nodes::read`] follows, in the middle of a bucket's read as well
//! as at its start. Every answer carries the node's
//! `mink-applied-index`; the highest one seen is sent back as `mink-min-applied-index`
//! on every call, so no node serves mink-query an older catalog than one it already
//! saw (DDL through any node is visible to the next statement).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mink_flight::actions::{ActionRequest, Answer, DescribeCluster, Empty};
use mink_flight::client::status_to_error;
use mink_flight::protocol::{ReadTicket, ScanBatch};
use mink_types::{MinkError, Result, TableBucket, TablePath};
use tokio::sync::Mutex;
use tonic::transport::Channel;

use crate::engine::arrow::record_batch::RecordBatch;
use crate::engine::flight::decode::{DecodedPayload, FlightDataDecoder};
use crate::engine::flight::error::FlightError;
use crate::engine::flight::flight_service_client::FlightServiceClient;
use crate::engine::flight::{Action, FlightDescriptor, FlightInfo, Ticket};

const APPLIED_INDEX: &str = "mink-applied-index";
const MIN_APPLIED_INDEX: &str = "mink-min-applied-index";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Redirects one read follows before giving up (a bucket moving again and again).
const REDIRECTS_MAX: usize = 5;
/// How long a call waits for a leader that serves its bucket, after a move or a
/// failure (a new leader opens the bucket first; a dead one is replaced after the
/// node session timeout), unless configured (`query.leader_wait_ms`).
pub const LEADER_WAIT: Duration = Duration::from_secs(60);
/// The longest pause between two tries while waiting for a leader.
const WAIT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A stream of a read's batches with their app metadata (JSON).
pub type Batches = BoxStream<'static, Result<(RecordBatch, Bytes)>>;

/// The cluster, through Flight.
pub struct Nodes {
    /// The configured nodes, then the ones `describe_cluster` named.
    candidates: std::sync::Mutex<Vec<String>>,
    connections: Mutex<HashMap<String, FlightServiceClient<Channel>>>,
    /// The highest `mink-applied-index` seen.
    applied: AtomicU64,
    /// How long one call waits for a leader that serves ([`Nodes::waiting`]).
    leader_wait: Duration,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field("candidates", &self.candidates)
            .field("applied", &self.applied)
            .finish()
    }
}

impl Nodes {
    pub fn new(bootstrap: Vec<String>) -> Arc<Self> {
        Self::with_leader_wait(bootstrap, LEADER_WAIT)
    }

    pub fn with_leader_wait(bootstrap: Vec<String>, leader_wait: Duration) -> Arc<Self> {
        Arc::new(Self {
            candidates: std::sync::Mutex::new(bootstrap),
            connections: Mutex::new(HashMap::new()),
            applied: AtomicU64::new(0),
            leader_wait,
        })
    }

    /// How long one call waits for a leader that serves.
    pub fn leader_wait(&self) -> Duration {
        self.leader_wait
    }

    /// Runs `op` until it answers anything but `Unavailable` (no node serves it yet: a
    /// bucket's leader died and its buckets have not moved, or a new leader is still
    /// opening one), with growing pauses, for up to the leader wait. Only for calls
    /// that change nothing (reads, planning, lookups): running one twice is harmless.
    pub async fn waiting<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.leader_wait;
        let mut pause = Duration::from_millis(50);
        loop {
            match op().await {
                Err(MinkError::Unavailable(why))
                    if tokio::time::Instant::now() + pause < deadline =>
                {
                    tracing::debug!("{what}: no node serves it yet ({why}); waiting");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(WAIT_PAUSE_MAX);
                }
                other => return other,
            }
        }
    }

    /// An action at any node, waiting for one that serves ([`Nodes::waiting`]): for
    /// actions that read (lookups), which a bucket's leader answers.
    pub async fn call_waiting<R: ActionRequest>(&self, request: &R) -> Result<R::Answer> {
        self.waiting(R::NAME, || self.call(request)).await
    }

    /// The highest metadata index a node answered with.
    pub fn applied_index(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Waits, on later calls, for at least `index` (a statement handle planned
    /// elsewhere carries the index its planner had seen).
    pub fn saw_index(&self, index: u64) {
        self.applied.fetch_max(index, Ordering::AcqRel);
    }

    async fn connection(&self, addr: &str) -> Result<FlightServiceClient<Channel>> {
        if let Some(c) = self.connections.lock().await.get(addr) {
            return Ok(c.clone());
        }
        let channel = Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| MinkError::invalid("address", format!("{addr}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await
            .map_err(|e| MinkError::Unavailable(format!("cannot connect to node {addr}: {e}")))?;
        let client = FlightServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        self.connections
            .lock()
            .await
            .insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// Forgets a connection that failed, so the next call dials again.
    async fn forget(&self, addr: &str) {
        self.connections.lock().await.remove(addr);
    }

    fn request<T>(&self, body: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(body);
        let index = self.applied_index();
        if index > 0 {
            request.metadata_mut().insert(
                MIN_APPLIED_INDEX,
                index.to_string().parse().expect("digits are ASCII"),
            );
        }
        request
    }

    fn saw(&self, metadata: &tonic::metadata::MetadataMap) {
        if let Some(index) = metadata
            .get(APPLIED_INDEX)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            self.saw_index(index);
        }
    }

    /// An action at `addr`.
    pub async fn call_at<R: ActionRequest>(&self, addr: &str, request: &R) -> Result<R::Answer> {
        let body = serde_json::to_vec(request).map_err(|e| MinkError::Internal(e.to_string()))?;
        let mut client = self.connection(addr).await?;
        let answer = client
            .do_action(self.request(Action::new(R::NAME, body)))
            .await;
        let response = match answer {
            Ok(r) => r,
            Err(status) => {
                self.saw(status.metadata());
                let error = read_error(status);
                if matches!(error, MinkError::Unavailable(_)) {
                    self.forget(addr).await;
                }
                return Err(error);
            }
        };
        self.saw(response.metadata());
        let mut stream = response.into_inner();
        let mut body = Vec::new();
        while let Some(result) = stream.message().await.map_err(read_error)? {
            body.extend_from_slice(&result.body);
        }
        R::Answer::from_body(R::NAME, body)
    }

    /// An action at any node (see [`Nodes::at_any`]).
    pub async fn call<R: ActionRequest>(&self, request: &R) -> Result<R::Answer> {
        self.at_any(|addr| async move { self.call_at(&addr, request).await })
            .await
    }

    /// Runs `op` at the candidates in order, from the one that answered last, until
    /// one answers with anything but `Unavailable` (which is also what a node that
    /// cannot be reached gives).
    async fn at_any<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let candidates = self.candidates.lock().expect("not poisoned").clone();
        let mut last = None;
        for addr in candidates {
            match op(addr.clone()).await {
                Err(e @ MinkError::Unavailable(_)) => last = Some(e),
                answered => {
                    self.prefer(&addr);
                    return answered;
                }
            }
        }
        Err(last.unwrap_or_else(|| MinkError::Unavailable("no node is configured".into())))
    }

    /// Puts `addr` first among the candidates.
    fn prefer(&self, addr: &str) {
        let mut candidates = self.candidates.lock().expect("not poisoned");
        if let Some(i) = candidates.iter().position(|c| c == addr)
            && i > 0
        {
            let a = candidates.remove(i);
            candidates.insert(0, a);
        }
    }

    /// A read any node answers (`Union`, `Lake`), at the first candidate that does.
    pub async fn read_any(&self, ticket: &ReadTicket) -> Result<Batches> {
        self.at_any(|addr| async move { Ok(self.open(&addr, ticket).await?.0) })
            .await
    }

    /// Adds the cluster's live nodes to the candidates (after the configured ones).
    pub async fn discover(&self) -> Result<usize> {
        let cluster = self.call(&DescribeCluster(Empty {})).await?;
        let mut found: Vec<String> = cluster
            .get("nodes")
            .and_then(|n| n.as_object())
            .map(|nodes| {
                nodes
                    .values()
                    .filter(|n| n.get("alive").and_then(|a| a.as_bool()).unwrap_or(true))
                    .filter_map(|n| n.get("flight_addr").and_then(|a| a.as_str()))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        let mut candidates = self.candidates.lock().expect("not poisoned");
        for addr in found {
            if !candidates.contains(&addr) {
                candidates.push(addr);
            }
        }
        Ok(candidates.len())
    }

    /// `GetFlightInfo` of a table at any node: its schema and one endpoint per bucket,
    /// whose ticket is a Scan up to the bucket's high watermark now.
    pub async fn flight_info(&self, path: &TablePath) -> Result<FlightInfo> {
        self.at_any(|addr| async move { self.flight_info_at(&addr, path).await })
            .await
    }

    async fn flight_info_at(&self, addr: &str, path: &TablePath) -> Result<FlightInfo> {
        let mut client = self.connection(addr).await?;
        match client
            .get_flight_info(self.request(FlightDescriptor::new_path(vec![path.to_string()])))
            .await
        {
            Ok(r) => {
                self.saw(r.metadata());
                Ok(r.into_inner())
            }
            Err(status) => {
                self.saw(status.metadata());
                let error = read_error(status);
                if matches!(error, MinkError::Unavailable(_)) {
                    self.forget(addr).await;
                }
                Err(error)
            }
        }
    }

    /// A DoGet at `addr`, following `NotLeader` redirects, streamed. A range read (a
    /// `Scan` with an `end_offset`, which the node serves in successive scans) also
    /// survives its bucket moving, or its leader going away, while it streams: when
    /// the stream ends with `NotLeader` or `Unavailable`, the read goes on at the
    /// leader from the offset after the last batch it received (at most
    /// [`REDIRECTS_MAX`] times, each waiting for a leader that serves, see
    /// [`Nodes::waiting`]). The rows below the end were acknowledged before the read was planned,
    /// so every leader after the move holds them.
    pub async fn read(self: &Arc<Self>, addr: &str, ticket: &ReadTicket) -> Result<Batches> {
        let ReadTicket::Scan {
            bucket,
            offset,
            max_bytes,
            end_offset: Some(end),
            ref columns,
            ref filter,
        } = *ticket
        else {
            return Ok(self.open(addr, ticket).await?.0);
        };
        let mut range = Range {
            nodes: self.clone(),
            addr: addr.to_string(),
            bucket,
            max_bytes,
            columns: columns.clone(),
            filter: filter.clone(),
            next: offset,
            end,
            moves: 0,
            batches: None,
        };
        // The first open waits for a leader as a resume does (one still opening after
        // a move answers Unavailable).
        let first = range.reopen().await?;
        range.batches = Some(first);
        Ok(range.stream())
    }

    /// [`Nodes::open`] at `addr`, or, when `addr` cannot serve (`Unavailable`: gone,
    /// or its bucket still opening), at any node, which redirects to the leader;
    /// waiting for one that serves ([`Nodes::waiting`]).
    pub async fn open_waiting(&self, addr: &str, ticket: &ReadTicket) -> Result<(Batches, String)> {
        self.waiting("a read", || async move {
            match self.open(addr, ticket).await {
                Err(MinkError::Unavailable(_)) => {
                    self.at_any(|other| async move { self.open(&other, ticket).await })
                        .await
                }
                other => other,
            }
        })
        .await
    }

    /// A DoGet at `addr`, following `NotLeader` redirects, streamed; with the address
    /// that answered.
    async fn open(&self, addr: &str, ticket: &ReadTicket) -> Result<(Batches, String)> {
        let body = serde_json::to_vec(ticket).map_err(|e| MinkError::Internal(e.to_string()))?;
        let mut addr = addr.to_string();
        for _ in 0..=REDIRECTS_MAX {
            let mut client = self.connection(&addr).await?;
            match client.do_get(self.request(Ticket::new(body.clone()))).await {
                Ok(response) => {
                    self.saw(response.metadata());
                    let stream = response
                        .into_inner()
                        .map_err(|s| FlightError::Tonic(Box::new(s)));
                    let decoded = FlightDataDecoder::new(stream)
                        .map_err(flight_error)
                        .try_filter_map(|d| async move {
                            Ok(match d.payload {
                                DecodedPayload::RecordBatch(b) => Some((b, d.inner.app_metadata)),
                                _ => None,
                            })
                        });
                    return Ok((decoded.boxed(), addr));
                }
                Err(status) => {
                    self.saw(status.metadata());
                    match read_error(status) {
                        MinkError::NotLeader {
                            leader: Some(to), ..
                        } => addr = to,
                        e @ MinkError::Unavailable(_) => {
                            self.forget(&addr).await;
                            return Err(e);
                        }
                        other => return Err(other),
                    }
                }
            }
        }
        Err(MinkError::Unavailable(format!(
            "the read moved leaders more than {REDIRECTS_MAX} times"
        )))
    }
}

/// A range read in progress ([`Nodes::read`]).
struct Range {
    nodes: Arc<Nodes>,
    /// The leader being read.
    addr: String,
    bucket: TableBucket,
    max_bytes: Option<u64>,
    /// The columns read (`None`: all).
    columns: Option<Vec<String>>,
    /// The rows read (`None`: all).
    filter: Option<mink_flight::filter::Filter>,
    /// The offset after the last batch received.
    next: i64,
    end: i64,
    /// Leader moves followed so far.
    moves: usize,
    /// The stream from `addr`; `None` between a move and the read that goes on.
    batches: Option<Batches>,
}

impl Range {
    /// Opens the rest of the range, `next..end`, at its leader.
    async fn reopen(&mut self) -> Result<Batches> {
        let ticket = ReadTicket::Scan {
            bucket: self.bucket,
            offset: self.next,
            max_bytes: self.max_bytes,
            end_offset: Some(self.end),
            columns: self.columns.clone(),
            filter: self.filter.clone(),
        };
        let (batches, at) = self.nodes.open_waiting(&self.addr, &ticket).await?;
        self.addr = at;
        Ok(batches)
    }

    fn stream(self) -> Batches {
        futures::stream::unfold(Some(self), |state| async move {
            let mut range = state?;
            loop {
                let batches = match range.batches.as_mut() {
                    Some(b) => b,
                    None => match range.reopen().await {
                        Ok(b) => range.batches.insert(b),
                        Err(e) => return Some((Err(e), None)),
                    },
                };
                match batches.next().await {
                    None => return None,
                    Some(Ok((batch, meta))) => {
                        if let Ok(m) = serde_json::from_slice::<ScanBatch>(&meta) {
                            // A filtered batch ends where its stored rows ended.
                            let end = m
                                .next_offset
                                .unwrap_or(m.base_offset + batch.num_rows() as i64);
                            range.next = range.next.max(end);
                        }
                        return Some((Ok((batch, meta)), Some(range)));
                    }
                    Some(Err(e)) if resumable(&e) && range.moves < REDIRECTS_MAX && range.next < range.end => {
                        tracing::debug!(bucket = %range.bucket, from = %range.addr, next = range.next,
                            "the read stopped ({e}); going on at the bucket's leader");
                        if let MinkError::NotLeader { leader: Some(to), .. } = e {
                            range.addr = to;
                        }
                        range.moves += 1;
                        range.batches = None;
                    }
                    Some(Err(e)) => return Some((Err(e), None)),
                }
            }
        })
        .boxed()
    }
}

/// Whether a read that stopped with `e` can go on elsewhere: its bucket moved, or its
/// node went away (or is opening the bucket).
pub fn resumable(e: &MinkError) -> bool {
    matches!(
        e,
        MinkError::NotLeader {
            leader: Some(_),
            ..
        } | MinkError::Unavailable(_)
    )
}

/// A node's answer as mink-query acts on it. A node's `StorageFailure` (its object
/// store failed or timed out) is retried as a node that cannot serve now is: mink-query
/// only reads, so a read that met one changed nothing.
fn read_error(status: tonic::Status) -> MinkError {
    match status_to_error(status) {
        MinkError::StorageFailure(m) => MinkError::Unavailable(format!("storage failure: {m}")),
        e => e,
    }
}

fn flight_error(e: FlightError) -> MinkError {
    match e {
        FlightError::Tonic(status) => read_error(*status),
        other => MinkError::Internal(format!("a node's answer: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that met a node's storage failure goes on as one that met a node that
    /// cannot serve now (mink-flight's client reads the failure back as itself).
    #[test]
    fn a_storage_failure_is_retried_as_a_node_that_cannot_serve() {
        let e = read_error(tonic::Status::unavailable(
            "storage failure: a GET timed out",
        ));
        assert!(
            matches!(e, MinkError::Unavailable(ref m) if m.contains("a GET timed out")),
            "{e:?}"
        );
        assert!(resumable(&e));
    }
}
