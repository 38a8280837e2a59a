//! Lake tiering through a node: rounds commit what the log holds, `Lake` reads the
//! lake, `Union` reads every row exactly once while rounds commit underneath it, the
//! TTL never trims what the lake lacks, and a dropped table's lake data goes with it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use mink_flight::MinkClient;
use mink_flight::protocol::{ReadTicket, ScanBatch};
use mink_node::node::Node;
use mink_types::{LakeProperties, MinkError, TableBucket, TableDescriptor, TablePath};

use crate::common;
use common::{config, ids, rows};

fn lake_events(buckets: u32) -> TableDescriptor {
    let mut d = common::events_in(buckets);
    d.properties.lake = LakeProperties {
        enabled: true,
        freshness: Duration::from_secs(1),
        partition: None,
    };
    d
}

async fn start(dir: &std::path::Path) -> Node {
    let mut c = config(dir, &dir.join("objects"), "n0");
    c.lake.check_interval_ms = 50;
    c.log.ttl_check_interval_ms = 50;
    Node::start(c).await.unwrap()
}

/// The lake snapshot's offsets, once some round committed.
async fn lake_offsets(client: &MinkClient, path: &TablePath) -> Option<BTreeMap<String, i64>> {
    let answer: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .ok()?;
    serde_json::from_value(answer["offsets"].clone()).ok()
}

/// Waits until the lake holds `rows` rows of the table (the node's rounds run every
/// freshness interval; the wait is for the node to do its duty).
async fn until_tiered(client: &MinkClient, path: &TablePath, rows: i64) {
    for _ in 0..600 {
        if let Some(o) = lake_offsets(client, path).await
            && o.values().sum::<i64>() >= rows
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the lake never held {rows} rows of {path}");
}

/// The first offset of bucket 0 of an unpartitioned table.
async fn earliest(client: &MinkClient, path: &TablePath) -> i64 {
    let answer: serde_json::Value = client
        .action(
            "list_offsets",
            serde_json::json!({"path": path, "spec": "earliest"}),
        )
        .await
        .unwrap();
    answer[0]["offset"].as_i64().unwrap_or(0)
}

/// Turns the lake on for `path` with `alter_table`, tiering every second.
async fn enable_lake(client: &MinkClient, path: &TablePath) {
    client
        .action::<serde_json::Value>(
            "alter_table",
            serde_json::json!({"path": path, "set_properties": {"lake.enabled": "true", "lake.freshness": "1s"}}),
        )
        .await
        .unwrap();
}

/// Checks a `Union` or `Lake` answer at the offset level: per bucket the batches cover
/// `[0, end)` exactly once, in order; returns the ends.
fn coverage(batches: &[(arrow::array::RecordBatch, ScanBatch)]) -> BTreeMap<String, i64> {
    let mut ends: BTreeMap<String, i64> = BTreeMap::new();
    for (b, meta) in batches {
        let end = ends.entry(meta.bucket.stream_name()).or_insert(0);
        assert_eq!(
            meta.base_offset, *end,
            "{}: a batch starts at {} where {} was expected (a gap or a duplicate)",
            meta.bucket, meta.base_offset, end
        );
        *end += b.num_rows() as i64;
    }
    ends
}

async fn read(
    client: &MinkClient,
    ticket: ReadTicket,
) -> Vec<(arrow::array::RecordBatch, ScanBatch)> {
    client.read_any(&ticket).await.unwrap()
}

/// The ids of a scan-metadata read, sorted.
fn read_ids(batches: &[(arrow::array::RecordBatch, ScanBatch)]) -> Vec<i64> {
    let batches: Vec<_> = batches.iter().map(|(b, _)| b.clone()).collect();
    ids(&batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_tier_and_union_reads_every_row_once_while_they_commit() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let client = Arc::new(
        MinkClient::connect(&node.flight_addr.to_string())
            .await
            .unwrap(),
    );
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &lake_events(4)).await.unwrap();
    client.append(&path, &rows(0..100)).await.unwrap();
    client.append(&path, &rows(100..200)).await.unwrap();
    until_tiered(&client, &path, 200).await;

    let lake = read(
        &client,
        ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&lake), (0..200).collect::<Vec<_>>());
    assert_eq!(coverage(&lake).values().sum::<i64>(), 200);
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    assert_eq!(snap["records"], 200);
    let first_snapshot = snap["snapshot_id"].as_i64().unwrap();

    // Rows not yet tiered come from the log.
    client.append(&path, &rows(200..300)).await.unwrap();
    let union = read(
        &client,
        ReadTicket::Union {
            path: path.clone(),
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&union), (0..300).collect::<Vec<_>>());
    coverage(&union);

    // Writers and Union readers race the rounds: every read holds each row once, and
    // every row acknowledged before it began.
    let acked = Arc::new(AtomicI64::new(300));
    let writer = {
        let (client, path, acked) = (client.clone(), path.clone(), acked.clone());
        tokio::spawn(async move {
            for start in (300..1500).step_by(20) {
                client
                    .append(&path, &rows(start..start + 20))
                    .await
                    .unwrap();
                acked.store(start + 20, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let info: serde_json::Value = client
        .action("get_table", serde_json::json!({"path": path}))
        .await
        .unwrap();
    let table_id: mink_types::TableId = info["id"].as_i64().unwrap();
    let buckets: Vec<TableBucket> = (0..4)
        .map(|b| TableBucket::new(table_id, None, b))
        .collect();
    let mut reads = 0;
    let mut versions = HashSet::new();
    while !writer.is_finished() || reads < 3 {
        let before = acked.load(Ordering::SeqCst);
        let union = read(
            &client,
            ReadTicket::Union {
                path: path.clone(),
                bucket: None,
                columns: None,
                filter: None,
            },
        )
        .await;
        coverage(&union);
        let got = read_ids(&union);
        let unique: HashSet<i64> = got.iter().copied().collect();
        assert_eq!(unique.len(), got.len(), "a Union read returned a row twice");
        assert!(
            (0..before).all(|i| unique.contains(&i)),
            "a Union read lacks a row acknowledged before it began"
        );
        // The same, read as each bucket's part of the Union (as mink-query reads a
        // lake-tiered table, one part per bucket in parallel): rounds commit between
        // the parts, and every row is still there once.
        let before = acked.load(Ordering::SeqCst);
        let mut got = Vec::new();
        for bucket in &buckets {
            let part = read(
                &client,
                ReadTicket::Union {
                    path: path.clone(),
                    bucket: Some(*bucket),
                    columns: None,
                    filter: None,
                },
            )
            .await;
            coverage(&part);
            assert!(part.iter().all(|(_, m)| m.bucket == *bucket), "{bucket}");
            got.extend(read_ids(&part));
        }
        let unique: HashSet<i64> = got.iter().copied().collect();
        assert_eq!(unique.len(), got.len(), "Union parts returned a row twice");
        assert!(
            (0..before).all(|i| unique.contains(&i)),
            "Union parts lack a row acknowledged before they began"
        );
        if let Some(o) = lake_offsets(&client, &path).await {
            versions.insert(o.values().sum::<i64>());
        }
        reads += 1;
    }
    writer.await.unwrap();
    assert!(
        versions.len() >= 2,
        "rounds committed while the readers read: {versions:?}"
    );
    until_tiered(&client, &path, 1500).await;
    let lake = read(
        &client,
        ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&lake), (0..1500).collect::<Vec<_>>());
    // An older snapshot still reads as it was.
    let old = read(
        &client,
        ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: Some(first_snapshot),
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&old), (0..200).collect::<Vec<_>>());
    // The same snapshot read one bucket at a time (as mink-query reads `t$lake`, the
    // snapshot id fixed when the query is planned): each part holds its bucket's rows
    // alone, and together they are the snapshot, every row once.
    let mut parts = Vec::new();
    for bucket in &buckets {
        let part = read(
            &client,
            ReadTicket::Lake {
                path: path.clone(),
                snapshot_id: Some(first_snapshot),
                bucket: Some(*bucket),
                columns: None,
                filter: None,
            },
        )
        .await;
        assert!(part.iter().all(|(_, m)| m.bucket == *bucket), "{bucket}");
        parts.extend(read_ids(&part));
    }
    parts.sort();
    assert_eq!(parts, (0..200).collect::<Vec<_>>());
    let missing = client
        .read_any(&ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: Some(42),
            bucket: None,
            columns: None,
            filter: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(missing, MinkError::NotFound(_)), "{missing:?}");
    // A part of a bucket the table does not have, or of another table, is NotFound.
    for bucket in [
        TableBucket::new(table_id, None, 4),
        TableBucket::new(table_id + 1, None, 0),
        TableBucket::new(table_id, Some(1), 0),
    ] {
        for ticket in [
            ReadTicket::Union {
                path: path.clone(),
                bucket: Some(bucket),
                columns: None,
                filter: None,
            },
            ReadTicket::Lake {
                path: path.clone(),
                snapshot_id: None,
                bucket: Some(bucket),
                columns: None,
                filter: None,
            },
        ] {
            let e = client.read_any(&ticket).await.unwrap_err();
            assert!(
                matches!(&e, MinkError::NotFound(m) if m.contains("is not a bucket of")),
                "{ticket:?}: {e:?}"
            );
        }
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_never_trims_what_the_lake_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    // Same TTL; the lake table tiers once a day, the other has no lake.
    let mut tiered = lake_events(1);
    tiered.properties.lake.freshness = Duration::from_secs(24 * 3600);
    tiered.properties.log_ttl = "1s".parse().unwrap();
    let mut plain = common::events_in(1);
    plain.properties.log_ttl = "1s".parse().unwrap();
    let (t, p) = (
        TablePath::parse("db.tiered").unwrap(),
        TablePath::parse("db.plain").unwrap(),
    );
    client.create_table(&t, &tiered).await.unwrap();
    client.create_table(&p, &plain).await.unwrap();
    // The first round runs when the node first sees the table (it may tier some of
    // these rows, or none); the next is a day away.
    client.append(&t, &rows(0..10)).await.unwrap();
    client.append(&t, &rows(10..20)).await.unwrap();
    client.append(&p, &rows(0..10)).await.unwrap();
    client.append(&p, &rows(10..20)).await.unwrap();
    // Wait for the TTL to trim the plain table (segments are cut by compaction first).
    for _ in 0..600 {
        if earliest(&client, &p).await > 0 {
            break;
        }
        node.streams().compact().await.ok();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        earliest(&client, &p).await > 0,
        "the TTL trimmed the table without a lake"
    );
    node.streams().compact().await.ok();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = earliest(&client, &t).await;
    let in_lake = lake_offsets(&client, &t)
        .await
        .map_or(0, |o| o.values().sum::<i64>());
    assert!(
        start <= in_lake,
        "the TTL trimmed the log to {start}; the lake holds rows below {in_lake} only"
    );
    let union = read(
        &client,
        ReadTicket::Union {
            path: t.clone(),
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&union), (0..20).collect::<Vec<_>>());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lake_properties_are_checked_and_a_dropped_tables_lake_goes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();

    // A column named like the lake's own is refused, naming it; bad freshness too.
    let mut clash = lake_events(1);
    clash.schema.columns[1].name = "__offset".into();
    let e = client.create_table(&path, &clash).await.unwrap_err();
    assert!(e.to_string().contains("__offset"), "{e}");
    let mut fast = lake_events(1);
    fast.properties.lake.freshness = Duration::from_millis(10);
    let e = client.create_table(&path, &fast).await.unwrap_err();
    assert!(e.to_string().contains("lake.freshness"), "{e}");

    // Turned on later with alter_table.
    client
        .create_table(&path, &common::events_in(2))
        .await
        .unwrap();
    client.append(&path, &rows(0..30)).await.unwrap();
    let e = client
        .action::<serde_json::Value>("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("lake.enabled is off"), "{e}");
    enable_lake(&client, &path).await;
    until_tiered(&client, &path, 30).await;

    // Dropped and made again: the new table's lake starts empty.
    client
        .action::<serde_json::Value>("drop_table", serde_json::json!({"path": path}))
        .await
        .unwrap();
    client.create_table(&path, &lake_events(2)).await.unwrap();
    // The client's routing still names the dropped table: it finds out and writes
    // to the new one.
    client.append(&path, &rows(100..105)).await.unwrap();
    until_tiered(&client, &path, 5).await;
    let lake = read(
        &client,
        ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&lake), (100..105).collect::<Vec<_>>());
    node.stop().await;
}

/// Every file under `root`, with its bytes.
fn files_under(root: &std::path::Path) -> BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.insert(path.strip_prefix(root).unwrap().to_path_buf(), bytes);
            }
        }
    }
    out
}

/// The lake rounds this process's nodes counted with `outcome`.
fn rounds(node: &Node, outcome: &str) -> u64 {
    let page = common::scrape_metrics(&node.admin_addr.to_string());
    page.lines()
        .filter(|l| {
            l.starts_with("mink_lake_rounds_total{")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The purge rule where it matters: a node whose catalog lags a drop and a re-create of
/// a name finds, at the name's lake path, the lake of a table *newer* than the one it
/// tiers. Its rounds fail and delete nothing (the newer table's TTL may already rely
/// on that lake); only the lake of an *older* table is purged. The lagging node is
/// made deterministic here: its table meets a lake another cluster wrote for a table
/// of a higher id at the same path, exactly what a node behind a drop and a
/// re-create meets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_of_a_newer_table_is_never_purged_by_a_node_behind() {
    // The newer table's lake: another cluster, where the name went to a later table id.
    let newer_dir = tempfile::tempdir().unwrap();
    let newer = start(newer_dir.path()).await;
    let client = MinkClient::connect(&newer.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    for name in ["db.a", "db.b"] {
        let p = TablePath::parse(name).unwrap();
        client
            .create_table(&p, &common::events_in(1))
            .await
            .unwrap();
    }
    client.create_table(&path, &lake_events(1)).await.unwrap();
    client.append(&path, &rows(0..40)).await.unwrap();
    until_tiered(&client, &path, 40).await;
    newer.stop().await;
    let newer_lake = newer_dir.path().join("objects/lake/db/events");
    let written = files_under(&newer_lake);
    assert!(!written.is_empty());

    // The node behind: its db.events has a lower id, and tiers to the same path.
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    client
        .create_table(&path, &common::events_in(1))
        .await
        .unwrap();
    client.append(&path, &rows(100..110)).await.unwrap();
    let lake = dir.path().join("objects/lake/db/events");
    for (name, bytes) in &written {
        let to = lake.join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, bytes).unwrap();
    }
    let failed_before = rounds(&node, "failed");
    enable_lake(&client, &path).await;
    // Rounds run (and fail) until the node's catalog catches up, which here it never
    // does; every one of them leaves the newer table's lake as it was.
    for _ in 0..600 {
        if rounds(&node, "failed") >= failed_before + 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        rounds(&node, "failed") >= failed_before + 3,
        "the node ran no round against the newer table's lake"
    );
    assert_eq!(
        files_under(&lake),
        written,
        "a node behind changed the lake of a newer table"
    );
    // Its reads see no lake of its own table: a Union is its log alone.
    let union = read(
        &client,
        ReadTicket::Union {
            path: path.clone(),
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&union), (100..110).collect::<Vec<_>>());
    node.stop().await;
}

fn state_rows(ids: std::ops::Range<i64>, tag: &str) -> arrow::array::RecordBatch {
    let schema = common::events_in(1).schema.to_arrow();
    arrow::array::RecordBatch::try_new(
        schema,
        vec![
            Arc::new(arrow::array::Int64Array::from_iter_values(ids.clone())),
            Arc::new(arrow::array::StringArray::from_iter_values(
                ids.map(|i| format!("{tag}{i}")),
            )),
        ],
    )
    .unwrap()
}

/// `(id, msg)` of a state read, sorted by id.
fn state(
    batches: &[(
        arrow::array::RecordBatch,
        mink_flight::protocol::SnapshotBatch,
    )],
) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for (b, _) in batches {
        let ids = b
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap();
        let msgs = b
            .column(1)
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .unwrap();
        for i in 0..b.num_rows() {
            out.push((ids.value(i), msgs.value(i).to_string()));
        }
    }
    out.sort();
    out
}

/// A node of config `c` with a lake-enabled primary-key table `db.users` of
/// `buckets` buckets.
async fn pk_table_on(c: mink_node::MinkConfig, buckets: u32) -> (Node, MinkClient, TablePath) {
    let node = Node::start(c).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    let path = pk_table(&client, buckets).await;
    (node, client, path)
}

/// The lake-enabled primary-key table `db.users` of `buckets` buckets, through `client`.
async fn pk_table(client: &MinkClient, buckets: u32) -> TablePath {
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.users").unwrap();
    let mut d = lake_events(buckets);
    d.primary_key = vec!["id".into()];
    client.create_table(&path, &d).await.unwrap();
    path
}

/// A `Lake` read of a primary-key table's state.
async fn lake_state(
    client: &MinkClient,
    path: &TablePath,
) -> Vec<(
    arrow::array::RecordBatch,
    mink_flight::protocol::SnapshotBatch,
)> {
    client
        .read_state_any(&ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        })
        .await
        .unwrap()
}

/// A `Union` read of a primary-key table's state.
async fn union_state(
    client: &MinkClient,
    path: &TablePath,
) -> Vec<(
    arrow::array::RecordBatch,
    mink_flight::protocol::SnapshotBatch,
)> {
    client
        .read_state_any(&ReadTicket::Union {
            path: path.clone(),
            bucket: None,
            columns: None,
            filter: None,
        })
        .await
        .unwrap()
}

async fn log_end(client: &MinkClient, path: &TablePath) -> i64 {
    let answer: serde_json::Value = client
        .action(
            "list_offsets",
            serde_json::json!({"path": path, "spec": "latest"}),
        )
        .await
        .unwrap();
    answer
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["offset"].as_i64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_table_tiers_its_state_and_union_merges_by_key() {
    use mink_types::ChangeType;
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.users").unwrap();
    let mut d = lake_events(2);
    d.primary_key = vec!["id".into()];
    client.create_table(&path, &d).await.unwrap();
    let expect = |parts: &[(std::ops::Range<i64>, &str)]| {
        let mut m = BTreeMap::new();
        for (ids, tag) in parts {
            for i in ids.clone() {
                m.insert(i, format!("{tag}{i}"));
            }
        }
        m.into_iter().collect::<Vec<_>>()
    };

    // Inserts, updates and deletes, then the lake catches up with the changelog.
    client
        .put(&path, &state_rows(0..50, "a"), None, None)
        .await
        .unwrap();
    client
        .put(&path, &state_rows(0..20, "b"), None, None)
        .await
        .unwrap();
    client
        .put(
            &path,
            &state_rows(40..50, "a"),
            Some(vec![ChangeType::Delete; 10]),
            None,
        )
        .await
        .unwrap();
    until_tiered(&client, &path, log_end(&client, &path).await).await;
    let want = expect(&[(0..20, "b"), (20..40, "a")]);
    let lake = lake_state(&client, &path).await;
    assert_eq!(state(&lake), want, "the lake holds the state");
    let union = union_state(&client, &path).await;
    assert_eq!(state(&union), want);

    // Changes the lake has not seen yet: Union merges them by key at once.
    client
        .put(&path, &state_rows(20..30, "c"), None, None)
        .await
        .unwrap();
    client
        .put(
            &path,
            &state_rows(0..5, "b"),
            Some(vec![ChangeType::Delete; 5]),
            None,
        )
        .await
        .unwrap();
    client
        .put(&path, &state_rows(100..105, "d"), None, None)
        .await
        .unwrap();
    let want = expect(&[(5..20, "b"), (20..30, "c"), (30..40, "a"), (100..105, "d")]);
    let union = union_state(&client, &path).await;
    assert_eq!(state(&union), want, "Union is the state now");
    // Once tiered, the lake (files rewritten, the old ones replaced) agrees.
    until_tiered(&client, &path, log_end(&client, &path).await).await;
    let lake = lake_state(&client, &path).await;
    assert_eq!(state(&lake), want);
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    assert_eq!(
        snap["records"].as_u64().unwrap() - snap["position_deletes"].as_u64().unwrap(),
        want.len() as u64,
        "the lake's rows less its position deletes are the state"
    );
    // Deleting every key leaves an empty bucket state, which tiers too.
    let ids: Vec<i64> = want.iter().map(|(i, _)| *i).collect();
    for id in ids {
        client
            .put(
                &path,
                &state_rows(id..id + 1, "x"),
                Some(vec![ChangeType::Delete]),
                None,
            )
            .await
            .unwrap();
    }
    until_tiered(&client, &path, log_end(&client, &path).await).await;
    let lake = lake_state(&client, &path).await;
    assert!(state(&lake).is_empty());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_tiers_in_bounded_rounds_and_date_partitions_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), &dir.path().join("objects"), "n0");
    c.lake.check_interval_ms = 50;
    c.lake.file_bytes_target = 4 << 10;
    c.lake.round_bytes_max = 16 << 10;
    let node = Node::start(c).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    // Partitioned by a DATE column.
    let path = TablePath::parse("db.daily").unwrap();
    let mut d = common::events_in(2);
    d.schema.columns.push(mink_types::Column::new(
        "day",
        mink_types::DataType::Date,
        false,
    ));
    d.partition_keys = vec!["day".into()];
    client.create_table(&path, &d).await.unwrap();
    let batch = |ids: std::ops::Range<i64>| {
        let base = rows(ids.clone());
        arrow::array::RecordBatch::try_new(
            d.schema.to_arrow(),
            vec![
                base.column(0).clone(),
                base.column(1).clone(),
                Arc::new(arrow::array::Date32Array::from_iter_values(
                    ids.map(|i| 20_000 + (i % 2) as i32),
                )),
            ],
        )
        .unwrap()
    };
    // A backlog written before the lake is on: many files over several rounds.
    for start in (0..3000).step_by(500) {
        client
            .append(&path, &batch(start..start + 500))
            .await
            .unwrap();
    }
    client
        .action::<serde_json::Value>(
            "alter_table",
            serde_json::json!({"path": path, "set_properties": {"lake.enabled": "true", "lake.freshness": "1h"}}),
        )
        .await
        .unwrap();
    // With a freshness of an hour, only rounds that stopped short re-run at once.
    until_tiered(&client, &path, 3000).await;
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    assert!(snap["files"].as_u64().unwrap() > 8, "{snap}");
    let lake = read(
        &client,
        ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&lake), (0..3000).collect::<Vec<_>>());
    coverage_per_partition(&lake);
    node.stop().await;
}

/// As `coverage`, with partitions told apart.
fn coverage_per_partition(batches: &[(arrow::array::RecordBatch, ScanBatch)]) {
    let mut ends: BTreeMap<mink_types::TableBucket, i64> = BTreeMap::new();
    for (b, meta) in batches {
        let end = ends.entry(meta.bucket).or_insert(0);
        assert_eq!(
            meta.base_offset, *end,
            "{}: a gap or a duplicate",
            meta.bucket
        );
        *end += b.num_rows() as i64;
    }
}

/// Two nodes lead a table's buckets: both tier theirs into the one lake table (their
/// commits race on the version), and either answers `Union`, reading the other's
/// buckets' logs at their leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_tier_one_table_and_either_answers_union() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("objects");
    let mut nodes = Vec::new();
    for id in ["n0", "n1"] {
        let mut c = config(dir.path(), &shared, id);
        c.lake.check_interval_ms = 50;
        nodes.push(Node::start(c).await.unwrap());
    }
    let client = MinkClient::connect(&nodes[0].flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &lake_events(4)).await.unwrap();
    client.append(&path, &rows(0..100)).await.unwrap();
    // Until both nodes lead buckets of it (the lease holder spreads them on rebalance).
    let mut spread = false;
    for _ in 0..100 {
        let meta: serde_json::Value = client
            .action("metadata", serde_json::json!({"path": path}))
            .await
            .unwrap();
        let leaders: HashSet<String> = meta["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b["leader"].as_str().map(str::to_string))
            .collect();
        if leaders.len() == 2 {
            spread = true;
            break;
        }
        let _ = client
            .action::<serde_json::Value>("rebalance", serde_json::json!({}))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(spread, "the buckets never spread over both nodes");
    client.append(&path, &rows(100..200)).await.unwrap();
    until_tiered(&client, &path, 200).await;
    client.append(&path, &rows(200..250)).await.unwrap();
    for node in &nodes {
        let c = MinkClient::connect(&node.flight_addr.to_string())
            .await
            .unwrap();
        let union = c
            .read_any(&ReadTicket::Union {
                path: path.clone(),
                bucket: None,
                columns: None,
                filter: None,
            })
            .await
            .unwrap();
        coverage(&union);
        assert_eq!(read_ids(&union), (0..250).collect::<Vec<_>>());
    }
    for node in nodes {
        node.stop().await;
    }
}

/// A `Union` read holds its lake snapshot's offsets while it streams the lake part;
/// the log rows above them stay for `lake.trim_grace_ms` after a newer round. A reader
/// slower than that finds them trimmed when it reaches the log part: it is told so
/// (`OUT_OF_RANGE`), never handed a short answer as if it were whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_reader_slower_than_the_trim_grace_fails_loudly() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), &dir.path().join("objects"), "n0");
    c.lake.check_interval_ms = 50;
    c.lake.trim_grace_ms = 200;
    c.log.ttl_check_interval_ms = 50;
    c.wal.compaction_interval_ms = 50;
    let node = Node::start(c).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    let mut d = lake_events(1);
    d.properties.log_ttl = "1s".parse().unwrap();
    // Rounds 3 s apart: the read below starts well between two.
    d.properties.lake.freshness = Duration::from_secs(3);
    client.create_table(&path, &d).await.unwrap();
    // Enough rows that the lake part outgrows the stream's flow-control window, so
    // that the node reads the log part only when the reader gets there.
    let wide = |ids: std::ops::Range<i64>| {
        arrow::array::RecordBatch::try_new(
            common::events_in(1).schema.to_arrow(),
            vec![
                Arc::new(arrow::array::Int64Array::from_iter_values(ids.clone())),
                Arc::new(arrow::array::StringArray::from_iter_values(
                    ids.map(|i| format!("{i:0>200}")),
                )),
            ],
        )
        .unwrap()
    };
    // (About 13 MB in ~60 Parquet batches: the node sends up to 16 messages ahead into
    // the response, and the client's HTTP/2 window holds 2 MiB more.)
    let mut next = 0;
    while next < 60_000 {
        client
            .append(&path, &wide(next..next + 4_000))
            .await
            .unwrap();
        next += 4_000;
    }
    until_tiered(&client, &path, next).await;
    // Rows the lake lacks: the read's log part, from the lake's offset.
    client.append(&path, &rows(next..next + 10)).await.unwrap();
    let tiered = next;
    next += 10;
    let mut flight = mink_flight::client::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    let ticket = serde_json::to_vec(&ReadTicket::Union {
        path: path.clone(),
        bucket: None,
        columns: None,
        filter: None,
    })
    .unwrap();
    let mut stream = flight
        .do_get(arrow_flight::Ticket {
            ticket: ticket.into(),
        })
        .await
        .unwrap()
        .into_inner();
    // The schema and the first lake batch, then the reader stalls.
    for _ in 0..2 {
        stream.next().await.unwrap().unwrap();
    }
    assert_eq!(
        lake_offsets(&client, &path)
            .await
            .map(|o| o.values().sum::<i64>()),
        Some(tiered),
        "a round ran before the read began: the test proves nothing"
    );
    // Meanwhile: a newer round tiers the log part's rows, and the TTL trims them once
    // the grace has passed.
    until_tiered(&client, &path, next).await;
    for _ in 0..400 {
        if earliest(&client, &path).await > tiered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        earliest(&client, &path).await > tiered,
        "the TTL never trimmed past the first round"
    );
    // The reader comes back.
    let mut outcome = Ok(());
    while let Some(message) = stream.next().await {
        if let Err(status) = message {
            outcome = Err(status);
            break;
        }
    }
    let status = outcome.expect_err("a Union read past the trim grace ended as if whole");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    // A new read is whole.
    let union = read(
        &client,
        ReadTicket::Union {
            path: path.clone(),
            bucket: None,
            columns: None,
            filter: None,
        },
    )
    .await;
    assert_eq!(read_ids(&union), (0..next).collect::<Vec<_>>());
    node.stop().await;
}

/// Merge-on-read: rounds after the first add the changed rows and position deletes of
/// the rows they replace (updates, deletes, re-inserts of deleted keys), `Lake` and `Union` read exactly the state after each, and once the delta
/// files pass `lake.rewrite_files_max` a round rewrites the bucket with no deletes left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_lake_merges_on_read_then_rewrites() {
    merges_on_read_then_rewrites(128 << 20).await;
}

/// The same without a key index: every round finds the changed keys' rows from the
/// key columns of the bucket's files (range reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_lake_merges_on_read_from_its_key_columns() {
    merges_on_read_then_rewrites(0).await;
}

async fn merges_on_read_then_rewrites(key_index_bytes_max: u64) {
    use mink_types::ChangeType;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), &dir.path().join("objects"), "n0");
    c.lake.check_interval_ms = 50;
    c.lake.rewrite_deleted_percent = 100;
    c.lake.rewrite_files_max = 6;
    c.lake.key_index_bytes_max = key_index_bytes_max;
    let (node, client, path) = pk_table_on(c, 1).await;
    let mut want: BTreeMap<i64, String> = BTreeMap::new();
    let snapshot = || async {
        client
            .action::<serde_json::Value>("lake_snapshot", serde_json::json!({"path": path}))
            .await
            .unwrap()
    };
    // Each step: one Put, one round, then the lake, Union and the snapshot's counts.
    let steps: Vec<(std::ops::Range<i64>, &str, Option<ChangeType>)> = vec![
        (0..100, "a", None),                      // the first round: a rewrite
        (0..10, "b", None),                       // updates
        (10..20, "x", Some(ChangeType::Delete)),  // deletes
        (10..15, "c", None),                      // re-inserts of deleted keys
        (50..55, "d", None),                      // more updates
        (95..100, "e", Some(ChangeType::Delete)), // deletes at the end of a file
        (0..3, "f", None),                        // past rewrite_files_max: a rewrite
    ];
    let mut deletes_seen = 0;
    for (n, (ids, tag, change)) in steps.into_iter().enumerate() {
        let count = (ids.end - ids.start) as usize;
        client
            .put(
                &path,
                &state_rows(ids.clone(), tag),
                change.map(|c| vec![c; count]),
                None,
            )
            .await
            .unwrap();
        for i in ids {
            match change {
                Some(ChangeType::Delete) => want.remove(&i),
                _ => want.insert(i, format!("{tag}{i}")),
            };
        }
        until_tiered(&client, &path, log_end(&client, &path).await).await;
        let want: Vec<(i64, String)> = want.clone().into_iter().collect();
        let lake = lake_state(&client, &path).await;
        assert_eq!(state(&lake), want, "step {n}: the lake is the state");
        let union = union_state(&client, &path).await;
        assert_eq!(state(&union), want, "step {n}: Union is the state");
        let snap = snapshot().await;
        let live = snap["records"].as_u64().unwrap() - snap["position_deletes"].as_u64().unwrap();
        assert_eq!(live, want.len() as u64, "step {n}: {snap}");
        deletes_seen = deletes_seen.max(snap["delete_files"].as_u64().unwrap());
        if n == 0 || n == 6 {
            assert_eq!(snap["delete_files"], 0, "step {n} rewrites: {snap}");
            assert_eq!(snap["position_deletes"], 0, "step {n}: {snap}");
        }
        if n == 1 {
            assert_eq!(snap["delete_files"], 1, "step 1 merges on read: {snap}");
            assert_eq!(snap["position_deletes"], 10, "step 1: {snap}");
            assert_eq!(
                snap["added_records"], 10,
                "step 1 writes the change, not the state: {snap}"
            );
        }
    }
    assert!(
        deletes_seen >= 4,
        "rounds merged on read ({deletes_seen} delete files)"
    );
    node.stop().await;
}

/// A seeded xorshift: `next(n)` is in `0..n`.
fn seeded(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut rng = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    }
}

/// Step `step` of a race: one Put through `client` of a random run of keys in `0..72`,
/// an upsert or (one in four) a delete, applied to `model` as well; every fifth step
/// `Union` is checked against the model.
async fn random_change(
    client: &MinkClient,
    path: &TablePath,
    model: &mut BTreeMap<i64, String>,
    step: usize,
    next: &mut impl FnMut(u64) -> u64,
    what: &str,
) {
    use mink_types::ChangeType;
    let start = next(60) as i64;
    let len = 1 + next(12) as i64;
    let ids = start..start + len;
    let delete = next(4) == 0;
    let tag = format!("s{step}-");
    let changes = delete.then(|| vec![ChangeType::Delete; len as usize]);
    client
        .put(path, &state_rows(ids.clone(), &tag), changes, None)
        .await
        .unwrap();
    for i in ids {
        if delete {
            model.remove(&i);
        } else {
            model.insert(i, format!("{tag}{i}"));
        }
    }
    if step.is_multiple_of(5) {
        let union = union_state(client, path).await;
        let want: Vec<(i64, String)> = model.clone().into_iter().collect();
        assert_eq!(state(&union), want, "{what} step {step}: Union");
    }
}

/// Waits for the node(s) to tier the whole log, then checks `Lake` and the snapshot's
/// live rows against `model`.
async fn lake_is_the_model(
    client: &MinkClient,
    path: &TablePath,
    model: BTreeMap<i64, String>,
    what: &str,
) {
    until_tiered(client, path, log_end(client, path).await).await;
    let want: Vec<(i64, String)> = model.into_iter().collect();
    let lake = lake_state(client, path).await;
    assert_eq!(state(&lake), want, "{what}: the lake");
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    let live = snap["records"].as_u64().unwrap() - snap["position_deletes"].as_u64().unwrap();
    assert_eq!(live, want.len() as u64, "{what}: {snap}");
}

/// Seeded races of merge-on-read: a writer upserts and deletes random keys (batches
/// spanning both buckets) while rounds commit, merge on read and rewrite underneath it
/// (`rewrite_files_max` 3, so rewrites come often); `Union` is the model's state at
/// every read, and once the lake caught up so is `Lake`. Seeds replay
/// (`MINK_MOR_SEED=S`, `MINK_MOR_SEEDS=N`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_on_read_rounds_race_random_upserts_and_deletes() {
    for seed in mink_wal::fault::seeds_from_env("MINK_MOR_SEED", "MINK_MOR_SEEDS", 2) {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), &dir.path().join("objects"), "n0");
        c.lake.check_interval_ms = 20;
        c.lake.rewrite_files_max = 3;
        // Every other seed without a key index: the rounds scan key columns.
        if seed % 2 == 1 {
            c.lake.key_index_bytes_max = 0;
        }
        let (node, client, path) = pk_table_on(c, 2).await;
        let mut next = seeded(seed);
        let mut model: BTreeMap<i64, String> = BTreeMap::new();
        let what = format!("seed {seed}");
        let started = std::time::Instant::now();
        let mut step = 0;
        // A few seconds of writes: several rounds (freshness 1 s) and rewrites.
        while started.elapsed() < Duration::from_secs(5) {
            step += 1;
            random_change(&client, &path, &mut model, step, &mut next, &what).await;
            tokio::time::sleep(Duration::from_millis(next(60))).await;
        }
        lake_is_the_model(&client, &path, model, &format!("{what} after {step} steps")).await;
        node.stop().await;
    }
}

/// The leader of bucket `bucket` of the unpartitioned table `path`, and the bucket.
async fn leader_of(
    client: &MinkClient,
    path: &TablePath,
    bucket: u64,
) -> (String, serde_json::Value) {
    let meta: serde_json::Value = client
        .action("metadata", serde_json::json!({"path": path}))
        .await
        .unwrap();
    let b = meta["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"]["bucket"] == bucket)
        .unwrap_or_else(|| panic!("no bucket {bucket}: {meta}"))
        .clone();
    (
        b["leader"].as_str().unwrap_or_default().to_string(),
        b["bucket"].clone(),
    )
}

/// Moves each of `buckets` to the other of nodes `n0` and `n1`; how many moved.
async fn swap_leaders(client: &MinkClient, path: &TablePath, buckets: &[u64]) -> u64 {
    let mut moves = 0;
    for &bucket in buckets {
        let (leader, b) = leader_of(client, path, bucket).await;
        let to = if leader == "n0" { "n1" } else { "n0" };
        let answer: serde_json::Value = client
            .action(
                "rebalance",
                serde_json::json!({"moves": [{"bucket": b, "to": to}]}),
            )
            .await
            .unwrap();
        moves += answer["moved"].as_u64().unwrap_or(0);
    }
    moves
}

/// SIGKILLs a node process and starts it again on the same address and data.
fn kill_and_restart(
    mut node: std::process::Child,
    (data, store, addr): (&std::path::Path, &std::path::Path, &str),
    env: &[(&str, &str)],
    what: &str,
) -> std::process::Child {
    node.kill().unwrap();
    node.wait().unwrap();
    let (restarted, again) = common::spawn_node(data, store, addr, env);
    assert_eq!(again, addr, "{what}");
    restarted
}

/// The same race while the buckets move between two nodes (bucket 0 about every
/// 1.2 s, bucket 1 now and then): a bucket's new leader has no key index of it and
/// finds the changed rows from the key columns, and its old leader, when the bucket
/// comes back, holds an index of files the other node's rounds replaced or deleted
/// from: no round may delete a wrong row or miss one. Seeds replay
/// (`MINK_MOR_MOVE_SEED=S`, `MINK_MOR_MOVE_SEEDS=N`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_on_read_rounds_follow_buckets_that_move_between_nodes() {
    for seed in mink_wal::fault::seeds_from_env("MINK_MOR_MOVE_SEED", "MINK_MOR_MOVE_SEEDS", 1) {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("objects");
        let mut nodes = Vec::new();
        for id in ["n0", "n1"] {
            let mut c = config(dir.path(), &shared, id);
            c.lake.check_interval_ms = 20;
            // Rounds merge on read (a rewrite would not need the index) but now and
            // then, when deltas pile up.
            c.lake.rewrite_deleted_percent = 100;
            c.lake.rewrite_files_max = 12;
            nodes.push(Node::start(c).await.unwrap());
        }
        let client = MinkClient::connect(&nodes[0].flight_addr.to_string())
            .await
            .unwrap();
        let path = pk_table(&client, 2).await;
        let mut next = seeded(seed);
        let mut model: BTreeMap<i64, String> = BTreeMap::new();
        let what = format!("seed {seed}");
        let started = std::time::Instant::now();
        let mut moved_at = started;
        let (mut step, mut moves) = (0, 0);
        while started.elapsed() < Duration::from_secs(8) {
            step += 1;
            random_change(&client, &path, &mut model, step, &mut next, &what).await;
            if moved_at.elapsed() > Duration::from_millis(1_200) {
                let both = next(2) == 1;
                moves += swap_leaders(&client, &path, if both { &[0, 1] } else { &[0] }).await;
                moved_at = std::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(next(60))).await;
        }
        assert!(moves >= 4, "{what}: {moves} moves");
        lake_is_the_model(
            &client,
            &path,
            model,
            &format!("{what} after {step} steps and {moves} moves"),
        )
        .await;
        for node in nodes {
            node.stop().await;
        }
    }
}

/// A node process killed (SIGKILL) three times while merge-on-read rounds run under a
/// stream of random upserts and deletes, each time restarted on the same address: a
/// round killed after writing its delta or delete file but before its commit leaves
/// files no snapshot names, and the restarted node (no key index, no remembered
/// files) tiers on from the committed snapshot. Every acknowledged change is in the
/// lake once it caught up, and `Union` is the model's state throughout. Seeds replay
/// (`MINK_MOR_KILL_SEED=S`, `MINK_MOR_KILL_SEEDS=N`).
///
/// A Put that changed nothing leaves no log record, so a restart loses its writer's
/// sequence: the client's next Put is refused as out of order and goes again under a
/// new writer (`kill.rs` pins that case alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_on_read_rounds_survive_a_killed_node() {
    let env = [
        ("MINK_LAKE__CHECK_INTERVAL_MS", "20"),
        ("MINK_LAKE__REWRITE_DELETED_PERCENT", "100"),
        ("MINK_LAKE__REWRITE_FILES_MAX", "12"),
    ];
    for seed in mink_wal::fault::seeds_from_env("MINK_MOR_KILL_SEED", "MINK_MOR_KILL_SEEDS", 1) {
        let dir = tempfile::tempdir().unwrap();
        let (data, store) = (dir.path().join("n0"), dir.path().join("objects"));
        let (mut node, addr) = common::spawn_node(&data, &store, "127.0.0.1:0", &env);
        let client = MinkClient::connect(&addr).await.unwrap();
        let path = pk_table(&client, 2).await;
        let mut next = seeded(seed);
        let mut model: BTreeMap<i64, String> = BTreeMap::new();
        let what = format!("seed {seed}");
        let mut step = 0;
        for kill in 0..3 {
            // Writes across a round or two (freshness 1 s), then a kill at a random
            // moment, a round perhaps in flight (the first write after it waits for
            // the restarted node: the client retries).
            let until = std::time::Instant::now() + Duration::from_millis(1_000 + next(1_000));
            let writes = async {
                while std::time::Instant::now() < until {
                    step += 1;
                    random_change(&client, &path, &mut model, step, &mut next, &what).await;
                }
            };
            writes.await;
            let at = (data.as_path(), store.as_path(), addr.as_str());
            node = kill_and_restart(node, at, &env, &format!("{what}: kill {kill}"));
        }
        lake_is_the_model(&client, &path, model, &format!("{what} after {step} steps")).await;
        node.kill().unwrap();
        node.wait().unwrap();
    }
}

/// A log table's lake gains a file per bucket per round; once a bucket has
/// `lake.compact_files_min` small files, the rounds that tier its rows also merge the
/// oldest run of them into one. The lake keeps a bounded number of files, every row
/// once at its offset, and a snapshot from before a compaction still reads as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_buckets_small_lake_files_are_compacted_and_every_row_stays_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), &dir.path().join("objects"), "n0");
    c.lake.check_interval_ms = 50;
    c.lake.compact_files_min = 4;
    let node = Node::start(c).await.unwrap();
    let client = MinkClient::connect(&node.flight_addr.to_string())
        .await
        .unwrap();
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &lake_events(1)).await.unwrap();
    let lake_read = |snapshot_id: Option<i64>| ReadTicket::Lake {
        path: path.clone(),
        snapshot_id,
        bucket: None,
        columns: None,
        filter: None,
    };
    let mut snapshots = Vec::new();
    let mut most_files = 0;
    for round in 0..10i64 {
        client
            .append(&path, &rows(round * 10..round * 10 + 10))
            .await
            .unwrap();
        until_tiered(&client, &path, round * 10 + 10).await;
        let snap: serde_json::Value = client
            .action("lake_snapshot", serde_json::json!({"path": path}))
            .await
            .unwrap();
        let files = snap["files"].as_u64().unwrap();
        most_files = most_files.max(files);
        snapshots.push((
            snap["snapshot_id"].as_i64().unwrap(),
            round * 10 + 10,
            files,
        ));
    }
    // One file per round without compaction: ten. With it, never more than the
    // threshold plus the round's own file.
    assert!(most_files <= 5, "{snapshots:?}");
    let (_, _, last_files) = snapshots.last().unwrap();
    assert!(*last_files < 10, "{snapshots:?}");
    let lake = read(&client, lake_read(None)).await;
    assert_eq!(coverage(&lake).values().sum::<i64>(), 100);
    assert_eq!(read_ids(&lake), (0..100).collect::<Vec<_>>());
    // Time travel across compactions: each snapshot still holds exactly its rows.
    for (id, rows_then, _) in &snapshots {
        let then = read(&client, lake_read(Some(*id))).await;
        coverage(&then);
        assert_eq!(
            read_ids(&then),
            (0..*rows_then).collect::<Vec<_>>(),
            "snapshot {id}"
        );
    }
    let page = common::scrape_metrics(&node.admin_addr.to_string());
    let compacted: f64 = page
        .lines()
        .filter(|l| l.starts_with("mink_lake_compacted_files_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(compacted >= 4.0, "files merged: {compacted}");
    node.stop().await;
}

/// Checks a log table's lake once it caught up with the log: `Lake` and `Union` both
/// hold ids `0..rows` once, each bucket's offsets `[0, end)` once and in order; the
/// snapshot has at most `files_max` files. Returns the snapshot's file count.
async fn log_lake_is_whole(client: &MinkClient, path: &TablePath, rows: i64, what: &str) -> u64 {
    until_tiered(client, path, rows).await;
    for ticket in [
        ReadTicket::Lake {
            path: path.clone(),
            snapshot_id: None,
            bucket: None,
            columns: None,
            filter: None,
        },
        ReadTicket::Union {
            path: path.clone(),
            bucket: None,
            columns: None,
            filter: None,
        },
    ] {
        let batches = read(client, ticket.clone()).await;
        coverage(&batches);
        assert_eq!(
            read_ids(&batches),
            (0..rows).collect::<Vec<_>>(),
            "{what}: {ticket:?}"
        );
    }
    let snap: serde_json::Value = client
        .action("lake_snapshot", serde_json::json!({"path": path}))
        .await
        .unwrap();
    snap["files"].as_u64().unwrap()
}

/// Compaction racing rounds while a log table's buckets move between two nodes every
/// ~1.2 s: a bucket's old and new leader may both run a round of it, each merging the
/// files it read; one commit wins, the other drops its part. The lake ends with every
/// row once and few files. Seeds replay (`MINK_COMPACT_MOVE_SEED=S`,
/// `MINK_COMPACT_MOVE_SEEDS=N`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_follows_log_buckets_that_move_between_nodes() {
    for seed in
        mink_wal::fault::seeds_from_env("MINK_COMPACT_MOVE_SEED", "MINK_COMPACT_MOVE_SEEDS", 1)
    {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("objects");
        let mut nodes = Vec::new();
        for id in ["n0", "n1"] {
            let mut c = config(dir.path(), &shared, id);
            c.lake.check_interval_ms = 20;
            c.lake.compact_files_min = 2;
            nodes.push(Node::start(c).await.unwrap());
        }
        let client = MinkClient::connect(&nodes[0].flight_addr.to_string())
            .await
            .unwrap();
        client.create_database("db").await.unwrap();
        let path = TablePath::parse("db.events").unwrap();
        client.create_table(&path, &lake_events(2)).await.unwrap();
        let mut next = seeded(seed);
        let what = format!("seed {seed}");
        let started = std::time::Instant::now();
        let mut moved_at = started;
        let (mut written, mut moves) = (0i64, 0);
        while started.elapsed() < Duration::from_secs(7) {
            let n = 1 + next(20) as i64;
            client
                .append(&path, &rows(written..written + n))
                .await
                .unwrap();
            written += n;
            if moved_at.elapsed() > Duration::from_millis(1_200) {
                moves += swap_leaders(&client, &path, &[0, 1]).await;
                moved_at = std::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(next(80))).await;
        }
        assert!(moves >= 4, "{what}: {moves} moves");
        let files = log_lake_is_whole(&client, &path, written, &what).await;
        // About seven rounds per bucket: fourteen files without compaction.
        assert!(files <= 8, "{what}: {files} files");
        for node in nodes {
            node.stop().await;
        }
    }
}

/// A node process killed (SIGKILL) three times while rounds tier and compact a log
/// table under a stream of appends, each time restarted on the same address: a round
/// killed after writing its merged file but before its commit leaves a file no
/// snapshot names, and the restarted node (no remembered files) compacts again from
/// the committed snapshot. Every acknowledged row is in the lake once. Seeds replay
/// (`MINK_COMPACT_KILL_SEED=S`, `MINK_COMPACT_KILL_SEEDS=N`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_survives_a_killed_node() {
    let env = [
        ("MINK_LAKE__CHECK_INTERVAL_MS", "20"),
        ("MINK_LAKE__COMPACT_FILES_MIN", "2"),
    ];
    for seed in
        mink_wal::fault::seeds_from_env("MINK_COMPACT_KILL_SEED", "MINK_COMPACT_KILL_SEEDS", 1)
    {
        let dir = tempfile::tempdir().unwrap();
        let (data, store) = (dir.path().join("n0"), dir.path().join("objects"));
        let (mut node, addr) = common::spawn_node(&data, &store, "127.0.0.1:0", &env);
        let client = MinkClient::connect(&addr).await.unwrap();
        client.create_database("db").await.unwrap();
        let path = TablePath::parse("db.events").unwrap();
        client.create_table(&path, &lake_events(2)).await.unwrap();
        let mut next = seeded(seed);
        let what = format!("seed {seed}");
        let mut written = 0i64;
        for kill in 0..3 {
            let until = std::time::Instant::now() + Duration::from_millis(1_500 + next(1_000));
            while std::time::Instant::now() < until {
                let n = 1 + next(20) as i64;
                client
                    .append(&path, &rows(written..written + n))
                    .await
                    .unwrap();
                written += n;
                tokio::time::sleep(Duration::from_millis(next(60))).await;
            }
            let at = (data.as_path(), store.as_path(), addr.as_str());
            node = kill_and_restart(node, at, &env, &format!("{what}: kill {kill}"));
        }
        let files = log_lake_is_whole(&client, &path, written, &what).await;
        assert!(files <= 8, "{what}: {files} files");
        node.kill().unwrap();
        node.wait().unwrap();
    }
}
