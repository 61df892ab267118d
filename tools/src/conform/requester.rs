//! Checks of the peer's requester: a perftest client's QPs send to QPs we
//! play by hand, and we answer as a responder would — or, on the QP of each
//! check, as a lossy, slow or hostile one would — and watch what it does.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use softroce::wire::build::{bth, Build};
use softroce::wire::opcode::Position;
use softroce::wire::{NakCode, Opcode, Operation, Psn, RoceRepr, Syndrome, Transport};

use super::probe::{Answer, Probe};
use super::session::{ClientSession, Program, QpNumbers, Remote, Setup};
use super::{Outcome, Plan, Report, Verdict};

/// perftest's local ACK timeout (`DEF_QP_TIME` 14): 4.096 µs × 2^14.
const ACK_TIMEOUT: Duration = Duration::from_micros(67_109);
/// perftest's `retry_cnt`.
const RETRY_CNT: usize = 7;
/// The RNR timer code we send (81.92 ms), long enough to measure.
const RNR_TIMER: u8 = 26;
/// How much earlier than a timer a peer may act and still pass (clocks,
/// jiffies): 10 %.
const SLACK: f64 = 0.9;

/// A client the peer runs against us in a loop: its test and options.
pub struct Client {
    pub program: Program,
    /// Its QPs (`-q`).
    pub qps: usize,
    /// Its other options (`-n`, `-s`), as PEER_HELP says.
    pub options: &'static [&'static str],
}

/// The write client (TCP port `--port` + 4) and the read client (+ 5).
pub const CLIENTS: [Client; 2] = [
    Client { program: Program::Write, qps: 6, options: &["-n", "20", "-s", "4096"] },
    Client { program: Program::Read, qps: 2, options: &["-n", "5", "-s", "2048"] },
];

/// The TCP listeners the peer's clients connect to.
pub struct Listeners {
    write: TcpListener,
    read: TcpListener,
}

impl Listeners {
    pub fn bind(plan: &Plan) -> std::io::Result<Listeners> {
        let at = |offset: u16| TcpListener::bind(SocketAddr::new(plan.local, plan.port + offset));
        Ok(Listeners { write: at(4)?, read: at(5)? })
    }
}

/// How we answer one of the client's QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// As a responder should, and the QP's packets are judged.
    Normal,
    /// As a responder should, on a QP no check looks at.
    Fill,
    /// Only every fourth message's ACK: each covers four.
    Coalesce,
    /// Every ACK twice.
    DoubleAck,
    /// Claim the PSN `at` after the first was lost, when the one after it comes.
    NakSeq { at: u32 },
    /// Answer the PSN `at` after the first with an RNR NAK, once.
    Rnr { at: u32 },
    /// Never answer.
    Silent,
    /// NAK the first packet that asks for an ACK with a remote access error.
    NakAccess,
    /// Answer the second READ before the first.
    ImpliedNak,
    /// Send only the first response of the first READ.
    CutShort,
}

/// A packet that came from the client, as we keep it.
struct Seen {
    at: Instant,
    header: RoceRepr,
    len: usize,
}

/// One client QP and our responder for it.
struct Player {
    r: Remote,
    mtu: usize,
    policy: Policy,
    /// Our expected PSN.
    epsn: u32,
    msn: u32,
    /// A sequence NAK is out; later PSNs are dropped silently until the
    /// expected one comes (T-11).
    nak_out: bool,
    /// The policy's one-time act is done, and when.
    acted: Option<Instant>,
    /// Packets held back by ImpliedNak (the first READ).
    seen: Vec<Seen>,
}

fn psn_add(psn: u32, k: u32) -> u32 {
    psn.wrapping_add(k) & 0x00ff_ffff
}

fn psn_diff(a: u32, b: u32) -> i32 {
    Psn::new(a).diff(Psn::new(b))
}

impl Player {
    fn new(r: Remote, mtu: usize, policy: Policy) -> Player {
        Player { r, mtu, policy, epsn: r.peer_psn, msn: 0, nak_out: false, acted: None, seen: Vec::new() }
    }

    fn first(&self, k: u32) -> u32 {
        psn_add(self.r.peer_psn, k)
    }

    fn answer(&self, op: Operation, psn: u32) -> RoceRepr {
        let opcode = Opcode::new(Transport::Rc, op).expect("an RC operation");
        RoceRepr::new(bth(opcode, self.r.qpn, psn))
    }

    fn ack(&self, psn: u32, syndrome: Syndrome) -> (RoceRepr, Vec<u8>) {
        (self.answer(Operation::Acknowledge, psn).aeth(syndrome, self.msn), Vec::new())
    }

    /// READ responses for a READ of `len` bytes at `psn`.
    fn read_responses(&self, psn: u32, len: usize) -> Vec<(RoceRepr, Vec<u8>)> {
        let n = len.div_ceil(self.mtu).max(1);
        let syndrome = Syndrome::Ack { credits: Syndrome::INVALID_CREDITS };
        (0..n)
            .map(|i| {
                let chunk = (len - i * self.mtu).min(self.mtu);
                let op = match (i, n) {
                    (_, 1) => Operation::ReadResponseOnly,
                    (0, _) => Operation::ReadResponseFirst,
                    (i, n) if i == n - 1 => Operation::ReadResponseLast,
                    _ => Operation::ReadResponseMiddle,
                };
                let mut h = self.answer(op, psn_add(psn, i as u32));
                if op != Operation::ReadResponseMiddle {
                    h = h.aeth(syndrome, self.msn);
                }
                (h, vec![0x5a; chunk])
            })
            .collect()
    }

    /// A responder's answer to a request, as T-11, T-12 and T-16 say.
    fn serve(&mut self, h: &RoceRepr) -> Vec<(RoceRepr, Vec<u8>)> {
        let psn = h.bth.psn.value();
        let op = h.bth.opcode.operation();
        let ok = Syndrome::Ack { credits: Syndrome::INVALID_CREDITS };
        let read_len = h.reth.map_or(0, |r| r.dma_len as usize);
        let d = psn_diff(psn, self.epsn);
        if d > 0 {
            if self.nak_out {
                return Vec::new();
            }
            self.nak_out = true;
            return vec![self.ack(self.epsn, Syndrome::Nak(NakCode::PsnSequenceError))];
        }
        if d < 0 {
            return match op {
                Operation::ReadRequest => self.read_responses(psn, read_len),
                _ if h.bth.ack_req => vec![self.ack(psn_add(self.epsn, 0x00ff_ffff), ok)],
                _ => Vec::new(),
            };
        }
        self.nak_out = false;
        if op == Operation::ReadRequest {
            self.msn += 1;
            let responses = self.read_responses(psn, read_len);
            self.epsn = psn_add(psn, responses.len() as u32);
            return responses;
        }
        self.epsn = psn_add(psn, 1);
        if matches!(op.position(), Position::Last | Position::Only) {
            self.msn += 1;
        }
        if h.bth.ack_req {
            vec![self.ack(psn, ok)]
        } else {
            Vec::new()
        }
    }

    /// What we send back for a packet from the client, by our policy.
    fn on_packet(&mut self, a: &Answer) -> Vec<(RoceRepr, Vec<u8>)> {
        let h = &a.header;
        let psn = h.bth.psn.value();
        self.seen.push(Seen { at: a.at, header: *h, len: a.payload.len() });
        match self.policy {
            Policy::Normal | Policy::Fill => self.serve(h),
            Policy::Coalesce => {
                let mut out = self.serve(h);
                out.retain(|(r, _)| !is_ack(r) || self.msn.is_multiple_of(4));
                out
            }
            Policy::DoubleAck => {
                let out = self.serve(h);
                out.iter().cloned().chain(out.iter().filter(|(r, _)| is_ack(r)).cloned()).collect()
            }
            Policy::NakSeq { at } => {
                if self.acted.is_none() && psn == self.first(at + 1) {
                    self.acted = Some(Instant::now());
                    self.epsn = self.first(at);
                    self.nak_out = true;
                    return vec![self.ack(self.epsn, Syndrome::Nak(NakCode::PsnSequenceError))];
                }
                self.serve(h)
            }
            Policy::Rnr { at } => {
                if self.acted.is_none() && psn == self.first(at) {
                    self.acted = Some(Instant::now());
                    self.nak_out = true;
                    return vec![self.ack(psn, Syndrome::RnrNak { timer: RNR_TIMER })];
                }
                self.serve(h)
            }
            Policy::Silent => Vec::new(),
            Policy::NakAccess => {
                if self.acted.is_none() && h.bth.ack_req {
                    self.acted = Some(Instant::now());
                    return vec![self.ack(psn, Syndrome::Nak(NakCode::RemoteAccessError))];
                }
                Vec::new()
            }
            Policy::ImpliedNak => {
                // The first READ is held back and the second answered; then
                // nothing until the first comes again.
                if self.acted.is_none() {
                    if psn != self.first(2) {
                        return Vec::new();
                    }
                    self.acted = Some(Instant::now());
                    let len = h.reth.map_or(0, |r| r.dma_len as usize);
                    return self.read_responses(psn, len);
                }
                if !self.retried() && psn != self.first(0) {
                    return Vec::new();
                }
                self.serve(h)
            }
            Policy::CutShort => {
                if self.acted.is_none() && psn == self.first(0) {
                    self.acted = Some(Instant::now());
                    let len = h.reth.map_or(0, |r| r.dma_len as usize);
                    let mut first = self.read_responses(psn, len);
                    first.truncate(1);
                    self.msn += 1;
                    self.epsn = self.first(1);
                    return first;
                }
                if self.acted.is_some() && psn != self.epsn && !self.retried() {
                    return Vec::new();
                }
                self.serve(h)
            }
        }
    }

    /// Whether a packet at or before our expected PSN came after the act.
    fn retried(&self) -> bool {
        self.after_act().any(|s| psn_diff(s.header.bth.psn.value(), self.epsn) <= 0)
    }

    fn after_act(&self) -> impl Iterator<Item = &Seen> {
        let acted = self.acted;
        self.seen.iter().filter(move |s| acted.is_some_and(|t| s.at > t))
    }
}

fn is_ack(h: &RoceRepr) -> bool {
    h.bth.opcode.operation() == Operation::Acknowledge
}

/// A batch: one run of a client, with a policy per QP.
struct Batch {
    /// The read client's run, else the write client's ([`CLIENTS`]).
    read: bool,
    policies: &'static [Policy],
    /// Keep watching this long after the client's run ends.
    watch: Duration,
    /// Watch no longer than this in all: a client that never ends (one that
    /// retries forever, or waits for what a check withholds) is judged on
    /// what it did until then.
    limit: Duration,
}

const BATCHES: &[Batch] = &[
    Batch {
        read: false,
        policies: &[
            Policy::Normal,
            Policy::Coalesce,
            Policy::DoubleAck,
            Policy::NakSeq { at: 5 },
            Policy::Rnr { at: 3 },
        ],
        watch: Duration::from_millis(300),
        limit: Duration::from_secs(20),
    },
    Batch {
        read: false,
        policies: &[Policy::NakAccess],
        watch: Duration::from_millis(600),
        limit: Duration::from_secs(20),
    },
    Batch {
        read: true,
        policies: &[Policy::ImpliedNak, Policy::CutShort],
        watch: Duration::from_millis(300),
        limit: Duration::from_secs(20),
    },
    // Last: a peer that retries forever never ends this run.
    Batch {
        read: false,
        policies: &[Policy::Silent],
        watch: Duration::from_millis(2500),
        limit: Duration::from_secs(3),
    },
];

/// The messages of the write client: 20 of 4096 bytes (PEER_HELP).
const WRITE_MESSAGES: u32 = 20;

pub fn probe_requesters(
    probe: &mut Probe,
    plan: &Plan,
    listeners: &Listeners,
    numbers: &mut QpNumbers,
    report: &mut Report,
) {
    let mut failed: [Option<String>; 2] = [None, None];
    for batch in BATCHES {
        let checks: Vec<(Policy, &'static [CheckInfo])> = batch.policies.iter().map(|p| (*p, checks_of(*p))).collect();
        let wanted = checks.iter().any(|(_, cs)| cs.iter().any(|c| plan.wants(c.id)));
        if !wanted {
            continue;
        }
        let listener = if batch.read { &listeners.read } else { &listeners.write };
        // A client that did not come once is not waited for again.
        let result = match &failed[usize::from(batch.read)] {
            Some(why) => Err(why.clone()),
            None => run_batch(probe, &plan.setup, listener, batch, numbers),
        };
        if let Err(why) = &result {
            failed[usize::from(batch.read)] = Some(why.clone());
        }
        match result {
            Ok(players) => {
                for player in &players {
                    // One QP's packets are the ladder of each of its checks.
                    let ladder = probe.take_ladder(player.r.ours);
                    for info in checks_of(player.policy) {
                        if plan.wants(info.id) {
                            let verdict = (info.judge)(player);
                            report.add(Outcome {
                                id: info.id,
                                spec: info.spec,
                                title: info.title,
                                verdict,
                                ladder: ladder.clone(),
                            });
                        }
                    }
                }
            }
            Err(e) => {
                for (_, infos) in checks {
                    for info in infos.iter().filter(|c| plan.wants(c.id)) {
                        report.add(Outcome {
                            id: info.id,
                            spec: info.spec,
                            title: info.title,
                            verdict: Verdict::Error(e.clone()),
                            ladder: Vec::new(),
                        });
                    }
                }
            }
        }
        probe.drop_pending();
    }
}

fn run_batch(
    probe: &mut Probe,
    setup: &Setup,
    listener: &TcpListener,
    batch: &Batch,
    numbers: &mut QpNumbers,
) -> Result<Vec<Player>, String> {
    let qps = CLIENTS[usize::from(batch.read)].qps;
    let session = ClientSession::accept(listener, qps, setup, numbers).map_err(|e| e.0)?;
    let mut players: Vec<Player> = session
        .qps
        .iter()
        .enumerate()
        .map(|(i, r)| Player::new(*r, session.mtu, batch.policies.get(i).copied().unwrap_or(Policy::Fill)))
        .collect();
    let start = Instant::now();
    let mut ended: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if session.finished() && ended.is_none() {
            ended = Some(now);
        }
        let limit = match ended {
            Some(t) => (t + batch.watch).min(start + batch.limit),
            None => start + batch.limit,
        };
        if now >= limit {
            break;
        }
        let Some(answer) = probe.next(Duration::from_millis(5)).map_err(|e| e.to_string())? else { continue };
        let Some(player) = players.iter_mut().find(|p| p.r.ours == answer.header.bth.dest_qpn) else { continue };
        for (h, payload) in player.on_packet(&answer) {
            probe.send(player.r.ours, &h, &payload).map_err(|e| e.to_string())?;
        }
    }
    Ok(players)
}

/// Every requester check: id, rxe-spec statements, title.
pub fn checks() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    BATCHES.iter().flat_map(|b| b.policies).flat_map(|p| checks_of(*p)).map(|c| (c.id, c.spec, c.title))
}

/// A requester check: what it judges from one QP's packets.
struct CheckInfo {
    id: &'static str,
    spec: &'static str,
    title: &'static str,
    judge: fn(&Player) -> Verdict,
}

fn deviation(expected: impl Into<String>, seen: impl Into<String>) -> Verdict {
    Verdict::Deviation { expected: expected.into(), seen: seen.into() }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The packets the client sent, but for the asks of T-6 (a packet resent
/// with AckReq after it went without, when the requester fell idle): a
/// program that posts its next WRITE late gets one mid-stream.
fn sent_but_asks(seen: &[Seen]) -> impl Iterator<Item = &Seen> {
    let mut asked_for: std::collections::HashSet<u32> = std::collections::HashSet::new();
    let mut without_ask: std::collections::HashSet<u32> = std::collections::HashSet::new();
    seen.iter().filter(move |s| {
        let psn = s.header.bth.psn.value();
        let ask = s.header.bth.ack_req && without_ask.contains(&psn) && asked_for.insert(psn);
        if !s.header.bth.ack_req {
            without_ask.insert(psn);
        }
        !ask
    })
}

/// The PSNs the client sent more than once, but for the asks of T-6.
fn repeated(p: &Player) -> Vec<u32> {
    let mut once = std::collections::HashSet::new();
    let mut again: Vec<u32> =
        sent_but_asks(&p.seen).map(|s| s.header.bth.psn.value()).filter(|&psn| !once.insert(psn)).collect();
    again.sort_unstable();
    again.dedup();
    again
}

/// Every PSN went once (but for T-6's asks) and the run completed.
fn nothing_resent(p: &Player) -> Verdict {
    match repeated(p).as_slice() {
        [] => all_written(p),
        psns => deviation("every PSN once", format!("resent: {psns:?}")),
    }
}

fn all_written(p: &Player) -> Verdict {
    let per_message = 4096usize.div_ceil(p.mtu) as u32;
    let last = p.first(WRITE_MESSAGES * per_message - 1);
    if p.seen.iter().any(|s| s.header.bth.psn.value() == last) {
        Verdict::Pass
    } else {
        deviation(
            format!("every WRITE sent, up to PSN {last}"),
            format!("{} packets, the stream stopped", p.seen.len()),
        )
    }
}

fn checks_of(policy: Policy) -> &'static [CheckInfo] {
    match policy {
        Policy::Fill => &[],
        Policy::Normal => &[
            CheckInfo {
                id: "req.write.segmentation",
                spec: "T-4",
                title: "WRITEs of 4096 bytes go out as FIRST, MIDDLE.., LAST of one MTU each, RETH on the FIRST",
                judge: |p| {
                    let per_message = 4096usize.div_ceil(p.mtu);
                    for (i, s) in sent_but_asks(&p.seen).take(WRITE_MESSAGES as usize * per_message).enumerate() {
                        let op = s.header.bth.opcode.operation();
                        let want = match (i % per_message, per_message) {
                            (_, 1) => Operation::WriteOnly,
                            (0, _) => Operation::WriteFirst,
                            (j, n) if j == n - 1 => Operation::WriteLast,
                            _ => Operation::WriteMiddle,
                        };
                        let len_ok = matches!(want, Operation::WriteLast | Operation::WriteOnly) || s.len == p.mtu;
                        if op != want || s.header.reth.is_some() != (i % per_message == 0) || !len_ok {
                            return deviation(
                                format!("packet {i}: {} with {} bytes", want.name(), p.mtu),
                                format!("{} with {} bytes", op.name(), s.len),
                            );
                        }
                    }
                    all_written(p)
                },
            },
            CheckInfo {
                id: "req.psn.consecutive",
                spec: "T-5",
                title:
                    "request PSNs start at the announced PSN and go up by one, each sent once when all is acknowledged",
                judge: |p| {
                    for (i, s) in sent_but_asks(&p.seen).enumerate() {
                        let want = p.first(i as u32);
                        if s.header.bth.psn.value() != want {
                            return deviation(
                                format!("packet {i} at PSN {want}"),
                                format!("PSN {}", s.header.bth.psn.value()),
                            );
                        }
                    }
                    all_written(p)
                },
            },
            CheckInfo {
                id: "req.ackreq.last",
                spec: "T-6",
                title: "the last packet of the run asks for an ACK",
                judge: |p| match p.seen.last() {
                    Some(s) if s.header.bth.ack_req => Verdict::Pass,
                    Some(s) => {
                        deviation("AckReq on the last packet", format!("PSN {} without", s.header.bth.psn.value()))
                    }
                    None => deviation("a stream of WRITEs", "nothing"),
                },
            },
        ],
        Policy::Coalesce => &[CheckInfo {
            id: "req.ack.coalesced",
            spec: "T-21",
            title: "an ACK for every fourth message completes the three before it: nothing is resent",
            judge: nothing_resent,
        }],
        Policy::DoubleAck => &[CheckInfo {
            id: "req.ack.duplicate",
            spec: "T-21",
            title: "every ACK arriving twice changes nothing: nothing resent, the run completes",
            judge: nothing_resent,
        }],
        Policy::NakSeq { .. } => &[CheckInfo {
            id: "req.nak.sequence",
            spec: "T-22",
            title: "a sequence NAK for a MIDDLE's PSN: transmission restarts exactly there, with a MIDDLE",
            judge: |p| {
                let Policy::NakSeq { at } = p.policy else { return Verdict::Error("wrong policy".into()) };
                let want = p.first(at);
                match p.after_act().find(|s| psn_diff(s.header.bth.psn.value(), p.first(at + 1)) <= 0) {
                    Some(s)
                        if s.header.bth.psn.value() == want
                            && s.header.bth.opcode.operation() == Operation::WriteMiddle =>
                    {
                        all_written(p)
                    }
                    Some(s) => deviation(
                        format!("resent from PSN {want} as RDMA_WRITE_MIDDLE"),
                        format!(
                            "resent from PSN {} as {}",
                            s.header.bth.psn.value(),
                            s.header.bth.opcode.operation().name()
                        ),
                    ),
                    None => deviation(format!("resent from PSN {want}"), "nothing resent"),
                }
            },
        }],
        Policy::Rnr { .. } => &[CheckInfo {
            id: "req.rnr.timer",
            spec: "T-23",
            title: "an RNR NAK with timer 26 (81.92 ms): the NAKed PSN comes again, no sooner",
            judge: |p| {
                let Policy::Rnr { at } = p.policy else { return Verdict::Error("wrong policy".into()) };
                let (want, Some(acted)) = (p.first(at), p.acted) else {
                    return deviation("a packet to NAK", "none came");
                };
                let timer = Duration::from_micros(Syndrome::rnr_timer_micros(RNR_TIMER).into());
                match p.after_act().find(|s| psn_diff(s.header.bth.psn.value(), want) <= 0) {
                    Some(s) if s.header.bth.psn.value() != want => deviation(
                        format!("resent from PSN {want}"),
                        format!("resent from PSN {}", s.header.bth.psn.value()),
                    ),
                    Some(s) if s.at.duration_since(acted) < timer.mul_f64(SLACK) => deviation(
                        format!("PSN {want} again after {} or more", ms(timer)),
                        format!("after {}", ms(s.at.duration_since(acted))),
                    ),
                    Some(_) => all_written(p),
                    None => deviation(format!("PSN {want} again"), "nothing resent"),
                }
            },
        }],
        Policy::Silent => &[
            CheckInfo {
                id: "req.timeout.interval",
                spec: "T-24",
                title: "unanswered, the oldest PSN is resent after the ACK timeout (timeout 14: 67.1 ms), no sooner",
                judge: |p| {
                    let times = sends_of_first(p);
                    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1].duration_since(w[0])).collect();
                    match gaps.iter().min() {
                        None => deviation("the first PSN resent", format!("sent {} time(s)", times.len())),
                        Some(min) if *min < ACK_TIMEOUT.mul_f64(SLACK) => deviation(
                            format!("resends {} or more apart", ms(ACK_TIMEOUT)),
                            format!("one {} after the last", ms(*min)),
                        ),
                        Some(_) => Verdict::Pass,
                    }
                },
            },
            CheckInfo {
                id: "req.timeout.retries",
                spec: "T-24 T-30",
                title: "unanswered, the oldest PSN goes 1 + retry_cnt (7) times, then the requester gives up",
                judge: |p| {
                    let n = sends_of_first(p).len();
                    if n == 1 + RETRY_CNT {
                        Verdict::Pass
                    } else {
                        deviation(format!("{} transmissions", 1 + RETRY_CNT), format!("{n} within the watch"))
                    }
                },
            },
        ],
        Policy::NakAccess => &[CheckInfo {
            id: "req.nak.access-stops",
            spec: "T-27",
            title: "a NAK remote access error ends the QP's sending: nothing is resent after it",
            judge: |p| {
                let Some(acted) = p.acted else { return deviation("a packet asking for an ACK", "none") };
                let nak_psn = p.seen.iter().find(|s| s.header.bth.ack_req).map_or(0, |s| s.header.bth.psn.value());
                let resent: Vec<u32> = p
                    .seen
                    .iter()
                    .filter(|s| {
                        s.at > acted + Duration::from_millis(5) && psn_diff(s.header.bth.psn.value(), nak_psn) <= 0
                    })
                    .map(|s| s.header.bth.psn.value())
                    .collect();
                if resent.is_empty() {
                    Verdict::Pass
                } else {
                    deviation("nothing resent after the NAK", format!("resent {resent:?}"))
                }
            },
        }],
        Policy::ImpliedNak => &[CheckInfo {
            id: "req.read.implied-nak",
            spec: "T-25",
            title: "responses to the second READ before the first: the first READ is asked again, at its PSN",
            judge: |p| {
                let want = p.first(0);
                let retry = p.after_act().find(|s| {
                    s.header.bth.opcode.operation() == Operation::ReadRequest && s.header.bth.psn.value() == want
                });
                match retry {
                    Some(_) => Verdict::Pass,
                    None => deviation(format!("RDMA_READ_REQUEST psn={want} again"), reads_after(p)),
                }
            },
        }],
        Policy::CutShort => &[CheckInfo {
            id: "req.read.cut-short",
            spec: "T-25",
            title: "a READ answered by its FIRST response only: it is asked again for the rest, from the missing PSN",
            judge: |p| {
                let first = p.seen.first().and_then(|s| s.header.reth);
                let Some(orig) = first else { return deviation("a READ", "none") };
                let want = (p.first(1), orig.va + p.mtu as u64, orig.dma_len.saturating_sub(p.mtu as u32));
                let retry = p.after_act().find(|s| {
                    s.header.bth.opcode.operation() == Operation::ReadRequest
                        && psn_diff(s.header.bth.psn.value(), p.first(1)) <= 0
                });
                match retry {
                    Some(s) if s.header.reth.map(|r| (s.header.bth.psn.value(), r.va, r.dma_len)) == Some(want) => {
                        Verdict::Pass
                    }
                    Some(s) => deviation(
                        format!("READ psn={} va={:#x} len={}", want.0, want.1, want.2),
                        format!(
                            "READ psn={} va={:#x} len={}",
                            s.header.bth.psn.value(),
                            s.header.reth.map_or(0, |r| r.va),
                            s.header.reth.map_or(0, |r| r.dma_len)
                        ),
                    ),
                    None => deviation(format!("READ psn={} again", want.0), reads_after(p)),
                }
            },
        }],
    }
}

/// When the client sent its first PSN.
fn sends_of_first(p: &Player) -> Vec<Instant> {
    let first = p.first(0);
    p.seen.iter().filter(|s| s.header.bth.psn.value() == first).map(|s| s.at).collect()
}

fn reads_after(p: &Player) -> String {
    let psns: Vec<String> = p
        .after_act()
        .filter(|s| s.header.bth.opcode.operation() == Operation::ReadRequest)
        .map(|s| s.header.bth.psn.value().to_string())
        .collect();
    if psns.is_empty() {
        "no READ after".into()
    } else {
        format!("READs at PSNs {}", psns.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softroce::wire::{BthRepr, Opcode, Psn};

    fn seen(psn: u32, ack_req: bool) -> Seen {
        let bth = BthRepr {
            opcode: Opcode::from_u8(0x0a).unwrap(),
            solicited: false,
            mig_req: false,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: 17,
            ack_req,
            psn: Psn::new(psn),
        };
        Seen { at: Instant::now(), header: RoceRepr::new(bth), len: 64 }
    }

    #[test]
    fn an_ask_mid_stream_is_left_out_and_a_resend_is_not() {
        // 7 went without AckReq and was asked for once; 8 was sent twice.
        let run = [seen(6, false), seen(7, false), seen(7, true), seen(8, true), seen(8, true), seen(9, true)];
        let psns: Vec<u32> = sent_but_asks(&run).map(|s| s.header.bth.psn.value()).collect();
        assert_eq!(psns, [6, 7, 8, 8, 9]);
    }
}
