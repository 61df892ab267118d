//! `softroce demo` run as a program: every operation must be checked "ok" at
//! both MTUs and the summary must carry numbers. (That the checks catch wrong
//! bytes and completions is unit-tested in src/demo.rs.)

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::process::{Command, Output};

const OPERATIONS: [&str; 8] = [
    "SEND",
    "SEND_WITH_IMM",
    "RDMA_WRITE",
    "RDMA_WRITE_WITH_IMM",
    "RDMA_READ",
    "CMP_SWAP (equal)",
    "CMP_SWAP (not equal)",
    "FETCH_ADD",
];

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A UDP port free on both demo addresses.
fn free_port() -> u16 {
    softroce::net::udp::free_port(&[A, B]).unwrap()
}

fn demo(args: &[&str]) -> (String, String) {
    let Output { status, stdout, stderr } = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("demo")
        .args(args)
        .env_remove("SOFTROCE_LOG")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8(stdout).unwrap(), String::from_utf8(stderr).unwrap());
    assert!(status.success(), "{status}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    (stdout, stderr)
}

/// The number just before `unit` in `line`.
fn number_before(line: &str, unit: &str) -> f64 {
    let head = &line[..line.find(unit).unwrap_or_else(|| panic!("no {unit:?} in {line:?}"))];
    let number = head.split_whitespace().last().unwrap().trim_start_matches(|c: char| !c.is_ascii_digit());
    number.parse().unwrap_or_else(|_| panic!("{number:?} before {unit:?} in {line:?}"))
}

fn summary_line<'a>(stdout: &'a str, label: &str) -> &'a str {
    stdout.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no {label} line in\n{stdout}"))
}

#[test]
fn every_operation_is_ok_at_both_mtus_and_the_summary_has_numbers() {
    let port = free_port().to_string();
    let (stdout, _) = demo(&["--seconds", "0.2", "--port", &port]);
    assert!(stdout.contains(&format!("UDP port {port}")), "{stdout}");
    for mtu in ["MTU 4096:", "MTU 1024:"] {
        assert!(stdout.lines().any(|l| l.starts_with(mtu)), "no {mtu} section in\n{stdout}");
    }
    for op in OPERATIONS {
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| l.trim_start().strip_prefix(op).is_some_and(|rest| rest.starts_with(' ')))
            .collect();
        assert_eq!(lines.len(), 2, "{op} should be checked once per MTU in\n{stdout}");
        assert!(lines.iter().all(|l| l.ends_with(" ok")), "{op} not ok:\n{}", lines.join("\n"));
    }

    let bandwidth = summary_line(&stdout, "bandwidth");
    let gbytes = number_before(bandwidth, "GB/s");
    assert!(gbytes > 0.0, "{bandwidth}");
    assert!((number_before(bandwidth, "Gbit/s") - gbytes * 8.0).abs() < 0.1, "{bandwidth}");
    assert!(number_before(bandwidth, "msg/s") > 0.0, "{bandwidth}");

    let latency = summary_line(&stdout, "latency");
    let median = number_before(latency.split("median").nth(1).unwrap(), "µs");
    let p99 = number_before(latency.split("p99").nth(1).unwrap(), "µs");
    assert!(median > 0.0 && p99 >= median, "{latency}");

    for device in ["demo_a", "demo_b"] {
        let counters = stdout.lines().find(|l| l.contains("counters") && l.contains(device)).expect("counters line");
        assert!(number_before(counters, "packets sent") > 0.0, "{counters}");
        assert_eq!(number_before(counters, "ICRC errors"), 0.0, "{counters}");
    }
}

#[test]
fn a_taken_default_port_is_replaced_and_verbose_traces_packets() {
    // Hold port 4791 on the first address (if something else holds it,
    // the demo cannot bind it either).
    let _holder = UdpSocket::bind((A, 4791));
    let (stdout, stderr) = demo(&["--seconds", "0", "-v"]);
    assert!(stdout.contains("port 4791 unavailable") && stdout.contains("using free port"), "{stdout}");
    let packets: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("softroce::transport") && l.contains("opcode=") && l.contains("psn="))
        .collect();
    // Requests and responses alike.
    for opcode in ["opcode=RC_SEND_FIRST", "opcode=RC_ACKNOWLEDGE"] {
        assert!(packets.iter().any(|l| l.contains(opcode)), "no {opcode} in the packet trace\n{stderr}");
    }
    // The trace covers the checks, not the benchmarks' many thousand packets.
    assert!(packets.len() < 2000, "{} traced packets", packets.len());
}
