//! The rows a read answers: a ticket's `filter`, a typed predicate over the table's
//! columns that the node evaluates with Arrow's compute kernels on each batch before
//! it is encoded, so that rows a reader would throw away never cross the wire.
//!
//! The wire form ([`Filter`]) names columns and carries values as JSON strings,
//! numbers or booleans; [`Filter::bind`] resolves it against the table's schema once
//! per read, casting each value to its column's type (a date as `"1994-01-01"`, a
//! decimal as `"0.06"`, exactly; a value that does not fit its column is refused, as is
//! anything past the limits below). Evaluation follows SQL: a comparison with a null
//! is unknown, `AND`/`OR` are Kleene's, and only rows for which the predicate is true
//! are kept.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, Scalar, StringArray,
    UInt64Array, new_empty_array,
};
use arrow::compute::kernels::{boolean, cmp, comparison};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use mink_types::MinkError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most nodes a filter may have, counting every value of an `in` list.
pub const FILTER_NODES_MAX: usize = 1024;
/// The deepest a filter may nest.
pub const FILTER_DEPTH_MAX: usize = 32;
/// The longest `like` pattern, in bytes.
pub const LIKE_PATTERN_MAX: usize = 4096;

/// A predicate over a table's columns, as a ticket carries it (docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Filter {
    /// Every one holds (an empty list: true).
    And(Vec<Filter>),
    /// Any one holds (an empty list: false).
    Or(Vec<Filter>),
    Not(Box<Filter>),
    /// `column op value`.
    Compare {
        column: String,
        op: CompareOp,
        value: Value,
    },
    /// `left op right`, two columns of one type.
    CompareColumns {
        left: String,
        op: CompareOp,
        right: String,
    },
    /// `column [NOT] IN (values...)`.
    In {
        column: String,
        values: Vec<Value>,
        #[serde(default)]
        negated: bool,
    },
    IsNull {
        column: String,
    },
    IsNotNull {
        column: String,
    },
    /// `column [NOT] BETWEEN low AND high` (both ends included).
    Between {
        column: String,
        low: Value,
        high: Value,
        #[serde(default)]
        negated: bool,
    },
    /// `column [NOT] [I]LIKE pattern`: SQL's `%` and `_`, `\` escaping; string
    /// columns only.
    Like {
        column: String,
        pattern: String,
        #[serde(default)]
        negated: bool,
        #[serde(default)]
        case_insensitive: bool,
    },
}

impl std::fmt::Display for Filter {
    /// The filter as SQL would write it (for EXPLAIN and logs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let join = |f: &mut std::fmt::Formatter<'_>, all: &[Filter], sep: &str, empty: &str| {
            if all.is_empty() {
                return f.write_str(empty);
            }
            for (i, x) in all.iter().enumerate() {
                if i > 0 {
                    f.write_str(sep)?;
                }
                match x {
                    Filter::And(_) | Filter::Or(_) => write!(f, "({x})")?,
                    _ => write!(f, "{x}")?,
                }
            }
            Ok(())
        };
        let not = |negated: &bool| if *negated { "NOT " } else { "" };
        match self {
            Filter::And(all) => join(f, all, " AND ", "true"),
            Filter::Or(all) => join(f, all, " OR ", "false"),
            Filter::Not(x) => write!(f, "NOT ({x})"),
            Filter::Compare { column, op, value } => write!(f, "{column} {} {value}", op.sql()),
            Filter::CompareColumns { left, op, right } => {
                write!(f, "{left} {} {right}", op.sql())
            }
            Filter::In {
                column,
                values,
                negated,
            } => {
                let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                write!(f, "{column} {}IN ({})", not(negated), values.join(", "))
            }
            Filter::IsNull { column } => write!(f, "{column} IS NULL"),
            Filter::IsNotNull { column } => write!(f, "{column} IS NOT NULL"),
            Filter::Between {
                column,
                low,
                high,
                negated,
            } => write!(f, "{column} {}BETWEEN {low} AND {high}", not(negated)),
            Filter::Like {
                column,
                pattern,
                negated,
                case_insensitive,
            } => {
                let like = if *case_insensitive { "ILIKE" } else { "LIKE" };
                write!(
                    f,
                    "{column} {}{like} {}",
                    not(negated),
                    Value::String(pattern.clone())
                )
            }
        }
    }
}

/// A comparison, written as SQL writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareOp {
    #[serde(rename = "=")]
    Eq,
    #[serde(rename = "!=")]
    NotEq,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    LtEq,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    GtEq,
}

impl CompareOp {
    fn sql(self) -> &'static str {
        match self {
            CompareOp::Eq => "=",
            CompareOp::NotEq => "!=",
            CompareOp::Lt => "<",
            CompareOp::LtEq => "<=",
            CompareOp::Gt => ">",
            CompareOp::GtEq => ">=",
        }
    }

    fn eval(self, left: &dyn arrow::array::Datum, right: &dyn arrow::array::Datum) -> Kernel {
        match self {
            CompareOp::Eq => cmp::eq(left, right),
            CompareOp::NotEq => cmp::neq(left, right),
            CompareOp::Lt => cmp::lt(left, right),
            CompareOp::LtEq => cmp::lt_eq(left, right),
            CompareOp::Gt => cmp::gt(left, right),
            CompareOp::GtEq => cmp::gt_eq(left, right),
        }
    }
}

type Kernel = Result<BooleanArray, arrow::error::ArrowError>;

/// A filter resolved against a table's schema: columns found and typed, values cast
/// to their columns' types. Cheap to share between the batches of a read.
#[derive(Debug, Clone)]
pub struct BoundFilter(Arc<Bound>);

#[derive(Debug)]
enum Bound {
    And(Vec<Bound>),
    Or(Vec<Bound>),
    Not(Box<Bound>),
    Compare {
        column: String,
        op: CompareOp,
        value: ArrayRef,
    },
    CompareColumns {
        left: String,
        op: CompareOp,
        right: String,
    },
    In {
        column: String,
        values: Vec<ArrayRef>,
        negated: bool,
    },
    IsNull(String),
    IsNotNull(String),
    Like {
        column: String,
        pattern: ArrayRef,
        negated: bool,
        case_insensitive: bool,
    },
}

fn invalid(reason: impl Into<String>) -> MinkError {
    MinkError::invalid("filter", reason)
}

impl Filter {
    /// This filter resolved against `schema`. A column the table lacks, a value that
    /// is not of its column's type, a comparison the column's type has no order for,
    /// `like` on a non-string column, or a filter past [`FILTER_NODES_MAX`] or
    /// [`FILTER_DEPTH_MAX`] is `InvalidArgument` naming what is wrong.
    pub fn bind(&self, schema: &SchemaRef) -> Result<BoundFilter, MinkError> {
        let mut nodes = 0;
        Ok(BoundFilter(Arc::new(self.bind_at(schema, 1, &mut nodes)?)))
    }

    /// How many nodes the filter has (each value of an `in` list counted) and how
    /// deep it nests, as [`FILTER_NODES_MAX`] and [`FILTER_DEPTH_MAX`] count them.
    pub fn size(&self) -> (usize, usize) {
        match self {
            Filter::And(all) | Filter::Or(all) => all.iter().fold((1, 1), |(n, d), f| {
                let (fn_, fd) = f.size();
                (n + fn_, d.max(fd + 1))
            }),
            Filter::Not(f) => {
                let (n, d) = f.size();
                (n + 1, d + 1)
            }
            Filter::In { values, .. } => (1 + values.len(), 1),
            _ => (1, 1),
        }
    }

    /// The table columns the filter reads.
    pub fn columns(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect_columns(&mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    fn collect_columns<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Filter::And(all) | Filter::Or(all) => {
                all.iter().for_each(|f| f.collect_columns(out));
            }
            Filter::Not(f) => f.collect_columns(out),
            Filter::CompareColumns { left, right, .. } => {
                out.push(left);
                out.push(right);
            }
            Filter::Compare { column, .. }
            | Filter::In { column, .. }
            | Filter::IsNull { column }
            | Filter::IsNotNull { column }
            | Filter::Between { column, .. }
            | Filter::Like { column, .. } => out.push(column),
        }
    }

    fn bind_at(
        &self,
        schema: &SchemaRef,
        depth: usize,
        nodes: &mut usize,
    ) -> Result<Bound, MinkError> {
        *nodes += 1;
        if depth > FILTER_DEPTH_MAX {
            return Err(invalid(format!(
                "the filter nests deeper than {FILTER_DEPTH_MAX}"
            )));
        }
        if *nodes > FILTER_NODES_MAX {
            return Err(invalid(format!(
                "the filter has more than {FILTER_NODES_MAX} terms and values"
            )));
        }
        let all = |fs: &[Filter], nodes: &mut usize| {
            fs.iter()
                .map(|f| f.bind_at(schema, depth + 1, nodes))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(match self {
            Filter::And(fs) => Bound::And(all(fs, nodes)?),
            Filter::Or(fs) => Bound::Or(all(fs, nodes)?),
            Filter::Not(f) => Bound::Not(Box::new(f.bind_at(schema, depth + 1, nodes)?)),
            leaf => leaf.bind_leaf(schema, nodes)?,
        })
    }

    /// A term that names a column, resolved.
    fn bind_leaf(&self, schema: &SchemaRef, nodes: &mut usize) -> Result<Bound, MinkError> {
        Ok(match self {
            Filter::And(_) | Filter::Or(_) | Filter::Not(_) => {
                return Err(MinkError::Internal("a compound term as a leaf".into()));
            }
            Filter::CompareColumns { left, op, right } => {
                let (l, r) = (column_type(schema, left)?, column_type(schema, right)?);
                if l != r {
                    return Err(invalid(format!(
                        "{left:?} ({l}) and {right:?} ({r}) are not of one type"
                    )));
                }
                comparable(left, l)?;
                Bound::CompareColumns {
                    left: left.clone(),
                    op: *op,
                    right: right.clone(),
                }
            }
            Filter::Compare { column, op, value } => {
                let ty = column_type(schema, column)?;
                comparable(column, ty)?;
                Bound::Compare {
                    column: column.clone(),
                    op: *op,
                    value: literal(column, ty, value)?,
                }
            }
            Filter::In {
                column,
                values,
                negated,
            } => {
                *nodes += values.len();
                if *nodes > FILTER_NODES_MAX {
                    return Err(invalid(format!(
                        "the filter has more than {FILTER_NODES_MAX} terms and values"
                    )));
                }
                let ty = column_type(schema, column)?;
                comparable(column, ty)?;
                Bound::In {
                    column: column.clone(),
                    values: values
                        .iter()
                        .map(|v| literal(column, ty, v))
                        .collect::<Result<_, _>>()?,
                    negated: *negated,
                }
            }
            Filter::IsNull { column } => {
                column_type(schema, column)?;
                Bound::IsNull(column.clone())
            }
            Filter::IsNotNull { column } => {
                column_type(schema, column)?;
                Bound::IsNotNull(column.clone())
            }
            Filter::Between {
                column,
                low,
                high,
                negated,
            } => {
                let ty = column_type(schema, column)?;
                comparable(column, ty)?;
                let range = Bound::And(vec![
                    Bound::Compare {
                        column: column.clone(),
                        op: CompareOp::GtEq,
                        value: literal(column, ty, low)?,
                    },
                    Bound::Compare {
                        column: column.clone(),
                        op: CompareOp::LtEq,
                        value: literal(column, ty, high)?,
                    },
                ]);
                if *negated {
                    Bound::Not(Box::new(range))
                } else {
                    range
                }
            }
            Filter::Like {
                column,
                pattern,
                negated,
                case_insensitive,
            } => bind_like(schema, column, pattern, *negated, *case_insensitive)?,
        })
    }
}

/// A `like` term resolved, its pattern compiled on one row now: one the kernels
/// cannot take is refused here, not met on the first batch.
fn bind_like(
    schema: &SchemaRef,
    column: &str,
    pattern: &str,
    negated: bool,
    case_insensitive: bool,
) -> Result<Bound, MinkError> {
    let ty = column_type(schema, column)?;
    if !matches!(
        ty,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    ) {
        return Err(invalid(format!(
            "like needs a string column; {column:?} is {ty}"
        )));
    }
    if pattern.len() > LIKE_PATTERN_MAX {
        return Err(invalid(format!(
            "a like pattern of {} bytes; at most {LIKE_PATTERN_MAX}",
            pattern.len()
        )));
    }
    let bound = Bound::Like {
        column: column.to_string(),
        pattern: literal(column, ty, &Value::String(pattern.to_string()))?,
        negated,
        case_insensitive,
    };
    let probe = RecordBatch::try_new(
        Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new(column, ty.clone(), true),
        ])),
        vec![literal(column, ty, &Value::String(String::new()))?],
    )
    .map_err(|e| MinkError::Internal(format!("probing a like pattern: {e}")))?;
    bound
        .eval(&probe)
        .map_err(|e| invalid(format!("the like pattern {pattern:?}: {e}")))?;
    Ok(bound)
}

fn column_type<'a>(schema: &'a SchemaRef, column: &str) -> Result<&'a DataType, MinkError> {
    schema
        .field_with_name(column)
        .map(|f| f.data_type())
        .map_err(|_| invalid(format!("the table has no column {column:?}")))
}

/// Whether Arrow's comparison kernels order values of `ty` (asked of the kernels
/// themselves, on no rows).
fn comparable(column: &str, ty: &DataType) -> Result<(), MinkError> {
    let empty = new_empty_array(ty);
    cmp::eq(&empty, &empty)
        .map(|_| ())
        .map_err(|_| invalid(format!("column {column:?} ({ty}) cannot be compared")))
}

/// `value` as a one-row array of `ty`: strings are parsed as the column's type,
/// numbers must fit it exactly.
fn literal(column: &str, ty: &DataType, value: &Value) -> Result<ArrayRef, MinkError> {
    let source: ArrayRef = match value {
        Value::String(s) => Arc::new(StringArray::from(vec![s.as_str()])),
        Value::Bool(b) => Arc::new(BooleanArray::from(vec![*b])),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Arc::new(Int64Array::from(vec![i]))
            } else if let Some(u) = n.as_u64() {
                Arc::new(UInt64Array::from(vec![u]))
            } else {
                Arc::new(Float64Array::from(vec![n.as_f64().unwrap_or(f64::NAN)]))
            }
        }
        Value::Null => {
            return Err(invalid(format!(
                "a null value for {column:?}: a comparison with null is never true (use is_null)"
            )));
        }
        Value::Array(_) | Value::Object(_) => {
            return Err(invalid(format!(
                "the value for {column:?} is not a string, number or boolean"
            )));
        }
    };
    let refuse = |why: String| {
        invalid(format!(
            "the value {value} does not fit column {column:?} ({ty}){why}"
        ))
    };
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    // A timestamp with a time zone is an instant: parsed as one (an offset in the
    // text is applied, none means UTC), then tagged with the column's zone, whatever
    // zone names this build of Arrow knows.
    let parse_as = match (ty, value) {
        (DataType::Timestamp(unit, Some(_)), Value::String(_)) => DataType::Timestamp(*unit, None),
        _ => ty.clone(),
    };
    let mut cast =
        cast_with_options(&source, &parse_as, &options).map_err(|e| refuse(format!(": {e}")))?;
    if cast.is_null(0) {
        return Err(refuse(String::new()));
    }
    exact(&source, &cast, value, &options).map_err(|why| refuse(format!(" exactly{why}")))?;
    if parse_as != *ty {
        let data = cast
            .to_data()
            .into_builder()
            .data_type(ty.clone())
            .build()
            .map_err(|e| refuse(format!(": {e}")))?;
        cast = arrow::array::make_array(data);
    }
    Ok(cast)
}

/// Whether `cast` (the value as its column's type) is `value` itself, not a value
/// rounded or cut to fit: a number comes back as itself (1.5 is no integer, 2^53 + 1
/// no double); a decimal's text has no digit past the column's scale; a timestamp's
/// text none past the column's unit.
fn exact(
    source: &ArrayRef,
    cast: &ArrayRef,
    value: &Value,
    options: &CastOptions,
) -> Result<(), String> {
    let fail = |e: arrow::error::ArrowError| format!(": {e}");
    match (value, cast.data_type()) {
        (Value::Number(_), _) => {
            let back = cast_with_options(cast, source.data_type(), options).map_err(fail)?;
            (back.as_ref() == source.as_ref())
                .then_some(())
                .ok_or_else(String::new)
        }
        (Value::String(text), DataType::Decimal128(_, scale) | DataType::Decimal256(_, scale)) => {
            let digits = text
                .trim()
                .split_once('.')
                .map_or(0, |(_, frac)| frac.trim_end_matches('0').len());
            let plain = text
                .trim()
                .trim_start_matches(['-', '+'])
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.');
            (plain && digits <= (*scale).max(0) as usize)
                .then_some(())
                .ok_or_else(|| {
                    format!(" (more digits than the scale {scale}, or not plain digits)")
                })
        }
        (Value::String(_), DataType::Timestamp(unit, _)) if *unit != TimeUnit::Nanosecond => {
            let finest = DataType::Timestamp(TimeUnit::Nanosecond, None);
            let parsed = cast_with_options(source, &finest, options).map_err(fail)?;
            let back = cast_with_options(cast, &finest, options).map_err(fail)?;
            (back.as_ref() == parsed.as_ref())
                .then_some(())
                .ok_or_else(|| format!(" (finer than {unit:?})"))
        }
        _ => Ok(()),
    }
}

impl BoundFilter {
    /// The rows of `batch` the filter keeps: true where it holds, false or null
    /// where it does not. `batch` has the columns the filter names (the table's
    /// schema, before any projection).
    pub fn mask(&self, batch: &RecordBatch) -> Result<BooleanArray, MinkError> {
        self.0
            .eval(batch)
            .map_err(|e| MinkError::Internal(format!("evaluating a read's filter: {e}")))
    }

    /// `batch` cut to the rows the filter keeps, and the mask that cut it (`None`:
    /// every row kept, the batch unchanged).
    pub fn apply(
        &self,
        batch: &RecordBatch,
    ) -> Result<(RecordBatch, Option<BooleanArray>), MinkError> {
        let mask = self.mask(batch)?;
        if mask.null_count() == 0 && mask.true_count() == batch.num_rows() {
            return Ok((batch.clone(), None));
        }
        let kept = arrow::compute::filter_record_batch(batch, &mask)
            .map_err(|e| MinkError::Internal(format!("filtering a read: {e}")))?;
        Ok((kept, Some(mask)))
    }
}

impl Bound {
    fn eval(&self, batch: &RecordBatch) -> Kernel {
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                arrow::error::ArrowError::SchemaError(format!("a batch read lacks column {name:?}"))
            })
        };
        match self {
            Bound::And(all) => {
                let mut out = BooleanArray::from(vec![true; batch.num_rows()]);
                for f in all {
                    out = boolean::and_kleene(&out, &f.eval(batch)?)?;
                }
                Ok(out)
            }
            Bound::Or(all) => {
                let mut out = BooleanArray::from(vec![false; batch.num_rows()]);
                for f in all {
                    out = boolean::or_kleene(&out, &f.eval(batch)?)?;
                }
                Ok(out)
            }
            Bound::Not(f) => boolean::not(&f.eval(batch)?),
            Bound::Compare {
                column: c,
                op,
                value,
            } => op.eval(column(c)?, &Scalar::new(value.clone())),
            Bound::CompareColumns { left, op, right } => op.eval(column(left)?, column(right)?),
            Bound::In {
                column: c,
                values,
                negated,
            } => {
                let col = column(c)?;
                let mut out = BooleanArray::from(vec![false; batch.num_rows()]);
                for v in values {
                    out = boolean::or_kleene(&out, &cmp::eq(col, &Scalar::new(v.clone()))?)?;
                }
                if *negated {
                    boolean::not(&out)
                } else {
                    Ok(out)
                }
            }
            Bound::IsNull(c) => arrow::compute::is_null(column(c)?),
            Bound::IsNotNull(c) => arrow::compute::is_not_null(column(c)?),
            Bound::Like {
                column: c,
                pattern,
                negated,
                case_insensitive,
            } => {
                let col = column(c)?;
                let pattern = Scalar::new(pattern.clone());
                match (negated, case_insensitive) {
                    (false, false) => comparison::like(col, &pattern),
                    (true, false) => comparison::nlike(col, &pattern),
                    (false, true) => comparison::ilike(col, &pattern),
                    (true, true) => comparison::nilike(col, &pattern),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Date32Array, Decimal128Array};
    use arrow::datatypes::{Field, Schema};
    use serde_json::json;

    fn table() -> (SchemaRef, RecordBatch) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new("day", DataType::Date32, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![
                    Some("apple"),
                    Some("banana"),
                    None,
                    Some("apricot"),
                ])),
                Arc::new(
                    Decimal128Array::from(vec![Some(5), Some(600), Some(700), None])
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
                // 1994-01-01 is day 8766.
                Arc::new(Date32Array::from(vec![
                    Some(8765),
                    Some(8766),
                    Some(8767),
                    None,
                ])),
            ],
        )
        .unwrap();
        (schema, batch)
    }

    fn ids(filter: serde_json::Value) -> Vec<i64> {
        let (schema, batch) = table();
        let filter: Filter = serde_json::from_value(filter).unwrap();
        let (kept, _) = filter.bind(&schema).unwrap().apply(&batch).unwrap();
        kept.column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    #[test]
    fn comparisons_take_values_in_their_columns_types() {
        assert_eq!(
            ids(json!({"compare": {"column": "id", "op": ">=", "value": 3}})),
            [3, 4]
        );
        assert_eq!(
            ids(json!({"compare": {"column": "price", "op": "<", "value": "6.00"}})),
            [1]
        );
        assert_eq!(
            ids(json!({"compare": {"column": "day", "op": ">=", "value": "1994-01-01"}})),
            [2, 3]
        );
        assert_eq!(
            ids(json!({"between": {"column": "price", "low": "0.05", "high": "6"}})),
            [1, 2]
        );
        assert_eq!(
            ids(json!({"in": {"column": "name", "values": ["apple", "kiwi", "banana"]}})),
            [1, 2]
        );
        // Two columns of one type; a null on either side keeps no row.
        assert_eq!(
            ids(json!({"compare_columns": {"left": "day", "op": "<", "right": "day"}})),
            Vec::<i64>::new()
        );
        assert_eq!(
            ids(json!({"compare_columns": {"left": "day", "op": "=", "right": "day"}})),
            [1, 2, 3]
        );
    }

    #[test]
    fn nulls_follow_sql() {
        // A comparison with a null row is unknown: neither it nor its negation keeps
        // the row.
        assert_eq!(
            ids(json!({"compare": {"column": "name", "op": "!=", "value": "apple"}})),
            [2, 4]
        );
        assert_eq!(
            ids(json!({"not": {"compare": {"column": "name", "op": "=", "value": "apple"}}})),
            [2, 4]
        );
        assert_eq!(ids(json!({"is_null": {"column": "price"}})), [4]);
        assert_eq!(
            ids(
                json!({"or": [{"is_null": {"column": "name"}}, {"compare": {"column": "id", "op": "=", "value": 1}}]})
            ),
            [1, 3]
        );
        // Unknown OR true is true; unknown AND false is false.
        assert_eq!(
            ids(json!({"in": {"column": "name", "values": ["apple"], "negated": true}})),
            [2, 4]
        );
        assert_eq!(ids(json!({"and": []})), [1, 2, 3, 4]);
        assert_eq!(ids(json!({"or": []})), Vec::<i64>::new());
    }

    #[test]
    fn like_matches_patterns_and_prefixes() {
        assert_eq!(
            ids(json!({"like": {"column": "name", "pattern": "ap%"}})),
            [1, 4]
        );
        assert_eq!(
            ids(json!({"like": {"column": "name", "pattern": "AP%", "case_insensitive": true}})),
            [1, 4]
        );
        assert_eq!(
            ids(json!({"like": {"column": "name", "pattern": "_anana", "negated": true}})),
            [1, 4]
        );
    }

    #[test]
    fn a_batch_every_row_of_which_is_kept_is_returned_as_it_was() {
        let (schema, batch) = table();
        let f: Filter =
            serde_json::from_value(json!({"compare": {"column": "id", "op": ">", "value": 0}}))
                .unwrap();
        let (kept, mask) = f.bind(&schema).unwrap().apply(&batch).unwrap();
        assert!(mask.is_none());
        assert_eq!(kept, batch);
    }

    #[test]
    fn bad_filters_are_refused_naming_what_is_wrong() {
        let (schema, _) = table();
        let refused = |filter: serde_json::Value| {
            let filter: Filter = serde_json::from_value(filter).unwrap();
            match filter.bind(&schema).unwrap_err() {
                MinkError::InvalidArgument { field, reason } => {
                    assert_eq!(field, "filter");
                    reason
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(refused(json!({"is_null": {"column": "nope"}})).contains("nope"));
        assert!(
            refused(json!({"compare": {"column": "id", "op": "=", "value": 1.5}}))
                .contains("does not fit")
        );
        assert!(
            refused(json!({"compare": {"column": "day", "op": "=", "value": "yesterday"}}))
                .contains("does not fit")
        );
        assert!(
            refused(json!({"compare": {"column": "id", "op": "=", "value": null}}))
                .contains("is_null")
        );
        assert!(refused(json!({"like": {"column": "id", "pattern": "1%"}})).contains("string"));
        assert!(
            refused(json!({"compare_columns": {"left": "id", "op": "<", "right": "price"}}))
                .contains("one type")
        );
        let values: Vec<i64> = (0..FILTER_NODES_MAX as i64).collect();
        assert!(refused(json!({"in": {"column": "id", "values": values}})).contains("more than"));
        let mut deep = json!({"is_null": {"column": "id"}});
        for _ in 0..FILTER_DEPTH_MAX {
            deep = json!({ "not": deep });
        }
        assert!(refused(deep).contains("deeper"));
        // Unknown shapes are refused by the parser.
        assert!(serde_json::from_value::<Filter>(json!({"regex": {"column": "id"}})).is_err());
        assert!(
            serde_json::from_value::<Filter>(
                json!({"compare": {"column": "id", "op": "~", "value": 1}})
            )
            .is_err()
        );
    }

    #[test]
    fn strings_are_read_exactly_or_refused() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("name", DataType::Utf8, true),
        ]));
        let bind = |f: serde_json::Value| {
            serde_json::from_value::<Filter>(f)
                .unwrap()
                .bind(&schema)
                .map(|_| ())
        };
        // Digits past the scale would round (0.065 to 0.07): refused, as is an
        // instant finer than the column's unit; trailing zeros are exact.
        assert!(
            bind(json!({"compare": {"column": "price", "op": ">", "value": "0.065"}})).is_err()
        );
        assert!(bind(json!({"compare": {"column": "price", "op": ">", "value": "0.060"}})).is_ok());
        assert!(bind(json!({"compare": {"column": "at", "op": "<", "value": "2024-01-01T00:00:00.0000005Z"}})).is_err());
        // A zoned column takes an instant with or without its offset.
        for at in [
            "2024-01-01T00:00:00Z",
            "2024-01-01T01:00:00+01:00",
            "2024-01-01 00:00:00",
        ] {
            assert!(
                bind(json!({"compare": {"column": "at", "op": ">=", "value": at}})).is_ok(),
                "{at}"
            );
        }
        let long = "x".repeat(LIKE_PATTERN_MAX + 1);
        assert!(bind(json!({"like": {"column": "name", "pattern": long}})).is_err());
    }

    #[test]
    fn an_instant_compares_with_a_zoned_column_as_an_instant() {
        use arrow::array::TimestampMicrosecondArray;
        let ty = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![Field::new("at", ty, true)]));
        let hour = 3_600_000_000i64;
        let base = 1_704_067_200_000_000i64; // 2024-01-01T00:00:00Z
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(
                TimestampMicrosecondArray::from(vec![base - hour, base, base + hour])
                    .with_timezone("UTC"),
            )],
        )
        .unwrap();
        let f: Filter = serde_json::from_value(
            json!({"compare": {"column": "at", "op": ">=", "value": "2024-01-01T01:00:00+01:00"}}),
        )
        .unwrap();
        let (kept, _) = f.bind(&schema).unwrap().apply(&batch).unwrap();
        assert_eq!(kept.num_rows(), 2);
    }

    #[test]
    fn columns_lists_each_column_once() {
        let f: Filter = serde_json::from_value(json!({"and": [
            {"is_null": {"column": "name"}},
            {"compare": {"column": "id", "op": "=", "value": 1}},
            {"not": {"like": {"column": "name", "pattern": "a%"}}}
        ]}))
        .unwrap();
        assert_eq!(f.columns(), ["id", "name"]);
    }
}
