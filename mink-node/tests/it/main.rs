//! mink-node's integration tests, one binary: each file is a module (one test binary
//! links the node once, where ten linked it ten times), sharing `common`. Filter by
//! module: `cargo nextest run -p mink-node --test it lake::`.

mod common;

mod chaos;
mod client;
mod contract;
mod cost;
mod edges;
mod kafka_fuzz;
mod kafka_wire;
mod kill;
mod lake;
mod resilience;
