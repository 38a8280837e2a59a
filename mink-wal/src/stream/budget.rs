//! The PUT-rate budget of group commit (`wal.put_rate_max`).
//!
//! A token bucket over the writer's uploads: `per_s` tokens a second, at most one
//! second's worth held. Sealing a group spends a token. While there is one, a group is
//! sealed as soon as an upload slot is free, as without a budget: an idle or lightly
//! loaded node acknowledges in one PUT. When there is none the group waits for the
//! next, gathering what arrives meanwhile, but never longer than `linger_ms` after its
//! first append. So a load that would make more uploads than the budget makes larger
//! ones instead, and the request rate stays near `per_s` (plus the groups that fill
//! `group_bytes_max` or outwait the linger, which go without a token).
//!
//! The bucket is a pure function of the times groups were sealed: `now` is passed in,
//! so its decisions are tested without a clock.

use std::time::{Duration, Instant};

/// A token bucket of uploads (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct PutBudget {
    per_s: f64,
    burst: f64,
    /// Tokens held at `at`.
    tokens: f64,
    at: Instant,
}

impl PutBudget {
    /// A budget of `per_s` uploads a second, full at `now`; `None` for 0 (no budget).
    pub fn new(per_s: u32, now: Instant) -> Option<Self> {
        (per_s > 0).then(|| {
            let per_s = f64::from(per_s);
            Self {
                per_s,
                burst: per_s.max(1.0),
                tokens: per_s.max(1.0),
                at: now,
            }
        })
    }

    /// The tokens held at `now` (refilled since the last spend, up to the burst).
    pub fn tokens(&self, now: Instant) -> f64 {
        let refilled = now.saturating_duration_since(self.at).as_secs_f64() * self.per_s;
        (self.tokens + refilled).min(self.burst)
    }

    /// How long from `now` until a token is there: zero when one is.
    pub fn wait(&self, now: Instant) -> Duration {
        let tokens = self.tokens(now);
        if tokens >= 1.0 {
            Duration::ZERO
        } else {
            // Rounded up, so that waking at `now + wait` finds the token whole.
            Duration::from_secs_f64((1.0 - tokens) / self.per_s) + Duration::from_micros(1)
        }
    }

    /// A group is sealed at `now`: one token spent, or what the bucket holds if less
    /// (a group that was full, or outwaited the linger, goes without a whole token;
    /// the bucket floors at empty, never in debt to the uploads that follow).
    pub fn spend(&mut self, now: Instant) {
        self.tokens = (self.tokens(now) - 1.0).max(0.0);
        self.at = self.at.max(now);
    }

    /// The budget, uploads a second.
    pub fn per_s(&self) -> f64 {
        self.per_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_budget_is_none() {
        assert!(PutBudget::new(0, Instant::now()).is_none());
    }

    #[test]
    fn an_idle_node_has_a_seconds_worth_at_once_then_the_rate() {
        let t0 = Instant::now();
        let mut b = PutBudget::new(10, t0).unwrap();
        for _ in 0..10 {
            assert_eq!(b.wait(t0), Duration::ZERO);
            b.spend(t0);
        }
        // The eleventh waits for a tenth of a second's refill.
        let wait = b.wait(t0);
        assert!(wait > ms(99) && wait <= ms(101), "{wait:?}");
        assert!(b.wait(t0 + ms(50)) > ms(49));
        assert_eq!(b.wait(t0 + wait), Duration::ZERO);
        // Idle for a minute: full again, never more than the burst.
        assert!((b.tokens(t0 + Duration::from_secs(60)) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn under_a_steady_overload_uploads_follow_the_budget() {
        // Groups sealed whenever a token is there, for ten seconds: a node whose
        // appends never stop makes the burst plus `per_s` uploads a second.
        let t0 = Instant::now();
        let mut b = PutBudget::new(10, t0).unwrap();
        let (mut now, mut uploads) = (t0, 0);
        while now < t0 + Duration::from_secs(10) {
            now += b.wait(now);
            b.spend(now);
            uploads += 1;
        }
        assert!((109..=111).contains(&uploads), "{uploads}");
    }

    #[test]
    fn a_seal_without_a_token_takes_no_credit() {
        let t0 = Instant::now();
        let mut b = PutBudget::new(2, t0).unwrap();
        b.spend(t0);
        b.spend(t0);
        // Two more sealed without a token (full groups): the bucket stays at empty,
        // not in debt, so the next token comes after half a second as usual.
        b.spend(t0);
        b.spend(t0);
        assert!(b.tokens(t0).abs() < 1e-9);
        let wait = b.wait(t0);
        assert!(wait >= ms(500) && wait <= ms(501), "{wait:?}");
    }

    #[test]
    fn a_budget_under_one_a_second_still_holds_one_token() {
        let t0 = Instant::now();
        let b = PutBudget::new(1, t0).unwrap();
        assert_eq!(b.wait(t0), Duration::ZERO);
        assert!((b.per_s() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn time_going_back_changes_nothing() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut b = PutBudget::new(10, t0).unwrap();
        for _ in 0..10 {
            b.spend(t0);
        }
        let earlier = t0 - ms(500);
        assert!(b.tokens(earlier).abs() < 1e-9);
        b.spend(earlier);
        assert!(b.wait(t0) > ms(99));
    }
}
