//! The built library exports exactly what Debian's libibverbs.so.1 44 exports by default
//! (`symbols.txt`) and what its librdmacm.so.1 does (`rdmacm-symbols.txt`), each at its version,
//! under the soname `libibverbs.so.1` (the loader takes a librdmacm.so.1 link to the same file
//! for the library it already has). A Rust cdylib can lose symbol versions silently on a
//! toolchain change; programs then fail to load.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

mod common;
use common::built_library;

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
    let verbs: BTreeSet<&str> = include_str!("../symbols.txt").lines().collect();
    assert_eq!(verbs.len(), 146, "symbols.txt: 75 IBVERBS_1.x and 71 IBVERBS_PRIVATE_34 symbols");
    let rdmacm: BTreeSet<&str> = include_str!("../rdmacm-symbols.txt").lines().collect();
    assert_eq!(rdmacm.len(), 68, "rdmacm-symbols.txt: 41 rdma_* and 27 rsockets symbols at RDMACM_1.0 to 1.3");
    let expected: BTreeSet<&str> = verbs.union(&rdmacm).copied().collect();
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
