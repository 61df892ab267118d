//! A program that exits owes its peers nothing: what its devices still owe (the ACK of the last
//! message it polled, the DREP to a DREQ it got, a response) leaves before the process does, as
//! it would from a kernel driver, which outlives the process. librdmacm never closes its devices,
//! and many programs exit with theirs open, so the library settles them at exit (`atexit`, which
//! `exit` runs, also from a signal handler; `_exit` and SIGKILL skip it) and when a program
//! closes a device (rxe-spec C-23).

use std::time::{Duration, Instant};

/// How long an exit or a close waits at most for what is owed to leave: a peer's resend comes
/// within it only where its ACK timeout is short (`ibv_rc_pingpong`'s 67 ms; rdma_cm's 2 s
/// is too long to wait for).
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_millis(200);

/// Has the process settle its devices when it exits; the first device opened calls it.
pub(crate) fn settle_at_exit() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers a function that takes no arguments and never unwinds.
        if unsafe { libc::atexit(at_exit) } != 0 {
            eprintln!("softroce: atexit refused: what the devices owe at exit may not leave");
        }
    });
}

extern "C" fn at_exit() {
    // A panic must not unwind into libc's exit; its message went to stderr.
    let _ = std::panic::catch_unwind(|| softroce::settle_before_exit(SETTLE_LIMIT));
}

/// Before the last handle of a device's context is closed: its answers leave first.
pub(crate) fn settle_before_close(context: &softroce::verbs::Context) {
    context.settle(Instant::now() + SETTLE_LIMIT);
}
