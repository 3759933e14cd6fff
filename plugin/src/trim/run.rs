//! The trimmer's task: one pass every `[trim] interval` over the containers whose turn it is,
//! one at a time, the whole pass (bookkeeping and turns) on trimming's own low-priority thread
//! ([`TrimWorker`]), which the task owns (it ends with the task); a turn's outcome is published
//! only if the container is still watched with the same cgroup.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use super::probe::{self, NotAvailable, Writer};
use super::status::{ContainerTrim, TrimState};
use super::step::{self, Readings, Turn};
use super::worker::TrimWorker;
use super::{Shared, TrimTarget};
use crate::cgroup::CgroupError;
use crate::config::Config;
use crate::observer::ReclaimWatch;
use crate::policy::{
    bytes_text, effective_trim, stall_text, working_set_holds, Found, HoldReason, Probe,
    TrimChoice, TrimSettings, TrimStep, REFAULT_FLOOR,
};
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// One container as the task keeps it.
struct Record {
    target: TrimTarget,
    probe: Probe,
    last: Option<Readings>,
    /// How steps ask the kernel, once trimming was found available on the cgroup.
    writer: Option<Writer>,
    next_at: Instant,
    view: ContainerTrim,
}

impl Record {
    fn new(target: TrimTarget) -> Self {
        Self {
            target,
            probe: Probe::default(),
            last: None,
            writer: None,
            next_at: Instant::now(),
            view: ContainerTrim::default(),
        }
    }

    /// Back to the start of a probe (after it converged, or trimming went off or failed).
    fn restart_probe(&mut self) {
        self.probe = Probe::default();
        self.last = None;
    }
}

pub(super) async fn run(shared: Arc<Shared>) {
    // Dropped when the task returns: the thread ends after the pass it is in, which stops
    // at its next turn once `shared.cancel` is cancelled.
    let worker = TrimWorker::start();
    let mut records: HashMap<String, Record> = HashMap::new();
    loop {
        let cfg = shared.state.config.read_locked().clone();
        let interval = cfg.trim.interval;
        // The whole pass (the bookkeeping as well as the turns) runs on trimming's thread,
        // not on tokio's workers, where the NRI handlers run.
        let on_thread = Arc::clone(&shared);
        let taken = std::mem::take(&mut records);
        let work = worker.run(move || one_pass(&on_thread, &cfg, taken));
        // A cancelled pass is not waited for: it ends on the thread, unreported.
        tokio::select! {
            r = work => match r {
                Ok(kept) => records = kept,
                // The records start over (fresh probes) from the targets at the next pass.
                Err(err) => warn!(%err, "trimming pass failed; its containers start over"),
            },
            () = shared.cancel.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shared.cancel.cancelled() => return,
        }
    }
}

/// One pass, on trimming's thread: the records follow the targets, then each container whose
/// turn it is takes it, within the pass's budget. Returns the records to keep.
fn one_pass(
    shared: &Shared,
    cfg: &Config,
    mut records: HashMap<String, Record>,
) -> HashMap<String, Record> {
    follow_targets(shared, &mut records);
    let started = Instant::now();
    let due = due_in_turn(&records, started);
    for (n, id) in due.iter().enumerate() {
        if shared.cancel.is_cancelled() {
            break;
        }
        // The pass's budget: the containers not reached keep their (older) turn and go
        // first in the next pass. At least one turn per pass.
        if n > 0 && started.elapsed() >= cfg.trim.pass_budget.min(cfg.trim.interval) {
            let postponed = due.len() - n;
            shared.state.metrics.trim.postponed(postponed);
            debug!(
                postponed,
                budget_ms = cfg.trim.pass_budget.as_millis(),
                "trimming pass over its budget: the rest go first next pass"
            );
            break;
        }
        let Some(rec) = records.remove(id) else {
            continue;
        };
        if let Some(rec) = pass(shared, cfg, id, rec) {
            records.insert(id.clone(), rec);
        }
    }
    records
}

/// The containers whose turn it is at `now`, the longest waiting first (then by id): a
/// container a pass's budget did not reach goes before those that had their turn.
fn due_in_turn(records: &HashMap<String, Record>, now: Instant) -> Vec<String> {
    let mut due: Vec<(Instant, &String)> = records
        .iter()
        .filter(|(_, r)| r.next_at <= now)
        .map(|(id, r)| (r.next_at, id))
        .collect();
    due.sort();
    due.into_iter().map(|(_, id)| id.clone()).collect()
}

/// Drops the records of containers no longer watched (or watched with another cgroup or
/// labels), takes new annotations, and adds the new containers.
fn follow_targets(shared: &Shared, records: &mut HashMap<String, Record>) {
    let targets = shared.targets.locked();
    records.retain(|id, r| {
        targets
            .get(id)
            .is_some_and(|t| t.cgroup == r.target.cgroup && t.labels == r.target.labels)
    });
    for (id, t) in targets.iter() {
        match records.get_mut(id) {
            Some(r) => r.target.annotations.clone_from(&t.annotations),
            None => {
                records.insert(id.clone(), Record::new(t.clone()));
            }
        }
    }
}

/// One container's turn; `None` when it is no longer watched or the trimmer stops.
fn pass(shared: &Shared, cfg: &Config, id: &str, mut rec: Record) -> Option<Record> {
    let node = TrimChoice {
        enabled: cfg.trim.enabled,
        max_stall: cfg.trim.max_stall,
    };
    let (choice, errors) =
        effective_trim(&rec.target.annotations, node, cfg.policy.allow_annotations);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if errors != rec.view.annotation_errors {
        for e in errors
            .iter()
            .filter(|e| !rec.view.annotation_errors.contains(e))
        {
            warn!(pod = %rec.target.labels.pod, namespace = %rec.target.labels.namespace, error = %e, "trimming annotation ignored");
            shared.state.metrics.annotation_error();
        }
        rec.view.annotation_errors = errors;
    }
    let interval = cfg.trim.interval;
    if !choice.enabled {
        rec.view.state = TrimState::Off;
        rec.view.max_stall = None;
        rec.restart_probe();
        rec.next_at = Instant::now() + interval;
        return publish(shared, id, rec, 0, None);
    }
    rec.view.max_stall = Some(choice.max_stall.get());
    // A pause that began since the last turn disturbed what the probe measured: start over.
    if shared.pauses.take_disturbed(id) {
        rec.restart_probe();
    }
    if shared.pauses.is_paused(id) {
        rec.view.state = TrimState::Holding {
            reason: HoldReason::Decrease,
        };
        rec.next_at = Instant::now() + interval;
        return publish(shared, id, rec, 0, None);
    }
    let Some(cgroups) = shared.state.cgroups.clone() else {
        rec.view.state = TrimState::Unavailable {
            reason: "cgroup access is off".into(),
        };
        rec.next_at = Instant::now() + cfg.trim.reprobe_after;
        return publish(shared, id, rec, 0, None);
    };
    let settings = TrimSettings {
        max_stall: choice.max_stall,
        min_step: cfg.trim.min_step,
        max_step: cfg.trim.max_step,
    };
    let outcome = turn(
        &cgroups,
        &mut rec,
        &settings,
        shared.node_has_swap,
        &shared.state.reclaim_watch,
    );
    // Stopped meanwhile: the step is not reported.
    if shared.cancel.is_cancelled() {
        return None;
    }
    let (trimmed, working_set) = apply(&mut rec, outcome, &settings, cfg);
    publish(shared, id, rec, trimmed, working_set)
}

/// Takes a turn's outcome into the record: its state and figures, and when its next turn is.
/// Returns the bytes trimmed and the working set found, for the series (`Some(0)`: a working
/// set found before no longer holds, its series goes).
fn apply(
    rec: &mut Record,
    outcome: Outcome,
    settings: &TrimSettings,
    cfg: &Config,
) -> (u64, Option<u64>) {
    let now = Instant::now();
    let interval = cfg.trim.interval;
    let mut trimmed = 0;
    let mut working_set = None;
    match outcome {
        Outcome::Unavailable(reason) => {
            rec.view.state = TrimState::Unavailable { reason };
            rec.restart_probe();
            rec.next_at = now + cfg.trim.reprobe_after;
        }
        Outcome::Failed(err) => {
            rec.view.state = TrimState::Unavailable {
                reason: err.to_string(),
            };
            rec.restart_probe();
            rec.writer = None;
            rec.next_at = now + interval;
        }
        Outcome::Turned {
            turn,
            stepped_before,
        } => {
            if stepped_before {
                let stall = turn.harm.stall();
                rec.view.last_stall = Some(stall);
                // A stall with nothing refaulted is the workload's own (policy/trim.rs).
                if turn.harm.refaulted > REFAULT_FLOOR {
                    rec.view.worst_stall = rec.view.worst_stall.max(stall);
                }
                rec.view.refaulted_bytes =
                    rec.view.refaulted_bytes.saturating_add(turn.harm.refaulted);
            }
            rec.next_at = now + interval;
            if drop_stale_working_set(rec, turn.usage) {
                working_set = Some(0);
            }
            match turn.step {
                None => {
                    rec.view.state = TrimState::Trimming {
                        next_step: rec.probe.next_step(settings),
                    };
                }
                Some(TrimStep::Reclaim(_)) => {
                    trimmed = turn.trimmed;
                    rec.view.steps += 1;
                    rec.view.trimmed_bytes = rec.view.trimmed_bytes.saturating_add(trimmed);
                    rec.view.state = TrimState::Trimming {
                        next_step: rec.probe.next_step(settings),
                    };
                }
                Some(TrimStep::Hold(reason)) => {
                    rec.view.state = TrimState::Holding { reason };
                }
                Some(TrimStep::Converged {
                    working_set: ws,
                    found,
                }) => {
                    // Nothing droppable is no finding about the workload: look again at the
                    // next interval (a container that fills its cache later is probed then),
                    // and say so once.
                    let nothing_left = matches!(found, Found::NothingLeft);
                    let said = nothing_left
                        && matches!(
                            rec.view.state,
                            TrimState::Converged {
                                found: Found::NothingLeft,
                                ..
                            }
                        );
                    if !said {
                        info!(
                        namespace = %rec.target.labels.namespace,
                        pod = %rec.target.labels.pod,
                        container = %rec.target.labels.container,
                        working_set = %bytes_text(ws),
                        %found,
                        trimmed = %bytes_text(rec.view.trimmed_bytes),
                        worst_stall = %stall_text(rec.view.worst_stall),
                        "trimming found the working set"
                        );
                    }
                    rec.view.state = TrimState::Converged {
                        working_set: ws,
                        found,
                    };
                    rec.view.working_set_bytes = Some(ws);
                    working_set = Some(ws);
                    rec.restart_probe();
                    rec.next_at = if nothing_left {
                        now + interval
                    } else {
                        now + cfg.trim.reprobe_after
                    };
                }
            }
        }
    }
    (trimmed, working_set)
}

/// A working set found before stops being true once the container uses less than it
/// (`usage`): it would make a decrease that fits wait (pod-level admission, kubelet's path).
/// Drops it from the record; `true` when it did.
fn drop_stale_working_set(rec: &mut Record, usage: u64) -> bool {
    let Some(ws) = rec
        .view
        .working_set_bytes
        .filter(|ws| !working_set_holds(*ws, usage))
    else {
        return false;
    };
    info!(
        namespace = %rec.target.labels.namespace,
        pod = %rec.target.labels.pod,
        container = %rec.target.labels.container,
        working_set = %bytes_text(ws),
        usage = %bytes_text(usage),
        "the working set trimming found no longer holds (usage below it); dropped"
    );
    rec.view.working_set_bytes = None;
    true
}

/// What a turn came to.
enum Outcome {
    /// Trimming cannot run on the cgroup (checked once per record, again after a pause).
    Unavailable(String),
    /// A read or the write failed (the container stopped?).
    Failed(CgroupError),
    /// `stepped_before`: the turn measured the harm of a step.
    Turned { turn: Turn, stepped_before: bool },
}

fn turn(
    cgroups: &crate::cgroup::Cgroups,
    rec: &mut Record,
    settings: &TrimSettings,
    node_has_swap: fn() -> bool,
    watch: &ReclaimWatch,
) -> Outcome {
    let writer = match rec.writer {
        Some(w) => w,
        None => match probe::writer(cgroups, &rec.target.cgroup, &node_has_swap) {
            Ok(w) => *rec.writer.insert(w),
            Err(NotAvailable::Node(reason)) => return Outcome::Unavailable(reason),
            Err(NotAvailable::Cgroup(e)) => return Outcome::Failed(e),
        },
    };
    // This turn may reclaim: the observer's reclaim counter stays attached until it ends.
    let _reclaiming = watch.watch();
    // The harm this turn measures is a step's only when the last turn stepped (not after a
    // hold: that stall is the workload's own).
    let stepped_before = rec.probe.last_step() > 0
        && rec.last.is_some()
        && matches!(rec.view.state, TrimState::Trimming { .. });
    match step::turn(
        cgroups,
        &rec.target.cgroup,
        writer,
        settings,
        &mut rec.probe,
        &mut rec.last,
    ) {
        Ok(turn) => Outcome::Turned {
            turn,
            stepped_before,
        },
        Err(e) => Outcome::Failed(e),
    }
}

/// Publishes the record and its series if the container is still watched with the same cgroup
/// (the lock order is the handle's: targets, then published).
fn publish(
    shared: &Shared,
    id: &str,
    rec: Record,
    trimmed: u64,
    working_set: Option<u64>,
) -> Option<Record> {
    let targets = shared.targets.locked();
    if !targets
        .get(id)
        .is_some_and(|t| t.cgroup == rec.target.cgroup && t.labels == rec.target.labels)
    {
        return None;
    }
    let metrics = &shared.state.metrics.trim;
    if trimmed > 0 {
        metrics.add_trimmed(&rec.target.labels, trimmed);
    }
    match working_set {
        Some(0) => metrics.clear_working_set(&rec.target.labels),
        Some(ws) => metrics.set_working_set(&rec.target.labels, ws),
        None => {}
    }
    shared
        .published
        .locked()
        .insert(id.to_owned(), rec.view.clone());
    drop(targets);
    Some(rec)
}
