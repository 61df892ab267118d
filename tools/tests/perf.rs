//! `softroce perf` against itself over loopback UDP (server on 127.0.0.1,
//! client on 127.0.0.2, each a `--local-addr` device) for every test, and
//! against stand-in peers that break perftest's TCP exchange.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};

const SERVER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const CLIENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// What the server prints once it listens.
const LISTENING: &str = "* Waiting for client to connect... *";

/// A UDP port free on both addresses.
fn free_udp_port() -> u16 {
    softroce::net::udp::free_port(&[SERVER_IP, CLIENT_IP]).unwrap()
}

fn free_tcp_port() -> u16 {
    TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port()
}

fn perf(local: IpAddr, tcp: u16, udp: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_softroce"));
    cmd.arg("perf")
        .args(args)
        .args(["--local-addr", &local.to_string(), "-p", &tcp.to_string()])
        .args(["--roce-port", &udp.to_string(), "--timeout", "30"])
        .env_remove("SOFTROCE_DEVICE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A finished run.
struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

/// Reads a child's output to the end in the background.
fn collect(mut child: Child, head: String, mut stdout: impl Read + Send + 'static) -> Run {
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        rest
    });
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    Run { stdout: head + &out.join().unwrap(), stderr: err, success: status.success() }
}

/// Runs a server and a client of `test` with the same options.
fn pair(args: &[&str]) -> (Run, Run) {
    let (tcp, udp) = (free_tcp_port(), free_udp_port());
    let mut server = perf(SERVER_IP, tcp, udp, args).spawn().unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut head = String::new();
    while !head.contains(LISTENING) {
        if out.read_line(&mut head).unwrap() == 0 {
            break;
        }
    }
    let server_out = std::thread::spawn(move || collect(server, head, out));
    let mut client = perf(CLIENT_IP, tcp, udp, args).arg(SERVER_IP.to_string()).spawn().unwrap();
    let stdout = client.stdout.take().unwrap();
    let client = collect(client, String::new(), stdout);
    (server_out.join().unwrap(), client)
}

/// The rows of the result table: the lines after the header line starting
/// with `header`, up to the closing dashes.
fn rows(run: &Run, header: &str) -> Vec<Vec<String>> {
    let mut lines = run.stdout.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table in:\n{}\n{}", run.stdout, run.stderr);
    lines.take_while(|l| !l.starts_with("-----")).map(|l| l.split_whitespace().map(str::to_owned).collect()).collect()
}

const BW: &str = " #bytes     #iterations    BW peak[MB/sec]";
const LAT: &str = " #bytes #iterations    t_min[usec]";

/// Both sides succeed; the client's table has a row per size with the
/// iterations of all QPs and a positive bandwidth; returns both tables.
fn bw(args: &[&str], sizes: &[&str], iters: &str) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let (server, client) = pair(args);
    for run in [&server, &client] {
        assert!(run.success, "{args:?}:\n{}\n{}", run.stdout, run.stderr);
    }
    let (s, c) = (rows(&server, BW), rows(&client, BW));
    assert_eq!(c.len(), sizes.len(), "{}", client.stdout);
    for (row, size) in c.iter().zip(sizes) {
        assert_eq!(row.len(), 5, "{row:?}");
        assert_eq!((row[0].as_str(), row[1].as_str()), (*size, iters), "{row:?}");
        // Two decimals of MB/s can round a tiny message's rate to 0.00;
        // the message rate has six.
        assert!(row[3].parse::<f64>().unwrap() >= 0.0, "{row:?}");
        assert!(row[4].parse::<f64>().unwrap() > 0.0, "{row:?}");
    }
    (s, c)
}

#[test]
fn write_bw_reports_the_clients_figures_on_both_sides() {
    let (server, client) = bw(&["write", "-s", "65536", "-n", "200", "-q", "2"], &["65536"], "400");
    // The server prints what the client sent it, as perftest's does.
    assert_eq!(server, client);
}

#[test]
fn write_bw_with_post_lists() {
    let args = ["write", "-s", "64", "-n", "1600", "-l", "16", "-q", "2"];
    let (server, client) = bw(&args, &["64"], "3200");
    assert_eq!(server, client);
    let (_, run) = pair(&args);
    assert!(
        run.stdout.contains("Post List requested - CQ moderation will be the size of the post list"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains(" Post List       : 16\n CQ Moderation   : 16\n"), "{}", run.stdout);
    assert!(run.stdout.contains("                    RDMA_Write Post List BW Test\n"), "{}", run.stdout);
    // Not a multiple, and not for latency tests: perftest's refusals.
    let refused = perf(CLIENT_IP, 1, 1, &["write", "-n", "100", "-l", "16"]).output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("multiple of post list size"), "{refused:?}");
    let refused = perf(CLIENT_IP, 1, 1, &["write", "--lat", "-l", "4"]).output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("BW tests only"), "{refused:?}");
}

#[test]
fn read_bw() {
    let (server, client) = bw(&["read", "-s", "4096", "-n", "300", "-q", "3", "-m", "1024"], &["4096"], "900");
    assert_eq!(server, client);
}

#[test]
fn atomic_bw_both_types() {
    for kind in ["FETCH_AND_ADD", "CMP_AND_SWAP"] {
        let (server, client) = bw(&["atomic", "-n", "500", "-q", "2", "-A", kind], &["8"], "1000");
        assert_eq!(server, client);
    }
}

#[test]
fn send_bw_rc_uc_ud() {
    for (conn, size) in [("RC", "100000"), ("UC", "2048"), ("UD", "1024")] {
        let (server, _) = bw(&["send", "-c", conn, "-s", size, "-n", "300", "-q", "2"], &[size], "600");
        // The server counts what it received, with no peak.
        assert_eq!(server.len(), 1);
        assert_eq!((server[0][0].as_str(), server[0][1].as_str(), server[0][2].as_str()), (size, "600", "0.00"));
    }
}

#[test]
fn all_sizes() {
    let sizes: Vec<String> = (1..24).map(|i| (1u32 << i).to_string()).collect();
    let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
    bw(&["write", "-a", "-n", "5"], &sizes, "5");
    // SEND over UD stops at the MTU (4096 between --local-addr devices).
    let (server, _) = bw(&["send", "-a", "-c", "UD", "-n", "20"], &sizes[..12], "20");
    assert_eq!(server.len(), 12);
}

#[test]
fn bidirectional_sums_both_sides() {
    for test in ["write", "read", "atomic", "send"] {
        let (server, client) = pair(&[test, "-b", "-n", "300", "-q", "2"]);
        for run in [&server, &client] {
            assert!(run.success, "{test}:\n{}\n{}", run.stdout, run.stderr);
            assert!(run.stdout.contains("Bidirectional BW Test"), "{}", run.stdout);
        }
        let (s, c) = (rows(&server, BW), rows(&client, BW));
        assert_eq!((s.len(), c.len()), (1, 1));
        // Each side prints the sum of both: the same figures.
        assert_eq!(s[0], c[0], "{test}");
        assert_eq!(c[0][1], "600");
    }
}

#[test]
fn duration_counts_the_middle_of_the_run() {
    for test in ["write", "send"] {
        let (server, client) = pair(&[test, "-D", "2", "-q", "2", "-s", "4096"]);
        for run in [&server, &client] {
            assert!(run.success, "{test}:\n{}\n{}", run.stdout, run.stderr);
        }
        for table in [rows(&server, BW), rows(&client, BW)] {
            assert_eq!(table.len(), 1, "{table:?}");
            assert_eq!(table[0][0], "4096");
            // No peak with -D, and some messages counted.
            assert_eq!(table[0][2], "0.00");
            assert!(table[0][1].parse::<u64>().unwrap() > 0, "{table:?}");
        }
    }
}

#[test]
fn report_gbits() {
    let (server, client) = pair(&["write", "-n", "100", "--report_gbits"]);
    assert!(server.success && client.success, "{}\n{}", client.stdout, client.stderr);
    assert!(client.stdout.contains(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"));
}

#[test]
fn latency_tests() {
    for (args, both) in [
        (&["write", "--lat", "-n", "200", "-s", "64"][..], true),
        (&["send", "--lat", "-n", "200", "-s", "64"][..], true),
        (&["send", "--lat", "-c", "UD", "-n", "200", "-s", "64"][..], true),
        (&["read", "--lat", "-n", "200", "-s", "64"][..], false),
        (&["atomic", "--lat", "-n", "200", "-A", "CMP_AND_SWAP"][..], false),
    ] {
        let (server, client) = pair(args);
        for run in [&server, &client] {
            assert!(run.success, "{args:?}:\n{}\n{}", run.stdout, run.stderr);
        }
        let size = if args[0] == "atomic" { "8" } else { "64" };
        let c = rows(&client, LAT);
        assert_eq!(c.len(), 1, "{}", client.stdout);
        assert_eq!((c[0][0].as_str(), c[0][1].as_str(), c[0].len()), (size, "200", 9), "{args:?}");
        if both {
            assert_eq!(rows(&server, LAT)[0][..2], c[0][..2]);
        }
    }
}

/// A stand-in server that answers the version message with `reply` and
/// then closes; returns the client's run.
fn against_fake_server(reply: Vec<u8>) -> Run {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let tcp = listener.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut version = [0u8; 16];
        s.read_exact(&mut version).unwrap();
        assert_eq!(&version[..5], b"6.06\0");
        let _ = s.write_all(&reply);
        // Then nothing more: the client sees the end of the stream.
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let mut client =
        perf(CLIENT_IP, tcp, free_udp_port(), &["write", "-n", "5"]).arg(SERVER_IP.to_string()).spawn().unwrap();
    let stdout = client.stdout.take().unwrap();
    let run = collect(client, String::new(), stdout);
    fake.join().unwrap();
    run
}

#[test]
fn malformed_peers_are_clear_errors() {
    let version = b"6.06\0\0\0\0\0\0\0\0\0\0\0\0".to_vec();
    let setup = [&version[..], &4096u32.to_be_bytes(), &64u32.to_be_bytes(), b"3\0"].concat();
    let garbage_key = [&setup[..], &[b'z'; 108]].concat();
    for (reply, expected) in [
        (b"4.0\0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec(), "older than 5.70"),
        (b"\xff\xfe garbage \0\0\0\0\0\0".to_vec(), "older than 5.70"),
        (version[..10].to_vec(), "closed the connection"),
        (garbage_key, "Couldn't parse line"),
    ] {
        let run = against_fake_server(reply);
        assert!(!run.success, "{}", run.stdout);
        assert!(run.stderr.contains(expected), "{expected:?} not in {:?}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

#[test]
fn options_perftest_refuses_are_refused() {
    for args in [
        &["read", "-c", "UC"][..],
        &["atomic", "-s", "64"],
        &["write", "-c", "UD"],
        &["write", "-n", "2"],
        &["write", "-D", "2", "-a"],
        &["read", "--lat", "-q", "2"],
        &["send", "-b", "--lat"],
    ] {
        let out = perf(CLIENT_IP, free_tcp_port(), free_udp_port(), args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
    }
}
