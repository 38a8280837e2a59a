//! The stream-metadata log's state machine: which streams exist, under which epoch and
//! owner, which segments hold their compacted data, and from which WAL sequence
//! number their uncompacted data may be found.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::objectlog::LogState;

/// One incarnation of one node's WAL writer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WalId {
    pub node: String,
    pub generation: u64,
}

impl fmt::Display for WalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.node, self.generation)
    }
}

/// One committed segment object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMeta {
    pub key: String,
    pub base: u64,
    pub end: u64,
    pub bytes: u64,
    pub min_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
}

/// A stream as the metadata log knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    /// The epoch of the last open.
    pub epoch: u64,
    /// The WAL writer that holds the stream open, or `None` after a clean close.
    pub owner: Option<WalId>,
    /// The first readable offset.
    pub start_offset: u64,
    /// Compacted data, contiguous, in order.
    pub segments: Vec<SegmentMeta>,
    /// The end of compacted data: records at or above it live in the owner's WAL.
    pub committed_end: u64,
    /// The owner's WAL holds no record of this stream below this sequence number that
    /// is not in a segment.
    pub wal_from: u64,
}

/// What the view of a stream looked like when a takeover began; an `Open` is rejected
/// if it changed since (the old owner compacted meanwhile).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    pub epoch: u64,
    pub committed_end: u64,
}

/// One stream's part of a [`StreamCommand::Commit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamUpdate {
    pub stream: String,
    pub epoch: u64,
    pub segments: Vec<SegmentMeta>,
    pub wal_from: u64,
}

/// Entries of the stream-metadata log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamCommand {
    /// Opens (or takes over) `stream` under `epoch` for `owner`. `recovered` holds
    /// what was recovered from the previous owner's WAL.
    Open {
        stream: String,
        epoch: u64,
        owner: WalId,
        wal_from: u64,
        expected: Option<Expected>,
        recovered: Option<SegmentMeta>,
    },
    /// Compaction results of one owner: new segments and WAL positions.
    Commit {
        owner: WalId,
        updates: Vec<StreamUpdate>,
    },
    /// A clean close: everything is in segments; the next owner needs no fence.
    Close {
        stream: String,
        epoch: u64,
        owner: WalId,
        segments: Vec<SegmentMeta>,
        end_offset: u64,
    },
    /// A fence object was written at `at` in `wal`: objects at or above it are
    /// ignored by everyone. The first fence recorded for a WAL wins.
    Fence { wal: WalId, at: u64 },
    /// Moves the start offset forward and drops the segments wholly below it.
    Trim {
        stream: String,
        epoch: u64,
        start_offset: u64,
    },
}

/// Every stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamsState {
    pub streams: BTreeMap<String, StreamMeta>,
    /// Fenced WAL writers (`node/generation`) and the sequence of their fence.
    pub fences: BTreeMap<String, u64>,
}

fn check_segments(meta_end: u64, segments: &[SegmentMeta]) -> Result<u64, String> {
    let mut end = meta_end;
    for s in segments {
        if s.base != end {
            return Err(format!(
                "segment {} starts at {} but the stream's compacted data ends at {end}",
                s.key, s.base
            ));
        }
        if s.end <= s.base {
            return Err(format!("segment {} is empty", s.key));
        }
        end = s.end;
    }
    Ok(end)
}

impl StreamsState {
    fn owned(
        &self,
        stream: &str,
        epoch: u64,
        owner: Option<&WalId>,
    ) -> Result<&StreamMeta, String> {
        let meta = self
            .streams
            .get(stream)
            .ok_or_else(|| format!("stream {stream} does not exist"))?;
        if meta.epoch != epoch {
            return Err(format!(
                "stream {stream} is open under epoch {}, not {epoch}",
                meta.epoch
            ));
        }
        if let Some(owner) = owner
            && meta.owner.as_ref() != Some(owner)
        {
            return Err(format!("stream {stream} is not owned by {owner}"));
        }
        Ok(meta)
    }

    /// The streams a WAL writer owns.
    pub fn owned_by<'a>(
        &'a self,
        wal: &'a WalId,
    ) -> impl Iterator<Item = (&'a String, &'a StreamMeta)> {
        self.streams
            .iter()
            .filter(move |(_, m)| m.owner.as_ref() == Some(wal))
    }
}

impl LogState for StreamsState {
    type Entry = StreamCommand;
    type Rejection = String;

    fn validate(&self, command: &StreamCommand) -> Result<(), String> {
        match command {
            StreamCommand::Open {
                stream,
                epoch,
                expected,
                recovered,
                ..
            } => match self.streams.get(stream) {
                None => {
                    if expected.is_some() || recovered.is_some() {
                        return Err(format!("stream {stream} does not exist"));
                    }
                    Ok(())
                }
                Some(meta) => {
                    if *epoch <= meta.epoch {
                        return Err(format!(
                            "stream {stream} was opened under epoch {}; {epoch} is not newer",
                            meta.epoch
                        ));
                    }
                    let now = Expected {
                        epoch: meta.epoch,
                        committed_end: meta.committed_end,
                    };
                    if expected.as_ref() != Some(&now) {
                        return Err(format!(
                            "stream {stream} changed during the takeover (now {now:?}); retry"
                        ));
                    }
                    check_segments(meta.committed_end, recovered.as_slice()).map(|_| ())
                }
            },
            StreamCommand::Commit { owner, updates } => {
                for u in updates {
                    let meta = self.owned(&u.stream, u.epoch, Some(owner))?;
                    check_segments(meta.committed_end, &u.segments)?;
                    if u.wal_from < meta.wal_from {
                        return Err(format!(
                            "stream {}: wal_from may not move back from {} to {}",
                            u.stream, meta.wal_from, u.wal_from
                        ));
                    }
                }
                Ok(())
            }
            StreamCommand::Close {
                stream,
                epoch,
                owner,
                segments,
                end_offset,
            } => {
                let meta = self.owned(stream, *epoch, Some(owner))?;
                let end = check_segments(meta.committed_end, segments)?;
                if end != *end_offset {
                    return Err(format!(
                        "stream {stream}: closing at {end_offset} but the segments end at {end}"
                    ));
                }
                Ok(())
            }
            StreamCommand::Fence { wal, at } => match self.fences.get(&wal.to_string()) {
                Some(existing) => Err(format!("{wal} is already fenced at {existing}, not {at}")),
                None => Ok(()),
            },
            StreamCommand::Trim {
                stream,
                epoch,
                start_offset,
            } => {
                let meta = self.owned(stream, *epoch, None)?;
                if *start_offset > meta.committed_end {
                    return Err(format!(
                        "stream {stream}: cannot trim to {start_offset} beyond the compacted end {}",
                        meta.committed_end
                    ));
                }
                Ok(())
            }
        }
    }

    fn apply(&mut self, _index: u64, command: &StreamCommand) {
        match command {
            StreamCommand::Open {
                stream,
                epoch,
                owner,
                wal_from,
                recovered,
                ..
            } => {
                let meta = self.streams.entry(stream.clone()).or_insert(StreamMeta {
                    epoch: *epoch,
                    owner: None,
                    start_offset: 0,
                    segments: vec![],
                    committed_end: 0,
                    wal_from: 0,
                });
                meta.epoch = *epoch;
                meta.owner = Some(owner.clone());
                meta.wal_from = *wal_from;
                if let Some(seg) = recovered {
                    meta.committed_end = seg.end;
                    meta.segments.push(seg.clone());
                }
            }
            StreamCommand::Commit { updates, .. } => {
                for u in updates {
                    if let Some(meta) = self.streams.get_mut(&u.stream) {
                        for seg in &u.segments {
                            meta.committed_end = seg.end;
                            meta.segments.push(seg.clone());
                        }
                        meta.wal_from = u.wal_from;
                    }
                }
            }
            StreamCommand::Close {
                stream, segments, ..
            } => {
                if let Some(meta) = self.streams.get_mut(stream) {
                    for seg in segments {
                        meta.committed_end = seg.end;
                        meta.segments.push(seg.clone());
                    }
                    meta.owner = None;
                }
            }
            StreamCommand::Fence { wal, at } => {
                self.fences.entry(wal.to_string()).or_insert(*at);
            }
            StreamCommand::Trim {
                stream,
                start_offset,
                ..
            } => {
                if let Some(meta) = self.streams.get_mut(stream) {
                    meta.start_offset = meta.start_offset.max(*start_offset);
                    let start = meta.start_offset;
                    meta.segments.retain(|s| s.end > start);
                }
            }
        }
    }
}
