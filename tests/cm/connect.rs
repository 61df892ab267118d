//! RC connections by address: connect, accept, reject, refusal, data over
//! the connected QPs, disconnect from either side, and two contexts sharing
//! one port.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use softroce::cm::{CmEvent, CmEventKind, CmId, CmOptions, ConnParam, EventChannel, PortSpace};
use softroce::verbs::*;

use crate::api::{expect, local_side};
use crate::support::verbs::*;

/// TimeWait lasts seconds (the kernel's is about the QPs' ACK timeout).
const TIMEWAIT: Duration = Duration::from_secs(30);

/// A context with what a side of a connection needs.
pub struct Side {
    pub context: Context,
    pub channel: EventChannel,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub mr: MemoryRegion,
}

impl Side {
    pub fn open(name: &str, ip: IpAddr, port: u16) -> Side {
        let (context, channel) = local_side(name, ip, port);
        let pd = context.alloc_pd().unwrap();
        let cq = context.create_cq(64, None).unwrap();
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        Side { context, channel, pd, cq, mr }
    }

    /// A listening id on `ip` and a free port of `ps`.
    pub fn listen(&self, ip: IpAddr, ps: PortSpace) -> (CmId, SocketAddr) {
        let listener = CmId::new(&self.channel, ps).unwrap();
        listener.bind_addr(SocketAddr::new(ip, 0)).unwrap();
        listener.listen(8).unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    /// An id resolved to `to`, address and route.
    pub fn resolve(&self, ps: PortSpace, to: SocketAddr) -> CmId {
        let id = CmId::new(&self.channel, ps).unwrap();
        id.resolve_addr(None, to, WAIT).unwrap();
        expect(&self.channel, CmEventKind::AddrResolved);
        id.resolve_route(WAIT).unwrap();
        expect(&self.channel, CmEventKind::RouteResolved);
        id
    }

    pub fn qp(&self, id: &CmId, qp_type: QpType) -> QueuePair {
        id.create_qp(self.pd.create_qp(qp_type, &self.cq)).unwrap()
    }

    pub fn post_recv(&self, qp: &QueuePair, offset: usize) {
        qp.post_recv(RecvWr { wr_id: offset as u64, sg_list: softroce::sg_list![self.mr.sge(offset, 512)] }).unwrap();
    }

    /// SENDs `data` from offset 3000 of the region.
    pub fn send(&self, qp: &QueuePair, data: &[u8], ud: Option<UdDest>) {
        self.mr.write(3000, data).unwrap();
        let wr = SendWr { ud, ..SendWr::new(7, SendOp::Send).with_sge(self.mr.sge(3000, data.len())) };
        qp.post_send(wr).unwrap();
        assert_eq!(next_wc(&self.cq).status, WcStatus::Success);
    }
}

/// RC parameters as rping asks for them.
pub fn params(private_data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// Where a side's region is, for the peer's RDMA WRITE: address and R_Key.
fn region_of(side: &Side) -> Vec<u8> {
    let mut data = side.mr.addr().to_be_bytes().to_vec();
    data.extend_from_slice(&side.mr.rkey().to_be_bytes());
    data
}

/// The client's connect, through to the server's CONNECT_REQUEST.
fn request(client: &Side, server: &Side, to: SocketAddr, private_data: &[u8]) -> (CmId, QueuePair, CmEvent) {
    let id = client.resolve(PortSpace::Tcp, to);
    let qp = client.qp(&id, QpType::Rc);
    id.connect(&ConnParam { responder_resources: 2, initiator_depth: 3, ..params(private_data) }).unwrap();
    let request = expect(&server.channel, CmEventKind::ConnectRequest);
    (id, qp, request)
}

#[test]
fn connect_accept_and_move_data_over_the_connected_qps() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_client", IP_A, port), Side::open("cm_server", IP_B, port));
    let (listener, addr) = server.listen(IP_B, PortSpace::Tcp);
    let (id, qp, request) = request(&client, &server, addr, &region_of(&client));

    // The request: a new id, from the listener, with the client's private
    // data after the CMA header, and its resources as the kernel reports them.
    assert!(request.listen_id.as_ref().unwrap().same_as(&listener));
    let accepted = request.id.clone();
    assert_eq!(accepted.local_addr(), Some(addr));
    assert_eq!(accepted.peer_addr(), id.local_addr());
    let conn = request.conn.as_ref().unwrap();
    assert_eq!(conn.private_data.len(), 56, "a REQ's 92 bytes less the CMA header");
    assert_eq!(conn.private_data[..12], region_of(&client)[..]);
    assert_eq!((conn.responder_resources, conn.initiator_depth), (3, 2), "swapped: the peer's depth is our load");
    assert_eq!((conn.qp_num, conn.retry_count, conn.rnr_retry_count), (qp.qpn(), 7, 7));
    assert!(accepted.context().unwrap().same_as(&server.context));

    let server_qp = server.qp(&accepted, QpType::Rc);
    let (init, _) = accepted.qp_attr(QpState::Init).unwrap();
    assert_eq!(init.access_flags, Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC);
    server.post_recv(&server_qp, 0);
    accepted.accept(&params(b"welcome")).unwrap();
    assert_eq!(server_qp.state(), QpState::Rts, "RTR and RTS before the REP");

    let established = expect(&client.channel, CmEventKind::Established);
    assert!(established.id.same_as(&id));
    let reply = established.conn.unwrap();
    assert_eq!(&reply.private_data[..7], b"welcome");
    assert_eq!(reply.private_data.len(), 196);
    assert_eq!(reply.qp_num, server_qp.qpn());
    assert_eq!(qp.state(), QpState::Rts);
    expect(&server.channel, CmEventKind::Established);

    // What the CM set: each QP sends to the other from the PSN it announced.
    let (client_rtr, _) = id.qp_attr(QpState::Rtr).unwrap();
    let (server_rts, _) = accepted.qp_attr(QpState::Rts).unwrap();
    assert_eq!((client_rtr.dest_qpn, qp.query().dest_qpn), (server_qp.qpn(), server_qp.qpn()));
    assert_eq!(server_qp.query().dest_qpn, qp.qpn());
    assert_eq!(server_rts.sq_psn, client_rtr.rq_psn);
    assert_eq!((client_rtr.min_rnr_timer, qp.query().timeout), (0, 19));

    // A SEND each way of the data path, and an RDMA WRITE into the client.
    client.send(&qp, b"ping", None);
    let wc = next_wc(&server.cq);
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::Recv, 4));
    let mut landed = [0u8; 4];
    server.mr.read(0, &mut landed).unwrap();
    assert_eq!(&landed, b"ping");
    server.mr.write(100, b"pong").unwrap();
    let write = SendOp::RdmaWrite { remote_addr: client.mr.addr() + 200, rkey: client.mr.rkey() };
    server_qp.post_send(SendWr::new(9, write).with_sge(server.mr.sge(100, 4))).unwrap();
    assert_eq!(next_wc(&server.cq).status, WcStatus::Success);
    client.mr.read(200, &mut landed).unwrap();
    assert_eq!(&landed, b"pong");
}

#[test]
fn a_rejection_carries_the_reason_and_private_data() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_rej_client", IP_A, port), Side::open("cm_rej_server", IP_B, port));
    let (_listener, addr) = server.listen(IP_B, PortSpace::Tcp);
    let (id, qp, request) = request(&client, &server, addr, b"may I?");
    request.id.reject(b"go away").unwrap();
    assert!(request.id.accept(&params(&[])).is_err(), "rejected already");
    let event = client.channel.get_event(Some(WAIT)).unwrap();
    assert!(event.id.same_as(&id));
    assert_eq!((event.kind, event.status), (CmEventKind::Rejected, 28), "consumer-defined");
    assert_eq!(&event.conn.unwrap().private_data[..7], b"go away");
    assert_eq!(qp.state(), QpState::Err);
}

#[test]
fn a_port_nobody_listens_on_rejects_with_status_8() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_closed_client", IP_A, port), Side::open("cm_closed_server", IP_B, port));
    // The server's CM runs (it listens elsewhere), but not on this port.
    let (_listener, addr) = server.listen(IP_B, PortSpace::Tcp);
    let closed = SocketAddr::new(IP_B, addr.port().wrapping_add(1).max(1));
    let id = client.resolve(PortSpace::Tcp, closed);
    client.qp(&id, QpType::Rc);
    id.connect(&params(&[])).unwrap();
    let event = client.channel.get_event(Some(WAIT)).unwrap();
    assert_eq!((event.kind, event.status), (CmEventKind::Rejected, 8), "invalid service ID");
    assert!(server.channel.try_get_event().is_none());
}

/// A connected pair: the client's id and QP, the server's.
fn connected(client: &Side, server: &Side) -> (CmId, QueuePair, CmId, QueuePair) {
    let (_listener, addr) = server.listen(IP_B, PortSpace::Tcp);
    let (id, qp, request) = request(client, server, addr, &[]);
    let server_qp = server.qp(&request.id, QpType::Rc);
    request.id.accept(&params(&[])).unwrap();
    expect(&client.channel, CmEventKind::Established);
    expect(&server.channel, CmEventKind::Established);
    (id, qp, request.id, server_qp)
}

#[test]
fn the_active_side_disconnects() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_dc_client", IP_A, port), Side::open("cm_dc_server", IP_B, port));
    let (id, qp, accepted, server_qp) = connected(&client, &server);
    server.post_recv(&server_qp, 0);
    id.disconnect().unwrap();
    assert_eq!(qp.state(), QpState::Err);
    // The server hears of it at once; its QP is the program's to stop.
    let event = expect(&server.channel, CmEventKind::Disconnected);
    assert!(event.id.same_as(&accepted));
    assert_eq!(server_qp.state(), QpState::Rts);
    accepted.disconnect().unwrap();
    assert_eq!(server_qp.state(), QpState::Err);
    // Its posted receive is flushed at once, with no packet or timer to
    // bring the engine to the QP (rping's completion thread waits for it).
    let flushed = server.cq.wait_one(WAIT).expect("the receive is flushed");
    assert_eq!(flushed.status, WcStatus::WrFlushErr);
    expect(&client.channel, CmEventKind::Disconnected);
    assert!(id.disconnect().is_err(), "down already");
    for channel in [&client.channel, &server.channel] {
        let event = channel.get_event(Some(TIMEWAIT)).expect("TimeWait ends");
        assert_eq!((event.kind, event.status), (CmEventKind::TimewaitExit, 0));
    }
}

#[test]
fn the_passive_side_disconnects() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_pdc_client", IP_A, port), Side::open("cm_pdc_server", IP_B, port));
    let (id, _qp, accepted, _server_qp) = connected(&client, &server);
    accepted.disconnect().unwrap();
    let event = expect(&client.channel, CmEventKind::Disconnected);
    assert!(event.id.same_as(&id));
    id.disconnect().unwrap();
    expect(&server.channel, CmEventKind::Disconnected);
    for channel in [&client.channel, &server.channel] {
        let event = channel.get_event(Some(TIMEWAIT)).expect("TimeWait ends");
        assert_eq!(event.kind, CmEventKind::TimewaitExit);
    }
}

#[test]
fn without_a_qp_the_program_moves_its_own_and_establishes() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_own_client", IP_A, port), Side::open("cm_own_server", IP_B, port));
    let (_listener, addr) = server.listen(IP_B, PortSpace::Tcp);
    let id = client.resolve(PortSpace::Tcp, addr);
    let qp = client.pd.create_qp(QpType::Rc, &client.cq).build().unwrap();
    id.connect(&ConnParam { qp_num: qp.qpn(), ..params(&[]) }).unwrap();
    let request = expect(&server.channel, CmEventKind::ConnectRequest);
    assert_eq!(request.conn.as_ref().unwrap().qp_num, qp.qpn());
    let server_qp = server.qp(&request.id, QpType::Rc);
    server.post_recv(&server_qp, 0);
    request.id.accept(&params(&[])).unwrap();
    let response = expect(&client.channel, CmEventKind::ConnectResponse);
    assert_eq!(response.conn.unwrap().qp_num, server_qp.qpn());
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (attr, mask) = id.qp_attr(state).unwrap();
        qp.modify(&attr, mask).unwrap();
    }
    id.establish().unwrap();
    expect(&server.channel, CmEventKind::Established);
    client.send(&qp, b"moved by hand", None);
    assert_eq!(next_wc(&server.cq).byte_len, 13);
}

#[test]
fn two_contexts_on_one_shared_port_connect() {
    // Two processes' worth: one address, one port, two slots.
    let port = free_port(&[IP_A]);
    let (client, server) = (Side::open("cm_shared_client", IP_A, port), Side::open("cm_shared_server", IP_A, port));
    assert_ne!(client.context.slot(), server.context.slot());
    let (_listener, addr) = server.listen(IP_A, PortSpace::Tcp);
    let (id, qp, request) = request(&client, &server, addr, b"neighbour");
    assert_eq!(&request.conn.as_ref().unwrap().private_data[..9], b"neighbour");
    let server_qp = server.qp(&request.id, QpType::Rc);
    server.post_recv(&server_qp, 0);
    request.id.accept(&params(&[])).unwrap();
    expect(&client.channel, CmEventKind::Established);
    expect(&server.channel, CmEventKind::Established);
    client.send(&qp, b"next door", None);
    assert_eq!(next_wc(&server.cq).byte_len, 9);
    drop(id);
}

#[test]
fn a_wildcard_listener_takes_requests_to_its_device() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_any_client", IP_A, port), Side::open("cm_any_server", IP_B, port));
    let listener = CmId::new(&server.channel, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new([0u8; 4].into(), 0)).unwrap();
    assert!(listener.context().is_none(), "a wildcard names no device");
    listener.listen(1).unwrap();
    assert!(listener.context().unwrap().same_as(&server.context));
    let to = SocketAddr::new(IP_B, listener.local_addr().unwrap().port());
    let (id, _qp, request) = request(&client, &server, to, &[]);
    assert_eq!(request.id.local_addr(), Some(to), "the address the client asked for");
    let _server_qp = server.qp(&request.id, QpType::Rc);
    request.id.accept(&params(&[])).unwrap();
    assert!(expect(&client.channel, CmEventKind::Established).id.same_as(&id));
}

#[test]
fn many_connections_at_once_all_establish() {
    const N: usize = 24;
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_many_client", IP_A, port), Side::open("cm_many_server", IP_B, port));
    // Room for every request at once: past the backlog a REQ is dropped
    // unanswered, as the kernel's ucma does, for its retry (seconds) later.
    let listener = CmId::new(&server.channel, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(IP_B, 0)).unwrap();
    listener.listen(N as u32).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut ids = Vec::new();
    for n in 0..N {
        let id = CmId::new(&client.channel, PortSpace::Tcp).unwrap();
        id.resolve_addr(None, addr, WAIT).unwrap();
        id.resolve_route(WAIT).unwrap();
        let qp = client.qp(&id, QpType::Rc);
        id.connect(&params(&[n as u8])).unwrap();
        ids.push((id, qp));
    }
    // The server accepts as requests come, each known by its first byte,
    // while the RTUs of those it accepted already come in between.
    let (mut accepted, mut server_established) = (Vec::new(), 0);
    let mut seen = [false; N];
    while server_established < N {
        let event = server.channel.get_event(Some(WAIT)).expect("an event");
        if event.kind == CmEventKind::Established {
            server_established += 1;
            continue;
        }
        assert_eq!(event.kind, CmEventKind::ConnectRequest);
        let n = event.conn.as_ref().unwrap().private_data[0] as usize;
        assert!(!std::mem::replace(&mut seen[n], true), "request {n} came twice");
        let qp = server.qp(&event.id, QpType::Rc);
        event.id.accept(&params(&[n as u8])).unwrap();
        accepted.push((event.id, qp));
    }
    assert_eq!(accepted.len(), N);
    let mut established = 0;
    while established < N {
        let event = client.channel.get_event(Some(WAIT)).expect("an event");
        match event.kind {
            CmEventKind::AddrResolved | CmEventKind::RouteResolved => continue,
            kind => assert_eq!((kind, event.status), (CmEventKind::Established, 0)),
        }
        let n = event.conn.unwrap().private_data[0] as usize;
        assert!(event.id.same_as(&ids[n].0), "the answer reaches the id that asked");
        established += 1;
    }
}

#[test]
fn a_peer_that_never_answers_is_unreachable_after_the_retries() {
    let port = free_port(&[IP_A]);
    let device = Device::custom("cm_unanswered", vec![IP_A], [2, 0, 0, 0, 0, 1], LINK_MTU);
    let context = Context::open(&device, ContextOptions { port, ..ContextOptions::default() }).unwrap();
    // Each wait is the response timeout (4.096 µs × 2^10 ≈ 4 ms here) and the
    // path's ACK timeout (about 2 s); one resend. With the kernel's timeout
    // and 15 resends it would take over a minute.
    let options = CmOptions { response_timeout: 10, max_cm_retries: 1, ..CmOptions::with_context(&context) };
    let channel = EventChannel::with_options(options).unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    // Nothing holds 127.0.0.3's RoCE port: the REQ goes unanswered.
    let nobody = SocketAddr::new(IpAddr::from([127, 0, 0, 3]), 7471);
    id.resolve_addr(None, nobody, WAIT).unwrap();
    expect(&channel, CmEventKind::AddrResolved);
    id.resolve_route(WAIT).unwrap();
    expect(&channel, CmEventKind::RouteResolved);
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(4, None).unwrap();
    let qp = id.create_qp(pd.create_qp(QpType::Rc, &cq)).unwrap();
    id.connect(&params(&[])).unwrap();
    let event = channel.get_event(Some(TIMEWAIT)).expect("the protocol gives up");
    assert_eq!((event.kind, event.status), (CmEventKind::Unreachable, -libc::ETIMEDOUT));
    assert_eq!(qp.state(), QpState::Err);
}
