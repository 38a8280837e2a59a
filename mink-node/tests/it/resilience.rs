//! A node keeps serving through object-store faults: a WAL that cannot complete an
//! upload is replaced by a new generation on its own (no restart), and every
//! acknowledged row survives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::TablePath;
use mink_wal::fault::{FaultConfig, FaultyStore};
use object_store::ObjectStore;

use crate::common;
use common::{KafkaConn, ids, rows};

fn config(dir: &std::path::Path) -> MinkConfig {
    let mut c = MinkConfig {
        node_id: "n0".into(),
        data_dir: dir.join("n0"),
        ..MinkConfig::default()
    };
    c.object_store.url = format!("file://{}", dir.join("objects").display());
    c.listeners = mink_node::config::Listeners::ephemeral();
    c.meta.heartbeat_interval_ms = 100;
    c.meta.tail_idle_interval_max_ms = 100;
    // Give up on an upload quickly, so that the outage below outlasts the budget.
    c.wal.upload_retry_budget_ms = 300;
    c
}

async fn health(client: &MinkClient) -> serde_json::Value {
    client
        .action::<serde_json::Value>("health", serde_json::json!({}))
        .await
        .unwrap()
}

/// A node on its object store behind a fault injector (faultless to begin with), and
/// a Flight client of it.
async fn faulty_node(config: MinkConfig) -> (Node, FaultyStore, MinkClient) {
    let inner = mink_wal::open_object_store(&config.object_store).unwrap();
    let faulty = FaultyStore::new(inner, FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let node = Node::start_with_store(config, store).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    (node, faulty, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_is_replaced_without_a_restart_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (node, faulty, client) = faulty_node(config(dir.path())).await;
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client
        .create_table(&path, &common::events_in(2))
        .await
        .unwrap();
    client.append(&path, &rows(0..20)).await.unwrap();
    let wal_before = client
        .action::<serde_json::Value>("node_stats", serde_json::json!({}))
        .await
        .unwrap()["wal"]
        .clone();

    // Every PUT fails for a while: the WAL gives up after its budget and fails.
    faulty.set_config(FaultConfig {
        put_failure_rate: 1.0,
        ..Default::default()
    });
    let during = tokio::time::timeout(
        Duration::from_secs(2),
        client.append(&path, &rows(100..110)),
    )
    .await;
    let mut acked: Vec<i64> = (0..20).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sick = health(&client).await;
    assert_eq!(sick["status"], "unavailable", "{sick}");

    // The store answers again: the node recovers by itself.
    faulty.set_config(FaultConfig::default());
    let healed = Instant::now();
    let mut written = None;
    while healed.elapsed() < Duration::from_secs(60) {
        match tokio::time::timeout(Duration::from_secs(5), client.append(&path, &rows(20..40)))
            .await
        {
            Ok(Ok(w)) => {
                written = Some(w);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(written.is_some(), "the node never accepted writes again");
    eprintln!(
        "writes accepted again {:?} after the store healed",
        healed.elapsed()
    );
    acked.extend(20..40);
    if let Ok(Ok(_)) = during {
        acked.extend(100..110);
    }
    let after = health(&client).await;
    assert_eq!(after["status"], "serving", "{after}");
    let wal_after = client
        .action::<serde_json::Value>("node_stats", serde_json::json!({}))
        .await
        .unwrap()["wal"]
        .clone();
    assert_ne!(wal_before, wal_after, "a new WAL generation serves");

    // Every acknowledged row is there exactly once; the write made during the outage
    // is there at most once.
    let mut got = ids(&client.scan_table(&path).await.unwrap());
    let outage: Vec<i64> = got
        .iter()
        .copied()
        .filter(|i| (100..110).contains(i))
        .collect();
    assert!(
        outage.is_empty() || outage == (100..110).collect::<Vec<_>>(),
        "{outage:?}"
    );
    got.retain(|i| !(100..110).contains(i));
    acked.retain(|i| !(100..110).contains(i));
    acked.sort();
    assert_eq!(got, acked);
    node.stop().await;
}

fn cluster_config(dir: &std::path::Path, id: &str) -> MinkConfig {
    let mut c = config(dir);
    c.node_id = id.into();
    c.data_dir = dir.join(id);
    c.wal.upload_retry_budget_ms = 60_000;
    c.meta.lease_timeout_ms = 1_000;
    c.meta.node_session_timeout_ms = 1_500;
    c
}

/// A node joins and `rebalance` moves buckets to it while a writer keeps writing:
/// the old leaders hand their buckets over (close their streams), so nobody is fenced,
/// the writer follows the redirects, and every acknowledged row is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_under_load_hands_buckets_over_without_fencing() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..2 {
        nodes.push(
            Node::start(cluster_config(dir.path(), &format!("n{i}")))
                .await
                .unwrap(),
        );
    }
    let client = Arc::new(
        MinkClient::connect(&nodes[0].flight_addr.to_string())
            .await
            .unwrap(),
    );
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client
        .create_table(&path, &common::events_in(6))
        .await
        .unwrap();
    client.append(&path, &rows(0..12)).await.unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, path, stop) = (client.clone(), path.clone(), stop.clone());
        tokio::spawn(async move {
            let mut next = 12i64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                client.append(&path, &rows(next..next + 6)).await?;
                next += 6;
            }
            Ok::<i64, mink_types::MinkError>(next)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    nodes.push(Node::start(cluster_config(dir.path(), "n2")).await.unwrap());
    // The joiner must be seen alive by the lease holder before it gets buckets.
    let mut moved = 0u64;
    for _ in 0..50 {
        let answer: serde_json::Value = client
            .action("rebalance", serde_json::json!({}))
            .await
            .unwrap();
        moved += answer["moved"].as_u64().unwrap_or(0);
        if moved > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved > 0, "rebalance moved nothing");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer
        .await
        .unwrap()
        .expect("every write succeeded through the moves");
    let fences = nodes[0].streams().metadata().read(|s, _| s.fences.clone());
    assert!(
        fences.is_empty(),
        "a handover fenced a live node: {fences:?}"
    );
    // And no WAL met a fence (the nodes of this process share one metrics recorder).
    let metrics = common::scrape_metrics(&nodes[0].admin_addr.to_string());
    let fenced: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("mink_wal_fenced_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum();
    assert_eq!(fenced, 0.0, "mink_wal_fenced_total after the handovers");
    assert!(
        metrics.contains("mink_node_handovers_total"),
        "handovers are counted"
    );
    let all = ids(&client.scan_table(&path).await.unwrap());
    assert_eq!(all, (0..written).collect::<Vec<_>>());
    let led_by_joiner = nodes[2].meta.read(|s| {
        s.buckets
            .values()
            .filter(|b| b.leader.as_deref() == Some("n2"))
            .count()
    });
    assert!(led_by_joiner > 0);
    for node in nodes {
        node.stop().await;
    }
}

/// A node cut off from the store long enough to be declared dead, and then back, is
/// not a zombie: it registers again as a new incarnation by itself (it leads nothing,
/// so no fence tells it) and gets buckets again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_declared_dead_while_alive_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    let mut stores = Vec::new();
    for i in 0..2 {
        let config = cluster_config(dir.path(), &format!("n{i}"));
        let inner = mink_wal::open_object_store(&config.object_store).unwrap();
        let faulty = FaultyStore::new(inner, FaultConfig::default());
        stores.push(faulty.clone());
        nodes.push(
            Node::start_with_store(config, Arc::new(faulty))
                .await
                .unwrap(),
        );
    }
    let holder = nodes[0].meta.lease().1.unwrap();
    let (keep, victim) = if holder == "n0" { (0, 1) } else { (1, 0) };
    let victim_id = nodes[victim].meta.node_id().to_string();
    let incarnation = nodes[victim].meta.incarnation();

    // Cut off: the others see its heartbeat stall.
    stores[victim].set_down(true);
    let declared = Instant::now();
    while !nodes[keep]
        .meta
        .read(|s| s.nodes.get(&victim_id).is_some_and(|n| !n.alive))
    {
        assert!(
            declared.elapsed() < Duration::from_secs(30),
            "never declared dead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Back: it notices and registers again.
    stores[victim].set_down(false);
    let back = Instant::now();
    loop {
        let alive = nodes[keep]
            .meta
            .read(|s| s.nodes.get(&victim_id).is_some_and(|n| n.alive));
        if alive && nodes[victim].meta.incarnation() > incarnation {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "the node never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It is given buckets and serves them.
    let client = MinkClient::connect(&nodes[victim].flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client
        .create_table(&path, &common::events_in(4))
        .await
        .unwrap();
    client.append(&path, &rows(0..20)).await.unwrap();
    let led = nodes[keep].meta.read(|s| {
        s.buckets
            .values()
            .filter(|b| b.leader.as_deref() == Some(victim_id.as_str()))
            .count()
    });
    assert!(led > 0, "the revived node leads no bucket");
    assert_eq!(
        ids(&client.scan_table(&path).await.unwrap()),
        (0..20).collect::<Vec<_>>()
    );
    for node in nodes {
        node.stop().await;
    }
}

impl KafkaConn {
    /// Produces values `values` (one record each, sequences from `first_sequence`) to
    /// partition 0 of `topic` as `producer`: the partition's error code and message.
    async fn produce(
        &mut self,
        topic: &str,
        producer: (i64, i16),
        first_sequence: i32,
        values: std::ops::Range<i32>,
    ) -> (i16, String) {
        let records: Vec<_> = values
            .map(|value| (None, Some(bytes::Bytes::from(format!("v{value}")))))
            .collect();
        let p = self
            .produce_records(topic, producer, first_sequence, &records)
            .await;
        (
            p.error_code,
            p.error_message
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default(),
        )
    }
}

/// The Kafka value column of a topic read through Flight, in offset order.
fn kafka_values(batches: &[arrow::record_batch::RecordBatch]) -> Vec<String> {
    use arrow::array::{Array, BinaryArray};
    let mut out = Vec::new();
    for b in batches {
        let values = b
            .column_by_name("value")
            .unwrap()
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        for i in 0..values.len() {
            out.push(String::from_utf8(values.value(i).to_vec()).unwrap());
        }
    }
    out
}

/// An idempotent Kafka producer pipelines: when one batch is refused as not persisted
/// (the WAL failed) and the next one reaches the bucket's reopened tablet first, that
/// one must be refused the same retriable way, not as OUT_OF_ORDER_SEQUENCE_NUMBER
/// (or UNKNOWN_PRODUCER_ID when the refused batch was the producer's first): librdkafka
/// answers those by bumping its epoch and writing every unacknowledged record again,
/// duplicating any that were in fact written. Retried in order, each record is
/// written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_batch_behind_one_refused_as_not_persisted_is_refused_alike() {
    use kafka_protocol::error::ResponseError;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.kafka.default_partitions = 1;
    let (node, faulty, client) = faulty_node(config).await;
    let mut kafka = KafkaConn::connect(node.kafka_addr.unwrap()).await;
    let ok = |(code, message): (i16, String)| assert_eq!(code, 0, "{message}");

    // Waits for the node to replace its failed WAL by itself.
    let recovered = || async {
        let start = Instant::now();
        while health(&client).await["status"] != "serving" {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the node never recovered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let outage = |on: bool| {
        faulty.set_config(FaultConfig {
            put_failure_rate: if on { 1.0 } else { 0.0 },
            ..Default::default()
        })
    };

    // Sends a batch behind a refused one until the bucket's tablet answers it: the
    // node reopens a tablet on its next request after the WAL was replaced, and
    // while it does, the answer is a plain "being reopened".
    async fn behind(
        kafka: &mut KafkaConn,
        producer: (i64, i16),
        first: i32,
        values: std::ops::Range<i32>,
    ) -> (i16, String) {
        let start = Instant::now();
        loop {
            let (code, message) = kafka.produce("gaps", producer, first, values.clone()).await;
            let reopening = code == ResponseError::LeaderNotAvailable.code()
                && !message.contains("not persisted");
            if !reopening || start.elapsed() > Duration::from_secs(30) {
                return (code, message);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Refused as its predecessor was: retriable, naming the batch not persisted.
    fn refused_alike((code, message): (i16, String)) {
        assert_eq!(
            ResponseError::try_from_code(code),
            Some(ResponseError::LeaderNotAvailable),
            "{message}"
        );
        assert!(message.contains("not persisted"), "{message}");
    }

    // A producer has written sequence 0; its batch at sequence 1 is refused.
    let producer = kafka.init_producer().await;
    ok(kafka.produce("gaps", producer, 0, 0..1).await);
    outage(true);
    let (code, message) = kafka.produce("gaps", producer, 1, 1..4).await;
    let refused = ResponseError::try_from_code(code);
    assert!(
        matches!(
            refused,
            Some(ResponseError::KafkaStorageError | ResponseError::LeaderNotAvailable)
        ),
        "{refused:?}: {message}"
    );
    outage(false);
    recovered().await;
    // The batch behind it reaches the reopened tablet first: refused alike, and
    // nothing is written.
    refused_alike(behind(&mut kafka, producer, 4, 4..5).await);
    // Sent again in order, both are written once.
    ok(kafka.produce("gaps", producer, 1, 1..4).await);
    ok(kafka.produce("gaps", producer, 4, 4..5).await);

    // A producer whose first batch here is refused: its second is refused alike, not
    // answered UNKNOWN_PRODUCER_ID.
    let second = kafka.init_producer().await;
    outage(true);
    let (code, message) = kafka.produce("gaps", second, 0, 10..12).await;
    assert_ne!(code, 0, "{message}");
    outage(false);
    recovered().await;
    refused_alike(behind(&mut kafka, second, 2, 12..13).await);
    ok(kafka.produce("gaps", second, 0, 10..12).await);
    ok(kafka.produce("gaps", second, 2, 12..13).await);

    // A gap no refusal explains is still a sequence error.
    let (code, message) = kafka.produce("gaps", second, 9, 19..20).await;
    assert_eq!(
        ResponseError::try_from_code(code),
        Some(ResponseError::OutOfOrderSequenceNumber),
        "{message}"
    );

    let path = TablePath::parse("kafka.gaps").unwrap();
    let got = kafka_values(&client.scan_table(&path).await.unwrap());
    let want: Vec<String> = [0, 1, 2, 3, 4, 10, 11, 12]
        .iter()
        .map(|v| format!("v{v}"))
        .collect();
    assert_eq!(got, want);
    node.stop().await;
}
