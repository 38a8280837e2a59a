//! mink-query's configuration: defaults, then `mink-query.toml` (or `--config FILE`),
//! then `MINK_QUERY_*` variables (`__` between sections:
//! `MINK_QUERY_QUERY__TIMEOUT_MS=60000`), as the node loads its own.

use std::net::SocketAddr;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The file read when no `--config` is given and it exists.
pub const DEFAULT_CONFIG_FILE: &str = "mink-query.toml";

/// Limits: the largest accepted values, so that a typo cannot ask for the absurd.
pub const CONCURRENT_MAX: usize = 4096;
pub const TIMEOUT_MS_MAX: u64 = 24 * 3600 * 1000;
pub const MEMORY_LIMIT_MIN: u64 = 16 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryConfig {
    /// Where Flight SQL is served.
    pub listen: SocketAddr,
    /// Nodes to start from (`host:port` of their Flight listeners); any one that
    /// answers suffices, the rest of the cluster is found through `describe_cluster`.
    pub nodes: Vec<String>,
    pub query: QueryLimits,
    pub logging: Logging,
}

/// What one query may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryLimits {
    /// A query running longer is cancelled and answers DEADLINE_EXCEEDED (ms).
    pub timeout_ms: u64,
    /// Queries executing at once; one more answers RESOURCE_EXHAUSTED at once.
    pub concurrent_max: usize,
    /// Memory the operators of all running queries may hold (bytes): sorts, joins
    /// and aggregations beyond it fail with RESOURCE_EXHAUSTED, never the process.
    pub memory_limit_bytes: u64,
    /// Rows per batch inside the engine.
    pub batch_size: usize,
    /// Buckets one query reads at once.
    pub read_parallelism: usize,
    /// The largest answer of a primary-key point query, in keys (`IN` lists beyond it
    /// are read by scanning).
    pub lookup_keys_max: usize,
    /// How long a query waits for a bucket's leader when none serves it (ms): its node
    /// died and the cluster has not moved its buckets yet, or a new leader is still
    /// opening one. Planning, lookups and reads wait, each call up to this long (and
    /// the query no longer than `timeout_ms`). Longer than the nodes'
    /// `meta.node_session_timeout_ms` plus a takeover, so that a node's death costs a
    /// query time, not an error.
    pub leader_wait_ms: u64,
    /// Whether a read sends the filters the nodes can evaluate with it, so that rows
    /// no answer needs stay on the node (docs/query.md). Off: every row is sent and
    /// filtered here (for comparing; the answers are the same).
    pub filter_pushdown: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Logging {
    /// `text` or `json`.
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9130".parse().expect("a literal address"),
            nodes: vec!["127.0.0.1:9120".into()],
            query: QueryLimits::default(),
            logging: Logging::default(),
        }
    }
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self {
            timeout_ms: 300_000,
            concurrent_max: 32,
            memory_limit_bytes: 2 << 30,
            batch_size: 8192,
            read_parallelism: 16,
            lookup_keys_max: 10_000,
            leader_wait_ms: 60_000,
            filter_pushdown: true,
        }
    }
}

impl Default for Logging {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
        }
    }
}

/// A configuration that could not be loaded; the message names the key and source.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

impl QueryConfig {
    /// Loads defaults, then `file` (which must exist) or `./mink-query.toml` (if it
    /// exists), then `MINK_QUERY_*` variables; validates.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(QueryConfig::default()));
        match file {
            Some(path) if !path.is_file() => {
                return Err(ConfigError(format!(
                    "the file {} does not exist",
                    path.display()
                )));
            }
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        figment = figment.merge(Env::prefixed("MINK_QUERY_").split("__"));
        let config: QueryConfig = figment.extract().map_err(|e| {
            ConfigError(
                e.into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError("nodes: give at least one node address".into()));
        }
        for (i, addr) in self.nodes.iter().enumerate() {
            let ok = addr
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err(ConfigError(format!(
                    "nodes[{i}]: {addr:?} is not host:port"
                )));
            }
        }
        let q = &self.query;
        let checks: [(&str, u64, u64, u64); 7] = [
            ("query.timeout_ms", q.timeout_ms, 1, TIMEOUT_MS_MAX),
            (
                "query.concurrent_max",
                q.concurrent_max as u64,
                1,
                CONCURRENT_MAX as u64,
            ),
            (
                "query.memory_limit_bytes",
                q.memory_limit_bytes,
                MEMORY_LIMIT_MIN,
                u64::MAX,
            ),
            ("query.batch_size", q.batch_size as u64, 1, 1 << 20),
            ("query.read_parallelism", q.read_parallelism as u64, 1, 1024),
            (
                "query.lookup_keys_max",
                q.lookup_keys_max as u64,
                1,
                100_000,
            ),
            ("query.leader_wait_ms", q.leader_wait_ms, 0, TIMEOUT_MS_MAX),
        ];
        for (key, value, min, max) in checks {
            if !(min..=max).contains(&value) {
                return Err(ConfigError(format!(
                    "{key} is {value}, outside {min}..={max}"
                )));
            }
        }
        Ok(())
    }

    /// The effective configuration as TOML (`--print-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment's Jail closures return figment::Error
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn no_configuration_serves_on_9130_against_a_node_on_9120() {
        Jail::expect_with(|_| {
            let c = QueryConfig::load(None).unwrap();
            assert_eq!(c.listen.to_string(), "127.0.0.1:9130");
            assert_eq!(c.nodes, vec!["127.0.0.1:9120".to_string()]);
            Ok(())
        });
    }

    #[test]
    fn the_file_then_the_environment_override_the_defaults() {
        Jail::expect_with(|jail| {
            jail.create_file(
                DEFAULT_CONFIG_FILE,
                "nodes = [\"a:1\", \"b:2\"]\n[query]\ntimeout_ms = 5000\n",
            )?;
            jail.set_env("MINK_QUERY_QUERY__CONCURRENT_MAX", "3");
            let c = QueryConfig::load(None).unwrap();
            assert_eq!(c.nodes.len(), 2);
            assert_eq!(c.query.timeout_ms, 5000);
            assert_eq!(c.query.concurrent_max, 3);
            Ok(())
        });
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_key() {
        Jail::expect_with(|jail| {
            jail.set_env("MINK_QUERY_QUERY__CONCURRENT_MAX", "0");
            let e = QueryConfig::load(None).unwrap_err().to_string();
            assert!(e.contains("query.concurrent_max"), "{e}");
            jail.set_env("MINK_QUERY_QUERY__CONCURRENT_MAX", "2");
            jail.set_env("MINK_QUERY_NODES", "[\"nohost\"]");
            let e = QueryConfig::load(None).unwrap_err().to_string();
            assert!(e.contains("nodes[0]"), "{e}");
            jail.set_env("MINK_QUERY_NODES", "[\"h:1\"]");
            jail.set_env("MINK_QUERY_QUERY__TIMEOUTMS", "1");
            let e = QueryConfig::load(None).unwrap_err().to_string();
            assert!(e.contains("timeoutms"), "{e}");
            Ok(())
        });
    }
}
