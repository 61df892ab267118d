//! perftest's out-of-band exchange over TCP, byte for byte.
//!
//! Every exchange is symmetric: the client writes its message and then reads
//! the server's; the server reads first and then writes. perftest's helpers
//! (`ctx_xchg_data`, `ctx_hand_shake`) do exactly this, and the programs
//! use the same exchange both to trade data and as a barrier: a "handshake"
//! trades the per-QP key message again purely to wait for the other side.
//!
//! The messages, in the order the programs send them:
//!
//! - the version: 16 bytes, a NUL-padded C string (`"6.06"`);
//! - (remote version 5.32 and later) the page size the buffers cycle over
//!   and the cache line size: two 32-bit big-endian integers, each side
//!   keeping the larger;
//! - (remote 5.1 and later) the MTU as `sprintf("%d", enum ibv_mtu)`, only
//!   its first 2 bytes sent (the digit and the NUL) for remote 5.31 and
//!   later; both sides keep the smaller;
//! - per QP, the 108-byte key message [`KeyMsg`], as often as the test's
//!   handshakes need;
//! - after the run (RDMA BW tests), the client's results [`BwReport`];
//! - at the end, one more handshake and then `"done"` with its NUL, which
//!   neither program reads.
//!
//! perftest reads each message with a single `read()` and fails on a short
//! one, so every message goes out in one `write`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::cli::Fail;

/// The version we announce: that of Debian's perftest 4.5+0.17 (`ib_*_bw
/// --version`), so the peer uses its current message formats.
pub const VERSION: &str = "6.06";
/// `MAX_VERSION`: bytes of the version message.
const VERSION_LEN: usize = 16;
/// perftest refuses peers older than this (`check_version_compatibility`).
const OLDEST_COMPATIBLE: f64 = 5.70;
/// `KEY_MSG_SIZE_GID`: bytes of a key message with a GID (RoCE always has one).
pub const KEY_MSG_LEN: usize = 108;
/// `sizeof "done"`.
const DONE: &[u8; 5] = b"done\0";

/// One QP's address as perftest sends it (`struct pingpong_dest`, in
/// `KEY_PRINT_FMT_GID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyMsg {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding READs/atomics the sender accepts as responder (perftest's
    /// `out_reads`); the peer uses it as its `max_rd_atomic`.
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// R_Key of the sender's buffer.
    pub rkey: u32,
    /// Address in the sender's buffer the peer WRITEs to or READs from.
    pub vaddr: u64,
    /// The GID, in wire order.
    pub gid: [u8; 16],
    /// SRQ number (XRC and DC only; 0 here).
    pub srqn: u32,
}

impl KeyMsg {
    /// `sprintf(msg, KEY_PRINT_FMT_GID, ...)` and its NUL: `LID:OUT:QPN:PSN:
    /// RKEY:VADDR:` in hex of widths 4, 4, 6, 6, 8 and 16, the 16 GID bytes
    /// as `%02x:` each, then `SRQN:` in 8 hex digits. The QPN and PSN are
    /// 24-bit, so every field has its nominal width and the text is 107
    /// characters.
    pub fn encode(&self) -> [u8; KEY_MSG_LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0x00ff_ffff,
            self.psn & 0x00ff_ffff,
            self.rkey,
            self.vaddr
        );
        for byte in self.gid {
            text.push_str(&format!("{byte:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut msg = [0u8; KEY_MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Reads what [`KeyMsg::encode`] (or perftest) wrote. perftest parses
    /// with `strtol` and takes garbage as zero; we refuse anything that is
    /// not 23 colon-terminated hex fields followed by the NUL.
    pub fn parse(msg: &[u8]) -> Result<KeyMsg, String> {
        let bad = |why: &str| {
            let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
            format!("Couldn't parse line <{}>: {why}", String::from_utf8_lossy(&msg[..end]))
        };
        let end = msg.iter().position(|&b| b == 0).ok_or_else(|| bad("no terminating NUL"))?;
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad("not text"))?;
        let body = text.strip_suffix(':').ok_or_else(|| bad("does not end with ':'"))?;
        let fields: Vec<&str> = body.split(':').collect();
        if fields.len() != 23 {
            return Err(bad(&format!("{} fields instead of 23", fields.len())));
        }
        let hex = |i: usize, max_digits: usize| -> Result<u64, String> {
            let f = fields[i];
            if f.is_empty() || f.len() > max_digits || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(&format!("field {} ({f:?}) is not a hex number of up to {max_digits} digits", i + 1)));
            }
            u64::from_str_radix(f, 16).map_err(|e| bad(&e.to_string()))
        };
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = hex(6 + i, 2)? as u8;
        }
        Ok(KeyMsg {
            lid: hex(0, 4)? as u16,
            out_reads: hex(1, 4)? as u16,
            qpn: hex(2, 6)? as u32,
            psn: hex(3, 6)? as u32,
            rkey: hex(4, 8)? as u32,
            vaddr: hex(5, 16)?,
            gid,
            srqn: hex(22, 8)? as u32,
        })
    }
}

/// The results the client sends the server after an RDMA BW test
/// (`struct bw_report_data`, without the per-port fields).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Messages, over all QPs.
    pub iters: u64,
    /// Peak bandwidth, in the report's unit.
    pub bw_peak: f64,
    /// Average bandwidth, in the report's unit.
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

/// `atof`: the number at the start of a C string, 0 if there is none.
pub fn c_atof(text: &str) -> f64 {
    let t = text.trim_start();
    let mut end = 0;
    let bytes = t.as_bytes();
    if end < bytes.len() && (bytes[end] == b'+' || bytes[end] == b'-') {
        end += 1;
    }
    let digits_start = end;
    while end < bytes.len() && bytes[end].is_ascii_digit() {
        end += 1;
    }
    if end < bytes.len() && bytes[end] == b'.' {
        end += 1;
        while end < bytes.len() && bytes[end].is_ascii_digit() {
            end += 1;
        }
    }
    if end == digits_start || &t[digits_start..end] == "." {
        return 0.0;
    }
    t[..end].parse().unwrap_or(0.0)
}

/// The TCP connection to the peer and which side we are.
pub struct Comm {
    stream: TcpStream,
    client: bool,
    /// The peer's version, once exchanged.
    pub remote_version: f64,
}

impl Comm {
    /// Wraps a connected stream; reads give up after `timeout`, if any.
    pub fn new(stream: TcpStream, client: bool, timeout: Option<Duration>) -> Result<Comm, Fail> {
        stream.set_read_timeout(timeout)?;
        // Each message is one write and the programs wait for each answer:
        // Nagle would only add delay.
        stream.set_nodelay(true)?;
        Ok(Comm { stream, client, remote_version: 0.0 })
    }

    /// `ctx_xchg_data`: the client writes then reads, the server the reverse.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), Fail> {
        if self.client {
            self.write(mine)?;
            self.read(theirs)
        } else {
            self.read(theirs)?;
            self.write(mine)
        }
    }

    fn write(&mut self, msg: &[u8]) -> Result<(), Fail> {
        self.stream.write_all(msg).map_err(|e| Fail(format!("Couldn't send data to the peer: {e}")))
    }

    fn read(&mut self, msg: &mut [u8]) -> Result<(), Fail> {
        self.stream.read_exact(msg).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Fail("The peer closed the connection early".to_owned()),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                Fail("Timed out waiting for the peer".to_owned())
            }
            _ => Fail(format!("Couldn't read from the peer: {e}")),
        })
    }

    /// `exchange_versions` and `check_version_compatibility`.
    pub fn exchange_versions(&mut self) -> Result<(), Fail> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(&mine, &mut theirs)?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        let text = String::from_utf8_lossy(&theirs[..end]).into_owned();
        self.remote_version = c_atof(&text);
        if self.remote_version < OLDEST_COMPATIBLE {
            return Err(Fail(format!(
                "Current implementation is not compatible with versions older than 5.70 (the peer says {text:?})"
            )));
        }
        Ok(())
    }

    /// `check_sys_data`: trades the cycle buffer (page) and cache line
    /// sizes; returns the larger of each.
    pub fn exchange_sys_data(&mut self, cycle_buffer: u32, cache_line: u32) -> Result<(u32, u32), Fail> {
        if self.remote_version < 5.32 {
            return Ok((cycle_buffer, cache_line));
        }
        let mut theirs = [0u8; 4];
        self.xchg(&cycle_buffer.to_be_bytes(), &mut theirs)?;
        let rem_cycle = i32::from_be_bytes(theirs);
        self.xchg(&cache_line.to_be_bytes(), &mut theirs)?;
        let rem_cache = i32::from_be_bytes(theirs);
        let max = |mine: u32, theirs: i32| u32::try_from(theirs).map_or(mine, |t| t.max(mine));
        // perftest takes the peer's values as they come; a nonsense one
        // (a cycle buffer of 1 GiB, say) would make our buffers absurd.
        let (cycle, cache) = (max(cycle_buffer, rem_cycle), max(cache_line, rem_cache));
        if !cycle.is_power_of_two() || cycle > 1 << 20 || !cache.is_power_of_two() || cache > cycle {
            return Err(Fail(format!("The peer's page size {rem_cycle} or cache line size {rem_cache} is unusable")));
        }
        Ok((cycle, cache))
    }

    /// `check_mtu`'s exchange: `mtu` is an `ibv_mtu` number (1..=5); returns
    /// the smaller of ours and a valid one of theirs.
    pub fn exchange_mtu(&mut self, mtu: u32) -> Result<u32, Fail> {
        if self.remote_version < 5.1 {
            return Ok(mtu);
        }
        let text = format!("{mtu}\0\0\0");
        let len = if self.remote_version >= 5.31 { 2 } else { 4 };
        let mut theirs = [0u8; 4];
        self.xchg(&text.as_bytes()[..len], &mut theirs[..len])?;
        let digits: String = theirs.iter().take_while(|b| b.is_ascii_digit()).map(|&b| b as char).collect();
        let remote = digits.parse::<u32>().unwrap_or(0);
        Ok(if (1..=5).contains(&remote) && mtu > remote { remote } else { mtu })
    }

    /// `ctx_hand_shake`: trades key messages.
    pub fn hand_shake(&mut self, mine: &KeyMsg) -> Result<KeyMsg, Fail> {
        let mut theirs = [0u8; KEY_MSG_LEN];
        self.xchg(&mine.encode(), &mut theirs)?;
        KeyMsg::parse(&theirs).map_err(Fail)
    }

    /// `xchg_bw_reports`: each field in its own exchange, big-endian.
    pub fn exchange_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, Fail> {
        let mut word = [0u8; 8];
        self.xchg(&mine.size.to_be_bytes(), &mut word)?;
        let size = u64::from_be_bytes(word);
        let iters = if self.remote_version >= 5.33 {
            self.xchg(&mine.iters.to_be_bytes(), &mut word)?;
            u64::from_be_bytes(word)
        } else {
            let mut half = [0u8; 4];
            self.xchg(&(mine.iters as u32).to_be_bytes(), &mut half)?;
            u64::from(u32::from_be_bytes(half))
        };
        let mut double = |value: f64| -> Result<f64, Fail> {
            self.xchg(&value.to_bits().to_be_bytes(), &mut word)?;
            Ok(f64::from_bits(u64::from_be_bytes(word)))
        };
        let bw_peak = double(mine.bw_peak)?;
        let bw_avg = double(mine.bw_avg)?;
        let msg_rate = double(mine.msg_rate)?;
        Ok(BwReport { size, iters, bw_peak, bw_avg, msg_rate })
    }

    /// `ctx_close_connection`: a last handshake, then `"done"`. perftest
    /// never reads the peer's `"done"`; we read it (briefly) so that our
    /// close finds no unread data and sends no RST the peer might see.
    pub fn close(&mut self, mine: &KeyMsg) -> Result<(), Fail> {
        self.hand_shake(mine)?;
        self.write(DONE)?;
        self.stream.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut done = [0u8; DONE.len()];
        let _ = self.stream.read_exact(&mut done);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sprintf(KEY_PRINT_FMT_GID, ...)` writes for lid 0, out_reads
    /// 0x80, QPN 0x11, PSN 0xabcdef, rkey 0x1234, vaddr 0x7f0012345000, GID
    /// ::ffff:10.77.0.20, srqn 0.
    const C_KEY: &[u8; 107] = b"0000:0080:000011:abcdef:00001234:00007f0012345000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:14:00000000:";

    fn sample() -> KeyMsg {
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 10, 77, 0, 20]);
        KeyMsg {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_1234_5000,
            gid,
            srqn: 0,
        }
    }

    #[test]
    fn key_message_is_perftests_format() {
        let msg = sample().encode();
        assert_eq!(&msg[..107], C_KEY);
        assert_eq!(msg[107], 0);
        let mut c = [0u8; KEY_MSG_LEN];
        c[..107].copy_from_slice(C_KEY);
        assert_eq!(KeyMsg::parse(&c), Ok(sample()));
    }

    #[test]
    fn malformed_key_messages_are_errors() {
        let with = |text: &[u8]| {
            let mut m = [0u8; KEY_MSG_LEN];
            m[..text.len()].copy_from_slice(text);
            KeyMsg::parse(&m)
        };
        assert!(with(b"").is_err());
        assert!(with(b"garbage").is_err());
        // A field too wide, a non-hex digit, a missing field, no NUL.
        assert!(with(&[&C_KEY[..5], b"00800:", &C_KEY[10..]].concat()).is_err());
        assert!(with(&[b"000g", &C_KEY[4..]].concat()).is_err());
        assert!(with(&C_KEY[..98]).is_err());
        assert!(KeyMsg::parse(&[b'0'; KEY_MSG_LEN]).is_err());
        assert!(KeyMsg::parse(&[0xff; KEY_MSG_LEN]).is_err());
    }

    #[test]
    fn versions_read_as_atof_does() {
        assert_eq!(c_atof("6.06"), 6.06);
        assert_eq!(c_atof("5.70beta"), 5.70);
        assert_eq!(c_atof(""), 0.0);
        assert_eq!(c_atof("x"), 0.0);
        assert_eq!(c_atof("."), 0.0);
        assert_eq!(c_atof("6"), 6.0);
    }

    /// Runs `server` against a client on a loopback TCP connection.
    fn pair<T: Send + 'static>(
        client: impl FnOnce(&mut Comm) -> T + Send + 'static,
        server: impl FnOnce(&mut Comm) -> T,
    ) -> (T, T) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let mut comm = Comm::new(TcpStream::connect(addr).unwrap(), true, None).unwrap();
            client(&mut comm)
        });
        let mut comm = Comm::new(listener.accept().unwrap().0, false, None).unwrap();
        let theirs = server(&mut comm);
        (handle.join().unwrap(), theirs)
    }

    #[test]
    fn setup_exchange_is_perftests_bytes() {
        // A raw peer speaking perftest 6.06's bytes to our client.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = vec![0u8; 16 + 4 + 4 + 2];
            s.read_exact(&mut got[..16]).unwrap();
            s.write_all(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
            s.read_exact(&mut got[16..20]).unwrap();
            s.write_all(&8192u32.to_be_bytes()).unwrap();
            s.read_exact(&mut got[20..24]).unwrap();
            s.write_all(&32u32.to_be_bytes()).unwrap();
            s.read_exact(&mut got[24..26]).unwrap();
            s.write_all(b"3\0").unwrap();
            got
        });
        let mut comm = Comm::new(TcpStream::connect(addr).unwrap(), true, None).unwrap();
        comm.exchange_versions().unwrap();
        assert_eq!(comm.exchange_sys_data(4096, 64).unwrap(), (8192, 64));
        assert_eq!(comm.exchange_mtu(5).unwrap(), 3);
        let got = peer.join().unwrap();
        assert_eq!(&got[..16], b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(&got[16..24], &[0, 0, 0x10, 0, 0, 0, 0, 64]);
        assert_eq!(&got[24..], b"5\0");
    }

    #[test]
    fn old_or_garbled_versions_are_refused() {
        let (client, _) = pair(
            |c| c.exchange_versions().map_err(|Fail(m)| m),
            |s| {
                let mut theirs = [0u8; VERSION_LEN];
                s.xchg(b"5.60\0\0\0\0\0\0\0\0\0\0\0\0", &mut theirs).map_err(|Fail(m)| m)
            },
        );
        assert!(client.unwrap_err().contains("older than 5.70"));
    }

    #[test]
    fn reports_cross_big_endian() {
        let mine = BwReport { size: 65536, iters: 5000, bw_peak: 1.5, bw_avg: 1.25, msg_rate: 0.02 };
        let (theirs, _) = pair(
            move |c| {
                c.remote_version = 6.06;
                c.exchange_bw_reports(&mine).map_err(|Fail(m)| m)
            },
            |s| {
                let mut got = [0u8; 40];
                for (i, chunk) in got.chunks_mut(8).enumerate() {
                    let reply = [0u64, 1, 2f64.to_bits(), 3f64.to_bits(), 4f64.to_bits()][i];
                    s.xchg(&reply.to_be_bytes(), chunk).unwrap();
                }
                assert_eq!(&got[..8], &65536u64.to_be_bytes());
                assert_eq!(&got[16..24], &1.5f64.to_bits().to_be_bytes());
                Ok(BwReport::default())
            },
        );
        assert_eq!(theirs.unwrap(), BwReport { size: 0, iters: 1, bw_peak: 2.0, bw_avg: 3.0, msg_rate: 4.0 });
    }

    #[test]
    fn absurd_sys_data_is_refused() {
        let (client, _) = pair(
            |c| {
                c.remote_version = 6.06;
                c.exchange_sys_data(4096, 64).map_err(|Fail(m)| m)
            },
            |s| {
                let mut theirs = [0u8; 4];
                s.xchg(&(1u32 << 30).to_be_bytes(), &mut theirs).unwrap();
                s.xchg(&64u32.to_be_bytes(), &mut theirs).unwrap();
                Ok((0, 0))
            },
        );
        assert!(client.is_err());
    }
}
