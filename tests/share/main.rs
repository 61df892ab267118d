//! One device, many processes (rxe-spec N-1 … N-9): separate processes of
//! one user open the same device on one address and one UDP port, and each
//! gets the packets of its own QPs. The members are this test binary run
//! again (the `member` test, which does nothing unless the parent set
//! [`member::CHILD_ENV`]); `member.rs` says what they do and how they meet,
//! `group.rs` how the parent runs them.
//!
//! The tests take turns (one lock): each runs several processes, and on a
//! small machine their timing is part of what is measured.

#[path = "../support/mod.rs"]
mod support;

mod group;
mod member;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use softroce::verbs::{AckTimeout, Context, ContextOptions, Device, Gid};

use group::{Group, User};
use member::{mono_ns, publish, Info, Lines, Mode, Role, ADDR, BIND_CASES};

/// The entry point of the member processes; a no-op in the parent.
#[test]
fn member() {
    if let Ok(spec) = std::env::var(member::CHILD_ENV) {
        member::main(&spec);
    }
}

fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_port() -> u16 {
    softroce::net::udp::free_port(&[ADDR]).unwrap()
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Each member is its own process with its own slot, every QPN of a member
/// is of its slot, no QPN is used twice on the host, and every QP's GID is
/// the one address.
fn check_slots(infos: &BTreeMap<usize, Info>) {
    let pids: BTreeSet<u32> = infos.values().map(|i| i.pid).collect();
    assert_eq!(pids.len(), infos.len(), "members share a process: {infos:?}");
    let slots: BTreeSet<u32> = infos.values().map(|i| i.slot).collect();
    assert_eq!(
        slots.len(),
        infos.len(),
        "two members have one slot: {:?}",
        infos.values().map(|i| i.slot).collect::<Vec<_>>()
    );
    let mut qpns = BTreeSet::new();
    for (index, info) in infos {
        assert!((1..=255).contains(&info.slot), "member {index} has slot {}", info.slot);
        for qpn in std::iter::once(info.ud_qpn).chain(info.rc.values().map(|rc| rc.qpn)) {
            assert_eq!(qpn >> 16, info.slot, "member {index}'s QPN {qpn:#x} is not of its slot {}", info.slot);
            assert!(qpns.insert(qpn), "QPN {qpn:#x} is used twice");
        }
        for (peer, rc) in &info.rc {
            assert_eq!(rc.gid, Gid::from_ip(ADDR), "member {index}'s QP to {peer} is not on {ADDR}");
        }
    }
}

/// Checks the RC traffic of every ordered pair among `members`: everything
/// the sender saw complete, the receiver received and checked (the members
/// checked the bytes), with no error on their QPs. Returns UD datagrams
/// sent and lost in all, with the worst pair's loss.
fn check_pairs(results: &BTreeMap<usize, Lines>, members: &[usize]) -> (u64, u64, String) {
    let (mut sent, mut lost, mut worst) = (0, 0, (0, String::new()));
    for &i in members {
        for &j in members.iter().filter(|&&j| j != i) {
            let (r_i, r_j) = (&results[&i], &results[&j]);
            let error = r_i.all("rc_error").find(|w| w[0] == j.to_string()).map(|w| w[1].clone());
            assert_eq!(error, None, "member {i}'s RC QP to {j} failed");
            let rc_sent = r_i.of("rc_sent", j).unwrap();
            assert_eq!(r_i.of("rc_posted", j), Some(rc_sent), "member {i}: not all its messages to {j} completed");
            assert_eq!(r_j.of("rc_recv", i), Some(rc_sent), "member {j} received not all that {i} sent it");
            assert_eq!(r_j.of("ud_dup", i), Some(0), "member {j} received datagrams of {i} twice");
            let (ud_sent, ud_recv) = (r_i.of("ud_sent", j).unwrap(), r_j.of("ud_recv", i).unwrap());
            assert!(ud_recv <= ud_sent, "member {j} received {ud_recv} datagrams of {i}, which sent {ud_sent}");
            sent += ud_sent;
            lost += ud_sent - ud_recv;
            if ud_sent - ud_recv > worst.0 {
                worst = (ud_sent - ud_recv, format!("{i}->{j}: {} of {ud_sent}", ud_sent - ud_recv));
            }
        }
    }
    (sent, lost, worst.1)
}

fn counters(results: &BTreeMap<usize, Lines>) -> String {
    results.iter().map(|(i, r)| format!("  member {i}: {}\n", r.text("counters").unwrap_or_default())).collect()
}

/// Eight processes, one device on 127.0.0.1 and one port: each has an RC
/// QP to every other (56 in all) and a UD QP, and sends every other RC
/// messages (a WRITE, then a SEND) and UD datagrams at the same time. Every
/// byte is checked by its receiver; RC delivers all, UD loses none.
#[test]
fn eight_processes_share_one_device_with_rc_and_ud() {
    const MEMBERS: usize = 8;
    const MESSAGES: u64 = 150;
    const DATAGRAMS: u64 = 100;
    let _turn = serial();
    let started = Instant::now();
    let mut group = Group::new("eight", free_port(), false);
    for i in 0..MEMBERS {
        let role = Role {
            rc_messages: MESSAGES,
            ud_datagrams: DATAGRAMS,
            ud_pace_us: 2000,
            ..group.role(i, MEMBERS, Mode::Counted)
        };
        group.spawn(&role, None);
    }
    let all: Vec<usize> = (0..MEMBERS).collect();
    group.wait_for(&Group::files("ready", all.clone()), Duration::from_secs(30));
    let ready = started.elapsed();
    group.wait_for(&Group::files("result", all.clone()), Duration::from_secs(40));
    let traffic = started.elapsed() - ready;

    let infos: BTreeMap<usize, Info> = all.iter().map(|&i| (i, group.info(i))).collect();
    check_slots(&infos);
    let results: BTreeMap<usize, Lines> = all.iter().map(|&i| (i, group.result(i))).collect();
    for (&i, r) in &results {
        for j in all.iter().filter(|&&j| j != i) {
            assert_eq!(r.of("rc_sent", *j), Some(MESSAGES), "member {i}: messages to {j}");
            assert_eq!(r.of("ud_sent", *j), Some(DATAGRAMS), "member {i}: datagrams to {j}");
        }
    }
    let (sent, lost, worst) = check_pairs(&results, &all);
    println!(
        "{MEMBERS} processes on {ADDR} port {}: slots {:?}; ready in {ready:.2?}, traffic {traffic:.2?}; \
         {} RC messages (WRITE + SEND) checked, {sent} UD datagrams, {lost} lost{}\n{}",
        group.port,
        infos.values().map(|i| i.slot).collect::<Vec<_>>(),
        MEMBERS * (MEMBERS - 1) * MESSAGES as usize,
        if lost > 0 { format!(" (worst pair {worst})") } else { String::new() },
        counters(&results)
    );
    assert_eq!(lost, 0, "UD datagrams were lost on loopback (worst pair {worst})");
    group.finish(Duration::from_secs(10));
}

/// Watches the port's shared state (in the user's softroce directory, as
/// `net::share` keeps it) for changes of the steering of [`ADDR`]: when the
/// survivors counted a dead member out, and the group took in a newcomer.
/// What it sees is reported, not judged: the file is the implementation's.
struct StateWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Steered>>>,
}

/// When a steering was first seen, and the slots it names by position.
type Steered = (u64, Vec<u32>);

impl StateWatch {
    fn start(port: u16) -> StateWatch {
        let path = softroce::rundir::user_directory(&format!("port-{port}")).unwrap().join("state");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let group = format!("group {ADDR} ");
            let mut seen: Vec<Steered> = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if let Some(line) = text.lines().find(|l| l.starts_with(&group)) {
                    let slots: Vec<u32> =
                        line[group.len()..].split_whitespace().filter_map(|s| s.parse().ok()).collect();
                    if seen.last().is_none_or(|(_, last)| *last != slots) {
                        seen.push((mono_ns(), slots));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            seen
        });
        StateWatch { stop, thread: Some(thread) }
    }

    /// Each steering seen, with when it was first seen.
    fn stop(mut self) -> Vec<Steered> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("running").join().unwrap()
    }
}

impl Drop for StateWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Six processes with RC and UD traffic among them; the parent SIGKILLs two
/// or three at random times (the seed is printed; SOFTROCE_SHARE_SEED
/// repeats a schedule). The survivors' traffic among themselves goes on:
/// all of it is delivered and checked, and it stalls less than 200 ms around
/// each kill. Then a newcomer joins: it gets a slot none of the dead had
/// (the least recently used), and every survivor answers its pings.
#[test]
fn members_killed_under_traffic_leave_the_survivors_running() {
    const MEMBERS: usize = 6;
    const LIMIT_NS: u64 = 200_000_000;
    let _turn = serial();
    let started = Instant::now();
    let seed = std::env::var("SOFTROCE_SHARE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(mono_ns);
    let mut rng = support::Rng::new(seed);
    let kills = 2 + (rng.next_u32() % 2) as usize;
    let mut victims: Vec<usize> = Vec::new();
    while victims.len() < kills {
        let v = rng.next_u32() as usize % MEMBERS;
        if !victims.contains(&v) {
            victims.push(v);
        }
    }
    // Far enough apart that each kill's stall is its own.
    let mut at = Duration::ZERO;
    let schedule: Vec<(usize, Duration)> = victims
        .iter()
        .map(|&v| {
            at += Duration::from_millis(350 + u64::from(rng.next_u32() % 400));
            (v, at)
        })
        .collect();
    println!("seed {seed} (SOFTROCE_SHARE_SEED={seed} repeats it): kills {schedule:?} after the traffic starts");

    // A packet lost to a kill is resent within 17 ms, well inside the
    // 200 ms; and a member the scheduler stalls does not lose its QPs: 7
    // retries span 134 ms. (With 4 ms they span 33 ms, and on a loaded
    // two-core machine a debug-built member was once stalled 78 ms before
    // any kill: every QP to it failed.) A dead peer's QPs give up after
    // those 134 ms.
    let timeout = AckTimeout::at_least(Duration::from_millis(12));
    let mut group = Group::new("chaos", free_port(), false);
    for i in 0..MEMBERS {
        let role = Role {
            ack_timeout: timeout.exponent(),
            rc_pace_us: 4000,
            ud_pace_us: 10_000,
            ..group.role(i, MEMBERS, Mode::Timed)
        };
        group.spawn(&role, None);
    }
    let all: Vec<usize> = (0..MEMBERS).collect();
    group.wait_for(&Group::files("ready", all.clone()), Duration::from_secs(30));
    let t0 = Instant::now();
    let watch = StateWatch::start(group.port);
    let mut events: Vec<(String, u64)> = Vec::new();
    for &(victim, after) in &schedule {
        std::thread::sleep((t0 + after).saturating_duration_since(Instant::now()));
        events.push((format!("kill {victim}"), group.kill(victim)));
    }
    let survivors: Vec<usize> = all.iter().copied().filter(|i| !victims.contains(i)).collect();

    // The newcomer, once the survivors have counted the dead out.
    std::thread::sleep(Duration::from_millis(300));
    let newcomer = MEMBERS;
    group.spawn(&Role { peers: survivors.clone(), ..group.role(newcomer, MEMBERS, Mode::Newcomer) }, None);
    group.wait_for(&[format!("result-{newcomer}")], Duration::from_secs(20));
    let joined = group.info(newcomer);
    events.push((format!("join {newcomer}"), joined.joining_ns));
    std::thread::sleep(Duration::from_millis(300));

    let mut stop = format!("stop {}\n", mono_ns());
    for &victim in &victims {
        stop += &format!("killed {victim}\n");
    }
    for (what, at) in &events {
        stop += &format!("event {} {at}\n", what.replace(' ', "_"));
    }
    publish(&group.dir, "stop", &stop);
    group.wait_for(&Group::files("result", survivors.clone()), Duration::from_secs(30));
    let run_time = started.elapsed();
    let steering = watch.stop();

    // The newcomer's slot is none of the dead's (nor anyone's).
    let infos: BTreeMap<usize, Info> = all.iter().chain([&newcomer]).map(|&i| (i, group.info(i))).collect();
    check_slots(&infos);
    let dead_slots: Vec<u32> = victims.iter().map(|v| infos[v].slot).collect();
    assert!(
        !dead_slots.contains(&joined.slot),
        "the newcomer got slot {} of a dead member ({dead_slots:?})",
        joined.slot
    );
    let pongs = group.result(newcomer);
    for &s in &survivors {
        assert!(pongs.of("pong", s).is_some(), "survivor {s} did not answer the newcomer");
    }

    let results: BTreeMap<usize, Lines> = survivors.iter().map(|&i| (i, group.result(i))).collect();
    let (sent, lost, worst) = check_pairs(&results, &survivors);
    // QPs to the dead gave up; none to a survivor did (check_pairs).
    for (&i, r) in &results {
        for &v in &victims {
            let error = r.all("rc_error").find(|w| w[0] == v.to_string()).map(|w| w[1].clone());
            assert!(error.is_some(), "member {i}'s QP to the dead {v} did not fail");
        }
    }
    let mut report = format!(
        "{MEMBERS} processes, kills at {schedule:?}, ACK timeout {:?}; slots {:?}, the dead had {dead_slots:?}, \
         the newcomer got {}; run {run_time:.2?}\n",
        timeout.duration().unwrap(),
        infos.iter().map(|(i, info)| (*i, info.slot)).collect::<Vec<_>>(),
        joined.slot,
    );
    let mut worst_gaps = Vec::new();
    for (e, (what, at)) in events.iter().enumerate() {
        let mut gaps: Vec<(u64, usize, usize)> = Vec::new();
        for (&i, r) in &results {
            for &j in survivors.iter().filter(|&&j| j != i) {
                let gap =
                    r.all("gap").find(|w| w[0] == e.to_string() && w[1] == j.to_string()).unwrap()[2].parse().unwrap();
                gaps.push((gap, j, i));
            }
        }
        gaps.sort_unstable();
        let (gap, from, to) = *gaps.last().unwrap();
        let median = gaps[gaps.len() / 2].0;
        let resteered = match what.strip_prefix("kill ").map(|v| infos[&v.parse::<usize>().unwrap()].slot) {
            Some(slot) => steering
                .iter()
                .find(|(t, slots)| *t >= *at && !slots.is_empty() && !slots.contains(&slot))
                .map_or("not seen".to_string(), |(t, slots)| format!("{:.1} ms after, to {slots:?}", ms(t - at))),
            None => steering
                .iter()
                .find(|(t, slots)| *t >= *at && slots.contains(&joined.slot))
                .map_or("not seen".to_string(), |(t, slots)| format!("{:.1} ms after, to {slots:?}", ms(t - at))),
        };
        report += &format!(
            "  {what}: longest stall {:.1} ms ({from}->{to}), median {:.1} ms; steering changed {resteered}\n",
            ms(gap),
            ms(median)
        );
        worst_gaps.push((what.clone(), gap, from, to));
    }
    let longest = results.values().flat_map(|r| r.all("max_gap").map(|w| w[1].parse::<u64>().unwrap())).max().unwrap();
    let messages: u64 = results.values().flat_map(|r| survivors.iter().filter_map(|&j| r.of("rc_recv", j))).sum();
    for (&i, r) in &results {
        for &j in survivors.iter().filter(|&&j| j != i) {
            let after = r.of("after_last_event", j).unwrap();
            assert!(after > 0, "member {i} received nothing from {j} after the last event");
        }
    }
    let timeouts = |peers: &[usize]| -> u64 {
        results.values().flat_map(|r| peers.iter().filter_map(|&j| r.of("rc_timeouts", j))).sum()
    };
    report += &format!(
        "  ACK timeouts on survivors' QPs: {} to survivors, {} to the dead\n",
        timeouts(&survivors),
        timeouts(&victims)
    );
    report += &format!(
        "  longest stall of any survivor pair over the whole run {:.1} ms; {messages} RC messages checked; \
         {sent} UD datagrams among survivors, {lost} lost ({worst})\n{}",
        ms(longest),
        counters(&results)
    );
    println!("{report}");
    for (what, gap, from, to) in worst_gaps.iter().filter(|(what, ..)| what.starts_with("kill")) {
        assert!(*gap < LIMIT_NS, "{what}: traffic {from}->{to} stalled {:.1} ms", ms(*gap));
    }
    // Datagrams the kernel had queued on a dying socket die with it.
    assert!(lost * 50 <= sent, "{lost} of {sent} datagrams lost among survivors");
    group.finish(Duration::from_secs(10));
}

/// Root runs two members as `nobody`: an unprivileged user shares the port.
/// Then a third user may neither open the device on that address and port
/// (EADDRINUSE, with a message that says what holds it and how to find it),
/// nor bind the port in any way that would take the members' packets.
#[test]
fn a_second_user_is_refused_and_an_unprivileged_user_shares() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        println!("skipped: running members as other users needs root");
        return;
    }
    const NOBODY: User = User { uid: 65534, gid: 65534 };
    const OTHER: User = User { uid: 65533, gid: 65533 };
    const MESSAGES: u64 = 50;
    let _turn = serial();
    let mut group = Group::new("users", free_port(), true);
    for i in 0..2 {
        let role =
            Role { rc_messages: MESSAGES, ud_datagrams: 20, ud_pace_us: 1000, ..group.role(i, 2, Mode::Counted) };
        group.spawn(&role, Some(NOBODY));
    }
    group.wait_for(&Group::files("result", 0..2), Duration::from_secs(30));
    let infos: BTreeMap<usize, Info> = (0..2).map(|i| (i, group.info(i))).collect();
    check_slots(&infos);
    let results: BTreeMap<usize, Lines> = (0..2).map(|i| (i, group.result(i))).collect();
    for (i, r) in &results {
        assert_eq!(r.num("uid"), Some(u64::from(NOBODY.uid)), "member {i} runs as another user");
        assert_eq!(r.of("rc_sent", 1 - i), Some(MESSAGES), "member {i}: messages to {}", 1 - i);
    }
    check_pairs(&results, &[0, 1]);

    // Another user, while nobody's members hold the port.
    group.spawn(&group.role(2, 2, Mode::Intruder), Some(OTHER));
    group.wait_exit(2, Duration::from_secs(20));
    let other = group.result(2);
    assert_eq!(other.num("uid"), Some(u64::from(OTHER.uid)));
    assert_eq!(other.text("open"), None, "uid {} opened the device nobody holds", OTHER.uid);
    assert_eq!(other.num("open_errno"), Some(libc::EADDRINUSE as u64), "{other:?}");
    assert_eq!(other.text("open_kind").as_deref(), Some("AddrInUse"));
    let text = other.text("open_text").unwrap();
    for words in [&format!("UDP port {} on {ADDR} is held", group.port), "another user", "ss -ulpn"] {
        assert!(text.contains(words), "the error does not say {words:?}: {text}");
    }
    // Root is another user too: sharing goes by uid, not privilege.
    let options = ContextOptions { port: group.port, publish_counters: false, ..ContextOptions::default() };
    let refused = Context::open(&Device::for_address(ADDR), options).expect_err("root opened nobody's port");
    assert_eq!(refused.errno(), libc::EADDRINUSE, "{refused}");

    // Binding the port otherwise: every IPv4 way, and IPv6 dual-stack (which
    // takes IPv4 too, as ::ffff:a.b.c.d), meets the members' sockets:
    // they did not set SO_REUSEADDR, and SO_REUSEPORT joins only a group of
    // the same user. A v6-only socket on [::] is another matter: it takes
    // IPv6 alone, where the members have no socket (the device is on
    // 127.0.0.1), so the kernel lets it bind and it can take none of their
    // packets.
    let mut outcomes = String::new();
    for case in BIND_CASES {
        let got = other.all("bind").find(|w| w[0] == case.name).map(|w| w[1].clone()).unwrap();
        let expected =
            if case.name.starts_with("any6-v6only") { "ok".to_string() } else { libc::EADDRINUSE.to_string() };
        outcomes += &format!("{}={} ", case.name, if got == "ok" { "ok" } else { "EADDRINUSE" });
        assert_eq!(got, expected, "uid {} binding port {} as {case:?}", OTHER.uid, group.port);
    }
    println!(
        "2 members as nobody (slots {:?}) exchanged {MESSAGES} RC messages each way; uid {} was refused: {text}\n\
         its binds: {outcomes}",
        infos.values().map(|i| i.slot).collect::<Vec<_>>(),
        OTHER.uid
    );
    group.finish(Duration::from_secs(10));
}
