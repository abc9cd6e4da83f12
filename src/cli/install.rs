//! `drainshim install`: copies this binary into a shared volume.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// Copies the running executable to `<dir>/drainshim`, via a temporary file
/// and a rename, so a reader never sees half a binary.
pub fn install(dir: &Path) -> Result<PathBuf, Error> {
    let fail = |what: String| Error::Unavailable(what);
    let me = std::env::current_exe().map_err(|e| fail(format!("finding this executable: {e}")))?;
    let dest = dir.join("drainshim");
    let tmp = dir.join(".drainshim.tmp");
    std::fs::copy(&me, &tmp)
        .map_err(|e| fail(format!("copy {} to {}: {e}", me.display(), tmp.display())))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| fail(format!("chmod {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, &dest).map_err(|e| fail(format!("rename to {}: {e}", dest.display())))?;
    Ok(dest)
}
