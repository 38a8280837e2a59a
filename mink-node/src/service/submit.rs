//! The front door of a bucket's tablet for writes, whichever protocol they came by: a
//! Flight `Append`/`Put` (and the parts of an `AppendTable`/`PutTable` this node
//! leads) and a Kafka Produce take the same two steps.
//!
//! 1. [`NodeService::write_target`]: the bucket's tablet when this node leads it, or
//!    the redirect ([`Leader`]); a write that meets a stream fenced under it hears
//!    the redirect it means ([`NodeService::redirect_stale`]).
//! 2. [`submit`]: the write goes into the tablet, which assigns its offsets in the
//!    order writes are submitted; [`Submission::wait`] resolves once it is durable.
//!
//! A Flight write waits at once; a Kafka connection submits its requests' partitions
//! in its produce turn and waits after, so that a producer's batches take their
//! offsets in the order it sent them. What differs between the protocols is only how
//! a writer's sequences are held to order ([`Sequencing`]) and, for a Put, the Kafka
//! producer's rules (`PutRequest::kafka`). Kafka-only checks (topic rows, topic
//! configs, compacted-topic keys) stay in the Kafka adapter (`service/kafka.rs`).

use super::*;
use mink_wal::Cork;

/// A write to one bucket's tablet.
pub(crate) enum BucketWrite {
    /// Rows appended to a log table's bucket, with how the writer's sequence is held.
    Append {
        request: AppendRequest,
        order: Sequencing,
    },
    /// A Put to a primary-key table's bucket (`request.kafka`: under a Kafka
    /// producer's rules).
    Put(PutRequest),
}

/// How an append's writer sequence is held to order (mink-log's `submit` family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sequencing {
    /// A Flight writer's pipelined requests may arrive out of order: a batch ahead of
    /// its writer's next sequence waits a little for its predecessors.
    Pipelined,
    /// Requests reach the tablet in the order they were sent (a Kafka connection): a
    /// batch ahead is refused at once.
    Ordered,
    /// [`Sequencing::Ordered`] for a Kafka idempotent producer, whose first batch at a
    /// bucket must start at sequence 0.
    Producer,
}

/// A write its tablet took: its offsets are assigned; [`Submission::wait`] for
/// durability.
pub(crate) struct Submission {
    log: LogTablet,
    step: SubmittedStep,
}

enum SubmittedStep {
    Append(mink_log::Submitted),
    Put(mink_kv::PendingPut),
}

impl Submission {
    /// The bucket's log tablet (its log start, for a Kafka answer).
    pub(crate) fn log(&self) -> &LogTablet {
        &self.log
    }

    /// Resolves once the write is durable, with where it landed.
    pub(crate) async fn wait(self) -> Result<mink_log::Appended> {
        match self.step {
            SubmittedStep::Append(s) => s.wait().await,
            SubmittedStep::Put(p) => p.wait().await,
        }
    }
}

/// Submits `write` to `tablet`; `cork` (a table write's parts sharing one WAL upload)
/// is released once the write is on its way. An append to a primary-key table's
/// bucket, or a Put to a log table's, is refused.
pub(crate) async fn submit(
    bucket: TableBucket,
    tablet: &Tablet,
    write: BucketWrite,
    cork: Option<Cork>,
) -> Result<Submission> {
    match (tablet, write) {
        (Tablet::Log(log), BucketWrite::Append { request, order }) => {
            let submitted = match order {
                Sequencing::Pipelined => log.submit(request).await,
                Sequencing::Ordered => log.submit_in_order(request).await,
                Sequencing::Producer => log.submit_producer(request).await,
            };
            drop(cork);
            Ok(Submission {
                log: log.clone(),
                step: SubmittedStep::Append(submitted?),
            })
        }
        (Tablet::Kv(kv), BucketWrite::Put(request)) => Ok(Submission {
            log: kv.log().clone(),
            step: SubmittedStep::Put(kv.submit_put(request, cork).await?),
        }),
        (Tablet::Kv(_), BucketWrite::Append { .. }) => Err(MinkError::invalid(
            "descriptor",
            format!("{bucket} belongs to a primary-key table: use Put"),
        )),
        (Tablet::Log(_), BucketWrite::Put(_)) => Err(MinkError::invalid(
            "descriptor",
            format!("{bucket} belongs to a log table: use Append"),
        )),
    }
}

impl NodeService {
    /// The tablet a write to `bucket` goes to: this node's when it leads the bucket,
    /// else the redirect (`NotLeader` with the leader's address, or `Unavailable`).
    pub(crate) async fn write_target(&self, bucket: TableBucket) -> Result<Tablet> {
        match self.tablet(bucket).await {
            Ok(t) => Ok(t),
            Err(e) => Err(self.redirect_stale(bucket, e).await),
        }
    }

    /// A write that failed because this node's stream of `bucket` was fenced or moved
    /// to a newer epoch: answered as `NotLeader` with the new leader when leadership
    /// moved (the client follows the redirect), `Unavailable` (retry) otherwise.
    pub(crate) async fn redirect_stale(&self, bucket: TableBucket, err: MinkError) -> MinkError {
        if !matches!(err, MinkError::Fenced(_)) {
            return err;
        }
        self.meta.inner_catch_up().await;
        match self.leader(bucket) {
            Some(other @ Leader::Other { .. }) => other.redirect(bucket).unwrap_or(err),
            _ => MinkError::Unavailable(format!(
                "{bucket}: the bucket is being reopened ({err}); retry"
            )),
        }
    }
}
