//! Merge engines: what a new row (or a delete) does to the row stored under its key.

use std::cmp::Ordering;

use mink_types::{
    AggFunction, DeleteBehavior, KeyValue, MergeEngine, MinkError, Result, Schema, TableDescriptor,
};

use crate::row::{Row, Value};

/// What to do with a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Store this row (it may equal the old one: then there is no change).
    Write(Row),
    /// Remove the key.
    Delete,
    /// Leave the key as it is.
    Skip,
}

/// A table's merge rules, resolved against its current schema.
#[derive(Debug, Clone)]
pub struct Merger {
    engine: MergeEngine,
    delete: DeleteBehavior,
    pk: Vec<usize>,
    version: Option<usize>,
    functions: Vec<AggFunction>,
}

impl Merger {
    pub fn new(table: &TableDescriptor) -> Result<Self> {
        let schema = &table.schema;
        let index = |name: &str| {
            schema.index_of(name).ok_or_else(|| {
                MinkError::Internal(format!("column {name} vanished from the schema"))
            })
        };
        let pk = table
            .primary_key
            .iter()
            .map(|c| index(c))
            .collect::<Result<Vec<_>>>()?;
        let version = match &table.properties.merge_engine {
            MergeEngine::Versioned { column } => Some(index(column)?),
            _ => None,
        };
        let functions = schema
            .columns
            .iter()
            .map(|c| match &table.properties.merge_engine {
                MergeEngine::Aggregation { functions } => functions
                    .get(&c.name)
                    .cloned()
                    .unwrap_or(AggFunction::LastValueIgnoreNulls),
                _ => AggFunction::LastValue,
            })
            .collect();
        Ok(Self {
            engine: table.properties.merge_engine.clone(),
            delete: table.properties.delete_behavior(),
            pk,
            version,
            functions,
        })
    }

    pub fn delete_behavior(&self) -> DeleteBehavior {
        self.delete
    }

    /// Whether this is `last_row`: a full-width upsert simply replaces the old row.
    pub fn is_last_row(&self) -> bool {
        matches!(self.engine, MergeEngine::LastRow)
    }

    /// Whether partial updates are allowed.
    pub fn allows_partial(&self) -> bool {
        matches!(
            self.engine,
            MergeEngine::LastRow | MergeEngine::Aggregation { .. }
        )
    }

    fn is_key(&self, i: usize) -> bool {
        self.pk.contains(&i)
    }

    /// An upsert of `new` (full width; with `targets`, only those columns count).
    pub fn upsert(&self, old: Option<&Row>, new: Row, targets: Option<&[bool]>) -> Decision {
        let Some(old) = old else {
            return match (&self.engine, self.version) {
                (MergeEngine::Versioned { .. }, Some(v)) if new[v].is_none() => Decision::Skip,
                _ => Decision::Write(new),
            };
        };
        match &self.engine {
            MergeEngine::LastRow => match targets {
                None => Decision::Write(new),
                Some(mask) => Decision::Write(
                    old.iter()
                        .zip(new)
                        .zip(mask)
                        .map(|((o, n), t)| if *t { n } else { o.clone() })
                        .collect(),
                ),
            },
            MergeEngine::FirstRow => Decision::Skip,
            MergeEngine::Versioned { .. } => {
                let v = self.version.unwrap_or(0);
                match (&new[v], &old[v]) {
                    (None, _) => Decision::Skip,
                    (Some(n), Some(o)) if n.cmp_value(o) == Ordering::Less => Decision::Skip,
                    _ => Decision::Write(new),
                }
            }
            MergeEngine::Aggregation { .. } => Decision::Write(
                old.iter()
                    .zip(new)
                    .enumerate()
                    .map(|(i, (o, n))| {
                        if self.is_key(i) || targets.is_some_and(|m| !m[i]) {
                            o.clone()
                        } else {
                            aggregate(&self.functions[i], o, n)
                        }
                    })
                    .collect(),
            ),
        }
    }

    /// A delete of the key of `new` (with `targets`, a partial delete).
    pub fn delete(&self, old: Option<&Row>, targets: Option<&[bool]>) -> Decision {
        if self.delete != DeleteBehavior::Allow {
            return Decision::Skip;
        }
        let Some(old) = old else {
            return Decision::Skip;
        };
        match targets {
            None => Decision::Delete,
            Some(mask) => {
                let row: Row = old
                    .iter()
                    .enumerate()
                    .map(|(i, o)| {
                        if mask[i] && !self.is_key(i) {
                            None
                        } else {
                            o.clone()
                        }
                    })
                    .collect();
                if row
                    .iter()
                    .enumerate()
                    .all(|(i, v)| self.is_key(i) || v.is_none())
                {
                    Decision::Delete
                } else {
                    Decision::Write(row)
                }
            }
        }
    }
}

fn add(a: &KeyValue, b: &KeyValue) -> Option<KeyValue> {
    use KeyValue::*;
    Some(match (a, b) {
        (TinyInt(x), TinyInt(y)) => TinyInt(x.wrapping_add(*y)),
        (SmallInt(x), SmallInt(y)) => SmallInt(x.wrapping_add(*y)),
        (Int(x), Int(y)) => Int(x.wrapping_add(*y)),
        (BigInt(x), BigInt(y)) => BigInt(x.wrapping_add(*y)),
        (Float(x), Float(y)) => Float(x + y),
        (Double(x), Double(y)) => Double(x + y),
        (Decimal(x), Decimal(y)) => Decimal(x.wrapping_add(*y)),
        _ => return None,
    })
}

fn mul(a: &KeyValue, b: &KeyValue) -> Option<KeyValue> {
    use KeyValue::*;
    Some(match (a, b) {
        (TinyInt(x), TinyInt(y)) => TinyInt(x.wrapping_mul(*y)),
        (SmallInt(x), SmallInt(y)) => SmallInt(x.wrapping_mul(*y)),
        (Int(x), Int(y)) => Int(x.wrapping_mul(*y)),
        (BigInt(x), BigInt(y)) => BigInt(x.wrapping_mul(*y)),
        (Float(x), Float(y)) => Float(x * y),
        (Double(x), Double(y)) => Double(x * y),
        _ => return None,
    })
}

/// One aggregation step. Nulls are ignored by the arithmetic and extremum functions.
pub fn aggregate(f: &AggFunction, old: &Value, new: Value) -> Value {
    let both =
        |g: fn(&KeyValue, &KeyValue) -> Option<KeyValue>, old: &Value, new: Value| match (old, new)
        {
            (Some(o), Some(n)) => g(o, &n).or(Some(n)),
            (Some(o), None) => Some(o.clone()),
            (None, n) => n,
        };
    match f {
        AggFunction::Sum => both(add, old, new),
        AggFunction::Product => both(mul, old, new),
        AggFunction::Max => both(
            |o, n| {
                Some(if n.cmp_value(o) == Ordering::Greater {
                    n.clone()
                } else {
                    o.clone()
                })
            },
            old,
            new,
        ),
        AggFunction::Min => both(
            |o, n| {
                Some(if n.cmp_value(o) == Ordering::Less {
                    n.clone()
                } else {
                    o.clone()
                })
            },
            old,
            new,
        ),
        AggFunction::LastValue => new,
        AggFunction::LastValueIgnoreNulls => new.or_else(|| old.clone()),
        AggFunction::FirstValue => old.clone(),
        AggFunction::FirstValueIgnoreNulls => old.clone().or(new),
        AggFunction::BoolAnd => both(
            |o, n| match (o, n) {
                (KeyValue::Boolean(a), KeyValue::Boolean(b)) => Some(KeyValue::Boolean(*a && *b)),
                _ => None,
            },
            old,
            new,
        ),
        AggFunction::BoolOr => both(
            |o, n| match (o, n) {
                (KeyValue::Boolean(a), KeyValue::Boolean(b)) => Some(KeyValue::Boolean(*a || *b)),
                _ => None,
            },
            old,
            new,
        ),
        AggFunction::Listagg { delimiter } => match (old, new) {
            (Some(KeyValue::String(o)), Some(KeyValue::String(n))) => {
                Some(KeyValue::String(format!("{o}{delimiter}{n}")))
            }
            (Some(o), None) => Some(o.clone()),
            (_, n) => n,
        },
    }
}

/// The columns of `schema` a partial update targets, as a mask; checks the rules.
pub fn target_mask(
    table: &TableDescriptor,
    schema: &Schema,
    targets: &[String],
) -> Result<Vec<bool>> {
    for key in &table.primary_key {
        if !targets.contains(key) {
            return Err(MinkError::invalid(
                "target_columns",
                format!(
                    "a partial update must include every primary-key column; {key:?} is missing"
                ),
            ));
        }
    }
    for (i, t) in targets.iter().enumerate() {
        if schema.index_of(t).is_none() {
            return Err(MinkError::invalid(
                format!("target_columns[{i}]"),
                format!("no column {t:?}"),
            ));
        }
    }
    let mask: Vec<bool> = schema
        .columns
        .iter()
        .map(|c| targets.contains(&c.name))
        .collect();
    for (c, t) in schema.columns.iter().zip(&mask) {
        if !t && !c.nullable {
            return Err(MinkError::invalid(
                "target_columns",
                format!(
                    "column {:?} is NOT NULL, so a partial update must target it",
                    c.name
                ),
            ));
        }
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregation_functions() {
        let i = |v: i64| Some(KeyValue::BigInt(v));
        let s = |v: &str| Some(KeyValue::String(v.into()));
        assert_eq!(aggregate(&AggFunction::Sum, &i(2), i(3)), i(5));
        assert_eq!(aggregate(&AggFunction::Sum, &None, i(3)), i(3));
        assert_eq!(aggregate(&AggFunction::Sum, &i(2), None), i(2));
        assert_eq!(aggregate(&AggFunction::Product, &i(2), i(3)), i(6));
        assert_eq!(aggregate(&AggFunction::Max, &i(2), i(3)), i(3));
        assert_eq!(aggregate(&AggFunction::Min, &i(2), i(3)), i(2));
        assert_eq!(aggregate(&AggFunction::LastValue, &i(2), None), None);
        assert_eq!(
            aggregate(&AggFunction::LastValueIgnoreNulls, &i(2), None),
            i(2)
        );
        assert_eq!(aggregate(&AggFunction::FirstValue, &None, i(3)), None);
        assert_eq!(
            aggregate(&AggFunction::FirstValueIgnoreNulls, &None, i(3)),
            i(3)
        );
        let b = |v: bool| Some(KeyValue::Boolean(v));
        assert_eq!(
            aggregate(&AggFunction::BoolAnd, &b(true), b(false)),
            b(false)
        );
        assert_eq!(aggregate(&AggFunction::BoolOr, &b(false), b(true)), b(true));
        let l = AggFunction::Listagg {
            delimiter: ";".into(),
        };
        assert_eq!(aggregate(&l, &s("a"), s("b")), s("a;b"));
        assert_eq!(aggregate(&l, &None, s("b")), s("b"));
        assert_eq!(aggregate(&l, &s("a"), None), s("a"));
    }
}
