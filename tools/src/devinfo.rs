//! `softroce devinfo`: the devices and their attributes, printed the way
//! rdma-core's `ibv_devinfo` prints them, so output (and scripts reading it)
//! compare line by line with a kernel rxe device.

use std::io::{self, Write};
use std::process::ExitCode;

use softroce::transport::Mtu;
use softroce::verbs::device::{AtomicCap, DeviceCapFlags, LinkLayer, PhysState, PortState};
use softroce::verbs::Device;

#[derive(clap::Args)]
pub struct Args {
    /// Only this device (default: every device).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Print only the device names.
    #[arg(short, long)]
    list: bool,
    /// Print all attributes, the GID table included.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(args: Args) -> ExitCode {
    let devices = match args.device.as_deref() {
        Some(name) => Device::by_name(name).map(|d| vec![d]),
        None => Device::list(),
    };
    let devices = match devices {
        Ok(devices) if devices.is_empty() => {
            eprintln!("No RDMA devices found");
            return ExitCode::FAILURE;
        }
        Ok(devices) => devices,
        Err(e) => {
            eprintln!("softroce devinfo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = io::stdout().lock();
    let written = if args.list {
        list(&mut out, &devices)
    } else {
        devices.iter().try_for_each(|device| print_device(&mut out, device, args.verbose))
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not a failure of ours.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce devinfo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn list(out: &mut impl Write, devices: &[Device]) -> io::Result<()> {
    let plural = if devices.len() == 1 { "" } else { "s" };
    writeln!(out, "{} HCA{plural} found:", devices.len())?;
    for device in devices {
        writeln!(out, "\t{}", device.name())?;
    }
    writeln!(out)
}

fn print_device(out: &mut impl Write, device: &Device, verbose: bool) -> io::Result<()> {
    let attr = device.query_device();
    writeln!(out, "hca_id:\t{}", device.name())?;
    writeln!(out, "\ttransport:\t\t\tInfiniBand (0)")?;
    writeln!(out, "\tfw_ver:\t\t\t\t{}", attr.fw_ver)?;
    writeln!(out, "\tnode_guid:\t\t\t{}", guid(attr.node_guid))?;
    writeln!(out, "\tsys_image_guid:\t\t\t{}", guid(attr.sys_image_guid))?;
    writeln!(out, "\tvendor_id:\t\t\t0x{:04x}", attr.vendor_id)?;
    writeln!(out, "\tvendor_part_id:\t\t\t{}", attr.vendor_part_id)?;
    writeln!(out, "\thw_ver:\t\t\t\t0x{:X}", attr.hw_ver)?;
    writeln!(out, "\tphys_port_cnt:\t\t\t{}", attr.phys_port_cnt)?;
    if verbose {
        writeln!(out, "\tmax_mr_size:\t\t\t0x{:x}", attr.max_mr_size)?;
        writeln!(out, "\tpage_size_cap:\t\t\t0x{:x}", attr.page_size_cap)?;
        writeln!(out, "\tmax_qp:\t\t\t\t{}", attr.max_qp)?;
        writeln!(out, "\tmax_qp_wr:\t\t\t{}", attr.max_qp_wr)?;
        writeln!(out, "\tdevice_cap_flags:\t\t0x{:08x}", attr.device_cap_flags.bits())?;
        for (flag, name) in DeviceCapFlags::NAMES {
            if attr.device_cap_flags.contains(flag) {
                writeln!(out, "\t\t\t\t\t{name}")?;
            }
        }
        writeln!(out, "\tmax_sge:\t\t\t{}", attr.max_sge)?;
        writeln!(out, "\tmax_sge_rd:\t\t\t{}", attr.max_sge_rd)?;
        writeln!(out, "\tmax_cq:\t\t\t\t{}", attr.max_cq)?;
        writeln!(out, "\tmax_cqe:\t\t\t{}", attr.max_cqe)?;
        writeln!(out, "\tmax_mr:\t\t\t\t{}", attr.max_mr)?;
        writeln!(out, "\tmax_pd:\t\t\t\t{}", attr.max_pd)?;
        writeln!(out, "\tmax_qp_rd_atom:\t\t\t{}", attr.max_qp_rd_atom)?;
        writeln!(out, "\tmax_ee_rd_atom:\t\t\t{}", attr.max_ee_rd_atom)?;
        writeln!(out, "\tmax_res_rd_atom:\t\t{}", attr.max_res_rd_atom)?;
        writeln!(out, "\tmax_qp_init_rd_atom:\t\t{}", attr.max_qp_init_rd_atom)?;
        writeln!(out, "\tmax_ee_init_rd_atom:\t\t{}", attr.max_ee_init_rd_atom)?;
        let atomic = attr.atomic_cap;
        writeln!(out, "\tatomic_cap:\t\t\t{} ({})", atomic_cap_name(atomic), atomic as u8)?;
        writeln!(out, "\tmax_ee:\t\t\t\t{}", attr.max_ee)?;
        writeln!(out, "\tmax_rdd:\t\t\t{}", attr.max_rdd)?;
        writeln!(out, "\tmax_mw:\t\t\t\t{}", attr.max_mw)?;
        writeln!(out, "\tmax_raw_ipv6_qp:\t\t{}", attr.max_raw_ipv6_qp)?;
        writeln!(out, "\tmax_raw_ethy_qp:\t\t{}", attr.max_raw_ethy_qp)?;
        writeln!(out, "\tmax_mcast_grp:\t\t\t{}", attr.max_mcast_grp)?;
        writeln!(out, "\tmax_mcast_qp_attach:\t\t{}", attr.max_mcast_qp_attach)?;
        writeln!(out, "\tmax_total_mcast_qp_attach:\t{}", attr.max_total_mcast_qp_attach)?;
        writeln!(out, "\tmax_ah:\t\t\t\t{}", attr.max_ah)?;
        writeln!(out, "\tmax_fmr:\t\t\t{}", attr.max_fmr)?;
        if attr.max_fmr != 0 {
            writeln!(out, "\tmax_map_per_fmr:\t\t{}", attr.max_map_per_fmr)?;
        }
        writeln!(out, "\tmax_srq:\t\t\t{}", attr.max_srq)?;
        if attr.max_srq != 0 {
            writeln!(out, "\tmax_srq_wr:\t\t\t{}", attr.max_srq_wr)?;
            writeln!(out, "\tmax_srq_sge:\t\t\t{}", attr.max_srq_sge)?;
        }
        writeln!(out, "\tmax_pkeys:\t\t\t{}", attr.max_pkeys)?;
        writeln!(out, "\tlocal_ca_ack_delay:\t\t{}", attr.local_ca_ack_delay)?;
    }
    for port in 1..=attr.phys_port_cnt {
        print_port(out, device, port, verbose)?;
    }
    Ok(())
}

fn print_port(out: &mut impl Write, device: &Device, port: u8, verbose: bool) -> io::Result<()> {
    let attr = device.query_port(port).map_err(io::Error::other)?;
    writeln!(out, "\t\tport:\t{port}")?;
    writeln!(out, "\t\t\tstate:\t\t\t{} ({})", port_state_name(attr.state), attr.state as u8)?;
    writeln!(out, "\t\t\tmax_mtu:\t\t{}", mtu(attr.max_mtu))?;
    writeln!(out, "\t\t\tactive_mtu:\t\t{}", mtu(attr.active_mtu))?;
    writeln!(out, "\t\t\tsm_lid:\t\t\t{}", attr.sm_lid)?;
    writeln!(out, "\t\t\tport_lid:\t\t{}", attr.lid)?;
    writeln!(out, "\t\t\tport_lmc:\t\t0x{:02x}", attr.lmc)?;
    writeln!(out, "\t\t\tlink_layer:\t\t{}", link_layer_name(attr.link_layer))?;
    if verbose {
        writeln!(out, "\t\t\tmax_msg_sz:\t\t0x{:x}", attr.max_msg_sz)?;
        writeln!(out, "\t\t\tport_cap_flags:\t\t0x{:08x}", attr.port_cap_flags)?;
        writeln!(out, "\t\t\tport_cap_flags2:\t0x{:04x}", attr.port_cap_flags2)?;
        writeln!(out, "\t\t\tmax_vl_num:\t\t{} ({})", vl_count(attr.max_vl_num), attr.max_vl_num)?;
        writeln!(out, "\t\t\tbad_pkey_cntr:\t\t0x{:x}", attr.bad_pkey_cntr)?;
        writeln!(out, "\t\t\tqkey_viol_cntr:\t\t0x{:x}", attr.qkey_viol_cntr)?;
        writeln!(out, "\t\t\tsm_sl:\t\t\t{}", attr.sm_sl)?;
        writeln!(out, "\t\t\tpkey_tbl_len:\t\t{}", attr.pkey_tbl_len)?;
        writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", attr.gid_tbl_len)?;
        writeln!(out, "\t\t\tsubnet_timeout:\t\t{}", attr.subnet_timeout)?;
        writeln!(out, "\t\t\tinit_type_reply:\t{}", attr.init_type_reply)?;
        let width = attr.active_width;
        writeln!(out, "\t\t\tactive_width:\t\t{}X ({width})", lane_count(width))?;
        let speed = attr.active_speed;
        writeln!(out, "\t\t\tactive_speed:\t\t{} ({speed})", lane_speed(speed))?;
        let phys = attr.phys_state;
        writeln!(out, "\t\t\tphys_state:\t\t{} ({})", phys_state_name(phys), phys as u8)?;
        // Every GID is RoCEv2, which ibv_devinfo prints as IPv6 text.
        for (index, gid) in device.gid_table().iter().enumerate() {
            let address = std::net::Ipv6Addr::from(gid.to_bytes());
            writeln!(out, "\t\t\tGID[{index:3}]:\t\t{address}, RoCE v2")?;
        }
    }
    writeln!(out)
}

/// A GUID as `ibv_devinfo` prints it: four groups of four hex digits.
fn guid(value: u64) -> String {
    let groups: Vec<String> =
        value.to_be_bytes().chunks_exact(2).map(|g| format!("{:02x}{:02x}", g[0], g[1])).collect();
    groups.join(":")
}

fn mtu(mtu: Mtu) -> String {
    format!("{} ({})", mtu.bytes(), mtu as u8)
}

fn atomic_cap_name(cap: AtomicCap) -> &'static str {
    match cap {
        AtomicCap::None => "ATOMIC_NONE",
        AtomicCap::Hca => "ATOMIC_HCA",
        AtomicCap::Glob => "ATOMIC_GLOB",
    }
}

fn port_state_name(state: PortState) -> &'static str {
    match state {
        PortState::Down => "PORT_DOWN",
        PortState::Active => "PORT_ACTIVE",
    }
}

fn phys_state_name(state: PhysState) -> &'static str {
    match state {
        PhysState::Polling => "POLLING",
        PhysState::LinkUp => "LINK_UP",
    }
}

fn link_layer_name(layer: LinkLayer) -> &'static str {
    match layer {
        LinkLayer::Ethernet => "Ethernet",
    }
}

/// The lanes an IB width code stands for.
fn lane_count(width: u8) -> &'static str {
    match width {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

/// The per-lane rate an IB speed code stands for.
fn lane_speed(speed: u8) -> &'static str {
    match speed {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        _ => "invalid speed",
    }
}

/// The virtual lanes a `max_vl_num` code stands for.
fn vl_count(code: u8) -> &'static str {
    match code {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_four_groups_of_four_hex_digits() {
        assert_eq!(guid(0x5054_00ff_fe12_3456), "5054:00ff:fe12:3456");
        assert_eq!(guid(0x0200_00ff_fe00_0000), "0200:00ff:fe00:0000");
    }
}
