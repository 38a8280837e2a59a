//! The listener: accepts connections and serves each on its own task.
//!
//! A connection reads frames one after another ([`crate::frame`]), decodes each
//! request's header and body at once (so a garbage frame ends the connection before
//! anything runs), and hands the request to a task of its own. Up to
//! `kafka.max_in_flight` requests of a connection run at once; their responses are
//! written in request order by the connection's writer. Produce requests of one
//! connection take their offsets in request order (an idempotent producer pipelines
//! its batches), then wait for durability together.
//!
//! A garbage, truncated or oversized frame, or a request for an API or version the
//! listener does not serve (and has no refusal for), closes that connection with a
//! log line; other connections never notice. A connection that sends nothing for
//! `kafka.connection_idle_ms` is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tracing::Instrument;

use crate::KafkaConfig;
use crate::api::{self, Ctx, Request};
use crate::frame::{Body, FrameError, Header, frame, read_frame};
use crate::groups::{Coordinator, SWEEP_EVERY};
use crate::handler::KafkaHandler;

/// Serves Kafka clients on `listener` until `shutdown` resolves. `groups` is the
/// consumer-group coordinator (the caller keeps a handle to show the groups elsewhere:
/// the node's console).
pub async fn serve(
    listener: TcpListener,
    handler: Arc<dyn KafkaHandler>,
    config: KafkaConfig,
    groups: Arc<Coordinator>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let ctx = Arc::new(Ctx {
        handler,
        config,
        groups,
        refused: Default::default(),
    });
    // Session and rebalance timeouts of consumer groups; groups that became Empty
    // start their offsets' retention (KIP-211).
    let sweeper = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                ctx.groups.sweep(tokio::time::Instant::now());
                for group in ctx.groups.take_emptied() {
                    let handler = ctx.handler.clone();
                    tokio::spawn(async move {
                        if let Err(e) = handler.group_emptied(&group).await {
                            tracing::warn!(%group, "kafka group emptied: its offsets' retention did not restart: {e}");
                        }
                    });
                }
            }
        })
    };
    let _stop_sweeper = AbortOnDrop(sweeper);
    // Connections stop reading when the listener stops (requests already read are
    // still answered).
    let (closing, _) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => {
                closing.send_replace(true);
                // Joins waiting for a rebalance are answered (REBALANCE_IN_PROGRESS).
                ctx.groups.clear();
                return;
            }
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(stream, peer, ctx.clone(), closing.subscribe()));
            }
            Err(e) => {
                tracing::warn!("kafka listener: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a connection is closed by us.
enum Close {
    Frame(FrameError),
    Request(String),
}

/// Serves one connection until the peer closes it, it idles, or it sends something
/// that cannot be answered.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<Ctx>,
    mut closing: watch::Receiver<bool>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let in_flight = ctx.config.max_in_flight.max(1) as usize;
    // A request holds a permit from when it is read until its response is written:
    // at most `max_in_flight` per connection; the reader waits for one beyond that.
    let permits = Arc::new(Semaphore::new(in_flight));
    // Each entry resolves to the framed response, or None (acks=0).
    let (tx, mut rx) = mpsc::channel::<(
        tokio::task::JoinHandle<Option<Vec<u8>>>,
        OwnedSemaphorePermit,
    )>(in_flight);
    let write_loop = tokio::spawn(async move {
        while let Some((next, _permit)) = rx.recv().await {
            match next.await {
                Ok(Some(bytes)) => {
                    if let Err(e) = writer.write_all(&bytes).await {
                        tracing::debug!(%peer, "kafka: writing a response: {e}");
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(%peer, "kafka: a request task failed: {e}; closing the connection");
                    return;
                }
            }
        }
        let _ = writer.shutdown().await;
    });
    let idle = Duration::from_millis(ctx.config.connection_idle_ms);
    // Produce requests take their offsets one after another: each waits for the
    // previous one's signal.
    let mut produce_turn: Option<oneshot::Receiver<()>> = None;
    let why = loop {
        // A permit first: with `max_in_flight` requests unanswered, the next frame
        // waits in the socket.
        let permit = tokio::select! {
            _ = closing.wait_for(|c| *c) => break None,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break None,
            },
        };
        let read =
            tokio::time::timeout(idle, read_frame(&mut reader, ctx.config.max_request_bytes));
        let read = tokio::select! {
            _ = closing.wait_for(|c| *c) => break None,
            read = read => read,
        };
        let frame = match read {
            Err(_) => {
                tracing::info!(%peer, "kafka: closing a connection idle for {idle:?}");
                break None;
            }
            Ok(Ok(None)) => break None,
            Ok(Ok(Some(frame))) => frame,
            Ok(Err(e)) => break Some(Close::Frame(e)),
        };
        let (header, request) = match decode(frame, peer) {
            Ok(decoded) => decoded,
            Err(e) => break Some(Close::Request(e)),
        };
        let ctx = ctx.clone();
        let turn = if matches!(request, Request::Produce(_)) {
            let (done, next) = oneshot::channel();
            Some((produce_turn.replace(next), done))
        } else {
            None
        };
        // One span per request: a slow one can be followed into the node's write path.
        let span = tracing::info_span!(
            "kafka",
            api = ?header.key,
            version = header.version,
            correlation_id = header.header.correlation_id,
            client_id = header.header.client_id.as_deref().unwrap_or(""),
            %peer
        );
        let task = tokio::spawn(
            async move {
                let (key, version, correlation_id) =
                    (header.key, header.version, header.header.correlation_id);
                let body = api::handle(&ctx, header, request, turn).await?;
                Some(respond(key, version, correlation_id, body, peer))
            }
            .instrument(span),
        );
        if tx.send((task, permit)).await.is_err() {
            break None;
        }
    };
    match why {
        Some(Close::Frame(e)) => {
            tracing::warn!(%peer, "kafka: closing the connection: {e}")
        }
        Some(Close::Request(e)) => {
            tracing::warn!(%peer, "kafka: closing the connection: {e}")
        }
        None => {}
    }
    // Requests already read are still answered, then the connection closes.
    drop(tx);
    let _ = write_loop.await;
}

/// Decodes a request frame: the header, then the body at the request's version.
fn decode(mut frame: Bytes, peer: SocketAddr) -> Result<(Header, Request), String> {
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let key = ApiKey::try_from(raw_key).map_err(|_| format!("unknown API key {raw_key}"))?;
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| format!("{key:?} v{version}: a malformed request header: {e}"))?;
    let request = api::decode_body(key, version, &mut frame)?;
    Ok((
        Header {
            key,
            version,
            header,
            peer,
        },
        request,
    ))
}

/// The framed response: header (v0 for ApiVersions, always) and body.
fn respond(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: Body,
    peer: SocketAddr,
) -> Vec<u8> {
    let header_version = if key == ApiKey::ApiVersions {
        0
    } else {
        key.response_header_version(body.version)
    };
    let mut buf = BytesMut::new();
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    if let Err(e) = header.encode(&mut buf, header_version) {
        tracing::error!(%peer, "kafka: encoding a {key:?} v{version} response header: {e}");
    }
    buf.extend_from_slice(&body.bytes);
    frame(&buf)
}
