//! The verbs objects of a run, laid out as perftest lays them out, and the
//! post/poll loops of perftest's tests (`run_iter_bw`, `run_iter_bw_server`,
//! `run_iter_lat`, `run_iter_lat_write`, `run_iter_lat_send`).
//!
//! The layout matters where the peer reaches into our memory: perftest's
//! client WRITEs, READs and runs atomics on the server's buffer at the
//! address the server announced, stepping by the message size rounded up
//! to a cache line and wrapping every cycle buffer (a page). So the buffer
//! is perftest's: `2 × QPs` slots of `max(size, cycle buffer)` bytes, QP
//! `i` sending from slot `i` and announcing slot `QPs + i`.

use std::time::{Duration, Instant};

use softroce::transport::{
    Access, AttrMask, Mtu, MwBind, QpAttr, QpCap, QpState, QpType, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
    WorkCompletion,
};
use softroce::verbs::{
    CompletionQueue, Context, ContextOptions, Device, Gid, MemoryRegion, MemoryWindow, ProtectionDomain, QueuePair,
    WindowType,
};
use softroce::wire::Psn;

use super::proto::KeyMsg;
use super::report::BwTimes;
use super::{Conn, Params, Verb};
use crate::cli::Fail;

/// `DEF_QKEY`: the Q_Key of perftest's UD QPs.
const QKEY: u32 = 0x1111_1111;
/// `UD_ADDITION`: the GRH area before UD receive data.
const UD_ADDITION: usize = 40;
/// `CTX_POLL_BATCH`: completions taken per poll.
const POLL_BATCH: usize = 16;
/// perftest's SEND server gives up when nothing arrives for this long
/// (its `check_alive` alarm, which fires every 60 s, sees no progress twice).
const SERVER_SILENCE: Duration = Duration::from_secs(120);
/// perftest's `DEF_QP_TIME`: the local ACK timeout exponent.
const QP_TIMEOUT: u8 = 14;
/// perftest's `MIN_RNR_TIMER`.
const MIN_RNR_TIMER: u8 = 12;

/// `INC`: a message's footprint in the cycle buffer, at least a cache line.
fn inc(size: usize, cache_line: usize) -> usize {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// The objects of a run (`struct pingpong_context`).
pub struct Res {
    _ctx: Context,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qps: Vec<QueuePair>,
    /// `--mw`: QP i's window over the whole buffer, and its bind, posted
    /// once the QP is in RTS; its key is the one the peer gets.
    windows: Vec<(MemoryWindow, MwBind)>,
    /// `BUFF_SIZE(size, cycle_buffer)`: one slot of the buffer.
    slot: usize,
    /// The cycle buffer (page) and cache line sizes both sides agreed on.
    cycle: usize,
    cache_line: usize,
    /// UD destinations, once connected.
    ud: Vec<UdDest>,
    /// `--timeout`: how long to wait without progress.
    timeout: Option<Duration>,
    /// The zero of the runs' timestamps.
    origin: Instant,
}

impl Res {
    /// Opens the device and creates the PD, buffer, CQs and QPs in INIT
    /// (`ctx_init`), for messages up to `p.size` bytes.
    pub fn new(
        device: &Device,
        options: ContextOptions,
        p: &Params,
        cycle: usize,
        cache_line: usize,
    ) -> Result<Res, Fail> {
        let ctx =
            Context::open(device, options).map_err(|e| Fail(format!("Couldn't get context for the device: {e}")))?;
        let pd = ctx.alloc_pd().map_err(|e| Fail(format!("Couldn't allocate PD: {e}")))?;
        let n = p.num_qps;
        let slot = p.size.max(cycle);
        let mut len = inc(slot, cache_line) * 2 * n;
        if p.conn == Conn::Ud {
            len += cache_line;
        }
        let remote = match p.verb {
            Verb::Write => Access::REMOTE_WRITE,
            Verb::Read => Access::REMOTE_READ,
            Verb::Atomic => Access::REMOTE_ATOMIC,
            Verb::Send => Access::NONE,
        };
        // With windows the region grants no remote right: they do.
        let access = Access::LOCAL_WRITE | if p.windows { Access::MW_BIND } else { remote };
        let mr = pd.alloc_mr(len, access).map_err(|e| Fail(format!("Couldn't allocate MR: {e}")))?;
        // perftest fills the buffer with rand(), except for write_lat, whose
        // ping-pong polls the last byte of each message and needs zeros.
        if !(p.verb == Verb::Write && p.lat) {
            let mut x = 0x2545_f491_4f6c_dd1du64 ^ u64::from(std::process::id());
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            mr.write(0, &bytes)?;
        }
        let cqe = (p.tx_depth + p.rx_depth) as usize * n;
        let send_cq = ctx.create_cq(cqe, None).map_err(|e| Fail(format!("Couldn't create CQ: {e}")))?;
        let recv_cq = ctx.create_cq(cqe, None).map_err(|e| Fail(format!("Couldn't create CQ: {e}")))?;
        let qp_type = match p.conn {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
        };
        let cap = QpCap {
            max_send_wr: p.tx_depth,
            max_recv_wr: if p.verb == Verb::Send { p.rx_depth } else { 1 },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qps = Vec::with_capacity(n);
        for _ in 0..n {
            let recv = if p.verb == Verb::Send { &recv_cq } else { &send_cq };
            let qp = pd
                .create_qp(qp_type, &send_cq)
                .recv_cq(recv)
                .cap(cap)
                .build()
                .map_err(|e| Fail(format!("Couldn't create QP: {e}")))?;
            let mut attr = QpAttr { state: QpState::Init, port: p.ib_port, pkey_index: 0, ..QpAttr::default() };
            let mask = if p.conn == Conn::Ud {
                attr.qkey = QKEY;
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
            } else {
                attr.access_flags = match p.verb {
                    Verb::Atomic => Access::REMOTE_ATOMIC,
                    Verb::Read => Access::REMOTE_READ,
                    Verb::Write => Access::REMOTE_WRITE,
                    Verb::Send => Access::REMOTE_WRITE | Access::LOCAL_WRITE,
                };
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
            };
            qp.modify(&attr, mask).map_err(|e| Fail(format!("Failed to modify QP to INIT, {e}")))?;
            qps.push(qp);
        }
        let mut windows = Vec::new();
        if p.windows {
            for _ in 0..n {
                let mw = pd.alloc_mw(WindowType::Type2).map_err(|e| Fail(format!("Couldn't allocate MW: {e}")))?;
                let bind = mw.bind_request(Some(&mr), mr.addr(), len as u64, remote);
                windows.push((mw, bind));
            }
        }
        Ok(Res {
            _ctx: ctx,
            pd,
            mr,
            send_cq,
            recv_cq,
            qps,
            windows,
            slot,
            cycle,
            cache_line,
            ud: Vec::new(),
            timeout: p.timeout,
            origin: Instant::now(),
        })
    }

    /// Our key messages (`set_up_connection`): a random first PSN per QP and
    /// slot `QPs + i` of the buffer as the address the peer uses.
    pub fn key_messages(&self, p: &Params, gid: Gid, lid: u16) -> Result<Vec<KeyMsg>, Fail> {
        let n = self.qps.len();
        let mut mine = Vec::with_capacity(n);
        for (i, qp) in self.qps.iter().enumerate() {
            mine.push(KeyMsg {
                lid,
                out_reads: p.out_reads,
                qpn: qp.qpn(),
                // Random, as the QP's own first PSN is.
                psn: qp.endpoint(0)?.psn.value(),
                rkey: self.windows.get(i).map_or(self.mr.rkey(), |(_, bind)| bind.rkey),
                vaddr: self.mr.addr() + ((n + i) * self.slot) as u64,
                gid: gid.to_bytes(),
                srqn: 0,
            });
        }
        Ok(mine)
    }

    /// `ctx_connect`: RTR for every QP, and RTS where this side sends
    /// (`rts`); for UD, the address handles.
    pub fn connect(&mut self, p: &Params, mtu: Mtu, mine: &[KeyMsg], theirs: &[KeyMsg], rts: bool) -> Result<(), Fail> {
        for (i, qp) in self.qps.iter().enumerate() {
            let (me, peer) = (&mine[i], &theirs[i]);
            let dest = Gid::from_bytes(peer.gid).to_ip();
            let attr = QpAttr {
                dest: Some(dest),
                path_mtu: mtu,
                dest_qpn: peer.qpn & 0x00ff_ffff,
                rq_psn: Psn::new(peer.psn),
                max_dest_rd_atomic: me.out_reads.min(255) as u8,
                min_rnr_timer: MIN_RNR_TIMER,
                sq_psn: Psn::new(me.psn),
                timeout: QP_TIMEOUT,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: peer.out_reads.min(255) as u8,
                ..QpAttr::default()
            };
            let (rtr, rts_mask) = match p.conn {
                Conn::Rc => (
                    AttrMask::AV
                        | AttrMask::PATH_MTU
                        | AttrMask::DEST_QPN
                        | AttrMask::RQ_PSN
                        | AttrMask::MIN_RNR_TIMER
                        | AttrMask::MAX_DEST_RD_ATOMIC,
                    AttrMask::SQ_PSN
                        | AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::MAX_QP_RD_ATOMIC,
                ),
                Conn::Uc => {
                    (AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN, AttrMask::SQ_PSN)
                }
                Conn::Ud => (AttrMask::empty(), AttrMask::SQ_PSN),
            };
            qp.modify(&QpAttr { state: QpState::Rtr, ..attr }, AttrMask::STATE | rtr)
                .map_err(|e| Fail(format!("Failed to modify QP {} to RTR: {e}", qp.qpn())))?;
            // A window is bound through its QP's send queue: RTS.
            if rts || p.windows {
                qp.modify(&QpAttr { state: QpState::Rts, ..attr }, AttrMask::STATE | rts_mask)
                    .map_err(|e| Fail(format!("Failed to modify QP to RTS: {e}")))?;
            }
            if let Some(&(_, bind)) = self.windows.get(i) {
                qp.post_send(SendWr::new(u64::MAX, SendOp::BindMw(bind)))
                    .map_err(|e| Fail(format!("Couldn't bind MW: {e}")))?;
                let done = self.send_cq.wait_one(Duration::from_secs(5));
                if !done.is_some_and(|wc| wc.status == WcStatus::Success && wc.opcode == WcOpcode::BindMw) {
                    return Err(Fail(format!("Couldn't bind MW: {done:?}")));
                }
            }
            if p.conn == Conn::Ud && rts {
                let ah = self.pd.create_ah(Gid::from_ip(dest));
                self.ud.push(ah.ud_dest(peer.qpn & 0x00ff_ffff, QKEY));
            }
        }
        Ok(())
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Offset of message `count` of `size` bytes in a slot starting at
    /// `base`: perftest steps through the cycle buffer for messages of up
    /// to half of it (`increase_loc_addr`, `increase_rem_addr`).
    fn cycled(&self, base: usize, size: usize, count: u64) -> usize {
        if size <= self.cycle / 2 {
            let step = inc(size, self.cache_line);
            base + (count as usize % (self.cycle / step)) * step
        } else {
            base
        }
    }

    /// The `count`-th request of QP `q` for a test of `size` bytes.
    fn request(&self, p: &Params, q: usize, peer: &KeyMsg, size: usize, count: u64, signaled: bool) -> SendWr {
        let local = self.cycled(q * self.slot, size, count);
        let remote_addr = peer.vaddr.wrapping_add(self.cycled(0, size, count) as u64);
        let op = match p.verb {
            Verb::Send => SendOp::Send,
            Verb::Write => SendOp::RdmaWrite { remote_addr, rkey: peer.rkey },
            Verb::Read => SendOp::RdmaRead { remote_addr, rkey: peer.rkey },
            Verb::Atomic if p.cmp_and_swap => SendOp::CompareSwap { remote_addr, rkey: peer.rkey, compare: 0, swap: 0 },
            Verb::Atomic => SendOp::FetchAdd { remote_addr, rkey: peer.rkey, add: 1 },
        };
        let mut wr = SendWr::new(q as u64, op).with_sge(self.mr.sge(local, size));
        wr.flags.signaled = signaled;
        wr.ud = self.ud.get(q).copied();
        wr
    }

    fn post(&self, q: usize, wr: SendWr, count: u64) -> Result<(), Fail> {
        self.post_list(q, [wr], count)
    }

    /// Posts `wrs` on QP `q` in one post; `count` is the first one's number.
    fn post_list(&self, q: usize, wrs: impl IntoIterator<Item = SendWr>, count: u64) -> Result<(), Fail> {
        self.qps[q]
            .post_send_list(wrs)
            .map_err(|(bad, e)| Fail(format!("Couldn't post send: qp {q} scnt={}: {e}", count + bad as u64)))
    }

    /// Where QP `q`'s receives land (`ctx_set_recv_wqes`).
    fn recv_wr(&self, p: &Params, q: usize, size: usize) -> RecvWr {
        let n = self.qps.len();
        let mut offset = (n + q) * inc(self.slot, self.cache_line);
        let mut len = size;
        if p.conn == Conn::Ud {
            offset += self.cache_line - UD_ADDITION;
            len += UD_ADDITION;
        }
        RecvWr { wr_id: q as u64, sg_list: softroce::sg_list![self.mr.sge(offset, len)] }
    }

    /// Posts `count` receives on QP `q`.
    pub fn post_recvs(&self, p: &Params, q: usize, size: usize, count: u32) -> Result<(), Fail> {
        for j in 0..count {
            self.qps[q]
                .post_recv(self.recv_wr(p, q, size))
                .map_err(|e| Fail(format!("Couldn't post recv Qp = {q}: counter={j}: {e}")))?;
        }
        Ok(())
    }

    /// Up to [`POLL_BATCH`] completions, waiting for the first at most `wait`.
    fn poll(cq: &CompletionQueue, batch: &mut Vec<WorkCompletion>, wait: Duration) {
        batch.clear();
        if let Some(wc) = cq.poll_one().or_else(|| cq.wait_one(wait)) {
            batch.push(wc);
            while batch.len() < POLL_BATCH {
                match cq.poll_one() {
                    Some(wc) => batch.push(wc),
                    None => break,
                }
            }
        }
    }

    /// Fails once `last` is longer ago than the no-progress limit.
    fn check_progress(&self, last: Instant, what: impl FnOnce() -> String) -> Result<(), Fail> {
        match self.timeout {
            Some(limit) if last.elapsed() >= limit => {
                Err(Fail(format!("no progress for {:.1} seconds while {}", last.elapsed().as_secs_f64(), what())))
            }
            _ => Ok(()),
        }
    }

    /// `run_iter_bw`: every QP keeps up to `tx_depth` requests in flight,
    /// one in `cq_mod` signaled (and the last), until `iters` completed on
    /// each, or with `-D` until the time is up. For SEND with `-b`
    /// (`run_iter_bi`) it also counts and re-posts receives until `iters`
    /// arrived on each QP, and the server sends only once the first has.
    /// Returns the timestamps and the number of messages they cover.
    pub fn run_bw(&self, p: &Params, theirs: &[KeyMsg], size: usize, server: bool) -> Result<(BwTimes, u64), Fail> {
        let n = self.qps.len();
        let iters = if p.duration.is_some() { u64::MAX } else { u64::from(p.iters) };
        let total = iters.saturating_mul(n as u64);
        let cq_mod = u64::from(p.cq_mod);
        let receiving = p.duplex && p.verb == Verb::Send;
        let mut clock = Clock::new(p.duration);
        let mut times = BwTimes::new(if clock.timed() { 1 } else { total as usize }, p.no_peak);
        let (mut scnt, mut ccnt) = (vec![0u64; n], vec![0u64; n]);
        let (mut totscnt, mut totccnt) = (0u64, 0u64);
        let (mut rcnt, mut posted) = (0u64, vec![u64::from(p.rx_depth); n]);
        // "Give some priority to RX": the server's first message waits for
        // the client's.
        let mut may_send = !(receiving && server);
        let mut batch = Vec::with_capacity(POLL_BATCH);
        let mut last = Instant::now();
        let list = u64::from(p.post_list);
        while (totscnt < total || totccnt < total || (receiving && rcnt < total)) && !clock.ended() {
            for q in 0..n {
                while may_send && scnt[q] < iters && scnt[q] - ccnt[q].min(scnt[q]) + list <= u64::from(p.tx_depth) {
                    let first = scnt[q];
                    let wrs = (first..first + list)
                        .map(|c| self.request(p, q, &theirs[q], size, c, (c + 1) % cq_mod == 0 || c + 1 == iters));
                    if !clock.timed() {
                        let now = self.now();
                        (0..list).for_each(|j| times.post((totscnt + j) as usize, now));
                    }
                    self.post_list(q, wrs, first)?;
                    scnt[q] += list;
                    totscnt += list;
                }
            }
            let mut progress = false;
            if receiving {
                Self::poll(&self.recv_cq, &mut batch, Duration::ZERO);
                for wc in &batch {
                    if wc.status != WcStatus::Success {
                        return Err(Fail(format!(
                            " Completion with error at {}\n Failed status {}: wr_id {} syndrom 0x0\n rcnt={rcnt} ({})",
                            if server { "server" } else { "client" },
                            wc.status as u32,
                            wc.wr_id as i32,
                            wc.status.as_str()
                        )));
                    }
                    rcnt += 1;
                    may_send = true;
                    let q = (wc.wr_id as usize).min(n - 1);
                    if posted[q] < iters {
                        self.post_recvs(p, q, size, 1)?;
                        posted[q] += 1;
                    }
                }
                progress = !batch.is_empty();
            }
            let wait = if receiving || clock.timed() { 1 } else { 100 };
            Self::poll(&self.send_cq, &mut batch, Duration::from_millis(wait));
            for wc in &batch {
                if wc.status != WcStatus::Success {
                    return Err(Fail(format!(
                        " Completion with error at client\n Failed status {}: wr_id {} syndrom 0x0\nscnt={totscnt}, ccnt={totccnt}\n ({})",
                        wc.status as u32,
                        wc.wr_id as i32,
                        wc.status.as_str()
                    )));
                }
                let q = (wc.wr_id as usize).min(n - 1);
                ccnt[q] += cq_mod;
                totccnt += cq_mod;
                if clock.timed() {
                    clock.count(cq_mod);
                } else {
                    times.complete(totccnt as usize, self.now());
                }
            }
            if progress || !batch.is_empty() {
                last = Instant::now();
            } else {
                self.check_progress(last, || format!("waiting for completions ({totccnt} of {total})"))?;
            }
        }
        Ok(clock.finish(self, times, total))
    }

    /// `run_iter_bw_server`: counts receives until `iters` arrived on every
    /// QP (or with `-D` until the time is up), re-posting while fewer than
    /// `iters` were posted. The clock starts at the first receive.
    pub fn run_bw_server(&self, p: &Params, size: usize) -> Result<(BwTimes, u64), Fail> {
        let n = self.qps.len();
        let iters = if p.duration.is_some() { u64::MAX } else { u64::from(p.iters) };
        let total = iters.saturating_mul(n as u64);
        let mut clock = Clock::new(p.duration);
        let mut times = BwTimes::new(1, true);
        let mut posted = vec![u64::from(p.rx_depth); n];
        let mut rcnt = 0u64;
        let mut batch = Vec::with_capacity(POLL_BATCH);
        let mut last = Instant::now();
        while rcnt < total && !(rcnt > 0 && clock.ended()) {
            Self::poll(&self.recv_cq, &mut batch, Duration::from_millis(if clock.timed() { 1 } else { 100 }));
            if batch.is_empty() {
                if last.elapsed() >= self.timeout.unwrap_or(SERVER_SILENCE) {
                    return Err(Fail(format!(
                        " Did not get Message for {} Seconds, exiting..\n Total Received={rcnt}, Total Iters Required={total}",
                        last.elapsed().as_secs()
                    )));
                }
                continue;
            }
            last = Instant::now();
            for wc in &batch {
                if rcnt == 0 {
                    times.post(0, self.now());
                    clock = Clock::new(p.duration);
                }
                if wc.status != WcStatus::Success {
                    return Err(Fail(format!(
                        " Completion with error at server\n Failed status {}: wr_id {} syndrom 0x0\n rcnt={rcnt} ({})",
                        wc.status as u32,
                        wc.wr_id as i32,
                        wc.status.as_str()
                    )));
                }
                rcnt += 1;
                clock.count(1);
                let q = (wc.wr_id as usize).min(n - 1);
                if posted[q] < iters {
                    self.post_recvs(p, q, size, 1)?;
                    posted[q] += 1;
                }
            }
        }
        Ok(clock.finish(self, times, total))
    }

    /// `run_iter_lat` (READ and atomic latency): one signaled request at a
    /// time on QP 0; returns the post times.
    pub fn run_lat(&self, p: &Params, peer: &KeyMsg, size: usize) -> Result<Vec<u64>, Fail> {
        let mut posted = Vec::with_capacity(p.iters as usize);
        for s in 0..u64::from(p.iters) {
            posted.push(self.now());
            self.post(0, self.request(p, 0, peer, size, 0, true), s)?;
            self.wait_send(s)?;
        }
        Ok(posted)
    }

    /// Waits for one send completion, which must be a success.
    fn wait_send(&self, count: u64) -> Result<(), Fail> {
        let last = Instant::now();
        loop {
            if let Some(wc) = self.send_cq.poll_one().or_else(|| self.send_cq.wait_one(Duration::from_millis(100))) {
                if wc.status != WcStatus::Success {
                    return Err(Fail(format!(
                        " Completion with error at client\n Failed status {}: wr_id {} syndrom 0x0\nscnt={count}, ccnt={count}\n ({})",
                        wc.status as u32,
                        wc.wr_id as i32,
                        wc.status.as_str()
                    )));
                }
                return Ok(());
            }
            self.check_progress(last, || format!("waiting for the completion of request {count}"))?;
        }
    }

    /// `run_iter_lat_write`: each side WRITEs its message into the peer's
    /// slot, the last byte holding the iteration number (mod 256), and waits
    /// for the peer's to land in its own; the server sends first.
    pub fn run_lat_write(&self, p: &Params, peer: &KeyMsg, size: usize, server: bool) -> Result<Vec<u64>, Fail> {
        let iters = u64::from(p.iters);
        let n = self.qps.len();
        let poll_at = n * self.slot + size - 1;
        let mut posted = Vec::with_capacity(iters as usize);
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        while scnt < iters || rcnt < iters {
            if rcnt < iters && !(scnt < 1 && server) {
                rcnt += 1;
                self.wait_byte(poll_at, rcnt as u8, rcnt)?;
            }
            if scnt < iters {
                posted.push(self.now());
                scnt += 1;
                self.mr.write(size - 1, &[scnt as u8])?;
                // Request 0: the start of our slot 0 to the start of theirs.
                self.post(0, self.request(p, 0, peer, size, 0, true), scnt)?;
                self.wait_send(scnt)?;
            }
        }
        Ok(posted)
    }

    /// Spins until the byte at `offset` of the buffer is `value`.
    fn wait_byte(&self, offset: usize, value: u8, count: u64) -> Result<(), Fail> {
        // The peer's WRITE lands while we look: read through the atomic
        // load of the aligned word holding the byte.
        let word = offset & !7;
        let shift = (offset - word) * 8;
        let last = Instant::now();
        let mut spins = 0u32;
        while (self.mr.load_u64(word)? >> shift) as u8 != value {
            spins += 1;
            if spins.is_multiple_of(1024) {
                // Two cores on a busy host: leave room for the engine.
                std::thread::yield_now();
                self.check_progress(last, || format!("waiting for the peer's WRITE {count}"))?;
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// `run_iter_lat_send`: SEND ping-pong on QP 0; the client sends first,
    /// each side sends once it received, re-posting receives while fewer than
    /// `iters` were posted.
    pub fn run_lat_send(&self, p: &Params, peer: &KeyMsg, size: usize, client: bool) -> Result<Vec<u64>, Fail> {
        let iters = u64::from(p.iters);
        let rx_depth = u64::from(p.rx_depth);
        let mut posted = Vec::with_capacity(iters as usize);
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        while scnt < iters || rcnt < iters {
            if rcnt < iters && !(scnt < 1 && client) {
                let last = Instant::now();
                let wc = loop {
                    if let Some(wc) =
                        self.recv_cq.poll_one().or_else(|| self.recv_cq.wait_one(Duration::from_millis(100)))
                    {
                        break wc;
                    }
                    self.check_progress(last, || format!("waiting for message {}", rcnt + 1))?;
                };
                if wc.status != WcStatus::Success {
                    return Err(Fail(format!(
                        " Completion with error at {}\n Failed status {}: wr_id {} syndrom 0x0\n rcnt={rcnt} ({})",
                        if client { "client" } else { "server" },
                        wc.status as u32,
                        wc.wr_id as i32,
                        wc.status.as_str()
                    )));
                }
                rcnt += 1;
                if rcnt + rx_depth <= iters {
                    self.post_recvs(p, 0, size, 1)?;
                }
            }
            if scnt < iters {
                posted.push(self.now());
                scnt += 1;
                let wr = self.request(p, 0, peer, size, 0, true);
                self.post(0, wr, scnt)?;
                self.wait_send(scnt)?;
            }
        }
        Ok(posted)
    }
}

/// `-D`'s phases (perftest's `catch_alarm`): a margin, the sample whose
/// completions count, a margin, the end. Without `-D` it is always
/// sampling and never ends.
struct Clock {
    phases: Option<(Instant, Instant, Instant)>,
    counted: u64,
}

impl Clock {
    /// Starting now, for `(length, margin)`.
    fn new(duration: Option<(Duration, Duration)>) -> Clock {
        let phases = duration.map(|(length, margin)| {
            let start = Instant::now();
            (start + margin, start + length.saturating_sub(margin), start + length)
        });
        Clock { phases, counted: 0 }
    }

    fn timed(&self) -> bool {
        self.phases.is_some()
    }

    fn ended(&self) -> bool {
        self.phases.is_some_and(|(_, _, end)| Instant::now() >= end)
    }

    /// Counts `n` messages if they completed in the sample.
    fn count(&mut self, n: u64) {
        if let Some((from, to, _)) = self.phases {
            let now = Instant::now();
            if now >= from && now < to {
                self.counted += n;
            }
        }
    }

    /// The timestamps and message count to report: the sample's bounds and
    /// what it counted with `-D`, else the run's own.
    fn finish(self, res: &Res, mut times: BwTimes, total: u64) -> (BwTimes, u64) {
        match self.phases {
            Some((from, to, _)) => {
                let at = |t: Instant| t.saturating_duration_since(res.origin).as_nanos() as u64;
                times.posted[0] = at(from);
                times.completed[0] = at(to);
                (times, self.counted)
            }
            None => {
                times.finish(res.now());
                (times, total)
            }
        }
    }
}
