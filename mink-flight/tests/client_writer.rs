//! The Rust client's idempotent writer against an in-process Flight server whose
//! service keeps writer windows as a leader does, and can be told to answer an error
//! after it recorded a batch (as a node does when its KV flush fails after the
//! changelog is durable). The client must never send a different batch under a
//! sequence the server may already hold.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use arrow::array::{AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{Int64Type, SchemaRef};
use arrow_flight::flight_service_server::FlightServiceServer;
use async_trait::async_trait;
use mink_flight::MinkClient;
use mink_flight::protocol::{TailPoll, WriteBatch, WriteDescriptor, WriteResult};
use mink_flight::server::{FlightServer, MinkService, ReadBatch};
use mink_types::{
    Column, DataType, MinkError, Result, Schema, TableBucket, TableDescriptor, TablePath,
};

const TABLE_ID: i64 = 1;
const BUCKET: TableBucket = TableBucket {
    table_id: TABLE_ID,
    partition_id: None,
    bucket: 0,
};

fn schema() -> Schema {
    Schema::new(1, vec![Column::new("id", DataType::BigInt, false)])
}

fn rows(ids: &[i64]) -> RecordBatch {
    RecordBatch::try_new(
        schema().to_arrow(),
        vec![Arc::new(Int64Array::from(ids.to_vec()))],
    )
    .unwrap()
}

/// One batch the service holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    writer_id: i64,
    sequence: i64,
    ids: Vec<i64>,
}

/// How the service answers one write.
enum Fault {
    /// Fails without recording the batch.
    Refuse(MinkError),
    /// Records the batch, then answers this error.
    AfterRecording(MinkError),
}

#[derive(Default)]
struct State {
    next_writer_id: i64,
    /// The bucket's log, in offset order (one row per offset).
    log: Vec<Held>,
    /// Per writer: `(sequence, first offset, last offset)` of its batches.
    windows: HashMap<i64, Vec<(i64, i64, i64)>>,
    /// How the next writes are answered, one each; then normally.
    faults: VecDeque<Fault>,
    /// How long the answer to the next write that records its batch is held.
    stall_next: Option<std::time::Duration>,
}

/// A one-bucket leader with writer windows (duplicate: original offsets; a gap:
/// out of order).
struct Leader {
    addr: String,
    state: Mutex<State>,
}

impl Leader {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    fn log(&self) -> Vec<Held> {
        self.with(|s| s.log.clone())
    }

    fn ids(&self) -> Vec<i64> {
        self.log().into_iter().flat_map(|h| h.ids).collect()
    }
}

#[async_trait]
impl MinkService for Leader {
    fn applied_index(&self) -> u64 {
        0
    }

    async fn wait_applied(&self, _: u64) -> Result<()> {
        Ok(())
    }

    async fn action(&self, name: &str, _: &[u8]) -> Result<Vec<u8>> {
        let body = match name {
            "init_writer" => {
                let id = self.with(|s| {
                    s.next_writer_id += 1;
                    s.next_writer_id
                });
                serde_json::json!({ "writer_id": id })
            }
            "metadata" => serde_json::json!({
                "table": {
                    "id": TABLE_ID,
                    "descriptor": TableDescriptor::log_table(schema()),
                },
                "buckets": [{ "bucket": BUCKET, "leader_address": self.addr }],
            }),
            other => return Err(MinkError::Unimplemented(format!("action {other}"))),
        };
        serde_json::to_vec(&body).map_err(|e| MinkError::Internal(e.to_string()))
    }

    async fn write(
        &self,
        descriptor: &WriteDescriptor,
        batch: RecordBatch,
        meta: WriteBatch,
    ) -> Result<WriteResult> {
        let WriteDescriptor::Append {
            writer_id: Some(writer_id),
            ..
        } = descriptor
        else {
            return Err(MinkError::invalid("descriptor", "an idempotent Append"));
        };
        let sequence = meta
            .batch_sequence
            .ok_or_else(|| MinkError::invalid("batch_sequence", "missing"))?;
        let (answer, stall) = self.with(|s| {
            let answer = Self::answer(s, *writer_id, sequence, &batch);
            let stall = if answer.as_ref().is_ok_and(|w| {
                matches!(
                    w,
                    WriteResult::Written {
                        duplicated: false,
                        ..
                    }
                )
            }) {
                s.stall_next.take()
            } else {
                None
            };
            (answer, stall)
        });
        if let Some(stall) = stall {
            tokio::time::sleep(stall).await;
        }
        answer
    }

    async fn read(
        &self,
        _: mink_flight::protocol::ReadTicket,
    ) -> Result<(SchemaRef, Vec<ReadBatch>)> {
        Err(MinkError::Unimplemented("read".into()))
    }

    async fn table_schema(&self, _: &TablePath) -> Result<SchemaRef> {
        Ok(schema().to_arrow())
    }

    async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>> {
        Ok(vec![])
    }

    async fn tail(&self, _: TableBucket, _: TailPoll) -> Result<(SchemaRef, Vec<ReadBatch>, i64)> {
        Err(MinkError::Unimplemented("tail".into()))
    }
}

impl Leader {
    /// Answers one write as the leader does (after the next scripted fault, if any).
    fn answer(
        s: &mut State,
        writer_id: i64,
        sequence: i64,
        batch: &RecordBatch,
    ) -> Result<WriteResult> {
        let fault = s.faults.pop_front();
        if let Some(Fault::Refuse(e)) = fault {
            return Err(e);
        }
        let window = s.windows.entry(writer_id).or_default();
        if let Some((_, first, last)) = window.iter().find(|(q, _, _)| *q == sequence) {
            return Ok(WriteResult::Written {
                first_offset: *first,
                last_offset: *last,
                duplicated: true,
            });
        }
        if let Some((latest, _, _)) = window.last()
            && sequence != latest + 1
        {
            return Err(MinkError::OutOfOrderSequence {
                bucket: BUCKET,
                writer_id,
                first_sequence: sequence,
                expected: latest + 1,
            });
        }
        let first = s.log.iter().map(|h| h.ids.len() as i64).sum::<i64>();
        let last = first + batch.num_rows() as i64 - 1;
        window.push((sequence, first, last));
        s.log.push(Held {
            writer_id,
            sequence,
            ids: batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec(),
        });
        match fault {
            Some(Fault::AfterRecording(e)) => Err(e),
            _ => Ok(WriteResult::Written {
                first_offset: first,
                last_offset: last,
                duplicated: false,
            }),
        }
    }
}

/// Serves a [`Leader`] on a loopback port; returns it and a connected client.
async fn start() -> (Arc<Leader>, MinkClient) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let leader = Arc::new(Leader {
        addr: addr.clone(),
        state: Mutex::new(State::default()),
    });
    let service = FlightServiceServer::new(FlightServer::new(leader.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let client = MinkClient::connect(&addr).await.unwrap();
    (leader, client)
}

fn path() -> TablePath {
    TablePath::parse("db.events").unwrap()
}

#[tokio::test]
async fn a_write_answered_internal_after_recording_retires_the_writer() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1, 2])).await.unwrap();
    // The leader records the next batch, then fails (its KV flush, say).
    leader.with(|s| {
        s.faults
            .push_back(Fault::AfterRecording(MinkError::Internal(
                "the KV flush failed".into(),
            )))
    });
    let err = client.append(&path(), &rows(&[3, 4])).await.unwrap_err();
    assert!(matches!(err, MinkError::Internal(_)), "{err:?}");
    // The next, different batch must be written, not answered as that one's duplicate.
    let written = client.append(&path(), &rows(&[5, 6])).await.unwrap();
    assert_eq!(written.len(), 1);
    assert!(
        !written[0].duplicated,
        "the batch was taken for a retry of the one whose outcome was unknown: {written:?}"
    );
    assert_eq!((written[0].first_offset, written[0].last_offset), (4, 5));
    assert_eq!(leader.ids(), vec![1, 2, 3, 4, 5, 6]);
    let log = leader.log();
    assert_eq!(
        (log[1].writer_id, log[1].sequence),
        (log[0].writer_id, 1),
        "the unknown outcome was the old writer's second batch"
    );
    assert_ne!(
        log[2].writer_id, log[0].writer_id,
        "a write whose outcome is unknown retires the writer"
    );
}

#[tokio::test]
async fn a_write_refused_before_recording_keeps_the_writer_and_its_sequence() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1])).await.unwrap();
    leader.with(|s| {
        s.faults.push_back(Fault::Refuse(MinkError::SchemaMismatch(
            "rows are written under schema 1, the table is at schema 2".into(),
        )))
    });
    let err = client.append(&path(), &rows(&[2])).await.unwrap_err();
    assert!(matches!(err, MinkError::SchemaMismatch(_)), "{err:?}");
    client.append(&path(), &rows(&[3])).await.unwrap();
    let log = leader.log();
    assert_eq!(leader.ids(), vec![1, 3]);
    assert_eq!(
        (log[1].writer_id, log[1].sequence),
        (log[0].writer_id, 1),
        "a refused batch does not use up its sequence, nor the writer"
    );
}

#[tokio::test]
async fn an_out_of_order_answer_retires_the_writer() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1])).await.unwrap();
    client.append(&path(), &rows(&[2])).await.unwrap();
    // The leader forgot the writer's last batch (a batch that wrote nothing is kept
    // in memory only, and the leader restarted): the client's next sequence is a gap.
    leader.with(|s| {
        for w in s.windows.values_mut() {
            w.pop();
        }
    });
    let err = client.append(&path(), &rows(&[3])).await.unwrap_err();
    assert!(err.to_string().contains("out-of-order sequence"), "{err:?}");
    // This writer's sequences no longer match the leader's: a fresh writer writes on.
    client.append(&path(), &rows(&[4])).await.unwrap();
    let log = leader.log();
    assert_eq!(leader.ids(), vec![1, 2, 4]);
    assert_ne!(log[2].writer_id, log[0].writer_id);
    assert_eq!(log[2].sequence, 0);
}

#[tokio::test]
async fn a_refusal_after_an_attempt_that_may_have_landed_retires_the_writer() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1])).await.unwrap();
    // The first attempt is recorded but its answer lost; the retry is refused (the
    // table changed meanwhile, say). The sequence is taken all the same.
    leader.with(|s| {
        s.faults
            .push_back(Fault::AfterRecording(MinkError::Unavailable(
                "connection reset".into(),
            )));
        s.faults.push_back(Fault::Refuse(MinkError::SchemaMismatch(
            "the table is at schema 2".into(),
        )));
    });
    let err = client.append(&path(), &rows(&[2])).await.unwrap_err();
    assert!(matches!(err, MinkError::SchemaMismatch(_)), "{err:?}");
    let written = client.append(&path(), &rows(&[3])).await.unwrap();
    assert!(!written[0].duplicated, "{written:?}");
    assert_eq!(leader.ids(), vec![1, 2, 3]);
    let log = leader.log();
    assert_ne!(log[2].writer_id, log[0].writer_id);
}

#[tokio::test]
async fn a_write_its_caller_gave_up_on_retires_the_writer() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1])).await.unwrap();
    // The leader records the next batch but answers late; the caller stops waiting
    // first (a timeout around `append`), so the client never learns the outcome.
    leader.with(|s| s.stall_next = Some(std::time::Duration::from_secs(2)));
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        client.append(&path(), &rows(&[2])),
    )
    .await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    assert_eq!(leader.ids(), vec![1, 2], "the leader recorded it");
    // The next, different batch must be written, not answered as that one's duplicate
    // (its sequence is taken). (Found by the seeded model test.)
    let written = client.append(&path(), &rows(&[3])).await.unwrap();
    assert!(!written[0].duplicated, "{written:?}");
    assert_eq!((written[0].first_offset, written[0].last_offset), (2, 2));
    assert_eq!(leader.ids(), vec![1, 2, 3]);
    let log = leader.log();
    assert_ne!(
        log[2].writer_id, log[0].writer_id,
        "a write abandoned mid-flight retires the writer"
    );
}
