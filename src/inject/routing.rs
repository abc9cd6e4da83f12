//! `drainshim istio-routing`: the mesh objects that send Istio's inbound
//! traffic through the guard, one EnvoyFilter per app port, selecting pods by
//! the label `drainshim.io/app-port` the Istio injection sets. They name no
//! workload, so a namespace adopts drainshim with its label alone, and the
//! namespace's default Sidecar (its egress scoping) stays the one its pods get.
//!
//! Each is `deploy/istio-routing/template.yaml` with the port filled in.

use serde_json::Value;

use super::{APP_PORT, RESERVED_PORTS};

const TEMPLATE: &str = include_str!("../../deploy/istio-routing/template.yaml");

/// Where the port goes in the template (its placeholders are 0).
const PORT_FIELDS: [&str; 3] = [
    "/spec/configPatches/0/match/cluster/portNumber",
    "/spec/configPatches/0/patch/value/load_assignment/endpoints/1/lb_endpoints/0/endpoint/address/socket_address/port_value",
    "/spec/configPatches/1/match/routeConfiguration/portNumber",
];

/// The routing objects for `ports`, as multi-document YAML, in `namespace`
/// (Istio's root namespace: every namespace's pods).
pub fn render(ports: &[u16], namespace: &str) -> Result<String, String> {
    let template: Value = serde_yaml_ng::from_str(TEMPLATE)
        .map_err(|e| format!("the built-in routing template does not parse: {e}"))?;
    let mut ports = ports.to_vec();
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        return Err(
            "no ports: give the app ports of the workloads to inject (--ports 8080,9090)".into(),
        );
    }
    let mut out = format!(
        "# drainshim istio-routing --ports {} --namespace {namespace}\n\
         # (from drainshim {}): one EnvoyFilter per app port; see\n\
         # deploy/istio-routing/template.yaml for what each does and relies on.\n",
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(","),
        env!("CARGO_PKG_VERSION"),
    );
    for port in ports {
        if port == 0 || RESERVED_PORTS.contains(&port) {
            return Err(format!(
                "port {port} cannot be an app port (drainshim's containers take {RESERVED_PORTS:?})"
            ));
        }
        let mut doc = template.clone();
        let mut put = |at: &str, v: Value| match doc.pointer_mut(at) {
            Some(slot) => {
                *slot = v;
                Ok(())
            }
            None => Err(format!("the built-in routing template has no {at}")),
        };
        put("/metadata/name", format!("drainshim-guard-{port}").into())?;
        put(
            &format!(
                "/spec/workloadSelector/labels/{}",
                APP_PORT.replace('/', "~1")
            ),
            port.to_string().into(),
        )?;
        put(
            "/spec/configPatches/0/patch/value/load_assignment/cluster_name",
            format!("inbound|{port}||").into(),
        )?;
        for at in PORT_FIELDS {
            put(at, port.into())?;
        }
        doc["metadata"]["namespace"] = namespace.into();
        out.push_str("---\n");
        out.push_str(
            &serde_yaml_ng::to_string(&doc).map_err(|e| format!("writing the routing: {e}"))?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_filter_per_port_with_the_port_everywhere() {
        let out = render(&[9090, 8080, 9090], "istio-system").expect("render");
        let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&out)
            .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
            .collect();
        assert_eq!(docs.len(), 2);
        for (doc, port) in docs.iter().zip([8080u16, 9090]) {
            assert_eq!(doc["metadata"]["name"], format!("drainshim-guard-{port}"));
            assert_eq!(doc["metadata"]["namespace"], "istio-system");
            assert_eq!(
                doc["spec"]["workloadSelector"]["labels"][APP_PORT],
                port.to_string()
            );
            for at in PORT_FIELDS {
                assert_eq!(doc.pointer(at), Some(&Value::from(port)), "{at}");
            }
            let la = &doc["spec"]["configPatches"][0]["patch"]["value"]["load_assignment"];
            assert_eq!(la["cluster_name"], format!("inbound|{port}||"));
            let guard =
                &la["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
            assert_eq!(guard["port_value"], 15097);
        }
        // Nothing of the template's placeholders is left.
        assert!(
            !out.contains("port_value: 0\n") && !out.contains("portNumber: 0\n"),
            "{out}"
        );
    }

    #[test]
    fn bad_ports_are_refused() {
        assert!(render(&[], "istio-system").is_err());
        assert!(render(&[15097], "istio-system")
            .unwrap_err()
            .contains("15097"));
    }
}
