//! Retry delays. Every retry loop of the agent (the NRI reconnect, the restore at start, the
//! ledger's writes) counts its delays on one exponential backoff of `backon`: doubling from a
//! floor to a cap, never giving up.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Whether the delays are spread at random, so that many retries do not meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Exactly the doubling delays.
    Exact,
    /// Each delay plus up to as much again, at random.
    Jittered,
}

/// Delays doubling from a floor to a cap, forever.
#[derive(Debug)]
pub struct Delays {
    builder: ExponentialBuilder,
    max: Duration,
    left: ExponentialBackoff,
}

impl Delays {
    pub fn doubling(min: Duration, max: Duration, spread: Spread) -> Delays {
        let mut builder = ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times();
        if spread == Spread::Jittered {
            builder = builder.with_jitter();
        }
        Delays {
            builder,
            max,
            left: builder.build(),
        }
    }

    /// The next delay: the floor first, the cap once reached.
    pub fn next_delay(&mut self) -> Duration {
        whole_ms(self.left.next().unwrap_or(self.max))
    }

    /// Starts over from the floor.
    pub fn reset(&mut self) {
        self.left = self.builder.build();
    }

    /// The delay after `failures` failures in a row (the first failure waits the floor), from
    /// a fresh count.
    pub fn after(&self, failures: u32) -> Duration {
        // Past 16 doublings every delay is the cap anyway.
        let n = failures.saturating_sub(1).min(16) as usize;
        whole_ms(self.builder.build().nth(n).unwrap_or(self.max))
    }
}

/// `d` to the nearest millisecond: backon doubles by an `f32` factor, which leaves a few
/// nanoseconds over (400.000006 ms).
fn whole_ms(d: Duration) -> Duration {
    let ms = (d.as_nanos() + 500_000) / 1_000_000;
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Waits `delay`; `false` when `shutdown` came first.
pub async fn pause(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_start_over() {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(10));
        let mut d = Delays::doubling(min, max, Spread::Exact);
        let seen: Vec<Duration> = (0..10).map(|_| d.next_delay()).collect();
        assert_eq!(seen[..2], [min, min * 2]);
        assert_eq!(seen.last(), Some(&max));
        assert!(seen.windows(2).all(|w| w[0] <= w[1]));
        d.reset();
        assert_eq!(d.next_delay(), min);
        assert_eq!(d.after(1), min);
        assert_eq!(d.after(3), min * 4);
        assert_eq!(d.after(1000), max);
    }

    #[test]
    fn jittered_delays_stay_within_twice_the_exact_ones() {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(30));
        let d = Delays::doubling(min, max, Spread::Jittered);
        for failures in 1..20 {
            let exact = Delays::doubling(min, max, Spread::Exact).after(failures);
            let got = d.after(failures);
            assert!(exact <= got && got <= exact * 2, "{failures}: {got:?}");
        }
    }
}
