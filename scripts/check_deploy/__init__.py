"""Checks the deployment files in deploy/ (run by scripts/check-deploy.sh).

    check_deploy.py check --rendered DIR --envoy-cache DIR --prometheus BIN --kubectl BIN
        Every check below on the kustomize output in DIR (one NAME.yaml per
        base or overlay). Prints what it checked; exits 1 on any failure.
    check_deploy.py selftest --rendered DIR --prometheus BIN --envoy-cache DIR --kubectl BIN
        Proves the rollout, scrape, label, docs, adoption and webhook rules
        fire: on the rendered
        DaemonSet as shipped (accepted) and as it was before issue 29, with
        its port declared (rejected), on the sidecar PodMonitor as shipped
        and as it was before issue 30, honouring labels (rejected, also by a
        real Prometheus), on the docs' old wording, on broken copies of
        the sidecar Components (ADOPTION_CASES, NATIVE_ADOPTION_CASES,
        ISTIO_ADOPTION_CASES), and on broken copies of the rendered webhook
        (WEBHOOK_CASES).
    check_deploy.py sync-rules
        Rewrites deploy/monitoring/prometheusrule.yaml from rules.yaml.

Checks:
  schema     every rendered object against the Kubernetes 1.30 and latest
             schemas (kubernetes-validate, strict: unknown fields fail)
  budget     drain < parent-shutdown < terminationGracePeriodSeconds, from the
             drainshim container's flags and env (defaults when absent), plus
             the timers around it: Envoy's --drain-time-s, Istio's
             drainDuration/terminationDrainDuration, prestop --timeout.
             Node mode: the agent's timers against every node-mode
             workload's grace, and against the agent's own grace
  wiring     the preStop hooks exec the binary that the install init container
             copies, from a volume the hook's container mounts; the proxy's
             hook starts the drain; probes and scrapes can reach the shim;
             Services' named target ports exist; no privileged: true anywhere.
             Node mode: each workload's httpGet preStop targets the agent's
             --pod-listen-port with ?wait=true on the Envoy container, other
             containers wait too, no binary in the pod, Envoy names its pod
             in node metadata. Scrapes: the PodMonitors are run on every
             rendered pod (Prometheus' pod discovery, the operator's port
             filter, the relabelings): each drainshim scraped exactly once at
             its --listen port (the webhook at --metrics-listen), nothing
             else scraped, the agent with honorLabels. Labels: no sidecar scraped with honorLabels, its
             monitor's own relabelings set namespace/pod from the pod's
             metadata, honorLabels only on monitors confined to the agents'
             namespaces; and a real Prometheus, configured from each sidecar
             monitor as the operator would, scrapes an exporter claiming
             another pod (FORGED): the stored series must name the real pod
  node       the `drainshim node` DaemonSet: hostPID, hostNetwork, exactly
             SYS_ADMIN + SYS_PTRACE, root (for the capabilities), read-only
             root, seccomp RuntimeDefault, tolerations for every node, a
             Pod Security "privileged" namespace, /readyz probe on --listen
  rollout    no DaemonSet or Deployment whose rolling update surges declares
             a host port (with hostNetwork: any container port): the surge
             pod would stay Pending on the NodePorts filter
  envoy      the Envoy bootstrap validates with the real Envoy of the image's
             version (`envoy --mode validate`) and agrees with drainshim's
             flags (admin address, INBOUND listener, cluster -> guard); it
             fails open: priority 0 the guard (health-checked), priority 1
             the app's own port, a retry to the other priority, bounded
             HTTP/2 windows. Every app container is as in deploy/base
             (image, command, args): the guard listens on 15097 and forwards
             to the app's own port. Under Istio, a Sidecar points the
             inbound cluster at the guard and an EnvoyFilter adds the app as
             its fallback
  adopt      the sidecar Component (deploy/components/sidecar) on workloads
             written here, outside the repo (ADOPTER_WORKLOADS), through one
             `components:` line: the opted-in pods pass every per-pod check
             above, the app containers keep their ports and mounts, a
             workload without the label is untouched. Its Istio variant
             (components/sidecar-istio, ADOPTER_ISTIO) likewise, with the
             Sidecar/EnvoyFilter pair; and in every rendered overlay, a
             workload-selected Sidecar carries its namespace default
             Sidecar's egress hosts and outboundTrafficPolicy (merged, not
             replaced). The selftest breaks copies of both Components
  webhook    the admission webhook (webhook/, its revisions such as
             webhook/canary/): each drainshim MutatingWebhookConfiguration's
             webhooks have failurePolicy Ignore, sideEffects None,
             timeoutSeconds <= 5, AdmissionReview v1, Pod CREATE only,
             reinvocationPolicy IfNeeded, matchPolicy Equivalent, no written
             caBundle; the objectSelector sends every pod but those labelled
             drainshim.io/inject: "false", and not the webhook's own; the
             namespaceSelector serves its revision (drainshim.io/inject=
             enabled without drainshim.io/rev for the default one,
             drainshim.io/rev=<name> otherwise), never kube-system or its own
             namespace, and no namespace is served by two revisions. Behind
             each: the Service (port -> --listen), the Certificate named by
             cert-manager.io/inject-ca-from (the Service's DNS name, its
             Secret the one mounted whole and read-only at --tls-cert's
             directory, its Issuer and CA rendered), two replicas spread over
             nodes, a budget allowing one disruption, a rollout keeping one,
             the opt-out label on its pods, no token, Pod Security
             "restricted", probes on --metrics-listen, --shutdown-delay within
             the grace period, args that `drainshim webhook --help` lists
             (REQUIRED_FLAGS written out) with --image its own image, a
             NetworkPolicy letting everyone reach --listen and denying all
             egress; no object rendered by two revisions
  rules      prometheusrule.yaml carries exactly the groups of rules.yaml
  metrics    every metric queried by the rules and the dashboard is in the
             contract (docs/design.md), or recorded by rules.yaml; the rules
             may also read RULE_METRICS_BEYOND_CONTRACT (the API server's
             fail-open count of webhooks)
  dashboard  the dashboard JSON parses and every panel has a query
  docs       the node-mode prose (DOC_FILES) against the rendered agent and
             `drainshim node --help`: a short list of known contradictions
             (maxSurge/maxUnavailable, "no stream guard", "no hostPath")
Only PyYAML is needed besides the standard library (and kubernetes-validate
for the schema check).
"""
