//! `drainshim inject` and `drainshim webhook`: the sidecar Components' change
//! to a pod, offline on manifests or online as a mutating admission webhook.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Span;
use crate::error::Error;
use crate::inject::manifest::{self, Direction};
use crate::inject::{webhook, InjectOptions, Mode, DEFAULT_IMAGE};

pub const INJECT_LONG_ABOUT: &str = "Add drainshim to the pods of Kubernetes manifests, offline.\n\n\
    Reads multi-document YAML or a List (a file, or stdin) and writes it to stdout with every pod \
    template of a Deployment, StatefulSet, DaemonSet, ReplicaSet or ReplicationController, and every \
    bare Pod, given what the sidecar Component of --mode gives it (deploy/components/sidecar or \
    native-sidecar): the install init container and its volume, the drainshim container, Envoy with \
    its fail-open bootstrap, both preStop hooks, the grace period. Other objects pass through; Jobs, \
    CronJobs and pods with restartPolicy Never or OnFailure are not injected (they run to completion).\n\n\
    The app is the pod's first container (Istio's proxy aside). Its port comes from the pod annotation \
    drainshim.io/app-port, else from the container's one TCP port. A workload or pod labelled or \
    annotated drainshim.io/inject: \"false\" (or disabled) is left as it is.\n\n\
    Injecting twice gives what injecting once gives; the pod records what it replaced in the \
    annotation drainshim.io/injected, and --uninject puts it back. A pod that cannot be injected \
    safely (no single app port, a preStop of the app's own, a name or port drainshim's containers \
    take, the node's network, Istio's proxy in the pod outside --mode istio, a pod-wide root user or a \
    non-Linux pod, an app port whose name says it is not HTTP: tcp-*, tls-*, https-*, redis, mysql, \
    mongo) is refused: every refusal is \
    printed, naming its object, nothing is written, and the exit code is 64.\n\n\
    What was done to each workload is printed on stderr. Envoy's inbound port takes the name of the \
    app's port, and the app's port takes app-<number> (its container's probes and hooks follow): a \
    Service that targets the app's port by name reaches Envoy on injected pods, and the app on pods \
    without drainshim. Point a Service that targets it by number at the name, or let --services do \
    it. Envoy and drainshim get CPU and memory limits; the pod annotations \
    drainshim.io/proxy-cpu-limit, proxy-memory-limit (Envoy), cpu-limit and memory-limit \
    (drainshim) set its own.\n\n\
    Under Istio (--mode istio), istio-proxy gets the preStop (a container, or with native sidecars \
    an init container; Istio's own drain hook is replaced, and put back by --uninject) and the pod \
    Istio's proxy settings and excluded port (never Istio's injection label: the pod must be one \
    Istio injects); the Services keep the app's port. \
    The pod's label \
    drainshim.io/app-port selects the mesh's routing objects (`drainshim istio-routing`), which send \
    Istio's inbound traffic for that port through the guard.";

pub const INJECT_EXIT_CODES: &str = "\
Exit codes:
  0   written to stdout
  64  bad input, or a pod that cannot be injected safely (each named on stderr; nothing written)";

/// What an injection adds, for `inject` and `webhook` alike.
#[derive(Debug, clap::Args)]
pub struct InjectionArgs {
    /// Which sidecar Component's change to make: `sidecar` (containers, any
    /// Kubernetes), `native-sidecar` (restartable init containers, 1.29+) or
    /// `istio` (beside Istio's injected proxy). The webhook uses `istio` for
    /// its Istio path and for pods Istio injects, whatever this says.
    #[arg(long, env = "DRAINSHIM_MODE", value_enum, default_value_t = Mode::Sidecar)]
    pub mode: Mode,

    /// The drainshim image the pods get.
    #[arg(long, env = "DRAINSHIM_IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,

    /// Envoy's image (default: the Component's).
    #[arg(long, env = "DRAINSHIM_ENVOY_IMAGE")]
    pub envoy_image: Option<String>,
}

impl InjectionArgs {
    fn settings(&self) -> InjectOptions {
        InjectOptions {
            mode: self.mode,
            image: self.image.clone(),
            envoy_image: self.envoy_image.clone(),
            services: false,
            await_istio: false,
            revision: None,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct InjectArgs {
    /// The manifests: a file, or `-` for stdin.
    #[arg(
        short = 'f',
        long = "filename",
        default_value = "-",
        value_name = "FILE"
    )]
    pub filename: PathBuf,

    #[command(flatten)]
    pub injection: InjectionArgs,

    /// Undo: remove what an injection added and restore what it replaced.
    #[arg(long)]
    pub uninject: bool,

    /// Also point the Services of the same manifests at Envoy: each port
    /// that targets the app's port by number, of the injected pods it
    /// selects, gets the name of Envoy's inbound port (the app's port name,
    /// or envoy-inbound where it had none). A Service that also selects pods
    /// without drainshim is left as it is. With --uninject, they point back.
    #[arg(long)]
    pub services: bool,

    /// Also annotate each injected pod drainshim.io/revision=NAME, as the
    /// webhook of that revision does (manifests rendered for the namespaces
    /// a revision serves). Every injected pod is annotated
    /// drainshim.io/version, this release, with or without it.
    #[arg(long, value_name = "NAME", value_parser = revision_name)]
    pub revision: Option<String>,
}

/// A revision's name as a namespace label value carries it.
fn revision_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a revision name: lower case letters, digits and '-', at most 63, as the \
             label drainshim.io/rev carries it"
        ))
    }
}

impl InjectArgs {
    /// Reads, transforms, writes; prints one line per workload on stderr.
    pub fn run(&self) -> Result<(), Error> {
        let mut input = String::new();
        let read = if self.filename.as_os_str() == "-" {
            std::io::stdin().read_to_string(&mut input).map(|_| ())
        } else {
            std::fs::read_to_string(&self.filename).map(|s| input = s)
        };
        read.map_err(|e| Error::Usage(format!("reading {}: {e}", self.filename.display())))?;
        if self.services && self.injection.mode == Mode::Istio {
            return Err(Error::Usage(
                "--services does not apply to --mode istio: under Istio the Services keep the app's port, \
                 which Istio's inbound listener captures (drainshim istio-routing sends it through the guard)"
                    .into(),
            ));
        }
        let action = if self.uninject {
            Direction::Uninject
        } else {
            Direction::Inject
        };
        match manifest::transform(
            &input,
            &InjectOptions {
                services: self.services,
                revision: self.revision.clone(),
                ..self.injection.settings()
            },
            action,
        ) {
            Ok((out, lines)) => {
                for l in &lines {
                    eprintln!("drainshim inject: {}: {}", l.object, l.what);
                }
                print!("{out}");
                Ok(())
            }
            Err(errors) => {
                for e in &errors {
                    eprintln!("drainshim inject: {e}");
                }
                Err(Error::Usage(format!(
                    "{} refused; nothing written",
                    if errors.len() == 1 {
                        "1 object".to_string()
                    } else {
                        format!("{} objects", errors.len())
                    }
                )))
            }
        }
    }
}

pub const WEBHOOK_LONG_ABOUT: &str =
    "A mutating admission webhook that adds drainshim to pods as they are created.\n\n\
    Serves AdmissionReview v1 on POST /inject over HTTPS (--listen), with the change `drainshim \
    inject --mode` makes, as a JSON Patch; /inject/istio for namespaces Istio injects and \
    /inject/no-istio for those whose istio-injection is not enabled, where the Istio mode is taken \
    only for pods Istio injects, never asked for. It never blocks a pod: a review it cannot read, a kind \
    other than Pod, or a pod it cannot inject safely is allowed unchanged, with a warning in the \
    response (kubectl prints it), a log line, and drainshim_webhook_reviews_total{outcome}.\n\n\
    The certificate and key are read again when the files change (cert-manager's Secret, mounted), \
    and a pair that does not load leaves the previous one serving. Plain HTTP on --metrics-listen: \
    GET /metrics, /healthz, /readyz (503 once SIGTERM arrived, or while the serving certificate \
    is past its notAfter). A body not read within --body-timeout is answered 408; past \
    --max-connections a connection is reset, past --max-in-flight a review is answered 429 with \
    Retry-After (the API server retries both). On SIGTERM it keeps answering for \
    --shutdown-delay, while the API server stops calling this replica, then exits 0.\n\n\
    Which namespaces and pods it sees is the MutatingWebhookConfiguration's (deploy/webhook): \
    drainshim.io/inject=enabled on a namespace, or drainshim.io/rev=<--revision>, and not pods \
    labelled drainshim.io/inject: \"false\".";

#[derive(Debug, clap::Args)]
pub struct WebhookArgs {
    /// HTTPS: the API server's admission reviews (POST /inject).
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// The serving certificate chain (PEM).
    #[arg(
        long,
        env = "DRAINSHIM_TLS_CERT",
        default_value = "/etc/drainshim/webhook/tls.crt"
    )]
    pub tls_cert: PathBuf,

    /// The serving certificate's private key (PEM).
    #[arg(
        long,
        env = "DRAINSHIM_TLS_KEY",
        default_value = "/etc/drainshim/webhook/tls.key"
    )]
    pub tls_key: PathBuf,

    /// How often the certificate files are checked for a change.
    #[arg(long, env = "DRAINSHIM_TLS_RELOAD_INTERVAL", default_value = "5s")]
    pub tls_reload_interval: Span,

    /// Plain HTTP: /metrics, /healthz, /readyz.
    #[arg(
        long,
        env = "DRAINSHIM_METRICS_LISTEN",
        default_value = "0.0.0.0:15090"
    )]
    pub metrics_listen: SocketAddr,

    #[command(flatten)]
    pub injection: InjectionArgs,

    /// The revision this webhook serves (drainshim.io/rev=<name> on a
    /// namespace); a label on its metrics.
    #[arg(long, env = "DRAINSHIM_REVISION", default_value = crate::inject::DEFAULT_REVISION)]
    pub revision: String,

    /// After SIGTERM, how long to keep answering before exiting.
    #[arg(long, env = "DRAINSHIM_SHUTDOWN_DELAY", default_value = "5s")]
    pub shutdown_delay: Span,

    /// A review whose body has not arrived whole by then is answered 408
    /// and its connection closed.
    #[arg(long, env = "DRAINSHIM_BODY_TIMEOUT", default_value = "10s")]
    pub body_timeout: Span,

    /// HTTPS connections open at once; one more is reset at accept (the API
    /// server retries it).
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTIONS", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_connections: u16,

    /// Reviews read and answered at once; one more is answered 429 with
    /// Retry-After (the API server retries it).
    #[arg(long, env = "DRAINSHIM_MAX_IN_FLIGHT", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_in_flight: u16,
}

impl WebhookArgs {
    /// Serves until SIGTERM (or Ctrl-C), then `--shutdown-delay` more.
    pub async fn run(&self) -> Result<(), Error> {
        if self.tls_reload_interval.get() < Duration::from_millis(100) {
            return Err(Error::Usage("--tls-reload-interval: at least 100ms".into()));
        }
        let settings = self.injection.settings();
        let cert = webhook::Certificate::load(&self.tls_cert, &self.tls_key)
            .map(Arc::new)
            .map_err(|e| Error::Usage(format!("the serving certificate: {e}")))?;
        let tls = webhook::tls_config(cert.clone()).map_err(Error::Internal)?;
        let bind = |addr: SocketAddr, flag: &str| {
            let flag = flag.to_owned();
            async move {
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| Error::Unavailable(format!("{flag} {addr}: {e}")))
            }
        };
        let https = bind(self.listen, "--listen").await?;
        let metrics = bind(self.metrics_listen, "--metrics-listen").await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Error::Os(format!("installing the SIGTERM handler: {e}")))?;
        let limits = webhook::WebhookLimits {
            body_timeout: self.body_timeout.get(),
            max_connections: self.max_connections.into(),
            max_in_flight: self.max_in_flight.into(),
        };
        let hook =
            Arc::new(webhook::Webhook::new(settings, self.revision.clone()).with_limits(limits));
        hook.set_certificate(cert.clone());
        let stop = tokio_util::sync::CancellationToken::new();
        let serving = tokio::spawn(webhook::serve(https, tls, hook.clone(), stop.clone()));
        let metrics = tokio::spawn(webhook::serve_metrics(metrics, hook.clone(), stop.clone()));
        tokio::spawn(webhook::watch(
            cert,
            hook.clone(),
            self.tls_reload_interval.get(),
            stop.clone(),
        ));
        tracing::info!(
            listen = %self.listen, metrics = %self.metrics_listen, mode = hook.settings.mode.name(),
            image = %hook.settings.image, revision = %self.revision, "webhook: ready"
        );
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        hook.set_draining();
        tracing::info!(delay = ?self.shutdown_delay.get(), "webhook: SIGTERM: answering until the delay is over, then exiting");
        tokio::time::sleep(self.shutdown_delay.get()).await;
        stop.cancel();
        let _ = serving.await;
        let _ = metrics.await;
        Ok(())
    }
}

pub const ISTIO_ROUTING_LONG_ABOUT: &str = "\
Writes the Istio objects that send each app port's inbound traffic through drainshim's guard, \
for every pod injected with --mode istio (or by the webhook in a namespace Istio injects): one \
EnvoyFilter per port, selecting pods by their label drainshim.io/app-port. None names a \
workload, so a namespace adopts drainshim with its label alone, and its default Sidecar keeps \
scoping its pods' egress.\n\n\
Each EnvoyFilter makes Istio's inbound cluster of that port two priorities, the guard and then \
the app itself, with a health check, outlier detection and a retry that fail open to the app \
within a second while the guard is down (deploy/istio-routing/template.yaml says what it relies \
on). Apply the output once per mesh, in Istio's root namespace, and again whenever a port is \
added: a pod whose app port has no object here is injected, but Istio sends its traffic \
straight to the app, so its streams are not ended gracefully (its shim shows drainshim_guard_paths \
0, and the alert DrainshimGuardNotInPath fires).";

#[derive(Debug, clap::Args)]
pub struct IstioRoutingArgs {
    /// The app ports of the workloads to inject, comma-separated (each pod's
    /// drainshim.io/app-port).
    #[arg(long, value_delimiter = ',', required = true, value_name = "PORT,...")]
    pub ports: Vec<u16>,

    /// The namespace of the objects: Istio's root namespace applies them to
    /// pods of every namespace; any other namespace, to its own pods only.
    #[arg(long, default_value = "istio-system")]
    pub namespace: String,
}

impl IstioRoutingArgs {
    pub fn run(&self) -> Result<(), Error> {
        let out = crate::inject::routing::render(&self.ports, &self.namespace)
            .map_err(|e| Error::Usage(format!("--ports: {e}")))?;
        print!("{out}");
        Ok(())
    }
}
