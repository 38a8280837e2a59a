//! What a node costs on object storage: every request is counted by operation and
//! purpose (`node_stats`, `/metrics`).

use std::sync::Arc;

use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::TablePath;
use mink_wal::{Op, Purpose};
use object_store::ObjectStore;
use object_store::memory::InMemory;

mod common;
use common::rows;

/// Node `id` with the default timings (what the budget is about), on loopback ports.
fn config(dir: &std::path::Path, id: &str) -> MinkConfig {
    let mut c = MinkConfig {
        node_id: id.into(),
        data_dir: dir.join(id),
        ..MinkConfig::default()
    };
    c.object_store.url = "memory://".into();
    c.listeners.flight = "127.0.0.1:0".parse().unwrap();
    c.listeners.admin = "127.0.0.1:0".parse().unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_operation_and_purpose_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let node = Node::start_with_store(config(dir.path(), "n0"), store)
        .await
        .unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client
        .create_table(&path, &common::events_in(2))
        .await
        .unwrap();
    let before = node.accounting.report().requests_for(Purpose::Wal);
    let batch = rows(0..10);
    common::settle(|| client.append(&path, &batch)).await;
    node.streams().compact().await.unwrap();

    let r = node.accounting.report();
    let count = |op: Op, purpose: Purpose| {
        r.by_kind
            .iter()
            .find(|u| u.op == op && u.purpose == purpose)
            .map_or(0, |u| u.requests)
    };
    assert!(r.requests_for(Purpose::Wal) > before, "the append uploaded");
    assert!(count(Op::Put, Purpose::Segment) >= 1, "compaction wrote");
    assert!(count(Op::Put, Purpose::Heartbeat) >= 1);
    assert!(
        count(Op::Put, Purpose::Meta) >= 1,
        "the catalog was appended"
    );
    assert!(r.bytes_sent > 0);
    assert_eq!(r.failures, 0);
    assert_eq!(
        r.requests,
        r.by_kind.iter().map(|u| u.requests).sum::<u64>()
    );

    // `node_stats` (what `mink node stats` prints) carries the same counters.
    let stats: serde_json::Value = client
        .action("node_stats", serde_json::json!({}))
        .await
        .unwrap();
    let reported = &stats["object_store"];
    assert!(
        reported["requests"].as_u64().unwrap() >= r.requests,
        "{stats}"
    );
    let kinds = reported["by_kind"].as_array().unwrap();
    assert!(
        kinds
            .iter()
            .any(|k| k["op"] == "put" && k["purpose"] == "segment"),
        "{stats}"
    );

    // So does /metrics.
    let page = reqwest_metrics(node.admin_addr).await;
    assert!(
        page.contains(r#"mink_object_store_requests_total{op="put",purpose="wal"}"#),
        "{page}"
    );
    assert!(page.contains("mink_object_store_request_duration_seconds"));
    node.stop().await;
}

/// `GET /metrics` over a plain TCP connection.
async fn reqwest_metrics(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    conn.read_to_string(&mut page).await.unwrap();
    page
}
