//! CM ids (`rdma_cm_id`): an endpoint that binds, resolves, listens or
//! connects, with the QP it moves through its states as librdmacm over the
//! kernel's rdma_cm does.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::addr::{self, PortBinding};
use super::channel::ChannelShared;
use super::protocol::{CommId, ConnectReply, ConnectRequest, Event, MadPeer, SidrReply, SidrRequest};
use super::service::{Service, State};
use super::{
    protocol_error, CmEvent, CmEventKind, CmOptions, ConnParam, EventChannel, PortSpace, Route, UdParam, RDMA_UDP_QKEY,
};
use crate::transport::{Access, AttrMask, Mtu, QpAttr, QpState, QpType};
use crate::verbs::{Context, Error, Gid, QpBuilder, QpController, QueuePair, Result, GSI_QPN};
use crate::wire::cm::{RejReason, ReqRepr, SidrReqRepr, SidrStatus, REP_PRIVATE_DATA_LEN, SIDR_REP_PRIVATE_DATA_LEN};
use crate::wire::cma::{CmaHeader, CmaHeaderRepr, CMA_HEADER_LEN, MAX_REQ_USER_DATA, MAX_SIDR_REQ_USER_DATA};
use crate::wire::BthRepr;
use crate::wire::Psn;

/// The local ACK timeout of a connection's QPs, and the one a REQ's path
/// carries: the kernel's over RoCE (packet lifetime 18, plus one), as in
/// `tests/data/cm/rping.pcap`.
const LOCAL_ACK_TIMEOUT: u8 = 19;
/// The hop limit of a RoCE route's path, as the kernel's REQ carries it.
const HOP_LIMIT: u8 = 64;
/// The default P_Key, the only one.
const DEFAULT_PKEY: u16 = 0xffff;
/// librdmacm's "as many as the device allows" for responder resources and
/// initiator depth (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`).
const AS_MANY_AS_POSSIBLE: u8 = 0xff;

/// An rdma_cm id. Clones are the same id; it goes away (rejecting or
/// disconnecting what it has open, as `rdma_destroy_id` does) when the last
/// clone and the last event about it are dropped.
#[derive(Debug, Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

#[derive(Debug)]
pub(super) struct IdInner {
    ps: PortSpace,
    options: CmOptions,
    channel: Mutex<Weak<ChannelShared>>,
    state: Mutex<IdState>,
}

/// Where an id is in its life, as the kernel's `rdma_cm_state` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listening,
    /// Our REQ or SIDR_REQ is out.
    Connecting,
    /// A peer's REQ or SIDR_REQ waits for accept or reject.
    RequestReceived,
    /// Our REP is out; the RTU will establish.
    Accepted,
    /// The peer's REP came and the id had no QP: the program moves its own
    /// and calls establish.
    ReplyReceived,
    Connected,
    /// Our DREQ is out.
    Disconnecting,
    /// The peer's DREQ came; disconnect answers it.
    DisconnectRequested,
    /// The connection is down; TimeWait runs.
    TimeWait,
    /// Rejected, unreachable, past TimeWait, or a UD exchange done.
    Done,
}

#[derive(Debug, Default)]
struct IdState {
    phase: Phase,
    /// The CM services of the id's devices: one once bound to an address
    /// or resolved; every device's for a wildcard listen.
    services: Vec<Arc<Service>>,
    binding: Option<PortBinding>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    route: Option<Route>,
    /// The peer's GSI QP.
    peer_gsi: Option<MadPeer>,
    comm_id: Option<CommId>,
    listening: Option<u64>,
    qp: Option<(QpController, QpType)>,
    link: Option<Link>,
    /// Multicast groups joined.
    groups: Vec<IpAddr>,
}

/// What the two sides agreed on for the QPs.
#[derive(Debug, Clone, Copy)]
struct Link {
    remote_qpn: u32,
    /// The PSN our QP expects first: the starting PSN we announced.
    rq_psn: Psn,
    /// The PSN our QP sends first: the starting PSN the peer announced.
    sq_psn: Psn,
    path_mtu: Mtu,
    /// READ/atomic requests we accept at once (max_dest_rd_atomic).
    responder_resources: u8,
    /// READ/atomic requests we send at once (max_rd_atomic).
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
}

impl CmId {
    /// `rdma_create_id`: an id of port space `ps` whose events go to `channel`.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let inner = IdInner {
            ps,
            options: channel.shared.options.clone(),
            channel: Mutex::new(Arc::downgrade(&channel.shared)),
            state: Mutex::new(IdState::default()),
        };
        Ok(CmId { inner: Arc::new(inner) })
    }

    fn state(&self) -> MutexGuard<'_, IdState> {
        self.inner.lock()
    }

    /// `rdma_bind_addr`: takes `addr`'s port (0: a free one) in the id's port
    /// space; an address other than the wildcard also picks its device.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let services = match addr.ip().is_unspecified() {
            true => Vec::new(),
            false => {
                let options = &self.inner.options;
                vec![Service::of(&addr::context_holding(addr.ip(), options)?, options)?]
            }
        };
        let mut state = self.state();
        expect_phase(&state, &[Phase::Idle], "bind")?;
        let binding = PortBinding::bind(self.inner.ps, addr.ip(), addr.port())?;
        state.local = Some(binding.socket_addr());
        state.binding = Some(binding);
        state.services = services;
        state.phase = Phase::AddrBound;
        Ok(())
    }

    /// `rdma_resolve_addr`: finds the source address for `dst` (`src`, the
    /// bound one, or the one the kernel's routing picks) and its device,
    /// binding a free port if the id has none. Resolved at once: the
    /// ADDR_RESOLVED or ADDR_ERROR event is queued before this returns, so
    /// librdmacm's timeout is never reached.
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, _timeout: Duration) -> Result<()> {
        if dst.ip().is_unspecified() {
            return Err(Error::InvalidArgument("resolve_addr to the wildcard address".into()));
        }
        let phase = self.state().phase;
        match phase {
            Phase::Idle => {
                let any = SocketAddr::new(if dst.is_ipv4() { [0u8; 4].into() } else { [0u16; 8].into() }, 0);
                self.bind_addr(src.unwrap_or(any))?;
            }
            Phase::AddrBound => {}
            _ => return Err(Error::InvalidArgument(format!("resolve_addr on an id that is {phase:?}"))),
        }
        let bound = self.state().local.ok_or_else(|| Error::InvalidArgument("resolve_addr on an unbound id".into()))?;
        let options = &self.inner.options;
        let source = match bound.ip().is_unspecified() {
            false => Ok(bound.ip()),
            true => addr::source_for(dst.ip(), options),
        };
        let resolved = source.and_then(|ip| Ok((ip, Service::of(&addr::context_holding(ip, options)?, options)?)));
        let mut state = self.state();
        state.peer = Some(dst);
        let (kind, status) = match resolved {
            Ok((ip, service)) => {
                state.local = Some(SocketAddr::new(ip, bound.port()));
                state.services = vec![service];
                state.phase = Phase::AddrResolved;
                (CmEventKind::AddrResolved, 0)
            }
            Err(e) => (CmEventKind::AddrError, -e.errno()),
        };
        drop(state);
        self.inner.deliver(self.event(kind, status));
        Ok(())
    }

    /// `rdma_resolve_route`: the path to the resolved peer. RoCE has no
    /// subnet manager to ask; the route is the addresses' GIDs and the
    /// device's MTU, and ROUTE_RESOLVED is queued before this returns (so
    /// librdmacm's timeout is never reached).
    pub fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        let mut state = self.state();
        expect_phase(&state, &[Phase::AddrResolved], "resolve_route")?;
        let (Some(local), Some(peer), Some(service)) = (state.local, state.peer, state.services.first()) else {
            return Err(Error::InvalidArgument("resolve_route before resolve_addr".into()));
        };
        let dgid = Gid::from_ip(peer.ip());
        state.route = Some(Route {
            sgid: Gid::from_ip(local.ip()),
            dgid,
            path_mtu: service.context.device().active_mtu(),
            pkey: DEFAULT_PKEY,
            hop_limit: HOP_LIMIT,
            traffic_class: 0,
        });
        state.peer_gsi = Some(MadPeer { gid: dgid, qpn: GSI_QPN });
        state.phase = Phase::RouteResolved;
        drop(state);
        self.inner.deliver(self.event(CmEventKind::RouteResolved, 0));
        Ok(())
    }

    /// `rdma_listen`: connection requests to the bound address and port
    /// (every device's for a wildcard) come to this id as CONNECT_REQUEST
    /// events. An unbound id listens on a free port of every address.
    pub fn listen(&self, backlog: u32) -> Result<()> {
        if self.state().phase == Phase::Idle {
            self.bind_addr(SocketAddr::new([0u8; 4].into(), 0))?;
        }
        let (local, mut services) = {
            let state = self.state();
            expect_phase(&state, &[Phase::AddrBound], "listen")?;
            (
                state.local.ok_or_else(|| Error::InvalidArgument("listen on an unbound id".into()))?,
                state.services.clone(),
            )
        };
        if services.is_empty() {
            let contexts = addr::contexts_of_family(local.is_ipv4(), &self.inner.options)?;
            services = contexts.iter().map(|c| Service::of(c, &self.inner.options)).collect::<Result<_>>()?;
        }
        let service_id = self.inner.ps.service_id(local.port());
        for (n, service) in services.iter().enumerate() {
            let listened = service.with_state(|state, _| {
                state.protocol.listen(service_id, backlog).map_err(protocol_error)?;
                state.listeners.insert(service_id, Arc::downgrade(&self.inner));
                Ok(())
            });
            if let Err(e) = listened {
                for earlier in &services[..n] {
                    unlisten(earlier, service_id);
                }
                return Err(e);
            }
            // Without a shared port every REQ reaches this process anyway.
            if let Err(e) = service.context.listen_cm(service_id as u32) {
                tracing::debug!("CM service {service_id:#x} not steered here: {e}");
            }
        }
        let mut state = self.state();
        state.services = services;
        state.listening = Some(service_id);
        state.phase = Phase::Listening;
        Ok(())
    }

    /// `rdma_create_qp`: builds the QP on the id's context, brings it to
    /// INIT (UD QPs on to RTS) and hands it to the id, which moves it from
    /// then on. The caller owns it; dropping it detaches it.
    pub fn create_qp(&self, builder: QpBuilder<'_>) -> Result<QueuePair> {
        let qp = builder.build()?;
        self.attach_qp(&qp)?;
        Ok(qp)
    }

    /// Hands the id a QP built elsewhere on its context (the C ABI's
    /// `rdma_create_qp`), as [`CmId::create_qp`] does with its own.
    pub fn attach_qp(&self, qp: &QueuePair) -> Result<()> {
        let context = self.context().ok_or_else(|| Error::InvalidArgument("the id has no device yet".into()))?;
        if !qp.belongs_to(&context) {
            return Err(Error::InvalidArgument("the QP belongs to another device's context".into()));
        }
        let qp_type = qp.qp_type();
        let fits = match self.inner.ps {
            PortSpace::Tcp => qp_type == QpType::Rc,
            PortSpace::Udp | PortSpace::IpoIb => qp_type == QpType::Ud,
            PortSpace::Ib => true,
        };
        if !fits {
            return Err(Error::InvalidArgument(format!("a {qp_type:?} QP in port space {}", self.inner.ps.name())));
        }
        let controller = qp.controller();
        let mut state = self.state();
        if state.qp.is_some() {
            return Err(Error::InvalidArgument("the id has a QP already".into()));
        }
        let (attr, mask) = self.inner.qp_attr(&state, qp_type, QpState::Init)?;
        controller.modify(&attr, mask)?;
        if qp_type == QpType::Ud {
            // librdmacm's ucma_init_ud_qp: straight on to RTS, sending from PSN 0.
            controller.modify(&QpAttr { state: QpState::Rtr, ..attr }, AttrMask::STATE)?;
            let rts = QpAttr { state: QpState::Rts, sq_psn: Psn::new(0), ..attr };
            controller.modify(&rts, AttrMask::STATE | AttrMask::SQ_PSN)?;
            // Groups joined before the QP came.
            for &group in &state.groups {
                controller.multicast(group, true)?;
            }
        }
        state.qp = Some((controller, qp_type));
        Ok(())
    }

    /// `rdma_destroy_qp`, for the id's side: it no longer moves the QP.
    pub fn detach_qp(&self) {
        self.state().qp = None;
    }

    /// `rdma_connect`: sends a REQ to the resolved peer, or for a UD id (UDP
    /// and IPoIB port spaces, or a UD QP in the IB one) a SIDR_REQ; the
    /// program's private data follows the CMA header, 56 bytes at most (180
    /// for SIDR). `param.qp_num` stands for the QP if the id has none.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let result = self.connect_untraced(param);
        self.trace_call("rdma_connect", param, &result);
        result
    }

    fn connect_untraced(&self, param: &ConnParam) -> Result<()> {
        let service = self.service()?;
        service.with_state(|protocol_state, now| {
            let mut state = self.state();
            expect_phase(&state, &[Phase::RouteResolved], "connect")?;
            let (Some(local), Some(peer), Some(route), Some(peer_gsi)) =
                (state.local, state.peer, state.route, state.peer_gsi)
            else {
                return Err(Error::InvalidArgument("connect before resolve_route".into()));
            };
            // The kernel's cma_connect: UD ids resolve their peer by SIDR.
            let ud = match self.inner.ps {
                PortSpace::Udp | PortSpace::IpoIb => true,
                PortSpace::Tcp => false,
                PortSpace::Ib => state.qp.as_ref().is_some_and(|(_, t)| *t == QpType::Ud),
            };
            let max = if ud { MAX_SIDR_REQ_USER_DATA } else { MAX_REQ_USER_DATA };
            if param.private_data.len() > max {
                let len = param.private_data.len();
                return Err(Error::InvalidArgument(format!("{len} bytes of private data (at most {max})")));
            }
            let header = CmaHeaderRepr { src_port: local.port(), src: local.ip(), dst: peer.ip() };
            let mut private_data = vec![0u8; CMA_HEADER_LEN];
            header
                .emit(&mut CmaHeader::new_unchecked(&mut private_data[..]))
                .map_err(|e| Error::InvalidArgument(format!("addresses {} and {}: {e}", local.ip(), peer.ip())))?;
            private_data.extend_from_slice(&param.private_data);
            let service_id = self.inner.ps.service_id(peer.port());
            let comm_id = if ud {
                let request = SidrRequest { peer: peer_gsi, service_id, pkey: DEFAULT_PKEY, private_data };
                protocol_state.protocol.sidr_request(now, request).map_err(protocol_error)?
            } else {
                let qp_type = state.qp.as_ref().map_or(QpType::Rc, |(_, t)| *t);
                let qpn = state.qp.as_ref().map_or(param.qp_num, |(qp, _)| qp.qpn());
                let device_max = max_rd_atomic(&service.context);
                let link = Link {
                    remote_qpn: 0,
                    rq_psn: Psn::new(crate::random_u32()),
                    sq_psn: Psn::new(0),
                    path_mtu: route.path_mtu,
                    responder_resources: clamp(param.responder_resources, device_max),
                    initiator_depth: clamp(param.initiator_depth, device_max),
                    retry_count: param.retry_count.min(7),
                    rnr_retry_count: param.rnr_retry_count.min(7),
                };
                let request = ConnectRequest {
                    peer: peer_gsi,
                    service_id,
                    local_gid: route.sgid,
                    qpn,
                    qp_type,
                    starting_psn: link.rq_psn,
                    path_mtu: link.path_mtu,
                    responder_resources: link.responder_resources,
                    initiator_depth: link.initiator_depth,
                    retry_count: link.retry_count,
                    rnr_retry_count: link.rnr_retry_count,
                    local_ack_timeout: LOCAL_ACK_TIMEOUT,
                    srq: param.srq,
                    flow_control: param.flow_control,
                    traffic_class: route.traffic_class,
                    hop_limit: route.hop_limit,
                    flow_label: 0,
                    pkey: route.pkey,
                    private_data,
                };
                let comm_id = protocol_state.protocol.connect(now, request).map_err(protocol_error)?;
                state.link = Some(link);
                comm_id
            };
            protocol_state.ids.insert(comm_id, Arc::downgrade(&self.inner));
            state.comm_id = Some(comm_id);
            state.phase = Phase::Connecting;
            Ok(())
        })
    }

    /// `rdma_accept`: answers a CONNECT_REQUEST. RC: the QP goes to RTR and
    /// RTS, then the REP leaves; the RTU brings ESTABLISHED. UD: the
    /// SIDR_REP names the QP and the Q_Key (RDMA_UDP_QKEY in the UDP port
    /// space); no event follows.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let result = self.accept_untraced(param);
        self.trace_call("rdma_accept", param, &result);
        result
    }

    fn accept_untraced(&self, param: &ConnParam) -> Result<()> {
        let service = self.service()?;
        service.with_state(|protocol_state, now| {
            let mut state = self.state();
            expect_phase(&state, &[Phase::RequestReceived], "accept")?;
            let comm_id = state.comm_id.ok_or_else(|| Error::InvalidArgument("no request to accept".into()))?;
            let qpn = state.qp.as_ref().map_or(param.qp_num, |(qp, _)| qp.qpn());
            let Some(mut link) = state.link else {
                // A SIDR request.
                if param.private_data.len() > SIDR_REP_PRIVATE_DATA_LEN {
                    return Err(Error::InvalidArgument("more than 136 bytes of SIDR_REP private data".into()));
                }
                let qkey = if self.inner.ps == PortSpace::Ib { param.qkey } else { RDMA_UDP_QKEY };
                let reply =
                    SidrReply { status: SidrStatus::SUCCESS, qpn, qkey, private_data: param.private_data.clone() };
                protocol_state.protocol.sidr_reply(now, comm_id, reply).map_err(protocol_error)?;
                protocol_state.ids.remove(&comm_id);
                state.comm_id = None;
                state.phase = Phase::Done;
                return Ok(());
            };
            if param.private_data.len() > REP_PRIVATE_DATA_LEN {
                return Err(Error::InvalidArgument("more than 196 bytes of REP private data".into()));
            }
            let device_max = max_rd_atomic(&service.context);
            link.responder_resources = clamp(param.responder_resources, device_max);
            link.initiator_depth = clamp(param.initiator_depth, device_max);
            state.link = Some(link);
            if let Err(e) = self.inner.move_qp_to_rts(&state) {
                self.inner.move_qp_to_error(&state);
                return Err(e);
            }
            let reply = ConnectReply {
                qpn,
                starting_psn: link.rq_psn,
                responder_resources: link.responder_resources,
                initiator_depth: link.initiator_depth,
                rnr_retry_count: param.rnr_retry_count.min(7),
                srq: param.srq,
                flow_control: param.flow_control,
                private_data: param.private_data.clone(),
            };
            protocol_state.protocol.accept(now, comm_id, reply).map_err(protocol_error)?;
            state.phase = Phase::Accepted;
            Ok(())
        })
    }

    /// `rdma_reject`: refuses a CONNECT_REQUEST with the consumer-defined
    /// reason (28), or a SIDR request with status "rejected", carrying
    /// `private_data` to the peer.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let service = self.service()?;
        service.with_state(|protocol_state, now| {
            let mut state = self.state();
            expect_phase(&state, &[Phase::RequestReceived], "reject")?;
            let comm_id = state.comm_id.ok_or_else(|| Error::InvalidArgument("no request to reject".into()))?;
            let refused = match state.link {
                Some(_) => protocol_state.protocol.reject(now, comm_id, RejReason::CONSUMER_DEFINED, private_data),
                None => {
                    let reply =
                        SidrReply { status: SidrStatus::REJECT, qpn: 0, qkey: 0, private_data: private_data.to_vec() };
                    protocol_state.protocol.sidr_reply(now, comm_id, reply)
                }
            };
            refused.map_err(protocol_error)?;
            protocol_state.ids.remove(&comm_id);
            state.comm_id = None;
            state.phase = Phase::Done;
            Ok(())
        })
    }

    /// `rdma_establish`: after a CONNECT_RESPONSE, once the program moved its
    /// QP to RTS, sends the RTU.
    pub fn establish(&self) -> Result<()> {
        let service = self.service()?;
        service.with_state(|protocol_state, now| {
            let mut state = self.state();
            expect_phase(&state, &[Phase::ReplyReceived], "establish")?;
            let comm_id = state.comm_id.ok_or_else(|| Error::InvalidArgument("no connection".into()))?;
            protocol_state.protocol.ready_to_use(now, comm_id, &[]).map_err(protocol_error)?;
            state.phase = Phase::Connected;
            Ok(())
        })
    }

    /// `rdma_disconnect`: the QP goes to ERR and a DREQ leaves (or, if the
    /// peer's came first, the DREP that answers it). DISCONNECTED follows
    /// when the peer answers; TIMEWAIT_EXIT after TimeWait.
    pub fn disconnect(&self) -> Result<()> {
        let service = self.service()?;
        service.with_state(|protocol_state, now| {
            let mut state = self.state();
            let phases = [Phase::Connected, Phase::Accepted, Phase::ReplyReceived, Phase::DisconnectRequested];
            expect_phase(&state, &phases, "disconnect")?;
            let comm_id = state.comm_id.ok_or_else(|| Error::InvalidArgument("no connection".into()))?;
            self.inner.move_qp_to_error(&state);
            protocol_state.protocol.disconnect(now, comm_id, &[]).map_err(protocol_error)?;
            state.phase = match state.phase {
                Phase::DisconnectRequested => Phase::TimeWait,
                _ => Phase::Disconnecting,
            };
            Ok(())
        })
    }

    /// `rdma_migrate_id`: the id's events go to `channel` from now on.
    pub fn migrate(&self, channel: &EventChannel) -> Result<()> {
        *self.inner.channel.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&channel.shared);
        Ok(())
    }

    /// Writes a connection call into the trace of the id's device, if traced.
    fn trace_call(&self, name: &str, param: &ConnParam, result: &Result<()>) {
        let Some(context) = self.context() else { return };
        let Some(trace) = context.tracer() else { return };
        let outcome = match result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {e}"),
        };
        let peer = self.peer_addr().map_or_else(|| "-".to_string(), |a| a.to_string());
        let qpn = self.state().qp.as_ref().map_or(param.qp_num, |(qp, _)| qp.qpn());
        trace.call(
            name,
            format_args!(
                "local={} peer={peer} qp={:#x} responder_resources={} initiator_depth={} retry_count={} \
                 rnr_retry_count={} private_data_len={} -> {outcome}",
                self.local_addr().map_or_else(|| "-".to_string(), |a| a.to_string()),
                qpn,
                param.responder_resources,
                param.initiator_depth,
                param.retry_count,
                param.rnr_retry_count,
                param.private_data.len()
            ),
        );
    }

    /// The verbs context of the id's device, once it is bound to an address
    /// or resolved: the process's one context of that device (`cm_id->verbs`).
    pub fn context(&self) -> Option<Context> {
        self.state().services.first().map(|s| s.context.clone())
    }

    /// `rdma_init_qp_attr`: the attributes and mask that move the id's QP
    /// (or one the program moves itself) to `qp_state`.
    pub fn qp_attr(&self, qp_state: QpState) -> Result<(QpAttr, AttrMask)> {
        let state = self.state();
        let qp_type = match (&state.qp, self.inner.ps) {
            (Some((_, t)), _) => *t,
            (None, PortSpace::Udp | PortSpace::IpoIb) => QpType::Ud,
            (None, _) => QpType::Rc,
        };
        self.inner.qp_attr(&state, qp_type, qp_state)
    }

    /// The id's own address: bound, resolved, or from the connection request.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.state().local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.state().peer
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// The path, once resolved (or, for an id from a connection request, from the REQ).
    pub fn route(&self) -> Option<Route> {
        self.state().route
    }

    /// Whether both are the same id.
    pub fn same_as(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn service(&self) -> Result<Arc<Service>> {
        let state = self.state();
        state.services.first().cloned().ok_or_else(|| Error::InvalidArgument("the id has no device yet".into()))
    }

    /// `rdma_join_multicast`: joins IPv4 multicast group `group` on the id's
    /// device and attaches the id's UD QP to it (rxe-spec M-72). RoCE has no
    /// subnet administrator to ask: as the kernel's `cma_iboe_join_multicast`,
    /// the group's GID is its IPv4-mapped address and its Q_Key
    /// RDMA_UDP_QKEY. MULTICAST_JOIN, with the address handle, QPN 0xffffff
    /// and Q_Key to send to the group, is queued before this returns.
    pub fn join_multicast(&self, group: IpAddr) -> Result<()> {
        if !group.is_ipv4() || !group.is_multicast() {
            return Err(Error::InvalidArgument(format!("{group} is no IPv4 multicast group")));
        }
        if self.inner.ps == PortSpace::Tcp {
            return Err(Error::InvalidArgument("multicast groups are for datagram port spaces".into()));
        }
        let mut state = self.state();
        expect_phase(&state, &[Phase::AddrBound, Phase::AddrResolved, Phase::RouteResolved], "join_multicast")?;
        if state.services.is_empty() {
            return Err(Error::InvalidArgument("join_multicast on an id with no device".into()));
        }
        if let Some((qp, _)) = &state.qp {
            qp.multicast(group, true)?;
        }
        if !state.groups.contains(&group) {
            state.groups.push(group);
        }
        drop(state);
        let ud = UdParam {
            private_data: Vec::new(),
            dgid: Gid::from_ip(group),
            qp_num: BthRepr::MULTICAST_QPN,
            qkey: RDMA_UDP_QKEY,
        };
        self.inner.deliver(CmEvent { ud: Some(ud), ..self.event(CmEventKind::MulticastJoin, 0) });
        Ok(())
    }

    /// `rdma_leave_multicast`: detaches the id's QP from a group it joined.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<()> {
        let mut state = self.state();
        let Some(at) = state.groups.iter().position(|g| *g == group) else {
            return Err(Error::InvalidArgument(format!("the id has not joined {group}")));
        };
        state.groups.remove(at);
        if let Some((qp, _)) = &state.qp {
            // A QP destroyed meanwhile left its groups already.
            let _ = qp.multicast(group, false);
        }
        Ok(())
    }

    fn event(&self, kind: CmEventKind, status: i32) -> CmEvent {
        CmEvent { id: self.clone(), listen_id: None, kind, status, conn: None, ud: None }
    }
}

fn expect_phase(state: &IdState, allowed: &[Phase], what: &str) -> Result<()> {
    match allowed.contains(&state.phase) {
        true => Ok(()),
        false => Err(Error::InvalidArgument(format!("{what} on an id that is {:?}", state.phase))),
    }
}

/// librdmacm's 0xff ("the most the device allows") or a value, within the
/// device's limit.
fn clamp(asked: u8, device_max: u8) -> u8 {
    match asked {
        AS_MANY_AS_POSSIBLE => device_max,
        value => value.min(device_max),
    }
}

/// The device's bound on READs and atomics outstanding per QP.
fn max_rd_atomic(context: &Context) -> u8 {
    u8::try_from(context.device().query_device().max_qp_rd_atom).unwrap_or(u8::MAX)
}

impl IdInner {
    fn lock(&self) -> MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `event` on the id's channel, if it still has one, and returns
    /// that channel: under the service's lock it must not be dropped there,
    /// as its last handle would drop the events it holds.
    fn deliver(&self, event: CmEvent) -> Option<Arc<ChannelShared>> {
        let channel = self.channel.lock().unwrap_or_else(PoisonError::into_inner).upgrade()?;
        channel.push(event);
        Some(channel)
    }

    /// `rdma_init_qp_attr` for a QP of `qp_type`. INIT before a connection
    /// exists grants no remote access (the kernel's `cma_ib_init_qp_attr`);
    /// once there is one, RDMA WRITE, and READ and atomics if the id accepts
    /// any (`ib_cm_init_qp_attr`). RTR and RTS carry what the REQ and REP
    /// agreed on; the RNR timer is the kernel CM's 0.
    fn qp_attr(&self, state: &IdState, qp_type: QpType, qp_state: QpState) -> Result<(QpAttr, AttrMask)> {
        let mut attr = QpAttr { state: qp_state, pkey_index: 0, port: 1, ..QpAttr::default() };
        let no_link = || Error::InvalidArgument(format!("QP attributes for {qp_state:?} before a connection"));
        if qp_type == QpType::Ud {
            return match qp_state {
                QpState::Init => {
                    attr.qkey = RDMA_UDP_QKEY;
                    Ok((attr, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY))
                }
                QpState::Rtr => Ok((attr, AttrMask::STATE)),
                QpState::Rts => Ok((QpAttr { sq_psn: Psn::new(0), ..attr }, AttrMask::STATE | AttrMask::SQ_PSN)),
                _ => Err(Error::InvalidArgument(format!("no CM attributes for a UD QP to {qp_state:?}"))),
            };
        }
        match qp_state {
            QpState::Init => {
                attr.access_flags = match state.link {
                    None => Access::NONE,
                    Some(link) if link.responder_resources > 0 => {
                        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
                    }
                    Some(_) => Access::REMOTE_WRITE,
                };
                Ok((attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT))
            }
            QpState::Rtr => {
                let link = state.link.filter(|l| l.remote_qpn != 0).ok_or_else(no_link)?;
                let route = state.route.ok_or_else(no_link)?;
                attr.dest = Some(route.dgid.to_ip());
                attr.path_mtu = link.path_mtu;
                attr.dest_qpn = link.remote_qpn;
                attr.rq_psn = link.rq_psn;
                attr.max_dest_rd_atomic = link.responder_resources;
                attr.min_rnr_timer = 0;
                let mut mask =
                    AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
                if qp_type == QpType::Rc {
                    mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
                }
                Ok((attr, mask))
            }
            QpState::Rts => {
                let link = state.link.filter(|l| l.remote_qpn != 0).ok_or_else(no_link)?;
                attr.sq_psn = link.sq_psn;
                let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
                if qp_type == QpType::Rc {
                    attr.timeout = LOCAL_ACK_TIMEOUT;
                    attr.retry_cnt = link.retry_count;
                    attr.rnr_retry = link.rnr_retry_count;
                    attr.max_rd_atomic = link.initiator_depth;
                    mask = mask
                        | AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::MAX_QP_RD_ATOMIC;
                }
                Ok((attr, mask))
            }
            QpState::Err | QpState::Reset => Ok((attr, AttrMask::STATE)),
            _ => Err(Error::InvalidArgument(format!("no CM attributes for {qp_state:?}"))),
        }
    }

    /// librdmacm's `ucma_modify_qp_rtr` and `ucma_modify_qp_rts`: INIT
    /// again (the connection's access rights), RTR, RTS. Nothing to do
    /// without a QP.
    fn move_qp_to_rts(&self, state: &IdState) -> Result<()> {
        let Some((qp, qp_type)) = &state.qp else { return Ok(()) };
        for step in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let (attr, mask) = self.qp_attr(state, *qp_type, step)?;
            qp.modify(&attr, mask)?;
        }
        Ok(())
    }

    /// `ucma_modify_qp_err`: what the QP still holds is flushed.
    fn move_qp_to_error(&self, state: &IdState) {
        if let Some((qp, _)) = &state.qp {
            if let Err(e) = qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE) {
                tracing::debug!("QP {:#x} not moved to ERR: {e}", qp.qpn());
            }
        }
    }
}

impl Drop for IdInner {
    /// `rdma_destroy_id`: stops listening, and answers or closes what the
    /// protocol still has open for the id (a REJ, a DREQ).
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(service_id) = state.listening {
            for service in &state.services {
                unlisten(service, service_id);
            }
        }
        if let (Some(comm_id), Some(service)) = (state.comm_id, state.services.first()) {
            service.with_state(|protocol_state, now| {
                protocol_state.ids.remove(&comm_id);
                protocol_state.protocol.destroy(now, comm_id);
            });
        }
    }
}

fn unlisten(service: &Arc<Service>, service_id: u64) {
    service.with_state(|state, _| {
        state.protocol.unlisten(service_id);
        state.listeners.remove(&service_id);
    });
    if let Err(e) = service.context.unlisten_cm(service_id as u32) {
        tracing::debug!("CM service {service_id:#x}: {e}");
    }
}

/// What dispatching under the service's lock let go of, dropped after the
/// lock is released: dropping an id's last handle destroys it, which takes
/// the lock again.
#[derive(Default)]
pub(super) struct Released {
    ids: Vec<CmId>,
    channels: Vec<Arc<ChannelShared>>,
}

/// Turns a protocol event into the id's state change, QP moves and rdma_cm
/// event. Runs under the service's lock; every id it touches goes into
/// `released`, to be dropped after the lock is let go.
pub(super) fn dispatch(service: &Arc<Service>, state: &mut State, now: Instant, event: Event, released: &mut Released) {
    let comm_id = match &event {
        Event::Request { id, .. }
        | Event::Reply { id, .. }
        | Event::Established { id }
        | Event::Rejected { id, .. }
        | Event::DisconnectRequest { id, .. }
        | Event::Disconnected { id }
        | Event::TimewaitExit { id }
        | Event::SidrRequest { id, .. }
        | Event::SidrReply { id, .. }
        | Event::SidrTimeout { id } => *id,
    };
    match event {
        Event::Request { id, peer, req } => {
            request(service, state, now, id, peer, Request::Connect(Box::new(req)), released)
        }
        Event::SidrRequest { id, peer, req } => {
            request(service, state, now, id, peer, Request::Sidr(Box::new(req)), released)
        }
        event => {
            let Some(inner) = state.ids.get(&comm_id).and_then(Weak::upgrade) else {
                // An id dropped meanwhile: its destroy already told the protocol.
                return;
            };
            let id = CmId { inner };
            released.ids.push(id.clone());
            if answer(state, now, &id, event, released) == Some(true) {
                state.ids.remove(&comm_id);
            }
        }
    }
}

/// A connection request for a listener, RC or UD.
enum Request {
    Connect(Box<ReqRepr>),
    Sidr(Box<SidrReqRepr>),
}

fn request(
    service: &Arc<Service>,
    state: &mut State,
    now: Instant,
    comm_id: CommId,
    peer: MadPeer,
    req: Request,
    released: &mut Released,
) {
    let (service_id, private_data) = match &req {
        Request::Connect(req) => (req.service_id, &req.private_data[..]),
        Request::Sidr(req) => (req.service_id, &req.private_data[..]),
    };
    let refuse = |state: &mut State| match &req {
        Request::Connect(_) => {
            let _ = state.protocol.reject(now, comm_id, RejReason::CONSUMER_DEFINED, &[]);
        }
        Request::Sidr(_) => {
            let reply = SidrReply { status: SidrStatus::REJECT, qpn: 0, qkey: 0, private_data: Vec::new() };
            let _ = state.protocol.sidr_reply(now, comm_id, reply);
        }
    };
    let listener = state.listeners.get(&service_id).and_then(Weak::upgrade);
    let header = CmaHeader::new_checked(private_data).and_then(|h| CmaHeaderRepr::parse(&h));
    let (Some(listener), Ok(header), Some((ps, port))) = (listener, header, PortSpace::from_service_id(service_id))
    else {
        refuse(state);
        return;
    };
    let listener = CmId { inner: listener };
    released.ids.push(listener.clone());
    let user_data = private_data[CMA_HEADER_LEN..].to_vec();
    let (link, route, conn, ud) = match &req {
        Request::Connect(req) => {
            let Some(path_mtu) = Mtu::from_ibv(req.path_mtu.into()) else {
                refuse(state);
                return;
            };
            let link = Link {
                remote_qpn: req.local_qpn,
                rq_psn: Psn::new(crate::random_u32()),
                sq_psn: req.starting_psn,
                path_mtu,
                // What the peer will send us at once, and what it takes.
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
            };
            let path = &req.primary_path;
            let route = Route {
                sgid: Gid::from_bytes(path.remote_gid),
                dgid: peer.gid,
                path_mtu,
                pkey: req.pkey,
                hop_limit: path.hop_limit,
                traffic_class: path.traffic_class,
            };
            // As the kernel reports them: the peer's initiator depth is the
            // responder resources this side needs, and the other way round.
            let conn = ConnParam {
                private_data: user_data,
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                flow_control: req.end_to_end_flow_control,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
                qkey: 0,
            };
            (Some(link), route, Some(conn), None)
        }
        Request::Sidr(req) => {
            let route = Route {
                sgid: Gid::from_ip(header.dst),
                dgid: peer.gid,
                path_mtu: service.context.device().active_mtu(),
                pkey: req.pkey,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
            };
            let ud = UdParam { private_data: user_data, dgid: peer.gid, qp_num: 0, qkey: 0 };
            (None, route, None, Some(ud))
        }
    };
    let id_state = IdState {
        phase: Phase::RequestReceived,
        services: vec![Arc::clone(service)],
        local: Some(SocketAddr::new(header.dst, port)),
        peer: Some(SocketAddr::new(header.src, header.src_port)),
        route: Some(route),
        peer_gsi: Some(peer),
        comm_id: Some(comm_id),
        link,
        ..IdState::default()
    };
    let inner = IdInner {
        ps,
        options: listener.inner.options.clone(),
        channel: Mutex::new(listener.inner.channel.lock().unwrap_or_else(PoisonError::into_inner).clone()),
        state: Mutex::new(id_state),
    };
    let id = CmId { inner: Arc::new(inner) };
    state.ids.insert(comm_id, Arc::downgrade(&id.inner));
    released.ids.push(id.clone());
    let event =
        CmEvent { id, listen_id: Some(listener.clone()), kind: CmEventKind::ConnectRequest, status: 0, conn, ud };
    released.channels.extend(listener.inner.deliver(event));
}

/// The id's part of an event about an existing connection. Returns
/// `Some(true)` when the protocol has forgotten the Comm ID.
fn answer(state: &mut State, now: Instant, id: &CmId, event: Event, released: &mut Released) -> Option<bool> {
    let mut id_state = id.inner.lock();
    let mut ended = false;
    let mut out = id.event(CmEventKind::Established, 0);
    match event {
        Event::Reply { id: comm_id, rep } => {
            if id_state.phase != Phase::Connecting {
                return None;
            }
            let link = id_state.link.as_mut()?;
            link.remote_qpn = rep.local_qpn;
            link.sq_psn = rep.starting_psn;
            // The kernel's cm_rep_handler: we send as many READs at once as
            // the peer takes, and take as many as it sends.
            link.initiator_depth = rep.responder_resources;
            link.responder_resources = rep.initiator_depth;
            link.rnr_retry_count = rep.rnr_retry_count;
            out.conn = Some(ConnParam {
                private_data: rep.private_data.to_vec(),
                responder_resources: rep.initiator_depth,
                initiator_depth: rep.responder_resources,
                flow_control: rep.end_to_end_flow_control,
                retry_count: 0,
                rnr_retry_count: rep.rnr_retry_count,
                srq: rep.srq,
                qp_num: rep.local_qpn,
                qkey: 0,
            });
            if id_state.qp.is_none() {
                id_state.phase = Phase::ReplyReceived;
                out.kind = CmEventKind::ConnectResponse;
            } else {
                let moved = id.inner.move_qp_to_rts(&id_state);
                let confirmed =
                    moved.and_then(|()| state.protocol.ready_to_use(now, comm_id, &[]).map_err(protocol_error));
                match confirmed {
                    Ok(()) => id_state.phase = Phase::Connected,
                    Err(e) => {
                        id.inner.move_qp_to_error(&id_state);
                        let _ = state.protocol.reject(now, comm_id, RejReason::CONSUMER_DEFINED, &[]);
                        (ended, id_state.phase, id_state.comm_id) = (true, Phase::Done, None);
                        (out.kind, out.status) = (CmEventKind::ConnectError, -e.errno());
                    }
                }
            }
        }
        Event::Established { .. } => {
            if id_state.phase != Phase::Accepted {
                return None;
            }
            id_state.phase = Phase::Connected;
        }
        Event::Rejected { reason, timed_out, private_data, .. } => {
            id.inner.move_qp_to_error(&id_state);
            (ended, id_state.phase, id_state.comm_id) = (true, Phase::Done, None);
            if timed_out {
                (out.kind, out.status) = (CmEventKind::Unreachable, -libc::ETIMEDOUT);
            } else {
                (out.kind, out.status) = (CmEventKind::Rejected, i32::from(reason.0));
                out.conn = Some(ConnParam { private_data, ..ConnParam::default() });
            }
        }
        Event::DisconnectRequest { private_data, .. } => {
            id_state.phase = Phase::DisconnectRequested;
            out.kind = CmEventKind::Disconnected;
            out.conn = Some(ConnParam { private_data, ..ConnParam::default() });
        }
        Event::Disconnected { .. } => {
            id_state.phase = Phase::TimeWait;
            out.kind = CmEventKind::Disconnected;
        }
        Event::TimewaitExit { .. } => {
            (ended, id_state.phase, id_state.comm_id) = (true, Phase::Done, None);
            out.kind = CmEventKind::TimewaitExit;
        }
        Event::SidrReply { rep, .. } => {
            (ended, id_state.phase, id_state.comm_id) = (true, Phase::Done, None);
            let dgid = id_state.route.map_or(Gid::default(), |r| r.dgid);
            let ud = UdParam { private_data: rep.private_data.to_vec(), dgid, qp_num: rep.qpn, qkey: rep.qkey };
            if rep.status == SidrStatus::SUCCESS {
                id_state.phase = Phase::Connected;
            } else {
                (out.kind, out.status) = (CmEventKind::Unreachable, i32::from(rep.status.0));
            }
            out.ud = Some(ud);
        }
        Event::SidrTimeout { .. } => {
            (ended, id_state.phase, id_state.comm_id) = (true, Phase::Done, None);
            (out.kind, out.status) = (CmEventKind::Unreachable, -libc::ETIMEDOUT);
        }
        Event::Request { .. } | Event::SidrRequest { .. } => return None,
    }
    drop(id_state);
    released.channels.extend(id.inner.deliver(out));
    Some(ended)
}
