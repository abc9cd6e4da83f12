//! Envoy discovery through `/proc`: which processes are Envoy, which network
//! namespace (pod) each one lives in, and what the process itself says of
//! its pod (downward-API environment, kubepods cgroup).
//!
//! Everything is read relative to `--proc-root`, so tests can point the agent
//! at a view of `/proc` that holds only their own processes.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One Envoy process as seen in `/proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyProc {
    /// The process id (thread-group leader).
    pub pid: i32,
    /// Inode of `/proc/<pid>/ns/net`: the pod's identity on this node, since
    /// every container of a pod shares one network namespace.
    pub netns: u64,
}

/// All Envoy processes of one network namespace, lowest pid first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsGroup {
    /// Inode of the network namespace.
    pub netns: u64,
    /// Envoy pids in it (two during a hot restart), sorted.
    pub pids: Vec<i32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
}

/// Lists the Envoy processes under `root` whose `comm` or executable name is
/// one of `names`. Processes that vanish or cannot be read while scanning
/// (exited, zombies, no permission) are skipped: a scan never fails on one
/// process, only when `root` itself cannot be listed.
pub fn scan(root: &Path, names: &[String]) -> Result<Vec<EnvoyProc>, ProcError> {
    let entries = std::fs::read_dir(root).map_err(|source| ProcError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        if !is_named(&dir, names) {
            continue;
        }
        // Zombies and exited processes have no namespace links any more.
        let Ok(meta) = std::fs::metadata(dir.join("ns/net")) else {
            continue;
        };
        found.push(EnvoyProc {
            pid,
            netns: meta.ino(),
        });
    }
    found.sort_by_key(|p| p.pid);
    Ok(found)
}

/// Groups processes by network namespace.
pub fn group(procs: &[EnvoyProc]) -> BTreeMap<u64, NetnsGroup> {
    let mut groups: BTreeMap<u64, NetnsGroup> = BTreeMap::new();
    for p in procs {
        let g = groups.entry(p.netns).or_insert_with(|| NetnsGroup {
            netns: p.netns,
            pids: Vec::new(),
        });
        g.pids.push(p.pid);
    }
    for g in groups.values_mut() {
        g.pids.sort_unstable();
    }
    groups
}

/// `comm` first (readable for every process), then the executable's file
/// name (needs ptrace access for other users' processes).
fn is_named(dir: &Path, names: &[String]) -> bool {
    if let Ok(comm) = std::fs::read_to_string(dir.join("comm")) {
        if names.iter().any(|n| n == comm.trim_end_matches('\n')) {
            return true;
        }
    }
    match std::fs::read_link(dir.join("exe")) {
        Ok(exe) => exe
            .file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| names.iter().any(|n| n == f)),
        Err(_) => false,
    }
}

/// The inode of a namespace link such as `/proc/self/ns/net`.
pub fn netns_inode(link: &Path) -> Result<u64, ProcError> {
    std::fs::metadata(link)
        .map(|m| m.ino())
        .map_err(|source| ProcError::Read {
            path: link.to_path_buf(),
            source,
        })
}

/// The pod UID from a `/proc/<pid>/cgroup` text: kubepods paths carry
/// `pod<uid>`, with dashes (cgroupfs driver) or underscores (systemd driver).
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        // hierarchy-ID:controllers:path
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if !path.contains("kubepods") {
            continue;
        }
        for segment in path.split('/') {
            let mut rest = segment;
            while let Some(i) = rest.find("pod") {
                let candidate = &rest[i + 3..];
                if let Some(uid) = uid_prefix(candidate) {
                    return Some(uid);
                }
                rest = &rest[i + 3..];
            }
        }
    }
    None
}

/// A UUID (8-4-4-4-12 hex, `-` or `_` separated) at the start of `s`.
fn uid_prefix(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() < 36 {
        return None;
    }
    let mut out = String::with_capacity(36);
    for (i, &c) in b[..36].iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' && c != b'_' {
                return None;
            }
            out.push('-');
        } else if c.is_ascii_hexdigit() {
            out.push(c.to_ascii_lowercase() as char);
        } else {
            return None;
        }
    }
    // The UUID must end the segment's id part (`.slice`, `/`, or nothing).
    match b.get(36) {
        None | Some(b'.') | Some(b'/') => Some(out),
        _ => None,
    }
}

/// `POD_NAMESPACE` and `POD_NAME` from a NUL-separated `/proc/<pid>/environ`
/// (the downward API, which Istio's proxy container sets).
pub fn pod_env(environ: &[u8]) -> (Option<String>, Option<String>) {
    let mut ns = None;
    let mut name = None;
    for var in environ.split(|&b| b == 0) {
        let var = String::from_utf8_lossy(var);
        if let Some(v) = var.strip_prefix("POD_NAMESPACE=") {
            ns = Some(v.to_string()).filter(|s| !s.is_empty());
        } else if let Some(v) = var.strip_prefix("POD_NAME=") {
            name = Some(v.to_string()).filter(|s| !s.is_empty());
        }
    }
    (ns, name)
}

/// What the process says of its pod; unreadable files give nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcIdentity {
    /// Downward-API `POD_NAMESPACE` in the process environment.
    pub namespace: Option<String>,
    /// Downward-API `POD_NAME` in the process environment.
    pub name: Option<String>,
    /// The pod UID from the kubepods cgroup path.
    pub uid: Option<String>,
}

pub fn identity(root: &Path, pid: i32) -> ProcIdentity {
    let dir = root.join(pid.to_string());
    let (namespace, name) = std::fs::read(dir.join("environ"))
        .map(|e| pod_env(&e))
        .unwrap_or_default();
    let uid = std::fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|t| pod_uid_from_cgroup(&t));
    ProcIdentity {
        namespace,
        name,
        uid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_pod_uids() {
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6a5b3c2e_1f2d_4c4b_9a9e_0123456789AB.slice/cri-containerd-abc.scope\n";
        assert_eq!(
            pod_uid_from_cgroup(systemd).as_deref(),
            Some("6a5b3c2e-1f2d-4c4b-9a9e-0123456789ab")
        );
        let cgroupfs = "12:memory:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/0123abcd\n11:cpu:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/0123abcd\n";
        assert_eq!(
            pod_uid_from_cgroup(cgroupfs).as_deref(),
            Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
        );
        assert_eq!(pod_uid_from_cgroup("0::/user.slice/user-0.slice\n"), None);
        // "pod" inside another word and a short id are not UIDs.
        assert_eq!(pod_uid_from_cgroup("0::/kubepods/podman/pod1234\n"), None);
        assert_eq!(pod_uid_from_cgroup("garbage"), None);
    }

    #[test]
    fn downward_api_environment() {
        let env = b"PATH=/bin\0POD_NAME=web-1\0POD_NAMESPACE=shop\0X=\0";
        assert_eq!(
            pod_env(env),
            (Some("shop".to_string()), Some("web-1".to_string()))
        );
        assert_eq!(pod_env(b"POD_NAME=\0"), (None, None));
    }

    /// A fake `/proc` made of plain files: discovery by comm or exe, grouping
    /// by the inode of `ns/net`, and processes that vanished are skipped.
    #[test]
    fn scan_and_group_a_fake_proc() {
        let root = tempfile::tempdir().unwrap();
        let mk = |pid: &str, comm: &str, ns: Option<&str>| {
            let d = root.path().join(pid);
            std::fs::create_dir_all(d.join("ns")).unwrap();
            std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
            if let Some(ns) = ns {
                // Hard links share an inode, like two processes in one netns.
                let target = root.path().join(format!("netns-{ns}"));
                if !target.exists() {
                    std::fs::write(&target, "").unwrap();
                }
                std::fs::hard_link(&target, d.join("ns/net")).unwrap();
            }
        };
        mk("10", "envoy", Some("a"));
        mk("12", "envoy", Some("a"));
        mk("11", "envoy", Some("b"));
        mk("13", "sleep", Some("b"));
        mk("14", "envoy", None); // a zombie: no namespace link
        mk("self", "envoy", Some("c")); // not a pid
        let names = vec!["envoy".to_string()];
        let procs = scan(root.path(), &names).unwrap();
        assert_eq!(
            procs.iter().map(|p| p.pid).collect::<Vec<_>>(),
            vec![10, 11, 12]
        );
        let groups = group(&procs);
        assert_eq!(groups.len(), 2);
        let a = netns_inode(&root.path().join("netns-a")).unwrap();
        assert_eq!(groups[&a].pids, vec![10, 12]);
        assert!(scan(&root.path().join("missing"), &names)
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }
}
