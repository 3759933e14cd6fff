//! Deciding a kubelet-driven memory decrease: direct, refused below usage ([`super::toward`]),
//! restart or reject, after a page-cache reclaim inside the update where that is enough and a
//! look at the pod step kubelet takes right after it ([`super::pod_step`]); and kubelet asking
//! again while the page cache in the way is reclaimed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{memory_limit, Engine};
use crate::cgroup::{container_path, CgroupIo};
use crate::config::Mode;
use crate::metrics::DecreaseOutcome;
use crate::model::{Container, LinuxResources, Pod};
use crate::nri::{Deadline, Rejection};
use crate::policy::{
    bytes_text, deprecated_spellings, effective_decrease_strategy, mib, plan_decrease,
    DecreasePlan, MemoryDecreaseStrategy, CONTAINER_DECREASE_PREFIX, POD_DECREASE_ANNOTATION,
};
use crate::resize::reclaims::Supersede;
use crate::resize::reply::answered_already;

/// The most one pass of the inline reclaim asks for.
const INLINE_CHUNK: u64 = 64 << 20;
/// What the first pass asks for, before the cgroup's reclaim rate is known.
const INLINE_FIRST: u64 = 8 << 20;
/// The least a later pass asks for.
const INLINE_MIN: u64 = 1 << 20;

/// The next inline pass's size: what the rate seen so far (`done` bytes in `took`) reclaims in
/// half the time `left`, within [`INLINE_MIN`, `INLINE_CHUNK`], so that a pass (a write the
/// kernel does not return from until it has reclaimed) ends within the time left; the first
/// pass, with no rate yet, asks for [`INLINE_FIRST`].
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "a rate estimate: non-negative, clamped to a chunk"
)]
fn inline_pass_size(done: u64, took: Duration, left: Duration) -> u64 {
    if done == 0 || took.is_zero() {
        return INLINE_FIRST;
    }
    let rate = done as f64 / took.as_secs_f64();
    let fits = (rate * left.as_secs_f64() / 2.0) as u64;
    fits.clamp(INLINE_MIN, INLINE_CHUNK)
}

/// The engine's answer for a memory decrease (`Direct`: not below usage, or reclaimed inline).
pub(in crate::resize) enum DecreaseVerdict {
    /// The limit is above usage: the runtime writes it as asked.
    Direct,
    /// Reclaim toward the requested limit (the strategy `reclaim`): within a whole-pod step;
    /// on kubelet's path it becomes [`Self::BelowUsage`] (never an interim limit).
    Reclaim,
    /// kubelet's path: usage (as read after the inline reclaim) is above the requested limit;
    /// refused, and the page cache in the way reclaimed in the background where that can help.
    BelowUsage(crate::policy::MemoryUse),
    /// Restart (evict) with this reason.
    Restart(String),
    /// Fail the update with this reason (`Deferred`).
    Reject(String),
}

impl DecreaseVerdict {
    /// What the memory-decrease `strategy` says about a decrease below usage (`what` says how
    /// far below), for the kubelet path and for whole-pod steps alike. `can_restart`: false for
    /// a whole-pod step, which cannot restart a container, so `restart` refuses the step.
    pub(in crate::resize) fn of_strategy(
        strategy: MemoryDecreaseStrategy,
        what: &str,
        can_restart: bool,
    ) -> Self {
        match strategy {
            MemoryDecreaseStrategy::Reject => {
                Self::Reject(format!("{what} (memory-decrease strategy reject)"))
            }
            MemoryDecreaseStrategy::Restart if can_restart => Self::Restart(format!(
                "{what}: restarting under the new limit (memory-decrease strategy restart)"
            )),
            MemoryDecreaseStrategy::Restart => Self::Reject(format!(
                "{what}: memory-decrease strategy restart, and a whole-pod resize cannot restart a container"
            )),
            MemoryDecreaseStrategy::Reclaim => Self::Reclaim,
        }
    }

    /// A refusal or restart whose strategy came from an annotation in its deprecated spelling
    /// says so in its reason (status REASON, the runtime's error), so that the owner rewrites it.
    fn noted(self, note: Option<&str>) -> Self {
        match (self, note) {
            (Self::Reject(r), Some(n)) => Self::Reject(format!("{r}; {n}")),
            (Self::Restart(r), Some(n)) => Self::Restart(format!("{r}; {n}")),
            (v, _) => v,
        }
    }

    /// The outcome counted in `nri_resize_memory_decrease_outcomes_total` when the verdict ends the
    /// decrease here (`None`: it goes on, directly or staged).
    pub(in crate::resize) fn outcome(&self) -> Option<DecreaseOutcome> {
        match self {
            // A refusal below usage is counted where it is answered (`toward`).
            Self::Direct | Self::Reclaim | Self::BelowUsage(_) => None,
            Self::Restart(_) => Some(DecreaseOutcome::Restarted),
            Self::Reject(_) => Some(DecreaseOutcome::Rejected),
        }
    }
}

impl Engine {
    /// Decides a kubelet-driven memory decrease from `allocated` to `desired` (see the module
    /// docs): the container ([`Self::decide_container_decrease`]), then, where it may go
    /// through, the pod step kubelet takes right after it ([`Self::pod_step_refusal`]: what is
    /// not page cache in the pod must fit under the lowered pod limit, or on cgroup v2 kubelet's
    /// pod write OOM-kills).
    pub(in crate::resize) fn decide_decrease(
        &self,
        pod: &Pod,
        ctr: &Container,
        allocated: &LinuxResources,
        desired: &LinuxResources,
        deadline: &Deadline,
    ) -> DecreaseVerdict {
        let verdict = self.decide_container_decrease(pod, ctr, allocated, desired, deadline);
        if !matches!(verdict, DecreaseVerdict::Direct) {
            return verdict;
        }
        match self.pod_step_refusal(pod, ctr, allocated, desired, deadline) {
            Some(reason) => {
                info!(container = %ctr.name, pod = %pod.full_name(), %reason, "memory decrease refused for the pod step after it");
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Rejected);
                DecreaseVerdict::Reject(reason)
            }
            None => verdict,
        }
    }

    /// The container's part of [`Self::decide_decrease`]: reads its usage, and reclaims page
    /// cache inline within a share of the runtime's `deadline` where that is enough.
    fn decide_container_decrease(
        &self,
        pod: &Pod,
        ctr: &Container,
        allocated: &LinuxResources,
        desired: &LinuxResources,
        deadline: &Deadline,
    ) -> DecreaseVerdict {
        let Some(target) = memory_limit(desired) else {
            return DecreaseVerdict::Direct;
        };
        let old = memory_limit(allocated);
        if old.is_some_and(|o| o <= target) {
            return DecreaseVerdict::Direct;
        }
        let Some(cg) = self.cgroups.as_ref() else {
            return DecreaseVerdict::Direct;
        };
        let usage = match container_path(&ctr.cgroups_path).and_then(|p| cg.memory_use(&p)) {
            Ok(u) => u,
            // Unchecked, a limit below usage is an OOM kill on cgroup v2: refused (kubelet
            // asks again), never let through.
            Err(e) => {
                warn!(container = %ctr.name, pod = %pod.full_name(), error = %e, "memory usage unreadable: the decrease is refused until it can be checked");
                self.state.metrics.decrease.outcome(DecreaseOutcome::Error);
                return DecreaseVerdict::Reject(format!(
                    "memory usage unreadable ({e}): a memory decrease is refused until it can be checked against usage"
                ));
            }
        };
        let cfg = self.config();
        let md = &cfg.memory_decrease;
        let DecreasePlan::Staged { .. } = plan_decrease(old, target, usage.usage, md.headroom)
        else {
            self.state.metrics.decrease.outcome(DecreaseOutcome::Direct);
            return DecreaseVerdict::Direct;
        };
        let (strategy, errors) = effective_decrease_strategy(
            &pod.annotations,
            &ctr.name,
            md.strategy,
            cfg.policy.allow_annotations,
        );
        for e in &errors {
            warn!(pod = %pod.full_name(), container = %ctr.name, error = %e, "memory-decrease annotation ignored");
            self.state.metrics.annotation_error();
        }
        let what = format!(
            "usage {} above requested limit {}",
            bytes_text(usage.usage),
            bytes_text(target)
        );
        if strategy == MemoryDecreaseStrategy::Reclaim {
            if let Some(reason) = self.below_trimmed_working_set(ctr, target, &what) {
                info!(container = %ctr.name, pod = %pod.full_name(), %reason, "memory decrease deferred: below the working set trimming found");
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Rejected);
                return DecreaseVerdict::Reject(reason);
            }
        }
        if strategy == MemoryDecreaseStrategy::Reclaim && cfg.resize.mode == Mode::Enforce {
            // Trimming stays off the container while the update reclaims it.
            let _pause = self.reclaims.inline_pass(&ctr.id);
            if self.reclaim_inline(ctr, (old, target), &usage, md.inline_max, deadline) {
                return DecreaseVerdict::Direct;
            }
        }
        let verdict = match DecreaseVerdict::of_strategy(strategy, &what, true) {
            // Never an interim on kubelet's path: refused with the usage as it is now.
            DecreaseVerdict::Reclaim => {
                let now = container_path(&ctr.cgroups_path)
                    .and_then(|p| cg.memory_use(&p))
                    .unwrap_or(usage);
                DecreaseVerdict::BelowUsage(now)
            }
            other => other,
        };
        // The memory-decrease annotations of this container in a spelling of before 2026-11-25
        // (read as the current one; logged once when the pod was announced).
        let container_key = format!("{CONTAINER_DECREASE_PREFIX}{}", ctr.name);
        let note = deprecated_spellings(&pod.annotations)
            .into_iter()
            .filter(|d| d.annotation == container_key || d.annotation == POD_DECREASE_ANNOTATION)
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        let verdict = verdict.noted(Some(note.as_str()).filter(|n| !n.is_empty()));
        if let Some(o) = verdict.outcome() {
            self.state.metrics.decrease.outcome(o);
        }
        verdict
    }

    /// Why a decrease of `ctr` to `target` (`what`: how far below usage) is not reclaimed: the
    /// working set trimming found for the container is above it. Trimming stopped at the usage
    /// where reclaiming more made the container refault or stall; reclaiming below it would
    /// evict memory the container uses, so the decrease waits (kubelet asks again) instead of
    /// thrashing the container until the reclaim's timeout. `None`: trimming found none, or
    /// one that fits.
    pub(super) fn below_trimmed_working_set(
        &self,
        ctr: &Container,
        target: u64,
        what: &str,
    ) -> Option<String> {
        let trim = self.reclaims.trim_state(&ctr.id)?;
        let working_set = trim.working_set_bytes.filter(|ws| *ws > target)?;
        let how = match trim.state {
            crate::trim::TrimState::Converged { found, .. } => format!(" ({found})"),
            _ => String::new(),
        };
        Some(format!(
            "{what}, and trimming found a working set of {}{how}: reclaiming below it would evict memory the container uses",
            bytes_text(working_set)
        ))
    }

    /// The fast path: when what must go is page cache (anonymous and shared memory fit under
    /// the target), reclaim inside the update, bounded by time: half of what is left of the
    /// runtime's deadline (750 ms with containerd's default 2 s). It reclaims in
    /// [`INLINE_CHUNK`] passes — v1: the limit lowered a chunk at a time (the kernel reclaims
    /// inside the write or refuses with `EBUSY`, never an OOM kill), v2: `memory.reclaim` a chunk
    /// at a time — and stops when usage fits or the time is spent; the decrease is then refused
    /// (v1: the limit its spec says put back) and the rest reclaimed in the background.
    /// `inline_max` (0: off) caps the bytes reclaimed here. `true`: usage fits the target now,
    /// and the runtime writes the limit as asked.
    fn reclaim_inline(
        &self,
        ctr: &Container,
        (old, target): (Option<u64>, u64),
        usage: &crate::policy::MemoryUse,
        inline_max: u64,
        deadline: &Deadline,
    ) -> bool {
        let need = usage.usage.saturating_sub(target);
        if need == 0 || inline_max == 0 || usage.unreclaimable() >= target {
            return false;
        }
        // Bytes reclaimed inline stop here even with time left (the background reclaim takes over).
        let floor = usage.usage.saturating_sub(inline_max).max(target);
        let (Some(cg), Ok(path)) = (self.cgroups.as_ref(), container_path(&ctr.cgroups_path))
        else {
            return false;
        };
        let started = Instant::now();
        let until = started + deadline.remaining() / 2;
        let mut now_usage = usage.usage;
        let (mut done, mut spent) = (0u64, Duration::ZERO);
        let fits = loop {
            if now_usage <= target {
                break match cg.version() {
                    // The target itself, now that usage fits: the runtime's write is then a no-op.
                    crate::cgroup::CgroupVersion::V1 => {
                        cg.set_memory_limit(&path, Some(target)).is_ok()
                    }
                    crate::cgroup::CgroupVersion::V2 => true,
                };
            }
            let pass_started = Instant::now();
            // Past its share, short of the floor, or the runtime was already answered (the
            // decrease refused): no more passes.
            if pass_started >= until || (floor > target && now_usage <= floor) || deadline.expired()
            {
                break false;
            }
            let chunk = inline_pass_size(done, spent, until - pass_started);
            let step = match cg.version() {
                crate::cgroup::CgroupVersion::V1 => {
                    let next = now_usage.saturating_sub(chunk).max(target);
                    cg.set_memory_limit(&path, Some(next))
                }
                crate::cgroup::CgroupVersion::V2 => cg.reclaim(
                    &path,
                    crate::policy::reclaim_request(now_usage, target).min(chunk),
                ),
            };
            match (step, cg.memory_use(&path)) {
                (Ok(()) | Err(crate::cgroup::CgroupError::Again { .. }), Ok(u))
                    if u.usage < now_usage =>
                {
                    done += now_usage - u.usage;
                    spent += pass_started.elapsed();
                    now_usage = u.usage;
                }
                // Nothing more comes out (or the cgroup is unreadable): refused, kubelet retries.
                _ => break false,
            }
        };
        let took = started.elapsed();
        if !fits && cg.version() == crate::cgroup::CgroupVersion::V1 {
            // The passes lowered the v1 limit toward the target: the decrease is refused, so the
            // container keeps the limit its spec says (a lower one would be a divergence nobody
            // sees, and an OOM kill nearer than anyone asked for).
            if let Err(e) = cg.set_memory_limit(&path, old) {
                warn!(container = %ctr.name, error = %e, "could not put the container's memory limit back after the inline reclaim");
            }
        }
        if fits {
            info!(container = %ctr.name, target_mib = mib(target), reclaimed_mib = mib(need), took_ms = took.as_millis(), "page cache reclaimed inside the update");
            self.state.metrics.decrease.inline(need, took.as_secs_f64());
        } else {
            info!(container = %ctr.name, target_mib = mib(target), left_mib = mib(now_usage.saturating_sub(target)), took_ms = took.as_millis(), "inline reclaim ran out of its share of the deadline; the decrease is refused");
        }
        fits
    }

    /// kubelet asking again for a decrease while a reclaim of the container is in flight
    /// (kubelet retries a refused update after its pod worker's backoff and shows the error text
    /// in `PodResizeInProgress`):
    /// - the background reclaim toward a refused limit ([`super::toward`]): the same limit
    ///   asked again is answered with its progress while usage is still above it; once usage
    ///   fits the reclaim ends and the update is decided anew (and goes through);
    /// - a staged decrease (a whole-pod step's, or one resumed from a checkpoint): the same
    ///   request, nothing else differing from what is allocated, is answered with its progress.
    ///
    /// Any other update supersedes the reclaim and is decided anew. `None`: decide anew.
    pub(in crate::resize) fn repeated_decrease(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        requested: &LinuxResources,
        desired: &LinuxResources,
        allocated: &LinuxResources,
        deadline: &Deadline,
    ) -> Option<Rejection> {
        let asked = memory_limit(requested);
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        if let Some(target) = self.reclaims.toward_target(&ctr.id) {
            if asked == Some(target) {
                return self.repeat_toward(ctr, &subject, target);
            }
            self.reclaims.take(
                &ctr.id,
                "newer update: the reclaim toward the refused limit ends",
            );
            return None;
        }
        if let Some((interim, target)) = self.reclaims.staged(&ctr.id) {
            if asked == Some(target) && answered_already(desired, allocated, target, interim) {
                let progress = self
                    .records
                    .view()
                    .container(&ctr.id)
                    .map(|r| r.reason)
                    .unwrap_or_default();
                return Some(Rejection(format!(
                    "memory decrease of {subject} in progress, not yet in place: {progress}"
                )));
            }
            // Half of what is left of the deadline for a write of it still inside the kernel.
            let until = Instant::now() + deadline.remaining() / 2;
            match self.reclaims.supersede_unless_applying(&ctr.id, until) {
                Supersede::Done => {}
                Supersede::Applying => {
                    info!(container = %subject, "newer update while the staged memory decrease is being applied: refused once, kubelet asks again");
                    return Some(Rejection(format!(
                        "the staged memory decrease of {subject} is being applied by the runtime at this moment; this newer update goes through when kubelet asks again"
                    )));
                }
                Supersede::InKernel => {
                    return Some(Rejection(format!(
                        "a memory limit write of the superseded staged decrease of {subject} is still inside the kernel; this newer update goes through when kubelet asks again"
                    )));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MemoryResources;

    #[test]
    fn an_inline_pass_is_sized_to_end_within_the_time_left() {
        let ms = Duration::from_millis;
        assert_eq!(inline_pass_size(0, Duration::ZERO, ms(750)), INLINE_FIRST);
        // 8 MiB in 250 ms is 32 MiB/s: half of 1 s left is 16 MiB.
        assert_eq!(inline_pass_size(8 << 20, ms(250), ms(1000)), 16 << 20);
        // Fast reclaim: never more than a chunk; slow reclaim with little time: at least 1 MiB.
        assert_eq!(inline_pass_size(8 << 20, ms(1), ms(700)), INLINE_CHUNK);
        assert_eq!(inline_pass_size(1 << 20, ms(500), ms(10)), INLINE_MIN);
    }

    #[test]
    fn one_mapping_from_strategy_to_verdict_and_outcome() {
        let v = |s, can_restart| {
            DecreaseVerdict::of_strategy(s, "usage 300Mi above requested limit 100Mi", can_restart)
        };
        let reject = v(MemoryDecreaseStrategy::Reject, true);
        assert!(matches!(&reject, DecreaseVerdict::Reject(r) if r.contains("strategy reject")));
        assert_eq!(reject.outcome(), Some(DecreaseOutcome::Rejected));
        let restart = v(MemoryDecreaseStrategy::Restart, true);
        assert!(matches!(&restart, DecreaseVerdict::Restart(r) if r.contains("restarting")));
        assert_eq!(restart.outcome(), Some(DecreaseOutcome::Restarted));
        // A whole-pod step cannot restart: refused, and counted as what happened (rejected).
        let whole_pod = v(MemoryDecreaseStrategy::Restart, false);
        assert!(matches!(&whole_pod, DecreaseVerdict::Reject(r) if r.contains("cannot restart")));
        assert_eq!(whole_pod.outcome(), Some(DecreaseOutcome::Rejected));
        let reclaim = v(MemoryDecreaseStrategy::Reclaim, false);
        assert!(matches!(reclaim, DecreaseVerdict::Reclaim));
        assert_eq!(reclaim.outcome(), None);
    }

    /// A decrease below the working set trimming found is refused with that figure, before any
    /// reclaim; one above it goes on as before (here: reclaimed inline, the fixture's "kernel"
    /// taking nothing, then refused below usage).
    #[tokio::test]
    #[expect(
        clippy::too_many_lines,
        reason = "one story: the fixture, trimming's finding, the two decreases"
    )]
    async fn a_decrease_below_the_working_set_trimming_found_is_deferred_with_it() {
        use std::collections::BTreeMap;

        use tokio_util::sync::CancellationToken;

        use crate::cgroup::{Cgroups, V2};
        use crate::config::Config;
        use crate::metrics::ContainerLabels;
        use crate::nri::RuntimeLink;
        use crate::policy::TRIM_ANNOTATION;
        use crate::resize::node::NodeReader;
        use crate::state::NodeState;
        use crate::trim::{TrimTarget, Trimmer};

        const MI: u64 = 1 << 20;
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pod/ctr");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let set = |usage: u64, file: u64| {
            // The breakdown first: a turn in between sees cache to drop, never a smaller one.
            for (name, text) in [
                (
                    "memory.stat",
                    format!(
                        "anon {}\nfile {}\nshmem 0\nactive_file 0\ninactive_file {}\nworkingset_refault_file 0\n",
                        (usage - file) * MI,
                        file * MI,
                        file * MI
                    ),
                ),
                ("memory.current", (usage * MI).to_string()),
            ] {
                let aside = dir.join(format!("{name}.new"));
                std::fs::write(&aside, text).expect("write");
                std::fs::rename(&aside, dir.join(name)).expect("rename");
            }
        };
        let idle = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        for (name, text) in [
            ("memory.pressure", idle),
            ("io.pressure", idle),
            ("memory.reclaim", ""),
        ] {
            std::fs::write(dir.join(name), text).expect("write");
        }
        // Nothing droppable left at 208Mi: trimming converges on that working set.
        set(208, 0);
        let cfg = Config::parse("[trim]\ninterval = \"100ms\"\n", "test").expect("config");
        let state = NodeState::with_cgroups(
            cfg,
            Some(Cgroups::V2(V2 {
                root: tmp.path().to_owned(),
            })),
        );
        let cancel = CancellationToken::new();
        let trimmer = Trimmer::start_with(state.clone(), &cancel, || false);
        trimmer.watch(
            "c",
            TrimTarget {
                labels: ContainerLabels {
                    namespace: "ns".into(),
                    pod: "p".into(),
                    container: "app".into(),
                },
                cgroup: "/pod/ctr".into(),
                annotations: BTreeMap::from([(TRIM_ANNOTATION.to_owned(), "on".to_owned())]),
            },
        );
        for _ in 0..400 {
            if trimmer.working_set("c").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(trimmer.working_set("c"), Some(208 * MI));
        // The trimmer's task stops here: its finding stays published, and no step of its own
        // lands in `memory.reclaim` while the decreases below are looked at.
        trimmer.shutdown().await;
        let engine = Engine::new(
            state.clone(),
            RuntimeLink::default(),
            state.cgroups.clone(),
            NodeReader::new("/nonexistent/nri-resize-test-node"),
            None,
        )
        .with_trimmer(trimmer.clone());
        // The cache came back since: 230Mi used, 22Mi of it page cache. (The trimmer's probe of
        // `memory.reclaim` is wiped.)
        set(230, 22);
        std::fs::write(dir.join("memory.reclaim"), "").expect("write");
        let pod = Pod {
            id: "p".into(),
            namespace: "ns".into(),
            name: "p".into(),
            ..Pod::default()
        };
        let ctr = Container {
            id: "c".into(),
            pod_id: "p".into(),
            name: "app".into(),
            cgroups_path: "/pod/ctr".into(),
            ..Container::default()
        };
        let limit = |mib: u64| LinuxResources {
            memory: Some(MemoryResources {
                limit: Some(i64::try_from(mib * MI).expect("fits")),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        };
        let deadline = Deadline::after(Duration::from_secs(2));
        let verdict = engine.decide_decrease(&pod, &ctr, &limit(512), &limit(128), &deadline);
        let DecreaseVerdict::Reject(reason) = verdict else {
            panic!("a decrease below the working set found goes on");
        };
        assert_eq!(
            reason,
            "usage 230Mi above requested limit 128Mi, and trimming found a working set of 208Mi (no droppable page cache left): reclaiming below it would evict memory the container uses"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.reclaim")).expect("read"),
            "",
            "nothing reclaimed"
        );
        // Above the working set: reclaimed inline (asked of the kernel), then refused below
        // usage (the fixture's kernel took nothing), never an interim.
        let verdict = engine.decide_decrease(&pod, &ctr, &limit(512), &limit(216), &deadline);
        assert!(
            matches!(&verdict, DecreaseVerdict::BelowUsage(u) if u.usage == 230 * MI),
            "refused below usage"
        );
        assert!(
            !std::fs::read_to_string(dir.join("memory.reclaim"))
                .expect("read")
                .is_empty(),
            "the inline reclaim asked the kernel"
        );
    }
}
