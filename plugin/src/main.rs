//! `nri-resize`: the daemon (`run`) and its command-line client (`status`, `resizes`, `events`,
//! `update`, `config`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use nri_resize::api::ApiClient;
use nri_resize::daemon::{self, Exit, ObserverOptions, RunOptions, EXIT_DISCONNECTED};
use nri_resize::model::{CpuResources, LinuxResources, MemoryResources};
use nri_resize::nri::PluginIdentity;
use nri_resize::observer::{
    CgroupLayout, ObjectSource, ObserverSettings, OomStrategy, ReclaimStrategy, ThrottleStrategy,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

const DEFAULT_API_SOCKET: &str = "/run/nri-resize/api.sock";

/// `--version`: the release and the commit it was built from (`plugin/build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NRI_RESIZE_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "nri-resize",
    version = VERSION,
    about = "containerd NRI plugin for safe, observable in-place pod resize"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the plugin daemon.
    Run(RunArgs),
    /// Resize a whole pod in place, in KEP order, behind the API server's back:
    /// `nri-resize resize default/web app=cpu=1500m,memory=512Mi`.
    ///
    /// For the real thing use `kubectl patch pod <pod> --subresource resize`: kubelet does not
    /// know about a resize made here.
    Resize {
        #[command(flatten)]
        api: ApiArgs,
        /// `namespace/name` of the pod.
        pod: String,
        /// `container=cpu=<q>,memory=<q>` per container to change, in Kubernetes quantities
        /// (CPU: 1500m or 1.5; memory: 512Mi, 1.5Gi, 1048576), as `status` prints them.
        #[arg(required = true)]
        containers: Vec<String>,
    },
    /// Show pods and containers as the plugin sees them.
    Status {
        #[command(flatten)]
        api: ApiArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Refresh at this interval (`2s`, `500ms`, `1m`; default 2s) until Ctrl-C: the table
        /// redrawn on a cleared screen, or one JSON document per line with `--json`.
        #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "2s", value_parser = parse_interval)]
        watch: Option<Duration>,
    },
    /// List the resize records: per container desired / allocated / actual, state, reason, when
    /// it last changed and the verdict; then the whole-pod resizes.
    Resizes {
        #[command(flatten)]
        api: ApiArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show the latest NRI events the plugin received.
    Events {
        #[command(flatten)]
        api: ApiArgs,
        /// Only events with a sequence number above this.
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// Print one JSON document per event instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Ask the runtime, through NRI, to update one container's resources, behind the API
    /// server's back.
    ///
    /// For the real thing use `kubectl patch pod <pod> --subresource resize`: kubelet does not
    /// know about an update made here.
    Update {
        #[command(flatten)]
        api: ApiArgs,
        /// The container: its id, or `namespace/pod/container` as `nri-resize status` shows it.
        container: String,
        /// CPU limit, a Kubernetes quantity (`1500m`, `1.5`), or `unlimited`; sets the CFS quota
        /// over the period (`--cpu-period`, else 100ms).
        #[arg(long, value_parser = parse_cpu_limit, conflicts_with = "cpu_quota")]
        cpu_limit: Option<CpuLimit>,
        /// CPU request, a Kubernetes quantity (`250m`); sets the CPU shares as kubelet does.
        #[arg(long, value_parser = parse_cpu_request, conflicts_with = "cpu_shares")]
        cpu_request: Option<u64>,
        /// CFS quota in microseconds per period (-1: unlimited).
        #[arg(long, allow_hyphen_values = true)]
        cpu_quota: Option<i64>,
        /// CFS period in microseconds.
        #[arg(long)]
        cpu_period: Option<u64>,
        /// CPU shares.
        #[arg(long)]
        cpu_shares: Option<u64>,
        /// Memory limit, a Kubernetes quantity (`512Mi`, `1.5Gi`, bytes) or `unlimited`.
        #[arg(long, value_parser = parse_memory_limit, allow_hyphen_values = true)]
        memory_limit: Option<i64>,
    },
    /// Configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Read a configuration file as `run --config` does: exit 0 if the daemon would start with
    /// it, non-zero with the key and line at fault if not. Values that cannot be meant (a
    /// reserve no node has, `512m` bytes) are warned about, with their line, and pass.
    Check {
        /// The configuration file (TOML), or with `--values` the Helm chart's values file.
        file: PathBuf,
        /// FILE is the Helm chart's values file (YAML): its `config:` (with `mode` and
        /// `kubeletConfigFile`) is checked as the chart writes it into the daemon's TOML.
        #[arg(long)]
        values: bool,
    },
    /// Print the default configuration as TOML, every key written out.
    Default,
}

#[derive(Debug, Args)]
struct ApiArgs {
    /// The daemon's status API socket.
    #[arg(long, env = "NRI_RESIZE_API_SOCKET", default_value = DEFAULT_API_SOCKET)]
    api_socket: PathBuf,
}

#[derive(Debug, Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent command-line switches, as clap flags"
)]
struct RunArgs {
    /// containerd's NRI socket.
    #[arg(
        long,
        env = "NRI_RESIZE_NRI_SOCKET",
        default_value = "/var/run/nri/nri.sock"
    )]
    nri_socket: PathBuf,
    /// Name to register with.
    #[arg(long, env = "NRI_RESIZE_PLUGIN_NAME", default_value = "nri-resize")]
    plugin_name: String,
    /// Invocation index, two digits; lower runs first.
    #[arg(long, env = "NRI_RESIZE_PLUGIN_IDX", default_value = "50")]
    plugin_idx: String,
    /// Plugin configuration file (TOML); the runtime's plugin config, if any, overrides it.
    #[arg(long, env = "NRI_RESIZE_CONFIG")]
    config: Option<PathBuf>,
    /// Root of the cgroup filesystem.
    #[arg(long, env = "NRI_RESIZE_CGROUP_ROOT", default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
    /// Status API socket.
    #[arg(long, env = "NRI_RESIZE_API_SOCKET", default_value = DEFAULT_API_SOCKET)]
    api_socket: PathBuf,
    /// Where in-flight resizes are checkpointed (created 0700 if absent).
    #[arg(
        long,
        env = "NRI_RESIZE_STATE_DIR",
        default_value = "/var/lib/nri-resize"
    )]
    state_dir: PathBuf,
    /// Exit with status 3 when the runtime connection is lost instead of reconnecting.
    #[arg(long, env = "NRI_RESIZE_EXIT_ON_DISCONNECT")]
    exit_on_disconnect: bool,
    /// Log format.
    #[arg(long, env = "NRI_RESIZE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// How often the observer reads every container's counters (e.g. `1s`, `500ms`).
    #[arg(long, env = "NRI_RESIZE_OBSERVER_INTERVAL", default_value = "1s", value_parser = parse_interval)]
    observer_interval: Duration,
    /// Start the throttling probe at this strategy (`fentry`, `tp_btf_sched_switch`, `cpu_stat_polling`):
    /// to exercise the fallbacks, or to count per task on a kernel without trampolines
    /// (`tp_btf_sched_switch`, never chosen by default: it runs on every context switch).
    #[arg(long, env = "NRI_RESIZE_OBSERVER_FORCE_THROTTLE")]
    observer_force_throttle: Option<ThrottleStrategy>,
    /// Measure reclaim by polling `memory.stat` instead of the memcg tracepoints.
    #[arg(long, env = "NRI_RESIZE_OBSERVER_FORCE_RECLAIM")]
    observer_force_reclaim: bool,
    /// Count OOM kills by polling `memory.events` / `memory.oom_control` instead of `tp_btf/mark_victim`.
    #[arg(long, env = "NRI_RESIZE_OBSERVER_FORCE_OOM")]
    observer_force_oom: bool,
    /// Load no eBPF at all: every measurement polls cgroup files.
    #[arg(long, env = "NRI_RESIZE_NO_EBPF")]
    no_ebpf: bool,
    /// The running kernel's BTF: the kernel's own, or an external file for the same kernel
    /// (from a BTF archive, or extracted with `pahole`) on nodes without `/sys/kernel/btf/vmlinux`.
    /// Missing: every measurement polls cgroup files, said in the log, `/readyz` and `status`.
    #[arg(
        long,
        env = "NRI_RESIZE_BTF_PATH",
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    btf_path: PathBuf,
    /// Where to serve /metrics, /healthz and /readyz (port 0: any free port, logged and shown
    /// in `status`); `off` disables it. Given more than once, the last one wins.
    #[arg(long, env = "NRI_RESIZE_METRICS_ADDR", default_value = "0.0.0.0:9464", value_parser = parse_metrics_addr, overrides_with = "metrics_addr")]
    metrics_addr: MetricsAddr,
}

#[derive(Debug, Clone, Copy)]
struct MetricsAddr(Option<SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|e| format!("{s:?} is not host:port or `off`: {e}"))
}

/// A humantime duration (`1s`, `500ms`, `1m 30s`), the configuration's one form; at least 10ms.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime_serde::re::humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 2s or 500ms: {e}"))?;
    if d < Duration::from_millis(10) {
        return Err(format!("{s:?} is shorter than 10ms"));
    }
    Ok(d)
}

/// A CPU limit for `update --cpu-limit`: millicores, or `None` for unlimited.
#[derive(Debug, Clone, Copy)]
struct CpuLimit(Option<u64>);

fn parse_cpu_limit(s: &str) -> Result<CpuLimit, String> {
    if s == "unlimited" || s == "max" {
        return Ok(CpuLimit(None));
    }
    nri_resize::policy::parse_cpu(s)
        .map(|m| CpuLimit(Some(m)))
        .map_err(|e| e.to_string())
}

fn parse_cpu_request(s: &str) -> Result<u64, String> {
    nri_resize::policy::parse_cpu(s).map_err(|e| e.to_string())
}

/// A memory limit for `update --memory-limit`: bytes, `-1` for `unlimited` (or `max`, `-1`).
fn parse_memory_limit(s: &str) -> Result<i64, String> {
    if matches!(s, "unlimited" | "max" | "-1") {
        return Ok(-1);
    }
    let bytes = nri_resize::policy::parse_memory(s).map_err(|e| e.to_string())?;
    i64::try_from(bytes).map_err(|_| format!("{s:?} is too large"))
}

/// What `resize` and `update` tell a person before they act: the API server is not asked.
const BEHIND_THE_API_SERVER: &str = "nri-resize: warning: this changes the pod behind the API server's back; kubelet will not know (the pod spec and status keep the old resources). Use `kubectl patch pod <pod> --subresource resize` for the real thing.";

/// An error for a person: each cause of the chain once. A cause whose text its parent already
/// includes (thiserror's `{source}` in a message) is not repeated.
fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NRI_RESIZE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// First SIGTERM/SIGINT: graceful stop; a second one: immediate exit.
fn spawn_signal_handler(cancel: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::spawn(async move {
        for round in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if round == 0 {
                info!("signal received; shutting down (send again to force)");
                cancel.cancel();
            } else {
                warn!("second signal; exiting now");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    init_tracing(args.log_format == "json");
    let cancel = CancellationToken::new();
    spawn_signal_handler(cancel.clone())?;
    let mut settings = ObserverSettings::host();
    settings.cgroups = CgroupLayout::detect(&args.cgroup_root);
    settings.btf = args.btf_path;
    if args.no_ebpf {
        settings.object = ObjectSource::None;
        settings.hotplug = false;
    }
    settings.force_throttle = args.observer_force_throttle;
    settings.force_reclaim = args
        .observer_force_reclaim
        .then_some(ReclaimStrategy::MemoryStatPolling);
    settings.force_oom = args
        .observer_force_oom
        .then_some(OomStrategy::MemoryEventsPolling);
    let opts = RunOptions {
        state_dir: args.state_dir,
        identity: PluginIdentity {
            socket: args.nri_socket,
            name: args.plugin_name,
            idx: args.plugin_idx,
        },
        config_path: args.config,
        cgroup_root: args.cgroup_root,
        api_socket: args.api_socket,
        exit_on_disconnect: args.exit_on_disconnect,
        observer: ObserverOptions {
            settings,
            interval: args.observer_interval,
        },
        metrics_addr: args.metrics_addr.0,
    };
    match daemon::run(opts, cancel).await? {
        Exit::Stopped => {
            info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Exit::Disconnected => Ok(ExitCode::from(u8::try_from(EXIT_DISCONNECTED).unwrap_or(1))),
    }
}

fn fmt_resources(r: Option<&LinuxResources>) -> (String, String) {
    let Some(r) = r else {
        return ("-".into(), "-".into());
    };
    let cpu = match (r.cpu_quota(), r.cpu_period(), r.cpu_shares()) {
        (Some(q), Some(p), s) if q > 0 && p > 0 => format!(
            "{}m ({q}/{p}) sh={}",
            r.cpu_limit_millis().unwrap_or(0),
            s.map_or("-".into(), |s| s.to_string())
        ),
        (_, _, Some(s)) => format!("unlimited sh={s}"),
        _ => "-".into(),
    };
    let mem = nri_resize::policy::memory_limit_exact_text(r.memory_limit().unwrap_or(-1));
    (cpu, mem)
}

/// One status rendering: pretty JSON, one-line JSON (for `--watch --json`), or the table.
async fn status_once(api: &ApiArgs, json: bool, one_line: bool) -> anyhow::Result<String> {
    let client = ApiClient::new(&api.api_socket);
    let status = client.status().await?;
    if json {
        let text = if one_line {
            serde_json::to_string(&status)?
        } else {
            serde_json::to_string_pretty(&status)?
        };
        return Ok(text + "\n");
    }
    let resizes = client.resizes().await.unwrap_or_default();
    Ok(nri_resize::api::render_status(
        &status,
        &resizes,
        nri_resize::cgroup::page_size(),
        nri_resize::clock::now_ms(),
    ))
}

/// `status --watch`: redraws every `every` until Ctrl-C (exit 0). A daemon that cannot be
/// reached is shown as such and retried, not fatal.
async fn watch_status(api: &ApiArgs, json: bool, every: Duration) -> anyhow::Result<()> {
    const CLEAR: &str = "\x1b[2J\x1b[H";
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One listener for the whole watch: a Ctrl-C while a frame is fetched or drawn is kept, not
    // lost between two listeners.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = tick.tick() => {}
        }
        let fetched = tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            r = status_once(api, json, true) => r,
        };
        let body = match fetched {
            Ok(text) => text,
            Err(e) if json => {
                eprintln!("nri-resize: {}", error_text(&e));
                continue;
            }
            Err(e) => format!("nri-resize: {}\n", error_text(&e)),
        };
        if json {
            out(&body)?;
        } else {
            out(&format!(
                "{CLEAR}every {:.1}s  {}\n\n{body}",
                every.as_secs_f64(),
                api.api_socket.display()
            ))?;
        }
    }
}

async fn resize_command(api: &ApiArgs, pod: &str, containers: &[String]) -> anyhow::Result<()> {
    let (namespace, name) = pod
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("pod must be namespace/name, got {pod:?}"))?;
    eprintln!("{BEHIND_THE_API_SERVER}");
    let mut req = nri_resize::resize::PodResizeRequest::default();
    for spec in containers {
        let (container, target) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("{spec:?}: expected container=cpu=..,memory=.."))?;
        let target = nri_resize::api::parse_target(target)
            .map_err(|e| anyhow::anyhow!("{container}: {e}"))?;
        req.containers.insert(container.to_string(), target);
    }
    let done = ApiClient::new(&api.api_socket)
        .resize_pod(namespace, name, &req)
        .await?;
    let mut text = String::new();
    for (i, s) in done.steps.iter().enumerate() {
        let _ = writeln!(
            text,
            "step {}: {}{}",
            i + 1,
            s.step,
            if s.ok {
                String::new()
            } else {
                format!(" FAILED: {}", s.error)
            }
        );
    }
    let _ = writeln!(text, "resized {pod} in {} steps", done.steps.len());
    out(&text)?;
    Ok(())
}

/// Writes `text` to standard output at once. A reader that went away (`| head`) is a
/// `BrokenPipe` error, which ends the command quietly ([`ends_quietly`]).
fn out(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// Whether `err` is standard output closed by its reader (`nri-resize status --watch | head`):
/// the command then ends with status 0 and says nothing, as `cat` and `yes` do under a shell
/// that ignores SIGPIPE.
fn ends_quietly(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `config check`: the verdict on stdout, warnings (like errors) on stderr with their place.
fn config_check(file: &std::path::Path, values: bool) -> anyhow::Result<()> {
    use nri_resize::config_check::{check_file, check_values_on, Machine};
    let checked = if values {
        check_values_on(file, Machine::this())?
    } else {
        check_file(file)?
    };
    let shown = file.display().to_string();
    for w in &checked.warnings {
        eprintln!("{}", w.render(&shown));
    }
    match checked.warnings.len() {
        0 => out(&format!("{shown}: ok\n"))?,
        n => out(&format!(
            "{shown}: ok, with {n} warning{}\n",
            if n == 1 { "" } else { "s" }
        ))?,
    }
    Ok(())
}

/// `resizes`: the records joined with the status (pod names, actual values).
async fn resizes_command(api: &ApiArgs, json: bool) -> anyhow::Result<()> {
    let client = ApiClient::new(&api.api_socket);
    let status = client.status().await?;
    let resizes = client.resizes().await?;
    let records = nri_resize::api::resize_records(&status, &resizes);
    if json {
        out(&(serde_json::to_string_pretty(&records)? + "\n"))?;
    } else {
        out(&nri_resize::api::render_resizes(
            &records,
            nri_resize::clock::now_ms(),
        ))?;
    }
    Ok(())
}

async fn client_command(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run(_) => unreachable!("handled by main"),
        Command::Config(ConfigCommand::Check { file, values }) => config_check(&file, values)?,
        Command::Config(ConfigCommand::Default) => out(&nri_resize::config::default_toml())?,
        Command::Status { api, json, watch } => match watch {
            None => out(&status_once(&api, json, false).await?)?,
            Some(every) => watch_status(&api, json, every).await?,
        },
        Command::Resizes { api, json } => resizes_command(&api, json).await?,
        Command::Events { api, since, json } => {
            let events = ApiClient::new(&api.api_socket).events(since).await?;
            let mut text = String::new();
            for e in &events {
                if json {
                    text.push_str(&serde_json::to_string(e)?);
                    text.push('\n');
                } else {
                    let (cpu, mem) = fmt_resources(e.resources.as_ref());
                    let _ = writeln!(
                        text,
                        "{:>6} {:<24} {:<40} {:<20} cpu={cpu} mem={mem}",
                        e.seq,
                        e.event.as_str(),
                        e.pod,
                        e.container
                    );
                }
            }
            out(&text)?;
        }
        Command::Resize {
            api,
            pod,
            containers,
        } => resize_command(&api, &pod, &containers).await?,
        Command::Update {
            api,
            container,
            cpu_limit,
            cpu_request,
            cpu_quota,
            cpu_period,
            cpu_shares,
            memory_limit,
        } => {
            let period = cpu_period.unwrap_or(nri_resize::policy::DEFAULT_CFS_PERIOD_US);
            let cpu_quota = cpu_limit.map_or(cpu_quota, |CpuLimit(limit)| {
                Some(limit.map_or(-1, |m| {
                    i64::try_from(m.saturating_mul(period) / 1000).unwrap_or(i64::MAX)
                }))
            });
            let cpu_period = cpu_period.or(cpu_limit.map(|_| period));
            let cpu_shares = cpu_request
                .map(nri_resize::policy::millis_to_shares)
                .or(cpu_shares);
            let cpu =
                (cpu_quota.is_some() || cpu_period.is_some() || cpu_shares.is_some()).then(|| {
                    CpuResources {
                        quota: cpu_quota,
                        period: cpu_period,
                        shares: cpu_shares,
                        ..Default::default()
                    }
                });
            let memory = memory_limit.map(|l| MemoryResources {
                limit: Some(l),
                ..Default::default()
            });
            anyhow::ensure!(
                cpu.is_some() || memory.is_some(),
                "nothing to update: give --cpu-limit, --cpu-request, --memory-limit, --cpu-quota, --cpu-period or --cpu-shares"
            );
            let client = ApiClient::new(&api.api_socket);
            let id = nri_resize::api::resolve_container(&client.status().await?, &container)?;
            eprintln!("{BEHIND_THE_API_SERVER}");
            let res = LinuxResources {
                cpu,
                memory,
                ..Default::default()
            };
            let result = client.update_resources(&id, &res).await?;
            if !result.failed.is_empty() {
                anyhow::bail!("the runtime could not apply the update to {container}");
            }
            if id == container {
                out(&format!("updated {container}\n"))?;
            } else {
                out(&format!("updated {container} ({id})\n"))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // Before the runtime's threads start (see `nri_resize::arena`).
    let one_arena = nri_resize::arena::one_arena();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nri-resize: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !one_arena {
        eprintln!(
            "nri-resize: glibc refused mallopt(M_ARENA_MAX, 1); malloc keeps an arena per thread"
        );
    }
    runtime.block_on(cli_main())
}

async fn cli_main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        other => client_command(other).await,
    };
    match result {
        Ok(code) => code,
        Err(err) if ends_quietly(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("nri-resize: {}", error_text(&err));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// Every subcommand and every argument a person can type has help text, all the way down.
    #[test]
    fn every_subcommand_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_name() != "help" && sub.get_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "nri-resize", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:?}");
        // The walk sees what it should: a nested subcommand's argument and a flattened one.
        let names = |c: &clap::Command| {
            c.get_subcommands()
                .map(|s| s.get_name().to_string())
                .collect::<Vec<_>>()
        };
        assert!(names(&cmd).contains(&"config".to_string()));
        let update = cmd.find_subcommand("update").expect("update");
        assert!(update.get_arguments().any(|a| a.get_id() == "api_socket"));
    }

    #[test]
    fn a_closed_stdout_ends_quietly_and_nothing_else_does() {
        let pipe = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("status");
        assert!(ends_quietly(&pipe));
        let other = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(!ends_quietly(&other));
        assert!(!ends_quietly(&anyhow::anyhow!(
            "broken pipe, in words only"
        )));
    }

    #[test]
    fn the_version_carries_the_commit() {
        let version = Cli::command().render_version();
        assert_eq!(
            version.trim(),
            format!(
                "nri-resize {} (commit {})",
                env!("CARGO_PKG_VERSION"),
                env!("NRI_RESIZE_COMMIT")
            )
        );
        assert!(!env!("NRI_RESIZE_COMMIT").is_empty());
    }

    #[test]
    fn an_error_reads_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let inner = anyhow::Error::from(nri_resize::api::ClientError::Connect {
            path: "/run/x.sock".into(),
            source: io,
        });
        let text = error_text(&inner);
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
        let outer = inner.context("status");
        assert!(
            error_text(&outer).starts_with("status: cannot reach"),
            "{}",
            error_text(&outer)
        );
    }

    #[test]
    fn durations_and_quantities_on_the_command_line() {
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("1m 30s"), Ok(Duration::from_secs(90)));
        for bad in ["2", "5ms", "soon", ""] {
            assert!(parse_interval(bad).is_err(), "{bad:?}");
        }
        let cli = Cli::try_parse_from(["nri-resize", "status", "--watch", "2s"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Status { watch: Some(d), .. } if d == Duration::from_secs(2)
        ));
        let cli = Cli::try_parse_from(["nri-resize", "status", "--watch"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Status { watch: Some(d), .. } if d == Duration::from_secs(2)
        ));
        assert_eq!(parse_memory_limit("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_memory_limit("unlimited"), Ok(-1));
        assert!(parse_memory_limit("12Xi").is_err());
        assert_eq!(parse_cpu_request("250m"), Ok(250));
        assert!(matches!(parse_cpu_limit("1.5"), Ok(CpuLimit(Some(1500)))));
        assert!(matches!(parse_cpu_limit("unlimited"), Ok(CpuLimit(None))));
    }
}
