//! `mink-kafka`: the Kafka wire-protocol listener.
//!
//! - [`server`]: accepting connections, one task per connection, pipelined requests
//!   answered in order, idle and malformed connections closed.
//! - [`frame`]: the 4-byte length framing, `max_request_bytes` checked first.
//! - [`versions`]: the APIs and versions served; ApiVersions with the KIP-511 fallback.
//! - `api`: one module per group of requests (metadata, produce, fetch, offsets,
//!   topics, groups) and the refusals of what is not built.
//! - [`groups`]: the classic consumer-group coordinator (membership, rebalances).
//! - [`records`]: record batches v2 to and from Arrow rows of a topic table.
//! - [`refused`]: idempotent producers' batches refused as not persisted, so that
//!   a batch behind one is refused alike and retried in order.
//! - [`handler`]: the [`KafkaHandler`] trait `mink-node` implements.
//! - [`config`]: settings and limits.
//!
//! Architecture invariant: this crate speaks Kafka and nothing else. Topics are log
//! tables behind the handler trait; it never touches storage or metadata itself.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod api;
pub mod config;
pub mod frame;
pub mod groups;
pub mod handler;
pub mod records;
pub mod refused;
pub mod server;
pub mod topic_config;
pub mod versions;

pub use config::KafkaConfig;
pub use handler::KafkaHandler;
