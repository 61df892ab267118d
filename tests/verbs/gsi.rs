//! GSI QPs on a shared port (rxe-spec N-5): each context has its own QP1,
//! and the kernel's steering sends a CM message to the one it is for.

use softroce::verbs::*;

use crate::support::verbs::*;

/// A GSI MAD carrying a CM message: attribute `attr`, first and second
/// words of the message (Local and Remote Comm IDs, or a SIDR Request ID),
/// and the Service ID.
fn cm_mad(attr: u16, first: u32, second: u32, service: u64) -> Vec<u8> {
    let mut mad = vec![0u8; 256];
    (mad[0], mad[1], mad[2], mad[3]) = (1, 0x07, 2, 0x03);
    mad[16..18].copy_from_slice(&attr.to_be_bytes());
    mad[24..28].copy_from_slice(&first.to_be_bytes());
    mad[28..32].copy_from_slice(&second.to_be_bytes());
    mad[32..40].copy_from_slice(&service.to_be_bytes());
    mad
}

/// A context on 127.0.0.1 with its GSI QP up, and a region for MADs.
struct Gsi {
    node: Node,
    qp: QueuePair,
    mr: MemoryRegion,
}

impl Gsi {
    fn open(name: &str, port: u16) -> Gsi {
        let node = Node::open(name, IP_A, ContextOptions { port, ..ContextOptions::default() });
        let qp = node.init(QpType::Ud).gsi().build().unwrap();
        assert_eq!(qp.qpn(), GSI_QPN);
        qp.activate(GSI_QKEY).unwrap();
        let mr = node.mr(1 << 16);
        for i in 0..8 {
            // A UD receive starts with 40 bytes for the GRH.
            qp.post_recv(RecvWr { wr_id: i, sg_list: softroce::sg_list![mr.sge(4096 * i as usize, 4096)] }).unwrap();
        }
        Gsi { node, qp, mr }
    }

    fn send(&self, mad: &[u8]) {
        self.mr.write(60_000, mad).unwrap();
        let ah = self.node.pd.create_ah(self.node.ctx.device().gid(1).unwrap());
        let wr = SendWr {
            ud: Some(ah.ud_dest(GSI_QPN, GSI_QKEY)),
            ..SendWr::new(99, SendOp::Send).with_sge(self.mr.sge(60_000, mad.len()))
        };
        self.qp.post_send(wr).unwrap();
        assert_eq!(next_wc(&self.node.cq).status, WcStatus::Success);
    }

    /// The MAD received next, without its GRH.
    fn receive(&self) -> Vec<u8> {
        let wc = next_wc(&self.node.cq);
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        let mut mad = vec![0u8; wc.byte_len as usize - 40];
        self.mr.read(4096 * wc.wr_id as usize + 40, &mut mad).unwrap();
        mad
    }
}

#[test]
fn a_cm_request_reaches_the_listening_context_and_the_answer_its_comm_id_owner() {
    let port = free_port(&[IP_A]);
    let (client, server) = (Gsi::open("gsi_client", port), Gsi::open("gsi_server", port));
    assert_ne!(client.node.ctx.slot(), server.node.ctx.slot());
    let service = 0x0106_4e20; // rdma_cm TCP port space, port 20000
    server.node.ctx.listen_cm(service).unwrap();
    // A REQ whose Local Comm ID carries the client's slot.
    let client_id = u32::from(client.node.ctx.slot()) << 24 | 0x42;
    let req = cm_mad(0x0010, client_id, 0, u64::from(service));
    client.send(&req);
    assert_eq!(server.receive(), req);
    // The REP, to the client's Comm ID.
    let server_id = u32::from(server.node.ctx.slot()) << 24 | 0x17;
    let rep = cm_mad(0x0013, server_id, client_id, 0);
    server.send(&rep);
    assert_eq!(client.receive(), rep);
    // The RTU, to the server's.
    let rtu = cm_mad(0x0014, client_id, server_id, 0);
    client.send(&rtu);
    assert_eq!(server.receive(), rtu);
    assert_no_wc(&client.node.cq);
    // The kernel's steering put each where it belongs: none was passed on.
    for gsi in [&client, &server] {
        assert_eq!(gsi.node.ctx.counters().link.forwarded, 0);
    }
    // A second GSI QP in one context is refused.
    assert!(client.node.init(QpType::Ud).gsi().build().is_err());
    assert!(client.node.init(QpType::Rc).gsi().build().is_err());
    server.node.ctx.unlisten_cm(service).unwrap();
}

/// A SIDR_REQ that comes before anyone listens on its service is held
/// (rxe-spec N-5a) and reaches the context that listens within the grace,
/// wherever the kernel's hash put it first; one for a service nobody ever
/// listens on reaches some context's CM, to be refused, once the grace is over.
#[test]
fn a_cm_request_before_its_listener_waits_for_it() {
    let port = free_port(&[IP_A]);
    let (client, server) = (Gsi::open("gsi_early_client", port), Gsi::open("gsi_early_server", port));
    let service = 0x0111_4e21; // rdma_cm UDP port space, port 20001
    let client_id = u32::from(client.node.ctx.slot()) << 24 | 0x43;
    let early = cm_mad(0x0017, client_id, 0, u64::from(service));
    client.send(&early);
    std::thread::sleep(std::time::Duration::from_millis(10));
    server.node.ctx.listen_cm(service).unwrap();
    assert_eq!(server.receive(), early);
    assert_no_wc(&client.node.cq);
    let unclaimed = cm_mad(0x0017, client_id + 1, 0, u64::from(service + 1));
    let sent = std::time::Instant::now();
    client.send(&unclaimed);
    let deadline = sent + WAIT;
    let got = loop {
        assert!(std::time::Instant::now() < deadline, "the unclaimed request reached nobody");
        if let Some(gsi) = [&client, &server].into_iter().find(|g| !g.node.cq.is_empty()) {
            break gsi.receive();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(got, unclaimed);
    assert!(sent.elapsed() >= softroce::net::udp::UNCLAIMED_GRACE, "refused after {:?}", sent.elapsed());
    server.node.ctx.unlisten_cm(service).unwrap();
}
