//! Forwarding a bucket's rows to its leader over Flight (table-addressed writes whose
//! buckets this node does not lead).

use std::collections::HashMap;

use arrow::array::RecordBatch;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor, SchemaAsIpc};
use mink_flight::protocol::{WriteBatch, WriteDescriptor, WriteResult};
use mink_types::{MinkError, Result};
use tonic::transport::Channel;

/// Flight clients to other nodes, one per address.
#[derive(Default)]
pub struct Forwarder {
    clients: tokio::sync::Mutex<HashMap<String, FlightServiceClient<Channel>>>,
}

fn unavailable(addr: &str, e: impl std::fmt::Display) -> MinkError {
    MinkError::Unavailable(format!("forwarding to {addr}: {e}"))
}

impl Forwarder {
    async fn client(&self, addr: &str) -> Result<FlightServiceClient<Channel>> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let channel = Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| unavailable(addr, e))?
            .connect_timeout(std::time::Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| unavailable(addr, e))?;
        let client = FlightServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
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
        let options = IpcWriteOptions::default();
        let cmd = serde_json::to_vec(descriptor).map_err(|e| MinkError::Internal(e.to_string()))?;
        let mut schema = FlightData::from(SchemaAsIpc::new(&batch.schema(), &options));
        schema.flight_descriptor = Some(FlightDescriptor::new_cmd(cmd));
        let (_, encoded) = IpcDataGenerator::default().encode(
            batch,
            &mut DictionaryTracker::new(false),
            &options,
            &mut IpcWriteContext::default(),
        )?;
        let meta = serde_json::to_vec(meta).map_err(|e| MinkError::Internal(e.to_string()))?;
        let data = FlightData::from(encoded).with_app_metadata(meta);
        let mut client = self.client(addr).await?;
        let response = client
            .do_put(futures::stream::iter(vec![schema, data]))
            .await
            .map_err(|s| status_error(addr, s))?;
        let mut results = response.into_inner();
        let first = results
            .message()
            .await
            .map_err(|s| status_error(addr, s))?
            .ok_or_else(|| unavailable(addr, "no answer"))?;
        serde_json::from_slice(&first.app_metadata)
            .map_err(|e| MinkError::Internal(format!("{addr} answered: {e}")))
    }
}

/// A status from another node, back into Mink's error (its message kept).
fn status_error(addr: &str, s: tonic::Status) -> MinkError {
    let message = format!("{addr}: {}", s.message());
    match s.code() {
        tonic::Code::InvalidArgument => MinkError::invalid("forwarded write", message),
        tonic::Code::NotFound => MinkError::NotFound(message),
        tonic::Code::AlreadyExists => MinkError::AlreadyExists(message),
        tonic::Code::OutOfRange => MinkError::Internal(message),
        tonic::Code::ResourceExhausted => MinkError::LimitExceeded {
            what: message,
            limit: 0,
            actual: 0,
        },
        tonic::Code::Unimplemented => MinkError::Unimplemented(message),
        tonic::Code::Aborted => MinkError::Fenced(message),
        tonic::Code::Internal => MinkError::Internal(message),
        _ => MinkError::Unavailable(message),
    }
}
