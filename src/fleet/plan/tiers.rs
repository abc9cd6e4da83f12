//! The tiers file, and its namespaces resolved against the fleet.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::human;

/// A tier of the tiers file: its name and namespaces, in rollout order.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    pub name: String,
    /// Namespaces by name.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces by regular expression, matched whole against the
    /// namespaces Prometheus has seen.
    #[serde(default)]
    pub pattern: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TiersFile {
    tier: Vec<TierSpec>,
}

/// Parses a tiers file (TOML, `[[tier]]` tables in rollout order).
pub fn parse_tiers(text: &str) -> Result<Vec<TierSpec>, String> {
    let file: TiersFile = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.tier.is_empty() {
        return Err("no [[tier]] in the file".into());
    }
    let mut names = BTreeSet::new();
    for t in &file.tier {
        if t.name.trim().is_empty() {
            return Err("a tier has an empty name".into());
        }
        if !names.insert(&t.name) {
            return Err(format!("tier {:?} is named twice", t.name));
        }
        if t.namespaces.is_empty() && t.pattern.is_none() {
            return Err(format!(
                "tier {:?} names no namespaces and no pattern",
                t.name
            ));
        }
        if let Some(p) = &t.pattern {
            regex::Regex::new(&format!("^(?:{p})$"))
                .map_err(|e| format!("tier {:?}: pattern {p:?}: {e}", t.name))?;
        }
    }
    Ok(file.tier)
}

/// A tier with its namespaces resolved.
#[derive(Clone, Debug, Serialize)]
pub struct Tier {
    pub name: String,
    pub namespaces: Vec<String>,
}

/// Resolves the tiers against the namespaces Prometheus has seen.
pub fn resolve(
    specs: &[TierSpec],
    seen: &BTreeSet<String>,
    history: Duration,
) -> Result<Vec<Tier>, String> {
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut tiers = Vec::new();
    for spec in specs {
        let mut namespaces: BTreeSet<String> = BTreeSet::new();
        for ns in &spec.namespaces {
            if !seen.contains(ns) {
                return Err(format!(
                    "tier {:?}: namespace {ns:?} is unknown: no proxy in it reported a version in the last {} \
                     (is it spelled right, and are its shims scraped?)",
                    spec.name,
                    human(history)
                ));
            }
            namespaces.insert(ns.clone());
        }
        if let Some(p) = &spec.pattern {
            let re = regex::Regex::new(&format!("^(?:{p})$"))
                .map_err(|e| format!("tier {:?}: pattern {p:?}: {e}", spec.name))?;
            let before = namespaces.len();
            namespaces.extend(seen.iter().filter(|ns| re.is_match(ns)).cloned());
            if namespaces.len() == before && spec.namespaces.is_empty() {
                return Err(format!(
                    "tier {:?}: pattern {p:?} matches no namespace Prometheus has seen",
                    spec.name
                ));
            }
        }
        for ns in &namespaces {
            if let Some(other) = owner.insert(ns.clone(), spec.name.clone()) {
                return Err(format!(
                    "namespace {ns:?} is in two tiers: {other:?} and {:?}",
                    spec.name
                ));
            }
        }
        tiers.push(Tier {
            name: spec.name.clone(),
            namespaces: namespaces.into_iter().collect(),
        });
    }
    Ok(tiers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_resolve_against_the_fleet() {
        let seen: BTreeSet<String> = ["a", "b", "team-x", "team-y"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let specs = parse_tiers(
            "[[tier]]\nname = \"one\"\nnamespaces = [\"a\"]\n[[tier]]\nname = \"two\"\npattern = \"team-.*\"\n",
        )
        .unwrap();
        let tiers = resolve(&specs, &seen, Duration::from_secs(60)).unwrap();
        assert_eq!(tiers[1].namespaces, vec!["team-x", "team-y"]);
        let unknown = parse_tiers("[[tier]]\nname = \"one\"\nnamespaces = [\"zz\"]\n").unwrap();
        let e = resolve(&unknown, &seen, Duration::from_secs(60)).unwrap_err();
        assert!(e.contains("\"zz\" is unknown"), "{e}");
        let twice = parse_tiers(
            "[[tier]]\nname = \"one\"\nnamespaces = [\"a\"]\n[[tier]]\nname = \"two\"\nnamespaces = [\"a\"]\n",
        )
        .unwrap();
        assert!(resolve(&twice, &seen, Duration::from_secs(60))
            .unwrap_err()
            .contains("two tiers"));
        assert!(parse_tiers("[[tier]]\nname = \"x\"\n").is_err());
        assert!(parse_tiers("[[tier]]\nname = \"x\"\npattern = \"(\"\n").is_err());
        assert!(parse_tiers("[[tier]]\nname = \"x\"\nnamespace = [\"a\"]\n").is_err());
        assert!(parse_tiers("").is_err());
    }
}
