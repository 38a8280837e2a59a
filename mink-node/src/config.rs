//! `MinkConfig`: every crate's configuration, composed, and how it is loaded.
//!
//! Order, later wins: built-in defaults, then `mink.toml` in the working directory (or
//! the file given with `--config`), then `MINK_*` environment variables with `__`
//! between nesting levels (`MINK_WAL__LINGER_MS=5`, `MINK_NODE_ID=n2`). An unknown key
//! or a bad value is an error that names the key. `MINK_ADDR` belongs to the `mink`
//! CLI and is ignored here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use mink_flight::FlightConfig;
use mink_kafka::KafkaConfig;
use mink_kv::KvConfig;
use mink_lake::LakeConfig;
use mink_log::LogConfig;
use mink_meta::MetaConfig;
use mink_wal::{ObjectStoreConfig, WalConfig};

/// The file read from the working directory when no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "mink.toml";

/// Where a node listens. Loopback by default: neither Flight nor Kafka authenticates
/// (spec/protocols.txt), so a node is reachable from elsewhere only when its
/// configuration says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listeners {
    /// Arrow Flight. Default `127.0.0.1:9120`.
    pub flight: SocketAddr,
    /// Kafka. Default `127.0.0.1:9092`.
    pub kafka: SocketAddr,
    /// Admin HTTP (`/health`, `/metrics`). Default `127.0.0.1:9121`.
    pub admin: SocketAddr,
    /// The Iceberg REST catalog (read-only; `iceberg_rest.enabled`). Default
    /// `127.0.0.1:9181`.
    pub iceberg_rest: SocketAddr,
}

impl Listeners {
    /// Every listener on the loopback at a port the OS chooses: what tests and
    /// benchmarks run with.
    pub fn ephemeral() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            flight: any,
            kafka: any,
            admin: any,
            iceberg_rest: any,
        }
    }
}

impl Default for Listeners {
    fn default() -> Self {
        Self {
            flight: SocketAddr::from(([127, 0, 0, 1], 9120)),
            kafka: SocketAddr::from(([127, 0, 0, 1], 9092)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9121)),
            iceberg_rest: SocketAddr::from(([127, 0, 0, 1], 9181)),
        }
    }
}

/// The addresses other nodes and clients are told to use. Default: the listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Advertised {
    /// `host:port` of the Flight listener as clients reach it.
    pub flight: Option<String>,
    /// `host:port` of the Kafka listener as clients reach it.
    pub kafka: Option<String>,
}

/// The Iceberg REST catalog every node serves (docs/lake.md): read-only, for the
/// engines that find Iceberg tables by name (pyiceberg, DuckDB, Spark, Trino).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IcebergRestConfig {
    /// Serve it on `listeners.iceberg_rest`. Default true.
    pub enabled: bool,
    /// Hand the node's own object-store credentials to every caller of `loadTable`
    /// (the spec's `config` and `storage-credentials`), so that an engine needs no
    /// keys of its own. The catalog authenticates nobody: turn this on only where
    /// whoever reaches the listener may read the bucket. Default false (endpoint and
    /// region are served; keys are not).
    pub vend_credentials: bool,
}

impl Default for IcebergRestConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            vend_credentials: false,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines (default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging. The filter comes from `RUST_LOG` (default `info`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    pub format: LogFormat,
}

/// Test facilities. Never set in production.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TestingConfig {
    /// Wraps the object store in a fault injector that the admin endpoint's
    /// `POST /fault` configures (PUT failures, ambiguous timeouts, creates applied
    /// then answered `AlreadyExists`, GET failures, latency, or the store "down"). Used
    /// by the chaos harness (`cargo xtask chaos`). Default off: the endpoint answers 404.
    pub fault_injection: bool,
}

/// The whole configuration of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MinkConfig {
    /// This node's id, unique in the cluster. Default `node-1`.
    #[serde(deserialize_with = "string_or_number")]
    pub node_id: String,
    /// Local state (KV stores, caches). Default `./mink-data`.
    pub data_dir: PathBuf,
    pub listeners: Listeners,
    pub advertised: Advertised,
    /// Default `file://<data_dir>/objects`.
    pub object_store: ObjectStoreConfig,
    pub wal: WalConfig,
    pub log: LogConfig,
    pub kv: KvConfig,
    pub meta: MetaConfig,
    pub flight: FlightConfig,
    pub kafka: KafkaConfig,
    pub lake: LakeConfig,
    pub iceberg_rest: IcebergRestConfig,
    /// Node-wide bounds on write requests in progress (back-pressure).
    pub writes: crate::admission::WritesConfig,
    pub logging: LoggingConfig,
    pub testing: TestingConfig,
}

impl Default for MinkConfig {
    fn default() -> Self {
        Self {
            node_id: "node-1".into(),
            data_dir: PathBuf::from("./mink-data"),
            listeners: Listeners::default(),
            advertised: Advertised::default(),
            object_store: ObjectStoreConfig::default(),
            wal: WalConfig::default(),
            log: LogConfig::default(),
            kv: KvConfig::default(),
            meta: MetaConfig::default(),
            flight: FlightConfig::default(),
            kafka: KafkaConfig::default(),
            lake: LakeConfig::default(),
            iceberg_rest: IcebergRestConfig::default(),
            writes: crate::admission::WritesConfig::default(),
            logging: LoggingConfig::default(),
            testing: TestingConfig::default(),
        }
    }
}

/// Accepts `MINK_NODE_ID=7`, which the environment provider reads as a number.
fn string_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Number(i64),
    }
    Ok(match Id::deserialize(d)? {
        Id::Text(s) => s,
        Id::Number(n) => n.to_string(),
    })
}

/// A configuration that could not be loaded; the message names the key and source.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

impl MinkConfig {
    /// Loads defaults, then `file` (which must exist) or `./mink.toml` (if it exists),
    /// then `MINK_*` variables; fills derived defaults; validates.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(MinkConfig::default()));
        match file {
            Some(path) => {
                if !path.is_file() {
                    return Err(ConfigError(format!(
                        "the file {} does not exist",
                        path.display()
                    )));
                }
                figment = figment.merge(Toml::file_exact(path));
            }
            None => {
                if Path::new(DEFAULT_CONFIG_FILE).is_file() {
                    figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
                }
            }
        }
        figment = figment.merge(Env::prefixed("MINK_").split("__").ignore(&["ADDR"]));
        let mut config: MinkConfig = figment
            .extract()
            .map_err(|e| ConfigError(render_figment_error(e)))?;
        config.fill_derived()?;
        config.validate()?;
        Ok(config)
    }

    /// Fills defaults that depend on other values: the object store URL, and the WAL's
    /// PUT budget and linger (which depend on the store).
    fn fill_derived(&mut self) -> Result<(), ConfigError> {
        if self.object_store.url.is_empty() {
            let dir = std::path::absolute(self.data_dir.join("objects")).map_err(|e| {
                ConfigError(format!(
                    "data_dir {}: cannot make it absolute: {e}",
                    self.data_dir.display()
                ))
            })?;
            self.object_store.url = format!("file://{}", dir.display());
        }
        // A PUT budget where requests are billed.
        self.wal
            .resolve_defaults(self.object_store.url.starts_with("s3://"));
        Ok(())
    }

    /// Checks every section; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        mink_types::validate_name("node_id", &self.node_id)
            .map_err(|e| ConfigError(e.to_string()))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError("data_dir must not be empty".into()));
        }
        for (key, addr) in [
            ("advertised.flight", &self.advertised.flight),
            ("advertised.kafka", &self.advertised.kafka),
        ] {
            if let Some(addr) = addr {
                let ok = addr
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !ok {
                    return Err(ConfigError(format!("{key}: {addr:?} is not host:port")));
                }
            }
        }
        if self.object_store.secret_access_key.as_deref() == Some(mink_wal::REDACTED) {
            return Err(ConfigError(format!(
                "object_store.secret_access_key is {:?}, the placeholder of a printed \
                 configuration: give the secret itself",
                mink_wal::REDACTED
            )));
        }
        self.wal.validate().map_err(ConfigError)?;
        self.log.validate().map_err(ConfigError)?;
        self.kv.validate().map_err(ConfigError)?;
        self.meta.validate().map_err(ConfigError)?;
        self.flight.validate().map_err(ConfigError)?;
        self.writes.validate().map_err(ConfigError)?;
        self.kafka.validate().map_err(ConfigError)?;
        // Every batch within kafka.max_message_bytes must fit a log batch once it is
        // Arrow rows (up to about three times its Kafka size for tiny records).
        if self.kafka.max_message_bytes.saturating_mul(3) > self.log.batch_bytes_max {
            return Err(ConfigError(format!(
                "kafka.max_message_bytes ({}) must be at most a third of log.batch_bytes_max ({})",
                self.kafka.max_message_bytes, self.log.batch_bytes_max
            )));
        }
        self.lake.validate().map_err(ConfigError)?;
        Ok(())
    }

    /// The Flight address clients are told to use.
    pub fn advertised_flight(&self) -> String {
        self.advertised
            .flight
            .clone()
            .unwrap_or_else(|| self.listeners.flight.to_string())
    }

    /// This configuration as it may be shown (`get_config`, `--print-config`): secrets,
    /// when set, are `"<redacted>"` ([`mink_wal::REDACTED`]). `Debug` redacts them too.
    pub fn redacted(&self) -> Self {
        Self {
            object_store: self.object_store.redacted(),
            ..self.clone()
        }
    }

    /// The effective configuration as TOML (`mink-node --print-config`), secrets
    /// redacted.
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.redacted()).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Figment's errors name the key as `default.a.b`; drop the profile prefix and keep
/// the rest (the value, the expectation, the source file or variable).
fn render_figment_error(err: figment::Error) -> String {
    err.into_iter()
        .map(|e| {
            let mut text = e.to_string();
            if let Some(path) = (!e.path.is_empty()).then(|| e.path.join(".")) {
                text = text.replace(&format!("default.{path}"), &path);
            }
            text
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment's Jail closures return figment::Error
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn defaults_match_the_documentation() {
        Jail::expect_with(|_jail| {
            let config = MinkConfig::load(None).unwrap();
            assert_eq!(config.node_id, "node-1");
            assert_eq!(config.listeners.flight.to_string(), "127.0.0.1:9120");
            assert_eq!(config.listeners.kafka.to_string(), "127.0.0.1:9092");
            assert_eq!(config.listeners.admin.to_string(), "127.0.0.1:9121");
            assert_eq!(config.listeners.iceberg_rest.to_string(), "127.0.0.1:9181");
            assert!(config.iceberg_rest.enabled && !config.iceberg_rest.vend_credentials);
            assert!(config.object_store.url.starts_with("file:///"));
            assert!(config.object_store.url.ends_with("mink-data/objects"));
            assert_eq!(config.kafka.max_request_bytes, 100 << 20);
            assert_eq!(config.kafka.max_fetch_bytes, 50 << 20);
            assert_eq!(config.kafka.max_in_flight, 64);
            assert_eq!(config.kafka.fetch_max_wait_cap_ms, 30_000);
            assert_eq!(config.kafka.session_timeout_min_ms, 6_000);
            assert_eq!(config.kafka.session_timeout_max_ms, 1_800_000);
            assert_eq!(config.kafka.group_offsets_ttl_ms, 604_800_000);
            assert_eq!(config.kafka.database, "kafka");
            assert_eq!(config.kv.backend, mink_kv::KvBackend::Fjall);
            // A local directory bills no requests: no PUT budget, no linger.
            assert_eq!(config.wal.linger_ms, Some(0));
            assert_eq!(config.wal.put_rate_max, Some(0));
            Ok(())
        });
    }

    #[test]
    fn an_s3_store_gets_a_put_budget_unless_one_is_set() {
        Jail::expect_with(|jail| {
            jail.set_env("MINK_OBJECT_STORE__URL", "s3://bucket/prefix");
            let config = MinkConfig::load(None).unwrap();
            assert_eq!(
                config.wal.put_rate_max,
                Some(mink_wal::DEFAULT_PUT_RATE_MAX)
            );
            assert_eq!(
                config.wal.linger_ms,
                Some(mink_wal::DEFAULT_BUDGET_LINGER_MS)
            );
            jail.set_env("MINK_WAL__PUT_RATE_MAX", "0");
            let config = MinkConfig::load(None).unwrap();
            assert_eq!(config.wal.put_rate_max, Some(0));
            assert_eq!(config.wal.linger_ms, Some(0));
            Ok(())
        });
    }

    #[test]
    fn file_then_environment_override_defaults() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "mink.toml",
                "node_id = \"n7\"\n[wal]\nlinger_ms = 3\n[kv]\nbackend = \"redb\"\n",
            )?;
            jail.set_env("MINK_WAL__LINGER_MS", "9");
            jail.set_env("MINK_ADDR", "somewhere:1");
            let config = MinkConfig::load(None).unwrap();
            assert_eq!(config.node_id, "n7");
            assert_eq!(config.wal.linger_ms, Some(9));
            assert_eq!(config.kv.backend, mink_kv::KvBackend::Redb);
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "[wal]\nlinger_mss = 3\n")?;
            let err = MinkConfig::load(Some(Path::new("bad.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("linger_mss"), "{err}");
            assert!(err.contains("wal"), "{err}");

            jail.create_file("bad2.toml", "[kafka]\nmax_in_flight = \"many\"\n")?;
            let err = MinkConfig::load(Some(Path::new("bad2.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("kafka.max_in_flight"), "{err}");

            jail.create_file("bad3.toml", "[kafka]\nmax_in_flight = 0\n")?;
            let err = MinkConfig::load(Some(Path::new("bad3.toml")))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("kafka.max_in_flight must be at least 1"),
                "{err}"
            );

            jail.create_file("bad4.toml", "[kafka]\nmax_message_bytes = 8388608\n")?;
            let err = MinkConfig::load(Some(Path::new("bad4.toml")))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("must be at most a third of log.batch_bytes_max"),
                "{err}"
            );

            let err = MinkConfig::load(Some(Path::new("missing.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("missing.toml does not exist"), "{err}");

            jail.set_env("MINK_NODE_ID", "7");
            assert_eq!(MinkConfig::load(None).unwrap().node_id, "7");

            jail.set_env("MINK_NODE_ID", "bad id");
            let err = MinkConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("node_id"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_secret_key_is_redacted_in_debug_and_printed_config() {
        Jail::expect_with(|jail| {
            jail.set_env("MINK_OBJECT_STORE__ACCESS_KEY_ID", "AKIDSHOWN");
            jail.set_env("MINK_OBJECT_STORE__SECRET_ACCESS_KEY", "s3cr3t-value");
            let config = MinkConfig::load(None).unwrap();
            assert_eq!(
                config.object_store.secret_access_key.as_deref(),
                Some("s3cr3t-value"),
                "the node itself still has the secret"
            );
            let debug = format!("{config:?}");
            assert!(!debug.contains("s3cr3t-value"), "{debug}");
            assert!(debug.contains("<redacted>"), "{debug}");
            let printed = config.to_toml();
            assert!(!printed.contains("s3cr3t-value"), "{printed}");
            let table: toml::Table = toml::from_str(&printed).unwrap();
            assert_eq!(
                table["object_store"]["secret_access_key"].as_str(),
                Some("<redacted>")
            );
            assert_eq!(
                table["object_store"]["access_key_id"].as_str(),
                Some("AKIDSHOWN")
            );
            // A printed configuration fed back is refused rather than used with the
            // placeholder as the secret.
            jail.create_file("printed.toml", &printed)?;
            jail.clear_env();
            let err = MinkConfig::load(Some(Path::new("printed.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("object_store.secret_access_key"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn printed_config_loads_back_to_the_same_config() {
        Jail::expect_with(|jail| {
            let config = MinkConfig::load(None).unwrap();
            jail.create_file("printed.toml", &config.to_toml())?;
            let again = MinkConfig::load(Some(Path::new("printed.toml"))).unwrap();
            assert_eq!(again, config);
            Ok(())
        });
    }
}
