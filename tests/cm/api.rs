//! What needs no peer: addresses, routes, ports, the process's contexts and
//! the QP attributes before a connection.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use softroce::cm::{self, CmEventKind, CmId, CmOptions, EventChannel, PortSpace};
use softroce::verbs::{Access, AttrMask, Context, ContextOptions, Device, Gid, QpState, QpType};

use crate::support::verbs::*;

/// A context on 127.0.0.1 alone, on a free port, and a channel pinned to it.
pub fn local_side(name: &str, ip: IpAddr, port: u16) -> (Context, EventChannel) {
    let device = Device::custom(name, vec![ip], [2, 0, 0, 0, 0, 1], LINK_MTU);
    let context = Context::open(&device, ContextOptions { port, ..ContextOptions::default() }).unwrap();
    let channel = EventChannel::with_options(CmOptions::with_context(&context)).unwrap();
    (context, channel)
}

/// The next event, which must be of `kind`.
pub fn expect(channel: &EventChannel, kind: CmEventKind) -> cm::CmEvent {
    let event = channel.get_event(Some(WAIT)).unwrap_or_else(|| panic!("no event; expected {kind:?}"));
    assert_eq!((event.kind, event.status), (kind, 0), "expected {kind:?}");
    event
}

#[test]
fn addresses_and_routes_resolve_at_once() {
    let port = free_port(&[IP_A]);
    let (context, channel) = local_side("cm_resolve", IP_A, port);
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    assert!(id.context().is_none());
    let peer = SocketAddr::new(IP_A, 7471);
    id.resolve_addr(None, peer, Duration::from_secs(2)).unwrap();
    // Queued before the call returned: the descriptor is readable already.
    assert_eq!(softroce::net::wait_readable(&[channel.fd()], Duration::ZERO), 1);
    let event = expect(&channel, CmEventKind::AddrResolved);
    assert!(event.id.same_as(&id));
    assert_eq!(softroce::net::wait_readable(&[channel.fd()], Duration::ZERO), 0);
    assert!(id.context().unwrap().same_as(&context));
    let local = id.local_addr().unwrap();
    assert_eq!(local.ip(), IP_A, "the kernel's route to 127.0.0.1 starts there");
    assert_ne!(local.port(), 0, "an ephemeral port was bound");
    assert_eq!(id.peer_addr(), Some(peer));
    assert!(id.route().is_none());

    id.resolve_route(Duration::from_secs(2)).unwrap();
    expect(&channel, CmEventKind::RouteResolved);
    let route = id.route().unwrap();
    assert_eq!((route.sgid, route.dgid), (Gid::from_ip(IP_A), Gid::from_ip(IP_A)));
    assert_eq!((route.path_mtu, route.pkey, route.hop_limit), (context.device().active_mtu(), 0xffff, 64));
    assert!(id.resolve_route(Duration::from_secs(2)).is_err(), "resolved once");
    assert!(channel.try_get_event().is_none());
}

#[test]
fn an_address_of_another_device_is_refused() {
    let port = free_port(&[IP_A]);
    let (_context, channel) = local_side("cm_elsewhere", IP_A, port);
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let elsewhere = SocketAddr::new(IP_B, 0);
    let err = id.resolve_addr(Some(elsewhere), SocketAddr::new(IP_A, 1), Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.errno(), libc::EADDRNOTAVAIL);
    assert!(id.resolve_addr(None, SocketAddr::new([0u8; 4].into(), 1), Duration::from_secs(1)).is_err());
}

#[test]
fn a_bound_port_is_taken_until_its_id_goes() {
    let port = free_port(&[IP_A]);
    let (_context, channel) = local_side("cm_bind", IP_A, port);
    let first = CmId::new(&channel, PortSpace::Tcp).unwrap();
    first.bind_addr(SocketAddr::new(IP_A, 0)).unwrap();
    let taken = first.local_addr().unwrap();
    assert_ne!(taken.port(), 0);
    let second = CmId::new(&channel, PortSpace::Tcp).unwrap();
    assert_eq!(second.bind_addr(taken).unwrap_err().errno(), libc::EADDRINUSE);
    // Another port space has ports of its own.
    CmId::new(&channel, PortSpace::Udp).unwrap().bind_addr(taken).unwrap();
    drop(first);
    second.bind_addr(taken).unwrap();
    assert_eq!(second.local_addr(), Some(taken));
}

#[test]
fn a_process_has_one_context_per_device_and_port() {
    let port = free_port(&[IP_A]);
    let device = Device::custom("cm_registry", vec![IP_A], [2, 0, 0, 0, 0, 1], LINK_MTU);
    let options = ContextOptions { port, ..ContextOptions::default() };
    let first = cm::context_for(&device, &options).unwrap();
    let again = cm::context_for(&device, &options).unwrap();
    assert!(first.same_as(&again));
    let other_port = ContextOptions { port: free_port(&[IP_A]), ..ContextOptions::default() };
    assert!(!cm::context_for(&device, &other_port).unwrap().same_as(&first));
}

#[test]
fn a_qp_is_init_with_no_remote_access_before_a_connection() {
    let port = free_port(&[IP_A]);
    let (context, channel) = local_side("cm_qp_init", IP_A, port);
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(16, None).unwrap();
    assert!(id.create_qp(pd.create_qp(QpType::Rc, &cq)).is_err(), "no device yet");
    id.resolve_addr(None, SocketAddr::new(IP_A, 1), WAIT).unwrap();
    let (attr, mask) = id.qp_attr(QpState::Init).unwrap();
    assert_eq!(mask, AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT);
    assert_eq!((attr.access_flags, attr.pkey_index, attr.port), (Access::NONE, 0, 1));
    assert!(id.qp_attr(QpState::Rtr).is_err(), "no peer QP yet");
    assert!(id.create_qp(pd.create_qp(QpType::Ud, &cq)).is_err(), "a UD QP in the TCP port space");
    let qp = id.create_qp(pd.create_qp(QpType::Rc, &cq)).unwrap();
    assert_eq!(qp.state(), QpState::Init);
    assert!(id.create_qp(pd.create_qp(QpType::Rc, &cq)).is_err(), "one QP per id");
}

#[test]
fn a_migrated_id_reports_to_its_new_channel() {
    let port = free_port(&[IP_A]);
    let (context, first) = local_side("cm_migrate", IP_A, port);
    let second = EventChannel::with_options(CmOptions::with_context(&context)).unwrap();
    let id = CmId::new(&first, PortSpace::Tcp).unwrap();
    id.migrate(&second).unwrap();
    id.resolve_addr(None, SocketAddr::new(IP_A, 1), WAIT).unwrap();
    assert!(expect(&second, CmEventKind::AddrResolved).id.same_as(&id));
    assert!(first.try_get_event().is_none());
}

#[test]
fn connect_refuses_private_data_that_does_not_fit() {
    let port = free_port(&[IP_A]);
    let (_context, channel) = local_side("cm_too_long", IP_A, port);
    for (ps, max) in [(PortSpace::Tcp, 56), (PortSpace::Udp, 180)] {
        let id = CmId::new(&channel, ps).unwrap();
        assert!(id.connect(&cm::ConnParam::default()).is_err(), "not resolved");
        id.resolve_addr(None, SocketAddr::new(IP_A, 1), WAIT).unwrap();
        id.resolve_route(WAIT).unwrap();
        let too_long = cm::ConnParam { private_data: vec![0; max + 1], ..cm::ConnParam::default() };
        assert_eq!(id.connect(&too_long).unwrap_err().errno(), libc::EINVAL, "{ps:?}");
    }
}
