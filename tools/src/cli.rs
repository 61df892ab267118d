//! What the peers of rdma-core's and perftest's programs share: numbers
//! parsed as their C option parsers parse them, and failures that carry the
//! message to print.

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
}
