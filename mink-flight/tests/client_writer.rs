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
use mink_flight::server::{FlightServer, MinkService, ReadBatch, ReadBatches, TableEndpoint};
use mink_types::{
    Column, DataType, IpcEncoded, MinkError, Result, Schema, TableBucket, TableDescriptor,
    TablePath,
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
    /// When set, every write waits `base + (sequence × 7 mod 5) ms` before the leader
    /// looks at it, so that a later batch can overtake an earlier one.
    delay: Option<std::time::Duration>,
    /// Writes being handled now, and the most at once.
    in_flight: usize,
    max_in_flight: usize,
    /// The most writes at once before the first one was recorded.
    max_in_flight_before_first: usize,
    /// Writes refused as out of order.
    out_of_order: usize,
    /// Whether a writer without a window starts only at sequence 0 (a primary-key
    /// tablet), else anywhere.
    strict_start: bool,
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

    async fn action(&self, action: mink_flight::actions::Action) -> Result<Vec<u8>> {
        let body = match action.name() {
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
        _ipc: Option<IpcEncoded>,
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
        let delay = self.with(|s| {
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
            if s.log.is_empty() {
                s.max_in_flight_before_first = s.max_in_flight_before_first.max(s.in_flight);
            }
            s.delay
        });
        if let Some(base) = delay {
            let jitter = std::time::Duration::from_millis((sequence as u64 * 7) % 5);
            tokio::time::sleep(base + jitter).await;
        }
        let (answer, stall) = self.with(|s| {
            s.in_flight -= 1;
            let answer = Self::answer(s, *writer_id, sequence, &batch);
            if matches!(answer, Err(MinkError::OutOfOrderSequence { .. })) {
                s.out_of_order += 1;
            }
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

    async fn read(&self, _: mink_flight::protocol::ReadTicket) -> Result<(SchemaRef, ReadBatches)> {
        Err(MinkError::Unimplemented("read".into()))
    }

    async fn table_schema(&self, _: &TablePath) -> Result<SchemaRef> {
        Ok(schema().to_arrow())
    }

    async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>> {
        Ok(vec![])
    }

    async fn table_endpoints(&self, _: &TablePath) -> Result<(SchemaRef, Vec<TableEndpoint>)> {
        Err(MinkError::Unimplemented("table_endpoints".into()))
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
        let expected = match window.last() {
            Some((latest, _, _)) => Some(latest + 1),
            None => s.strict_start.then_some(0),
        };
        if let Some(expected) = expected
            && sequence != expected
        {
            return Err(MinkError::OutOfOrderSequence {
                bucket: BUCKET,
                writer_id,
                first_sequence: sequence,
                expected,
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

/// A leader that refuses a writer's next batch as out of order, with nothing of the
/// writer in flight or unresolved, did not record it: the writer's sequences no longer
/// match the leader's window, and the batch goes once more under a fresh writer.
#[tokio::test]
async fn an_out_of_order_answer_sends_the_batch_again_under_a_new_writer() {
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
    let written = client.append(&path(), &rows(&[3])).await.unwrap();
    assert!(!written[0].duplicated, "{written:?}");
    client.append(&path(), &rows(&[4])).await.unwrap();
    let log = leader.log();
    assert_eq!(leader.ids(), vec![1, 2, 3, 4]);
    assert_ne!(log[2].writer_id, log[0].writer_id);
    assert_eq!((log[2].sequence, log[3].sequence), (0, 1));
    assert_eq!(log[3].writer_id, log[2].writer_id);
}

/// The same after an attempt that may have been recorded (its answer lost as the
/// leader restarted): the leader's window ends before a sequence the client had
/// acknowledged, so no attempt of this batch can be in it, and the batch goes again
/// under a new writer rather than failing.
#[tokio::test]
async fn an_out_of_order_answer_behind_acknowledged_sequences_restarts_the_writer() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1])).await.unwrap();
    client.append(&path(), &rows(&[2])).await.unwrap();
    leader.with(|s| {
        s.strict_start = true;
        for w in s.windows.values_mut() {
            w.pop();
        }
        s.faults.push_back(Fault::Refuse(MinkError::Unavailable(
            "connection reset".into(),
        )));
    });
    let written = client.append(&path(), &rows(&[3])).await.unwrap();
    assert!(!written[0].duplicated, "{written:?}");
    let log = leader.log();
    assert_eq!(leader.ids(), vec![1, 2, 3]);
    assert_ne!(log[2].writer_id, log[0].writer_id);
    assert_eq!(log[2].sequence, 0);
    assert_eq!(leader.with(|s| s.out_of_order), 1);
}

/// But a leader that does not know the writer at all (its window evicted, or its
/// batches trimmed away) may have recorded the attempt whose answer was lost: the
/// client does not send the batch again, and retires the writer.
#[tokio::test]
async fn an_out_of_order_answer_from_a_leader_that_forgot_the_writer_is_not_resent() {
    let (leader, client) = start().await;
    client.append(&path(), &rows(&[1])).await.unwrap();
    client.append(&path(), &rows(&[2])).await.unwrap();
    leader.with(|s| {
        s.strict_start = true;
        s.windows.clear();
        s.faults.push_back(Fault::Refuse(MinkError::Unavailable(
            "connection reset".into(),
        )));
    });
    let err = client.append(&path(), &rows(&[3])).await.unwrap_err();
    assert!(
        matches!(err, MinkError::OutOfOrderSequence { expected: 0, .. }),
        "{err:?}"
    );
    client.append(&path(), &rows(&[4])).await.unwrap();
    let log = leader.log();
    assert_eq!(leader.ids(), vec![1, 2, 4]);
    assert_ne!(log[2].writer_id, log[0].writer_id);
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
    // (its sequence is taken). (Found by the seeded model test below.)
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

// ---------------------------------------------------------------------------------
// A seeded model test of the client's sequence handling against injected errors.
//
// A leader of a few buckets keeps real writer windows (the last five batches of each
// writer: a retry of one is answered with its original offsets; a gap is out of
// order; a writer's first batch may start anywhere) and injects, by seed, errors
// before recording a batch (NotLeader, Unavailable, InvalidArgument, a dropped
// connection) and after (Internal, Unavailable, a dropped connection: a TCP proxy in
// front of it cuts every connection). A few tasks write many batches through one real
// MinkClient; now and then a task stops waiting for a write (its own timeout), and a
// task that gets an error (or gave up) may send the same rows again, as an application
// would. The checker:
// - every batch the client reported written is in its bucket's log at the offsets
//   returned, and those offsets hold that batch, not another (no batch answered as a
//   duplicate of a different one);
// - the leader never saw a sequence it holds for one batch arrive with another batch;
// - a batch is in the log more than once only if the client reported an error for it,
//   at most once per error reported (at-least-once after errors; counted);
// - no write hangs (a watchdog on the wall clock).
//
// Paused time on a current-thread runtime, over real loopback sockets: a fault is a
// function of (seed, batch, attempt), so a seed replays its faults, but the socket
// readiness order may differ between runs. `MINK_CLIENT_MODEL_SEEDS=N` runs seeds
// `0..N` (default 20), `MINK_CLIENT_MODEL_SEED=S` one, `MINK_CLIENT_MODEL_TRACE=1`
// prints each write; the failing seed is named.

mod seeded {
    use std::collections::{BTreeMap, HashMap, VecDeque};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use arrow::array::{AsArray, RecordBatch};
    use arrow::datatypes::{Int64Type, SchemaRef};
    use arrow_flight::flight_service_server::FlightServiceServer;
    use async_trait::async_trait;
    use mink_flight::MinkClient;
    use mink_flight::protocol::{
        BucketWritten, TailPoll, WriteBatch, WriteDescriptor, WriteResult,
    };
    use mink_flight::server::{FlightServer, MinkService, ReadBatch};
    use mink_types::{MinkError, Result, TableBucket, TableDescriptor, TablePath};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tokio::net::{TcpListener, TcpStream};

    use super::{TABLE_ID, path, rows, schema};

    const BUCKETS: u32 = 3;
    const TASKS: u64 = 4;
    const BATCHES_PER_TASK: u64 = 40;
    /// Times a task sends the rows of a batch the client reported an error for.
    const RESENDS_MAX: u32 = 2;
    /// Batches of a writer the leader remembers (as `mink_log::window::WINDOW_BATCHES`).
    const WINDOW_BATCHES: usize = 5;
    /// A seed that takes longer (real time) has hung. Virtual time cannot tell: with
    /// real sockets, a paused clock may jump ahead while a reply is on its way, so a
    /// virtual timeout could cancel a write that was fine (and a cancelled write is
    /// a fault of its own).
    const HUNG: Duration = Duration::from_secs(120);

    fn mix(mut x: u64) -> u64 {
        // splitmix64: a fault is a function of (seed, batch, attempt), whatever the
        // interleaving.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    /// A TCP proxy in front of the leader that can cut every connection at once (a
    /// dropped connection, as the client sees it).
    struct Proxy {
        addr: String,
        connections: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    }

    impl Proxy {
        async fn start(target: String) -> Arc<Self> {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let proxy = Arc::new(Self {
                addr: listener.local_addr().unwrap().to_string(),
                connections: Mutex::new(Vec::new()),
            });
            let p = proxy.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let target = target.clone();
                    // Without it, small writes wait for delayed ACKs (real time).
                    let _ = inbound.set_nodelay(true);
                    let relay = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(&target).await {
                            let _ = outbound.set_nodelay(true);
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    let mut connections = p.connections.lock().unwrap();
                    connections.retain(|c| !c.is_finished());
                    connections.push(relay);
                }
            });
            proxy
        }

        fn cut(&self) {
            for c in self.connections.lock().unwrap().drain(..) {
                c.abort();
            }
        }
    }

    #[derive(Debug, Clone)]
    struct Record {
        writer_id: i64,
        sequence: i64,
        batch: u64,
        first: i64,
        last: i64,
    }

    #[derive(Default)]
    struct BucketState {
        log: Vec<Record>,
        next_offset: i64,
        /// Per writer: its last batches, `(sequence, batch, first, last)`.
        windows: HashMap<i64, VecDeque<(i64, u64, i64, i64)>>,
    }

    #[derive(Default)]
    struct State {
        next_writer_id: i64,
        buckets: BTreeMap<u32, BucketState>,
        /// Attempts seen per batch (the fault of an attempt is decided by it).
        attempts: HashMap<u64, u64>,
        violations: Vec<String>,
        events: BTreeMap<&'static str, u64>,
    }

    struct SeededLeader {
        seed: u64,
        proxy: Mutex<Option<Arc<Proxy>>>,
        state: Mutex<State>,
        writes: AtomicU64,
    }

    /// What the leader does with one write attempt.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Fault {
        None,
        NotLeader,
        UnavailableBefore,
        Refused,
        DropBefore,
        InternalAfter,
        UnavailableAfter,
        DropAfter,
    }

    impl SeededLeader {
        fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
            f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
        }

        fn addr(&self) -> String {
            self.proxy
                .lock()
                .unwrap()
                .as_ref()
                .map(|p| p.addr.clone())
                .unwrap_or_default()
        }

        fn cut(&self) {
            if let Some(p) = self.proxy.lock().unwrap().as_ref() {
                p.cut();
            }
        }

        fn fault(&self, batch: u64, attempt: u64) -> Fault {
            match mix(self.seed ^ mix(batch) ^ attempt.wrapping_mul(0x51ED)) % 100 {
                0..=4 => Fault::NotLeader,
                5..=9 => Fault::UnavailableBefore,
                10..=11 => Fault::Refused,
                12..=13 => Fault::DropBefore,
                14..=17 => Fault::InternalAfter,
                18..=21 => Fault::UnavailableAfter,
                22..=25 => Fault::DropAfter,
                _ => Fault::None,
            }
        }

        /// Records the batch (or answers a retry of a recorded one) as a leader does.
        fn record(
            &self,
            bucket: u32,
            writer_id: i64,
            sequence: i64,
            batch: u64,
            rows: i64,
        ) -> Result<WriteResult> {
            self.with(|s| {
                let b = s.buckets.entry(bucket).or_default();
                let window = b.windows.entry(writer_id).or_default();
                if let Some(&(_, held, first, last)) =
                    window.iter().find(|(q, _, _, _)| *q == sequence)
                {
                    if held != batch {
                        s.violations.push(format!(
                            "bucket {bucket}: writer {writer_id} sent batch {batch} under \
                             sequence {sequence}, which holds batch {held}"
                        ));
                    }
                    *s.events.entry("answered as a duplicate").or_default() += 1;
                    return Ok(WriteResult::Written {
                        first_offset: first,
                        last_offset: last,
                        duplicated: true,
                    });
                }
                if let Some(&(latest, _, _, _)) = window.back()
                    && sequence != latest + 1
                {
                    *s.events.entry("refused out of order").or_default() += 1;
                    return Err(MinkError::OutOfOrderSequence {
                        bucket: TableBucket::new(TABLE_ID, None, bucket),
                        writer_id,
                        first_sequence: sequence,
                        expected: latest + 1,
                    });
                }
                let first = b.next_offset;
                let last = first + rows - 1;
                b.next_offset = last + 1;
                window.push_back((sequence, batch, first, last));
                while window.len() > WINDOW_BATCHES {
                    window.pop_front();
                }
                b.log.push(Record {
                    writer_id,
                    sequence,
                    batch,
                    first,
                    last,
                });
                Ok(WriteResult::Written {
                    first_offset: first,
                    last_offset: last,
                    duplicated: false,
                })
            })
        }
    }

    #[async_trait]
    impl MinkService for SeededLeader {
        fn applied_index(&self) -> u64 {
            0
        }

        async fn wait_applied(&self, _: u64) -> Result<()> {
            Ok(())
        }

        async fn action(&self, action: mink_flight::actions::Action) -> Result<Vec<u8>> {
            let body = match action.name() {
                "init_writer" => {
                    let id = self.with(|s| {
                        s.next_writer_id += 1;
                        s.next_writer_id
                    });
                    serde_json::json!({ "writer_id": id })
                }
                "metadata" => {
                    let descriptor = TableDescriptor {
                        bucket_count: BUCKETS,
                        ..TableDescriptor::log_table(schema())
                    };
                    let addr = self.addr();
                    let buckets: Vec<_> = (0..BUCKETS)
                        .map(|b| {
                            serde_json::json!({
                                "bucket": TableBucket::new(TABLE_ID, None, b),
                                "leader_address": addr,
                            })
                        })
                        .collect();
                    serde_json::json!({
                        "table": { "id": TABLE_ID, "descriptor": descriptor },
                        "buckets": buckets,
                    })
                }
                other => return Err(MinkError::Unimplemented(format!("action {other}"))),
            };
            serde_json::to_vec(&body).map_err(|e| MinkError::Internal(e.to_string()))
        }

        async fn write(
            &self,
            descriptor: &WriteDescriptor,
            batch: RecordBatch,
            _ipc: Option<mink_types::IpcEncoded>,
            meta: WriteBatch,
        ) -> Result<WriteResult> {
            let WriteDescriptor::Append {
                bucket,
                writer_id: Some(writer_id),
                ..
            } = descriptor
            else {
                return Err(MinkError::invalid("descriptor", "an idempotent Append"));
            };
            let sequence = meta
                .batch_sequence
                .ok_or_else(|| MinkError::invalid("batch_sequence", "missing"))?;
            let ids = batch.column(0).as_primitive::<Int64Type>();
            let id = (ids.value(0) / 10) as u64;
            let attempt = self.with(|s| {
                let n = s.attempts.entry(id).or_default();
                *n += 1;
                *n
            });
            let n = self.writes.fetch_add(1, Ordering::SeqCst);
            // Answers take a moment, so that the tasks' writes interleave.
            tokio::time::sleep(Duration::from_micros(mix(self.seed ^ n) % 3_000)).await;
            let fault = self.fault(id, attempt);
            self.with(|s| {
                *s.events
                    .entry(match fault {
                        Fault::None => "answered",
                        Fault::NotLeader => "fault: not leader",
                        Fault::UnavailableBefore => "fault: unavailable before recording",
                        Fault::Refused => "fault: refused",
                        Fault::DropBefore => "fault: connection dropped before recording",
                        Fault::InternalAfter => "fault: internal after recording",
                        Fault::UnavailableAfter => "fault: unavailable after recording",
                        Fault::DropAfter => "fault: connection dropped after recording",
                    })
                    .or_default() += 1
            });
            let rows = batch.num_rows() as i64;
            if std::env::var_os("MINK_CLIENT_MODEL_TRACE").is_some() {
                eprintln!(
                    "{:?} write bucket {} writer {writer_id} seq {sequence} batch {id} attempt {attempt}: {fault:?}",
                    tokio::time::Instant::now(),
                    bucket.bucket
                );
            }
            match fault {
                Fault::NotLeader => Err(MinkError::NotLeader {
                    bucket: *bucket,
                    leader: Some(self.addr()),
                }),
                Fault::UnavailableBefore => {
                    Err(MinkError::Unavailable(format!("{bucket} is being opened")))
                }
                Fault::Refused => Err(MinkError::invalid(
                    "batch",
                    "refused by a check before the log (injected)",
                )),
                Fault::DropBefore => {
                    self.cut();
                    Err(MinkError::Unavailable("the connection dropped".into()))
                }
                Fault::None => self.record(bucket.bucket, *writer_id, sequence, id, rows),
                Fault::InternalAfter | Fault::UnavailableAfter | Fault::DropAfter => {
                    let recorded = self.record(bucket.bucket, *writer_id, sequence, id, rows);
                    match (fault, recorded) {
                        (_, Err(e)) => Err(e),
                        (Fault::InternalAfter, Ok(_)) => {
                            Err(MinkError::Internal("the KV flush failed (injected)".into()))
                        }
                        (Fault::UnavailableAfter, Ok(_)) => Err(MinkError::Unavailable(
                            "the answer was lost (injected)".into(),
                        )),
                        (_, Ok(answer)) => {
                            self.cut();
                            Ok(answer)
                        }
                    }
                }
            }
        }

        async fn read(
            &self,
            _: mink_flight::protocol::ReadTicket,
        ) -> Result<(SchemaRef, mink_flight::server::ReadBatches)> {
            Err(MinkError::Unimplemented("read".into()))
        }

        async fn table_endpoints(
            &self,
            _: &TablePath,
        ) -> Result<(SchemaRef, Vec<mink_flight::server::TableEndpoint>)> {
            Err(MinkError::Unimplemented("table_endpoints".into()))
        }

        async fn table_schema(&self, _: &TablePath) -> Result<SchemaRef> {
            Ok(schema().to_arrow())
        }

        async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>> {
            Ok(vec![])
        }

        async fn tail(
            &self,
            _: TableBucket,
            _: TailPoll,
        ) -> Result<(SchemaRef, Vec<ReadBatch>, i64)> {
            Err(MinkError::Unimplemented("tail".into()))
        }
    }

    /// What the client answered for one call.
    enum Outcome {
        Written(Vec<BucketWritten>),
        Failed(MinkError),
        /// The task stopped waiting (dropped the call).
        Cancelled,
    }

    async fn task(client: Arc<MinkClient>, seed: u64, t: u64) -> Vec<(u64, Outcome)> {
        let mut rng = StdRng::seed_from_u64(seed ^ (0x7A5C << 8) ^ t);
        let mut out = Vec::new();
        for k in 0..BATCHES_PER_TASK {
            let batch = t * 1_000 + k;
            let n = rng.random_range(1..4);
            let ids: Vec<i64> = (0..n).map(|i| batch as i64 * 10 + i).collect();
            let mut resends = 0;
            loop {
                let (table, batch_rows) = (path(), rows(&ids));
                let append = client.append(&table, &batch_rows);
                // Now and then the application gives up on a write (its own timeout).
                let outcome = if rng.random_bool(0.05) {
                    let patience = Duration::from_micros(rng.random_range(0..3_000));
                    tokio::time::timeout(patience, append).await.ok()
                } else {
                    Some(append.await)
                };
                if std::env::var_os("MINK_CLIENT_MODEL_TRACE").is_some() {
                    eprintln!("client: batch {batch}: {outcome:?}");
                }
                match outcome {
                    Some(Ok(written)) => {
                        out.push((batch, Outcome::Written(written)));
                        break;
                    }
                    None => {
                        out.push((batch, Outcome::Cancelled));
                        if resends >= RESENDS_MAX || rng.random_bool(0.5) {
                            break;
                        }
                        resends += 1;
                    }
                    Some(Err(e)) => {
                        out.push((batch, Outcome::Failed(e)));
                        if resends >= RESENDS_MAX || rng.random_bool(0.5) {
                            break;
                        }
                        resends += 1;
                    }
                }
            }
            tokio::time::sleep(Duration::from_micros(rng.random_range(0..2_000))).await;
        }
        out
    }

    async fn run_seed(seed: u64) -> std::result::Result<BTreeMap<&'static str, u64>, String> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = listener.local_addr().unwrap().to_string();
        let leader = Arc::new(SeededLeader {
            seed,
            proxy: Mutex::new(None),
            state: Mutex::new(State::default()),
            writes: AtomicU64::new(0),
        });
        let service = FlightServiceServer::new(FlightServer::new(leader.clone()));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                ),
        );
        let proxy = Proxy::start(server_addr).await;
        *leader.proxy.lock().unwrap() = Some(proxy.clone());
        let client = Arc::new(
            MinkClient::connect(&proxy.addr)
                .await
                .map_err(|e| e.to_string())?,
        );
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| tokio::spawn(task(client.clone(), seed, t)))
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.extend(t.await.map_err(|e| format!("a task panicked: {e}"))?);
        }
        server.abort();
        proxy.cut();

        let mut state = std::mem::take(&mut *leader.state.lock().unwrap());
        let mut violations = std::mem::take(&mut state.violations);
        // Where each batch is in the logs.
        let mut placed: HashMap<u64, Vec<(u32, &Record)>> = HashMap::new();
        for (b, bucket) in &state.buckets {
            for r in &bucket.log {
                placed.entry(r.batch).or_default().push((*b, r));
            }
        }
        let mut errors: HashMap<u64, u64> = HashMap::new();
        let mut events = std::mem::take(&mut state.events);
        for (batch, outcome) in &outcomes {
            match outcome {
                Outcome::Failed(e) => {
                    *errors.entry(*batch).or_default() += 1;
                    *events
                        .entry(match e.kind() {
                            "internal" => "client: errors reported: internal",
                            "unavailable" => "client: errors reported: unavailable",
                            "invalid_argument" => "client: errors reported: invalid argument",
                            _ => "client: errors reported: other",
                        })
                        .or_default() += 1;
                }
                Outcome::Cancelled => {
                    *errors.entry(*batch).or_default() += 1;
                    *events.entry("client: calls cancelled").or_default() += 1;
                }
                Outcome::Written(written) => {
                    *events.entry("client: written").or_default() += 1;
                    if written.len() != 1 {
                        violations.push(format!("batch {batch} written as {written:?}"));
                        continue;
                    }
                    let w = &written[0];
                    let at = state.buckets.get(&w.bucket.bucket).and_then(|b| {
                        b.log
                            .iter()
                            .find(|r| r.first == w.first_offset && r.last == w.last_offset)
                    });
                    match at {
                        Some(r) if r.batch == *batch => {}
                        Some(r) => violations.push(format!(
                            "batch {batch} was answered written at {}..={} of bucket {}, which \
                             hold batch {} (writer {}, sequence {}): answered as another \
                             batch's duplicate",
                            w.first_offset,
                            w.last_offset,
                            w.bucket.bucket,
                            r.batch,
                            r.writer_id,
                            r.sequence
                        )),
                        None => violations.push(format!(
                            "batch {batch} was answered written at {}..={} of bucket {}, where \
                             no batch is",
                            w.first_offset, w.last_offset, w.bucket.bucket
                        )),
                    }
                }
            }
        }
        for (batch, at) in &placed {
            let copies = at.len() as u64;
            let errors = errors.get(batch).copied().unwrap_or(0);
            if copies > 1 + errors {
                violations.push(format!(
                    "batch {batch} is in the log {copies} times, but the client reported only \
                     {errors} errors (or cancelled calls) for it: {:?}",
                    at.iter()
                        .map(|(b, r)| (b, r.writer_id, r.sequence, r.first))
                        .collect::<Vec<_>>()
                ));
            }
            if copies > 1 {
                *events
                    .entry("at least once: extra copies after errors")
                    .or_default() += copies - 1;
            }
        }
        for (batch, outcome) in &outcomes {
            if matches!(outcome, Outcome::Written(_)) && !placed.contains_key(batch) {
                violations.push(format!(
                    "batch {batch} was answered written but is in no log"
                ));
            }
        }
        if violations.is_empty() {
            Ok(events)
        } else {
            violations.truncate(20);
            Err(violations.join("\n"))
        }
    }

    fn run_one(seed: u64) -> std::result::Result<BTreeMap<&'static str, u64>, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|e| e.to_string())?;
        // A watchdog on the wall clock: a write that never returns fails the seed.
        let (done, watched) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if watched.recv_timeout(HUNG).is_err() {
                eprintln!(
                    "seed {seed} hung: a write did not return within {HUNG:?} \
                     (replay: MINK_CLIENT_MODEL_SEED={seed})"
                );
                std::process::exit(101);
            }
        });
        let result = runtime.block_on(run_seed(seed));
        let _ = done.send(());
        let _ = watchdog.join();
        result
    }

    #[test]
    fn the_client_writes_each_batch_once_at_the_offsets_it_reports_against_injected_errors() {
        let seeds: Vec<u64> = match std::env::var("MINK_CLIENT_MODEL_SEED") {
            Ok(one) => vec![one.parse().expect("MINK_CLIENT_MODEL_SEED is a number")],
            Err(_) => {
                let n: u64 = std::env::var("MINK_CLIENT_MODEL_SEEDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(20);
                (0..n).collect()
            }
        };
        let started = std::time::Instant::now();
        let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut failed = Vec::new();
        for seed in &seeds {
            match run_one(*seed) {
                Ok(events) => {
                    for (k, v) in events {
                        *totals.entry(k).or_default() += v;
                    }
                }
                Err(why) => {
                    eprintln!(
                        "seed {seed} failed (replay: MINK_CLIENT_MODEL_SEED={seed}):\n{why}\n"
                    );
                    failed.push(*seed);
                }
            }
        }
        eprintln!(
            "{} seeds in {:.1} s: {totals:?}",
            seeds.len(),
            started.elapsed().as_secs_f64()
        );
        assert!(failed.is_empty(), "failed seeds: {failed:?}");
        assert!(
            totals.get("client: written").copied().unwrap_or(0) > seeds.len() as u64 * 50,
            "the tasks made progress: {totals:?}"
        );
    }
}

/// Many tasks appending through one client to one bucket: the client keeps up to five
/// batches in flight (the leader's window), the writer's first batch alone; batches
/// that overtake earlier ones are refused out of order and sent again. The log holds
/// every batch once, at the offsets each call reported, with the writer's sequences
/// contiguous in log order.
#[tokio::test]
async fn appends_of_one_bucket_are_pipelined_in_sequence_order() {
    let (leader, client) = start().await;
    leader.with(|s| s.delay = Some(std::time::Duration::from_millis(10)));
    let client = Arc::new(client);
    let tasks: Vec<_> = (0..10i64)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut written = Vec::new();
                for k in 0..6i64 {
                    let ids = [t * 100 + k * 2, t * 100 + k * 2 + 1];
                    let w = client.append(&path(), &rows(&ids)).await.unwrap();
                    written.push((ids, w[0].first_offset, w[0].last_offset));
                }
                written
            })
        })
        .collect();
    let mut calls = Vec::new();
    for t in tasks {
        calls.extend(t.await.unwrap());
    }
    let log = leader.log();
    assert_eq!(log.len(), 60, "every batch once");
    let writer = log[0].writer_id;
    for (i, held) in log.iter().enumerate() {
        assert_eq!(
            (held.writer_id, held.sequence),
            (writer, i as i64),
            "in sequence order"
        );
    }
    let ids = leader.ids();
    for (batch, first, last) in calls {
        assert_eq!(&ids[first as usize..=last as usize], &batch[..]);
    }
    let (max, before_first, out_of_order) = leader.with(|s| {
        (
            s.max_in_flight,
            s.max_in_flight_before_first,
            s.out_of_order,
        )
    });
    assert_eq!(before_first, 1, "a writer's first batch goes alone");
    assert!(
        (2..=5).contains(&max),
        "up to five batches of the bucket in flight, not {max}"
    );
    eprintln!("at most {max} in flight; {out_of_order} refused out of order and sent again");
}
