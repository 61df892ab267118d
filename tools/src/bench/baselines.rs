//! The baselines softroce is measured against, each over loopback with one
//! sending and one receiving thread: UDP datagrams moved as softroce's UDP
//! link moved them before it sent GSO trains (unconnected sockets,
//! `sendmmsg`/`recvmmsg` batches of 32, one datagram per packet), the same
//! with GSO and GRO (as the link now does, at its best: every datagram a
//! full train), one TCP stream, and UDP ping-pongs: plain, and with an ACK
//! behind every datagram as RoCE has.

use std::io::{self, Read, Write};
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softroce::stages::{self, Stage};

use super::{print_stages, Measured, Meter, Timing, Window};

const ADDRESS_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const ADDRESS_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Datagrams per system call, as softroce's UDP link batches them.
const BATCH: usize = 32;
/// GSO super-datagrams per system call: about as many bytes as `BATCH` of
/// 4 KiB datagrams, several times over.
const GSO_BATCH: usize = 8;
/// Socket buffers as softroce's UDP link asks for them.
const SOCKET_BUFFER: libc::c_int = 8 << 20;
/// Receivers wake this often to see whether to stop.
const POLL: Duration = Duration::from_millis(20);
/// A ping-pong answer that takes longer than this is lost.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// The TCP baseline's congestion control, whatever the system's default:
/// Linux's own default, and the fastest over loopback. BBR, the default of
/// some distributions, paces a loopback flow to a fraction of what the
/// machine can do (1.3 against 8.8 GB/s on the 2-core machine), which would
/// flatter every ratio to TCP.
pub const TCP_CONGESTION: &str = "cubic";

/// The congestion control the TCP baseline runs with: [`TCP_CONGESTION`]
/// where the kernel has it, else the system's default.
pub fn tcp_congestion() -> String {
    let read = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap_or_default();
    if read("tcp_available_congestion_control").split_whitespace().any(|c| c == TCP_CONGESTION) {
        TCP_CONGESTION.to_owned()
    } else {
        read("tcp_congestion_control").trim().to_owned()
    }
}

/// Datagrams of `segment` bytes from one thread to another. With `segments`
/// above 1, each `sendmmsg` entry is a GSO super-datagram of that many
/// segments (`UDP_SEGMENT`), and the receiver takes them coalesced
/// (`UDP_GRO`), counting segments by the size the kernel reports. Fails if
/// the kernel refuses either option.
pub fn udp_stream(segment: usize, segments: usize, timing: &Timing) -> Result<Measured, String> {
    let bind = |ip| UdpSocket::bind((ip, 0)).map_err(|e| format!("bind {ip}: {e}"));
    let (tx, rx) = (bind(ADDRESS_A)?, bind(ADDRESS_B)?);
    for socket in [&tx, &rx] {
        set_option(socket, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCKET_BUFFER)
            .or_else(|_| set_option(socket, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCKET_BUFFER))
            .map_err(|e| format!("SO_SNDBUF: {e}"))?;
        set_option(socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCKET_BUFFER)
            .or_else(|_| set_option(socket, libc::SOL_SOCKET, libc::SO_RCVBUF, SOCKET_BUFFER))
            .map_err(|e| format!("SO_RCVBUF: {e}"))?;
    }
    rx.set_read_timeout(Some(POLL)).map_err(|e| e.to_string())?;
    let gso = segments > 1;
    if gso {
        set_option(&tx, libc::SOL_UDP, libc::UDP_SEGMENT, segment as libc::c_int)
            .map_err(|e| format!("the kernel refuses UDP_SEGMENT: {e}"))?;
        set_option(&rx, libc::SOL_UDP, libc::UDP_GRO, 1).map_err(|e| format!("the kernel refuses UDP_GRO: {e}"))?;
    }
    let dest = match rx.local_addr().map_err(|e| e.to_string())? {
        SocketAddr::V4(addr) => addr,
        SocketAddr::V6(_) => unreachable!("bound to IPv4"),
    };
    let (count, len) = if gso { (GSO_BATCH, segment * segments) } else { (BATCH, segment) };
    let mut outgoing = Batch::new(count, len);
    // One batch first: a kernel that takes the option but not the send says so here.
    outgoing.send(tx.as_raw_fd(), &dest).map_err(|e| format!("sendmmsg: {e}"))?;
    // Room for a whole GRO train whatever the sender's batch.
    let mut incoming = Batch::new(count, if gso { 1 << 16 } else { segment });
    let meter = Meter::default();
    let (window, sent, received) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            while !meter.stopped() {
                outgoing.send(tx.as_raw_fd(), &dest)?;
            }
            Ok(())
        });
        let receiver = s.spawn(|| {
            while !meter.stopped() {
                match incoming.recv(rx.as_raw_fd(), segment) {
                    Ok((bytes, datagrams)) => meter.add(bytes, datagrams),
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
        let window = meter.time(timing);
        (window, sender.join(), receiver.join())
    });
    joined(sent, "UDP sender")?;
    joined(received, "UDP receiver")?;
    Ok(Measured { window, rtts: Vec::new(), retries: None, per_qp: Vec::new() })
}

/// What steering costs a packet on its way in. Datagrams of `size` bytes
/// that carry a BTH's QP number go, batch by batch in turns, to a socket
/// bound alone and to a member of a group of `members` sockets sharing a
/// port as softroce's processes do (`net::share`): the group's reuseport
/// program steers each datagram by its QPN's slot, and each member's socket
/// filter looks for census probes. The member is the one the program
/// checks last, the one that joined last. Nobody reads either socket, so
/// each datagram goes the kernel's way in as far as a full socket, where
/// it is dropped (nothing that differs between the two comes after), all
/// within the sending thread's `sendmmsg` on loopback. One thread, batches
/// in turns, and the median time of a batch: the machine's other work,
/// which moves whole runs by more than steering costs, falls on both alike
/// or is left out as outliers.
///
/// Returns the socket alone's figures, the member's, and the median
/// batch's time per datagram to the member less that to the socket alone.
pub fn udp_steering(size: usize, members: usize, timing: &Timing) -> Result<(Measured, Measured, f64), String> {
    use softroce::net::share::Member;
    let bind = |ip| UdpSocket::bind((ip, 0)).map_err(|e| format!("bind {ip}: {e}"));
    let tx = bind(ADDRESS_A)?;
    set_option(&tx, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCKET_BUFFER)
        .or_else(|_| set_option(&tx, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCKET_BUFFER))
        .map_err(|e| format!("SO_SNDBUF: {e}"))?;
    let alone = std::sync::Arc::new(bind(ADDRESS_B)?);
    let b = std::net::IpAddr::V4(ADDRESS_B);
    let port = softroce::net::udp::free_port(&[b]).map_err(|e| format!("no free UDP port: {e}"))?;
    let mut group = Vec::new();
    for _ in 0..members.max(1) {
        group.push(Member::join(port, &[b]).map_err(|e| format!("joining the group on port {port}: {e}"))?);
    }
    let last = group.last().expect("a member");
    let member = last.sockets().into_iter().next().expect("a socket per address").1;
    let mut turns = Vec::new();
    for (socket, qpn) in [(alone, 0x11), (member, u32::from(last.slot()) << 16 | 0x11)] {
        // The least the kernel allows: full at once.
        set_option(&socket, libc::SOL_SOCKET, libc::SO_RCVBUF, 0).map_err(|e| format!("SO_RCVBUF: {e}"))?;
        let dest = match socket.local_addr().map_err(|e| e.to_string())? {
            SocketAddr::V4(addr) => addr,
            SocketAddr::V6(_) => unreachable!("bound to IPv4"),
        };
        let mut batch = Batch::new(BATCH, size.max(8));
        for datagram in batch.data.chunks_mut(batch.len) {
            datagram[4..8].copy_from_slice(&qpn.to_be_bytes());
        }
        turns.push((socket, dest, batch, Turn::default()));
    }
    let meter = Meter::default();
    let (_, sent) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut next = 0;
            while !meter.stopped() {
                let (_, dest, batch, turn) = &mut turns[next];
                let (start, cpu) = (Instant::now(), thread_cpu_time());
                let n = batch.send(tx.as_raw_fd(), dest)?;
                let (elapsed, cpu) = (start.elapsed(), thread_cpu_time().saturating_sub(cpu));
                meter.add((n * size) as u64, n as u64);
                if meter.measuring() && n > 0 {
                    turn.record(n, size, elapsed, cpu);
                }
                next = 1 - next;
            }
            Ok(())
        });
        let window = meter.time(timing);
        (window, sender.join())
    });
    let turns: Vec<Turn> = turns.into_iter().map(|(_, _, _, turn)| turn).collect();
    for member in group {
        member.leave(|_| {});
    }
    joined(sent, "UDP sender")?;
    let extra = turns[1].median_ns() - turns[0].median_ns();
    let [alone, steered]: [Turn; 2] = turns.try_into().expect("two turns");
    Ok((alone.measured(), steered.measured(), extra))
}

/// One destination's batches in [`udp_steering`].
#[derive(Debug, Default)]
struct Turn {
    bytes: u64,
    datagrams: u64,
    elapsed: Duration,
    cpu: Duration,
    /// Each batch's time per datagram, in ns.
    per_datagram: Vec<f64>,
}

impl Turn {
    fn record(&mut self, datagrams: usize, size: usize, elapsed: Duration, cpu: Duration) {
        self.bytes += (datagrams * size) as u64;
        self.datagrams += datagrams as u64;
        self.elapsed += elapsed;
        self.cpu += cpu;
        self.per_datagram.push(elapsed.as_secs_f64() * 1e9 / datagrams as f64);
    }

    fn median_ns(&self) -> f64 {
        super::median(&self.per_datagram)
    }

    /// The batches as one window: their time, and the sending thread's CPU.
    fn measured(&self) -> Measured {
        let window = Window { bytes: self.bytes, messages: self.datagrams, elapsed: self.elapsed, cpu: self.cpu };
        Measured { window, rtts: Vec::new(), retries: None, per_qp: Vec::new() }
    }
}

/// The calling thread's CPU time so far.
fn thread_cpu_time() -> Duration {
    // SAFETY: zero is a valid timespec, which clock_gettime fills.
    let mut t: libc::timespec = unsafe { zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// One TCP stream of `write`-byte writes; messages are the writes.
pub fn tcp_stream(write: usize, timing: &Timing) -> Result<Measured, String> {
    let listener = TcpListener::bind((ADDRESS_B, 0)).map_err(|e| format!("bind {ADDRESS_B}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut tx = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut rx, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    let congestion = tcp_congestion();
    for stream in [&tx, &rx] {
        // SAFETY: a valid socket and a buffer of the length given.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                congestion.as_ptr().cast(),
                congestion.len() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(format!("TCP_CONGESTION {congestion}: {}", io::Error::last_os_error()));
        }
    }
    let meter = Meter::default();
    let (window, sent, received) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let data = vec![0xa5u8; write];
            while !meter.stopped() {
                tx.write_all(&data)?;
                meter.add(0, 1);
            }
            // Closing tells the receiver the stream is over.
            tx.shutdown(std::net::Shutdown::Write)
        });
        let receiver = s.spawn(|| {
            let mut buf = vec![0u8; write];
            loop {
                match rx.read(&mut buf)? {
                    0 => return Ok(()),
                    n => meter.add(n as u64, 0),
                }
            }
        });
        let window = meter.time(timing);
        (window, sender.join(), receiver.join())
    });
    joined(sent, "TCP sender")?;
    joined(received, "TCP receiver")?;
    Ok(Measured { window, rtts: Vec::new(), retries: None, per_qp: Vec::new() })
}

/// UDP ping-pong of `size`-byte messages, one thread pinging and waiting
/// for each answer, the other answering until the pinger is done (so that
/// the last ping is answered too). Both wait as softroce's waiting threads
/// do: polling for [`SPIN`], then asleep, as a blocking receive alone
/// would be. On a VM a thread woken on an idle CPU takes tens of µs to run,
/// so a ping-pong that only sleeps measures that: 4 µs or 70 µs from one
/// run to the next, as the scheduler places the threads.
///
/// Without `acked`, each message is one datagram of `size` bytes. With
/// `acked`, it is the packets a RoCE SEND of `size` bytes puts on the wire
/// when it asks for an ACK (signaled SENDs, or any of rxe's), as softroce's
/// link sends them: payloads of up to [`MTU`] bytes, each with BTH and
/// ICRC's room, in GSO trains (`UDP_SEGMENT`) taken coalesced (`UDP_GRO`),
/// the last train ending in a 20-byte datagram, the ACK of the message
/// before, all the trains in one `sendmmsg` — with nothing computed and
/// nothing placed: what the kernel's path costs a message, at least.
/// (`send-lat`'s SENDs are unsignaled and ask for none, rxe-spec T-6.)
pub fn udp_ping_pong(size: usize, acked: bool, timing: &Timing) -> Result<Measured, String> {
    let bind = |ip| UdpSocket::bind((ip, 0)).map_err(|e| format!("bind {ip}: {e}"));
    let (pinger, answerer) = (bind(ADDRESS_A)?, bind(ADDRESS_B)?);
    let there = answerer.local_addr().map_err(|e| e.to_string())?;
    let back = pinger.local_addr().map_err(|e| e.to_string())?;
    pinger.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| e.to_string())?;
    answerer.set_read_timeout(Some(POLL)).map_err(|e| e.to_string())?;
    let wire = if acked { RoceWire::new(size) } else { RoceWire::plain(size) };
    if acked {
        for socket in [&pinger, &answerer] {
            set_option(socket, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCKET_BUFFER)
                .and_then(|()| set_option(socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCKET_BUFFER))
                .map_err(|e| format!("socket buffers: {e}"))?;
            set_option(socket, libc::SOL_UDP, libc::UDP_SEGMENT, wire.segment as libc::c_int)
                .map_err(|e| format!("the kernel refuses UDP_SEGMENT: {e}"))?;
            set_option(socket, libc::SOL_UDP, libc::UDP_GRO, 1)
                .map_err(|e| format!("the kernel refuses UDP_GRO: {e}"))?;
        }
    }
    let spin = spin();
    let send = |socket: &UdpSocket, data: &[u8], to: SocketAddr| -> io::Result<()> {
        let SocketAddr::V4(to) = to else { unreachable!("bound to IPv4") };
        send_trains(socket.as_raw_fd(), data, &wire.trains, &to)
    };
    let (data, mut buf) = (vec![0xa5u8; wire.total], vec![0u8; wire.largest_train()]);
    let test = if acked { "udp-gso-lat" } else { "udp-lat" };
    let ping = || {
        stages::mark(Stage::Post);
        send(&pinger, &data, there)?;
        let mut got = 0;
        while got < wire.total {
            got += receive(pinger.as_raw_fd(), &mut buf, spin)?;
        }
        stages::mark(Stage::Completed);
        Ok(())
    };
    let pinged = || {
        print_stages(&format!("{test} {size}, the pinger"));
        Ok(())
    };
    let answer = |pinger_done: &AtomicBool| {
        stages::reset();
        let (data, mut buf) = (vec![0x5au8; wire.total], vec![0u8; wire.largest_train()]);
        let mut got = 0;
        while !pinger_done.load(Ordering::Relaxed) {
            match receive(answerer.as_raw_fd(), &mut buf, spin) {
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if got >= wire.total {
                stages::mark(Stage::Completed);
                got = 0;
                stages::mark(Stage::Post);
                send(&answerer, &data, back)?;
            }
        }
        print_stages(&format!("{test} {size}, the answerer"));
        Ok(())
    };
    ping_pong("UDP", size, timing, ping, pinged, answer)
}

/// The two threads of a ping-pong of `size`-byte messages: `ping` sends one
/// and waits for its answer, round trip after round trip (each timed) until
/// the meter stops, and then `pinged` runs; `answer` answers until the flag
/// it is given says the pinger is done (so that the last ping is answered
/// too). `who` names the transport in errors.
fn ping_pong(
    who: &str,
    size: usize,
    timing: &Timing,
    mut ping: impl FnMut() -> io::Result<()> + Send,
    pinged: impl FnOnce() -> io::Result<()> + Send,
    answer: impl FnOnce(&AtomicBool) -> io::Result<()> + Send,
) -> Result<Measured, String> {
    let meter = Meter::default();
    let pinger_done = AtomicBool::new(false);
    let (window, pinging, answering) = std::thread::scope(|s| {
        let pinging = s.spawn(|| {
            stages::reset();
            let mut rtts = Vec::new();
            let pinging = (|| {
                while !meter.stopped() {
                    let start = Instant::now();
                    ping()?;
                    let rtt = start.elapsed();
                    if meter.measuring() {
                        rtts.push(rtt);
                    }
                    meter.add(2 * size as u64, 2);
                }
                Ok(())
            })();
            pinger_done.store(true, Ordering::Relaxed);
            pinging.and(pinged()).map(|()| rtts)
        });
        let answering = s.spawn(|| answer(&pinger_done));
        let window = meter.time(timing);
        (window, pinging.join(), answering.join())
    });
    let mut rtts = joined(pinging, &format!("{who} pinger"))?;
    joined(answering, &format!("{who} answerer"))?;
    rtts.sort_unstable();
    Ok(Measured { window, rtts, retries: None, per_qp: Vec::new() })
}

/// Sends `data` as the datagrams (GSO trains) of the lengths in `trains`,
/// in order, with as few `sendmmsg` calls as the kernel takes: the fewest
/// system calls a message's packets can leave in.
fn send_trains(fd: RawFd, data: &[u8], trains: &[usize], dest: &SocketAddrV4) -> io::Result<()> {
    let mut to = sockaddr(dest);
    let mut at = 0;
    let mut iovs: Vec<libc::iovec> = trains
        .iter()
        .map(|&len| {
            let iov = libc::iovec { iov_base: data[at..].as_ptr().cast_mut().cast(), iov_len: len };
            at += len;
            iov
        })
        .collect();
    // SAFETY: zero is a valid mmsghdr; the pointers are set below.
    let mut msgs: Vec<libc::mmsghdr> = iovs.iter().map(|_| unsafe { zeroed() }).collect();
    for (msg, iov) in msgs.iter_mut().zip(&mut iovs) {
        msg.msg_hdr.msg_name = (&mut to as *mut libc::sockaddr_in).cast();
        msg.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as u32;
        msg.msg_hdr.msg_iov = iov;
        msg.msg_hdr.msg_iovlen = 1;
    }
    let mut sent = 0;
    while sent < msgs.len() {
        let left = &mut msgs[sent..];
        stages::mark(Stage::SendCall);
        // SAFETY: every header points at live buffers (read only by the
        // kernel), its iovec and the address.
        let n = unsafe { libc::sendmmsg(fd, left.as_mut_ptr(), left.len() as u32, 0) };
        stages::mark(Stage::SendReturn);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        sent += n as usize;
    }
    Ok(())
}

/// The datagrams of one ping-pong message, as `send` calls.
#[derive(Debug, PartialEq, Eq)]
struct RoceWire {
    /// The GSO segment size: every segment of a train but its last has it.
    segment: usize,
    /// Bytes of each `send`, in order.
    trains: Vec<usize>,
    total: usize,
}

impl RoceWire {
    /// One datagram of `size` bytes.
    fn plain(size: usize) -> RoceWire {
        RoceWire { segment: size, trains: vec![size], total: size }
    }

    /// A SEND of `size` bytes in packets of up to [`MTU`] bytes of payload,
    /// then the ACK, gathered into GSO trains: a train ends after
    /// [`MAX_TRAIN`] bytes or after a segment shorter than the rest.
    fn new(size: usize) -> RoceWire {
        let segment = size.clamp(1, MTU) + ROCE_OVERHEAD;
        let full = size / MTU;
        let rest = size % MTU;
        let mut segments = vec![segment; full.max(usize::from(size <= MTU))];
        if size > MTU && rest > 0 {
            segments.push(rest + ROCE_OVERHEAD);
        }
        segments.push(ACK_PACKET);
        let mut trains = Vec::new();
        let mut train = 0;
        for seg in segments {
            if train + seg > MAX_TRAIN {
                trains.push(std::mem::take(&mut train));
            }
            train += seg;
            if seg < segment {
                trains.push(std::mem::take(&mut train));
            }
        }
        if train > 0 {
            trains.push(train);
        }
        let total = trains.iter().sum();
        RoceWire { segment, trains, total }
    }

    fn largest_train(&self) -> usize {
        self.trains.iter().copied().max().unwrap_or(0)
    }
}

/// TCP ping-pong of `size`-byte messages over one connection (Nagle off),
/// each side waiting as [`udp_ping_pong`]'s do: what a program that moves
/// its messages over TCP, as Open MPI's TCP transport does, pays a round
/// trip on this machine.
pub fn tcp_ping_pong(size: usize, timing: &Timing) -> Result<Measured, String> {
    let listener = TcpListener::bind((ADDRESS_B, 0)).map_err(|e| format!("bind {ADDRESS_B}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let pinger = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let (answerer, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    for (stream, timeout) in [(&pinger, ANSWER_TIMEOUT), (&answerer, POLL)] {
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        // An answer nobody reads any more does not hold the row up.
        stream.set_write_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| e.to_string())?;
    }
    let spin = spin();
    let (data, mut buf) = (vec![0xa5u8; size], vec![0u8; size]);
    let ping = || {
        (&pinger).write_all(&data)?;
        let mut got = 0;
        while got < size {
            match receive(pinger.as_raw_fd(), &mut buf[got..], spin)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => got += n,
            }
        }
        Ok(())
    };
    // Closing tells the answerer the ping-pong is over.
    let pinged = || pinger.shutdown(std::net::Shutdown::Write);
    let answer = |pinger_done: &AtomicBool| {
        let (data, mut buf) = (vec![0x5au8; size], vec![0u8; size]);
        let mut got = 0;
        loop {
            match receive(answerer.as_raw_fd(), &mut buf[got..], spin) {
                Ok(0) => return Ok(()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !pinger_done.load(Ordering::Relaxed) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
            if got == size {
                got = 0;
                (&answerer).write_all(&data)?;
            }
        }
    };
    ping_pong("TCP", size, timing, ping, pinged, answer)
}

/// How long a ping-pong thread polls before it sleeps: softroce's waiting
/// threads poll for 20 µs (none in a process with one CPU).
const SPIN: Duration = Duration::from_micros(20);

/// [`SPIN`] on a machine of several CPUs; none on one, as softroce's threads.
fn spin() -> Duration {
    if std::thread::available_parallelism().map_or(1, usize::from) > 1 {
        SPIN
    } else {
        Duration::ZERO
    }
}
/// Bytes a RoCE packet adds to its payload: a BTH (12) and the ICRC (4).
const ROCE_OVERHEAD: usize = 16;
/// A RoCE ACK: BTH, AETH and ICRC.
const ACK_PACKET: usize = 20;
/// The path MTU of the ping-pongs' RoCE packets.
const MTU: usize = 4096;
/// The most a UDP datagram over IPv4 carries: a GSO train's limit.
const MAX_TRAIN: usize = 65507;

/// Receives a datagram (a whole GRO train), or what a stream has, into
/// `buf`, polling for `spin` before a blocking receive with the socket's
/// timeout (`WouldBlock` when it passes); returns the length.
fn receive(fd: RawFd, buf: &mut [u8], spin: Duration) -> io::Result<usize> {
    let until = Instant::now() + spin;
    let mut flags = libc::MSG_DONTWAIT;
    loop {
        stages::mark(Stage::ReceiveCall);
        // SAFETY: a valid socket and a buffer of the length given.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n >= 0 {
            stages::mark(Stage::Received);
            return Ok(n as usize);
        }
        stages::mark(Stage::NothingReceived);
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock || flags == 0 {
            return Err(e);
        }
        if Instant::now() >= until {
            flags = 0;
        }
    }
}

/// A thread's outcome as the row's.
fn joined<T>(outcome: std::thread::Result<io::Result<T>>, who: &str) -> Result<T, String> {
    match outcome {
        Ok(result) => result.map_err(|e| format!("{who}: {e}")),
        Err(_) => Err(format!("{who} panicked")),
    }
}

/// `count` buffers of `len` bytes moved by one `sendmmsg` or `recvmmsg`,
/// with room for each message's control data (the GRO segment size).
struct Batch {
    data: Vec<u8>,
    len: usize,
    count: usize,
    /// `u64`s, so that each message's control buffer is aligned for `cmsghdr`.
    control: Vec<u64>,
}

/// `u64`s of control buffer per message: a `cmsghdr` and an `int`, with room.
const CONTROL_WORDS: usize = 8;

impl Batch {
    fn new(count: usize, len: usize) -> Batch {
        Batch { data: vec![0xa5; count * len], len, count, control: vec![0; count * CONTROL_WORDS] }
    }

    /// Headers for every buffer, built each call (as softroce's link does),
    /// pointing into `self` and at `iovs`; received ones get control buffers.
    fn headers(&mut self, iovs: &mut [libc::iovec], receiving: bool) -> Vec<libc::mmsghdr> {
        // SAFETY: zero is a valid mmsghdr.
        let mut msgs: Vec<libc::mmsghdr> = (0..self.count).map(|_| unsafe { zeroed() }).collect();
        for (i, (msg, iov)) in msgs.iter_mut().zip(iovs.iter_mut()).enumerate() {
            *iov = libc::iovec { iov_base: self.data[i * self.len..].as_mut_ptr().cast(), iov_len: self.len };
            msg.msg_hdr.msg_iov = iov;
            msg.msg_hdr.msg_iovlen = 1;
            if receiving {
                msg.msg_hdr.msg_control = self.control[i * CONTROL_WORDS..].as_mut_ptr().cast();
                msg.msg_hdr.msg_controllen = CONTROL_WORDS * size_of::<u64>();
            }
        }
        msgs
    }

    fn iovecs(&self) -> Vec<libc::iovec> {
        // SAFETY: zero is a valid iovec; `headers` fills them in.
        (0..self.count).map(|_| unsafe { zeroed() }).collect()
    }

    /// Sends every buffer to `dest`; returns how many went.
    fn send(&mut self, fd: RawFd, dest: &SocketAddrV4) -> io::Result<usize> {
        let mut iovs = self.iovecs();
        let mut msgs = self.headers(&mut iovs, false);
        let mut to = sockaddr(dest);
        for msg in &mut msgs {
            msg.msg_hdr.msg_name = (&mut to as *mut libc::sockaddr_in).cast();
            msg.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as u32;
        }
        // SAFETY: every header points at live buffers, iovecs and the address.
        let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Receives up to a batch (waiting for the first datagram only); returns
    /// the bytes and datagrams, GRO trains counted in `segment`-sized
    /// segments, or in the size the kernel reports.
    fn recv(&mut self, fd: RawFd, segment: usize) -> io::Result<(u64, u64)> {
        let mut iovs = self.iovecs();
        let mut msgs = self.headers(&mut iovs, true);
        // SAFETY: as in `send`; the kernel writes at most the lengths given.
        let n = unsafe {
            libc::recvmmsg(fd, msgs.as_mut_ptr(), msgs.len() as u32, libc::MSG_WAITFORONE, std::ptr::null_mut())
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let (mut bytes, mut datagrams) = (0, 0);
        for msg in &msgs[..n as usize] {
            let len = msg.msg_len as usize;
            let size = gro_segment(&msg.msg_hdr).unwrap_or(segment).max(1);
            bytes += len as u64;
            datagrams += len.div_ceil(size) as u64;
        }
        Ok((bytes, datagrams))
    }
}

/// The segment size of a GRO train, from its `UDP_GRO` control message; none
/// for a datagram that arrived alone.
fn gro_segment(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: the kernel filled the control buffer and set its length; the
    // CMSG macros stay within it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return usize::try_from(size).ok();
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    None
}

fn sockaddr(addr: &SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: zero is a valid sockaddr_in.
    let mut sin: libc::sockaddr_in = unsafe { zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = addr.port().to_be();
    sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(addr.ip().octets()) };
    sin
}

fn set_option(socket: &UdpSocket, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid socket and a pointer to a c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_gso_option_is_an_error_not_a_run() {
        // UDP_SEGMENT takes at most 65535: the kernel refuses more.
        let timing = Timing { warmup: Duration::ZERO, seconds: Duration::from_millis(1) };
        let e = udp_stream(70_000, 2, &timing).unwrap_err();
        assert!(e.contains("the kernel refuses UDP_SEGMENT"), "{e}");
    }

    #[test]
    fn both_ping_pongs_time_round_trips() {
        let timing = Timing { warmup: Duration::from_millis(10), seconds: Duration::from_millis(50) };
        for acked in [false, true] {
            let m = udp_ping_pong(8, acked, &timing).unwrap();
            assert!(!m.rtts.is_empty(), "acked {acked}: no round trip timed");
            assert!(m.rtts[m.rtts.len() / 2] < ANSWER_TIMEOUT, "acked {acked}: {:?}", m.rtts[m.rtts.len() / 2]);
        }
    }

    #[test]
    fn steered_and_lone_batches_take_turns() {
        let timing = Timing { warmup: Duration::from_millis(10), seconds: Duration::from_millis(50) };
        let (alone, steered, extra) = udp_steering(64, 2, &timing).unwrap();
        for m in [&alone, &steered] {
            assert!(m.window.messages > 0 && m.window.bytes == m.window.messages * 64, "{m:?}");
            assert!(m.window.elapsed > Duration::ZERO && m.window.elapsed < Duration::from_secs(1), "{m:?}");
        }
        // Turns: neither destination had many more batches than the other.
        let (a, s) = (alone.window.messages, steered.window.messages);
        assert!(a.abs_diff(s) <= BATCH as u64, "{a} and {s} datagrams");
        assert!(extra.is_finite());
    }

    #[test]
    fn a_ping_and_its_ack_arrive_as_one_train() {
        let (tx, rx) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        set_option(&rx, libc::SOL_UDP, libc::UDP_GRO, 1).unwrap();
        rx.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        set_option(&tx, libc::SOL_UDP, libc::UDP_SEGMENT, 24).unwrap();
        tx.send_to(&[7u8; 24 + ACK_PACKET], rx.local_addr().unwrap()).unwrap();
        // One GSO send, one GRO receive, as a SEND and its ACK travel.
        let mut buf = [0u8; 128];
        assert_eq!(receive(rx.as_raw_fd(), &mut buf, SPIN).unwrap(), 24 + ACK_PACKET);
    }

    #[test]
    fn a_send_of_many_packets_goes_in_trains_with_its_ack_last() {
        // 8 B: one packet and the ACK, one train.
        assert_eq!(RoceWire::new(8), RoceWire { segment: 24, trains: vec![44], total: 44 });
        // 1 MiB: 256 packets of 4112 bytes, 15 to a train, the ACK behind the last.
        let mib = RoceWire::new(1 << 20);
        assert_eq!(mib.segment, 4112);
        assert_eq!(mib.trains.len(), 18);
        assert!(mib.trains[..17].iter().all(|&t| t == 15 * 4112), "{:?}", mib.trains);
        assert_eq!(mib.trains[17], 4112 + ACK_PACKET);
        assert_eq!(mib.total, 256 * 4112 + ACK_PACKET);
        // A short last packet ends its train; the ACK goes alone.
        let odd = RoceWire::new(MTU + 100);
        assert_eq!(odd.trains, vec![4112 + 116, ACK_PACKET]);
        assert_eq!(RoceWire::plain(8), RoceWire { segment: 8, trains: vec![8], total: 8 });
    }

    #[test]
    fn the_one_mib_ping_pongs_answer_every_byte() {
        let timing = Timing { warmup: Duration::from_millis(10), seconds: Duration::from_millis(50) };
        for measured in [udp_ping_pong(1 << 20, true, &timing), tcp_ping_pong(1 << 20, &timing)] {
            let m = measured.unwrap();
            assert!(m.window.messages > 0 && m.window.bytes == m.window.messages * (1 << 20), "{m:?}");
            assert!(!m.rtts.is_empty(), "{m:?}");
        }
    }

    #[test]
    fn plain_datagrams_count_one_each() {
        let (tx, rx) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        let SocketAddr::V4(dest) = rx.local_addr().unwrap() else { unreachable!() };
        assert_eq!(Batch::new(3, 100).send(tx.as_raw_fd(), &dest).unwrap(), 3);
        rx.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        let mut incoming = Batch::new(4, 100);
        let (mut bytes, mut datagrams) = (0, 0);
        while datagrams < 3 {
            let (b, d) = incoming.recv(rx.as_raw_fd(), 100).unwrap();
            (bytes, datagrams) = (bytes + b, datagrams + d);
        }
        assert_eq!((bytes, datagrams), (300, 3));
    }

    #[test]
    fn a_gro_train_counts_its_segments() {
        let (tx, rx) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        set_option(&tx, libc::SOL_UDP, libc::UDP_SEGMENT, 100).unwrap();
        set_option(&rx, libc::SOL_UDP, libc::UDP_GRO, 1).unwrap();
        let SocketAddr::V4(dest) = rx.local_addr().unwrap() else { unreachable!() };
        assert_eq!(Batch::new(1, 1000).send(tx.as_raw_fd(), &dest).unwrap(), 1);
        rx.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        // Whole, with its segment size in the control message: were it
        // counted by the size given here, it would be one datagram.
        assert_eq!(Batch::new(4, 1 << 16).recv(rx.as_raw_fd(), 1000).unwrap(), (1000, 10));
    }
}
