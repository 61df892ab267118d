//! The kernel's own MADs (tests/data/cm/rping.pcap, see its README) against
//! the protocol: its REQ taken and answered, and our REQ and REP compared
//! with its own, byte for byte but for the Comm IDs and transaction IDs each
//! side picks.

use super::*;
use crate::support::captures;
use softroce::wire::cm::{RepRepr, ReqRepr};
use softroce::wire::mad::{HEADER_LEN, MAD_LEN};
use softroce::wire::{CmMessage, Packet};

/// rping's client and server.
const CLIENT: [u8; 4] = [10, 77, 0, 3];
const SERVER: [u8; 4] = [10, 77, 0, 2];

/// The CM MADs of the rping capture, in order: REQ, REP, RTU, DREQ, DREP.
fn rping_mads() -> Vec<[u8; MAD_LEN]> {
    captures::roce_ip_packets("cm/rping")
        .iter()
        .map(|ip| Packet::parse(ip).expect("every packet parses"))
        .filter(|p| p.roce.header.bth.dest_qpn == 1)
        .map(|p| p.roce.payload.try_into().expect("a MAD"))
        .collect()
}

fn kernel_req() -> (u64, ReqRepr, [u8; MAD_LEN]) {
    let mad = rping_mads()[0];
    let parsed = CmMad::parse(&mad).unwrap();
    let CmMessage::Req(req) = parsed.message else { panic!("a REQ first") };
    (parsed.header.transaction_id, req, mad)
}

fn kernel_rep() -> ([u8; MAD_LEN], RepRepr) {
    let mad = rping_mads()[1];
    let CmMessage::Rep(rep) = CmMad::parse(&mad).unwrap().message else { panic!("a REP second") };
    (mad, rep)
}

#[test]
fn kernel_req_is_taken_and_our_rep_answers_its_comm_id() {
    let (tid, kernel, mad) = kernel_req();
    let (kernel_rep_mad, kernel_rep) = kernel_rep();
    let now = Instant::now();
    let mut server = Protocol::new(config(0, kernel_rep.local_ca_guid), 7);
    server.listen(SERVICE, 8).unwrap();
    server.handle_mad(now, peer(CLIENT), &mad);

    let Some(Event::Request { id, peer: from, req }) = server.poll_event() else { panic!("a request") };
    assert_eq!((from, req), (peer(CLIENT), kernel));
    assert_eq!((req.local_comm_id, req.local_qpn, req.starting_psn), (0x8be7_ac52, 0x11, Psn::new(0x7439d2)));

    // Answered with what the kernel's server answered.
    let reply = ConnectReply {
        qpn: kernel_rep.local_qpn,
        starting_psn: kernel_rep.starting_psn,
        responder_resources: kernel_rep.responder_resources,
        initiator_depth: kernel_rep.initiator_depth,
        rnr_retry_count: kernel_rep.rnr_retry_count,
        srq: kernel_rep.srq,
        flow_control: kernel_rep.end_to_end_flow_control,
        private_data: Vec::new(),
    };
    server.accept(now, id, reply).unwrap();
    let ours = server.poll_transmit().expect("a REP");
    assert_eq!(ours.to, peer(CLIENT));
    let parsed = CmMad::parse(&ours.mad).unwrap();
    let CmMessage::Rep(rep) = parsed.message else { panic!("a REP") };
    assert_eq!((rep.remote_comm_id, rep.local_comm_id), (kernel.local_comm_id, id));
    assert_eq!(parsed.header.transaction_id, tid, "in the REQ's transaction");
    // The kernel's REP, but for the server's Comm ID (data bytes 0-3).
    let mut expected = kernel_rep_mad;
    expected[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&id.to_be_bytes());
    assert_eq!(ours.mad, expected);

    // The kernel client's RTU, renamed to our ID, establishes.
    let mut rtu = rping_mads()[2];
    rtu[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&id.to_be_bytes());
    server.handle_mad(now, peer(CLIENT), &rtu);
    assert_eq!(server.poll_event(), Some(Event::Established { id }));
}

#[test]
fn our_req_is_the_kernels_but_for_ids() {
    let (_, kernel, kernel_mad) = kernel_req();
    let mut client = Protocol::new(config(0, kernel.local_ca_guid), 7);
    let path = kernel.primary_path;
    let request = ConnectRequest {
        peer: peer(SERVER),
        service_id: kernel.service_id,
        local_gid: Gid::from_bytes(path.local_gid),
        qpn: kernel.local_qpn,
        qp_type: QpType::Rc,
        starting_psn: kernel.starting_psn,
        path_mtu: Mtu::from_ibv(kernel.path_mtu.into()).unwrap(),
        responder_resources: kernel.responder_resources,
        initiator_depth: kernel.initiator_depth,
        retry_count: kernel.retry_count,
        rnr_retry_count: kernel.rnr_retry_count,
        local_ack_timeout: path.local_ack_timeout,
        srq: kernel.srq,
        flow_control: kernel.end_to_end_flow_control,
        traffic_class: path.traffic_class,
        hop_limit: path.hop_limit,
        flow_label: path.flow_label,
        pkey: kernel.pkey,
        private_data: kernel.private_data.to_vec(),
    };
    let id = client.connect(Instant::now(), request).unwrap();
    let ours = client.poll_transmit().unwrap();
    // The kernel's REQ, but for the Comm ID and the TID built from it
    // (agent number in bytes 8-11, the swapped ID in 12-15).
    let mut expected = kernel_mad;
    expected[8..12].copy_from_slice(&1u32.to_be_bytes());
    expected[12..16].copy_from_slice(&id.swap_bytes().to_be_bytes());
    expected[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&id.to_be_bytes());
    assert_eq!(ours.mad, expected);
}

#[test]
fn kernel_dreq_for_a_gone_id_is_answered() {
    // The capture's DREQ reaches a protocol that never knew the connection
    // (say, a restarted process): it answers with a DREP as the kernel's
    // cm_issue_drep does, ids swapped, in the DREQ's transaction.
    let dreq = rping_mads()[3];
    let parsed = CmMad::parse(&dreq).unwrap();
    let CmMessage::Dreq(message) = parsed.message else { panic!("a DREQ fourth") };
    let mut cm = Protocol::new(config(0, 1), 7);
    cm.handle_mad(Instant::now(), peer(CLIENT), &dreq);
    let drep = CmMad::parse(&cm.poll_transmit().unwrap().mad).unwrap();
    let CmMessage::Drep(answer) = drep.message else { panic!("a DREP") };
    assert_eq!((answer.local_comm_id, answer.remote_comm_id), (message.remote_comm_id, message.local_comm_id));
    assert_eq!(drep.header.transaction_id, parsed.header.transaction_id);
    // The kernel's DREP is the same message.
    let CmMessage::Drep(kernel) = CmMad::parse(&rping_mads()[4]).unwrap().message else { panic!("a DREP fifth") };
    assert_eq!(answer, kernel);
}
