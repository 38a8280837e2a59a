//! The actions behind the console (`crate::console`) that need another node's answer:
//! `bucket_stats` (a leader's offsets of its buckets) and `kafka_groups` (the lease
//! holder's consumer groups with their lag).

use std::collections::{BTreeMap, BTreeSet};

use mink_flight::actions::{
    BucketStat, BucketStats, KafkaGroup, KafkaGroupMember, KafkaGroupOffset, KafkaGroups,
    KafkaTopicPartitions, ListOffsets,
};

use super::*;

impl NodeService {
    /// The offsets of the buckets this node leads (of `r.path`, or of every table);
    /// with `r.open`, opening a bucket's tablet if it is not open yet.
    pub(crate) async fn bucket_stats(&self, r: BucketStats) -> Result<Vec<BucketStat>> {
        let table_id = match &r.path {
            Some(path) => Some(self.table(path).await?.id),
            None => None,
        };
        let me = self.meta.node_id().to_string();
        let led: Vec<TableBucket> = self.meta.read(|s| {
            s.buckets
                .values()
                .filter(|b| table_id.is_none_or(|id| b.bucket.table_id == id))
                .filter(|b| b.leader.as_deref() == Some(&me))
                .map(|b| b.bucket)
                .collect()
        });
        let mut open: HashMap<TableBucket, LogTablet> =
            self.tablets.open_logs().into_iter().collect();
        let mut out = Vec::with_capacity(led.len());
        for bucket in led {
            let log = match open.remove(&bucket) {
                Some(log) => log,
                None if r.open => match self.tablet(bucket).await {
                    Ok(t) => t.log().clone(),
                    // Moved away since the read: not this node's to report.
                    Err(MinkError::NotLeader { .. } | MinkError::NotFound(_)) => continue,
                    Err(e) => return Err(e),
                },
                None => continue,
            };
            out.push(BucketStat {
                bucket,
                epoch: log.epoch(),
                log_start: log.log_start(),
                high_watermark: log.high_watermark(),
                stored_bytes: Some(log.stored_bytes()),
            });
        }
        Ok(out)
    }

    /// Every consumer group: those with members (this node coordinates them while it
    /// holds the lease) and those with committed offsets only (`Empty`, as Kafka
    /// reports them). Another node forwards the request to the lease holder.
    pub(crate) async fn kafka_groups(&self, r: KafkaGroups) -> Result<Vec<KafkaGroup>> {
        let (_, holder) = self.meta.lease();
        match holder.as_deref() {
            Some(h) if h == self.meta.node_id() => {}
            Some(h) if !r.forwarded => {
                let addr = self
                    .meta
                    .read(|s| s.nodes.get(h).map(|n| n.flight_addr.clone()))
                    .ok_or_else(|| {
                        MinkError::Unavailable(format!(
                            "the lease holder {h} has no address in this node's view"
                        ))
                    })?;
                return self
                    .forwarder
                    .call(&addr, &KafkaGroups { forwarded: true })
                    .await;
            }
            _ => {
                return Err(MinkError::Unavailable(
                    "no node holds the lease now: consumer groups live on the lease holder".into(),
                ));
            }
        }
        let now = now_ms();
        let offsets: BTreeMap<String, Vec<(String, i32, i64)>> = self.meta.read(|s| {
            s.group_offsets
                .iter()
                .map(|(group, offsets)| {
                    let parsed = offsets
                        .iter()
                        .filter(|(_, o)| o.expires_at_ms > now)
                        .filter_map(|(key, o)| {
                            let (topic, partition) = key.rsplit_once('/')?;
                            Some((topic.to_string(), partition.parse().ok()?, o.offset))
                        })
                        .collect();
                    (group.clone(), parsed)
                })
                .collect()
        });
        let topics: BTreeSet<&str> = offsets
            .values()
            .flatten()
            .map(|(t, _, _)| t.as_str())
            .collect();
        let mut watermarks: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for topic in topics {
            for (partition, hw) in self.topic_high_watermarks(topic).await {
                watermarks.insert((topic.to_string(), partition), hw);
            }
        }
        let mut live: BTreeMap<String, mink_kafka::groups::GroupView> =
            self.kafka_coordinator.describe_all().into_iter().collect();
        let ids: BTreeSet<String> = live.keys().chain(offsets.keys()).cloned().collect();
        Ok(ids
            .into_iter()
            .map(|id| {
                let view = live.remove(&id);
                let offsets = offsets
                    .get(&id)
                    .into_iter()
                    .flatten()
                    .map(|(topic, partition, committed)| {
                        let hw = watermarks.get(&(topic.clone(), *partition)).copied();
                        KafkaGroupOffset {
                            topic: topic.clone(),
                            partition: *partition,
                            committed: *committed,
                            high_watermark: hw,
                            lag: hw.map(|hw| (hw - committed).max(0)),
                        }
                    })
                    .collect();
                group_answer(id, view, offsets)
            })
            .collect())
    }

    /// The high watermark of every partition of a topic; none when the topic is gone
    /// or its leaders do not answer (the console shows the lag as unknown).
    async fn topic_high_watermarks(&self, topic: &str) -> Vec<(i32, i64)> {
        let Ok(path) = self.topic_path(topic) else {
            return Vec::new();
        };
        let request = ListOffsets {
            forwarded: false,
            path,
            spec: "latest".into(),
            timestamp: None,
            partition: None,
            buckets: None,
        };
        match self.list_offsets(request).await {
            Ok(offsets) => offsets
                .into_iter()
                .filter_map(|o| Some((o.bucket.bucket as i32, o.offset?)))
                .collect(),
            Err(e) => {
                tracing::debug!(topic, "kafka_groups: no high watermarks: {e}");
                Vec::new()
            }
        }
    }
}

/// The most consumer-lag series one scrape reports (a group per partition each).
pub const LAG_SERIES_MAX: usize = 10_000;

impl NodeService {
    /// `mink_kafka_consumer_lag{group, topic, partition}`, in the Prometheus text
    /// format: on the lease holder, every committed offset's distance to its
    /// partition's high watermark, as `kafka-consumer-groups --describe` shows it
    /// (nothing on other nodes, so that a cluster reports each series once). Computed
    /// at scrape time from the metadata view and the leaders' offsets, so a deleted
    /// group's series go with it; at most [`LAG_SERIES_MAX`].
    pub async fn consumer_lag_metrics(&self) -> String {
        if !self.meta.is_lease_holder() {
            return String::new();
        }
        let groups = match tokio::time::timeout(
            LAG_SCRAPE_TIMEOUT,
            self.kafka_groups(KafkaGroups { forwarded: true }),
        )
        .await
        {
            Ok(Ok(groups)) => groups,
            Ok(Err(e)) => {
                tracing::debug!("consumer lag for /metrics: {e}");
                return String::new();
            }
            Err(_) => {
                tracing::debug!("consumer lag for /metrics: the leaders did not answer in time");
                return String::new();
            }
        };
        lag_text(&groups)
    }
}

/// How long a scrape waits for the partitions' high watermarks.
const LAG_SCRAPE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The lag series of `groups` in the Prometheus text format.
fn lag_text(groups: &[KafkaGroup]) -> String {
    use std::fmt::Write;
    let series: Vec<(&str, &KafkaGroupOffset, i64)> = groups
        .iter()
        .flat_map(|g| {
            g.offsets
                .iter()
                .filter_map(move |o| o.lag.map(|lag| (g.group_id.as_str(), o, lag)))
        })
        .take(LAG_SERIES_MAX)
        .collect();
    if series.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "# HELP mink_kafka_consumer_lag Records between a consumer group's committed offset and the partition's high watermark.\n# TYPE mink_kafka_consumer_lag gauge\n",
    );
    for (group, o, lag) in series {
        let _ = writeln!(
            out,
            "mink_kafka_consumer_lag{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {lag}",
            label(group),
            label(&o.topic),
            o.partition
        );
    }
    out
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn group_answer(
    group_id: String,
    view: Option<mink_kafka::groups::GroupView>,
    offsets: Vec<KafkaGroupOffset>,
) -> KafkaGroup {
    let Some(view) = view else {
        return KafkaGroup {
            group_id,
            state: "Empty".into(),
            protocol_type: "consumer".into(),
            protocol: String::new(),
            members: Vec::new(),
            offsets,
        };
    };
    let members = view
        .members
        .into_iter()
        .map(|m| KafkaGroupMember {
            assignment: if view.protocol_type == "consumer" {
                mink_kafka::groups::decode_assignment(&m.assignment)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(topic, partitions)| KafkaTopicPartitions { topic, partitions })
                    .collect()
            } else {
                Vec::new()
            },
            member_id: m.member_id,
            client_id: m.client_id,
            client_host: m.client_host,
        })
        .collect();
    KafkaGroup {
        group_id,
        state: view.state.name().into(),
        protocol_type: view.protocol_type,
        protocol: view.protocol,
        members,
        offsets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_series_escape_their_labels_and_skip_unknown_lag() {
        let offset = |partition, lag: Option<i64>| KafkaGroupOffset {
            topic: "orders.v1".into(),
            partition,
            committed: 5,
            high_watermark: lag.map(|l| 5 + l),
            lag,
        };
        let group = KafkaGroup {
            group_id: "a\"b\\c\nd".into(),
            state: "Empty".into(),
            protocol_type: "consumer".into(),
            protocol: String::new(),
            members: Vec::new(),
            offsets: vec![offset(0, Some(3)), offset(1, None)],
        };
        let text = lag_text(&[group]);
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            series,
            [r#"mink_kafka_consumer_lag{group="a\"b\\c\nd",topic="orders.v1",partition="0"} 3"#]
        );
        assert!(text.contains("# TYPE mink_kafka_consumer_lag gauge"));
        assert_eq!(lag_text(&[]), "");
    }
}
