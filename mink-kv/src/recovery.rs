//! Where a KV tablet's recovery starts: a pure decision over the local store's flushed
//! offset, the log's range and the snapshots on object storage.
//!
//! The changelog is the only copy of every row that no durable snapshot holds, so a
//! tablet whose log no longer starts at 0 can be rebuilt only from a snapshot at or
//! above the log start. The log tablet enforces the other half: a primary-key table's
//! log is never trimmed above its newest durable snapshot
//! ([`mink_log::LogTablet::allow_trim_to`]). When neither the store nor a snapshot
//! covers the rows below the log start, recovery fails loudly instead of opening a
//! bucket that silently lacks them.

use mink_types::{MinkError, Result, TableBucket};

/// Where replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecoveryStart {
    /// The local store is consistent at this offset, inside the log: replay from it.
    Store(i64),
    /// Clear the store, load the snapshot at this offset and replay from it.
    Snapshot(i64),
    /// Clear the store and replay the whole log (it starts at 0).
    LogStart,
}

/// Decides where recovery starts. `flushed` is the store's flushed offset (`None`: an
/// empty store; negative: a snapshot load that did not finish), `[log_start, hw)` the
/// log, `snapshots` the offsets of the snapshots on object storage.
pub(crate) fn plan(
    bucket: TableBucket,
    flushed: Option<i64>,
    log_start: i64,
    hw: i64,
    snapshots: &[i64],
) -> Result<RecoveryStart> {
    if let Some(f) = flushed
        && f >= 0
        && f >= log_start
        && f <= hw
    {
        return Ok(RecoveryStart::Store(f));
    }
    // The store is empty, half-loaded, behind the log start or ahead of the log (it
    // belongs to another history): it is rebuilt.
    if let Some(&s) = snapshots
        .iter()
        .filter(|&&s| s >= log_start && s <= hw)
        .max()
    {
        return Ok(RecoveryStart::Snapshot(s));
    }
    if log_start == 0 {
        return Ok(RecoveryStart::LogStart);
    }
    Err(MinkError::Internal(format!(
        "{bucket}: the changelog starts at offset {log_start} and no KV snapshot covers the \
         rows below it (snapshots at {snapshots:?}, the log holds [{log_start}, {hw}), the \
         local store is at {flushed:?}); the bucket's state cannot be rebuilt, and it is not \
         opened without those rows"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: TableBucket = TableBucket {
        table_id: 1,
        partition_id: None,
        bucket: 0,
    };

    #[test]
    fn a_store_inside_the_log_replays_from_where_it_is() {
        assert_eq!(
            plan(B, Some(40), 10, 50, &[30]).unwrap(),
            RecoveryStart::Store(40)
        );
        // Behind a newer snapshot but inside the log: replay is enough.
        assert_eq!(
            plan(B, Some(12), 10, 50, &[30]).unwrap(),
            RecoveryStart::Store(12)
        );
        assert_eq!(
            plan(B, Some(50), 0, 50, &[]).unwrap(),
            RecoveryStart::Store(50)
        );
    }

    #[test]
    fn an_empty_store_starts_from_the_newest_snapshot_inside_the_log() {
        assert_eq!(
            plan(B, None, 10, 50, &[5, 20, 30, 60]).unwrap(),
            RecoveryStart::Snapshot(30)
        );
        assert_eq!(
            plan(B, None, 0, 50, &[20]).unwrap(),
            RecoveryStart::Snapshot(20)
        );
        // A half-loaded snapshot or a store behind the log start is rebuilt too.
        assert_eq!(
            plan(B, Some(-1), 10, 50, &[10]).unwrap(),
            RecoveryStart::Snapshot(10)
        );
        assert_eq!(
            plan(B, Some(5), 10, 50, &[40]).unwrap(),
            RecoveryStart::Snapshot(40)
        );
        // A store ahead of the log belongs to another history.
        assert_eq!(
            plan(B, Some(70), 0, 50, &[]).unwrap(),
            RecoveryStart::LogStart
        );
    }

    #[test]
    fn a_log_from_zero_needs_no_snapshot() {
        assert_eq!(plan(B, None, 0, 50, &[]).unwrap(), RecoveryStart::LogStart);
        assert_eq!(
            plan(B, Some(-1), 0, 0, &[]).unwrap(),
            RecoveryStart::LogStart
        );
    }

    #[test]
    fn a_trimmed_log_without_a_covering_snapshot_fails_loudly() {
        for (flushed, snapshots) in [
            (None, vec![]),
            (None, vec![3, 7]), // every snapshot below the log start
            (Some(4), vec![]),
            (Some(-1), vec![60]), // above the high watermark
        ] {
            let err = plan(B, flushed, 10, 50, &snapshots).unwrap_err();
            assert!(
                matches!(&err, MinkError::Internal(m) if m.contains("no KV snapshot covers")),
                "{flushed:?} {snapshots:?}: {err}"
            );
        }
    }
}
