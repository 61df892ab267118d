//! ATOMIC WRITE and FLUSH (IBTA annex A19) over loopback UDP (rxe-spec
//! V-21): an 8-byte store that is never torn, and a flush that completes
//! once what was placed is visible, or in the file behind the region.

use std::io::Write as _;

use crate::support::verbs::*;
use softroce::transport::{Access, FlushPlacement, Mtu, QpType, SendOp, SendWr, WcOpcode, WcStatus};

fn atomic_write(pair: &NodePair, remote_addr: u64, rkey: u32, data: [u8; 8]) -> (WcStatus, WcOpcode) {
    pair.mr_a.write(0, &data).unwrap();
    let wr = SendWr::new(1, SendOp::AtomicWrite { remote_addr, rkey }).with_sge(pair.mr_a.sge(0, 8));
    pair.qp_a.post_send(wr).unwrap();
    let wc = next_wc(&pair.a.cq);
    (wc.status, wc.opcode)
}

fn flush(pair: &NodePair, remote_addr: u64, rkey: u32, len: u32, placement: FlushPlacement) -> WcStatus {
    let op = SendOp::Flush { remote_addr, rkey, len, whole_region: false, placement };
    pair.qp_a.post_send(SendWr::new(2, op)).unwrap();
    let wc = next_wc(&pair.a.cq);
    assert_eq!(wc.opcode, WcOpcode::Flush);
    wc.status
}

#[test]
fn an_atomic_write_stores_its_eight_bytes() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    fill(&pair.mr_b, FILL);
    let value = 0x0123_4567_89ab_cdef_u64.to_ne_bytes();
    let done = atomic_write(&pair, pair.mr_b.addr() + 64, pair.mr_b.rkey(), value);
    assert_eq!(done, (WcStatus::Success, WcOpcode::AtomicWrite));
    assert_holds_only(&pair.mr_b, 64, &value);
    // Not 8 bytes: refused at post.
    let wr = SendWr::new(3, SendOp::AtomicWrite { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey() })
        .with_sge(pair.mr_a.sge(0, 4));
    assert!(pair.qp_a.post_send(wr).is_err());
}

#[test]
fn a_misaligned_atomic_write_is_an_invalid_request() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let done = atomic_write(&pair, pair.mr_b.addr() + 4, pair.mr_b.rkey(), [7; 8]);
    assert_eq!(done, (WcStatus::RemInvReqErr, WcOpcode::AtomicWrite));
}

#[test]
fn a_flush_needs_the_regions_flush_rights() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let flushable = pair.b.pd.alloc_mr(4096, ALL_ACCESS | Access::FLUSH_GLOBAL).unwrap();
    assert_eq!(flush(&pair, flushable.addr(), flushable.rkey(), 4096, FlushPlacement::Global), WcStatus::Success);
    // It grants global visibility, not persistence.
    let persistent = flush(&pair, flushable.addr(), flushable.rkey(), 64, FlushPlacement::Persistent);
    assert_eq!(persistent, WcStatus::RemAccessErr);
}

#[test]
fn a_persistent_flush_puts_a_write_in_the_file_behind_the_region() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let path = std::env::temp_dir().join(format!("softroce-flush-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    file.write_all(&[0; 4096]).unwrap();
    // SAFETY: the file is ours and 4096 bytes long; the mapping outlives the region.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
    let access = ALL_ACCESS | Access::FLUSH_PERSISTENT;
    // SAFETY: the mapping stays until the region is dropped below.
    let mr = unsafe { pair.b.pd.reg_mr(map.as_mut_ptr(), map.len(), access) }.unwrap();
    pair.mr_a.write(0, b"persistent").unwrap();
    let op = SendOp::RdmaWrite { remote_addr: mr.addr() + 100, rkey: mr.rkey() };
    pair.qp_a.post_send(SendWr::new(1, op).with_sge(pair.mr_a.sge(0, 10))).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::Success);
    assert_eq!(flush(&pair, mr.addr() + 100, mr.rkey(), 10, FlushPlacement::Persistent), WcStatus::Success);
    drop(mr);
    drop(map);
    assert_eq!(&std::fs::read(&path).unwrap()[100..110], b"persistent");
    std::fs::remove_file(&path).unwrap();
}
