//! The command line of drainshim-bench: the benchmark subcommands and the
//! demo. `drainshim bench <command>` and `drainshim demo` run this binary
//! with the same arguments (`bench` left out), so flags, help and exit codes
//! are the ones users know.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::reconnect;
use drainshim::cli::logging::LogFormat;
use drainshim::cli::{emit, Format, MaxAgeArgs, EXIT_CODES};
use drainshim::config::Span;
use drainshim::error::Error;
use drainshim::sidecar::sigterm::sigterms;

#[derive(Debug, Parser)]
#[command(
    name = "drainshim-bench",
    // The drainshim library it was built with: its version, commit and features.
    version = drainshim::cli::VERSION,
    about = "drainshim's benchmarks and demo (run as `drainshim bench <command>` and `drainshim demo`)",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// Log filter (tracing-subscriber syntax), e.g. `info` or `drainshim=debug`.
    /// Default: `info` (`warn` for the demo).
    #[arg(long, env = "DRAINSHIM_LOG", global = true)]
    pub log: Option<String>,

    /// How log lines on stderr are written: `text` for people, or `json`,
    /// one JSON object per line.
    #[arg(long, env = "DRAINSHIM_LOG_FORMAT", global = true, value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start: the size of the biggest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Bench(BenchCommand),

    /// Run the main job end to end on this machine: real Envoy, gRPC streams,
    /// a drain, then the restart.
    #[command(after_help = EXIT_CODES)]
    Demo(DemoArgs),
}

// === impl Command ===

impl Command {
    /// The name `drainshim` gives the command, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Bench(_) => "bench",
            Command::Demo(_) => "demo",
        }
    }

    /// The runtime the command runs on: `bench relay` gets one thread (the
    /// guard's default, to compare with); others one per core.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self {
            Command::Bench(b) if b.single_threaded() => {
                tokio::runtime::Builder::new_current_thread()
            }
            _ => tokio::runtime::Builder::new_multi_thread(),
        };
        builder.enable_all().build()
    }

    /// The log filter without `--log`: the demo talks to a person, so only
    /// warnings from the library.
    pub fn default_log(&self) -> &'static str {
        match self {
            Command::Demo(_) => "warn",
            Command::Bench(_) => "info",
        }
    }

    /// False when a benchmark that judges found what it must not (exit 1).
    pub async fn run(self) -> Result<bool, Error> {
        match self {
            Command::Bench(b) => b.run().await,
            Command::Demo(a) => a.run().await.map(|()| true),
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The Envoy binary (default: the project's cached 1.40.0, then `envoy` on PATH).
    #[arg(long, env = "DRAINSHIM_ENVOY")]
    pub envoy: Option<std::path::PathBuf>,

    /// How many long-lived streams to hold open, over two pods.
    #[arg(long, env = "DRAINSHIM_STREAMS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(2..=10_000))]
    pub streams: u64,

    /// Where to write the reconnect plot.
    #[arg(long, env = "DRAINSHIM_PLOT", default_value = "drainshim-demo.svg")]
    pub plot: std::path::PathBuf,

    /// The long-lived streams: gRPC, WebSockets, or half of each.
    #[arg(long, env = "DRAINSHIM_PROTOCOL", value_enum, default_value = "mixed")]
    pub protocol: crate::population::Protocol,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// A tonic streaming backend that stamps every message with a sequence number.
    #[command(after_help = EXIT_CODES)]
    Server(BenchServerArgs),

    /// Restart one of two pods under N long-lived streams and measure, from
    /// the client side, what each way of restarting costs.
    #[command(
        long_about = "Restart one of two pods under N long-lived streams and measure what it costs.\n\n\
            Each pod is a real Envoy inbound in front of the tonic bench backend (in drainshim mode \
            with a drainshim sidecar and its stream guard between them). Clients reconnect with \
            backoff when a stream ends, like real gRPC clients. Per mode it reports streams ended \
            gracefully and cut, messages lost, reconnect latency p50/p99, and the reconnect storm \
            (peak over mean reconnects per 100 ms). With --soak it instead holds the population for \
            that long under --max-connection-age and reports the steady-state reconnect rate.\n\n\
            Exits 1 when drainshim mode cut a stream, lost a message, or found one that had gone \
            around the guard (BYPASSED: Envoy's fail-open path); the baselines cut by design.",
        after_help = EXIT_CODES
    )]
    Reconnect(ReconnectArgs),

    /// The node agent with N pod namespaces: discovery time, RSS, idle CPU.
    #[command(
        long_about = "The node agent with N pod namespaces.\n\n\
            Creates N network namespaces, each with a light admin stand-in for Envoy \
            (`bench admin-stub`, run under the process name `envoy`), starts the real \
            `drainshim node` on a private view of /proc holding just those processes, and \
            reports the time until every pod is inventoried (version read from inside its \
            namespace, preStop listener bound), the agent's RSS, the time of one /metrics \
            scrape, and the agent's idle CPU. Needs root; removes everything it created.",
        after_help = "Exit codes:\n  0   measured\n  64  usage error\n  69  the benchmark could not run (not root, no `ip`, a pod not found)"
    )]
    NodeScale(NodeScaleArgs),

    /// A light stand-in for Envoy's admin API (used by node-scale).
    #[command(hide = true, after_help = EXIT_CODES)]
    AdminStub(AdminStubArgs),

    /// The bench app for both populations on one port: the gRPC streaming
    /// backend (h2c) and a WebSocket ticker/echo (`GET /tick?id=&interval_ms=&size=`).
    #[command(after_help = EXIT_CODES)]
    App(BenchAppArgs),

    /// A byte-copy TCP relay on one thread: the floor under any proxy hop.
    #[command(
        long_about = "A byte-copy TCP relay on one thread: the floor under any proxy hop.\n\n\
            Each accepted connection gets its own connection to --upstream, and bytes are copied \
            both ways until either side closes; nothing is parsed. The guard benchmark runs it \
            beside the guard and Envoy, so their throughput against direct can be read against \
            the least a hop that reads one socket and writes another costs on the same machine.",
        after_help = EXIT_CODES
    )]
    Relay(BenchRelayArgs),

    /// The fleet tools against a simulated fleet's ten weeks of history,
    /// on Prometheus and VictoriaMetrics.
    #[command(
        long_about = "The fleet tools against a simulated fleet's ten weeks of history, on \
            Prometheus and on VictoriaMetrics.\n\n\
            Writes the series the shims export for --pods pods of --services services in \
            --namespaces namespaces over a ten-week migration (four tiers; a max connection age \
            per tier; a restart to 1.39 in which one tier's wave stalls for three days; the \
            control plane to 1.40; a restart to 1.40 in which the last tier's wave cuts streams), \
            loads it into a real Prometheus (promtool's backfill) and a real VictoriaMetrics (its \
            import), then runs inventory, skew, verify and plan (at three moments) against each \
            store. Per command and store it reports wall time, peak RSS, queries and bytes \
            answered.\n\n\
            Exits 1 when a command's JSON differs between the stores, or the plan does not name \
            the stalled wave, the control plane's point of no return and the failed verify at \
            their moments. Needs the stores from `make tools`; several GB of disk at 2,400 pods.",
        after_help = "Exit codes:\n  0   measured, and every judgement held\n  1   a judgement failed (printed)\n  64  usage error\n  69  a store could not be started or loaded"
    )]
    Fleet(FleetArgs),

    /// The sidecar binary under streams recycled by max age for minutes, its
    /// memory and descriptors sampled: a leak shows as growth per stream.
    #[command(
        long_about = "The sidecar binary under streams recycled by max age, its memory and \
            descriptors sampled over time.\n\n\
            One pod: a real Envoy in front, the drainshim binary beside this one run as `drainshim sidecar` with its \
            stream guard and --max-connection-age, the bench app behind it, no fail-open path and \
            no retry. --streams WebSockets are held through Envoy; each is ended gracefully at \
            its connection's max age and reconnects at once, so every recycled stream is a new \
            connection through Envoy and the guard. Every --sample-every the sidecar's /proc is \
            read (RSS, open descriptors, threads) against the streams recycled so far. The report \
            gives the growth per 10^5 recycled streams after a warm-up (a fifth of the run), and \
            the descriptors once the clients left against the idle sidecar's.\n\n\
            Exits 1 when a stream was cut or a message lost, RSS grew more than 8 MiB per 10^5 \
            streams, or more than 4 descriptors stayed open. `bench reconnect --soak` instead \
            measures the reconnect rate and storm of an in-process sidecar.\n\n\
            --node soaks the node agent instead (root: it makes network namespaces): --pods pods, \
            each a network namespace with the bench app and an admin stand-in for Envoy, their \
            guards served by one `drainshim node` agent with the same max connection age, the \
            clients at the pods' addresses. Every --drain-every one pod in turn is taken out of \
            the clients' rotation, drained through the agent's API, removed and replaced by a new \
            pod, as a rollout does; a drain that cut or bypassed a stream fails the run. The \
            agent's /proc is sampled.",
        after_help = "Exit codes:\n  0   measured, and the run held\n  1   a stream was cut, a message lost, or the sidecar grew (printed)\n  64  usage error\n  69  Envoy or the sidecar could not be started"
    )]
    Soak(SoakArgs),
}

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// The Envoy binary (default: the project's cached 1.40.0, then `envoy` on PATH).
    #[arg(long, env = "DRAINSHIM_ENVOY")]
    pub envoy: Option<std::path::PathBuf>,

    /// WebSockets held at once; each recycled stream is also a new connection.
    #[arg(long, env = "DRAINSHIM_STREAMS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(1..=20_000))]
    pub streams: u64,

    /// How long to hold them (e.g. `3m`, `24h`): the longest the run takes.
    #[arg(long, env = "DRAINSHIM_DURATION", default_value = "3m")]
    pub duration: Span,

    /// Stop early, at the first sample with at least this many streams
    /// recycled (e.g. 100000). The growth is read over the samples after the
    /// warm-up (a fifth of them) and judged on 50,000 streams or more.
    #[arg(long, env = "DRAINSHIM_UNTIL_RECYCLED",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub until_recycled: Option<u64>,

    /// The sidecar's --max-connection-age: how often each stream is recycled
    /// (jittered +/-10%).
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE", default_value = "1s")]
    pub max_connection_age: Span,

    /// Time between two samples of the sidecar's /proc.
    #[arg(long, env = "DRAINSHIM_SAMPLE_EVERY", default_value = "5s")]
    pub sample_every: Span,

    /// Soak the node agent instead of the sidecar (root).
    #[arg(long)]
    pub node: bool,

    /// With --node: pods served by the agent.
    #[arg(long, env = "DRAINSHIM_PODS", default_value_t = 4, requires = "node",
          value_parser = clap::value_parser!(u64).range(2..=64))]
    pub pods: u64,

    /// With --node: one pod drained and replaced this often.
    #[arg(
        long,
        env = "DRAINSHIM_DRAIN_EVERY",
        default_value = "1m",
        requires = "node"
    )]
    pub drain_every: Span,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct FleetArgs {
    /// Pods in the fleet (each a sidecar shim, scraped as its own instance).
    #[arg(long, env = "DRAINSHIM_PODS", default_value_t = 2400,
          value_parser = clap::value_parser!(u64).range(8..=100_000))]
    pub pods: u64,

    /// Services, spread over the namespaces; each pod serves one.
    #[arg(long, env = "DRAINSHIM_SERVICES", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(4..=100_000))]
    pub services: u64,

    /// Namespaces, in four tiers (2%, 18%, 40%, 40%; at least one each).
    #[arg(long, env = "DRAINSHIM_NAMESPACES", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(4..=10_000))]
    pub namespaces: u64,

    /// Time between the history's samples (1m to 30m). The stores look back
    /// one and a half of it for a series' last sample.
    #[arg(long, env = "DRAINSHIM_INTERVAL", default_value = "10m")]
    pub interval: Span,

    /// The stores to load; repeatable (default: both).
    #[arg(long, env = "DRAINSHIM_STORE", value_enum, value_delimiter = ',',
          default_values_t = [crate::fleet::store::StoreKind::Prometheus, crate::fleet::store::StoreKind::VictoriaMetrics])]
    pub store: Vec<crate::fleet::store::StoreKind>,

    /// Keep the history, the stores' data and their logs in this directory
    /// (default: a temporary one, removed at the end).
    #[arg(long, env = "DRAINSHIM_KEEP", value_name = "DIR")]
    pub keep: Option<PathBuf>,

    /// Another `drainshim` binary (an earlier build): every `plan` is run
    /// with it too, right after this build's on the same store, labelled
    /// "[compared]": a before and after of the same run.
    #[arg(long, env = "DRAINSHIM_COMPARE_BINARY", value_name = "PATH")]
    pub compare_binary: Option<PathBuf>,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

impl BenchCommand {
    /// Whether the command runs on one thread (the relays, to compare with
    /// the guard's default of one).
    pub fn single_threaded(&self) -> bool {
        matches!(self, BenchCommand::Relay(_))
    }
}

#[derive(Debug, Args)]
pub struct ReconnectArgs {
    /// The Envoy binary (default: the project's cached 1.40.0, then `envoy` on PATH).
    #[arg(long, env = "DRAINSHIM_ENVOY")]
    pub envoy: Option<std::path::PathBuf>,

    /// Long-lived streams, spread over both pods.
    #[arg(long, env = "DRAINSHIM_STREAMS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(2..=20_000))]
    pub streams: u64,

    /// Which restarts to measure; repeatable (default: all three).
    #[arg(long, env = "DRAINSHIM_MODE", value_enum, value_delimiter = ',')]
    pub mode: Vec<reconnect::Mode>,

    /// The long-lived streams: gRPC server streams, WebSockets (HTTP/1.1
    /// Upgrade; the guard ends them with Close 1012), or half of each. Each
    /// kind gets its own result row.
    #[arg(long, env = "DRAINSHIM_PROTOCOL", value_enum, default_value = "grpc")]
    pub protocol: crate::population::Protocol,

    /// drainshim mode: time for callers to drop the endpoint.
    #[arg(long, env = "DRAINSHIM_DEREGISTRATION_DELAY", default_value_t = reconnect::DEFAULT_DEREGISTRATION_DELAY)]
    pub deregistration_delay: Span,

    /// drainshim mode: streams are ended gracefully before this.
    #[arg(long, env = "DRAINSHIM_DRAIN_TIME", default_value_t = reconnect::DEFAULT_DRAIN_TIME)]
    pub drain_time: Span,

    /// drainshim mode: hard deadline.
    #[arg(long, env = "DRAINSHIM_PARENT_SHUTDOWN_TIME", default_value_t = reconnect::DEFAULT_PARENT_SHUTDOWN_TIME)]
    pub parent_shutdown_time: Span,

    /// The guard's max connection age, grace and spread (drainshim mode and --soak).
    #[command(flatten)]
    pub max_age: MaxAgeArgs,

    /// Instead of a restart, hold the population this long under
    /// --max-connection-age and report the steady-state reconnect rate.
    #[arg(long, env = "DRAINSHIM_SOAK", requires = "max_connection_age")]
    pub soak: Option<Span>,

    /// Message sizes in bytes, comma-separated: stream i gets the i-th size
    /// in turn (e.g. `1,1000,16385,100000,1048576` mixes small and 1 MiB
    /// messages, which span many HTTP/2 frames). At most 1 MiB each.
    #[arg(long, env = "DRAINSHIM_PAYLOAD_BYTES", value_delimiter = ',', default_value = "64",
          value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    pub payload_bytes: Vec<u32>,

    /// How often each stream's server sends a message (1ms to 1m). The
    /// whole population carries streams / tick messages per second through
    /// both pods: when that saturates the machine, the table's CPU_BUSY
    /// column says so, and reconnect times and the storm measure the
    /// machine rather than the restart. Quiet streams (e.g. `--tick 1s`)
    /// let one machine hold thousands.
    #[arg(long, env = "DRAINSHIM_TICK", default_value_t = reconnect::DEFAULT_TICK)]
    pub tick: Span,

    /// How long the streams run before the restart [default: 20 ticks, at
    /// least 1s]. The guard ends a quiet stream between two of its writes
    /// once it has learned the stream's cadence (about fifteen steady
    /// gaps), and right after its next write until then: young streams
    /// that write in step end in step.
    #[arg(long, env = "DRAINSHIM_WARMUP")]
    pub warmup: Option<Span>,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,

    /// Write reconnects over time per mode as an SVG plot.
    #[arg(long, env = "DRAINSHIM_PLOT")]
    pub plot: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchServerArgs {
    /// Address to serve gRPC (h2c) on.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
}

#[derive(Debug, Args)]
pub struct BenchRelayArgs {
    /// Address to accept connections on.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,

    /// Where every connection is relayed to.
    #[arg(long, env = "DRAINSHIM_UPSTREAM", default_value = "127.0.0.1:50051")]
    pub upstream: SocketAddr,
}

#[derive(Debug, Args)]
pub struct NodeScaleArgs {
    /// Pod namespaces to create.
    #[arg(long, env = "DRAINSHIM_PODS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub pods: u64,

    /// How long to watch the idle agent's CPU (two scans at the default 5 s).
    #[arg(long, env = "DRAINSHIM_IDLE_WINDOW", default_value = "10s")]
    pub idle_window: Span,

    /// Give every pod a stream guard: the agent's RSS and idle CPU with them,
    /// and unary throughput and p99 through the agent against one sidecar
    /// guard per pod (and straight to the app) at the same offered load.
    #[arg(long)]
    pub guards: bool,

    /// With --guards: offered unary calls per second, over all pods.
    #[arg(
        long,
        env = "DRAINSHIM_RATE",
        default_value_t = 2000.0,
        requires = "guards"
    )]
    pub rate: f64,

    /// With --guards: how long each load phase runs.
    #[arg(
        long,
        env = "DRAINSHIM_LOAD_DURATION",
        default_value = "10s",
        requires = "guards"
    )]
    pub load_duration: Span,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct BenchAppArgs {
    /// Address to serve gRPC and WebSocket on.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
}

#[derive(Debug, Args)]
pub struct AdminStubArgs {
    /// Address to serve on (inside the pod's namespace).
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:15000")]
    pub listen: SocketAddr,

    /// Node metadata NAMESPACE to report.
    #[arg(long, env = "DRAINSHIM_NAMESPACE", default_value = "bench")]
    pub namespace: String,

    /// Node metadata NAME to report.
    #[arg(long, env = "DRAINSHIM_POD", default_value = "pod")]
    pub pod: String,

    /// Envoy release to report.
    #[arg(long, env = "DRAINSHIM_VERSION", default_value = "1.40.0")]
    pub version: String,
}

// === running the bench commands ===

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(e.to_string())
}

/// Waits for the first SIGTERM or Ctrl-C.
fn first_signal() -> Result<impl std::future::Future<Output = ()>, Error> {
    let mut signals = sigterms()?;
    Ok(async move {
        let _ = signals.recv().await;
    })
}

/// The `drainshim` binary beside this one: the sidecar, the agent and the
/// fleet commands the benchmarks measure.
fn drainshim_binary() -> Result<PathBuf, Error> {
    crate::drainshim_binary().map_err(Error::Unavailable)
}

/// This binary, linked as `envoy` to run the admin stand-ins (`admin-stub`)
/// under the process name the node agent looks for.
fn this_binary() -> Result<PathBuf, Error> {
    std::env::current_exe().map_err(|e| Error::Internal(format!("finding this executable: {e}")))
}

fn envoy_binary(given: Option<PathBuf>) -> Result<PathBuf, Error> {
    given
        .map_or_else(crate::envoy::default_binary, Ok)
        .map_err(unavailable)
}

impl DemoArgs {
    pub async fn run(self) -> Result<(), Error> {
        let opts = crate::demo::DemoOptions {
            envoy: envoy_binary(self.envoy)?,
            streams: self.streams as usize,
            plot: self.plot,
            protocol: self.protocol,
        };
        crate::demo::run(opts).await.map_err(unavailable)
    }
}

impl ReconnectArgs {
    fn options(&self) -> Result<reconnect::ReconnectOptions, Error> {
        let mut opts = reconnect::ReconnectOptions::new(envoy_binary(self.envoy.clone())?);
        opts.streams = self.streams as usize;
        opts.protocol = self.protocol;
        if !self.mode.is_empty() {
            opts.modes = self.mode.clone();
        }
        opts.deregistration_delay = self.deregistration_delay.get();
        opts.drain_time = self.drain_time.get();
        opts.parent_shutdown_time = self.parent_shutdown_time.get();
        opts.max_connection_age = self.max_age.max_connection_age.map(Span::get);
        opts.max_connection_age_grace = self.max_age.max_connection_age_grace.get();
        opts.max_connection_age_spread = self.max_age.max_connection_age_spread.get();
        opts.payload_bytes = self.payload_bytes.clone();
        opts.tick = self.tick.get();
        opts.warmup = self.warmup.map(Span::get);
        opts.validate()?;
        Ok(opts)
    }

    /// Whether drainshim mode held: nothing cut, bypassed or lost.
    async fn run(self) -> Result<bool, Error> {
        let opts = self.options()?;
        if let Some(d) = self.soak {
            let r = reconnect::soak(&opts, d.get()).await.map_err(unavailable)?;
            emit(self.format, &r, || r.render());
            return Ok(true);
        }
        let results = reconnect::run(&opts).await.map_err(unavailable)?;
        emit(self.format, &results, || {
            crate::measure::render_table(&results)
        });
        if let Some(path) = self.plot {
            crate::measure::plot(&results, &path).map_err(unavailable)?;
            eprintln!(
                "drainshim bench reconnect: plot written to {}",
                path.display()
            );
        }
        for w in crate::measure::saturation_warnings(&results) {
            eprintln!("drainshim bench reconnect: warning: {w}");
        }
        let failures = crate::measure::drainshim_failures(&results);
        for f in &failures {
            eprintln!("drainshim bench reconnect: FAILED: {f}");
        }
        Ok(failures.is_empty())
    }
}

impl BenchCommand {
    /// False when a benchmark that judges found what it must not (exit 1).
    pub async fn run(self) -> Result<bool, Error> {
        match self {
            BenchCommand::Reconnect(a) => a.run().await,
            BenchCommand::NodeScale(a) if a.guards => {
                let binary = drainshim_binary()?;
                let opts = crate::node_guard::NodeGuardOptions {
                    pods: a.pods as usize,
                    idle_window: a.idle_window.get(),
                    binary,
                    stub: this_binary()?,
                    rate: a.rate,
                    load_duration: a.load_duration.get(),
                };
                let report = crate::node_guard::run(opts).await.map_err(unavailable)?;
                emit(a.format, &report, || report.render());
                Ok(true)
            }
            BenchCommand::NodeScale(a) => {
                let binary = drainshim_binary()?;
                let opts = crate::node_scale::NodeScaleOptions {
                    pods: a.pods as usize,
                    idle_window: a.idle_window.get(),
                    binary,
                    stub: this_binary()?,
                };
                let report = crate::node_scale::run(opts).await.map_err(unavailable)?;
                emit(a.format, &report, || report.render());
                Ok(true)
            }
            BenchCommand::App(a) => {
                let listener = bind(a.listen).await?;
                let ledger = crate::ws::WsLedger::default();
                crate::ws::serve_mixed(listener, ledger, first_signal()?).await;
                Ok(true)
            }
            BenchCommand::AdminStub(a) => {
                let listener = bind(a.listen).await?;
                let id = crate::admin_stub::StubIdentity {
                    version: a.version,
                    namespace: a.namespace,
                    pod: a.pod,
                };
                let stop = tokio_util::sync::CancellationToken::new();
                let signal = first_signal()?;
                let s = stop.clone();
                tokio::spawn(async move {
                    signal.await;
                    s.cancel();
                });
                crate::admin_stub::serve(listener, id, stop).await;
                Ok(true)
            }
            BenchCommand::Relay(a) => {
                let listener = bind(a.listen).await?;
                crate::relay::serve(listener, a.upstream, first_signal()?).await;
                Ok(true)
            }
            BenchCommand::Fleet(a) => {
                let binary = drainshim_binary()?;
                let opts = crate::fleet::FleetBenchOptions {
                    pods: a.pods as usize,
                    services: a.services as usize,
                    namespaces: a.namespaces as usize,
                    interval: a.interval.get(),
                    stores: a.store.clone(),
                    binary,
                    keep: a.keep.clone(),
                    compare: a.compare_binary.clone(),
                };
                let report = crate::fleet::run(opts).await.map_err(unavailable)?;
                emit(a.format, &report, || report.render());
                Ok(report.ok())
            }
            BenchCommand::Soak(a) => {
                let binary = drainshim_binary()?;
                if a.max_connection_age.get().is_zero() || a.sample_every.get().is_zero() {
                    return Err(Error::Usage(
                        "--max-connection-age and --sample-every must be greater than zero".into(),
                    ));
                }
                let opts = crate::soak::SoakOptions {
                    envoy: envoy_binary(a.envoy.clone())?,
                    binary,
                    stub: this_binary()?,
                    streams: a.streams as usize,
                    duration: a.duration.get(),
                    until_recycled: a.until_recycled,
                    max_connection_age: a.max_connection_age.get(),
                    sample_every: a.sample_every.get(),
                    progress: true,
                    drain_every: a.drain_every.get(),
                };
                if a.drain_every.get() < std::time::Duration::from_secs(5) {
                    return Err(Error::Usage(
                        "--drain-every: at least 5s (a drain and a new pod take seconds)".into(),
                    ));
                }
                let report = if a.node {
                    crate::soak_node::run(&opts, a.pods as usize).await
                } else {
                    crate::soak::run(&opts).await
                }
                .map_err(unavailable)?;
                emit(a.format, &report, || report.render());
                Ok(report.ok())
            }
            BenchCommand::Server(a) => crate::server::run(a.listen, first_signal()?)
                .await
                .map(|()| true)
                .map_err(unavailable),
        }
    }
}

/// The benches' stand-in apps listen as a Go or Java server does, with the
/// backlog of `net.core.somaxconn`, not tokio's 128.
async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    drainshim::guard::bind_listener(addr)
        .map_err(|e| Error::Unavailable(format!("bind {addr}: {e}")))
}
