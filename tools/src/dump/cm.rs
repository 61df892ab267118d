//! Connection management MADs in the dump: the summary on the packet line,
//! the JSON object and the `--explain` lines.

use std::net::{IpAddr, Ipv6Addr};

use serde_json::{json, Value};
use softroce::wire::cm::{self, CmPathRepr, MessageRef, RejReason, SidrStatus, TransportService};
use softroce::wire::cma::{self, CmaHeader, CmaHeaderRepr, PortSpace};
use softroce::wire::mad::{class, method, MadRepr};
use softroce::wire::CmMessage;

use super::decode::Gsi;

/// `TCP:7174` for an rdma_cm service ID, the number in hex for any other.
pub fn service(service_id: u64) -> String {
    match PortSpace::from_service_id(service_id) {
        Some((ps, port)) => format!("{}:{port}", ps.name()),
        None => format!("{service_id:#018x}"),
    }
}

/// `8 (invalid service ID)`.
fn reason(reason: RejReason) -> String {
    match reason.name() {
        Some(name) => format!("{} ({name})", reason.0),
        None => format!("{} (undefined)", reason.0),
    }
}

/// `0 (success)`.
fn status(status: SidrStatus) -> String {
    match status.name() {
        Some(name) => format!("{} ({name})", status.0),
        None => format!("{} (undefined)", status.0),
    }
}

fn message_ref(m: MessageRef) -> &'static str {
    match m {
        MessageRef::Req => "REQ",
        MessageRef::Rep => "REP",
        MessageRef::Other => "other",
    }
}

/// The name of an attribute, or its number.
fn attribute(id: u16) -> String {
    cm::attribute_name(id).map(str::to_string).unwrap_or_else(|| format!("attribute {id:#06x}"))
}

/// What follows the DETH on the packet line: `CM REQ(local_id=… sid=TCP:7174 …)`.
pub fn summary(gsi: &Gsi) -> String {
    let mad = match gsi {
        Gsi::Cm(mad) => mad,
        Gsi::OtherMad(h) => {
            return format!(
                "MAD(class={:#04x} version={} method={:#04x} attr={:#06x})",
                h.mgmt_class, h.class_version, h.method, h.attribute_id
            )
        }
        Gsi::BadCm(h, e) => return format!("CM {}(malformed: {e})", attribute(h.attribute_id)),
        Gsi::NotMad => return "MAD(too short)".to_string(),
    };
    let ids = |local: u32, remote: u32| format!("local_id={local:#010x} remote_id={remote:#010x}");
    let fields = match &mad.message {
        CmMessage::Req(q) => format!(
            "local_id={:#010x} sid={} qpn={:#x} psn={} mtu={}",
            q.local_comm_id,
            service(q.service_id),
            q.local_qpn,
            q.starting_psn,
            cm::mtu_bytes(q.path_mtu).map_or_else(|| format!("code {}", q.path_mtu), |b| b.to_string())
        ),
        CmMessage::Rep(p) => {
            format!("{} qpn={:#x} psn={}", ids(p.local_comm_id, p.remote_comm_id), p.local_qpn, p.starting_psn)
        }
        CmMessage::Rtu(u) => ids(u.local_comm_id, u.remote_comm_id),
        CmMessage::Dreq(d) => format!("{} remote_qpn={:#x}", ids(d.local_comm_id, d.remote_comm_id), d.remote_qpn),
        CmMessage::Drep(d) => ids(d.local_comm_id, d.remote_comm_id),
        CmMessage::Rej(j) => format!(
            "{} reason={} rejected={}",
            ids(j.local_comm_id, j.remote_comm_id),
            reason(j.reason),
            message_ref(j.message_rejected)
        ),
        CmMessage::Mra(m) => format!(
            "{} mraed={} service_timeout={}",
            ids(m.local_comm_id, m.remote_comm_id),
            message_ref(m.message_mraed),
            m.service_timeout
        ),
        CmMessage::SidrReq(q) => format!("request_id={:#010x} sid={}", q.request_id, service(q.service_id)),
        CmMessage::SidrRep(p) => format!(
            "request_id={:#010x} sid={} status={} qpn={:#x} qkey={:#010x}",
            p.request_id,
            service(p.service_id),
            status(p.status),
            p.qpn,
            p.qkey
        ),
    };
    format!("CM {}({fields})", mad.message.name())
}

/// The short label of a ladder arrow: `CM REQ`, `CM REJ 8`.
pub fn label(gsi: &Gsi) -> String {
    match gsi {
        Gsi::Cm(mad) => match &mad.message {
            CmMessage::Rej(j) => format!("CM REJ {}", j.reason.0),
            other => format!("CM {}", other.name()),
        },
        Gsi::BadCm(h, _) => format!("CM {} malformed", attribute(h.attribute_id)),
        Gsi::OtherMad(_) | Gsi::NotMad => "MAD".to_string(),
    }
}

fn header_json(h: &MadRepr) -> Value {
    json!({
        "base_version": h.base_version,
        "mgmt_class": h.mgmt_class,
        "class_version": h.class_version,
        "method": h.method,
        "status": h.status,
        "transaction_id": h.transaction_id,
        "attribute_id": h.attribute_id,
        "attribute_modifier": h.attribute_modifier,
    })
}

fn path_json(p: &CmPathRepr) -> Value {
    json!({
        "local_gid": gid(&p.local_gid).to_string(),
        "remote_gid": gid(&p.remote_gid).to_string(),
        "local_lid": p.local_lid,
        "remote_lid": p.remote_lid,
        "flow_label": p.flow_label,
        "traffic_class": p.traffic_class,
        "hop_limit": p.hop_limit,
        "sl": p.sl,
        "local_ack_timeout": p.local_ack_timeout,
    })
}

/// The CMA header of a REQ's or SIDR_REQ's private data, if it is one.
fn cma_header(private_data: &[u8]) -> Option<CmaHeaderRepr> {
    CmaHeaderRepr::parse(&CmaHeader::new_checked(private_data).ok()?).ok()
}

fn cma_json(private_data: &[u8]) -> Value {
    match cma_header(private_data) {
        Some(h) => json!({"src": h.src.to_string(), "src_port": h.src_port, "dst": h.dst.to_string()}),
        None => Value::Null,
    }
}

/// The `"mad"` object of a packet to QP 1: the header and, for a CM message,
/// `"cm"` with its type and fields.
pub fn json(gsi: &Gsi) -> Value {
    let mad = match gsi {
        Gsi::Cm(mad) => mad,
        Gsi::OtherMad(h) => return json!({"header": header_json(h)}),
        Gsi::BadCm(h, e) => return json!({"header": header_json(h), "malformed": e.to_string()}),
        Gsi::NotMad => return json!({"malformed": "shorter than a MAD"}),
    };
    let message = match &mad.message {
        CmMessage::Req(q) => json!({
            "local_comm_id": q.local_comm_id,
            "service_id": q.service_id,
            "service": service(q.service_id),
            "local_ca_guid": q.local_ca_guid,
            "local_qpn": q.local_qpn,
            "starting_psn": q.starting_psn.value(),
            "responder_resources": q.responder_resources,
            "initiator_depth": q.initiator_depth,
            "transport": transport_name(q.transport_service),
            "remote_cm_response_timeout": q.remote_cm_response_timeout,
            "local_cm_response_timeout": q.local_cm_response_timeout,
            "retry_count": q.retry_count,
            "rnr_retry_count": q.rnr_retry_count,
            "max_cm_retries": q.max_cm_retries,
            "pkey": q.pkey,
            "path_mtu": cm::mtu_bytes(q.path_mtu),
            "srq": q.srq,
            "primary_path": path_json(&q.primary_path),
            "cma": cma_json(&q.private_data),
        }),
        CmMessage::Rep(p) => json!({
            "local_comm_id": p.local_comm_id,
            "remote_comm_id": p.remote_comm_id,
            "local_qpn": p.local_qpn,
            "starting_psn": p.starting_psn.value(),
            "local_ca_guid": p.local_ca_guid,
            "responder_resources": p.responder_resources,
            "initiator_depth": p.initiator_depth,
            "target_ack_delay": p.target_ack_delay,
            "rnr_retry_count": p.rnr_retry_count,
            "srq": p.srq,
        }),
        CmMessage::Rtu(u) => json!({"local_comm_id": u.local_comm_id, "remote_comm_id": u.remote_comm_id}),
        CmMessage::Drep(d) => json!({"local_comm_id": d.local_comm_id, "remote_comm_id": d.remote_comm_id}),
        CmMessage::Dreq(d) => json!({
            "local_comm_id": d.local_comm_id,
            "remote_comm_id": d.remote_comm_id,
            "remote_qpn": d.remote_qpn,
        }),
        CmMessage::Rej(j) => json!({
            "local_comm_id": j.local_comm_id,
            "remote_comm_id": j.remote_comm_id,
            "reason": j.reason.0,
            "reason_name": j.reason.name(),
            "message_rejected": message_ref(j.message_rejected),
            "ari_length": j.ari_length,
        }),
        CmMessage::Mra(m) => json!({
            "local_comm_id": m.local_comm_id,
            "remote_comm_id": m.remote_comm_id,
            "message_mraed": message_ref(m.message_mraed),
            "service_timeout": m.service_timeout,
        }),
        CmMessage::SidrReq(q) => json!({
            "request_id": q.request_id,
            "pkey": q.pkey,
            "service_id": q.service_id,
            "service": service(q.service_id),
            "cma": cma_json(&q.private_data),
        }),
        CmMessage::SidrRep(p) => json!({
            "request_id": p.request_id,
            "status": p.status.0,
            "status_name": p.status.name(),
            "qpn": p.qpn,
            "qkey": p.qkey,
            "service_id": p.service_id,
            "service": service(p.service_id),
        }),
    };
    let mut cm = json!({"type": mad.message.name()});
    if let (Value::Object(cm), Value::Object(fields)) = (&mut cm, message) {
        cm.extend(fields);
    }
    json!({"header": header_json(&mad.header), "cm": cm})
}

/// A GID as an IPv6 address: `::ffff:10.77.0.3` for an IPv4 one.
fn gid(bytes: &[u8; 16]) -> Ipv6Addr {
    Ipv6Addr::from(*bytes)
}

fn transport_name(t: TransportService) -> &'static str {
    match t {
        TransportService::Rc => "RC",
        TransportService::Uc => "UC",
        TransportService::Rd => "RD",
        TransportService::Extended => "extended",
    }
}

/// `20 = 4.29 s`: a CM timeout code and the time it stands for.
fn timeout(code: u8) -> String {
    let nanos = cm::timeout_nanos(code);
    let text = if nanos >= 1_000_000_000 {
        format!("{:.2} s", nanos as f64 / 1e9)
    } else if nanos >= 1_000_000 {
        format!("{:.2} ms", nanos as f64 / 1e6)
    } else {
        format!("{:.1} us", nanos as f64 / 1e3)
    };
    format!("{code} = {text}")
}

/// The MAD header line, the first of a GSI packet's explanation.
pub fn header_line(gsi: &Gsi) -> String {
    let h = match gsi {
        Gsi::Cm(mad) => &mad.header,
        Gsi::OtherMad(h) | Gsi::BadCm(h, _) => h,
        Gsi::NotMad => {
            return "a packet to QP 1 should carry a 256-byte MAD, and this payload is too short for \
                    one: the GSI drops it"
                .to_string()
        }
    };
    let class_name = match h.mgmt_class {
        class::CM => "communication management",
        class::SUBN_ADM => "subnet administration",
        class::PERF => "performance management",
        class::DEV_MGT => "device management",
        _ => "another class",
    };
    let method_name = match h.method {
        method::SEND => "Send",
        method::GET => "Get",
        method::SET => "Set",
        method::GET_RESP => "GetResp",
        _ => "another method",
    };
    let attribute = match (h.mgmt_class, cm::attribute_name(h.attribute_id)) {
        (class::CM, Some(name)) => format!("attribute {:#06x} ({name})", h.attribute_id),
        _ => format!("attribute {:#06x}", h.attribute_id),
    };
    format!(
        "MAD: class {:#04x} ({class_name}) version {}, method {method_name} ({:#04x}), {attribute}, \
         transaction ID {:#018x}",
        h.mgmt_class, h.class_version, h.method, h.transaction_id
    )
}

/// What the message says, after the header line.
pub fn message_lines(gsi: &Gsi, src: IpAddr, dst: IpAddr) -> Vec<String> {
    let mad = match gsi {
        Gsi::Cm(mad) => mad,
        Gsi::OtherMad(h) if h.mgmt_class == class::CM => {
            return vec![format!(
                "a CM MAD of class version {} (or not 256 bytes): the kernel's CM speaks version 2 \
                 only and ignores it",
                h.class_version
            )]
        }
        Gsi::OtherMad(_) => {
            return vec!["not a CM MAD: on RoCE the GSI carries connection management and little \
                         else"
                .to_string()]
        }
        Gsi::BadCm(_, e) => return vec![format!("the CM message does not decode ({e}); a CM drops such a MAD")],
        Gsi::NotMad => return Vec::new(),
    };
    let mut lines = match &mad.message {
        CmMessage::Req(q) => req_lines(q, src, dst),
        CmMessage::Rep(p) => vec![
            format!(
                "REP: {src} accepts the REQ of communication ID {:#010x}, naming the connection \
                 {:#010x} on its side; its QP {:#x} expects PSN {} first, so the requester's \
                 first request carries PSN {}",
                p.remote_comm_id, p.local_comm_id, p.local_qpn, p.starting_psn, p.starting_psn
            ),
            format!(
                "responder resources {} and initiator depth {} as granted; target ACK delay {}; the \
                 requester's QP is to use RNR retry count {}{}",
                p.responder_resources,
                p.initiator_depth,
                timeout(p.target_ack_delay),
                p.rnr_retry_count,
                if p.rnr_retry_count == 7 { " (7: retry without limit)" } else { "" }
            ),
            "the requester answers with an RTU; if the REP is lost, it sends the REQ again and \
             the responder repeats this REP"
                .to_string(),
        ],
        CmMessage::Rtu(u) => vec![format!(
            "RTU (ready to use): {src} got the REP for connection {:#010x}; both QPs are ready to \
             send, and the responder may now send too ({dst}'s connection ID {:#010x})",
            u.local_comm_id, u.remote_comm_id
        )],
        CmMessage::Dreq(d) => vec![format!(
            "DREQ: {src} disconnects connection {:#010x} (the receiver's ID {:#010x}, its QP \
             {:#x}); the receiver moves its QP to the error state, answers with a DREP, and both \
             sides wait a while (time wait) before reusing the IDs",
            d.local_comm_id, d.remote_comm_id, d.remote_qpn
        )],
        CmMessage::Drep(d) => vec![format!(
            "DREP: {src} confirms the disconnection of connection {:#010x}; the connection is gone",
            d.remote_comm_id
        )],
        CmMessage::Rej(j) => rej_lines(j, src),
        CmMessage::Mra(m) => vec![format!(
            "MRA (message receipt acknowledged): {src} got the {} of connection {:#010x} but needs \
             more time to answer: service timeout {}; the sender holds off its retries that long",
            message_ref(m.message_mraed),
            m.remote_comm_id,
            timeout(m.service_timeout)
        )],
        CmMessage::SidrReq(q) => {
            let mut lines = vec![format!(
                "SIDR_REQ (service ID resolution): {src} asks {dst} which UD QP serves service ID \
                 {:#018x}{}; request ID {:#010x}; no connection results, just the answer",
                q.service_id,
                rdma_cm_service(q.service_id),
                q.request_id
            )];
            lines.extend(cma_lines(&q.private_data, cma::MAX_SIDR_REQ_USER_DATA));
            lines
        }
        CmMessage::SidrRep(p) => {
            let qkey_note = if p.qkey == cma::RDMA_UDP_QKEY { " (rdma_cm's Q_Key for the UDP port space)" } else { "" };
            vec![format!(
                "SIDR_REP: answers request {:#010x}: status {}; datagrams for service {} go to QP \
                 {:#x} with Q_Key {:#010x}{qkey_note}",
                p.request_id,
                status(p.status),
                service(p.service_id),
                p.qpn,
                p.qkey
            )]
        }
    };
    let private = mad.message.private_data();
    let skip = match mad.message {
        CmMessage::Req(_) | CmMessage::SidrReq(_) => cma::CMA_HEADER_LEN,
        _ => 0,
    };
    let used = private[skip..].iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if used > 0 && skip == 0 {
        lines.push(format!(
            "private data: {used} of its {} bytes used, for the applications (the CM passes it on \
             untouched)",
            private.len()
        ));
    }
    lines
}

/// `, which rdma_cm reads as TCP port 7174`.
fn rdma_cm_service(service_id: u64) -> String {
    match PortSpace::from_service_id(service_id) {
        Some((ps, port)) => {
            format!(", which rdma_cm reads as port space {:#06x} (RDMA_PS_{}), port {port}", ps.code(), ps.name())
        }
        None => String::new(),
    }
}

fn req_lines(q: &cm::ReqRepr, src: IpAddr, dst: IpAddr) -> Vec<String> {
    let mtu = cm::mtu_bytes(q.path_mtu).map_or_else(|| format!("reserved code {}", q.path_mtu), |b| b.to_string());
    let mut lines = vec![
        format!(
            "REQ: {src} asks to connect its {} QP {:#x} to service ID {:#018x}{}; it names the \
             connection {:#010x} (local communication ID)",
            transport_name(q.transport_service),
            q.local_qpn,
            q.service_id,
            rdma_cm_service(q.service_id),
            q.local_comm_id
        ),
        format!(
            "starting PSN {}: the PSN the requester's QP expects first, so {dst}'s QP will send \
             from it (the REP announces the other direction's); path MTU {mtu}; P_Key {:#06x}",
            q.starting_psn, q.pkey
        ),
        format!(
            "responder resources {}, initiator depth {}: RDMA READs and atomics in flight towards \
             the requester and from it; retry count {}, RNR retry count {}{}",
            q.responder_resources,
            q.initiator_depth,
            q.retry_count,
            q.rnr_retry_count,
            if q.rnr_retry_count == 7 { " (7: retry without limit)" } else { "" }
        ),
        format!(
            "remote CM response timeout {}: how long {dst} may take to answer; {src} sends the REQ \
             again if nothing comes, up to {} times (max CM retries); local CM response timeout {}",
            timeout(q.remote_cm_response_timeout),
            q.max_cm_retries,
            timeout(q.local_cm_response_timeout)
        ),
    ];
    let p = &q.primary_path;
    lines.push(format!(
        "primary path: GID {} > {}, LIDs {:#06x}/{:#06x} (RoCE has none), flow label {:#07x} (on \
         RoCEv2 it picks the UDP source port), traffic class {}, hop limit {}, SL {}, local ACK \
         timeout {} (the QP's transport timeout)",
        gid(&p.local_gid),
        gid(&p.remote_gid),
        p.local_lid,
        p.remote_lid,
        p.flow_label,
        p.traffic_class,
        p.hop_limit,
        p.sl,
        timeout(p.local_ack_timeout)
    ));
    if !q.alternate_path.is_empty() {
        lines.push(format!(
            "alternate path: GID {} > {} (automatic path migration)",
            gid(&q.alternate_path.local_gid),
            gid(&q.alternate_path.remote_gid)
        ));
    }
    lines.extend(cma_lines(&q.private_data, cma::MAX_REQ_USER_DATA));
    lines
}

/// The CMA header at the start of a REQ's or SIDR_REQ's private data.
fn cma_lines(private_data: &[u8], user: usize) -> Vec<String> {
    let Some(h) = cma_header(private_data) else {
        return vec!["the private data does not start with an rdma_cm header: an IB CM consumer, \
                     not rdma_cm"
            .to_string()];
    };
    let user_data = &private_data[cma::CMA_HEADER_LEN..];
    let used = user_data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let consumer = if used == 0 {
        format!("none of the {user} bytes left for the application's private data are used")
    } else {
        format!("{used} of the {user} bytes left for the application's private data are used")
    };
    vec![format!(
        "private data: rdma_cm's header first (36 bytes): IPv{} {}:{} > {}, the source port \
         here and the destination port in the service ID; {consumer}",
        h.ip_version(),
        h.src,
        h.src_port,
        h.dst
    )]
}

fn rej_lines(j: &cm::RejRepr, src: IpAddr) -> Vec<String> {
    let why = match j.reason {
        RejReason::INVALID_SERVICE_ID => {
            "nobody listens on that service ID (rdma_cm: nothing bound to that port); librdmacm \
             reports RDMA_CM_EVENT_REJECTED with status 8"
        }
        RejReason::CONSUMER_DEFINED => "the application refused (rdma_reject); its private data may say why",
        RejReason::TIMEOUT => "the sender gave up waiting: its CM timed out on this connection",
        RejReason::STALE_CONN => "the QP or communication ID is still tied to an older connection",
        RejReason::NO_QP | RejReason::NO_RESOURCES => "the receiver is out of resources",
        _ => "see the IBTA's list of rejection reasons",
    };
    let mut lines = vec![format!(
        "REJ: {src} rejects the {} of connection {:#010x}: reason {}: {why}",
        message_ref(j.message_rejected),
        j.remote_comm_id,
        reason(j.reason)
    )];
    if j.local_comm_id == 0 {
        lines.push("local communication ID 0: the rejecter never took the request on".to_string());
    }
    if j.ari_length > 0 {
        lines.push(format!("{} bytes of additional rejection information (ARI)", j.ari_length));
    }
    lines
}
