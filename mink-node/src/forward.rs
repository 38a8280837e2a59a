//! Forwarding to a bucket's leader over Flight: table-addressed writes whose buckets
//! this node does not lead, and per-bucket actions (`list_offsets`); and to the lease
//! holder: `rebalance`.

use std::collections::HashMap;

use arrow::array::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, Ticket};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mink_flight::protocol::{ReadTicket, ScanBatch, WriteBatch, WriteDescriptor, WriteResult};
use mink_meta::MetaNode;
use mink_types::{MinkError, Result};
use tonic::transport::Channel;

/// Flight clients to other nodes, one per address.
///
/// Every forwarded call carries this node's applied metadata index as
/// `mink-min-applied-index`: the receiver answers from a view at least as new as the one
/// that chose it (the leader this node saw in a move has seen the move too).
pub struct Forwarder {
    clients: tokio::sync::Mutex<HashMap<String, FlightServiceClient<Channel>>>,
    meta: MetaNode,
}

fn unavailable(addr: &str, e: impl std::fmt::Display) -> MinkError {
    MinkError::Unavailable(format!("forwarding to {addr}: {e}"))
}

impl Forwarder {
    pub fn new(meta: MetaNode) -> Self {
        Self {
            clients: tokio::sync::Mutex::new(HashMap::new()),
            meta,
        }
    }

    /// `body` as a request carrying this node's applied metadata index.
    fn request<T>(&self, body: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(body);
        let index = self.meta.applied_index();
        if index > 0 {
            request
                .metadata_mut()
                .insert(mink_flight::server::MIN_APPLIED_INDEX_HEADER, index.into());
        }
        request
    }

    async fn client(&self, addr: &str) -> Result<FlightServiceClient<Channel>> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let client = mink_flight::client::connect(addr).await?;
        clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// Writes one batch at `addr` with `descriptor`; returns the leader's answer.
    pub async fn write(
        &self,
        addr: &str,
        descriptor: &WriteDescriptor,
        batch: &RecordBatch,
        meta: &WriteBatch,
    ) -> Result<WriteResult> {
        let data = mink_flight::client::encode_write(batch, Some(descriptor), meta)?;
        let mut client = self.client(addr).await?;
        let idempotent = match descriptor {
            WriteDescriptor::Append { writer_id, .. } | WriteDescriptor::Put { writer_id, .. } => {
                writer_id.is_some()
            }
            _ => false,
        };
        let response = client
            .do_put(self.request(futures::stream::iter(data)))
            .await
            .map_err(|s| write_status_error(addr, idempotent, s))?;
        let mut results = response.into_inner();
        let first = results
            .message()
            .await
            .map_err(|s| write_status_error(addr, idempotent, s))?
            .ok_or_else(|| match idempotent {
                true => unavailable(addr, "no answer"),
                // The leader may have written before its answer was lost.
                false => MinkError::StorageFailure(format!(
                    "{addr} ended the write with no answer: its outcome is unknown; without \
                     a writer id it is not retried"
                )),
            })?;
        serde_json::from_slice(&first.app_metadata)
            .map_err(|e| MinkError::Internal(format!("{addr} answered: {e}")))
    }

    /// Runs action `name` with a JSON `body` at `addr`; the first result's bytes.
    pub async fn action_raw(
        &self,
        addr: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<Vec<u8>> {
        let mut client = self.client(addr).await?;
        let action = Action::new(name, body.to_string().into_bytes());
        let mut results = client
            .do_action(self.request(action))
            .await
            .map_err(|s| status_error(addr, s))?
            .into_inner();
        let first = results
            .message()
            .await
            .map_err(|s| status_error(addr, s))?
            .ok_or_else(|| unavailable(addr, "no answer"))?;
        Ok(first.body.to_vec())
    }

    /// Reads `ticket` at `addr`, streaming its batches with their scan metadata.
    pub async fn read(
        &self,
        addr: &str,
        ticket: &ReadTicket,
    ) -> Result<BoxStream<'static, Result<(RecordBatch, ScanBatch)>>> {
        let mut client = self.client(addr).await?;
        let ticket = Ticket {
            ticket: serde_json::to_vec(ticket)
                .map_err(|e| MinkError::Internal(e.to_string()))?
                .into(),
        };
        let response = client
            .do_get(self.request(ticket))
            .await
            .map_err(|s| status_error(addr, s))?;
        let addr = addr.to_string();
        let decoder = FlightDataDecoder::new(
            response
                .into_inner()
                .map_err(|e| arrow_flight::error::FlightError::Tonic(Box::new(e))),
        );
        Ok(decoder
            .filter_map(move |item| {
                let addr = addr.clone();
                async move {
                    let decoded = match item {
                        Ok(d) => d,
                        Err(arrow_flight::error::FlightError::Tonic(s)) => {
                            return Some(Err(status_error(&addr, *s)));
                        }
                        Err(e) => return Some(Err(unavailable(&addr, e))),
                    };
                    let DecodedPayload::RecordBatch(batch) = decoded.payload else {
                        return None;
                    };
                    Some(
                        serde_json::from_slice::<ScanBatch>(&decoded.inner.app_metadata)
                            .map(|meta| (batch, meta))
                            .map_err(|e| MinkError::Internal(format!("{addr} answered: {e}"))),
                    )
                }
            })
            .boxed())
    }

    /// Runs a typed action at `addr` and decodes its answer.
    pub async fn call<R: mink_flight::actions::ActionRequest>(
        &self,
        addr: &str,
        request: &R,
    ) -> Result<R::Answer> {
        let body = serde_json::to_value(request).map_err(|e| MinkError::Internal(e.to_string()))?;
        let bytes = self.action_raw(addr, R::NAME, &body).await?;
        <R::Answer as mink_flight::actions::Answer>::from_body(R::NAME, bytes)
    }

    /// Runs action `name` at `addr`; the first result as JSON.
    pub async fn action(
        &self,
        addr: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        let bytes = self.action_raw(addr, name, body).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| MinkError::Internal(format!("{addr} answered: {e}")))
    }
}

/// A forwarded write's failed status. The leader's own answers keep their shape (its
/// `Unavailable` is a refusal before anything was written: for a write without a
/// writer id, what may have been written it answers `StorageFailure`). A failure of the
/// call itself (a connection lost mid-request, no Mink error in it) may come after the
/// leader recorded the rows: without a writer id to deduplicate a retry, its outcome
/// is unknown.
fn write_status_error(addr: &str, idempotent: bool, s: tonic::Status) -> MinkError {
    // The leader's own answers, its `StorageFailure` included, and a connection never
    // made (nothing was sent) are passed on as they are.
    let answered = mink_flight::client::node_answered(&s);
    let e = status_error(addr, s);
    if answered || idempotent {
        return e;
    }
    MinkError::StorageFailure(format!(
        "the write's outcome is unknown ({e}); without a writer id it is not retried"
    ))
}

/// A status from another node, back into Mink's error. A refusal keeps its shape (a
/// `NotLeader` stays a redirect the caller can follow); a failure names the node.
fn status_error(addr: &str, s: tonic::Status) -> MinkError {
    match mink_flight::client::status_to_error(s) {
        MinkError::Unavailable(m) => MinkError::Unavailable(format!("{addr}: {m}")),
        MinkError::Internal(m) => MinkError::Internal(format!("{addr}: {m}")),
        MinkError::StorageFailure(m) => MinkError::StorageFailure(format!("{addr}: {m}")),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forwarded write without a writer id hears "outcome unknown" for a failure of
    /// the call itself, and the leader's own answers as they are.
    #[test]
    fn a_forwarded_write_tells_a_leaders_refusal_from_a_failed_call() {
        let refusal = || tonic::Status::unavailable("unavailable: table 1 bucket 0: overloaded");
        let unknown = || tonic::Status::unavailable("storage failure: outcome is unknown");
        let transport = || tonic::Status::unavailable("connection reset by peer");
        let h2 = || tonic::Status::internal("h2 protocol error: stream reset");
        let calm = || tonic::Status::resource_exhausted("h2 protocol error: enhance your calm");
        for idempotent in [false, true] {
            let e = write_status_error("n1", idempotent, refusal());
            assert!(matches!(e, MinkError::Unavailable(_)), "{e}");
            let e = write_status_error("n1", idempotent, unknown());
            assert!(matches!(e, MinkError::StorageFailure(_)), "{e}");
        }
        for failed in [transport(), h2(), calm()] {
            let e = write_status_error("n1", false, failed.clone());
            assert!(
                matches!(&e, MinkError::StorageFailure(m) if m.contains("outcome is unknown")),
                "{e}"
            );
            // With a writer id a retry is deduplicated: the failure keeps its shape.
            let e = write_status_error("n1", true, failed);
            assert!(!matches!(e, MinkError::StorageFailure(_)), "{e}");
        }
        // A connection that could not be made sent nothing: the refusal as it is.
        let refused = tonic::Status::from_error(Box::new(tonic::ConnectError(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        )));
        let e = write_status_error("n1", false, refused);
        assert!(matches!(e, MinkError::Unavailable(_)), "{e}");
    }
}
