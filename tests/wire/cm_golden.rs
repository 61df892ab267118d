//! Golden tests for the CM wire format (rxe-spec/cm.md): the connection
//! management MADs kernel rdma_cm sent in `tests/data/cm` (see the README),
//! parsed and re-emitted byte for byte, and what they say checked against the
//! traffic around them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use crate::support::captures;
use softroce::wire::cm::{self, attr, MessageRef, RejReason, SidrStatus, TransportService};
use softroce::wire::cma::{self, CmaHeader, CmaHeaderRepr, PortSpace};
use softroce::wire::mad::{self, method, Mad, MadRepr, GSI_QKEY, GSI_QPN, MAD_LEN};
use softroce::wire::{CmMad, CmMessage, Operation, Packet, Transport};

const SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2));
const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 3));

/// rping's and udaddy's default port.
const PORT: u16 = 7174;

/// The CM captures: name, RoCE packets, and the CM messages in order.
const CAPTURES: [(&str, usize, &[u16]); 3] = [
    ("cm/rping", 41, &[attr::REQ, attr::REP, attr::RTU, attr::DREQ, attr::DREP]),
    ("cm/rping_rejected", 2, &[attr::REQ, attr::REJ]),
    ("cm/udaddy", 6, &[attr::SIDR_REQ, attr::SIDR_REP]),
];

/// One CM MAD of a capture: the packet around it and the MAD's bytes.
struct Captured {
    src: IpAddr,
    dst: IpAddr,
    mad: Vec<u8>,
}

/// Every packet of a capture, parsed.
fn packets(ips: &[Vec<u8>]) -> Vec<Packet<'_>> {
    ips.iter().map(|ip| Packet::parse(ip).expect("every packet parses")).collect()
}

/// The GSI packets of a capture (those to QP 1), checked to be what the GSI
/// sends: UD SEND_ONLY, Q_Key 0x80010000, from QP 1, a 256-byte MAD.
fn gsi_mads(name: &str) -> Vec<Captured> {
    let ips = captures::roce_ip_packets(name);
    packets(&ips)
        .iter()
        .filter(|p| p.roce.header.bth.dest_qpn == GSI_QPN)
        .map(|p| {
            let bth = p.roce.header.bth;
            assert_eq!((bth.opcode.transport(), bth.opcode.operation()), (Transport::Ud, Operation::SendOnly));
            let deth = p.roce.header.deth.expect("UD has a DETH");
            assert_eq!((deth.qkey, deth.src_qpn), (GSI_QKEY, GSI_QPN), "{name}");
            assert_eq!(p.roce.payload.len(), MAD_LEN, "{name}: a MAD per packet");
            assert!(p.icrc_ok());
            Captured { src: p.ip.source(), dst: p.ip.destination(), mad: p.roce.payload.to_vec() }
        })
        .collect()
}

/// The CM messages of a capture, parsed.
fn messages(name: &str) -> Vec<(Captured, CmMad)> {
    gsi_mads(name)
        .into_iter()
        .map(|c| {
            let parsed = CmMad::parse(&c.mad).unwrap_or_else(|e| panic!("{name}: {e}"));
            (c, parsed)
        })
        .collect()
}

#[test]
fn every_cm_capture_holds_the_expected_messages() {
    for (name, count, attributes) in CAPTURES {
        assert_eq!(captures::roce_ip_packets(name).len(), count, "{name}");
        let found: Vec<u16> = messages(name).iter().map(|(_, m)| m.message.attribute_id()).collect();
        assert_eq!(found, attributes, "{name}");
        for (_, m) in messages(name) {
            assert!(m.header.is_cm());
            assert_eq!((m.header.method, m.header.status, m.header.class_specific), (method::SEND, 0, 0));
            assert_eq!(m.header.attribute_modifier, 0, "no ECE options");
        }
    }
}

#[test]
fn every_cm_mad_re_emits_byte_identically() {
    let mut checked = 0;
    for (name, _, _) in CAPTURES {
        for (i, (captured, parsed)) in messages(name).into_iter().enumerate() {
            let mut out = [0x5au8; MAD_LEN];
            parsed.emit(&mut out).unwrap_or_else(|e| panic!("{name} MAD {i}: {e}"));
            assert_eq!(out[..], captured.mad[..], "{name} MAD {i} ({})", parsed.message.name());
            // Through the header and message separately, as a stack builds one.
            let mut again = [0u8; MAD_LEN];
            parsed.header.emit(&mut Mad::new_unchecked(&mut again[..])).unwrap();
            parsed.message.emit(&mut again[mad::HEADER_LEN..]).unwrap();
            assert_eq!(again, out);
            checked += 1;
        }
    }
    assert_eq!(checked, 9);
}

/// REQ, REP, RTU, DREQ, DREP: the handshake rping's connection went through,
/// and the numbers it agreed are the ones its RC traffic then used.
#[test]
fn rping_connects_and_disconnects() {
    let msgs = messages("cm/rping");
    let [req, rep, rtu, dreq, drep] = [0, 1, 2, 3, 4].map(|i| (&msgs[i].0, msgs[i].1));
    let (CmMessage::Req(q), CmMessage::Rep(p), CmMessage::Rtu(u), CmMessage::Dreq(dq), CmMessage::Drep(dp)) =
        (req.1.message, rep.1.message, rtu.1.message, dreq.1.message, drep.1.message)
    else {
        panic!("REQ REP RTU DREQ DREP")
    };
    // Who sends what: the client requests, the server replies, the client is ready.
    assert_eq!((req.0.src, req.0.dst), (CLIENT, SERVER));
    assert_eq!((rep.0.src, rep.0.dst), (SERVER, CLIENT));
    assert_eq!(rtu.0.src, CLIENT);

    // Communication IDs pair up: each side's local ID is the other's remote ID.
    assert_eq!(p.remote_comm_id, q.local_comm_id);
    assert_eq!((u.local_comm_id, u.remote_comm_id), (q.local_comm_id, p.local_comm_id));
    let (dreq_by_client, drep_by_server) = (dreq.0.src == CLIENT, drep.0.src == SERVER);
    let client_id = q.local_comm_id;
    let server_id = p.local_comm_id;
    if dreq_by_client {
        assert_eq!((dq.local_comm_id, dq.remote_comm_id), (client_id, server_id));
        assert!(drep_by_server);
    } else {
        assert_eq!((dq.local_comm_id, dq.remote_comm_id), (server_id, client_id));
    }
    assert_eq!((dp.local_comm_id, dp.remote_comm_id), (dq.remote_comm_id, dq.local_comm_id));

    // The REP and RTU answer in the REQ's transaction; DREQ starts another, DREP answers in it.
    assert_eq!(rep.1.header.transaction_id, req.1.header.transaction_id);
    assert_eq!(rtu.1.header.transaction_id, req.1.header.transaction_id);
    assert_eq!(drep.1.header.transaction_id, dreq.1.header.transaction_id);
    if dreq_by_client {
        // The kernel's TID comes from the sender's comm ID: one per side and connection.
        assert_eq!(dreq.1.header.transaction_id, req.1.header.transaction_id);
    }

    // rdma_cm's service ID: TCP port space, rping's port.
    assert_eq!(PortSpace::from_service_id(q.service_id), Some((PortSpace::Tcp, PORT)));
    assert_eq!(q.transport_service, TransportService::Rc);
    // The path: RoCE has no LIDs; GIDs are the IPv4-mapped addresses.
    let path = q.primary_path;
    assert_eq!((path.local_lid, path.remote_lid), (0xffff, 0xffff));
    assert_eq!(path.local_gid, gid(CLIENT));
    assert_eq!(path.remote_gid, gid(SERVER));
    assert_eq!(path.hop_limit, 64);
    assert!(q.alternate_path.is_empty());
    assert_eq!(cm::mtu_bytes(q.path_mtu), Some(1024));

    // The CMA header: the client's address and port, the server's address.
    let header = CmaHeaderRepr::parse(&CmaHeader::new_checked(&q.private_data[..]).unwrap()).unwrap();
    assert_eq!((header.src, header.dst), (CLIENT, SERVER));
    assert_ne!(header.src_port, PORT, "the CMA header carries the source port");
    assert!(q.private_data[cma::CMA_HEADER_LEN..].iter().all(|&b| b == 0), "rping sends no private data");

    // The DREQ names the receiver's QP.
    let receiver_qpn = if dreq_by_client { p.local_qpn } else { q.local_qpn };
    assert_eq!(dq.remote_qpn, receiver_qpn);

    // The RC traffic: a message's starting PSN is the one its sender expects
    // to receive, so each side's first request PSN is the starting PSN the
    // *other* side announced, and packets go to the QP the other announced.
    let ips = captures::roce_ip_packets("cm/rping");
    let rc: Vec<Packet<'_>> = packets(&ips).into_iter().filter(|p| p.roce.header.bth.dest_qpn != GSI_QPN).collect();
    let first_request = |from: IpAddr| {
        rc.iter()
            .find(|p| p.ip.source() == from && p.roce.header.bth.opcode.operation().is_request())
            .map(|p| (p.roce.header.bth.psn, p.roce.header.bth.dest_qpn))
            .expect("a request")
    };
    assert_eq!(first_request(CLIENT), (p.starting_psn, p.local_qpn));
    assert_eq!(first_request(SERVER), (q.starting_psn, q.local_qpn));
}

/// A connection to a port nobody listens on: REJ, invalid service ID.
#[test]
fn rping_to_a_closed_port_is_rejected() {
    let msgs = messages("cm/rping_rejected");
    let (CmMessage::Req(q), CmMessage::Rej(j)) = (msgs[0].1.message, msgs[1].1.message) else { panic!("REQ then REJ") };
    assert_eq!(msgs[1].0.src, SERVER);
    assert_eq!(j.reason, RejReason::INVALID_SERVICE_ID);
    assert_eq!(j.message_rejected, MessageRef::Req);
    assert_eq!(j.remote_comm_id, q.local_comm_id);
    assert_eq!(j.local_comm_id, 0, "nobody took the request, so no local ID");
    assert_eq!(j.ari_length, 0);
    assert_eq!(msgs[1].1.header.transaction_id, msgs[0].1.header.transaction_id);
}

/// udaddy resolves a UD service: SIDR_REQ with the CMA header, SIDR_REP with
/// the server's QPN and rdma_cm's UDP Q_Key, which its datagrams then use.
#[test]
fn udaddy_resolves_by_sidr() {
    let msgs = messages("cm/udaddy");
    let (CmMessage::SidrReq(q), CmMessage::SidrRep(p)) = (msgs[0].1.message, msgs[1].1.message) else {
        panic!("SIDR_REQ then SIDR_REP")
    };
    assert_eq!((msgs[0].0.src, msgs[1].0.src), (CLIENT, SERVER));
    assert_eq!(PortSpace::from_service_id(q.service_id), Some((PortSpace::Udp, PORT)));
    assert_eq!(q.pkey, 0xffff);
    let header = CmaHeaderRepr::parse(&CmaHeader::new_checked(&q.private_data[..]).unwrap()).unwrap();
    assert_eq!((header.src, header.dst), (CLIENT, SERVER));
    assert_eq!(p.request_id, q.request_id);
    assert_eq!(p.service_id, q.service_id);
    assert_eq!(p.status, SidrStatus::SUCCESS);
    assert_eq!(p.qkey, cma::RDMA_UDP_QKEY);

    let ips = captures::roce_ip_packets("cm/udaddy");
    let datagrams: Vec<Packet<'_>> =
        packets(&ips).into_iter().filter(|p| p.roce.header.bth.dest_qpn != GSI_QPN).collect();
    let to_server: Vec<&Packet<'_>> = datagrams.iter().filter(|d| d.ip.destination() == SERVER).collect();
    assert!(!to_server.is_empty());
    for d in to_server {
        assert_eq!(d.roce.header.bth.dest_qpn, p.qpn);
        assert_eq!(d.roce.header.deth.unwrap().qkey, p.qkey);
    }
}

/// Kernel comm IDs and transaction IDs: the TID's low half is the sender's
/// comm ID in little-endian byte order (the kernel puts a `__be32` into a
/// `u64`), its high half the MAD agent's.
#[test]
fn kernel_transaction_ids_hold_the_comm_id() {
    for (name, _, _) in CAPTURES {
        let msgs = messages(name);
        let (_, first) = &msgs[0];
        let tid = first.header.transaction_id;
        assert_eq!((tid as u32).swap_bytes(), first.message.local_comm_id(), "{name}");
    }
}

/// A captured MAD whose class or attribute is changed is refused, not misread.
#[test]
fn captured_mads_with_another_class_or_attribute_are_refused() {
    for (name, _, _) in CAPTURES {
        for captured in gsi_mads(name) {
            let mut other = captured.mad.clone();
            other[1] = mad::class::SUBN_ADM;
            assert!(matches!(CmMad::parse(&other), Err(softroce::wire::Error::NotCm { .. })));
            let mut lap = captured.mad.clone();
            lap[16..18].copy_from_slice(&attr::LAP.to_be_bytes());
            assert_eq!(CmMad::parse(&lap), Err(softroce::wire::Error::UnknownCmAttribute(attr::LAP)));
            let header = MadRepr::parse(&Mad::new_checked(&captured.mad[..]).unwrap()).unwrap();
            assert!(header.is_cm());
        }
    }
}

/// A GID on RoCEv2: the IPv4-mapped IPv6 address.
fn gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The committed seeds of the `cm_parse` fuzz target: every CM MAD of the
/// captures, one file each.
fn fuzz_seeds() -> BTreeMap<String, Vec<u8>> {
    let mut seeds = BTreeMap::new();
    for (name, _, _) in CAPTURES {
        for (i, captured) in gsi_mads(name).into_iter().enumerate() {
            seeds.insert(format!("{}-{i}.mad", name.trim_start_matches("cm/")), captured.mad);
        }
    }
    seeds
}

fn fuzz_seed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/cm_parse")
}

#[test]
fn cm_fuzz_seeds_are_the_captured_mads() {
    let dir = fuzz_seed_dir();
    let mut committed = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        committed.insert(path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap());
    }
    assert!(
        committed == fuzz_seeds(),
        "fuzz/seeds/cm_parse is stale: run `cargo test --test wire -- --ignored write_cm_fuzz_seeds`"
    );
}

#[test]
#[ignore = "writes fuzz/seeds/cm_parse"]
fn write_cm_fuzz_seeds() {
    let dir = fuzz_seed_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in fuzz_seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
