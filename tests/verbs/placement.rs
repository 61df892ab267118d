//! Where data lands, over loopback UDP: ATOMIC WRITE and FLUSH (IBTA annex
//! A19, rxe-spec V-21), an 8-byte store that is never torn and a flush that
//! completes once what was placed is visible, or in the file behind the
//! region; and on-demand regions (V-22), whose missing pages are errors.

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

/// Two pages mapped for an on-demand region, and the region.
fn on_demand_region(pair: &NodePair) -> (*mut u8, usize, softroce::verbs::MemoryRegion) {
    // SAFETY: sysconf and an anonymous mapping of our own.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: the mapping is ours; the test unmaps it only as the scenario asks.
    let mr = unsafe { pair.b.pd.reg_mr(base.cast(), 2 * page, ALL_ACCESS | Access::ON_DEMAND) }.unwrap();
    (base.cast(), page, mr)
}

#[test]
fn an_on_demand_region_whose_page_went_away_refuses_the_access_instead_of_faulting() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let (base, page, mr) = on_demand_region(&pair);
    let write = |offset: usize, id| {
        let op = SendOp::RdmaWrite { remote_addr: mr.addr() + offset as u64, rkey: mr.rkey() };
        pair.qp_a.post_send(SendWr::new(id, op).with_sge(pair.mr_a.sge(0, 64))).unwrap();
        next_wc(&pair.a.cq).status
    };
    pair.mr_a.write(0, &[0x5a; 64]).unwrap();
    assert_eq!(write(page + 8, 1), WcStatus::Success);
    // SAFETY: the second page is ours; the region stays registered over it,
    // as on-demand paging allows.
    assert_eq!(unsafe { libc::munmap(base.add(page).cast(), page) }, 0);
    assert_eq!(write(page + 8, 2), WcStatus::RemAccessErr);
    drop(mr);
    // SAFETY: the first page is still ours.
    unsafe { libc::munmap(base.cast(), page) };
}

#[test]
fn advice_is_for_on_demand_regions_of_the_domain() {
    use softroce::verbs::Advice;
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let (base, page, mr) = on_demand_region(&pair);
    for advice in [Advice::Prefetch, Advice::PrefetchWrite, Advice::PrefetchNoFault] {
        pair.b.pd.advise_mr(advice, &[mr.sge(0, 2 * page)]).unwrap();
    }
    let error = |sge| pair.b.pd.advise_mr(Advice::Prefetch, &[sge]).unwrap_err().errno();
    assert_eq!(error(pair.mr_b.sge(0, 64)), libc::EINVAL, "not on demand");
    assert_eq!(error(mr.sge(page, page + 1)), libc::EINVAL, "past its end");
    // SAFETY: the second page is ours.
    assert_eq!(unsafe { libc::munmap(base.add(page).cast(), page) }, 0);
    assert_eq!(error(mr.sge(page, 64)), libc::EFAULT, "not mapped");
    drop(mr);
    // SAFETY: the first page is still ours.
    unsafe { libc::munmap(base.cast(), page) };
}
