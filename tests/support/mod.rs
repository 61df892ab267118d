//! What the test crates share, as quinn-proto's tests share `util.rs`:
//!
//! - [`qp`]: one QP under the sans-IO interface, driven by hand with packets
//!   built with `RoceRepr`, and what it sends parsed back;
//! - [`roce`]: builders that add extended headers to a hand-made `RoceRepr`;
//! - [`fake_peer`]: a UDP socket that speaks RoCE to a real context;
//! - [`verbs`]: devices on loopback addresses, connected QPs and waits;
//! - [`captures`]: the kernel-rxe captures in `tests/data`;
//! - [`pattern`] and [`Rng`], for data and choices that differ run to run
//!   only when the seed does.

// Each test crate includes the whole module and uses its own part of it.
#![allow(dead_code)]

pub mod captures;
pub mod fake_peer;
pub mod qp;
pub mod roce;
pub mod verbs;

/// `len` bytes that differ from one `seed` to the next and do not repeat every 256.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(0x9e37_79b1) >> 24) as u8).collect()
}

/// SplitMix64: fast, deterministic, good enough for an attacker's guesses
/// (whose only requirement is independence from the secrets guessed) and
/// for a test's random choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A PSN: 24 random bits.
    pub fn psn(&mut self) -> u32 {
        self.next_u32() & 0x00ff_ffff
    }
}
