//! Setup for tests of real contexts: devices on loopback addresses (each
//! test on its own free UDP port, so tests run in parallel), connected queue
//! pairs, memory contents and completion waits.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use softroce::transport::{Access, AsyncEvent, Mtu, QpType, WorkCompletion};
use softroce::verbs::{
    CompletionChannel, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, MemoryRegion,
    ProtectionDomain, QpBuilder, QueuePair,
};

pub const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
pub const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Loopback's MTU: the devices' active MTU is 4096.
pub const LINK_MTU: u32 = 65536;
/// Every access right a memory region or QP can grant.
pub const ALL_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);
/// Bytes of each memory region of a [`NodePair`]: room for a 1 MiB message at
/// an offset.
pub const MR_LEN: usize = 2 << 20;
/// What memory holds where no transfer may write.
pub const FILL: u8 = 0xa5;
/// How long a test waits for something that must happen.
pub const WAIT: Duration = Duration::from_secs(5);
/// How long a test watches for something that must not happen.
pub const QUIET: Duration = Duration::from_millis(50);

/// A UDP port that every address in `addrs` can bind.
pub fn free_port(addrs: &[IpAddr]) -> u16 {
    softroce::net::udp::free_port(addrs).unwrap()
}

/// An open device with a protection domain and one completion queue,
/// attached to a completion channel, for the sends and receives of its QPs.
pub struct Node {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub channel: CompletionChannel,
    pub cq: CompletionQueue,
}

impl Node {
    /// Opens a device on `ip` alone.
    pub fn open(name: &str, ip: IpAddr, options: ContextOptions) -> Node {
        Node::open_on(name, vec![ip], options)
    }

    /// Opens a device on `ips` (GID 1 onwards, in this order).
    pub fn open_on(name: &str, ips: Vec<IpAddr>, options: ContextOptions) -> Node {
        // A locally administered MAC: the UDP link does not use it.
        let device = Device::custom(name, ips, [2, 0, 0, 0, 0, 1], LINK_MTU);
        let ctx = Context::open(&device, options).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let channel = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(1024, Some(&channel)).unwrap();
        Node { ctx, pd, channel, cq }
    }

    /// A QP builder with the node's CQ for both queues.
    pub fn init(&self, qp_type: QpType) -> QpBuilder<'_> {
        self.pd.create_qp(qp_type, &self.cq)
    }

    pub fn qp(&self, qp_type: QpType) -> QueuePair {
        self.init(qp_type).build().unwrap()
    }

    /// A region with every access right.
    pub fn mr(&self, len: usize) -> MemoryRegion {
        self.pd.alloc_mr(len, ALL_ACCESS).unwrap()
    }
}

/// Node A on 127.0.0.1 and node B on 127.0.0.2, on a port free for both.
pub fn nodes(busy_poll: bool) -> (Node, Node) {
    let options = ContextOptions { port: free_port(&[IP_A, IP_B]), busy_poll, ..ContextOptions::default() };
    (Node::open("node_a", IP_A, options.clone()), Node::open("node_b", IP_B, options))
}

/// Options granting every remote right, with room for four READs/atomics.
pub fn options(mtu: Mtu) -> ConnectOptions {
    ConnectOptions { access: ALL_ACCESS, mtu: Some(mtu), max_rd_atomic: 4, max_dest_rd_atomic: 4, ..Default::default() }
}

/// Connects two QPs to each other through GID 1 (the address) of their devices.
pub fn connect(a: &QueuePair, b: &QueuePair, a_options: &ConnectOptions, b_options: &ConnectOptions) {
    let (ep_a, ep_b) = (a.endpoint(1).unwrap(), b.endpoint(1).unwrap());
    a.connect(&ep_b, a_options).unwrap();
    b.connect(&ep_a, b_options).unwrap();
}

/// Two nodes with one QP each, connected, and a region of [`MR_LEN`] bytes each.
pub struct NodePair {
    pub a: Node,
    pub b: Node,
    pub qp_a: QueuePair,
    pub qp_b: QueuePair,
    pub mr_a: MemoryRegion,
    pub mr_b: MemoryRegion,
}

impl NodePair {
    pub fn new(
        (a, b): (Node, Node),
        qp_type: QpType,
        a_options: &ConnectOptions,
        b_options: &ConnectOptions,
    ) -> NodePair {
        let (qp_a, qp_b) = (a.qp(qp_type), b.qp(qp_type));
        connect(&qp_a, &qp_b, a_options, b_options);
        let (mr_a, mr_b) = (a.mr(MR_LEN), b.mr(MR_LEN));
        NodePair { a, b, qp_a, qp_b, mr_a, mr_b }
    }

    /// Both sides with the same options.
    pub fn connected(qp_type: QpType, options: &ConnectOptions) -> NodePair {
        NodePair::new(nodes(false), qp_type, options, options)
    }
}

/// Sets every byte of `mr` to `byte`.
pub fn fill(mr: &MemoryRegion, byte: u8) {
    mr.write(0, &vec![byte; mr.len()]).unwrap();
}

pub fn contents(mr: &MemoryRegion) -> Vec<u8> {
    let mut bytes = vec![0; mr.len()];
    mr.read(0, &mut bytes).unwrap();
    bytes
}

/// Asserts that `mr` holds `data` at `offset` and [`FILL`] everywhere else,
/// naming the first wrong byte (regions are too large to print).
pub fn assert_holds_only(mr: &MemoryRegion, offset: usize, data: &[u8]) {
    let mut expected = vec![FILL; mr.len()];
    expected[offset..offset + data.len()].copy_from_slice(data);
    let actual = contents(mr);
    if actual != expected {
        let i = (0..actual.len()).find(|&i| actual[i] != expected[i]).expect("the contents differ");
        panic!(
            "byte {i} of the region is {:#04x}, expected {:#04x} ({} bytes expected at offset {offset})",
            actual[i],
            expected[i],
            data.len()
        );
    }
}

/// The next completion of `cq`; fails the test if none comes in [`WAIT`].
pub fn next_wc(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait_one(WAIT).expect("a completion within the wait")
}

/// Asserts that no completion arrives for [`QUIET`].
pub fn assert_no_wc(cq: &CompletionQueue) {
    assert_eq!(cq.wait_one(QUIET), None, "no completion expected");
}

/// Polls `done` until it holds; fails the test after [`WAIT`].
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits for the next asynchronous event of `ctx`.
pub fn next_async_event(ctx: &Context) -> AsyncEvent {
    let mut event = None;
    wait_for("an asynchronous event", || {
        event = ctx.poll_async_event();
        event.is_some()
    });
    event.expect("set when the wait ends")
}

/// Whether the channel's file descriptor becomes readable within `timeout`.
pub fn channel_readable(channel: &CompletionChannel, timeout: Duration) -> bool {
    let mut fd = libc::pollfd { fd: channel.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    assert!(ready >= 0, "poll: {}", std::io::Error::last_os_error());
    ready == 1 && fd.revents & libc::POLLIN != 0
}
