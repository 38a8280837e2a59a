//! Names of databases, tables and partitions, table paths and bucket addresses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{MinkError, Result};

/// The longest database, table or partition name, in characters.
pub const NAME_LEN_MAX: usize = 200;

/// How much of a client's input an error message quotes, in characters.
pub const QUOTE_CHARS_MAX: usize = 64;

/// `input` quoted for an error message: at most [`QUOTE_CHARS_MAX`] characters of it,
/// so that an error about a huge input stays small (a gRPC status travels in a header,
/// whose size is limited).
pub fn quote(input: &str) -> String {
    let mut chars = input.char_indices();
    match chars.nth(QUOTE_CHARS_MAX) {
        None => format!("{input:?}"),
        Some((cut, _)) => format!(
            "{:?}… ({} characters)",
            &input[..cut],
            input.chars().count()
        ),
    }
}

/// Checks `name` against `[A-Za-z0-9_][A-Za-z0-9_-]{0,199}`. `what` names the field in
/// the error ("database name", "table name", ...), and the error says which rule failed.
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    let invalid = |reason: String| {
        Err(MinkError::invalid(
            what,
            format!("{} {reason}", quote(name)),
        ))
    };
    let Some(first) = name.chars().next() else {
        return Err(MinkError::invalid(what, "must not be empty"));
    };
    let len = name.chars().count();
    if len > NAME_LEN_MAX {
        return invalid(format!(
            "is {len} characters long; the limit is {NAME_LEN_MAX}"
        ));
    }
    if !(first.is_ascii_alphanumeric() || first == '_') {
        return invalid(format!(
            "starts with {first:?}; the first character must be an ASCII letter, digit or '_'"
        ));
    }
    if let Some((at, bad)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return invalid(format!(
            "contains {bad:?} at position {at}; only ASCII letters, digits, '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// The longest table name, in characters: Kafka's topic-name limit, so that every
/// Kafka topic is a table under exactly its Kafka name.
pub const TABLE_NAME_LEN_MAX: usize = 249;

/// Checks a table name against Kafka's topic-name rule, `[A-Za-z0-9._-]{1,249}` but not
/// `.` or `..` (docs/decisions.md, "Table names are Kafka's topic names"). A table path
/// `database.table` still parses unambiguously: a database name has no `.`.
pub fn validate_table_name(what: &str, name: &str) -> Result<()> {
    let invalid = |reason: String| {
        Err(MinkError::invalid(
            what,
            format!("{} {reason}", quote(name)),
        ))
    };
    if name.is_empty() {
        return Err(MinkError::invalid(what, "must not be empty"));
    }
    let len = name.chars().count();
    if len > TABLE_NAME_LEN_MAX {
        return invalid(format!(
            "is {len} characters long; the limit is {TABLE_NAME_LEN_MAX}"
        ));
    }
    if name == "." || name == ".." {
        return invalid("is not a name; '.' and '..' are reserved".into());
    }
    if let Some((at, bad)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return invalid(format!(
            "contains {bad:?} at position {at}; only ASCII letters, digits, '_', '-' and '.' are allowed"
        ));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $what:literal) => {
        name_type!($(#[$doc])* $ty, $what, validate_name);
    };
    ($(#[$doc:meta])* $ty:ident, $what:literal, $validate:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $ty(String);

        impl $ty {
            /// Validates and wraps `name`.
            pub fn new(name: impl Into<String>) -> Result<Self> {
                let name = name.into();
                $validate($what, &name)?;
                Ok(Self(name))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $ty {
            type Error = MinkError;
            fn try_from(name: String) -> Result<Self> {
                Self::new(name)
            }
        }

        impl From<$ty> for String {
            fn from(name: $ty) -> String {
                name.0
            }
        }

        impl FromStr for $ty {
            type Err = MinkError;
            fn from_str(name: &str) -> Result<Self> {
                Self::new(name)
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// A validated database name.
    DatabaseName,
    "database name"
);
name_type!(
    /// A validated table name: Kafka's topic-name rule ([`validate_table_name`]).
    TableName,
    "table name",
    validate_table_name
);
name_type!(
    /// A validated partition name (the rendered partition-key values).
    PartitionName,
    "partition name"
);

/// `database.table`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TablePath {
    pub database: DatabaseName,
    pub table: TableName,
}

impl TablePath {
    pub fn new(database: DatabaseName, table: TableName) -> Self {
        Self { database, table }
    }

    /// Parses `db.table`; exactly one `.` separates two valid names.
    pub fn parse(path: &str) -> Result<Self> {
        let Some((db, table)) = path.split_once('.') else {
            return Err(MinkError::invalid(
                "table path",
                format!("{} is not of the form database.table", quote(path)),
            ));
        };
        Ok(Self {
            database: DatabaseName::new(db)?,
            table: TableName::new(table)?,
        })
    }
}

impl FromStr for TablePath {
    type Err = MinkError;
    fn from_str(path: &str) -> Result<Self> {
        Self::parse(path)
    }
}

impl TryFrom<String> for TablePath {
    type Error = MinkError;
    fn try_from(path: String) -> Result<Self> {
        Self::parse(&path)
    }
}

impl From<TablePath> for String {
    fn from(path: TablePath) -> String {
        path.to_string()
    }
}

impl fmt::Display for TablePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

/// Table ids are assigned by the metadata log and never reused.
pub type TableId = i64;
/// Partition ids are assigned by the metadata log and never reused.
pub type PartitionId = i64;
/// A bucket number in `0..bucket_count`.
pub type BucketId = u32;

/// The address of one bucket: the unit of leadership, of the log and of the KV tablet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TableBucket {
    pub table_id: TableId,
    /// `None` for a table without partition keys.
    pub partition_id: Option<PartitionId>,
    pub bucket: BucketId,
}

impl TableBucket {
    pub fn new(table_id: TableId, partition_id: Option<PartitionId>, bucket: BucketId) -> Self {
        Self {
            table_id,
            partition_id,
            bucket,
        }
    }

    /// A stable object-store-safe name: `t{table}-b{bucket}` or `t{table}-p{partition}-b{bucket}`.
    pub fn stream_name(&self) -> String {
        match self.partition_id {
            Some(p) => format!("t{}-p{}-b{}", self.table_id, p, self.bucket),
            None => format!("t{}-b{}", self.table_id, self.bucket),
        }
    }

    /// The bucket a [`TableBucket::stream_name`] names; `None` for any other text.
    pub fn from_stream_name(name: &str) -> Option<Self> {
        let rest = name.strip_prefix('t')?;
        let (table, rest) = rest.split_once('-')?;
        let (partition, bucket) = match rest.strip_prefix('p') {
            Some(rest) => {
                let (p, b) = rest.split_once('-')?;
                (Some(p), b)
            }
            None => (None, rest),
        };
        let bucket = bucket.strip_prefix('b')?;
        // Digits only (no sign, no spaces), as `stream_name` writes them.
        fn number<T: std::str::FromStr>(s: &str) -> Option<T> {
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        }
        let out = Self {
            table_id: number(table)?,
            partition_id: match partition {
                Some(p) => Some(number(p)?),
                None => None,
            },
            bucket: number(bucket)?,
        };
        (out.stream_name() == name).then_some(out)
    }
}

impl fmt::Display for TableBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.partition_id {
            Some(p) => write!(
                f,
                "table {} partition {} bucket {}",
                self.table_id, p, self.bucket
            ),
            None => write!(f, "table {} bucket {}", self.table_id, self.bucket),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_name_reads_back_as_its_bucket() {
        for b in [
            TableBucket::new(1, None, 0),
            TableBucket::new(42, Some(7), 15),
            TableBucket::new(0, Some(0), 0),
        ] {
            assert_eq!(TableBucket::from_stream_name(&b.stream_name()), Some(b));
        }
        for bad in [
            "", "t", "t1", "t1-", "t1-b", "t-b1", "t1-bx", "t1-p-b1", "t1-p2", "t01-b1", "t1-b+1",
            "t1-b1-", "x1-b1", "t1-q2-b1",
        ] {
            assert_eq!(TableBucket::from_stream_name(bad), None, "{bad:?}");
        }
    }

    fn reason(err: MinkError) -> (String, String) {
        match err {
            MinkError::InvalidArgument { field, reason } => (field, reason),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn valid_names_are_accepted() {
        for name in [
            "a",
            "_",
            "0",
            "orders",
            "Orders_2024-01",
            "_x-",
            &"a".repeat(200),
        ] {
            TableName::new(name).unwrap();
            DatabaseName::new(name).unwrap();
        }
        // Every Kafka topic name is a table name.
        for name in [
            "orders.v1",
            "server.db.table",
            "-lead",
            "...",
            ".hidden",
            &"t".repeat(249),
        ] {
            TableName::new(name).unwrap();
            assert!(DatabaseName::new(name).is_err(), "{name}");
        }
    }

    #[test]
    fn an_error_quotes_at_most_a_bounded_prefix_of_its_input() {
        let (_, why) = reason(DatabaseName::new("x".repeat(10_000)).unwrap_err());
        assert!(why.len() < 200, "{why}");
        assert!(why.contains("10000 characters"), "{why}");
        assert!(why.contains("the limit is 200"), "{why}");
        assert_eq!(quote("short"), "\"short\"");
        // Cut at a character, not inside one.
        let cut = quote(&"é".repeat(100));
        assert!(
            cut.starts_with(&format!("{:?}", "é".repeat(QUOTE_CHARS_MAX))),
            "{cut}"
        );
    }

    #[test]
    fn each_rule_has_its_own_error() {
        let (field, why) = reason(DatabaseName::new("").unwrap_err());
        assert_eq!(
            (field.as_str(), why.as_str()),
            ("database name", "must not be empty")
        );

        let (_, why) = reason(DatabaseName::new("a".repeat(201)).unwrap_err());
        assert!(
            why.contains("201 characters long; the limit is 200"),
            "{why}"
        );
        let (_, why) = reason(TableName::new("a".repeat(250)).unwrap_err());
        assert!(
            why.contains("250 characters long; the limit is 249"),
            "{why}"
        );

        let (field, why) = reason(DatabaseName::new("-orders").unwrap_err());
        assert_eq!(field, "database name");
        assert!(why.contains("starts with '-'"), "{why}");
        for reserved in [".", ".."] {
            let (field, why) = reason(TableName::new(reserved).unwrap_err());
            assert_eq!(field, "table name");
            assert!(why.contains("reserved"), "{why}");
        }
        let (_, why) = reason(TableName::new("a/b").unwrap_err());
        assert!(why.contains("'/' at position 1"), "{why}");

        let (_, why) = reason(PartitionName::new("ab.c").unwrap_err());
        assert!(why.contains("contains '.' at position 2"), "{why}");

        let (_, why) = reason(TableName::new("café").unwrap_err());
        assert!(why.contains("'é' at position 3"), "{why}");
    }

    #[test]
    fn table_paths_parse_and_display() {
        let path = TablePath::parse("sales.orders").unwrap();
        assert_eq!(path.database.as_str(), "sales");
        assert_eq!(path.table.as_str(), "orders");
        assert_eq!(path.to_string(), "sales.orders");
        assert!(TablePath::parse("orders").is_err());
        // The first '.' ends the database name; the table name may hold more.
        let dotted = TablePath::parse("kafka.server.db.orders").unwrap();
        assert_eq!(dotted.database.as_str(), "kafka");
        assert_eq!(dotted.table.as_str(), "server.db.orders");
        assert_eq!(dotted.to_string(), "kafka.server.db.orders");
        let (field, _) = reason(TablePath::parse("a.b/c").unwrap_err());
        assert_eq!(field, "table name");
        let (field, _) = reason(TablePath::parse(".b").unwrap_err());
        assert_eq!(field, "database name");
    }

    #[test]
    fn names_round_trip_through_json_and_reject_bad_input() {
        let path = TablePath::parse("db.t-1").unwrap();
        let json = serde_json::to_string(&path).unwrap();
        assert_eq!(json, "\"db.t-1\"");
        assert_eq!(serde_json::from_str::<TablePath>(&json).unwrap(), path);
        assert!(serde_json::from_str::<TableName>("\"bad name\"").is_err());

        let bucket = TableBucket::new(3, Some(9), 1);
        let json = serde_json::to_string(&bucket).unwrap();
        assert_eq!(json, r#"{"table_id":3,"partition_id":9,"bucket":1}"#);
        assert_eq!(serde_json::from_str::<TableBucket>(&json).unwrap(), bucket);
        assert_eq!(bucket.stream_name(), "t3-p9-b1");
        assert_eq!(TableBucket::new(3, None, 1).stream_name(), "t3-b1");
    }
}
