//! The per-user directory where a user's softroce processes meet: counters
//! for `softroce stat`, and the state of shared ports (`net::share`).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// `$XDG_RUNTIME_DIR/softroce/<sub>` if that runtime directory is the
/// user's own, else `/tmp/softroce-UID/<sub>`; made mode 0700, and refused
/// if another user owns it (they could otherwise show a user counters that
/// are not theirs, or take part in a shared port's bookkeeping).
pub fn user_directory(sub: &str) -> io::Result<PathBuf> {
    // SAFETY: getuid has no preconditions.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::getuid() };
    // A program run under another uid (setpriv, sudo -u) may keep the
    // first user's XDG_RUNTIME_DIR, which it cannot write.
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| fs::metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid))
        .map(|d| Path::new(&d).join("softroce"));
    let dir = runtime.unwrap_or_else(|| std::env::temp_dir().join(format!("softroce-{uid}"))).join(sub);
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    for owned in [dir.parent(), Some(dir.as_path())].into_iter().flatten() {
        if fs::metadata(owned)?.uid() != uid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} belongs to another user", owned.display()),
            ));
        }
    }
    Ok(dir)
}
