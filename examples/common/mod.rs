//! What the example programs share, as `pingpong.c` is shared by
//! libibverbs' examples: command-line options, choosing a device, the TCP
//! connection that carries the out-of-band exchange, and the report lines.

// Each example uses only some of these helpers.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::error::Error;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::str::FromStr;
use std::time::Duration;

use softroce::verbs::{CompletionChannel, CompletionQueue, Device, Endpoint, WorkCompletion};
use softroce::wire::ROCE_UDP_PORT;

/// The result type of the examples: any error ends the program with a message.
pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// How long to wait for a completion before giving up. The C programs wait
/// forever; a lost UD datagram or a dead peer should end a demo, not hang it.
pub const COMPLETION_TIMEOUT: Duration = Duration::from_secs(30);

/// The options every example takes, with `ibv_rc_pingpong`'s defaults.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server to connect to; `None` makes this process the server.
    pub server: Option<String>,
    /// TCP port of the out-of-band exchange.
    pub port: u16,
    /// UDP port of RoCE traffic (4791). Both sides must use the same one.
    pub roce_port: u16,
    /// Message size in bytes.
    pub size: usize,
    pub iters: u32,
    /// The GID (and so the IP address) this side is known by.
    pub gid_index: usize,
    /// `-d NAME`: a device from `Device::list`.
    pub device: Option<String>,
    /// `--local ADDR`: a device made on this one address.
    pub local: Option<IpAddr>,
    /// Let the engine spin instead of sleep (lower latency, one core busy).
    pub busy_poll: bool,
}

impl Options {
    /// Parses the command line. `-h` prints the usage: `synopsis`, then the
    /// options here, then `extra_help`. Options only one program knows go to
    /// `extra`, which returns `Ok(false)` for an option it does not know
    /// either.
    pub fn parse(
        synopsis: &str,
        extra_help: &str,
        default_size: usize,
        mut extra: impl FnMut(&str, &mut Args) -> Result<bool>,
    ) -> Options {
        let mut opts = Options {
            server: None,
            port: 18515,
            roce_port: ROCE_UDP_PORT,
            size: default_size,
            iters: 1000,
            gid_index: 1,
            device: None,
            local: None,
            busy_poll: false,
        };
        let usage = format!(
            "{synopsis}

Options:
  -p, --port=<port>      listen on/connect to TCP port <port> (default 18515)
      --roce-port=<port> UDP port of RoCE traffic, the same on both sides (default 4791)
  -d, --ib-dev=<dev>     use device <dev> (default $SOFTROCE_DEVICE, else the first)
      --local=<addr>     use a device on address <addr> alone (e.g. 127.0.0.2)
  -g, --gid-idx=<index>  local GID index (default 1, the device's first address)
  -s, --size=<size>      size of message to exchange (default {default_size})
  -n, --iters=<iters>    number of exchanges (default 1000)
      --busy-poll        let the engine spin instead of sleep (needs a spare core)
{extra_help}"
        );
        let mut args = Args::from_env();
        if let Err(e) = opts.parse_args(&usage, &mut args, &mut extra) {
            eprintln!("{e}\n\n{usage}");
            std::process::exit(1);
        }
        opts
    }

    /// The client connects to a server and sends first.
    pub fn is_client(&self) -> bool {
        self.server.is_some()
    }

    fn parse_args(
        &mut self,
        usage: &str,
        args: &mut Args,
        extra: &mut impl FnMut(&str, &mut Args) -> Result<bool>,
    ) -> Result<()> {
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "-h" | "--help" => {
                    println!("{usage}");
                    std::process::exit(0);
                }
                "-p" | "--port" => self.port = args.value(&arg)?,
                "--roce-port" => self.roce_port = args.value(&arg)?,
                "-s" | "--size" => self.size = args.value(&arg)?,
                "-n" | "--iters" => self.iters = args.value(&arg)?,
                "-g" | "--gid-idx" => self.gid_index = args.value(&arg)?,
                "-d" | "--ib-dev" => self.device = Some(args.value(&arg)?),
                "--local" => self.local = Some(args.value(&arg)?),
                "--busy-poll" => self.busy_poll = true,
                _ if extra(&arg, args)? => {}
                _ if !arg.starts_with('-') && self.server.is_none() => self.server = Some(arg),
                _ => return Err(format!("unknown argument {arg:?}").into()),
            }
        }
        if self.iters == 0 || self.size == 0 {
            return Err("--iters and --size must be at least 1".into());
        }
        Ok(())
    }
}

/// The command line, with `--name=value` split into two arguments.
pub struct Args {
    items: VecDeque<String>,
}

impl Args {
    fn from_env() -> Args {
        let mut items = VecDeque::new();
        for arg in std::env::args().skip(1) {
            match arg.split_once('=') {
                Some((name, value)) if name.starts_with("--") => {
                    items.push_back(name.to_owned());
                    items.push_back(value.to_owned());
                }
                _ => items.push_back(arg),
            }
        }
        Args { items }
    }

    fn next(&mut self) -> Option<String> {
        self.items.pop_front()
    }

    /// The value that follows option `flag`.
    pub fn value<T: FromStr>(&mut self, flag: &str) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let text = self.next().ok_or_else(|| format!("{flag} needs a value"))?;
        text.parse().map_err(|e| format!("{flag} {text}: {e}").into())
    }
}

/// The device to use: one made on the `--local` address, the one `-d` names,
/// or the default one (`SOFTROCE_DEVICE`, else the first).
pub fn open_device(opts: &Options) -> Result<Device> {
    if let Some(addr) = opts.local {
        // Several processes on one host each need an address of their own
        // (127.0.0.1, 127.0.0.2, ...): every device binds the RoCE UDP port
        // on its addresses. With one address, GID index 1 is that address.
        let link_mtu = if addr.is_loopback() { 65536 } else { 1500 };
        return Ok(Device::custom(&format!("sr_{addr}"), vec![addr], mac_for(addr), link_mtu));
    }
    Ok(match &opts.device {
        Some(name) => Device::by_name(name)?,
        None => Device::default_device()?,
    })
}

/// A locally administered MAC made from the address, so GID 0 differs
/// between devices.
fn mac_for(addr: IpAddr) -> [u8; 6] {
    let octets = match addr {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, octets[0], octets[1], octets[2], octets[3]]
}

/// The TCP side channel over which the two processes swap what they need to
/// reach each other, like the socket in `pp_client_exch_dest`.
pub struct OutOfBand {
    listener: Option<TcpListener>,
}

impl OutOfBand {
    /// The server listens at once, so a client started after the server has
    /// printed its address finds it listening.
    pub fn listen(opts: &Options) -> Result<OutOfBand> {
        if opts.is_client() {
            return Ok(OutOfBand { listener: None });
        }
        let listener = match opts.local {
            Some(addr) => TcpListener::bind((addr, opts.port)),
            // All addresses, IPv6 and (where the host maps them) IPv4.
            None => TcpListener::bind((Ipv6Addr::UNSPECIFIED, opts.port))
                .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, opts.port))),
        };
        let listener = listener.map_err(|e| format!("couldn't listen on TCP port {}: {e}", opts.port))?;
        Ok(OutOfBand { listener: Some(listener) })
    }

    /// The connection to the peer: the server accepts one client, the
    /// client connects to the server.
    pub fn connect(self, opts: &Options) -> Result<TcpStream> {
        let stream = match (self.listener, &opts.server) {
            (Some(listener), _) => listener.accept()?.0,
            (None, Some(host)) => TcpStream::connect((host.as_str(), opts.port))
                .map_err(|e| format!("couldn't connect to {host}:{}: {e}", opts.port))?,
            (None, None) => unreachable!("a server always has a listener"),
        };
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// Waits until the peer has reached the same point: each side sends one byte
/// and reads the other's. Used once both QPs are connected, so that nobody
/// sends to a QP that is not yet ready to receive.
pub fn sync(stream: &mut TcpStream) -> io::Result<()> {
    stream.write_all(b"R")?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte)
}

/// Prints an endpoint as the C examples do. RoCE has no LIDs, so the LID is
/// always 0; the GID is shown as `inet_ntop` shows it.
pub fn print_address(label: &str, ep: &Endpoint) {
    println!(
        "  {label:<15} LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        ep.qpn,
        ep.psn.value(),
        Ipv6Addr::from(ep.gid.to_bytes())
    );
}

/// The two report lines of `ibv_rc_pingpong`.
pub fn print_rate(bytes: u64, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let secs = usec / 1e6;
    println!("{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec", bytes as f64 * 8.0 / usec);
    println!("{iters} iters in {secs:.2} seconds = {:.2} usec/iter", usec / f64::from(iters));
}

/// The bytes of message number `seq`, for `--check`: different for every
/// message and every offset, so a stale or shifted buffer shows.
pub fn fill_pattern(seq: u32, buf: &mut [u8]) {
    for (i, byte) in buf.iter_mut().enumerate() {
        *byte = (seq.wrapping_mul(31) as usize).wrapping_add(i) as u8;
    }
}

/// Waits for completions and moves them into `out` (cleared first); returns
/// once there is at least one.
///
/// Without a channel this blocks on the CQ itself. With one it sleeps until
/// the CQ raises an event, re-arms it and polls: the event only says "look",
/// and arming before polling means a completion that lands in between still
/// raises the next event.
pub fn wait_completions(
    cq: &CompletionQueue,
    channel: Option<&CompletionChannel>,
    out: &mut Vec<WorkCompletion>,
) -> Result<()> {
    out.clear();
    loop {
        while let Some(wc) = cq.poll_one() {
            out.push(wc);
        }
        if !out.is_empty() {
            return Ok(());
        }
        match channel {
            Some(channel) => {
                let fired = channel.get_event(COMPLETION_TIMEOUT).ok_or("timed out waiting for a CQ event")?;
                if fired != cq.id() {
                    return Err(format!("CQ event for unknown CQ {fired}").into());
                }
                cq.req_notify(false);
            }
            None => {
                let wc = cq.wait_one(COMPLETION_TIMEOUT).ok_or("timed out waiting for a completion")?;
                out.push(wc);
            }
        }
    }
}
