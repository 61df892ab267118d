//! Devices and GIDs: the GID text form, the rxe GID table layout, rxe's device
//! and port attributes, and how devices are listed and chosen (by
//! `SOFTROCE_DEVICE`: `tests/device_env.rs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softroce::transport::Mtu;
use softroce::verbs::device::{AtomicCap, DeviceCapFlags, LinkLayer, PhysState, PortState};
use softroce::verbs::{Device, Error, Gid};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn names(devices: &[Device]) -> Vec<&str> {
    devices.iter().map(Device::name).collect()
}

#[test]
fn gid_text_is_ibv_devinfo_form_and_round_trips() {
    for text in [
        "fe80:0000:0000:0000:5054:00ff:fe12:3456",
        "0000:0000:0000:0000:0000:ffff:0a4d:0002",
        "fd00:0000:0000:0000:0000:0000:0000:0002",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    ] {
        let gid: Gid = text.parse().unwrap();
        assert_eq!(gid.to_string(), text);
        assert_eq!(Gid::from(<[u8; 16]>::from(gid)), gid);
        assert_eq!(Gid::from_bytes(gid.to_bytes()), gid);
    }
    let raw = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56];
    assert_eq!(Gid::from(raw).to_string(), "fe80:0000:0000:0000:5054:00ff:fe12:3456");
    assert!("fe80::5054:ff:fe12:3456".parse::<Gid>().is_err());
}

#[test]
fn link_local_gid_and_node_guid_are_the_macs_eui64() {
    let gid = Gid::link_local(MAC);
    assert_eq!(gid.to_string(), "fe80:0000:0000:0000:5054:00ff:fe12:3456");
    assert_eq!(gid.to_ip(), ip("fe80::5054:ff:fe12:3456"));

    let attr = Device::custom("sr_test", vec![], MAC, 1500).query_device();
    assert_eq!(attr.node_guid, 0x5054_00ff_fe12_3456);
    assert_eq!(attr.sys_image_guid, attr.node_guid);
}

#[test]
fn ipv4_gids_are_ipv4_mapped() {
    let gid = Gid::from_ip(ip("10.77.0.2"));
    assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:0a4d:0002");
    assert!(gid.is_ipv4_mapped());
    assert_eq!(gid.to_ip(), IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2)));

    let v6 = Gid::from_ip(ip("fd00::2"));
    assert!(!v6.is_ipv4_mapped());
    assert_eq!(v6.to_ip(), ip("fd00::2"));
    // An IPv6 address that is not mapped stays IPv6, even if it ends in an
    // IPv4-looking value.
    let compatible = Gid::from_ip(IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0x0a4d, 2)));
    assert!(!compatible.is_ipv4_mapped());
    assert!(compatible.to_ip().is_ipv6());
}

#[test]
fn active_mtu_is_derived_from_the_link_mtu_as_rxe_does() {
    for (link_mtu, expected) in [
        (1500, Mtu::Mtu1024),
        (1420, Mtu::Mtu1024),
        (9000, Mtu::Mtu4096),
        (65536, Mtu::Mtu4096),
        (576, Mtu::Mtu256),
        (2128, Mtu::Mtu2048),
        (2127, Mtu::Mtu1024),
    ] {
        let device = Device::custom("sr_test", vec![ip("127.0.0.1")], MAC, link_mtu);
        assert_eq!(device.active_mtu(), expected, "link MTU {link_mtu}");
        let port = device.query_port(1).unwrap();
        assert_eq!(port.active_mtu, expected, "link MTU {link_mtu}");
        assert_eq!(port.max_mtu, Mtu::Mtu4096);
    }
}

#[test]
fn custom_devices_on_two_loopback_addresses() {
    let a = Device::custom("sr_a", vec![ip("127.0.0.1")], [2, 0, 0, 0, 0, 1], 65536);
    let b = Device::custom("sr_b", vec![ip("127.0.0.2")], [2, 0, 0, 0, 0, 2], 65536);
    assert_eq!(a.name(), "sr_a");
    assert_eq!(a.netdev(), None);
    assert_eq!(a.gid_table(), [Gid::link_local([2, 0, 0, 0, 0, 1]), Gid::from_ip(ip("127.0.0.1"))]);
    assert_eq!(b.gid(1), Some(Gid::from_ip(ip("127.0.0.2"))));
    assert_eq!(b.gid(2), None);
    assert_eq!(a.addresses().collect::<Vec<_>>(), [ip("127.0.0.1")]);
    assert_eq!(b.addresses().collect::<Vec<_>>(), [ip("127.0.0.2")]);
    assert_ne!(a.query_device().node_guid, b.query_device().node_guid);
}

#[test]
fn custom_gid_table_keeps_order_and_leaves_link_local_addresses_unbound() {
    let addrs = vec![ip("fd00::2"), ip("fe80::5054:ff:fe12:3456"), ip("192.0.2.2"), ip("fe80::1")];
    let device = Device::custom("sr_test", addrs, MAC, 1500);
    let table: Vec<String> = device.gid_table().iter().map(Gid::to_string).collect();
    assert_eq!(
        table,
        [
            "fe80:0000:0000:0000:5054:00ff:fe12:3456",
            "fd00:0000:0000:0000:0000:0000:0000:0002",
            "0000:0000:0000:0000:0000:ffff:c000:0202",
            "fe80:0000:0000:0000:0000:0000:0000:0001",
        ]
    );
    assert_eq!(device.addresses().collect::<Vec<_>>(), [ip("fd00::2"), ip("192.0.2.2")]);
}

#[test]
fn this_host_lists_loopback_last() {
    let devices = Device::list().unwrap();
    let lo = devices.last().expect("at least the loopback device");
    assert_eq!(lo.name(), "sr_lo", "devices: {:?}", names(&devices));
    assert_eq!(lo.netdev(), Some("lo"));
    assert_eq!(lo.gid(1), Some(Gid::from_ip(IpAddr::V4(Ipv4Addr::LOCALHOST))));
    assert_eq!(lo.gid(0), Some(Gid::link_local(lo.mac())));
    assert_eq!(lo.query_port(1).unwrap().state, PortState::Active);

    for device in &devices {
        let netdev = device.netdev().expect("listed devices are on an interface");
        assert_eq!(device.name(), format!("sr_{netdev}"));
        assert_eq!(device.gid(0), Some(Gid::link_local(device.mac())));
        // IPv4 GIDs come before IPv6 ones, as rxe adds them.
        let ipv4: Vec<bool> = device.gid_table()[1..].iter().map(|g| g.is_ipv4_mapped()).collect();
        assert!(ipv4.windows(2).all(|w| w[0] >= w[1]), "{}: {ipv4:?}", device.name());
        assert_eq!(
            device.link_mtu().to_string(),
            std::fs::read_to_string(format!("/sys/class/net/{netdev}/mtu")).unwrap().trim()
        );
    }
    let mut unique = names(&devices);
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), devices.len());
}

#[test]
fn by_name_finds_listed_devices_only() {
    assert_eq!(Device::by_name("sr_lo").unwrap().netdev(), Some("lo"));
    match Device::by_name("sr_no_such_interface") {
        Err(Error::NoSuchDevice { name, known }) => {
            assert_eq!(name, "sr_no_such_interface");
            assert!(known.iter().any(|n| n == "sr_lo"), "{known:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn pick_takes_the_named_device_or_the_first() {
    let devices = || {
        vec![
            Device::custom("sr_a", vec![ip("127.0.0.1")], MAC, 1500),
            Device::custom("sr_b", vec![ip("127.0.0.2")], MAC, 1500),
        ]
    };
    assert_eq!(Device::pick(devices(), None).unwrap().name(), "sr_a");
    assert_eq!(Device::pick(devices(), Some("sr_b")).unwrap().name(), "sr_b");
    match Device::pick(devices(), Some("sr_c")) {
        Err(Error::NoSuchDevice { name, known }) => {
            assert_eq!(name, "sr_c");
            assert_eq!(known, ["sr_a", "sr_b"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(Device::pick(Vec::new(), None).is_err());
}

#[test]
fn device_and_port_attributes_are_rxes() {
    let device = Device::custom("sr_test", vec![ip("127.0.0.1")], MAC, 1500);
    let attr = device.query_device();
    assert_eq!(attr.fw_ver, "0.0.0");
    assert_eq!(attr.max_mr_size, u64::MAX);
    assert_eq!(attr.page_size_cap, 0xffff_f000);
    assert_eq!((attr.vendor_id, attr.vendor_part_id, attr.hw_ver), (0xff_ffff, 0, 0));
    assert_eq!((attr.max_qp, attr.max_qp_wr), (0x10000, 0x4000));
    assert_eq!((attr.max_sge, attr.max_sge_rd), (32, 32));
    assert_eq!((attr.max_cq, attr.max_cqe), (16384, 32767));
    assert_eq!((attr.max_mr, attr.max_pd), (256 * 1024, 0x7ffc));
    assert_eq!((attr.max_qp_rd_atom, attr.max_qp_init_rd_atom), (128, 128));
    assert_eq!(attr.max_res_rd_atom, 0x3f000);
    assert_eq!((attr.max_srq, attr.max_srq_wr, attr.max_srq_sge), (960, 0x4000, 27));
    assert_eq!((attr.max_pkeys, attr.local_ca_ack_delay), (64, 15));
    assert_eq!((attr.phys_port_cnt, attr.max_inline_data), (1, 400));
    assert_eq!(attr.atomic_cap, AtomicCap::Hca);
    let flags = attr.device_cap_flags;
    for flag in [
        DeviceCapFlags::UD_AV_PORT_ENFORCE,
        DeviceCapFlags::PORT_ACTIVE_EVENT,
        DeviceCapFlags::SYS_IMAGE_GUID,
        DeviceCapFlags::RC_RNR_NAK_GEN,
        DeviceCapFlags::MEM_WINDOW,
        DeviceCapFlags::MEM_WINDOW_TYPE_2B,
    ] {
        assert!(flags.contains(flag), "{flags:?} lacks {flag:?}");
    }
    // rxe also claims these; softroce has no fast-registration MRs, path
    // migration, port changes, SRQ resizing or P_Key/Q_Key violation
    // counters, so it does not.
    for flag in [
        DeviceCapFlags::MEM_MGT_EXTENSIONS,
        DeviceCapFlags::AUTO_PATH_MIG,
        DeviceCapFlags::CHANGE_PHY_PORT,
        DeviceCapFlags::SRQ_RESIZE,
        DeviceCapFlags::BAD_PKEY_CNTR,
        DeviceCapFlags::BAD_QKEY_CNTR,
    ] {
        assert!(!flags.contains(flag), "{flags:?} claims {flag:?}");
    }
    assert_eq!(flags.bits(), 0x0102_1c40);

    let port = device.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.phys_state, PhysState::LinkUp);
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert_eq!(port.gid_tbl_len, 1024);
    assert_eq!(port.max_msg_sz, 0x80_0000);
    assert_eq!(port.port_cap_flags, 1 << 16);
    assert_eq!((port.lid, port.sm_lid, port.lmc), (0, 0, 0));
    assert_eq!((port.max_vl_num, port.pkey_tbl_len), (1, 64));
    assert_eq!((port.active_width, port.active_speed), (1, 1));
    assert!(matches!(device.query_port(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(device.query_port(2), Err(Error::InvalidArgument(_))));
}
