//! Builders for hand-made packets: a BTH with the usual defaults, then the
//! extended headers added one call at a time, as a probe, a test or a
//! teaching example writes them:
//! `RoceRepr::new(bth(op, qpn, psn)).reth(va, rkey, len).ack_req()`.

use super::{AethRepr, AtomicEthRepr, BthRepr, DethRepr, Opcode, Psn, RethRepr, RoceRepr, Syndrome};

/// A BTH of `opcode` to `dest_qpn` at `psn`, with no flags and the default
/// P_Key; add the other headers with [`Build`].
pub fn bth(opcode: Opcode, dest_qpn: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pkey: BthRepr::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req: false,
        psn: Psn::new(psn),
    }
}

/// `RoceRepr::new(bth).reth(..).ack_req()` and so on.
pub trait Build {
    /// Sets AckReq.
    fn ack_req(self) -> Self;
    /// Adds a RETH (VA, R_Key, DMA length).
    fn reth(self, va: u64, rkey: u32, len: u32) -> Self;
    /// Adds an AtomicETH.
    fn atomic_eth(self, va: u64, rkey: u32, swap_add: u64, compare: u64) -> Self;
    /// Adds an AETH.
    fn aeth(self, syndrome: Syndrome, msn: u32) -> Self;
    /// Adds a DETH (Q_Key, source QP).
    fn deth(self, qkey: u32, src_qpn: u32) -> Self;
    /// Adds an IETH (the R_Key to invalidate).
    fn ieth(self, rkey: u32) -> Self;
    /// Adds ImmDt.
    fn imm(self, imm: u32) -> Self;
    /// Sends the packet to another QP.
    fn qpn(self, dest_qpn: u32) -> Self;
}

impl Build for RoceRepr {
    fn ack_req(mut self) -> RoceRepr {
        self.bth.ack_req = true;
        self
    }

    fn reth(mut self, va: u64, rkey: u32, dma_len: u32) -> RoceRepr {
        self.reth = Some(RethRepr { va, rkey, dma_len });
        self
    }

    fn atomic_eth(mut self, va: u64, rkey: u32, swap_add: u64, compare: u64) -> RoceRepr {
        self.atomic_eth = Some(AtomicEthRepr { va, rkey, swap_add, compare });
        self
    }

    fn aeth(mut self, syndrome: Syndrome, msn: u32) -> RoceRepr {
        self.aeth = Some(AethRepr { syndrome, msn });
        self
    }

    fn deth(mut self, qkey: u32, src_qpn: u32) -> RoceRepr {
        self.deth = Some(DethRepr { qkey, src_qpn });
        self
    }

    fn ieth(mut self, rkey: u32) -> RoceRepr {
        self.ieth = Some(rkey);
        self
    }

    fn imm(mut self, imm: u32) -> RoceRepr {
        self.imm = Some(imm);
        self
    }

    fn qpn(mut self, dest_qpn: u32) -> RoceRepr {
        self.bth.dest_qpn = dest_qpn;
        self
    }
}
