//! `mink-flight`: the Arrow Flight adapter and the Rust client.
//!
//! It owns, as it grows, the JSON descriptors, tickets and actions, the gRPC status
//! mapping, the `mink-applied-index` headers, the Flight server over a handler trait
//! it defines, and the Rust client (client-side routing, one idempotent sequence per
//! bucket, retries on NotLeader). Today it holds its configuration.
//!
//! Architecture invariant: this crate speaks Flight and nothing else. It never
//! touches storage or metadata; `mink-node` implements its handler trait.

pub mod config;

pub use config::FlightConfig;
