//! When to write an object the agent keeps in the API server: only when it changed since the
//! last successful write, and not sooner than an interval after the last attempt (a failed
//! attempt counts, so an unreachable API server is not hammered).

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Pacer<T> {
    last_attempt: Option<Instant>,
    last_sent: Option<T>,
}

impl<T> Default for Pacer<T> {
    fn default() -> Self {
        Pacer {
            last_attempt: None,
            last_sent: None,
        }
    }
}

impl<T: PartialEq> Pacer<T> {
    /// The object last written (none before the first write or after [`Pacer::reset`]).
    pub fn last_sent(&self) -> Option<&T> {
        self.last_sent.as_ref()
    }

    /// Whether `wait` has passed since the last attempt (always, before the first).
    pub fn due(&self, now: Instant, wait: Duration) -> bool {
        self.last_attempt
            .is_none_or(|t| now.saturating_duration_since(t) >= wait)
    }

    /// Whether `obj` differs from the last object written and `interval` has passed.
    pub fn should_send(&self, now: Instant, obj: &T, interval: Duration) -> bool {
        self.last_sent.as_ref() != Some(obj) && self.due(now, interval)
    }

    pub fn sent(&mut self, now: Instant, obj: T) {
        self.last_attempt = Some(now);
        self.last_sent = Some(obj);
    }

    pub fn failed(&mut self, now: Instant) {
        self.last_attempt = Some(now);
    }

    /// Forgets what was written (the object may be gone: write it again when due).
    pub fn reset(&mut self) {
        self.last_sent = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_changes_only_and_not_too_often() {
        let t0 = Instant::now();
        let five = Duration::from_secs(5);
        let mut p = Pacer::default();
        assert!(p.should_send(t0, &1, five));
        p.sent(t0, 1);
        assert!(
            !p.should_send(t0 + Duration::from_secs(60), &1, five),
            "unchanged"
        );
        assert!(
            !p.should_send(t0 + Duration::from_secs(1), &2, five),
            "too soon"
        );
        assert!(p.should_send(t0 + five, &2, five));
        p.failed(t0 + five);
        assert!(
            !p.should_send(t0 + five, &2, five),
            "a failed attempt counts"
        );
        assert!(p.should_send(t0 + 2 * five, &2, five));
        p.reset();
        assert!(p.should_send(t0 + 2 * five, &1, five), "after a reset");
        assert_eq!(p.last_sent(), None);
    }
}
