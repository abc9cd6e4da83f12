//! `drainshim check`: the preflight over exported objects (`crate::check`).

use std::io::Read;
use std::path::PathBuf;

use crate::check::{self, CheckReport};
use crate::cli::Format;
use crate::error::Error;

pub const CHECK_LONG_ABOUT: &str = "\
Preflight: read Kubernetes objects exported with `kubectl get ... -o yaml` and name what would \
keep drainshim from serving a namespace, before you opt one in. Give one or more files, or `-` \
for stdin; multi-document YAML and `kind: List` are both read. It calls no API: what is not in \
the export is not seen. A useful export:\n\n\
  kubectl get namespaces,pods,services,deployments,limitranges,mutatingwebhookconfigurations -A -o yaml > cluster.yaml\n\
  kubectl get certificates,issuers,clusterissuers,envoyfilters -A -o yaml > more.yaml\n\
  kubectl -n istio-system get configmap istio istio-sidecar-injector -o yaml > istio.yaml\n\
  drainshim check cluster.yaml more.yaml istio.yaml\n\n\
Each finding is one line: PROBLEM or info, the check, the object (kind/namespace/name), what is \
wrong and, after ->, what to do; then a summary. `-o json` gives the same as one JSON object.\n\n\
The checks:\n\
- webhook-ca: drainshim's MutatingWebhookConfiguration has an empty caBundle and no \
cert-manager.io/inject-ca-from annotation, or that annotation's Certificate is missing (with an \
empty caBundle) or names an Issuer or ClusterIssuer that is not in the export. The API server \
then cannot verify the webhook, and pods are created without drainshim.\n\
- revision: a namespace labelled drainshim.io/rev=<name> (or drainshim.io/inject=enabled, the \
default revision) that no webhook Deployment (`drainshim webhook --revision=<name>`) with a \
Service selecting its pods serves, directly or through a tag (a MutatingWebhookConfiguration \
drainshim-tag-<name> whose webhooks call a revision's Service); and a namespace whose \
drainshim.io/inject is neither enabled nor disabled (or false), which no webhook reads. \
drainshim.io/inject=disabled opts a namespace out whatever its drainshim.io/rev says. And a \
webhook Deployment whose --image is not the image it runs (kustomize's images: moves the \
container's image, not the flag), so every pod it injects would pull another one.\n\
- service-port: a Service of an opted-in namespace whose targetPort is a port only injected \
pods have (envoy-inbound, Envoy's 10000, drainshim's): it drops every pod created without \
drainshim. Keep the app's own port name.\n\
- not-injected: a running pod of an opted-in namespace without the drainshim.io/injected \
annotation (pods opted out, Jobs' and finished pods aside).\n\
- limit-range: a LimitRange (type Container) of an opted-in namespace whose max, min or \
maxLimitRequestRatio refuses drainshim's containers as injected (their default requests and \
limits). Its plugin runs after the webhook and refuses the whole pod, and failurePolicy: Ignore \
does not help: the workload's pods are never created. Export LimitRanges too (kubectl get \
limitranges -A -o yaml).\n\
- versions (info): per namespace, how many injected pods run which drainshim release and \
revision (the annotations drainshim.io/version and drainshim.io/revision the injection writes): \
the version spread a move to a new revision goes through.\n\
- istio-mode (Istio's istio-sidecar-injector and istio ConfigMaps, istiod, its webhooks): \
info on the proxy mode drainshim will meet (native sidecars, classic, classic holding the app), \
from ENABLE_NATIVE_SIDECARS (istiod's env or values.pilot.env) and \
holdApplicationUntilProxyStarts (values.global.proxy or meshConfig defaultConfig); a problem for \
what deploy/README.md does not support: Istio's webhook with reinvocationPolicy IfNeeded and \
native sidecars, and drainshim's configuration named to sort after Istio's.\n\
- istio-routing: a pod or workload that Istio injects in an opted-in namespace whose app port \
has no EnvoyFilter of `drainshim istio-routing` (selecting drainshim.io/app-port) in Istio's \
root namespace or its own.";

pub const CHECK_EXIT_CODES: &str = "\
Exit codes:
  0   healthy: no problem found (info lines may be printed)
  1   problems found (each named)
  64  usage error: a bad flag
  65  unreadable input: a file that cannot be read, or that is not YAML of Kubernetes objects";

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The exported objects: files, or `-` for stdin.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// `table`: one line per finding and a summary; `json`: one object.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

impl CheckArgs {
    /// Reads every input (all or nothing), then checks the whole export.
    pub fn run(&self) -> Result<CheckReport, Error> {
        let mut objects = Vec::new();
        for file in &self.files {
            let mut input = String::new();
            let (read, source) = if file.as_os_str() == "-" {
                (
                    std::io::stdin().read_to_string(&mut input).map(|_| ()),
                    "stdin".to_owned(),
                )
            } else {
                (
                    std::fs::read_to_string(file).map(|s| input = s),
                    file.display().to_string(),
                )
            };
            read.map_err(|e| Error::Data(format!("reading {source}: {e}")))?;
            check::load(&input, &source, &mut objects).map_err(Error::Data)?;
        }
        Ok(check::check(&objects))
    }
}
