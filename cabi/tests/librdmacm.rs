//! The library as `librdmacm.so.1` and `libibverbs.so.1`: C programs built against Debian's
//! librdmacm-dev and libibverbs-dev (`-lrdmacm -libverbs`), run with both sonames linked to the
//! cdylib. One finds one library under both names, binds every import at its version at load, and
//! gets librdmacm's answers from the calls that need no peer (`c/rdmacm.c`); one reads what
//! providers and Open MPI read beyond the calls (`c/device.c`).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::built_library;

/// A directory holding `libibverbs.so.1` and `librdmacm.so.1`, both links to the cdylib, as
/// `softroce run` makes it.
fn soname_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softroce-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let lib = built_library();
    for soname in ["libibverbs.so.1", "librdmacm.so.1"] {
        std::os::unix::fs::symlink(&lib, dir.join(soname)).expect("a link");
    }
    dir
}

/// Compiles `c/NAME.c` against the system's headers and libraries into `dir`.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-ldl"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc: {e}"));
    assert!(
        out.status.success(),
        "cc {} failed (needs librdmacm-dev and libibverbs-dev, see .ci/run):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn one_library_under_both_sonames() {
    let dir = soname_dir("rdmacm");
    let exe = compile("rdmacm", &dir);
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .env("LD_BIND_NOW", "1")
        .env("SOFTROCE_ADDR", "127.0.0.1")
        .output()
        .expect("run the C program");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success() && text.contains("rdmacm: all checks passed"), "{}:\n{text}", exe.display());
}

/// `c/device.c` with `SYSFS_PATH` unset and set (with trailing slashes, which are dropped).
#[test]
fn device_memory_and_sysfs_path() {
    let dir = soname_dir("device");
    let exe = compile("device", &dir);
    for sysfs in [None, Some("/tmp/softroce-fake-sys//")] {
        let mut command = Command::new(&exe);
        command.env("LD_LIBRARY_PATH", &dir).env("SOFTROCE_ADDR", "127.0.0.1").env_remove("SYSFS_PATH");
        if let Some(path) = sysfs {
            command.env("SYSFS_PATH", path);
        }
        let out = command.output().expect("run the C program");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && text.contains("device: all checks passed"),
            "SYSFS_PATH={sysfs:?} {}:\n{text}",
            exe.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
