//! `mink-kafka`: the Kafka wire-protocol listener.
//!
//! It owns, as it grows, framing, version negotiation, request dispatch, record-batch
//! conversion to and from Arrow rows and the classic group coordinator, over a handler
//! trait it defines. Today it holds its configuration and the limits of
//! spec/protocols.txt.
//!
//! Architecture invariant: this crate speaks Kafka and nothing else. Topics are log
//! tables behind the handler trait; it never touches storage or metadata itself.

pub mod config;

pub use config::KafkaConfig;
