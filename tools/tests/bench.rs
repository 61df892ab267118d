//! `softroce bench` run as a program: the JSON rows are complete and sane,
//! the plot has a line per series, and the table carries the ratios. (The
//! statistics and ratio rules are unit-tested in src/bench.rs.)

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// Keys of every row that has figures.
const KEYS: [&str; 15] = [
    "test",
    "size",
    "mtu",
    "qps",
    "engines",
    "gbytes_per_s",
    "msgs_per_s",
    "cpu_s_per_gb",
    "lat_p50_us",
    "lat_p99_us",
    "ratio_udp",
    "ratio_udp_gso",
    "ratio_tcp",
    "ratio_ref",
    "ref_extra_cpu_ns_per_msg",
];
const STREAMS: [&str; 3] = ["rc-write", "rc-send", "rc-read"];
const MIB: u64 = 1 << 20;

fn bench(args: &[&str]) -> String {
    let Output { status, stdout, stderr } = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("bench")
        .args(args)
        .env_remove("SOFTROCE_LOG")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8(stdout).unwrap(), String::from_utf8(stderr).unwrap());
    assert!(status.success(), "{status}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

/// One quick run, with a plot, shared by the tests: its rows and the SVG.
fn quick_run() -> &'static (Vec<Map<String, Value>>, String) {
    static RUN: OnceLock<(Vec<Map<String, Value>>, String)> = OnceLock::new();
    RUN.get_or_init(|| {
        let svg = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-{}.svg", std::process::id()));
        let stdout = bench(&["--quick", "--json", "--seconds", "0.1", "--plot", svg.to_str().unwrap()]);
        let rows = stdout
            .lines()
            .map(|line| match serde_json::from_str(line) {
                Ok(Value::Object(row)) => row,
                other => panic!("not a JSON object: {line:?} ({other:?})"),
            })
            .collect();
        let drawing = std::fs::read_to_string(&svg).unwrap();
        std::fs::remove_file(&svg).unwrap();
        (rows, drawing)
    })
}

fn text<'a>(row: &'a Map<String, Value>, key: &str) -> &'a str {
    row[key].as_str().unwrap_or_else(|| panic!("{key} of {row:?}"))
}

fn number(row: &Map<String, Value>, key: &str) -> f64 {
    let n = row[key].as_f64().unwrap_or_else(|| panic!("{key} of {row:?} is not a number"));
    assert!(n.is_finite() && n > 0.0, "{key} of {row:?} is not positive and finite");
    n
}

fn find<'a>(
    rows: &'a [Map<String, Value>],
    test: &str,
    size: u64,
    mtu: Option<u64>,
    qps: Option<u64>,
) -> &'a Map<String, Value> {
    rows.iter()
        .find(|r| {
            text(r, "test") == test
                && r["size"].as_u64() == Some(size)
                && r["mtu"].as_u64() == mtu
                && r["qps"].as_u64() == qps
                && r["engines"].as_u64().unwrap_or(1) == 1
        })
        .unwrap_or_else(|| panic!("no {test} row of {size} B, MTU {mtu:?}, {qps:?} QPs"))
}

/// A baseline's row, if it is planned at that size and ran.
fn available<'a>(rows: &'a [Map<String, Value>], test: &str, size: u64) -> Option<&'a Map<String, Value>> {
    rows.iter().find(|r| text(r, "test") == test && r["size"].as_u64() == Some(size) && !r.contains_key("unavailable"))
}

#[test]
fn every_json_row_is_complete_and_sane() {
    let rows = &quick_run().0;
    for (test, size) in [
        ("udp", 4096),
        ("udp-gso", 4096),
        ("tcp", 65536),
        ("udp-lat", 8),
        ("udp-gso-lat", 8),
        ("udp-gso-lat", MIB),
        ("tcp-lat", 8),
        ("tcp-lat", MIB),
    ] {
        find(rows, test, size, None, None);
    }
    // Only the GSO rows may be unavailable: the kernel may refuse GSO.
    for test in ["udp", "tcp", "udp-lat", "tcp-lat"] {
        let row = rows.iter().find(|r| text(r, "test") == test).unwrap();
        assert!(!row.contains_key("unavailable"), "{row:?}");
    }
    for test in STREAMS {
        find(rows, test, MIB, Some(4096), Some(1));
    }
    find(rows, "send-lat", 8, Some(4096), Some(1));
    // A lone 1 MiB message each way, against TCP's and the bare wire's.
    let large = find(rows, "send-lat", MIB, Some(4096), Some(1));
    number(large, "ratio_tcp");
    find(rows, "write-rate", 64, Some(4096), Some(1));
    find(rows, "write-rate-list", 64, Some(4096), Some(1));
    // Rows measured against a reference, in turns: each reference's row
    // comes just before, and only the row has the ratio to it.
    for (test, reference, size, conn) in [
        ("udp-steered", "udp-alone", 64, None),
        ("shared-write", "procs-write", 64, Some(1)),
        ("shared-write", "procs-write", MIB, Some(1)),
    ] {
        let at = rows
            .iter()
            .position(|r| text(r, "test") == test && r["size"].as_u64() == Some(size))
            .unwrap_or_else(|| panic!("no {test} row of {size} B"));
        let (row, before) = (&rows[at], &rows[at - 1]);
        assert_eq!((text(before, "test"), before["size"].as_u64()), (reference, Some(size)), "{before:?}");
        assert_eq!(row["qps"].as_u64(), conn, "{row:?}");
        assert_eq!(text(row, "reference"), reference, "{row:?}");
        number(row, "ratio_ref");
        assert_eq!(row["ratio_ref_rounds"].as_array().map(Vec::len), Some(3), "{row:?}");
        assert!(row["ref_extra_cpu_ns_per_msg"].as_f64().is_some_and(f64::is_finite), "{row:?}");
        assert!(before["ratio_ref"].is_null(), "{before:?}");
    }
    // One busy QP among 1023 idle ones, against the busy one alone, with
    // what each idle pair cost every round.
    let idle = find(rows, "write-rate-idle", 64, Some(4096), Some(1024));
    assert_eq!(text(idle, "reference"), "write-rate", "{idle:?}");
    number(idle, "ratio_ref");
    let costs = idle["idle_qp_costs"].as_array().unwrap_or_else(|| panic!("{idle:?}"));
    assert_eq!(costs.len(), 3, "{idle:?}");
    for cost in costs {
        for key in ["setup_us", "teardown_us"] {
            assert!(cost[key].as_f64().is_some_and(|us| us > 0.0 && us.is_finite()), "{idle:?}");
        }
    }
    // The same 4 QPs over one engine per side and over two.
    let engines = |n| rows.iter().any(|r| text(r, "test") == "rc-write" && r["qps"] == 4 && r["engines"] == n);
    assert!(engines(1) && engines(2), "{rows:?}");

    for row in rows {
        assert!(!row.contains_key("error"), "{row:?}");
        if let Some(why) = row.get("unavailable") {
            assert!(["udp-gso", "udp-gso-lat"].contains(&text(row, "test")), "{row:?}");
            assert!(!why.as_str().unwrap().is_empty());
            continue;
        }
        for key in KEYS {
            assert!(row.contains_key(key), "no {key} in {row:?}");
        }
        let test = text(row, "test");
        for key in ["size", "gbytes_per_s", "msgs_per_s", "cpu_s_per_gb"] {
            number(row, key);
        }
        if test.ends_with("-lat") {
            assert!(number(row, "lat_p50_us") <= number(row, "lat_p99_us"), "{row:?}");
        } else {
            assert!(row["lat_p50_us"].is_null() && row["lat_p99_us"].is_null(), "{row:?}");
        }
        let softroce =
            !["udp", "udp-gso", "tcp", "udp-lat", "udp-gso-lat", "tcp-lat", "udp-alone", "udp-steered"].contains(&test);
        if !softroce {
            for key in ["mtu", "qps", "engines", "ratio_udp", "ratio_udp_gso", "ratio_tcp"] {
                assert!(row[key].is_null(), "{key} of {row:?}");
            }
            continue;
        }
        number(row, "mtu");
        number(row, "qps");
        number(row, "engines");
        // Each ratio is there exactly when its baseline ran and compares.
        let size = row["size"].as_u64().unwrap();
        let baselines = match test {
            "send-lat" => [
                ("ratio_udp", available(rows, "udp-lat", size).is_some()),
                ("ratio_udp_gso", available(rows, "udp-gso-lat", size).is_some()),
                ("ratio_tcp", available(rows, "tcp-lat", size).is_some()),
            ],
            "write-rate" | "write-rate-list" => [
                ("ratio_udp", true),
                ("ratio_udp_gso", available(rows, "udp-gso", 4096).is_some()),
                ("ratio_tcp", false),
            ],
            _ => [
                ("ratio_udp", true),
                ("ratio_udp_gso", available(rows, "udp-gso", 4096).is_some()),
                ("ratio_tcp", true),
            ],
        };
        for (key, expected) in baselines {
            if expected {
                number(row, key);
            } else {
                assert!(row[key].is_null(), "{key} of {row:?}");
            }
        }
    }

    // The ratio is the quotient of the figures.
    let write = find(rows, "rc-write", MIB, Some(4096), Some(1));
    let udp = available(rows, "udp", 4096).unwrap();
    let expected = number(write, "gbytes_per_s") / number(udp, "gbytes_per_s");
    assert!((number(write, "ratio_udp") / expected - 1.0).abs() < 1e-9, "{write:?}");
    let lat = find(rows, "send-lat", 8, Some(4096), Some(1));
    let udp_lat = available(rows, "udp-lat", 8).unwrap();
    let expected = number(lat, "lat_p50_us") / number(udp_lat, "lat_p50_us");
    assert!((number(lat, "ratio_udp") / expected - 1.0).abs() < 1e-9, "{lat:?}");
    if let Some(floor) = available(rows, "udp-gso-lat", 8) {
        let expected = number(lat, "lat_p50_us") / number(floor, "lat_p50_us");
        assert!((number(lat, "ratio_udp_gso") / expected - 1.0).abs() < 1e-9, "{lat:?}");
    }
}

#[test]
fn the_plot_has_a_line_per_series() {
    let (rows, svg) = quick_run();
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"), "{svg}");
    let series: BTreeSet<(&str, u64, u64)> = rows
        .iter()
        .filter(|r| STREAMS.contains(&text(r, "test")) && r["engines"].as_u64() == Some(1))
        .map(|r| (text(r, "test"), r["mtu"].as_u64().unwrap(), r["qps"].as_u64().unwrap()))
        .collect();
    assert!(series.len() >= 3, "{series:?}");
    assert_eq!(svg.matches("<polyline ").count(), series.len(), "{svg}");
    for label in
        ["RC WRITE, MTU 4096, 1 QP", "RC WRITE, MTU 4096, 4 QPs", "RC READ, MTU 4096, 1 QP", "TCP, 64 KiB writes"]
    {
        assert!(svg.contains(label), "no {label:?} in the legend");
    }
    for axis in ["message size (log scale)", "throughput (GB/s)", ">1 MiB<"] {
        assert!(svg.contains(axis), "no {axis:?} on the axes");
    }
}

#[test]
fn the_table_has_ratios_and_a_line_per_row() {
    let stdout = bench(&["--quick", "--test", "tcp,rc-write", "--seconds", "0.05"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("softroce bench: ") && lines[0].contains("load average"), "{stdout}");
    assert!(lines[1].split_whitespace().eq([
        "test", "size", "MTU", "QPs", "eng", "GB/s", "msg/s", "CPU", "s/GB", "p50", "µs", "p99", "µs", "×udp", "×gso",
        "×tcp", "×ref", "retries"
    ]));
    let rc_write: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("rc-write ")).collect();
    assert_eq!(rc_write.len(), 6, "{stdout}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("tcp ")).count(), 1, "{stdout}");
    for line in rc_write {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // No udp rows ran, so only the TCP ratio is there, and rc-write has
        // no reference.
        assert_eq!(&fields[fields.len() - 5..fields.len() - 3], ["-", "-"], "{line}");
        let tcp: f64 = fields[fields.len() - 3].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(tcp > 0.0, "{line}");
        assert_eq!(fields[fields.len() - 2], "-", "{line}");
    }
}

/// `--rounds`: every row once a round, numbered, then a median row each
/// whose ratio is the median of the rounds' ratios.
#[test]
fn rounds_end_with_each_rows_median() {
    let stdout = bench(&["--test", "udp-lat,send-lat", "--size", "8", "--seconds", "0.05", "--rounds", "3", "--json"]);
    let rows: Vec<Map<String, Value>> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let measured: Vec<&Map<String, Value>> = rows.iter().filter(|r| !r["round"].is_null()).collect();
    let medians: Vec<&Map<String, Value>> = rows.iter().filter(|r| r["round"].is_null()).collect();
    let tests = |rows: &[&Map<String, Value>]| rows.iter().map(|r| text(r, "test").to_owned()).collect::<Vec<_>>();
    // udp-lat runs at 8 B and 4 KiB, send-lat at 8 B only.
    assert_eq!(tests(&measured), ["udp-lat", "udp-lat", "send-lat"].repeat(3), "{stdout}");
    let rounds: Vec<u64> = measured.iter().map(|r| r["round"].as_u64().unwrap()).collect();
    assert_eq!(rounds, [1, 1, 1, 2, 2, 2, 3, 3, 3]);
    assert_eq!(tests(&medians), ["udp-lat", "udp-lat", "send-lat"], "{stdout}");
    let send_lat = medians[2];
    assert_eq!(send_lat["median_of_rounds"].as_u64(), Some(3));
    for key in KEYS {
        assert!(send_lat.contains_key(key), "{key} missing from {send_lat:?}");
    }
    let mut ratios: Vec<f64> =
        measured.iter().filter(|r| text(r, "test") == "send-lat").map(|r| number(r, "ratio_udp")).collect();
    ratios.sort_by(f64::total_cmp);
    assert_eq!(number(send_lat, "ratio_udp"), ratios[1], "{stdout}");
}

/// `--stages` in a build without the `stages` feature says what to build
/// instead of printing nothing (with it, `.ci/run` checks the stages).
#[test]
fn stages_without_the_feature_say_how_to_build_it() {
    if softroce::stages::RECORDED {
        return;
    }
    let Output { status, stderr, .. } = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["bench", "--stages", "--test", "udp-lat", "--seconds", "0.05"])
        .output()
        .unwrap();
    let stderr = String::from_utf8(stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("--features stages"), "{stderr}");
}
