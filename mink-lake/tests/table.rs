//! A lake table on an object store: rounds commit, race, survive ambiguous answers,
//! and read back exactly what was tiered.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_lake::{
    LakeRetention, LakeTable, TieredBucket, from_lake_batch, lake_arrow_schema, partition_value,
    to_lake_batch,
};
use mink_types::{Column, DataType, Schema, TablePath};
use mink_wal::fault::{FaultConfig, FaultyStore};
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};

fn schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("name", DataType::String, true),
        ],
    )
}

fn rows(schema: &Schema, ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_new(
        schema.to_arrow(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("n{i}")))),
        ],
    )
    .unwrap()
}

/// Tiers rows `[from, to)` of bucket `bucket` into one file; the round's record.
async fn tier(
    table: &LakeTable,
    schema: &Schema,
    bucket: u32,
    from: Option<i64>,
    to: i64,
) -> TieredBucket {
    let start = from.unwrap_or(0);
    let lake = lake_arrow_schema(schema);
    let batch =
        to_lake_batch(schema, &lake, &rows(schema, start..to), bucket, start, 1000).unwrap();
    let stream = format!("t1-b{bucket}");
    let partition = partition_value(schema, &[], None, &batch).unwrap();
    let file = table
        .write_data_file(&stream, start, &[batch], partition)
        .await
        .unwrap();
    TieredBucket {
        stream,
        from,
        to,
        files: vec![file],
        replaces: vec![],
        compacted: Vec::new(),
        compacted_from: Vec::new(),
    }
}

async fn all_ids(table: &LakeTable, schema: &Schema) -> Vec<i64> {
    let version = table.load(None).await.unwrap().unwrap();
    let mut ids = Vec::new();
    for f in table.files(&version, None).await.unwrap() {
        for b in table.read_file(&f).await.unwrap() {
            let rows = from_lake_batch(schema, &b).unwrap();
            let col = rows
                .batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone();
            // The id column was written equal to the offset.
            assert_eq!(col.values(), rows.offsets.values());
            ids.extend(col.values().iter());
        }
    }
    ids.sort();
    ids
}

fn path() -> TablePath {
    TablePath::parse("db.t").unwrap()
}

#[tokio::test]
async fn rounds_commit_and_read_back() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let table = LakeTable::new(store.clone(), "memory://", &path());
    let s = schema();
    assert!(table.load(None).await.unwrap().is_none());
    let b0 = tier(&table, &s, 0, None, 10).await;
    let c = table
        .commit(1, &s, &[], None, vec![b0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        c.version, 2,
        "v1 creates the table, v2 holds the first snapshot"
    );
    assert_eq!(c.offsets, BTreeMap::from([("t1-b0".to_string(), 10)]));
    let b0 = tier(&table, &s, 0, Some(10), 25).await;
    let c = table
        .commit(1, &s, &[], Some(c.version), vec![b0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.offsets["t1-b0"], 25);
    assert_eq!(all_ids(&table, &s).await, (0..25).collect::<Vec<_>>());
    let v = table.load(None).await.unwrap().unwrap();
    assert_eq!(v.snapshot_id(), Some(c.snapshot_id));
    assert_eq!(v.offsets(None).unwrap()["t1-b0"], 25);
    // The first snapshot is still readable as it was.
    let first = v
        .metadata
        .snapshots()
        .map(|s| s.snapshot_id())
        .find(|id| *id != c.snapshot_id)
        .unwrap();
    let files = table.files(&v, Some(first)).await.unwrap();
    assert_eq!(files.iter().map(|f| f.record_count).sum::<u64>(), 10);
}

#[tokio::test]
async fn a_schema_change_reads_old_files_with_nulls() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let table = LakeTable::new(store, "memory://", &path());
    let s1 = schema();
    let b = tier(&table, &s1, 0, None, 5).await;
    table
        .commit(1, &s1, &[], None, vec![b])
        .await
        .unwrap()
        .unwrap();
    let mut s2 = s1
        .with_added_columns(&[Column::new("extra", DataType::Int, true)])
        .unwrap();
    s2.schema_id = 2;
    let lake = lake_arrow_schema(&s2);
    let mut batch = rows(&s1, 5..8);
    batch = RecordBatch::try_new(
        s2.to_arrow(),
        vec![
            batch.column(0).clone(),
            batch.column(1).clone(),
            Arc::new(arrow::array::Int32Array::from(vec![1, 2, 3])),
        ],
    )
    .unwrap();
    let l = to_lake_batch(&s2, &lake, &batch, 0, 5, 0).unwrap();
    let f = table
        .write_data_file("t1-b0", 5, &[l], iceberg::spec::Struct::empty())
        .await
        .unwrap();
    let c = table
        .commit(
            1,
            &s2,
            &[],
            None,
            vec![TieredBucket {
                stream: "t1-b0".into(),
                from: Some(5),
                to: 8,
                files: vec![f],
                replaces: vec![],
                compacted: Vec::new(),
                compacted_from: Vec::new(),
            }],
        )
        .await
        .unwrap()
        .unwrap();
    let v = table.load(Some(c.version)).await.unwrap().unwrap();
    assert_eq!(
        v.metadata.current_schema().as_struct().fields().len(),
        3 + 3
    );
    let mut nulls = 0;
    for f in table.files(&v, None).await.unwrap() {
        for b in table.read_file(&f).await.unwrap() {
            nulls += from_lake_batch(&s2, &b)
                .unwrap()
                .batch
                .column(2)
                .null_count();
        }
    }
    assert_eq!(nulls, 5);
}

#[tokio::test]
async fn racing_writers_never_tier_a_bucket_twice() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let s = schema();
    let a = LakeTable::new(store.clone(), "memory://", &path());
    let b = LakeTable::new(store.clone(), "memory://", &path());
    // Two writers believe they lead bucket 0 (an old and a new leader) and both tier it
    // from the same offset; a third tiers bucket 1.
    let (ra, rb, rc) = tokio::join!(
        async {
            let t = tier(&a, &s, 0, None, 10).await;
            a.commit(1, &s, &[], None, vec![t]).await.unwrap()
        },
        async {
            let t = tier(&b, &s, 0, None, 12).await;
            b.commit(1, &s, &[], None, vec![t]).await.unwrap()
        },
        async {
            let t = tier(&b, &s, 1, None, 3).await;
            b.commit(1, &s, &[], None, vec![t]).await.unwrap()
        },
    );
    let won: Vec<_> = [&ra, &rb].into_iter().flatten().collect();
    assert_eq!(
        won.len(),
        1,
        "exactly one of the two rounds of bucket 0 commits"
    );
    assert!(rc.is_some());
    let v = a.load(None).await.unwrap().unwrap();
    let offsets = v.offsets(None).unwrap();
    let rows0 = offsets["t1-b0"];
    assert!(rows0 == 10 || rows0 == 12);
    assert_eq!(offsets["t1-b1"], 3);
    let total: u64 = a
        .files(&v, None)
        .await
        .unwrap()
        .iter()
        .map(|f| f.record_count)
        .sum();
    assert_eq!(total as i64, rows0 + 3, "no duplicate and no gap");
    // The loser's data file was deleted.
    let data: Vec<_> =
        futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&"lake/db/t/data".into())))
            .await
            .unwrap();
    assert_eq!(data.len(), 2);
}

#[tokio::test]
async fn a_commit_whose_answer_was_lost_is_recognised() {
    for fault in ["time_out", "conflict_after_apply"] {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faulty = FaultyStore::new(inner, FaultConfig::default());
        let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
        let table = LakeTable::new(store, "memory://", &path());
        let s = schema();
        let first = tier(&table, &s, 0, None, 4).await;
        let c = table
            .commit(1, &s, &[], None, vec![first])
            .await
            .unwrap()
            .unwrap();
        let next = tier(&table, &s, 0, Some(4), 9).await;
        // Only metadata versions are targeted: the next create of one lands, and its
        // answer is lost (a timeout) or is the AlreadyExists of a retry meeting it.
        faulty.set_config(FaultConfig {
            fault_prefix: Some("lake/db/t/metadata/v".into()),
            ..FaultConfig::default()
        });
        match fault {
            "time_out" => faulty.time_out_next_puts(1),
            _ => faulty.conflict_after_apply_next_puts(1),
        }
        let c2 = table
            .commit(1, &s, &[], Some(c.version), vec![next])
            .await
            .unwrap()
            .unwrap();
        faulty.set_config(FaultConfig::default());
        assert_eq!(
            c2.version,
            c.version + 1,
            "{fault}: the landed create is ours"
        );
        assert_eq!(
            all_ids(&table, &s).await,
            (0..9).collect::<Vec<_>>(),
            "{fault}"
        );
    }
}

#[tokio::test]
async fn the_orphan_sweep_deletes_only_what_nothing_needs() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let table = LakeTable::new(store.clone(), "memory://", &path());
    let s = schema();
    let mut version = None;
    let mut to = 0;
    // Enough rounds to merge manifests (32) and leave some behind.
    for round in 0..40 {
        let b = tier(&table, &s, 0, (round > 0).then_some(to), to + 3).await;
        to += 3;
        version = Some(
            table
                .commit(1, &s, &[], version, vec![b])
                .await
                .unwrap()
                .unwrap()
                .version,
        );
    }
    // A round that died after writing its file, before committing.
    let orphan = tier(&table, &s, 1, None, 5).await;
    let count = |store: Arc<dyn ObjectStore>| async move {
        futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&"lake/db/t".into())))
            .await
            .unwrap()
            .len()
    };
    let before = count(store.clone()).await;
    // Young objects are kept whatever they are.
    let kept = table
        .sweep_orphans(std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(kept.deleted, 0);
    let swept = table
        .sweep_orphans(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(swept.deleted >= 1, "{swept:?}");
    assert_eq!(
        count(store.clone()).await as u64,
        before as u64 - swept.deleted
    );
    assert!(
        store
            .head(&table.path_of(orphan.files[0].file_path()).unwrap())
            .await
            .is_err(),
        "the uncommitted file is gone"
    );
    // Every snapshot still reads, and the newest holds every row once.
    assert_eq!(all_ids(&table, &s).await, (0..to).collect::<Vec<_>>());
    let v = table.load(None).await.unwrap().unwrap();
    for snap in v.metadata.snapshots() {
        for f in table.files(&v, Some(snap.snapshot_id())).await.unwrap() {
            table.read_file(&f).await.unwrap();
        }
    }
    // The merge kept the manifest list short.
    let list = v
        .metadata
        .current_snapshot()
        .unwrap()
        .manifest_list()
        .to_string();
    let bytes = store
        .get(&table.path_of(&list).unwrap())
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let parsed =
        iceberg::spec::ManifestList::parse_with_version(&bytes, iceberg::spec::FormatVersion::V2)
            .unwrap();
    assert!(parsed.entries().len() <= mink_lake::table::MANIFESTS_MAX);
}

/// Position delete files: committed beside data files in their own manifests, listed
/// by `contents`, read back by `read_deletes`; kept apart through manifest merges (more
/// rounds than `MANIFESTS_MAX`); and removed with the data files a rewrite replaces.
#[tokio::test]
async fn position_deletes_commit_merge_and_go_with_a_rewrite() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let table = LakeTable::new(store, "memory://", &path());
    let s = schema();
    let first = tier(&table, &s, 0, None, 100).await;
    let data_location = first.files[0].file_path().to_string();
    let mut hint = table
        .commit(1, &s, &[], None, vec![first])
        .await
        .unwrap()
        .map(|c| c.version);
    // Each round deletes one more row of the first file and adds one row.
    let rounds = mink_lake::table::MANIFESTS_MAX as i64 + 4;
    for r in 0..rounds {
        let from = 100 + r;
        let mut delta = tier(&table, &s, 0, Some(from), from + 1).await;
        let positions = BTreeMap::from([(data_location.clone(), vec![r as u64])]);
        let deletes = table
            .write_position_deletes(&delta.stream, from, &positions, iceberg_empty())
            .await
            .unwrap();
        delta.files.push(deletes);
        hint = table
            .commit(1, &s, &[], hint, vec![delta])
            .await
            .unwrap()
            .map(|c| c.version);
    }
    let version = table.load(hint).await.unwrap().unwrap();
    let contents = table.contents(&version, None).await.unwrap();
    assert_eq!(contents.data.len() as i64, 1 + rounds);
    assert_eq!(contents.deletes.len() as i64, rounds);
    let deleted = table.read_deletes(&contents.deletes).await.unwrap();
    assert_eq!(
        deleted[&data_location],
        (0..rounds as u64).collect::<Vec<_>>()
    );
    let summary = &version
        .metadata
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties;
    assert_eq!(summary["total-delete-files"], rounds.to_string());
    assert_eq!(summary["total-position-deletes"], rounds.to_string());
    // A rewrite replaces every file, deletes included.
    let mut rewrite = tier(&table, &s, 0, Some(100 + rounds), 101 + rounds).await;
    rewrite.replaces = contents.locations();
    let c = table
        .commit(1, &s, &[], hint, vec![rewrite])
        .await
        .unwrap()
        .unwrap();
    let version = table.load(Some(c.version)).await.unwrap().unwrap();
    let contents = table.contents(&version, None).await.unwrap();
    assert_eq!(contents.data.len(), 1);
    assert!(contents.deletes.is_empty());
    let summary = &version
        .metadata
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties;
    assert_eq!(summary["total-delete-files"], "0");
    assert_eq!(summary["total-position-deletes"], "0");
    assert_eq!(summary["total-data-files"], "1");
}

fn iceberg_empty() -> iceberg::spec::Struct {
    iceberg::spec::Struct::empty()
}

#[tokio::test]
async fn commits_expire_snapshots_past_the_retention_and_their_manifest_lists_go() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // Every snapshot older than 300 ms goes, but the newest two stay.
    let table = LakeTable::new(store.clone(), "memory://", &path()).with_retention(LakeRetention {
        max_age_ms: 300,
        min: 2,
        max: 1000,
    });
    let s = schema();
    let mut hint = None;
    let mut to = 0;
    let commit = async |table: &LakeTable, hint: &mut Option<u64>, to: &mut i64| {
        let from = (*to > 0).then_some(*to);
        *to += 10;
        let b = tier(table, &s, 0, from, *to).await;
        let c = table
            .commit(1, &s, &[], *hint, vec![b])
            .await
            .unwrap()
            .unwrap();
        *hint = Some(c.version);
        c
    };
    let mut lists = Vec::new();
    for _ in 0..3 {
        commit(&table, &mut hint, &mut to).await;
        let v = table.load(hint).await.unwrap().unwrap();
        lists.push(
            v.metadata
                .current_snapshot()
                .unwrap()
                .manifest_list()
                .to_string(),
        );
    }
    let v = table.load(hint).await.unwrap().unwrap();
    assert_eq!(v.metadata.snapshots().count(), 3, "all young");
    let oldest = v
        .metadata
        .snapshots()
        .map(|s| s.snapshot_id())
        .min_by_key(|id| v.metadata.snapshot_by_id(*id).unwrap().sequence_number());
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    commit(&table, &mut hint, &mut to).await;
    let v = table.load(hint).await.unwrap().unwrap();
    // The three are past the age; the newest of them stays with the new one.
    assert_eq!(v.metadata.snapshots().count(), 2);
    assert!(v.metadata.snapshot_by_id(oldest.unwrap()).is_none());
    for expired in &lists[..2] {
        let path = table.path_of(expired).unwrap();
        assert!(
            matches!(
                store.head(&path).await,
                Err(object_store::Error::NotFound { .. })
            ),
            "an expired snapshot's manifest list is deleted: {expired}"
        );
    }
    // The one kept still reads as it was (time travel), the current one in full.
    let kept = v
        .metadata
        .snapshots()
        .map(|s| s.snapshot_id())
        .find(|id| Some(*id) != v.snapshot_id())
        .unwrap();
    let files = table.files(&v, Some(kept)).await.unwrap();
    assert_eq!(files.iter().map(|f| f.record_count).sum::<u64>(), 30);
    assert_eq!(all_ids(&table, &s).await, (0..40).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_round_that_replaces_files_no_longer_in_the_table_commits_nothing() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let table = LakeTable::new(store.clone(), "memory://", &path());
    let s = schema();
    let b = tier(&table, &s, 0, None, 10).await;
    let first = b.files[0].file_path().to_string();
    let c = table
        .commit(1, &s, &[], None, vec![b])
        .await
        .unwrap()
        .unwrap();
    // A round that replaces the first file (as a compaction would), committed.
    let mut merged = tier(&table, &s, 0, Some(10), 20).await;
    merged.replaces = vec![first.clone()];
    let c = table
        .commit(1, &s, &[], Some(c.version), vec![merged])
        .await
        .unwrap()
        .unwrap();
    // A second round that read the table before, and replaces the first file again.
    let mut stale = tier(&table, &s, 0, Some(20), 30).await;
    stale.replaces = vec![first];
    let e = table
        .commit(1, &s, &[], Some(c.version), vec![stale])
        .await
        .unwrap_err();
    assert!(matches!(e, mink_types::MinkError::Unavailable(_)), "{e}");
    let v = table.load(None).await.unwrap().unwrap();
    assert_eq!(v.version, c.version, "nothing committed");
    assert_eq!(all_ids(&table, &s).await, (10..20).collect::<Vec<_>>());
}
