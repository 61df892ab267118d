//! What the subcommands share: numbers parsed as the C option parsers of
//! rdma-core's and perftest's programs parse them, the options the peers of
//! those programs add to theirs, lengths of time, and failures that carry
//! the message to print.

use std::net::IpAddr;
use std::time::Duration;

use softroce::verbs::{self, CaptureOptions, ContextOptions, Device};
use softroce::wire::ROCE_UDP_PORT;

/// `strtol(text, NULL, 0)`: `0x` for hex, a leading 0 for octal; trailing
/// garbage is refused.
pub fn c_number(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let parsed = if let Some(hex) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16)
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8)
    } else {
        digits.parse()
    };
    let value = parsed.map_err(|_| format!("{text:?} is not a number"))?;
    Ok(if negative { -value } else { value })
}

pub fn c_u32(text: &str) -> Result<u32, String> {
    u32::try_from(c_number(text)?).map_err(|_| format!("{text} is out of range"))
}

pub fn c_i32(text: &str) -> Result<i32, String> {
    i32::try_from(c_number(text)?).map_err(|_| format!("{text} is out of range"))
}

/// A TCP or UDP port number.
pub fn c_port(text: &str) -> Result<u16, String> {
    u16::try_from(c_number(text)?).map_err(|_| format!("{text} is not a port (0-65535)"))
}

/// The options `pingpong` and `perf` add to those of the C programs they
/// are the peers of: a device on one address, the RoCE port, and when to
/// give up.
#[derive(clap::Args)]
pub struct PeerArgs {
    /// UDP port of RoCE (the RoCEv2 port; peers must use the same).
    #[arg(long = "roce-port", default_value_t = ROCE_UDP_PORT, value_parser = c_port)]
    pub roce_port: u16,
    /// Instead of a device, use one on this local address alone (for tests
    /// and demos with two peers on one host, e.g. 127.0.0.1 and 127.0.0.2;
    /// its GID index 1 is the address, its MTU 4096).
    #[arg(long = "local-addr", value_name = "ADDR", conflicts_with = "device")]
    pub local_addr: Option<IpAddr>,
    /// Give up after this many seconds without progress (default: as the C
    /// programs, wait for the peer forever, except perftest's SEND server,
    /// which gives up after 120 seconds without messages).
    #[arg(long, value_name = "SECONDS", value_parser = |s: &str| seconds(s, Zero::Allowed))]
    pub timeout: Option<Duration>,
    /// Record every packet the device sends and receives into this pcap
    /// file, one RoCE packet per record as on the wire (rxe-spec V-13).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

impl PeerArgs {
    /// The device on `--local-addr`, else the one named `name` (`-d`),
    /// else the default one.
    pub fn device(&self, name: Option<&str>) -> verbs::Result<Device> {
        match (self.local_addr, name) {
            (Some(addr), _) => Ok(Device::for_address(addr)),
            (None, Some(name)) => Device::by_name(name),
            (None, None) => Device::default_device(),
        }
    }

    /// Context options with the RoCE port and the capture.
    pub fn context_options(&self) -> ContextOptions {
        let capture = self.pcap.as_ref().map(CaptureOptions::new);
        ContextOptions { port: self.roce_port, capture, ..ContextOptions::default() }
    }
}

/// Whether a length of time may be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zero {
    Allowed,
    Refused,
}

/// A length of time in seconds, a decimal number: finite, not negative,
/// and not zero unless `zero` allows it.
pub fn seconds(text: &str, zero: Zero) -> Result<Duration, String> {
    let seconds: f64 = text.parse().map_err(|e| format!("{e}"))?;
    match (Duration::try_from_secs_f64(seconds), zero) {
        (Ok(d), Zero::Allowed) => Ok(d),
        (Ok(d), Zero::Refused) if !d.is_zero() => Ok(d),
        (_, Zero::Allowed) => Err("seconds must be a finite number, 0 or more".to_owned()),
        (_, Zero::Refused) => Err("seconds must be a finite number above 0".to_owned()),
    }
}

/// A failure, with the message to print (the C programs' where they have one).
#[derive(Debug)]
pub struct Fail(pub String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Fail {
        Fail(e.to_string())
    }
}

pub fn fail<T>(message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(message.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_as_strtol_base_0() {
        assert_eq!(c_number("18515"), Ok(18515));
        assert_eq!(c_number("0x10"), Ok(16));
        assert_eq!(c_number("010"), Ok(8));
        assert_eq!(c_number("0"), Ok(0));
        assert_eq!(c_number("-1"), Ok(-1));
        assert!(c_number("x").is_err());
        assert!(c_number("1k").is_err());
        assert_eq!(c_port("65536"), Err("65536 is not a port (0-65535)".to_owned()));
    }

    #[test]
    fn seconds_are_checked() {
        assert_eq!(seconds("0.2", Zero::Allowed), Ok(Duration::from_millis(200)));
        assert_eq!(seconds("0", Zero::Allowed), Ok(Duration::ZERO));
        assert!(seconds("-1", Zero::Allowed).is_err());
        assert!(seconds("soon", Zero::Allowed).is_err());
    }

    #[test]
    fn seconds_must_be_positive() {
        assert_eq!(seconds("0.1", Zero::Refused), Ok(Duration::from_millis(100)));
        assert!(seconds("0", Zero::Refused).is_err());
        assert!(seconds("-1", Zero::Refused).is_err());
        assert!(seconds("soon", Zero::Refused).is_err());
    }
}
