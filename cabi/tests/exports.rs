//! The built library exports exactly what Debian's libibverbs.so.1 44 exports by default
//! (`symbols.txt`), each at its version, under the soname `libibverbs.so.1`. A Rust cdylib can
//! lose symbol versions silently on a toolchain change; programs then fail to load.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cdylib cargo built with this test: in target/<profile>/deps/, beside the test executable
/// (`cargo test` leaves it there), else in target/<profile>/ (where `cargo build` puts it).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let deps = exe.parent().expect("test executable in target/<profile>/deps");
    let candidates: Vec<PathBuf> =
        [Some(deps), deps.parent()].into_iter().flatten().map(|dir| dir.join("libsoftroce_ibverbs.so")).collect();
    candidates.iter().find(|lib| lib.is_file()).cloned().unwrap_or_else(|| {
        panic!("the cdylib is missing: none of {candidates:?} exists; `cargo test -p softroce-ibverbs` builds it")
    })
}

fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf (binutils): {e}"));
    assert!(out.status.success(), "readelf {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("readelf prints UTF-8")
}

/// (type, name) of every dynamic symbol the library defines, version suffix included.
fn defined_symbols(lib: &Path) -> Vec<(String, String)> {
    let mut symbols = Vec::new();
    for line in readelf(&["--dyn-syms", "-W"], lib).lines() {
        // Num: Value Size Type Bind Vis Ndx Name
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [num, _value, _size, kind, _bind, _vis, ndx, name] = fields[..] else { continue };
        let is_entry = num.strip_suffix(':').is_some_and(|n| n.parse::<u32>().is_ok());
        if !is_entry || ndx == "UND" {
            continue;
        }
        // A version definition, as GNU ld emits them (lld does not).
        if ndx == "ABS" && !name.contains('@') {
            continue;
        }
        symbols.push((kind.to_string(), name.to_string()));
    }
    symbols
}

#[test]
fn exports_are_symbols_txt() {
    let lib = built_library();
    let expected: BTreeSet<&str> = include_str!("../symbols.txt").lines().collect();
    assert_eq!(expected.len(), 146, "symbols.txt: 75 IBVERBS_1.x and 71 IBVERBS_PRIVATE_34 symbols");
    let symbols = defined_symbols(&lib);
    let actual: BTreeSet<&str> = symbols.iter().map(|(_, name)| name.as_str()).collect();
    let missing: Vec<_> = expected.difference(&actual).collect();
    let extra: Vec<_> = actual.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "exports of {} differ from symbols.txt\nmissing: {missing:#?}\nextra (unversioned, hidden or unknown): {extra:#?}",
        lib.display()
    );
}

#[test]
fn only_one_export_is_data() {
    let lib = built_library();
    for (kind, name) in defined_symbols(&lib) {
        let want = if name.starts_with("verbs_allow_disassociate_destroy@@") { "OBJECT" } else { "FUNC" };
        assert_eq!(kind, want, "type of {name}");
    }
}

#[test]
fn soname_is_libibverbs_so_1() {
    let lib = built_library();
    let dynamic = readelf(&["-d", "-W"], &lib);
    let soname =
        dynamic.lines().find(|l| l.contains("(SONAME)")).unwrap_or_else(|| panic!("{} has no SONAME", lib.display()));
    assert!(soname.contains("[libibverbs.so.1]"), "{soname}");
}
