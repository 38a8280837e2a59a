//! The classic consumer-group coordinator: group membership and rebalances, in memory
//! on the lease holder (spec/protocols.txt). Committed offsets are not here: they go
//! through the metadata log (the handler's `commit_offsets`), so they survive the
//! coordinator; group state does not, and is rebuilt by rebalances after the lease
//! moves (members get UNKNOWN_MEMBER_ID and join again).
//!
//! States: Empty, PreparingRebalance, CompletingRebalance, Stable.
//! - A JoinGroup (a new member, or a known one rejoining) moves the group to
//!   PreparingRebalance; the join waits until every member has rejoined, or until the
//!   longest rebalance timeout of the members passed (members that did not rejoin are
//!   removed). Then the generation grows, a protocol every member supports is chosen,
//!   the leader gets every member's metadata, and the group is CompletingRebalance.
//! - The leader's SyncGroup hands out the assignments: Stable.
//! - A member that neither heartbeats nor waits in a join or sync for its session
//!   timeout is removed, as is one that leaves; the rest rebalance.
//! - MEMBER_ID_REQUIRED (KIP-394) only for JoinGroup v4+, whose clients expect it.
//! - A group whose last member left stays Empty for [`EMPTY_GROUP_RETENTION`] (Kafka
//!   describes it as Empty, not Dead, until its cleanup), at most [`EMPTY_GROUPS_MAX`].
//!
//! Static membership (`group.instance.id`) is not implemented: such members are
//! treated as dynamic ones.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A group's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl State {
    /// The name DescribeGroups and ListGroups use.
    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// A JoinGroup, as the coordinator needs it.
#[derive(Debug, Clone)]
pub struct Join {
    pub group: String,
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// Protocol names with the member's metadata for each, in preference order.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a member without an id is given one and asked to join again.
    pub member_id_required: bool,
}

/// The answer to a JoinGroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Joined {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// For the leader: every member with its metadata for the chosen protocol.
    pub members: Vec<(String, Bytes)>,
}

impl Joined {
    fn error(code: ResponseError, member_id: &str) -> Self {
        Self {
            error: code.code(),
            generation: -1,
            member_id: member_id.to_string(),
            ..Default::default()
        }
    }
}

/// The answer to a SyncGroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl Synced {
    fn error(code: ResponseError) -> Self {
        Self {
            error: code.code(),
            ..Default::default()
        }
    }
}

/// The partitions of a `consumer`-protocol assignment (the bytes a SyncGroup leader
/// hands each member: a version, then topics and partitions), or `None` when the
/// bytes are not one (another protocol type, or empty before the first sync).
pub fn decode_assignment(bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    let mut buf = Bytes::copy_from_slice(bytes);
    if buf.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    // Versions above the codec's read as its newest: newer versions only add fields.
    let a = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)).ok()?;
    Some(
        a.assigned_partitions
            .into_iter()
            .map(|tp| (tp.topic.0.to_string(), tp.partitions))
            .collect(),
    )
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub state: State,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberView>,
}

struct Member {
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    /// When the member is removed unless it heartbeats (not while it waits in a
    /// join or a sync).
    expires: Instant,
    join: Option<oneshot::Sender<Joined>>,
    sync: Option<oneshot::Sender<Synced>>,
}

impl Member {
    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|(n, _)| n == protocol)
    }

    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

struct Group {
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, not yet joined, each until its
    /// session timeout passes (as Kafka expires them, KIP-394): a client asking again
    /// and again without joining must not grow the group without end.
    pending: HashMap<String, Instant>,
    /// When a rebalance in progress completes without the members still missing.
    rebalance_deadline: Option<Instant>,
    /// When the group's last member left: an Empty group is still described as Empty
    /// (not Dead) for [`EMPTY_GROUP_RETENTION`] after, as Kafka keeps it until its
    /// next cleanup.
    empty_since: Option<Instant>,
}

impl Group {
    fn new() -> Self {
        Self {
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: HashMap::new(),
            rebalance_deadline: None,
            empty_since: None,
        }
    }

    /// The last member is gone. The protocol type stays, for DescribeGroups (a member
    /// of another type may still join an Empty group).
    fn become_empty(&mut self, now: Instant) {
        self.state = State::Empty;
        self.protocol = None;
        self.leader = None;
        self.empty_since = Some(now);
    }

    fn prepare_rebalance(&mut self, now: Instant) {
        if self.state == State::CompletingRebalance {
            // Members waiting for their assignment must join again.
            for m in self.members.values_mut() {
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send(Synced::error(ResponseError::RebalanceInProgress));
                }
            }
        }
        if self.state != State::PreparingRebalance {
            let longest = self
                .members
                .values()
                .map(|m| m.rebalance_timeout)
                .max()
                .unwrap_or_default();
            self.rebalance_deadline = Some(now + longest);
            self.state = State::PreparingRebalance;
            self.empty_since = None;
        }
    }

    fn try_complete_join(&mut self, now: Instant) {
        if self.state == State::PreparingRebalance
            && self.members.values().all(|m| m.join.is_some())
        {
            self.complete_join(now);
        }
    }

    /// Ends a rebalance: members that did not rejoin are removed, the generation
    /// grows, the protocol and the leader are chosen, and every join is answered.
    fn complete_join(&mut self, now: Instant) {
        self.members.retain(|_, m| m.join.is_some());
        self.rebalance_deadline = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.become_empty(now);
            return;
        }
        let leader = match &self.leader {
            Some(l) if self.members.contains_key(l) => l.clone(),
            _ => self.members.keys().next().cloned().unwrap_or_default(),
        };
        let candidates: Vec<String> = self.members[&leader]
            .protocols
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        let protocol = candidates
            .iter()
            .find(|p| self.members.values().all(|m| m.supports(p)))
            .or(candidates.first())
            .cloned()
            .unwrap_or_default();
        let everyone: Vec<(String, Bytes)> = self
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.metadata(&protocol)))
            .collect();
        self.leader = Some(leader.clone());
        self.protocol = Some(protocol.clone());
        self.state = State::CompletingRebalance;
        for (id, m) in self.members.iter_mut() {
            m.expires = now + m.session_timeout;
            m.assignment = Bytes::new();
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined {
                    error: 0,
                    generation: self.generation,
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: Some(protocol.clone()),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader {
                        everyone.clone()
                    } else {
                        vec![]
                    },
                });
            }
        }
    }

    /// A member left or expired: the others rebalance.
    fn remove(&mut self, id: &str, now: Instant) {
        self.members.remove(id);
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        match self.state {
            State::Stable | State::CompletingRebalance => {
                if self.members.is_empty() {
                    self.generation += 1;
                    self.become_empty(now);
                } else {
                    self.prepare_rebalance(now);
                }
            }
            State::PreparingRebalance => self.try_complete_join(now),
            State::Empty => {}
        }
    }
}

/// The groups this node coordinates.
pub struct Coordinator {
    groups: Mutex<BTreeMap<String, Group>>,
    session_timeout_min_ms: u64,
    session_timeout_max_ms: u64,
    next_member: std::sync::atomic::AtomicU64,
}

/// Group ids longer than this are refused.
pub const GROUP_ID_BYTES_MAX: usize = 256;

impl Coordinator {
    pub fn new(session_timeout_min_ms: u64, session_timeout_max_ms: u64) -> Self {
        Self {
            groups: Mutex::new(BTreeMap::new()),
            session_timeout_min_ms,
            session_timeout_max_ms,
            next_member: std::sync::atomic::AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Group>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every group (this node no longer coordinates).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn new_member_id(&self, client_id: &str) -> String {
        let n = self
            .next_member
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{client_id}-{nanos:x}-{n}")
    }

    /// Joins (or rejoins) a group; resolves when the rebalance completes.
    pub async fn join(&self, req: Join) -> Joined {
        let rx = match self.join_now(req, Instant::now()) {
            Ok(rx) => rx,
            Err(answer) => return answer,
        };
        rx.await
            .unwrap_or_else(|_| Joined::error(ResponseError::RebalanceInProgress, ""))
    }

    // The error is the answer itself, built once per join: not worth a box.
    #[allow(clippy::result_large_err)]
    fn join_now(&self, req: Join, now: Instant) -> Result<oneshot::Receiver<Joined>, Joined> {
        let session = req.session_timeout_ms.max(0) as u64;
        if req.group.is_empty() || req.group.len() > GROUP_ID_BYTES_MAX {
            return Err(Joined::error(ResponseError::InvalidGroupId, &req.member_id));
        }
        if session < self.session_timeout_min_ms || session > self.session_timeout_max_ms {
            return Err(Joined::error(
                ResponseError::InvalidSessionTimeout,
                &req.member_id,
            ));
        }
        if req.protocols.is_empty() || req.protocol_type.is_empty() {
            return Err(Joined::error(
                ResponseError::InconsistentGroupProtocol,
                &req.member_id,
            ));
        }
        let mut groups = self.lock();
        let group = groups.entry(req.group.clone()).or_insert_with(Group::new);
        if !group.members.is_empty() {
            let same_type = group.protocol_type.as_deref() == Some(req.protocol_type.as_str());
            let common = req.protocols.iter().any(|(name, _)| {
                group
                    .members
                    .iter()
                    .filter(|(id, _)| **id != req.member_id)
                    .all(|(_, m)| m.supports(name))
            });
            if !same_type || !common {
                return Err(Joined::error(
                    ResponseError::InconsistentGroupProtocol,
                    &req.member_id,
                ));
            }
        }
        let member_id = if req.member_id.is_empty() {
            let id = self.new_member_id(&req.client_id);
            if req.member_id_required {
                group
                    .pending
                    .insert(id.clone(), now + Duration::from_millis(session));
                return Err(Joined::error(ResponseError::MemberIdRequired, &id));
            }
            id
        } else if group.members.contains_key(&req.member_id)
            || group.pending.contains_key(&req.member_id)
        {
            req.member_id.clone()
        } else {
            return Err(Joined::error(
                ResponseError::UnknownMemberId,
                &req.member_id,
            ));
        };
        group.pending.remove(&member_id);
        let (tx, rx) = oneshot::channel();
        let session_timeout = Duration::from_millis(session);
        let rebalance_timeout = Duration::from_millis(
            u64::try_from(req.rebalance_timeout_ms)
                .ok()
                .filter(|ms| *ms > 0)
                .unwrap_or(session),
        );
        let member = group.members.entry(member_id).or_insert_with(|| Member {
            client_id: String::new(),
            client_host: String::new(),
            session_timeout,
            rebalance_timeout,
            protocols: vec![],
            assignment: Bytes::new(),
            expires: now + session_timeout,
            join: None,
            sync: None,
        });
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.session_timeout = session_timeout;
        member.rebalance_timeout = rebalance_timeout;
        member.protocols = req.protocols;
        member.join = Some(tx);
        group.protocol_type = Some(req.protocol_type);
        group.prepare_rebalance(now);
        group.try_complete_join(now);
        Ok(rx)
    }

    /// A member's SyncGroup; the leader's carries every assignment. Resolves once the
    /// leader's has arrived.
    pub async fn sync(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
    ) -> Synced {
        let rx = {
            let mut groups = self.lock();
            let Some(group) = groups.get_mut(group_id) else {
                return Synced::error(ResponseError::UnknownMemberId);
            };
            if !group.members.contains_key(member_id) {
                return Synced::error(ResponseError::UnknownMemberId);
            }
            if generation != group.generation {
                return Synced::error(ResponseError::IllegalGeneration);
            }
            let now = Instant::now();
            match group.state {
                State::Empty => return Synced::error(ResponseError::UnknownMemberId),
                State::PreparingRebalance => {
                    return Synced::error(ResponseError::RebalanceInProgress);
                }
                State::Stable => {
                    let m = &mut group.members.get_mut(member_id).expect("checked above");
                    m.expires = now + m.session_timeout;
                    return Synced {
                        error: 0,
                        protocol_type: group.protocol_type.clone(),
                        protocol_name: group.protocol.clone(),
                        assignment: m.assignment.clone(),
                    };
                }
                State::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            if let Some(m) = group.members.get_mut(member_id) {
                m.sync = Some(tx);
                m.expires = now + m.session_timeout;
            }
            if group.leader.as_deref() == Some(member_id) {
                for (id, assignment) in assignments {
                    if let Some(m) = group.members.get_mut(&id) {
                        m.assignment = assignment;
                    }
                }
                group.state = State::Stable;
                let (protocol_type, protocol_name) =
                    (group.protocol_type.clone(), group.protocol.clone());
                for m in group.members.values_mut() {
                    if let Some(tx) = m.sync.take() {
                        let _ = tx.send(Synced {
                            error: 0,
                            protocol_type: protocol_type.clone(),
                            protocol_name: protocol_name.clone(),
                            assignment: m.assignment.clone(),
                        });
                    }
                }
            }
            rx
        };
        rx.await
            .unwrap_or_else(|_| Synced::error(ResponseError::RebalanceInProgress))
    }

    /// A heartbeat: the member stays; the answer tells it to rejoin when a rebalance
    /// is in progress.
    pub fn heartbeat(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
    ) -> Option<ResponseError> {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        let state = group.state;
        let current = group.generation;
        let Some(m) = group.members.get_mut(member_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        if generation != current {
            return Some(ResponseError::IllegalGeneration);
        }
        m.expires = Instant::now() + m.session_timeout;
        match state {
            State::PreparingRebalance => Some(ResponseError::RebalanceInProgress),
            _ => None,
        }
    }

    /// Members leave; each answered on its own (UNKNOWN_MEMBER_ID when not a member).
    pub fn leave(&self, group_id: &str, member_ids: &[String]) -> Vec<Option<ResponseError>> {
        let mut groups = self.lock();
        let now = Instant::now();
        member_ids
            .iter()
            .map(|id| match groups.get_mut(group_id) {
                Some(group) if group.members.contains_key(id) => {
                    group.remove(id, now);
                    None
                }
                _ => Some(ResponseError::UnknownMemberId),
            })
            .collect()
    }

    /// Whether an offset commit of `member_id` in `generation` may be written:
    /// `None` when it may, else the error. A commit without a member (generation -1)
    /// is allowed for a group with no members (consumers that assign partitions).
    pub fn may_commit(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
    ) -> Option<ResponseError> {
        let groups = self.lock();
        let group = match groups.get(group_id) {
            Some(g) if !g.members.is_empty() => g,
            _ if generation < 0 && member_id.is_empty() => return None,
            _ => return Some(ResponseError::UnknownMemberId),
        };
        if !group.members.contains_key(member_id) {
            return Some(ResponseError::UnknownMemberId);
        }
        if generation != group.generation {
            return Some(ResponseError::IllegalGeneration);
        }
        if group.state == State::CompletingRebalance {
            return Some(ResponseError::RebalanceInProgress);
        }
        None
    }

    /// Every group with members, and its state.
    pub fn list(&self) -> Vec<(String, State, String)> {
        self.lock()
            .iter()
            .map(|(id, g)| {
                (
                    id.clone(),
                    g.state,
                    g.protocol_type.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Every group in memory, described (the console's view; Kafka clients use
    /// ListGroups and DescribeGroups).
    pub fn describe_all(&self) -> Vec<(String, GroupView)> {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        ids.into_iter()
            .filter_map(|id| self.describe(&id).map(|g| (id, g)))
            .collect()
    }

    /// A group's state and members (`None`: no such group in memory).
    pub fn describe(&self, group_id: &str) -> Option<GroupView> {
        let groups = self.lock();
        let g = groups.get(group_id)?;
        let protocol = g.protocol.clone().unwrap_or_default();
        Some(GroupView {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: protocol.clone(),
            members: g
                .members
                .iter()
                .map(|(id, m)| MemberView {
                    member_id: id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    /// Forgets an Empty group: `Ok(true)` when it was known here, `Err` with
    /// NON_EMPTY_GROUP when it has members.
    pub fn delete(&self, group_id: &str) -> Result<bool, ResponseError> {
        let mut groups = self.lock();
        match groups.get(group_id) {
            Some(g) if !g.members.is_empty() => Err(ResponseError::NonEmptyGroup),
            _ => Ok(groups.remove(group_id).is_some()),
        }
    }

    /// Removes members whose session expired and completes rebalances whose timeout
    /// passed. Run periodically (every [`SWEEP_EVERY`]).
    pub fn sweep(&self, now: Instant) {
        let mut groups = self.lock();
        for group in groups.values_mut() {
            let expired: Vec<String> = group
                .members
                .iter()
                .filter(|(_, m)| m.join.is_none() && m.sync.is_none() && m.expires <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired {
                tracing::info!(member = %id, "kafka group member's session expired; removing it");
                group.remove(&id, now);
            }
            group.pending.retain(|_, expires| *expires > now);
            if group.state == State::PreparingRebalance
                && group.rebalance_deadline.is_some_and(|d| d <= now)
            {
                group.complete_join(now);
            }
        }
        let gone = |g: &Group| {
            g.state == State::Empty
                && g.members.is_empty()
                && g.pending.is_empty()
                && g.empty_since
                    .is_none_or(|t| now.duration_since(t) >= EMPTY_GROUP_RETENTION)
        };
        groups.retain(|_, g| !gone(g));
        // A bound on what clients that come and go leave behind: the oldest Empty
        // groups go first.
        let mut empty: Vec<(Instant, String)> = groups
            .iter()
            .filter(|(_, g)| g.state == State::Empty && g.members.is_empty())
            .filter_map(|(id, g)| g.empty_since.map(|t| (t, id.clone())))
            .collect();
        if empty.len() > EMPTY_GROUPS_MAX {
            empty.sort();
            for (_, id) in &empty[..empty.len() - EMPTY_GROUPS_MAX] {
                groups.remove(id);
            }
        }
    }
}

/// How long a group whose last member left stays Empty before it is forgotten (its
/// committed offsets, kept by the metadata log, make it Empty again after that): as
/// Kafka's `offsets.retention.check.interval.ms` (10 minutes).
pub const EMPTY_GROUP_RETENTION: Duration = Duration::from_secs(600);

/// Empty groups kept in memory at most.
pub const EMPTY_GROUPS_MAX: usize = 10_000;

/// How often [`Coordinator::sweep`] runs: the resolution of session and rebalance
/// timeouts (at least 6 s, spec/protocols.txt).
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::*;

    fn join(group: &str, member: &str, required: bool) -> Join {
        Join {
            group: group.into(),
            member_id: member.into(),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 20_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            member_id_required: required,
        }
    }

    fn coordinator() -> Coordinator {
        Coordinator::new(6_000, 1_800_000)
    }

    #[tokio::test(start_paused = true)]
    async fn one_member_joins_syncs_and_is_stable() {
        let c = coordinator();
        let first = c.join(join("g", "", true)).await;
        assert_eq!(first.error, ResponseError::MemberIdRequired.code());
        let id = first.member_id.clone();
        let joined = c.join(join("g", &id, true)).await;
        assert_eq!(joined.error, 0);
        assert_eq!(joined.generation, 1);
        assert_eq!(joined.leader, id);
        assert_eq!(joined.protocol_name.as_deref(), Some("range"));
        assert_eq!(
            joined.members,
            vec![(id.clone(), Bytes::from_static(b"meta"))]
        );
        let synced = c
            .sync("g", 1, &id, vec![(id.clone(), Bytes::from_static(b"all"))])
            .await;
        assert_eq!(synced.assignment, Bytes::from_static(b"all"));
        assert_eq!(c.describe("g").unwrap().state, State::Stable);
        assert_eq!(c.heartbeat("g", 1, &id), None);
        assert_eq!(
            c.heartbeat("g", 0, &id),
            Some(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            c.heartbeat("g", 1, "nobody"),
            Some(ResponseError::UnknownMemberId)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn member_ids_never_used_expire_with_their_session() {
        let c = coordinator();
        let mut ids = Vec::new();
        for _ in 0..1_000 {
            let asked = c.join(join("g", "", true)).await;
            assert_eq!(asked.error, ResponseError::MemberIdRequired.code());
            ids.push(asked.member_id);
        }
        assert_eq!(c.lock()["g"].pending.len(), 1_000);
        // Within the session an id handed out may join.
        c.sweep(Instant::now() + Duration::from_millis(9_999));
        assert_eq!(c.lock()["g"].pending.len(), 1_000);
        // After it, none may, and the group holding nothing else is forgotten.
        c.sweep(Instant::now() + Duration::from_millis(10_001));
        assert!(c.lock().get("g").is_none(), "expired ids are dropped");
        tokio::time::advance(Duration::from_millis(10_001)).await;
        let late = c.join(join("g", &ids[0], true)).await;
        assert_eq!(late.error, ResponseError::UnknownMemberId.code());
    }

    #[tokio::test(start_paused = true)]
    async fn old_join_versions_get_an_id_without_a_second_round() {
        let c = coordinator();
        let joined = c.join(join("g", "", false)).await;
        assert_eq!(joined.error, 0);
        assert!(!joined.member_id.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_member_rebalances_and_a_leaver_hands_over() {
        let c = std::sync::Arc::new(coordinator());
        let a = c.join(join("g", "", false)).await;
        c.sync(
            "g",
            1,
            &a.member_id,
            vec![(a.member_id.clone(), Bytes::from_static(b"a:all"))],
        )
        .await;
        // B joins: the group prepares a rebalance; A learns it from its heartbeat.
        let c2 = c.clone();
        let b = tokio::spawn(async move { c2.join(join("g", "", false)).await });
        tokio::task::yield_now().await;
        assert_eq!(
            c.heartbeat("g", 1, &a.member_id),
            Some(ResponseError::RebalanceInProgress)
        );
        let a2 = c.join(join("g", &a.member_id, false)).await;
        let b = b.await.unwrap();
        assert_eq!((a2.generation, b.generation), (2, 2));
        assert_eq!(a2.leader, a.member_id, "the leader stays");
        assert_eq!(a2.members.len(), 2);
        assert!(b.members.is_empty());
        // B's sync waits for the leader's.
        let c3 = c.clone();
        let b_id = b.member_id.clone();
        let b_sync = tokio::spawn(async move { c3.sync("g", 2, &b_id, vec![]).await });
        tokio::task::yield_now().await;
        let a_sync = c
            .sync(
                "g",
                2,
                &a.member_id,
                vec![
                    (a.member_id.clone(), Bytes::from_static(b"a:p0")),
                    (b.member_id.clone(), Bytes::from_static(b"b:p1")),
                ],
            )
            .await;
        assert_eq!(a_sync.assignment, Bytes::from_static(b"a:p0"));
        assert_eq!(
            b_sync.await.unwrap().assignment,
            Bytes::from_static(b"b:p1")
        );
        // A leaves: B rejoins alone and leads.
        assert_eq!(c.leave("g", std::slice::from_ref(&a.member_id)), vec![None]);
        assert_eq!(
            c.heartbeat("g", 2, &b.member_id),
            Some(ResponseError::RebalanceInProgress)
        );
        let b2 = c.join(join("g", &b.member_id, false)).await;
        assert_eq!(
            (b2.generation, b2.leader.as_str()),
            (3, b.member_id.as_str())
        );
        assert_eq!(
            c.leave("g", std::slice::from_ref(&a.member_id)),
            vec![Some(ResponseError::UnknownMemberId)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_member_is_removed_after_its_session_timeout() {
        let c = std::sync::Arc::new(coordinator());
        let a = c.join(join("g", "", false)).await;
        c.sync("g", 1, &a.member_id, vec![]).await;
        let c2 = c.clone();
        let b = tokio::spawn(async move { c2.join(join("g", "", false)).await });
        tokio::task::yield_now().await;
        // A never rejoins: after the rebalance timeout B's join completes alone.
        tokio::time::advance(Duration::from_millis(20_001)).await;
        c.sweep(Instant::now());
        let b = b.await.unwrap();
        assert_eq!(b.error, 0);
        assert_eq!(b.members.len(), 1, "A was removed");
        assert_eq!(
            c.heartbeat("g", b.generation, &a.member_id),
            Some(ResponseError::UnknownMemberId)
        );
        // B stops heartbeating: removed after its session timeout; the group empties.
        c.sync("g", b.generation, &b.member_id, vec![]).await;
        tokio::time::advance(Duration::from_millis(10_001)).await;
        c.sweep(Instant::now());
        // Empty, not Dead, for a while after (as Kafka), with its protocol type.
        let empty = c.describe("g").expect("an Empty group is still known");
        assert_eq!(empty.state, State::Empty);
        assert!(empty.members.is_empty());
        assert_eq!(empty.protocol_type, "consumer");
        assert_eq!(c.list().len(), 1);
        tokio::time::advance(EMPTY_GROUP_RETENTION).await;
        c.sweep(Instant::now());
        assert!(c.describe("g").is_none());
        // A group deleted while known says so; one never seen does not.
        assert_eq!(c.delete("g"), Ok(false));
    }

    #[tokio::test(start_paused = true)]
    async fn empty_groups_are_bounded() {
        let c = coordinator();
        for i in 0..EMPTY_GROUPS_MAX + 5 {
            let g = format!("g{i}");
            let a = c.join(join(&g, "", false)).await;
            c.sync(&g, 1, &a.member_id, vec![]).await;
            c.leave(&g, std::slice::from_ref(&a.member_id));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        c.sweep(Instant::now());
        assert_eq!(c.list().len(), EMPTY_GROUPS_MAX);
        assert!(c.describe("g0").is_none(), "the oldest went first");
        assert!(c.describe(&format!("g{}", EMPTY_GROUPS_MAX + 4)).is_some());
    }

    #[test]
    fn bad_joins_are_refused_with_their_error() {
        let c = coordinator();
        let mut j = join("g", "", false);
        j.session_timeout_ms = 1_000;
        assert_eq!(
            c.join_now(j, Instant::now()).unwrap_err().error,
            ResponseError::InvalidSessionTimeout.code()
        );
        assert_eq!(
            c.join_now(join("g", "stranger", false), Instant::now())
                .unwrap_err()
                .error,
            ResponseError::UnknownMemberId.code()
        );
        assert_eq!(
            c.join_now(join("", "", false), Instant::now())
                .unwrap_err()
                .error,
            ResponseError::InvalidGroupId.code()
        );
    }

    #[test]
    fn commits_need_the_current_generation_unless_the_group_has_no_members() {
        let c = coordinator();
        assert_eq!(c.may_commit("g", -1, ""), None);
        assert_eq!(
            c.may_commit("g", 3, "m"),
            Some(ResponseError::UnknownMemberId)
        );
    }

    #[test]
    fn consumer_assignments_decode_and_other_bytes_do_not() {
        use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
        use kafka_protocol::messages::{ConsumerProtocolAssignment, TopicName};
        use kafka_protocol::protocol::{Encodable, StrBytes};
        for version in [0i16, 1, 3] {
            let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
                TopicPartition::default()
                    .with_topic(TopicName(StrBytes::from_static_str("orders.v1")))
                    .with_partitions(vec![0, 2]),
            ]);
            let mut buf = bytes::BytesMut::new();
            buf.extend_from_slice(&version.to_be_bytes());
            a.encode(&mut buf, version).unwrap();
            assert_eq!(
                decode_assignment(&buf),
                Some(vec![("orders.v1".to_string(), vec![0, 2])]),
                "version {version}"
            );
        }
        assert_eq!(decode_assignment(b""), None);
        assert_eq!(decode_assignment(b"\x00\x00\xff"), None);
    }
}
