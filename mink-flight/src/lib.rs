//! `mink-flight`: the Arrow Flight adapter.
//!
//! - [`protocol`]: the JSON descriptors, per-batch metadata, tickets and results.
//! - [`actions`]: the typed action protocol: every action's request and answer, and
//!   the one list of their names (Arrow-free).
//! - [`projection`]: the columns a read answers (a ticket's `columns`).
//! - [`filter`]: the rows a read answers (a ticket's `filter`), evaluated on the node.
//! - [`server`]: the Flight server over the [`server::MinkService`] trait the node
//!   implements; gRPC status mapping; the `mink-applied-index` headers.
//! - [`client`]: the Rust client (client-side routing, idempotent writes with retries).
//!
//! Architecture invariant: this crate speaks Flight and nothing else. It never
//! touches storage or metadata; `mink-node` implements its service trait.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod actions;
pub mod client;
pub mod config;
pub mod filter;
pub mod projection;
pub mod protocol;
pub mod server;

pub use client::MinkClient;
pub use config::FlightConfig;
pub use server::{FlightServer, MinkService, READ_COMPRESSION_HEADER};
