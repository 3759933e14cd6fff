//! `nri-resize`: the daemon (`run`) and its command-line client (`status`, `events`, `update`).

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

#[derive(Debug, Parser)]
#[command(
    name = "nri-resize",
    version,
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
    /// Resize a whole pod in place, in KEP order: `nri-resize resize default/web app=cpu=1500m,memory=512Mi`.
    Resize {
        #[command(flatten)]
        api: ApiArgs,
        /// `namespace/name` of the pod.
        pod: String,
        /// `container=cpu=<q>,memory=<q>` per container to change (CPU: 1500m or 1.5; memory: 512Mi, 2Gi, bytes).
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
        /// Refresh every N seconds (default 2) until Ctrl-C: the table redrawn on a cleared
        /// screen, or one JSON document per line with `--json`.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2", value_parser = parse_interval)]
        watch: Option<Duration>,
    },
    /// Show the latest NRI events the plugin received.
    Events {
        #[command(flatten)]
        api: ApiArgs,
        /// Only events with a sequence number above this.
        #[arg(long, default_value_t = 0)]
        since: u64,
        #[arg(long)]
        json: bool,
    },
    /// Ask the runtime, through NRI, to update one container's resources.
    Update {
        #[command(flatten)]
        api: ApiArgs,
        /// Container id (as in `nri-resize status`).
        container: String,
        /// CFS quota in microseconds per period (-1: unlimited).
        #[arg(long, allow_hyphen_values = true)]
        cpu_quota: Option<i64>,
        /// CFS period in microseconds.
        #[arg(long)]
        cpu_period: Option<u64>,
        /// CPU shares.
        #[arg(long)]
        cpu_shares: Option<u64>,
        /// Memory limit in bytes.
        #[arg(long)]
        memory_limit: Option<i64>,
    },
    /// Configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Read a configuration file as `run --config` does: exit 0 if the daemon would start with
    /// it, non-zero with the key and line at fault if not.
    Check {
        /// The configuration file (TOML).
        file: PathBuf,
    },
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
    /// Start the throttling probe at this strategy (`fentry`, `tp_btf_sched_switch`, `cpu_stat_polling`),
    /// to exercise the fallbacks.
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

/// `1s`, `500ms`, `2.5s` or a bare number of seconds; at least 10 ms.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(ms) = s.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(sec) = s.strip_suffix('s') {
        (sec, 1.0)
    } else {
        (s, 1.0)
    };
    let secs = num
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("{s:?} is not a duration like 1s or 500ms"))?
        * scale;
    if !secs.is_finite() || secs < 0.01 {
        return Err(format!("observer interval {s:?} must be at least 10ms"));
    }
    Ok(Duration::from_secs_f64(secs))
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
    let mem = match r.memory_limit() {
        Some(l) if l > 0 => format!("{}Mi", l >> 20),
        _ => "unlimited".into(),
    };
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
    let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    Ok(nri_resize::api::render_status(
        &status,
        &resizes,
        page_size,
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
                eprintln!("nri-resize: {e:#}");
                continue;
            }
            Err(e) => format!("nri-resize: {e:#}\n"),
        };
        let mut out = std::io::stdout().lock();
        if json {
            out.write_all(body.as_bytes())?;
        } else {
            write!(
                out,
                "{CLEAR}every {:.1}s  {}\n\n{body}",
                every.as_secs_f64(),
                api.api_socket.display()
            )?;
        }
        out.flush()?;
    }
}

async fn resize_command(api: &ApiArgs, pod: &str, containers: &[String]) -> anyhow::Result<()> {
    let (namespace, name) = pod
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("pod must be namespace/name, got {pod:?}"))?;
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
    for (i, s) in done.steps.iter().enumerate() {
        println!(
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
    println!("resized {pod} in {} steps", done.steps.len());
    Ok(())
}

async fn client_command(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run(_) => unreachable!("handled by main"),
        Command::Config(ConfigCommand::Check { file }) => {
            nri_resize::config_check::check_file(&file)?;
            println!("{}: ok", file.display());
        }
        Command::Status { api, json, watch } => match watch {
            None => print!("{}", status_once(&api, json, false).await?),
            Some(every) => watch_status(&api, json, every).await?,
        },
        Command::Events { api, since, json } => {
            let events = ApiClient::new(&api.api_socket).events(since).await?;
            for e in &events {
                if json {
                    println!("{}", serde_json::to_string(e)?);
                } else {
                    let (cpu, mem) = fmt_resources(e.resources.as_ref());
                    println!(
                        "{:>6} {:<24} {:<40} {:<20} cpu={cpu} mem={mem}",
                        e.seq,
                        e.event.as_str(),
                        e.pod,
                        e.container
                    );
                }
            }
        }
        Command::Resize {
            api,
            pod,
            containers,
        } => resize_command(&api, &pod, &containers).await?,
        Command::Update {
            api,
            container,
            cpu_quota,
            cpu_period,
            cpu_shares,
            memory_limit,
        } => {
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
                "nothing to update: give --cpu-quota, --cpu-period, --cpu-shares or --memory-limit"
            );
            let res = LinuxResources {
                cpu,
                memory,
                ..Default::default()
            };
            let result = ApiClient::new(&api.api_socket)
                .update_resources(&container, &res)
                .await?;
            if !result.failed.is_empty() {
                anyhow::bail!("the runtime could not apply the update to {container}");
            }
            println!("updated {container}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        other => client_command(other).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("nri-resize: {err:#}");
            ExitCode::FAILURE
        }
    }
}
