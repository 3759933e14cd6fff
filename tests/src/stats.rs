//! The median of paired differences with a 95 % distribution-free confidence interval: how a
//! benchmark judges a small difference between two sides whose level drifts between rounds
//! (each round measures both sides seconds apart; the drift cancels in the difference).

/// The median of some values and its 95 % confidence interval from their order statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MedianInterval {
    pub median: f64,
    /// The interval's ends, or the whole range where `interval` is false.
    pub lo: f64,
    pub hi: f64,
    /// Whether `lo`–`hi` covers the median with at least 95 % (6 values or more); with fewer,
    /// not even the whole range does.
    pub interval: bool,
    pub n: usize,
}

impl MedianInterval {
    /// Of `values` (not empty; NaN sorts last).
    ///
    /// # Panics
    ///
    /// On no values.
    #[must_use]
    pub fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        assert!(n > 0, "the median of no values");
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            f64::midpoint(v[n / 2 - 1], v[n / 2])
        };
        let rank = interval_rank(n);
        let (lo, hi) = rank.map_or((v[0], v[n - 1]), |k| (v[k - 1], v[n - k]));
        Self {
            median,
            lo,
            hi,
            interval: rank.is_some(),
            n,
        }
    }
}

/// The 1-based rank `k` of the lower end of a 95 % confidence interval for the median of `n`
/// values (the upper end is rank `n + 1 − k`): the largest `k` with P(Binomial(n, ½) < k) ≤ 2.5 %,
/// so that the interval misses the median with at most 5 %. `None` below 6 values. The
/// probabilities are summed from their logarithms: ½ⁿ itself is below the smallest `f64` from
/// n = 1075 on (then every term read 0 and the "interval" was the whole range, reversed).
fn interval_rank(n: usize) -> Option<usize> {
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let mut ln_pmf = n as f64 * 0.5_f64.ln();
    let (mut cdf, mut k) = (0.0, 0);
    for j in 0..n {
        cdf += ln_pmf.exp();
        if cdf > 0.025 {
            break;
        }
        k = j + 1;
        #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        {
            ln_pmf += ((n - j) as f64 / (j + 1) as f64).ln();
        }
    }
    (k >= 1).then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_are_the_tabulated_ones() {
        // Conover, Practical Nonparametric Statistics, table A3 (two-sided, α ≤ 0.05).
        assert_eq!(interval_rank(5), None);
        assert_eq!(interval_rank(6), Some(1));
        assert_eq!(interval_rank(8), Some(1));
        assert_eq!(interval_rank(9), Some(2));
        assert_eq!(interval_rank(12), Some(3));
        assert_eq!(interval_rank(20), Some(6));
        assert_eq!(interval_rank(40), Some(14));
    }

    #[test]
    fn thousands_of_values_give_the_normal_approximations_ranks() {
        // n/2 − 1.96·√n/2: 712.0 for 1,500, 1446.3 for 3,000, 4902.0 for 10,000.
        for (n, near) in [(1500, 712), (3000, 1446), (10_000, 4902)] {
            let k = interval_rank(n).expect("an interval");
            assert!(k.abs_diff(near) <= 1, "n {n}: rank {k}, about {near}");
        }
        let values: Vec<f64> = (0..3000).map(f64::from).collect();
        let m = MedianInterval::of(&values);
        assert!(m.interval && m.lo < m.median && m.median < m.hi, "{m:?}");
        assert!(m.hi - m.lo < 120.0, "{m:?}");
    }

    #[test]
    fn twenty_differences_give_the_sixth_and_fifteenth() {
        let values: Vec<f64> = (1..=20).rev().map(f64::from).collect();
        let m = MedianInterval::of(&values);
        assert_eq!(
            m,
            MedianInterval {
                median: 10.5,
                lo: 6.0,
                hi: 15.0,
                interval: true,
                n: 20
            }
        );
    }

    #[test]
    fn too_few_values_give_the_range_and_say_so() {
        let m = MedianInterval::of(&[3.0, -1.0, 2.0]);
        assert_eq!((m.median, m.lo, m.hi, m.interval), (2.0, -1.0, 3.0, false));
    }
}
