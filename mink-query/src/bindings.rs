//! Parameters bound to a prepared statement, for clients that keep the handle they
//! were given at preparation.
//!
//! Handles are stateless ([`crate::handle`]): binding parameters (a DoPut of
//! `CommandPreparedStatementQuery`) answers with a new handle that carries them, and
//! clients of Flight SQL 15 and later (the ADBC driver, current JDBC) execute that one.
//! Clients written before it (flightsql-dbapi and with it SQLAlchemy's `datafusion://`
//! dialect, older JDBC drivers) ignore the answer and execute the handle they
//! prepared. For them, the mink-query that took the binding remembers it under the
//! prepared handle (each preparation's handle is its own: it carries a statement id)
//! until the statement is closed, [`BINDING_TTL`] passes, or [`BINDINGS_MAX`] newer
//! bindings push it out. Such a client must execute on the mink-query it bound on,
//! as it would on any server that keeps statements.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::plans::HANDLE_BYTES_KEPT_MAX;

/// How long a binding is remembered after it was made.
pub const BINDING_TTL: Duration = Duration::from_secs(600);

/// The most bindings remembered (the oldest goes first): with handles of at most
/// [`HANDLE_BYTES_KEPT_MAX`], at most 64 MiB.
pub const BINDINGS_MAX: usize = 1024;

/// Bindings by the handle they were made on.
#[derive(Default)]
pub struct Bindings {
    kept: Mutex<VecDeque<Binding>>,
}

struct Binding {
    at: Instant,
    prepared: Bytes,
    bound: Bytes,
}

impl Bindings {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Binding>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `prepared` was bound, giving `bound`; a later binding of the
    /// same handle replaces it.
    pub fn remember(&self, prepared: Bytes, bound: Bytes) {
        if prepared.len() + bound.len() > HANDLE_BYTES_KEPT_MAX {
            return;
        }
        let now = Instant::now();
        let mut kept = self.lock();
        kept.retain(|b| now.duration_since(b.at) < BINDING_TTL && b.prepared != prepared);
        while kept.len() >= BINDINGS_MAX {
            kept.pop_front();
        }
        kept.push_back(Binding {
            at: now,
            prepared,
            bound,
        });
    }

    /// The handle to execute for `handle`: its binding when one is remembered,
    /// otherwise `handle` itself.
    pub fn resolve(&self, handle: &Bytes) -> Bytes {
        let now = Instant::now();
        self.lock()
            .iter()
            .rev()
            .find(|b| b.prepared == *handle && now.duration_since(b.at) < BINDING_TTL)
            .map_or_else(|| handle.clone(), |b| b.bound.clone())
    }

    /// Forgets the binding of `handle` (the statement was closed).
    pub fn forget(&self, handle: &[u8]) {
        self.lock().retain(|b| b.prepared != handle);
    }

    /// How many bindings are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_is_found_by_its_prepared_handle_until_it_is_forgotten() {
        let b = Bindings::default();
        let (p, q) = (Bytes::from_static(b"p1"), Bytes::from_static(b"p2"));
        assert_eq!(b.resolve(&p), p, "nothing bound: the handle itself");
        b.remember(p.clone(), Bytes::from_static(b"p1+3"));
        b.remember(q.clone(), Bytes::from_static(b"p2+5"));
        assert_eq!(b.resolve(&p), Bytes::from_static(b"p1+3"));
        assert_eq!(b.resolve(&q), Bytes::from_static(b"p2+5"));
        // Bound again: the newer values.
        b.remember(p.clone(), Bytes::from_static(b"p1+4"));
        assert_eq!(b.resolve(&p), Bytes::from_static(b"p1+4"));
        assert_eq!(b.len(), 2);
        b.forget(&p);
        assert_eq!(b.resolve(&p), p);
        assert_eq!(b.resolve(&q), Bytes::from_static(b"p2+5"));
    }

    #[test]
    fn bindings_are_bounded() {
        let b = Bindings::default();
        for i in 0..BINDINGS_MAX + 10 {
            b.remember(Bytes::from(format!("h{i}")), Bytes::from(format!("b{i}")));
        }
        assert_eq!(b.len(), BINDINGS_MAX);
        assert_eq!(
            b.resolve(&Bytes::from("h0")),
            Bytes::from("h0"),
            "the oldest went"
        );
        let last = format!("h{}", BINDINGS_MAX + 9);
        assert_eq!(
            b.resolve(&Bytes::from(last)),
            Bytes::from(format!("b{}", BINDINGS_MAX + 9))
        );
        let huge = Bytes::from(vec![0u8; HANDLE_BYTES_KEPT_MAX]);
        b.remember(huge.clone(), Bytes::from_static(b"x"));
        assert_eq!(b.resolve(&huge), huge, "a handle too long to keep is not");
    }
}
