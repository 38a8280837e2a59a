//! Configuration of the object store and of the WAL writer.

use serde::{Deserialize, Serialize};

/// What a secret is shown as wherever a configuration is printed, logged or served.
pub const REDACTED: &str = "<redacted>";

/// Where durable state lives. `url` is one of `file:///abs/dir`, `memory://`,
/// `s3://bucket/prefix`; the S3 fields apply to `s3://` only. Its `Debug` shows the
/// secret key as [`REDACTED`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectStoreConfig {
    /// The store's URL. Empty means "derive from the node's data directory"
    /// (`file://<data_dir>/objects`); the node fills it in before opening.
    pub url: String,
    /// S3 endpoint for S3-compatible stores (MinIO, R2, moto), e.g. `http://127.0.0.1:9000`.
    /// Default: AWS.
    pub endpoint: Option<String>,
    /// S3 region. Default `us-east-1`.
    pub region: String,
    /// S3 access key id. Default: from the AWS environment.
    pub access_key_id: Option<String>,
    /// S3 secret access key. Default: from the AWS environment.
    pub secret_access_key: Option<String>,
    /// Allow plain-HTTP endpoints (local test servers). Default false.
    pub allow_http: bool,
    /// Timeout of one object-store request, in milliseconds. Default 30,000.
    pub request_timeout_ms: u64,
}

impl ObjectStoreConfig {
    /// This configuration with the secret key, when set, replaced by [`REDACTED`]: what
    /// may be printed or served.
    pub fn redacted(&self) -> Self {
        Self {
            secret_access_key: self.secret_access_key.as_ref().map(|_| REDACTED.into()),
            ..self.clone()
        }
    }
}

/// By hand, so that no `{:?}` of a configuration prints the secret key.
impl std::fmt::Debug for ObjectStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            url,
            endpoint,
            region,
            access_key_id,
            secret_access_key,
            allow_http,
            request_timeout_ms,
        } = self;
        f.debug_struct("ObjectStoreConfig")
            .field("url", url)
            .field("endpoint", endpoint)
            .field("region", region)
            .field("access_key_id", access_key_id)
            .field(
                "secret_access_key",
                &secret_access_key.as_ref().map(|_| REDACTED),
            )
            .field("allow_http", allow_http)
            .field("request_timeout_ms", request_timeout_ms)
            .finish()
    }
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
            request_timeout_ms: 30_000,
        }
    }
}

/// The WAL writer of a node: group commit and upload pipelining.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WalConfig {
    /// A group (one WAL object, one PUT) closes when it reaches this many bytes; no
    /// WAL object is larger than this plus one append. At most 4 GiB. Default 8 MiB.
    pub group_bytes_max: u64,
    /// The longest an open group waits for more appends before it is uploaded, in
    /// milliseconds. With a PUT budget (`put_rate_max`) a group is uploaded at once
    /// while the budget allows, and this bounds the latency the budget may add; without
    /// one every group waits this long. Default: 250 with a budget, 0 without.
    pub linger_ms: Option<u64>,
    /// The WAL PUTs a second the node aims to stay under (its group-commit budget): a
    /// token bucket of this many uploads a second, holding one second's worth. While
    /// it has a token a group is uploaded at once (an idle or lightly loaded node
    /// acknowledges in one PUT); when it has none, the group waits for the next token,
    /// growing with what arrives, but never longer than `linger_ms`. Full groups
    /// (`group_bytes_max`) go at once. 0: no budget. Default: 10 on S3, where every
    /// request is billed; none on a local directory or in memory.
    pub put_rate_max: Option<u32>,
    /// Uploads in flight at once; acks still come in upload order. Default 4.
    pub inflight_uploads_max: u32,
    /// The longest a cork (the parts of one table write being enqueued) holds back the
    /// sealing of a group, from its first append, in milliseconds. A table write's
    /// parts are enqueued in well under this; the bound keeps a holder that stalls (a
    /// bucket opening, memory back-pressure) from delaying anyone longer. At most
    /// 1,000. Default 2.
    pub cork_max_ms: u64,
    /// Bytes of appends waiting for a group before appenders are pushed back. Default 64 MiB.
    pub pending_bytes_max: u64,
    /// Bytes of recent records kept in memory per node, for tail reads and for
    /// compaction. Default 128 MiB: twice `segment_bytes_max`, the uncompacted bytes
    /// that start a compaction round, so that what arrives while a round writes its
    /// segments does not push out records the round has yet to write (it would read
    /// them back from their WAL objects: one GET each, and the bytes again).
    pub tail_cache_bytes_max: u64,
    /// How often WAL data is compacted into per-stream segments, in milliseconds.
    /// Default 30,000.
    pub compaction_interval_ms: u64,
    /// Compaction also runs as soon as this many WAL objects were written since the
    /// last round began, whatever the interval. A takeover of the node's streams reads
    /// every WAL object written since their last compaction, so this bounds its reads
    /// on a busy node (docs/s3stream.md). At least 1. Default 512.
    pub compaction_wal_objects_max: u64,
    /// The largest segment object compaction writes, in bytes. Default 64 MiB.
    pub segment_bytes_max: u64,
    /// A run of at least this many consecutive segments of a stream, together no
    /// larger than `segment_bytes_max` and none holding half of the run's bytes, is
    /// merged into one segment by compaction (so each byte is rewritten at most
    /// log2(segment_bytes_max / smallest segment) times). 0 turns merging off.
    /// Default 8.
    pub segment_merge_fanin: u32,
    /// WAL objects of a dead generation (its node has a newer one, and no stream
    /// names it as owner) are deleted once older than this, in milliseconds.
    /// Default 600,000 (10 minutes).
    pub dead_wal_grace_ms: u64,
    /// How long one WAL upload is retried (with backoff) after errors and timeouts
    /// before the writer gives up and fails, in milliseconds. A slow-down episode on
    /// S3 can last minutes; appends wait meanwhile (nothing is acknowledged out of
    /// order). 0: no retries. Default 60,000.
    pub upload_retry_budget_ms: u64,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            group_bytes_max: 8 << 20,
            linger_ms: None,
            put_rate_max: None,
            inflight_uploads_max: 4,
            cork_max_ms: 2,
            pending_bytes_max: 64 << 20,
            tail_cache_bytes_max: 128 << 20,
            compaction_interval_ms: 30_000,
            compaction_wal_objects_max: 512,
            segment_bytes_max: 64 << 20,
            segment_merge_fanin: 8,
            dead_wal_grace_ms: 600_000,
            upload_retry_budget_ms: 60_000,
        }
    }
}

/// `wal.put_rate_max` on a store that bills per request (S3): at 10 PUTs a second a
/// node's WAL costs about $130 a month in requests at S3 Standard's list price, and
/// 50 MB/s fits in groups of 5 MB (docs/benchmarks.md, bench cost).
pub const DEFAULT_PUT_RATE_MAX: u32 = 10;
/// `wal.linger_ms` when a PUT budget is kept: the most the budget adds to an ack.
pub const DEFAULT_BUDGET_LINGER_MS: u64 = 250;

impl WalConfig {
    /// The PUT budget in effect, uploads a second (0: none).
    pub fn put_rate(&self) -> u32 {
        self.put_rate_max.unwrap_or(0)
    }

    /// The linger in effect (see `linger_ms`). With a budget the default is
    /// [`DEFAULT_BUDGET_LINGER_MS`], or the gap between two tokens if that is longer:
    /// a group that outwaited a shorter linger would go before its token every time,
    /// and the budget would be `1 / linger` instead of `put_rate_max`.
    pub fn linger(&self) -> std::time::Duration {
        let rate = u64::from(self.put_rate());
        let default = if rate > 0 {
            DEFAULT_BUDGET_LINGER_MS.max(1_000u64.div_ceil(rate))
        } else {
            0
        };
        std::time::Duration::from_millis(self.linger_ms.unwrap_or(default))
    }

    /// Fills the defaults that depend on the store: a budget where requests are
    /// billed (`billed`, an S3 store), none elsewhere or when `linger_ms` was set to
    /// 0 (no wait at all: a budget could hold nothing back); then the linger that goes
    /// with it. Values set explicitly stay. A node resolves its configuration when it
    /// loads it (`MinkConfig::load`); a `WalConfig` built in code keeps no budget
    /// unless it names one.
    pub fn resolve_defaults(&mut self, billed: bool) {
        let budget = billed && self.linger_ms != Some(0);
        self.put_rate_max
            .get_or_insert(if budget { DEFAULT_PUT_RATE_MAX } else { 0 });
        let linger = self.linger().as_millis() as u64;
        self.linger_ms.get_or_insert(linger);
    }

    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.group_bytes_max == 0 {
            return Err("wal.group_bytes_max must be at least 1".into());
        }
        // A group is one PUT, and S3 takes at most 5 GiB in one. The appends of a
        // group also hold `pending_bytes_max` permits, which stop at 4 GiB.
        if self.group_bytes_max > 4 << 30 {
            return Err(
                "wal.group_bytes_max must be at most 4 GiB (a WAL object is one PUT)".into(),
            );
        }
        if self.inflight_uploads_max == 0 {
            return Err("wal.inflight_uploads_max must be at least 1".into());
        }
        if self.cork_max_ms > 1_000 {
            return Err("wal.cork_max_ms must be at most 1000".into());
        }
        if self.pending_bytes_max < self.group_bytes_max {
            return Err("wal.pending_bytes_max must be at least wal.group_bytes_max".into());
        }
        if self.segment_bytes_max == 0 {
            return Err("wal.segment_bytes_max must be at least 1".into());
        }
        if self.compaction_wal_objects_max == 0 {
            return Err("wal.compaction_wal_objects_max must be at least 1".into());
        }
        if self.linger_ms.is_some_and(|ms| ms > 60_000) {
            return Err("wal.linger_ms must be at most 60000".into());
        }
        if self.put_rate_max.is_some_and(|n| n > 100_000) {
            return Err("wal.put_rate_max must be at most 100000 (0: no budget)".into());
        }
        if self.put_rate() > 0 && self.linger_ms == Some(0) {
            return Err(
                "wal.put_rate_max needs a wal.linger_ms above 0: the linger is the most the \
                 budget may hold a group back, and 0 holds nothing (set put_rate_max = 0 for \
                 no budget)"
                    .into(),
            );
        }
        if self.segment_merge_fanin == 1 {
            return Err("wal.segment_merge_fanin must be 0 (off) or at least 2".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_names_its_key() {
        let cases = [
            (
                WalConfig {
                    group_bytes_max: 0,
                    ..Default::default()
                },
                "wal.group_bytes_max",
            ),
            (
                WalConfig {
                    group_bytes_max: (4 << 30) + 1,
                    pending_bytes_max: 8 << 30,
                    ..Default::default()
                },
                "wal.group_bytes_max must be at most 4 GiB",
            ),
            (
                WalConfig {
                    inflight_uploads_max: 0,
                    ..Default::default()
                },
                "wal.inflight_uploads_max",
            ),
            (
                WalConfig {
                    cork_max_ms: 1_001,
                    ..Default::default()
                },
                "wal.cork_max_ms",
            ),
            (
                WalConfig {
                    pending_bytes_max: 1 << 20,
                    ..Default::default()
                },
                "wal.pending_bytes_max",
            ),
            (
                WalConfig {
                    linger_ms: Some(60_001),
                    ..Default::default()
                },
                "wal.linger_ms",
            ),
            (
                WalConfig {
                    put_rate_max: Some(100_001),
                    ..Default::default()
                },
                "wal.put_rate_max",
            ),
            (
                WalConfig {
                    put_rate_max: Some(10),
                    linger_ms: Some(0),
                    ..Default::default()
                },
                "wal.put_rate_max needs a wal.linger_ms above 0",
            ),
            (
                WalConfig {
                    segment_merge_fanin: 1,
                    ..Default::default()
                },
                "wal.segment_merge_fanin",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err();
            assert!(err.contains(key), "{err:?} should name {key}");
        }
        let largest = WalConfig {
            group_bytes_max: 4 << 30,
            pending_bytes_max: 4 << 30,
            ..Default::default()
        };
        assert_eq!(largest.validate(), Ok(()));
        assert_eq!(WalConfig::default().validate(), Ok(()));
    }

    #[test]
    fn the_budget_and_its_linger_default_by_store() {
        let mut s3 = WalConfig::default();
        s3.resolve_defaults(true);
        assert_eq!(s3.put_rate_max, Some(DEFAULT_PUT_RATE_MAX));
        assert_eq!(s3.linger_ms, Some(DEFAULT_BUDGET_LINGER_MS));
        let mut local = WalConfig::default();
        local.resolve_defaults(false);
        assert_eq!((local.put_rate_max, local.linger_ms), (Some(0), Some(0)));
        // What is set stays: a fixed linger without a budget, or a budget with its own.
        let mut fixed = WalConfig {
            linger_ms: Some(50),
            put_rate_max: Some(0),
            ..Default::default()
        };
        fixed.resolve_defaults(true);
        assert_eq!((fixed.put_rate(), fixed.linger().as_millis()), (0, 50));
        let mut own = WalConfig {
            put_rate_max: Some(4),
            ..Default::default()
        };
        own.resolve_defaults(false);
        assert_eq!((own.put_rate(), own.linger().as_millis()), (4, 250));
        // A budget under 4 a second lingers at least one token's gap.
        let slow = WalConfig {
            put_rate_max: Some(3),
            ..Default::default()
        };
        assert_eq!(slow.linger().as_millis(), 334);
        // linger_ms 0 on S3: no wait, so no budget either.
        let mut eager = WalConfig {
            linger_ms: Some(0),
            ..Default::default()
        };
        eager.resolve_defaults(true);
        assert_eq!((eager.put_rate(), eager.validate()), (0, Ok(())));
    }
}
