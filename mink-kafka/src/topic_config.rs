//! Topic configs as CreateTopics sends them and DescribeConfigs shows them.
//!
//! Frameworks create their topics with configs (Kafka Connect, Flink, Debezium send
//! `min.insync.replicas`, `retention.bytes=-1`, `segment.bytes`, `compression.type`,
//! `message.timestamp.type`, ...). Each config Kafka defines for a topic is one of:
//! - **applied**: `retention.ms` (the table's `log_ttl`), `max.message.bytes` (the
//!   topic's batch limit, within the listener's), `message.timestamp.type`
//!   (`LogAppendTime` stamps fetched batches with their commit time),
//!   `cleanup.policy` (`compact` makes the topic a primary-key table keyed by the
//!   record key: docs/kafka.md, "Compacted topics");
//! - **kept**: accepted when its value is one Mink honours, and shown by
//!   DescribeConfigs: replication and durability settings (the object store's: every
//!   acknowledged write is durable), segment, flush and index settings (Mink has none
//!   of these files), `retention.bytes=-1`, `compression.type` `producer` or
//!   `uncompressed` (fetched batches are uncompressed);
//! - **refused**: anything else, and values Mink cannot honour, as INVALID_CONFIG
//!   naming the key (`cleanup.policy=compact,delete` among them).
//!
//! Applied and kept configs other than `retention.ms` are stored with the table as
//! custom properties (`kafka.` + name: `mink_types::table::TableProperties::custom`).

use std::collections::BTreeMap;

/// The prefix of a topic config among a table's custom properties.
pub const PREFIX: &str = "kafka.";

/// `message.timestamp.type`'s value that stamps batches with their commit time.
pub const LOG_APPEND_TIME: &str = "LogAppendTime";

/// The custom properties holding the configs the produce and fetch paths read (keys
/// written out, so that those paths build no string).
const MAX_MESSAGE_BYTES_KEY: &str = "kafka.max.message.bytes";
const TIMESTAMP_TYPE_KEY: &str = "kafka.message.timestamp.type";
const CLEANUP_POLICY_KEY: &str = "kafka.cleanup.policy";

/// `cleanup.policy`'s value that makes a topic a primary-key table.
pub const COMPACT: &str = "compact";

/// Whether a topic is compacted, from its table's custom properties.
pub fn is_compacted(custom: &BTreeMap<String, String>) -> bool {
    custom.get(CLEANUP_POLICY_KEY).map(String::as_str) == Some(COMPACT)
}

/// Whether a topic's records carry their commit time, from its table's custom
/// properties.
pub fn is_log_append_time(custom: &BTreeMap<String, String>) -> bool {
    custom.get(TIMESTAMP_TYPE_KEY).map(String::as_str) == Some(LOG_APPEND_TIME)
}

/// A topic's own `max.message.bytes`, from its table's custom properties.
pub fn max_message_bytes(custom: &BTreeMap<String, String>) -> Option<usize> {
    custom.get(MAX_MESSAGE_BYTES_KEY)?.parse().ok()
}

/// A config value's type, as DescribeConfigs names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
}

/// What CreateTopics' configs mean for a new topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicConfigs {
    /// `retention.ms`: the table's `log_ttl` (-1: forever).
    pub retention_ms: Option<i64>,
    /// Every other accepted config, as given.
    pub kept: BTreeMap<String, String>,
}

impl TopicConfigs {
    /// `cleanup.policy=compact`: the topic is a primary-key table.
    pub fn compacted(&self) -> bool {
        self.kept.get("cleanup.policy").map(String::as_str) == Some(COMPACT)
    }
}

fn int(name: &str, value: &str, min: i64, max: i64) -> Result<(), String> {
    match value.parse::<i64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(()),
        _ => Err(format!(
            "{name}={value}: give a whole number within {min}..={max}"
        )),
    }
}

fn one_of(name: &str, value: &str, allowed: &[&str], why: &str) -> Result<(), String> {
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{name}={value} is not supported ({}; {why})",
            allowed.join(" or ")
        ))
    }
}

/// The type of a config Mink accepts, or `None` for one it refuses whatever the
/// value.
pub fn config_type(name: &str) -> Option<ConfigType> {
    Some(match name {
        "retention.ms"
        | "segment.ms"
        | "segment.jitter.ms"
        | "flush.ms"
        | "flush.messages"
        | "file.delete.delay.ms"
        | "retention.bytes"
        | "delete.retention.ms"
        | "min.compaction.lag.ms"
        | "max.compaction.lag.ms"
        | "local.retention.ms"
        | "local.retention.bytes" => ConfigType::Long,
        "max.message.bytes"
        | "min.insync.replicas"
        | "segment.bytes"
        | "segment.index.bytes"
        | "index.interval.bytes" => ConfigType::Int,
        "unclean.leader.election.enable" | "preallocate" | "message.downconversion.enable" => {
            ConfigType::Boolean
        }
        "min.cleanable.dirty.ratio" => ConfigType::Double,
        "cleanup.policy" => ConfigType::List,
        "message.timestamp.type" | "compression.type" => ConfigType::String,
        _ => return None,
    })
}

/// Checks one config's value; the error names the key.
fn check(name: &str, value: &str, message_bytes_max: u64) -> Result<(), String> {
    const I32: i64 = i32::MAX as i64;
    match name {
        "retention.ms" => match value.parse::<i64>() {
            Ok(ms) if ms > 0 || ms == -1 => Ok(()),
            _ => Err(format!(
                "retention.ms={value}: give a positive number of milliseconds or -1 (forever)"
            )),
        },
        "max.message.bytes" => int(name, value, 1, message_bytes_max.min(I32 as u64) as i64),
        "message.timestamp.type" => one_of(
            name,
            value,
            &["CreateTime", LOG_APPEND_TIME],
            "the records' own time or the commit time",
        ),
        "cleanup.policy" => one_of(
            name,
            value,
            &["delete", COMPACT],
            "a topic keeps its records for retention.ms, or is compacted: a primary-key \
             table keyed by the record key; not both",
        ),
        "compression.type" => one_of(
            name,
            value,
            &["producer", "uncompressed"],
            "fetched batches are sent uncompressed",
        ),
        "retention.bytes" | "local.retention.bytes" => one_of(
            name,
            value,
            &["-1"],
            "retention is by time (retention.ms), not by size",
        ),
        "min.insync.replicas" => int(name, value, 1, I32),
        "segment.bytes" => int(name, value, 14, I32),
        "segment.index.bytes" => int(name, value, 8, I32),
        "index.interval.bytes" => int(name, value, 0, I32),
        "segment.ms" | "flush.ms" | "flush.messages" => int(name, value, 1, i64::MAX),
        "segment.jitter.ms"
        | "file.delete.delay.ms"
        | "delete.retention.ms"
        | "min.compaction.lag.ms" => int(name, value, 0, i64::MAX),
        "max.compaction.lag.ms" => int(name, value, 1, i64::MAX),
        "local.retention.ms" => int(name, value, -2, i64::MAX),
        "unclean.leader.election.enable" | "preallocate" | "message.downconversion.enable" => {
            one_of(name, value, &["true", "false"], "a boolean")
        }
        "min.cleanable.dirty.ratio" => match value.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            _ => Err(format!("{name}={value}: give a ratio within 0..=1")),
        },
        _ => Err(format!(
            "{name} is not a topic config Mink keeps (docs/kafka.md lists those it does)"
        )),
    }
}

/// A checked value as it is kept: numbers in their plain form (`+007` is `7`).
fn normal(name: &str, value: &str) -> String {
    match config_type(name) {
        Some(ConfigType::Int | ConfigType::Long) => value
            .parse::<i64>()
            .map_or_else(|_| value.to_string(), |n| n.to_string()),
        Some(ConfigType::Double) => value
            .parse::<f64>()
            .map_or_else(|_| value.to_string(), |n| n.to_string()),
        _ => value.to_string(),
    }
}

/// The configs of a CreateTopics topic (a null value means the default: skipped).
/// A config named twice is refused.
pub fn parse(
    configs: impl IntoIterator<Item = (String, Option<String>)>,
    message_bytes_max: u64,
) -> Result<TopicConfigs, String> {
    let mut out = TopicConfigs::default();
    let mut named = std::collections::BTreeSet::new();
    for (name, value) in configs {
        if !named.insert(name.clone()) {
            return Err(format!("{name} is given twice"));
        }
        let Some(value) = value else { continue };
        check(&name, &value, message_bytes_max)?;
        if name == "retention.ms" {
            out.retention_ms = Some(value.parse().map_err(|_| name.clone())?);
        } else {
            let value = normal(&name, &value);
            out.kept.insert(name, value);
        }
    }
    Ok(out)
}

/// Configs DescribeConfigs shows with their default when a topic has not set them.
pub fn defaults(message_bytes_max: u64) -> [(&'static str, String); 4] {
    [
        ("cleanup.policy", "delete".into()),
        ("message.timestamp.type", "CreateTime".into()),
        ("max.message.bytes", message_bytes_max.to_string()),
        ("min.insync.replicas", "1".into()),
    ]
}

/// IncrementalAlterConfigs' operations.
pub const OP_SET: i8 = 0;
pub const OP_DELETE: i8 = 1;
pub const OP_APPEND: i8 = 2;
pub const OP_SUBTRACT: i8 = 3;

/// What IncrementalAlterConfigs changes of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicAlter {
    /// `retention.ms`: `Some(Some(ms))` set (-1: forever), `Some(None)` back to the
    /// default.
    pub retention_ms: Option<Option<i64>>,
    /// Custom properties (stored keys, `kafka.` + name) set or removed.
    pub custom: BTreeMap<String, Option<String>>,
}

impl TopicAlter {
    pub fn is_empty(&self) -> bool {
        self.retention_ms.is_none() && self.custom.is_empty()
    }
}

/// Why an alteration is refused; both name the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterRefused {
    /// The request itself is malformed (Kafka's INVALID_REQUEST): a config named
    /// twice, SET or APPEND without a value, an operation that does not exist.
    Request(String),
    /// The change cannot be honoured (INVALID_CONFIG).
    Config(String),
}

impl std::fmt::Display for AlterRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Request(why) | Self::Config(why) => f.write_str(why),
        }
    }
}

/// The changes of one IncrementalAlterConfigs resource (name, operation, value) to a
/// topic whose custom properties are `current`. The error names the config: a
/// value refused as at creation, an unknown config, a config named twice, an
/// operation that does not fit it, or a change of `message.timestamp.type` (kept as
/// the topic was created: its owners index the log by it).
pub fn alter(
    current: &BTreeMap<String, String>,
    ops: impl IntoIterator<Item = (String, i8, Option<String>)>,
    message_bytes_max: u64,
) -> Result<TopicAlter, AlterRefused> {
    use AlterRefused::{Config, Request};
    let mut out = TopicAlter::default();
    let mut named = std::collections::BTreeSet::new();
    for (name, op, value) in ops {
        if !named.insert(name.clone()) {
            return Err(Request(format!("{name} is given twice")));
        }
        if !(OP_SET..=OP_SUBTRACT).contains(&op) {
            return Err(Request(format!("{name}: {op} is not a config operation")));
        }
        if matches!(op, OP_SET | OP_APPEND) && value.is_none() {
            return Err(Request(format!("{name}: SET and APPEND need a value")));
        }
        let Some(kind) = config_type(&name) else {
            return Err(Config(format!(
                "{name} is not a topic config Mink keeps (docs/kafka.md lists those it does)"
            )));
        };
        let stored = format!("{PREFIX}{name}");
        // A compacted topic is a primary-key table, a deleting one a log table: the
        // policy stays as the topic was created.
        let policy_now = current
            .get(CLEANUP_POLICY_KEY)
            .map_or("delete", String::as_str);
        let policy = |to: &str| {
            if name == "cleanup.policy" && policy_now != to {
                Err(Config(format!(
                    "cleanup.policy stays {policy_now}, as the topic was created (a compacted \
                     topic is a primary-key table, a deleting one a log table)"
                )))
            } else {
                Ok(())
            }
        };
        let timestamp_type = |to: &str| {
            let now = current
                .get(TIMESTAMP_TYPE_KEY)
                .map_or("CreateTime", String::as_str);
            if name == "message.timestamp.type" && now != to {
                Err(Config(format!(
                    "message.timestamp.type stays {now}, as the topic was created (its log is indexed by it)"
                )))
            } else {
                Ok(())
            }
        };
        match op {
            OP_SET => {
                let value = value.unwrap_or_default();
                check(&name, &value, message_bytes_max).map_err(Config)?;
                timestamp_type(&value)?;
                policy(&value)?;
                if name == "retention.ms" {
                    out.retention_ms = Some(Some(value.parse().map_err(|_| Config(name.clone()))?));
                } else {
                    out.custom.insert(stored, Some(normal(&name, &value)));
                }
            }
            OP_DELETE => {
                timestamp_type("CreateTime")?;
                policy("delete")?;
                if name == "retention.ms" {
                    out.retention_ms = Some(None);
                } else {
                    out.custom.insert(stored, None);
                }
            }
            OP_APPEND | OP_SUBTRACT if kind != ConfigType::List => {
                return Err(Config(format!(
                    "{name}: APPEND and SUBTRACT are for list configs; use SET"
                )));
            }
            // cleanup.policy, the one list config, holds one policy, which stays.
            OP_APPEND => {
                let value = value.unwrap_or_default();
                for item in value.split(',').map(str::trim) {
                    check(&name, item, message_bytes_max).map_err(Config)?;
                    policy(item)?;
                }
            }
            OP_SUBTRACT => {
                return Err(Config(format!(
                    "{name}: a topic's cleanup.policy is {policy_now} and stays so"
                )));
            }
            _ => unreachable!("operations were checked above"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> Result<TopicConfigs, String> {
        parse(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.to_string()))),
            4 << 20,
        )
    }

    #[test]
    fn what_frameworks_send_is_accepted_and_kept() {
        let got = configs(&[
            ("retention.ms", "86400000"),
            ("min.insync.replicas", "2"),
            ("retention.bytes", "-1"),
            ("segment.bytes", "1073741824"),
            ("compression.type", "producer"),
            ("message.timestamp.type", "LogAppendTime"),
            ("max.message.bytes", "1048576"),
            ("unclean.leader.election.enable", "false"),
        ])
        .unwrap();
        assert_eq!(got.retention_ms, Some(86_400_000));
        assert_eq!(got.kept.len(), 7);
        assert_eq!(got.kept["segment.bytes"], "1073741824");
        assert!(!got.kept.contains_key("retention.ms"));
        for name in got.kept.keys() {
            assert!(config_type(name).is_some(), "{name} has a type");
        }
    }

    #[test]
    fn values_mink_cannot_honour_are_refused_naming_the_key() {
        for (name, value) in [
            ("cleanup.policy", "compact,delete"),
            ("retention.bytes", "1000"),
            ("compression.type", "zstd"),
            ("max.message.bytes", "8388608"),
            ("max.message.bytes", "0"),
            ("retention.ms", "0"),
            ("min.insync.replicas", "zero"),
            ("message.timestamp.type", "Sometimes"),
            ("leader.replication.throttled.replicas", "*"),
        ] {
            let err = configs(&[(name, value)]).unwrap_err();
            assert!(err.starts_with(name), "{name}={value}: {err}");
        }
        // The keys the hot paths read are the stored ones.
        for key in [MAX_MESSAGE_BYTES_KEY, TIMESTAMP_TYPE_KEY] {
            let name = key.strip_prefix(PREFIX).unwrap();
            assert!(config_type(name).is_some(), "{key}");
        }
        // Numbers are kept in their plain form; a config named twice is refused.
        let plain = configs(&[("segment.bytes", "+0001024")]).unwrap();
        assert_eq!(plain.kept["segment.bytes"], "1024");
        let twice = configs(&[("segment.ms", "1"), ("segment.ms", "2")]).unwrap_err();
        assert!(twice.starts_with("segment.ms"), "{twice}");
        // A null value is the default: nothing to check.
        let skipped = parse([("cleanup.policy".to_string(), None)], 1024).unwrap();
        assert_eq!(skipped, TopicConfigs::default());
        assert!(
            configs(&[("cleanup.policy", "compact")])
                .unwrap()
                .compacted()
        );
        assert!(
            !configs(&[("cleanup.policy", "delete")])
                .unwrap()
                .compacted()
        );
    }

    fn altered(
        current: &[(&str, &str)],
        ops: &[(&str, i8, Option<&str>)],
    ) -> Result<TopicAlter, AlterRefused> {
        let current = current
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        alter(
            &current,
            ops.iter()
                .map(|(n, o, v)| (n.to_string(), *o, v.map(str::to_string))),
            4 << 20,
        )
    }

    #[test]
    fn alterations_set_and_delete_what_creation_accepts() {
        let got = altered(
            &[("kafka.segment.bytes", "1024")],
            &[
                ("retention.ms", OP_SET, Some("3600000")),
                ("max.message.bytes", OP_SET, Some("+2048")),
                ("segment.bytes", OP_DELETE, None),
                ("cleanup.policy", OP_APPEND, Some("delete")),
            ],
        )
        .unwrap();
        assert_eq!(got.retention_ms, Some(Some(3_600_000)));
        assert_eq!(got.custom["kafka.max.message.bytes"], Some("2048".into()));
        assert_eq!(got.custom["kafka.segment.bytes"], None);
        assert_eq!(
            got.custom.len(),
            2,
            "appending delete to delete changes nothing"
        );
        let reset = altered(&[], &[("retention.ms", OP_DELETE, None)]).unwrap();
        assert_eq!(reset.retention_ms, Some(None));
        assert!(altered(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn alterations_mink_cannot_honour_are_refused_naming_the_key() {
        for (current, op) in [
            (vec![], ("cleanup.policy", OP_SET, Some("compact"))),
            (vec![], ("cleanup.policy", OP_APPEND, Some("compact"))),
            (vec![], ("cleanup.policy", OP_SUBTRACT, Some("delete"))),
            (
                vec![("kafka.cleanup.policy", "compact")],
                ("cleanup.policy", OP_SET, Some("delete")),
            ),
            (
                vec![("kafka.cleanup.policy", "compact")],
                ("cleanup.policy", OP_DELETE, None),
            ),
            (vec![], ("retention.ms", OP_SET, Some("0"))),
            (vec![], ("max.message.bytes", OP_SET, Some("8388608"))),
            (vec![], ("segment.bytes", OP_APPEND, Some("1"))),
            (vec![], ("no.such.config", OP_DELETE, None)),
            (
                vec![],
                ("message.timestamp.type", OP_SET, Some("LogAppendTime")),
            ),
            (
                vec![("kafka.message.timestamp.type", "LogAppendTime")],
                ("message.timestamp.type", OP_DELETE, None),
            ),
        ] {
            let err = altered(&current, &[op]).unwrap_err();
            assert!(matches!(err, AlterRefused::Config(_)), "{op:?}: {err:?}");
            assert!(err.to_string().starts_with(op.0), "{op:?}: {err}");
        }
        // Setting the timestamp type it has is no change, and allowed.
        let same = altered(
            &[],
            &[("message.timestamp.type", OP_SET, Some("CreateTime"))],
        );
        assert!(same.is_ok(), "{same:?}");
        let twice = altered(
            &[],
            &[
                ("segment.ms", OP_SET, Some("1")),
                ("segment.ms", OP_DELETE, None),
            ],
        )
        .unwrap_err();
        assert!(
            matches!(&twice, AlterRefused::Request(w) if w.starts_with("segment.ms")),
            "{twice:?}"
        );
        // A malformed request is told apart from a refused value.
        for op in [
            ("retention.ms", OP_SET, None),
            ("segment.bytes", 7, Some("1")),
            ("cleanup.policy", OP_APPEND, None),
        ] {
            let err = altered(&[], &[op]).unwrap_err();
            assert!(matches!(err, AlterRefused::Request(_)), "{op:?}: {err:?}");
        }
    }
}
