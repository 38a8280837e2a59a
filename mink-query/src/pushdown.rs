//! The filters a read hands to the nodes: DataFusion's filter expressions, where they
//! can be, as the protocol's typed [`Filter`] (docs/protocol.md), which a node
//! evaluates on each batch before sending it. A pure function, unit-tested here.
//!
//! Pushed filters stay `Inexact`: DataFusion applies them again above the read, so a
//! filter translated in part (a conjunct it cannot name left out) still gives the
//! same answer, only with more rows sent. What is sent is a relaxation of what was
//! asked, never a narrowing: under a `NOT` nothing is left out.
//!
//! Translated: `=`, `!=`, `<`, `<=`, `>`, `>=` between a column and a literal of the
//! column's own type or between two columns of one type, `[NOT] BETWEEN`, `[NOT] IN` lists of literals, `IS [NOT] NULL`,
//! `[NOT] [I]LIKE` with the default escape, and their `AND`, `OR` and `NOT`. A literal
//! of another type (DataFusion casts the column then) is not.

use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::{InList, Like};
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};
use mink_flight::filter::{CompareOp, FILTER_DEPTH_MAX, FILTER_NODES_MAX, Filter};
use serde_json::Value;

/// The filter to send with a read of `schema`'s columns for `filters` (DataFusion's
/// conjuncts), restricted to those naming only `allowed` columns (`None`: any of
/// `schema`'s); `None` when nothing translates.
pub fn node_filter(
    filters: &[Expr],
    schema: &Schema,
    allowed: Option<&[String]>,
) -> Option<Filter> {
    let ctx = Ctx { schema, allowed };
    // Within the node's limits: a conjunct past them is left to DataFusion.
    let mut nodes = 1;
    let mut all: Vec<Filter> = filters
        .iter()
        .filter_map(|f| ctx.translate(f, true))
        .filter(|f| {
            let (n, depth) = f.size();
            let fits = nodes + n <= FILTER_NODES_MAX && depth < FILTER_DEPTH_MAX;
            if fits {
                nodes += n;
            }
            fits
        })
        .collect();
    match all.len() {
        0 => None,
        1 => all.pop(),
        _ => Some(Filter::And(all)),
    }
}

/// Whether [`node_filter`] sends something for `filter` (DataFusion is told the
/// filter is `Inexact`, and passes it to the scan).
pub fn translates(filter: &Expr, schema: &Schema, allowed: Option<&[String]>) -> bool {
    Ctx { schema, allowed }.translate(filter, true).is_some()
}

struct Ctx<'a> {
    schema: &'a Schema,
    allowed: Option<&'a [String]>,
}

impl Ctx<'_> {
    /// `expr` as a filter. `relax`: a filter that holds for more rows than `expr`
    /// does is good enough (an `AND` may drop the conjuncts it cannot translate);
    /// under a `NOT` it is not.
    fn translate(&self, expr: &Expr, relax: bool) -> Option<Filter> {
        match expr {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
                Operator::And => {
                    let (l, r) = (self.translate(left, relax), self.translate(right, relax));
                    match (l, r) {
                        (Some(l), Some(r)) => Some(and(l, r)),
                        (Some(one), None) | (None, Some(one)) if relax => Some(one),
                        _ => None,
                    }
                }
                Operator::Or => Some(or(
                    self.translate(left, relax)?,
                    self.translate(right, relax)?,
                )),
                _ => self.compare(left, *op, right),
            },
            Expr::Not(inner) => Some(Filter::Not(Box::new(self.translate(inner, false)?))),
            Expr::IsNull(e) => Some(Filter::IsNull {
                column: self.column(e)?.0,
            }),
            Expr::IsNotNull(e) => Some(Filter::IsNotNull {
                column: self.column(e)?.0,
            }),
            Expr::Between(Between {
                expr,
                negated,
                low,
                high,
            }) => {
                let (column, ty) = self.column(expr)?;
                Some(Filter::Between {
                    low: value(low, ty)?,
                    high: value(high, ty)?,
                    column,
                    negated: *negated,
                })
            }
            Expr::InList(InList {
                expr,
                list,
                negated,
            }) => {
                let (column, ty) = self.column(expr)?;
                Some(Filter::In {
                    values: list
                        .iter()
                        .map(|v| value(v, ty))
                        .collect::<Option<Vec<_>>>()?,
                    column,
                    negated: *negated,
                })
            }
            Expr::Like(Like {
                negated,
                expr,
                pattern,
                escape_char: None,
                case_insensitive,
            }) => {
                let (column, ty) = self.column(expr)?;
                if !matches!(
                    ty,
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) {
                    return None;
                }
                let Value::String(pattern) = value(pattern, ty)? else {
                    return None;
                };
                Some(Filter::Like {
                    column,
                    pattern,
                    negated: *negated,
                    case_insensitive: *case_insensitive,
                })
            }
            _ => None,
        }
    }

    fn compare(&self, left: &Expr, op: Operator, right: &Expr) -> Option<Filter> {
        let op = match op {
            Operator::Eq => CompareOp::Eq,
            Operator::NotEq => CompareOp::NotEq,
            Operator::Lt => CompareOp::Lt,
            Operator::LtEq => CompareOp::LtEq,
            Operator::Gt => CompareOp::Gt,
            Operator::GtEq => CompareOp::GtEq,
            _ => return None,
        };
        // Two columns of one type.
        if let (Expr::Column(_), Expr::Column(_)) = (left, right) {
            let ((l, lt), (r, rt)) = (self.column(left)?, self.column(right)?);
            return (lt == rt).then_some(Filter::CompareColumns {
                left: l,
                op,
                right: r,
            });
        }
        // `literal op column` is `column op' literal`.
        let (column, op, literal) = match (left, right) {
            (Expr::Column(_), _) => (left, op, right),
            (_, Expr::Column(_)) => (right, flip(op), left),
            _ => return None,
        };
        let (column, ty) = self.column(column)?;
        Some(Filter::Compare {
            value: value(literal, ty)?,
            column,
            op,
        })
    }

    /// A table column `expr` names (one the read may filter on), with its type.
    fn column(&self, expr: &Expr) -> Option<(String, &DataType)> {
        let Expr::Column(c) = expr else {
            return None;
        };
        if self
            .allowed
            .is_some_and(|allowed| !allowed.contains(&c.name))
        {
            return None;
        }
        let field = self.schema.field_with_name(&c.name).ok()?;
        Some((c.name.clone(), field.data_type()))
    }
}

fn and(l: Filter, r: Filter) -> Filter {
    match l {
        Filter::And(mut all) => {
            all.push(r);
            Filter::And(all)
        }
        l => Filter::And(vec![l, r]),
    }
}

fn or(l: Filter, r: Filter) -> Filter {
    match l {
        Filter::Or(mut any) => {
            any.push(r);
            Filter::Or(any)
        }
        l => Filter::Or(vec![l, r]),
    }
}

fn flip(op: CompareOp) -> CompareOp {
    match op {
        CompareOp::Lt => CompareOp::Gt,
        CompareOp::LtEq => CompareOp::GtEq,
        CompareOp::Gt => CompareOp::Lt,
        CompareOp::GtEq => CompareOp::LtEq,
        same => same,
    }
}

/// A literal of exactly `ty` as the protocol carries it: integers, finite floats
/// and booleans as JSON, everything else as the text Arrow reads back to the same
/// value (checked here, so that the node compares with what DataFusion would).
fn value(expr: &Expr, ty: &DataType) -> Option<Value> {
    let Expr::Literal(scalar, _) = expr else {
        return None;
    };
    if scalar.is_null() || scalar.data_type() != *ty {
        return None;
    }
    Some(match scalar {
        ScalarValue::Boolean(Some(b)) => Value::Bool(*b),
        ScalarValue::Int8(Some(v)) => (*v).into(),
        ScalarValue::Int16(Some(v)) => (*v).into(),
        ScalarValue::Int32(Some(v)) => (*v).into(),
        ScalarValue::Int64(Some(v)) => (*v).into(),
        ScalarValue::UInt8(Some(v)) => (*v).into(),
        ScalarValue::UInt16(Some(v)) => (*v).into(),
        ScalarValue::UInt32(Some(v)) => (*v).into(),
        ScalarValue::UInt64(Some(v)) => (*v).into(),
        ScalarValue::Float32(Some(v)) if v.is_finite() => f64::from(*v).into(),
        ScalarValue::Float64(Some(v)) if v.is_finite() => (*v).into(),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Value::String(s.clone()),
        ScalarValue::Decimal128(..)
        | ScalarValue::Decimal256(..)
        | ScalarValue::Date32(_)
        | ScalarValue::Date64(_)
        | ScalarValue::TimestampSecond(..)
        | ScalarValue::TimestampMillisecond(..)
        | ScalarValue::TimestampMicrosecond(..)
        | ScalarValue::TimestampNanosecond(..) => {
            let array = scalar.to_array().ok()?;
            let text = array_value_to_string(&array, 0).ok()?;
            let options = CastOptions {
                safe: false,
                ..Default::default()
            };
            let text_array = ScalarValue::Utf8(Some(text.clone())).to_array().ok()?;
            let back = cast_with_options(&text_array, ty, &options).ok()?;
            if back.as_ref() != array.as_ref() {
                return None;
            }
            Value::String(text)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Field;
    use datafusion::prelude::{col, lit};
    use serde_json::json;
    use std::ops::Not;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new("day", DataType::Date32, true),
        ])
    }

    fn sent(filters: &[Expr]) -> Option<serde_json::Value> {
        node_filter(filters, &schema(), None).map(|f| serde_json::to_value(f).unwrap())
    }

    #[test]
    fn comparisons_go_as_typed_values_either_way_round() {
        assert_eq!(
            sent(&[lit(5i64).lt(col("id"))]),
            Some(json!({"compare": {"column": "id", "op": ">", "value": 5}}))
        );
        let day = ScalarValue::Date32(Some(8766));
        let price = ScalarValue::Decimal128(Some(6), 15, 2);
        assert_eq!(
            sent(&[col("day").gt_eq(lit(day)), col("price").lt(lit(price))]),
            Some(json!({"and": [
                {"compare": {"column": "day", "op": ">=", "value": "1994-01-01"}},
                {"compare": {"column": "price", "op": "<", "value": "0.06"}},
            ]}))
        );
        assert_eq!(
            sent(&[col("name")
                .like(lit("ap%"))
                .or(col("id").in_list(vec![lit(1i64), lit(2i64)], false))]),
            Some(json!({"or": [
                {"like": {"column": "name", "pattern": "ap%", "negated": false, "case_insensitive": false}},
                {"in": {"column": "id", "values": [1, 2], "negated": false}},
            ]}))
        );
    }

    #[test]
    fn what_cannot_be_said_is_left_out_only_where_leaving_it_out_widens() {
        // A literal of another type than its column (DataFusion casts the column).
        assert_eq!(sent(&[col("id").eq(lit(1i32))]), None);
        // Two columns: of one type, sent; of two, not.
        assert_eq!(
            sent(&[col("day").lt(col("day"))]),
            Some(json!({"compare_columns": {"left": "day", "op": "<", "right": "day"}}))
        );
        assert_eq!(sent(&[col("id").lt(col("price"))]), None);
        // A conjunct it cannot name is dropped from an AND...
        let opaque = (col("id") + lit(1i64)).eq(col("id"));
        assert_eq!(
            sent(&[opaque.clone().and(col("name").is_null())]),
            Some(json!({"is_null": {"column": "name"}}))
        );
        // ... but not under NOT (that would narrow), nor from an OR.
        assert_eq!(
            sent(&[opaque.clone().and(col("name").is_null()).not()]),
            None
        );
        assert_eq!(sent(&[opaque.or(col("name").is_null())]), None);
        // Columns outside those allowed are not sent.
        let only_id = ["id".to_string()];
        assert!(node_filter(&[col("name").is_null()], &schema(), Some(&only_id)).is_none());
        assert!(translates(
            &col("id").gt(lit(3i64)),
            &schema(),
            Some(&only_id)
        ));
        // An IN list past the node's limit is left to DataFusion.
        let many: Vec<Expr> = (0..FILTER_NODES_MAX as i64).map(lit).collect();
        assert_eq!(sent(&[col("id").in_list(many, false)]), None);
        // A null literal says nothing.
        assert_eq!(sent(&[col("id").eq(lit(ScalarValue::Int64(None)))]), None);
    }
}
