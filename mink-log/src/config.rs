//! Configuration of log tablets.

use serde::{Deserialize, Serialize};

/// Limits and timings of log tablets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// The largest batch one append may carry: its header plus Arrow IPC as stored, and
    /// its rows as decoded (uncompressed), each at most this. Default 16 MiB.
    pub batch_bytes_max: u64,
    /// Appends in flight per tablet before appenders wait. Default 256.
    pub inflight_appends_max: u32,
    /// The most bytes one scan returns. Default 8 MiB.
    pub scan_bytes_max: u64,
    /// How often TTL trimming runs, in milliseconds. Default 300,000 (5 minutes).
    pub ttl_check_interval_ms: u64,
    /// How often an open tablet that took appends writes a writer-state checkpoint
    /// (so that opening it reads only what came after), in milliseconds. Default 60,000.
    pub checkpoint_interval_ms: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            batch_bytes_max: 16 << 20,
            inflight_appends_max: 256,
            scan_bytes_max: 8 << 20,
            ttl_check_interval_ms: 300_000,
            checkpoint_interval_ms: 60_000,
        }
    }
}

impl LogConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_bytes_max == 0 {
            return Err("log.batch_bytes_max must be at least 1".into());
        }
        if self.inflight_appends_max == 0 {
            return Err("log.inflight_appends_max must be at least 1".into());
        }
        if self.scan_bytes_max == 0 {
            return Err("log.scan_bytes_max must be at least 1".into());
        }
        Ok(())
    }
}
