//! Big-endian field access for header views. Callers check lengths first
//! (`check_len`), exactly as smoltcp's views do.
//!
//! Also the `fixed_view!` macro that every fixed-size header view starts
//! from, and [`Bits`], a field of any width at any bit of a message, named
//! as the IBTA tables name it: byte, bit (0 is the most significant) and width.

pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn get_u24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Fails with [`super::Error::Truncated`] unless `buf` holds `needed` bytes.
pub(crate) fn need(buf: &[u8], needed: usize) -> super::Result<()> {
    if buf.len() < needed {
        Err(super::Error::Truncated { needed, got: buf.len() })
    } else {
        Ok(())
    }
}

/// A field of up to 64 bits anywhere in a message, in the IBTA's notation:
/// it starts at bit `bit` of byte `byte` (bit 0 is the most significant) and
/// runs for `width` bits, big-endian, possibly across byte boundaries. The
/// REQ's local QPN is `Bits::new(32, 0, 24)`, its responder resources
/// `Bits::new(35, 0, 8)`, its retry count `Bits::new(47, 5, 3)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bits {
    byte: usize,
    bit: u8,
    width: u8,
}

impl Bits {
    /// The field at `byte`[`bit`], `width` bits wide.
    pub(crate) const fn new(byte: usize, bit: u8, width: u8) -> Bits {
        assert!(bit < 8 && width >= 1 && width <= 64);
        Bits { byte, bit, width }
    }

    /// Bytes the field touches.
    const fn span(self) -> usize {
        (self.bit as usize + self.width as usize).div_ceil(8)
    }

    /// How far the field's lowest bit sits above bit 0 of its last byte.
    const fn shift(self) -> u32 {
        (self.span() * 8 - self.bit as usize - self.width as usize) as u32
    }

    /// The largest value the field holds.
    pub(crate) const fn max(self) -> u64 {
        u64::MAX >> (64 - self.width as u32)
    }

    /// One past the last byte the field touches: a buffer this long holds it.
    pub(crate) const fn end(self) -> usize {
        self.byte + self.span()
    }

    fn window(self, b: &[u8]) -> u128 {
        b[self.byte..self.end()].iter().fold(0u128, |acc, &x| (acc << 8) | u128::from(x))
    }

    /// Reads the field.
    pub(crate) fn get(self, b: &[u8]) -> u64 {
        ((self.window(b) >> self.shift()) as u64) & self.max()
    }

    /// Writes the low `width` bits of `value`, leaving the other bits of the
    /// bytes it shares untouched.
    pub(crate) fn set(self, b: &mut [u8], value: u64) {
        let mask = u128::from(self.max()) << self.shift();
        let window = (self.window(b) & !mask) | ((u128::from(value) << self.shift()) & mask);
        let span = self.span();
        for (i, byte) in b[self.byte..self.end()].iter_mut().enumerate() {
            *byte = (window >> (8 * (span - 1 - i))) as u8;
        }
    }
}

/// The length-checking half of a header view, shared by every fixed-size header.
macro_rules! fixed_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the header in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; getters panic if it is short.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps a buffer after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Fails with [`Error::Truncated`] unless the buffer holds the whole header.
            pub fn check_len(&self) -> Result<()> {
                need(self.buffer.as_ref(), Self::LEN)
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Bits;

    #[test]
    fn bits_read_and_write_across_bytes() {
        // A 24-bit QPN then an 8-bit field: the REQ's word at byte 32.
        let mut b = [0x00, 0x00, 0x11, 0x01, 0xff];
        assert_eq!(Bits::new(0, 0, 24).get(&b), 0x11);
        assert_eq!(Bits::new(3, 0, 8).get(&b), 0x01);
        Bits::new(0, 0, 24).set(&mut b, 0xabcdef);
        assert_eq!(b, [0xab, 0xcd, 0xef, 0x01, 0xff]);
        // Five bits, then two, then one, in one byte: REQ byte 43.
        let mut b = [0u8];
        Bits::new(0, 0, 5).set(&mut b, 20);
        Bits::new(0, 5, 2).set(&mut b, 1);
        Bits::new(0, 7, 1).set(&mut b, 1);
        assert_eq!(b, [0b1010_0011]);
        assert_eq!((Bits::new(0, 0, 5).get(&b), Bits::new(0, 5, 2).get(&b), Bits::new(0, 7, 1).get(&b)), (20, 1, 1));
        // 20 bits from the top of a word; a field that starts mid-byte.
        let mut b = [0u8; 4];
        Bits::new(0, 0, 20).set(&mut b, 0xfffff);
        assert_eq!(b, [0xff, 0xff, 0xf0, 0x00]);
        Bits::new(3, 2, 6).set(&mut b, 0x3f);
        assert_eq!(b, [0xff, 0xff, 0xf0, 0x3f]);
        // Values wider than the field are cut, not spilled.
        Bits::new(2, 0, 4).set(&mut b, 0x1ff);
        assert_eq!(b, [0xff, 0xff, 0xf0, 0x3f]);
        // 64 bits at an odd bit offset span nine bytes.
        let mut b = [0u8; 9];
        Bits::new(0, 4, 64).set(&mut b, u64::MAX);
        assert_eq!(b, [0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0]);
        assert_eq!(Bits::new(0, 4, 64).get(&b), u64::MAX);
        assert_eq!((Bits::new(0, 0, 24).max(), Bits::new(0, 0, 64).max()), (0xff_ffff, u64::MAX));
    }
}
