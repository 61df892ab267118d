//! Devices as `ibv_get_device_list` shows them: one per network interface
//! that is up and has an address, named `sr_<ifname>`, each with one port
//! whose GID table is laid out as kernel rxe lays it out, and with rxe's
//! device and port attributes.

use std::fmt;
use std::io;
use std::net::IpAddr;

use pnet_datalink::NetworkInterface;

use super::error::{Error, Result};
use super::gid::{eui64, Gid};
use crate::transport::attr::{Mtu, PORT};

/// Device names are this prefix and the interface name. Short, because
/// tools print device names in narrow columns (`rxe0` is four characters).
const NAME_PREFIX: &str = "sr_";

/// The environment variable naming the device [`Device::default_device`]
/// returns.
pub const DEVICE_ENV: &str = "SOFTROCE_DEVICE";

/// Names the one address of a host a process's devices use (several,
/// comma-separated, make several devices). A user's programs share a
/// device's address and port without it; two users on one host each need
/// an address of their own, one on 127.0.0.1 and one on 127.0.0.2, say.
/// Unset, every interface that is up is a device, as `ibv_devices` lists
/// kernel rxe's. [`Device::list_for`] reads it.
pub const ADDR_ENV: &str = "SOFTROCE_ADDR";

/// Room rxe leaves in a link-MTU packet for headers (`RXE_MAX_HDR_LENGTH`);
/// the RoCE MTU is the largest IB MTU that fits in the rest.
const MAX_HDR_LENGTH: u32 = 80;

/// One softroce device: a network interface (or, from [`Device::custom`],
/// chosen addresses) and the RoCE port on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
    netdev: Option<String>,
    mac: [u8; 6],
    link_mtu: u32,
    running: bool,
    gids: Vec<Gid>,
}

impl Device {
    /// The devices of this host, in `ibv_get_device_list` order: interfaces
    /// by index, loopback last, so the first device is a real interface.
    pub fn list() -> Result<Vec<Device>> {
        let mut interfaces: Vec<NetworkInterface> =
            interfaces().into_iter().filter(|i| i.is_up() && !i.ips.is_empty()).collect();
        interfaces.sort_by_key(|i| (i.is_loopback(), i.index));
        let mut devices = Vec::with_capacity(interfaces.len());
        for interface in interfaces {
            let link_mtu = match read_link_mtu(&interface.name) {
                Ok(mtu) => mtu,
                // Gone since it was listed.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            // rxe enumerates IPv4 addresses before IPv6 ones.
            let mut addrs: Vec<IpAddr> = interface.ips.iter().map(|network| network.ip()).collect();
            addrs.sort_by_key(|a| a.is_ipv6());
            let mac = interface.mac.map_or([0; 6], |mac| mac.octets());
            devices.push(Device {
                name: format!("{NAME_PREFIX}{}", interface.name),
                running: interface.is_running(),
                netdev: Some(interface.name),
                mac,
                link_mtu,
                gids: gid_table(mac, &addrs),
            });
        }
        Ok(devices)
    }

    /// The devices a process whose [`ADDR_ENV`] is `addresses` has, in
    /// `ibv_get_device_list` order: without addresses (None or blank) every
    /// device of [`Device::list`]; else, for each address, the device of
    /// the interface whose subnet holds it narrowed to it, or a device of
    /// its own ([`Device::for_address`]) for an address no interface has.
    /// One function, so that the C library's list and the `/sys` tree
    /// `softroce run` makes for it agree.
    pub fn list_for(addresses: Option<&str>) -> Result<Vec<Device>> {
        match addresses {
            Some(list) if !list.trim().is_empty() => list
                .split(',')
                .map(|text| {
                    let addr: IpAddr = text.trim().parse().map_err(|e| {
                        Error::InvalidArgument(format!("{ADDR_ENV}={list}: {text:?} is not an address: {e}"))
                    })?;
                    Ok(Device::holding(addr).unwrap_or_else(|_| Device::for_address(addr)))
                })
                .collect(),
            _ => Device::list(),
        }
    }

    /// The device of this name (`ibv_devinfo -d`).
    pub fn by_name(name: &str) -> Result<Device> {
        Device::pick(Device::list()?, Some(name))
    }

    /// The device named by `SOFTROCE_DEVICE`, or else the first device.
    pub fn default_device() -> Result<Device> {
        let requested = std::env::var(DEVICE_ENV).ok();
        Device::pick(Device::list()?, requested.as_deref().filter(|name| !name.is_empty()))
    }

    /// The device named `requested` among `devices`, or the first one if no
    /// name is given: the choice [`Device::default_device`] makes.
    pub fn pick(devices: Vec<Device>, requested: Option<&str>) -> Result<Device> {
        match requested {
            Some(name) => {
                let known: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
                devices
                    .into_iter()
                    .find(|d| d.name == name)
                    .ok_or_else(|| Error::NoSuchDevice { name: name.to_owned(), known })
            }
            None => devices.into_iter().next().ok_or_else(|| {
                let why = "no RDMA devices: no network interface is up with an address";
                Error::Io(io::Error::new(io::ErrorKind::NotFound, why))
            }),
        }
    }

    /// A device on chosen addresses, for tests and demos that need several
    /// devices on one host (say on 127.0.0.1 and 127.0.0.2). Its GID table is
    /// built as for an interface, with the addresses in the order given.
    pub fn custom(name: &str, addrs: Vec<IpAddr>, mac: [u8; 6], link_mtu: u32) -> Device {
        Device { name: name.to_owned(), netdev: None, mac, link_mtu, running: true, gids: gid_table(mac, &addrs) }
    }

    /// A device on `addr` alone, for programs that each take one address of
    /// a host (two processes on one host, say on 127.0.0.1 and 127.0.0.2).
    /// It is named `sr_<addr>`, has a locally administered MAC made from the
    /// address, so that each such device has its own link-local GID, and a
    /// link MTU that makes its active MTU 4096.
    pub fn for_address(addr: IpAddr) -> Device {
        let mac = match addr {
            IpAddr::V4(v4) => {
                let o = v4.octets();
                [0x02, 0x00, o[0], o[1], o[2], o[3]]
            }
            IpAddr::V6(v6) => {
                let o = v6.octets();
                [0x02, o[11], o[12], o[13], o[14], o[15]]
            }
        };
        Device::custom(&format!("{NAME_PREFIX}{addr}"), vec![addr], mac, 4096 + MAX_HDR_LENGTH)
    }

    /// The device of the interface whose subnet holds `addr`, narrowed to
    /// `addr` alone: how one program takes one address of a host (127.0.0.2
    /// of `lo`, say) while another program holds the RoCE port on another,
    /// both under the interface's device name.
    pub fn holding(addr: IpAddr) -> Result<Device> {
        let owner = interfaces()
            .into_iter()
            .find(|i| i.is_up() && i.ips.iter().any(|network| network.contains(addr)))
            .ok_or_else(|| {
                let why = format!("no network interface is up with a subnet holding {addr}");
                Error::Io(io::Error::new(io::ErrorKind::NotFound, why))
            })?;
        let device = Device::by_name(&format!("{NAME_PREFIX}{}", owner.name))?;
        Ok(device.narrowed_to(addr))
    }

    /// This device with `addr` as its only address (the one a program's GID
    /// names), so that its socket binds that address alone: other programs
    /// may hold the RoCE port on the interface's other addresses.
    pub fn narrowed_to(&self, addr: IpAddr) -> Device {
        Device { gids: gid_table(self.mac, &[addr]), ..self.clone() }
    }

    /// `ibv_get_device_name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network interface the device is on; `None` for a custom device.
    pub fn netdev(&self) -> Option<&str> {
        self.netdev.as_deref()
    }

    /// The interface's MAC address (zeros if it has none); GID 0 and the node
    /// GUID derive from it.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The interface's MTU in bytes (IP packet size).
    pub fn link_mtu(&self) -> u32 {
        self.link_mtu
    }

    /// The GID table of port 1: index 0 is the link-local GID of the MAC,
    /// then one RoCEv2 GID per address (IPv4 ones first, as in rxe), so with
    /// one IPv4 address "GID index 1" names it, as it does with rxe.
    pub fn gid_table(&self) -> &[Gid] {
        &self.gids
    }

    /// `ibv_query_gid` on port 1.
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.gids.get(index).copied()
    }

    /// The IP addresses of the GIDs that a socket can bind: all but the
    /// link-local ones (GID 0 is one), which would need an interface scope.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.gids.iter().map(|gid| gid.to_ip()).filter(|ip| !is_link_local(*ip))
    }

    /// The RoCE MTU of the port, derived from the link MTU as rxe derives it.
    pub fn active_mtu(&self) -> Mtu {
        active_mtu(self.link_mtu)
    }

    /// `ibv_query_device`, with kernel rxe's values.
    pub fn query_device(&self) -> DeviceAttr {
        let guid = u64::from_be_bytes(eui64(self.mac));
        DeviceAttr {
            fw_ver: "0.0.0".to_owned(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            // rxe's RXE_VENDOR_ID (0 before Linux 5.x; pyverbs' suite and
            // SPDK expect it nonzero).
            vendor_id: 0xff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0x10000,
            max_qp_wr: 0x4000,
            device_cap_flags: DeviceCapFlags::SOFTROCE,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: 16384,
            max_cqe: (1 << 15) - 1,
            max_mr: 256 * 1024,
            max_pd: 0x7ffc,
            max_qp_rd_atom: 128,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0x3f000,
            max_qp_init_rd_atom: 128,
            max_ee_init_rd_atom: 0,
            atomic_cap: AtomicCap::Hca,
            max_ee: 0,
            max_rdd: 0,
            // rxe's RXE_MAX_MW.
            max_mw: 0x1000,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            // rxe's RXE_MAX_MCAST_GRP, _QP_ATTACH and _TOTAL_MCAST_QP_ATTACH.
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 0x70000,
            max_ah: 100,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 960,
            max_srq_wr: 0x4000,
            max_srq_sge: 27,
            max_pkeys: 64,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
            max_inline_data: 400,
        }
    }

    /// `ibv_query_port`, with kernel rxe's values; the only port is 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != PORT {
            return Err(Error::InvalidArgument(format!("port {port} (devices have port {PORT} only)")));
        }
        let (state, phys_state) = if self.running {
            (PortState::Active, PhysState::LinkUp)
        } else {
            // Up without carrier, as rxe reports it.
            (PortState::Down, PhysState::Polling)
        };
        Ok(PortAttr {
            state,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.active_mtu(),
            gid_tbl_len: 1024,
            port_cap_flags: PORT_CM_SUP,
            port_cap_flags2: 0,
            max_msg_sz: 0x80_0000,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 64,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 1,
            active_speed: 1,
            phys_state,
            link_layer: LinkLayer::Ethernet,
        })
    }
}

/// The RoCE MTU rxe derives from a link MTU: the largest IB MTU that fits
/// after its header allowance, and 256 when none does.
fn active_mtu(link_mtu: u32) -> Mtu {
    let room = link_mtu.saturating_sub(MAX_HDR_LENGTH) as usize;
    Mtu::from_bytes(room).unwrap_or(Mtu::Mtu256)
}

fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// `IB_PORT_CM_SUP`, the capability bit current rxe reports.
const PORT_CM_SUP: u32 = 1 << 16;

/// The GID table rxe builds: the link-local GID first, then the addresses'
/// GIDs in order, each once.
fn gid_table(mac: [u8; 6], addrs: &[IpAddr]) -> Vec<Gid> {
    let mut gids = vec![Gid::link_local(mac)];
    for &addr in addrs {
        let gid = Gid::from_ip(addr);
        // An interface's own link-local address is usually the first GID.
        if !gids.contains(&gid) {
            gids.push(gid);
        }
    }
    gids
}

/// `ibv_device_attr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// The modified EUI-64 of the MAC address, as rxe sets it.
    pub node_guid: u64,
    /// System image GUID: the same as `node_guid`, as rxe sets it.
    pub sys_image_guid: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes, one bit per power of two.
    pub page_size_cap: u64,
    /// IEEE vendor ID (0: none).
    pub vendor_id: u32,
    /// Vendor part ID.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most work requests in a send or receive queue.
    pub max_qp_wr: u32,
    /// Capabilities.
    pub device_cap_flags: DeviceCapFlags,
    /// Most SGEs in a send or receive work request.
    pub max_sge: u32,
    /// Most SGEs in an RDMA READ work request.
    pub max_sge_rd: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries in a CQ (enforced by `Context::create_cq`).
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most READ and atomic requests a QP may have outstanding as responder
    /// (the bound of `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// The same per EE context (Reliable Datagram, which there is not: 0).
    pub max_ee_rd_atom: u32,
    /// Responder resources for incoming READs and atomics, device-wide.
    pub max_res_rd_atom: u32,
    /// Most READ and atomic requests a QP may have outstanding as requester
    /// (the bound of `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// The same per EE context (Reliable Datagram: 0).
    pub max_ee_init_rd_atom: u32,
    /// How atomic the atomics are.
    pub atomic_cap: AtomicCap,
    /// Most EE contexts (Reliable Datagram: 0).
    pub max_ee: u32,
    /// Most RD domains (Reliable Datagram: 0).
    pub max_rdd: u32,
    /// Most memory windows (0: none).
    pub max_mw: u32,
    /// Most raw IPv6 QPs (0).
    pub max_raw_ipv6_qp: u32,
    /// Most raw Ethertype QPs (0).
    pub max_raw_ethy_qp: u32,
    /// Most multicast groups (0: no multicast).
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group (0).
    pub max_mcast_qp_attach: u32,
    /// Most multicast attachments in all (0).
    pub max_total_mcast_qp_attach: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Most fast memory regions (0: none).
    pub max_fmr: u32,
    /// Most remaps of one FMR (0).
    pub max_map_per_fmr: u32,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most work requests in an SRQ (enforced by `ProtectionDomain::create_srq`).
    pub max_srq_wr: u32,
    /// Most SGEs in an SRQ work request (enforced likewise).
    pub max_srq_sge: u32,
    /// Entries in the P_Key table.
    pub max_pkeys: u16,
    /// Local CA ACK delay: how long the responder may take to answer,
    /// 4.096 µs × 2^value.
    pub local_ca_ack_delay: u8,
    /// Number of ports: 1.
    pub phys_port_cnt: u8,
    /// Not in `ibv_device_attr`: the most inline data a send may carry.
    pub max_inline_data: u32,
}

/// `ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`: atomics are not supported.
    None = 0,
    /// Atomic operations are atomic among the operations of this device.
    Hca = 1,
    /// Also atomic with respect to the CPU and other devices.
    Glob = 2,
}

/// `ibv_device_cap_flags`, with libibverbs' bit values; the named flags are
/// those kernel rxe reports.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceCapFlags(u32);

impl DeviceCapFlags {
    /// `IBV_DEVICE_BAD_PKEY_CNTR`: packets with a bad P_Key are counted.
    pub const BAD_PKEY_CNTR: DeviceCapFlags = DeviceCapFlags(1 << 1);
    /// `IBV_DEVICE_BAD_QKEY_CNTR`: packets with a bad Q_Key are counted.
    pub const BAD_QKEY_CNTR: DeviceCapFlags = DeviceCapFlags(1 << 2);
    /// `IBV_DEVICE_AUTO_PATH_MIG`: automatic path migration.
    pub const AUTO_PATH_MIG: DeviceCapFlags = DeviceCapFlags(1 << 4);
    /// `IBV_DEVICE_CHANGE_PHY_PORT`: a QP's primary port can be changed by an
    /// SQD → SQD modify.
    pub const CHANGE_PHY_PORT: DeviceCapFlags = DeviceCapFlags(1 << 5);
    /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`: a UD address vector's port must be the QP's.
    pub const UD_AV_PORT_ENFORCE: DeviceCapFlags = DeviceCapFlags(1 << 6);
    /// `IBV_DEVICE_PORT_ACTIVE_EVENT`: the device raises `IBV_EVENT_PORT_ACTIVE`.
    pub const PORT_ACTIVE_EVENT: DeviceCapFlags = DeviceCapFlags(1 << 10);
    /// `IBV_DEVICE_SYS_IMAGE_GUID`: `sys_image_guid` is valid.
    pub const SYS_IMAGE_GUID: DeviceCapFlags = DeviceCapFlags(1 << 11);
    /// `IBV_DEVICE_RC_RNR_NAK_GEN`: RC responders send RNR NAKs.
    pub const RC_RNR_NAK_GEN: DeviceCapFlags = DeviceCapFlags(1 << 12);
    /// `IBV_DEVICE_SRQ_RESIZE`: SRQs can be resized.
    pub const SRQ_RESIZE: DeviceCapFlags = DeviceCapFlags(1 << 13);
    /// `IBV_DEVICE_MEM_WINDOW`: memory windows.
    pub const MEM_WINDOW: DeviceCapFlags = DeviceCapFlags(1 << 17);
    /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`: fast registration, local invalidate and
    /// memory windows. rxe reports it; softroce does not.
    pub const MEM_MGT_EXTENSIONS: DeviceCapFlags = DeviceCapFlags(1 << 21);
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2 windows bound to one QP.
    pub const MEM_WINDOW_TYPE_2B: DeviceCapFlags = DeviceCapFlags(1 << 24);

    /// Names in bit order, as `ibv_devinfo -v` lists them.
    pub const NAMES: [(DeviceCapFlags, &'static str); 12] = [
        (DeviceCapFlags::BAD_PKEY_CNTR, "BAD_PKEY_CNTR"),
        (DeviceCapFlags::BAD_QKEY_CNTR, "BAD_QKEY_CNTR"),
        (DeviceCapFlags::AUTO_PATH_MIG, "AUTO_PATH_MIG"),
        (DeviceCapFlags::CHANGE_PHY_PORT, "CHANGE_PHY_PORT"),
        (DeviceCapFlags::UD_AV_PORT_ENFORCE, "UD_AV_PORT_ENFORCE"),
        (DeviceCapFlags::PORT_ACTIVE_EVENT, "PORT_ACTIVE_EVENT"),
        (DeviceCapFlags::SYS_IMAGE_GUID, "SYS_IMAGE_GUID"),
        (DeviceCapFlags::RC_RNR_NAK_GEN, "RC_RNR_NAK_GEN"),
        (DeviceCapFlags::SRQ_RESIZE, "SRQ_RESIZE"),
        (DeviceCapFlags::MEM_WINDOW, "MEM_WINDOW"),
        (DeviceCapFlags::MEM_MGT_EXTENSIONS, "MEM_MGT_EXTENSIONS"),
        (DeviceCapFlags::MEM_WINDOW_TYPE_2B, "MEM_WINDOW_TYPE_2B"),
    ];

    /// What a softroce device reports: rxe's flags except
    /// MEM_MGT_EXTENSIONS, since softroce has no fast-registration MRs.
    pub const SOFTROCE: DeviceCapFlags = DeviceCapFlags(
        Self::UD_AV_PORT_ENFORCE.0
            | Self::PORT_ACTIVE_EVENT.0
            | Self::SYS_IMAGE_GUID.0
            | Self::RC_RNR_NAK_GEN.0
            | Self::MEM_WINDOW.0
            | Self::MEM_WINDOW_TYPE_2B.0,
    );

    /// The `ibv_device_cap_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: DeviceCapFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl fmt::Debug for DeviceCapFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES.iter().filter(|(flag, _)| self.contains(*flag)).map(|(_, n)| *n).collect();
        write!(f, "DeviceCapFlags({})", names.join("|"))
    }
}

/// `ibv_port_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// The MTU in use, derived from the link MTU ([`Device::active_mtu`]).
    pub active_mtu: Mtu,
    /// Entries the GID table can hold.
    pub gid_tbl_len: u32,
    /// `ibv_port_cap_flags`: `IBV_PORT_CM_SUP` only.
    pub port_cap_flags: u32,
    /// `ibv_port_cap_flags2`: none.
    pub port_cap_flags2: u16,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Packets dropped for a bad P_Key (always 0).
    pub bad_pkey_cntr: u32,
    /// Packets dropped for a bad Q_Key (always 0 here; see the QP counters).
    pub qkey_viol_cntr: u32,
    /// Entries in the P_Key table.
    pub pkey_tbl_len: u16,
    /// Base LID: 0, as RoCE has no LIDs.
    pub lid: u16,
    /// LID of the subnet manager: 0, as RoCE has none.
    pub sm_lid: u16,
    /// LID mask control: 0.
    pub lmc: u8,
    /// Virtual lanes, IB encoding: 1 = VL0 only.
    pub max_vl_num: u8,
    /// Service level of the subnet manager: 0.
    pub sm_sl: u8,
    /// Subnet propagation delay: 0.
    pub subnet_timeout: u8,
    /// InitTypeReply from the subnet manager: 0.
    pub init_type_reply: u8,
    /// IB encoding: 1 = 1X.
    pub active_width: u8,
    /// IB encoding: 1 = SDR (2.5 Gb/s per lane). Kernel rxe derives width
    /// and speed from the link speed; this is what it reports for links of
    /// 1 Gb/s and below or of unknown speed (loopback, veth).
    pub active_speed: u8,
    /// Physical port state.
    pub phys_state: PhysState,
    /// The link layer: Ethernet, as for every RoCE port.
    pub link_layer: LinkLayer,
}

/// `ibv_port_state`: a port is active while its interface has carrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// `IBV_PORT_DOWN`: the interface is up but has no carrier.
    Down = 1,
    /// `IBV_PORT_ACTIVE`: the interface has carrier.
    Active = 4,
}

/// Physical port states, with the values `ibv_devinfo` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhysState {
    /// Polling: no carrier, as rxe reports a port that is down.
    Polling = 2,
    /// LinkUp: the interface has carrier.
    LinkUp = 5,
}

/// `IBV_LINK_LAYER_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_ETHERNET`.
    Ethernet = 2,
}

/// The host's interfaces with their addresses in the kernel's order.
fn interfaces() -> Vec<NetworkInterface> {
    let mut interfaces: Vec<NetworkInterface> = Vec::new();
    for interface in pnet_datalink::interfaces() {
        // getifaddrs names an IPv4 address with a label ("eth0:1") by the
        // label; it belongs to the interface before the colon, as interface
        // names cannot contain one.
        let owner = interface.name.split(':').next().unwrap_or_default();
        match interfaces.iter_mut().find(|i| i.name == owner) {
            Some(owner) => owner.ips.extend(interface.ips),
            None => interfaces.push(interface),
        }
    }
    interfaces
}

fn read_link_mtu(ifname: &str) -> io::Result<u32> {
    let path = format!("/sys/class/net/{ifname}/mtu");
    let text = std::fs::read_to_string(&path)?;
    text.trim().parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_mtu_leaves_rxe_header_room() {
        assert_eq!(active_mtu(1500), Mtu::Mtu1024);
        assert_eq!(active_mtu(1400), Mtu::Mtu1024);
        assert_eq!(active_mtu(4096 + 80), Mtu::Mtu4096);
        assert_eq!(active_mtu(4096 + 79), Mtu::Mtu2048);
        assert_eq!(active_mtu(256 + 80), Mtu::Mtu256);
        // Too small for any IB MTU: rxe falls back to 256.
        assert_eq!(active_mtu(300), Mtu::Mtu256);
        assert_eq!(active_mtu(0), Mtu::Mtu256);
    }

    #[test]
    fn gid_table_lists_each_gid_once() {
        let mac = [0x02, 0xfc, 0, 0, 0, 1];
        let link_local: IpAddr = "fe80::fc:ff:fe00:1".parse().unwrap();
        let v4: IpAddr = "192.0.2.2".parse().unwrap();
        let gids = gid_table(mac, &[v4, link_local, v4]);
        assert_eq!(gids, vec![Gid::from_ip(link_local), Gid::from_ip(v4)]);
    }

    #[test]
    fn an_address_in_loopbacks_subnet_is_held_by_sr_lo_narrowed_to_it() {
        let addr: IpAddr = "127.0.0.2".parse().unwrap();
        let device = Device::holding(addr).unwrap();
        assert_eq!(device.name(), "sr_lo");
        assert_eq!(device.addresses().collect::<Vec<_>>(), vec![addr]);
        assert_eq!(device.gid(1), Some(Gid::from_ip(addr)));
        assert!(Device::holding("198.51.100.7".parse().unwrap()).is_err());
    }

    #[test]
    fn addresses_choose_the_devices_in_their_order() {
        let devices = Device::list_for(Some("127.0.0.2, 198.51.100.7")).unwrap();
        let names: Vec<&str> = devices.iter().map(Device::name).collect();
        assert_eq!(names, ["sr_lo", "sr_198.51.100.7"]);
        assert_eq!(devices[0].gid(1), Some(Gid::from_ip("127.0.0.2".parse().unwrap())));
        assert_eq!(Device::list_for(Some(" ")).unwrap(), Device::list().unwrap());
        assert_eq!(Device::list_for(None).unwrap(), Device::list().unwrap());
        let error = Device::list_for(Some("127.0.0.1,lo")).unwrap_err();
        assert!(matches!(&error, Error::InvalidArgument(why) if why.contains("\"lo\" is not an address")), "{error}");
    }

    #[test]
    fn interfaces_are_named_without_address_labels() {
        let interfaces = interfaces();
        let lo = interfaces.iter().find(|i| i.is_loopback()).expect("a loopback interface");
        assert_ne!(lo.index, 0);
        assert!(lo.ips.iter().any(|network| network.ip() == IpAddr::from([127, 0, 0, 1])));
        assert!(interfaces.iter().all(|i| !i.name.is_empty() && !i.name.contains(':')));
    }
}
