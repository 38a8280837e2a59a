//! How a table is read, decided from the filters and limit DataFusion pushes down:
//! a pure function, unit-tested here, so that `EXPLAIN` and the tests can say why a
//! query made the requests it did.
//!
//! - **Point query** (`=` or `IN` on every primary-key column): the `lookup` action,
//!   never a scan.
//! - **Key-prefix query** (`=` on the leading primary-key columns, which are exactly
//!   the partition and bucket keys): the `prefix_lookup` action.
//! - **Scan** otherwise, of the partitions the partition-key filters leave (equality
//!   and `IN` on partition keys prune exactly) and, with a limit DataFusion could push
//!   (every filter exact), `LimitScan`s of the first rows of each bucket.
//!
//! Filters on key columns are `Inexact`: DataFusion still applies them above the
//! read, so the answer is the same with and without the pushdown. Partition-key
//! filters whose values render as partition names are `Exact`.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use mink_types::{BucketId, BucketingRule, DataType, KeyValue, TableDescriptor};

/// The most buckets a bucket-key filter is resolved to (an `IN` list beyond it reads
/// every bucket).
const PRUNED_BUCKETS_MAX: usize = 1024;

/// The parts of a table's definition that decide how it is read.
#[derive(Debug, Clone)]
pub struct Shape {
    pub primary_key: Vec<String>,
    pub partition_keys: Vec<String>,
    pub bucket_keys: Vec<String>,
    /// The bucket keys' Mink types, in bucket-key order.
    pub bucket_types: Vec<DataType>,
    pub bucketing: BucketingRule,
    pub bucket_count: u32,
}

impl Shape {
    pub fn of(descriptor: &TableDescriptor) -> Self {
        let bucket_keys = descriptor.bucket_keys();
        let bucket_types = bucket_keys
            .iter()
            .filter_map(|k| descriptor.schema.column(k).map(|c| c.data_type))
            .collect();
        Self {
            primary_key: descriptor.primary_key.clone(),
            partition_keys: descriptor.partition_keys.clone(),
            bucket_types,
            bucket_keys,
            bucketing: descriptor.bucketing,
            bucket_count: descriptor.bucket_count,
        }
    }

    /// The leading primary-key columns a `prefix_lookup` takes: the partition and
    /// bucket keys, when they are exactly the first primary-key columns and fewer
    /// than all of them.
    fn prefix_columns(&self) -> Option<&[String]> {
        let wanted: BTreeSet<&String> = self
            .partition_keys
            .iter()
            .chain(self.bucket_keys.iter())
            .collect();
        let n = wanted.len();
        if n == 0 || n >= self.primary_key.len() {
            return None;
        }
        let leading: BTreeSet<&String> = self.primary_key[..n].iter().collect();
        (leading == wanted).then(|| &self.primary_key[..n])
    }
}

/// How to read.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    /// `lookup` of these keys (values in primary-key order).
    Lookup { keys: Vec<Vec<serde_json::Value>> },
    /// `prefix_lookup` of these leading key values.
    PrefixLookup { prefix: Vec<serde_json::Value> },
    /// Scans: of the partitions named (all when `None`) and of the buckets named
    /// (all when `None`), each bucket from its log start (or only its first `limit`
    /// rows).
    Scan {
        partitions: Option<BTreeSet<String>>,
        buckets: Option<BTreeSet<BucketId>>,
        limit: Option<usize>,
    },
}

/// What the filters say about one column: the values it may take.
fn column_values(expr: &Expr) -> Option<(String, Vec<ScalarValue>)> {
    match expr {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) => match (left.as_ref(), right.as_ref()) {
            (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => {
                Some((c.name.clone(), vec![v.clone()]))
            }
            _ => None,
        },
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let (a, mut va) = column_values(left)?;
            let (b, vb) = column_values(right)?;
            (a == b).then(|| {
                va.extend(vb);
                (a, va)
            })
        }
        Expr::InList(list) if !list.negated => {
            let Expr::Column(c) = list.expr.as_ref() else {
                return None;
            };
            let values = list
                .list
                .iter()
                .map(|e| match e {
                    Expr::Literal(v, _) => Some(v.clone()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some((c.name.clone(), values))
        }
        _ => None,
    }
}

/// A value as the node's JSON key encoding takes it (`lookup`, `prefix_lookup`), or
/// `None` for a value it cannot name (such a query scans instead).
pub fn json_value(v: &ScalarValue) -> Option<serde_json::Value> {
    use serde_json::Value;
    Some(match v {
        ScalarValue::Boolean(Some(b)) => Value::Bool(*b),
        ScalarValue::Int8(Some(i)) => Value::from(*i),
        ScalarValue::Int16(Some(i)) => Value::from(*i),
        ScalarValue::Int32(Some(i)) => Value::from(*i),
        ScalarValue::Int64(Some(i)) => Value::from(*i),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Value::String(s.clone()),
        ScalarValue::Date32(Some(d)) => Value::String(mink_types::partition::format_date(*d)),
        _ => return None,
    })
}

/// A value as it appears in a partition name (`mink_types::partition`), or `None`.
fn partition_text(v: &ScalarValue) -> Option<String> {
    Some(match v {
        ScalarValue::Boolean(Some(b)) => b.to_string(),
        ScalarValue::Int8(Some(i)) => i.to_string(),
        ScalarValue::Int16(Some(i)) => i.to_string(),
        ScalarValue::Int32(Some(i)) => i.to_string(),
        ScalarValue::Int64(Some(i)) => i.to_string(),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => s.clone(),
        ScalarValue::Date32(Some(d)) => mink_types::partition::format_date(*d),
        _ => return None,
    })
}

/// Whether a filter helps the read, and whether the read makes it hold by itself.
pub fn support(shape: &Shape, filter: &Expr) -> TableProviderFilterPushDown {
    let Some((column, values)) = column_values(filter) else {
        return TableProviderFilterPushDown::Unsupported;
    };
    if shape.partition_keys.contains(&column) && values.iter().all(|v| partition_text(v).is_some())
    {
        return TableProviderFilterPushDown::Exact;
    }
    if shape.primary_key.contains(&column) || shape.bucket_keys.contains(&column) {
        return TableProviderFilterPushDown::Inexact;
    }
    TableProviderFilterPushDown::Unsupported
}

/// Decides the read of a table of `shape` under `filters` (the ones [`support`]
/// accepted) and `limit`. `primary_state`: the read is a primary-key table's state
/// (point and prefix lookups apply); `lookup_keys_max` caps a point query's keys.
pub fn decide(
    shape: &Shape,
    primary_state: bool,
    filters: &[Expr],
    limit: Option<usize>,
    lookup_keys_max: usize,
) -> Access {
    let mut values: BTreeMap<String, Vec<ScalarValue>> = BTreeMap::new();
    for f in filters {
        if let Some((column, vs)) = column_values(f) {
            // Two filters on one column: the values both allow.
            match values.get_mut(&column) {
                Some(old) => old.retain(|v| vs.contains(v)),
                None => {
                    values.insert(column, vs);
                }
            }
        }
    }
    if primary_state {
        if let Some(keys) = lookup_keys(shape, &values, lookup_keys_max) {
            return Access::Lookup { keys };
        }
        if let Some(prefix) = shape.prefix_columns().and_then(|cols| {
            cols.iter()
                .map(|c| match values.get(c).map(Vec::as_slice) {
                    Some([one]) => json_value(one),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
        }) {
            return Access::PrefixLookup { prefix };
        }
    }
    Access::Scan {
        partitions: partitions(shape, &values),
        buckets: buckets(shape, &values),
        limit: if primary_state { None } else { limit },
    }
}

/// A literal as the key value of a column of type `ty`, when it is exactly that type.
fn key_value(v: &ScalarValue, ty: DataType) -> Option<KeyValue> {
    let value = match v {
        ScalarValue::Boolean(Some(b)) => KeyValue::Boolean(*b),
        ScalarValue::Int8(Some(i)) => KeyValue::TinyInt(*i),
        ScalarValue::Int16(Some(i)) => KeyValue::SmallInt(*i),
        ScalarValue::Int32(Some(i)) => KeyValue::Int(*i),
        ScalarValue::Int64(Some(i)) => KeyValue::BigInt(*i),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => KeyValue::String(s.clone()),
        ScalarValue::Binary(Some(b)) | ScalarValue::LargeBinary(Some(b)) => {
            KeyValue::Bytes(b.clone())
        }
        ScalarValue::Date32(Some(d)) => KeyValue::Date(*d),
        _ => return None,
    };
    value.matches(ty).then_some(value)
}

/// The buckets the bucket-key filters allow under the `hash` rule (the one the nodes
/// route by, `mink_types::bucketing`), or `None` when they allow every bucket: every
/// bucket key needs `=` or `IN` values of exactly its type.
fn buckets(
    shape: &Shape,
    values: &BTreeMap<String, Vec<ScalarValue>>,
) -> Option<BTreeSet<BucketId>> {
    if shape.bucketing != BucketingRule::Hash
        || shape.bucket_keys.is_empty()
        || shape.bucket_types.len() != shape.bucket_keys.len()
    {
        return None;
    }
    let per_column = shape
        .bucket_keys
        .iter()
        .zip(&shape.bucket_types)
        .map(|(column, ty)| {
            values
                .get(column)?
                .iter()
                .filter(|v| !v.is_null())
                .map(|v| key_value(v, *ty))
                .collect::<Option<Vec<_>>>()
        })
        .collect::<Option<Vec<_>>>()?;
    let keys = combinations(per_column, PRUNED_BUCKETS_MAX)?;
    let mut out = BTreeSet::new();
    let mut encoded = Vec::new();
    for key in keys {
        mink_types::key::encode_values(&shape.bucket_types, &key, &mut encoded).ok()?;
        out.insert(mink_types::bucketing::hash_bucket(
            &encoded,
            shape.bucket_count,
        ));
    }
    Some(out)
}

/// Every combination of the key values, when each key column has values the node can
/// name and there are at most `max` combinations.
fn lookup_keys(
    shape: &Shape,
    values: &BTreeMap<String, Vec<ScalarValue>>,
    max: usize,
) -> Option<Vec<Vec<serde_json::Value>>> {
    let per_column = shape
        .primary_key
        .iter()
        .map(|column| {
            let mut vs: Vec<serde_json::Value> = Vec::new();
            for v in values.get(column)?.iter().filter(|v| !v.is_null()) {
                let v = json_value(v)?;
                if !vs.contains(&v) {
                    vs.push(v);
                }
            }
            Some(vs)
        })
        .collect::<Option<Vec<_>>>()?;
    combinations(per_column, max)
}

/// Every combination of one value per column, in column order; `None` when there
/// would be more than `max`.
fn combinations<T: Clone>(per_column: Vec<Vec<T>>, max: usize) -> Option<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> = vec![vec![]];
    for vs in per_column {
        if out.len().checked_mul(vs.len())? > max {
            return None;
        }
        out = out
            .into_iter()
            .flat_map(|k| {
                vs.iter().map(move |v| {
                    let mut k = k.clone();
                    k.push(v.clone());
                    k
                })
            })
            .collect();
    }
    Some(out)
}

/// The partitions the partition-key filters allow, as predicates on names: `None`
/// when they allow every partition.
fn partitions(
    shape: &Shape,
    values: &BTreeMap<String, Vec<ScalarValue>>,
) -> Option<BTreeSet<String>> {
    let constrained: Vec<(usize, BTreeSet<String>)> = shape
        .partition_keys
        .iter()
        .enumerate()
        .filter_map(|(i, k)| {
            let texts = values
                .get(k)?
                .iter()
                .map(partition_text)
                .collect::<Option<BTreeSet<_>>>()?;
            Some((i, texts))
        })
        .collect();
    if constrained.is_empty() {
        return None;
    }
    // Names are built from the constrained components; unconstrained ones are
    // matched by `partition_allowed`.
    let mut names: BTreeSet<String> = BTreeSet::new();
    let n = shape.partition_keys.len();
    let mut patterns: Vec<Vec<Option<String>>> = vec![vec![None; n]];
    for (i, texts) in constrained {
        patterns = patterns
            .into_iter()
            .flat_map(|p| {
                texts.iter().map(move |t| {
                    let mut p = p.clone();
                    p[i] = Some(t.clone());
                    p
                })
            })
            .collect();
    }
    for p in patterns {
        names.insert(
            p.iter()
                .map(|c| c.clone().unwrap_or_else(|| "*".into()))
                .collect::<Vec<_>>()
                .join(mink_types::partition::SEPARATOR),
        );
    }
    Some(names)
}

/// Whether partition `name` matches one of the patterns [`decide`] made (`*` stands
/// for any value of an unconstrained key).
pub fn partition_allowed(patterns: &BTreeSet<String>, name: &str, keys: usize) -> bool {
    let parts: Vec<&str> = if keys > 1 {
        name.split(mink_types::partition::SEPARATOR).collect()
    } else {
        vec![name]
    };
    patterns.iter().any(|p| {
        let want: Vec<&str> = if keys > 1 {
            p.split(mink_types::partition::SEPARATOR).collect()
        } else {
            vec![p.as_str()]
        };
        want.len() == parts.len() && want.iter().zip(&parts).all(|(w, g)| *w == "*" || w == g)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    fn shape(pk: &[&str], partition: &[&str], bucket: &[&str], types: Vec<DataType>) -> Shape {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Shape {
            primary_key: owned(pk),
            partition_keys: owned(partition),
            bucket_keys: owned(bucket),
            bucket_types: types,
            bucketing: BucketingRule::Hash,
            bucket_count: 8,
        }
    }

    fn users() -> Shape {
        shape(&["id"], &[], &["id"], vec![DataType::BigInt])
    }

    fn orders() -> Shape {
        // Partitioned by day, bucketed by customer, keyed (day, customer, order).
        shape(
            &["day", "customer", "order"],
            &["day"],
            &["customer"],
            vec![DataType::String],
        )
    }

    #[test]
    fn equality_on_every_key_column_is_a_lookup() {
        let a = decide(&users(), true, &[col("id").eq(lit(7i64))], None, 100);
        assert_eq!(
            a,
            Access::Lookup {
                keys: vec![vec![7.into()]]
            }
        );
        let a = decide(
            &users(),
            true,
            &[col("id").in_list(vec![lit(1i64), lit(2i64), lit(1i64)], false)],
            None,
            100,
        );
        assert_eq!(
            a,
            Access::Lookup {
                keys: vec![vec![1.into()], vec![2.into()]]
            }
        );
    }

    #[test]
    fn a_lookup_needs_a_primary_state_and_every_key_and_stays_under_the_cap() {
        let f = [col("id").eq(lit(7i64))];
        assert!(matches!(
            decide(&users(), false, &f, None, 100),
            Access::Scan { .. }
        ));
        let many: Vec<Expr> = (0..5i64).map(lit).collect();
        let f = [col("id").in_list(many, false)];
        assert!(matches!(
            decide(&users(), true, &f, None, 4),
            Access::Scan { .. }
        ));
        let f = [
            col("day").eq(lit("2026-01-01")),
            col("customer").eq(lit("ann")),
        ];
        assert_eq!(
            decide(&orders(), true, &f, None, 100),
            Access::PrefixLookup {
                prefix: vec!["2026-01-01".into(), "ann".into()]
            }
        );
        let negated = [col("id").in_list(vec![lit(1i64)], true)];
        assert!(matches!(
            decide(&users(), true, &negated, None, 100),
            Access::Scan { .. }
        ));
    }

    #[test]
    fn key_combinations_multiply() {
        let f = [
            col("day").in_list(vec![lit("d1"), lit("d2")], false),
            col("customer").eq(lit("ann")),
            col("order").in_list(vec![lit(1i64), lit(2i64)], false),
        ];
        let Access::Lookup { keys } = decide(&orders(), true, &f, None, 100) else {
            panic!("a lookup")
        };
        assert_eq!(keys.len(), 4);
        assert!(keys.contains(&vec!["d2".into(), "ann".into(), 2.into()]));
    }

    #[test]
    fn partition_filters_prune_exactly_and_the_rest_stays_above() {
        let s = orders();
        assert_eq!(
            support(&s, &col("day").eq(lit("2026-01-01"))),
            TableProviderFilterPushDown::Exact
        );
        assert_eq!(
            support(&s, &col("order").eq(lit(3i64))),
            TableProviderFilterPushDown::Inexact
        );
        assert_eq!(
            support(&s, &col("amount").gt(lit(3i64))),
            TableProviderFilterPushDown::Unsupported
        );
        let Access::Scan { partitions, .. } = decide(
            &s,
            false,
            &[col("day").in_list(vec![lit("a"), lit("b")], false)],
            Some(3),
            100,
        ) else {
            panic!("a scan")
        };
        let partitions = partitions.unwrap();
        assert!(partition_allowed(&partitions, "a", 1));
        assert!(!partition_allowed(&partitions, "c", 1));
    }

    #[test]
    fn a_multi_key_partition_is_matched_per_component() {
        let s = shape(&[], &["region", "day"], &[], vec![]);
        let Access::Scan {
            partitions, limit, ..
        } = decide(&s, false, &[col("region").eq(lit("eu"))], Some(5), 100)
        else {
            panic!("a scan")
        };
        assert_eq!(limit, Some(5));
        let p = partitions.unwrap();
        assert!(partition_allowed(&p, "eu__2026-01-01", 2));
        assert!(!partition_allowed(&p, "us__2026-01-01", 2));
    }

    #[test]
    fn bucket_key_equality_reads_the_buckets_the_nodes_route_those_rows_to() {
        use arrow60::array::{Int64Array, StringArray};
        let ids: Vec<i64> = (0..200).collect();
        let batch = arrow60::record_batch::RecordBatch::try_from_iter([(
            "id",
            std::sync::Arc::new(Int64Array::from(ids.clone())) as arrow60::array::ArrayRef,
        )])
        .unwrap();
        let routed =
            mink_types::bucketing::bucket_per_row(&batch, &[0], BucketingRule::Hash, 8).unwrap();
        let log = shape(&[], &[], &["id"], vec![DataType::BigInt]);
        for (i, id) in ids.iter().enumerate() {
            let Access::Scan { buckets, .. } =
                decide(&log, false, &[col("id").eq(lit(*id))], None, 100)
            else {
                panic!("a scan")
            };
            assert_eq!(buckets, Some(BTreeSet::from([routed[i]])), "id {id}");
        }
        let names = ["ann", "bob", "cy"];
        let batch = arrow60::record_batch::RecordBatch::try_from_iter([(
            "name",
            std::sync::Arc::new(StringArray::from(names.to_vec())) as arrow60::array::ArrayRef,
        )])
        .unwrap();
        let routed =
            mink_types::bucketing::bucket_per_row(&batch, &[0], BucketingRule::Hash, 8).unwrap();
        let by_name = shape(&[], &[], &["name"], vec![DataType::String]);
        let list: Vec<Expr> = names.iter().map(|n| lit(*n)).collect();
        let Access::Scan { buckets, .. } = decide(
            &by_name,
            false,
            &[col("name").in_list(list, false)],
            None,
            100,
        ) else {
            panic!("a scan")
        };
        assert_eq!(buckets, Some(routed.into_iter().collect()));
        // A literal of another type than the column's prunes nothing.
        let Access::Scan { buckets, .. } =
            decide(&log, false, &[col("id").eq(lit(7i32))], None, 100)
        else {
            panic!("a scan")
        };
        assert_eq!(buckets, None);
    }

    #[test]
    fn two_filters_on_one_column_intersect() {
        let f = [
            col("id").in_list(vec![lit(1i64), lit(2i64)], false),
            col("id").eq(lit(2i64)),
        ];
        assert_eq!(
            decide(&users(), true, &f, None, 100),
            Access::Lookup {
                keys: vec![vec![2.into()]]
            }
        );
    }
}
