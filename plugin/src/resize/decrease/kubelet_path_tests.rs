//! kubelet's path through [`Engine::on_update`] on a cgroupfs fixture whose "kernel" reclaims
//! nothing: a decrease below usage is refused with its figures, never answered with another
//! limit; the page cache in the way is reclaimed in the background (v2) until kubelet's retry
//! finds it fits; the pod step after the container is judged with it; v1's inline passes leave
//! the limit the container's spec says.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cgroup::{Cgroups, V1, V2};
use crate::config::Config;
use crate::model::{Container, ContainerState, LinuxResources, MemoryResources, Pod};
use crate::nri::{Deadline, RuntimeLink};
use crate::policy::ResizeState;
use crate::resize::node::NodeReader;
use crate::resize::Engine;
use crate::state::NodeState;

const MI: u64 = 1 << 20;

fn write(dir: &Path, name: &str, text: &str) {
    let aside = dir.join(format!("{name}.new"));
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, dir.join(name)).expect("rename");
}

/// A v2 cgroup's memory files: `usage` MiB of which `file` page cache and `anon` anonymous.
fn v2_memory(dir: &Path, usage: u64, anon: u64, file: u64) {
    write(
        dir,
        "memory.stat",
        &format!(
            "anon {}\nfile {}\nshmem 0\nactive_file 0\ninactive_file {}\nworkingset_refault_file 0\n",
            anon * MI,
            file * MI,
            file * MI
        ),
    );
    write(dir, "memory.current", &(usage * MI).to_string());
}

fn limit(mib: u64) -> LinuxResources {
    LinuxResources {
        memory: Some(MemoryResources {
            limit: Some(i64::try_from(mib * MI).expect("fits")),
            ..MemoryResources::default()
        }),
        ..LinuxResources::default()
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    pod_dir: PathBuf,
    ctr_dir: PathBuf,
    engine: Arc<Engine>,
    pod: Pod,
    ctr: Container,
}

/// A pod `ns/p` (pod cgroup `/pod`, memory limit `pod_limit` MiB where given) with container
/// `app` (`/pod/ctr`) limited to 512 MiB, on cgroup v2 or v1.
fn fixture(v1: bool, pod_limit: Option<u64>, config: &str) -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cgroups, pod_dir, ctr_dir) = if v1 {
        let memory = tmp.path().join("memory");
        let cpu = tmp.path().join("cpu");
        std::fs::create_dir_all(cpu.join("pod/ctr")).expect("mkdir");
        std::fs::create_dir_all(memory.join("pod/ctr")).expect("mkdir");
        (
            Cgroups::V1(V1 {
                cpu,
                memory: memory.clone(),
            }),
            memory.join("pod"),
            memory.join("pod/ctr"),
        )
    } else {
        std::fs::create_dir_all(tmp.path().join("pod/ctr")).expect("mkdir");
        (
            Cgroups::V2(V2 {
                root: tmp.path().to_owned(),
            }),
            tmp.path().join("pod"),
            tmp.path().join("pod/ctr"),
        )
    };
    let idle = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    for dir in [&pod_dir, &ctr_dir] {
        if v1 {
            write(dir, "memory.limit_in_bytes", &(512 * MI).to_string());
        } else {
            write(dir, "memory.max", &(512 * MI).to_string());
            write(dir, "cpu.max", "max 100000");
            write(dir, "memory.reclaim", "");
            write(dir, "memory.pressure", idle);
            write(dir, "io.pressure", idle);
        }
    }
    let pod_max = pod_limit.map_or_else(|| "max".to_owned(), |l| (l * MI).to_string());
    if v1 {
        let unlimited = pod_limit.map_or(9_223_372_036_854_771_712, |l| l * MI);
        write(&pod_dir, "memory.limit_in_bytes", &unlimited.to_string());
    } else {
        write(&pod_dir, "memory.max", &pod_max);
    }
    let cfg = Config::parse(config, "test").expect("config");
    let state = NodeState::with_cgroups(cfg, Some(cgroups));
    let pod = Pod {
        id: "p".into(),
        namespace: "ns".into(),
        name: "p".into(),
        cgroup_parent: "/pod".into(),
        ..Pod::default()
    };
    let ctr = Container {
        id: "c".into(),
        pod_id: "p".into(),
        name: "app".into(),
        cgroups_path: "/pod/ctr".into(),
        state: ContainerState::Running,
        resources: Some(limit(512)),
        ..Container::default()
    };
    state.write_model(|m| {
        m.upsert_pod(pod.clone());
        m.upsert_container(ctr.clone());
    });
    let engine = Arc::new(Engine::new(
        state.clone(),
        RuntimeLink::default(),
        state.cgroups.clone(),
        NodeReader::new("/nonexistent/nri-resize-test-node"),
        None,
    ));
    Fixture {
        _tmp: tmp,
        pod_dir,
        ctr_dir,
        engine,
        pod,
        ctr,
    }
}

impl Fixture {
    fn ask(&self, mib: u64) -> Result<crate::nri::UpdateReply, crate::nri::Rejection> {
        self.engine.on_update(
            &self.pod,
            &self.ctr,
            &limit(mib),
            &Deadline::after(Duration::from_secs(2)),
        )
    }

    fn record(&self) -> (Option<ResizeState>, String) {
        let r = self.engine.container_resizes().remove("c").expect("record");
        (r.state, r.reason)
    }
}

/// Anonymous memory in the way: refused with the figures, nothing reclaimed, no reclaim left
/// running, and the answer carries no limit (kubelet would record it as actuated).
#[tokio::test]
async fn anonymous_memory_in_the_way_is_refused_with_its_figures() {
    let f = fixture(false, None, "");
    v2_memory(&f.ctr_dir, 310, 300, 10);
    let err = f.ask(100).expect_err("refused");
    assert_eq!(
        err.0,
        "memory decrease of ns/p/app refused: usage 310Mi above the requested limit 100Mi: 300Mi of anonymous memory cannot be reclaimed, and a limit below it would OOM-kill the container"
    );
    assert_eq!(f.record().0, Some(ResizeState::Deferred));
    assert!(f.engine.reclaims.toward_target("c").is_none());
    assert_eq!(
        std::fs::read_to_string(f.ctr_dir.join("memory.reclaim")).expect("read"),
        "",
        "nothing reclaimed"
    );
}

/// Page cache in the way (v2): refused, and reclaimed in the background; kubelet's retry is
/// answered with the progress while usage is above the limit, and goes through (the limit as
/// asked, no adjustment) once it fits.
#[tokio::test]
async fn page_cache_in_the_way_is_reclaimed_until_kubelets_retry_fits() {
    // No inline reclaim: the background reclaim does it all.
    let f = fixture(
        false,
        None,
        "[memory_decrease]\ninline_max = 0\ntimeout = \"60s\"\n",
    );
    v2_memory(&f.ctr_dir, 310, 20, 290);
    let err = f.ask(100).expect_err("refused");
    assert!(
        err.0.contains("290Mi of it is page cache")
            && err.0.contains("being reclaimed in the background"),
        "{}",
        err.0
    );
    assert_eq!(f.record().0, Some(ResizeState::InProgress));
    assert_eq!(f.engine.reclaims.toward_target("c"), Some(100 * MI));
    // The background reclaim asks the kernel (the fixture's takes nothing).
    for _ in 0..200 {
        if !std::fs::read_to_string(f.ctr_dir.join("memory.reclaim"))
            .expect("read")
            .is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !std::fs::read_to_string(f.ctr_dir.join("memory.reclaim"))
            .expect("read")
            .is_empty(),
        "the background reclaim asked the kernel"
    );
    assert_eq!(
        std::fs::read_to_string(f.ctr_dir.join("memory.max")).expect("read"),
        (512 * MI).to_string(),
        "no limit written"
    );
    // kubelet's retry while usage is above the limit: the progress, the reclaim goes on.
    let err = f.ask(100).expect_err("still refused");
    assert!(
        err.0.starts_with("memory decrease of ns/p/app refused: "),
        "{}",
        err.0
    );
    assert_eq!(f.engine.reclaims.toward_target("c"), Some(100 * MI));
    // The cache went: the retry goes through as asked.
    v2_memory(&f.ctr_dir, 90, 20, 70);
    let reply = f.ask(100).expect("applied at kubelet's retry");
    assert!(reply.updates.is_empty(), "no adjustment: {reply:?}");
    assert!(f.engine.reclaims.toward_target("c").is_none());
    assert_eq!(f.record().0, Some(ResizeState::InProgress));
    f.engine.shutdown().await;
}

/// A newer update while the page cache is reclaimed ends the reclaim and is decided anew.
#[tokio::test]
async fn a_newer_update_ends_the_background_reclaim() {
    let f = fixture(
        false,
        None,
        "[memory_decrease]\ninline_max = 0\ntimeout = \"60s\"\n",
    );
    v2_memory(&f.ctr_dir, 310, 20, 290);
    f.ask(100).expect_err("refused");
    assert!(f.engine.reclaims.toward_target("c").is_some());
    f.ask(400).expect("a limit above usage goes through");
    assert!(f.engine.reclaims.toward_target("c").is_none());
    f.engine.shutdown().await;
}

/// kubelet lowers the pod cgroup right after the container: a container decrease that fits
/// its own usage is refused when what is not page cache in the pod would not fit under the
/// lowered pod limit; it goes through when it fits.
#[tokio::test]
async fn the_pod_step_after_the_container_is_judged_with_it() {
    let f = fixture(false, Some(600), "");
    // The container fits 100Mi; the pod (600Mi → 188Mi) holds 250Mi outside page cache.
    v2_memory(&f.ctr_dir, 50, 50, 0);
    v2_memory(&f.pod_dir, 260, 250, 10);
    let err = f.ask(100).expect_err("refused for the pod step");
    assert_eq!(
        err.0,
        "resize of ns/p/app refused: the pod's memory that is not page cache (250Mi) does not fit under the pod limit kubelet writes right after this update (188Mi, now 600Mi): a pod cgroup below it would OOM-kill inside the pod"
    );
    assert_eq!(f.record().0, Some(ResizeState::Deferred));
    // What the pod holds outside page cache fits: through, the pod's cache reclaimed ahead.
    v2_memory(&f.pod_dir, 260, 150, 110);
    f.ask(100).expect("fits with the pod step");
    assert!(
        !std::fs::read_to_string(f.pod_dir.join("memory.reclaim"))
            .expect("read")
            .is_empty(),
        "the pod's page cache was reclaimed ahead of kubelet's pod write"
    );
    // A pod without a memory limit has no pod step.
    let f = fixture(false, None, "");
    v2_memory(&f.ctr_dir, 50, 50, 0);
    v2_memory(&f.pod_dir, 900, 900, 0);
    f.ask(100).expect("no pod limit, no pod step");
}

/// A pod cgroup that cannot be read: the decrease is refused (the pod write is unchecked).
#[tokio::test]
async fn an_unreadable_pod_cgroup_refuses_the_decrease() {
    let f = fixture(false, Some(600), "");
    v2_memory(&f.ctr_dir, 50, 50, 0);
    write(&f.pod_dir, "memory.current", "garbage");
    let err = f.ask(100).expect_err("refused");
    assert!(err.0.contains("the pod cgroup is unreadable"), "{}", err.0);
}

/// cgroup v1: the inline passes lower the container's limit toward the target; when usage
/// does not come down the update is refused and the limit its spec says is put back.
#[tokio::test]
async fn v1_inline_passes_put_the_limit_back_when_refused() {
    let f = fixture(true, None, "");
    write(&f.ctr_dir, "memory.usage_in_bytes", &(310 * MI).to_string());
    write(
        &f.ctr_dir,
        "memory.stat",
        &format!(
            "total_rss {}\ntotal_shmem 0\ntotal_cache {}\n",
            20 * MI,
            290 * MI
        ),
    );
    let err = f.ask(100).expect_err("refused");
    assert!(
        err.0.contains("kubelet's next try reclaims it again"),
        "{}",
        err.0
    );
    assert_eq!(
        std::fs::read_to_string(f.ctr_dir.join("memory.limit_in_bytes")).expect("read"),
        (512 * MI).to_string(),
        "the limit the spec says is back"
    );
    assert!(
        f.engine.reclaims.toward_target("c").is_none(),
        "no background reclaim on v1"
    );
}

/// An upgrade with old annotations: a pod annotated `memory-decrease.nri-resize.io/pod: reject`
/// before the values were respelled (2026-11-25) is refused exactly as one annotated `Reject`
/// (same state, same refusal, nothing reclaimed), its reason naming the deprecated spelling;
/// not staged under the node default `Reclaim` as a malformed value is.
#[tokio::test]
async fn an_old_spelling_is_refused_exactly_as_the_current_one() {
    struct Outcome {
        error: String,
        state: Option<ResizeState>,
        reason: String,
        reclaiming: bool,
    }
    async fn decrease_with(value: &str) -> Outcome {
        let mut f = fixture(
            false,
            None,
            "[memory_decrease]\ninline_max = 0\ntimeout = \"60s\"\n",
        );
        f.pod.annotations.insert(
            crate::policy::POD_DECREASE_ANNOTATION.to_owned(),
            value.to_owned(),
        );
        // Page cache in the way: what `Reclaim` would reclaim.
        v2_memory(&f.ctr_dir, 310, 20, 290);
        let error = f.ask(100).expect_err("refused").0;
        let (state, reason) = f.record();
        let reclaiming = f.engine.reclaims.toward_target("c").is_some();
        assert_eq!(
            std::fs::read_to_string(f.ctr_dir.join("memory.max")).expect("read"),
            (512 * MI).to_string(),
            "{value}: no limit written"
        );
        f.engine.shutdown().await;
        Outcome {
            error,
            state,
            reason,
            reclaiming,
        }
    }
    let current = decrease_with("Reject").await;
    let earlier = decrease_with("reject").await;
    let note = "; annotation memory-decrease.nri-resize.io/pod: \"reject\" is the deprecated spelling of \"Reject\", read as \"Reject\"; write \"Reject\"";
    assert!(
        current.error.contains("strategy reject"),
        "{}",
        current.error
    );
    assert_eq!(earlier.error, format!("{}{note}", current.error));
    assert_eq!(earlier.reason, format!("{}{note}", current.reason));
    assert_eq!(earlier.state, current.state);
    assert!(
        !current.reclaiming && !earlier.reclaiming,
        "refused, not staged"
    );
    // A value that is no spelling at all falls back to the node default (Reclaim): staged.
    let malformed = decrease_with("Rejected").await;
    assert!(malformed.reclaiming, "{}", malformed.error);
    assert_ne!(malformed.state, None);
}
