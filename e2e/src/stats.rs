//! Latency summaries for the e2e benchmarks (nearest-rank percentiles over measured samples).

use std::time::Duration;

/// p50, p90, p99, max and mean of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub mean: Duration,
}

/// The nearest-rank `q`-quantile (0 < q <= 1) of sorted samples: the smallest sample with at
/// least `q * n` samples at or below it. `None` when there are none.
pub fn nearest_rank(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    let idx = rank.clamp(1, n) - 1;
    sorted.get(idx).copied()
}

impl Summary {
    /// `None` for no samples.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        let mut s = samples.to_vec();
        s.sort_unstable();
        let total: Duration = s.iter().sum();
        let n = s.len();
        Some(Summary {
            n,
            p50: nearest_rank(&s, 0.50)?,
            p90: nearest_rank(&s, 0.90)?,
            p99: nearest_rank(&s, 0.99)?,
            max: *s.last()?,
            mean: total / u32::try_from(n).ok()?,
        })
    }
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// `b - a` in milliseconds with two decimals and a sign.
pub fn ms_delta(a: Duration, b: Duration) -> String {
    format!("{:+.2}", (b.as_secs_f64() - a.as_secs_f64()) * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_list(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn nearest_rank_of_one_to_hundred() {
        let s = ms_list(&(1..=100).collect::<Vec<_>>());
        assert_eq!(nearest_rank(&s, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(nearest_rank(&s, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(nearest_rank(&s, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(nearest_rank(&s, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }

    #[test]
    fn p99_of_two_hundred_is_the_third_largest() {
        // ceil(0.99 * 200) = 198: two samples lie above p99.
        let s = ms_list(&(1..=200).collect::<Vec<_>>());
        assert_eq!(Summary::of(&s).unwrap().p99, Duration::from_millis(198));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let s = Summary::of(&ms_list(&[30, 10, 20, 40])).unwrap();
        assert_eq!(s.n, 4);
        assert_eq!(s.p50, Duration::from_millis(20));
        assert_eq!(s.max, Duration::from_millis(40));
        assert_eq!(s.mean, Duration::from_millis(25));
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn formats_milliseconds() {
        assert_eq!(ms(Duration::from_micros(1234)), "1.23");
        assert_eq!(
            ms_delta(Duration::from_micros(1000), Duration::from_micros(1500)),
            "+0.50"
        );
        assert_eq!(
            ms_delta(Duration::from_micros(1500), Duration::from_micros(1000)),
            "-0.50"
        );
    }
}
