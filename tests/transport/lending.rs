//! A memory that lends (rxe-spec T-36), for the tests of which payloads
//! leave lent and which copied.

use softroce::transport::*;
use softroce::wire::RoceRepr;

use crate::support::qp::TestQp;

/// A memory that lends: copies of the bytes asked for, kept until the test
/// ends, stand in for registered memory that stays put.
struct Lending<'a> {
    mem: &'a mut MemoryTable,
    lent: std::cell::RefCell<Vec<Box<[u8]>>>,
}

impl Memory for Lending<'_> {
    fn check(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.mem.check(key, user, addr, len, access)
    }
    fn resolve(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError> {
        self.mem.resolve(key, user, addr, len, access)
    }
    fn read(&self, key: u32, user: KeyUser, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        self.mem.read(key, user, addr, out, access)
    }
    fn lend(&self, key: u32, user: KeyUser, addr: u64, len: usize, access: Access) -> Result<Option<Lent>, MemError> {
        let mut copy = vec![0; len].into_boxed_slice();
        self.mem.read(key, user, addr, &mut copy, access)?;
        let ptr = std::ptr::NonNull::new(copy.as_mut_ptr()).expect("a boxed slice's pointer");
        self.lent.borrow_mut().push(copy);
        // SAFETY: the box is kept in `self.lent` until `self` goes, after
        // the test's last look at the lent bytes; moving a box does not move
        // its bytes.
        Ok(Some(unsafe { Lent::new(ptr, len) }))
    }
    fn write(&mut self, key: u32, user: KeyUser, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        self.mem.write(key, user, addr, data, access)
    }
    fn atomic(&mut self, key: u32, user: KeyUser, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        self.mem.atomic(key, user, addr, op)
    }
    fn invalidate(&mut self, rkey: u32, user: KeyUser) -> Result<(), MemError> {
        self.mem.invalidate(rkey, user)
    }
    fn bind_window(&mut self, user: KeyUser, bind: &MwBind) -> Result<(), MemError> {
        self.mem.bind_window(user, bind)
    }
    fn flush(&mut self, key: u32, user: KeyUser, range: Option<(u64, u64)>, access: Access) -> Result<(), MemError> {
        self.mem.flush(key, user, range, access)
    }
}

/// Each packet the QP sends (the buffer filled with 0xee first), its
/// payload as it will leave: lent, or in the buffer.
pub(crate) fn transmit_lending(node: &mut TestQp) -> Vec<(bool, Vec<u8>)> {
    let mut mem = Lending { mem: &mut node.mem, lent: Default::default() };
    let mut buf = vec![0u8; 8192];
    let mut sent = Vec::new();
    loop {
        buf.fill(0xee);
        let Some(t) = node.qp.poll_transmit(node.now, &mut mem, &mut buf, TransmitOrder::RequestsFirst) else { break };
        let parsed = RoceRepr::parse(&buf[..t.len]).expect("the QP emits valid packets");
        let at = t.len - 4 - parsed.payload.len() - usize::from(parsed.pad);
        sent.push(match t.lent {
            Some((offset, lent)) => {
                assert_eq!(offset, at, "a lent payload goes where the packet's payload is");
                assert!(buf[at..at + lent.len()].iter().all(|&b| b == 0xee), "and its place stays unwritten");
                (true, lent.bytes().to_vec())
            }
            None => (false, parsed.payload.to_vec()),
        });
    }
    sent
}
