//! The change type of a row in a bucket's log.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{MinkError, Result};

/// What a row in the log means. The one-byte encoding is part of the log format
/// (docs/log-format.md) and never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
#[repr(u8)]
pub enum ChangeType {
    /// `+A`: a row appended to a log table.
    AppendOnly = 0,
    /// `+I`: a new key in a primary-key table.
    Insert = 1,
    /// `-U`: the old row of an update.
    UpdateBefore = 2,
    /// `+U`: the new row of an update.
    UpdateAfter = 3,
    /// `-D`: a deleted row.
    Delete = 4,
}

impl ChangeType {
    pub const ALL: [ChangeType; 5] = [
        ChangeType::AppendOnly,
        ChangeType::Insert,
        ChangeType::UpdateBefore,
        ChangeType::UpdateAfter,
        ChangeType::Delete,
    ];

    /// The stable one-byte encoding.
    pub fn to_byte(self) -> u8 {
        self as u8
    }

    /// Decodes the one-byte encoding.
    pub fn from_byte(byte: u8) -> Result<Self> {
        Self::ALL
            .get(byte as usize)
            .copied()
            .ok_or_else(|| MinkError::invalid("change type", format!("unknown encoding {byte}")))
    }

    /// `+A`, `+I`, `-U`, `+U` or `-D`.
    pub fn short_string(self) -> &'static str {
        match self {
            ChangeType::AppendOnly => "+A",
            ChangeType::Insert => "+I",
            ChangeType::UpdateBefore => "-U",
            ChangeType::UpdateAfter => "+U",
            ChangeType::Delete => "-D",
        }
    }

    /// Whether the row adds to the table's state (`+A`, `+I`, `+U`).
    pub fn is_addition(self) -> bool {
        matches!(
            self,
            ChangeType::AppendOnly | ChangeType::Insert | ChangeType::UpdateAfter
        )
    }
}

impl fmt::Display for ChangeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_string())
    }
}

impl FromStr for ChangeType {
    type Err = MinkError;
    fn from_str(text: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|c| c.short_string() == text)
            .ok_or_else(|| {
                MinkError::invalid(
                    "change type",
                    format!("{text:?} is not one of +A, +I, -U, +U, -D"),
                )
            })
    }
}

impl TryFrom<String> for ChangeType {
    type Error = MinkError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<ChangeType> for String {
    fn from(c: ChangeType) -> String {
        c.short_string().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_stable() {
        let bytes: Vec<u8> = ChangeType::ALL.iter().map(|c| c.to_byte()).collect();
        assert_eq!(bytes, vec![0, 1, 2, 3, 4]);
        for c in ChangeType::ALL {
            assert_eq!(ChangeType::from_byte(c.to_byte()).unwrap(), c);
            assert_eq!(c.to_string().parse::<ChangeType>().unwrap(), c);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<ChangeType>(&json).unwrap(), c);
        }
        assert_eq!(
            serde_json::to_string(&ChangeType::UpdateBefore).unwrap(),
            "\"-U\""
        );
        assert!(ChangeType::from_byte(5).is_err());
        assert!("+X".parse::<ChangeType>().is_err());
    }
}
