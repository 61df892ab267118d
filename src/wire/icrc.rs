//! The invariant CRC (ICRC) of RoCEv2.
//!
//! The ICRC is the standard CRC-32 (the one `crc32fast` computes) over
//! - eight bytes of 0xFF, standing in for the InfiniBand LRH;
//! - the IP header with its variant fields set to all ones (IPv4: TOS, TTL and
//!   header checksum; IPv6: traffic class, flow label and hop limit);
//! - the UDP header with its checksum set to all ones;
//! - the BTH with byte 4 (FECN, BECN, reserved) set to all ones;
//! - the extended headers, payload and pad.
//!
//! It goes on the wire least-significant byte first (the CRC register as
//! kernel rxe stores it).
//!
//! ## The IPv4 Identification problem
//!
//! The IPv4 ID is covered, yet a receiver on a UDP socket never sees it. Since a
//! CRC is affine over GF(2), the effect of the unknown 16 ID bits on the result
//! is a known linear map: [`verify_ipv4_unknown_id`] computes the CRC with ID 0
//! and asks whether the difference to the received ICRC is the image of some
//! 16-bit ID. It answers with that ID, so the check costs one CRC plus (for a
//! nonzero ID) one carry-less multiplication by a factor that depends only on
//! the length, cached per thread, and a random corruption slips through with
//! probability 2^-16 (2^-15 counting the DF-bit retry). When the whole IP header
//! is known (pcap, raw link) use [`compute`] and compare: that check is strict.
//!
//! ## Cached headers
//!
//! [`compute`] runs the CRC over a masked copy of the headers, then over the
//! rest. At full rate the small first call costs a third as much as a 4 KiB
//! packet's second, so the UDP link uses [`compute_ipv4`] and
//! [`verify_ipv4_unknown_id_cached`]: the CRC register after the masked
//! headers and the BTH up to its masked byte 4 comes from a [`PrefixCache`]
//! the caller keeps, the link one per direction (a stream's packets share a
//! few lengths, IDs and opcodes).

use std::net::Ipv4Addr;

use super::roce::ICRC_LEN;
use super::{Error, Result};

/// The masked LRH: eight bytes of ones.
const LRH_ONES: [u8; 8] = [0xff; 8];

/// Computes the ICRC of a packet given its raw IP header (IPv4 with any
/// options, or the 40-byte IPv6 header), its UDP header, and the RoCE bytes
/// from the BTH up to (not including) the ICRC.
pub fn compute(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    if udp_header.len() != 8 {
        return Err(Error::BadIp);
    }
    if roce.len() < 12 {
        return Err(Error::Truncated { needed: 12, got: roce.len() });
    }
    // The masked prefix goes into one buffer so the CRC runs in two calls:
    // crc32fast's SIMD path pays a setup cost per call.
    let mut prefix = [0u8; 8 + 60 + 8 + 12];
    prefix[..8].copy_from_slice(&LRH_ONES);
    let ip_len = ip_header.len().min(60);
    let ip = &mut prefix[8..8 + ip_len];
    ip.copy_from_slice(&ip_header[..ip_len]);
    match ip.first().map(|b| b >> 4) {
        Some(4) if ip.len() >= 20 => {
            ip[1] = 0xff; // TOS
            ip[8] = 0xff; // TTL
            ip[10] = 0xff; // header checksum
            ip[11] = 0xff;
        }
        Some(6) if ip.len() == 40 => {
            ip[0] |= 0x0f; // traffic class, high nibble
            ip[1] = 0xff; // traffic class low nibble, flow label
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[7] = 0xff; // hop limit
        }
        _ => return Err(Error::BadIp),
    }
    let udp_at = 8 + ip_len;
    let udp = &mut prefix[udp_at..udp_at + 8];
    udp.copy_from_slice(udp_header);
    udp[6] = 0xff;
    udp[7] = 0xff;
    let bth_at = udp_at + 8;
    let bth = &mut prefix[bth_at..bth_at + 12];
    bth.copy_from_slice(&roce[..12]);
    bth[4] = 0xff;

    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&prefix[..bth_at + 12]);
    hasher.update(&roce[12..]);
    Ok(hasher.finalize())
}

/// Splits a RoCE UDP payload into the bytes the ICRC covers and the ICRC.
fn split_icrc(roce_with_icrc: &[u8]) -> Result<(&[u8], u32)> {
    if roce_with_icrc.len() < 12 + ICRC_LEN {
        return Err(Error::Truncated { needed: 12 + ICRC_LEN, got: roce_with_icrc.len() });
    }
    let (covered, icrc) = roce_with_icrc.split_at(roce_with_icrc.len() - ICRC_LEN);
    Ok((covered, u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]])))
}

/// Strict check: the whole IP header is known. `roce_with_icrc` is the UDP
/// payload including the trailing ICRC.
pub fn verify(ip_header: &[u8], udp_header: &[u8], roce_with_icrc: &[u8]) -> Result<bool> {
    let (covered, icrc) = split_icrc(roce_with_icrc)?;
    Ok(compute(ip_header, udp_header, covered)? == icrc)
}

/// Writes the ICRC into the last four bytes of `roce_with_icrc`.
pub fn fill(ip_header: &[u8], udp_header: &[u8], roce_with_icrc: &mut [u8]) -> Result<()> {
    let (covered, _) = split_icrc(roce_with_icrc)?;
    let icrc = compute(ip_header, udp_header, covered)?;
    let at = roce_with_icrc.len() - ICRC_LEN;
    roce_with_icrc[at..].copy_from_slice(&icrc.to_le_bytes());
    Ok(())
}

/// The addresses and ports of a RoCE datagram over IPv4, for the cached
/// one-pass forms ([`compute_ipv4`], [`verify_ipv4_unknown_id_cached`]): the
/// lengths follow from the RoCE bytes, and the other header fields the ICRC
/// covers are masked or fixed (no IP options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Udp {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791 for RoCEv2).
    pub dst_port: u16,
}

/// [`compute`] in one CRC pass, for the IPv4 datagram `h` with ID `id` and
/// flags byte `flags` (0x40: DF): the CRC register after the headers and the
/// first five BTH bytes (byte 4 masked) comes from `cache`, and the pass
/// covers the rest.
pub fn compute_ipv4(cache: &mut PrefixCache, h: Ipv4Udp, id: u16, flags: u8, roce: &[u8]) -> Result<u32> {
    if roce.len() < 12 {
        return Err(Error::Truncated { needed: 12, got: roce.len() });
    }
    let key = PrefixKey::new(h, flags, roce, roce.len())?;
    let mut hasher = crc32fast::Hasher::new_with_initial(cache.state(key));
    hasher.update(&roce[5..]);
    Ok(hasher.finalize() ^ cache.id_term(id, roce.len()))
}

/// [`compute_ipv4`] of RoCE bytes that lie in three pieces (headers, a
/// payload sent from elsewhere, pad), the first holding at least the BTH.
pub fn compute_ipv4_parts(cache: &mut PrefixCache, h: Ipv4Udp, id: u16, flags: u8, parts: [&[u8]; 3]) -> Result<u32> {
    let [head, middle, tail] = parts;
    if head.len() < 12 {
        return Err(Error::Truncated { needed: 12, got: head.len() });
    }
    let covered = head.len() + middle.len() + tail.len();
    let key = PrefixKey::new(h, flags, head, covered)?;
    let mut hasher = crc32fast::Hasher::new_with_initial(cache.state(key));
    for part in [&head[5..], middle, tail] {
        if !part.is_empty() {
            hasher.update(part);
        }
    }
    Ok(hasher.finalize() ^ cache.id_term(id, covered))
}

/// What an IPv4 Identification of `id` adds (by XOR) to the ICRC of a
/// packet whose ICRC covers `covered` RoCE bytes, against ID 0: one
/// carry-less multiplication once the factor for the length is known. The
/// cached forms compute with ID 0 and add this (the factor of the last
/// length kept with the cache), since a GSO train numbers its packets upwards and a cache keyed by
/// the ID missed on most packets of a long train; and a train that leaves
/// as single datagrams (ID 0) takes it off again.
pub fn ipv4_id_term(id: u16, covered: usize) -> u32 {
    gf2::id_term(id, gf2::id_factor(ID_TRAILING + covered))
}

/// Bytes of ICRC input between the IPv4 ID and the covered RoCE bytes: the
/// rest of the IP header (offset 6..20) and the UDP header.
const ID_TRAILING: usize = (20 - 6) + 8;

/// CRC states after the masked headers (with ID 0) and BTH bytes 0..5 of
/// recent packets, for [`compute_ipv4`] and [`verify_ipv4_unknown_id_cached`]:
/// the packets of a stream share a few lengths and opcodes. One per direction
/// of a link, say.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    states: [(PrefixKey, u32); PREFIX_STATES],
    /// The covered length of the last packet with a nonzero ID, and its
    /// [`gf2::id_factor`]: a stream's packets mostly have one length.
    id_factor: (usize, u32),
}

/// Entries of a [`PrefixCache`].
const PREFIX_STATES: usize = 32;

impl Default for PrefixCache {
    fn default() -> PrefixCache {
        // No key is all zeros: the first word holds version 4.
        PrefixCache { states: [(PrefixKey([0; 4]), 0); PREFIX_STATES], id_factor: (usize::MAX, 0) }
    }
}

impl PrefixCache {
    /// The CRC register after the eight ones of the LRH, the masked headers
    /// of `key` and the masked BTH byte 4, cached or computed into the cache.
    #[inline]
    fn state(&mut self, key: PrefixKey) -> u32 {
        let entry = &mut self.states[key.slot()];
        if !entry.0.is(&key) {
            *entry = (key, key.state());
        }
        entry.1
    }

    /// [`ipv4_id_term`], with the factor of the last length kept.
    #[inline]
    fn id_term(&mut self, id: u16, covered: usize) -> u32 {
        if id == 0 {
            return 0;
        }
        if self.id_factor.0 != covered {
            self.id_factor = (covered, gf2::id_factor(ID_TRAILING + covered));
        }
        gf2::id_term(id, self.id_factor.1)
    }
}

/// A cache key: the masked IPv4 and UDP headers and BTH bytes 0..4, as
/// big-endian words. Built from the fields in registers and compared there,
/// never from header bytes just stored: a wide load of narrower stores still
/// in the store buffer cannot be forwarded from it, and waits until every
/// older store has drained, here the packet's 4 KiB payload copy (measured:
/// 5-7 % of all cycles on that one load, when the key was copied from the
/// header bytes into a thread-local cache's lookup).
#[derive(Debug, Clone, Copy)]
struct PrefixKey([u64; 4]);

impl PrefixKey {
    /// The key of a packet whose `covered_len` RoCE bytes begin with `bth`.
    fn new(h: Ipv4Udp, flags: u8, bth: &[u8], covered_len: usize) -> Result<PrefixKey> {
        let udp_len = 8 + covered_len + ICRC_LEN;
        let total_len = u16::try_from(20 + udp_len).map_err(|_| Error::FieldOverflow)?;
        let udp_len = udp_len as u16;
        let bth = u32::from_be_bytes([bth[0], bth[1], bth[2], bth[3]]);
        // IPv4: version/IHL, TOS (masked), total length, ID 0, flags, offset
        // 0, TTL (masked), protocol, checksum (masked), addresses; then UDP:
        // ports, length, checksum (masked).
        let ip_0 = 0x45ff_u64 << 48 | u64::from(total_len) << 32 | u64::from(flags) << 8;
        let ip_8 = 0xff11_ffff_u64 << 32 | u64::from(u32::from(h.src));
        let ip_16 = u64::from(u32::from(h.dst)) << 32 | u64::from(h.src_port) << 16 | u64::from(h.dst_port);
        let udp_4 = u64::from(udp_len) << 48 | 0xffff_u64 << 32 | u64::from(bth);
        Ok(PrefixKey([ip_0, ip_8, ip_16, udp_4]))
    }

    /// The CRC register after the eight ones of the LRH, these headers and
    /// the masked BTH byte 4; on a cache miss.
    #[cold]
    #[inline(never)]
    fn state(&self) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&LRH_ONES);
        for word in self.0 {
            hasher.update(&word.to_be_bytes());
        }
        hasher.update(&[0xff]);
        hasher.finalize()
    }

    /// `self == key`, word by word: an array comparison spills the key to
    /// the stack and reloads it in wider pieces, which stalls as above.
    #[inline(always)]
    fn is(&self, key: &PrefixKey) -> bool {
        let (a, b) = (self.0, key.0);
        (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) == 0
    }

    /// The slot: the fields that vary along one stream are the length and
    /// the opcode.
    fn slot(&self) -> usize {
        let [ip_0, _, _, udp_4] = self.0;
        let (total_len, opcode) = (ip_0 >> 32 & 0xffff, udp_4 >> 24 & 0xff);
        ((total_len * 7 + opcode * 3) % PREFIX_STATES as u64) as usize
    }
}

/// Check for a packet received on a UDP socket: everything of the IPv4 header
/// is known (addresses from the socket, length from the datagram, TOS, TTL and
/// checksum are masked anyway) except the Identification and the DF flag.
///
/// Returns the sender's IPv4 ID when the ICRC is consistent with some ID, with
/// DF set (rxe's and our choice) or, failing that, clear; `None` otherwise.
pub fn verify_ipv4_unknown_id(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp_header: &[u8],
    roce_with_icrc: &[u8],
) -> Result<Option<u16>> {
    let (covered, icrc) = split_icrc(roce_with_icrc)?;
    let total_len = u16::try_from(20 + udp_header.len() + roce_with_icrc.len()).map_err(|_| Error::FieldOverflow)?;
    solve_unknown_id(covered.len(), icrc, |flags| {
        compute(&ipv4_header(src, dst, total_len, 0, flags), udp_header, covered)
    })
}

/// [`verify_ipv4_unknown_id`] with [`compute_ipv4`]'s cached headers.
pub fn verify_ipv4_unknown_id_cached(
    cache: &mut PrefixCache,
    h: Ipv4Udp,
    roce_with_icrc: &[u8],
) -> Result<Option<u16>> {
    let (covered, icrc) = split_icrc(roce_with_icrc)?;
    solve_unknown_id(covered.len(), icrc, |flags| compute_ipv4(cache, h, 0, flags, covered))
}

/// The ID that makes the ICRC of `covered` RoCE bytes `icrc`, given how to
/// compute it with ID 0 and a flags byte: with DF set, or failing that,
/// clear.
fn solve_unknown_id(covered: usize, icrc: u32, mut compute_with: impl FnMut(u8) -> Result<u32>) -> Result<Option<u16>> {
    // Bytes of ICRC input after the two ID bytes.
    let trailing = ID_TRAILING + covered;
    for flags in [0x40u8, 0x00] {
        let with_zero_id = compute_with(flags)?;
        if let Some(id) = gf2::solve_id(with_zero_id ^ icrc, trailing) {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// An IPv4 header without options as the ICRC sees it (masked fields zero).
pub fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, total_len: u16, id: u16, flags: u8) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total_len.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6] = flags;
    h[9] = 17; // UDP
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    h
}

/// Arithmetic on CRC-32 registers as polynomials modulo the CRC-32 generator,
/// in the reflected representation (bit 31 is x^0, bit 0 is x^31), as zlib's
/// `multmodp` uses it.
mod gf2 {
    /// The reflected CRC-32 polynomial (without x^32).
    const POLY: u32 = 0xedb8_8320;
    /// x^0.
    const ONE: u32 = 1 << 31;
    /// x^1.
    const X: u32 = 1 << 30;
    /// x^-1 modulo the generator: (P + 1) / x, which exists because P(0) = 1.
    pub(super) const X_INV: u32 = (POLY << 1) | 1;

    /// a * b modulo the generator (`const` so the table below is built at
    /// compile time).
    pub(super) const fn mul(a: u32, mut b: u32) -> u32 {
        let mut product = 0;
        let mut bit = 32;
        while bit > 0 {
            bit -= 1;
            if a & (1 << bit) != 0 {
                product ^= b;
            }
            b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        }
        product
    }

    /// [`mul`] with one carry-less multiplication and a Barrett reduction
    /// where the CPU has PCLMULQDQ: a few nanoseconds against the 32 steps
    /// of the loop, which every received packet of a GSO train needs.
    #[allow(unsafe_code)]
    pub(super) fn mul_fast(a: u32, b: u32) -> u32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("pclmulqdq") {
            // SAFETY: the CPU has the one feature `clmul` enables.
            return unsafe { clmul::mul(a, b) };
        }
        mul(a, b)
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    mod clmul {
        use std::arch::x86_64::*;

        /// The generator with its x^32 term, and floor(x^64 / generator),
        /// both bit-reflected, as crc32fast's final reduction uses them.
        const P_X: i64 = 0x1_db71_0641;
        const U_PRIME: i64 = 0x1_f701_1641;

        /// a * b modulo the generator. In the reflected representation the
        /// 64-bit carry-less product, shifted up one bit, is a 64-bit
        /// register whose Barrett reduction is the result (checked against
        /// the loop in the tests).
        #[target_feature(enable = "pclmulqdq")]
        pub(super) unsafe fn mul(a: u32, b: u32) -> u32 {
            let product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(a as i32), _mm_cvtsi32_si128(b as i32), 0x00);
            let x = _mm_slli_epi64(product, 1);
            let constants = _mm_set_epi64x(U_PRIME, P_X);
            let low = _mm_setr_epi32(!0, 0, 0, 0);
            let t = _mm_clmulepi64_si128(_mm_and_si128(x, low), constants, 0x10);
            let t = _mm_clmulepi64_si128(_mm_and_si128(t, low), constants, 0x00);
            _mm_cvtsi128_si32(_mm_srli_si128(_mm_xor_si128(x, t), 4)) as u32
        }
    }

    /// base^exp modulo the generator.
    #[cfg(test)]
    pub(super) fn pow(mut base: u32, mut exp: u64) -> u32 {
        let mut result = ONE;
        while exp != 0 {
            if exp & 1 != 0 {
                result = mul(result, base);
            }
            base = mul(base, base);
            exp >>= 1;
        }
        result
    }

    /// `X_INV^(2^i)`: x^-e is the product of the entries for the bits set in
    /// e, a handful of multiplications where squaring-and-multiplying takes
    /// dozens.
    const X_INV_POWERS: [u32; 64] = squarings(X_INV);

    /// `x^(2^i)`, as [`X_INV_POWERS`] for x itself.
    const X_POWERS: [u32; 64] = squarings(X);

    /// `base^(2^i)` for i in 0..64, built at compile time.
    const fn squarings(base: u32) -> [u32; 64] {
        let mut table = [0; 64];
        table[0] = base;
        let mut i = 1;
        while i < 64 {
            table[i] = mul(table[i - 1], table[i - 1]);
            i += 1;
        }
        table
    }

    /// The product of `table`'s entries for the bits set in `exp`.
    fn table_pow(table: &[u32; 64], exp: u64) -> u32 {
        let mut result = ONE;
        let mut bits = exp;
        while bits != 0 {
            let i = bits.trailing_zeros();
            result = mul_fast(result, table[i as usize]);
            bits &= bits - 1;
        }
        result
    }

    /// x^-exp modulo the generator.
    pub(super) fn x_inv_pow(exp: u64) -> u32 {
        table_pow(&X_INV_POWERS, exp)
    }

    /// x^exp modulo the generator.
    pub(super) fn x_pow(exp: u64) -> u32 {
        table_pow(&X_POWERS, exp)
    }

    /// The last few `(shift, x^-shift)` pairs `solve_id` used, per thread:
    /// packets of a stream mostly have one of a few lengths, so the factor
    /// is usually one multiplication away.
    const CACHED: usize = 4;
    std::thread_local! {
        static FACTORS: std::cell::Cell<([(u64, u32); CACHED], usize)> =
            const { std::cell::Cell::new(([(0, ONE); CACHED], 0)) };
    }

    /// x^-shift, from the cache if it is there.
    fn unshift(shift: u64) -> u32 {
        FACTORS.with(|cell| {
            let (mut entries, next) = cell.get();
            if let Some(&(_, factor)) = entries.iter().find(|(s, _)| *s == shift) {
                return factor;
            }
            let factor = x_inv_pow(shift);
            entries[next] = (shift, factor);
            cell.set((entries, (next + 1) % CACHED));
            factor
        })
    }

    /// The factor [`id_term`] multiplies by for a 16-bit field with
    /// `trailing` bytes of CRC input after it.
    pub(super) fn id_factor(trailing: usize) -> u32 {
        x_pow(8 * trailing as u64 + 32)
    }

    /// What a 16-bit field of value `value` adds to the CRC register against
    /// a zero field, given its [`id_factor`]: the inverse of [`solve_id`].
    pub(super) fn id_term(value: u16, factor: u32) -> u32 {
        if value == 0 {
            return 0;
        }
        mul_fast(u32::from(value.swap_bytes()) << 16, factor)
    }

    /// Given the difference `delta` between a CRC computed with a zero 16-bit
    /// field and the real one, with `trailing` bytes after that field, finds the
    /// field's value.
    ///
    /// Changing the field by D (a polynomial of degree < 16, first bit highest)
    /// changes the CRC register by D * x^(8 * trailing + 32) mod P. Undoing the
    /// shift leaves D itself, which must fit in the 16 highest-order register
    /// bits; otherwise no field value explains the difference.
    pub(super) fn solve_id(delta: u32, trailing: usize) -> Option<u16> {
        // ID 0 (single datagrams from unconnected DF sockets, ours) needs no
        // arithmetic.
        if delta == 0 {
            return Some(0);
        }
        let shift = 8 * trailing as u64 + 32;
        let d = mul_fast(delta, unshift(shift));
        if d & 0xffff != 0 {
            return None;
        }
        // Bit 16 + s of `d` is the s-th bit on the wire: the ID's first byte
        // least-significant bit first, then its second byte.
        Some(((d >> 16) as u16).swap_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_inverse_is_inverse() {
        let x = 1u32 << 30;
        assert_eq!(gf2::mul(x, gf2::X_INV), 1 << 31);
        assert_eq!(gf2::mul(gf2::pow(x, 1000), gf2::pow(gf2::X_INV, 1000)), 1 << 31);
    }

    #[test]
    fn the_fast_multiplication_agrees_with_the_loop() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        };
        let edges = [(0, 0), (1 << 31, 1 << 31), (u32::MAX, u32::MAX), (1, 1)];
        for (a, b) in edges.into_iter().chain((0..10_000).map(|_| (next(), next()))) {
            assert_eq!(gf2::mul_fast(a, b), gf2::mul(a, b), "{a:#x} * {b:#x}");
        }
    }

    #[test]
    fn the_table_powers_agree_with_squaring() {
        for exp in [0u64, 1, 2, 3, 32, 8 * 4124 + 32, 8 * 65535 + 32, u64::from(u32::MAX) + 5, u64::MAX] {
            assert_eq!(gf2::x_inv_pow(exp), gf2::pow(gf2::X_INV, exp), "exponent {exp}");
            assert_eq!(gf2::x_pow(exp), gf2::pow(1 << 30, exp), "exponent {exp}");
        }
    }

    /// An ID's term, added to the ICRC computed with ID 0, is the ICRC
    /// computed with that ID, and taken off again gives ID 0's: a train the
    /// kernel refuses leaves as single datagrams so.
    #[test]
    fn an_ids_term_is_what_the_id_changes() {
        let (src, dst) = (Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 3));
        for len in [16usize, 28, 1040, 4124, 4128] {
            let udp_len = (8 + len) as u16;
            let [l0, l1] = udp_len.to_be_bytes();
            let udp = [0xc0, 0x00, 0x12, 0xb7, l0, l1, 0, 0];
            let mut roce: Vec<u8> = (0..len).map(|i| (i * 11) as u8).collect();
            let covered = len - ICRC_LEN;
            let zero = compute(&ipv4_header(src, dst, 20 + udp_len, 0, 0x40), &udp, &roce[..covered]).unwrap();
            for id in [1u16, 2, 15, 63, 0x1234, 0xffff] {
                let with_id = compute(&ipv4_header(src, dst, 20 + udp_len, id, 0x40), &udp, &roce[..covered]).unwrap();
                assert_eq!(zero ^ ipv4_id_term(id, covered), with_id, "len {len} id {id}");
                roce[covered..].copy_from_slice(&with_id.to_le_bytes());
                assert_eq!(verify_ipv4_unknown_id(src, dst, &udp, &roce), Ok(Some(id)), "len {len} id {id}");
            }
        }
        assert_eq!(ipv4_id_term(0, 100), 0);
    }

    /// Many lengths in turn, more than the factor cache holds, and the same
    /// length with every kind of ID: the cache never answers for the wrong
    /// length.
    #[test]
    fn recovers_ids_across_lengths_and_cache_evictions() {
        let (src, dst) = (Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 3));
        let udp = [0xc0, 0x00, 0x12, 0xb7, 0x00, 0x00, 0x00, 0x00];
        for round in 0..3u16 {
            for len in [16usize, 20, 64, 1040, 4124, 4128, 100, 16] {
                let id = round.wrapping_mul(0x1111).wrapping_add(len as u16);
                let mut roce: Vec<u8> = (0..len).map(|i| (i * 3) as u8).collect();
                let ip = ipv4_header(src, dst, (28 + len) as u16, id, 0x40);
                fill(&ip, &udp, &mut roce).unwrap();
                assert_eq!(verify_ipv4_unknown_id(src, dst, &udp, &roce), Ok(Some(id)), "length {len}");
                roce[len / 2] ^= 0x20;
                assert_eq!(verify_ipv4_unknown_id(src, dst, &udp, &roce), Ok(None), "length {len}");
            }
        }
    }

    fn sample(id: u16, flags: u8) -> ([u8; 20], [u8; 8], Vec<u8>) {
        let src = Ipv4Addr::new(10, 77, 0, 2);
        let dst = Ipv4Addr::new(10, 77, 0, 3);
        let mut roce = vec![0u8; 12 + 1024 + 4];
        roce[0] = 0x04;
        roce[7] = 0x11;
        for (i, b) in roce[12..].iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let mut ip = ipv4_header(src, dst, (20 + 8 + roce.len()) as u16, id, flags);
        ip[8] = 64; // TTL, masked
        let udp = [0xc0, 0x00, 0x12, 0xb7, 0x04, 0x10, 0x00, 0x00];
        fill(&ip, &udp, &mut roce).unwrap();
        (ip, udp, roce)
    }

    #[test]
    fn recovers_the_unknown_id() {
        for id in [0u16, 1, 0x1234, 0x8000, 0xffff, 0xbeef] {
            for flags in [0x40, 0x00] {
                let (_, udp, roce) = sample(id, flags);
                let got = verify_ipv4_unknown_id(Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 3), &udp, &roce)
                    .unwrap();
                assert_eq!(got, Some(id), "id {id:#x} flags {flags:#x}");
            }
        }
    }

    #[test]
    fn rejects_a_flipped_bit_with_unknown_id() {
        let (ip, udp, mut roce) = sample(0x4242, 0x40);
        assert!(verify(&ip, &udp, &roce).unwrap());
        roce[100] ^= 0x10;
        assert!(!verify(&ip, &udp, &roce).unwrap());
        let got =
            verify_ipv4_unknown_id(Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 3), &udp, &roce).unwrap();
        assert_eq!(got, None);
    }

    /// The cached forms agree with [`compute`] and the uncached check
    /// across more lengths, IDs and opcodes than the cache has slots.
    #[test]
    fn the_cached_forms_agree_with_the_uncached_ones() {
        let (src, dst) = (Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 3));
        let h = Ipv4Udp { src, dst, src_port: 0xc000, dst_port: 4791 };
        let cache = &mut PrefixCache::default();
        for round in 0..3u8 {
            for len in [12usize, 16, 28, 100, 1040, 4108, 4124] {
                for (id, opcode) in [(0u16, 0x06), (1, 0x07), (2, 0x07), (14, 0x08), (63, 0x0a), (0xbeef, 0x04)] {
                    let mut roce: Vec<u8> = (0..len + 4).map(|i| (i * 5) as u8 ^ round).collect();
                    roce[0] = opcode;
                    roce[4] = 0x80; // FECN: masked
                    let udp_len = (8 + roce.len()) as u16;
                    let [l0, l1] = udp_len.to_be_bytes();
                    // The checksum is masked: any value.
                    let udp = [0xc0, 0x00, 0x12, 0xb7, l0, l1, 0x5a, round];
                    for flags in [0x40, 0x00] {
                        let ip = ipv4_header(src, dst, 20 + udp_len, id, flags);
                        let expected = compute(&ip, &udp, &roce[..len]).unwrap();
                        assert_eq!(compute_ipv4(cache, h, id, flags, &roce[..len]), Ok(expected), "len {len} id {id}");
                        let (head, rest) = roce[..len].split_at(12);
                        let (middle, tail) = rest.split_at(rest.len() / 2);
                        let parts = compute_ipv4_parts(cache, h, id, flags, [head, middle, tail]);
                        assert_eq!(parts, Ok(expected), "len {len} id {id}");
                    }
                    let expected = compute_ipv4(cache, h, id, 0x40, &roce[..len]).unwrap();
                    roce[len..].copy_from_slice(&expected.to_le_bytes());
                    let got = verify_ipv4_unknown_id_cached(cache, h, &roce);
                    assert_eq!(got, Ok(Some(id)), "len {len} id {id}");
                    assert_eq!(got, verify_ipv4_unknown_id(src, dst, &udp, &roce));
                    roce[len / 2 + 6] ^= 0x04;
                    assert_eq!(verify_ipv4_unknown_id_cached(cache, h, &roce), Ok(None), "len {len}");
                }
            }
        }
        assert!(compute_ipv4(cache, h, 0, 0x40, &[0; 11]).is_err());
        assert!(verify_ipv4_unknown_id_cached(cache, h, &[0; 15]).is_err());
        assert_eq!(compute_ipv4(cache, h, 0, 0x40, &vec![0; 65_536]), Err(Error::FieldOverflow));
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let (mut ip, mut udp, mut roce) = sample(7, 0x40);
        ip[1] = 0xb8; // TOS
        ip[8] = 1; // TTL
        ip[10] = 0x12; // checksum
        udp[6] = 0x55; // UDP checksum
        roce[4] = 0x80; // FECN
        assert!(verify(&ip, &udp, &roce).unwrap());
        roce[5] ^= 1; // a QPN bit is covered
        assert!(!verify(&ip, &udp, &roce).unwrap());
    }
}
