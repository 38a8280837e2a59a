//! Lake tiering settings (`[lake]` in `mink.toml`). Whether a table is tiered and how
//! fresh its lake is are table properties (`lake.enabled`, `lake.freshness`).

use serde::{Deserialize, Serialize};

/// Lake tiering settings of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LakeConfig {
    /// Parquet data files are cut at about this many bytes of Arrow data (a round holds
    /// one file's rows in memory while it writes it). Default 128 MiB.
    pub file_bytes_target: u64,
    /// How often the node looks for tables due for a round. Default 1 s.
    pub check_interval_ms: u64,
    /// At most this many bytes of a bucket's log go into one round (the rest into the
    /// next, which runs at once): bounds a round's duration, and, for primary-key
    /// tables, the changelog a round holds in memory. Default 256 MiB.
    pub round_bytes_max: u64,
    /// The TTL trims a lake-enabled table's log only below offsets the lake has held
    /// for at least this long, so that a `Union` read that began on an older snapshot
    /// still finds the log rows it needs. Default 1 min.
    pub trim_grace_ms: u64,
    /// How often each lake table's orphan sweep runs (on the leader of its first
    /// bucket). Default 1 h.
    pub orphan_sweep_interval_ms: u64,
    /// The sweep keeps every object younger than this, needed or not: a round in
    /// flight has written files it has not committed yet. Default 1 h.
    pub orphan_min_age_ms: u64,
    /// A primary-key bucket's lake is merge-on-read: each round adds the changed rows
    /// and position deletes of the rows they replace. When the deleted rows reach this
    /// percentage of the bucket's data file rows, the round rewrites the bucket instead
    /// (its state in fresh files, no deletes). 1..=100; default 20.
    pub rewrite_deleted_percent: u32,
    /// ... or when the bucket has more than this many files written by merge-on-read
    /// rounds (small data files and delete files). 2..=1000; default 32.
    pub rewrite_files_max: u32,
    /// A node keeps, for the primary-key buckets it tiers, where each live key's row is
    /// in the lake (about 80 bytes plus the key per key), so that a merge-on-read round
    /// reads no lake file; beyond this many bytes, a bucket's round reads its key
    /// columns instead. 0 keeps none. Default 128 MiB.
    pub key_index_bytes_max: u64,
    /// A lake table's snapshots stay readable (time travel: `Lake {snapshot_id}`, an
    /// engine's `AS OF`) for at least this long after they were committed; older ones
    /// are expired at the next commit, beyond `snapshots_min`. Default 1 day.
    pub snapshot_retention_ms: u64,
    /// The newest snapshots kept whatever their age. 1..=1000; default 10.
    pub snapshots_min: u32,
    /// The most snapshots kept whatever their age: each one costs about 1 KB (more
    /// with many buckets) of every metadata version a round writes and a reader loads.
    /// `snapshots_min`..=100000; default 2000 (a day of rounds at a `lake.freshness`
    /// of 1 minute).
    pub snapshots_max: u32,
    /// A log table's bucket is compacted once it has at least this many small data
    /// files: the round that next tiers its rows also merges the oldest run of
    /// consecutive small files into one file of up to `file_bytes_target` (Arrow
    /// bytes), which replaces them. 0 turns compaction off; else 2..=10000. Default 16.
    pub compact_files_min: u32,
    /// A data file smaller than this (Parquet bytes) is small. Default 8 MiB.
    pub compact_small_file_bytes: u64,
}

impl Default for LakeConfig {
    fn default() -> Self {
        Self {
            file_bytes_target: 128 << 20,
            check_interval_ms: 1000,
            round_bytes_max: 256 << 20,
            trim_grace_ms: 60_000,
            orphan_sweep_interval_ms: 3_600_000,
            orphan_min_age_ms: 3_600_000,
            rewrite_deleted_percent: 20,
            rewrite_files_max: 32,
            key_index_bytes_max: 128 << 20,
            snapshot_retention_ms: 86_400_000,
            snapshots_min: 10,
            snapshots_max: 2000,
            compact_files_min: 16,
            compact_small_file_bytes: 8 << 20,
        }
    }
}

/// Which of a lake table's snapshots a commit keeps ([`LakeConfig`]'s
/// `snapshot_retention_ms`, `snapshots_min` and `snapshots_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LakeRetention {
    pub max_age_ms: u64,
    pub min: usize,
    pub max: usize,
}

impl Default for LakeRetention {
    fn default() -> Self {
        LakeConfig::default().retention()
    }
}

impl LakeConfig {
    /// The snapshot retention these settings describe.
    pub fn retention(&self) -> LakeRetention {
        LakeRetention {
            max_age_ms: self.snapshot_retention_ms,
            min: self.snapshots_min as usize,
            max: self.snapshots_max as usize,
        }
    }

    /// Checks the bounds; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(1 << 10..=1 << 30).contains(&self.file_bytes_target) {
            return Err(format!(
                "lake.file_bytes_target {} is outside 1 KiB..=1 GiB",
                self.file_bytes_target
            ));
        }
        if !(10..=3_600_000).contains(&self.check_interval_ms) {
            return Err(format!(
                "lake.check_interval_ms {} is outside 10..=3600000",
                self.check_interval_ms
            ));
        }
        if self.round_bytes_max < self.file_bytes_target.min(1 << 20) {
            return Err(format!(
                "lake.round_bytes_max {} is below 1 MiB (or file_bytes_target)",
                self.round_bytes_max
            ));
        }
        if self.orphan_sweep_interval_ms < 1000 {
            return Err(format!(
                "lake.orphan_sweep_interval_ms {} is below 1000",
                self.orphan_sweep_interval_ms
            ));
        }
        if self.orphan_min_age_ms < 600_000 {
            return Err(format!(
                "lake.orphan_min_age_ms {} is below 600000: a round in flight could lose its files",
                self.orphan_min_age_ms
            ));
        }
        if !(1..=100).contains(&self.rewrite_deleted_percent) {
            return Err(format!(
                "lake.rewrite_deleted_percent {} is outside 1..=100",
                self.rewrite_deleted_percent
            ));
        }
        if !(2..=1000).contains(&self.rewrite_files_max) {
            return Err(format!(
                "lake.rewrite_files_max {} is outside 2..=1000",
                self.rewrite_files_max
            ));
        }
        if !(1..=1000).contains(&self.snapshots_min) {
            return Err(format!(
                "lake.snapshots_min {} is outside 1..=1000",
                self.snapshots_min
            ));
        }
        if self.compact_files_min == 1 || self.compact_files_min > 10_000 {
            return Err(format!(
                "lake.compact_files_min {} is neither 0 (off) nor in 2..=10000",
                self.compact_files_min
            ));
        }
        if !(1 << 10..=1 << 30).contains(&self.compact_small_file_bytes) {
            return Err(format!(
                "lake.compact_small_file_bytes {} is outside 1 KiB..=1 GiB",
                self.compact_small_file_bytes
            ));
        }
        if !(self.snapshots_min..=100_000).contains(&self.snapshots_max) {
            return Err(format!(
                "lake.snapshots_max {} is outside lake.snapshots_min ({})..=100000",
                self.snapshots_max, self.snapshots_min
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_counts_out_of_bounds_are_refused_naming_the_key() {
        assert!(LakeConfig::default().validate().is_ok());
        let bad = |f: fn(&mut LakeConfig)| {
            let mut c = LakeConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.snapshots_min = 0).contains("lake.snapshots_min"));
        assert!(bad(|c| c.snapshots_max = 5).contains("lake.snapshots_max"));
        assert!(bad(|c| c.snapshots_max = 100_001).contains("lake.snapshots_max"));
        assert!(bad(|c| c.compact_files_min = 1).contains("lake.compact_files_min"));
        assert!(bad(|c| c.compact_small_file_bytes = 0).contains("compact_small_file_bytes"));
        let r = LakeConfig::default().retention();
        assert_eq!((r.max_age_ms, r.min, r.max), (86_400_000, 10, 2000));
    }
}
