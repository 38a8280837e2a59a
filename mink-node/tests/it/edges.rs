//! Where features meet the durability core: retention of a primary-key table against its
//! KV snapshots, and bucket moves between live nodes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use common::{config, settle};
use mink_flight::MinkClient;
use mink_node::MinkConfig;
use mink_node::node::Node;
use mink_types::{Column, DataType, Schema, TableBucket, TableDescriptor, TablePath};

/// `users(id BIGINT NOT NULL, name STRING)`, keyed by id, one bucket, with `props`.
fn users(props: &[(&str, &str)]) -> TableDescriptor {
    let mut d = TableDescriptor {
        primary_key: vec!["id".into()],
        ..TableDescriptor::log_table(Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("name", DataType::String, true),
            ],
        ))
    };
    for (k, v) in props {
        d.properties.set(k, v).unwrap();
    }
    d
}

fn user_rows(ids: std::ops::Range<i64>, name: &str) -> RecordBatch {
    RecordBatch::try_new(
        users(&[]).schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(
                ids.map(|i| format!("{name}{i}")),
            )),
        ],
    )
    .unwrap()
}

/// The names of `ids` found by lookup, in id order (missing ids absent).
async fn names(client: &MinkClient, path: &TablePath, ids: &[i64]) -> Vec<(i64, String)> {
    let keys = ids.iter().map(|i| vec![serde_json::json!(i)]).collect();
    let found = client.lookup(path, keys).await.unwrap();
    let mut out: Vec<(i64, String)> = found
        .iter()
        .flat_map(|b| {
            let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let name = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            (0..b.num_rows())
                .map(|i| (id.value(i), name.value(i).to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

/// Bucket 0 of the unpartitioned table at `path`, as `node` knows it.
fn bucket_zero(node: &Node, path: &TablePath) -> TableBucket {
    node.meta.read(|s| {
        let t = s.tables.values().find(|t| &t.path == path).unwrap();
        TableBucket::new(t.id, None, 0)
    })
}

/// A database `db` and the primary-key table `db.users` with a 1 s `log_ttl`, through
/// `client`.
async fn users_with_a_short_ttl(client: &MinkClient) -> TablePath {
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.users").unwrap();
    client
        .create_table(&path, &users(&[("log_ttl", "1s")]))
        .await
        .unwrap();
    path
}

/// Asks the lease holder (through `client`'s node) to move `bucket` to `to`.
async fn move_bucket(client: &MinkClient, bucket: TableBucket, to: &str) {
    let answer: serde_json::Value = client
        .action(
            "rebalance",
            serde_json::json!({"moves": [{"bucket": bucket, "to": to}]}),
        )
        .await
        .unwrap();
    assert!(answer["moved"].as_u64().is_some(), "{answer}");
}

/// The node `node` leads `bucket` in its own view, and serves it.
async fn wait_led_by(node: &Node, bucket: TableBucket) {
    for _ in 0..200 {
        if leader_in_view(node, bucket).as_deref() == Some(node.meta.node_id()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never led {bucket}", node.meta.node_id());
}

fn fast_ttl(mut c: MinkConfig) -> MinkConfig {
    c.log.ttl_check_interval_ms = 50;
    c.wal.compaction_interval_ms = 50;
    // Far longer than the test: only a trim can make a snapshot.
    c.kv.snapshot_interval_ms = 3_600_000;
    c
}

/// A primary-key table with a 1 s `log_ttl` and no periodic snapshot in sight: the
/// TTL trims its changelog only below a KV snapshot it writes first, so the node the
/// bucket moves to (no local store) finds every acknowledged key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_table_past_its_ttl_moves_with_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let n0 = Node::start(fast_ttl(config(dir.path(), &shared, "n0")))
        .await
        .unwrap();
    let n1 = Node::start(fast_ttl(config(dir.path(), &shared, "n1")))
        .await
        .unwrap();
    let client = MinkClient::connect(&n0.flight_addr.to_string())
        .await
        .unwrap();
    let path = users_with_a_short_ttl(&client).await;
    let bucket = bucket_zero(&n0, &path);
    let first = user_rows(0..50, "a");
    settle(|| client.put(&path, &first, None, None)).await;
    client
        .put(&path, &user_rows(25..75, "b"), None, None)
        .await
        .unwrap();
    let all: Vec<i64> = (0..75).collect();
    let want = names(&client, &path, &all).await;
    assert_eq!(want.len(), 75);

    // Wait until the TTL has trimmed the changelog (it is older than 1 s).
    let leader = |node: &Node| {
        node.meta.read(|s| {
            s.buckets
                .get(&bucket.stream_name())
                .and_then(|b| b.leader.clone())
        })
    };
    let owner = if leader(&n0).as_deref() == Some("n0") {
        &n0
    } else {
        &n1
    };
    let other = if owner.meta.node_id() == "n0" {
        "n1"
    } else {
        "n0"
    };
    let mut trimmed = false;
    for _ in 0..200 {
        let start = owner
            .streams()
            .metadata()
            .read(|s, _| s.streams.get(&bucket.stream_name()).map(|m| m.start_offset));
        if start.is_some_and(|s| s > 0) {
            trimmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(trimmed, "the TTL never trimmed the changelog");

    move_bucket(&client, bucket, other).await;
    let target = if other == "n0" { &n0 } else { &n1 };
    wait_led_by(target, bucket).await;
    let got = settle(|| async { Ok(names(&client, &path, &all).await) }).await;
    assert_eq!(got, want, "every acknowledged key after the move");
    n1.stop().await;
    n0.stop().await;
}

/// The sum of a counter over its labels in a Prometheus page.
fn counter(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// A bucket moved away from an idle node and straight back: the idle node's view of
/// the stream metadata is stale (it last saw its own clean close), so it must catch
/// up before deciding that nobody holds the stream, or its takeover fences the live
/// node that is handing the bucket back, and with it every bucket that node leads.
/// The other node learns of moves slowly (a 1 s metadata tail), so the first write
/// on the idle node arrives while the stream is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_moved_back_to_an_idle_node_is_handed_over_without_a_fence() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let mut slow = config(dir.path(), &shared, "n1");
    slow.meta.tail_idle_interval_max_ms = 1_000;
    slow.meta.lease_timeout_ms = 2_000;
    slow.meta.node_session_timeout_ms = 3_000;
    let nodes = [
        Node::start(config(dir.path(), &shared, "n0"))
            .await
            .unwrap(),
        Node::start(slow).await.unwrap(),
    ];
    let client_of = |i: usize| {
        let addr = nodes[i].flight_addr.to_string();
        async move { MinkClient::connect(&addr).await.unwrap() }
    };
    let client = client_of(0).await;
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client
        .create_table(&path, &common::events_in(1))
        .await
        .unwrap();
    let bucket = bucket_zero(&nodes[0], &path);
    let first = common::rows(0..10);
    settle(|| client.append(&path, &first)).await;
    let fenced_before = counter(
        &common::scrape_metrics(&nodes[0].admin_addr.to_string()),
        "mink_wal_fenced_total",
    );
    let mut next = 10;
    for round in 0..3 {
        // To n1, which takes writes while n0 stays idle.
        move_bucket(&client, bucket, "n1").await;
        wait_led_by(&nodes[1], bucket).await;
        let rows = common::rows(next..next + 10);
        let on_n1 = client_of(1).await;
        settle(|| on_n1.append(&path, &rows)).await;
        next += 10;
        // Longer than n0's metadata tail: n0 has seen every move.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // And straight back: a write on n0 as soon as it knows it leads.
        move_bucket(&client, bucket, "n0").await;
        wait_led_by(&nodes[0], bucket).await;
        let rows = common::rows(next..next + 10);
        let on_n0 = client_of(0).await;
        settle(|| on_n0.append(&path, &rows)).await;
        next += 10;
        let fences = nodes[0].streams().metadata().read(|s, _| s.fences.clone());
        assert!(
            fences.is_empty(),
            "round {round}: a handover fenced: {fences:?}"
        );
    }
    let fenced = counter(
        &common::scrape_metrics(&nodes[0].admin_addr.to_string()),
        "mink_wal_fenced_total",
    );
    assert_eq!(
        fenced, fenced_before,
        "mink_wal_fenced_total after the moves"
    );
    let all = common::ids(&client.scan_table(&path).await.unwrap());
    assert_eq!(all, (0..next).collect::<Vec<_>>());
    for node in nodes {
        node.stop().await;
    }
}

/// A `Snapshot` reader brings the state up to date with a `Scan` of the changelog from
/// the snapshot's offset. Once the TTL has trimmed the changelog past that offset (it
/// may, up to the newest snapshot), the reader that comes back late is told so
/// (`OffsetOutOfRange`), never handed fewer changes as if they were all; a new
/// `Snapshot` read starts it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_reader_past_the_trim_fails_loudly_and_a_new_snapshot_serves() {
    use mink_flight::protocol::ReadTicket;
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let node = Node::start(fast_ttl(config(dir.path(), &shared, "n0")))
        .await
        .unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    let path = users_with_a_short_ttl(&client).await;
    let bucket = bucket_zero(&node, &path);
    let first = user_rows(0..10, "a");
    settle(|| client.put(&path, &first, None, None)).await;
    let snapshot = client
        .read_state_any(&ReadTicket::Snapshot {
            bucket,
            columns: None,
            filter: None,
        })
        .await
        .unwrap();
    let at = snapshot[0].1.log_offset;
    // Later changes; the TTL then trims past `at` (writing newer snapshots first).
    for round in 0..3 {
        client
            .put(&path, &user_rows(0..10, &format!("r{round}")), None, None)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut start = 0;
    for _ in 0..200 {
        start = node.streams().metadata().read(|s, _| {
            s.streams
                .get(&bucket.stream_name())
                .map_or(0, |m| m.start_offset)
        });
        if start as i64 > at {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        start as i64 > at,
        "the TTL never trimmed past the snapshot at {at}"
    );
    let err = client.scan(&path, bucket, at).await.unwrap_err();
    assert!(
        matches!(err, mink_types::MinkError::OffsetOutOfRange { .. })
            || err.to_string().contains("out of range"),
        "{err:?}"
    );
    let renewed = client
        .read_state_any(&ReadTicket::Snapshot {
            bucket,
            columns: None,
            filter: None,
        })
        .await
        .unwrap();
    let renewed_at = renewed[0].1.log_offset;
    assert!(renewed_at >= start as i64, "{renewed_at} < {start}");
    client.scan(&path, bucket, renewed_at).await.unwrap();
    node.stop().await;
}

/// `rows` appended to `path` with a table-addressed `AppendTable` at `addr`: the node
/// routes the rows and forwards the parts of buckets it does not lead. Its answer.
async fn append_table(
    addr: &str,
    path: &TablePath,
    rows: &RecordBatch,
) -> mink_types::Result<serde_json::Value> {
    use mink_flight::client::status_to_error;
    let mut raw = mink_flight::client::connect(addr).await?;
    let descriptor = mink_flight::protocol::WriteDescriptor::AppendTable {
        path: path.clone(),
        schema_id: 1,
    };
    let data = mink_flight::client::encode_write(rows, Some(&descriptor), &Default::default())?;
    let mut results = raw
        .do_put(futures::stream::iter(data))
        .await
        .map_err(status_to_error)?
        .into_inner();
    let first = results
        .message()
        .await
        .map_err(status_to_error)?
        .expect("an answer");
    Ok(serde_json::from_slice(&first.app_metadata).unwrap())
}

/// The leader of `bucket` in `node`'s own view.
fn leader_in_view(node: &Node, bucket: TableBucket) -> Option<String> {
    node.meta.read(|s| {
        s.buckets
            .get(&bucket.stream_name())
            .and_then(|b| b.leader.clone())
    })
}

/// A request any node takes for a bucket (`list_offsets`, `lookup`) is forwarded to the
/// leader in the receiving node's view. While a bucket moves, two views can disagree:
/// n0 (the lease holder, which moved it) says n1 leads, n1 (a slow metadata tail) still
/// says n0. The forwarded request must be served, not handed back and forth: each hop
/// of such a ping-pong holds an HTTP/2 stream of the hop before it, and once the
/// connection's stream limit is reached no hop can finish (found by mink-query's
/// three-node test, whose queries hung while buckets moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_forwarded_to_a_node_with_a_stale_view_is_served_not_bounced() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let n0 = Node::start(config(dir.path(), &shared, "n0"))
        .await
        .unwrap();
    for _ in 0..100 {
        if n0.meta.is_lease_holder() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(n0.meta.is_lease_holder(), "n0 holds the lease");
    let mut slow = config(dir.path(), &shared, "n1");
    slow.meta.tail_idle_interval_max_ms = 8_000;
    slow.meta.lease_timeout_ms = 20_000;
    slow.meta.node_session_timeout_ms = 21_000;
    let n1 = Node::start(slow).await.unwrap();
    let client = MinkClient::connect(&n0.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let events = TablePath::parse("db.events").unwrap();
    client
        .create_table(&events, &common::events_in(1))
        .await
        .unwrap();
    let users_path = TablePath::parse("db.users").unwrap();
    client.create_table(&users_path, &users(&[])).await.unwrap();
    let log_bucket = bucket_zero(&n0, &events);
    let kv_bucket = bucket_zero(&n0, &users_path);
    let (rows, user_rows) = (common::rows(0..10), user_rows(0..10, "u"));
    settle(|| client.append(&events, &rows)).await;
    settle(|| client.put(&users_path, &user_rows, None, None)).await;
    let n1_client = MinkClient::connect(&n1.flight_addr.to_string())
        .await
        .unwrap();
    // Asked through n0, whose view is the newer one: the receiver (n1) catches up to
    // the forwarder's index and serves. Asked through n1, whose view is the stale
    // one: the leader it forwards to (n0) answers that it does not lead, and n1
    // catches up and serves.
    // A table write through n1 while its view is stale: n1 forwards its part to n0,
    // which redirects it back; n1 catches up and writes it (no tight loop).
    let mut end = 10;
    for (asker, through, write) in [
        (&client, "n0", false),
        (&n1_client, "n1", false),
        (&n1_client, "n1", true),
    ] {
        // Both buckets on n0, and n1's view saying so.
        for bucket in [log_bucket, kv_bucket] {
            if leader_in_view(&n0, bucket).as_deref() != Some("n0") {
                move_bucket(&client, bucket, "n0").await;
            }
            wait_led_by(&n0, bucket).await;
        }
        for _ in 0..400 {
            if [log_bucket, kv_bucket]
                .iter()
                .all(|b| leader_in_view(&n1, *b).as_deref() == Some("n0"))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // n1's metadata tail backs off while nothing changes (up to 8 s between looks).
        tokio::time::sleep(Duration::from_secs(4)).await;
        // Moved to n1 by n0, which applies the move at once; n1 learns of it late.
        move_bucket(&client, log_bucket, "n1").await;
        move_bucket(&client, kv_bucket, "n1").await;
        assert_eq!(leader_in_view(&n0, log_bucket).as_deref(), Some("n1"));
        assert_eq!(leader_in_view(&n1, log_bucket).as_deref(), Some("n0"));
        if write {
            let more = common::rows(end..end + 10);
            let addr = n1.flight_addr.to_string();
            tokio::time::timeout(Duration::from_secs(20), append_table(&addr, &events, &more))
                .await
                .unwrap_or_else(|_| panic!("a table write through {through} answered"))
                .unwrap();
            end += 10;
        }
        let latest = tokio::time::timeout(
            Duration::from_secs(20),
            asker.call(&mink_flight::actions::ListOffsets {
                forwarded: false,
                path: events.clone(),
                spec: "latest".into(),
                timestamp: None,
                partition: None,
                buckets: None,
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("list_offsets through {through} answered"))
        .unwrap();
        assert_eq!(latest.len(), 1);
        assert_eq!(
            (latest[0].bucket, latest[0].offset),
            (log_bucket, Some(end))
        );
        let found = tokio::time::timeout(
            Duration::from_secs(20),
            names(asker, &users_path, &[3, 7, 42]),
        )
        .await
        .unwrap_or_else(|_| panic!("lookup through {through} answered"));
        assert_eq!(found, vec![(3, "u3".to_string()), (7, "u7".to_string())]);
    }
    n1.stop().await;
    n0.stop().await;
}
