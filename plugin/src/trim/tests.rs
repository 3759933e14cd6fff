//! The trimmer's lifecycle on a v2 fixture cgroup root: opt-in, steps written to
//! `memory.reclaim` with `swappiness=0`, convergence and its series, container removal,
//! unavailability (v1, no PSI) and cancellation.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ContainerTrim, TrimState, TrimTarget, Trimmer};
use crate::cgroup::{Cgroups, V1, V2};
use crate::config::Config;
use crate::metrics::ContainerLabels;
use crate::policy::{Found, TRIM_ANNOTATION};
use crate::state::NodeState;

const MIB: u64 = 1 << 20;

/// Writes a fixture file the way the kernel shows one: whole (written aside, renamed into
/// place), so the trimmer's task never reads it half-written.
fn write(dir: &Path, file: &str, value: &str) {
    let aside = dir.join(format!("{file}.new"));
    std::fs::write(&aside, value).expect("write fixture");
    std::fs::rename(&aside, dir.join(file)).expect("rename fixture");
}

/// A v2 container cgroup under a temp root holding `file_mib` of inactive page cache.
fn container(root: &Path, name: &str, file_mib: u64) -> PathBuf {
    let dir = root.join("pod").join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    set_cache(&dir, file_mib, 0);
    write(&dir, "memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
    write(&dir, "io.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
    write(&dir, "memory.reclaim", "");
    dir
}

fn set_cache(dir: &Path, file_mib: u64, refault_pages: u64) {
    let usage = (8 + file_mib) * MIB;
    write(dir, "memory.current", &format!("{usage}\n"));
    write(
        dir,
        "memory.stat",
        &format!(
            "anon {}\nfile {}\nshmem 0\nactive_file 0\ninactive_file {}\nworkingset_refault_file {refault_pages}\n",
            8 * MIB,
            file_mib * MIB,
            file_mib * MIB
        ),
    );
}

fn state(root: &Path, cfg: &str) -> Arc<NodeState> {
    let config = Config::parse(cfg, "test").expect("config");
    NodeState::with_cgroups(
        config,
        Some(Cgroups::V2(V2 {
            root: root.to_owned(),
        })),
    )
}

fn target(name: &str, annotations: &[(&str, &str)]) -> TrimTarget {
    TrimTarget {
        labels: ContainerLabels {
            namespace: "default".into(),
            pod: "web".into(),
            container: name.into(),
        },
        cgroup: PathBuf::from(format!("/pod/{name}")),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    }
}

const FAST: &str = "[trim]\ninterval = \"100ms\"\nmax_step = \"4Mi\"\n";

/// Waits (up to 20 s) until `cond` holds for container `id`'s record.
async fn until(
    t: &Trimmer,
    id: &str,
    what: &str,
    cond: impl Fn(&ContainerTrim) -> bool,
) -> ContainerTrim {
    for _ in 0..400 {
        if let Some(c) = t.state(id).filter(|c| cond(c)) {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id}: never {what}: {:?}", t.state(id));
}

#[tokio::test]
async fn an_opted_in_container_is_trimmed_in_steps_and_its_working_set_exported() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = container(tmp.path(), "app", 6);
    let state = state(tmp.path(), FAST);
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state.clone(), &cancel, || false);
    t.sync(HashMap::from([
        ("c1".to_owned(), target("app", &[(TRIM_ANNOTATION, "on")])),
        ("c2".to_owned(), target("side", &[])),
    ]));
    // Steps ask for page cache only, at most max_step (the sizes: policy/trim/tests.rs).
    until(&t, "c1", "stepped", |c| c.steps >= 1).await;
    let written = std::fs::read_to_string(dir.join("memory.reclaim")).expect("read");
    let bytes: u64 = written
        .strip_suffix(" swappiness=0")
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("a page-cache-only step: {written:?}"));
    assert!((MIB..=4 * MIB).contains(&bytes), "{written}");
    assert_eq!(
        t.state("c2").map(|c| c.state),
        Some(TrimState::Off),
        "not opted in"
    );
    // The "kernel" drops the cache: no droppable cache left, the working set is the usage.
    set_cache(&dir, 0, 0);
    let c = until(&t, "c1", "converged", |c| {
        matches!(c.state, TrimState::Converged { .. })
    })
    .await;
    assert_eq!(
        c.state,
        TrimState::Converged {
            working_set: 8 * MIB,
            found: Found::NothingLeft
        }
    );
    assert_eq!(t.working_set("c1"), Some(8 * MIB));
    // The fixture's "kernel" reclaims nothing inside the write: what went later is not counted
    // as trimmed (the real kernel's figures are in tests/cgroup_kernel.rs).
    assert!(c.steps >= 1 && c.trimmed_bytes == 0, "{c:?}");
    let text = state.metrics.encode().expect("encode");
    assert!(
        text.contains(r#"nri_resize_container_trim_working_set_bytes{container="app",namespace="default",pod="web"} 8388608"#),
        "{text}"
    );
    // Removed: its record and series go at once.
    t.forget("c1");
    assert_eq!(t.state("c1"), None);
    let text = state.metrics.encode().expect("encode");
    assert!(!text.contains("container=\"app\""), "{text}");
    t.shutdown().await;
}

/// A working set found stops being true once the container uses less: the next probe drops it
/// (record and series), so that a decrease that fits is not made to wait for it.
#[tokio::test]
async fn a_working_set_is_dropped_once_usage_falls_below_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = container(tmp.path(), "hot", 100);
    let state = state(
        tmp.path(),
        "[trim]\ninterval = \"100ms\"\nmax_step = \"4Mi\"\nreprobe_after = \"1s\"\n",
    );
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state.clone(), &cancel, || false);
    t.watch("c1", target("hot", &[(TRIM_ANNOTATION, "on")]));
    until(&t, "c1", "stepped", |c| c.steps >= 1).await;
    set_cache(&dir, 100, 256);
    until(&t, "c1", "converged", |c| {
        matches!(c.state, TrimState::Converged { .. })
    })
    .await;
    assert_eq!(t.working_set("c1"), Some(108 * MIB));
    // The workload shrank: 58Mi used, under the 108Mi found.
    set_cache(&dir, 50, 256);
    until(&t, "c1", "dropped its working set", |c| {
        c.working_set_bytes.is_none()
    })
    .await;
    assert_eq!(t.working_set("c1"), None);
    let text = state.metrics.encode().expect("encode");
    assert!(
        !text.contains("nri_resize_container_trim_working_set_bytes{"),
        "the series went with it: {text}"
    );
    t.shutdown().await;
}

#[tokio::test]
async fn refaults_after_a_step_end_the_probe_before_the_cache_is_gone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = container(tmp.path(), "hot", 100);
    let state = state(tmp.path(), FAST);
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state, &cancel, || false);
    t.watch("c1", target("hot", &[(TRIM_ANNOTATION, "on")]));
    until(&t, "c1", "stepped", |c| c.steps >= 1).await;
    // Everything the step took comes back: 1 MiB refaulted.
    set_cache(&dir, 100, 256);
    let c = until(&t, "c1", "converged", |c| {
        matches!(c.state, TrimState::Converged { .. })
    })
    .await;
    assert!(
        matches!(c.state, TrimState::Converged { working_set, found: Found::Refaults { .. } } if working_set == 108 * MIB),
        "{c:?}"
    );
    assert!(c.refaulted_bytes >= MIB, "{c:?}");
    // Cancelling the daemon's token stops the task.
    cancel.cancel();
    t.shutdown().await;
}

#[tokio::test]
async fn trimming_says_why_it_is_unavailable_and_bad_annotations_lose_nothing() {
    // No PSI: memory.pressure absent.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = container(tmp.path(), "app", 6);
    std::fs::remove_file(dir.join("memory.pressure")).expect("rm");
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state(tmp.path(), FAST), &cancel, || false);
    t.watch(
        "c1",
        target(
            "app",
            &[
                (TRIM_ANNOTATION, "on"),
                ("trim.nri-resize.io/max-stall", "5%"),
            ],
        ),
    );
    let c = until(&t, "c1", "unavailable", |c| {
        matches!(c.state, TrimState::Unavailable { .. })
    })
    .await;
    assert!(c.line().contains("no PSI"), "{}", c.line());
    assert!(
        c.line().contains("looser than the node default"),
        "{}",
        c.line()
    );
    assert_eq!(c.max_stall, Some(0.002), "the node's target applies");
    assert_eq!(
        std::fs::read_to_string(dir.join("memory.reclaim")).expect("read"),
        "",
        "nothing written"
    );
    t.shutdown().await;

    // cgroup v1.
    let tmp = tempfile::tempdir().expect("tempdir");
    let v1 = NodeState::with_cgroups(
        Config::parse("[trim]\nenabled = true\ninterval = \"100ms\"\n", "t").expect("config"),
        Some(Cgroups::V1(V1 {
            cpu: tmp.path().join("cpu"),
            memory: tmp.path().join("memory"),
        })),
    );
    let t = Trimmer::start_with(v1, &cancel, || true);
    t.watch("c1", target("app", &[]));
    let c = until(&t, "c1", "unavailable", |c| {
        matches!(c.state, TrimState::Unavailable { .. })
    })
    .await;
    assert!(c.line().contains("cgroup v1"), "{}", c.line());
    t.shutdown().await;
}

#[tokio::test]
async fn a_container_removed_while_trimmed_is_dropped_and_shutdown_ends_the_task() {
    let tmp = tempfile::tempdir().expect("tempdir");
    container(tmp.path(), "app", 50);
    let state = state(tmp.path(), "[trim]\nenabled = true\ninterval = \"100ms\"\n");
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state.clone(), &cancel, || false);
    t.sync(HashMap::from([("c1".to_owned(), target("app", &[]))]));
    until(&t, "c1", "stepped", |c| c.steps >= 1).await;
    t.sync(HashMap::new());
    assert_eq!(t.state("c1"), None);
    // A pass later it is still gone (no step in flight republished it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(t.state("c1"), None);
    assert!(!state
        .metrics
        .encode()
        .expect("encode")
        .contains("container=\"app\""));
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), t.shutdown())
        .await
        .expect("the task ends when the daemon's token fires");
}

#[tokio::test]
async fn a_container_stalling_on_its_own_is_held_not_trimmed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = container(tmp.path(), "busy", 50);
    // The container waits on I/O all the time: its io.pressure total grows by 10 s every
    // 10 ms, from before trimming's first reading to the end (a share of 1 between any two).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stalling = {
        let (dir, stop) = (dir.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut total: u64 = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                total += 10_000_000;
                write(&dir, "io.pressure", &format!("some avg10=90.00 avg60=90.00 avg300=90.00 total={total}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"));
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(
        state(tmp.path(), "[trim]\ninterval = \"500ms\"\n"),
        &cancel,
        || false,
    );
    t.watch("c1", target("busy", &[(TRIM_ANNOTATION, "on")]));
    let c = until(&t, "c1", "holding", |c| {
        matches!(c.state, TrimState::Holding { .. })
    })
    .await;
    assert!(c.line().contains("on its own"), "{}", c.line());
    assert_eq!(c.steps, 0, "nothing reclaimed: {c:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("memory.reclaim")).expect("read"),
        "0 swappiness=0",
        "only the availability check was written"
    );
    t.shutdown().await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    stalling.join().expect("the stalling thread");
}

#[tokio::test]
async fn a_cgroup_created_after_the_container_is_trimmed_without_waiting_the_pause() {
    // NRI's CreateContainer comes before runc creates the cgroup.
    let tmp = tempfile::tempdir().expect("tempdir");
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state(tmp.path(), FAST), &cancel, || false);
    t.watch("c1", target("late", &[(TRIM_ANNOTATION, "on")]));
    let c = until(&t, "c1", "unavailable", |c| {
        matches!(c.state, TrimState::Unavailable { .. })
    })
    .await;
    assert!(c.line().contains("does not exist"), "{}", c.line());
    // Made whole aside, then renamed into place, as a new cgroup appears with all its files.
    let staged = container(&tmp.path().join("staging"), "late", 50);
    std::fs::create_dir_all(tmp.path().join("pod")).expect("mkdir");
    std::fs::rename(staged, tmp.path().join("pod/late")).expect("rename");
    until(&t, "c1", "stepped", |c| c.steps >= 1).await;
    t.shutdown().await;
}

#[tokio::test]
async fn a_container_with_nothing_to_drop_is_probed_again_once_its_cache_fills() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Just started: no page cache yet.
    let dir = container(tmp.path(), "late", 0);
    let state = state(tmp.path(), FAST);
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state, &cancel, || false);
    t.watch("c1", target("late", &[(TRIM_ANNOTATION, "on")]));
    let c = until(&t, "c1", "found nothing to drop", |c| {
        matches!(c.state, TrimState::Converged { .. })
    })
    .await;
    assert_eq!(
        c.state,
        TrimState::Converged {
            working_set: 8 * MIB,
            found: Found::NothingLeft
        }
    );
    // It reads 50 MiB of files: the next interval's probe steps (not the 5-minute re-probe
    // pause of a found working set), and the working set follows.
    set_cache(&dir, 50, 0);
    until(&t, "c1", "stepped on the new cache", |c| c.steps >= 1).await;
    cancel.cancel();
    t.shutdown().await;
}

#[tokio::test]
async fn a_paused_container_is_held_while_a_decrease_reclaims_and_probed_afresh_after() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = container(tmp.path(), "app", 6);
    let state = state(tmp.path(), FAST);
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state.clone(), &cancel, || false);
    t.watch("c1", target("app", &[(TRIM_ANNOTATION, "on")]));
    // Three steps in: the probe's steps have grown past the first size (1, 2, 4 MiB).
    until(&t, "c1", "stepped three times", |c| c.steps >= 3).await;
    let first = t.pause("c1");
    let second = t.pause("c1");
    let held = until(&t, "c1", "held for the decrease", |c| {
        c.state
            == TrimState::Holding {
                reason: crate::policy::HoldReason::Decrease,
            }
    })
    .await;
    write(&dir, "memory.reclaim", "");
    // Several intervals (100 ms each) while paused: nothing written, no step counted.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("memory.reclaim")).expect("read"),
        "",
        "a step was written while a decrease held trimming off"
    );
    assert_eq!(t.state("c1").map(|c| c.steps), Some(held.steps));
    // Pauses nest: the first one to end does not resume trimming.
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(t.state("c1").map(|c| c.steps), Some(held.steps));
    drop(second);
    // Resumed with a new probe: its first step is the smallest again.
    let after = until(&t, "c1", "stepping again", |c| c.steps > held.steps).await;
    assert!(
        matches!(after.state, TrimState::Trimming { .. }),
        "{after:?}"
    );
    let written = std::fs::read_to_string(dir.join("memory.reclaim")).expect("read");
    assert_eq!(
        written,
        format!("{MIB} swappiness=0"),
        "the probe started over"
    );
    t.shutdown().await;
}

/// Issue 37: a pass over many trimmed containers is bounded by `[trim] pass_budget`; the
/// containers it does not reach go first in the next pass, so none waits for ever. With a
/// budget of 0 every pass takes exactly one turn: the three containers are stepped in turn and
/// the postponed turns are counted.
#[tokio::test]
async fn a_pass_over_its_budget_postpones_the_rest_and_every_container_gets_its_turn() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in ["a", "b", "c"] {
        container(tmp.path(), name, 6);
    }
    let state = state(
        tmp.path(),
        "[trim]\ninterval = \"100ms\"\nmax_step = \"4Mi\"\npass_budget = \"0s\"\n",
    );
    let cancel = CancellationToken::new();
    let t = Trimmer::start_with(state.clone(), &cancel, || false);
    t.sync(HashMap::from([
        ("c1".to_owned(), target("a", &[(TRIM_ANNOTATION, "on")])),
        ("c2".to_owned(), target("b", &[(TRIM_ANNOTATION, "on")])),
        ("c3".to_owned(), target("c", &[(TRIM_ANNOTATION, "on")])),
    ]));
    for id in ["c1", "c2", "c3"] {
        until(&t, id, "stepped in its turn", |c| c.steps >= 1).await;
    }
    let text = state.metrics.encode().expect("encode");
    let postponed: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("nri_resize_trim_turns_postponed_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no postponed counter: {text}"));
    // The first pass reached one of three: two postponed, at least.
    assert!(postponed >= 2, "{postponed}");
    t.shutdown().await;
}
