//! `drainshim webhook`: a mutating admission webhook that injects pods as
//! they are created, with the transform `drainshim inject` applies offline.
//!
//! It never blocks a pod. Whatever it cannot handle (a malformed review, a
//! kind other than Pod, a pod it cannot inject safely) is allowed unchanged,
//! with a warning the API server passes on to the client (`kubectl` prints
//! it), a log line and `drainshim_webhook_reviews_total{outcome}`. The
//! MutatingWebhookConfiguration adds the rest (deploy/webhook): failurePolicy
//! Ignore, a short timeout, the namespace and object selectors.
//!
//! HTTPS with rustls; the certificate and key are read again whenever the
//! files change (cert-manager rotates the Secret; the kubelet swaps the
//! mounted files), and a pair that does not load keeps the previous one.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use kube_core::admission::{AdmissionResponse, AdmissionReview, Operation};
use kube_core::DynamicObject;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::manifest::{pod_patch, Direction};
use super::mesh::{self, Choice, Declined, Namespace};
use super::{InjectOptions, Mode, PodChange, PodRefusal};
use crate::http::server::{json, not_allowed, openmetrics, serve_connection, serve_fn, text};

pub use super::certificate::{not_after, tls_config, Certificate};

/// The path the MutatingWebhookConfiguration calls for namespaces without
/// Istio's labels (Istio injects only the pods that ask for it by label).
pub const PATH: &str = "/inject";
/// The path of its webhooks for namespaces Istio injects: the Istio mode,
/// but for a pod that opts out of Istio's injection.
pub const PATH_ISTIO: &str = "/inject/istio";
/// The path for namespaces whose `istio-injection` label is not `enabled`
/// (`disabled`): Istio injects none of their pods, so none takes the Istio
/// mode; one that asks for Istio is told why.
pub const PATH_NO_ISTIO: &str = "/inject/no-istio";
/// An AdmissionReview of a Pod is a few KiB; the API server caps requests at 3 MiB.
const MAX_REVIEW_BYTES: usize = 3 << 20;
/// A client that opens a connection and says nothing is dropped after this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How much the server takes on at once, and for how long. The defaults fit
/// the Deployment's 128 Mi: reviews in flight times the body cap (3 MiB, and
/// a few times that once parsed) stays well under it, and each open
/// connection holds only TLS and HTTP buffers (tens of KiB).
#[derive(Clone, Copy, Debug)]
pub struct WebhookLimits {
    /// A body not read whole by then is cut: a client that sends headers and
    /// trickles the body would otherwise hold a review slot indefinitely.
    pub body_timeout: Duration,
    /// Connections open at once; one more is reset at accept, which the API
    /// server's webhook client retries.
    pub max_connections: usize,
    /// Reviews read and answered at once; one more is answered 429 with
    /// Retry-After at once, which the API server's webhook client retries.
    pub max_in_flight: usize,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits {
            body_timeout: Duration::from_secs(10),
            max_connections: 64,
            max_in_flight: 4,
        }
    }
}

/// Every `drainshim_webhook_rejected_total{reason}`.
const REJECTED: [&str; 4] = ["connections", "in_flight", "body_timeout", "body_too_large"];

/// What the webhook did with one review.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReviewOutcome {
    /// drainshim added; the response carries the patch.
    injected,
    /// The Istio mode before Istio's injector: only Istio's annotations now,
    /// drainshim on the API server's call after Istio's.
    awaiting_istio,
    /// Allowed as it was: already injected, or not a Pod CREATE.
    unchanged,
    /// The pod opted out (`drainshim.io/inject: "false"`).
    opted_out,
    /// The pod cannot be injected safely: allowed without drainshim, with a warning.
    refused,
    /// Not an AdmissionReview this webhook can read: allowed, with a warning.
    malformed,
}

impl ReviewOutcome {
    /// Every outcome, for its series at 0 from the start.
    const ALL: [ReviewOutcome; 6] = [
        ReviewOutcome::injected,
        ReviewOutcome::awaiting_istio,
        ReviewOutcome::unchanged,
        ReviewOutcome::opted_out,
        ReviewOutcome::refused,
        ReviewOutcome::malformed,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    revision: String,
    outcome: ReviewOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeclinedLabels {
    revision: String,
    reason: Declined,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    reason: &'static str,
}

/// The webhook's metrics.
pub struct WebhookMetrics {
    reviews: Family<ReviewLabels, Counter>,
    istio_declined: Family<DeclinedLabels, Counter>,
    latency: Histogram,
    reloads: Family<ReloadLabels, Counter>,
    /// Seconds until the serving certificate's notAfter, set at each scrape.
    expiry: Gauge,
    rejected: Family<RejectedLabels, Counter>,
    registry: Registry,
}

impl WebhookMetrics {
    fn new() -> Self {
        let reviews = Family::<ReviewLabels, Counter>::default();
        let latency = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ]);
        let reloads = Family::<ReloadLabels, Counter>::default();
        let istio_declined = Family::<DeclinedLabels, Counter>::default();
        let mut registry = Registry::with_prefix("drainshim_webhook");
        registry.register(
            "reviews",
            "Admission reviews answered, by revision and outcome (injected, awaiting_istio, unchanged, opted_out, refused, malformed); every one is allowed",
            reviews.clone(),
        );
        registry.register(
            "istio_declined",
            "Pods given the plain mode though their namespace or labels ask for Istio, which will not inject them, by reason (namespace_disabled, pod_opted_out, annotation_only, label_not_true)",
            istio_declined.clone(),
        );
        registry.register(
            "review_duration_seconds",
            "Time to answer one admission review, from its first byte read to the answer",
            latency.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificate reloads after the files changed, by result (ok, failed: the previous pair is kept)",
            reloads.clone(),
        );
        let expiry = Gauge::default();
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until the serving certificate's notAfter (negative once it has expired; /readyz is 503 then)",
            expiry.clone(),
        );
        let rejected = Family::<RejectedLabels, Counter>::default();
        registry.register(
            "rejected",
            "Requests turned away by a server limit, by reason (connections: reset at accept; in_flight: 429; body_timeout: 408; body_too_large: 413)",
            rejected.clone(),
        );
        WebhookMetrics {
            reviews,
            istio_declined,
            latency,
            reloads,
            expiry,
            rejected,
            registry,
        }
    }
}

impl WebhookMetrics {
    /// The webhook's series in the text format (what `GET /metrics` serves).
    pub fn render(&self) -> String {
        crate::metrics::render(&self.registry)
    }
}

/// One webhook: the injection settings and the revision it serves.
pub struct Webhook {
    pub settings: InjectOptions,
    pub revision: String,
    pub metrics: WebhookMetrics,
    /// SIGTERM arrived: /readyz says 503 while reviews are still answered.
    draining: std::sync::atomic::AtomicBool,
    pub limits: WebhookLimits,
    /// One permit per review being read or answered (`limits.max_in_flight`).
    in_flight: Semaphore,
    /// The serving certificate, for readiness and the expiry gauge.
    cert: OnceLock<Arc<Certificate>>,
}

impl Webhook {
    pub fn new(settings: InjectOptions, revision: String) -> Self {
        let metrics = WebhookMetrics::new();
        // Every series from the start, at 0: an alert on `increase()` sees
        // the first refusal, and a dashboard every outcome.
        for outcome in ReviewOutcome::ALL {
            let _ = metrics.reviews.get_or_create(&ReviewLabels {
                revision: revision.clone(),
                outcome,
            });
        }
        for reason in Declined::ALL {
            let _ = metrics.istio_declined.get_or_create(&DeclinedLabels {
                revision: revision.clone(),
                reason,
            });
        }
        for result in ["ok", "failed"] {
            let _ = metrics.reloads.get_or_create(&ReloadLabels { result });
        }
        for reason in REJECTED {
            let _ = metrics.rejected.get_or_create(&RejectedLabels { reason });
        }
        let limits = WebhookLimits::default();
        Webhook {
            // Every pod it injects records the revision.
            settings: InjectOptions {
                revision: Some(revision.clone()),
                ..settings
            },
            revision,
            metrics,
            draining: Default::default(),
            in_flight: Semaphore::new(limits.max_in_flight),
            limits,
            cert: OnceLock::new(),
        }
    }

    /// The same webhook with other server limits.
    pub fn with_limits(mut self, limits: WebhookLimits) -> Self {
        self.in_flight = Semaphore::new(limits.max_in_flight.max(1));
        self.limits = limits;
        self
    }

    /// The certificate /readyz and the expiry gauge look at.
    pub fn set_certificate(&self, cert: Arc<Certificate>) {
        let _ = self.cert.set(cert);
    }

    /// Why /readyz is 503, if it is: shutting down, no certificate, or a
    /// certificate past its notAfter (the API server would refuse the TLS
    /// handshake, and with failurePolicy Ignore create pods without drainshim).
    pub fn unready(&self, now: SystemTime) -> Option<String> {
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            return Some("shutting down".into());
        }
        let Some(cert) = self.cert.get() else {
            return Some("no serving certificate loaded".into());
        };
        let left = cert.seconds_left(now);
        (left <= 0).then(|| format!("the serving certificate expired {}s ago", -left))
    }

    fn reject(&self, reason: &'static str) {
        self.metrics
            .rejected
            .get_or_create(&RejectedLabels { reason })
            .inc();
    }

    /// What `GET /metrics` does before rendering, for tests.
    #[cfg(test)]
    pub fn observe_expiry_for_test(&self, now: SystemTime) {
        self.observe_expiry(now)
    }

    /// Sets the expiry gauge from the certificate as now loaded.
    fn observe_expiry(&self, now: SystemTime) {
        if let Some(cert) = self.cert.get() {
            self.metrics.expiry.set(cert.seconds_left(now));
        }
    }

    /// From now on /readyz is 503.
    pub fn set_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn count(&self, outcome: ReviewOutcome) {
        self.metrics
            .reviews
            .get_or_create(&ReviewLabels {
                revision: self.revision.clone(),
                outcome,
            })
            .inc();
    }

    /// The answer to one AdmissionReview body, from a namespace `ns` (which
    /// path was called): always `allowed`, with a patch when drainshim was
    /// added, and a warning when it could not be, or not as asked.
    pub fn review(&self, body: &[u8], ns: Namespace) -> (Value, ReviewOutcome) {
        let mut review: Value = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return self.malformed(body, format!("not an AdmissionReview v1: {e}")),
        };
        strip_managed_fields(&mut review);
        let review: AdmissionReview<DynamicObject> = match serde_json::from_value(review) {
            Ok(r) => r,
            Err(e) => return self.malformed(body, format!("not an AdmissionReview v1: {e}")),
        };
        let request = match review.try_into() {
            Ok(r) => r,
            Err(_) => return self.malformed(body, "an AdmissionReview with no request".into()),
        };
        let request: kube_core::admission::AdmissionRequest<DynamicObject> = request;
        let response = AdmissionResponse::from(&request);
        let who = format!(
            "{}/{}",
            request.namespace.as_deref().unwrap_or("-"),
            pod_name(request.object.as_ref())
        );
        if request.kind.kind != "Pod"
            || !request.kind.group.is_empty()
            || request.operation != Operation::Create
        {
            let why = format!(
                "drainshim injects Pods on CREATE; this is {} {} {}",
                request.kind.kind,
                format!("{:?}", request.operation).to_uppercase(),
                who
            );
            tracing::warn!(review = %request.uid, "webhook: {why}: allowed unchanged");
            return self.answer(warn(response, why), ReviewOutcome::malformed);
        }
        let Some(pod) = request
            .object
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
        else {
            return self.answer(
                warn(response, "the review carries no pod".into()),
                ReviewOutcome::malformed,
            );
        };
        let choice = match (
            pod.get("metadata")
                .map(|m| serde_json::from_value(m.clone())),
            pod.get("spec").map(|s| serde_json::from_value(s.clone())),
        ) {
            (Some(Ok(meta)), Some(Ok(spec))) => mesh::choose(ns, &meta, &spec),
            // Not a pod: the transform says what is wrong with it.
            _ => Choice::Plain,
        };
        let istio = InjectOptions {
            mode: Mode::Istio,
            await_istio: true,
            ..self.settings.clone()
        };
        let settings = match &choice {
            Choice::Istio => &istio,
            _ => &self.settings,
        };
        let mut response = response;
        if let Choice::Declined(reason, why) = &choice {
            tracing::info!(pod = %who, reason = ?reason, "webhook: not the Istio mode: {why}");
            response = warn(response, format!("{who}: {why}"));
        }
        match pod_patch(&pod, settings, Direction::Inject) {
            Ok((_, PodChange::OptedOut)) => {
                tracing::info!(pod = %who, "webhook: opted out");
                self.answer(response, ReviewOutcome::opted_out)
            }
            Ok((_, PodChange::RunsToCompletion)) => {
                tracing::info!(pod = %who, "webhook: not injected: the pod runs to completion (restartPolicy)");
                self.answer(response, ReviewOutcome::unchanged)
            }
            Ok((patch, outcome)) if patch.0.is_empty() => {
                let outcome = match outcome {
                    // Called again before Istio's injector ran.
                    PodChange::AwaitingIstio { .. } => ReviewOutcome::awaiting_istio,
                    _ => ReviewOutcome::unchanged,
                };
                self.answer(response, outcome)
            }
            Ok((patch, outcome)) => match response.clone().with_patch(patch) {
                Ok(mut r) => {
                    self.declined(&choice);
                    let counted = match &outcome {
                        PodChange::Injected {
                            app,
                            port,
                            warnings,
                        } => {
                            tracing::info!(pod = %who, app = %app, port, mode = settings.mode.name(), "webhook: injected");
                            for w in warnings {
                                tracing::warn!(pod = %who, "webhook: {w}");
                                r = warn(r, format!("drainshim injected {who}, but {w}"));
                            }
                            ReviewOutcome::injected
                        }
                        PodChange::AwaitingIstio { app, port } => {
                            tracing::info!(pod = %who, app = %app, port, "webhook: Istio's settings set; drainshim follows Istio's injection");
                            ReviewOutcome::awaiting_istio
                        }
                        _ => ReviewOutcome::injected,
                    };
                    self.answer(r, counted)
                }
                Err(e) => {
                    let why = format!("drainshim could not encode its patch ({e}); the pod runs without drainshim");
                    self.answer(warn(response, why), ReviewOutcome::refused)
                }
            },
            Err(PodRefusal(why)) => {
                tracing::warn!(pod = %who, reason = %why, "webhook: not injected; the pod runs without drainshim");
                let why = format!("drainshim not injected into {who}: {why}");
                // Reinvoked after a later webhook made the pod one it cannot
                // inject (Istio's injector added istio-proxy, whose admin port
                // is Envoy's): what it added on the first call comes out again.
                match pod_patch(&pod, settings, Direction::Uninject) {
                    Ok((patch, PodChange::Uninjected)) if !patch.0.is_empty() => {
                        match response.clone().with_patch(patch) {
                            Ok(r) => return self.answer(warn(r, why), ReviewOutcome::refused),
                            Err(e) => {
                                tracing::warn!(pod = %who, error = %e, "webhook: encoding the removal")
                            }
                        }
                    }
                    _ => {}
                }
                self.answer(warn(response, why), ReviewOutcome::refused)
            }
        }
    }

    /// Counts a pod that got the plain mode though Istio was asked for.
    fn declined(&self, choice: &Choice) {
        if let Choice::Declined(reason, _) = choice {
            self.metrics
                .istio_declined
                .get_or_create(&DeclinedLabels {
                    revision: self.revision.clone(),
                    reason: *reason,
                })
                .inc();
        }
    }

    fn answer(
        &self,
        mut response: AdmissionResponse,
        outcome: ReviewOutcome,
    ) -> (Value, ReviewOutcome) {
        self.count(outcome);
        // kube-core writes the patch's bytes as a JSON array of numbers; the
        // API's documented form (and what Go writes for []byte) is base64.
        let patch = response.patch.take();
        let mut review = serde_json::to_value(response.into_review()).unwrap_or(Value::Null);
        if let (Some(patch), Some(r)) = (
            patch,
            review.get_mut("response").and_then(Value::as_object_mut),
        ) {
            use base64::Engine;
            r.insert(
                "patch".into(),
                base64::engine::general_purpose::STANDARD
                    .encode(patch)
                    .into(),
            );
        }
        (review, outcome)
    }

    /// A body that is not a review: answered as one if it carries a uid (the
    /// API server then allows the pod, with the warning), else the caller
    /// gets a 400 (`Value::Null`).
    fn malformed(&self, body: &[u8], why: String) -> (Value, ReviewOutcome) {
        tracing::warn!(reason = %why, "webhook: malformed review: allowed unchanged");
        self.count(ReviewOutcome::malformed);
        let uid = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            v.pointer("/request/uid")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        let Some(uid) = uid else {
            return (Value::Null, ReviewOutcome::malformed);
        };
        let answer = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": true, "warnings": [format!("drainshim: {why}")]},
        });
        (answer, ReviewOutcome::malformed)
    }
}

/// Drops the objects' `metadata.managedFields` before anything reads them:
/// the server-side-apply bookkeeping is often most of a pod's metadata, is
/// none of the webhook's business, and left out no patch can name it.
fn strip_managed_fields(review: &mut Value) {
    for object in ["object", "oldObject"] {
        if let Some(meta) = review
            .pointer_mut(&format!("/request/{object}/metadata"))
            .and_then(Value::as_object_mut)
        {
            meta.remove("managedFields");
        }
    }
}

fn warn(mut response: AdmissionResponse, why: String) -> AdmissionResponse {
    response.warnings.get_or_insert_with(Vec::new).push(why);
    response
}

/// A pod at admission often has no name yet: its generateName then.
fn pod_name(pod: Option<&DynamicObject>) -> String {
    let meta = pod.map(|p| &p.metadata);
    match (
        meta.and_then(|m| m.name.as_deref()),
        meta.and_then(|m| m.generate_name.as_deref()),
    ) {
        (Some(n), _) => n.to_owned(),
        (None, Some(g)) => format!("{g}*"),
        (None, None) => "(no name)".into(),
    }
}

// === the certificate's reloads ===

/// Checks the files every `every` and counts each reload.
pub async fn watch(
    cert: Arc<Certificate>,
    metrics: Arc<Webhook>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let c = cert.clone();
        let result = tokio::task::spawn_blocking(move || c.reload()).await;
        let result = match result {
            Ok(Ok(false)) => continue,
            Ok(Ok(true)) => {
                tracing::info!(cert = %cert.cert.display(), "webhook: serving certificate reloaded");
                "ok"
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "webhook: the certificate files changed but do not load; serving the previous pair");
                "failed"
            }
            Err(e) => {
                tracing::warn!(error = %e, "webhook: reloading the certificate failed");
                "failed"
            }
        };
        metrics
            .metrics
            .reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }
}

// === serving ===

/// Serves `POST /inject` over TLS on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    hook: Arc<Webhook>,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let tracker = TaskTracker::new();
    let connections = Arc::new(Semaphore::new(hook.limits.max_connections.max(1)));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Over the cap: reset at once (linger 0 sends RST, not FIN), which
        // the API server's webhook client retries, rather than queueing
        // connections that each hold buffers.
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            hook.reject("connections");
            tracing::debug!(%peer, "webhook: too many connections: reset");
            let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
            drop(tcp);
            continue;
        };
        let (acceptor, hook, stop) = (acceptor.clone(), hook.clone(), stop.clone());
        tracker.spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return tracing::debug!(%peer, error = %e, "webhook: TLS handshake failed")
                }
                Err(_) => return tracing::debug!(%peer, "webhook: TLS handshake timed out"),
            };
            let handler = move |req| {
                let hook = hook.clone();
                async move { handle(&hook, req).await }
            };
            if let Err(e) = serve_connection(stream, handler, &stop).await {
                tracing::debug!(%peer, error = %e, "webhook: connection ended with an error");
            }
        });
    }
    drop(listener);
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
}

async fn handle(hook: &Webhook, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let ns = match req.uri().path() {
        PATH => Namespace::Unlabelled,
        PATH_ISTIO => Namespace::Injected,
        PATH_NO_ISTIO => Namespace::Disabled,
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "not found; admission reviews go to POST {PATH} (or {PATH_ISTIO}, {PATH_NO_ISTIO})\n"
                ),
            )
        }
    };
    if req.method() != Method::POST {
        return not_allowed("POST");
    }
    let start = Instant::now();
    // Held from the first byte read to the answer: what bounds the memory
    // the reviews take together.
    let Ok(_permit) = hook.in_flight.try_acquire() else {
        hook.reject("in_flight");
        let mut r = text(
            StatusCode::TOO_MANY_REQUESTS,
            "too many reviews in flight; retry\n",
        );
        r.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        return r;
    };
    let read = Limited::new(req.into_body(), MAX_REVIEW_BYTES).collect();
    let body = match tokio::time::timeout(hook.limits.body_timeout, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            hook.reject("body_too_large");
            return close(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a review is at most {MAX_REVIEW_BYTES} bytes\n"),
            ));
        }
        Ok(Err(e)) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("reading the review: {e}\n"),
            )
        }
        Err(_) => {
            hook.reject("body_timeout");
            tracing::debug!(timeout = ?hook.limits.body_timeout, "webhook: the review's body was not read in time");
            return close(text(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the review's body did not arrive within {:?}\n",
                    hook.limits.body_timeout
                ),
            ));
        }
    };
    let (answer, _) = hook.review(&body, ns);
    hook.metrics.latency.observe(start.elapsed().as_secs_f64());
    if answer.is_null() {
        return text(
            StatusCode::BAD_REQUEST,
            "not an AdmissionReview v1 with a request uid\n",
        );
    }
    json(StatusCode::OK, &answer)
}

/// An answer after which the connection is closed: the rest of the body
/// is never read.
fn close(mut r: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    r.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    r
}

/// `GET /metrics`, `/healthz`, `/readyz` on the plain-HTTP port.
pub async fn serve_metrics(listener: TcpListener, hook: Arc<Webhook>, stop: CancellationToken) {
    serve_fn(
        listener,
        stop,
        move |_peer: SocketAddr, req: Request<Incoming>| {
            let hook = hook.clone();
            async move {
                match (req.method(), req.uri().path()) {
                    (&Method::GET, "/metrics") => {
                        hook.observe_expiry(SystemTime::now());
                        openmetrics(crate::metrics::render(&hook.metrics.registry))
                    }
                    (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
                    (&Method::GET, "/readyz") => match hook.unready(SystemTime::now()) {
                        Some(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                        None => text(StatusCode::OK, "ok\n"),
                    },
                    _ => text(
                        StatusCode::NOT_FOUND,
                        "not found; GET /metrics, /healthz or /readyz\n",
                    ),
                }
            }
        },
    )
    .await
}
