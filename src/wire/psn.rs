//! 24-bit packet sequence numbers.

use core::cmp::Ordering;
use core::fmt;

/// A packet sequence number: 24 bits, wrapping.
///
/// PSNs have no total order. Like kernel rxe (`psn_compare`), two PSNs are
/// compared by their signed distance on the 2^24 circle: `a` is after `b` when
/// `a - b`, taken modulo 2^24, lies in the first half of the space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The 24 bits a PSN occupies.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Half of the sequence space: the largest distance that still orders.
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `value` (higher bits are dropped).
    pub const fn new(value: u32) -> Psn {
        Psn(value & Psn::MASK)
    }

    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// Signed distance `self - other` on the circle, in `-2^23..2^23`.
    ///
    /// This is rxe's `psn_compare`: shift the 24-bit difference into the top of
    /// a 32-bit word and read it as signed.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Window comparison: `Greater` when `self` comes after `other`.
    pub const fn cmp_window(self, other: Psn) -> Ordering {
        let d = self.diff(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// `self` comes strictly after `other` within half the space.
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// `self` comes strictly before `other` within half the space.
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_masks_to_24_bits() {
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
        assert_eq!(Psn::new(0x100_0005).value(), 5);
    }

    #[test]
    fn arithmetic_wraps_at_2_pow_24() {
        assert_eq!(Psn::new(0xff_fffe).wrapping_add(3), Psn::new(1));
        assert_eq!(Psn::new(1).wrapping_sub(3), Psn::new(0xff_fffe));
    }

    #[test]
    fn window_comparison_across_the_wrap() {
        let before = Psn::new(0xff_fff0);
        let after = Psn::new(0x10);
        assert!(after.is_after(before));
        assert!(before.is_before(after));
        assert_eq!(after.diff(before), 0x20);
        assert_eq!(before.diff(after), -0x20);
        assert_eq!(after.cmp_window(after), Ordering::Equal);
    }

    #[test]
    fn half_space_boundary() {
        let zero = Psn::new(0);
        // Exactly half the space away reads as "before" (the most negative distance).
        assert_eq!(Psn::new(Psn::HALF).diff(zero), -(Psn::HALF as i32));
        assert!(Psn::new(Psn::HALF - 1).is_after(zero));
        assert!(Psn::new(Psn::HALF + 1).is_before(zero));
    }
}
