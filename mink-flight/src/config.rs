//! Configuration of the Flight listener.

use serde::{Deserialize, Serialize};

/// Flight limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlightConfig {
    /// The largest gRPC message accepted or sent, in bytes. Default 64 MiB.
    pub message_bytes_max: u64,
    /// Concurrent calls per connection. Default 256.
    pub concurrent_streams_max: u32,
    /// The longest a Tail exchange may wait for data, in milliseconds. Default 30,000.
    pub tail_wait_max_ms: u64,
}

impl Default for FlightConfig {
    fn default() -> Self {
        Self {
            message_bytes_max: 64 << 20,
            concurrent_streams_max: 256,
            tail_wait_max_ms: 30_000,
        }
    }
}

impl FlightConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.message_bytes_max < 1 << 20 {
            return Err("flight.message_bytes_max must be at least 1 MiB".into());
        }
        if self.concurrent_streams_max == 0 {
            return Err("flight.concurrent_streams_max must be at least 1".into());
        }
        Ok(())
    }
}
