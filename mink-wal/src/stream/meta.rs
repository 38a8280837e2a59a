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

/// What the view of a stream looked like when an open began; an `Open` is rejected
/// if it changed since (the old owner compacted, or someone else took it over).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    pub epoch: u64,
    pub committed_end: u64,
    /// The owner at the time (`None`: closed). Entries written before this field
    /// existed read as `None`; they were validated when appended and are only applied.
    #[serde(default)]
    pub owner: Option<WalId>,
    /// The stream's `wal_from` at the time. A takeover reads the owner's WAL from it;
    /// once the owner commits a higher one it may delete the objects below, and a
    /// stale fence object left by a refused fencer may fill such a slot, which a
    /// reader from the old position would take for the end of the WAL. `None` in
    /// entries written before this field existed (not compared).
    #[serde(default)]
    pub wal_from: Option<u64>,
}

impl Expected {
    /// What a view of `meta` expects at the moment of the open.
    pub fn of(meta: &StreamMeta) -> Self {
        Expected {
            epoch: meta.epoch,
            committed_end: meta.committed_end,
            owner: meta.owner.clone(),
            wal_from: Some(meta.wal_from),
        }
    }

    fn still(&self, meta: &StreamMeta) -> bool {
        self.epoch == meta.epoch
            && self.committed_end == meta.committed_end
            && self.owner == meta.owner
            && self.wal_from.is_none_or(|w| w == meta.wal_from)
    }
}

/// One stream's part of a [`StreamCommand::Commit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamUpdate {
    pub stream: String,
    pub epoch: u64,
    pub segments: Vec<SegmentMeta>,
    pub wal_from: u64,
}

/// One stream's part of a [`StreamCommand::Merge`]: `segment` holds exactly the
/// records of the consecutive segments `replaces` (keys, in order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMerge {
    pub stream: String,
    pub replaces: Vec<String>,
    pub segment: SegmentMeta,
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
    /// `oldest_unacked` (the owner's oldest unacknowledged WAL sequence when it
    /// collected) lets the state machine raise the owner's WAL floor; commits
    /// written before it existed raise nothing.
    Commit {
        owner: WalId,
        updates: Vec<StreamUpdate>,
        #[serde(default)]
        oldest_unacked: Option<u64>,
    },
    /// A clean close: everything is in segments; the next owner needs no fence.
    Close {
        stream: String,
        epoch: u64,
        owner: WalId,
        segments: Vec<SegmentMeta>,
        end_offset: u64,
    },
    /// Merged segments of one owner's streams: each replaces a run of consecutive
    /// segments with one holding the same records. The replaced objects are deleted
    /// once this lands (or, if their owner dies first, by the next owner's orphan GC).
    Merge {
        owner: WalId,
        merges: Vec<SegmentMerge>,
    },
    /// A fence object was written at `at` in `wal`: objects at or above it are
    /// ignored by everyone. The first fence recorded for a WAL wins.
    Fence { wal: WalId, at: u64 },
    /// Moves the start offset forward and drops the segments wholly below it.
    Trim {
        stream: String,
        epoch: u64,
        start_offset: u64,
        /// The writer that trims; only the owner may. Entries written before this
        /// field existed read as `None` (they were validated when appended).
        #[serde(default)]
        owner: Option<WalId>,
    },
}

impl StreamCommand {
    /// The WAL writer the command speaks for, if it names one.
    fn owner(&self) -> Option<&WalId> {
        match self {
            StreamCommand::Open { owner, .. }
            | StreamCommand::Commit { owner, .. }
            | StreamCommand::Close { owner, .. }
            | StreamCommand::Merge { owner, .. } => Some(owner),
            StreamCommand::Trim { owner, .. } => owner.as_ref(),
            StreamCommand::Fence { .. } => None,
        }
    }
}

/// Every stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamsState {
    pub streams: BTreeMap<String, StreamMeta>,
    /// Fenced WAL writers (`node/generation`) and the sequence of their fence.
    pub fences: BTreeMap<String, u64>,
    /// Per WAL writer (`node/generation`): the sequence below which its owner may
    /// delete its WAL objects. Raised only by the owner's commits, computed here, so
    /// a GC floor never comes from a node's local view. A fence below it is refused:
    /// the slot may have been deleted, and the owner would never meet the fence.
    #[serde(default)]
    pub wal_floors: BTreeMap<String, u64>,
    /// Per node: the newest WAL generation any applied command names as its owner. An
    /// `Open` by an older generation of the node is refused: the node replaced that
    /// WAL, and dead-WAL GC may delete a replaced generation's objects once a newer
    /// one is seen here, so a late open (a paused process, a delayed request) must not
    /// make a stream depend on them again.
    #[serde(default)]
    pub generations: BTreeMap<String, u64>,
}

/// Where the run of segments `m.replaces` sits in `segments`, if it is there, in
/// order, and `m.segment` covers exactly its offsets.
fn merge_position(segments: &[SegmentMeta], m: &SegmentMerge) -> Result<usize, String> {
    let stream = &m.stream;
    if m.replaces.len() < 2 {
        return Err(format!(
            "stream {stream}: a merge needs at least two segments"
        ));
    }
    let at = segments
        .iter()
        .position(|s| s.key == m.replaces[0])
        .ok_or_else(|| format!("stream {stream}: segment {} is gone", m.replaces[0]))?;
    let run = segments
        .get(at..at + m.replaces.len())
        .ok_or_else(|| format!("stream {stream}: the merged run is no longer there"))?;
    if run.iter().map(|s| &s.key).ne(m.replaces.iter()) {
        return Err(format!(
            "stream {stream}: the merged run is no longer there"
        ));
    }
    let (first, last) = (&run[0], &run[run.len() - 1]);
    if m.segment.base != first.base || m.segment.end != last.end {
        return Err(format!(
            "stream {stream}: merged segment {} covers {}..{}, the run {}..{}",
            m.segment.key, m.segment.base, m.segment.end, first.base, last.end
        ));
    }
    Ok(at)
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
    /// The stream, if `owner` holds it open. The epoch is not compared: an owner that
    /// moved its stream to a newer epoch in place is still the one WAL writer that may
    /// hold its records, and its compaction must not mistake that for a takeover.
    fn owned_by_writer(&self, stream: &str, owner: &WalId) -> Result<&StreamMeta, String> {
        let meta = self
            .streams
            .get(stream)
            .ok_or_else(|| format!("stream {stream} does not exist"))?;
        if meta.owner.as_ref() != Some(owner) {
            return Err(format!("stream {stream} is not owned by {owner}"));
        }
        Ok(meta)
    }

    /// The stream, if it is open under `epoch`.
    fn open_under(&self, stream: &str, epoch: u64) -> Result<&StreamMeta, String> {
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
        Ok(meta)
    }

    /// The sequence below which `wal`'s owner may have deleted its WAL objects.
    pub fn wal_floor(&self, wal: &WalId) -> u64 {
        self.wal_floors.get(&wal.to_string()).copied().unwrap_or(1)
    }

    /// The lowest sequence a fence of `wal` may take: no WAL object of `wal` below it
    /// is needed by anyone, and none at or above it was deleted.
    pub fn fence_floor(&self, wal: &WalId) -> u64 {
        self.owned_by(wal)
            .map(|(_, m)| m.wal_from)
            .chain(std::iter::once(self.wal_floor(wal)))
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// The streams a WAL writer owns.
    /// Whether `wal` is done for good: fenced, or superseded by a newer generation of
    /// its node. Either way it may open no stream, so dead-WAL GC may delete its
    /// objects once no stream names it.
    pub fn retired(&self, wal: &WalId) -> bool {
        self.superseded(wal) || self.fences.contains_key(&wal.to_string())
    }

    /// Whether a newer generation of `wal`'s node has been seen (see
    /// [`StreamsState::generations`]).
    pub fn superseded(&self, wal: &WalId) -> bool {
        self.generations
            .get(&wal.node)
            .is_some_and(|newest| *newest > wal.generation)
    }

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

    #[expect(
        clippy::too_many_lines,
        reason = "one arm per stream command: the state machine's validation reads as one table"
    )]
    fn validate(&self, command: &StreamCommand) -> Result<(), String> {
        match command {
            StreamCommand::Open {
                stream,
                epoch,
                expected,
                recovered,
                owner,
                ..
            } => match self.streams.get(stream) {
                _ if self.superseded(owner) => Err(format!(
                    "stream {stream}: WAL {owner} is superseded by generation {} of its node; \
                     a replaced WAL opens nothing",
                    self.generations[&owner.node]
                )),
                _ if self.fences.contains_key(&owner.to_string()) => Err(format!(
                    "stream {stream}: WAL {owner} is fenced; a fenced WAL opens nothing"
                )),
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
                    let now = Expected::of(meta);
                    if !expected.as_ref().is_some_and(|e| e.still(meta)) {
                        return Err(format!(
                            "stream {stream} changed during the takeover (now {now:?}); retry"
                        ));
                    }
                    check_segments(meta.committed_end, recovered.as_slice()).map(|_| ())
                }
            },
            StreamCommand::Commit { owner, updates, .. } => {
                for u in updates {
                    let meta = self.owned_by_writer(&u.stream, owner)?;
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
                let _ = epoch;
                let meta = self.owned_by_writer(stream, owner)?;
                let end = check_segments(meta.committed_end, segments)?;
                if end != *end_offset {
                    return Err(format!(
                        "stream {stream}: closing at {end_offset} but the segments end at {end}"
                    ));
                }
                Ok(())
            }
            StreamCommand::Merge { owner, merges } => {
                let mut seen = std::collections::BTreeSet::new();
                for m in merges {
                    if !seen.insert(&m.stream) {
                        return Err(format!("stream {}: two merges in one entry", m.stream));
                    }
                    let meta = self.owned_by_writer(&m.stream, owner)?;
                    merge_position(&meta.segments, m)?;
                }
                Ok(())
            }
            StreamCommand::Fence { wal, at } => {
                if let Some(existing) = self.fences.get(&wal.to_string()) {
                    return Err(format!("{wal} is already fenced at {existing}, not {at}"));
                }
                let floor = self.fence_floor(wal);
                if *at < floor {
                    return Err(format!(
                        "a fence of {wal} at {at} is below its floor {floor}: stale view, retry"
                    ));
                }
                Ok(())
            }
            StreamCommand::Trim {
                stream,
                epoch,
                start_offset,
                owner,
            } => {
                let meta = self.open_under(stream, *epoch)?;
                if let Some(owner) = owner {
                    self.owned_by_writer(stream, owner)?;
                }
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
        if let Some(owner) = command.owner() {
            let newest = self.generations.entry(owner.node.clone()).or_default();
            *newest = (*newest).max(owner.generation);
        }
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
                // Objects below the owner's floor may be gone; none holds a record
                // of this stream that is not in a segment (docs/s3stream.md).
                meta.wal_from = (*wal_from).max(
                    self.wal_floors
                        .get(&owner.to_string())
                        .copied()
                        .unwrap_or(1),
                );
                if let Some(seg) = recovered {
                    meta.committed_end = seg.end;
                    meta.segments.push(seg.clone());
                }
            }
            StreamCommand::Commit {
                owner,
                updates,
                oldest_unacked,
            } => {
                for u in updates {
                    if let Some(meta) = self.streams.get_mut(&u.stream) {
                        for seg in &u.segments {
                            meta.committed_end = seg.end;
                            meta.segments.push(seg.clone());
                        }
                        meta.wal_from = u.wal_from;
                    }
                }
                // The new floor: no owned stream needs anything below its wal_from,
                // and nothing below the oldest unacknowledged upload is in flight.
                // Streams this writer owns but did not update (one it has not
                // installed, say) hold the floor down.
                if let Some(oldest) = oldest_unacked {
                    let floor = self
                        .owned_by(owner)
                        .map(|(_, m)| m.wal_from)
                        .chain(std::iter::once(*oldest))
                        .min()
                        .unwrap_or(*oldest);
                    let entry = self.wal_floors.entry(owner.to_string()).or_insert(1);
                    *entry = (*entry).max(floor);
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
            StreamCommand::Merge { merges, .. } => {
                for m in merges {
                    if let Some(meta) = self.streams.get_mut(&m.stream)
                        && let Ok(at) = merge_position(&meta.segments, m)
                    {
                        meta.segments
                            .splice(at..at + m.replaces.len(), [m.segment.clone()]);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wal(node: &str) -> WalId {
        WalId {
            node: node.into(),
            generation: 1,
        }
    }

    fn apply(state: &mut StreamsState, command: StreamCommand) {
        state.validate(&command).unwrap();
        state.apply(0, &command);
    }

    #[test]
    fn a_replaced_wal_generation_opens_nothing() {
        let mut s = StreamsState::default();
        let old = wal("n");
        let new = WalId {
            node: "n".into(),
            generation: 2,
        };
        apply(&mut s, open("a", 1, &old, 1, None));
        assert!(!s.superseded(&old));
        // A fenced one opens nothing either.
        let fenced = wal("f");
        apply(
            &mut s,
            StreamCommand::Fence {
                wal: fenced.clone(),
                at: 1,
            },
        );
        assert!(s.retired(&fenced) && !s.superseded(&fenced));
        let err = s.validate(&open("d", 1, &fenced, 1, None)).unwrap_err();
        assert!(err.contains("is fenced"), "{err}");
        apply(&mut s, open("b", 1, &new, 1, None));
        assert!(s.superseded(&old));
        assert!(!s.superseded(&new));
        // A late open by the replaced generation is refused, whatever the stream.
        let err = s.validate(&open("c", 1, &old, 1, None)).unwrap_err();
        assert!(err.contains("superseded by generation 2"), "{err}");
        // Another node's generations are its own.
        assert!(!s.superseded(&wal("m")));
        s.validate(&open("c", 1, &wal("m"), 1, None)).unwrap();
    }

    fn open(
        stream: &str,
        epoch: u64,
        owner: &WalId,
        wal_from: u64,
        expected: Option<Expected>,
    ) -> StreamCommand {
        StreamCommand::Open {
            stream: stream.into(),
            epoch,
            owner: owner.clone(),
            wal_from,
            expected,
            recovered: None,
        }
    }

    fn commit(owner: &WalId, streams: &[(&str, u64)], oldest: u64) -> StreamCommand {
        StreamCommand::Commit {
            owner: owner.clone(),
            updates: streams
                .iter()
                .map(|(s, wal_from)| StreamUpdate {
                    stream: s.to_string(),
                    epoch: 0,
                    segments: vec![],
                    wal_from: *wal_from,
                })
                .collect(),
            oldest_unacked: Some(oldest),
        }
    }

    #[test]
    fn a_fence_below_the_owners_floor_is_refused() {
        let a = wal("a");
        let mut state = StreamsState::default();
        apply(&mut state, open("s", 1, &a, 1, None));
        apply(&mut state, commit(&a, &[("s", 10)], 10));
        assert_eq!(state.wal_floor(&a), 10);
        // A fencer whose view predates the commit finds slot 5 empty (deleted).
        let stale = StreamCommand::Fence {
            wal: a.clone(),
            at: 5,
        };
        let why = state.validate(&stale).unwrap_err();
        assert!(why.contains("below its floor"), "{why}");
        apply(
            &mut state,
            StreamCommand::Fence {
                wal: a.clone(),
                at: 10,
            },
        );
        assert_eq!(state.fences.get("a/1"), Some(&10));
    }

    #[test]
    fn a_stream_owned_but_not_committed_holds_the_floor_down() {
        let a = wal("a");
        let mut state = StreamsState::default();
        apply(&mut state, open("s", 1, &a, 3, None));
        // "ghost" is owned by a in the log, but a's compaction does not know it.
        apply(&mut state, open("ghost", 1, &a, 4, None));
        apply(&mut state, commit(&a, &[("s", 50)], 50));
        assert_eq!(state.wal_floor(&a), 4);
        // An open by a raises the stream's wal_from to at least the floor.
        apply(&mut state, commit(&a, &[("s", 60), ("ghost", 60)], 60));
        apply(&mut state, open("late", 1, &a, 2, None));
        assert_eq!(state.streams["late"].wal_from, 60);
    }

    #[test]
    fn the_owner_commits_after_moving_its_stream_to_a_newer_epoch() {
        let a = wal("a");
        let mut state = StreamsState::default();
        apply(&mut state, open("s", 1, &a, 1, None));
        let expected = Some(Expected {
            epoch: 1,
            committed_end: 0,
            owner: Some(a.clone()),
            wal_from: None,
        });
        apply(&mut state, open("s", 2, &a, 1, expected));
        // Compaction collected under epoch 1; the commit is still the owner's.
        let mut c = commit(&a, &[("s", 5)], 5);
        if let StreamCommand::Commit { updates, .. } = &mut c {
            updates[0].epoch = 1;
        }
        apply(&mut state, c);
        assert_eq!(state.streams["s"].wal_from, 5);
    }

    #[test]
    fn an_open_expecting_another_owner_is_refused() {
        let (a, b) = (wal("a"), wal("b"));
        let mut state = StreamsState::default();
        apply(&mut state, open("s", 1, &a, 1, None));
        let took = Some(Expected {
            epoch: 1,
            committed_end: 0,
            owner: Some(a.clone()),
            wal_from: None,
        });
        apply(&mut state, open("s", 2, &b, 1, took));
        // a moves "its" stream in place from a view in which b's takeover has not
        // happened: same epoch and end as a fresh read would show, but not the owner.
        let stale = open(
            "s",
            3,
            &a,
            1,
            Some(Expected {
                epoch: 2,
                committed_end: 0,
                owner: Some(a.clone()),
                wal_from: None,
            }),
        );
        assert!(state.validate(&stale).unwrap_err().contains("changed"));
    }

    /// Found by the concurrent model test (seed 858): a takeover read the owner's WAL
    /// from a stale `wal_from`; the owner had since committed a higher one and deleted
    /// the slot below, a refused fencer's stray fence object filled it, and the reader
    /// took it for the end of the WAL: it recovered nothing and its open (same epoch,
    /// end and owner) landed, losing acknowledged records. The open now also expects
    /// the `wal_from` it read from.
    #[test]
    fn a_takeover_from_a_stale_wal_position_is_refused() {
        let (a, b) = (wal("a"), wal("b"));
        let mut state = StreamsState::default();
        apply(&mut state, open("s", 1, &a, 9, None));
        let view = Expected::of(&state.streams["s"]);
        assert_eq!(view.wal_from, Some(9));
        // The owner commits no new segment, only a higher WAL position.
        apply(&mut state, commit(&a, &[("s", 10)], 10));
        let late = open("s", 2, &b, 1, Some(view));
        let why = state.validate(&late).unwrap_err();
        assert!(why.contains("changed during the takeover"), "{why}");
        let fresh = Expected::of(&state.streams["s"]);
        apply(&mut state, open("s", 2, &b, 1, Some(fresh)));
    }

    fn seg(key: &str, base: u64, end: u64) -> SegmentMeta {
        SegmentMeta {
            key: key.into(),
            base,
            end,
            bytes: 10,
            min_timestamp_ms: 0,
            max_timestamp_ms: 0,
        }
    }

    #[test]
    fn a_merge_replaces_exactly_a_run_the_owner_still_has() {
        let (a, b) = (wal("a"), wal("b"));
        let mut state = StreamsState::default();
        apply(&mut state, open("s", 1, &a, 1, None));
        let mut c = commit(&a, &[("s", 5)], 5);
        if let StreamCommand::Commit { updates, .. } = &mut c {
            updates[0].segments = vec![seg("k1", 0, 2), seg("k2", 2, 3), seg("k3", 3, 7)];
        }
        apply(&mut state, c);
        let merge = |owner: &WalId, replaces: &[&str], base, end| StreamCommand::Merge {
            owner: owner.clone(),
            merges: vec![SegmentMerge {
                stream: "s".into(),
                replaces: replaces.iter().map(|k| k.to_string()).collect(),
                segment: seg("m", base, end),
            }],
        };
        let refused = |state: &StreamsState, c: StreamCommand, why: &str| {
            let got = state.validate(&c).unwrap_err();
            assert!(got.contains(why), "{got}");
        };
        refused(&state, merge(&b, &["k1", "k2"], 0, 3), "not owned by");
        refused(&state, merge(&a, &["k1"], 0, 2), "at least two");
        refused(&state, merge(&a, &["k1", "k3"], 0, 7), "no longer there");
        refused(&state, merge(&a, &["k2", "k3"], 2, 6), "covers");
        refused(&state, merge(&a, &["k0", "k1"], 0, 2), "is gone");
        let twice = StreamCommand::Merge {
            owner: a.clone(),
            merges: [
                merge(&a, &["k1", "k2"], 0, 3),
                merge(&a, &["k2", "k3"], 2, 7),
            ]
            .into_iter()
            .flat_map(|c| match c {
                StreamCommand::Merge { merges, .. } => merges,
                _ => unreachable!(),
            })
            .collect(),
        };
        refused(&state, twice, "two merges");
        apply(&mut state, merge(&a, &["k2", "k3"], 2, 7));
        let keys: Vec<_> = state.streams["s"]
            .segments
            .iter()
            .map(|s| s.key.as_str())
            .collect();
        assert_eq!(keys, ["k1", "m"]);
        assert_eq!(state.streams["s"].committed_end, 7);
        // A trim that dropped part of a run makes a merge of it stale.
        apply(
            &mut state,
            StreamCommand::Trim {
                stream: "s".into(),
                epoch: 1,
                start_offset: 2,
                owner: Some(a.clone()),
            },
        );
        refused(&state, merge(&a, &["k1", "m"], 0, 7), "is gone");
    }
}
