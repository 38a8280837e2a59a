//! Writer-state checkpoints: the writer windows and the last commit timestamp as of a
//! log offset, so that opening a tablet reads batch headers from the newest
//! checkpoint instead of from the log start (a bucket with a week of log opens in the
//! time it takes to read what came after its last checkpoint).
//!
//! `ckpt/{stream}/{offset:020}` holds JSON of every durable window entry below
//! `offset`. Entries at offsets below a checkpoint never change (acknowledged data is
//! immutable), so a checkpoint written by any owner stays true for every later one.
//! A checkpoint that cannot be read is ignored (recovery then reads from the start).

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::window::{Entry, Windows};

/// Checkpoints kept per stream.
const KEPT: usize = 2;

/// One durable window entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedEntry {
    pub first_sequence: i64,
    pub last_sequence: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub commit_timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// Every entry below this offset is included; recovery reads from here.
    pub offset: i64,
    pub last_commit_timestamp: i64,
    pub writers: Vec<(i64, Vec<SavedEntry>)>,
}

impl Checkpoint {
    /// The entries of `windows` below `high_watermark`, or below the first pending
    /// entry if one starts lower: every entry below the checkpoint's offset is in it
    /// (an entry durable but not yet marked so would otherwise be missed, and a retry
    /// of its batch written twice). A pending sequence marker's record is at its
    /// `last_offset` (its range is the empty one after it), so that is where it starts.
    pub fn of(windows: &Windows, high_watermark: i64, last_commit_timestamp: i64) -> Self {
        let all = windows.entries();
        let offset = all
            .iter()
            .flat_map(|(_, entries)| entries.iter())
            .filter(|e| e.pending.is_some())
            .map(|e| e.first_offset.min(e.last_offset))
            .chain(std::iter::once(high_watermark))
            .min()
            .unwrap_or(high_watermark);
        let writers = all
            .into_iter()
            .map(|(writer, entries)| {
                let saved = entries
                    .into_iter()
                    .filter(|e| e.pending.is_none() && e.last_offset < offset)
                    .map(|e| SavedEntry {
                        first_sequence: e.first_sequence,
                        last_sequence: e.last_sequence,
                        first_offset: e.first_offset,
                        last_offset: e.last_offset,
                        commit_timestamp: e.commit_timestamp,
                    })
                    .collect::<Vec<_>>();
                (writer, saved)
            })
            .filter(|(_, saved)| !saved.is_empty())
            .collect();
        Self {
            offset,
            last_commit_timestamp,
            writers,
        }
    }

    /// The windows this checkpoint holds.
    pub fn windows(&self) -> Windows {
        let mut windows = Windows::default();
        for (writer, entries) in &self.writers {
            for e in entries {
                windows.push(
                    *writer,
                    Entry {
                        first_sequence: e.first_sequence,
                        last_sequence: e.last_sequence,
                        first_offset: e.first_offset,
                        last_offset: e.last_offset,
                        commit_timestamp: e.commit_timestamp,
                        pending: None,
                    },
                );
            }
        }
        windows
    }
}

fn dir(stream: &str) -> Path {
    Path::from(format!("ckpt/{stream}"))
}

/// Writes `checkpoint` and deletes all but the newest [`KEPT`].
pub(crate) async fn write(
    store: &Arc<dyn ObjectStore>,
    stream: &str,
    checkpoint: &Checkpoint,
) -> object_store::Result<()> {
    let json = serde_json::to_vec(checkpoint).map_err(|e| object_store::Error::Generic {
        store: "checkpoint",
        source: Box::new(e),
    })?;
    let path = dir(stream).join(format!("{:020}", checkpoint.offset));
    store.put(&path, PutPayload::from(json)).await?;
    let mut offsets = list(store, stream).await?;
    offsets.sort_unstable();
    let stale = offsets.len().saturating_sub(KEPT);
    for offset in &offsets[..stale] {
        let path = dir(stream).join(format!("{offset:020}"));
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn list(store: &Arc<dyn ObjectStore>, stream: &str) -> object_store::Result<Vec<i64>> {
    store
        .list(Some(&dir(stream)))
        .try_filter_map(
            |m| async move { Ok(m.location.filename().and_then(|f| f.parse::<i64>().ok())) },
        )
        .try_collect()
        .await
}

/// The newest readable checkpoint at or below `at_most`, if any.
pub(crate) async fn latest(
    store: &Arc<dyn ObjectStore>,
    stream: &str,
    at_most: i64,
) -> Option<Checkpoint> {
    let mut offsets = match list(store, stream).await {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(stream, "listing checkpoints: {e}");
            return None;
        }
    };
    offsets.sort_unstable();
    for offset in offsets.into_iter().rev().filter(|o| *o <= at_most) {
        let path = dir(stream).join(format!("{offset:020}"));
        let read = async {
            let bytes = store.get(&path).await.ok()?.bytes().await.ok()?;
            serde_json::from_slice::<Checkpoint>(&bytes).ok()
        };
        match read.await {
            Some(c) if c.offset == offset => return Some(c),
            _ => tracing::warn!(
                stream,
                offset,
                "an unreadable writer checkpoint; skipping it"
            ),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sequence: i64, (first_offset, last_offset): (i64, i64), pending: bool) -> Entry {
        Entry {
            first_sequence: sequence,
            last_sequence: sequence,
            first_offset,
            last_offset,
            commit_timestamp: 1,
            pending: pending.then(|| Arc::new(tokio::sync::watch::channel(None).0)),
        }
    }

    /// A sequence marker durable in the stream but not yet marked so (its settle task
    /// has not run) holds the checkpoint below its record, as a batch of rows does: a
    /// checkpoint at the high watermark would leave it out, and a recovery from there
    /// would never read its header.
    #[test]
    fn a_pending_marker_holds_the_checkpoint_at_its_record() {
        let mut windows = Windows::default();
        windows.push(7, entry(0, (0, 2), false));
        // The marker at offset 3: answered as the empty range 4..=3.
        windows.push(7, entry(1, (4, 3), true));
        let c = Checkpoint::of(&windows, 4, 1);
        assert_eq!(c.offset, 3, "recovery reads the marker's header");
        assert_eq!(
            c.writers,
            vec![(
                7,
                vec![SavedEntry {
                    first_sequence: 0,
                    last_sequence: 0,
                    first_offset: 0,
                    last_offset: 2,
                    commit_timestamp: 1,
                }]
            )]
        );

        // Marked durable: the checkpoint goes to the high watermark and holds it.
        let mut windows = Windows::default();
        windows.push(7, entry(0, (0, 2), false));
        windows.push(7, entry(1, (4, 3), false));
        let c = Checkpoint::of(&windows, 4, 1);
        assert_eq!(c.offset, 4);
        assert_eq!(c.writers[0].1.len(), 2);
        // Recovered from it, a retry of the marker's sequence is a duplicate.
        assert!(matches!(
            c.windows().check(
                7,
                (1, 1),
                crate::window::Rules {
                    producer: false,
                    start_anywhere: false
                }
            ),
            crate::window::Check::Duplicate(_)
        ));
    }
}
