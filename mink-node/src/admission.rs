//! Admission of writes: a node-wide bound on the bytes of write requests in progress,
//! so that writers faster than the object store meet back-pressure instead of filling
//! the node's memory.
//!
//! Every write is admitted for its size where its rows enter their tablet (a Flight
//! bucket write, each local part of a table write, a forwarded part at its leader, a
//! Kafka produce of one partition), and holds its bytes until it is durable. A table
//! write holds nothing while its parts for other leaders are forwarded, so two nodes
//! forwarding to each other never wait on each other's permits. While `writes.inflight_bytes_max` are
//! in progress a request waits, up to `writes.admission_wait_ms`, without reading
//! further from its client: HTTP/2 and TCP flow control slow the client down. If it is
//! not admitted in that time, or if `writes.waiting_bytes_max` are waiting already, it
//! is answered `Unavailable` ("overloaded; retry"), which clients retry. So the bytes
//! a node holds for writes stay below the sum of the two limits, whatever the number
//! of clients.
//!
//! The WAL's own bound (`wal.pending_bytes_max`, bytes waiting for a group) sits
//! inside this one: a request waits there only after it was admitted here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mink_types::{MinkError, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The node-wide bounds on write requests in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WritesConfig {
    /// Bytes of write requests admitted and not yet answered, at most. A request
    /// larger than this is admitted alone. Default 256 MiB.
    pub inflight_bytes_max: u64,
    /// Bytes of write requests waiting for admission, at most; beyond it a request is
    /// refused at once (`Unavailable`). Default 256 MiB.
    pub waiting_bytes_max: u64,
    /// How long a request waits for admission before it is refused (`Unavailable`),
    /// in milliseconds. Default 10,000.
    pub admission_wait_ms: u64,
}

impl Default for WritesConfig {
    fn default() -> Self {
        Self {
            inflight_bytes_max: 256 << 20,
            waiting_bytes_max: 256 << 20,
            admission_wait_ms: 10_000,
        }
    }
}

impl WritesConfig {
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.inflight_bytes_max == 0 || self.inflight_bytes_max > u32::MAX as u64 {
            return Err("writes.inflight_bytes_max must be within 1..=4 GiB".into());
        }
        if self.waiting_bytes_max > 64 << 30 {
            return Err("writes.waiting_bytes_max must be at most 64 GiB".into());
        }
        if self.admission_wait_ms > 600_000 {
            return Err("writes.admission_wait_ms must be at most 600,000 (10 minutes)".into());
        }
        Ok(())
    }
}

/// The admission gate of one node.
pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    capacity: u32,
    waiting: AtomicU64,
    waiting_max: u64,
    wait: Duration,
}

/// An admitted write: its bytes count against the node's bound until it is dropped.
pub(crate) struct Admitted {
    _permit: OwnedSemaphorePermit,
    bytes: u64,
}

impl Admitted {
    fn new(permit: OwnedSemaphorePermit, bytes: u64) -> Self {
        metrics::gauge!("mink_node_write_bytes_in_progress").increment(bytes as f64);
        Self {
            _permit: permit,
            bytes,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        metrics::gauge!("mink_node_write_bytes_in_progress").decrement(self.bytes as f64);
    }
}

/// Takes a request's bytes off the waiting count however its wait ends.
struct Waiting<'a>(&'a AtomicU64, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::SeqCst);
        metrics::gauge!("mink_node_write_bytes_waiting").decrement(self.1 as f64);
    }
}

impl Admission {
    pub(crate) fn new(config: &WritesConfig) -> Self {
        let capacity = config.inflight_bytes_max.clamp(1, u32::MAX as u64) as u32;
        Self {
            permits: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
            waiting: AtomicU64::new(0),
            waiting_max: config.waiting_bytes_max,
            wait: Duration::from_millis(config.admission_wait_ms),
        }
    }

    /// Admits a write request of `bytes`, waiting (bounded) while the node is full.
    pub(crate) async fn admit(&self, bytes: u64) -> Result<Admitted> {
        let permits = bytes.clamp(1, self.capacity as u64) as u32;
        let admitted = |permit| Admitted::new(permit, bytes);
        if let Ok(permit) = self.permits.clone().try_acquire_many_owned(permits) {
            return Ok(admitted(permit));
        }
        let waiting = self.waiting.fetch_add(bytes, Ordering::SeqCst) + bytes;
        metrics::gauge!("mink_node_write_bytes_waiting").increment(bytes as f64);
        let _waiting = Waiting(&self.waiting, bytes);
        if waiting > self.waiting_max {
            return Err(self.overloaded(format!(
                "{waiting} bytes of writes are waiting, over writes.waiting_bytes_max ({})",
                self.waiting_max
            )));
        }
        match tokio::time::timeout(self.wait, self.permits.clone().acquire_many_owned(permits))
            .await
        {
            Ok(Ok(permit)) => Ok(admitted(permit)),
            Ok(Err(_)) => Err(MinkError::Unavailable("the node is shutting down".into())),
            Err(_) => Err(self.overloaded(format!(
                "a write of {bytes} bytes was not admitted within writes.admission_wait_ms ({} ms)",
                self.wait.as_millis()
            ))),
        }
    }

    /// Admits a write request of `bytes` if the node has room now; refuses it
    /// (`Unavailable`) otherwise, without waiting. For a caller that already holds
    /// admitted bytes it will not release while it waits (hold-and-wait).
    pub(crate) fn admit_now(&self, bytes: u64) -> Result<Admitted> {
        let permits = bytes.clamp(1, self.capacity as u64) as u32;
        match self.permits.clone().try_acquire_many_owned(permits) {
            Ok(permit) => Ok(Admitted::new(permit, bytes)),
            Err(_) => Err(self.overloaded(format!(
                "a write of {bytes} bytes finds no room, and this path does not wait"
            ))),
        }
    }

    fn overloaded(&self, why: String) -> MinkError {
        metrics::counter!("mink_node_writes_refused_overloaded_total").increment(1);
        MinkError::Unavailable(format!(
            "this node is overloaded ({} bytes of writes in progress): {why}; retry",
            self.capacity
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(inflight: u64, waiting: u64, wait_ms: u64) -> Admission {
        Admission::new(&WritesConfig {
            inflight_bytes_max: inflight,
            waiting_bytes_max: waiting,
            admission_wait_ms: wait_ms,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_node_makes_writes_wait_then_refuses_them() {
        let g = gate(100, 1_000, 1_000);
        let first = g.admit(60).await.unwrap();
        // 60 + 60 > 100: the second waits, and is admitted once the first is done.
        let second = {
            let g = &g;
            async move { g.admit(60).await }
        };
        let (second, ()) = tokio::join!(second, async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            drop(first);
        });
        let second = second.unwrap();
        // Nothing frees room within the wait: refused, retriably.
        let err = g.admit(60).await.err().unwrap();
        assert!(err.is_retriable(), "{err}");
        assert!(err.to_string().contains("not admitted within"), "{err}");
        drop(second);
        g.admit(60).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn too_many_waiting_bytes_are_refused_at_once() {
        let g = gate(100, 100, 60_000);
        let _held = g.admit(100).await.unwrap();
        let waiter = {
            let g = &g;
            async move { g.admit(80).await }
        };
        let refused = async {
            tokio::task::yield_now().await;
            let started = tokio::time::Instant::now();
            let err = g.admit(80).await.err().unwrap();
            assert!(
                err.to_string().contains("writes.waiting_bytes_max"),
                "{err}"
            );
            assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
        };
        let (waited, ()) = tokio::join!(
            async { tokio::time::timeout(Duration::from_secs(1), waiter).await },
            refused
        );
        assert!(waited.is_err(), "the first waiter still waits");
        assert_eq!(
            g.waiting.load(Ordering::SeqCst),
            0,
            "nothing counted as waiting"
        );
    }

    #[tokio::test]
    async fn admit_now_never_waits() {
        let g = gate(100, 1_000, 60_000);
        let held = g.admit_now(70).unwrap();
        let err = g.admit_now(70).err().unwrap();
        assert!(
            err.is_retriable() && err.to_string().contains("does not wait"),
            "{err}"
        );
        drop(held);
        g.admit_now(70).unwrap();
    }

    #[tokio::test]
    async fn a_request_larger_than_the_bound_is_admitted_alone() {
        let g = gate(100, 100, 1_000);
        let big = g.admit(1_000).await.unwrap();
        assert_eq!(g.permits.available_permits(), 0);
        drop(big);
        assert_eq!(g.permits.available_permits(), 100);
    }
}
