//! The PromQL behind the gates: a wave's series, joined to its namespaces,
//! and each counter's increase per second read the same way on every store
//! that speaks PromQL.

/// Builds the queries over the wave's series.
pub struct Queries<'a> {
    /// The namespace regex (already escaped).
    pub ns: &'a str,
    /// The window, in seconds.
    pub secs: u64,
    /// Whether some counter of the window reset (a shim restarted in its
    /// pod): only then do per-second figures take the reset-aware form.
    pub resets: bool,
}

/// The counters every window reads per second, each under the part name
/// its answer carries ([`Queries::window`]).
pub const COUNTERS: [(&str, &str); 7] = [
    ("requests", "drainshim_guard_requests_total"),
    ("callers", "drainshim_envoy_downstream_requests_total"),
    ("reopens", "drainshim_guard_streams_opened_total"),
    ("ended", "drainshim_streams_terminated_total"),
    ("reset", "drainshim_streams_ungraceful_total"),
    ("retries", "drainshim_envoy_upstream_retries_total"),
    ("tcp_resets", "drainshim_tcp_resets_total"),
];

/// The label a window's answer names each sample's part by.
pub const PART: &str = "drainshim_part";

/// The part that counts the wave's counter series that reset in the
/// window ([`Part::resets`]).
pub const RESETS: &str = "resets";

/// The longest query [`Queries::window`] builds before it begins another:
/// under VictoriaMetrics' default `-search.maxQueryLen` (16 KiB), which
/// every query must pass.
pub const MAX_QUERY_LEN: usize = 12 * 1024;

/// How a part reads each of its series over the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The increase per second ([`per_second`]).
    PerSecond,
    /// The highest sample: a count the series only ever adds to.
    Highest,
    /// The series that reset in the window, each with its number of
    /// resets.
    Reset,
}

/// One family of a window's query: its series, read one way, summed under
/// its own name.
#[derive(Clone, Debug)]
pub struct Part {
    pub name: &'static str,
    pub metric: &'static str,
    /// More matchers, each after a comma (`,outcome="cut"`).
    pub matchers: String,
    pub read: Read,
}

impl Part {
    /// [`COUNTERS`] as parts.
    pub fn counters() -> Vec<Part> {
        COUNTERS
            .iter()
            .map(|(name, metric)| Part {
                name,
                metric,
                matchers: String::new(),
                read: Read::PerSecond,
            })
            .collect()
    }

    /// The [`RESETS`] parts: the counters' series that reset in the
    /// window, under one name (series of two counters with the same labels
    /// may hide one another, which only ever hides a reset already
    /// counted).
    pub fn resets() -> Vec<Part> {
        COUNTERS
            .iter()
            .map(|(_, metric)| Part {
                name: RESETS,
                metric,
                matchers: String::new(),
                read: Read::Reset,
            })
            .collect()
    }
}

/// A counter's increase per second over `[w]` (ending `offset` back), the
/// same on every store that speaks PromQL: the highest sample in the window
/// less the lowest, over the window's length. `rate()` is not: Prometheus
/// divides a series' increase by the whole window, VictoriaMetrics by the
/// part of it the series has samples in, so a pod that started or ended in
/// the window (every pod of a wave) counts up to the window over its life
/// there; and Prometheus extrapolates to the window's edges, which
/// VictoriaMetrics does not. With `resets` (some counter reset in the
/// window: the shim restarted in its pod), a series that reset is read with
/// the store's own `increase()`, which counts both sides of the reset: the
/// one place where the two stores' figures can differ in the last digits,
/// since the subset they share has no exact reset-aware increase
/// (Prometheus 2 has no `first_over_time`).
pub fn per_second(selector: &str, w: u64, offset: &str, resets: bool) -> String {
    let r = format!("{selector}[{w}s]{offset}");
    if resets {
        format!(
            "((((max_over_time({r}) - min_over_time({r})) unless (resets({r}) > 0)) or increase({r})) / {w})"
        )
    } else {
        format!("((max_over_time({r}) - min_over_time({r})) / {w})")
    }
}

impl Queries<'_> {
    /// The window as a PromQL duration.
    pub fn w(&self) -> String {
        format!("{}s", self.secs.max(1))
    }

    /// `f(selector)` over the wave's series: those that carry a `namespace`
    /// label themselves (node mode's per-pod series, and sidecars scraped
    /// with their pod's labels) directly, and those of shims that export
    /// none joined on `instance` to the namespace of their
    /// `drainshim_proxy_info` at any time in the window (the wave's pods are
    /// gone at its end). Only series with neither `namespace` nor `pod` are
    /// joined: a node agent labels every pod's series with its pod, so its
    /// instance, which holds many namespaces, never is, and the one
    /// namespace the join takes per instance (`topk`) is a sidecar's own.
    /// A `drainshim_proxy_info` read once per query, not twice (excluding
    /// instances of several namespaces took a second): at 2,400 pods that
    /// was a third of the max-age history's cost.
    pub fn in_wave(&self, f: impl Fn(&str) -> String, offset: &str) -> String {
        let (ns, w) = (self.ns, self.w());
        self.join(
            f,
            &format!("max_over_time(drainshim_proxy_info{{namespace=~\"{ns}\"}}[{w}]{offset})"),
        )
    }

    /// [`Queries::in_wave`] with each instance's namespace as it is at the
    /// evaluation time: for a range query over the fleet's history, where a
    /// window per point would read every sample many times over.
    pub fn in_fleet(&self, f: impl Fn(&str) -> String) -> String {
        let ns = self.ns;
        self.join(f, &format!("drainshim_proxy_info{{namespace=~\"{ns}\"}}"))
    }

    fn join(&self, f: impl Fn(&str) -> String, info: &str) -> String {
        let ns = self.ns;
        let members = format!("topk by (instance) (1, max by (instance, namespace) ({info}))");
        format!(
            "({} or ({} * on(instance) group_left(namespace) {members}))",
            f(&format!("namespace=~\"{ns}\"")),
            f("namespace=\"\",pod=\"\"")
        )
    }

    /// One part over the wave, labelled with its name.
    fn part(&self, part: &Part, sel: &str, offset: &str) -> String {
        let series = format!("{}{{{sel}{}}}", part.metric, part.matchers);
        let read = match part.read {
            Read::PerSecond => per_second(&series, self.secs.max(1), offset, self.resets),
            Read::Highest => format!("max_over_time({series}[{}]{offset})", self.w()),
            Read::Reset => format!("(resets({series}[{}]{offset}) > 0)", self.w()),
        };
        format!(
            "label_replace({read}, \"{PART}\", \"{}\", \"\", \"\")",
            part.name
        )
    }

    /// The window's `parts` in as few queries as fit [`MAX_QUERY_LEN`]:
    /// each sums its parts' series over the wave by namespace, service,
    /// code, reason and part. The parts share one join to the wave's
    /// namespaces ([`Queries::in_wave`]), which reads every `proxy_info`
    /// sample of the window: asked once per part, it was most of a wave's
    /// cost.
    pub fn window(&self, parts: &[Part], offset: &str) -> Vec<String> {
        let build = |group: &[&Part]| {
            let wave = self.in_wave(
                |sel| {
                    let each: Vec<String> =
                        group.iter().map(|p| self.part(p, sel, offset)).collect();
                    format!("({})", each.join(" or "))
                },
                offset,
            );
            format!("sum by (namespace, service, code, reason, {PART}) ({wave})")
        };
        let mut out = Vec::new();
        let mut group: Vec<&Part> = Vec::new();
        for p in parts {
            group.push(p);
            if group.len() > 1 && build(&group).len() > MAX_QUERY_LEN {
                group.pop();
                out.push(build(&group));
                group = vec![p];
            }
        }
        if !group.is_empty() {
            out.push(build(&group));
        }
        out
    }

    /// p99 latency by (namespace, service). Only the buckets' shares count,
    /// so each bucket series' growth is its highest sample less its lowest,
    /// without [`per_second`]'s reset fallback: the histogram is 14 series
    /// per pod, the costliest query of a wave, and a shim that restarted in
    /// its pod resets all its buckets together, which keeps their shares.
    pub fn p99(&self, offset: &str) -> String {
        let w = self.w();
        format!(
            "histogram_quantile(0.99, sum by (namespace, service, le) ({}))",
            self.in_wave(
                |sel| {
                    let r = format!(
                        "drainshim_guard_request_duration_seconds_bucket{{{sel}}}[{w}]{offset}"
                    );
                    format!("(max_over_time({r}) - min_over_time({r}))")
                },
                offset
            )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(q: &Queries, offset: &str) -> String {
        q.window(&Part::counters(), offset).join("\n")
    }

    #[test]
    fn the_wave_join_reads_both_label_styles() {
        let q = Queries {
            ns: "shop",
            secs: 60,
            resets: false,
        };
        let text = all(&q, " offset 60s");
        assert!(
            text.contains(r#"drainshim_guard_requests_total{namespace=~"shop"}[60s] offset 60s"#),
            "{text}"
        );
        assert!(
            text.contains(r#"drainshim_guard_requests_total{namespace="",pod=""}[60s] offset 60s"#),
            "{text}"
        );
        assert!(text.contains("group_left(namespace)"), "{text}");
    }

    /// Every part in one query while it fits, each under its own name, with
    /// one join to the namespaces; a tier whose namespaces make it longer
    /// than a store accepts is split, no part lost or repeated.
    #[test]
    fn a_window_is_one_query_while_it_fits() {
        let q = Queries {
            ns: "shop|cart",
            secs: 60,
            resets: true,
        };
        let one = q.window(&Part::counters(), "");
        assert_eq!(one.len(), 1, "{one:?}");
        assert_eq!(one[0].matches("drainshim_proxy_info").count(), 1);
        for (name, metric) in COUNTERS {
            assert!(
                one[0].contains(&format!("\"{PART}\", \"{name}\"")),
                "{name}"
            );
            assert!(one[0].contains(metric), "{metric}");
        }
        let names: Vec<String> = (0..400).map(|k| format!("team-{k:03}")).collect();
        let long = regex::escape(&names.join("|"));
        let q = Queries { ns: &long, ..q };
        let split = q.window(&Part::counters(), "");
        assert!(split.len() > 1, "{}", split.len());
        for (name, _) in COUNTERS {
            let marker = format!("\"{PART}\", \"{name}\"");
            let n: usize = split.iter().map(|x| x.matches(&marker).count()).sum();
            assert_eq!(n, 2, "{name}: once per branch of the join");
        }
        // Only a part too long on its own may pass the limit.
        assert!(
            split
                .iter()
                .all(|x| x.len() <= MAX_QUERY_LEN || x.matches(PART).count() == 3),
            "{:?}",
            split.iter().map(String::len).collect::<Vec<_>>()
        );
    }

    /// The increase per second that both stores compute alike: no `rate()`
    /// (its window differs between them); where a counter reset in the
    /// window, a series that reset falls back to `increase()`.
    #[test]
    fn counters_are_read_the_same_way_on_every_store() {
        let text = per_second("m{a=\"b\"}", 600, " offset 600s", true);
        assert_eq!(
            text,
            "((((max_over_time(m{a=\"b\"}[600s] offset 600s) - min_over_time(m{a=\"b\"}[600s] offset 600s)) \
             unless (resets(m{a=\"b\"}[600s] offset 600s) > 0)) or increase(m{a=\"b\"}[600s] offset 600s)) / 600)"
        );
        assert_eq!(
            per_second("m", 60, "", false),
            "((max_over_time(m[60s]) - min_over_time(m[60s])) / 60)"
        );
        let q = |resets| Queries {
            ns: "x",
            secs: 60,
            resets,
        };
        assert!(!all(&q(false), "").contains("rate("));
        assert!(!all(&q(false), "").contains("resets("));
        assert!(all(&q(true), "").contains("resets("));
        let probe = q(false).window(&Part::resets(), "").join("\n");
        for (_, c) in COUNTERS {
            assert!(probe.contains(&format!(
                "(resets({c}{{namespace=\"\",pod=\"\"}}[60s]) > 0)"
            )));
        }
    }
}
