//! The Flight server over a [`MinkService`] that `mink-node` implements. This module
//! speaks Flight (framing, metadata, headers, status codes) and nothing else.

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream;
use futures::{StreamExt, TryStreamExt};
use mink_types::{IpcEncoded, MinkError, TablePath};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::filter::Filter;
use crate::projection::ReadShape;
use crate::protocol::{
    ExchangeDescriptor, ReadTicket, Redirect, ScanBatch, SnapshotBatch, TailEnd, TailPoll,
    WriteBatch, WriteDescriptor, WriteResult, parse_json,
};

/// Response header: the metadata index the serving node had applied.
pub const APPLIED_INDEX_HEADER: &str = "mink-applied-index";
/// Request header: wait until this index is applied before serving.
pub const MIN_APPLIED_INDEX_HEADER: &str = "mink-min-applied-index";

/// Every action the protocol has, with a one-line description (ListActions).
pub use crate::actions::ACTIONS;

/// One batch of a scan or a tail, with its scan metadata.
pub type ReadBatch = (RecordBatch, ScanBatch);

/// The batches a DoGet answers, each with the metadata its ticket calls for.
pub enum ReadBatches {
    /// `Scan`, `LimitScan`: `ScanBatch` metadata.
    Scan(Vec<ReadBatch>),
    /// `Lake`, `Union`: `ScanBatch` metadata, streamed as they are read, so that a
    /// read of any size holds a few batches in memory. An error ends the stream with
    /// its status.
    Stream(futures::stream::BoxStream<'static, Result<ReadBatch, MinkError>>),
    /// `Snapshot`, and `Lake`, `Union` of a primary-key table: a state, with
    /// `SnapshotBatch` metadata, streamed likewise.
    SnapshotStream(
        futures::stream::BoxStream<'static, Result<(RecordBatch, SnapshotBatch), MinkError>>,
    ),
}

impl std::fmt::Debug for ReadBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadBatches::Scan(b) => write!(f, "Scan({} batches)", b.len()),
            ReadBatches::Stream(_) => f.write_str("Stream"),
            ReadBatches::SnapshotStream(_) => f.write_str("SnapshotStream"),
        }
    }
}

/// One part of a table in GetFlightInfo: a bucket's rows, the ticket that reads them
/// and the node to read them at.
#[derive(Debug, Clone)]
pub struct TableEndpoint {
    /// A `Scan` with an `end_offset`.
    pub ticket: ReadTicket,
    /// The bucket leader's Flight address (`host:port`), when it has one.
    pub leader: Option<String>,
    /// Rows the ticket reads.
    pub rows: i64,
}

/// What the node does for the Flight server.
#[async_trait]
pub trait MinkService: Send + Sync + 'static {
    /// The metadata index this node has applied.
    fn applied_index(&self) -> u64;
    /// Waits (bounded) until `index` is applied.
    async fn wait_applied(&self, index: u64) -> Result<(), MinkError>;
    /// Runs an action; returns its answer's body (JSON, or Arrow IPC for lookups).
    async fn action(&self, action: crate::actions::Action) -> Result<Vec<u8>, MinkError>;
    /// Writes one batch; `ipc` holds the bytes it was decoded from, which the service
    /// may store as they are (see [`IpcEncoded`]).
    async fn write(
        &self,
        descriptor: &WriteDescriptor,
        batch: RecordBatch,
        ipc: Option<IpcEncoded>,
        meta: WriteBatch,
    ) -> Result<WriteResult, MinkError>;
    /// Reads what a ticket names: the schema and the batches.
    async fn read(&self, ticket: ReadTicket) -> Result<(SchemaRef, ReadBatches), MinkError>;
    /// The current Arrow schema of a table.
    async fn table_schema(&self, path: &TablePath) -> Result<SchemaRef, MinkError>;
    /// A table's schema and one endpoint per bucket (of every partition), as its rows
    /// are now.
    async fn table_endpoints(
        &self,
        path: &TablePath,
    ) -> Result<(SchemaRef, Vec<TableEndpoint>), MinkError>;
    /// Every table, with its current Arrow schema.
    async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>, MinkError>;
    /// One long poll of a bucket: the table schema, the batches, the high watermark.
    async fn tail(
        &self,
        bucket: mink_types::TableBucket,
        poll: TailPoll,
    ) -> Result<(SchemaRef, Vec<ReadBatch>, i64), MinkError>;
}

/// The longest status message sent, in bytes. gRPC carries the message in a header
/// (percent-encoded: up to three bytes a byte) and clients refuse headers over 8 KiB,
/// reporting only "Stream removed": a longer message is cut, and says so.
pub const STATUS_MESSAGE_BYTES_MAX: usize = 2_048;

/// `message` cut to at most [`STATUS_MESSAGE_BYTES_MAX`] bytes (at a character
/// boundary), with a note of how long it was.
fn capped(message: String) -> String {
    if message.len() <= STATUS_MESSAGE_BYTES_MAX {
        return message;
    }
    let mut cut = STATUS_MESSAGE_BYTES_MAX - 64;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}… (message cut from {} bytes)",
        &message[..cut],
        message.len()
    )
}

/// Maps Mink's errors to gRPC statuses (spec/protocols.txt "Errors").
pub fn status(err: MinkError) -> Status {
    let message = capped(err.to_string());
    match err {
        MinkError::NotLeader { bucket, leader } => {
            let body = serde_json::to_vec(&Redirect { bucket, to: leader }).unwrap_or_default();
            Status::with_details(tonic::Code::FailedPrecondition, message, Bytes::from(body))
        }
        MinkError::Unavailable(_) | MinkError::StorageFailure(_) => Status::unavailable(message),
        MinkError::InvalidArgument { .. } | MinkError::SchemaMismatch(_) => {
            Status::invalid_argument(message)
        }
        MinkError::NotFound(_) => Status::not_found(message),
        MinkError::AlreadyExists(_) => Status::already_exists(message),
        MinkError::OutOfOrderSequence { .. }
        | MinkError::UnknownWriter { .. }
        | MinkError::WriterFenced { .. } => {
            // The error itself in the details, so that a client (or a node forwarding
            // the answer) gets the writer's expected sequence without parsing text.
            let body = serde_json::to_vec(&err).unwrap_or_default();
            Status::with_details(tonic::Code::FailedPrecondition, message, Bytes::from(body))
        }
        MinkError::OffsetOutOfRange { .. } => Status::out_of_range(message),
        MinkError::Fenced(_) => Status::aborted(message),
        MinkError::LimitExceeded { .. } => Status::resource_exhausted(message),
        MinkError::Unimplemented(_) => Status::unimplemented(message),
        MinkError::Internal(_) => Status::internal(message),
    }
}

/// `status` with the `mink-applied-index` header.
fn with_applied_index(mut status: Status, index: u64) -> Status {
    if let Ok(v) = index.to_string().parse() {
        status.metadata_mut().insert(APPLIED_INDEX_HEADER, v);
    }
    status
}

/// Counts a Flight call and records its latency when dropped.
struct Observe {
    method: &'static str,
    action: Option<String>,
    start: std::time::Instant,
}

impl Observe {
    fn new(method: &'static str) -> Self {
        Self {
            method,
            action: None,
            start: std::time::Instant::now(),
        }
    }
}

impl Drop for Observe {
    fn drop(&mut self) {
        let seconds = self.start.elapsed().as_secs_f64();
        match self.action.take() {
            Some(action) => {
                metrics::counter!("mink_flight_actions_total", "action" => action.clone())
                    .increment(1);
                metrics::histogram!("mink_flight_action_seconds", "action" => action)
                    .record(seconds);
            }
            None => {
                metrics::counter!("mink_flight_requests_total", "method" => self.method)
                    .increment(1);
                metrics::histogram!("mink_flight_request_seconds", "method" => self.method)
                    .record(seconds);
            }
        }
    }
}

/// The Flight server.
pub struct FlightServer<S> {
    service: Arc<S>,
}

impl<S: MinkService> FlightServer<S> {
    pub fn new(service: Arc<S>) -> Self {
        Self { service }
    }

    async fn before<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if let Some(v) = request.metadata().get(MIN_APPLIED_INDEX_HEADER) {
            let index: u64 = v
                .to_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "{MIN_APPLIED_INDEX_HEADER} must be an integer"
                    ))
                })?;
            self.service.wait_applied(index).await.map_err(status)?;
        }
        Ok(())
    }

    /// Runs a call; its error status, if it fails, carries `mink-applied-index` as
    /// every response does.
    async fn stamped<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        call.await
            .map_err(|s| with_applied_index(s, self.service.applied_index()))
    }

    /// A response stream whose error status, if it ends with one, carries
    /// `mink-applied-index` (as of the error).
    fn stamp_stream<T: Send + 'static>(&self, stream: Stream<T>) -> Stream<T> {
        let service = self.service.clone();
        stream
            .map(move |item| item.map_err(|s| with_applied_index(s, service.applied_index())))
            .boxed()
    }

    fn respond<T>(&self, body: T) -> Response<T> {
        let mut response = Response::new(body);
        if let Ok(v) = self.service.applied_index().to_string().parse() {
            response.metadata_mut().insert(APPLIED_INDEX_HEADER, v);
        }
        response
    }
}

impl<S: MinkService> FlightServer<S> {
    /// A `Scan` with an `end_offset`: the rows of `[offset, end)`, read in successive
    /// scans and streamed as each is read, so a bucket of any size is read with one
    /// scan in memory. The first scan's error is the call's status; later ones end the
    /// stream.
    async fn scan_range(
        &self,
        bucket: mink_types::TableBucket,
        (offset, end): (i64, i64),
        max_bytes: Option<u64>,
        (columns, filter): (Option<Vec<String>>, Option<Filter>),
        options: IpcWriteOptions,
    ) -> Result<Response<Stream<FlightData>>, Status> {
        // The node decodes the columns answered and those the filter reads, no more.
        let decoded = ReadTicket::Scan {
            bucket,
            offset,
            max_bytes,
            end_offset: None,
            columns: columns.clone(),
            filter: filter.clone(),
        }
        .read_columns();
        let scan = move |from| ReadTicket::Scan {
            bucket,
            offset: from,
            max_bytes,
            end_offset: None,
            columns: decoded.clone(),
            filter: None,
        };
        let (schema, first) = self.service.read(scan(offset)).await.map_err(status)?;
        let shape = ReadShape::of(&schema, columns.as_deref(), filter.as_ref()).map_err(status)?;
        let schema = shape.schema().clone();
        // Cut at `end` first (by the rows as stored), then filtered and projected.
        let answer = move |batches: ReadBatches, from: i64| {
            let (kept, next) = below(batches, from, end)?;
            let mut shaped = Vec::with_capacity(kept.len());
            for b in kept {
                shaped.extend(shape.scan_batch(b).map_err(status)?);
            }
            Ok::<_, Status>((encode_batches(shaped, &options)?, next))
        };
        let (mut data, mut next) = answer(first, offset)?;
        data.insert(
            0,
            FlightData::from(SchemaAsIpc::new(&schema, &IpcWriteOptions::default())),
        );
        let service = self.service.clone();
        let answers = async_stream(move |tx| async move {
            loop {
                for d in data.drain(..) {
                    if tx.send(Ok(d)).await.is_err() {
                        return;
                    }
                }
                let Some(from) = next.filter(|n| *n < end) else {
                    return;
                };
                let read = service.read(scan(from)).await.map_err(status);
                match read.and_then(|(_, batches)| answer(batches, from)) {
                    Ok((d, n)) => (data, next) = (d, n),
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        Ok(self.respond(self.stamp_stream(answers)))
    }
}

/// A scan's batches from `from` cut at `end`; and the offset to scan next, `None`
/// when the scan made no progress (nothing more is readable).
fn below(
    batches: ReadBatches,
    from: i64,
    end: i64,
) -> Result<(Vec<ReadBatch>, Option<i64>), Status> {
    let ReadBatches::Scan(batches) = batches else {
        return Err(Status::internal(
            "a Scan answered with other than scan batches",
        ));
    };
    let mut next = from;
    let mut kept = Vec::with_capacity(batches.len());
    for (batch, mut meta) in batches {
        if meta.base_offset >= end {
            break;
        }
        let take = (end - meta.base_offset).min(batch.num_rows() as i64) as usize;
        if let Some(c) = meta.change_types.as_mut() {
            c.truncate(take);
        }
        next = meta.base_offset + take as i64;
        kept.push((batch.slice(0, take), meta));
    }
    let progressed = next > from;
    Ok((kept, progressed.then_some(next)))
}

/// The request header by which a reader asks for its rows' IPC bodies compressed:
/// `zstd` or `lz4` (Arrow IPC body compression, which pyarrow and arrow-rs read), or
/// `none`, the default. For readers across a network, where bytes cost more than the
/// CPU of both ends.
pub const READ_COMPRESSION_HEADER: &str = "mink-read-compression";

/// The IPC options of a read, from [`READ_COMPRESSION_HEADER`]; a value that is not
/// a codec is refused, naming the header.
fn read_options<T>(request: &Request<T>) -> Result<IpcWriteOptions, Status> {
    let Some(value) = request.metadata().get(READ_COMPRESSION_HEADER) else {
        return Ok(IpcWriteOptions::default());
    };
    let text = value.to_str().unwrap_or("");
    let compression: mink_types::Compression = text.parse().map_err(|_| {
        Status::invalid_argument(format!(
            "{READ_COMPRESSION_HEADER}: {text:?} is not one of zstd, lz4, none"
        ))
    })?;
    Ok(compression.ipc_options())
}

fn encode_read(
    schema: &SchemaRef,
    batches: ReadBatches,
    options: &IpcWriteOptions,
) -> Result<Vec<FlightData>, Status> {
    let mut out = vec![FlightData::from(SchemaAsIpc::new(schema, options))];
    out.extend(match batches {
        ReadBatches::Scan(b) => encode_batches(b, options)?,
        ReadBatches::Stream(_) | ReadBatches::SnapshotStream(_) => {
            return Err(Status::internal(
                "a streamed read reached the batch encoder",
            ));
        }
    });
    Ok(out)
}

/// A streamed read as Flight messages: the schema, then each batch as it comes; an
/// error ends the stream with its status.
fn stream_batches<M: serde::Serialize + Send + 'static>(
    schema: &SchemaRef,
    mut batches: futures::stream::BoxStream<'static, Result<(RecordBatch, M), MinkError>>,
    options: IpcWriteOptions,
) -> Stream<FlightData> {
    let head = FlightData::from(SchemaAsIpc::new(schema, &IpcWriteOptions::default()));
    async_stream(move |tx| async move {
        if tx.send(Ok(head)).await.is_err() {
            return;
        }
        while let Some(item) = batches.next().await {
            match item
                .map_err(status)
                .and_then(|b| encode_batches(vec![b], &options))
            {
                Ok(data) => {
                    for d in data {
                        if tx.send(Ok(d)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    })
}

/// Batches as Flight messages, each with its metadata as JSON app metadata.
fn encode_batches<M: serde::Serialize>(
    batches: Vec<(RecordBatch, M)>,
    options: &IpcWriteOptions,
) -> Result<Vec<FlightData>, Status> {
    let mut out = Vec::new();
    let generator = IpcDataGenerator::default();
    let mut tracker = DictionaryTracker::new(false);
    let mut context = IpcWriteContext::default();
    for (batch, meta) in batches {
        let (dicts, encoded) = generator
            .encode(&batch, &mut tracker, options, &mut context)
            .map_err(|e| Status::internal(format!("encoding a batch: {e}")))?;
        out.extend(dicts.into_iter().map(FlightData::from));
        let meta = serde_json::to_vec(&meta).map_err(|e| Status::internal(e.to_string()))?;
        out.push(FlightData::from(encoded).with_app_metadata(meta));
    }
    Ok(out)
}

type Stream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

#[async_trait]
impl<S: MinkService> FlightService for FlightServer<S> {
    type HandshakeStream = Stream<HandshakeResponse>;
    type ListFlightsStream = Stream<FlightInfo>;
    type DoGetStream = Stream<FlightData>;
    type DoPutStream = Stream<PutResult>;
    type DoActionStream = Stream<arrow_flight::Result>;
    type ListActionsStream = Stream<ActionType>;
    type DoExchangeStream = Stream<FlightData>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        self.stamped(async move {
            Err(Status::unimplemented(
                "Handshake is not served: Mink does not authenticate (spec/protocols.txt)",
            ))
        })
        .await
    }

    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        self.stamped(async move { Err(Status::unimplemented("PollFlightInfo is not served")) })
            .await
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("list_flights");
            self.before(&request).await?;
            let tables = self.service.tables().await.map_err(status)?;
            let infos: Vec<Result<FlightInfo, Status>> = tables
                .into_iter()
                .map(|(path, schema)| {
                    FlightInfo::new()
                        .try_with_schema(&schema)
                        .map(|i| {
                            i.with_descriptor(FlightDescriptor::new_path(vec![path.to_string()]))
                        })
                        .map_err(|e| Status::internal(e.to_string()))
                })
                .collect();
            Ok(self.respond(stream::iter(infos).boxed()))
        })
        .await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("get_flight_info");
            self.before(&request).await?;
            let path = descriptor_path(request.get_ref())?;
            let (schema, endpoints) = self.service.table_endpoints(&path).await.map_err(status)?;
            let mut info = FlightInfo::new()
                .try_with_schema(&schema)
                .map_err(|e| Status::internal(e.to_string()))?
                .with_descriptor(request.get_ref().clone())
                .with_total_records(endpoints.iter().map(|e| e.rows).sum());
            for e in endpoints {
                let ticket =
                    serde_json::to_vec(&e.ticket).map_err(|e| Status::internal(e.to_string()))?;
                let mut endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
                if let Some(leader) = e.leader {
                    endpoint = endpoint.with_location(format!("grpc://{leader}"));
                }
                info = info.with_endpoint(endpoint);
            }
            Ok(self.respond(info))
        })
        .await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("get_schema");
            self.before(&request).await?;
            let path = descriptor_path(request.get_ref())?;
            let schema = self.service.table_schema(&path).await.map_err(status)?;
            let result = SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
                .try_into()
                .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
            Ok(self.respond(result))
        })
        .await
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("do_get");
            self.before(&request).await?;
            let options = read_options(&request)?;
            let ticket: ReadTicket =
                parse_json("ticket", &request.get_ref().ticket).map_err(status)?;
            tracing::debug!(?ticket, "flight.do_get");
            if let ReadTicket::Scan {
                bucket,
                offset,
                max_bytes,
                end_offset: Some(end),
                columns,
                filter,
            } = ticket
            {
                return self
                    .scan_range(bucket, (offset, end), max_bytes, (columns, filter), options)
                    .await;
            }
            let columns = ticket.columns().map(<[String]>::to_vec);
            let filter = ticket.filter().cloned();
            let (schema, batches) = self.service.read(ticket).await.map_err(status)?;
            let shape =
                ReadShape::of(&schema, columns.as_deref(), filter.as_ref()).map_err(status)?;
            let batches = shape.apply_read(batches).map_err(status)?;
            let schema = shape.schema().clone();
            match batches {
                ReadBatches::Stream(batches) => {
                    let stream = stream_batches(&schema, batches, options);
                    return Ok(self.respond(self.stamp_stream(stream)));
                }
                ReadBatches::SnapshotStream(batches) => {
                    let stream = stream_batches(&schema, batches, options);
                    return Ok(self.respond(self.stamp_stream(stream)));
                }
                _ => {}
            }
            let data = encode_read(&schema, batches, &options)?;
            Ok(self.respond(stream::iter(data.into_iter().map(Ok)).boxed()))
        })
        .await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("do_put");
            self.before(&request).await?;
            let mut incoming = request.into_inner().peekable();
            // The descriptor arrives on the first message.
            let first = Pin::new(&mut incoming)
                .peek()
                .await
                .ok_or_else(|| Status::invalid_argument("an empty DoPut stream"))?
                .as_ref()
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let descriptor = first.flight_descriptor.as_ref().ok_or_else(|| {
                Status::invalid_argument("the first DoPut message carries no descriptor")
            })?;
            let descriptor: WriteDescriptor =
                parse_json("descriptor", &descriptor.cmd).map_err(status)?;
            let service = self.service.clone();
            let mut decoder = FlightDataDecoder::new(
                incoming.map_err(|e| arrow_flight::error::FlightError::Tonic(Box::new(e))),
            );
            // One span per DoPut stream, one inside it per batch: a slow write can be
            // followed through the node's logs (the JSON log format keeps the fields).
            let span = tracing::info_span!("flight.do_put", descriptor = ?descriptor);
            let results = async_stream(move |tx| {
                async move {
                    while let Some(item) = decoder.next().await {
                        let decoded = match item {
                            Ok(d) => d,
                            Err(e) => {
                                let _ = tx
                                    .send(Err(Status::invalid_argument(format!(
                                        "bad Arrow IPC: {e}"
                                    ))))
                                    .await;
                                return;
                            }
                        };
                        let DecodedPayload::RecordBatch(batch) = decoded.payload else {
                            continue;
                        };
                        let meta: WriteBatch = if decoded.inner.app_metadata.is_empty() {
                            WriteBatch::default()
                        } else {
                            match parse_json("batch metadata", &decoded.inner.app_metadata) {
                                Ok(m) => m,
                                Err(e) => {
                                    let _ = tx.send(Err(status(e))).await;
                                    return;
                                }
                            }
                        };
                        metrics::counter!("mink_flight_put_batches_total").increment(1);
                        metrics::counter!("mink_flight_put_rows_total")
                            .increment(batch.num_rows() as u64);
                        // The bytes the batch was decoded from, without a copy.
                        let ipc = IpcEncoded {
                            message: Buffer::from(decoded.inner.data_header.clone()),
                            body: Buffer::from(decoded.inner.data_body.clone()),
                        };
                        let batch_span = tracing::debug_span!(
                            "batch",
                            sequence = ?meta.batch_sequence,
                            rows = batch.num_rows()
                        );
                        let result = service
                            .write(&descriptor, batch, Some(ipc), meta)
                            .instrument(batch_span)
                            .await;
                        let message = match result {
                            Ok(r) => serde_json::to_vec(&r)
                                .map(|m| PutResult {
                                    app_metadata: m.into(),
                                })
                                .map_err(|e| Status::internal(e.to_string())),
                            Err(e) => Err(status(e)),
                        };
                        let failed = message.is_err();
                        if tx.send(message).await.is_err() || failed {
                            return;
                        }
                    }
                }
                .instrument(span)
            });
            Ok(self.respond(self.stamp_stream(results)))
        })
        .await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        self.stamped(async move {
            let mut observe = Observe::new("do_action");
            self.before(&request).await?;
            let request = request.get_ref();
            let action =
                crate::actions::Action::parse(&request.r#type, &request.body).map_err(status)?;
            // Labelled only with known names: a client cannot grow the label set.
            observe.action = Some(action.name().to_string());
            let span = tracing::info_span!("flight.do_action", action = action.name());
            let body = self
                .service
                .action(action)
                .instrument(span)
                .await
                .map_err(status)?;
            let result = arrow_flight::Result { body: body.into() };
            Ok(self.respond(stream::iter(vec![Ok(result)]).boxed()))
        })
        .await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("list_actions");
            self.before(&request).await?;
            let actions: Vec<Result<ActionType, Status>> = ACTIONS
                .iter()
                .map(|(name, description)| {
                    Ok(ActionType {
                        r#type: name.to_string(),
                        description: description.to_string(),
                    })
                })
                .collect();
            Ok(self.respond(stream::iter(actions).boxed()))
        })
        .await
    }

    /// Tail: the first message names the bucket (`{"Tail": {"bucket": ...}}`); every
    /// client message's app metadata is a `TailPoll`. Each poll is answered with its
    /// batches (the schema first, once) and a `TailEnd` message.
    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.stamped(async move {
            let _observe = Observe::new("do_exchange");
            self.before(&request).await?;
            let options = read_options(&request)?;
            let mut incoming = request.into_inner();
            let first = incoming
                .message()
                .await?
                .ok_or_else(|| Status::invalid_argument("an empty DoExchange stream"))?;
            let descriptor = first.flight_descriptor.as_ref().ok_or_else(|| {
                Status::invalid_argument("the first DoExchange message carries no descriptor")
            })?;
            let ExchangeDescriptor::Tail { bucket } =
                parse_json("descriptor", &descriptor.cmd).map_err(status)?;
            let service = self.service.clone();
            let answers = async_stream(move |tx| async move {
                // Clients may send the descriptor alone first, then the polls.
                let mut message = if first.app_metadata.is_empty() {
                    match incoming.message().await {
                        Ok(m) => m,
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                } else {
                    Some(first)
                };
                let mut schema_sent = false;
                while let Some(m) = message.take() {
                    let poll: TailPoll = match parse_json("tail poll", &m.app_metadata) {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = tx.send(Err(status(e))).await;
                            return;
                        }
                    };
                    let offset = poll.offset;
                    let (schema, batches, high_watermark) = match service.tail(bucket, poll).await {
                        Ok(answer) => answer,
                        Err(e) => {
                            let _ = tx.send(Err(status(e))).await;
                            return;
                        }
                    };
                    let next_offset = batches
                        .last()
                        .map_or(offset, |(b, meta)| meta.base_offset + b.num_rows() as i64);
                    let mut data = Vec::new();
                    if !schema_sent {
                        data.push(FlightData::from(SchemaAsIpc::new(&schema, &options)));
                        schema_sent = true;
                    }
                    match encode_batches(batches, &options) {
                        Ok(d) => data.extend(d),
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                    let end = serde_json::to_vec(&TailEnd::TailEnd {
                        next_offset,
                        high_watermark,
                    })
                    .unwrap_or_default();
                    data.push(FlightData::new().with_app_metadata(end));
                    for d in data {
                        if tx.send(Ok(d)).await.is_err() {
                            return;
                        }
                    }
                    message = match incoming.message().await {
                        Ok(m) => m,
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    };
                }
            });
            Ok(self.respond(self.stamp_stream(answers)))
        })
        .await
    }
}

/// A table path from a descriptor: a path of one `db.table` element, or a command
/// holding `{"path": "db.table"}`.
fn descriptor_path(descriptor: &FlightDescriptor) -> Result<TablePath, Status> {
    if let [one] = descriptor.path.as_slice() {
        return TablePath::parse(one).map_err(status);
    }
    #[derive(serde::Deserialize)]
    struct PathCmd {
        path: TablePath,
    }
    let cmd: PathCmd = parse_json("descriptor", &descriptor.cmd).map_err(status)?;
    Ok(cmd.path)
}

/// A stream fed by a task through a bounded channel.
fn async_stream<T, F, Fut>(f: F) -> Stream<T>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_error_message_is_cut_to_fit_a_grpc_header() {
        let huge = MinkError::Internal("é".repeat(10_000));
        let message = status(huge).message().to_string();
        assert!(
            message.len() <= STATUS_MESSAGE_BYTES_MAX,
            "{}",
            message.len()
        );
        assert!(
            message.ends_with("(message cut from 20016 bytes)"),
            "{message}"
        );
        let small = status(MinkError::NotFound("table db.t".into()));
        assert_eq!(small.message(), "not found: table db.t");
    }
}
