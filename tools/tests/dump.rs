//! `softroce dump` run as a program on the real rxe captures in tests/data and
//! on captures made up or damaged by the tests.

mod synthetic;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn data(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data")).join(name)
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softroce-dump-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

impl Run {
    fn last_line(&self) -> &str {
        self.stdout.lines().last().unwrap_or_default()
    }

    /// Each packet line with the explanation lines indented under it.
    fn blocks(&self) -> Vec<(&str, Vec<&str>)> {
        let mut blocks: Vec<(&str, Vec<&str>)> = Vec::new();
        for line in self.stdout.lines() {
            match blocks.last_mut() {
                Some((_, explanation)) if line.starts_with("      ") => explanation.push(line.trim()),
                _ => blocks.push((line, Vec::new())),
            }
        }
        blocks
    }

    /// The packet line of a frame and its explanation.
    fn frame(&self, number: usize) -> (&str, Vec<&str>) {
        self.blocks()
            .into_iter()
            .find(|(line, _)| line.split_whitespace().next() == Some(&number.to_string()))
            .unwrap_or_else(|| panic!("no frame {number} in\n{}", self.stdout))
    }

    fn json(&self) -> Vec<Value> {
        self.stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON object per line")).collect()
    }
}

fn dump(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("dump")
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap();
    let run = Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        success: output.status.success(),
    };
    assert!(!run.stderr.contains("panicked"), "softroce panicked: {}", run.stderr);
    run
}

fn explanation_of(run: &Run, frame: usize) -> String {
    run.frame(frame).1.join("\n")
}

#[test]
fn last_line_counts_every_capture() {
    for (file, packets) in [
        ("rc_atomic_fadd.pcap", 10),
        ("rc_read_bw.pcap", 30),
        ("rc_send_bw.pcap", 20),
        ("rc_send_mtu1024.pcap", 32),
        ("rc_send_mtu4096.pcap", 32),
        ("rc_write_bw.pcap", 30),
        ("srq_send.pcap", 24),
        ("uc_send_mtu1024.pcap", 24),
        ("ud_send.pcap", 8),
    ] {
        let run = dump(&[&data(file)]);
        assert!(run.success, "{file}: {}", run.stderr);
        assert_eq!(
            run.last_line(),
            format!("packets: {packets}, icrc ok: {packets}, icrc bad: 0, malformed: 0"),
            "{file}"
        );
        assert_eq!(run.stdout.lines().count(), packets + 1, "{file}: one line per packet");
    }
}

/// softroce's own loopback traffic, captured before the kernel cut its GSO
/// trains: each train is decoded packet by packet, every ICRC good, and a
/// train that does not split is called malformed, not a bad ICRC.
#[test]
fn trains_in_a_loopback_capture_are_split_into_packets() {
    let run = dump(&[&data("softroce/lo_trains.pcap")]);
    assert!(run.success, "{}", run.stderr);
    assert_eq!(
        run.last_line(),
        "packets: 166, icrc ok: 166, icrc bad: 0, malformed: 0, from GSO/GRO trains: 30 datagrams"
    );
    assert_eq!(run.stdout.lines().filter(|l| l.contains("(train packet 1/")).count(), 30);

    // A train with one byte changed splits no more: one malformed datagram.
    let (frames, _) = softroce::capture::read(&std::fs::read(data("softroce/lo_trains.pcap")).unwrap());
    let train = frames.iter().find(|f| f.data.len() > 6000).expect("a long train");
    let mut damaged = softroce::capture::ip_bytes(train.link, &train.data).unwrap().to_vec();
    let at = damaged.len() - 40;
    damaged[at] ^= 0x10;
    let mut capture = synthetic::Capture::new();
    capture.push_bytes(&damaged);
    let dir = scratch("train");
    let path = write_file(&dir, "damaged.pcap", &capture.finish());
    let run = dump(&[&path]);
    assert_eq!(run.last_line(), "packets: 1, icrc ok: 0, icrc bad: 0, malformed: 1");
    assert!(run.stdout.contains("does not split into a GSO/GRO train"), "{}", run.stdout);
}

/// Two `ibv_rc_pingpong`s sharing sr_lo's port, captured on lo: the
/// census probes of the shared port (on 127.0.0.1 and ::1) are named, not
/// counted as RoCE packets or malformed ones.
#[test]
fn census_probes_of_the_shared_port_are_named() {
    let capture = data("softroce/census_probes.pcap");
    let run = dump(&[&capture]);
    assert!(run.success, "{}", run.stderr);
    assert_eq!(
        run.last_line(),
        "packets: 30, icrc ok: 30, icrc bad: 0, malformed: 0, from GSO/GRO trains: 6 datagrams, \
         softroce census probes: 6"
    );
    let probes: Vec<&str> = run.stdout.lines().filter(|l| l.contains("softroce census probe (")).collect();
    assert_eq!(probes.len(), 6, "{}", run.stdout);
    assert!(
        probes[0].ends_with(
            "127.0.0.1 > 127.0.0.1 softroce census probe (shared port, not RoCE) nonce=0x0143c24a position=0"
        ),
        "{}",
        probes[0]
    );
    assert!(probes[5].contains("::1 > ::1 ") && probes[5].ends_with("position=1"), "{}", probes[5]);

    let explained = dump(&[&"--explain", &capture]);
    assert!(explained.frame(2).1.join(" ").contains("sends 2 to steer to socket position 1"), "{}", explained.stdout);

    let json = dump(&[&"--json", &capture]).json();
    assert_eq!(json[0]["census_probe"], serde_json::json!({"nonce": 0x0143_c24a, "position": 0}));
    assert_eq!(json.iter().filter(|o| o.get("census_probe").is_some()).count(), 6);
}

#[test]
fn text_line_shows_headers() {
    let run = dump(&[&data("rc_atomic_fadd.pcap")]);
    let (first, _) = run.frame(1);
    assert!(first.contains("10.77.0.3 > 10.77.0.2 RC_FETCH_ADD qp=0x11 psn=2905357 ack_req=1"), "{first}");
    assert!(first.contains("AtomicETH(va=0x5614eaa32000 rkey=0x2aa swap_add=0x1 compare=0x0)"), "{first}");
    assert!(first.ends_with("len=0 icrc=ok"), "{first}");
    let (ack, _) = run.frame(6);
    assert!(ack.contains("AETH(0x1f ACK credits=invalid msn=1) AtomicAckETH(orig="), "{ack}");

    let run = dump(&[&data("ud_send.pcap")]);
    assert!(run.frame(1).0.contains("DETH(qkey=0x11111111 src_qp=0x11) len=512"));
}

#[test]
fn reads_pcapng_with_linux_cooked_frames() {
    let dir = scratch("pcapng");
    let pcap = std::fs::read(data("rc_read_bw.pcap")).unwrap();
    let path = write_file(&dir, "cooked.pcapng", &synthetic::ethernet_pcap_to_cooked_pcapng(&pcap));
    let run = dump(&[&path]);
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.last_line(), "packets: 30, icrc ok: 30, icrc bad: 0, malformed: 0");
    assert_eq!(run.stdout, dump(&[&data("rc_read_bw.pcap")]).stdout, "same packets, same times");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn json_fetch_add_carries_atomic_eth() {
    let run = dump(&[&"--json", &data("rc_atomic_fadd.pcap")]);
    assert!(run.success);
    let packets = run.json();
    assert_eq!(packets.len(), 10);
    let fetch_add = &packets[0];
    assert_eq!(fetch_add["opcode"], 0x14);
    assert_eq!(fetch_add["opcode_name"], "RC_FETCH_ADD");
    assert_eq!(fetch_add["src"], "10.77.0.3");
    assert_eq!(fetch_add["dst"], "10.77.0.2");
    assert_eq!(fetch_add["dqpn"], 0x11);
    assert_eq!(fetch_add["psn"], 2905357);
    assert_eq!(fetch_add["ack_req"], true);
    assert_eq!(fetch_add["solicited"], false);
    assert_eq!(fetch_add["pkey"], 0xffff);
    assert_eq!(fetch_add["payload_len"], 0);
    assert_eq!(fetch_add["pad"], 0);
    assert_eq!(fetch_add["icrc_ok"], true);
    assert!(fetch_add["time"].as_f64().unwrap() > 1e9, "seconds since the epoch");
    assert_eq!(
        fetch_add["atomic_eth"],
        serde_json::json!({"va": 0x5614_eaa3_2000u64, "rkey": 0x2aa, "swap_add": 1, "compare": 0})
    );
    assert!(fetch_add.get("aeth").is_none() && fetch_add.get("reth").is_none());

    let atomic_ack = &packets[5];
    assert_eq!(atomic_ack["opcode_name"], "RC_ATOMIC_ACKNOWLEDGE");
    assert_eq!(atomic_ack["psn"], 2905357);
    assert_eq!(atomic_ack["aeth"]["kind"], "ack");
    assert!(atomic_ack["atomic_ack_eth"]["original"].is_u64());
}

#[test]
fn json_read_response_carries_aeth() {
    let run = dump(&[&"--json", &data("rc_read_bw.pcap")]);
    let packets = run.json();
    assert_eq!(packets[0]["reth"], serde_json::json!({"va": 0x5557_90d9_4388u64, "rkey": 0x202, "dma_len": 5000}));
    let first = &packets[5];
    assert_eq!(first["opcode_name"], "RC_RDMA_READ_RESPONSE_FIRST");
    assert_eq!(first["payload_len"], 1024);
    assert_eq!(first["aeth"], serde_json::json!({"syndrome": 0x1f, "kind": "ack", "credits": 31, "msn": 1}));
    assert!(packets[6].get("aeth").is_none(), "MIDDLE responses have no AETH");
    assert_eq!(packets[9]["aeth"]["msn"], 1);
    assert_eq!(packets[9]["payload_len"], 904);
}

#[test]
fn json_ud_carries_deth() {
    let run = dump(&[&"--json", &data("ud_send.pcap")]);
    let packets = run.json();
    assert_eq!(packets.len(), 8);
    for packet in &packets {
        assert_eq!(packet["deth"], serde_json::json!({"qkey": 0x1111_1111u32, "src_qpn": 0x11}));
        assert_eq!(packet["opcode_name"], "UD_SEND_ONLY");
    }
}

#[test]
fn json_keeps_stdout_pure_and_summary_on_stderr() {
    let run = dump(&[&"--json", &data("rc_write_bw.pcap")]);
    assert_eq!(run.json().len(), 30);
    assert_eq!(run.stderr.trim_end(), "packets: 30, icrc ok: 30, icrc bad: 0, malformed: 0");
}

#[test]
fn explain_says_ackreq_on_last_packet() {
    let run = dump(&[&"--explain", &data("rc_send_mtu1024.pcap")]);
    assert!(run.success);
    let (last, explanation) = run.frame(3);
    assert!(last.contains("RC_SEND_LAST"), "{last}");
    assert!(explanation.contains(&"AckReq set: last packet of the message, the responder must acknowledge"));
    assert!(explanation.contains(&"payload 952 bytes: completes a 3000-byte SEND in 3 packet(s)"));
    let first = explanation_of(&run, 1);
    assert!(first.contains("AckReq clear: more of the message follows"), "{first}");
    assert!(first.contains("so this QP's path MTU is 1024"), "{first}");
    let middle = explanation_of(&run, 2);
    assert!(middle.contains("next in sequence for QP 0x11 (previous"), "{middle}");
    let ack = explanation_of(&run, 4);
    assert!(ack.contains("AETH 0x1f: ACK, credit field invalid (rxe never advertises credits); MSN 1"), "{ack}");
    assert_eq!(run.last_line(), "packets: 32, icrc ok: 32, icrc bad: 0, malformed: 0");
}

#[test]
fn explain_follows_read_psns() {
    let run = dump(&[&"--explain", &data("rc_read_bw.pcap")]);
    let second_read = explanation_of(&run, 2);
    assert!(
        second_read.contains(
            "PSN 7085925: next in sequence: the READ request at PSN 7085920 reserved 5 PSN(s), \
             one for each response packet (5000 bytes at path MTU 1024)"
        ),
        "{second_read}"
    );
    let middle = explanation_of(&run, 7);
    assert!(middle.contains("PSN 7085921: response packet 2 of 5 to the READ request at PSN 7085920"), "{middle}");
    assert!(middle.contains("2048 bytes so far of 5000"), "{middle}");
}

#[test]
fn explain_relates_atomic_ack_to_its_request() {
    let run = dump(&[&"--explain", &data("rc_atomic_fadd.pcap")]);
    let (line, _) = run.frame(6);
    let original = line.split("orig=0x").nth(1).unwrap().split(')').next().unwrap();
    let original = u64::from_str_radix(original, 16).unwrap();
    let ack = explanation_of(&run, 6);
    assert!(ack.contains("answers the FETCH_ADD request with the same PSN"), "{ack}");
    assert!(ack.contains(&format!("the FETCH_ADD of 1 left {:#x} there", original + 1)), "{ack}");
}

#[test]
fn explain_tells_background_once() {
    let run = dump(&[&"--explain", &data("ud_send.pcap")]);
    assert_eq!(run.stdout.matches("The ICRC is a CRC-32").count(), 1);
    assert_eq!(run.stdout.matches("ICRC 0x").count(), 8);
    assert!(explanation_of(&run, 1).contains("Q_Key 0x11111111"));
}

/// Well-formed enough: tags nest and close, `<` and `&` only start markup.
fn assert_xmlish(svg: &str) {
    assert!(svg.starts_with("<svg "), "{}", &svg[..40.min(svg.len())]);
    let mut open = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        assert!(!rest[..start].contains('>'), "stray > before {}", &rest[start..][..40]);
        let end = rest[start..].find('>').expect("unclosed tag") + start;
        let tag = &rest[start + 1..end];
        let name = tag.trim_start_matches('/').split([' ', '/']).next().unwrap();
        if let Some(closing) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(closing.to_string()), "mismatched </{closing}>");
        } else if !tag.ends_with('/') {
            open.push(name.to_string());
        }
        for entity in rest[..start].match_indices('&') {
            let after = &rest[entity.0..];
            assert!(["&amp;", "&lt;", "&gt;", "&quot;"].iter().any(|e| after.starts_with(e)), "bare &");
        }
        rest = &rest[end + 1..];
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
}

#[test]
fn ladder_draws_one_arrow_per_packet() {
    let dir = scratch("ladder");
    let svg_path = dir.join("read.svg");
    let run = dump(&[&"--ladder", &svg_path, &data("rc_read_bw.pcap")]);
    assert!(run.success);
    assert_eq!(run.last_line(), "packets: 30, icrc ok: 30, icrc bad: 0, malformed: 0", "text output too");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_xmlish(&svg);
    assert_eq!(svg.matches(r#"<g class="pkt "#).count(), 30);
    assert_eq!(svg.matches(r#"<g class="pkt request""#).count(), 5);
    assert_eq!(svg.matches(r#"<g class="pkt read-response""#).count(), 25);
    assert!(svg.contains(">10.77.0.3</text>") && svg.contains(">10.77.0.2</text>"), "lifelines");
    assert!(svg.contains(">QP 0x11</text>"));
    assert!(svg.contains(">READ_REQ 7085920</text>"));
    assert!(svg.contains(">READ_RESP_MIDDLE 7085921</text>"));
    assert!(svg.contains("Legend"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn flipped_payload_byte_fails_icrc() {
    let dir = scratch("flip");
    let mut bytes = std::fs::read(data("rc_send_mtu1024.pcap")).unwrap();
    // File header, record header, Ethernet, IPv4, UDP, BTH, then 100 bytes into the payload.
    bytes[24 + 16 + 14 + 20 + 8 + 12 + 100] ^= 0x01;
    let path = write_file(&dir, "flipped.pcap", &bytes);
    let run = dump(&[&path]);
    assert!(run.success, "a bad ICRC is a finding, not a failure to read");
    assert!(run.frame(1).0.ends_with("icrc=BAD"), "{}", run.frame(1).0);
    assert!(run.frame(2).0.ends_with("icrc=ok"));
    assert_eq!(run.last_line(), "packets: 32, icrc ok: 31, icrc bad: 1, malformed: 0");

    let run = dump(&[&"--explain", &path]);
    let explanation = explanation_of(&run, 1);
    assert!(explanation.contains("ICRC BAD: the packet carries 0x"), "{explanation}");
    let json = dump(&[&"--json", &path]).json();
    assert_eq!(json[0]["icrc_ok"], false);
    assert_eq!(json[1]["icrc_ok"], true);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn garbage_file_is_malformed_not_a_panic() {
    let dir = scratch("garbage");
    let garbage: Vec<u8> = (0..4000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let path = write_file(&dir, "garbage.pcap", &garbage);
    let run = dump(&[&path]);
    assert!(!run.success);
    assert_eq!(run.last_line(), "packets: 0, icrc ok: 0, icrc bad: 0, malformed: 1");
    assert!(run.stderr.contains("garbage.pcap") && run.stderr.contains("not a pcap or pcapng file"), "{}", run.stderr);

    let empty = write_file(&dir, "empty.pcap", &[]);
    let run = dump(&[&"--json", &empty]);
    assert!(!run.success);
    assert!(run.stdout.is_empty());
    assert!(run.stderr.ends_with("packets: 0, icrc ok: 0, icrc bad: 0, malformed: 1\n"), "{}", run.stderr);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn truncated_file_keeps_earlier_packets_and_fails() {
    let dir = scratch("truncated");
    let bytes = std::fs::read(data("rc_send_mtu1024.pcap")).unwrap();
    // Walk the records (16-byte header, captured length at +8) to the last one.
    let mut last_record = 24;
    loop {
        let captured = u32::from_le_bytes(bytes[last_record + 8..last_record + 12].try_into().unwrap());
        let next = last_record + 16 + captured as usize;
        if next >= bytes.len() {
            break;
        }
        last_record = next;
    }
    let path = write_file(&dir, "cut.pcap", &bytes[..last_record + 16 + 10]);
    let run = dump(&[&path]);
    assert!(!run.success);
    assert_eq!(run.last_line(), "packets: 31, icrc ok: 31, icrc bad: 0, malformed: 1");
    assert!(run.stderr.contains("cut.pcap: damaged capture, stopped after frame 31"), "{}", run.stderr);
    // Every cut of the file header and first records is handled.
    for cut in (0..1200).step_by(7) {
        let path = write_file(&dir, "short.pcap", &bytes[..cut]);
        let run = dump(&[&path]);
        assert!(!run.success, "cut at {cut}");
        assert!(run.last_line().ends_with("malformed: 1"), "cut at {cut}: {}", run.last_line());
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn missing_file_fails_but_others_are_read() {
    let run = dump(&[&"/nonexistent/softroce.pcap", &data("ud_send.pcap")]);
    assert!(!run.success);
    assert!(run.stderr.contains("/nonexistent/softroce.pcap"));
    assert!(run.stdout.contains("==> "), "files are announced when there are several");
    assert_eq!(run.last_line(), "packets: 8, icrc ok: 8, icrc bad: 0, malformed: 0");
}

fn lossy_capture(test: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(test);
    let path = write_file(&dir, "lossy.pcap", &synthetic::lossy_rc());
    (dir, path)
}

#[test]
fn lossy_conversation_is_counted_and_flagged() {
    let (dir, path) = lossy_capture("lossy-text");
    let run = dump(&[&path]);
    assert!(run.success);
    assert_eq!(run.last_line(), "packets: 18, icrc ok: 16, icrc bad: 1, malformed: 1");
    let frames: Vec<&str> = run.blocks().iter().filter_map(|(l, _)| l.split_whitespace().next()).collect();
    assert!(!frames.contains(&"18"), "the DNS frame is skipped: {frames:?}");
    let line = |frame| run.frame(frame).0;
    assert!(line(3).contains("AETH(0x60 NAK PSN sequence error msn=0)"), "{}", line(3));
    assert!(line(4).ends_with("icrc=ok [retransmission]"), "{}", line(4));
    assert!(line(5).ends_with("[retransmission]"));
    assert!(!line(6).contains("retransmission"));
    assert!(line(7).contains("ImmDt(0xdeadbeef) len=1022 pad=2 icrc=ok"), "{}", line(7));
    assert!(line(8).contains("AETH(0x2e RNR NAK timer=14 (1280 us) msn=1)"), "{}", line(8));
    assert!(line(11).ends_with("RETH(va=0x7000 rkey=0x99 len=64) len=64 icrc=BAD"), "{}", line(11));
    assert!(line(12).ends_with("icrc=ok [retransmission]"));
    assert!(!line(15).contains("retransmission"), "a duplicate ACK is not resent data");
    assert!(
        line(19).ends_with("10.77.0.3 > 10.77.0.2 malformed RoCEv2 packet: BTH version 1, expected 0"),
        "{}",
        line(19)
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn lossy_conversation_is_explained() {
    let (dir, path) = lossy_capture("lossy-explain");
    let run = dump(&[&"--explain", &path]);
    let expect = |frame: usize, needle: &str| {
        let explanation = explanation_of(&run, frame);
        assert!(explanation.contains(needle), "frame {frame}: no {needle:?} in\n{explanation}");
    };
    expect(2, "PSN 102 skips ahead of the expected 101: 1 PSN(s) missing");
    expect(2, "an RC responder answers a gap with a NAK (PSN sequence error)");
    expect(3, "AETH 0x60: NAK, PSN sequence error");
    expect(3, "PSN 101: the PSN the responder expected; the requester must resend from here");
    expect(4, "PSN 101 seen before on this flow: retransmission (the flow had reached 103)");
    expect(5, "PSN 102: next after 101, but sent before");
    expect(6, "PSN 102: acknowledges every request up to and including PSN 102 (ACKs are cumulative)");
    expect(7, "pad 2: 1022-byte payload padded to a multiple of 4");
    expect(7, "ImmDt 0xdeadbeef");
    expect(8, "RNR NAK (receiver not ready)");
    expect(8, "timer code 14 = 1280 us (1.28 ms)");
    expect(8, "PSN 103: the request that found no receive request posted");
    expect(10, "covers the 1 PSN(s) after the previous acknowledgement at 102");
    expect(11, "ICRC BAD: the packet carries 0x");
    expect(12, "PSN 104 seen before on this flow: retransmission");
    expect(15, "same PSN as the previous acknowledgement: a duplicate ACK");
    expect(16, "if the 8 bytes at remote address 0x8000 (R_Key 0x42) equal 0x5, replace them with 0x7");
    expect(17, "answers the COMPARE_SWAP request with the same PSN");
    expect(17, "it equals the compare value, so 0x7 was stored");
    expect(19, "does not decode (BTH version 1, expected 0)");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn lossy_conversation_as_json() {
    let (dir, path) = lossy_capture("lossy-json");
    let run = dump(&[&"--json", &"--explain", &path]);
    let packets = run.json();
    assert_eq!(packets.len(), 18);
    let by_frame = |frame: u64| packets.iter().find(|p| p["frame"] == frame).unwrap();
    assert_eq!(
        by_frame(3)["aeth"],
        serde_json::json!({
            "syndrome": 0x60,
            "kind": "nak",
            "nak_code": 0,
            "nak_name": "PSN sequence error",
            "msn": 0
        })
    );
    assert_eq!(by_frame(4)["retransmission"], true);
    assert_eq!(by_frame(6)["retransmission"], false);
    assert_eq!(by_frame(7)["imm"], 0xdead_beefu32);
    assert_eq!(by_frame(7)["pad"], 2);
    assert_eq!(by_frame(7)["payload_len"], 1022);
    assert_eq!(
        by_frame(8)["aeth"],
        serde_json::json!({"syndrome": 0x2e, "kind": "rnr_nak", "timer": 14, "timer_us": 1280, "msn": 1})
    );
    assert_eq!(by_frame(11)["icrc_ok"], false);
    assert_eq!(by_frame(11)["reth"]["dma_len"], 64);
    assert_eq!(by_frame(12)["icrc_ok"], true);
    assert_eq!(
        by_frame(16)["atomic_eth"],
        serde_json::json!({"va": 0x8000, "rkey": 0x42, "swap_add": 7, "compare": 5})
    );
    assert_eq!(by_frame(17)["atomic_ack_eth"], serde_json::json!({"original": 5}));
    let malformed = by_frame(19);
    assert_eq!(malformed["malformed"], "BTH version 1, expected 0");
    assert!(malformed.get("opcode").is_none());
    let explain = by_frame(1)["explain"].as_array().unwrap();
    assert!(explain.iter().any(|l| l.as_str().unwrap().starts_with("PSN 100: first request")));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn lossy_conversation_ladder_styles() {
    let (dir, path) = lossy_capture("lossy-ladder");
    let svg_path = dir.join("lossy.svg");
    let run = dump(&[&"--json", &"--ladder", &svg_path, &path]);
    assert!(run.success);
    assert_eq!(run.json().len(), 18, "JSON output alongside the ladder");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_xmlish(&svg);
    let arrows = |class: &str| svg.matches(&format!(r#"<g class="pkt {class}""#)).count();
    assert_eq!(svg.matches(r#"<g class="pkt "#).count(), 18);
    assert_eq!(arrows("nak"), 1);
    assert_eq!(arrows("rnr-nak"), 1);
    assert_eq!(arrows("request retransmission"), 5, "frames 4, 5, 9, 12 and 14");
    assert_eq!(arrows("request broken"), 1, "the ICRC failure");
    assert_eq!(arrows("malformed broken"), 1);
    assert_eq!(arrows("ack"), 5, "four ACKs and an ATOMIC ACK");
    assert_eq!(arrows("request"), 4, "frames 1, 2, 7 and 16");
    assert!(svg.contains(">ACK 101 [NAK 0x60 PSN sequence error]</text>"));
    assert!(svg.contains(">ACK 103 [RNR 0x2e 1280us]</text>"));
    assert!(svg.contains(">SEND_MIDDLE 101 retransmitted</text>"));
    assert!(svg.contains(">WRITE_ONLY 104 ICRC BAD</text>"));
    assert!(svg.contains(r#"stroke-dasharray="7 4""#), "retransmissions are dashed");
    assert!(svg.contains(">QP 0x11</text>") && svg.contains(">QP 0x12</text>"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn cut_short_frame_is_malformed_with_its_reason() {
    use synthetic::{request, Capture, Direction};
    let dir = scratch("snaplen");
    let mut capture = Capture::new();
    let send = request(softroce::wire::Operation::SendOnly, 7, true);
    let whole = capture.packet(Direction::Forward, &send, &[5; 1000]);
    capture.push_bytes(&whole);
    capture.push_bytes(&whole[..60]);
    let path = write_file(&dir, "snaplen.pcap", &capture.finish());
    let run = dump(&[&path]);
    assert!(run.success, "a damaged packet is not a damaged file");
    assert!(run.frame(1).0.ends_with("len=1000 icrc=ok"));
    assert!(
        run.frame(2).0.ends_with(
            "malformed RoCEv2 packet: frame cut short: the IP header announces 1044 bytes, 60 \
             were captured (snap length too small?)"
        ),
        "{}",
        run.frame(2).0
    );
    assert_eq!(run.last_line(), "packets: 2, icrc ok: 1, icrc bad: 0, malformed: 1");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn ladder_stops_at_its_limit_on_large_captures() {
    let dir = scratch("large");
    let path = write_file(&dir, "large.pcap", &synthetic::many_ud_sends(2100));
    let svg_path = dir.join("large.svg");
    let run = dump(&[&"--ladder", &svg_path, &path]);
    assert_eq!(run.last_line(), "packets: 2100, icrc ok: 2100, icrc bad: 0, malformed: 0");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_xmlish(&svg);
    assert_eq!(svg.matches(r#"<g class="pkt "#).count(), 2000);
    assert!(svg.contains("100 more packets not drawn"));
    assert!(svg.contains("2100 packet(s), showing the first 2000"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unwritable_ladder_fails() {
    let run = dump(&[&"--ladder", &"/nonexistent/dir/out.svg", &data("ud_send.pcap")]);
    assert!(!run.success);
    assert!(run.stderr.contains("/nonexistent/dir/out.svg"), "{}", run.stderr);
    assert_eq!(run.last_line(), "packets: 8, icrc ok: 8, icrc bad: 0, malformed: 0");
}

#[test]
fn a_reader_that_goes_away_ends_the_dump_quietly() {
    // Five explained captures are more than a pipe holds, so the dump
    // writes into a pipe whose reader has gone.
    let capture = data("rc_send_mtu4096.pcap");
    let mut child = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("dump")
        .arg("--explain")
        .args([&capture, &capture, &capture, &capture, &capture])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{:?}", output.status);
}

/// The CM MADs of kernel rdma_cm's connections (tests/data/cm): one line each
/// with the message and its key fields, and a ladder arrow named after it.
#[test]
fn cm_messages_are_decoded_on_their_lines() {
    let run = dump(&[&data("cm/rping.pcap")]);
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.last_line(), "packets: 41, icrc ok: 41, icrc bad: 0, malformed: 0");
    let line = |frame| run.frame(frame).0.to_string();
    assert!(line(1).contains(
        "UD_SEND_ONLY qp=0x1 psn=0 ack_req=1 DETH(qkey=0x80010000 src_qp=0x1) CM REQ(local_id=0x8be7ac52 \
         sid=TCP:7174 qpn=0x11 psn=7616978 mtu=1024) len=256 icrc=ok"
    ));
    assert!(line(2).contains("CM REP(local_id=0x0a718b4e remote_id=0x8be7ac52 qpn=0x11 psn=1457642)"));
    assert!(line(3).contains("CM RTU(local_id=0x8be7ac52 remote_id=0x0a718b4e)"));
    assert!(line(4).contains("RC_SEND_ONLY qp=0x11 psn=1457642"), "the client sends from the REP's PSN");
    assert!(!line(4).contains("CM "));
    assert!(line(40).contains("CM DREQ(local_id=0x8be7ac52 remote_id=0x0a718b4e remote_qpn=0x11)"));
    assert!(line(41).contains("CM DREP(local_id=0x0a718b4e remote_id=0x8be7ac52)"));

    let run = dump(&[&data("cm/rping_rejected.pcap")]);
    assert!(run
        .frame(2)
        .0
        .contains("CM REJ(local_id=0x00000000 remote_id=0x70a3b9d7 reason=8 (invalid service ID) rejected=REQ)"));
    let run = dump(&[&data("cm/udaddy.pcap")]);
    assert!(run.frame(1).0.contains("CM SIDR_REQ(request_id=0x0b74236a sid=UDP:7174)"));
    assert!(run
        .frame(2)
        .0
        .contains("CM SIDR_REP(request_id=0x0b74236a sid=UDP:7174 status=0 (success) qpn=0x11 qkey=0x01234567)"));

    let dir = scratch("cm-ladder");
    let svg_path = dir.join("cm.svg");
    let run = dump(&[&"--ladder", &svg_path, &data("cm/rping.pcap"), &data("cm/rping_rejected.pcap")]);
    assert!(run.success);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_xmlish(&svg);
    for label in [">CM REQ</text>", ">CM REP</text>", ">CM RTU</text>", ">CM DREQ</text>", ">CM DREP</text>"] {
        assert!(svg.contains(label), "{label}");
    }
    assert!(svg.contains(">CM REJ 8</text>"));
    assert!(svg.contains(">QP 0x1, 0x11</text>"), "QP 1 and the connected QP on each host");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn explain_walks_through_a_cm_connection() {
    let run = dump(&[&"--explain", &data("cm/rping.pcap")]);
    assert!(run.success);
    let req = explanation_of(&run, 1);
    for expected in [
        "MAD: class 0x07 (communication management) version 2, method Send (0x03), attribute 0x0010 (REQ)",
        "QP 1 is the General Services Interface",
        "REQ: 10.77.0.3 asks to connect its RC QP 0x11 to service ID 0x0000000001061c06, which rdma_cm \
         reads as port space 0x0106 (RDMA_PS_TCP), port 7174",
        "starting PSN 7616978: the PSN the requester's QP expects first, so 10.77.0.2's QP will send from it",
        "remote CM response timeout 20 = 4.29 s",
        "primary path: GID ::ffff:10.77.0.3 > ::ffff:10.77.0.2",
        "rdma_cm's header first (36 bytes): IPv4 10.77.0.3:35316 > 10.77.0.2",
    ] {
        assert!(req.contains(expected), "{expected}\nnot in\n{req}");
    }
    let rep = explanation_of(&run, 2);
    assert!(rep.contains("so the requester's first request carries PSN 1457642"), "{rep}");
    assert!(!rep.contains("General Services Interface"), "the background is told once");
    assert!(explanation_of(&run, 3).contains("RTU (ready to use)"));
    assert!(explanation_of(&run, 40).contains("DREQ: 10.77.0.3 disconnects connection 0x8be7ac52"));
    assert!(explanation_of(&run, 41).contains("DREP: 10.77.0.2 confirms the disconnection"));

    let run = dump(&[&"--explain", &data("cm/rping_rejected.pcap")]);
    let rej = explanation_of(&run, 2);
    assert!(rej.contains("reason 8 (invalid service ID): nobody listens on that service ID"), "{rej}");
    assert!(rej.contains("RDMA_CM_EVENT_REJECTED with status 8"), "{rej}");

    let run = dump(&[&"--explain", &data("cm/udaddy.pcap")]);
    assert!(explanation_of(&run, 1).contains("asks 10.77.0.2 which UD QP serves service ID 0x0000000001111c06"));
    assert!(explanation_of(&run, 2).contains("go to QP 0x11 with Q_Key 0x01234567 (rdma_cm's Q_Key"));
}

#[test]
fn json_carries_cm_messages() {
    let run = dump(&[&"--json", &data("cm/rping.pcap")]);
    let packets = run.json();
    let req = &packets[0]["mad"];
    assert_eq!(req["header"]["mgmt_class"], 7);
    assert_eq!(req["header"]["attribute_id"], 0x10);
    assert_eq!(req["cm"]["type"], "REQ");
    assert_eq!(req["cm"]["service"], "TCP:7174");
    assert_eq!(req["cm"]["local_qpn"], 0x11);
    assert_eq!(req["cm"]["starting_psn"], 7616978);
    assert_eq!(req["cm"]["primary_path"]["local_gid"], "::ffff:10.77.0.3");
    assert_eq!(req["cm"]["cma"], serde_json::json!({"src": "10.77.0.3", "src_port": 35316, "dst": "10.77.0.2"}));
    assert_eq!(packets[1]["mad"]["cm"]["type"], "REP");
    assert_eq!(packets[1]["mad"]["cm"]["remote_comm_id"], req["cm"]["local_comm_id"]);
    assert!(packets[3].get("mad").is_none(), "RC traffic has no MAD");

    let run = dump(&[&"--json", &data("cm/rping_rejected.pcap")]);
    let rej = &run.json()[1]["mad"]["cm"];
    assert_eq!((rej["type"].as_str(), rej["reason"].as_u64()), (Some("REJ"), Some(8)));
    assert_eq!(rej["reason_name"], "invalid service ID");
}

/// A MAD to QP 1 that is damaged but whose ICRC is right: the packet is fine,
/// its MAD is flagged, and nothing panics.
#[test]
fn a_broken_cm_mad_is_flagged() {
    let (frames, _) = softroce::capture::read(&std::fs::read(data("cm/rping.pcap")).unwrap());
    let ip = softroce::capture::ip_bytes(frames[0].link, &frames[0].data).unwrap().to_vec();
    let req = softroce::wire::Packet::parse(&ip).unwrap();
    let rebuilt = |change: &dyn Fn(&mut Vec<u8>)| {
        let mut mad = req.roce.payload.to_vec();
        change(&mut mad);
        softroce::wire::packet::build(&req.ip, &req.udp, &req.roce.header, &mad).unwrap()
    };
    let mut capture = synthetic::Capture::new();
    // An MRA whose "message MRAed" is the reserved 3.
    capture.push_bytes(&rebuilt(&|mad| {
        mad[17] = 0x11;
        mad[24 + 8] = 0xc0;
    }));
    // A LAP, which is not parsed.
    capture.push_bytes(&rebuilt(&|mad| mad[17] = 0x19));
    // Subnet administration, not the CM.
    capture.push_bytes(&rebuilt(&|mad| mad[1] = 0x03));
    // Too short for a MAD.
    capture.push_bytes(&rebuilt(&|mad| mad.truncate(20)));
    let dir = scratch("cm-broken");
    let path = write_file(&dir, "broken.pcap", &capture.finish());
    let run = dump(&[&path]);
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.last_line(), "packets: 4, icrc ok: 4, icrc bad: 0, malformed: 0");
    assert!(run.frame(1).0.contains("CM MRA(malformed: MRA message MRAed 0x3 is reserved or out of range)"));
    assert!(run.frame(2).0.contains("CM LAP(malformed: CM attribute 0x0019 is not a message this stack parses)"));
    assert!(run.frame(3).0.contains("MAD(class=0x03 version=2 method=0x03 attr=0x0010)"));
    assert!(run.frame(4).0.contains("MAD(too short)"));
    let run = dump(&[&"--explain", &path]);
    assert!(explanation_of(&run, 1).contains("the CM message does not decode"));
    assert!(explanation_of(&run, 3).contains("not a CM MAD"));
    let run = dump(&[&"--json", &path]);
    assert!(run.json()[0]["mad"]["malformed"].is_string());
    std::fs::remove_dir_all(dir).ok();
}
