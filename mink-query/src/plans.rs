//! Statements planned for a GetFlightInfo or a preparation, kept for the DoGet that
//! follows.
//!
//! Flight SQL clients ask twice for every query: ADBC prepares (or asks
//! GetFlightInfo), then sends DoGet with the handle it was given. Handles are
//! stateless, so DoGet could plan from the SQL alone, but planning again costs a
//! catalog call to a node per table and the planner's work, which is most of a point
//! query's time. So the plan made for the first call is kept, keyed by the exact
//! handle it answered (each statement's handle carries an id of its own, so two
//! clients' identical statements are two keys), and the DoGet that presents that
//! handle within
//! [`PLAN_REUSE`] takes it (once). Any later DoGet of the handle, or one that reaches
//! another mink-query, plans again; a statement therefore never runs on a catalog
//! older than its own preparation plus [`PLAN_REUSE`], and each execution after the
//! first sees the catalog of its time. Rows are cut when the taken plan executes, as
//! for a fresh one.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::service::Planned;

/// How long a plan waits for its DoGet.
pub const PLAN_REUSE: Duration = Duration::from_secs(5);

/// The most plans kept (the oldest goes first).
pub const PLANS_MAX: usize = 64;

/// A statement whose handle is longer (its SQL and bound parameters) is planned
/// again at DoGet rather than kept: the plans kept stay within
/// `PLANS_MAX * HANDLE_BYTES_KEPT_MAX` of handles and what was planned from them.
pub const HANDLE_BYTES_KEPT_MAX: usize = 64 << 10;

/// Plans waiting for their DoGet.
#[derive(Default)]
pub struct Plans {
    kept: Mutex<VecDeque<Kept>>,
}

struct Kept {
    at: Instant,
    handle: Bytes,
    planned: Planned,
}

impl Plans {
    /// Keeps `planned` for the DoGet of `handle`.
    pub fn keep(&self, handle: Bytes, planned: Planned) {
        if handle.len() > HANDLE_BYTES_KEPT_MAX {
            return;
        }
        let now = Instant::now();
        let mut kept = self.kept.lock().expect("plans lock");
        kept.retain(|k| now.duration_since(k.at) < PLAN_REUSE && k.handle != handle);
        while kept.len() >= PLANS_MAX {
            kept.pop_front();
        }
        kept.push_back(Kept {
            at: now,
            handle,
            planned,
        });
    }

    /// The plan kept for `handle`, if one was made within [`PLAN_REUSE`].
    pub fn take(&self, handle: &[u8]) -> Option<Planned> {
        let now = Instant::now();
        let mut kept = self.kept.lock().expect("plans lock");
        kept.retain(|k| now.duration_since(k.at) < PLAN_REUSE);
        let at = kept.iter().position(|k| k.handle == handle)?;
        kept.remove(at).map(|k| k.planned)
    }

    /// How many plans are waiting.
    pub fn len(&self) -> usize {
        self.kept.lock().expect("plans lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::tests::{planned_for_test, service_for_test};

    #[tokio::test]
    async fn a_plan_is_taken_once_by_its_own_handle() {
        let service = service_for_test();
        let plans = Plans::default();
        plans.keep(Bytes::from_static(b"a"), planned_for_test(&service).await);
        assert!(plans.take(b"b").is_none());
        assert!(plans.take(b"a").is_some());
        assert!(plans.take(b"a").is_none(), "taken once");
    }

    #[tokio::test]
    async fn plans_are_bounded() {
        let service = service_for_test();
        let plans = Plans::default();
        for i in 0..PLANS_MAX + 10 {
            plans.keep(Bytes::from(i.to_string()), planned_for_test(&service).await);
        }
        assert_eq!(plans.len(), PLANS_MAX);
        assert!(plans.take(b"0").is_none(), "the oldest went first");
        assert!(plans.take((PLANS_MAX + 9).to_string().as_bytes()).is_some());
    }

    #[tokio::test]
    async fn a_statement_with_a_long_handle_is_not_kept() {
        let service = service_for_test();
        let plans = Plans::default();
        let long = Bytes::from(vec![b'x'; HANDLE_BYTES_KEPT_MAX + 1]);
        plans.keep(long.clone(), planned_for_test(&service).await);
        assert!(plans.take(&long).is_none());
    }

    #[tokio::test]
    async fn a_plan_not_taken_in_time_is_dropped() {
        let service = service_for_test();
        let plans = Plans::default();
        plans.keep(Bytes::from_static(b"a"), planned_for_test(&service).await);
        plans.kept.lock().unwrap()[0].at = Instant::now() - PLAN_REUSE;
        assert!(plans.take(b"a").is_none());
        assert!(plans.is_empty());
    }
}
