//! The per-user directory where a user's softroce processes meet: counters
//! for `softroce stat`, and the state of shared ports (`net::share`).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// `$XDG_RUNTIME_DIR/softroce/<sub>` if that runtime directory is the
/// user's own, else `/tmp/softroce-UID/<sub>`; made mode 0700, and refused
/// if another user owns it (they could otherwise show a user counters that
/// are not theirs).
pub fn user_directory(sub: &str) -> io::Result<PathBuf> {
    let uid = uid();
    // A program run under another uid (setpriv, sudo -u) may keep the
    // first user's XDG_RUNTIME_DIR, which it cannot write.
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| fs::metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid))
        .map(|d| Path::new(&d).join("softroce"));
    let dir = runtime.unwrap_or_else(|| std::env::temp_dir().join(format!("softroce-{uid}"))).join(sub);
    private(dir)
}

/// `/tmp/softroce-UID/<sub>`, private as [`user_directory`]'s, but found
/// from the uid alone: every process of the user must meet there whatever
/// its environment (`XDG_RUNTIME_DIR`, `TMPDIR`) says, or two would take
/// one port's slots unaware of each other.
pub fn host_directory(sub: &str) -> io::Result<PathBuf> {
    private(Path::new("/tmp").join(format!("softroce-{}", uid())).join(sub))
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::getuid()
    }
}

/// Makes `dir` (mode 0700) and checks that it and its parent are the user's.
fn private(dir: PathBuf) -> io::Result<PathBuf> {
    let uid = uid();
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
