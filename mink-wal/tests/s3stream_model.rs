//! A property test of s3stream against a model: random appends, injected upload
//! failures and ambiguous timeouts, crashes, clean handovers and compactions on two
//! nodes sharing one store. After every step that reopens a stream, and at the end:
//! every acknowledged record is present, in order; the stream is contiguous; nothing
//! appears twice; nothing appears that was never appended.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use mink_wal::fault::{FaultConfig, FaultyStore};
use mink_wal::{Stream, StreamStore, WalConfig};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use proptest::prelude::*;

const NODES: usize = 2;
const STREAMS: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Append { stream: usize, count: u32 },
    FailNextPut,
    TimeOutNextPut,
    Crash { node: usize },
    Handover { stream: usize },
    Compact { node: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..STREAMS, 1u32..4).prop_map(|(stream, count)| Op::Append { stream, count }),
        1 => Just(Op::FailNextPut),
        1 => Just(Op::TimeOutNextPut),
        1 => (0..NODES).prop_map(|node| Op::Crash { node }),
        1 => (0..STREAMS).prop_map(|stream| Op::Handover { stream }),
        1 => (0..NODES).prop_map(|node| Op::Compact { node }),
    ]
}

struct ModelStream {
    owner: usize,
    epoch: u64,
    handle: Stream,
    /// Payloads acknowledged, in order.
    acked: Vec<Bytes>,
    /// Payloads whose append failed: they may or may not be present.
    maybe: HashSet<Bytes>,
}

struct World {
    store: Arc<dyn ObjectStore>,
    faulty: FaultyStore,
    nodes: Vec<StreamStore>,
    streams: Vec<ModelStream>,
    next_id: u64,
}

fn config() -> WalConfig {
    WalConfig {
        compaction_interval_ms: 3_600_000,
        segment_bytes_max: 64,
        // A few payloads: some records are read back from the WAL, some from memory.
        tail_cache_bytes_max: 16,
        ..Default::default()
    }
}

impl World {
    async fn new() -> Self {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
        let mut nodes = Vec::new();
        for n in 0..NODES {
            nodes.push(
                StreamStore::open(store.clone(), &format!("n{n}"), config())
                    .await
                    .unwrap(),
            );
        }
        let mut streams = Vec::new();
        for s in 0..STREAMS {
            let handle = nodes[s % NODES]
                .open_stream(&format!("s{s}"), 1)
                .await
                .unwrap();
            streams.push(ModelStream {
                owner: s % NODES,
                epoch: 1,
                handle,
                acked: vec![],
                maybe: HashSet::new(),
            });
        }
        Self {
            store,
            faulty,
            nodes,
            streams,
            next_id: 0,
        }
    }

    /// Restarts `node` as a new incarnation and reopens its streams under new epochs:
    /// a new process (`Crash`), or, when its WAL failed, a new generation in the same
    /// process (`open_after`, which takes what the failed one acknowledged from memory).
    async fn restart(&mut self, node: usize, in_process: bool) {
        // An injected fault may hit the restart itself; an operator retries.
        let mut attempts = 0;
        self.nodes[node] = loop {
            attempts += 1;
            let id = format!("n{node}");
            let opened = if in_process {
                StreamStore::open_after(&self.nodes[node], self.store.clone(), &id, config()).await
            } else {
                StreamStore::open(self.store.clone(), &id, config()).await
            };
            match opened {
                Ok(store) => break store,
                Err(e) if attempts < 5 => eprintln!("restart of n{node} failed, retrying: {e}"),
                Err(e) => panic!("restart of n{node}: {e}"),
            }
        };
        for s in 0..STREAMS {
            if self.streams[s].owner == node {
                self.reopen(s, node).await;
            }
        }
    }

    async fn reopen(&mut self, s: usize, node: usize) {
        let mut epoch = self.streams[s].epoch;
        let mut attempts = 0;
        let handle = loop {
            epoch += 1;
            attempts += 1;
            if self.nodes[node].failure().is_some() {
                self.nodes[node] = StreamStore::open_after(
                    &self.nodes[node],
                    self.store.clone(),
                    &format!("n{node}"),
                    config(),
                )
                .await
                .unwrap();
            }
            match self.nodes[node].open_stream(&format!("s{s}"), epoch).await {
                Ok(handle) => break handle,
                Err(e) if attempts < 5 => eprintln!("open of s{s} failed, retrying: {e}"),
                Err(e) => panic!("open of s{s}: {e}"),
            }
        };
        let m = &mut self.streams[s];
        m.owner = node;
        m.epoch = epoch;
        m.handle = handle;
        check(m).await;
    }

    async fn heal(&mut self) {
        for node in 0..NODES {
            if self.nodes[node].failure().is_some() {
                self.restart(node, true).await;
            }
        }
    }

    async fn step(&mut self, op: Op) {
        match op {
            Op::Append { stream, count } => {
                self.next_id += 1;
                let body = Bytes::from(format!("r{}", self.next_id));
                let m = &mut self.streams[stream];
                match m
                    .handle
                    .append_durable(m.epoch, count, 0, body.clone())
                    .await
                {
                    Ok(range) => {
                        assert_eq!(range.end - range.start, count as u64);
                        m.acked.push(body);
                    }
                    Err(_) => {
                        m.maybe.insert(body);
                    }
                }
            }
            Op::FailNextPut => self.faulty.fail_next_puts(1),
            Op::TimeOutNextPut => self.faulty.time_out_next_puts(1),
            Op::Crash { node } => self.restart(node, false).await,
            Op::Handover { stream } => {
                let owner = self.streams[stream].owner;
                let to = (owner + 1) % NODES;
                let handle = self.streams[stream].handle.clone();
                if let Err(e) = handle.close().await {
                    eprintln!("close of s{stream} on n{owner} failed: {e}");
                    // The owner's WAL failed under the close: a crash, then.
                    self.faulty.fail_next_puts(0);
                    self.restart(owner, true).await;
                }
                self.reopen(stream, to).await;
            }
            Op::Compact { node } => {
                let _ = self.nodes[node].compact().await;
            }
        }
        self.heal().await;
    }
}

/// Reads the whole stream and checks it against the model.
async fn check(m: &ModelStream) {
    let mut got = Vec::new();
    let mut pos = m.handle.start_offset();
    let end = m.handle.durable_end();
    while pos < end {
        let records = m.handle.read(pos, 1 << 16).await.unwrap();
        assert!(!records.is_empty());
        for r in records {
            assert_eq!(r.base, pos, "contiguous");
            pos = r.end();
            got.push(r.payload);
        }
    }
    let unique: HashSet<&Bytes> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "no duplicates in {got:?}");
    for body in &got {
        assert!(
            m.acked.contains(body) || m.maybe.contains(body),
            "{body:?} was never appended"
        );
    }
    let present: Vec<&Bytes> = got.iter().filter(|b| m.acked.contains(b)).collect();
    assert_eq!(
        present,
        m.acked.iter().collect::<Vec<_>>(),
        "every acknowledged record, in order"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn acknowledged_records_survive_everything(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let mut world = World::new().await;
            for op in ops {
                world.step(op).await;
            }
            world.faulty.fail_next_puts(0);
            world.faulty.time_out_next_puts(0);
            for node in 0..NODES {
                world.restart(node, false).await;
            }
            for m in &world.streams {
                check(m).await;
            }
        });
    }
}

/// A case the property test found: a clean close whose segment upload fails, then
/// handovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_failing_mid_way_then_handovers() {
    let mut world = World::new().await;
    for op in [
        Op::Append {
            stream: 0,
            count: 1,
        },
        Op::FailNextPut,
        Op::Handover { stream: 0 },
        Op::Append {
            stream: 0,
            count: 1,
        },
        Op::Handover { stream: 0 },
    ] {
        world.step(op).await;
    }
    for m in &world.streams {
        check(m).await;
    }
}
