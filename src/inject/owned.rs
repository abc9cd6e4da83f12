//! What drainshim wrote in its own containers, field by field, so that a
//! second call (the API server's reinvocation after later webhooks, or
//! `inject` run again) changes only what is still as drainshim left it. A
//! field another webhook changed since (a registry mirror's `image`, a
//! policy's `resources` or `securityContext`), added, or removed stays as
//! that webhook left it; a field nobody touched takes drainshim's value of
//! now (the grace period's flag follows the pod's, a mode's args the mode).
//!
//! The record is a digest per field, in the pod's `drainshim.io/injected`
//! annotation: a few hundred bytes, not a copy of the containers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use serde_json::{Map, Value};

/// Per container of drainshim's, per top-level field it wrote: a digest of
/// the value it wrote.
pub type Record = BTreeMap<String, BTreeMap<String, String>>;

/// drainshim's containers as the pod has them now, and what it wrote in them.
pub struct Before {
    containers: BTreeMap<String, Map<String, Value>>,
    record: Record,
}

impl Before {
    /// `containers` are the pod's own copies of drainshim's containers;
    /// `record` what the last injection wrote in them (`None`: an injection
    /// by a drainshim that kept no record, whose containers are rebuilt).
    pub fn new<'a>(
        containers: impl Iterator<Item = &'a Container>,
        record: Option<Record>,
    ) -> Self {
        let record = record.unwrap_or_default();
        let containers = containers
            .filter(|c| record.contains_key(&c.name))
            .filter_map(|c| match serde_json::to_value(c) {
                Ok(Value::Object(m)) => Some((c.name.clone(), m)),
                _ => None,
            })
            .collect();
        Before { containers, record }
    }

    /// The container drainshim writes now, `fresh`, over the one the pod
    /// has: each field as the pod has it where someone else changed, added
    /// or removed it, else as `fresh` has it. What was written goes into
    /// `record`.
    pub fn merge(&self, fresh: Container, record: &mut Record) -> Container {
        let Ok(Value::Object(ours)) = serde_json::to_value(&fresh) else {
            return fresh;
        };
        let wrote = self.record.get(&fresh.name);
        let theirs = self.containers.get(&fresh.name);
        let (mut out, mut digests) = (Map::new(), BTreeMap::new());
        let keys: std::collections::BTreeSet<&String> = ours
            .keys()
            .chain(theirs.into_iter().flat_map(|t| t.keys()))
            .collect();
        for k in keys {
            let (mine, theirs) = (ours.get(k), theirs.and_then(|t| t.get(k)));
            let written = wrote.and_then(|w| w.get(k));
            let keep = match (theirs, written) {
                // Never written, now there: another webhook's.
                (Some(_), None) => true,
                // Written and still as written: drainshim's to change.
                (Some(t), Some(w)) => digest(t) != *w,
                // Written and gone since: removed by another.
                (None, Some(_)) => true,
                (None, None) => false,
            };
            if keep {
                if let Some(t) = theirs {
                    out.insert(k.clone(), t.clone());
                }
                if let Some(w) = written {
                    digests.insert(k.clone(), w.clone());
                }
            } else if let Some(m) = mine {
                out.insert(k.clone(), m.clone());
                digests.insert(k.clone(), digest(m));
            }
        }
        record.insert(fresh.name.clone(), digests);
        serde_json::from_value(Value::Object(out)).unwrap_or(fresh)
    }
}

/// A digest of a JSON value, independent of the order of its keys: FNV-1a,
/// 64 bits, over its canonical text. Not a defence against anyone: it only
/// tells whether a field still holds what drainshim wrote.
pub fn digest(v: &Value) -> String {
    let mut text = String::new();
    canonical(v, &mut text);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            out.push('{');
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&m[k], out);
                out.push(',');
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for i in items {
                canonical(i, out);
                out.push(',');
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}
