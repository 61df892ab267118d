//! Every test that rxe-spec names must exist, so the spec cannot drift from
//! the code that checks it. A Rust test is named `path.rs::test_name`; a
//! row of a test script `tools/SCRIPT::ROW` (the kernel-rxe interop suite,
//! `tools/stock-programs`), and a check of a C test `path.c::TEXT`, where
//! ROW and TEXT are text the script or the check spells out.

use std::fs;
use std::path::Path;

/// `path::name` references in backticks after "Test:" in the spec pages:
/// Rust tests (`path.rs::name`) and interop scenarios (`tools/interop/…::name`).
fn references(page: &str) -> Vec<(String, String)> {
    let mut refs = Vec::new();
    let mut in_tests = false;
    for line in page.lines() {
        if line.trim().is_empty() || line.starts_with("**") {
            in_tests = false;
        }
        if line.contains("Test:") {
            in_tests = true;
        }
        if !in_tests {
            continue;
        }
        for quoted in line.split('`').skip(1).step_by(2) {
            if let Some((path, name)) = quoted.rsplit_once("::") {
                if path.ends_with(".rs") || path.ends_with(".c") || path.starts_with("tools/") {
                    refs.push((path.to_string(), name.to_string()));
                }
            }
        }
    }
    refs
}

#[test]
fn every_named_test_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    let mut missing = Vec::new();
    for entry in fs::read_dir(root.join("rxe-spec")).unwrap() {
        let page_path = entry.unwrap().path();
        if page_path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let page = fs::read_to_string(&page_path).unwrap();
        for (path, name) in references(&page) {
            checked += 1;
            let source = fs::read_to_string(root.join(&path)).unwrap_or_default();
            let defined = if path.ends_with(".rs") {
                source.contains(&format!("fn {name}("))
            } else {
                // A scenario of a script or a check of a C test, by its text.
                !name.is_empty() && source.contains(name.as_str())
            };
            if !defined {
                missing.push(format!("{}: {path}::{name}", page_path.display()));
            }
        }
    }
    assert!(checked >= 20, "only {checked} test references found in rxe-spec");
    assert!(missing.is_empty(), "rxe-spec names tests that do not exist:\n{}", missing.join("\n"));
}

/// The numbered statements of a page (`**X-1. Title.**` to the next one or
/// the next heading), as (number, text).
fn statements(page: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    for line in page.lines() {
        let number = line.strip_prefix("**").and_then(|rest| rest.split_once(". ")).map(|(n, _)| n);
        match number {
            Some(n) if n.contains('-') && !n.contains(' ') => found.push((n.to_string(), String::new())),
            _ if line.starts_with('#') => found.push((String::new(), String::new())),
            _ => {}
        }
        if let Some((_, text)) = found.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    found.retain(|(number, _)| !number.is_empty());
    found
}

/// A statement either names the tests that check it or says it is an
/// observation (a measured fact about other systems, with nothing of ours to
/// test): "Test: none (observation)".
#[test]
fn every_statement_names_a_test_or_is_an_observation() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut untested = Vec::new();
    let mut seen = 0;
    for entry in fs::read_dir(root.join("rxe-spec")).unwrap() {
        let page_path = entry.unwrap().path();
        if page_path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let page = fs::read_to_string(&page_path).unwrap();
        for (number, text) in statements(&page) {
            seen += 1;
            let observation = text.contains("Test: none (observation)");
            if !observation && references(&text).is_empty() {
                untested.push(format!("{}: {number}", page_path.display()));
            }
        }
    }
    assert!(seen >= 100, "only {seen} statements found in rxe-spec");
    assert!(untested.is_empty(), "statements with no test and not marked observations:\n{}", untested.join("\n"));
}

#[test]
fn statements_run_to_the_next_statement_or_heading() {
    let page = "# A\n**W-1. X.** one\nTest: `a.rs::t`\n\n**W-2. Y.** two\n## B\nprose\n**W-2a. Z.** three\n";
    let numbers: Vec<_> = statements(page).into_iter().map(|(n, t)| (n, t.lines().count())).collect();
    assert_eq!(numbers, vec![("W-1".into(), 3), ("W-2".into(), 1), ("W-2a".into(), 1)]);
}

#[test]
fn references_are_found_in_test_lines_only() {
    let page = "**W-1. X.** text `a.rs::not_a_test`\nTest: `src/x.rs::one`,\n`tests/y.rs::two`\n\nplain `z.rs::no`";
    assert_eq!(references(page), vec![("src/x.rs".into(), "one".into()), ("tests/y.rs".into(), "two".into())]);
    let page = "**I-1. Y.** text\nTest: `tools/interop/suite::RC 1 B, MTU 1024`, `README.md::no`";
    assert_eq!(references(page), vec![("tools/interop/suite".into(), "RC 1 B, MTU 1024".into())]);
}
