//! `mink-types`: the vocabulary every other Mink crate shares.
//!
//! It owns names and their validation ([`names`]), data types and their Arrow mapping
//! ([`types`]), schemas and schema ids ([`schema`]), table descriptors, properties and
//! merge-engine configuration ([`table`]), change types ([`change`]), a batch's IPC
//! encoding as a client sent it ([`ipc`]), the canonical key encoding ([`key`]), the
//! bucketing rules ([`bucketing`]), writer ids and the producer epoch they carry
//! ([`writer`]) and the error type ([`error`]).
//!
//! Architecture invariant: this crate is pure data and pure functions. It knows
//! nothing of object storage, tablets, the network or async; it depends on arrow and
//! serde only, so every layer above can use it without pulling anything in.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod bucketing;
pub mod change;
pub mod error;
pub mod ipc;
pub mod key;
pub mod names;
pub mod partition;
pub mod schema;
pub mod table;
pub mod types;
pub mod writer;

pub use bucketing::{BucketRows, bucket_per_row, hash_bucket, split_by_bucket};
pub use change::ChangeType;
pub use error::{MinkError, Result};
pub use ipc::IpcEncoded;
pub use key::{KeyEncoder, KeyValue, ValueEncoder, decode_key, encode_values};
pub use names::{
    BucketId, DatabaseName, PartitionId, PartitionName, TableBucket, TableId, TableName, TablePath,
    validate_name, validate_table_name,
};
pub use partition::{PartitionRows, split_by_partition};
pub use schema::{Column, Schema, SchemaId};
pub use table::{
    AggFunction, BucketingRule, ChangelogImage, Compression, DeleteBehavior, LAKE_SYSTEM_COLUMNS,
    LakePartition, LakeProperties, LogTtl, MergeEngine, TableDescriptor, TableProperties,
    TimeTransform,
};
pub use types::DataType;
pub use writer::{
    KAFKA_SEQUENCE_MODULUS, WRITER_BASE_MAX, WRITER_EPOCH_SHIFT, kafka_sequence_after,
    kafka_sequence_ahead, split_writer, writer_id,
};
