//! `softroce pingpong` against itself over loopback UDP (server on
//! 127.0.0.1, client on 127.0.0.2, each a `--local-addr` device), and its
//! TCP exchange against a stand-in that speaks the C programs' bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const SERVER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const CLIENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A UDP port free on both addresses.
fn free_udp_port() -> u16 {
    softroce::net::udp::free_port(&[SERVER_IP, CLIENT_IP]).unwrap()
}

fn free_tcp_port() -> u16 {
    TcpListener::bind(("::", 0)).or_else(|_| TcpListener::bind(("0.0.0.0", 0))).unwrap().local_addr().unwrap().port()
}

fn pingpong(local: IpAddr, tcp: u16, udp: u16, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_softroce"));
    cmd.arg("pingpong")
        .args(["--local-addr", &local.to_string(), "-g", "1", "-p", &tcp.to_string()])
        .args(["--roce-port", &udp.to_string()])
        .args(extra)
        .env_remove("SOFTROCE_DEVICE")
        .stdin(Stdio::null());
    // Nothing may hang a test: give up after a while without progress.
    if !extra.contains(&"--timeout") {
        cmd.args(["--timeout", "30"]);
    }
    cmd
}

/// A server that is listening, its output read in the background.
struct Server {
    child: Child,
    first_line: String,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// Starts a server and waits until it listens (it prints its address then).
fn start_server(tcp: u16, udp: u16, extra: &[&str]) -> Server {
    let mut child = pingpong(SERVER_IP, tcp, udp, extra).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first_line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut first_line).unwrap();
    let mut stderr = child.stderr.take().unwrap();
    Server {
        child,
        first_line,
        stdout: std::thread::spawn(move || {
            let mut rest = String::new();
            stdout.read_to_string(&mut rest).unwrap();
            rest
        }),
        stderr: std::thread::spawn(move || {
            let mut all = String::new();
            stderr.read_to_string(&mut all).unwrap();
            all
        }),
    }
}

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

impl Server {
    fn finish(mut self) -> Run {
        let status = self.child.wait().unwrap();
        Run {
            stdout: self.first_line + &self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
            success: status.success(),
        }
    }
}

fn to_run(output: Output) -> Run {
    Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        success: output.status.success(),
    }
}

/// The QPN and PSN of an address line, checked against the C format.
fn address(line: &str, label: &str, ip: IpAddr, ud_local: bool) -> (u32, u32) {
    let rest = line.strip_prefix(&format!("  {label} LID 0x0000, QPN 0x")).unwrap_or_else(|| panic!("{line:?}"));
    let (qpn, rest) = rest.split_at(6);
    let rest = rest.strip_prefix(", PSN 0x").unwrap_or_else(|| panic!("{line:?}"));
    let (psn, rest) = rest.split_at(6);
    let sep = if ud_local { ":" } else { "," };
    assert_eq!(rest, format!("{sep} GID ::ffff:{ip}"), "{line:?}");
    (u32::from_str_radix(qpn, 16).unwrap(), u32::from_str_radix(psn, 16).unwrap())
}

/// Runs a server and a client with the same options; both must finish and
/// print the C programs' lines.
fn pair(extra: &[&str], iters: u32, size: u64) {
    let ud = extra.contains(&"--ud");
    let n = iters.to_string();
    let mut args = vec!["-n", &n];
    args.extend_from_slice(extra);
    let (tcp, udp) = (free_tcp_port(), free_udp_port());
    let server = start_server(tcp, udp, &args);
    let mut client_args = args.clone();
    client_args.push("127.0.0.1");
    let client = to_run(pingpong(CLIENT_IP, tcp, udp, &client_args).output().unwrap());
    let server = server.finish();
    let context = format!(
        "{extra:?}\n--- client\n{}{}\n--- server\n{}{}",
        client.stdout, client.stderr, server.stdout, server.stderr
    );
    assert!(client.success && server.success, "{context}");
    for (run, mine, theirs) in [(&client, CLIENT_IP, SERVER_IP), (&server, SERVER_IP, CLIENT_IP)] {
        let lines: Vec<&str> = run.stdout.lines().collect();
        let qps = if extra.contains(&"--srq") { 4 } else { 1 };
        assert_eq!(lines.len(), 2 * qps + 2, "{context}");
        for line in &lines[..qps] {
            address(line, "local address: ", mine, ud);
        }
        for line in &lines[qps..2 * qps] {
            address(line, "remote address:", theirs, false);
        }
        let bytes = format!("{} bytes in ", size * u64::from(iters) * 2);
        assert!(lines[2 * qps].starts_with(&bytes) && lines[2 * qps].ends_with(" Mbit/sec"), "{context}");
        let iters_line = format!("{iters} iters in ");
        assert!(lines[2 * qps + 1].starts_with(&iters_line) && lines[2 * qps + 1].ends_with(" usec/iter"), "{context}");
    }
    // Each side's remote line is the other's local line.
    let local = |run: &Run, ip| address(run.stdout.lines().next().unwrap(), "local address: ", ip, ud);
    let remote = |run: &Run, ip| {
        let qps = if extra.contains(&"--srq") { 4 } else { 1 };
        address(run.stdout.lines().nth(qps).unwrap(), "remote address:", ip, false)
    };
    assert_eq!(local(&client, CLIENT_IP), remote(&server, CLIENT_IP), "{context}");
    assert_eq!(local(&server, SERVER_IP), remote(&client, SERVER_IP), "{context}");
}

#[test]
fn rc_sizes_with_check() {
    for size in [1u64, 1000, 4096, 20000] {
        pair(&["-s", &size.to_string(), "-c"], 200, size);
    }
}

#[test]
fn uc_sizes_with_check() {
    for size in [1u64, 1000, 4096, 20000] {
        pair(&["--uc", "-s", &size.to_string(), "-c"], 200, size);
    }
}

#[test]
fn ud_sizes_up_to_the_mtu_with_check() {
    for size in [1u64, 1000, 4096] {
        pair(&["--ud", "-s", &size.to_string(), "-c"], 200, size);
    }
}

#[test]
fn srq_with_check() {
    for size in [1u64, 4096, 20000] {
        pair(&["--srq", "-q", "4", "-s", &size.to_string(), "-c"], 200, size);
    }
}

#[test]
fn defaults_events_and_small_rx_depth() {
    pair(&["-c"], 1000, 4096);
    pair(&["-e", "-c"], 200, 4096);
    pair(&["--ud", "-e", "-c", "-r", "3"], 200, 1024);
    pair(&["--uc", "-e", "-m", "256", "-s", "3000", "-c"], 200, 3000);
    pair(&["--srq", "-q", "4", "-r", "4", "-e", "-c"], 200, 4096);
}

/// The numbers of a `--stats` line, in order.
fn stats(run: &Run) -> Vec<u64> {
    let line = run.stdout.lines().find(|l| l.starts_with("softroce: sent ")).expect("a --stats line");
    line.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect()
}

#[test]
fn packets_sent_with_a_broken_icrc_are_dropped_counted_and_retransmitted() {
    let (tcp, udp) = (free_tcp_port(), free_udp_port());
    let server = start_server(tcp, udp, &["-n", "40", "-c", "--stats"]);
    let client_args = ["-n", "40", "-c", "--stats", "--corrupt-icrc", "5", "127.0.0.1"];
    let client = to_run(pingpong(CLIENT_IP, tcp, udp, &client_args).output().unwrap());
    let server = server.finish();
    let context =
        format!("--- client\n{}{}\n--- server\n{}{}", client.stdout, client.stderr, server.stdout, server.stderr);
    assert!(client.success && server.success, "{context}");
    // sent, broken, received, ICRC errors, malformed, retries, timeouts, NAKs, duplicates
    let (mine, theirs) = (stats(&client), stats(&server));
    assert_eq!(mine[0] / 5, mine[1], "every 5th packet is broken: {context}");
    assert!(mine[1] > 0, "{context}");
    assert_eq!(theirs[3], mine[1], "the server drops each broken packet as an ICRC error: {context}");
    assert!(mine[5] > 0, "and the client sends them again: {context}");
    assert_eq!((mine[3], theirs[1]), (0, 0), "{context}");
}

#[test]
fn ud_refuses_messages_over_the_mtu() {
    let run = to_run(pingpong(SERVER_IP, free_tcp_port(), free_udp_port(), &["--ud", "-s", "4097"]).output().unwrap());
    assert!(!run.success);
    assert_eq!(run.stderr, "Requested size larger than port MTU (4096)\n");
}

/// `sprintf(msg, "%04x:%06x:%06x:%s", ...)` of an all-zero address.
const UNUSED: [u8; 52] = *b"0000:000000:000000:00000000000000000000000000000000\0";

/// A C-style message: `%04x:%06x:%06x:` and the wire GID, NUL-terminated.
fn c_message(qpn: u32, psn: u32, ip: Ipv4Addr) -> [u8; 52] {
    let o = ip.octets();
    let text =
        format!("0000:{qpn:06x}:{psn:06x}:00000000000000000000ffff{:02x}{:02x}{:02x}{:02x}", o[0], o[1], o[2], o[3]);
    let mut msg = [0u8; 52];
    msg[..51].copy_from_slice(text.as_bytes());
    msg
}

/// Checks a 52-byte message in the C format and returns its QPN and PSN.
fn parse_c_message(msg: &[u8; 52], ip: Ipv4Addr) -> (u32, u32) {
    assert_eq!(msg[51], 0, "{msg:?}");
    let text = std::str::from_utf8(&msg[..51]).unwrap();
    let o = ip.octets();
    let gid = format!("00000000000000000000ffff{:02x}{:02x}{:02x}{:02x}", o[0], o[1], o[2], o[3]);
    assert_eq!(&text[..5], "0000:", "{text}");
    assert_eq!((&text[11..12], &text[18..19], &text[19..]), (":", ":", gid.as_str()), "{text}");
    (u32::from_str_radix(&text[5..11], 16).unwrap(), u32::from_str_radix(&text[12..18], 16).unwrap())
}

#[test]
fn server_speaks_the_c_exchange() {
    let (tcp, udp) = (free_tcp_port(), free_udp_port());
    let server = start_server(tcp, udp, &["-n", "1", "--timeout", "1"]);
    let (local_qpn, local_psn) = address(server.first_line.trim_end(), "local address: ", SERVER_IP, false);
    let mut stream = TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(&c_message(0xabc, 0x123456, Ipv4Addr::new(127, 0, 0, 2))).unwrap();
    let mut reply = [0u8; 52];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(parse_c_message(&reply, Ipv4Addr::new(127, 0, 0, 1)), (local_qpn, local_psn));
    stream.write_all(b"done\0").unwrap();
    drop(stream);
    // Nobody sends RoCE: the server gives up after --timeout.
    let run = server.finish();
    assert!(!run.success);
    let remote = run.stdout.lines().nth(1).unwrap();
    assert_eq!(remote, "  remote address: LID 0x0000, QPN 0x000abc, PSN 0x123456, GID ::ffff:127.0.0.2");
    assert!(run.stderr.contains("no progress"), "{}", run.stderr);
}

#[test]
fn srq_server_exchanges_256_addresses() {
    let (tcp, udp) = (free_tcp_port(), free_udp_port());
    let server = start_server(tcp, udp, &["--srq", "-q", "2", "-n", "1", "--timeout", "1"]);
    let mut stream = TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for i in 0..256u32 {
        // ibv_srq_pingpong sends its unused entries as zeros.
        let msg = if i < 2 { c_message(0x100 + i, 0x200 + i, Ipv4Addr::new(127, 0, 0, 2)) } else { UNUSED };
        stream.write_all(&msg).unwrap();
    }
    let mut replies = vec![0u8; 52 * 256];
    stream.read_exact(&mut replies).unwrap();
    for (i, reply) in replies.chunks_exact(52).enumerate() {
        let reply: &[u8; 52] = reply.try_into().unwrap();
        if i < 2 {
            parse_c_message(reply, Ipv4Addr::new(127, 0, 0, 1));
        } else {
            assert_eq!(reply, &UNUSED);
        }
    }
    stream.write_all(b"done\0").unwrap();
    drop(stream);
    let run = server.finish();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[2], "  remote address: LID 0x0000, QPN 0x000100, PSN 0x000200, GID ::ffff:127.0.0.2");
    assert_eq!(lines[3], "  remote address: LID 0x0000, QPN 0x000101, PSN 0x000201, GID ::ffff:127.0.0.2");
}

#[test]
fn client_speaks_the_c_exchange() {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let tcp = listener.local_addr().unwrap().port();
    let udp = free_udp_port();
    let client = std::thread::spawn(move || {
        to_run(pingpong(CLIENT_IP, tcp, udp, &["-n", "1", "--timeout", "1", "127.0.0.1"]).output().unwrap())
    });
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && std::time::Instant::now() < deadline => {
                if client.is_finished() {
                    panic!("the client ended without connecting: {}", client.join().unwrap().stderr);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("no client: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut msg = [0u8; 52];
    stream.read_exact(&mut msg).unwrap();
    let (qpn, psn) = parse_c_message(&msg, Ipv4Addr::new(127, 0, 0, 2));
    stream.write_all(&c_message(0x77, 0xfedcba, Ipv4Addr::new(127, 0, 0, 1))).unwrap();
    let mut done = Vec::new();
    stream.read_to_end(&mut done).unwrap();
    assert_eq!(done, b"done\0");
    let run = client.join().unwrap();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(address(lines[0], "local address: ", CLIENT_IP, false), (qpn, psn));
    assert_eq!(lines[1], "  remote address: LID 0x0000, QPN 0x000077, PSN 0xfedcba, GID ::ffff:127.0.0.1");
    // Nobody answers the RoCE SEND.
    assert!(!run.success, "{}", run.stderr);
}
