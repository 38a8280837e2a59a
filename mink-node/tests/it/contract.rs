//! The Flight contract (spec/protocols.txt) as seen from outside a node: what any node
//! answers for the cluster, and what every response carries.

use std::time::Duration;

use mink_flight::MinkClient;
use mink_node::node::Node;
use mink_types::TablePath;

use crate::common;
use common::config;

/// Polls `probe` until it returns something (cluster state that settles), at most 20 s.
async fn wait_until<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Leaders of a table's buckets, by node id, from `client`'s node.
async fn leaders(client: &MinkClient, path: &str) -> Vec<Option<String>> {
    let meta: serde_json::Value = client
        .action("metadata", serde_json::json!({"path": path}))
        .await
        .unwrap();
    meta["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["leader"].as_str().map(str::to_string))
        .collect()
}

/// spec/protocols.txt: "rebalance is forwarded to the lease holder". Asked at a node
/// that does not hold the lease, it is run by the holder, whose answer comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_at_a_node_without_the_lease_is_run_by_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let n0 = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    let c0 = MinkClient::connect(&n0.flight_addr.to_string())
        .await
        .unwrap();
    wait_until("n0 holds the lease", async || {
        (n0.meta.lease().1.as_deref() == Some("n0")).then_some(())
    })
    .await;
    c0.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    c0.create_table(&path, &common::events_in(4)).await.unwrap();
    // Alone, n0 leads all four buckets; n1 joins later and leads none until a rebalance.
    wait_until("n0 leads every bucket", async || {
        let l = leaders(&c0, "db.events").await;
        l.iter().all(|l| l.as_deref() == Some("n0")).then_some(())
    })
    .await;
    let n1 = Node::start(config(dir.path(), &shared, "n1"))
        .await
        .unwrap();
    let c1 = MinkClient::connect(&n1.flight_addr.to_string())
        .await
        .unwrap();
    wait_until("n0 sees n1", async || {
        n0.meta.read(|s| s.nodes.contains_key("n1")).then_some(())
    })
    .await;
    assert_eq!(n1.meta.lease().1.as_deref(), Some("n0"));

    let answer: serde_json::Value = c1
        .action("rebalance", serde_json::json!({}))
        .await
        .expect("a node without the lease forwards rebalance to the holder");
    assert_eq!(answer, serde_json::json!({"moved": 2}));
    let after = wait_until("two buckets on each node", async || {
        let l = leaders(&c1, "db.events").await;
        let on_n1 = l.iter().filter(|l| l.as_deref() == Some("n1")).count();
        (on_n1 == 2).then_some(l)
    })
    .await;
    assert_eq!(
        after.iter().filter(|l| l.as_deref() == Some("n0")).count(),
        2
    );
    // Balanced now: the holder moves nothing, whichever node is asked.
    for c in [&c0, &c1] {
        let again: serde_json::Value = c.action("rebalance", serde_json::json!({})).await.unwrap();
        assert_eq!(again, serde_json::json!({"moved": 0}));
    }
    n1.stop().await;
    n0.stop().await;
}

/// The metadata index a status says the node had applied (`mink-applied-index`).
fn applied_index_of(status: &tonic::Status) -> Option<u64> {
    status
        .metadata()
        .get(mink_flight::server::APPLIED_INDEX_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// docs/protocol.md: "Every response carries `mink-applied-index`" — failures too,
/// whether the Flight layer or the node refuses, at the call or in its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_responses_carry_the_applied_index() {
    use arrow_flight::{Action, FlightDescriptor, Ticket};
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let node = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    let addr = node.flight_addr.to_string();
    let created: serde_json::Value = MinkClient::connect(&addr)
        .await
        .unwrap()
        .action("create_database", serde_json::json!({"name": "db"}))
        .await
        .unwrap();
    let created = created["index"].as_u64().unwrap();
    let mut raw = mink_flight::client::connect(&addr).await.unwrap();

    let mut failures = vec![
        (
            "an unknown action",
            raw.do_action(Action::new("make_coffee", "{}"))
                .await
                .unwrap_err(),
        ),
        (
            "a missing table",
            raw.do_action(Action::new("get_table", r#"{"path": "db.nope"}"#))
                .await
                .unwrap_err(),
        ),
        (
            "a bad ticket",
            raw.do_get(Ticket::new("{nope")).await.unwrap_err(),
        ),
        (
            "GetFlightInfo of a missing table",
            raw.get_flight_info(FlightDescriptor::new_path(vec!["db.nope".into()]))
                .await
                .unwrap_err(),
        ),
        (
            "Handshake",
            raw.handshake(futures::stream::empty()).await.unwrap_err(),
        ),
    ];
    // A write refused in the DoPut stream, after the response began.
    let descriptor = mink_flight::protocol::WriteDescriptor::AppendTable {
        path: TablePath::parse("db.nope").unwrap(),
        schema_id: 1,
    };
    let data = mink_flight::client::encode_write(
        &common::rows(0..1),
        Some(&descriptor),
        &Default::default(),
    )
    .unwrap();
    let mut results = raw
        .do_put(futures::stream::iter(data))
        .await
        .unwrap()
        .into_inner();
    failures.push(("a DoPut batch", results.message().await.unwrap_err()));

    for (what, status) in failures {
        let index = applied_index_of(&status);
        assert!(
            index.is_some_and(|i| i >= created),
            "{what}: {status:?} carries no applied index"
        );
    }
    node.stop().await;
}

/// `GET path` at `addr` over HTTP/1.1, the body parsed as JSON.
async fn get_json(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: mink\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    s.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8(response).unwrap();
    let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The console's cluster page tells a node that is still opening (its metadata and
/// heartbeat run, its Flight listener does not answer yet) from one that neither
/// answers nor heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_tells_a_starting_node_from_an_unreachable_one() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let n0 = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    // An address nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap().to_string();
    drop(closed);
    let store: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(&shared).unwrap(),
    );
    let meta = config(dir.path(), &shared, "n9").meta;
    let n9 = mink_meta::MetaNode::open(store, "n9", &nowhere, "", meta)
        .await
        .unwrap();
    let state = async || {
        let cluster = get_json(n0.admin_addr, "/api/v1/cluster").await;
        cluster["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "n9")
            .and_then(|n| n["state"].as_str().map(str::to_string))
    };
    wait_until("n9 shown as starting", async || {
        (state().await.as_deref() == Some("starting")).then_some(())
    })
    .await;
    // It stops heartbeating: no longer starting (unreachable, then down once the
    // lease holder declares it dead).
    n9.shutdown(false).await;
    wait_until("n9 shown as unreachable or down", async || {
        matches!(state().await.as_deref(), Some("unreachable" | "down")).then_some(())
    })
    .await;
}
