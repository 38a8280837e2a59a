//! `mink-node`: the node service that both listeners front, and its binaries.
//!
//! It owns, as it grows, the tablet manager, the write path of spec/writes.txt,
//! table routing and forwarding, reads and actions, and the `mink-node` and `mink`
//! binaries. Today it owns configuration loading ([`config`]) and the node's
//! start-up and shutdown ([`node`]).
//!
//! Architecture invariant: mink-node is the only crate that knows every other one. It
//! implements the handler traits the protocol crates define; nothing depends on it.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod admin;
pub mod admission;
pub mod config;
pub mod console;
pub mod forward;
pub mod iceberg_rest;
pub mod node;
pub mod service;
mod tablets;

pub use config::MinkConfig;
