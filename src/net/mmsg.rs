//! Batched datagram I/O with `sendmmsg`/`recvmmsg`, with UDP GSO and GRO.
//!
//! The kernel's per-datagram work (socket lookup, an skb, a trip through the
//! IP stack) is most of what a UDP link costs, so datagrams move in batches
//! of up to [`BATCH`] per system call, and consecutive ones to the same
//! destination with the same length travel as one GSO super-datagram
//! (`UDP_SEGMENT`): one skb through the stack, cut into the original
//! datagrams by the device, or by the receiving socket, or not at all when
//! the receiver asked for them coalesced (`UDP_GRO`), as [`RecvBatch`] does.
//!
//! A segment of a super-datagram is a whole datagram on the wire, with its
//! own IP and UDP headers. The one difference to sending it alone is its
//! IPv4 Identification: the kernel numbers the segments upward from the
//! super-datagram's ID (0 from an unconnected `IP_PMTUDISC_DO` socket), so
//! the `k`th segment carries ID `k`. [`SendBatch::push`] says which `k` a
//! datagram gets, for callers whose payload covers the IP header (RoCE's
//! ICRC).
//!
//! The calls go to the kernel as raw system calls: libc's wrappers are
//! cancellation points, which an application thread polling its CQ must not
//! meet inside softroce (rxe-spec C-24), and each wraps the call in two
//! atomic updates of the thread's cancellation state, 3.7% of a spinning
//! `ib_send_lat`'s CPU.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::RawFd;

use crate::stages::{self, Stage};
use crate::transport::Lent;

/// Messages per system call.
pub const BATCH: usize = 32;
/// Segments per GSO super-datagram: `UDP_MAX_SEGMENTS` of Linux before 6.9
/// (128 since); a larger train would be refused where the smaller limit holds.
pub const MAX_SEGMENTS: usize = 64;
/// The largest UDP payload of an IPv4 datagram (65535 minus the IP and UDP
/// headers): the bound on a super-datagram, and on any one datagram.
pub const MAX_DATAGRAM: usize = 65535 - 20 - 8;
/// Bytes a send batch holds: eight full super-datagrams, so a round of an
/// engine's transmissions (64 packets of 4 KiB per QP) usually leaves in one
/// system call without holding megabytes per socket.
const SEND_BYTES: usize = 8 * (MAX_DATAGRAM + 1);
/// iovecs of one `sendmmsg` call at most: per message, a lent payload and
/// the bytes before it for each segment, and the bytes after the last.
const IOVS: usize = BATCH * (2 * MAX_SEGMENTS + 1);
/// Bytes a receive fill takes ahead of the engine, about: the kernel
/// writes them before the first is checked and placed, and 32 GRO trains
/// (2 MiB, this machine's L2) came back from the next cache level for both
/// (rxe-spec T-37: a 1 MiB READ stream 4.5–5.2 GB/s with 32 slots, 6.0–6.4
/// with this).
const FILL_AHEAD: usize = 256 << 10;
/// Bytes of one receive slot: a whole GRO super-datagram.
const SLOT: usize = 1 << 16;
/// `u64`s of control buffer per message, so it is aligned for `cmsghdr`:
/// room for one `cmsghdr` and an `int` (`CMSG_SPACE(4)` is 24 bytes).
const CONTROL_WORDS: usize = 4;

/// One message of a send batch: a datagram, or a GSO train of segments of
/// `segment` bytes each (the last may be shorter), stored contiguously but
/// for lent payloads, whose places are left unwritten.
#[derive(Clone, Copy)]
struct Message {
    dest: SocketAddr,
    /// The owner slot of the first datagram's destination QP ([`owner_slot`]).
    slot: u8,
    start: usize,
    len: usize,
    segment: usize,
    segments: usize,
    /// Its lent payloads: `SendBatch::lent[lent_from..lent_to]`.
    lent_from: usize,
    lent_to: usize,
}

impl Message {
    const EMPTY: Message = Message {
        dest: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        slot: 0,
        start: 0,
        len: 0,
        segment: 0,
        segments: 0,
        lent_from: 0,
        lent_to: 0,
    };

    /// Whether a datagram of `len` bytes to `dest`, for a QP of owner slot
    /// `slot`, can be the next segment: not after a shorter last one, within
    /// the kernel's limits, and for the same owner, as a receiving host
    /// steers a train by its first segment (rxe-spec N-3).
    fn takes(&self, dest: SocketAddr, slot: u8, len: usize) -> bool {
        self.dest == dest
            && self.slot == slot
            && len <= self.segment
            && self.len == self.segment * self.segments
            && self.segments < MAX_SEGMENTS
            && self.len + len <= MAX_DATAGRAM
    }
}

/// The slot of the process that owns a RoCE packet's destination QP on a
/// shared port: the top byte of the BTH's destination QPN (`net::share`).
fn owner_slot(roce: &[u8]) -> u8 {
    roce.get(5).copied().unwrap_or(0)
}

/// Datagrams to send from one socket, grouped into GSO trains while the
/// socket takes them.
pub struct SendBatch {
    data: Vec<u8>,
    used: usize,
    messages: [Message; BATCH],
    count: usize,
    /// Payloads sent from where they were lent (`commit_lent`), in the order
    /// of their places in `data`.
    lent: Vec<(usize, Lent)>,
    gso: bool,
    /// The headers `flush` hands the kernel, kept to avoid building 8 KiB
    /// of them on the stack or the heap for every call.
    wire: Box<Wire>,
}

impl SendBatch {
    /// An empty batch; `gso` says whether to try `UDP_SEGMENT` at all.
    pub fn new(gso: bool) -> SendBatch {
        SendBatch {
            data: vec![0; SEND_BYTES],
            used: 0,
            messages: [Message::EMPTY; BATCH],
            count: 0,
            lent: Vec::with_capacity(SEND_BYTES / 4096),
            gso,
            wire: Wire::new(),
        }
    }

    /// Whether datagrams still travel as GSO trains (false once the kernel
    /// refused one).
    pub fn gso(&self) -> bool {
        self.gso
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Room for a datagram of up to `len` bytes where the next one queued
    /// goes, so a caller can build it in place and [`SendBatch::commit`] it
    /// instead of pushing a copy; `None` when the batch is full (flush).
    pub fn room(&mut self, len: usize) -> Option<&mut [u8]> {
        let fits = self.count < BATCH && self.used + len <= self.data.len();
        fits.then(|| &mut self.data[self.used..self.used + len])
    }

    /// Queues a copy of `datagram` for `dest`; see [`SendBatch::commit`].
    pub fn push(&mut self, dest: SocketAddr, datagram: &[u8]) -> io::Result<Option<(&mut [u8], u16)>> {
        let len = datagram.len();
        check_len(len)?;
        let Some(room) = self.room(len) else { return Ok(None) };
        room.copy_from_slice(datagram);
        self.commit(dest, len)
    }

    /// Queues the first `len` bytes of [`SendBatch::room`] as a datagram for
    /// `dest`. Returns them, for the caller to finish (the ICRC), and their
    /// index in their GSO train — the IPv4 ID they will carry — or `None`
    /// when the batch has no room: flush, then build or push again.
    pub fn commit(&mut self, dest: SocketAddr, len: usize) -> io::Result<Option<(&mut [u8], u16)>> {
        self.queue(dest, len, None)
    }

    /// [`SendBatch::commit`] of a datagram whose bytes from `at` on are
    /// `payload`, sent from where it was lent: its place in the room stays
    /// unwritten, and `payload` must stay readable until the next
    /// [`SendBatch::flush`] returns.
    pub fn commit_lent(
        &mut self,
        dest: SocketAddr,
        len: usize,
        at: usize,
        payload: Lent,
    ) -> io::Result<Option<(&mut [u8], u16)>> {
        if at.checked_add(payload.len()).is_none_or(|end| end > len) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a lent payload past its datagram's end"));
        }
        self.queue(dest, len, Some((at, payload)))
    }

    fn queue(
        &mut self,
        dest: SocketAddr,
        len: usize,
        lent: Option<(usize, Lent)>,
    ) -> io::Result<Option<(&mut [u8], u16)>> {
        check_len(len)?;
        if self.used + len > self.data.len() {
            return Ok(None);
        }
        let slot = owner_slot(&self.data[self.used..self.used + len]);
        let joins = self.gso && self.count > 0 && self.messages[self.count - 1].takes(dest, slot, len);
        let index = if joins {
            let last = &mut self.messages[self.count - 1];
            last.len += len;
            last.segments += 1;
            last.segments - 1
        } else if self.count == BATCH {
            return Ok(None);
        } else {
            let at = self.lent.len();
            self.messages[self.count] =
                Message { dest, slot, start: self.used, len, segment: len, segments: 1, lent_from: at, lent_to: at };
            self.count += 1;
            0
        };
        if let Some((at, payload)) = lent {
            self.lent.push((self.used + at, payload));
            self.messages[self.count - 1].lent_to += 1;
        }
        let queued = &mut self.data[self.used..self.used + len];
        self.used += len;
        // `index` < MAX_SEGMENTS.
        Ok(Some((queued, index as u16)))
    }

    /// Sends everything queued on `fd`. Datagrams the kernel refuses for a
    /// full socket buffer are dropped, as a NIC drops on a full queue (RC
    /// retransmits them); one it refuses for another reason (too large for
    /// the path) is dropped and its error returned once the rest is sent.
    ///
    /// If the kernel refuses a GSO train itself (`UDP_SEGMENT` unsupported,
    /// or a path that cannot checksum or segment it), the batch stops using
    /// GSO for good and sends the trains as single datagrams; as those carry
    /// ID 0 rather than their index, `reindex` is called on each segment
    /// with index `k` > 0 to redo what depends on the ID.
    pub fn flush(&mut self, fd: RawFd, reindex: &mut dyn FnMut(SocketAddr, &mut [u8], u16)) -> io::Result<usize> {
        if !self.gso {
            materialize(&mut self.data, &mut self.lent, &mut self.messages[..self.count]);
        }
        let wire = &mut *self.wire;
        let mut sent = 0;
        let mut error = None;
        // The next message to send, and its next segment in plain mode.
        let (mut message, mut segment) = (0, 0);
        while message < self.count {
            // Lay out up to BATCH wire messages from (message, segment) on.
            let (mut m, mut s, mut n, mut iov) = (message, segment, 0, 0);
            while m < self.count && n < BATCH {
                let msg = &self.messages[m];
                wire.origins[n] = (m, s);
                let first = iov;
                if self.gso {
                    let train = if msg.segments > 1 { msg.segment } else { 0 };
                    // The stored bytes, and each lent payload in its place.
                    let mut at = msg.start;
                    if msg.lent_to > msg.lent_from {
                        for &(place, payload) in &self.lent[msg.lent_from..msg.lent_to] {
                            wire.iovs[iov] = iovec(&mut self.data[at..place]);
                            wire.iovs[iov + 1] =
                                libc::iovec { iov_base: payload.as_ptr().cast_mut().cast(), iov_len: payload.len() };
                            (iov, at) = (iov + 2, place + payload.len());
                        }
                    }
                    wire.iovs[iov] = iovec(&mut self.data[at..msg.start + msg.len]);
                    iov += 1;
                    wire.set(n, first..iov, msg.len, msg.dest, train);
                    m += 1;
                } else {
                    let at = msg.start + s * msg.segment;
                    let len = msg.segment.min(msg.start + msg.len - at);
                    wire.iovs[iov] = iovec(&mut self.data[at..at + len]);
                    iov += 1;
                    wire.set(n, first..iov, len, msg.dest, 0);
                    s += 1;
                    if s == msg.segments {
                        (m, s) = (m + 1, 0);
                    }
                }
                n += 1;
            }
            let done = if n == 1 && wire.segments[0] == 1 && wire.headers[0].msg_hdr.msg_iovlen == 1 {
                // One plain datagram: `sendto` spares the kernel copying
                // and checking a message header and an iovec, 0.13 µs of a
                // ping-pong's send on a VM (1.66 → 1.53 µs).
                let (hdr, iov) = (&wire.headers[0].msg_hdr, &wire.iovs[0]);
                let (name, name_len) = (hdr.msg_name.cast::<libc::sockaddr>(), hdr.msg_namelen);
                stages::mark(Stage::SendCall);
                // SAFETY: the iovec points at a live buffer of self.data,
                // the name at wire's own address of the length given.
                let r = unsafe {
                    libc::syscall(libc::SYS_sendto, fd, iov.iov_base, iov.iov_len, libc::MSG_DONTWAIT, name, name_len)
                };
                stages::mark(Stage::SendReturn);
                if r >= 0 {
                    1
                } else {
                    -1
                }
            } else {
                stages::mark(Stage::SendCall);
                // SAFETY: the first `n` wire messages point at live buffers
                // of self.data, at lent payloads (readable until this call
                // returns, `commit_lent`) and at wire's own addresses and
                // control data.
                let r = unsafe {
                    libc::syscall(libc::SYS_sendmmsg, fd, wire.headers.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT)
                };
                stages::mark(Stage::SendReturn);
                r as libc::c_int
            };
            if done > 0 {
                let done = done as usize;
                sent += (0..done).map(|i| wire.datagrams(i)).sum::<usize>();
                (message, segment) = if done < n { wire.origins[done] } else { (m, s) };
                continue;
            }
            let e = io::Error::last_os_error();
            let (failed, _) = wire.origins[0];
            if e.kind() == io::ErrorKind::WouldBlock {
                break;
            }
            if self.gso && self.messages[failed].segments > 1 && refuses_gso(&e) {
                self.gso = false;
                materialize(&mut self.data, &mut self.lent, &mut self.messages[..self.count]);
                reindex_from(&self.messages[failed..self.count], &mut self.data, reindex);
                continue;
            }
            // This datagram (or train) cannot go; the rest may.
            error.get_or_insert(e);
            (message, segment) = if self.gso || segment + 1 == self.messages[failed].segments {
                (failed + 1, 0)
            } else {
                (failed, segment + 1)
            };
        }
        self.count = 0;
        self.used = 0;
        self.lent.clear();
        match error {
            Some(e) => Err(e),
            None => Ok(sent),
        }
    }
}

/// Copies the lent payloads into their places in `data`, for the paths that
/// send or rewrite datagrams whole (no GSO, a train's ICRCs redone).
fn materialize(data: &mut [u8], lent: &mut Vec<(usize, Lent)>, messages: &mut [Message]) {
    for &(place, payload) in lent.iter() {
        data[place..place + payload.len()].copy_from_slice(payload.bytes());
    }
    lent.clear();
    for msg in messages {
        (msg.lent_from, msg.lent_to) = (0, 0);
    }
}

/// An iovec of `bytes`.
fn iovec(bytes: &mut [u8]) -> libc::iovec {
    libc::iovec { iov_base: bytes.as_mut_ptr().cast(), iov_len: bytes.len() }
}

/// Calls `reindex` on every segment with index above 0 of `messages`, whose
/// bytes are in `data`.
fn reindex_from(messages: &[Message], data: &mut [u8], reindex: &mut dyn FnMut(SocketAddr, &mut [u8], u16)) {
    for msg in messages {
        for k in 1..msg.segments {
            let at = msg.start + k * msg.segment;
            let end = (at + msg.segment).min(msg.start + msg.len);
            // k < MAX_SEGMENTS.
            reindex(msg.dest, &mut data[at..end], k as u16);
        }
    }
}

/// Refuses datagrams UDP cannot carry (and empty ones, which no caller means).
fn check_len(len: usize) -> io::Result<()> {
    if len == 0 || len > MAX_DATAGRAM {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "datagram empty or larger than UDP allows"));
    }
    Ok(())
}

/// Whether a failed send of a GSO train says the kernel or the path cannot
/// do GSO (rather than something about this one datagram): `EIO` where the
/// device cannot checksum it or IPsec is in the way, `EINVAL` from kernels
/// with a lower segment limit or sockets without UDP checksums,
/// `ENOPROTOOPT`/`EOPNOTSUPP` from kernels without `UDP_SEGMENT`.
fn refuses_gso(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP))
}

/// The headers of one `sendmmsg` call: an address, iovecs and a control
/// buffer (for `UDP_SEGMENT`) per message.
struct Wire {
    headers: [libc::mmsghdr; BATCH],
    iovs: [libc::iovec; IOVS],
    names: [libc::sockaddr_storage; BATCH],
    control: [[u64; CONTROL_WORDS]; BATCH],
    segments: [usize; BATCH],
    /// The batch message and segment each wire message starts at, to go
    /// on from after a partial send.
    origins: [(usize, usize); BATCH],
}

// SAFETY: the raw pointers in a `Wire` are set by `set` and read by the
// kernel within one `flush` call, on one thread; between calls they are
// stale and never read.
unsafe impl Send for Wire {}

impl Wire {
    fn new() -> Box<Wire> {
        // SAFETY: all fields are plain old data for which zero is valid
        // (null pointers, zero lengths); `set` fills what a message uses.
        Box::new(unsafe { zeroed() })
    }

    /// Makes message `i` the datagram of `len` bytes in `iovs` to `dest`, a
    /// GSO train of `segment`-byte segments unless `segment` is 0.
    /// The pointers it stores into the `Wire` stay valid while it does not
    /// move (it lives in a `Box`).
    fn set(&mut self, i: usize, iovs: Range<usize>, len: usize, dest: SocketAddr, segment: usize) {
        self.names[i] = to_storage(dest);
        let wire = self;
        let hdr = &mut wire.headers[i].msg_hdr;
        hdr.msg_name = (&mut wire.names[i] as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = storage_len(&wire.names[i]);
        hdr.msg_iovlen = iovs.len() as _;
        hdr.msg_iov = &mut wire.iovs[iovs.start];
        wire.segments[i] = if segment == 0 { 1 } else { len.div_ceil(segment) };
        if segment == 0 {
            hdr.msg_control = std::ptr::null_mut();
            hdr.msg_controllen = 0;
            return;
        }
        let control = &mut wire.control[i];
        hdr.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE of an int fits the control buffer, which is
        // aligned for cmsghdr; CMSG_FIRSTHDR of a buffer that large is
        // non-null and the data write stays inside it.
        unsafe {
            hdr.msg_controllen = libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(hdr);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            // `segment` ≤ MAX_DATAGRAM fits the u16 UDP_SEGMENT takes.
            libc::CMSG_DATA(cmsg).cast::<u16>().write_unaligned(segment as u16);
        }
    }

    /// Datagrams on the wire that message `i` stands for.
    fn datagrams(&self, i: usize) -> usize {
        self.segments[i]
    }
}

/// Datagrams received and not yet handed out. A slot may hold a GRO
/// super-datagram, which [`RecvBatch::pop`] hands out segment by segment.
pub struct RecvBatch {
    data: Vec<u8>,
    lens: [usize; BATCH],
    /// GRO segment size of each slot; 0 for a plain datagram.
    segments: [usize; BATCH],
    /// The headers the kernel fills, pointing at `data`'s slots.
    wire: Box<RecvWire>,
    count: usize,
    next: usize,
    /// Bytes of slot `next` already handed out.
    offset: usize,
    /// Datagrams the next fill asks for: one after a fill that found none,
    /// else as many of the last fill's mean size as make [`FILL_AHEAD`]
    /// bytes, within [`BATCH`]. A socket polled while idle (a thread
    /// waiting for an answer) then costs one header a poll, and the answer
    /// comes without the kernel's try at a second datagram that is not
    /// there (~0.1 µs a round trip); a burst that follows comes from the
    /// next fill.
    want: usize,
}

/// The headers of one `recvmmsg` call, built once: each points at its
/// slot, source address and control buffer, so a fill only resets what
/// the kernel wrote (a ping-pong's fills used to build and zero 2.5 KiB of
/// headers each, ~1.5k instructions a round trip).
struct RecvWire {
    msgs: [libc::mmsghdr; BATCH],
    iovs: [libc::iovec; BATCH],
    srcs: [libc::sockaddr_storage; BATCH],
    control: [[u64; CONTROL_WORDS]; BATCH],
    /// Headers from the first on that the kernel may have written since
    /// they were last reset; the others are ready as they are.
    written: usize,
}

// SAFETY: the raw pointers in a `RecvWire` point into itself (it lives in a
// `Box` and never moves) and into its batch's `data`, whose heap buffer is
// never reallocated; they are only used by the batch's `&mut self` methods.
unsafe impl Send for RecvWire {}

impl RecvWire {
    fn new(data: &mut [u8]) -> Box<RecvWire> {
        // SAFETY: all fields are plain old data for which zero is valid.
        let mut wire: Box<RecvWire> = Box::new(unsafe { zeroed() });
        let wire_ref = &mut *wire;
        for (i, slot) in data.chunks_exact_mut(SLOT).take(BATCH).enumerate() {
            wire_ref.iovs[i] = libc::iovec { iov_base: slot.as_mut_ptr().cast(), iov_len: SLOT };
            let hdr = &mut wire_ref.msgs[i].msg_hdr;
            hdr.msg_iov = &mut wire_ref.iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_name = (&mut wire_ref.srcs[i] as *mut libc::sockaddr_storage).cast();
            hdr.msg_control = wire_ref.control[i].as_mut_ptr().cast();
        }
        wire.written = BATCH;
        wire.ready();
        wire
    }

    /// Makes every header ready for a receive again: the lengths the
    /// kernel overwrote in those it filled are made whole (it writes no
    /// header past the last datagram it returns).
    fn ready(&mut self) {
        for msg in &mut self.msgs[..self.written.min(BATCH)] {
            msg.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            msg.msg_hdr.msg_controllen = size_of::<[u64; CONTROL_WORDS]>() as _;
        }
        self.written = 0;
    }
}

impl Default for RecvBatch {
    fn default() -> RecvBatch {
        // Pages are only touched as large datagrams arrive.
        let mut data = vec![0; BATCH * SLOT];
        let wire = RecvWire::new(&mut data);
        RecvBatch { data, lens: [0; BATCH], segments: [0; BATCH], wire, count: 0, next: 0, offset: 0, want: BATCH }
    }
}

impl RecvBatch {
    /// Reads up to [`BATCH`] datagrams from `fd` if the batch is used up;
    /// returns how many slots are waiting.
    pub fn fill(&mut self, fd: RawFd) -> io::Result<usize> {
        if self.next < self.count {
            return Ok(self.count - self.next);
        }
        let want = self.want.clamp(1, BATCH);
        let n = if want == 1 { self.receive_one(fd) } else { self.receive_many(fd, want) };
        (self.next, self.offset, self.count) = (0, 0, 0);
        self.want = if n > 0 {
            let bytes: usize = self.lens[..n as usize].iter().sum();
            (FILL_AHEAD * n as usize / bytes.max(1)).clamp(2, BATCH)
        } else {
            1
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
        }
        self.count = n as usize;
        Ok(self.count)
    }

    /// One datagram into slot 0 with `recvmsg`: for an idle socket polled
    /// over and over, one header for the kernel to read instead of
    /// `recvmmsg`'s array (0.065 µs a receive in a UDP model on a VM).
    fn receive_one(&mut self, fd: RawFd) -> isize {
        self.wire.ready();
        stages::mark(Stage::ReceiveCall);
        // SAFETY: the header points at slot 0's live buffer, address
        // storage and control buffer, all owned by self.
        let n = unsafe { libc::syscall(libc::SYS_recvmsg, fd, &mut self.wire.msgs[0].msg_hdr, libc::MSG_DONTWAIT) };
        if n < 0 {
            stages::mark(Stage::NothingReceived);
            return -1;
        }
        stages::mark(Stage::Received);
        self.wire.written = 1;
        self.keep(0, n as usize);
        1
    }

    /// Up to `want` datagrams into the first slots with `recvmmsg`.
    fn receive_many(&mut self, fd: RawFd, want: usize) -> isize {
        self.wire.ready();
        stages::mark(Stage::ReceiveCall);
        // SAFETY: each of the first `want` messages points at a live
        // SLOT-sized buffer, address storage and control buffer owned by self.
        let n = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                fd,
                self.wire.msgs.as_mut_ptr(),
                want as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            ) as libc::c_int
        };
        stages::mark(if n > 0 { Stage::Received } else { Stage::NothingReceived });
        self.wire.written = n.max(0) as usize;
        for i in 0..n.max(0) as usize {
            let len = self.wire.msgs[i].msg_len as usize;
            self.keep(i, len);
        }
        n as isize
    }

    /// Records what the kernel put in slot `i`: `len` bytes.
    fn keep(&mut self, i: usize, len: usize) {
        let hdr = &self.wire.msgs[i].msg_hdr;
        // A datagram larger than the slot was cut: mark it so it is dropped.
        let truncated = hdr.msg_flags & libc::MSG_TRUNC != 0;
        self.lens[i] = if truncated { 0 } else { len };
        self.segments[i] = gro_segment(hdr);
    }

    /// Whether the last datagram handed out was a segment of a GRO
    /// super-datagram with more segments to come.
    pub fn amid_slot(&self) -> bool {
        self.offset > 0
    }

    /// The next datagram (a segment of a GRO super-datagram counts as one):
    /// its source and where its bytes are ([`RecvBatch::bytes`]), so callers
    /// can hand them on without copying. Truncated ones come out empty.
    pub fn pop(&mut self) -> Option<(Option<SocketAddr>, Range<usize>)> {
        if self.next >= self.count {
            return None;
        }
        let i = self.next;
        let (len, segment) = (self.lens[i], self.segments[i]);
        let left = len - self.offset;
        let take = if segment == 0 { left } else { segment.min(left) };
        let at = i * SLOT + self.offset;
        self.offset += take;
        if self.offset >= len {
            (self.next, self.offset) = (i + 1, 0);
        }
        Some((from_storage(&self.wire.srcs[i]), at..at + take))
    }

    /// The bytes of a datagram [`RecvBatch::pop`] handed out, until the
    /// next [`RecvBatch::fill`] that reads.
    pub fn bytes(&self, datagram: Range<usize>) -> &[u8] {
        self.data.get(datagram).unwrap_or_default()
    }
}

/// The segment size a `UDP_GRO` control message gives, or 0 if there is none.
fn gro_segment(hdr: &libc::msghdr) -> usize {
    // SAFETY: the kernel filled msg_control up to msg_controllen with
    // well-formed control messages; CMSG_* stay within it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned();
                return usize::try_from(size).unwrap_or(0);
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    0
}

fn to_storage(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: zero is a valid sockaddr_storage; the casts write within it.
    unsafe {
        let mut storage: libc::sockaddr_storage = zeroed();
        match addr {
            SocketAddr::V4(a) => {
                let sin = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            }
            SocketAddr::V6(a) => {
                let sin6 = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
                sin6.sin6_scope_id = a.scope_id();
            }
        }
        storage
    }
}

fn storage_len(storage: &libc::sockaddr_storage) -> u32 {
    if i32::from(storage.ss_family) == libc::AF_INET {
        size_of::<libc::sockaddr_in>() as u32
    } else {
        size_of::<libc::sockaddr_in6>() as u32
    }
}

fn from_storage(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the family field says which sockaddr the storage holds.
    unsafe {
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                let sin = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::ptr::NonNull;
    use std::time::Duration;

    #[test]
    fn sockaddr_round_trip() {
        for addr in ["127.0.0.2:4791", "[fe80::1]:9"] {
            let addr: SocketAddr = addr.parse().unwrap();
            assert_eq!(from_storage(&to_storage(addr)), Some(addr));
        }
    }

    /// The index each datagram gets in its train.
    fn indices(batch: &mut SendBatch, datagrams: &[(SocketAddr, usize)]) -> Vec<u16> {
        datagrams.iter().map(|&(dest, len)| batch.push(dest, &vec![7; len]).unwrap().unwrap().1).collect()
    }

    #[test]
    fn trains_take_one_destination_and_length_with_a_shorter_last() {
        let (a, b): (SocketAddr, SocketAddr) = ("127.0.0.1:9".parse().unwrap(), "127.0.0.2:9".parse().unwrap());
        let mut batch = SendBatch::new(true);
        let got = indices(&mut batch, &[(a, 100), (a, 100), (a, 100), (a, 60), (a, 60), (a, 100), (b, 100), (a, 100)]);
        assert_eq!(got, [0, 1, 2, 3, 0, 0, 0, 0]);
        assert_eq!(batch.count, 5);
        // Longer than the train's segments: a new datagram.
        assert_eq!(indices(&mut batch, &[(a, 101)]), [0]);
        // Without GSO every datagram stands alone.
        let mut plain = SendBatch::new(false);
        assert_eq!(indices(&mut plain, &[(a, 100), (a, 100)]), [0, 0]);
    }

    #[test]
    fn trains_break_where_the_destination_owner_changes() {
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut batch = SendBatch::new(true);
        let packet = |qpn: u32| {
            let mut p = vec![0u8; 100];
            p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            p
        };
        let mut index = |qpn| batch.push(a, &packet(qpn)).unwrap().unwrap().1;
        // QPs 0x01_0011 and 0x01_0012 belong to slot 1, 0x02_0005 to slot 2.
        let got: Vec<u16> = [0x01_0011, 0x01_0012, 0x02_0005, 0x02_0005, 0x01_0011].map(&mut index).to_vec();
        assert_eq!(got, [0, 1, 0, 1, 0]);
        assert_eq!(batch.count, 3);
    }

    #[test]
    fn trains_respect_the_segment_and_size_limits() {
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut batch = SendBatch::new(true);
        let got = indices(&mut batch, &vec![(a, 16); MAX_SEGMENTS + 1]);
        assert_eq!(got[MAX_SEGMENTS - 1], (MAX_SEGMENTS - 1) as u16);
        assert_eq!(got[MAX_SEGMENTS], 0);
        let mut batch = SendBatch::new(true);
        let fit = MAX_DATAGRAM / 4128;
        let got = indices(&mut batch, &vec![(a, 4128); fit + 1]);
        assert_eq!(got[fit - 1], (fit - 1) as u16);
        assert_eq!(got[fit], 0);
        assert!(batch.push(a, &vec![0; MAX_DATAGRAM + 1]).is_err());
        assert!(batch.push(a, &[]).is_err());
    }

    #[test]
    fn a_datagram_built_in_place_queues_like_a_pushed_one() {
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut batch = SendBatch::new(true);
        batch.push(a, &[1; 100]).unwrap().unwrap();
        // Room for more than the datagram will need, as an engine asks; the
        // same destination QP (byte 5) as the first, so the train goes on.
        let mut second = [2u8; 100];
        second[5] = 1;
        batch.room(4096).unwrap()[..100].copy_from_slice(&second);
        let (queued, index) = batch.commit(a, 100).unwrap().unwrap();
        assert_eq!((&*queued, index), (&second[..], 1));
        assert_eq!((batch.count, batch.used), (1, 200));
        assert_eq!(&batch.data[..200], &[&[1u8; 100][..], &second].concat()[..]);
        assert!(batch.commit(a, 0).is_err());
    }

    #[test]
    fn a_full_batch_asks_to_be_flushed() {
        let mut batch = SendBatch::new(false);
        for i in 0..BATCH {
            let dest = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1000 + i as u16);
            assert!(batch.push(dest, &[1; 10]).unwrap().is_some());
        }
        assert!(batch.push("127.0.0.1:9".parse().unwrap(), &[1; 10]).unwrap().is_none());
        assert!(batch.room(10).is_none());
        let mut big = SendBatch::new(true);
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        while big.push(a, &vec![0; MAX_DATAGRAM]).unwrap().is_some() {}
        assert_eq!(big.used, SEND_BYTES - SEND_BYTES % MAX_DATAGRAM);
    }

    /// `n` datagrams of `len` bytes (the last `last` bytes), each filled with
    /// its number but for byte 5 (the destination's owner slot), 0 in all.
    fn train(n: u8, len: usize, last: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut datagram = vec![i; if i + 1 == n { last } else { len }];
                datagram[5] = 0;
                datagram
            })
            .collect()
    }

    /// Everything `rx` gets within a second, as `pop` hands it out.
    fn receive_all(rx: &UdpSocket, inb: &mut RecvBatch, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for _ in 0..1000 {
            if inb.fill(rx.as_raw_fd()).unwrap() > 0 {
                while let Some((_, datagram)) = inb.pop() {
                    got.push(inb.bytes(datagram).to_vec());
                }
            }
            if got.len() >= want {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }

    fn set(socket: &UdpSocket, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> bool {
        // SAFETY: a valid socket fd and a pointer to a c_int of the given size.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                option,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            ) == 0
        }
    }

    #[test]
    fn trains_cross_a_socket_pair_and_gro_splits_them_back() {
        for gro in [true, false] {
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            if gro {
                assert!(set(&rx, libc::SOL_UDP, libc::UDP_GRO, 1));
            }
            let dest = rx.local_addr().unwrap();
            let datagrams = [train(5, 1000, 300), train(3, 200, 200)].concat();
            let mut out = SendBatch::new(true);
            for d in &datagrams {
                out.push(dest, d).unwrap().unwrap();
            }
            assert_eq!(out.count, 2);
            let sent = out.flush(tx.as_raw_fd(), &mut |_, _, _| panic!("no fallback on loopback")).unwrap();
            assert_eq!(sent, 8);
            assert!(out.gso() && out.is_empty());
            let mut inb = RecvBatch::default();
            assert_eq!(receive_all(&rx, &mut inb, datagrams.len()), datagrams, "GRO {gro}");
            // With GRO on, the first train arrived in one slot.
            assert_eq!(inb.segments[0], if gro { 1000 } else { 0 });
        }
    }

    /// Datagrams whose payloads were lent arrive whole, in GSO trains and
    /// sent one by one, and trains the kernel refuses are redone with their
    /// payloads in place; the stored bytes around each payload stay as they
    /// were.
    #[test]
    fn lent_payloads_arrive_in_their_places_in_trains_and_alone() {
        for (gso, refused) in [(true, false), (false, false), (true, true)] {
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            if refused {
                assert!(set(&tx, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1));
            }
            let dest = rx.local_addr().unwrap();
            let datagrams = [train(4, 600, 600), train(2, 300, 100)].concat();
            // Bytes 12..len-4 of each come from elsewhere: the "registered
            // memory" holds them, the batch's room only the rest.
            let memory: Vec<Vec<u8>> =
                datagrams.iter().enumerate().map(|(i, d)| vec![0xa0 + i as u8; d.len() - 16]).collect();
            let mut out = SendBatch::new(gso);
            let mut expected = Vec::new();
            for (d, payload) in datagrams.iter().zip(&memory) {
                let room = out.room(d.len()).unwrap();
                room.fill(0xee);
                room[..12].copy_from_slice(&d[..12]);
                let end = d.len() - 4;
                room[end..d.len()].copy_from_slice(&d[end..]);
                // SAFETY: `memory` outlives the flush below.
                let lent = unsafe { Lent::new(NonNull::new(payload.as_ptr().cast_mut()).unwrap(), payload.len()) };
                out.commit_lent(dest, d.len(), 12, lent).unwrap().unwrap();
                expected.push([&d[..12], payload, &d[end..]].concat());
            }
            assert_eq!(out.count, if gso { 2 } else { 6 });
            let mut redone = 0;
            let sent = out
                .flush(tx.as_raw_fd(), &mut |_, data: &mut [u8], _| {
                    assert!(refused, "no fallback on loopback");
                    assert!(data[12..data.len() - 4].iter().all(|&b| b >= 0xa0), "a payload not in its place");
                    redone += 1;
                })
                .unwrap();
            assert_eq!(sent, 6);
            assert_eq!(redone, if refused { 4 } else { 0 }, "segments past the first of each train");
            assert!(out.is_empty() && out.lent.is_empty());
            let mut inb = RecvBatch::default();
            assert_eq!(receive_all(&rx, &mut inb, expected.len()), expected, "GSO {gso}, refused {refused}");
        }
    }

    /// A fill of large trains asks next for as many as make FILL_AHEAD bytes,
    /// one of small datagrams for a whole batch.
    #[test]
    fn a_fill_of_trains_asks_next_for_what_the_cache_holds() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(set(&rx, libc::SOL_UDP, libc::UDP_GRO, 1));
        let dest = rx.local_addr().unwrap();
        let mut out = SendBatch::new(true);
        for _ in 0..3 {
            for d in train(40, 1000, 1000) {
                out.push(dest, &d).unwrap().unwrap();
            }
            out.flush(tx.as_raw_fd(), &mut |_, _, _| panic!("no fallback on loopback")).unwrap();
        }
        let mut inb = RecvBatch::default();
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 3, "three trains of 40 000 bytes");
        assert_eq!(inb.want, FILL_AHEAD * 3 / 120_000);
        while inb.pop().is_some() {}
        tx.send_to(&[1; 40], dest).unwrap();
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 1);
        assert_eq!(inb.want, BATCH);
    }

    /// An idle socket's poll asks for one datagram; the fill after one that
    /// brought something asks for a whole batch again.
    #[test]
    fn a_fill_after_an_empty_one_takes_one_datagram_then_the_rest() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut inb = RecvBatch::default();
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 0);
        for i in 0..5u8 {
            tx.send_to(&[i; 40], rx.local_addr().unwrap()).unwrap();
        }
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 1, "after an empty fill, one");
        let (_, first) = inb.pop().unwrap();
        assert_eq!(inb.bytes(first), [0; 40]);
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 4, "then the rest at once");
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 4, "nothing read again before the batch is used up");
    }

    /// The headers are built once and reused: what the kernel wrote into
    /// them on one fill (no control message for a lone datagram, a source
    /// of another family's length) must not cut short the next, which
    /// would lose a train's segment size and so the train.
    #[test]
    fn headers_reused_after_plain_datagrams_still_see_trains() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(set(&rx, libc::SOL_UDP, libc::UDP_GRO, 1));
        let dest = rx.local_addr().unwrap();
        let mut inb = RecvBatch::default();
        for round in 0..3 {
            // Plain datagrams of different sizes arrive apart: no GRO
            // segment size, in as many slots as the fills give them.
            for i in 0..3u8 {
                tx.send_to(&vec![i; 40 + 8 * usize::from(i)], dest).unwrap();
            }
            let plain = receive_all(&rx, &mut inb, 3);
            assert_eq!(plain.len(), 3, "round {round}");
            // Then trains, into the very headers those used.
            let datagrams = [train(5, 700, 300), train(4, 500, 500)].concat();
            let mut out = SendBatch::new(true);
            for d in &datagrams {
                out.push(dest, d).unwrap().unwrap();
            }
            out.flush(tx.as_raw_fd(), &mut |_, _, _| panic!("no fallback on loopback")).unwrap();
            assert_eq!(receive_all(&rx, &mut inb, datagrams.len()), datagrams, "round {round}");
        }
    }

    /// The one-datagram receive of an idle socket splits a GRO train as
    /// the batch receive does, says while handing it out that more of it is
    /// here, and a bad descriptor is an error, not an empty fill.
    #[test]
    fn a_train_after_an_empty_fill_comes_whole_in_one_slot() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(set(&rx, libc::SOL_UDP, libc::UDP_GRO, 1));
        let mut inb = RecvBatch::default();
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 0);
        let datagrams = train(4, 600, 100);
        let mut out = SendBatch::new(true);
        for d in &datagrams {
            out.push(rx.local_addr().unwrap(), d).unwrap().unwrap();
        }
        out.flush(tx.as_raw_fd(), &mut |_, _, _| panic!("no fallback on loopback")).unwrap();
        assert_eq!(inb.fill(rx.as_raw_fd()).unwrap(), 1, "one slot, one recvmsg");
        assert_eq!(inb.segments[0], 600);
        let (mut popped, mut amid) = (Vec::new(), Vec::new());
        while let Some((_, at)) = inb.pop() {
            popped.push(inb.bytes(at).to_vec());
            amid.push(inb.amid_slot());
        }
        assert_eq!(popped, datagrams);
        assert_eq!(amid, [true, true, true, false], "the rest of the train is here until its last segment");
        assert!(inb.fill(-1).is_err());
    }

    /// A socket without UDP checksums (`SO_NO_CHECK`) cannot send GSO
    /// (`EINVAL`): the batch sends the trains datagram by datagram, has the
    /// later segments re-done for ID 0, and stays without GSO.
    #[test]
    fn a_refused_train_falls_back_to_single_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(set(&tx, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1));
        let dest = rx.local_addr().unwrap();
        let datagrams = [vec![vec![9u8; 50]], train(4, 500, 100)].concat();
        let mut out = SendBatch::new(true);
        for d in &datagrams {
            out.push(dest, d).unwrap().unwrap();
        }
        let mut redone = Vec::new();
        let sent = out
            .flush(tx.as_raw_fd(), &mut |to, data: &mut [u8], id| {
                redone.push((to, data[0], data.len(), id));
                data[1] = 0xee;
            })
            .unwrap();
        assert_eq!(sent, 5);
        assert!(!out.gso());
        assert_eq!(redone, [(dest, 1, 500, 1), (dest, 2, 500, 2), (dest, 3, 100, 3)]);
        let mut expected = datagrams.clone();
        for d in &mut expected[2..] {
            d[1] = 0xee;
        }
        assert_eq!(receive_all(&rx, &mut RecvBatch::default(), expected.len()), expected);
        // Later batches do not try again.
        assert_eq!(indices(&mut out, &[(dest, 10), (dest, 10)]), [0, 0]);
    }

    #[test]
    fn a_datagram_the_path_refuses_does_not_take_the_rest_with_it() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dest = rx.local_addr().unwrap();
        let mut out = SendBatch::new(false);
        out.push(dest, &[1; 10]).unwrap().unwrap();
        // Port 0 is refused (EINVAL) whatever the GSO setting.
        out.push("127.0.0.1:0".parse().unwrap(), &[2; 10]).unwrap().unwrap();
        out.push(dest, &[3; 10]).unwrap().unwrap();
        assert!(out.flush(tx.as_raw_fd(), &mut |_, _, _| {}).is_err());
        assert!(out.is_empty());
        assert_eq!(receive_all(&rx, &mut RecvBatch::default(), 2), [vec![1; 10], vec![3; 10]]);
    }
}
