//! GIDs: the 16-byte port addresses of RoCE. A RoCEv2 GID is an IPv6 address
//! (an IPv4 address appears IPv4-mapped), so the GID a peer names is the IP
//! address its packets go to.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

/// `union ibv_gid`: 16 bytes in network order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid([u8; 16]);

impl Gid {
    /// A GID from its 16 bytes, in network order.
    pub const fn from_bytes(raw: [u8; 16]) -> Gid {
        Gid(raw)
    }

    /// The 16 bytes, in network order.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// The GID of an IP address: IPv6 as itself, IPv4 as `::ffff:a.b.c.d`.
    pub fn from_ip(ip: IpAddr) -> Gid {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Gid(v6.octets())
    }

    /// The IP address packets to this GID go to; IPv4-mapped GIDs give IPv4.
    pub fn to_ip(self) -> IpAddr {
        Ipv6Addr::from(self.0).to_canonical()
    }

    /// Whether this GID stands for an IPv4 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }

    /// The link-local GID every RoCE port has at index 0: `fe80::` followed by
    /// the modified EUI-64 of the interface's MAC address.
    pub fn link_local(mac: [u8; 6]) -> Gid {
        let mut raw = [0; 16];
        raw[..2].copy_from_slice(&[0xfe, 0x80]);
        raw[8..].copy_from_slice(&eui64(mac));
        Gid(raw)
    }
}

/// The modified EUI-64 of a MAC address (RFC 4291 appendix A): the
/// universal/local bit flipped and `ff:fe` put in the middle. Kernel rxe uses
/// it both as the link-local interface identifier and as the node GUID.
pub(crate) fn eui64(mac: [u8; 6]) -> [u8; 8] {
    [mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]
}

impl From<[u8; 16]> for Gid {
    fn from(raw: [u8; 16]) -> Gid {
        Gid(raw)
    }
}

impl From<Gid> for [u8; 16] {
    fn from(gid: Gid) -> [u8; 16] {
        gid.0
    }
}

/// The form `ibv_devinfo` prints and sysfs shows: eight groups of four
/// lower-case hex digits, none left out
/// (`0000:0000:0000:0000:0000:ffff:0a4d:0002`).
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Why a text is not a GID in the form [`Gid`]'s `Display` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseGidError(String);

impl fmt::Display for ParseGidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a GID of the form xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx", self.0)
    }
}

impl std::error::Error for ParseGidError {}

/// Parses exactly the form `Display` writes (hex digits in either case), so a
/// GID copied from `ibv_devinfo -v` or sysfs reads back as the same bytes.
/// Shortened IPv6 text is refused: for an address, use [`Gid::from_ip`].
impl FromStr for Gid {
    type Err = ParseGidError;

    fn from_str(text: &str) -> Result<Gid, ParseGidError> {
        let error = || ParseGidError(text.to_owned());
        let mut raw = [0u8; 16];
        let mut groups = text.split(':');
        for pair in raw.chunks_exact_mut(2) {
            let group = groups.next().ok_or_else(error)?;
            if group.len() != 4 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(error());
            }
            let value = u16::from_str_radix(group, 16).map_err(|_| error())?;
            pair.copy_from_slice(&value.to_be_bytes());
        }
        if groups.next().is_some() {
            return Err(error());
        }
        Ok(Gid(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn ipv4_is_mapped_and_comes_back_as_ipv4() {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2));
        let gid = Gid::from_ip(ip);
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:0a4d:0002");
        assert!(gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), ip);
    }

    #[test]
    fn ipv6_is_itself() {
        let ip: IpAddr = "fd00::2".parse().unwrap();
        let gid = Gid::from_ip(ip);
        assert_eq!(gid.to_string(), "fd00:0000:0000:0000:0000:0000:0000:0002");
        assert!(!gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), ip);
    }

    #[test]
    fn eui64_flips_the_universal_local_bit_and_inserts_fffe() {
        assert_eq!(eui64([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]), [0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56]);
        assert_eq!(eui64([0x02, 0xfc, 0, 0, 0, 1]), [0x00, 0xfc, 0, 0xff, 0xfe, 0, 0, 1]);
    }

    #[test]
    fn parse_refuses_other_forms() {
        for text in [
            "",
            "fe80::1",
            "::ffff:10.0.0.1",
            "fe80:0000:0000:0000:5054:00ff:fe12:345",
            "fe80:0000:0000:0000:5054:00ff:fe12:34567",
            "fe80:0000:0000:0000:5054:00ff:fe12",
            "fe80:0000:0000:0000:5054:00ff:fe12:3456:",
            "fe80:0000:0000:0000:5054:00ff:fe12:3456:0000",
            "fe80:0000:0000:0000:5054:00ff:fe12:+456",
            "fe80:0000:0000:0000:5054:00ff:fe12:345g",
        ] {
            assert_eq!(text.parse::<Gid>(), Err(ParseGidError(text.to_owned())), "{text:?}");
        }
    }

    #[test]
    fn parse_accepts_upper_case() {
        let gid: Gid = "FE80:0000:0000:0000:5054:00FF:FE12:3456".parse().unwrap();
        assert_eq!(gid, Gid::link_local([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]));
    }
}
