//! The example programs, run the way the C pingpongs are run: a server
//! process on 127.0.0.1 and a client process on 127.0.0.2 (two devices made
//! with `--local`), RoCE over loopback UDP and the endpoint exchange over
//! TCP. Each test checks both exit codes and the lines each side prints.
//!
//! How the binaries are found: Cargo tells integration tests where the
//! package's binaries are (`CARGO_BIN_EXE_<name>`) but not its examples, and
//! `cargo test --test examples` does not even build them. So the first test
//! that needs them runs `cargo build --example ...` once, with the Cargo
//! and profile running the tests, and takes each executable's path from
//! Cargo's JSON report; that build is quick, since the library is already
//! built. (Including the examples' sources in this test instead would run
//! server and client in one process, and miss what is tested here: two
//! programs, their command lines, exit codes and output.)

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const EXAMPLES: [&str; 4] = ["rc_pingpong", "ud_pingpong", "rdma_write_read", "rdma_cm_pingpong"];

const SERVER_IP: &str = "127.0.0.1";
const CLIENT_IP: &str = "127.0.0.2";

/// Long enough for a loaded two-core machine running debug builds.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The path of example `name`, built on first use.
fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<HashMap<String, PathBuf>> = OnceLock::new();
    let built = BUILT.get_or_init(build_examples);
    built.get(name).cloned().unwrap_or_else(|| panic!("cargo built no example {name:?}: {built:?}"))
}

/// Builds the examples and returns their executables by name.
fn build_examples() -> HashMap<String, PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.current_dir(env!("CARGO_MANIFEST_DIR")).args(["build", "--quiet", "--message-format=json"]);
    for name in EXAMPLES {
        build.args(["--example", name]);
    }
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let output = build.stderr(Stdio::inherit()).output().expect("cargo runs");
    assert!(output.status.success(), "cargo build --example failed: {}", output.status);

    // One JSON object per line; artifacts with an executable name its path.
    let mut executables = HashMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some(path) = json_string_field(line, "executable") {
            let path = PathBuf::from(path);
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            executables.insert(name, path);
        }
    }
    executables
}

/// The value of string field `"name":"..."` in a line of JSON, unescaped.
/// Enough for Cargo's messages; not a JSON parser.
fn json_string_field(line: &str, name: &str) -> Option<String> {
    let start = line.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let mut value = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => value.push(chars.next()?),
            c => value.push(c),
        }
    }
    None
}

/// A UDP port free on both addresses: both devices bind the same RoCE port.
fn free_udp_port() -> u16 {
    let (a, b): (IpAddr, IpAddr) = (SERVER_IP.parse().unwrap(), CLIENT_IP.parse().unwrap());
    softroce::net::udp::free_port(&[a, b]).unwrap()
}

fn free_tcp_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.local_addr().unwrap().port()
}

/// A running example, its stdout read line by line as it comes.
struct Process {
    what: String,
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

/// An example that has exited.
struct Finished {
    status: ExitStatus,
    stdout: Vec<String>,
    stderr: String,
}

impl Process {
    fn spawn(name: &str, args: &[String]) -> Process {
        Process::spawn_with_env(name, args, &[])
    }

    fn spawn_with_env(name: &str, args: &[String], env: &[(&str, String)]) -> Process {
        let mut child = Command::new(example(name))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let what = format!("{name} {}", args.join(" "));
        Process { what, child, lines, seen: Vec::new(), stderr: Some(stderr) }
    }

    /// Waits until the program prints a line containing `needle`.
    fn wait_for_line(&mut self, needle: &str) {
        let deadline = Instant::now() + RUN_TIMEOUT;
        while !self.seen.iter().any(|line| line.contains(needle)) {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Timeout) => panic!("`{}` printed no {needle:?}: {:?}", self.what, self.seen),
                Err(RecvTimeoutError::Disconnected) => {
                    let finished = self.finish();
                    panic!("`{}` exited ({}) before printing {needle:?}:\n{}", self.what, finished.status, finished);
                }
            }
        }
    }

    /// Waits for the program to exit; kills it if it runs too long.
    fn finish(&mut self) -> Finished {
        let deadline = Instant::now() + RUN_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("`{}` did not exit within {RUN_TIMEOUT:?}; printed {:?}", self.what, self.seen);
            }
            thread::sleep(Duration::from_millis(20));
        };
        // The reader thread stops at end of file, which has come.
        self.seen.extend(self.lines.iter());
        let stderr = self.stderr.take().map(|t| t.join().unwrap()).unwrap_or_default();
        Finished { status, stdout: self.seen.clone(), stderr }
    }
}

impl Drop for Process {
    /// A failed test leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "--- stdout\n{}", self.stdout.join("\n"))?;
        write!(f, "--- stderr\n{}", self.stderr)
    }
}

impl Finished {
    fn line_with(&self, needle: &str) -> &str {
        self.stdout
            .iter()
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{self}"))
    }
}

/// Runs `name` as server on 127.0.0.1 and as client on 127.0.0.2 with the
/// same extra arguments; checks both succeed and print matching addresses.
fn run_pair(name: &str, extra: &[&str]) -> (Finished, Finished) {
    let mut shared: Vec<String> =
        vec!["--port".into(), free_tcp_port().to_string(), "--roce-port".into(), free_udp_port().to_string()];
    shared.extend(extra.iter().map(|s| s.to_string()));

    let server_args: Vec<String> = ["--local", SERVER_IP].iter().map(|s| s.to_string()).chain(shared.clone()).collect();
    let mut server = Process::spawn(name, &server_args);
    // The server listens on TCP before it prints its address.
    server.wait_for_line("local address:");

    let client_args: Vec<String> =
        [SERVER_IP, "--local", CLIENT_IP].iter().map(|s| s.to_string()).chain(shared).collect();
    let mut client = Process::spawn(name, &client_args);
    let client_done = client.finish();
    let server_done = server.finish();
    assert!(client_done.status.success(), "client `{}` failed: {}\n{client_done}", client.what, client_done.status);
    assert!(server_done.status.success(), "server `{}` failed: {}\n{server_done}", server.what, server_done.status);

    // Each side prints its own address and then the other's, as C does.
    let server_local = server_done.line_with("local address:");
    let client_local = client_done.line_with("local address:");
    assert!(server_local.starts_with("  local address:  LID 0x0000, QPN 0x"), "{server_local}");
    assert!(server_local.ends_with(&format!("GID ::ffff:{SERVER_IP}")), "{server_local}");
    assert!(client_local.ends_with(&format!("GID ::ffff:{CLIENT_IP}")), "{client_local}");
    let after_label = |line: &str| line.split_once("LID").unwrap().1.to_owned();
    assert_eq!(after_label(server_done.line_with("remote address:")), after_label(client_local));
    assert_eq!(after_label(client_done.line_with("remote address:")), after_label(server_local));
    (server_done, client_done)
}

/// The two report lines of a pingpong: total bytes and iterations.
fn assert_pingpong_report(side: &Finished, size: u64, iters: u64) {
    let bytes = side.line_with("Mbit/sec");
    assert!(bytes.starts_with(&format!("{} bytes in ", size * iters * 2)), "{bytes}");
    let per_iter = side.line_with("usec/iter");
    assert!(per_iter.starts_with(&format!("{iters} iters in ")), "{per_iter}");
}

#[test]
fn rc_pingpong_checks_every_message() {
    // Larger than the MTU: every message is several packets.
    let (server, client) = run_pair("rc_pingpong", &["--size", "10000", "--iters", "200", "--check"]);
    assert_pingpong_report(&server, 10000, 200);
    assert_pingpong_report(&client, 10000, 200);
}

#[test]
fn rc_pingpong_sleeps_on_completion_events() {
    let (server, client) = run_pair("rc_pingpong", &["-s", "100", "-n", "100", "-c", "--events"]);
    assert_pingpong_report(&server, 100, 100);
    assert_pingpong_report(&client, 100, 100);
}

#[test]
fn ud_pingpong_checks_every_message() {
    // The loopback device's MTU is 4096: the largest datagram that fits.
    let (server, client) = run_pair("ud_pingpong", &["--size", "4096", "--iters", "200", "--check"]);
    assert_pingpong_report(&server, 4096, 200);
    assert_pingpong_report(&client, 4096, 200);
}

#[test]
fn ud_pingpong_refuses_messages_larger_than_the_mtu() {
    let mut process =
        Process::spawn("ud_pingpong", &["--local".into(), SERVER_IP.into(), "--size".into(), "4097".into()]);
    let done = process.finish();
    assert!(!done.status.success(), "{done}");
    assert!(done.stderr.contains("Requested size larger than port MTU (4096)"), "{done}");
}

#[test]
fn rdma_write_read_verifies_on_both_sides() {
    let (server, client) = run_pair("rdma_write_read", &["--size", "6000", "--iters", "100"]);
    let buffer = server.line_with("local buffer:");
    let remote_buffer = client.line_with("remote buffer:");
    assert_eq!(buffer.split_once("addr").unwrap().1, remote_buffer.split_once("addr").unwrap().1);
    assert!(buffer.ends_with("len 6008"), "{buffer}");
    assert_eq!(server.line_with("peer wrote"), "peer wrote and read back 6000 bytes 100 times");
    // 100 adds of 1 to 0xffffff00.
    assert!(server.line_with("checked:").ends_with("counter went 0xffffff00 -> 0xffffff64"), "{server}");
    assert!(client.line_with("checked:").ends_with("from 0xffffff00 to 0xffffff64"), "{client}");
    client.line_with("server checked its memory: ok");
    assert_pingpong_report(&client, 6000, 100);
}

#[test]
fn rdma_cm_pingpong_connects_by_address() {
    // Both processes on 127.0.0.1, sharing its RoCE port as two programs
    // share a kernel device: the connect request is steered to the server.
    let env = [("SOFTROCE_PORT", free_udp_port().to_string())];
    let at = format!("{SERVER_IP}:{}", free_tcp_port());
    let mut server = Process::spawn_with_env("rdma_cm_pingpong", &["server".into(), at.clone()], &env);
    server.wait_for_line("listening on");
    let mut client = Process::spawn_with_env("rdma_cm_pingpong", &["client".into(), at.clone(), "50".into()], &env);
    let (client_done, server_done) = (client.finish(), server.finish());
    assert!(client_done.status.success(), "client failed: {}\n{client_done}", client_done.status);
    assert!(server_done.status.success(), "server failed: {}\n{server_done}", server_done.status);
    assert!(client_done.line_with("connected to").starts_with(&format!("connected to {at} in ")));
    assert!(client_done.line_with("rounds in").starts_with("50 rounds in "));
    client_done.line_with("disconnected");
    assert_eq!(server_done.line_with("rounds;"), "50 rounds; disconnected");
}
