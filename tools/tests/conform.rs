//! `softroce conform`: its own regression run against a softroce peer it
//! starts on loopback (`--self`), and peers that are missing or silent,
//! which must end in errors within bounded time, never a hang.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A base port, from `from` on, with the six TCP ports after it free on
/// every address. The tests run at once and `softroce perf` servers listen
/// on every address, so each test searches a range of its own.
fn free_tcp_base(from: u16) -> u16 {
    for base in (from..from + 9000).step_by(97) {
        let all: Vec<_> = (0..6).map(|i| TcpListener::bind(("0.0.0.0", base + i))).collect();
        if all.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no six free TCP ports in a row");
}

fn free_udp_port(addrs: &[IpAddr]) -> u16 {
    softroce::net::udp::free_port(addrs).unwrap()
}

fn conform(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("conform")
        .args(args)
        .env_remove("SOFTROCE_DEVICE")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

fn at(last: u8, third: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, third, last))
}

#[test]
fn self_conformance_has_no_deviation_in_forty_checks_or_more() {
    let dir = std::env::temp_dir().join(format!("softroce-conform-{}", std::process::id()));
    let pcap = dir.join("run.pcap");
    let ladders = dir.join("ladders");
    std::fs::create_dir_all(&dir).unwrap();
    let (base, udp) = (free_tcp_base(31000), free_udp_port(&[at(1, 77), at(2, 77), at(3, 77)]));
    let output = conform(&[
        "--self",
        "--json",
        "--port",
        &base.to_string(),
        "--roce-port",
        &udp.to_string(),
        "--pcap",
        pcap.to_str().unwrap(),
        "--ladder",
        ladders.to_str().unwrap(),
    ]);
    let lines = json_lines(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(lines.len() >= 40, "{} checks; stderr: {stderr}", lines.len());
    for line in &lines {
        for key in ["id", "spec", "title", "result", "expected", "seen", "detail", "ladder"] {
            assert!(line.get(key).is_some(), "{line} lacks {key}");
        }
        assert_eq!(line["result"], "pass", "{line}");
    }
    assert!(output.status.success(), "{stderr}");
    // Both directions were exercised.
    assert!(lines.iter().any(|l| l["id"].as_str().unwrap().starts_with("resp.")));
    assert!(lines.iter().any(|l| l["id"].as_str().unwrap().starts_with("req.")));
    // The capture holds the run's packets; each check has its ladder.
    let (frames, error) = softroce::capture::read(&std::fs::read(&pcap).unwrap());
    assert!(error.is_none() && frames.len() > 500, "{} frames, {error:?}", frames.len());
    let ladder = std::fs::read_to_string(ladders.join("resp.psn.gap.txt")).unwrap();
    assert!(ladder.contains("NAK PSN sequence error"), "{ladder}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_peer_that_is_not_there_gives_errors_in_bounded_time() {
    let (base, udp) = (free_tcp_base(41000), free_udp_port(&[at(1, 79)]));
    let started = Instant::now();
    let output = conform(&[
        "127.0.79.2",
        "--local-addr",
        "127.0.79.1",
        "--json",
        "--timeout",
        "1",
        "--port",
        &base.to_string(),
        "--roce-port",
        &udp.to_string(),
    ]);
    let lines = json_lines(&output);
    assert!(lines.len() >= 40);
    assert!(lines.iter().all(|l| l["result"] == "error"), "{lines:?}");
    assert!(lines.iter().all(|l| !l["detail"].as_str().unwrap_or("").is_empty()));
    assert_eq!(output.status.code(), Some(2));
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
}

#[test]
fn a_peer_that_accepts_and_never_speaks_is_an_error() {
    let udp = free_udp_port(&[at(4, 79)]);
    // A write server that takes the connection and says nothing. Its port
    // is bound at once: one found free a moment before may have gone to
    // another test's outgoing connection since (51000 is an ephemeral port).
    let (base, listener) = (51000..60000)
        .step_by(97)
        .find_map(|base| Some((base, TcpListener::bind(("127.0.79.3", base)).ok()?)))
        .expect("a free TCP port");
    let mute = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
    });
    let output = conform(&[
        "127.0.79.3",
        "--local-addr",
        "127.0.79.4",
        "--json",
        "--timeout",
        "1",
        "--only",
        "resp.write.ack",
        "--port",
        &base.to_string(),
        "--roce-port",
        &udp.to_string(),
    ]);
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["result"], "error");
    assert!(lines[0]["detail"].as_str().unwrap().contains("Timed out"), "{}", lines[0]);
    assert_eq!(output.status.code(), Some(2));
    mute.join().unwrap();
}
