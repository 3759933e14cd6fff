//! One container's observer counters: each reading advances them by the difference from the
//! last (a counter that went backwards, after an eBPF map entry was forgotten or the cgroup was
//! recreated, restarts from the new value).

use super::containers::{ContainerFamilies, ContainerLabels};
use crate::observer::{Observation, PressureResource, StallTotals};

/// The observer's handle on one container's series.
#[derive(Debug)]
pub struct ContainerSeries {
    families: ContainerFamilies,
    labels: ContainerLabels,
    last: Observation,
    page_size: u64,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "nanoseconds to seconds as f64 for a counter"
)]
fn ns_to_secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// What grew since the last reading (a counter that went backwards counts from zero).
fn delta(new: u64, old: u64) -> u64 {
    if new >= old {
        new - old
    } else {
        new
    }
}

impl ContainerSeries {
    pub(super) fn new(families: ContainerFamilies, labels: ContainerLabels) -> Self {
        Self {
            families,
            labels,
            last: Observation::default(),
            page_size: crate::cgroup::page_size(),
        }
    }

    pub fn labels(&self) -> &ContainerLabels {
        &self.labels
    }

    /// The observation the counters were last advanced to (zeros before the first).
    pub fn last(&self) -> &Observation {
        &self.last
    }

    /// Advances the counters to `now` (nothing, once the container's series were removed).
    pub fn update(&mut self, now: &Observation) {
        let last = self.last;
        let page_size = self.page_size;
        self.families.update(&self.labels, |v| {
            let c = v.counters.get_or_insert((0, 0.0, 0));
            if let Some(t) = now.throttling {
                let old = last.throttling.unwrap_or_default();
                c.0 += delta(t.count, old.count);
                c.1 += ns_to_secs(delta(t.throttled_ns, old.throttled_ns));
            }
            c.2 += delta(now.oom.kills, last.oom.kills);
            if let Some(pages) = now.reclaim.pgsteal() {
                let r = v.reclaim.get_or_insert((0, 0.0));
                let old = last.reclaim.pgsteal().unwrap_or(0);
                r.0 += delta(pages, old).saturating_mul(page_size);
                if let Some(ns) = now.reclaim.direct_reclaim_ns {
                    let old = last.reclaim.direct_reclaim_ns.unwrap_or(0);
                    r.1 += ns_to_secs(delta(ns, old));
                }
            }
            if let Some(p) = now.pressure {
                let series = v.pressure.get_or_insert([0.0; 6]);
                let old = last.pressure.unwrap_or_default();
                let us = |t: StallTotals| [Some(t.some_us), t.full_us];
                let news = PressureResource::ALL.into_iter().flat_map(|r| us(p.of(r)));
                let olds = PressureResource::ALL
                    .into_iter()
                    .flat_map(|r| us(old.of(r)));
                for ((s, new), old) in series.iter_mut().zip(news).zip(olds) {
                    if let Some(new) = new {
                        *s += ns_to_secs(delta(new, old.unwrap_or(0)).saturating_mul(1000));
                    }
                }
            }
        });
        self.last = *now;
    }
}
