//! A Mink table as DataFusion sees it: [`MinkTable`], one per name a statement uses.
//!
//! | SQL name | what it reads |
//! |---|---|
//! | `db.t`, a log table | every retained row: each bucket's log from its start to the high watermark at planning (`GetFlightInfo`'s endpoints) |
//! | `db.t`, a primary-key table | its state: per bucket the KV snapshot and the changelog since, merged up to the planned cut; point and prefix queries by `lookup` / `prefix_lookup` |
//! | `db.t`, tiered to the lake | `Union`: the lake snapshot and each bucket's log past it, every row once (a primary-key table's merged state) |
//! | `db."t$lake"` | `Lake`: the newest lake snapshot alone, its id fixed at planning, one part per bucket |
//! | `db."t$changelog"` | every retained change of a primary-key table, with `_change_type`, `_log_offset` and `_commit_timestamp` |

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use mink_flight::actions::{LakeSnapshot, ListPartitions, TableInfo, TableRef};
use mink_flight::filter::Filter;
use mink_flight::protocol::ReadTicket;
use mink_types::{MinkError, PartitionId, TableBucket, TablePath};

use crate::access::{Access, Shape, decide, partition_allowed, support};
use crate::engine::schema_of;
use crate::exec::{CHANGELOG_COLUMNS, Describe, MinkReadExec, Part, mink_error};
use crate::merge::key_columns;
use crate::nodes::Nodes;
use crate::pushdown::{node_filter, translates};

/// Which view of a table a name reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// `t`: the table.
    Table,
    /// `t$lake`: the lake snapshot.
    Lake,
    /// `t$changelog`: a primary-key table's changes.
    Changelog,
}

impl View {
    /// A SQL table name as (Mink table name, view).
    pub fn of(name: &str) -> (&str, View) {
        if let Some(t) = name.strip_suffix("$lake") {
            (t, View::Lake)
        } else if let Some(t) = name.strip_suffix("$changelog") {
            (t, View::Changelog)
        } else {
            (name, View::Table)
        }
    }
}

/// Limits a table's reads follow (from `[query]`).
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    pub lookup_keys_max: usize,
    pub read_parallelism: usize,
    pub batch_size: usize,
    /// Whether reads send the filters the nodes can evaluate (`query.filter_pushdown`).
    pub filter_pushdown: bool,
}

#[derive(Debug)]
pub struct MinkTable {
    nodes: Arc<Nodes>,
    info: TableInfo,
    view: View,
    schema: SchemaRef,
    /// The table's own columns (a `$changelog`'s without its system columns): what a
    /// node's filter may name.
    own: SchemaRef,
    shape: Shape,
    limits: ReadLimits,
}

impl MinkTable {
    pub fn new(
        nodes: Arc<Nodes>,
        info: TableInfo,
        view: View,
        limits: ReadLimits,
    ) -> mink_types::Result<Self> {
        let path = &info.path;
        let primary = info.descriptor.has_primary_key();
        let lake = info.descriptor.properties.lake.enabled;
        match view {
            View::Changelog if !primary => {
                return Err(MinkError::NotFound(format!(
                    "table {path}$changelog: {path} is a log table (its rows are its changes; read {path})"
                )));
            }
            View::Lake if !lake => {
                return Err(MinkError::NotFound(format!(
                    "table {path}$lake: {path} is not tiered to the lake (lake.enabled is off)"
                )));
            }
            _ => {}
        }
        let own = schema_of(&info.descriptor.schema)?;
        let schema = match view {
            View::Changelog => {
                let mut fields: Vec<Field> =
                    own.fields().iter().map(|f| f.as_ref().clone()).collect();
                fields.push(Field::new(CHANGELOG_COLUMNS[0], DataType::Utf8, false));
                fields.push(Field::new(CHANGELOG_COLUMNS[1], DataType::Int64, false));
                fields.push(Field::new(
                    CHANGELOG_COLUMNS[2],
                    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                    true,
                ));
                Arc::new(Schema::new(fields))
            }
            _ => own.clone(),
        };
        Ok(Self {
            own,
            shape: Shape::of(&info.descriptor),
            nodes,
            info,
            view,
            schema,
            limits,
        })
    }

    pub fn info(&self) -> &TableInfo {
        &self.info
    }

    /// A log table tiered to the lake, read as the Union of each bucket's lake files
    /// and log: its log alone may have been trimmed below what the lake holds.
    fn union_of_buckets(&self) -> bool {
        self.view == View::Table
            && self.info.descriptor.properties.lake.enabled
            && !self.info.descriptor.has_primary_key()
    }

    fn primary_state(&self) -> bool {
        self.view == View::Table && self.info.descriptor.has_primary_key()
    }

    /// The columns a node's filter may name: a state is merged here from its snapshot
    /// and changelog, and a row may leave the filter's range by a later change of its
    /// values, never of its key; any column of other reads (their rows are final on
    /// the node).
    fn filter_columns(&self) -> Option<&[String]> {
        self.primary_state()
            .then_some(self.info.descriptor.primary_key.as_slice())
    }

    /// Whether reads of this view send filters: not a `$changelog`'s, whose rows are
    /// numbered by their place in the batch the node sent.
    fn filters_pushed(&self) -> bool {
        self.limits.filter_pushdown && self.view != View::Changelog
    }

    /// The filter a read of this table sends its nodes, if any.
    fn node_filter(&self, filters: &[Expr]) -> Option<Filter> {
        if !self.filters_pushed() {
            return None;
        }
        node_filter(filters, &self.own, self.filter_columns())
    }

    /// The buckets to read and where their leaders are, from `GetFlightInfo`: each
    /// endpoint's ticket is a Scan up to the high watermark now (the query's cut).
    /// Waits for every bucket to have a leader that answers (a node died, and its
    /// buckets have not moved yet).
    async fn endpoints(
        &self,
        partitions: &Option<std::collections::BTreeSet<String>>,
        buckets: &Option<std::collections::BTreeSet<mink_types::BucketId>>,
    ) -> mink_types::Result<Vec<(String, ReadTicket)>> {
        self.nodes
            .waiting("planning a read", || {
                self.endpoints_once(partitions, buckets)
            })
            .await
    }

    async fn endpoints_once(
        &self,
        partitions: &Option<std::collections::BTreeSet<String>>,
        buckets: &Option<std::collections::BTreeSet<mink_types::BucketId>>,
    ) -> mink_types::Result<Vec<(String, ReadTicket)>> {
        let info = self.nodes.flight_info(&self.info.path).await?;
        let mut names: BTreeMap<PartitionId, String> = self
            .info
            .partitions
            .values()
            .map(|p| (p.id, p.name.clone()))
            .collect();
        let mut out = Vec::new();
        for endpoint in info.endpoint {
            let ticket = endpoint
                .ticket
                .as_ref()
                .ok_or_else(|| MinkError::Internal("an endpoint without a ticket".into()))?;
            let ticket: ReadTicket = serde_json::from_slice(&ticket.ticket)
                .map_err(|e| MinkError::Internal(format!("an endpoint's ticket: {e}")))?;
            let ReadTicket::Scan { bucket, .. } = &ticket else {
                return Err(MinkError::Internal(format!(
                    "an endpoint's ticket is not a Scan: {ticket:?}"
                )));
            };
            if buckets
                .as_ref()
                .is_some_and(|b| !b.contains(&bucket.bucket))
            {
                continue;
            }
            if let (Some(patterns), Some(id)) = (partitions, bucket.partition_id) {
                if !names.contains_key(&id) {
                    // A partition created since the table was read.
                    let listed: Vec<mink_flight::actions::PartitionInfo> = serde_json::from_value(
                        self.nodes
                            .call(&ListPartitions(TableRef {
                                path: self.info.path.clone(),
                            }))
                            .await?,
                    )
                    .map_err(|e| MinkError::Internal(format!("list_partitions answered: {e}")))?;
                    names.extend(listed.into_iter().map(|p| (p.id, p.name)));
                }
                let Some(name) = names.get(&id) else {
                    return Err(MinkError::Internal(format!(
                        "partition {id} of {} has no name",
                        self.info.path
                    )));
                };
                if !partition_allowed(patterns, name, self.shape.partition_keys.len()) {
                    continue;
                }
            }
            let location = endpoint
                .location
                .first()
                .ok_or_else(|| MinkError::Unavailable(format!("{bucket} has no leader yet")))?;
            let addr = location
                .uri
                .split_once("://")
                .map_or(location.uri.as_str(), |(_, a)| a)
                .to_string();
            out.push((addr, ticket));
        }
        Ok(out)
    }
}

#[async_trait]
impl TableProvider for MinkTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match (self.view, support(&self.shape, f)) {
                // The lake may hold partitions dropped since, whose names the catalog
                // no longer knows: they are read, and the filter applied to their rows.
                (View::Lake, TableProviderFilterPushDown::Exact) => {
                    TableProviderFilterPushDown::Inexact
                }
                // Not pushed for pruning or lookups, but the nodes can apply it.
                (_, TableProviderFilterPushDown::Unsupported)
                    if self.filters_pushed() && translates(f, &self.own, self.filter_columns()) =>
                {
                    TableProviderFilterPushDown::Inexact
                }
                (_, pushed) => pushed,
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let path = self.info.path.clone();
        let (parts, describe) = match self.view {
            View::Lake => self.lake_parts(filters).await,
            _ => self.bucket_parts(filters, limit).await,
        }
        .map_err(mink_error)?;
        let keys = if self.primary_state() {
            key_columns(&self.schema, &self.info.descriptor.primary_key)?
        } else {
            vec![]
        };
        let filter = match parts.first() {
            // Lookups answer keys; DataFusion filters what they find.
            Some(Part::Lookup { .. } | Part::PrefixLookup { .. }) => None,
            _ => self.node_filter(filters),
        };
        Ok(Arc::new(MinkReadExec::new(
            self.nodes.clone(),
            path,
            parts,
            self.schema.clone(),
            (projection.cloned(), filter),
            keys,
            self.view == View::Changelog,
            describe,
            self.limits.read_parallelism,
            self.limits.batch_size,
        )?))
    }
}

impl MinkTable {
    /// `t$lake`: the newest lake snapshot, its id fixed now (each part reads that one,
    /// however many rounds commit while the query runs), one part per bucket the
    /// snapshot holds rows of, read in parallel and pruned as bucket reads are.
    async fn lake_parts(&self, filters: &[Expr]) -> mink_types::Result<(Vec<Part>, Describe)> {
        let path = &self.info.path;
        let snapshot = match self
            .nodes
            .call(&LakeSnapshot(TableRef { path: path.clone() }))
            .await
        {
            Ok(s) => s,
            // No round has committed yet: the lake holds no row. (The node knows the
            // table: it answers at least the index the table was read at.)
            Err(MinkError::NotFound(m)) if m.starts_with("a lake snapshot of") => {
                return Ok((
                    vec![],
                    Describe::estimated("lake", "no snapshot yet", Some(0)),
                ));
            }
            Err(e) => return Err(e),
        };
        let malformed = |what: &str| {
            MinkError::Internal(format!("lake_snapshot of {path} answered without {what}"))
        };
        // The live rows of the whole snapshot (what a pruned read yields at most).
        let number = |key: &str| snapshot.get(key).and_then(|v| v.as_u64());
        let rows = number("records")
            .map(|records| records.saturating_sub(number("position_deletes").unwrap_or(0)));
        let id = snapshot
            .get("snapshot_id")
            .and_then(|v| v.as_i64())
            .ok_or_else(|| malformed("a snapshot_id"))?;
        let offsets: BTreeMap<String, i64> = snapshot
            .get("offsets")
            .cloned()
            .and_then(|o| serde_json::from_value(o).ok())
            .ok_or_else(|| malformed("its offsets"))?;
        let lake = |bucket| Part::Any {
            ticket: ReadTicket::Lake {
                path: path.clone(),
                snapshot_id: Some(id),
                bucket,
                columns: None,
                filter: None,
            },
        };
        let streams: Option<Vec<TableBucket>> = offsets
            .keys()
            .map(|s| TableBucket::from_stream_name(s).filter(|b| b.table_id == self.info.id))
            .collect();
        let Some(streams) = streams else {
            // A bucket name this reader does not know: the snapshot read whole.
            return Ok((
                vec![lake(None)],
                Describe::estimated("lake", format!("snapshot={id} whole"), rows),
            ));
        };
        let (partitions, buckets) = match decide(
            &self.shape,
            false,
            filters,
            None,
            self.limits.lookup_keys_max,
        ) {
            Access::Scan {
                partitions,
                buckets,
                ..
            } => (partitions, buckets),
            _ => (None, None),
        };
        let names: BTreeMap<PartitionId, &str> = self
            .info
            .partitions
            .values()
            .map(|p| (p.id, p.name.as_str()))
            .collect();
        let parts: Vec<Part> = streams
            .into_iter()
            .filter(|b| buckets.as_ref().is_none_or(|only| only.contains(&b.bucket)))
            .filter(|b| match (&partitions, b.partition_id) {
                // A partition dropped since keeps its part (the filter sees its rows).
                (Some(patterns), Some(id)) => names.get(&id).is_none_or(|name| {
                    partition_allowed(patterns, name, self.shape.partition_keys.len())
                }),
                _ => true,
            })
            .map(|b| lake(Some(b)))
            .collect();
        let mut detail = format!("snapshot={id} buckets={}", parts.len());
        pruning(&mut detail, &partitions, &buckets);
        Ok((parts, Describe::estimated("lake", detail, rows)))
    }

    async fn bucket_parts(
        &self,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> mink_types::Result<(Vec<Part>, Describe)> {
        let primary = self.primary_state();
        match decide(
            &self.shape,
            primary,
            filters,
            limit,
            self.limits.lookup_keys_max,
        ) {
            Access::Lookup { keys } => {
                let detail = format!("keys={}", keys.len());
                let rows = Some(keys.len() as u64);
                Ok((
                    vec![Part::Lookup { keys }],
                    Describe::estimated("lookup", detail, rows),
                ))
            }
            Access::PrefixLookup { prefix } => {
                let detail = format!("prefix={}", serde_json::Value::from(prefix.clone()));
                Ok((
                    vec![Part::PrefixLookup { prefix }],
                    Describe::estimated("prefix_lookup", detail, None),
                ))
            }
            Access::Scan {
                partitions,
                buckets,
                limit,
            } => {
                let endpoints = self.endpoints(&partitions, &buckets).await?;
                let logged = logged_rows(&endpoints);
                let mut detail = format!("buckets={}", endpoints.len());
                pruning(&mut detail, &partitions, &buckets);
                let union = self.union_of_buckets();
                let read = match (primary, union) {
                    (true, _) => "state",
                    (false, true) => "union",
                    (false, false) => "scan",
                };
                let path = &self.info.path;
                let parts: Vec<Part> = endpoints
                    .into_iter()
                    .map(|(addr, ticket)| match (ticket, limit) {
                        // Not a LimitScan: the log may hold fewer rows than the lake.
                        (ReadTicket::Scan { bucket, .. }, _) if union => Part::Log {
                            addr,
                            ticket: ReadTicket::Union {
                                path: path.clone(),
                                bucket: Some(bucket),
                                columns: None,
                                filter: None,
                            },
                        },
                        (
                            ReadTicket::Scan {
                                bucket, end_offset, ..
                            },
                            _,
                        ) if primary => Part::State {
                            addr,
                            bucket,
                            end_offset: end_offset.unwrap_or(i64::MAX),
                        },
                        (ReadTicket::Scan { bucket, .. }, Some(limit)) => Part::Log {
                            addr,
                            ticket: ReadTicket::LimitScan {
                                bucket,
                                limit: limit as u64,
                                columns: None,
                            },
                        },
                        (ticket, _) => Part::Log { addr, ticket },
                    })
                    .collect();
                if let (Some(l), false) = (limit, union) {
                    detail.push_str(&format!(", limit_scan={l}"));
                }
                let rows = match (union, limit) {
                    (true, _) => None,
                    (false, Some(l)) => Some(logged.min(l as u64 * parts.len() as u64)),
                    (false, None) => Some(logged),
                };
                let mut describe = Describe::estimated(read, detail, rows);
                // A log table's offsets are its rows, one each, and the read yields
                // every row of `[start, cut)` of the buckets chosen: the count is
                // exact (DataFusion answers `count(*)` from it, reading nothing). A
                // primary-key table's log holds changes, and sequence markers that
                // take an offset without a row.
                describe.rows_exact =
                    !union && limit.is_none() && !self.info.descriptor.has_primary_key();
                Ok((parts, describe))
            }
        }
    }
}

/// The rows the endpoints' logs hold up to the cut: a log table's rows, a primary-key
/// table's changes (more than its state). A lake-tiered table's lake is not counted.
fn logged_rows(endpoints: &[(String, ReadTicket)]) -> u64 {
    endpoints
        .iter()
        .map(|(_, t)| match t {
            ReadTicket::Scan {
                offset,
                end_offset: Some(end),
                ..
            } => (end - offset).max(0) as u64,
            _ => 0,
        })
        .sum()
}

/// The pruning of a read, for EXPLAIN.
fn pruning(
    detail: &mut String,
    partitions: &Option<std::collections::BTreeSet<String>>,
    buckets: &Option<std::collections::BTreeSet<mink_types::BucketId>>,
) {
    if let Some(b) = buckets {
        detail.push_str(&format!(
            " (pruned to bucket {})",
            b.iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(p) = partitions {
        detail.push_str(&format!(
            ", partitions=[{}]",
            p.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
}

/// A table of the catalog, fetched from a node.
pub async fn fetch(
    nodes: &Arc<Nodes>,
    database: &str,
    name: &str,
    limits: ReadLimits,
) -> mink_types::Result<MinkTable> {
    let (table, view) = View::of(name);
    let path = TablePath::parse(&format!("{database}.{table}")).map_err(|e| {
        MinkError::NotFound(format!(
            "table {database}.{name} (no Mink table has such a name: {e})"
        ))
    })?;
    let answer = nodes
        .call(&mink_flight::actions::GetTable(TableRef { path }))
        .await?;
    let info = TableInfo::from_answer(answer)?;
    MinkTable::new(nodes.clone(), info, view, limits)
}
