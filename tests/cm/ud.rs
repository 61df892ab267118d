//! UD by SIDR: the UDP port space resolves the peer's QP and Q_Key, and a
//! datagram follows; and UD multicast groups joined through the CM.

use softroce::cm::{CmEventKind, CmId, ConnParam, PortSpace, RDMA_UDP_QKEY};
use softroce::verbs::*;

use crate::api::expect;
use crate::connect::Side;
use crate::support::verbs::*;

#[test]
fn sidr_resolves_the_peer_qp_and_a_datagram_follows() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_ud_client", IP_A, port), Side::open("cm_ud_server", IP_B, port));
    let (listener, addr) = server.listen(IP_B, PortSpace::Udp);
    let id = client.resolve(PortSpace::Udp, addr);
    let qp = client.qp(&id, QpType::Ud);
    assert_eq!((qp.state(), qp.query().qkey), (QpState::Rts, RDMA_UDP_QKEY), "a UD QP is ready at once");
    id.connect(&ConnParam { private_data: b"who is there?".to_vec(), ..ConnParam::default() }).unwrap();

    let request = expect(&server.channel, CmEventKind::ConnectRequest);
    assert!(request.listen_id.unwrap().same_as(&listener));
    let ud = request.ud.unwrap();
    assert_eq!(&ud.private_data[..13], b"who is there?");
    assert_eq!(ud.private_data.len(), 180, "a SIDR_REQ's 216 bytes less the CMA header");
    assert_eq!(ud.dgid, Gid::from_ip(IP_A));
    let server_qp = server.qp(&request.id, QpType::Ud);
    server.post_recv(&server_qp, 0);
    request.id.accept(&ConnParam { private_data: b"me".to_vec(), ..ConnParam::default() }).unwrap();

    let established = expect(&client.channel, CmEventKind::Established);
    let reply = established.ud.unwrap();
    assert_eq!((reply.qp_num, reply.qkey, reply.dgid), (server_qp.qpn(), RDMA_UDP_QKEY, Gid::from_ip(IP_B)));
    assert_eq!(&reply.private_data[..2], b"me");
    assert!(server.channel.try_get_event().is_none(), "UD accept raises nothing on its side");

    let ah = client.pd.create_ah(reply.dgid);
    client.send(&qp, b"datagram", Some(ah.ud_dest(reply.qp_num, reply.qkey)));
    let wc = next_wc(&server.cq);
    assert_eq!((wc.status, wc.byte_len, wc.src_qp), (WcStatus::Success, 40 + 8, qp.qpn()));
    let mut landed = [0u8; 8];
    server.mr.read(40, &mut landed).unwrap();
    assert_eq!(&landed, b"datagram");
}

#[test]
fn a_rejected_sidr_request_is_unreachable() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_udr_client", IP_A, port), Side::open("cm_udr_server", IP_B, port));
    let (_listener, addr) = server.listen(IP_B, PortSpace::Udp);
    let id = client.resolve(PortSpace::Udp, addr);
    client.qp(&id, QpType::Ud);
    id.connect(&ConnParam::default()).unwrap();
    let request = expect(&server.channel, CmEventKind::ConnectRequest);
    request.id.reject(b"no").unwrap();
    let event = client.channel.get_event(Some(WAIT)).unwrap();
    assert_eq!((event.kind, event.status), (CmEventKind::Unreachable, 2), "SIDR status: rejected");
    assert_eq!(&event.ud.unwrap().private_data[..2], b"no");
}

#[test]
fn a_sidr_request_nobody_listens_to_is_unreachable() {
    let port = free_port(&[IP_A, IP_B]);
    let (client, server) = (Side::open("cm_udn_client", IP_A, port), Side::open("cm_udn_server", IP_B, port));
    // The server's CM runs (it listens elsewhere), but not on this port.
    let (_listener, addr) = server.listen(IP_B, PortSpace::Udp);
    let closed = std::net::SocketAddr::new(IP_B, addr.port().wrapping_add(1).max(1));
    let id = client.resolve(PortSpace::Udp, closed);
    client.qp(&id, QpType::Ud);
    id.connect(&ConnParam::default()).unwrap();
    let event = client.channel.get_event(Some(WAIT)).unwrap();
    assert_eq!((event.kind, event.status), (CmEventKind::Unreachable, 1), "SIDR status: unsupported service ID");
    assert!(server.channel.try_get_event().is_none());
}

#[test]
fn a_datagram_to_a_joined_multicast_group_reaches_every_member() {
    let port = free_port(&[IP_A, IP_B]);
    let (sender, receiver) = (Side::open("cm_mc_sender", IP_A, port), Side::open("cm_mc_receiver", IP_B, port));
    let group = std::net::SocketAddr::new(std::net::Ipv4Addr::new(239, 77, 2, 1).into(), 0);
    // Each side: an id bound to its address, a UD QP, a join.
    let join = |side: &Side, ip| {
        let id = CmId::new(&side.channel, PortSpace::Udp).unwrap();
        id.bind_addr(std::net::SocketAddr::new(ip, 0)).unwrap();
        let qp = side.qp(&id, QpType::Ud);
        id.join_multicast(group.ip()).unwrap();
        let joined = expect(&side.channel, CmEventKind::MulticastJoin).ud.unwrap();
        assert_eq!((joined.dgid, joined.qp_num, joined.qkey), (Gid::from_ip(group.ip()), 0xff_ffff, RDMA_UDP_QKEY));
        (id, qp, joined)
    };
    let (_rid, rqp, _) = join(&receiver, IP_B);
    let (sid, sqp, joined) = join(&sender, IP_A);
    assert!(sid.join_multicast(std::net::Ipv4Addr::new(10, 0, 0, 1).into()).is_err(), "a unicast address");
    receiver.post_recv(&rqp, 0);
    let ah = sender.pd.create_ah(joined.dgid);
    sender.send(&sqp, b"to all", Some(ah.ud_dest(joined.qp_num, joined.qkey)));
    let wc = next_wc(&receiver.cq);
    assert_eq!((wc.status, wc.byte_len, wc.src_qp), (WcStatus::Success, 40 + 6, sqp.qpn()));
    sid.leave_multicast(group.ip()).unwrap();
    assert!(sid.leave_multicast(group.ip()).is_err(), "left already");
}
