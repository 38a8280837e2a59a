//! Opening a stream: create, reopen after a clean close, or take over from an owner
//! that did not close it (fence its WAL, recover the stream's records from it).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::meta::{Expected, StreamMeta, WalId};
use super::writer::{wal_dir, wal_path};
use super::{Status, StoreInner, Stream, StreamCommand, StreamInner, StreamState, propose};
use crate::error::{WalError, WalResult};
use crate::format::{Record, WalObject, decode_wal_object};

/// Attempts of the takeover loop before giving up (each retry follows a concurrent
/// change of the stream's metadata).
const TAKEOVER_ATTEMPTS_MAX: u32 = 16;

pub(super) async fn open_stream(
    store: &Arc<StoreInner>,
    name: &str,
    epoch: u64,
) -> WalResult<Stream> {
    if name.is_empty() || name.contains('/') || name.len() > 512 {
        return Err(WalError::Config(format!(
            "stream name {name:?} must be 1 to 512 bytes without '/'"
        )));
    }
    if let Some(e) = store.writer.failure() {
        return Err(e);
    }
    let local = store.lock_streams().get(name).cloned();
    if let Some(local) = local {
        store.meta.catch_up().await?;
        let local_epoch = local.lock().epoch;
        let still_ours = store.meta.read(|s, _| {
            s.streams
                .get(name)
                .is_some_and(|m| m.epoch == local_epoch && m.owner.as_ref() == Some(&store.wal))
        });
        if still_ours {
            return reopen_local(store, local, epoch).await;
        }
        // Taken over since: the local stream is stale. Forget it and open afresh.
        local.lock().status = Status::Failed(WalError::Fenced(format!(
            "stream {name} was taken over after epoch {local_epoch}"
        )));
        store.lock_streams().remove(name);
    }
    for _ in 0..TAKEOVER_ATTEMPTS_MAX {
        store.meta.catch_up().await?;
        let current = store.meta.read(|s, _| s.streams.get(name).cloned());
        if let Some(meta) = &current
            && epoch <= meta.epoch
        {
            return Err(WalError::Fenced(format!(
                "stream {name} was opened under epoch {}; {epoch} is not newer",
                meta.epoch
            )));
        }
        let recovered = match current
            .as_ref()
            .and_then(|m| m.owner.clone().map(|o| (m, o)))
        {
            Some((_, owner)) if owner == store.wal => {
                return Err(WalError::Corrupt(format!(
                    "stream {name} is owned by this WAL writer but not open here"
                )));
            }
            Some((meta, owner)) => recover(store, name, meta, &owner, epoch).await?,
            None => vec![],
        };
        let segment = if recovered.is_empty() {
            None
        } else {
            Some(super::compact::write_segment(store, name, epoch, &recovered).await?)
        };
        let wal_from = store.writer.oldest_unacked.load(Ordering::SeqCst);
        let command = StreamCommand::Open {
            stream: name.to_string(),
            epoch,
            owner: store.wal.clone(),
            wal_from,
            expected: current.as_ref().map(|m| Expected {
                epoch: m.epoch,
                committed_end: m.committed_end,
            }),
            recovered: segment.clone(),
        };
        match propose(store, &command).await? {
            Ok(_) => {
                let meta = store
                    .meta
                    .read(|s, _| s.streams.get(name).cloned())
                    .ok_or_else(|| {
                        WalError::Corrupt(format!("stream {name} vanished after its open"))
                    })?;
                let inner = install(store, name, epoch, &meta);
                if let Some(seg) = &segment {
                    tracing::info!(
                        stream = name,
                        epoch,
                        from = seg.base,
                        to = seg.end,
                        "recovered records from the previous owner's WAL"
                    );
                }
                return Ok(Stream { inner });
            }
            Err(why)
                if why.contains("changed during the takeover") || why.contains("is not newer") =>
            {
                tracing::debug!(stream = name, "takeover raced: {why}");
                if why.contains("is not newer") {
                    return Err(WalError::Fenced(why));
                }
            }
            Err(why) => return Err(WalError::Corrupt(format!("open of {name} rejected: {why}"))),
        }
    }
    Err(WalError::Storage(format!(
        "stream {name}: gave up after {TAKEOVER_ATTEMPTS_MAX} concurrent changes during takeover"
    )))
}

fn install(store: &Arc<StoreInner>, name: &str, epoch: u64, meta: &StreamMeta) -> Arc<StreamInner> {
    let end = meta.committed_end;
    let inner = Arc::new(StreamInner {
        name: name.to_string(),
        state: Mutex::new(StreamState {
            epoch,
            status: Status::Open,
            next_offset: end,
            acked_end: end,
            start_offset: meta.start_offset,
            committed_end: end,
            committed_wal_from: meta.wal_from,
            segments: meta.segments.clone(),
            held: VecDeque::new(),
            held_bytes: 0,
        }),
        acked: tokio::sync::watch::channel(end).0,
        store: store.clone(),
    });
    store.lock_streams().insert(name.to_string(), inner.clone());
    inner
}

/// The stream is open here already: move it to the newer epoch in place.
async fn reopen_local(
    store: &Arc<StoreInner>,
    local: Arc<StreamInner>,
    epoch: u64,
) -> WalResult<Stream> {
    let name = local.name.clone();
    {
        let state = local.lock();
        if let Status::Failed(e) = &state.status {
            return Err(e.clone());
        }
        if epoch <= state.epoch {
            return Err(WalError::Fenced(format!(
                "stream {name} is open under epoch {}; {epoch} is not newer",
                state.epoch
            )));
        }
    }
    store.meta.catch_up().await?;
    let current = store
        .meta
        .read(|s, _| s.streams.get(&name).cloned())
        .ok_or_else(|| {
            WalError::Corrupt(format!(
                "stream {name} is open here but not in the metadata"
            ))
        })?;
    let command = StreamCommand::Open {
        stream: name.clone(),
        epoch,
        owner: store.wal.clone(),
        wal_from: current.wal_from,
        expected: Some(Expected {
            epoch: current.epoch,
            committed_end: current.committed_end,
        }),
        recovered: None,
    };
    match propose(store, &command).await? {
        Ok(_) => {
            let mut state = local.lock();
            state.epoch = epoch;
            if state.status == Status::Closing {
                state.status = Status::Open;
            }
            drop(state);
            Ok(Stream { inner: local })
        }
        Err(why) => Err(WalError::Fenced(format!(
            "reopen of {name} under epoch {epoch}: {why}"
        ))),
    }
}

/// Fences `owner`'s WAL (once; the metadata log records where) and returns the
/// stream's records it holds above the compacted end, checked contiguous.
async fn recover(
    store: &Arc<StoreInner>,
    name: &str,
    meta: &StreamMeta,
    owner: &WalId,
    epoch: u64,
) -> WalResult<Vec<Record>> {
    let fence = fence(store, owner, epoch, name).await?;
    let mut records: Vec<Record> = Vec::new();
    let mut expected = meta.committed_end;
    for seq in meta.wal_from..fence {
        let path = wal_path(owner, seq);
        let bytes = match store.store.get(&path).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(WalError::Corrupt(format!(
                    "WAL object {path} below the fence at {fence} is missing"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        match decode_wal_object(path.as_ref(), &bytes)? {
            WalObject::Fence(_) => break,
            WalObject::Data(objects) => {
                for r in objects.into_iter().filter(|r| r.stream == name) {
                    let record = r.record;
                    if record.end() <= meta.committed_end {
                        continue; // compacted already
                    }
                    if record.base != expected {
                        return Err(WalError::Corrupt(format!(
                            "stream {name}: WAL {owner} holds offset {} where {expected} was expected",
                            record.base
                        )));
                    }
                    expected = record.end();
                    records.push(record);
                }
            }
        }
    }
    Ok(records)
}

/// Where `owner`'s WAL is fenced: the recorded fence, or a new fence object at the
/// first missing sequence at or above the lowest `wal_from` of the streams it owns.
async fn fence(store: &Arc<StoreInner>, owner: &WalId, epoch: u64, stream: &str) -> WalResult<u64> {
    for _ in 0..TAKEOVER_ATTEMPTS_MAX {
        store.meta.catch_up().await?;
        let (recorded, from) = store.meta.read(|s, _| {
            (
                s.fences.get(&owner.to_string()).copied(),
                s.owned_by(owner).map(|(_, m)| m.wal_from).min(),
            )
        });
        if let Some(at) = recorded {
            return Ok(at);
        }
        let from = from.unwrap_or(1).max(1);
        let mut seqs: Vec<u64> = store
            .store
            .list(Some(&wal_dir(owner)))
            .try_filter_map(|m| async move {
                Ok(m.location.filename().and_then(|f| f.parse::<u64>().ok()))
            })
            .try_collect()
            .await?;
        seqs.sort_unstable();
        let mut at = from;
        for seq in seqs.into_iter().filter(|s| *s >= from) {
            if seq != at {
                break;
            }
            at += 1;
        }
        let who = serde_json::json!({"fenced_by": store.wal.to_string(), "stream": stream, "epoch": epoch}).to_string();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match store
            .store
            .put_opts(
                &wal_path(owner, at),
                PutPayload::from(crate::format::encode_fence(&who)),
                opts,
            )
            .await
        {
            Ok(_) => {}
            // The owner (or another fencer) wrote `at` meanwhile: look again.
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            // Ambiguous: our fence may be there. Looking again is safe either way:
            // recovery stops at the first fence object it meets.
            Err(e) => {
                tracing::debug!(%owner, at, "writing a fence failed: {e}");
                continue;
            }
        }
        metrics::counter!("mink_wal_fences_written_total").increment(1);
        tracing::info!(%owner, at, stream, "fenced a WAL");
        match propose(
            store,
            &StreamCommand::Fence {
                wal: owner.clone(),
                at,
            },
        )
        .await?
        {
            Ok(_) => return Ok(at),
            Err(_) => continue, // someone recorded a fence first; use theirs
        }
    }
    Err(WalError::Storage(format!("could not fence WAL {owner}")))
}
