//! The library as `librdmacm.so.1` and `libibverbs.so.1`: C programs built against Debian's
//! librdmacm-dev and libibverbs-dev (`-lrdmacm -libverbs`), run with both sonames linked to the
//! cdylib. One finds one library under both names, binds every import at its version at load, and
//! gets librdmacm's answers from the calls that need no peer (`c/rdmacm.c`); one reads what
//! providers and Open MPI read beyond the calls (`c/device.c`).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::built_library;

/// A directory holding `libibverbs.so.1` and `librdmacm.so.1`, both links to the cdylib, as
/// `softroce run` makes it.
fn soname_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softroce-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let lib = built_library();
    for soname in ["libibverbs.so.1", "librdmacm.so.1"] {
        std::os::unix::fs::symlink(&lib, dir.join(soname)).expect("a link");
    }
    dir
}

/// Compiles `c/NAME.c` against the system's headers and libraries into `dir`.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-ldl"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc: {e}"));
    assert!(
        out.status.success(),
        "cc {} failed (needs librdmacm-dev and libibverbs-dev, see .ci/run):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Compiles and runs `c/NAME.c` on 127.0.0.1 with `env` besides, and asserts that it exits 0
/// after printing "NAME: all checks passed".
fn checks_pass(name: &str, env: &[(&str, &str)]) {
    let dir = soname_dir(name);
    let exe = compile(name, &dir);
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .env("SOFTROCE_ADDR", "127.0.0.1")
        .envs(env.iter().copied())
        .output()
        .expect("run the C program");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    let passed = format!("{name}: all checks passed");
    assert!(out.status.success() && text.contains(&passed), "{}:\n{text}", exe.display());
}

#[test]
fn one_library_under_both_sonames() {
    checks_pass("rdmacm", &[("LD_BIND_NOW", "1")]);
}

/// `c/device.c` with `SYSFS_PATH` unset and set (with trailing slashes, which are dropped).
#[test]
fn device_memory_and_sysfs_path() {
    let dir = soname_dir("device");
    let exe = compile("device", &dir);
    for sysfs in [None, Some("/tmp/softroce-fake-sys//")] {
        let mut command = Command::new(&exe);
        command.env("LD_LIBRARY_PATH", &dir).env("SOFTROCE_ADDR", "127.0.0.1").env_remove("SYSFS_PATH");
        if let Some(path) = sysfs {
            command.env("SYSFS_PATH", path);
        }
        let out = command.output().expect("run the C program");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && text.contains("device: all checks passed"),
            "SYSFS_PATH={sysfs:?} {}:\n{text}",
            exe.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `c/late_event_thread.c`: an event thread that asks the channel its main thread destroyed
/// while that thread exits does not end the process with its error first (rxe-spec C-14).
#[test]
fn an_event_thread_left_running_does_not_outrun_the_exit() {
    let dir = soname_dir("late-event");
    let exe = compile("late_event_thread", &dir);
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .env("SOFTROCE_ADDR", "127.0.0.1")
        .output()
        .expect("run the C program");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(0), "{}:\n{text}", exe.display());
    assert!(text.contains("the main thread exits"), "{text}");
}

/// `c/cancel.c`: threads cancelled while they wait in the library's blocking calls, or while they
/// spin on `ibv_poll_cq`, end cancelled, and the process goes on (rxe-spec C-24); before, glibc's
/// unwind met the panic barrier and aborted the process.
#[test]
fn threads_cancelled_in_the_library_end_cancelled() {
    checks_pass("cancel", &[]);
}

/// A free UDP port of 127.0.0.1, for the RoCE link of one pair of processes.
fn free_udp_port() -> u16 {
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    probe.local_addr().expect("its address").port()
}

/// Waits for `child` to exit within `limit`, killing it after; its exit code and output.
fn finish(mut child: std::process::Child, limit: std::time::Duration) -> (Option<i32>, String) {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().expect("wait for a child").is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("the child's output");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// Runs `c/exit_owed.c` as a server in `server_mode` and a client in `client_mode` on one rdma_cm
/// port, two processes sharing 127.0.0.1's device as two programs would; the client gets the
/// server's pid after its mode. Their exit codes and outputs.
fn exit_owed_pair(
    dir: &Path,
    exe: &Path,
    server_mode: &str,
    client_mode: &str,
) -> ((Option<i32>, String), (Option<i32>, String)) {
    use std::io::BufRead;
    use std::process::Stdio;
    let udp = free_udp_port().to_string();
    let cm_port = (20000 + std::process::id() % 20000 + u32::from(free_udp_port()) % 1000).to_string();
    let run = |args: &[&str]| {
        let mut command = Command::new(exe);
        command
            .args(args)
            .env("LD_LIBRARY_PATH", dir)
            .env("SOFTROCE_ADDR", "127.0.0.1")
            .env("SOFTROCE_PORT", &udp)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().expect("run the C program")
    };
    let mut server = run(&["server", &cm_port, server_mode]);
    let mut listening = String::new();
    let stdout = server.stdout.take().expect("the server's stdout");
    let mut lines = std::io::BufReader::new(stdout);
    lines.read_line(&mut listening).expect("the server's first line");
    assert_eq!(listening.trim(), "listening", "the server did not listen");
    // The rest of the server's output is read with its exit.
    let rest = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut lines, &mut text);
        text
    });
    let pid = server.id().to_string();
    let client = run(&["client", &cm_port, client_mode, &pid]);
    let limit = std::time::Duration::from_secs(30);
    let client = finish(client, limit);
    let (code, err) = finish(server, limit);
    let server = (code, format!("{}{err}", rest.join().unwrap_or_default()));
    (server, client)
}

/// rxe-spec C-23: a server that gets the DREQ and exits without destroying its id (qperf's server
/// does) still answers it: the client's DISCONNECTED comes at once, not after the DREQ's retries.
#[test]
fn an_exit_sends_the_drep_owed() {
    let dir = soname_dir("exit-drep");
    let exe = compile("exit_owed", &dir);
    let (server, client) = exit_owed_pair(&dir, &exe, "drep", "drep");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(server.0 == Some(0) && server.1.contains("drep: ok"), "server: {server:?}");
    assert!(client.0 == Some(0) && client.1.contains("drep: ok"), "client: {client:?}");
}

/// rxe-spec C-23: a server that exits right after it polled the receive of the client's SEND
/// leaves the ACK it owes on the wire: the client's SEND completes at once. Without the settling
/// at exit the engine thread sends it first in most runs (within its few milliseconds of
/// hand-over), so several pairs run.
#[test]
fn an_exit_sends_the_ack_owed() {
    let dir = soname_dir("exit-ack");
    let exe = compile("exit_owed", &dir);
    for _ in 0..8 {
        let (server, client) = exit_owed_pair(&dir, &exe, "ack", "ack");
        assert!(server.0 == Some(0) && server.1.contains("ack: ok"), "server: {server:?}");
        assert!(client.0 == Some(0) && client.1.contains("ack: ok"), "client: {client:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// rxe-spec C-23: a SIGKILLed process owes what it owes; its peer's SEND ends in RETRY_EXC_ERR
/// once its retries run out (none here: one ACK timeout, about 2 s), not in a hang.
#[test]
fn a_killed_peer_ends_in_retry_exc_err() {
    let dir = soname_dir("exit-kill");
    let exe = compile("exit_owed", &dir);
    let (server, client) = exit_owed_pair(&dir, &exe, "stay", "kill");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(server.0, None, "the server was killed: {server:?}");
    assert!(client.0 == Some(0) && client.1.contains("kill: ok"), "client: {client:?}");
}
