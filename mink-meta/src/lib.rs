//! `mink-meta`: cluster metadata.
//!
//! - [`state`]: the deterministic state machine (`MetaState`, `MetaCommand`): nodes,
//!   the lease, databases, tables and schema versions, partitions, buckets with their
//!   leader and epoch, the writer-id allocator, producer and group offsets, KV and lake
//!   snapshot pointers. Every command is validated before it is appended.
//! - [`node`]: `MetaNode`, one node's view of the metadata log (applied index, waiting
//!   on it), its heartbeat, the lease and the lease holder's duties.
//!
//! Architecture invariant: every change to cluster state is an entry of the metadata
//! log (an `ObjectLog`), validated before it is appended; nodes coordinate through
//! object storage only, never by talking to each other. mink-meta knows nothing of
//! tablets or protocols.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod config;
pub mod node;
pub mod state;

pub use config::MetaConfig;
pub use node::MetaNode;
pub use state::{BucketState, MetaCommand, MetaState, NodeInfo, PartitionInfo, TableInfo};
