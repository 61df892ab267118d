//! What the integration tests share.

use std::path::PathBuf;

/// The cdylib cargo built with this test: in target/<profile>/deps/, beside the test executable
/// (`cargo test` leaves it there), else in target/<profile>/ (where `cargo build` puts it).
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let deps = exe.parent().expect("test executable in target/<profile>/deps");
    let candidates: Vec<PathBuf> =
        [Some(deps), deps.parent()].into_iter().flatten().map(|dir| dir.join("libsoftroce_ibverbs.so")).collect();
    candidates.iter().find(|lib| lib.is_file()).cloned().unwrap_or_else(|| {
        panic!("the cdylib is missing: none of {candidates:?} exists; `cargo test -p softroce-ibverbs` builds it")
    })
}
