//! One suite, both backends.

mod failing_store;

use failing_store::SmallDisk;
use mink_kv::{KvBackend, KvOp, open_kv_store};
use mink_types::MinkError;

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

/// fjall poisons its database for good after a failed journal write (here a real
/// full disk). The store closes that generation: every namespace handed out answers
/// `Fenced`, reads too, and keeps answering so; the next `namespace` reopens the
/// database in place, with the pairs written before the failure, once the old one's
/// last handle is gone (an iterator over it holds it). Each name keeps its `Owner`
/// across the reopen, so the epoch order of its tablets holds.
#[test]
fn fjall_closes_a_poisoned_database_and_reopens_it_in_place() {
    let Some(disk) = SmallDisk::mount(8 << 20) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs CAP_SYS_ADMIN)");
        return;
    };
    let store = open_kv_store(KvBackend::Fjall, &disk.path().join("kv")).unwrap();
    let a = store.namespace("a").unwrap();
    let b = store.namespace("b").unwrap();
    a.owner().claim(5).unwrap();
    a.write(&ops(&[(b"before", b"1")]), 1).unwrap();
    b.write(&ops(&[(b"other", b"2")]), 1).unwrap();
    let filler = disk.fill();
    let value = vec![7u8; 4096];
    let mut offset = 2;
    let fenced = loop {
        match a.write(
            &[KvOp::Put(format!("k{offset}").into_bytes(), value.clone())],
            offset,
        ) {
            Ok(()) => {}
            Err(e @ MinkError::Fenced(_)) => break e,
            Err(e) => assert!(e.to_string().contains("No space left"), "{e}"),
        }
        offset += 1;
        assert!(offset < 10_000, "the full disk never poisoned fjall");
    };
    assert!(fenced.to_string().contains("poisoned"), "{fenced}");
    // Closed: both namespaces, reads as well as writes.
    for ns in [&a, &b] {
        assert!(matches!(ns.get(b"before"), Err(MinkError::Fenced(_))));
        assert!(matches!(ns.flushed_offset(), Err(MinkError::Fenced(_))));
        assert!(matches!(ns.write(&[], 9), Err(MinkError::Fenced(_))));
    }
    std::fs::remove_file(filler).unwrap();
    let reopened = store.namespace("a").unwrap();
    assert_eq!(reopened.get(b"before").unwrap(), Some(b"1".to_vec()));
    // The old handles stay closed; the name's owner kept its epoch.
    assert!(matches!(a.get(b"before"), Err(MinkError::Fenced(_))));
    assert!(matches!(
        reopened.owner().claim(4),
        Err(MinkError::Fenced(_))
    ));
    reopened.owner().claim(6).unwrap();
    reopened.write(&ops(&[(b"after", b"3")]), offset).unwrap();
    assert_eq!(reopened.flushed_offset().unwrap(), Some(offset));
    let b2 = store.namespace("b").unwrap();
    assert_eq!(b2.get(b"other").unwrap(), Some(b"2".to_vec()));
    drop((a, b));

    // An iterator over the database holds it: no reopen under it until it is gone.
    let iter = reopened.snapshot().unwrap();
    let filler = disk.fill();
    let mut offset = offset + 1;
    loop {
        match reopened.write(
            &[KvOp::Put(format!("k{offset}").into_bytes(), value.clone())],
            offset,
        ) {
            Err(MinkError::Fenced(_)) => break,
            _ => offset += 1,
        }
        assert!(offset < 20_000, "the full disk never poisoned fjall");
    }
    std::fs::remove_file(filler).unwrap();
    let refused = store
        .namespace("a")
        .err()
        .expect("reopened under a live iterator");
    assert!(matches!(refused, MinkError::Unavailable(_)), "{refused}");
    drop(iter);
    drop((reopened, b2));
    // The last try failed less than a second ago.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let again = store.namespace("a").unwrap();
    assert_eq!(again.get(b"after").unwrap(), Some(b"3".to_vec()));
}
