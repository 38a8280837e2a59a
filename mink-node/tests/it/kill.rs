//! A `mink-node` process killed with SIGKILL in the middle of a stream of idempotent
//! writes, then restarted on the same address: the Rust client's in-flight write is
//! retried with its sequence, and afterwards every acknowledged row is there, once.

use std::sync::Arc;
use std::time::Duration;

use mink_flight::MinkClient;
use mink_types::{ChangeType, TableDescriptor, TablePath};

use crate::common;
use common::{ids, rows, spawn_node};

fn events() -> TableDescriptor {
    common::events_in(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_acknowledged_row_and_duplicates_none() {
    let dir = tempfile::tempdir().unwrap();
    let (data, store) = (dir.path().join("n0"), dir.path().join("objects"));
    let (mut node, addr) = spawn_node(&data, &store, "127.0.0.1:0", &[]);
    let client = Arc::new(MinkClient::connect(&addr).await.unwrap());
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.events").unwrap();
    client.create_table(&path, &events()).await.unwrap();

    // A writer appends 50-row batches until told to stop; each call returns only once
    // every bucket's part is acknowledged (retrying across the kill).
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let (acked_tx, mut acked_rx) = tokio::sync::watch::channel(0i64);
    let writer = {
        let (client, path) = (client.clone(), path.clone());
        tokio::spawn(async move {
            let mut next = 0i64;
            while !*stop_rx.borrow_and_update() {
                client.append(&path, &rows(next..next + 50)).await?;
                next += 50;
                let _ = acked_tx.send(next);
            }
            Ok::<i64, mink_types::MinkError>(next)
        })
    };
    // Let some batches land, then kill the node while the writer is mid-stream.
    while *acked_rx.borrow_and_update() < 500 {
        acked_rx.changed().await.unwrap();
    }
    node.kill().unwrap();
    node.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut node, again) = spawn_node(&data, &store, &addr, &[]);
    assert_eq!(again, addr);
    // Some more acknowledged batches after the restart, then stop.
    let restarted_at = *acked_rx.borrow();
    while *acked_rx.borrow_and_update() < restarted_at + 500 {
        acked_rx.changed().await.unwrap();
    }
    stop_tx.send(true).unwrap();
    let written = writer.await.unwrap().expect("every append is acknowledged");

    let ids = ids(&client.scan_table(&path).await.unwrap());
    assert_eq!(ids.len() as i64, written, "no row duplicated by a retry");
    assert_eq!(
        ids,
        (0..written).collect::<Vec<_>>(),
        "every acknowledged row"
    );
    node.kill().unwrap();
    node.wait().unwrap();
}

/// A Put that changed nothing (a delete of an absent key) in every one of four
/// buckets, then the node is killed. The client's next Put is sent while the node is
/// down (a refused connection, which may have recorded it as far as the client can
/// tell) and retried at the restarted node; it must land, once, in every bucket. The
/// no-op Puts are in the log as sequence markers, so the restarted node's windows end
/// at the acknowledged sequences and the retry is taken as the next batch. (Before
/// markers, the windows ended one sequence early and the retry was refused as out of
/// order; the client then sent it again under a new writer, bucket by bucket: the
/// rule in docs/protocol.md, which this test pinned first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_after_a_restart_following_a_no_op_put_lands_once() {
    let dir = tempfile::tempdir().unwrap();
    let (data, store) = (dir.path().join("n0"), dir.path().join("objects"));
    let (mut node, addr) = spawn_node(&data, &store, "127.0.0.1:0", &[]);
    let client = Arc::new(MinkClient::connect(&addr).await.unwrap());
    client.create_database("db").await.unwrap();
    let path = TablePath::parse("db.users").unwrap();
    let mut d = common::events_in(4);
    d.primary_key = vec!["id".into()];
    client.create_table(&path, &d).await.unwrap();

    client.put(&path, &rows(0..12), None, None).await.unwrap();
    let deleted = client
        .put(
            &path,
            &rows(100..112),
            Some(vec![ChangeType::Delete; 12]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(deleted.len(), 4, "every bucket has a delete: {deleted:?}");
    for d in &deleted {
        assert_eq!(
            d.last_offset,
            d.first_offset - 1,
            "the delete of absent keys changed nothing: {deleted:?}"
        );
    }
    node.kill().unwrap();
    node.wait().unwrap();
    let put = {
        let (client, path) = (client.clone(), path.clone());
        tokio::spawn(async move { client.put(&path, &rows(12..24), None, None).await })
    };
    // Let its first attempts meet the closed port.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut node, again) = spawn_node(&data, &store, &addr, &[]);
    assert_eq!(again, addr);
    let written = put
        .await
        .unwrap()
        .expect("the Put after the restart is written");
    assert_eq!(written.len(), 4, "{written:?}");
    assert!(written.iter().all(|w| !w.duplicated), "{written:?}");
    client.put(&path, &rows(24..30), None, None).await.unwrap();
    let state = client
        .lookup(&path, (0..40).map(|i| vec![serde_json::json!(i)]).collect())
        .await
        .unwrap();
    assert_eq!(ids(&state), (0..30).collect::<Vec<_>>());
    node.kill().unwrap();
    node.wait().unwrap();
}
