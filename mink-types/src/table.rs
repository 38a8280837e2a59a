//! Table descriptors: schema, keys, bucketing and properties, with their validation.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{DataType, MinkError, Result, Schema};

/// The most buckets one table (or one partition of it) may have.
pub const BUCKET_COUNT_MAX: u32 = 1024;

/// How rows with bucket keys are assigned to buckets. See [`crate::bucketing`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketingRule {
    /// murmur3 x86 32-bit (seed 0) of the canonical key encoding of the bucket keys.
    #[default]
    Hash,
    /// Iceberg's bucket transform of a single bucket-key column.
    Iceberg,
    /// Kafka's default partitioner over a single BYTES bucket key (a compacted
    /// topic's record key): murmur2 of the bytes, made positive, modulo the buckets.
    Kafka,
}

/// How long log data is kept: a duration such as `7d`, `12h`, `30m`, or `forever`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LogTtl(pub Option<Duration>);

impl Default for LogTtl {
    fn default() -> Self {
        LogTtl(Some(Duration::from_secs(7 * 24 * 3600)))
    }
}

impl FromStr for LogTtl {
    type Err = MinkError;
    fn from_str(text: &str) -> Result<Self> {
        if text.eq_ignore_ascii_case("forever") {
            return Ok(LogTtl(None));
        }
        let ttl = humantime::parse_duration(text).map_err(|e| {
            MinkError::invalid(
                "properties.log_ttl",
                format!("{text:?} is not a duration such as 7d, 12h or forever: {e}"),
            )
        })?;
        if ttl.is_zero() {
            return Err(MinkError::invalid(
                "properties.log_ttl",
                "must be longer than zero",
            ));
        }
        Ok(LogTtl(Some(ttl)))
    }
}

impl fmt::Display for LogTtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("forever"),
            Some(d) => write!(f, "{}", humantime::format_duration(d)),
        }
    }
}

impl TryFrom<String> for LogTtl {
    type Error = MinkError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<LogTtl> for String {
    fn from(ttl: LogTtl) -> String {
        ttl.to_string()
    }
}

/// One aggregation function of the `aggregation` merge engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum AggFunction {
    Sum,
    Product,
    Max,
    Min,
    LastValue,
    LastValueIgnoreNulls,
    FirstValue,
    FirstValueIgnoreNulls,
    BoolAnd,
    BoolOr,
    /// Concatenates strings with `delimiter` (`listagg` is `listagg(,)`).
    Listagg {
        delimiter: String,
    },
}

impl AggFunction {
    /// Checks that the function applies to a column of type `ty`.
    pub fn check_type(&self, column: &str, ty: DataType) -> Result<()> {
        let ok = match self {
            AggFunction::Sum | AggFunction::Product => ty.is_numeric(),
            AggFunction::Max | AggFunction::Min => {
                !matches!(ty, DataType::Boolean | DataType::Bytes)
            }
            AggFunction::BoolAnd | AggFunction::BoolOr => ty == DataType::Boolean,
            AggFunction::Listagg { .. } => ty == DataType::String,
            AggFunction::LastValue
            | AggFunction::LastValueIgnoreNulls
            | AggFunction::FirstValue
            | AggFunction::FirstValueIgnoreNulls => true,
        };
        if ok {
            Ok(())
        } else {
            Err(MinkError::invalid(
                format!("properties.merge_engine.functions.{column}"),
                format!("{self} does not apply to a {ty} column"),
            ))
        }
    }
}

impl fmt::Display for AggFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            AggFunction::Sum => "sum",
            AggFunction::Product => "product",
            AggFunction::Max => "max",
            AggFunction::Min => "min",
            AggFunction::LastValue => "last_value",
            AggFunction::LastValueIgnoreNulls => "last_value_ignore_nulls",
            AggFunction::FirstValue => "first_value",
            AggFunction::FirstValueIgnoreNulls => "first_value_ignore_nulls",
            AggFunction::BoolAnd => "bool_and",
            AggFunction::BoolOr => "bool_or",
            AggFunction::Listagg { delimiter } if delimiter == "," => "listagg",
            AggFunction::Listagg { delimiter } => return write!(f, "listagg({delimiter})"),
        };
        f.write_str(name)
    }
}

impl FromStr for AggFunction {
    type Err = MinkError;
    fn from_str(text: &str) -> Result<Self> {
        Ok(match text {
            "sum" => AggFunction::Sum,
            "product" => AggFunction::Product,
            "max" => AggFunction::Max,
            "min" => AggFunction::Min,
            "last_value" => AggFunction::LastValue,
            "last_value_ignore_nulls" => AggFunction::LastValueIgnoreNulls,
            "first_value" => AggFunction::FirstValue,
            "first_value_ignore_nulls" => AggFunction::FirstValueIgnoreNulls,
            "bool_and" => AggFunction::BoolAnd,
            "bool_or" => AggFunction::BoolOr,
            "listagg" => AggFunction::Listagg {
                delimiter: ",".into(),
            },
            other => match other
                .strip_prefix("listagg(")
                .and_then(|rest| rest.strip_suffix(')'))
            {
                Some(delimiter) => AggFunction::Listagg {
                    delimiter: delimiter.into(),
                },
                None => {
                    return Err(MinkError::invalid(
                        "aggregation function",
                        format!(
                            "{other:?} is not one of sum, product, max, min, last_value, \
                             last_value_ignore_nulls, first_value, first_value_ignore_nulls, \
                             bool_and, bool_or, listagg, listagg(DELIMITER)"
                        ),
                    ));
                }
            },
        })
    }
}

impl TryFrom<String> for AggFunction {
    type Error = MinkError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<AggFunction> for String {
    fn from(f: AggFunction) -> String {
        f.to_string()
    }
}

/// How a primary-key table merges a new row into the row stored under its key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum MergeEngine {
    /// Keep the newest row. Supports partial updates and deletes.
    #[default]
    LastRow,
    /// Keep the first row; later upserts are ignored; the changelog is insert-only.
    FirstRow,
    /// Take the new row when `new.column >= old.column`; a null version never updates.
    Versioned { column: String },
    /// Combine old and new per column; columns not listed use `last_value_ignore_nulls`.
    Aggregation {
        #[serde(default)]
        functions: BTreeMap<String, AggFunction>,
    },
}

impl MergeEngine {
    pub fn name(&self) -> &'static str {
        match self {
            MergeEngine::LastRow => "last_row",
            MergeEngine::FirstRow => "first_row",
            MergeEngine::Versioned { .. } => "versioned",
            MergeEngine::Aggregation { .. } => "aggregation",
        }
    }
}

/// What a delete (a `-D` row of a Put) does on a primary-key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteBehavior {
    /// Deletes remove the row (only with `last_row`).
    Allow,
    /// Deletes are dropped silently.
    Ignore,
    /// A batch holding a delete is rejected.
    Disable,
}

impl FromStr for DeleteBehavior {
    type Err = MinkError;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "allow" => Ok(DeleteBehavior::Allow),
            "ignore" => Ok(DeleteBehavior::Ignore),
            "disable" => Ok(DeleteBehavior::Disable),
            other => Err(MinkError::invalid(
                "properties.delete_behavior",
                format!("{other:?} is not one of allow, ignore, disable"),
            )),
        }
    }
}

/// What a primary-key table's changelog carries for an update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangelogImage {
    /// `+I` for a new key; `-U` (the old row) then `+U` for a changed one; nothing for
    /// an unchanged one; `-D` (the old row) for a delete. Every change is known, so a
    /// Put reads each key's old row.
    #[default]
    Full,
    /// No `-U` images. A `last_row` Put of full rows without deletes reads nothing: each
    /// row is a `+U`, whether its key is new, changed or unchanged (Fluss's `WAL`
    /// image). Other Puts still read old rows where the merge needs them (partial
    /// updates, deletes, the other merge engines) and emit `+I`, `+U` and `-D` as
    /// `full` does, without `-U`. For consumers that apply rows by key (the lake, a
    /// replica of the table), not for ones that need the row an update replaced.
    Wal,
}

impl FromStr for ChangelogImage {
    type Err = MinkError;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "full" => Ok(ChangelogImage::Full),
            "wal" => Ok(ChangelogImage::Wal),
            other => Err(MinkError::invalid(
                "properties.changelog_image",
                format!("{other:?} is not one of full, wal"),
            )),
        }
    }
}

impl ChangelogImage {
    fn is_full(&self) -> bool {
        *self == ChangelogImage::Full
    }
}

/// How a table's rows are compressed where they are stored (WAL records, log segments,
/// KV snapshots): Arrow IPC's own body compression, which every Arrow reader
/// understands. The default is `zstd` at a fast level. A change applies to what is
/// written from then on; what was written before stays readable as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    Zstd,
    Lz4,
    None,
}

impl FromStr for Compression {
    type Err = MinkError;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "zstd" => Ok(Compression::Zstd),
            "lz4" => Ok(Compression::Lz4),
            "none" => Ok(Compression::None),
            other => Err(MinkError::invalid(
                "properties.compression",
                format!("{other:?} is not one of zstd, lz4, none"),
            )),
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::None => "none",
        })
    }
}

/// The zstd level of [`Compression::Zstd`]: the fastest of the regular levels. Rows
/// are compressed on the write path, before an append is acknowledged; level 1 keeps
/// most of zstd's ratio on columnar data at several times the speed of the default 3.
pub const ZSTD_LEVEL: i32 = 1;

impl Compression {
    fn is_default(&self) -> bool {
        *self == Compression::default()
    }

    /// Arrow's IPC codec for it (`None` for none).
    pub fn ipc_codec(self) -> Option<arrow::ipc::CompressionType> {
        match self {
            Compression::None => None,
            Compression::Zstd => Some(arrow::ipc::CompressionType::ZSTD),
            Compression::Lz4 => Some(arrow::ipc::CompressionType::LZ4_FRAME),
        }
    }

    /// IPC write options that compress bodies with it.
    pub fn ipc_options(self) -> arrow::ipc::writer::IpcWriteOptions {
        let options = arrow::ipc::writer::IpcWriteOptions::default();
        let with = match self {
            Compression::None => return options,
            Compression::Zstd => options
                .try_with_compression(self.ipc_codec())
                .and_then(|o| o.try_with_compression_level(Some(ZSTD_LEVEL))),
            Compression::Lz4 => options.try_with_compression(self.ipc_codec()),
        };
        with.expect("arrow is built with IPC compression")
    }
}

/// Table properties. Set through JSON or, one key at a time, with [`TableProperties::set`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableProperties {
    /// How long log data is kept (default 7 days).
    #[serde(default)]
    pub log_ttl: LogTtl,
    /// The merge engine of a primary-key table (default `last_row`).
    #[serde(default)]
    pub merge_engine: MergeEngine,
    /// What deletes do; default `allow` for `last_row`, `ignore` for the other engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_behavior: Option<DeleteBehavior>,
    /// What a primary-key table's changelog carries (default `full`).
    #[serde(default, skip_serializing_if = "ChangelogImage::is_full")]
    pub changelog_image: ChangelogImage,
    /// How stored rows are compressed (default `zstd`).
    #[serde(default, skip_serializing_if = "Compression::is_default")]
    pub compression: Compression,
    /// Tiering to the lake (Apache Iceberg on the same object store).
    #[serde(default, skip_serializing_if = "LakeProperties::is_off_by_default")]
    pub lake: LakeProperties,
    /// Settings kept with the table for the layers above storage, which storage does
    /// not read: the Kafka listener keeps a topic's Kafka configs here (`kafka.` and
    /// the config's name). At most [`CUSTOM_PROPERTIES_MAX`] entries, keys of
    /// `[a-zA-Z0-9._-]` up to [`CUSTOM_KEY_BYTES_MAX`] bytes, values up to
    /// [`CUSTOM_VALUE_BYTES_MAX`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, String>,
}

/// The most custom properties a table keeps.
pub const CUSTOM_PROPERTIES_MAX: usize = 64;
/// The longest custom property key, in bytes.
pub const CUSTOM_KEY_BYTES_MAX: usize = 128;
/// The longest custom property value, in bytes.
pub const CUSTOM_VALUE_BYTES_MAX: usize = 1024;

/// Names of the columns every lake table carries besides the table's own: the bucket
/// a row came from, its log offset and its commit timestamp. A table tiered to the lake
/// may not have columns of these names.
pub const LAKE_SYSTEM_COLUMNS: [&str; 3] = ["__bucket", "__offset", "__timestamp"];

/// The shortest and longest `lake.freshness`.
pub const LAKE_FRESHNESS_MIN: Duration = Duration::from_secs(1);
pub const LAKE_FRESHNESS_MAX: Duration = Duration::from_secs(24 * 3600);

/// Whether and how often a table is tiered to the lake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LakeProperties {
    #[serde(default)]
    pub enabled: bool,
    /// How far the lake may lag the log: each bucket is tiered this often.
    #[serde(default = "default_freshness", with = "humantime_serde_duration")]
    pub freshness: Duration,
    /// A time partition of the lake table (an Iceberg `year`/`month`/`day`/`hour`
    /// transform of a column) beside the identity partitions of the partition keys,
    /// without making it a Mink partition key: engines prune on it. Log tables only;
    /// fixed when the table is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<LakePartition>,
}

/// An Iceberg time transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeTransform {
    Year,
    Month,
    Day,
    Hour,
}

impl TimeTransform {
    /// The transform's Iceberg name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Year => "year",
            Self::Month => "month",
            Self::Day => "day",
            Self::Hour => "hour",
        }
    }
}

/// `lake.partition`: a time transform of a column, written `day(ts)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LakePartition {
    pub transform: TimeTransform,
    pub column: String,
}

impl fmt::Display for LakePartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.transform.as_str(), self.column)
    }
}

impl FromStr for LakePartition {
    type Err = MinkError;

    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            MinkError::invalid(
                "properties.lake.partition",
                format!(
                    "{text:?} is not a time transform of a column: year(COLUMN), \
                     month(COLUMN), day(COLUMN) or hour(COLUMN)"
                ),
            )
        };
        let (name, rest) = text.trim().split_once('(').ok_or_else(bad)?;
        let column = rest.strip_suffix(')').ok_or_else(bad)?.trim();
        let transform = match name.trim() {
            "year" => TimeTransform::Year,
            "month" => TimeTransform::Month,
            "day" => TimeTransform::Day,
            "hour" => TimeTransform::Hour,
            _ => return Err(bad()),
        };
        if column.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            transform,
            column: column.to_string(),
        })
    }
}

impl TryFrom<String> for LakePartition {
    type Error = MinkError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<LakePartition> for String {
    fn from(p: LakePartition) -> String {
        p.to_string()
    }
}

fn default_freshness() -> Duration {
    Duration::from_secs(60)
}

impl Default for LakeProperties {
    fn default() -> Self {
        Self {
            enabled: false,
            freshness: default_freshness(),
            partition: None,
        }
    }
}

impl LakeProperties {
    fn is_off_by_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `Duration` as humantime text (`"1m"`, `"30s"`) in JSON.
mod humantime_serde_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

impl TableProperties {
    /// The effective delete behaviour.
    pub fn delete_behavior(&self) -> DeleteBehavior {
        self.delete_behavior.unwrap_or(match self.merge_engine {
            MergeEngine::LastRow => DeleteBehavior::Allow,
            _ => DeleteBehavior::Ignore,
        })
    }

    /// Sets one property from its text form, as `--property k=v` and Kafka configs do:
    /// `log_ttl=7d`, `merge_engine=last_row|first_row|aggregation`,
    /// `merge_engine=versioned(COLUMN)`, `aggregation.COLUMN=FUNCTION`,
    /// `delete_behavior=allow|ignore|disable`, `changelog_image=full|wal`,
    /// `compression=zstd|lz4|none`. Unknown keys are an error naming the key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "log_ttl" => self.log_ttl = value.parse()?,
            "compression" => self.compression = value.parse()?,
            "changelog_image" => self.changelog_image = value.parse()?,
            "delete_behavior" => self.delete_behavior = Some(value.parse()?),
            "lake.enabled" => {
                self.lake.enabled = match value {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(MinkError::invalid(
                            "properties.lake.enabled",
                            format!("{other:?} is not true or false"),
                        ));
                    }
                }
            }
            "lake.freshness" => {
                self.lake.freshness = humantime::parse_duration(value).map_err(|e| {
                    MinkError::invalid(
                        "properties.lake.freshness",
                        format!("{value:?} is not a duration such as 1m or 30s: {e}"),
                    )
                })?
            }
            "lake.partition" => {
                self.lake.partition = match value.trim() {
                    "" | "none" => None,
                    text => Some(text.parse()?),
                }
            }
            "merge_engine" => {
                self.merge_engine = match value {
                    "last_row" => MergeEngine::LastRow,
                    "first_row" => MergeEngine::FirstRow,
                    "aggregation" => match &self.merge_engine {
                        agg @ MergeEngine::Aggregation { .. } => agg.clone(),
                        _ => MergeEngine::Aggregation {
                            functions: BTreeMap::new(),
                        },
                    },
                    other => match other
                        .strip_prefix("versioned(")
                        .and_then(|rest| rest.strip_suffix(')'))
                    {
                        Some(column) => MergeEngine::Versioned {
                            column: column.to_string(),
                        },
                        None => {
                            return Err(MinkError::invalid(
                                "properties.merge_engine",
                                format!(
                                    "{other:?} is not one of last_row, first_row, \
                                     versioned(COLUMN), aggregation"
                                ),
                            ));
                        }
                    },
                }
            }
            _ => match key.strip_prefix("aggregation.") {
                Some(column) => {
                    let function: AggFunction = value.parse()?;
                    match &mut self.merge_engine {
                        MergeEngine::Aggregation { functions } => {
                            functions.insert(column.to_string(), function);
                        }
                        _ => {
                            self.merge_engine = MergeEngine::Aggregation {
                                functions: BTreeMap::from([(column.to_string(), function)]),
                            }
                        }
                    }
                }
                None => {
                    return Err(MinkError::invalid(
                        format!("properties.{key}"),
                        "unknown property; known: log_ttl, merge_engine, aggregation.COLUMN, \
                         delete_behavior, changelog_image, compression, lake.enabled, \
                         lake.freshness, lake.partition",
                    ));
                }
            },
        }
        Ok(())
    }
}

/// Everything that defines a table, as `create_table` receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableDescriptor {
    pub schema: Schema,
    /// Primary-key columns; empty for a log table.
    #[serde(default)]
    pub primary_key: Vec<String>,
    /// Columns whose values name the partition; empty for an unpartitioned table.
    #[serde(default)]
    pub partition_keys: Vec<String>,
    /// Columns hashed to pick the bucket. Defaults to the primary key minus the
    /// partition keys for primary-key tables, and to none (round-robin) for log tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_keys: Option<Vec<String>>,
    /// Buckets per table (or per partition), `1..=BUCKET_COUNT_MAX`.
    #[serde(default = "one")]
    pub bucket_count: u32,
    #[serde(default)]
    pub bucketing: BucketingRule,
    #[serde(default)]
    pub properties: TableProperties,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

fn one() -> u32 {
    1
}

fn check_columns(schema: &Schema, field: &str, names: &[String]) -> Result<()> {
    for (i, name) in names.iter().enumerate() {
        if schema.index_of(name).is_none() {
            return Err(MinkError::invalid(
                format!("{field}[{i}]"),
                format!("column {name:?} is not in the schema"),
            ));
        }
        if names[..i].contains(name) {
            return Err(MinkError::invalid(
                format!("{field}[{i}]"),
                format!("column {name:?} is listed twice"),
            ));
        }
    }
    Ok(())
}

impl TableDescriptor {
    /// A log table with these columns and default everything else.
    pub fn log_table(schema: Schema) -> Self {
        Self {
            schema,
            primary_key: vec![],
            partition_keys: vec![],
            bucket_keys: None,
            bucket_count: 1,
            bucketing: BucketingRule::Hash,
            properties: TableProperties::default(),
            comment: None,
        }
    }

    /// Whether this is a primary-key table.
    pub fn has_primary_key(&self) -> bool {
        !self.primary_key.is_empty()
    }

    /// Whether the table is partitioned.
    pub fn is_partitioned(&self) -> bool {
        !self.partition_keys.is_empty()
    }

    /// The effective bucket keys (see the field's doc for the default).
    pub fn bucket_keys(&self) -> Vec<String> {
        match &self.bucket_keys {
            Some(keys) => keys.clone(),
            None => self
                .primary_key
                .iter()
                .filter(|c| !self.partition_keys.contains(c))
                .cloned()
                .collect(),
        }
    }

    /// Validates the whole descriptor; every error names the offending field.
    pub fn validate(&self) -> Result<()> {
        let schema = &self.schema;
        schema.validate()?;
        check_columns(schema, "primary_key", &self.primary_key)?;
        check_columns(schema, "partition_keys", &self.partition_keys)?;
        let bucket_keys = self.bucket_keys();
        check_columns(schema, "bucket_keys", &bucket_keys)?;

        if !(1..=BUCKET_COUNT_MAX).contains(&self.bucket_count) {
            return Err(MinkError::invalid(
                "bucket_count",
                format!("{} is outside 1..={BUCKET_COUNT_MAX}", self.bucket_count),
            ));
        }

        for (i, name) in self.primary_key.iter().enumerate() {
            if schema.column(name).is_some_and(|c| c.nullable) {
                return Err(MinkError::invalid(
                    format!("primary_key[{i}]"),
                    format!("primary-key column {name:?} must be NOT NULL"),
                ));
            }
        }

        for (i, name) in self.partition_keys.iter().enumerate() {
            let ty = schema.column(name).map(|c| c.data_type);
            if !matches!(
                ty,
                Some(
                    DataType::String
                        | DataType::Boolean
                        | DataType::TinyInt
                        | DataType::SmallInt
                        | DataType::Int
                        | DataType::BigInt
                        | DataType::Date
                )
            ) {
                return Err(MinkError::invalid(
                    format!("partition_keys[{i}]"),
                    format!(
                        "column {name:?} is {}; partition keys must be STRING, BOOLEAN, an integer type or DATE",
                        ty.map(|t| t.to_string()).unwrap_or_default()
                    ),
                ));
            }
        }

        if self.has_primary_key() {
            for (i, name) in self.partition_keys.iter().enumerate() {
                if !self.primary_key.contains(name) {
                    return Err(MinkError::invalid(
                        format!("partition_keys[{i}]"),
                        format!(
                            "partition key {name:?} must be part of the primary key of a primary-key table"
                        ),
                    ));
                }
            }
            if bucket_keys.is_empty() {
                return Err(MinkError::invalid(
                    "bucket_keys",
                    "a primary-key table needs at least one bucket key: the primary key must hold a column that is not a partition key",
                ));
            }
            for (i, name) in bucket_keys.iter().enumerate() {
                if !self.primary_key.contains(name) || self.partition_keys.contains(name) {
                    return Err(MinkError::invalid(
                        format!("bucket_keys[{i}]"),
                        format!(
                            "bucket key {name:?} must be a primary-key column that is not a partition key"
                        ),
                    ));
                }
            }
        }

        self.validate_bucketing(&bucket_keys)?;

        self.validate_properties()
    }

    /// The bucketing rule against the bucket keys: the kafka and iceberg rules take
    /// one key, of a type they hash.
    fn validate_bucketing(&self, bucket_keys: &[String]) -> Result<()> {
        let schema = &self.schema;
        let rule = match self.bucketing {
            BucketingRule::Hash => return Ok(()),
            BucketingRule::Kafka => "kafka",
            BucketingRule::Iceberg => "iceberg",
        };
        let [key] = bucket_keys else {
            return Err(MinkError::invalid(
                "bucketing",
                format!(
                    "the {rule} rule needs exactly one bucket key, the table has {}",
                    bucket_keys.len()
                ),
            ));
        };
        let ty = schema.column(key).map(|c| c.data_type);
        match self.bucketing {
            BucketingRule::Kafka if ty != Some(DataType::Bytes) => Err(MinkError::invalid(
                "bucketing",
                format!("the kafka rule buckets a BYTES column; {key:?} is not one"),
            )),
            BucketingRule::Iceberg
                if matches!(
                    ty,
                    Some(DataType::Boolean | DataType::Float | DataType::Double)
                ) =>
            {
                Err(MinkError::invalid(
                    "bucketing",
                    format!(
                        "the iceberg rule cannot bucket {} column {key:?}",
                        ty.map(|t| t.to_string()).unwrap_or_default()
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// `lake.partition`: a log table's time column (an hour of a date is no
    /// partition).
    fn validate_lake_partition(&self, partition: &LakePartition) -> Result<()> {
        let key = "properties.lake.partition";
        if self.has_primary_key() {
            return Err(MinkError::invalid(
                key,
                "is for log tables: a primary-key table's lake holds its state, whose rows \
                 move as they change",
            ));
        }
        let ty = self
            .schema
            .column(&partition.column)
            .map(|c| c.data_type)
            .ok_or_else(|| {
                MinkError::invalid(key, format!("{:?} is not a column", partition.column))
            })?;
        match (ty, partition.transform) {
            (DataType::Timestamp { .. } | DataType::TimestampLtz { .. }, _) => Ok(()),
            (DataType::Date, t) if t != TimeTransform::Hour => Ok(()),
            _ => Err(MinkError::invalid(
                key,
                format!(
                    "{partition}: column {:?} is {ty}; a time partition takes a TIMESTAMP, \
                     TIMESTAMP_LTZ or (but for hour) DATE column",
                    partition.column
                ),
            )),
        }
    }

    fn validate_lake(&self) -> Result<()> {
        let lake = &self.properties.lake;
        if !(LAKE_FRESHNESS_MIN..=LAKE_FRESHNESS_MAX).contains(&lake.freshness) {
            return Err(MinkError::invalid(
                "properties.lake.freshness",
                format!(
                    "{} is outside {}..={}",
                    humantime::format_duration(lake.freshness),
                    humantime::format_duration(LAKE_FRESHNESS_MIN),
                    humantime::format_duration(LAKE_FRESHNESS_MAX)
                ),
            ));
        }
        if let Some(partition) = &lake.partition {
            self.validate_lake_partition(partition)?;
        }
        if !lake.enabled {
            return Ok(());
        }
        for name in &self.primary_key {
            if let Some(
                DataType::Time { precision }
                | DataType::Timestamp { precision }
                | DataType::TimestampLtz { precision },
            ) = self.schema.column(name).map(|c| c.data_type)
                && precision > 6
            {
                return Err(MinkError::invalid(
                    "properties.lake.enabled",
                    format!(
                        "primary-key column {name:?} has precision {precision}; the lake keeps \
                         microseconds, so its keys would not match (use a precision of 6 or less)"
                    ),
                ));
            }
        }
        for name in LAKE_SYSTEM_COLUMNS {
            if self.schema.column(name).is_some() {
                return Err(MinkError::invalid(
                    "properties.lake.enabled",
                    format!(
                        "column {name:?} is reserved in the lake (with {}); rename it to tier this table",
                        LAKE_SYSTEM_COLUMNS.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_custom(&self) -> Result<()> {
        let custom = &self.properties.custom;
        if custom.len() > CUSTOM_PROPERTIES_MAX {
            return Err(MinkError::invalid(
                "properties.custom",
                format!("{} entries; at most {CUSTOM_PROPERTIES_MAX}", custom.len()),
            ));
        }
        for (key, value) in custom {
            let good_key = !key.is_empty()
                && key.len() <= CUSTOM_KEY_BYTES_MAX
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !good_key {
                return Err(MinkError::invalid(
                    "properties.custom",
                    format!("key {key:?}: 1 to {CUSTOM_KEY_BYTES_MAX} bytes of [a-zA-Z0-9._-]"),
                ));
            }
            if value.len() > CUSTOM_VALUE_BYTES_MAX {
                return Err(MinkError::invalid(
                    "properties.custom",
                    format!(
                        "the value of {key} is {} bytes; at most {CUSTOM_VALUE_BYTES_MAX}",
                        value.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_properties(&self) -> Result<()> {
        self.validate_lake()?;
        self.validate_custom()?;
        let props = &self.properties;
        let engine = &props.merge_engine;
        if !self.has_primary_key() {
            if *engine != MergeEngine::LastRow {
                return Err(MinkError::invalid(
                    "properties.merge_engine",
                    "only primary-key tables have a merge engine",
                ));
            }
            if props.delete_behavior.is_some() {
                return Err(MinkError::invalid(
                    "properties.delete_behavior",
                    "only primary-key tables take deletes",
                ));
            }
            if !props.changelog_image.is_full() {
                return Err(MinkError::invalid(
                    "properties.changelog_image",
                    "only primary-key tables have a changelog",
                ));
            }
            return Ok(());
        }
        match engine {
            MergeEngine::LastRow | MergeEngine::FirstRow => {}
            MergeEngine::Versioned { column } => {
                let ty = self.schema.column(column).map(|c| c.data_type);
                match ty {
                    None => {
                        return Err(MinkError::invalid(
                            "properties.merge_engine.column",
                            format!("version column {column:?} is not in the schema"),
                        ));
                    }
                    Some(
                        DataType::Int
                        | DataType::BigInt
                        | DataType::Timestamp { .. }
                        | DataType::TimestampLtz { .. },
                    ) => {}
                    Some(other) => {
                        return Err(MinkError::invalid(
                            "properties.merge_engine.column",
                            format!(
                                "version column {column:?} is {other}; it must be INT, BIGINT, TIMESTAMP or TIMESTAMP_LTZ"
                            ),
                        ));
                    }
                }
            }
            MergeEngine::Aggregation { functions } => {
                for (column, function) in functions {
                    let Some(col) = self.schema.column(column) else {
                        return Err(MinkError::invalid(
                            format!("properties.merge_engine.functions.{column}"),
                            "no such column",
                        ));
                    };
                    if self.primary_key.contains(column) {
                        return Err(MinkError::invalid(
                            format!("properties.merge_engine.functions.{column}"),
                            "primary-key columns are not aggregated",
                        ));
                    }
                    function.check_type(column, col.data_type)?;
                }
            }
        }
        if props.delete_behavior == Some(DeleteBehavior::Allow) && *engine != MergeEngine::LastRow {
            return Err(MinkError::invalid(
                "properties.delete_behavior",
                format!(
                    "the {} merge engine cannot delete rows; use ignore or disable",
                    engine.name()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Column;

    fn pk_table() -> TableDescriptor {
        TableDescriptor {
            primary_key: vec!["region".into(), "id".into()],
            partition_keys: vec!["region".into()],
            bucket_count: 4,
            ..TableDescriptor::log_table(Schema::new(
                1,
                vec![
                    Column::new("region", DataType::String, false),
                    Column::new("id", DataType::BigInt, false),
                    Column::new("ts", DataType::Timestamp { precision: 3 }, true),
                    Column::new("amount", DataType::Double, true),
                    Column::new("tags", DataType::String, true),
                    Column::new("flag", DataType::Boolean, true),
                ],
            ))
        }
    }

    fn field_of(err: MinkError) -> String {
        match err {
            MinkError::InvalidArgument { field, .. } => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn bucket_keys_default_to_primary_key_minus_partition_keys() {
        let t = pk_table();
        t.validate().unwrap();
        assert_eq!(t.bucket_keys(), vec!["id".to_string()]);
        let log = TableDescriptor::log_table(t.schema.clone());
        assert!(log.bucket_keys().is_empty());
        log.validate().unwrap();
    }

    #[test]
    fn every_rule_names_its_field() {
        let mut t = pk_table();
        t.schema.columns[1].nullable = true;
        assert_eq!(field_of(t.validate().unwrap_err()), "primary_key[1]");

        let mut t = pk_table();
        t.partition_keys = vec!["tags".into()];
        assert_eq!(field_of(t.validate().unwrap_err()), "partition_keys[0]");

        let mut t = pk_table();
        t.bucket_keys = Some(vec!["region".into()]);
        assert_eq!(field_of(t.validate().unwrap_err()), "bucket_keys[0]");

        let mut t = pk_table();
        t.bucket_keys = Some(vec!["amount".into()]);
        assert_eq!(field_of(t.validate().unwrap_err()), "bucket_keys[0]");

        let mut t = pk_table();
        t.primary_key = vec!["region".into()];
        assert_eq!(field_of(t.validate().unwrap_err()), "bucket_keys");

        let mut t = pk_table();
        t.bucket_count = 0;
        assert_eq!(field_of(t.validate().unwrap_err()), "bucket_count");

        let mut t = pk_table();
        t.primary_key.push("nope".into());
        assert_eq!(field_of(t.validate().unwrap_err()), "primary_key[2]");

        let mut t = pk_table();
        t.primary_key.push("id".into());
        assert_eq!(field_of(t.validate().unwrap_err()), "primary_key[2]");

        let mut t = pk_table();
        t.partition_keys = vec!["amount".into()];
        t.primary_key.push("amount".into());
        t.schema.columns[3].nullable = false;
        assert_eq!(field_of(t.validate().unwrap_err()), "partition_keys[0]");

        let mut t = pk_table();
        t.bucketing = BucketingRule::Iceberg;
        t.validate().unwrap();
        t.bucket_keys = Some(vec![]);
        assert_eq!(field_of(t.validate().unwrap_err()), "bucket_keys");
    }

    #[test]
    fn the_changelog_image_is_full_or_wal_and_only_for_primary_keys() {
        let mut t = pk_table();
        assert_eq!(t.properties.changelog_image, ChangelogImage::Full);
        t.properties.set("changelog_image", "wal").unwrap();
        assert_eq!(t.properties.changelog_image, ChangelogImage::Wal);
        t.validate().unwrap();
        // Kept in the JSON only when it is not the default.
        let json = serde_json::to_string(&t.properties).unwrap();
        assert!(json.contains("\"changelog_image\":\"wal\""), "{json}");
        let back: TableProperties = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t.properties);
        assert!(
            !serde_json::to_string(&TableProperties::default())
                .unwrap()
                .contains("changelog_image")
        );
        let err = t.properties.set("changelog_image", "before").unwrap_err();
        assert_eq!(field_of(err), "properties.changelog_image");
        let mut log = TableDescriptor::log_table(t.schema.clone());
        log.properties.changelog_image = ChangelogImage::Wal;
        assert_eq!(
            field_of(log.validate().unwrap_err()),
            "properties.changelog_image"
        );
    }

    #[test]
    fn merge_engines_are_validated() {
        let mut t = pk_table();
        t.properties.merge_engine = MergeEngine::Versioned {
            column: "ts".into(),
        };
        t.validate().unwrap();
        t.properties.merge_engine = MergeEngine::Versioned {
            column: "amount".into(),
        };
        let err = t.validate().unwrap_err();
        assert_eq!(field_of(err.clone()), "properties.merge_engine.column");
        assert!(err.to_string().contains("DOUBLE"));

        t.properties.merge_engine = MergeEngine::Aggregation {
            functions: BTreeMap::from([
                ("amount".into(), AggFunction::Sum),
                (
                    "tags".into(),
                    AggFunction::Listagg {
                        delimiter: ";".into(),
                    },
                ),
                ("flag".into(), AggFunction::BoolOr),
            ]),
        };
        t.validate().unwrap();
        t.properties.set("aggregation.tags", "sum").unwrap();
        assert_eq!(
            field_of(t.validate().unwrap_err()),
            "properties.merge_engine.functions.tags"
        );

        let mut t = pk_table();
        t.properties.merge_engine = MergeEngine::FirstRow;
        assert_eq!(t.properties.delete_behavior(), DeleteBehavior::Ignore);
        t.properties.delete_behavior = Some(DeleteBehavior::Allow);
        assert_eq!(
            field_of(t.validate().unwrap_err()),
            "properties.delete_behavior"
        );

        let mut log = TableDescriptor::log_table(pk_table().schema);
        log.properties.merge_engine = MergeEngine::FirstRow;
        assert_eq!(
            field_of(log.validate().unwrap_err()),
            "properties.merge_engine"
        );
    }

    #[test]
    fn properties_parse_from_text() {
        let mut p = TableProperties::default();
        assert_eq!(p.log_ttl.0, Some(Duration::from_secs(7 * 86400)));
        p.set("log_ttl", "12h").unwrap();
        assert_eq!(p.log_ttl.0, Some(Duration::from_secs(12 * 3600)));
        p.set("log_ttl", "forever").unwrap();
        assert_eq!(p.log_ttl.0, None);
        p.set("merge_engine", "versioned(ts)").unwrap();
        assert_eq!(
            p.merge_engine,
            MergeEngine::Versioned {
                column: "ts".into()
            }
        );
        p.set("aggregation.amount", "max").unwrap();
        p.set("merge_engine", "aggregation").unwrap();
        assert_eq!(
            p.merge_engine,
            MergeEngine::Aggregation {
                functions: BTreeMap::from([("amount".into(), AggFunction::Max)])
            }
        );
        assert_eq!(
            field_of(p.set("log_ttl", "soon").unwrap_err()),
            "properties.log_ttl"
        );
        assert_eq!(
            field_of(p.set("log_ttl", "0s").unwrap_err()),
            "properties.log_ttl"
        );
        assert_eq!(
            field_of(p.set("colour", "red").unwrap_err()),
            "properties.colour"
        );
        assert_eq!(
            field_of(p.set("merge_engine", "newest").unwrap_err()),
            "properties.merge_engine"
        );
        assert!(p.set("aggregation.x", "median").is_err());
    }

    #[test]
    fn descriptors_round_trip_through_json() {
        let mut t = pk_table();
        t.properties.merge_engine = MergeEngine::Aggregation {
            functions: BTreeMap::from([(
                "tags".into(),
                AggFunction::Listagg {
                    delimiter: "|".into(),
                },
            )]),
        };
        t.properties.log_ttl = "3d".parse().unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert!(
            json.contains(
                r#""merge_engine":{"type":"aggregation","functions":{"tags":"listagg(|)"}}"#
            ),
            "{json}"
        );
        assert!(json.contains(r#""log_ttl":"3days""#), "{json}");
        assert_eq!(serde_json::from_str::<TableDescriptor>(&json).unwrap(), t);

        let minimal: TableDescriptor =
            serde_json::from_str(r#"{"schema":{"columns":[{"name":"k","type":"BYTES"}]}}"#)
                .unwrap();
        assert_eq!(minimal.bucket_count, 1);
        assert_eq!(minimal.schema.schema_id, 1);
        assert_eq!(minimal.properties, TableProperties::default());
        minimal.validate().unwrap();
    }

    #[test]
    fn lake_properties_are_validated() {
        let schema = Schema::new(
            1,
            vec![
                Column::new("at", DataType::Timestamp { precision: 9 }, false),
                Column::new("v", DataType::String, true),
            ],
        );
        let mut t = TableDescriptor::log_table(schema);
        t.properties.set("lake.enabled", "true").unwrap();
        t.properties.set("lake.freshness", "30s").unwrap();
        assert_eq!(t.properties.lake.freshness, Duration::from_secs(30));
        t.validate().unwrap();
        // JSON round trip, and the default is left out.
        let json = serde_json::to_string(&t.properties).unwrap();
        assert!(
            json.contains(r#""lake":{"enabled":true,"freshness":"30s"}"#),
            "{json}"
        );
        assert!(
            !serde_json::to_string(&TableProperties::default())
                .unwrap()
                .contains("lake")
        );
        // A nanosecond key would not match itself in the lake (microseconds).
        t.primary_key = vec!["at".into()];
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("precision 9"), "{e}");
        // Bad values name the property.
        assert!(
            t.properties
                .set("lake.enabled", "yes")
                .unwrap_err()
                .to_string()
                .contains("lake.enabled")
        );
        t.primary_key.clear();
        t.properties.set("lake.freshness", "10ms").unwrap();
        assert!(
            t.validate()
                .unwrap_err()
                .to_string()
                .contains("lake.freshness")
        );
    }

    #[test]
    fn a_lake_time_partition_takes_a_log_tables_time_column() {
        let schema = Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("at", DataType::TimestampLtz { precision: 3 }, true),
                Column::new("day", DataType::Date, true),
                Column::new("v", DataType::String, true),
            ],
        );
        let mut t = TableDescriptor::log_table(schema);
        t.properties.set("lake.partition", " hour( at ) ").unwrap();
        let p = t.properties.lake.partition.clone().unwrap();
        assert_eq!(
            (p.transform, p.column.as_str()),
            (TimeTransform::Hour, "at")
        );
        assert_eq!(p.to_string(), "hour(at)");
        t.validate().unwrap();
        let json = serde_json::to_string(&t.properties).unwrap();
        assert!(json.contains(r#""partition":"hour(at)""#), "{json}");
        let back: TableProperties = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t.properties);
        for ok in ["year(day)", "month(day)", "day(day)", "day(at)"] {
            t.properties.set("lake.partition", ok).unwrap();
            t.validate().unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, says) in [
            ("hour(day)", "DATE"),
            ("day(v)", "TIMESTAMP"),
            ("day(nope)", "not a column"),
        ] {
            t.properties.set("lake.partition", bad).unwrap();
            let e = t.validate().unwrap_err().to_string();
            assert!(
                e.contains("lake.partition") && e.contains(says),
                "{bad}: {e}"
            );
        }
        for bad in ["week(at)", "day at", "day()", "(at)"] {
            let e = t
                .properties
                .set("lake.partition", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("lake.partition"), "{bad}: {e}");
        }
        t.properties.set("lake.partition", "none").unwrap();
        assert!(t.properties.lake.partition.is_none());
        // A primary-key table's lake holds its state: no time partition.
        t.properties.set("lake.partition", "day(at)").unwrap();
        t.primary_key = vec!["id".into()];
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("log tables"), "{e}");
    }
}

#[cfg(test)]
mod custom_property_tests {
    use super::*;
    use crate::{Column, DataType, Schema};

    fn with_custom(custom: BTreeMap<String, String>) -> Result<()> {
        let mut d = TableDescriptor::log_table(Schema::new(
            1,
            vec![Column::new("id", DataType::BigInt, false)],
        ));
        d.properties.custom = custom;
        d.validate()
    }

    #[test]
    fn custom_properties_are_bounded() {
        let one = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(with_custom(one("kafka.segment.bytes", "1073741824")).is_ok());
        for bad in [
            "",
            "has space",
            "slash/es",
            &"k".repeat(CUSTOM_KEY_BYTES_MAX + 1),
        ] {
            assert!(with_custom(one(bad, "v")).is_err(), "{bad:?}");
        }
        assert!(with_custom(one("k", &"v".repeat(CUSTOM_VALUE_BYTES_MAX + 1))).is_err());
        let many = (0..=CUSTOM_PROPERTIES_MAX)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(with_custom(many).is_err());
    }
}
