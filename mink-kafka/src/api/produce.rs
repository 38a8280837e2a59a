//! Produce (3-9): one append per topic-partition, durable on object storage before
//! the response (acks=0 only suppresses the response). Idempotent producers go
//! through the writer window: producer id = writer id, base sequence = the batch's
//! first sequence. Transactional produce is refused.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use mink_types::MinkError;

use super::{Ctx, ProduceTurn, now_ms, s};
use crate::handler::{PendingProduce, ProducerBatch, error_code};
use crate::records::{ProducedBatch, RecordError, decode_produce};
use crate::refused::is_retriable_refusal;

fn failed(index: i32, code: ResponseError, message: String, v: i16) -> PartitionProduceResponse {
    let mut out = PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(code.code())
        .with_base_offset(-1);
    if v >= 8 {
        out = out.with_error_message(Some(s(message)));
    }
    out
}

/// What became of one partition before durability.
enum Step {
    Done(PartitionProduceResponse),
    Pending(i32, PendingProduce, Option<ProducerBatch>),
}

pub(crate) async fn produce(
    ctx: &Ctx,
    r: ProduceRequest,
    v: i16,
    turn: Option<ProduceTurn>,
) -> ProduceResponse {
    let (previous, done) = match turn {
        Some((previous, done)) => (previous, Some(done)),
        None => (None, None),
    };
    if let Some(previous) = previous {
        // Dropped (the previous request failed early) counts as done.
        let _ = previous.await;
    }
    let refusal = if r.transactional_id.is_some() {
        Some((
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactional produce is not implemented".to_string(),
        ))
    } else if !matches!(r.acks, -1..=1) {
        Some((
            ResponseError::InvalidRequiredAcks,
            format!("acks={} is not -1, 0 or 1", r.acks),
        ))
    } else {
        None
    };
    let mut steps: Vec<(usize, Step)> = Vec::new();
    let mut topics = Vec::with_capacity(r.topic_data.len());
    let mut names = Vec::with_capacity(r.topic_data.len());
    for (t, topic) in r.topic_data.into_iter().enumerate() {
        topics.push(TopicProduceResponse::default().with_name(topic.name.clone()));
        names.push(topic.name.to_string());
        for p in topic.partition_data {
            let step = match &refusal {
                Some((code, message)) => Step::Done(failed(p.index, *code, message.clone(), v)),
                None => one(ctx, &topic.name, p.index, p.records, v).await,
            };
            steps.push((t, step));
        }
    }
    // Every partition has its offsets: the next Produce of this connection may go.
    drop(done);
    for (t, step) in steps {
        let response = match step {
            Step::Done(r) => r,
            Step::Pending(index, pending, producer) => match pending.await {
                Ok(p) => {
                    if let Some(b) = producer {
                        ctx.refused
                            .written(&names[t], index, b.producer_id, b.last_sequence);
                    }
                    let mut out = PartitionProduceResponse::default()
                        .with_index(index)
                        .with_base_offset(p.base_offset);
                    if let Some(at) = p.log_append_time {
                        out = out.with_log_append_time_ms(at);
                    }
                    if v >= 5 {
                        out = out.with_log_start_offset(p.log_start_offset);
                    }
                    out
                }
                Err(e) => {
                    let code = produce_error_code(&e);
                    if let Some(b) = producer {
                        if is_retriable_refusal(code) {
                            ctx.refused.unwritten(
                                &names[t],
                                index,
                                b.producer_id,
                                b.first_sequence,
                            );
                        } else {
                            ctx.refused
                                .forget(&names[t], index, b.producer_id, b.first_sequence);
                        }
                    }
                    failed(index, code, e.to_string(), v)
                }
            },
        };
        topics[t].partition_responses.push(response);
    }
    ProduceResponse::default().with_responses(topics)
}

/// A write's error as a Produce answers it: a batch over a size limit of the log
/// (encoded bytes, rows, a WAL payload) is MESSAGE_TOO_LARGE, which producers answer
/// by splitting the batch.
fn produce_error_code(e: &MinkError) -> ResponseError {
    match e {
        MinkError::LimitExceeded { .. } => ResponseError::MessageTooLarge,
        other => error_code(other),
    }
}

/// One topic-partition's batch: decoded and checked, its producer read, submitted to
/// the handler (creating the topic on first use), and the outcome mapped to Kafka's
/// answer.
async fn one(ctx: &Ctx, topic: &str, index: i32, records: Option<bytes::Bytes>, v: i16) -> Step {
    let refused = |e: RecordError| Step::Done(failed(index, e.code, e.message, v));
    let Some(records) = records else {
        return refused(RecordError::new(ResponseError::InvalidRecord, "no records"));
    };
    let batch = match decoded(ctx, &records) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(topic, partition = index, "kafka produce refused: {e}");
            return refused(e);
        }
    };
    let producer = match producer_of(&batch) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let attempt = submit(ctx, topic, index, batch.rows, producer, records.len()).await;
    match attempt {
        Ok(pending) => {
            if let Some(b) = producer {
                ctx.refused
                    .unwritten(topic, index, b.producer_id, b.first_sequence);
            }
            Step::Pending(index, pending, producer)
        }
        Err(e) => Step::Done(refusal(ctx, topic, index, &e, producer, v)),
    }
}

/// The records decoded into rows, within `max.message.bytes` and the request bound,
/// timestamps no further ahead than `timestamp_after_max_ms`.
fn decoded(ctx: &Ctx, records: &bytes::Bytes) -> Result<ProducedBatch, RecordError> {
    if records.len() as u64 > ctx.config.message_bytes_max() {
        return Err(RecordError::new(
            ResponseError::MessageTooLarge,
            format!(
                "the record batch is {} bytes, more than max.message.bytes ({})",
                records.len(),
                ctx.config.message_bytes_max()
            ),
        ));
    }
    let now = now_ms();
    let latest = now.saturating_add(ctx.config.timestamp_after_max_ms.min(i64::MAX as u64) as i64);
    let max = usize::try_from(ctx.config.max_request_bytes).unwrap_or(usize::MAX);
    decode_produce(records, now, latest, max)
}

/// The batch's idempotent producer as a writer: `None` without one. The writer id
/// carries the producer epoch (`mink_types::writer`): each epoch is a writer of its
/// own, starting at sequence 0, and fences the older ones.
fn producer_of(batch: &ProducedBatch) -> Result<Option<ProducerBatch>, RecordError> {
    if batch.producer_id < 0 {
        return Ok(None);
    }
    let Some(writer) = mink_types::writer_id(batch.producer_id, batch.producer_epoch) else {
        return Err(if batch.producer_epoch < 0 {
            RecordError::new(
                ResponseError::InvalidProducerEpoch,
                format!("producer epoch {}", batch.producer_epoch),
            )
        } else {
            RecordError::new(
                ResponseError::UnknownProducerId,
                format!("producer id {} was not issued here", batch.producer_id),
            )
        });
    };
    Ok(Some(ProducerBatch {
        producer_id: writer,
        first_sequence: i64::from(batch.base_sequence),
        last_sequence: i64::from(batch.base_sequence) + batch.rows.num_rows() as i64 - 1,
    }))
}

/// Submits the rows to the handler; a topic it does not know is created on first use
/// when `auto_create_topics` is on (a partition the topic lacks stays unknown).
async fn submit(
    ctx: &Ctx,
    topic: &str,
    index: i32,
    rows: arrow::array::RecordBatch,
    producer: Option<ProducerBatch>,
    bytes: usize,
) -> Result<PendingProduce, MinkError> {
    let attempt = ctx
        .handler
        .produce(topic, index, rows.clone(), producer, bytes)
        .await;
    if !(matches!(attempt, Err(MinkError::NotFound(_))) && ctx.config.auto_create_topics) {
        return attempt;
    }
    ctx.handler
        .topic(topic, Some(ctx.config.default_partitions))
        .await?;
    ctx.handler
        .produce(topic, index, rows, producer, bytes)
        .await
}

/// A refused write as the partition's answer. An idempotent producer's gap left by a
/// batch refused as not persisted is refused the same retriable way
/// (LEADER_NOT_AVAILABLE), so that the producer retries in order
/// (`crate::refused`); a retriable refusal of its own leaves such a gap.
fn refusal(
    ctx: &Ctx,
    topic: &str,
    index: i32,
    e: &MinkError,
    producer: Option<ProducerBatch>,
    v: i16,
) -> PartitionProduceResponse {
    let code = refusal_code(e);
    let Some(b) = producer else {
        return failed(index, code, e.to_string(), v);
    };
    let expected = match e {
        MinkError::OutOfOrderSequence { expected, .. } => Some(Some(*expected)),
        MinkError::UnknownWriter { .. } => Some(None),
        _ => None,
    };
    let explained = expected.and_then(|expected| {
        ctx.refused
            .explains(topic, index, b.producer_id, b.first_sequence, expected)
    });
    if let Some(refused) = explained {
        let why = format!(
            "{topic}-{index}: sequence {} follows this producer's batch at \
             sequence {refused}, which was not persisted; send both again in order",
            b.first_sequence
        );
        tracing::debug!("kafka produce refused: {why}");
        return failed(index, ResponseError::LeaderNotAvailable, why, v);
    }
    if is_retriable_refusal(code) {
        ctx.refused
            .unwritten(topic, index, b.producer_id, b.first_sequence);
    }
    failed(index, code, e.to_string(), v)
}

/// The Kafka error of a refused write: a bad topic name is INVALID_TOPIC_EXCEPTION; a
/// record the topic refuses (a compacted topic's without a key, or with a key of
/// another partition) INVALID_RECORD, as Kafka refuses it; the rest as
/// [`produce_error_code`].
fn refusal_code(e: &MinkError) -> ResponseError {
    match e {
        MinkError::InvalidArgument { field, .. } if field == "topic" => {
            ResponseError::InvalidTopicException
        }
        MinkError::InvalidArgument { field, .. } if field == "record" => {
            ResponseError::InvalidRecord
        }
        other => produce_error_code(other),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use arrow::array::RecordBatch;
    use async_trait::async_trait;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::Compression;
    use mink_types::TableBucket;

    use super::*;
    use crate::handler::*;

    /// A handler whose `produce` answers from a script; Produce needs nothing else.
    struct Scripted {
        answers: Mutex<VecDeque<Result<PendingProduce, MinkError>>>,
    }

    /// What the scripted handler answers to anything but Produce.
    fn unused() -> MinkError {
        MinkError::Unimplemented("the scripted handler answers Produce only".into())
    }

    #[async_trait]
    impl KafkaHandler for Scripted {
        fn broker_id(&self) -> i32 {
            0
        }
        fn cluster(&self) -> ClusterView {
            ClusterView {
                cluster_id: "scripted".into(),
                controller_id: -1,
                brokers: Vec::new(),
            }
        }
        async fn topics(&self) -> Result<Vec<TopicView>, MinkError> {
            Err(unused())
        }
        async fn topic(&self, _: &str, _: Option<u32>) -> Result<TopicView, MinkError> {
            Err(unused())
        }
        async fn create_topic(
            &self,
            _: &str,
            _: u32,
            _: &crate::topic_config::TopicConfigs,
            _: bool,
        ) -> Result<(), MinkError> {
            Err(unused())
        }
        async fn delete_topic(&self, _: &str) -> Result<(), MinkError> {
            Err(unused())
        }
        async fn alter_topic_configs(
            &self,
            _: &str,
            _: Option<i64>,
            _: &crate::topic_config::TopicAlter,
            _: bool,
        ) -> Result<(), MinkError> {
            Err(unused())
        }
        async fn create_partitions(&self, _: &str, _: u32, _: bool) -> Result<(), MinkError> {
            Err(unused())
        }
        async fn delete_records(&self, _: &str, _: i32, _: i64) -> Result<i64, MinkError> {
            Err(unused())
        }
        async fn produce(
            &self,
            _: &str,
            _: i32,
            _: RecordBatch,
            _: Option<ProducerBatch>,
            _: usize,
        ) -> Result<PendingProduce, MinkError> {
            self.answers
                .lock()
                .unwrap()
                .pop_front()
                .expect("a scripted answer")
        }
        async fn fetch(
            &self,
            _: &str,
            _: i32,
            _: i64,
            _: Duration,
            _: usize,
        ) -> Result<Fetched, MinkError> {
            Err(unused())
        }
        async fn list_offset(
            &self,
            _: &str,
            _: i32,
            _: OffsetQuery,
        ) -> Result<ListedOffset, MinkError> {
            Err(unused())
        }
        async fn leader_epoch(&self, _: &str, _: i32) -> Result<i32, MinkError> {
            Err(unused())
        }
        async fn epoch_end(
            &self,
            _: &str,
            _: i32,
            _: i32,
        ) -> Result<Option<(i32, i64)>, MinkError> {
            Err(unused())
        }
        async fn init_producer_id(&self) -> Result<i64, MinkError> {
            Err(unused())
        }
        fn is_coordinator(&self) -> bool {
            false
        }
        async fn commit_offsets(
            &self,
            _: &str,
            _: Vec<CommittedOffset>,
            _: i64,
        ) -> Result<(), MinkError> {
            Err(unused())
        }
        fn committed_offsets(&self, _: &str) -> Vec<CommittedOffset> {
            Vec::new()
        }
        fn offset_groups(&self) -> Vec<String> {
            Vec::new()
        }
        async fn group_emptied(&self, _: &str) -> Result<(), MinkError> {
            Err(unused())
        }
        async fn delete_group_offsets(&self, _: &str) -> Result<(), MinkError> {
            Err(unused())
        }
    }

    /// A Produce of one record at `sequence` from producer 7, epoch 0, to `t`-0.
    fn request(sequence: i32) -> ProduceRequest {
        let mut record = crate::records::tests::record(0, "k", "v", now_ms(), &[]);
        record.sequence = sequence;
        let records = crate::records::tests::produced(&[record], Compression::None);
        ProduceRequest::default()
            .with_acks(-1)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(records)),
                    ]),
            ])
    }

    fn answer(r: &ProduceResponse) -> (Option<ResponseError>, String) {
        let p = &r.responses[0].partition_responses[0];
        (
            ResponseError::try_from_code(p.error_code),
            p.error_message
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default(),
        )
    }

    /// Batch N is still on its way (its append not yet resolved) when N+1 reaches a
    /// reopened tablet that expects N: N+1 is refused as retriable, because N counts
    /// from its submission, not only from its refusal. Then N fails, retriable too.
    #[tokio::test]
    async fn a_batch_behind_one_still_on_its_way_is_refused_alike() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<Produced, MinkError>>();
        let pending: PendingProduce = Box::pin(async move { rx.await.unwrap() });
        let gap = MinkError::OutOfOrderSequence {
            bucket: TableBucket {
                table_id: 1,
                partition_id: None,
                bucket: 0,
            },
            writer_id: 7,
            first_sequence: 1,
            expected: 0,
        };
        let script = Arc::new(Scripted {
            answers: Mutex::new(VecDeque::from([Ok(pending), Err(gap)])),
        });
        let handler = script.clone();
        let config = crate::KafkaConfig::default();
        let ctx = Arc::new(Ctx {
            handler,
            groups: Arc::new(crate::groups::Coordinator::new(&config)),
            config,
            refused: Default::default(),
        });
        let first = tokio::spawn({
            let ctx = ctx.clone();
            async move { produce(&ctx, request(0), 9, None).await }
        });
        // Until the first is submitted: its answer is taken, and in the same poll it
        // goes on to await its append.
        while script.answers.lock().unwrap().len() > 1 {
            tokio::task::yield_now().await;
        }
        let (code, message) = answer(&produce(&ctx, request(1), 9, None).await);
        assert_eq!(code, Some(ResponseError::LeaderNotAvailable), "{message}");
        assert!(message.contains("not persisted"), "{message}");
        tx.send(Err(MinkError::Unavailable("the WAL failed".into())))
            .unwrap();
        let (code, message) = answer(&first.await.unwrap());
        assert_eq!(code, Some(ResponseError::LeaderNotAvailable), "{message}");
        // Both are remembered until the producer writes past them.
        assert_eq!(ctx.refused.explains("t", 0, 7, 1, Some(0)), Some(0));
    }
}
