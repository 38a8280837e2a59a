//! The Rust client against in-process nodes: client-side routing, scans, tails,
//! lookups, partitions on demand, and a leader failover followed by the client.

use std::sync::Arc;
use std::time::Duration;

use mink_flight::MinkClient;
use mink_node::node::Node;
use mink_types::{TableDescriptor, TablePath};

use crate::common;
use common::{config, ids, rows, settle};

fn events() -> TableDescriptor {
    common::events_in(4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_routing_scans_tails_lookups_and_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let node = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &events()).await.unwrap();
    // The client retries each bucket (same sequence) while leaders are assigned; a
    // retry of the whole call would write the acknowledged buckets twice.
    let written = client.append(&path, &rows(0..40)).await.unwrap();
    assert_eq!(
        written
            .iter()
            .map(|w| w.last_offset - w.first_offset + 1)
            .sum::<i64>(),
        40
    );
    assert_eq!(
        ids(&client.scan_table(&path).await.unwrap()),
        (0..40).collect::<Vec<_>>()
    );

    // A tail is woken by a write.
    let bucket = written[0].bucket;
    let end = written[0].last_offset + 1;
    let tail = {
        let client = MinkClient::connect(&node.flight_addr.to_string())
            .await
            .unwrap();
        let path = path.clone();
        tokio::spawn(async move {
            client
                .poll(&path, bucket, end, Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Write rows until one lands in the tailed bucket.
    for i in 100..140 {
        let w = client.append(&path, &rows(i..i + 1)).await.unwrap();
        if w[0].bucket == bucket {
            break;
        }
    }
    let (batches, next) = tokio::time::timeout(Duration::from_secs(20), tail)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!batches.is_empty());
    assert!(next > end);

    // A primary-key table: put, then lookup.
    let users = TablePath::parse("db.users").unwrap();
    let d = TableDescriptor {
        primary_key: vec!["id".into()],
        ..events()
    };
    client.create_table(&users, &d).await.unwrap();
    client.put(&users, &rows(0..10), None, None).await.unwrap();
    let found = client
        .lookup(
            &users,
            vec![vec![serde_json::json!(3)], vec![serde_json::json!(99)]],
        )
        .await
        .unwrap();
    assert_eq!(ids(&found), vec![3]);

    // Table-addressed writes, routed by the node: one request over every bucket.
    let written = client
        .write_table(&path, &rows(200..240), None)
        .await
        .unwrap();
    assert_eq!(
        written
            .iter()
            .map(|w| w.bucket.bucket)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        4,
        "40 rows by id span all four buckets"
    );
    assert!(
        ids(&client.scan_table(&path).await.unwrap()).ends_with(&(200..240).collect::<Vec<_>>())
    );
    let err = client
        .write_table(
            &path,
            &rows(0..1),
            Some(vec![mink_types::ChangeType::Delete]),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no primary key"), "{err}");
    client
        .write_table(
            &users,
            &rows(3..5),
            Some(vec![mink_types::ChangeType::Delete; 2]),
        )
        .await
        .unwrap();
    let found = client
        .lookup(
            &users,
            vec![vec![serde_json::json!(3)], vec![serde_json::json!(5)]],
        )
        .await
        .unwrap();
    assert_eq!(ids(&found), vec![5], "the node applied the deletes");

    // A partition created on demand by the client's routing.
    let daily = TablePath::parse("db.daily").unwrap();
    let pd = TableDescriptor {
        partition_keys: vec!["msg".into()],
        ..events()
    };
    client.create_table(&daily, &pd).await.unwrap();
    client.append(&daily, &rows(5..7)).await.unwrap();
    let partitions: Vec<serde_json::Value> = client
        .action("list_partitions", serde_json::json!({"path": "db.daily"}))
        .await
        .unwrap();
    assert_eq!(partitions.len(), 2);
    assert_eq!(ids(&client.scan_table(&daily).await.unwrap()), vec![5, 6]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_and_a_failover_the_client_follows() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(
            Node::start(config(dir.path(), &shared, &format!("n{i}")))
                .await
                .unwrap(),
        );
    }
    let client = MinkClient::connect(&nodes[0].flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &events()).await.unwrap();
    client.append(&path, &rows(0..40)).await.unwrap();

    // Stop a node that is not the lease holder and not the one the client knows.
    let holder = nodes[0].meta.lease().1.unwrap();
    let victim = (1..3).find(|i| nodes[*i].meta.node_id() != holder).unwrap();
    let victim = nodes.remove(victim);
    victim.stop().await;
    // Its buckets move after the session timeout; the client's routing is stale until
    // a NotLeader or a refused connection makes it refresh. Every row still lands.
    client.append(&path, &rows(40..80)).await.unwrap();
    let all = settle(|| client.scan_table(&path)).await;
    assert_eq!(ids(&all), (0..80).collect::<Vec<_>>());
    for node in nodes {
        node.stop().await;
    }
}

/// Many tasks sharing one client write to the same buckets at once: every bucket's
/// sequences still reach its leader in order, so every call succeeds, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_shared_by_concurrent_tasks_writes_each_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let node = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    let client = Arc::new(
        MinkClient::connect(&node.flight_addr.to_string())
            .await
            .unwrap(),
    );
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &events()).await.unwrap();
    let warm_up = rows(0..4);
    settle(|| client.append(&path, &warm_up)).await;
    let tasks: Vec<_> = (0..8i64)
        .map(|t| {
            let (client, path) = (client.clone(), path.clone());
            tokio::spawn(async move {
                for b in 0..10i64 {
                    let first = 4 + (t * 10 + b) * 8;
                    client.append(&path, &rows(first..first + 8)).await?;
                }
                Ok::<(), mink_types::MinkError>(())
            })
        })
        .collect::<Vec<_>>();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(
        ids(&client.scan_table(&path).await.unwrap()),
        (0..4 + 8 * 10 * 8).collect::<Vec<_>>()
    );
    node.stop().await;
}

/// A round-robin table that grows buckets (as a Kafka topic does by CreatePartitions)
/// is written across all of them once the client's routing is older than its maximum
/// age, by the same client; every row lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_spreads_rows_over_buckets_a_table_grew() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let node = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    let age = Duration::from_millis(300);
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap()
        .with_routing_max_age(age);
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.spread").unwrap();
    let mut d = events();
    d.bucket_keys = None;
    d.bucket_count = 1;
    client.create_table(&path, &d).await.unwrap();
    let first = client.append(&path, &rows(0..10)).await.unwrap();
    assert!(first.iter().all(|w| w.bucket.bucket == 0));
    node.meta.add_buckets(&path, 3).await.unwrap();
    // Past the routing's maximum age: the next append reads the table again.
    tokio::time::sleep(age + Duration::from_millis(100)).await;
    let mut landed = std::collections::BTreeSet::new();
    let mut written = 10;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while landed.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "wrote only to {landed:?}"
        );
        for w in client
            .append(&path, &rows(written..written + 30))
            .await
            .unwrap()
        {
            landed.insert(w.bucket.bucket);
        }
        written += 30;
    }
    assert_eq!(
        ids(&client.scan_table(&path).await.unwrap()),
        (0..written).collect::<Vec<_>>()
    );
    node.stop().await;
}
