//! Builders that add extended headers to a hand-made `RoceRepr`.

use softroce::wire::{AethRepr, AtomicEthRepr, BthRepr, DethRepr, Opcode, Psn, RethRepr, RoceRepr, Syndrome};

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
    fn ack_req(self) -> Self;
    fn reth(self, va: u64, rkey: u32, len: u32) -> Self;
    fn atomic_eth(self, va: u64, rkey: u32, swap_add: u64, compare: u64) -> Self;
    fn aeth(self, syndrome: Syndrome, msn: u32) -> Self;
    fn deth(self, qkey: u32, src_qpn: u32) -> Self;
    fn ieth(self, rkey: u32) -> Self;
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

    fn qpn(mut self, dest_qpn: u32) -> RoceRepr {
        self.bth.dest_qpn = dest_qpn;
        self
    }
}
