//! The model of the KV model test (`kv_concurrent.rs`): the merge engines on plain
//! values, written independently of `mink_kv::merge`, and the Puts the writers send.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use mink_kv::PutRequest;
use mink_types::{ChangeType, Column, DataType, Schema, TableDescriptor, TableProperties};
use rand::Rng;
use rand::rngs::StdRng;

pub fn schema() -> Schema {
    Schema::new(
        1,
        vec![
            Column::new("id", DataType::BigInt, false),
            Column::new("name", DataType::String, true),
            Column::new("score", DataType::BigInt, true),
        ],
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    LastRow,
    FirstRow,
    /// `versioned(score)`; deletes are ignored (the engine cannot delete).
    Versioned,
    /// `score` sums, `name` keeps the last non-null value; deletes are ignored.
    Aggregation,
}

impl Engine {
    pub fn of_seed(seed: u64) -> Self {
        match seed % 5 {
            0 | 1 => Engine::LastRow,
            2 => Engine::FirstRow,
            3 => Engine::Versioned,
            _ => Engine::Aggregation,
        }
    }

    pub fn descriptor(self) -> TableDescriptor {
        let props: &[(&str, &str)] = match self {
            Engine::LastRow => &[],
            Engine::FirstRow => &[("merge_engine", "first_row")],
            Engine::Versioned => &[("merge_engine", "versioned(score)")],
            Engine::Aggregation => &[
                ("merge_engine", "aggregation"),
                ("aggregation.score", "sum"),
            ],
        };
        let mut properties = TableProperties::default();
        for (k, v) in props {
            properties.set(k, v).unwrap();
        }
        let d = TableDescriptor {
            primary_key: vec!["id".into()],
            properties,
            ..TableDescriptor::log_table(schema())
        };
        d.validate().unwrap();
        d
    }

    pub fn takes_partial_updates(self) -> bool {
        matches!(self, Engine::LastRow | Engine::Aggregation)
    }

    pub fn applies_deletes(self) -> bool {
        self == Engine::LastRow
    }
}

/// The non-key columns of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Val {
    pub name: Option<String>,
    pub score: Option<i64>,
}

/// The columns a Put carries besides the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    All,
    Name,
    Score,
}

impl Target {
    pub fn name(self) -> bool {
        matches!(self, Target::All | Target::Name)
    }

    pub fn score(self) -> bool {
        matches!(self, Target::All | Target::Score)
    }

    pub fn columns(self) -> Option<Vec<String>> {
        match self {
            Target::All => None,
            Target::Name => Some(vec!["id".into(), "name".into()]),
            Target::Score => Some(vec!["id".into(), "score".into()]),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RowSpec {
    pub key: i64,
    pub delete: bool,
    pub val: Val,
}

#[derive(Debug, Clone)]
pub struct PutSpec {
    pub target: Target,
    pub rows: Vec<RowSpec>,
}

pub type State = BTreeMap<i64, Val>;
pub type Change = (ChangeType, i64, Val);

/// What the engine does with one upsert: `None` skips, `Some(v)` writes `v`.
pub fn upsert(engine: Engine, old: Option<&Val>, new: &Val, target: Target) -> Option<Val> {
    let new = Val {
        name: if target.name() {
            new.name.clone()
        } else {
            None
        },
        score: if target.score() { new.score } else { None },
    };
    let Some(old) = old else {
        return match engine {
            Engine::Versioned if new.score.is_none() => None,
            _ => Some(new),
        };
    };
    match engine {
        Engine::LastRow => Some(Val {
            name: if target.name() {
                new.name
            } else {
                old.name.clone()
            },
            score: if target.score() { new.score } else { old.score },
        }),
        Engine::FirstRow => None,
        Engine::Versioned => match (new.score, old.score) {
            (None, _) => None,
            (Some(n), Some(o)) if n < o => None,
            _ => Some(new),
        },
        Engine::Aggregation => Some(Val {
            name: if target.name() {
                new.name.or_else(|| old.name.clone())
            } else {
                old.name.clone()
            },
            score: if target.score() {
                match (old.score, new.score) {
                    (Some(o), Some(n)) => Some(o.wrapping_add(n)),
                    (Some(o), None) => Some(o),
                    (None, n) => n,
                }
            } else {
                old.score
            },
        }),
    }
}

/// What the engine does with one delete: `None` skips, `Some(None)` deletes,
/// `Some(Some(v))` writes `v` (a partial delete that leaves a column).
pub fn delete(engine: Engine, old: Option<&Val>, target: Target) -> Option<Option<Val>> {
    if !engine.applies_deletes() {
        return None;
    }
    let old = old?;
    let left = match target {
        Target::All => return Some(None),
        Target::Name => Val {
            name: None,
            score: old.score,
        },
        Target::Score => Val {
            name: old.name.clone(),
            score: None,
        },
    };
    if left.name.is_none() && left.score.is_none() {
        Some(None)
    } else {
        Some(Some(left))
    }
}

/// The changelog a Put makes over `state`, and the keys it changes (`None`: deleted).
pub fn merge(
    engine: Engine,
    state: &State,
    put: &PutSpec,
) -> (Vec<Change>, BTreeMap<i64, Option<Val>>) {
    let mut changed: BTreeMap<i64, Option<Val>> = BTreeMap::new();
    let mut changes = Vec::new();
    for row in &put.rows {
        let old = match changed.get(&row.key) {
            Some(v) => v.clone(),
            None => state.get(&row.key).cloned(),
        };
        let decision = if row.delete {
            delete(engine, old.as_ref(), put.target)
        } else {
            upsert(engine, old.as_ref(), &row.val, put.target).map(Some)
        };
        match (decision, old) {
            (None, _) | (Some(None), None) => {}
            (Some(None), Some(old)) => {
                changes.push((ChangeType::Delete, row.key, old));
                changed.insert(row.key, None);
            }
            (Some(Some(new)), None) => {
                changes.push((ChangeType::Insert, row.key, new.clone()));
                changed.insert(row.key, Some(new));
            }
            (Some(Some(new)), Some(old)) if new == old => {}
            (Some(Some(new)), Some(old)) => {
                changes.push((ChangeType::UpdateBefore, row.key, old));
                changes.push((ChangeType::UpdateAfter, row.key, new.clone()));
                changed.insert(row.key, Some(new));
            }
        }
    }
    (changes, changed)
}

pub fn apply(state: &mut State, changed: &BTreeMap<i64, Option<Val>>) {
    for (k, v) in changed {
        match v {
            Some(v) => state.insert(*k, v.clone()),
            None => state.remove(k),
        };
    }
}

/// A random Put whose values are unique to it (`id`), so that its changelog is told
/// apart from any other Put's.
pub fn random_put(rng: &mut StdRng, engine: Engine, id: u64, keys: &[i64]) -> PutSpec {
    let target = if engine.takes_partial_updates() && rng.random_bool(0.3) {
        if rng.random_bool(0.5) {
            Target::Name
        } else {
            Target::Score
        }
    } else {
        Target::All
    };
    let rows = (0..rng.random_range(1..=3))
        .map(|i| {
            // Versions in a small range, so that older ones arrive too.
            let version = match engine {
                Engine::Versioned => rng.random_range(0..8) * 1_000_000,
                _ => 0,
            };
            RowSpec {
                key: keys[rng.random_range(0..keys.len())],
                delete: rng.random_bool(0.2),
                val: Val {
                    name: (!rng.random_bool(0.1)).then(|| format!("p{id}.{i}")),
                    score: (!rng.random_bool(0.1)).then(|| version + id as i64 * 10 + i),
                },
            }
        })
        .collect();
    PutSpec { target, rows }
}

pub fn request(put: &PutSpec, writer_id: i64, sequence: i64) -> PutRequest {
    let targets = put.target.columns();
    let schema = match &targets {
        None => schema(),
        Some(t) => schema().project(t).unwrap(),
    };
    let columns: Vec<ArrayRef> = schema
        .columns
        .iter()
        .map(|c| -> ArrayRef {
            match c.name.as_str() {
                "id" => Arc::new(Int64Array::from_iter_values(put.rows.iter().map(|r| r.key))),
                "name" => Arc::new(StringArray::from(
                    put.rows
                        .iter()
                        .map(|r| r.val.name.clone())
                        .collect::<Vec<_>>(),
                )),
                _ => Arc::new(Int64Array::from(
                    put.rows.iter().map(|r| r.val.score).collect::<Vec<_>>(),
                )),
            }
        })
        .collect();
    let changes = put.rows.iter().any(|r| r.delete).then(|| {
        put.rows
            .iter()
            .map(|r| {
                if r.delete {
                    ChangeType::Delete
                } else {
                    ChangeType::Insert
                }
            })
            .collect()
    });
    PutRequest {
        writer_id,
        batch_sequence: sequence,
        kafka: None,
        schema_id: 1,
        target_columns: targets,
        changes,
        batch: RecordBatch::try_new(schema.to_arrow(), columns).unwrap(),
    }
}

/// Full-width rows (`id`, `name`, `score`) of a batch.
pub fn rows_of(batch: &RecordBatch) -> Vec<(i64, Val)> {
    let ids = batch.column(0).as_primitive::<Int64Type>();
    let names = batch.column(1).as_string::<i32>();
    let scores = batch.column(2).as_primitive::<Int64Type>();
    (0..batch.num_rows())
        .map(|i| {
            (
                ids.value(i),
                Val {
                    name: (!names.is_null(i)).then(|| names.value(i).to_string()),
                    score: (!scores.is_null(i)).then(|| scores.value(i)),
                },
            )
        })
        .collect()
}
