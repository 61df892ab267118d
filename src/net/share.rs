//! One UDP port shared by all of a user's softroce processes, as kernel rxe
//! shares one device among processes (rxe-spec/share.md).
//!
//! Every member (each open context) binds the port with `SO_REUSEPORT`, so
//! the kernel puts the sockets of one address in one reuseport group, which
//! only sockets of the same user can join. The group carries a classic-BPF
//! program ([`bpf::Steering`]) that sends each datagram to the socket of the
//! process owning its destination QP: QPNs are `slot << 16 | n`, and each
//! member holds one slot (1..=255).
//!
//! The kernel does not say where a socket sits in a group, and a closing
//! socket's place goes to the last one. So positions are found by a
//! *census*, which needs no member's cooperation: every member's socket
//! drops census probes (a socket filter), the coordinator sends `k + 1`
//! probes that the program steers to position `k`, and each socket's drop
//! counter in `/proc/net/udp` then says its position.
//!
//! Bookkeeping lives in the user's private directory
//! (`rundir::host_directory`), one subdirectory per port and network
//! namespace: a lock file (`flock`: one coordinator at a time;
//! an OFD lock on byte `slot`, held by its member and released by the kernel
//! when the process dies, even by SIGKILL), a state file, and each member's
//! Unix datagram socket. A datagram that reaches the wrong member (during a
//! change, or a GRO train a remote host's NIC made of several owners'
//! packets) goes on to its owner over that socket.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::ops::RangeInclusive;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::bpf::{self, Insn, Steering};

/// Members of one port at most: slots 1..=255 (slot 0 holds QP0 and QP1).
pub const MAX_MEMBERS: usize = 255;
/// How often a member's steward looks for members that died.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(50);
/// The first line of a state file; a different one is another version's.
const STATE_MAGIC: &str = "softroce-shared-port 1";
/// Census rounds before giving up (each has a new nonce).
const CENSUS_TRIES: u32 = 4;
/// How long a census waits for its probes to be counted.
const CENSUS_WAIT: Duration = Duration::from_millis(200);
/// How long to wait for another coordinator before giving up.
const COORDINATOR_WAIT: Duration = Duration::from_secs(10);
/// How long forwarding waits for room in a slow member's inbox: the kernel
/// queues only `net.unix.max_dgram_qlen` (10 by default) datagrams per
/// receiver, so a burst must wait for the owner to read rather than be lost.
const FORWARD_WAIT: Duration = Duration::from_millis(5);
/// How long packets for a member that let [`FORWARD_WAIT`] run out are
/// dropped at once instead of waited for.
const STALL_BACKOFF: Duration = Duration::from_millis(100);
/// Bytes ahead of a forwarded packet: source address and port, and the
/// local address it came to ([`encode_forward`]).
const FORWARD_HEADER: usize = 36;

/// What became of a packet [`Member::forward`] passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// It is in its owner's inbox.
    Passed,
    /// Its owner did not read its inbox for 5 ms: dropped, as
    /// a full socket buffer drops.
    InboxFull,
    /// Nobody holds the slot: dropped, as packets for a missing QP are.
    Ownerless,
}

/// One member's place in the group sharing a port: its slot, its sockets
/// (one per local address) and the steward thread that keeps the group's
/// steering right when members come and go.
pub struct Member {
    shared: Arc<Shared>,
    steward: Option<JoinHandle<()>>,
    /// Where packets forwarded to this member arrive.
    inbox: UnixDatagram,
    /// Where packets for other members are forwarded from: blocking, for at
    /// most [`FORWARD_WAIT`], unlike the inbox.
    outbox: UnixDatagram,
    /// The same without waiting, for a member that let a wait run out: the
    /// engine must not spend 5 ms a packet on one that stopped reading.
    outbox_now: UnixDatagram,
    /// The member whose inbox was last found full, and until when packets
    /// for it are not waited for.
    stalled: Option<(u8, Instant)>,
    /// Reused for forwarded packets, header and all.
    scratch: Vec<u8>,
    /// Whether the member has left (or, in tests, crashed).
    left: bool,
}

/// What the member and its steward share.
struct Shared {
    slot: u8,
    dir: PathBuf,
    /// The lock file: `flock` for coordination, the OFD lock on our slot.
    lock: File,
    /// Another open of the lock file, holding no lock, to test others'.
    probe: File,
    sockets: Mutex<Vec<(IpAddr, Arc<UdpSocket>)>>,
    /// The steering in force as of the last census or change, for deciding
    /// who owns a GSI packet.
    steering: Mutex<BTreeMap<IpAddr, Steering>>,
    stop: Mutex<bool>,
    wake: Condvar,
    misdelivered: AtomicBool,
    censuses: AtomicU64,
}

impl Member {
    /// Joins the group sharing `port` on each of `addrs`: takes the least
    /// recently used free slot, binds a socket per address, takes a census
    /// and steers the slot's QPs here.
    pub fn join(port: u16, addrs: &[IpAddr]) -> io::Result<Member> {
        // A network namespace is a host of its own: its own groups, slots
        // and QPNs.
        let netns = fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
        let (dir, lock, coordinator) = loop {
            let dir = crate::rundir::host_directory(&format!("port-{port}-net{netns}"))?;
            let path = dir.join("lock");
            let lock =
                match OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&path) {
                    // The directory went between its making and this (a last
                    // member left, or a sweep): make it again.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    opened => opened?,
                };
            let coordinator = Coordinator::take(&lock)?;
            // The last member to leave removes the directory: start again
            // if that happened while this one waited for the lock.
            if fs::metadata(&path).is_ok_and(|m| m.ino() == lock.metadata().map_or(0, |l| l.ino())) {
                break (dir, lock, coordinator);
            }
        };
        let mut state = State::read(&dir)?;
        let slot = take_slot(&lock, &dir, &state)?;
        let mut sockets = Vec::new();
        for &addr in addrs {
            sockets.push((addr, Arc::new(member_socket(addr, port)?)));
        }
        let inbox_path = slot_path(&dir, slot);
        let _ = fs::remove_file(&inbox_path);
        let inbox = UnixDatagram::bind(&inbox_path)?;
        inbox.set_nonblocking(true)?;
        let outbox = UnixDatagram::unbound()?;
        outbox.set_write_timeout(Some(FORWARD_WAIT))?;
        let outbox_now = UnixDatagram::unbound()?;
        outbox_now.set_nonblocking(true)?;
        let mut inodes = Vec::new();
        for (addr, socket) in &sockets {
            inodes.push((*addr, inode(socket.as_raw_fd())?));
        }
        state.slots.insert(slot, SlotState { used: now_ms(), inodes });
        let probe = File::open(dir.join("lock"))?;
        let shared = Arc::new(Shared {
            slot,
            dir,
            lock,
            probe,
            sockets: Mutex::new(sockets),
            steering: Mutex::default(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            misdelivered: AtomicBool::new(false),
            censuses: AtomicU64::new(0),
        });
        shared.census_all(&mut state)?;
        state.write(&shared.dir, slot)?;
        drop(coordinator);
        static SWEPT: Once = Once::new();
        if let Some(host) = shared.dir.parent() {
            SWEPT.call_once(|| sweep_abandoned(host, &shared.dir));
        }
        let steward = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new().name(format!("softroce-share-{slot}")).spawn(move || shared.steward())?
        };
        Ok(Member {
            shared,
            steward: Some(steward),
            inbox,
            outbox,
            outbox_now,
            stalled: None,
            scratch: Vec::new(),
            left: false,
        })
    }

    /// This member's slot: its QPNs are `slot << 16 | n`.
    pub fn slot(&self) -> u8 {
        self.shared.slot
    }

    /// The member's sockets, one per address, for the link to send and
    /// receive on.
    pub fn sockets(&self) -> Vec<(IpAddr, Arc<UdpSocket>)> {
        lock(&self.shared.sockets).clone()
    }

    /// Censuses taken by this member so far.
    pub fn censuses(&self) -> u64 {
        self.shared.censuses.load(Ordering::Relaxed)
    }

    /// The descriptor that is readable while forwarded packets wait.
    pub fn inbox_fd(&self) -> RawFd {
        self.inbox.as_raw_fd()
    }

    /// The slot of another member that owns `roce`, which arrived at
    /// `local`; `None` if it is this member's (or nobody's to say: a packet
    /// for QP0, a QPN of slot 0, or a GSI MAD no rule places).
    #[inline]
    pub fn owner_elsewhere(&self, local: IpAddr, roce: &[u8]) -> Option<u8> {
        let slot = match roce.get(4..8) {
            Some(&[_, slot, b6, b7]) if (slot, b6, b7) != (0, 0, 1) => slot,
            Some(_) => lock(&self.shared.steering).get(&local).and_then(|s| s.owner(roce))?,
            None => return None,
        };
        (slot != 0 && slot != self.shared.slot).then_some(slot)
    }

    /// The rdma_cm service of `roce`, a REQ or SIDR_REQ that arrived at
    /// `local`, if no member listens on it as far as this one knows: a
    /// listener may be on its way (rxe-spec N-8).
    #[inline]
    pub fn unclaimed_request(&self, local: IpAddr, roce: &[u8]) -> Option<u32> {
        let service = bpf::cm_request_service(roce)?;
        let known = lock(&self.shared.steering).get(&local).and_then(|s| s.owner(roce));
        known.is_none().then_some(service)
    }

    /// The live member of `local`'s group listening on rdma_cm `service`
    /// now, from the port's state (not this member's steering, which learns
    /// of other members' listeners at its next census).
    pub fn listener_now(&self, local: IpAddr, service: u32) -> Option<u8> {
        let state = State::read(&self.shared.dir).ok()?;
        let group = state.groups.get(&local)?;
        // A member that died is still in the state until the next census:
        // its slot lock says it is gone.
        state.listeners.iter().find_map(|&(s, slot)| {
            let here = group.positions.contains(&Some(slot)) || slot == self.shared.slot;
            (s == service && here && !self.shared.vanished(slot)).then_some(slot)
        })
    }

    /// Passes `roce`, which arrived at `local` from `src`, to member `slot`,
    /// and asks the steward for a census.
    pub fn forward(&mut self, slot: u8, src: SocketAddr, local: IpAddr, roce: &[u8]) -> Forwarded {
        if !self.shared.misdelivered.swap(true, Ordering::Relaxed) {
            self.shared.wake.notify_one();
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&encode_forward(src, local));
        self.scratch.extend_from_slice(roce);
        let now = Instant::now();
        let stalled = self.stalled.is_some_and(|(stalled, until)| stalled == slot && now < until);
        let outbox = if stalled { &self.outbox_now } else { &self.outbox };
        match outbox.send_to(&self.scratch, slot_path(&self.shared.dir, slot)) {
            Ok(_) => Forwarded::Passed,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if !stalled {
                    self.stalled = Some((slot, now + STALL_BACKOFF));
                }
                Forwarded::InboxFull
            }
            Err(_) => Forwarded::Ownerless,
        }
    }

    /// The next packet another member forwarded here: its source, the local
    /// address it came to, and its length at the start of `buf`.
    pub fn receive_forwarded(&mut self, buf: &mut [u8]) -> Option<(SocketAddr, IpAddr, usize)> {
        loop {
            self.scratch.resize(FORWARD_HEADER + buf.len(), 0);
            let n = self.inbox.recv(&mut self.scratch).ok()?;
            let Some((src, local)) = decode_forward(&self.scratch[..n.min(FORWARD_HEADER)]) else { continue };
            let len = n - FORWARD_HEADER;
            buf[..len].copy_from_slice(&self.scratch[FORWARD_HEADER..n]);
            return Some((src, local, len));
        }
    }

    /// A handle to the member's slot and CM listeners, for whoever owns the
    /// QPs (the link itself lives in an engine).
    pub fn handle(&self) -> ShareHandle {
        ShareHandle(Arc::clone(&self.shared))
    }

    /// Leaves the group: steers as the group will be once this member's
    /// sockets close (the last socket takes each of their places), passes on
    /// what already arrived for others with `drain`, and closes them. The
    /// caller must have dropped its own references to the sockets.
    pub fn leave(mut self, drain: impl FnOnce(&mut Member)) {
        self.depart(drain);
    }

    /// Ends membership as a crash would: sockets and locks close with
    /// nothing said to the others.
    #[cfg(test)]
    fn crash(mut self) {
        self.left = true;
    }

    fn depart(&mut self, drain: impl FnOnce(&mut Member)) {
        self.left = true;
        self.stop_steward();
        let Ok(coordinator) = Coordinator::take(&self.shared.lock) else { return };
        let mut state = State::read(&self.shared.dir).unwrap_or_default();
        let slot = self.shared.slot;
        for (addr, socket) in lock(&self.shared.sockets).iter() {
            let Some(group) = state.groups.get_mut(addr) else { continue };
            if let Some(at) = group.positions.iter().position(|&s| s == Some(slot)) {
                group.positions.swap_remove(at);
            }
            group.listeners.retain(|&(_, s)| s != slot);
            let _ = attach_steering(socket, &group.steering(), None);
        }
        state.listeners.retain(|&(_, s)| s != slot);
        drain(self);
        lock(&self.shared.sockets).clear();
        if let Some(s) = state.slots.get_mut(&slot) {
            *s = SlotState { used: now_ms(), inodes: Vec::new() };
        }
        let _ = fs::remove_file(slot_path(&self.shared.dir, slot));
        self.shared.forget_vanished(&mut state);
        // A member that left removed its inbox, though it may hold its slot
        // lock a moment longer (two leaving at once each see the other's).
        let dir = &self.shared.dir;
        let alone = state.slots.keys().all(|&s| s == slot || !slot_path(dir, s).exists());
        if alone {
            // Nobody else lives here: leave no directory behind (a joiner
            // waiting for the lock sees the file gone and starts again).
            let _ = fs::remove_dir_all(&self.shared.dir);
        } else {
            let _ = state.write(&self.shared.dir, slot);
        }
        drop(coordinator);
        // Closing the lock file (with the last Arc) releases the slot.
    }

    fn stop_steward(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(steward) = self.steward.take() {
            let _ = steward.join();
        }
    }

    /// Takes a census now, as the steward does when it sees a change.
    pub fn census(&self) -> io::Result<()> {
        let _coordinator = Coordinator::take(&self.shared.lock)?;
        let mut state = State::read(&self.shared.dir)?;
        self.shared.census_all(&mut state)?;
        state.write(&self.shared.dir, self.shared.slot)
    }
}

/// What a context may ask of its link's membership from outside the
/// engine: its slot, and which rdma_cm services its GSI QP listens on.
#[derive(Clone)]
pub struct ShareHandle(Arc<Shared>);

impl std::fmt::Debug for ShareHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareHandle").field("slot", &self.0.slot).finish()
    }
}

impl ShareHandle {
    /// The member's slot: the top byte of its QPNs, and of the CM Comm IDs
    /// and SIDR Request IDs it hands out, so answers find it (rxe-spec N-5).
    pub fn slot(&self) -> u8 {
        self.0.slot
    }

    /// Steers rdma_cm connection requests (REQ, SIDR_REQ) for `service`
    /// (port space << 16 | port: the Service ID's low word) on every
    /// address to this member.
    pub fn listen(&self, service: u32) -> io::Result<()> {
        let slot = self.0.slot;
        // Other members may listen on it too: a process's contexts on
        // other addresses (a wildcard listener), each steered in its group.
        self.0.change_listeners(|listeners| {
            listeners.retain(|&l| l != (service, slot));
            listeners.push((service, slot));
        })
    }

    /// Stops steering `service` here.
    pub fn unlisten(&self, service: u32) -> io::Result<()> {
        let slot = self.0.slot;
        self.0.change_listeners(|listeners| listeners.retain(|&l| l != (service, slot)))
    }
}

impl Drop for Member {
    /// Leaves the group, if [`Member::leave`] did not, with nothing to pass on.
    fn drop(&mut self) {
        if self.left {
            self.stop_steward();
        } else {
            self.depart(|_| {});
        }
    }
}

impl Shared {
    /// The steward: every [`LIVENESS_PERIOD`], or when a packet was
    /// misdelivered, it checks whether a member vanished and if so takes a
    /// census. Misdeliveries that a census does not cure (a remote GRO
    /// train of mixed owners) back off.
    fn steward(&self) {
        let mut backoff = LIVENESS_PERIOD;
        let mut next_for_misdelivery = Instant::now();
        loop {
            {
                let stop = lock(&self.stop);
                let (stop, _) = self
                    .wake
                    .wait_timeout_while(stop, LIVENESS_PERIOD, |stop| {
                        !*stop && !self.misdelivered.load(Ordering::Relaxed)
                    })
                    .unwrap_or_else(|e| e.into_inner());
                if *stop {
                    return;
                }
            }
            let misdelivered =
                Instant::now() >= next_for_misdelivery && self.misdelivered.swap(false, Ordering::Relaxed);
            if !misdelivered && !self.someone_vanished() {
                if self.misdelivered.load(Ordering::Relaxed) {
                    // Too soon after the last census for a misdelivery.
                    std::thread::sleep(next_for_misdelivery.saturating_duration_since(Instant::now()));
                }
                continue;
            }
            let changed = self.recount(misdelivered).unwrap_or(true);
            backoff = if changed { LIVENESS_PERIOD / 5 } else { (backoff * 2).min(Duration::from_secs(2)) };
            next_for_misdelivery = Instant::now() + backoff;
        }
    }

    /// Under the coordinator lock: takes a census if `forced` or if the
    /// state still names a member that is gone (one that left has taken
    /// itself out, and its steering needs no census); else adopts the
    /// state's steering. Whether any position changed.
    fn recount(&self, forced: bool) -> io::Result<bool> {
        let _coordinator = Coordinator::take(&self.lock)?;
        let mut state = State::read(&self.dir)?;
        let before = state.groups.clone();
        let stale = {
            let steering = lock(&self.steering);
            let ours = state.groups.iter().filter(|(addr, _)| steering.contains_key(addr));
            ours.flat_map(|(_, g)| g.positions.iter().flatten()).any(|&slot| self.vanished(slot))
        };
        if forced || stale {
            self.census_all(&mut state)?;
            state.write(&self.dir, self.slot)?;
        } else {
            let mut steering = lock(&self.steering);
            for (addr, s) in steering.iter_mut() {
                if let Some(group) = state.groups.get(addr) {
                    *s = group.steering();
                }
            }
        }
        Ok(state.groups != before)
    }

    /// Whether `slot`, another member's, has lost its owner.
    fn vanished(&self, slot: u8) -> bool {
        slot != self.slot && !is_locked(&self.probe, slot..=slot)
    }

    /// Whether a slot in our steering lost its owner: a few `fcntl`s, no
    /// allocation (the steward runs all along, beside the data path).
    fn someone_vanished(&self) -> bool {
        lock(&self.steering).values().flat_map(|s| s.positions.iter().flatten()).any(|&slot| self.vanished(slot))
    }

    /// Takes a census of each address's group, forgetting members whose
    /// slot lock is gone, and attaches the result.
    fn census_all(&self, state: &mut State) -> io::Result<()> {
        self.forget_vanished(state);
        let sockets = lock(&self.sockets).clone();
        let mut steering = BTreeMap::new();
        for (addr, socket) in &sockets {
            let group = state.groups.entry(*addr).or_default();
            group.listeners = state.listeners.clone();
            let inodes: BTreeMap<u64, u8> = state
                .slots
                .iter()
                .flat_map(|(&slot, s)| s.inodes.iter().filter(|(a, _)| a == addr).map(move |&(_, ino)| (ino, slot)))
                .collect();
            // Without a census (no /proc, say) the steering stays as it was:
            // packets still arrive, some by way of another member (N-4).
            match census(socket, &inodes, &group.steering()) {
                Ok(positions) => group.positions = positions,
                Err(e) => tracing::warn!("no census of the members sharing {addr}: {e}"),
            }
            attach_steering(socket, &group.steering(), None)?;
            steering.insert(*addr, group.steering());
        }
        *lock(&self.steering) = steering;
        self.censuses.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets the members that died without leaving: their sockets, their
    /// listeners and their inboxes, which would otherwise outlive them in
    /// the directory (a network namespace's inode number, and so its
    /// directory's name, comes back for a later namespace).
    fn forget_vanished(&self, state: &mut State) {
        for (&slot, s) in state.slots.iter_mut() {
            if self.vanished(slot) {
                s.inodes.clear();
                let _ = fs::remove_file(slot_path(&self.dir, slot));
            }
        }
        state.listeners_of_live_slots();
    }

    /// Changes the rdma_cm listeners and re-steers every group.
    fn change_listeners(&self, change: impl FnOnce(&mut Vec<(u32, u8)>)) -> io::Result<()> {
        let _coordinator = Coordinator::take(&self.lock)?;
        let mut state = State::read(&self.dir)?;
        change(&mut state.listeners);
        let sockets = lock(&self.sockets).clone();
        let mut steering = lock(&self.steering);
        for (addr, socket) in &sockets {
            let group = state.groups.entry(*addr).or_default();
            group.listeners = state.listeners.clone();
            attach_steering(socket, &group.steering(), None)?;
            steering.insert(*addr, group.steering());
        }
        state.write(&self.dir, self.slot)
    }
}

/// Where each socket of one address's group sits: `inodes` maps the known
/// members' sockets to their slots; others (a member that has not written
/// its inode yet, a program of the user's own that binds the port with
/// `SO_REUSEPORT`) come out as `None`.
fn census(socket: &UdpSocket, inodes: &BTreeMap<u64, u8>, current: &Steering) -> io::Result<Vec<Option<u8>>> {
    let own = inode(socket.as_raw_fd())?;
    let local = socket.local_addr()?;
    for _ in 0..CENSUS_TRIES {
        let before = group_drops(local.is_ipv6(), own)?;
        let size = before.len();
        if size <= 1 {
            // Alone: nothing to count.
            return Ok(vec![inodes.get(&own).copied()]);
        }
        let nonce = crate::random_u32();
        attach_steering(socket, current, Some(nonce))?;
        let expected = (size * (size + 1) / 2) as u64;
        for position in 0..size {
            for _ in 0..=position {
                send_probe(socket, local, &bpf::probe(nonce, position as u32))?;
            }
        }
        let deadline = Instant::now() + CENSUS_WAIT;
        loop {
            let after = group_drops(local.is_ipv6(), own)?;
            let deltas: Vec<(u64, u64)> = after
                .iter()
                .map(|&(ino, drops)| {
                    let was = before.iter().find(|&&(i, _)| i == ino).map_or(drops, |&(_, d)| d);
                    (ino, drops.wrapping_sub(was))
                })
                .collect();
            let total: u64 = deltas.iter().map(|&(_, d)| d).sum();
            if total >= expected || Instant::now() >= deadline {
                if let Some(positions) = positions_from(&deltas, size, inodes) {
                    return Ok(positions);
                }
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Drops other than the probes' kept changing the counts: keep the
    // steering as it was; misdelivered packets are still forwarded.
    tracing::warn!("could not count the members sharing {local}; steering stays as it was");
    Ok(current.positions.clone())
}

/// Positions from the drops each socket counted, if they are exactly one
/// socket per position (socket at `k` dropped `k + 1` probes).
fn positions_from(deltas: &[(u64, u64)], size: usize, inodes: &BTreeMap<u64, u8>) -> Option<Vec<Option<u8>>> {
    let mut positions: Vec<Option<Option<u8>>> = vec![None; size];
    for &(ino, delta) in deltas {
        let at = usize::try_from(delta).ok()?.checked_sub(1)?;
        let place = positions.get_mut(at)?;
        if place.is_some() {
            return None;
        }
        *place = Some(inodes.get(&ino).copied());
    }
    positions.into_iter().collect()
}

fn send_probe(socket: &UdpSocket, to: SocketAddr, probe: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + CENSUS_WAIT;
    loop {
        match socket.send_to(probe, to) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(100))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Every socket in the group of the socket with inode `own` (the
/// unconnected ones bound to the same address and port, as `/proc/net/udp`
/// lists them) and its drop counter.
fn group_drops(ipv6: bool, own: u64) -> io::Result<Vec<(u64, u64)>> {
    let table = fs::read_to_string(if ipv6 { "/proc/net/udp6" } else { "/proc/net/udp" })?;
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
    let rows: Vec<(&str, &str, u64, u64)> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (inode, drops) = (f.get(9)?.parse().ok()?, f.get(12)?.parse().ok()?);
            Some((*f.get(1)?, *f.get(3)?, inode, drops))
        })
        .collect();
    let Some(&(local, ..)) = rows.iter().find(|r| r.2 == own) else {
        return Err(io::Error::other("a member socket is missing from /proc/net/udp"));
    };
    // State 07 (TCP_CLOSE): unconnected, so in the group's positions.
    Ok(rows.iter().filter(|r| r.0 == local && r.1 == "07").map(|r| (r.2, r.3)).collect())
}

/// A socket for `addr` on `port` that joins the user's reuseport group
/// there: never `SO_REUSEADDR`, which would let another user's socket bind
/// beside it and take its datagrams (rxe-spec N-9).
#[allow(unsafe_code)]
fn member_socket(addr: IpAddr, port: u16) -> io::Result<UdpSocket> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2); the descriptor is owned by the UdpSocket at once.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let socket = unsafe { UdpSocket::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    if addr.is_ipv6() {
        set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    }
    attach(fd, libc::SO_ATTACH_FILTER, &bpf::probe_filter(port))?;
    let (storage, len) = sockaddr(SocketAddr::new(addr, port));
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::AddrInUse {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "UDP port {port} on {addr} is held by a socket softroce cannot share: another user's \
                     program, kernel rxe, or a program that did not ask to share it (`ss -ulpn 'sport = \
                     :{port}'` names programs; kernel rxe shows in `rdma link`). Another user on this \
                     host needs an address of its own (SOFTROCE_ADDR, `softroce run --addr`)"
                ),
            ));
        }
        return Err(e);
    }
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// A socket on `group:port` that receives the datagrams sent to the IPv4
/// multicast group on the interface of `local`: every process that opens
/// one gets a copy of each (multicast delivery ignores reuseport groups).
/// `SO_REUSEPORT`, never `SO_REUSEADDR`, as for member sockets.
#[allow(unsafe_code)]
pub(super) fn group_socket(group: Ipv4Addr, local: Ipv4Addr, port: u16) -> io::Result<UdpSocket> {
    // SAFETY: plain socket(2); the descriptor is owned by the UdpSocket at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let socket = unsafe { UdpSocket::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    let (storage, len) = sockaddr(SocketAddr::new(IpAddr::V4(group), port));
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let request = libc::ip_mreq {
        imr_multiaddr: libc::in_addr { s_addr: u32::from_ne_bytes(group.octets()) },
        imr_interface: libc::in_addr { s_addr: u32::from_ne_bytes(local.octets()) },
    };
    set_option(fd, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &request)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Makes datagrams `socket` sends to multicast groups leave on the
/// interface of `local`, the device's own, never the host's default route;
/// one hop only.
pub(super) fn send_multicast_from(socket: &UdpSocket, local: Ipv4Addr) -> io::Result<()> {
    let interface = libc::in_addr { s_addr: u32::from_ne_bytes(local.octets()) };
    set_option(socket.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &interface)?;
    set_int(socket.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 1)
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: zero is a valid sockaddr_storage.
    #[allow(unsafe_code)]
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            #[allow(unsafe_code)]
            unsafe {
                (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>().write(sin)
            };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            #[allow(unsafe_code)]
            unsafe {
                (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>().write(sin6)
            };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Attaches the group's steering (with a census probe rule if `nonce`).
fn attach_steering(socket: &UdpSocket, steering: &Steering, nonce: Option<u32>) -> io::Result<()> {
    let program = steering
        .program(nonce)
        .ok_or_else(|| io::Error::other("the steering table does not fit in one BPF program"))?;
    attach(socket.as_raw_fd(), libc::SO_ATTACH_REUSEPORT_CBPF, &program)
}

fn attach(fd: RawFd, option: libc::c_int, program: &[Insn]) -> io::Result<()> {
    let len = u16::try_from(program.len()).map_err(|_| io::Error::other("BPF program too long"))?;
    // `fprog` points at `len` instructions that outlive the call.
    let fprog = libc::sock_fprog { len, filter: program.as_ptr().cast_mut() };
    set_option(fd, libc::SOL_SOCKET, option, &fprog)
}

fn set_int(fd: RawFd, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    set_option(fd, level, option, &value)
}

/// `setsockopt(2)` with `value` as the option's bytes; the kernel copies
/// them (and what they point at) during the call.
#[allow(unsafe_code)]
fn set_option<T>(fd: RawFd, level: libc::c_int, option: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: a pointer to a live `T` of the size given.
    let rc =
        unsafe { libc::setsockopt(fd, level, option, (value as *const T).cast(), size_of::<T>() as libc::socklen_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[allow(unsafe_code)]
fn inode(fd: RawFd) -> io::Result<u64> {
    // SAFETY: zero is a valid stat; fstat fills it for a valid descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_ino)
}

/// Holds the port's `flock`: one coordinator at a time. It holds the lock
/// through its own descriptor of the file's open description, which is
/// where `flock` keeps it.
struct Coordinator(File);

impl Coordinator {
    fn take(file: &File) -> io::Result<Coordinator> {
        let file = file.try_clone()?;
        let deadline = Instant::now() + COORDINATOR_WAIT;
        loop {
            if try_flock(&file)? {
                return Ok(Coordinator(file));
            }
            if Instant::now() >= deadline {
                // A coordinator takes milliseconds; one that holds on is
                // stopped (SIGSTOP, a debugger) or hung.
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "another softroce process of this user has held the shared port's lock for seconds \
                     (stopped or hung?); `fuser -v /tmp/softroce-$UID/port-*/lock` names it",
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Takes the port's `flock` through `file` if no other coordinator holds
/// it now; whether it did. It is released when the file's last descriptor
/// closes (or by [`Coordinator`]'s drop).
#[allow(unsafe_code)]
fn try_flock(file: &File) -> io::Result<bool> {
    // SAFETY: flock on a descriptor the caller owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(false),
        _ => Err(e),
    }
}

/// Removes the directories of `host`'s ports (but `ours`) whose members all
/// died without leaving (SIGKILL, a crash), which nobody else would: no
/// slot lock is held there and no coordinator is at work. A process does
/// it when it first joins a port. A joiner that opened such a lock file
/// before it went finds it gone once it holds it, and starts again, as
/// after a last member's leaving.
fn sweep_abandoned(host: &Path, ours: &Path) {
    let Ok(entries) = fs::read_dir(host) else { return };
    for entry in entries.flatten() {
        let is_port = entry.file_name().to_str().is_some_and(|name| name.starts_with("port-"));
        if is_port && entry.path() != ours {
            let _ = remove_if_abandoned(&entry.path());
        }
    }
}

/// Removes the port directory `dir` if nobody lives there; whether it did.
/// One without a lock file a minute after its making is a joiner's that
/// died before it made one.
fn remove_if_abandoned(dir: &Path) -> io::Result<bool> {
    let path = dir.join("lock");
    let lock = match OpenOptions::new().read(true).write(true).open(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let age = fs::metadata(dir)?.modified()?.elapsed().unwrap_or_default();
            let stale = age > Duration::from_secs(60) && fs::remove_dir(dir).is_ok();
            return Ok(stale);
        }
        opened => opened?,
    };
    // Held until `lock` closes, at the return.
    if !try_flock(&lock)? {
        return Ok(false);
    }
    let current = fs::metadata(&path)?.ino() == lock.metadata()?.ino();
    let abandoned = current && !is_locked(&File::open(&path)?, 1..=MAX_MEMBERS as u8);
    if abandoned {
        fs::remove_dir_all(dir)?;
    }
    Ok(abandoned)
}

impl Drop for Coordinator {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: flock on a descriptor we own.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// An OFD write lock on the bytes `slots` of `file` (a slot's byte is its
/// number): `F_OFD_SETLK` to take it, `F_OFD_GETLK` to test it (through
/// another open of the file, as a description does not conflict with
/// itself).
#[allow(unsafe_code)]
fn ofd_lock(file: &File, slots: RangeInclusive<u8>, cmd: libc::c_int) -> io::Result<libc::flock> {
    // SAFETY: zero is a valid flock.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = libc::off_t::from(*slots.start());
    fl.l_len = libc::off_t::from(*slots.end()) + 1 - fl.l_start;
    // SAFETY: fcntl with a valid descriptor and flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// Whether a member holds any of `slots` (tested through `probe`, an open
/// of the lock file that holds no lock).
fn is_locked(probe: &File, slots: RangeInclusive<u8>) -> bool {
    ofd_lock(probe, slots, libc::F_OFD_GETLK).is_ok_and(|fl| fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Takes the free slot used longest ago (never used first), so a dead
/// member's QPNs are not handed out again at once.
fn take_slot(lock: &File, dir: &Path, state: &State) -> io::Result<u8> {
    let probe = File::open(dir.join("lock"))?;
    let mut free: Vec<(u64, u8)> = (1..=MAX_MEMBERS as u8)
        .filter(|&slot| !is_locked(&probe, slot..=slot))
        .map(|slot| (state.slots.get(&slot).map_or(0, |s| s.used), slot))
        .collect();
    free.sort_unstable();
    for (_, slot) in free {
        if ofd_lock(lock, slot..=slot, libc::F_OFD_SETLK).is_ok() {
            return Ok(slot);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("all {MAX_MEMBERS} slots of {} are taken: too many softroce processes share it", dir.display()),
    ))
}

fn slot_path(dir: &Path, slot: u8) -> PathBuf {
    dir.join(format!("slot-{slot}.sock"))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The header of a forwarded packet: the IP version, the source's port and
/// address, and the local address (IPv4 ones mapped into 16 bytes).
fn encode_forward(src: SocketAddr, local: IpAddr) -> [u8; FORWARD_HEADER] {
    let mut h = [0; FORWARD_HEADER];
    let v6 = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    h[0] = if src.is_ipv4() { 4 } else { 6 };
    h[2..4].copy_from_slice(&src.port().to_be_bytes());
    h[4..20].copy_from_slice(&v6(src.ip()));
    h[20..36].copy_from_slice(&v6(local));
    h
}

fn decode_forward(h: &[u8]) -> Option<(SocketAddr, IpAddr)> {
    let h: &[u8; FORWARD_HEADER] = h.try_into().ok()?;
    let ip = |b: &[u8]| -> Option<IpAddr> {
        let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?);
        Some(match h[0] {
            4 => IpAddr::V4(v6.to_ipv4_mapped()?),
            6 => IpAddr::V6(v6),
            _ => return None,
        })
    };
    Some((SocketAddr::new(ip(&h[4..20])?, u16::from_be_bytes([h[2], h[3]])), ip(&h[20..36])?))
}

/// The port's shared state, as written in its `state` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    /// Every slot ever taken: when it was last used, and its member's
    /// socket inode per address while it lives.
    slots: BTreeMap<u8, SlotState>,
    listeners: Vec<(u32, u8)>,
    groups: BTreeMap<IpAddr, Group>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SlotState {
    used: u64,
    inodes: Vec<(IpAddr, u64)>,
}

/// One address's reuseport group as last counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Group {
    positions: Vec<Option<u8>>,
    listeners: Vec<(u32, u8)>,
}

impl Group {
    fn steering(&self) -> Steering {
        Steering { positions: self.positions.clone(), listeners: self.listeners.clone() }
    }
}

impl State {
    /// The state in `dir`; empty if there is none yet.
    fn read(dir: &Path) -> io::Result<State> {
        let text = match fs::read_to_string(dir.join("state")) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
            Err(e) => return Err(e),
        };
        let mut lines = text.lines();
        if lines.next() != Some(STATE_MAGIC) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} was written by another softroce version; stop its processes first", dir.display()),
            ));
        }
        let mut state = State::default();
        for line in lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            let parsed = match f.as_slice() {
                ["slot", slot, "used", used, inodes @ ..] => (|| {
                    let inodes = inodes
                        .iter()
                        .map(|i| i.split_once('=').and_then(|(a, n)| Some((a.parse().ok()?, n.parse().ok()?))))
                        .collect::<Option<Vec<_>>>()?;
                    state.slots.insert(slot.parse().ok()?, SlotState { used: used.parse().ok()?, inodes });
                    Some(())
                })(),
                ["listen", service, slot] => (|| {
                    state.listeners.push((service.parse().ok()?, slot.parse().ok()?));
                    Some(())
                })(),
                ["group", addr, positions @ ..] => (|| {
                    let positions =
                        positions.iter().map(|p| if *p == "-" { Some(None) } else { p.parse().ok().map(Some) });
                    let group = Group { positions: positions.collect::<Option<_>>()?, listeners: Vec::new() };
                    state.groups.insert(addr.parse().ok()?, group);
                    Some(())
                })(),
                _ => None,
            };
            if parsed.is_none() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad line in state: {line}")));
            }
        }
        let listeners = state.listeners.clone();
        for group in state.groups.values_mut() {
            group.listeners = listeners.clone();
        }
        Ok(state)
    }

    /// Forgets listeners whose member is gone.
    fn listeners_of_live_slots(&mut self) {
        let slots = &self.slots;
        self.listeners.retain(|(_, slot)| slots.get(slot).is_some_and(|s| !s.inodes.is_empty()));
    }

    /// Replaces the state file (by rename, so readers see one or the other).
    fn write(&self, dir: &Path, slot: u8) -> io::Result<()> {
        let mut text = format!("{STATE_MAGIC}\n");
        for (slot, s) in &self.slots {
            text += &format!("slot {slot} used {}", s.used);
            for (addr, ino) in &s.inodes {
                text += &format!(" {addr}={ino}");
            }
            text.push('\n');
        }
        for (service, slot) in &self.listeners {
            text += &format!("listen {service} {slot}\n");
        }
        for (addr, group) in &self.groups {
            text += &format!("group {addr}");
            for p in &group.positions {
                text += &p.map_or(" -".to_string(), |s| format!(" {s}"));
            }
            text.push('\n');
        }
        let tmp = dir.join(format!("state.{slot}.tmp"));
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        file.write_all(text.as_bytes())?;
        fs::rename(tmp, dir.join("state"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn packet(qpn: u32) -> Vec<u8> {
        let mut p = vec![0; 64];
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        p
    }

    /// The QPNs each member's socket received within `wait`.
    fn received(members: &[&Member], wait: Duration) -> Vec<Vec<u32>> {
        let deadline = Instant::now() + wait;
        let mut got = vec![Vec::new(); members.len()];
        while Instant::now() < deadline {
            for (i, m) in members.iter().enumerate() {
                let socket = &m.sockets()[0].1;
                let mut buf = [0; 128];
                while let Ok(n) = socket.recv(&mut buf) {
                    got[i].push(u32::from_be_bytes(buf[4..8].try_into().unwrap()) & 0xff_ffff);
                    assert_eq!(n, 64);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        got
    }

    /// Sends each member's QP a packet and checks each got exactly its own.
    fn check_steering(members: &[&Member], port: u16) {
        if let Err(wrong) = steering_of(members, port) {
            panic!("{wrong}");
        }
    }

    /// Sends each member's QP a packet; says which member got others'.
    fn steering_of(members: &[&Member], port: u16) -> Result<(), String> {
        let local = members[0].sockets()[0].0;
        let sender = UdpSocket::bind((local, 0)).unwrap();
        let qpns: Vec<u32> = members.iter().map(|m| u32::from(m.slot()) << 16 | 0x42).collect();
        for _ in 0..4 {
            for &qpn in &qpns {
                sender.send_to(&packet(qpn), (local, port)).unwrap();
            }
        }
        let got = received(members, Duration::from_millis(100));
        for (i, qpn) in qpns.iter().enumerate() {
            if got[i] != vec![*qpn; 4] {
                return Err(format!("member {i} (slot {}) got {:?}", members[i].slot(), got[i]));
            }
        }
        Ok(())
    }

    fn free_port() -> u16 {
        crate::net::udp::free_port(&[LOCAL]).unwrap()
    }

    #[test]
    fn members_get_their_own_qps_and_a_crash_is_counted_out() {
        let port = free_port();
        let members: Vec<Member> = (0..4).map(|_| Member::join(port, &[LOCAL]).unwrap()).collect();
        let slots: Vec<u8> = members.iter().map(Member::slot).collect();
        assert!(slots.windows(2).all(|w| w[0] != w[1]), "slots {slots:?}");
        check_steering(&members.iter().collect::<Vec<_>>(), port);
        // The first to join dies without leaving: its socket closes, the last
        // takes its place, and its slot lock goes with it.
        let mut members = members.into_iter();
        members.next().unwrap().crash();
        let survivors: Vec<Member> = members.collect();
        let counted: Vec<u64> = survivors.iter().map(Member::censuses).collect();
        let deadline = Instant::now() + Duration::from_secs(2);
        while survivors.iter().zip(&counted).all(|(m, &c)| m.censuses() == c) {
            assert!(Instant::now() < deadline, "no survivor took a census");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A census whose probes all came too late (a host loaded with other
        // tests) leaves the steering as it was, until the next: take one.
        let survivors_ref: Vec<&Member> = survivors.iter().collect();
        for _ in 0..3 {
            if steering_of(&survivors_ref, port).is_ok() {
                break;
            }
            survivors[0].census().unwrap();
        }
        check_steering(&survivors_ref, port);
        // A newcomer does not get the dead member's slot back at once.
        let newcomer = Member::join(port, &[LOCAL]).unwrap();
        assert!(!slots.contains(&newcomer.slot()), "slot {} reused", newcomer.slot());
        let mut all: Vec<&Member> = survivors.iter().collect();
        all.push(&newcomer);
        check_steering(&all, port);
    }

    #[test]
    fn ipv6_members_are_counted_and_steered_too() {
        let local: IpAddr = "::1".parse().unwrap();
        let Ok(port) = crate::net::udp::free_port(&[local]) else {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        };
        let members: Vec<Member> = (0..3).map(|_| Member::join(port, &[local]).unwrap()).collect();
        check_steering(&members.iter().collect::<Vec<_>>(), port);
    }

    #[test]
    fn a_member_that_leaves_moves_the_last_into_its_place_without_a_census() {
        let port = free_port();
        let mut members: Vec<Member> = (0..3).map(|_| Member::join(port, &[LOCAL]).unwrap()).collect();
        let leaver = members.remove(0);
        let counted: Vec<u64> = members.iter().map(Member::censuses).collect();
        leaver.leave(|_| {});
        check_steering(&members.iter().collect::<Vec<_>>(), port);
        assert_eq!(members.iter().map(Member::censuses).collect::<Vec<_>>(), counted);
    }

    #[test]
    fn the_last_to_leave_removes_the_directory_even_when_two_leave_at_once() {
        let port = free_port();
        let a = Member::join(port, &[LOCAL]).unwrap();
        let b = Member::join(port, &[LOCAL]).unwrap();
        let dead = Member::join(port, &[LOCAL]).unwrap();
        let dir = a.shared.dir.clone();
        let dead_inbox = slot_path(&dir, dead.slot());
        dead.crash();
        a.census().unwrap();
        assert!(!dead_inbox.exists(), "a dead member's inbox outlived the census that counted it out");
        // A process that exits releases its slot lock only when its files
        // close, after it left: the other, leaving meanwhile, sees it locked.
        let still_locked = Arc::clone(&a.shared);
        a.leave(|_| {});
        b.leave(|_| {});
        assert!(!dir.exists(), "{} outlived its members", dir.display());
        drop(still_locked);
    }

    #[test]
    fn a_port_whose_members_all_died_is_swept_and_a_living_one_kept() {
        let living = Member::join(free_port(), &[LOCAL]).unwrap();
        let dead = (0..10)
            .map(|_| Member::join(free_port(), &[LOCAL]).unwrap())
            .find(|m| m.shared.dir != living.shared.dir)
            .unwrap();
        let (living_dir, dead_dir) = (living.shared.dir.clone(), dead.shared.dir.clone());
        dead.crash();
        assert!(dead_dir.exists());
        // A joiner's directory without a lock file: its own if new, left by
        // one that died if old.
        let host = living_dir.parent().unwrap();
        let [old, new] = [120, 0].map(|age| {
            let dir = host.join(format!("port-test-{age}-{}", std::process::id()));
            fs::create_dir(&dir).unwrap();
            File::open(&dir).unwrap().set_modified(SystemTime::now() - Duration::from_secs(age)).unwrap();
            dir
        });
        sweep_abandoned(host, &living_dir);
        assert!(!dead_dir.exists(), "{} outlived its dead members", dead_dir.display());
        assert!(!old.exists() && new.exists());
        fs::remove_dir(new).unwrap();
        assert!(living_dir.exists());
        // Swept from another's view too: a living member's port stays.
        assert!(!remove_if_abandoned(&living_dir).unwrap());
        drop(living);
    }

    #[test]
    fn misdelivered_packets_reach_their_owner_through_its_inbox() {
        let port = free_port();
        let mut a = Member::join(port, &[LOCAL]).unwrap();
        let mut b = Member::join(port, &[LOCAL]).unwrap();
        let p = packet(u32::from(b.slot()) << 16 | 7);
        let src: SocketAddr = "127.0.0.9:5000".parse().unwrap();
        assert_eq!(a.owner_elsewhere(LOCAL, &p), Some(b.slot()));
        assert_eq!(b.owner_elsewhere(LOCAL, &p), None);
        assert_eq!(a.owner_elsewhere(LOCAL, &packet(1 << 16)[..7]), None, "too short to say");
        assert_eq!(a.forward(b.slot(), src, LOCAL, &p), Forwarded::Passed);
        let mut buf = [0; 256];
        let got = b.receive_forwarded(&mut buf).unwrap();
        assert_eq!(got, (src, LOCAL, p.len()));
        assert_eq!(&buf[..p.len()], &p[..]);
        // Nobody holds slot 250's inbox.
        assert_eq!(a.forward(250, src, LOCAL, &p), Forwarded::Ownerless);
    }

    /// The kernel queues ten datagrams per Unix socket by default: a burst
    /// waits for an owner that reads, and is dropped and counted as such
    /// only when the owner stops reading.
    #[test]
    fn a_forwarded_burst_waits_for_its_owner_and_only_a_stalled_owner_loses_packets() {
        let port = free_port();
        let mut a = Member::join(port, &[LOCAL]).unwrap();
        let mut b = Member::join(port, &[LOCAL]).unwrap();
        let p = packet(u32::from(b.slot()) << 16 | 7);
        let src: SocketAddr = "127.0.0.9:5000".parse().unwrap();
        const BURST: usize = 2000;
        let slot = b.slot();
        let reader = std::thread::spawn(move || {
            let mut buf = [0; 256];
            let (mut got, deadline) = (0, Instant::now() + Duration::from_secs(10));
            while got < BURST && Instant::now() < deadline {
                match b.receive_forwarded(&mut buf) {
                    Some(_) => got += 1,
                    None => std::thread::sleep(Duration::from_micros(200)),
                }
            }
            (b, got)
        });
        let passed = (0..BURST).filter(|_| a.forward(slot, src, LOCAL, &p) == Forwarded::Passed).count();
        let (b, got) = reader.join().unwrap();
        assert_eq!((passed, got), (BURST, BURST));
        // Nobody reads now: the queue fills, a packet waits 5 ms and is lost,
        // and the next ones are lost without waiting.
        let started = Instant::now();
        let outcomes: Vec<Forwarded> = (0..BURST / 10).map(|_| a.forward(slot, src, LOCAL, &p)).collect();
        assert_eq!(outcomes[0], Forwarded::Passed);
        let full = outcomes.iter().filter(|&&o| o == Forwarded::InboxFull).count();
        assert!(full >= BURST / 10 - 20, "{full} of {} dropped", BURST / 10);
        assert!(started.elapsed() < FORWARD_WAIT * 20, "waited {:?}", started.elapsed());
        drop(b);
    }

    #[test]
    fn forward_headers_round_trip() {
        for (src, local) in [("10.0.0.1:4791", "10.0.0.2"), ("[fe80::1]:49152", "::1")] {
            let (src, local): (SocketAddr, IpAddr) = (src.parse().unwrap(), local.parse().unwrap());
            assert_eq!(decode_forward(&encode_forward(src, local)), Some((src, local)));
        }
        assert_eq!(decode_forward(&[9; FORWARD_HEADER]), None);
    }

    #[test]
    fn state_round_trips_and_refuses_another_version() {
        let dir = std::env::temp_dir().join(format!("softroce-state-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut state = State::default();
        state.slots.insert(3, SlotState { used: 17, inodes: vec![(LOCAL, 99), ("::1".parse().unwrap(), 100)] });
        state.slots.insert(4, SlotState { used: 18, inodes: vec![] });
        state.listeners.push((0x0106_4e20, 3));
        let group = Group { positions: vec![Some(3), None], listeners: state.listeners.clone() };
        state.groups.insert(LOCAL, group);
        state.write(&dir, 3).unwrap();
        assert_eq!(State::read(&dir).unwrap(), state);
        fs::write(dir.join("state"), "softroce-shared-port 0\n").unwrap();
        assert_eq!(State::read(&dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
        fs::remove_dir_all(&dir).unwrap();
    }
}
