//! The classic consumer-group coordinator: group membership and rebalances, in memory
//! on the lease holder (spec/protocols.txt). Committed offsets are not here: they go
//! through the metadata log (the handler's `commit_offsets`), so they survive the
//! coordinator; group state does not, and is rebuilt by rebalances after the lease
//! moves (members get UNKNOWN_MEMBER_ID and join again).
//!
//! States: Empty, PreparingRebalance, CompletingRebalance, Stable.
//! - A JoinGroup (a new member, or a known one rejoining with other metadata) moves the
//!   group to PreparingRebalance; the join waits until every member has rejoined, or
//!   until the longest rebalance timeout of the members passed (members that did not
//!   rejoin are removed). Then the generation grows, a protocol every member supports
//!   is chosen, the leader gets every member's metadata, and the group is
//!   CompletingRebalance.
//! - A group that was Empty waits `initial_rebalance_delay` (Kafka's
//!   `group.initial.rebalance.delay.ms`) before it completes its first join, and as
//!   long again each time a new member arrived meanwhile (within the rebalance
//!   timeout): consumers that start together make one rebalance, not one each.
//! - The leader's SyncGroup hands out the assignments: Stable.
//! - A member that rejoins with the metadata it joined with while the group is Stable
//!   or CompletingRebalance is answered at once with the current generation, as Kafka
//!   does: clients rejoin after losing track of a join they already completed (a
//!   consumer whose poll returned before its join did), and must not restart the
//!   group's rebalance each time. The leader is answered with every member's
//!   metadata; its SyncGroup in a Stable group is the current assignment again, or,
//!   when it hands out a different one (the topics' partitions changed), a
//!   rebalance.
//! - A member that neither heartbeats nor waits in a join or sync for its session
//!   timeout is removed, as is one that leaves; the rest rebalance.
//! - MEMBER_ID_REQUIRED (KIP-394) only for JoinGroup v4+, whose clients expect it.
//! - A group whose last member left stays Empty for [`EMPTY_GROUP_RETENTION`] (Kafka
//!   describes it as Empty, not Dead, until its cleanup), at most [`EMPTY_GROUPS_MAX`].
//!
//! - Static membership (KIP-345, JoinGroup v5+ with `group.instance.id`): a member
//!   that joins without a member id under an instance id the group knows is that
//!   member restarted. It takes the old member's place under a new member id, with its
//!   assignment; in a Stable group with the metadata it had, that is no rebalance.
//!   The old member id is fenced: its requests (and those of a second live process
//!   under the same instance id) are FENCED_INSTANCE_ID. Static members skip
//!   MEMBER_ID_REQUIRED, as in Kafka; LeaveGroup v3+ removes one by its instance id.

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
    /// JoinGroup v5+: a static member's `group.instance.id`.
    pub group_instance_id: Option<String>,
}

/// A member as the leader's JoinGroup answer shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// Its metadata for the chosen protocol.
    pub metadata: Bytes,
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
    pub members: Vec<JoinedMember>,
    /// JoinGroup v9 (KIP-814): the leader is a static member that restarted into a
    /// Stable group, which keeps its assignment: it learns the members (to watch
    /// the topics' metadata) but must not assign again.
    pub skip_assignment: bool,
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
    pub group_instance_id: Option<String>,
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
    /// A static member's instance id.
    instance_id: Option<String>,
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
    /// While a group that was Empty waits for more members before its join completes.
    initial_delay: Option<InitialDelay>,
    /// It became Empty since [`Coordinator::take_emptied`] last looked.
    emptied: bool,
    /// Static members: instance id → member id.
    instances: HashMap<String, String>,
}

/// The wait of a group that was Empty before it completes its join.
struct InitialDelay {
    /// The join completes then, unless members arrived meanwhile.
    until: Instant,
    /// The members when the wait (re)started: more at `until` means wait again.
    members: usize,
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
            initial_delay: None,
            emptied: false,
            instances: HashMap::new(),
        }
    }

    /// A static member restarted (a join without a member id under a known instance
    /// id): `old` gives way to `new`, keeping its assignment and leadership. Waits of
    /// the old process are answered FENCED_INSTANCE_ID.
    fn replace_static(&mut self, instance: &str, old: &str, new: &str) {
        if let Some(mut m) = self.members.remove(old) {
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined::error(ResponseError::FencedInstanceId, old));
            }
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(Synced::error(ResponseError::FencedInstanceId));
            }
            self.members.insert(new.to_string(), m);
        }
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(new.to_string());
        }
        self.instances.insert(instance.to_string(), new.to_string());
    }

    /// The answer to a join of member `id` in the current generation: the leader gets
    /// every member's metadata for the chosen protocol.
    fn joined(&self, id: &str) -> Joined {
        let protocol = self.protocol.clone().unwrap_or_default();
        let leader = self.leader.clone().unwrap_or_default();
        Joined {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: Some(protocol.clone()),
            members: if id == leader {
                self.members
                    .iter()
                    .map(|(id, m)| JoinedMember {
                        member_id: id.clone(),
                        group_instance_id: m.instance_id.clone(),
                        metadata: m.metadata(&protocol),
                    })
                    .collect()
            } else {
                vec![]
            },
            leader,
            member_id: id.to_string(),
            skip_assignment: false,
        }
    }

    /// A join's protocols against the members': the same type, and one every other
    /// member supports.
    #[allow(clippy::result_large_err)]
    fn check_protocols(&self, req: &Join) -> Result<(), Joined> {
        if self.members.is_empty() {
            return Ok(());
        }
        let same_type = self.protocol_type.as_deref() == Some(req.protocol_type.as_str());
        let common = req.protocols.iter().any(|(name, _)| {
            self.members
                .iter()
                .filter(|(id, _)| **id != req.member_id)
                .all(|(_, m)| m.supports(name))
        });
        if same_type && common {
            Ok(())
        } else {
            Err(Joined::error(
                ResponseError::InconsistentGroupProtocol,
                &req.member_id,
            ))
        }
    }

    /// Whether `assignments` (a leader's SyncGroup) hands every member what it holds.
    fn assigns_as_now(&self, assignments: &[(String, Bytes)]) -> bool {
        self.members.iter().all(|(id, m)| {
            let given = assignments.iter().find(|(to, _)| to == id);
            given.map_or(m.assignment.is_empty(), |(_, a)| *a == m.assignment)
        })
    }

    /// The last member is gone. The protocol type stays, for DescribeGroups (a member
    /// of another type may still join an Empty group).
    fn become_empty(&mut self, now: Instant) {
        self.state = State::Empty;
        self.protocol = None;
        self.leader = None;
        self.empty_since = Some(now);
        self.initial_delay = None;
        self.emptied = true;
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
            && self.initial_delay.is_none()
            && self.members.values().all(|m| m.join.is_some())
        {
            self.complete_join(now);
        }
    }

    /// Ends a rebalance: members that did not rejoin are removed, the generation
    /// grows, the protocol and the leader are chosen, and every join is answered.
    fn complete_join(&mut self, now: Instant) {
        self.members.retain(|_, m| m.join.is_some());
        let members = &self.members;
        self.instances.retain(|_, id| members.contains_key(id));
        self.rebalance_deadline = None;
        self.initial_delay = None;
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
        self.leader = Some(leader);
        self.protocol = Some(protocol);
        self.state = State::CompletingRebalance;
        let answers: Vec<(oneshot::Sender<Joined>, Joined)> = self
            .members
            .iter_mut()
            .filter_map(|(id, m)| {
                m.expires = now + m.session_timeout;
                m.assignment = Bytes::new();
                m.join.take().map(|tx| (tx, id.clone()))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(tx, id)| (tx, self.joined(&id)))
            .collect();
        for (tx, answer) in answers {
            let _ = tx.send(answer);
        }
    }

    /// A member left or expired: the others rebalance.
    fn remove(&mut self, id: &str, now: Instant) {
        if let Some(mut m) = self.members.remove(id) {
            // A join or sync it waits in ends now, as Kafka answers a removed member.
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined::error(ResponseError::UnknownMemberId, id));
            }
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(Synced::error(ResponseError::UnknownMemberId));
            }
            if let Some(instance) = m.instance_id {
                self.instances.remove(&instance);
            }
        }
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
    initial_rebalance_delay: Duration,
    next_member: std::sync::atomic::AtomicU64,
}

/// Group ids longer than this are refused.
pub const GROUP_ID_BYTES_MAX: usize = 256;

impl Coordinator {
    /// A coordinator with the group settings of `config`.
    pub fn new(config: &crate::KafkaConfig) -> Self {
        Self {
            groups: Mutex::new(BTreeMap::new()),
            session_timeout_min_ms: config.session_timeout_min_ms,
            session_timeout_max_ms: config.session_timeout_max_ms,
            initial_rebalance_delay: Duration::from_millis(config.initial_rebalance_delay_ms),
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

    // The errors are the answers themselves, built once per join: not worth a box.
    #[allow(clippy::result_large_err)]
    fn check_join(&self, req: &Join) -> Result<(), Joined> {
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
        Ok(())
    }

    /// The member id a join is for: a new one (or MEMBER_ID_REQUIRED first), the
    /// one it names, or, for a static member that restarted, a new one in the old
    /// member's place (then `true`).
    #[allow(clippy::result_large_err)]
    fn member_for(
        &self,
        group: &mut Group,
        req: &Join,
        now: Instant,
    ) -> Result<(String, bool), Joined> {
        let known = req
            .group_instance_id
            .as_ref()
            .and_then(|i| group.instances.get(i).cloned());
        match (&req.group_instance_id, known) {
            (Some(_), Some(known)) if !req.member_id.is_empty() && known != req.member_id => Err(
                Joined::error(ResponseError::FencedInstanceId, &req.member_id),
            ),
            (Some(instance), Some(old)) if req.member_id.is_empty() => {
                let id = self.new_member_id(&req.client_id);
                tracing::info!(group = %req.group, %instance, %old, new = %id, "kafka static member rejoined");
                group.replace_static(instance, &old, &id);
                Ok((id, true))
            }
            _ if req.member_id.is_empty() => {
                let id = self.new_member_id(&req.client_id);
                if req.member_id_required && req.group_instance_id.is_none() {
                    let session = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
                    group.pending.insert(id.clone(), now + session);
                    return Err(Joined::error(ResponseError::MemberIdRequired, &id));
                }
                Ok((id, false))
            }
            _ if group.members.contains_key(&req.member_id)
                || group.pending.contains_key(&req.member_id) =>
            {
                Ok((req.member_id.clone(), false))
            }
            _ => Err(Joined::error(
                ResponseError::UnknownMemberId,
                &req.member_id,
            )),
        }
    }

    #[allow(clippy::result_large_err)]
    fn join_now(&self, req: Join, now: Instant) -> Result<oneshot::Receiver<Joined>, Joined> {
        self.check_join(&req)?;
        let session = req.session_timeout_ms.max(0) as u64;
        let mut groups = self.lock();
        let group = groups.entry(req.group.clone()).or_insert_with(Group::new);
        group.check_protocols(&req)?;
        let (member_id, restarted) = self.member_for(group, &req, now)?;
        group.pending.remove(&member_id);
        let (tx, rx) = oneshot::channel();
        let session_timeout = Duration::from_millis(session);
        let rebalance_timeout = Duration::from_millis(
            u64::try_from(req.rebalance_timeout_ms)
                .ok()
                .filter(|ms| *ms > 0)
                .unwrap_or(session),
        );
        // A member rejoining with what it joined with while no rebalance is under
        // way: the current generation, at once (see the module's notes). A restarted
        // static member only in a Stable group: while CompletingRebalance the leader
        // assigns to the old member id, so the group rebalances.
        let settled = match group.state {
            State::Stable => true,
            State::CompletingRebalance => !restarted,
            _ => false,
        };
        // A restarted static member's metadata differs from its old process's (the
        // Java client's carries its generation and owned partitions): in a Stable
        // group it takes its place without a rebalance as long as it speaks the
        // group's protocol, as Kafka decides it.
        let chosen = group.protocol.clone().unwrap_or_default();
        if let Some(m) = group.members.get_mut(&member_id)
            && settled
            && (m.protocols == req.protocols
                || (restarted && req.protocols.iter().any(|(name, _)| *name == chosen)))
        {
            m.protocols = req.protocols;
            m.client_id = req.client_id;
            m.client_host = req.client_host;
            m.session_timeout = session_timeout;
            m.rebalance_timeout = rebalance_timeout;
            m.expires = now + session_timeout;
            let mut joined = group.joined(&member_id);
            joined.skip_assignment = restarted && joined.leader == member_id;
            let _ = tx.send(joined);
            return Ok(rx);
        }
        if let Some(instance) = &req.group_instance_id {
            group.instances.insert(instance.clone(), member_id.clone());
        }
        // A member that now names another instance id (or none) gives up the old one.
        let previous = group
            .members
            .get(&member_id)
            .and_then(|m| m.instance_id.clone())
            .filter(|old| Some(old) != req.group_instance_id.as_ref());
        if let Some(old) = previous {
            group.instances.remove(&old);
        }
        let member = group.members.entry(member_id).or_insert_with(|| Member {
            instance_id: req.group_instance_id.clone(),
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
        member.instance_id = req.group_instance_id;
        member.join = Some(tx);
        group.protocol_type = Some(req.protocol_type);
        if group.state == State::Empty && !self.initial_rebalance_delay.is_zero() {
            group.initial_delay = Some(InitialDelay {
                until: now + self.initial_rebalance_delay,
                members: group.members.len(),
            });
        }
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
                    // A leader handing out something new (it rejoined because the
                    // topics' partitions changed): every member must learn it.
                    let leads = group.leader.as_deref() == Some(member_id);
                    if leads && !assignments.is_empty() && !group.assigns_as_now(&assignments) {
                        group.prepare_rebalance(now);
                        return Synced::error(ResponseError::RebalanceInProgress);
                    }
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

    /// Whether a request naming `instance` (a static member's instance id) comes from
    /// a process that was replaced: FENCED_INSTANCE_ID when the instance now belongs
    /// to another member id.
    pub fn fenced(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
    ) -> Option<ResponseError> {
        let instance = instance?;
        let groups = self.lock();
        let known = groups.get(group_id)?.instances.get(instance)?;
        (known != member_id).then_some(ResponseError::FencedInstanceId)
    }

    /// The member a LeaveGroup v3+ entry names: by instance id when it has one (an
    /// empty member id is allowed then), else by member id.
    pub fn leaving_member(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
    ) -> Result<String, ResponseError> {
        let Some(instance) = instance else {
            return Ok(member_id.to_string());
        };
        let groups = self.lock();
        let known = groups
            .get(group_id)
            .and_then(|g| g.instances.get(instance))
            .ok_or(ResponseError::UnknownMemberId)?;
        if !member_id.is_empty() && known != member_id {
            return Err(ResponseError::FencedInstanceId);
        }
        Ok(known.clone())
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

    /// The groups with members: their committed offsets do not expire (KIP-211).
    pub fn live_groups(&self) -> std::collections::BTreeSet<String> {
        self.lock()
            .iter()
            .filter(|(_, g)| !g.members.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The groups whose last member left since the previous call (their offsets'
    /// retention counts from now).
    pub fn take_emptied(&self) -> Vec<String> {
        self.lock()
            .iter_mut()
            .filter_map(|(id, g)| {
                (std::mem::take(&mut g.emptied) && g.members.is_empty()).then(|| id.clone())
            })
            .collect()
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
                    group_instance_id: m.instance_id.clone(),
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
            if let Some(wait) = &mut group.initial_delay
                && wait.until <= now
            {
                let deadline = group.rebalance_deadline.unwrap_or(now);
                if group.members.len() > wait.members && now < deadline {
                    wait.until = (now + self.initial_rebalance_delay).min(deadline);
                    wait.members = group.members.len();
                } else {
                    group.initial_delay = None;
                    group.try_complete_join(now);
                }
            }
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
            group_instance_id: None,
        }
    }

    fn coordinator() -> Coordinator {
        Coordinator::new(&crate::KafkaConfig {
            initial_rebalance_delay_ms: 0,
            ..Default::default()
        })
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
            vec![JoinedMember {
                member_id: id.clone(),
                group_instance_id: None,
                metadata: Bytes::from_static(b"meta"),
            }]
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

    /// B syncs generation 2 and waits; A, the leader, hands out `a` and `b`. Returns
    /// B's answer.
    async fn sync_both(c: &std::sync::Arc<Coordinator>, a: &str, b: &str) -> Synced {
        let c3 = c.clone();
        let b_id = b.to_string();
        let b_sync = tokio::spawn(async move { c3.sync("g", 2, &b_id, vec![]).await });
        tokio::task::yield_now().await;
        c.sync("g", 2, a, assignments(a, b)).await;
        b_sync.await.unwrap()
    }

    /// A and B in one Stable group of generation 2, A leading, each assigned `a`/`b`.
    async fn two_stable_members(c: &std::sync::Arc<Coordinator>) -> (String, String) {
        let a = c.join(join("g", "", false)).await;
        c.sync("g", 1, &a.member_id, vec![]).await;
        let c2 = c.clone();
        let b = tokio::spawn(async move { c2.join(join("g", "", false)).await });
        tokio::task::yield_now().await;
        let a2 = c.join(join("g", &a.member_id, false)).await;
        let b = b.await.unwrap();
        assert_eq!((a2.generation, b.generation), (2, 2));
        let synced = sync_both(c, &a.member_id, &b.member_id).await;
        assert_eq!(synced.assignment, Bytes::from_static(b"b"));
        (a.member_id, b.member_id)
    }

    fn assignments(a: &str, b: &str) -> Vec<(String, Bytes)> {
        vec![
            (a.to_string(), Bytes::from_static(b"a")),
            (b.to_string(), Bytes::from_static(b"b")),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejoin_with_the_same_metadata_does_not_rebalance() {
        let c = std::sync::Arc::new(coordinator());
        let (a, b) = two_stable_members(&c).await;
        // The follower rejoins (kafka-python does when its poll returned before its
        // join did): the current generation at once, and nobody else is disturbed.
        let again = c.join(join("g", &b, false)).await;
        assert_eq!((again.error, again.generation), (0, 2));
        assert_eq!(again.leader, a);
        assert!(again.members.is_empty());
        assert_eq!(c.heartbeat("g", 2, &a), None);
        let synced = c.sync("g", 2, &b, vec![]).await;
        assert_eq!(
            (synced.error, synced.assignment),
            (0, Bytes::from_static(b"b"))
        );
        // The leader rejoins: every member's metadata, so it can assign again; the
        // same assignment keeps the group as it is.
        let led = c.join(join("g", &a, false)).await;
        assert_eq!((led.generation, led.members.len()), (2, 2));
        let synced = c.sync("g", 2, &a, assignments(&a, &b)).await;
        assert_eq!(
            (synced.error, synced.assignment),
            (0, Bytes::from_static(b"a"))
        );
        assert_eq!(c.describe("g").unwrap().state, State::Stable);
        // A different one (the partitions changed) is a rebalance everyone joins.
        c.join(join("g", &a, false)).await;
        let moved = vec![
            (a.clone(), Bytes::from_static(b"ab")),
            (b.clone(), Bytes::new()),
        ];
        let refused = c.sync("g", 2, &a, moved).await;
        assert_eq!(refused.error, ResponseError::RebalanceInProgress.code());
        assert_eq!(
            c.heartbeat("g", 2, &b),
            Some(ResponseError::RebalanceInProgress)
        );
        let c2 = c.clone();
        let b2 = tokio::spawn({
            let b = b.clone();
            async move { c2.join(join("g", &b, false)).await }
        });
        let a3 = c.join(join("g", &a, false)).await;
        assert_eq!((a3.generation, b2.await.unwrap().generation), (3, 3));
        // New metadata (another subscription) rebalances too.
        let mut other = join("g", &b, false);
        other.protocols = vec![("range".into(), Bytes::from_static(b"other"))];
        let c3 = c.clone();
        let b3 = tokio::spawn(async move { c3.join(other).await });
        tokio::task::yield_now().await;
        assert_eq!(c.describe("g").unwrap().state, State::PreparingRebalance);
        let a4 = c.join(join("g", &a, false)).await;
        assert_eq!((a4.generation, b3.await.unwrap().generation), (4, 4));
    }

    fn static_join(member: &str, instance: &str) -> Join {
        Join {
            group_instance_id: Some(instance.into()),
            ..join("g", member, true)
        }
    }

    /// Static members A (`i-a`, leading) and B (`i-b`) joining group `g`, no
    /// MEMBER_ID_REQUIRED round for them: A's first join, A's rejoin and B's join,
    /// both in generation 2.
    async fn two_static_members(c: &std::sync::Arc<Coordinator>) -> (Joined, Joined, Joined) {
        let a = c.join(static_join("", "i-a")).await;
        assert_eq!((a.error, a.generation), (0, 1));
        c.sync("g", 1, &a.member_id, vec![]).await;
        let c2 = c.clone();
        let b = tokio::spawn(async move { c2.join(static_join("", "i-b")).await });
        tokio::task::yield_now().await;
        let a2 = c.join(static_join(&a.member_id, "i-a")).await;
        (a, a2, b.await.unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_static_member_takes_its_place_without_a_rebalance() {
        let c = std::sync::Arc::new(coordinator());
        let (a, a2, b) = two_static_members(&c).await;
        assert_eq!((a2.generation, b.generation), (2, 2));
        let instances: Vec<_> = a2
            .members
            .iter()
            .map(|m| m.group_instance_id.clone())
            .collect();
        assert_eq!(instances, [Some("i-a".into()), Some("i-b".into())]);
        sync_both(&c, &a.member_id, &b.member_id).await;
        // B's process restarts: a join without a member id, under its instance id,
        // with other metadata (the Java client's carries its generation).
        let mut restart = static_join("", "i-b");
        restart.protocols = vec![("range".into(), Bytes::from_static(b"meta, gen -1"))];
        let b2 = c.join(restart).await;
        assert_eq!((b2.error, b2.generation), (0, 2), "no rebalance");
        assert_ne!(b2.member_id, b.member_id);
        assert!(!b2.skip_assignment, "a follower assigns nothing anyway");
        let synced = c.sync("g", 2, &b2.member_id, vec![]).await;
        assert_eq!(
            synced.assignment,
            Bytes::from_static(b"b"),
            "its old assignment"
        );
        assert_eq!(c.heartbeat("g", 2, &a.member_id), None);
        assert_eq!(c.describe("g").unwrap().members.len(), 2, "no ghost member");
        // The old process is fenced; so is a second live process joining with the
        // old id.
        assert_eq!(
            c.fenced("g", &b.member_id, Some("i-b")),
            Some(ResponseError::FencedInstanceId)
        );
        assert_eq!(c.fenced("g", &b2.member_id, Some("i-b")), None);
        let dup = c.join(static_join(&b.member_id, "i-b")).await;
        assert_eq!(dup.error, ResponseError::FencedInstanceId.code());
        // LeaveGroup by instance id removes it; the group rebalances.
        assert_eq!(
            c.leaving_member("g", "", Some("i-b")),
            Ok(b2.member_id.clone())
        );
        assert_eq!(
            c.leaving_member("g", &b.member_id, Some("i-b")),
            Err(ResponseError::FencedInstanceId)
        );
        assert_eq!(
            c.leave("g", std::slice::from_ref(&b2.member_id)),
            vec![None]
        );
        assert_eq!(
            c.leaving_member("g", "", Some("i-b")),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            c.heartbeat("g", 2, &a.member_id),
            Some(ResponseError::RebalanceInProgress)
        );
    }

    /// KIP-814 (JoinGroup v9): a static leader restarting into a Stable group learns
    /// the members and that it must not assign; its SyncGroup gets its assignment.
    /// A dynamic leader rejoining is not told to skip.
    #[tokio::test(start_paused = true)]
    async fn a_restarted_static_leader_is_told_to_skip_the_assignment() {
        let c = std::sync::Arc::new(coordinator());
        let (a, a2, b) = two_static_members(&c).await;
        assert_eq!(a2.leader, a.member_id);
        assert!(!a2.skip_assignment, "a rebalance: the leader assigns");
        sync_both(&c, &a.member_id, &b.member_id).await;
        let a3 = c.join(static_join("", "i-a")).await;
        assert_eq!((a3.error, a3.generation), (0, 2), "no rebalance");
        assert_eq!(a3.leader, a3.member_id, "it still leads, under its new id");
        assert!(a3.skip_assignment);
        assert_eq!(a3.members.len(), 2, "it learns the members");
        let synced = c.sync("g", 2, &a3.member_id, vec![]).await;
        assert_eq!(
            (synced.error, synced.assignment),
            (0, Bytes::from_static(b"a"))
        );
        assert_eq!(c.heartbeat("g", 2, &b.member_id), None, "B kept going");
    }

    #[tokio::test(start_paused = true)]
    async fn consumers_starting_together_make_one_rebalance() {
        let c = std::sync::Arc::new(Coordinator::new(&crate::KafkaConfig::default()));
        let delay = Duration::from_millis(3_000);
        let step = SWEEP_EVERY;
        let sweep_for = |c: std::sync::Arc<Coordinator>, d: Duration| async move {
            let end = Instant::now() + d;
            while Instant::now() < end {
                tokio::time::advance(step).await;
                c.sweep(Instant::now());
            }
        };
        let c1 = c.clone();
        let a = tokio::spawn(async move { c1.join(join("g", "", false)).await });
        sweep_for(c.clone(), Duration::from_millis(1_000)).await;
        assert!(!a.is_finished(), "a new group waits for more members");
        let c2 = c.clone();
        let b = tokio::spawn(async move { c2.join(join("g", "", false)).await });
        // At the first delay's end B had arrived: the group waits once more.
        sweep_for(c.clone(), delay).await;
        assert!(!a.is_finished() && !b.is_finished());
        sweep_for(c.clone(), delay).await;
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!(
            (a.generation, b.generation),
            (1, 1),
            "one rebalance for both"
        );
        assert_eq!(a.members.len() + b.members.len(), 2);
        // A group that is not new does not wait: a third member rebalances at once
        // when the others rejoin.
        let leader = if a.members.is_empty() { &b } else { &a };
        let follower = if a.members.is_empty() { &a } else { &b };
        c.sync("g", 1, &leader.member_id, vec![]).await;
        c.sync("g", 1, &follower.member_id, vec![]).await;
        let c3 = c.clone();
        let third = tokio::spawn(async move { c3.join(join("g", "", false)).await });
        tokio::task::yield_now().await;
        let c4 = c.clone();
        let f = follower.member_id.clone();
        let f = tokio::spawn(async move { c4.join(join("g", &f, false)).await });
        let l = c.join(join("g", &leader.member_id, false)).await;
        assert_eq!(l.generation, 2);
        assert_eq!(third.await.unwrap().generation, 2);
        assert_eq!(f.await.unwrap().generation, 2);
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
