//! Fetch (4-12): a long poll over many partitions without a thread per partition.
//!
//! Every partition is read once at once. When the total across partitions is less than
//! `min_bytes` (0 answers at once), every partition is tailed from where its read
//! ended (futures on this task, each woken by its high watermark, never by polling),
//! and each that brings rows is tailed again from its new end, until the total reaches
//! `min_bytes` or `max_wait_ms` (capped by `kafka.fetch_max_wait_cap_ms`) passed. Rows are
//! re-encoded as record batches v2; the response stops growing at the request's
//! `max_bytes` (capped by `kafka.max_fetch_bytes`), but always carries the first
//! partition that has data, whatever its size (KIP-74). A partition whose
//! `current_leader_epoch` (v9+) is not the leader's answers FENCED_LEADER_EPOCH or
//! UNKNOWN_LEADER_EPOCH and is not read. Each record batch carries the leader epoch it
//! was written under.

use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use mink_types::MinkError;

use super::Ctx;
use crate::handler::{Fetched, error_code};
use crate::records::encode_fetched_at;

/// One partition asked for.
struct Wanted {
    topic: usize,
    name: TopicName,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    /// The leader epoch the client believes in (-1: not checked).
    current_leader_epoch: i32,
}

/// What one partition answered: its records, encoded, and the offset after them; or
/// its error.
enum Answer {
    Records {
        bytes: BytesMut,
        high_watermark: i64,
        log_start_offset: i64,
        next_offset: i64,
    },
    Error(MinkError),
    /// Refused before reading (a leader epoch the leader does not have).
    Refused(ResponseError),
}

impl Answer {
    fn size(&self) -> usize {
        match self {
            Answer::Records { bytes, .. } => bytes.len(),
            Answer::Error(_) | Answer::Refused(_) => 0,
        }
    }

    /// Adds a later read of the same partition (from this answer's `next_offset`);
    /// returns the bytes it added.
    fn extend(&mut self, later: Answer) -> usize {
        let added = later.size();
        match (self, later) {
            (
                Answer::Records {
                    bytes,
                    high_watermark,
                    log_start_offset,
                    next_offset,
                },
                Answer::Records {
                    bytes: more,
                    high_watermark: hw,
                    log_start_offset: start,
                    next_offset: next,
                },
            ) => {
                bytes.extend_from_slice(&more);
                *high_watermark = hw;
                *log_start_offset = start;
                *next_offset = next;
            }
            (this, later @ (Answer::Error(_) | Answer::Refused(_))) => *this = later,
            (Answer::Error(_) | Answer::Refused(_), _) => {}
        }
        added
    }
}

/// The first read of a partition: its leader epoch checked, then what is there now.
async fn first_read(ctx: &Ctx, w: &Wanted) -> Answer {
    match super::offsets::check_leader_epoch(ctx, &w.name, w.partition, w.current_leader_epoch)
        .await
    {
        Ok(()) => read(ctx, w, w.offset, w.max_bytes, Duration::ZERO).await,
        Err(code) => Answer::Refused(code),
    }
}

async fn read(ctx: &Ctx, w: &Wanted, offset: i64, max_bytes: usize, wait: Duration) -> Answer {
    match ctx
        .handler
        .fetch(&w.name, w.partition, offset, wait, max_bytes)
        .await
    {
        Ok(f) => encode(w, offset, f),
        Err(e) => Answer::Error(e),
    }
}

fn encode(w: &Wanted, offset: i64, f: Fetched) -> Answer {
    let mut bytes = BytesMut::new();
    let mut next_offset = offset;
    for b in &f.batches {
        let base = b.base_offset;
        let appended_at = f.log_append_time.then_some(b.commit_timestamp);
        let encoded = encode_fetched_at(
            base,
            &b.rows,
            b.offsets.as_ref(),
            b.leader_epoch,
            appended_at,
            &mut bytes,
        );
        if let Err(e) = encoded {
            return Answer::Error(MinkError::Internal(format!(
                "{} partition {} at {base}: {e}",
                &*w.name, w.partition
            )));
        }
        next_offset = base
            + b.offsets
                .as_ref()
                .map_or(b.rows.num_rows() as i64, |o| i64::from(o.last) + 1);
    }
    Answer::Records {
        bytes,
        high_watermark: f.high_watermark,
        log_start_offset: f.log_start_offset,
        next_offset,
    }
}

/// Tails the partitions until their total reaches `min_bytes` or `deadline` passes:
/// every partition from where its answer ends, and again after each read that brought
/// rows (so one partition trickling rows also fills the answer), none beyond its
/// `max_bytes`.
async fn wait_for_min_bytes(
    ctx: &Ctx,
    wanted: &[Wanted],
    answers: &mut [Answer],
    min_bytes: usize,
    deadline: tokio::time::Instant,
) {
    let mut total: usize = answers.iter().map(Answer::size).sum();
    let tail = |i: usize, answers: &[Answer]| {
        let w = &wanted[i];
        let room = w.max_bytes.saturating_sub(answers[i].size());
        let from = match &answers[i] {
            Answer::Records { next_offset, .. } if room > 0 => Some(*next_offset),
            _ => None,
        };
        from.map(|offset| async move {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            (i, read(ctx, w, offset, room, left).await)
        })
    };
    let mut tails: FuturesUnordered<_> =
        (0..wanted.len()).filter_map(|i| tail(i, answers)).collect();
    while let Some((i, later)) = tails.next().await {
        let error = matches!(later, Answer::Error(_) | Answer::Refused(_));
        let added = answers[i].extend(later);
        total += added;
        if error || total >= min_bytes {
            return;
        }
        // A read with nothing returns at the deadline: that partition is done.
        if added > 0
            && tokio::time::Instant::now() < deadline
            && let Some(next) = tail(i, answers)
        {
            tails.push(next);
        }
    }
}

pub(crate) async fn fetch(ctx: &Ctx, r: FetchRequest, v: i16) -> FetchResponse {
    // Fetch sessions (KIP-227) are declined, as the KIP lets a broker: every response
    // names session 0, so clients keep sending full requests (session 0 with epoch 0
    // or -1). An incremental request (epoch > 0) names a session no broker here
    // created: FETCH_SESSION_ID_NOT_FOUND, and the client starts over with a full one.
    if v >= 7 && r.session_epoch > 0 {
        return FetchResponse::default()
            .with_error_code(ResponseError::FetchSessionIdNotFound.code())
            .with_session_id(0);
    }
    let wait_ms = (r.max_wait_ms.max(0) as u64).min(ctx.config.fetch_max_wait_cap_ms);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let min_bytes = r.min_bytes.max(0) as usize;
    let max_bytes = (r.max_bytes.max(0) as u64).min(ctx.config.max_fetch_bytes) as usize;
    let mut wanted = Vec::new();
    let mut topics = Vec::with_capacity(r.topics.len());
    // A partition named twice is read once (a Kafka broker keys a fetch by partition),
    // and none is read for more than the whole response may hold: listing one
    // partition many times, or asking 2 GiB of each, reads no more than the response
    // limit per partition.
    let mut seen = std::collections::HashSet::new();
    for (t, topic) in r.topics.into_iter().enumerate() {
        topics.push(FetchableTopicResponse::default().with_topic(topic.topic.clone()));
        for p in topic.partitions {
            if !seen.insert((topic.topic.clone(), p.partition)) {
                continue;
            }
            wanted.push(Wanted {
                topic: t,
                name: topic.topic.clone(),
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: (p.partition_max_bytes.max(0) as usize).min(max_bytes.max(1)),
                current_leader_epoch: if v >= 9 { p.current_leader_epoch } else { -1 },
            });
        }
    }
    // Everything that is there now, all partitions at once.
    let mut answers: Vec<Answer> =
        futures::future::join_all(wanted.iter().map(|w| first_read(ctx, w))).await;
    let total: usize = answers.iter().map(Answer::size).sum();
    let errors = answers
        .iter()
        .any(|a| matches!(a, Answer::Error(_) | Answer::Refused(_)));
    if total < min_bytes && !errors && wait_ms > 0 {
        wait_for_min_bytes(ctx, &wanted, &mut answers, min_bytes, deadline).await;
    }
    let mut used = 0usize;
    for (w, answer) in wanted.iter().zip(answers) {
        let mut out = PartitionData::default().with_partition_index(w.partition);
        match answer {
            Answer::Records {
                bytes,
                high_watermark,
                log_start_offset,
                ..
            } => {
                // Past max_bytes, partitions answer without records (the client asks
                // again from the same offset), except the first one with data.
                let records = if used > 0 && used + bytes.len() > max_bytes {
                    bytes::Bytes::new()
                } else {
                    used += bytes.len();
                    bytes.freeze()
                };
                out = out
                    .with_high_watermark(high_watermark)
                    .with_last_stable_offset(high_watermark)
                    .with_records(Some(records));
                if v >= 5 {
                    out = out.with_log_start_offset(log_start_offset);
                }
            }
            Answer::Refused(code) => {
                out = out
                    .with_error_code(code.code())
                    .with_high_watermark(-1)
                    .with_records(Some(bytes::Bytes::new()));
            }
            Answer::Error(e) => {
                tracing::debug!(
                    topic = w.name.as_str(),
                    partition = w.partition,
                    "kafka fetch: {e}"
                );
                out = out
                    .with_error_code(error_code(&e).code())
                    .with_high_watermark(-1)
                    // Empty, not null: librdkafka refuses a null record set.
                    .with_records(Some(bytes::Bytes::new()));
                if let MinkError::OffsetOutOfRange {
                    log_start,
                    high_watermark,
                    ..
                } = e
                {
                    out = out
                        .with_high_watermark(high_watermark)
                        .with_last_stable_offset(high_watermark);
                    if v >= 5 {
                        out = out.with_log_start_offset(log_start);
                    }
                }
            }
        }
        topics[w.topic].partitions.push(out);
    }
    FetchResponse::default().with_responses(topics)
}
