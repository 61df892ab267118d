//! Property tests for the CM wire format (rxe-spec/cm.md): every message
//! value survives a trip through its bytes, a value too wide for its fields
//! is refused rather than cut, and no input makes a parser panic.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use softroce::wire::cm::{
    attr, CmPathRepr, DrepRepr, DreqRepr, MessageRef, MraRepr, RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr,
    SidrRepRepr, SidrReqRepr, SidrStatus, TransportService,
};
use softroce::wire::cma::{CmaHeader, CmaHeaderRepr};
use softroce::wire::mad::{Mad, MadRepr, DATA_LEN, HEADER_LEN, MAD_LEN};
use softroce::wire::{CmMad, CmMessage, Error, Psn};

use crate::support::captures;

// ---------------------------------------------------------------- strategies

/// Values of `width` bits.
fn bits(width: u32) -> impl Strategy<Value = u32> {
    0..=((1u64 << width) - 1) as u32
}

fn bits8(width: u32) -> impl Strategy<Value = u8> {
    bits(width).prop_map(|v| v as u8)
}

fn psn() -> impl Strategy<Value = Psn> {
    bits(24).prop_map(Psn::new)
}

/// `N` bytes, mostly zero as applications leave them, sometimes random.
fn bytes<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop_oneof![
        Just([0u8; N]),
        vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap()),
        (vec(any::<u8>(), 0..=N)).prop_map(|v| {
            let mut out = [0u8; N];
            out[..v.len()].copy_from_slice(&v);
            out
        }),
    ]
}

fn message_ref() -> impl Strategy<Value = MessageRef> {
    select(vec![MessageRef::Req, MessageRef::Rep, MessageRef::Other])
}

fn path() -> impl Strategy<Value = CmPathRepr> {
    (
        any::<(u16, u16, [u8; 16], [u8; 16])>(),
        (bits(20), bits8(6), any::<(u8, u8)>(), bits8(4), any::<bool>(), bits8(5)),
    )
        .prop_map(
            |(
                (local_lid, remote_lid, local_gid, remote_gid),
                (flow_label, packet_rate, (traffic_class, hop_limit), sl, subnet_local, local_ack_timeout),
            )| CmPathRepr {
                local_lid,
                remote_lid,
                local_gid,
                remote_gid,
                flow_label,
                packet_rate,
                traffic_class,
                hop_limit,
                sl,
                subnet_local,
                local_ack_timeout,
            },
        )
}

fn req() -> impl Strategy<Value = ReqRepr> {
    let ids = (any::<(u32, u64, u64, u32)>(), bits(24), bits(24), bits(24), any::<(u8, u8)>());
    let flags = (
        bits8(5),
        bits8(2).prop_map(TransportService::from_code),
        any::<bool>(),
        psn(),
        bits8(5),
        bits8(3),
        any::<u16>(),
        bits8(4),
        any::<bool>(),
        bits8(3),
        bits8(4),
        (any::<bool>(), bits8(3), any::<bool>()),
    );
    (ids, flags, path(), prop_oneof![Just(CmPathRepr::default()), path()], bytes()).prop_map(
        |(ids, flags, primary_path, alternate_path, private_data)| {
            let ((local_comm_id, service_id, local_ca_guid, local_qkey), vendor_id, local_qpn, local_eecn, rest) = ids;
            let (responder_resources, initiator_depth) = rest;
            let (
                remote_cm_response_timeout,
                transport_service,
                end_to_end_flow_control,
                starting_psn,
                local_cm_response_timeout,
                retry_count,
                pkey,
                path_mtu,
                rdc_exists,
                rnr_retry_count,
                max_cm_retries,
                (srq, extended_transport_type, sap_supported),
            ) = flags;
            ReqRepr {
                local_comm_id,
                vendor_id,
                service_id,
                local_ca_guid,
                local_qkey,
                local_qpn,
                responder_resources,
                local_eecn,
                initiator_depth,
                remote_eecn: local_eecn ^ 0x5a5a5a,
                remote_cm_response_timeout,
                transport_service,
                end_to_end_flow_control,
                starting_psn,
                local_cm_response_timeout,
                retry_count,
                pkey,
                path_mtu,
                rdc_exists,
                rnr_retry_count,
                max_cm_retries,
                srq,
                extended_transport_type,
                primary_path,
                alternate_path,
                sap_supported,
                private_data,
            }
        },
    )
}

fn mra() -> impl Strategy<Value = MraRepr> {
    (any::<(u32, u32)>(), message_ref(), bits8(5), bytes()).prop_map(
        |((local_comm_id, remote_comm_id), message_mraed, service_timeout, private_data)| MraRepr {
            local_comm_id,
            remote_comm_id,
            message_mraed,
            service_timeout,
            private_data,
        },
    )
}

fn rej() -> impl Strategy<Value = RejRepr> {
    (any::<(u32, u32, u16)>(), message_ref(), 0..=72u8, bytes(), bytes()).prop_map(
        |((local_comm_id, remote_comm_id, reason), message_rejected, ari_length, ari, private_data)| RejRepr {
            local_comm_id,
            remote_comm_id,
            message_rejected,
            ari_length,
            reason: RejReason(reason),
            ari,
            private_data,
        },
    )
}

fn rep() -> impl Strategy<Value = RepRepr> {
    (
        (any::<(u32, u32, u32, u64)>(), bits(24), bits(24), bits(24), psn()),
        (any::<(u8, u8)>(), bits8(5), bits8(2), any::<bool>(), bits8(3), any::<bool>()),
        bytes(),
    )
        .prop_map(|(ids, flags, private_data)| {
            let ((local_comm_id, remote_comm_id, local_qkey, local_ca_guid), local_qpn, vendor_id, local_eecn, psn) =
                ids;
            let (
                (responder_resources, initiator_depth),
                target_ack_delay,
                failover_accepted,
                end_to_end_flow_control,
                rnr_retry_count,
                srq,
            ) = flags;
            RepRepr {
                local_comm_id,
                remote_comm_id,
                local_qkey,
                local_qpn,
                vendor_id,
                local_eecn,
                starting_psn: psn,
                responder_resources,
                initiator_depth,
                target_ack_delay,
                failover_accepted,
                end_to_end_flow_control,
                rnr_retry_count,
                srq,
                local_ca_guid,
                private_data,
            }
        })
}

fn sidr_rep() -> impl Strategy<Value = SidrRepRepr> {
    (any::<(u32, u8, u64, u32)>(), 0..=72u8, bits(24), bits(24), bytes(), bytes()).prop_map(
        |((request_id, status, service_id, qkey), additional_info_length, vendor_id, qpn, additional_info, private)| {
            SidrRepRepr {
                request_id,
                status: SidrStatus(status),
                additional_info_length,
                vendor_id,
                qpn,
                service_id,
                qkey,
                additional_info,
                private_data: private,
            }
        },
    )
}

/// Any CM message with every field in range.
fn message() -> impl Strategy<Value = CmMessage> {
    let ids = any::<(u32, u32)>();
    prop_oneof![
        req().prop_map(CmMessage::Req),
        mra().prop_map(CmMessage::Mra),
        rej().prop_map(CmMessage::Rej),
        rep().prop_map(CmMessage::Rep),
        (ids, bytes()).prop_map(|((local_comm_id, remote_comm_id), private_data)| CmMessage::Rtu(RtuRepr {
            local_comm_id,
            remote_comm_id,
            private_data
        })),
        (ids, bits(24), bytes()).prop_map(|((local_comm_id, remote_comm_id), remote_qpn, private_data)| {
            CmMessage::Dreq(DreqRepr { local_comm_id, remote_comm_id, remote_qpn, private_data })
        }),
        (ids, bytes()).prop_map(|((local_comm_id, remote_comm_id), private_data)| CmMessage::Drep(DrepRepr {
            local_comm_id,
            remote_comm_id,
            private_data
        })),
        (any::<(u32, u16, u64)>(), bytes()).prop_map(|((request_id, pkey, service_id), private_data)| {
            CmMessage::SidrReq(SidrReqRepr { request_id, pkey, service_id, private_data })
        }),
        sidr_rep().prop_map(CmMessage::SidrRep),
    ]
}

/// Whether every field of a REQ fits its bits.
fn req_fits(r: &ReqRepr) -> bool {
    let path_fits =
        |p: &CmPathRepr| p.flow_label < 1 << 20 && p.packet_rate < 64 && p.sl < 16 && p.local_ack_timeout < 32;
    r.vendor_id < 1 << 24
        && r.local_qpn < 1 << 24
        && r.local_eecn < 1 << 24
        && r.remote_eecn < 1 << 24
        && r.remote_cm_response_timeout < 32
        && r.local_cm_response_timeout < 32
        && r.retry_count < 8
        && r.path_mtu < 16
        && r.rnr_retry_count < 8
        && r.max_cm_retries < 16
        && r.extended_transport_type < 8
        && path_fits(&r.primary_path)
        && path_fits(&r.alternate_path)
}

/// A REQ in range, then with one field (chosen by `which`) set to `wide`.
fn widened(mut r: ReqRepr, which: usize, wide: u32) -> ReqRepr {
    match which % 12 {
        0 => r.vendor_id = wide,
        1 => r.local_qpn = wide,
        2 => r.local_eecn = wide,
        3 => r.remote_eecn = wide,
        4 => r.remote_cm_response_timeout = wide as u8,
        5 => r.retry_count = wide as u8,
        6 => r.path_mtu = wide as u8,
        7 => r.rnr_retry_count = wide as u8,
        8 => r.max_cm_retries = wide as u8,
        9 => r.primary_path.flow_label = wide,
        10 => r.alternate_path.sl = wide as u8,
        _ => r.primary_path.local_ack_timeout = wide as u8,
    }
    r
}

/// The data of the captured CM MADs.
fn captured_mads() -> Vec<Vec<u8>> {
    ["cm/rping", "cm/rping_rejected", "cm/udaddy"]
        .iter()
        .flat_map(|name| captures::roce_ip_packets(name))
        .filter_map(|ip| {
            let p = softroce::wire::Packet::parse(&ip).ok()?;
            (p.roce.header.bth.dest_qpn == 1).then(|| p.roce.payload.to_vec())
        })
        .collect()
}

const ATTRIBUTES: [u16; 12] = [
    attr::CLASS_PORT_INFO,
    attr::REQ,
    attr::MRA,
    attr::REJ,
    attr::REP,
    attr::RTU,
    attr::DREQ,
    attr::DREP,
    attr::SIDR_REQ,
    attr::SIDR_REP,
    attr::LAP,
    attr::APR,
];

proptest! {
    #[test]
    fn cm_message_round_trips(message in message(), tid in any::<u64>()) {
        let mut data = [0xa5u8; DATA_LEN];
        message.emit(&mut data).unwrap();
        prop_assert_eq!(CmMessage::parse(message.attribute_id(), &data), Ok(message));
        let mad = CmMad::new(tid, message);
        let mut bytes = [0u8; MAD_LEN];
        mad.emit(&mut bytes).unwrap();
        prop_assert_eq!(CmMad::parse(&bytes), Ok(mad));
        prop_assert_eq!(&bytes[HEADER_LEN..], &data[..]);
    }

    #[test]
    fn req_emit_refuses_what_does_not_fit(r in req(), which in any::<usize>(), wide in any::<u32>()) {
        let r = widened(r, which, wide);
        let mut data = [0u8; DATA_LEN];
        let emitted = CmMessage::Req(r).emit(&mut data);
        if req_fits(&r) {
            prop_assert_eq!(emitted, Ok(()));
            prop_assert_eq!(CmMessage::parse(attr::REQ, &data), Ok(CmMessage::Req(r)));
        } else {
            prop_assert_eq!(emitted, Err(Error::FieldOverflow));
        }
    }

    #[test]
    fn mad_header_round_trips(
        (base_version, mgmt_class, class_version, method) in any::<(u8, u8, u8, u8)>(),
        (status, class_specific, transaction_id, attribute_id, attribute_modifier) in any::<(u16, u16, u64, u16, u32)>(),
    ) {
        let header = MadRepr {
            base_version, mgmt_class, class_version, method, status, class_specific, transaction_id, attribute_id,
            attribute_modifier,
        };
        let mut bytes = [0u8; MAD_LEN];
        header.emit(&mut Mad::new_unchecked(&mut bytes[..])).unwrap();
        prop_assert_eq!(MadRepr::parse(&Mad::new_unchecked(&bytes[..])), Ok(header));
    }

    #[test]
    fn cma_header_round_trips(port in any::<u16>(), v6 in any::<bool>(), src in any::<[u8; 16]>(), dst in any::<[u8; 16]>()) {
        let (src, dst) = if v6 {
            (std::net::Ipv6Addr::from(src).into(), std::net::Ipv6Addr::from(dst).into())
        } else {
            let v4 = |b: [u8; 16]| std::net::IpAddr::from([b[0], b[1], b[2], b[3]]);
            (v4(src), v4(dst))
        };
        let repr = CmaHeaderRepr { src_port: port, src, dst };
        let mut bytes = [0u8; 36];
        repr.emit(&mut CmaHeader::new_unchecked(&mut bytes[..])).unwrap();
        prop_assert_eq!(CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&bytes[..])), Ok(repr));
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_cm_parsers(bytes in vec(any::<u8>(), 0..300), attribute in any::<u16>()) {
        let _ = CmMad::parse(&bytes);
        let _ = CmMessage::parse(attribute, &bytes);
        let _ = MadRepr::parse(&Mad::new_unchecked(&bytes[..]));
        let _ = CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&bytes[..]));
    }

    /// A CM header and any data: the message parses or is refused for a
    /// reserved value; what parses re-emits to bytes that parse the same
    /// (the reserved bits cleared).
    #[test]
    fn any_data_under_a_cm_header_parses_or_errors(
        attribute in select(ATTRIBUTES.to_vec()),
        data in vec(any::<u8>(), DATA_LEN),
        tid in any::<u64>(),
    ) {
        let mut bytes = [0u8; MAD_LEN];
        MadRepr::cm_send(attribute, tid).emit(&mut Mad::new_unchecked(&mut bytes[..])).unwrap();
        bytes[HEADER_LEN..].copy_from_slice(&data);
        match CmMad::parse(&bytes) {
            Ok(mad) => {
                let mut again = [0u8; MAD_LEN];
                mad.emit(&mut again).unwrap();
                prop_assert_eq!(CmMad::parse(&again), Ok(mad));
            }
            Err(Error::ReservedValue { .. }) => {}
            Err(Error::UnknownCmAttribute(a)) => {
                prop_assert!([attr::CLASS_PORT_INFO, attr::LAP, attr::APR].contains(&a));
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    /// The captured MADs with bytes flipped or cut never panic a parser.
    #[test]
    fn mutated_captured_mads_never_panic(
        which in any::<usize>(),
        flips in vec((any::<usize>(), 1..=255u8), 1..8),
        cut in any::<Option<usize>>(),
    ) {
        let mads = captured_mads();
        let mut bytes = mads[which % mads.len()].clone();
        for (at, mask) in flips {
            let at = at % bytes.len();
            bytes[at] ^= mask;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % (MAD_LEN + 1));
        }
        if let Ok(mad) = CmMad::parse(&bytes) {
            let mut again = [0u8; MAD_LEN];
            mad.emit(&mut again).unwrap();
            prop_assert_eq!(CmMad::parse(&again), Ok(mad));
        }
    }
}
