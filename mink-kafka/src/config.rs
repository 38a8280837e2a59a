//! Configuration of the Kafka listener, with the limits of spec/protocols.txt.

use serde::{Deserialize, Serialize};

/// Kafka settings and limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Whether the Kafka listener runs. Default true.
    pub enabled: bool,
    /// The database whose log tables are the topics. Default `kafka`.
    pub database: String,
    /// Create a topic on first use (Metadata or Produce). Default true.
    pub auto_create_topics: bool,
    /// Partitions of an auto-created topic. Default 1.
    pub default_partitions: u32,
    /// The largest request frame, in bytes. Default 100 MiB.
    pub max_request_bytes: u64,
    /// The largest record batch a Produce may carry, as sent (Kafka's
    /// `max.message.bytes`, reported by DescribeConfigs and CreateTopics); a larger
    /// one is MESSAGE_TOO_LARGE, which producers answer by splitting the batch.
    /// Default 4 MiB; at most a third of `log.batch_bytes_max` (a batch of tiny records
    /// takes up to about three times its Kafka size as Arrow rows), which the node
    /// checks at start.
    pub max_message_bytes: u64,
    /// The most bytes one Fetch response returns. Default 50 MiB.
    pub max_fetch_bytes: u64,
    /// Requests in flight per connection. Default 64.
    pub max_in_flight: u32,
    /// The longest a Fetch waits (`max_wait_ms` is capped to it), in milliseconds.
    /// Default 30,000.
    pub fetch_max_wait_cap_ms: u64,
    /// A connection that sends no request for this long is closed, in milliseconds.
    /// Default 600,000 (Kafka's `connections.max.idle.ms`).
    pub connection_idle_ms: u64,
    /// The shortest group session timeout accepted, in milliseconds. Default 6,000.
    pub session_timeout_min_ms: u64,
    /// The longest group session timeout accepted, in milliseconds. Default 1,800,000.
    pub session_timeout_max_ms: u64,
    /// How long a group that was Empty waits for more members before its first
    /// rebalance completes, and again each time one arrived meanwhile (within the
    /// members' rebalance timeout), in milliseconds: consumers that start together
    /// make one rebalance (Kafka's `group.initial.rebalance.delay.ms`). Default 3,000;
    /// at most 300,000.
    pub initial_rebalance_delay_ms: u64,
    /// How long committed group offsets are kept without a new commit, in
    /// milliseconds. Default 604,800,000 (7 days).
    pub group_offsets_ttl_ms: u64,
    /// How far ahead of this node's clock a produced record's timestamp may be, in
    /// milliseconds; later ones are INVALID_TIMESTAMP (Kafka's
    /// `message.timestamp.after.max.ms`). Default 3,600,000 (one hour).
    pub timestamp_after_max_ms: u64,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            database: "kafka".into(),
            auto_create_topics: true,
            default_partitions: 1,
            max_request_bytes: 100 << 20,
            max_message_bytes: 4 << 20,
            max_fetch_bytes: 50 << 20,
            max_in_flight: 64,
            fetch_max_wait_cap_ms: 30_000,
            connection_idle_ms: 600_000,
            session_timeout_min_ms: 6_000,
            session_timeout_max_ms: 30 * 60 * 1000,
            initial_rebalance_delay_ms: 3_000,
            group_offsets_ttl_ms: 7 * 24 * 3600 * 1000,
            timestamp_after_max_ms: 3_600_000,
        }
    }
}

impl KafkaConfig {
    /// The largest record batch a Produce may carry: `max_message_bytes`, or less when
    /// the request frame limit is lower (a frame holds the batch).
    pub fn message_bytes_max(&self) -> u64 {
        self.max_message_bytes.min(self.max_request_bytes)
    }

    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        mink_types::validate_name("kafka.database", &self.database).map_err(|e| e.to_string())?;
        if self.default_partitions == 0
            || self.default_partitions > mink_types::table::BUCKET_COUNT_MAX
        {
            return Err(format!(
                "kafka.default_partitions must be within 1..={}",
                mink_types::table::BUCKET_COUNT_MAX
            ));
        }
        if !(1024..=i32::MAX as u64).contains(&self.max_request_bytes) {
            // A Kafka frame's length is an i32, and so is an Arrow column's offset into
            // the keys or values of one produced batch (bounded by this too).
            return Err(format!(
                "kafka.max_request_bytes must be within 1024..={}",
                i32::MAX
            ));
        }
        if !(1..=i32::MAX as u64).contains(&self.max_fetch_bytes) {
            return Err(format!(
                "kafka.max_fetch_bytes must be within 1..={}",
                i32::MAX
            ));
        }
        if self.max_message_bytes < 1024 {
            return Err("kafka.max_message_bytes must be at least 1024".into());
        }
        if self.max_in_flight == 0 {
            return Err("kafka.max_in_flight must be at least 1".into());
        }
        if self.connection_idle_ms == 0 {
            return Err("kafka.connection_idle_ms must be at least 1".into());
        }
        if self.session_timeout_min_ms > self.session_timeout_max_ms {
            return Err(
                "kafka.session_timeout_min_ms must not exceed kafka.session_timeout_max_ms".into(),
            );
        }
        if self.initial_rebalance_delay_ms > 300_000 {
            return Err("kafka.initial_rebalance_delay_ms must be at most 300000".into());
        }
        if self.group_offsets_ttl_ms == 0 {
            return Err("kafka.group_offsets_ttl_ms must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_limits_fit_a_kafka_frame() {
        assert_eq!(KafkaConfig::default().validate(), Ok(()));
        for (request, fetch, field) in [
            (1023, 1, "kafka.max_request_bytes"),
            (1 << 31, 1, "kafka.max_request_bytes"),
            (u64::MAX, 1, "kafka.max_request_bytes"),
            (1024, 0, "kafka.max_fetch_bytes"),
            (1024, 1 << 31, "kafka.max_fetch_bytes"),
        ] {
            let c = KafkaConfig {
                max_request_bytes: request,
                max_fetch_bytes: fetch,
                ..KafkaConfig::default()
            };
            let err = c.validate().unwrap_err();
            assert!(err.starts_with(field), "{request} {fetch}: {err}");
        }
        for message in [0, 1023] {
            let c = KafkaConfig {
                max_message_bytes: message,
                ..KafkaConfig::default()
            };
            let err = c.validate().unwrap_err();
            assert!(err.starts_with("kafka.max_message_bytes"), "{err}");
        }
        let small = KafkaConfig {
            max_request_bytes: 65_536,
            ..KafkaConfig::default()
        };
        assert_eq!(small.validate(), Ok(()));
        assert_eq!(small.message_bytes_max(), 65_536);
        let c = KafkaConfig {
            max_request_bytes: i32::MAX as u64,
            max_fetch_bytes: i32::MAX as u64,
            ..KafkaConfig::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }
}
