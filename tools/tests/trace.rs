//! The tutorial's program (examples/tutorial.rs) run step by step under a
//! trace, and the timeline `softroce trace` and `softroce run --trace` make
//! of it: each step's calls and packets, as docs/tutorial.md shows them, so
//! the tutorial cannot drift from what the code does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const SOFTROCE: &str = env!("CARGO_BIN_EXE_softroce");

/// The tutorial program, built once with the profile running the tests
/// (Cargo builds a package's examples for its own tests only).
fn tutorial() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        build.args(["build", "--quiet", "-p", "softroce", "--example", "tutorial", "--message-format=json"]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let output = build.output().expect("cargo runs");
        assert!(output.status.success(), "cargo build --example tutorial: {}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout.lines().find(|l| l.contains("\"executable\":\"")).expect("cargo names the executable");
        let start = line.find("\"executable\":\"").unwrap() + "\"executable\":\"".len();
        PathBuf::from(&line[start..start + line[start..].find('"').unwrap()])
    })
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("softroce-trace-{}-{name}", std::process::id()))
}

/// Runs tutorial step `step` tracing into an events file; returns what it
/// printed and the events.
fn run_step(step: &str) -> (String, PathBuf) {
    let events = scratch(&format!("{step}.events"));
    let _ = std::fs::remove_file(&events);
    let output = Command::new(tutorial()).arg(step).env("SOFTROCE_TRACE", &events).output().unwrap();
    assert!(output.status.success(), "tutorial {step}: {}", String::from_utf8_lossy(&output.stderr));
    (String::from_utf8(output.stdout).unwrap(), events)
}

/// The text timeline of `events`.
fn timeline(events: &Path) -> String {
    let output = Command::new(SOFTROCE).arg("trace").arg(events).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The lines of `text` holding every one of `words`.
fn lines_with<'a>(text: &'a str, words: &[&str]) -> Vec<&'a str> {
    text.lines().filter(|l| words.iter().all(|w| l.contains(w))).collect()
}

fn assert_line(text: &str, words: &[&str]) {
    assert!(!lines_with(text, words).is_empty(), "no line with {words:?} in:\n{text}");
}

#[test]
fn send_shows_the_first_program_and_its_packets() {
    let (printed, events) = run_step("send");
    assert_eq!(printed, "send: bob received \"Hello, RDMA!\"\n");
    let text = timeline(&events);
    assert_line(&text, &["A ", "device alice (127.0.0.1)"]);
    assert_line(&text, &["B ", "device bob (127.0.0.2)"]);
    for call in ["ibv_alloc_pd", "ibv_create_cq", "ibv_create_qp", "ibv_reg_mr", "connect"] {
        assert_eq!(lines_with(&text, &[call, " -> ok"]).len(), 2, "{call} on each side:\n{text}");
    }
    assert_line(&text, &["B ", "ibv_post_recv", "wr_id=1 len=4096 -> ok"]);
    assert_line(&text, &["A ", "ibv_post_send", "wr_id=2 opcode=SEND len=12 flags=signaled -> ok"]);
    assert_line(&text, &["A->B", "RC_SEND_ONLY", "ack_req=1", "len=12", "icrc=ok", "received"]);
    assert_line(&text, &["B->A", "RC_ACKNOWLEDGE", "ACK", "msn=1", "received"]);
    assert_line(&text, &["A ", "ibv_poll_cq", "wr_id=2 status=success opcode=Send"]);
    assert_line(&text, &["B ", "ibv_poll_cq", "wr_id=1 status=success opcode=Recv len=12"]);
    // The SEND goes out after it is posted, and completes after its ACK.
    let at = |words: &[&str]| text.lines().position(|l| words.iter().all(|w| l.contains(w))).unwrap();
    assert!(at(&["ibv_post_send"]) < at(&["RC_SEND_ONLY"]));
    assert!(at(&["RC_ACKNOWLEDGE"]) < at(&["ibv_poll_cq", "opcode=Send"]));
    std::fs::remove_file(events).unwrap();
}

#[test]
fn write_read_and_atomic_show_their_headers() {
    let (printed, events) = run_step("write");
    assert!(printed.starts_with("write: 3000 bytes landed in bob's memory; bob's CQ is empty: true"), "{printed}");
    let text = timeline(&events);
    assert_line(&text, &["A->B", "RC_RDMA_WRITE_FIRST", "RETH(va=", "len=3000)", "len=1024"]);
    assert_line(&text, &["A->B", "RC_RDMA_WRITE_MIDDLE", "len=1024"]);
    assert_line(&text, &["A->B", "RC_RDMA_WRITE_LAST", "ack_req=1", "len=952"]);
    assert!(lines_with(&text, &["B ", "ibv_poll_cq"]).is_empty(), "a WRITE completes nothing at bob:\n{text}");
    std::fs::remove_file(events).unwrap();

    let (_, events) = run_step("read");
    let text = timeline(&events);
    assert_line(&text, &["A->B", "RC_RDMA_READ_REQUEST", "RETH(", "len=64)", "len=0"]);
    assert_line(&text, &["B->A", "RC_RDMA_READ_RESPONSE_ONLY", "AETH(", "len=64"]);
    std::fs::remove_file(events).unwrap();

    let (printed, events) = run_step("atomic");
    assert_eq!(printed, "atomic: the counter was 40, is now 45\n");
    let text = timeline(&events);
    assert_line(&text, &["A->B", "RC_FETCH_ADD", "AtomicETH(", "swap_add=0x5"]);
    assert_line(&text, &["B->A", "RC_ATOMIC_ACKNOWLEDGE", "AtomicAckETH(orig=0x28)"]);
    std::fs::remove_file(events).unwrap();
}

#[test]
fn rnr_shows_the_nak_and_the_retry() {
    let (_, events) = run_step("rnr");
    let text = timeline(&events);
    assert_line(&text, &["B->A", "RC_ACKNOWLEDGE", "RNR NAK timer=12"]);
    assert_line(&text, &["A->B", "RC_SEND_ONLY", "[retransmission]", "received"]);
    assert_line(&text, &["B ", "ibv_poll_cq", "wr_id=7 status=success opcode=Recv len=9"]);
    std::fs::remove_file(events).unwrap();
}

#[test]
fn a_lost_packet_is_dropped_naked_and_resent() {
    let (printed, events) = run_step("loss");
    assert_eq!(printed, "loss: all 4096 bytes arrived despite the lost packets\n");
    let text = timeline(&events);
    assert_line(&text, &["A->B", "RC_RDMA_WRITE_MIDDLE", "icrc=BAD", "DROPPED by the receiver: bad ICRC"]);
    assert_line(&text, &["B->A", "NAK PSN sequence error"]);
    assert_line(&text, &["A->B", "[retransmission]", "received"]);
    assert_line(&text, &["A ", "ibv_poll_cq", "wr_id=8 status=success opcode=RdmaWrite len=4096"]);
    std::fs::remove_file(events).unwrap();
}

/// The page has a column per endpoint and one `<details>` per packet line
/// of the text, with the explanation and the rxe-spec rule inside.
#[test]
fn the_html_page_has_a_column_per_endpoint_and_a_packet_per_arrow() {
    let (_, events) = run_step("loss");
    let text = timeline(&events);
    let page = scratch("loss.html");
    let output = Command::new(SOFTROCE).arg("trace").arg(&events).arg("-o").arg(&page).output().unwrap();
    assert!(output.status.success());
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<th>").count(), 2, "alice and bob");
    let packets = text.lines().filter(|l| l.contains("->") && l.contains(" icrc=")).count();
    assert_eq!(html.matches("<details>").count(), packets);
    assert!(html.contains("rxe-spec/transport.md</a> T-22. Go-back-N."), "the NAK's rule");
    assert!(html.contains("rxe-spec/wire.md</a> W-13."), "the bad ICRC's rule");
    assert!(html.contains("<b>ibv_post_send</b>"));
    std::fs::remove_file(page).unwrap();
    std::fs::remove_file(events).unwrap();
}

fn run_traced(trace: &Path, script: &str) -> Output {
    // `run` needs the cdylib only to point the loader at it: a stand-in
    // does for a program that does not load libibverbs, and keeps the
    // links `run` makes beside it out of the build's directory.
    let dir = scratch(&format!("lib-{}", trace.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::create_dir_all(&dir).unwrap();
    let library = dir.join("libsoftroce_ibverbs.so");
    std::fs::write(&library, b"").unwrap();
    Command::new(SOFTROCE)
        .env("SOFTROCE_LIBIBVERBS", &library)
        .arg("run")
        .arg("--trace")
        .arg(trace)
        .args(["--", "sh", "-c", script, "sh"])
        .arg(tutorial())
        .output()
        .unwrap()
}

/// `run --trace` merges what every process it started traced, waits for
/// a child killed by SIGKILL, renders what it had written, and exits as a
/// shell would (128 + 9).
#[test]
fn run_merges_processes_and_survives_a_killed_child() {
    let trace = scratch("run.txt");
    let output = run_traced(&trace, r#""$1" send & "$1" atomic & wait; "$1" write; kill -KILL $$"#);
    assert_eq!(output.status.code(), Some(137), "{}", String::from_utf8_lossy(&output.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    let endpoints = text.lines().take_while(|l| !l.is_empty()).filter(|l| l.contains("tutorial, device")).count();
    assert_eq!(endpoints, 6, "three processes, two devices each:\n{text}");
    assert_line(&text, &["RC_SEND_ONLY"]);
    assert_line(&text, &["RC_FETCH_ADD"]);
    assert_line(&text, &["RC_RDMA_WRITE_LAST"]);
    std::fs::remove_file(trace).unwrap();
}

/// A process the program started and did not wait for is waited for: its
/// events are in the timeline.
#[test]
fn run_waits_for_what_the_program_left_behind() {
    let trace = scratch("orphan.txt");
    let output = run_traced(&trace, r#"(sleep 1; "$1" atomic) & exit 0"#);
    assert!(output.status.success());
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_line(&text, &["RC_ATOMIC_ACKNOWLEDGE", "received"]);
    std::fs::remove_file(trace).unwrap();
}

/// `--trace -` writes the text timeline to stderr.
#[test]
fn run_trace_dash_writes_to_stderr() {
    let output = run_traced(Path::new("-"), r#""$1" atomic"#);
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_line(&stderr, &["RC_ATOMIC_ACKNOWLEDGE"]);
    assert_eq!(String::from_utf8(output.stdout).unwrap(), "atomic: the counter was 40, is now 45\n");
}
