//! Floods and garbage: whatever arrives, the protocol never panics, counts
//! what it drops, and holds no more than its bounds: `max_connections` IDs,
//! a listener's backlog of unanswered requests, and a few queued transmits
//! and events per ID.

use super::*;
use crate::fuzz_cm_protocol as fuzz;
use crate::support::{captures, Rng};
use softroce::wire::cm::{CmPathRepr, ReqRepr, TransportService};
use softroce::wire::mad::{HEADER_LEN, MAD_LEN};
use softroce::wire::{CmMessage, Packet};

/// A random GSI peer on 10.x.x.x.
fn random_peer(rng: &mut Rng) -> MadPeer {
    let bits = rng.next_u32().to_be_bytes();
    peer([10, bits[1], bits[2], bits[3]])
}

/// A valid REQ for `service_id` from a random Comm ID and CA GUID.
fn random_req(rng: &mut Rng, service_id: u64) -> [u8; MAD_LEN] {
    let req = ReqRepr {
        local_comm_id: rng.next_u32(),
        vendor_id: 0,
        service_id,
        local_ca_guid: rng.next_u64(),
        local_qkey: 0,
        local_qpn: rng.psn(),
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service: TransportService::Rc,
        end_to_end_flow_control: false,
        starting_psn: Psn::new(rng.psn()),
        local_cm_response_timeout: (rng.next_u32() % 32) as u8,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: (rng.next_u32() % 16) as u8,
        srq: false,
        extended_transport_type: 0,
        primary_path: CmPathRepr { hop_limit: 64, local_ack_timeout: 19, ..CmPathRepr::default() },
        alternate_path: CmPathRepr::default(),
        sap_supported: false,
        private_data: [0; 92],
    };
    let mut mad = [0u8; MAD_LEN];
    CmMad::new(rng.next_u64(), CmMessage::Req(req)).emit(&mut mad).unwrap();
    mad
}

/// The CM MADs of every CM capture.
fn captured_mads() -> Vec<Vec<u8>> {
    ["cm/rping", "cm/rping_rejected", "cm/udaddy"]
        .iter()
        .flat_map(|name| captures::roce_ip_packets(name))
        .filter_map(|ip| {
            let p = Packet::parse(&ip).ok()?;
            (p.roce.header.bth.dest_qpn == 1).then(|| p.roce.payload.to_vec())
        })
        .collect()
}

/// One hostile MAD: random bytes of any length; a CM header over random
/// data with any attribute, any of them valid or not; a captured MAD with
/// bytes changed; a valid REQ; or a header with a wrong version or method.
fn garbage(rng: &mut Rng, captured: &[Vec<u8>]) -> Vec<u8> {
    match rng.next_u32() % 6 {
        0 => (0..rng.next_u32() % 300).map(|_| rng.next_u32() as u8).collect(),
        1 | 2 => {
            let mut mad: Vec<u8> = (0..MAD_LEN).map(|_| rng.next_u32() as u8).collect();
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16..18].copy_from_slice(&(0x0010 + (rng.next_u32() % 12) as u16).to_be_bytes());
            mad
        }
        3 => {
            let mut mad = captured[rng.next_u32() as usize % captured.len()].clone();
            for _ in 0..1 + rng.next_u32() % 8 {
                let at = HEADER_LEN + rng.next_u32() as usize % (MAD_LEN - HEADER_LEN);
                mad[at] = rng.next_u32() as u8;
            }
            mad
        }
        4 => random_req(rng, SERVICE).to_vec(),
        _ => {
            let mut mad = captured[rng.next_u32() as usize % captured.len()].clone();
            let field = rng.next_u32() as usize % 4;
            mad[field] ^= 1 + (rng.next_u32() % 255) as u8;
            mad
        }
    }
}

/// Everything queued, drained: (transmits, events).
fn drain(cm: &mut Protocol) -> (usize, usize) {
    let (mut transmits, mut events) = (0, 0);
    while cm.poll_transmit().is_some() {
        transmits += 1;
    }
    while cm.poll_event().is_some() {
        events += 1;
    }
    (transmits, events)
}

#[test]
fn random_and_malformed_mads_leave_the_protocol_sane() {
    let captured = captured_mads();
    let mut rng = Rng::new(0xbad_cafe);
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 32).unwrap();
    let id_a = pipe.connect(0x77);
    pipe.run_for(Duration::from_secs(1));
    let Event::Request { id: id_b, .. } = pipe.b.events[0] else { panic!("connected") };
    // B takes 100 000 hostile MADs, from its peer and from strangers, with
    // time passing; it never polls until the end.
    let mut now = pipe.now;
    let before = pipe.b.cm.stats().received;
    for i in 0..100_000u32 {
        let from = if i % 3 == 0 { pipe.a.at } else { random_peer(&mut rng) };
        let mad = garbage(&mut rng, &captured);
        pipe.b.cm.handle_mad(now, from, &mad);
        if i % 1000 == 0 {
            now += Duration::from_millis(u64::from(rng.next_u32() % 5000));
            pipe.b.cm.handle_timeout(now);
        }
    }
    let stats = pipe.b.cm.stats();
    let received = stats.received;
    let parsed = received.req
        + received.mra
        + received.rej
        + received.rep
        + received.rtu
        + received.dreq
        + received.drep
        + received.sidr_req
        + received.sidr_rep;
    assert_eq!(before.req + before.rtu, 2, "the connection's REQ and RTU");
    assert_eq!(parsed - 2 + stats.malformed, 100_000, "every MAD parsed or counted malformed");
    assert!(stats.malformed > 30_000 && received.req > 15_000, "{stats:?}");
    assert!(stats.live_ids <= 32 + 1, "the backlog bounds unanswered requests: {stats:?}");
    let (transmits, events) = drain(&mut pipe.b.cm);
    assert!(transmits <= 4 * 4096 && events <= 4 * 4096);
    // The peer's real connection was only at risk from the garbage sent in
    // its name with the right IDs; if it survived, it still disconnects.
    pipe.now = now;
    pipe.b.events.clear();
    if pipe.a.cm.disconnect(pipe.now, id_a, b"").is_ok() {
        pipe.run_for(Duration::from_secs(30));
        assert!(pipe.b.events.iter().any(|e| matches!(e, Event::DisconnectRequest { id, .. } if *id == id_b)));
    }
}

#[test]
fn req_flood_stays_within_the_backlog_and_the_table() {
    let mut rng = Rng::new(0xf100d);
    let mut cm = Protocol::new(ProtocolConfig { max_connections: 64, ..config(3, 0x33) }, 5);
    cm.listen(SERVICE, 16).unwrap();
    let mut now = Instant::now();
    // Unanswered: the backlog holds 16, the rest is dropped without a word.
    for _ in 0..20_000 {
        cm.handle_mad(now, random_peer(&mut rng), &random_req(&mut rng, SERVICE));
    }
    let stats = cm.stats();
    assert_eq!((stats.live_ids, stats.refused, stats.sent.rej), (16, 20_000 - 16, 0));
    // For nobody's service: a REJ each, no state.
    for _ in 0..20_000 {
        cm.handle_mad(now, random_peer(&mut rng), &random_req(&mut rng, SERVICE + 1));
        cm.poll_transmit();
    }
    assert_eq!((cm.stats().live_ids, cm.stats().rejected), (16, 20_000));
    // Answered as fast as they come: the table holds 64, then refuses.
    for _ in 0..20_000 {
        cm.handle_mad(now, random_peer(&mut rng), &random_req(&mut rng, SERVICE));
        while let Some(event) = cm.poll_event() {
            if let Event::Request { id, .. } = event {
                cm.accept(now, id, connect_reply(5)).unwrap();
            }
        }
        while cm.poll_transmit().is_some() {}
    }
    let stats = cm.stats();
    assert_eq!(stats.live_ids, 64, "{stats:?}");
    // Nobody sends RTUs: every REP retries out, and the table empties.
    while let Some(at) = cm.poll_timeout() {
        now = at;
        cm.handle_timeout(now);
        drain(&mut cm);
    }
    assert_eq!(cm.stats().live_ids, 0);
    // A peer who claims the longest response time (2.4 h a retry) is given it.
    assert!(now - Instant::now() > Duration::from_secs(3600));
}

/// A random run of the fuzz driver: both sides listen, then mostly
/// deliveries and the calls of a handshake, with some corruption, losses,
/// garbage, clock jumps and the other calls.
fn random_run(rng: &mut Rng) -> fuzz::Input {
    use fuzz::{Call, Step};
    const HANDSHAKE: [Call; 4] = [Call::Connect, Call::Accept, Call::ReadyToUse, Call::Disconnect];
    const OTHERS: [Call; 6] =
        [Call::Listen, Call::Unlisten, Call::Reject, Call::Destroy, Call::SidrRequest, Call::SidrReply];
    let listen = |side| Step::Call { side, call: Call::Listen, pick: 0, service: false };
    let mut steps = vec![listen(0), listen(1)];
    for _ in 0..rng.next_u32() % 256 {
        let side = rng.next_u32() as u8;
        let pick = rng.next_u32() as u8;
        let service = rng.next_u32().is_multiple_of(8);
        let call = |call| Step::Call { side, call, pick, service };
        steps.push(match rng.next_u32() % 32 {
            0..=13 => Step::Deliver { side, pick, repeat: false, changes: Vec::new() },
            14 => Step::Deliver { side, pick, repeat: true, changes: Vec::new() },
            15 => Step::Deliver { side, pick, repeat: false, changes: vec![(rng.next_u32() as u8, pick)] },
            16 => Step::Lose { side, pick },
            17 => Step::Raw {
                side,
                stranger: rng.next_u32().is_multiple_of(2),
                bytes: (0..rng.next_u32() % 260).map(|_| rng.next_u32() as u8).collect(),
            },
            18..=20 => Step::Advance { log2_micros: (rng.next_u32() % 45) as u8 },
            21..=29 => call(HANDSHAKE[rng.next_u32() as usize % HANDSHAKE.len()]),
            _ => call(OTHERS[rng.next_u32() as usize % OTHERS.len()]),
        });
    }
    fuzz::Input { max_connections: rng.next_u32() as u8, backlog: rng.next_u32() as u8, steps }
}

#[test]
fn fuzz_driver_checks_hold_on_random_runs() {
    let mut rng = Rng::new(0xc0ffee);
    let mut total = fuzz::Reached::default();
    for _ in 0..1000 {
        let reached = fuzz::run(&random_run(&mut rng));
        total.requests += reached.requests;
        total.established += reached.established;
        total.rejected += reached.rejected;
        total.disconnected += reached.disconnected;
        total.timewait_exits += reached.timewait_exits;
        total.sidr_replies += reached.sidr_replies;
    }
    // The runs get through whole handshakes and teardowns, not just garbage.
    assert!(total.established > 20 && total.timewait_exits > 20 && total.sidr_replies > 20, "{total:?}");
}

#[test]
fn each_kind_of_malformed_mad_is_dropped_and_counted() {
    let mut cm = Protocol::new(config(1, 1), 0);
    cm.listen(SERVICE, 4).unwrap();
    let now = Instant::now();
    let from = peer([10, 0, 0, 9]);
    let req = random_req(&mut Rng::new(1), SERVICE);
    let changed = |at: usize, value: u8| {
        let mut mad = req;
        mad[at] = value;
        mad
    };
    let cases: [(&str, Vec<u8>); 8] = [
        ("truncated", req[..255].to_vec()),
        ("empty", Vec::new()),
        ("base version 2", changed(0, 2).to_vec()),
        ("class 3 (SA)", changed(1, 3).to_vec()),
        ("class version 1", changed(2, 1).to_vec()),
        ("method Get", changed(3, 1).to_vec()),
        ("attribute LAP", changed(17, 0x19).to_vec()),
        ("attribute 0x99", changed(17, 0x99).to_vec()),
    ];
    for (i, (what, mad)) in cases.iter().enumerate() {
        cm.handle_mad(now, from, mad);
        assert_eq!(cm.stats().malformed, i as u64 + 1, "{what}");
    }
    // A REJ for no ID of ours is never answered.
    let mut rej = changed(17, 0x12);
    rej[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&0x0100_0042u32.to_be_bytes());
    cm.handle_mad(now, from, &rej);
    let stats = cm.stats();
    assert_eq!((stats.malformed, stats.unmatched, stats.received.rej, stats.live_ids), (8, 1, 1, 0));
    assert!(cm.poll_transmit().is_none() && cm.poll_event().is_none());
}
