//! Mink's SQL-style data types and their Arrow mapping.
//!
//! | Mink | Arrow |
//! |---|---|
//! | BOOLEAN | Boolean |
//! | TINYINT, SMALLINT, INT, BIGINT | Int8, Int16, Int32, Int64 |
//! | FLOAT, DOUBLE | Float32, Float64 |
//! | DECIMAL(p,s), 1 <= p <= 38, 0 <= s <= p | Decimal128(p, s) |
//! | STRING | Utf8 |
//! | BYTES | Binary |
//! | DATE | Date32 |
//! | TIME(p), 0 <= p <= 9 | Time32(Second) p=0, Time32(Millisecond) p<=3, Time64(Microsecond) p<=6, Time64(Nanosecond) |
//! | TIMESTAMP(p) | Timestamp(unit as for TIME, no time zone) |
//! | TIMESTAMP_LTZ(p) | Timestamp(unit as for TIME, "UTC") |
//!
//! Arrow has four time units, Mink ten precisions: Arrow → Mink yields the canonical
//! precision of the unit (0, 3, 6, 9), so `TIME(2)` maps to milliseconds and back to
//! `TIME(3)`. Every other mapping round-trips exactly.

use std::fmt;
use std::str::FromStr;

use arrow::datatypes::{DataType as ArrowType, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::{MinkError, Result};

/// The largest DECIMAL precision (Arrow's Decimal128).
pub const DECIMAL_PRECISION_MAX: u8 = 38;
/// The largest TIME/TIMESTAMP precision (nanoseconds).
pub const TIME_PRECISION_MAX: u8 = 9;

/// A column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DataType {
    Boolean,
    TinyInt,
    SmallInt,
    Int,
    BigInt,
    Float,
    Double,
    Decimal { precision: u8, scale: u8 },
    String,
    Bytes,
    Date,
    Time { precision: u8 },
    Timestamp { precision: u8 },
    TimestampLtz { precision: u8 },
}

fn time_unit(precision: u8) -> TimeUnit {
    match precision {
        0 => TimeUnit::Second,
        1..=3 => TimeUnit::Millisecond,
        4..=6 => TimeUnit::Microsecond,
        _ => TimeUnit::Nanosecond,
    }
}

fn unit_precision(unit: TimeUnit) -> u8 {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond => 6,
        TimeUnit::Nanosecond => 9,
    }
}

impl DataType {
    /// Checks the precision and scale bounds.
    pub fn validate(&self) -> Result<()> {
        match *self {
            DataType::Decimal { precision, scale } => {
                if !(1..=DECIMAL_PRECISION_MAX).contains(&precision) {
                    return Err(MinkError::invalid(
                        "data type",
                        format!(
                            "DECIMAL precision {precision} is outside 1..={DECIMAL_PRECISION_MAX}"
                        ),
                    ));
                }
                if scale > precision {
                    return Err(MinkError::invalid(
                        "data type",
                        format!("DECIMAL scale {scale} exceeds its precision {precision}"),
                    ));
                }
            }
            DataType::Time { precision }
            | DataType::Timestamp { precision }
            | DataType::TimestampLtz { precision }
                if precision > TIME_PRECISION_MAX =>
            {
                return Err(MinkError::invalid(
                    "data type",
                    format!("{self} precision is outside 0..={TIME_PRECISION_MAX}"),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The Arrow type rows of this type are carried in.
    pub fn to_arrow(&self) -> ArrowType {
        match *self {
            DataType::Boolean => ArrowType::Boolean,
            DataType::TinyInt => ArrowType::Int8,
            DataType::SmallInt => ArrowType::Int16,
            DataType::Int => ArrowType::Int32,
            DataType::BigInt => ArrowType::Int64,
            DataType::Float => ArrowType::Float32,
            DataType::Double => ArrowType::Float64,
            DataType::Decimal { precision, scale } => ArrowType::Decimal128(precision, scale as i8),
            DataType::String => ArrowType::Utf8,
            DataType::Bytes => ArrowType::Binary,
            DataType::Date => ArrowType::Date32,
            DataType::Time { precision } => match time_unit(precision) {
                unit @ (TimeUnit::Second | TimeUnit::Millisecond) => ArrowType::Time32(unit),
                unit => ArrowType::Time64(unit),
            },
            DataType::Timestamp { precision } => ArrowType::Timestamp(time_unit(precision), None),
            DataType::TimestampLtz { precision } => {
                ArrowType::Timestamp(time_unit(precision), Some("UTC".into()))
            }
        }
    }

    /// The Mink type of an Arrow type, or an error naming the Arrow type when Mink has
    /// no counterpart.
    pub fn from_arrow(arrow: &ArrowType) -> Result<Self> {
        Ok(match arrow {
            ArrowType::Boolean => DataType::Boolean,
            ArrowType::Int8 => DataType::TinyInt,
            ArrowType::Int16 => DataType::SmallInt,
            ArrowType::Int32 => DataType::Int,
            ArrowType::Int64 => DataType::BigInt,
            ArrowType::Float32 => DataType::Float,
            ArrowType::Float64 => DataType::Double,
            ArrowType::Decimal128(p, s) if *s >= 0 => DataType::Decimal {
                precision: *p,
                scale: *s as u8,
            },
            ArrowType::Utf8 => DataType::String,
            ArrowType::Binary => DataType::Bytes,
            ArrowType::Date32 => DataType::Date,
            ArrowType::Time32(unit @ (TimeUnit::Second | TimeUnit::Millisecond))
            | ArrowType::Time64(unit @ (TimeUnit::Microsecond | TimeUnit::Nanosecond)) => {
                DataType::Time {
                    precision: unit_precision(*unit),
                }
            }
            ArrowType::Timestamp(unit, None) => DataType::Timestamp {
                precision: unit_precision(*unit),
            },
            ArrowType::Timestamp(unit, Some(_)) => DataType::TimestampLtz {
                precision: unit_precision(*unit),
            },
            other => {
                return Err(MinkError::invalid(
                    "data type",
                    format!("Arrow type {other} has no Mink counterpart"),
                ));
            }
        })
    }

    /// Whether values of this type can be compared for `max`/`min` and ordered in keys.
    pub fn is_numeric(&self) -> bool {
        matches!(
            self,
            DataType::TinyInt
                | DataType::SmallInt
                | DataType::Int
                | DataType::BigInt
                | DataType::Float
                | DataType::Double
                | DataType::Decimal { .. }
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataType::Boolean => f.write_str("BOOLEAN"),
            DataType::TinyInt => f.write_str("TINYINT"),
            DataType::SmallInt => f.write_str("SMALLINT"),
            DataType::Int => f.write_str("INT"),
            DataType::BigInt => f.write_str("BIGINT"),
            DataType::Float => f.write_str("FLOAT"),
            DataType::Double => f.write_str("DOUBLE"),
            DataType::Decimal { precision, scale } => write!(f, "DECIMAL({precision},{scale})"),
            DataType::String => f.write_str("STRING"),
            DataType::Bytes => f.write_str("BYTES"),
            DataType::Date => f.write_str("DATE"),
            DataType::Time { precision } => write!(f, "TIME({precision})"),
            DataType::Timestamp { precision } => write!(f, "TIMESTAMP({precision})"),
            DataType::TimestampLtz { precision } => write!(f, "TIMESTAMP_LTZ({precision})"),
        }
    }
}

impl FromStr for DataType {
    type Err = MinkError;

    /// Parses `INT`, `decimal(10, 2)`, `TIMESTAMP_LTZ(3)`, ... (case-insensitive,
    /// spaces ignored). `TIME`, `TIMESTAMP` and `TIMESTAMP_LTZ` without a precision
    /// default to 0, 6 and 6 as in SQL; `DECIMAL` alone is `DECIMAL(10,0)`.
    fn from_str(text: &str) -> Result<Self> {
        let compact: String = text
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_uppercase();
        let bad = |why: &str| {
            MinkError::invalid("data type", format!("{}: {why}", crate::names::quote(text)))
        };
        let (name, args) = match compact.split_once('(') {
            Some((name, rest)) => {
                let args = rest.strip_suffix(')').ok_or_else(|| bad("missing ')'"))?;
                let args: Vec<u8> = args
                    .split(',')
                    .map(|a| {
                        a.parse::<u8>()
                            .map_err(|_| bad("arguments must be small integers"))
                    })
                    .collect::<Result<_>>()?;
                (name.to_string(), Some(args))
            }
            None => (compact.clone(), None),
        };
        let no_args = |t: DataType| match &args {
            None => Ok(t),
            Some(_) => Err(bad("this type takes no arguments")),
        };
        let one = |default: u8| match args.as_deref() {
            None => Ok(default),
            Some([p]) => Ok(*p),
            Some(_) => Err(bad("expected one precision argument")),
        };
        let ty = match name.as_str() {
            "BOOLEAN" | "BOOL" => no_args(DataType::Boolean)?,
            "TINYINT" => no_args(DataType::TinyInt)?,
            "SMALLINT" => no_args(DataType::SmallInt)?,
            "INT" | "INTEGER" => no_args(DataType::Int)?,
            "BIGINT" => no_args(DataType::BigInt)?,
            "FLOAT" => no_args(DataType::Float)?,
            "DOUBLE" => no_args(DataType::Double)?,
            "STRING" => no_args(DataType::String)?,
            "BYTES" => no_args(DataType::Bytes)?,
            "DATE" => no_args(DataType::Date)?,
            "DECIMAL" => match args.as_deref() {
                None => DataType::Decimal {
                    precision: 10,
                    scale: 0,
                },
                Some([p]) => DataType::Decimal {
                    precision: *p,
                    scale: 0,
                },
                Some([p, s]) => DataType::Decimal {
                    precision: *p,
                    scale: *s,
                },
                Some(_) => return Err(bad("DECIMAL takes (precision) or (precision, scale)")),
            },
            "TIME" => DataType::Time { precision: one(0)? },
            "TIMESTAMP" => DataType::Timestamp { precision: one(6)? },
            "TIMESTAMP_LTZ" => DataType::TimestampLtz { precision: one(6)? },
            _ => return Err(bad("unknown type")),
        };
        ty.validate()?;
        Ok(ty)
    }
}

impl TryFrom<String> for DataType {
    type Error = MinkError;
    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<DataType> for String {
    fn from(ty: DataType) -> String {
        ty.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_canonical() -> Vec<DataType> {
        let mut all = vec![
            DataType::Boolean,
            DataType::TinyInt,
            DataType::SmallInt,
            DataType::Int,
            DataType::BigInt,
            DataType::Float,
            DataType::Double,
            DataType::Decimal {
                precision: 38,
                scale: 10,
            },
            DataType::Decimal {
                precision: 1,
                scale: 0,
            },
            DataType::String,
            DataType::Bytes,
            DataType::Date,
        ];
        for p in [0, 3, 6, 9] {
            all.push(DataType::Time { precision: p });
            all.push(DataType::Timestamp { precision: p });
            all.push(DataType::TimestampLtz { precision: p });
        }
        all
    }

    #[test]
    fn arrow_mapping_round_trips() {
        for ty in all_canonical() {
            assert_eq!(DataType::from_arrow(&ty.to_arrow()).unwrap(), ty, "{ty}");
        }
        assert_eq!(
            DataType::Timestamp { precision: 3 }.to_arrow(),
            ArrowType::Timestamp(TimeUnit::Millisecond, None)
        );
        assert_eq!(
            DataType::TimestampLtz { precision: 3 }.to_arrow(),
            ArrowType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
        );
        assert_eq!(
            DataType::Time { precision: 5 }.to_arrow(),
            ArrowType::Time64(TimeUnit::Microsecond)
        );
        // A non-canonical precision widens to its unit's canonical one.
        assert_eq!(
            DataType::from_arrow(&DataType::Time { precision: 2 }.to_arrow()).unwrap(),
            DataType::Time { precision: 3 }
        );
    }

    #[test]
    fn unsupported_arrow_types_are_named() {
        let err = DataType::from_arrow(&ArrowType::UInt32).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid data type: Arrow type UInt32 has no Mink counterpart"
        );
    }

    #[test]
    fn text_form_round_trips() {
        for ty in all_canonical() {
            assert_eq!(ty.to_string().parse::<DataType>().unwrap(), ty);
            let json = serde_json::to_string(&ty).unwrap();
            assert_eq!(serde_json::from_str::<DataType>(&json).unwrap(), ty);
        }
        assert_eq!(
            "decimal( 10 , 2 )".parse::<DataType>().unwrap(),
            DataType::Decimal {
                precision: 10,
                scale: 2
            }
        );
        assert_eq!(
            "timestamp_ltz".parse::<DataType>().unwrap(),
            DataType::TimestampLtz { precision: 6 }
        );
        assert_eq!(serde_json::to_string(&DataType::Int).unwrap(), "\"INT\"");
    }

    #[test]
    fn bad_types_are_rejected_with_the_reason() {
        for (text, why) in [
            ("VARCHAR", "unknown type"),
            ("INT(3)", "takes no arguments"),
            ("DECIMAL(39,2)", "precision 39 is outside"),
            ("DECIMAL(5,6)", "scale 6 exceeds its precision 5"),
            ("TIMESTAMP(10)", "precision is outside 0..=9"),
            ("TIME(3", "missing ')'"),
            ("DECIMAL(a)", "small integers"),
        ] {
            let err = text.parse::<DataType>().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
