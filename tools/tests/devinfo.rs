//! `softroce devinfo` run as a program on this host's devices, whose last is
//! always the loopback one (MAC 00:00:00:00:00:00, MTU 65536, 127.0.0.1).

use std::process::Command;

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

fn devinfo(args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("devinfo")
        .args(args)
        .env_remove("SOFTROCE_DEVICE")
        .output()
        .unwrap();
    Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        success: output.status.success(),
    }
}

/// The lines from `hca_id:\t<name>` up to the next device.
fn block<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("hca_id:\t{name}");
    let mut lines = stdout.lines().skip_while(|l| *l != header);
    let first = lines.next().unwrap_or_else(|| panic!("no {header:?} in\n{stdout}"));
    std::iter::once(first).chain(lines.take_while(|l| !l.starts_with("hca_id:"))).collect()
}

#[test]
fn loopback_device_prints_as_ibv_devinfo_does() {
    let run = devinfo(&["-d", "sr_lo"]);
    assert!(run.success, "{}", run.stderr);
    let expected = "hca_id:\tsr_lo
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t0.0.0
\tnode_guid:\t\t\t0200:00ff:fe00:0000
\tsys_image_guid:\t\t\t0200:00ff:fe00:0000
\tvendor_id:\t\t\t0xffffff
\tvendor_part_id:\t\t\t0
\thw_ver:\t\t\t\t0x0
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t0
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tEthernet

";
    assert_eq!(run.stdout, expected);
}

#[test]
fn verbose_output_has_the_attributes_and_the_gid_table() {
    let run = devinfo(&["-v"]);
    assert!(run.success, "{}", run.stderr);
    let lo = block(&run.stdout, "sr_lo");
    for line in [
        "\tmax_mr_size:\t\t\t0xffffffffffffffff",
        "\tpage_size_cap:\t\t\t0xfffff000",
        "\tmax_qp:\t\t\t\t65536",
        "\tdevice_cap_flags:\t\t0x01021c40",
        "\t\t\t\t\tRC_RNR_NAK_GEN",
        "\t\t\t\t\tMEM_WINDOW",
        "\t\t\t\t\tMEM_WINDOW_TYPE_2B",
        "\tmax_mw:\t\t\t\t4096",
        "\tmax_cqe:\t\t\t32767",
        "\tatomic_cap:\t\t\tATOMIC_HCA (1)",
        "\tmax_srq_sge:\t\t\t27",
        "\tlocal_ca_ack_delay:\t\t15",
        "\t\t\tmax_msg_sz:\t\t0x800000",
        "\t\t\tport_cap_flags:\t\t0x00010000",
        "\t\t\tgid_tbl_len:\t\t1024",
        "\t\t\tactive_width:\t\t1X (1)",
        "\t\t\tactive_speed:\t\t2.5 Gbps (1)",
        "\t\t\tphys_state:\t\tLINK_UP (5)",
        "\t\t\tGID[  0]:\t\tfe80::200:ff:fe00:0, RoCE v2",
        "\t\t\tGID[  1]:\t\t::ffff:127.0.0.1, RoCE v2",
    ] {
        assert!(lo.contains(&line), "no {line:?} in\n{}", lo.join("\n"));
    }
    // The flags follow their line, and the GID table closes the port.
    let flags = lo.iter().position(|l| l.starts_with("\tdevice_cap_flags:")).unwrap();
    assert_eq!(lo[flags + 1], "\t\t\t\t\tUD_AV_PORT_ENFORCE");
    let gid0 = lo.iter().position(|l| l.starts_with("\t\t\tGID[  0]")).unwrap();
    assert!(lo[gid0 - 1].starts_with("\t\t\tphys_state:"));
    assert_eq!(lo.last(), Some(&""));
    // Loopback comes last.
    assert_eq!(run.stdout.matches("hca_id:").count(), list_names().len());
    assert!(!run.stdout[run.stdout.find("hca_id:\tsr_lo").unwrap()..][1..].contains("hca_id:"));
}

fn list_names() -> Vec<String> {
    let run = devinfo(&["-l"]);
    assert!(run.success, "{}", run.stderr);
    let mut lines = run.stdout.lines();
    let header = lines.next().unwrap();
    let names: Vec<String> =
        lines.take_while(|l| !l.is_empty()).map(|l| l.strip_prefix('\t').unwrap().to_owned()).collect();
    let plural = if names.len() == 1 { "" } else { "s" };
    assert_eq!(header, format!("{} HCA{plural} found:", names.len()));
    names
}

#[test]
fn list_names_every_device_loopback_last() {
    let names = list_names();
    assert_eq!(names.last().map(String::as_str), Some("sr_lo"), "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("sr_")), "{names:?}");
}

#[test]
fn unknown_device_fails() {
    let run = devinfo(&["-d", "sr_no_such_interface"]);
    assert!(!run.success);
    assert_eq!(run.stdout, "");
    assert!(run.stderr.contains("sr_no_such_interface"), "{}", run.stderr);
}
