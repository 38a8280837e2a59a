//! One suite, both backends.

use mink_kv::{KvBackend, KvOp, open_kv_store};

fn ops(pairs: &[(&[u8], &[u8])]) -> Vec<KvOp> {
    pairs
        .iter()
        .map(|(k, v)| KvOp::Put(k.to_vec(), v.to_vec()))
        .collect()
}

fn suite(backend: KvBackend) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_kv_store(backend, dir.path()).unwrap();
    let a = store.namespace("t1-b0").unwrap();
    let b = store.namespace("t1-b1").unwrap();
    assert_eq!(a.flushed_offset().unwrap(), None);

    a.write(
        &ops(&[
            (b"k1", b"v1"),
            (b"k2", b"v2"),
            (b"k3\x00", b"v3"),
            (b"l", b"x"),
        ]),
        4,
    )
    .unwrap();
    b.write(&ops(&[(b"k1", b"other")]), 1).unwrap();
    assert_eq!(a.flushed_offset().unwrap(), Some(4));
    assert_eq!(b.flushed_offset().unwrap(), Some(1));
    assert_eq!(a.get(b"k1").unwrap(), Some(b"v1".to_vec()));
    assert_eq!(
        b.get(b"k1").unwrap(),
        Some(b"other".to_vec()),
        "namespaces are separate"
    );
    assert_eq!(a.get(b"zz").unwrap(), None);
    assert_eq!(
        a.multi_get(&[b"k2".to_vec(), b"nope".to_vec()]).unwrap(),
        vec![Some(b"v2".to_vec()), None]
    );

    // Ordered prefix and range scans.
    let keys =
        |pairs: Vec<(Vec<u8>, Vec<u8>)>| pairs.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(
        keys(a.prefix(b"k", 10).unwrap()),
        vec![b"k1".to_vec(), b"k2".to_vec(), b"k3\x00".to_vec()]
    );
    assert_eq!(keys(a.prefix(b"k", 2).unwrap()).len(), 2);
    assert_eq!(
        keys(a.range(b"k2", Some(b"l"), 10).unwrap()),
        vec![b"k2".to_vec(), b"k3\x00".to_vec()]
    );
    assert_eq!(
        keys(a.range(b"k3", None, 10).unwrap()),
        vec![b"k3\x00".to_vec(), b"l".to_vec()]
    );

    // A consistent snapshot does not see later writes.
    let snapshot = a.snapshot().unwrap();
    a.write(
        &[
            KvOp::Delete(b"k1".to_vec()),
            KvOp::Put(b"k9".to_vec(), b"v9".to_vec()),
        ],
        6,
    )
    .unwrap();
    let seen: Vec<Vec<u8>> = snapshot.map(|r| r.unwrap().0).collect();
    assert_eq!(
        seen,
        vec![
            b"k1".to_vec(),
            b"k2".to_vec(),
            b"k3\x00".to_vec(),
            b"l".to_vec()
        ]
    );
    assert_eq!(a.get(b"k1").unwrap(), None);
    assert_eq!(a.flushed_offset().unwrap(), Some(6));

    // Reopening finds the data (no fsync needed while the process lives on).
    drop((a, b));
    drop(store);
    let store = open_kv_store(backend, dir.path()).unwrap();
    let a = store.namespace("t1-b0").unwrap();
    assert_eq!(a.get(b"k9").unwrap(), Some(b"v9".to_vec()));
    assert_eq!(a.flushed_offset().unwrap(), Some(6));

    a.clear().unwrap();
    assert_eq!(a.get(b"k9").unwrap(), None);
    assert_eq!(a.flushed_offset().unwrap(), None);
    store.drop_namespace("t1-b1").unwrap();
    let b = store.namespace("t1-b1").unwrap();
    assert_eq!(b.get(b"k1").unwrap(), None);
    assert!(store.namespace("bad/name").is_err());
}

#[test]
fn fjall_passes_the_suite() {
    suite(KvBackend::Fjall);
}

#[test]
fn redb_passes_the_suite() {
    suite(KvBackend::Redb);
}
