//! Seeds for the cargo-fuzz targets in `fuzz/`, drawn from the captures in
//! `tests/data`: every RoCE IP packet, and the first frames of each capture as
//! a pcap and as a pcapng file.
//!
//! - `export_fuzz_corpus` (ignored; `tools/fuzz.sh` runs it) writes all of them
//!   to `fuzz/corpus/packet_parse`, which git ignores.
//! - A few are committed in `fuzz/seeds/packet_parse` (one packet per opcode
//!   seen, and the heads of the smallest capture), so a fuzzer starts from real
//!   traffic even without the export. `write_fuzz_seeds` (ignored) regenerates
//!   them; `committed_seeds_are_current` checks that they match.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::captures;
use softroce::capture;
use softroce::wire::Packet;

/// Frames in a capture's head: enough for a few packets of each direction.
const HEAD_FRAMES: usize = 3;

/// The capture whose heads are committed: the smallest.
const SEED_HEAD_CAPTURE: &str = "ud_send";

fn fuzz_dir(rest: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(rest)
}

/// The first `frames` records of a little-endian pcap file, cut from its bytes.
fn pcap_head(pcap: &[u8], frames: usize) -> Vec<u8> {
    assert_eq!(pcap[..4], 0xa1b2_c3d4u32.to_le_bytes(), "little-endian pcap");
    let mut end = 24;
    for _ in 0..frames {
        let incl_len = u32::from_le_bytes(pcap[end + 8..end + 12].try_into().unwrap());
        end += 16 + incl_len as usize;
    }
    pcap[..end].to_vec()
}

/// Every input derived from the captures, by file name.
fn corpus() -> BTreeMap<String, Vec<u8>> {
    let mut corpus = BTreeMap::new();
    for name in captures::capture_names() {
        for (i, ip) in captures::roce_ip_packets(&name).into_iter().enumerate() {
            corpus.insert(format!("{name}-{i:02}.ip"), ip);
        }
        let pcap = captures::capture_bytes(&name);
        let (frames, err) = capture::read(&pcap);
        assert_eq!(err, None, "{name}");
        corpus.insert(format!("{name}-head.pcap"), pcap_head(&pcap, HEAD_FRAMES));
        corpus.insert(format!("{name}-head.pcapng"), captures::to_pcapng(&frames[..HEAD_FRAMES]));
    }
    corpus
}

/// The committed subset: the first packet of each opcode, and the heads of
/// [`SEED_HEAD_CAPTURE`].
fn seeds() -> BTreeMap<String, Vec<u8>> {
    let mut opcodes = BTreeSet::new();
    corpus()
        .into_iter()
        .filter(|(name, bytes)| match name.strip_suffix(".ip") {
            Some(_) => opcodes.insert(Packet::parse(bytes).unwrap().roce.header.bth.opcode.to_u8()),
            None => name.starts_with(&format!("{SEED_HEAD_CAPTURE}-head.")),
        })
        .collect()
}

/// Writes `inputs` into `dir`, creating it.
fn write_all(dir: &Path, inputs: &BTreeMap<String, Vec<u8>>) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (name, bytes) in inputs {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn committed_seeds_are_current() {
    let dir = fuzz_dir("seeds/packet_parse");
    let committed: BTreeMap<String, Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    let want = seeds();
    assert_eq!(
        committed.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "run: cargo test --test wire -- --ignored write_fuzz_seeds"
    );
    for (name, bytes) in &want {
        assert!(committed[name] == *bytes, "{name} differs from the capture");
    }
}

#[test]
#[ignore = "writes fuzz/corpus/packet_parse; run by tools/fuzz.sh"]
fn export_fuzz_corpus() {
    write_all(&fuzz_dir("corpus/packet_parse"), &corpus());
}

#[test]
#[ignore = "rewrites the committed seeds in fuzz/seeds/packet_parse"]
fn write_fuzz_seeds() {
    write_all(&fuzz_dir("seeds/packet_parse"), &seeds());
}
