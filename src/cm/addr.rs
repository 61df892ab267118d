//! Addresses: the source address the kernel's routing picks for a
//! destination, the device that holds an address, the process's one
//! context per device, and the ports ids bind.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{io_error, CmOptions, PortSpace};
use crate::verbs::{Context, ContextOptions, Device, Result, WeakContext};

/// The devices addresses resolve to, if the program chose them
/// ([`set_devices`]); else those of [`Device::list`].
static DEVICES: Mutex<Option<Vec<Device>>> = Mutex::new(None);

/// How the CM opens a device's context: [`context_for`], unless the
/// program chose another way ([`set_context_opener`]).
static OPENER: Mutex<ContextOpener> = Mutex::new(context_for);

/// Opens (or finds) the process's context of a device with options.
pub type ContextOpener = fn(&Device, &ContextOptions) -> Result<Context>;

/// The process's open contexts, by device and RoCE port. Weak: a context
/// closes when its last user lets go, as `ibv_close_device` closes it.
static CONTEXTS: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

/// The ports ids of this process have bound: port space, port and address.
static PORTS: Mutex<Vec<(PortSpace, u16, IpAddr)>> = Mutex::new(Vec::new());

/// Where `bind` with port 0 picks from: Linux's default
/// `ip_local_port_range`, as the kernel's rdma_cm picks from it.
const EPHEMERAL_PORTS: std::ops::RangeInclusive<u16> = 32768..=60999;

struct Registered {
    device: Device,
    port: u16,
    context: WeakContext,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Names the devices this process uses, in the order addresses are looked
/// up in: the C ABI's `ibv_get_device_list`, so that an address resolves to
/// the device programs see. Without it, [`Device::list`]'s.
pub fn set_devices(devices: Vec<Device>) {
    *locked(&DEVICES) = Some(devices);
}

/// Names how the CM opens the context of a device it needs: the C ABI's
/// `ibv_open_device` path, say, so that a context the CM opens first gets
/// the capture and settings the program's environment asks for. The
/// opener should return the process's one context of the device, as
/// [`context_for`] (the default) does.
pub fn set_context_opener(open: ContextOpener) {
    *locked(&OPENER) = open;
}

/// The process's context of `device` on RoCE port `options.port`: the one
/// open already (by the CM or by anything else that came through here), or
/// else a new one opened with `options`. Every user of a device in a
/// process shares its context, as they share a kernel device: one engine,
/// one GSI QP, one slot on the shared port.
pub fn context_for(device: &Device, options: &ContextOptions) -> Result<Context> {
    let mut contexts = locked(&CONTEXTS);
    contexts.retain(|r| r.context.upgrade().is_some());
    let live = contexts.iter().find(|r| r.port == options.port && &r.device == device);
    if let Some(context) = live.and_then(|r| r.context.upgrade()) {
        return Ok(context);
    }
    let context = Context::open(device, options.clone())?;
    contexts.push(Registered { device: device.clone(), port: options.port, context: context.downgrade() });
    Ok(context)
}

/// The source address the kernel's routing picks to reach `dst`: a
/// connected UDP socket's own address (connecting sends nothing).
pub(super) fn route_source(dst: IpAddr) -> io::Result<IpAddr> {
    let any = match dst {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind((any, 0))?;
    socket.connect((dst, 9))?;
    Ok(socket.local_addr()?.ip())
}

/// The source address for `dst` of an id bound to no address: the one the
/// kernel's routing picks, unless this process's device on that address's
/// interface was narrowed to another of the interface's addresses
/// (`softroce run --addr`: another program holds the routing's pick), in
/// which case the device's own. A device narrowed to 127.0.0.2 reaching a
/// peer at 127.0.0.1 speaks from 127.0.0.2, as the kernel's rxe on `lo`,
/// holding every loopback address, would speak from one it holds.
pub(super) fn source_for(dst: IpAddr, options: &CmOptions) -> Result<IpAddr> {
    let routed = route_source(dst).map_err(crate::verbs::Error::Io)?;
    let ours = match &options.context {
        Some(context) => vec![context.device().clone()],
        None => devices()?,
    };
    Ok(narrowed_source(routed, &ours).unwrap_or(routed))
}

/// The address a device of `ours` narrowed to another address of the
/// interface holding `routed` has, if no device of `ours` holds `routed`.
fn narrowed_source(routed: IpAddr, ours: &[Device]) -> Option<IpAddr> {
    if ours.iter().any(|d| d.addresses().any(|a| a == routed)) {
        return None;
    }
    let interface = Device::holding(routed).ok()?;
    let netdev = interface.netdev()?;
    ours.iter()
        .filter(|d| d.netdev() == Some(netdev))
        .flat_map(Device::addresses)
        .find(|a| a.is_ipv4() == routed.is_ipv4())
}

/// The context whose device holds `ip`: the channel's own, or the process's
/// context of the device that holds it.
pub(super) fn context_holding(ip: IpAddr, options: &CmOptions) -> Result<Context> {
    let holds = |device: &Device| device.addresses().any(|a| a == ip);
    if let Some(context) = &options.context {
        return match holds(context.device()) {
            true => Ok(context.clone()),
            false => Err(io_error(
                io::ErrorKind::AddrNotAvailable,
                format!("{ip} is not an address of device {}", context.device().name()),
            )),
        };
    }
    let already_open = locked(&CONTEXTS)
        .iter()
        .filter(|r| r.port == options.port && holds(&r.device))
        .find_map(|r| r.context.upgrade());
    if let Some(context) = already_open {
        return Ok(context);
    }
    let listed = devices()?.into_iter().find(|d| holds(d));
    let device = match listed {
        Some(device) => device,
        None => Device::holding(ip)?,
    };
    open_context(&device, options)
}

/// The device's context, by the program's opener.
fn open_context(device: &Device, options: &CmOptions) -> Result<Context> {
    let opener = *locked(&OPENER);
    opener(device, &options.context_options())
}

/// The contexts a wildcard address stands for: the channel's own, or one
/// for every device with an address of the family.
pub(super) fn contexts_of_family(ipv4: bool, options: &CmOptions) -> Result<Vec<Context>> {
    if let Some(context) = &options.context {
        return Ok(vec![context.clone()]);
    }
    let mut contexts = Vec::new();
    for device in devices()? {
        if device.addresses().any(|a| a.is_ipv4() == ipv4) {
            contexts.push(open_context(&device, options)?);
        }
    }
    if contexts.is_empty() {
        return Err(io_error(io::ErrorKind::AddrNotAvailable, "no device has an address to listen on".into()));
    }
    Ok(contexts)
}

fn devices() -> Result<Vec<Device>> {
    match &*locked(&DEVICES) {
        Some(devices) => Ok(devices.clone()),
        None => Device::list(),
    }
}

/// A port of a port space bound to an address; released when dropped.
#[derive(Debug)]
pub(super) struct PortBinding {
    ps: PortSpace,
    port: u16,
    ip: IpAddr,
}

impl PortBinding {
    /// Binds `port` (0: a free one) of `ps` on `ip`. A port is taken where
    /// another id holds it on the same address, or where either is a
    /// wildcard, as the kernel's rdma_cm has it without SO_REUSEADDR.
    pub(super) fn bind(ps: PortSpace, ip: IpAddr, port: u16) -> Result<PortBinding> {
        let mut table = locked(&PORTS);
        let free = |port: u16| {
            !table.iter().any(|&(s, p, held)| {
                s == ps && p == port && (held == ip || held.is_unspecified() || ip.is_unspecified())
            })
        };
        let port = if port != 0 {
            if !free(port) {
                return Err(io_error(io::ErrorKind::AddrInUse, format!("{} port {port} on {ip} is bound", ps.name())));
            }
            port
        } else {
            let span = u32::from(EPHEMERAL_PORTS.end() - EPHEMERAL_PORTS.start()) + 1;
            let start = crate::random_u32() % span;
            (0..span)
                .map(|i| EPHEMERAL_PORTS.start() + ((start + i) % span) as u16)
                .find(|&p| free(p))
                .ok_or_else(|| io_error(io::ErrorKind::AddrInUse, format!("no free {} port on {ip}", ps.name())))?
        };
        table.push((ps, port, ip));
        Ok(PortBinding { ps, port, ip })
    }

    pub(super) fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

impl Drop for PortBinding {
    fn drop(&mut self) {
        let mut table = locked(&PORTS);
        if let Some(at) = table.iter().position(|&entry| entry == (self.ps, self.port, self.ip)) {
            table.swap_remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_to_loopback_starts_at_loopback() {
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(route_source(local).unwrap(), local);
    }

    #[test]
    fn a_device_narrowed_on_the_routes_interface_speaks_from_its_own_address() {
        let (one, two) = (IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
        let lo = Device::holding(one).unwrap();
        let narrowed = lo.narrowed_to(two);
        assert_eq!(narrowed_source(one, std::slice::from_ref(&narrowed)), Some(two));
        // A device of ours holds the routing's pick: it stands.
        assert_eq!(narrowed_source(one, &[narrowed, lo]), None);
        // A device on no interface of the route is no substitute.
        let custom = Device::custom("elsewhere", vec![two], [0x02, 0, 0, 0, 0, 2], 1500);
        assert_eq!(narrowed_source(one, &[custom]), None);
    }

    #[test]
    fn a_port_is_taken_on_its_address_and_by_wildcards() {
        let (a, b, any) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap(), "0.0.0.0".parse().unwrap());
        let first = PortBinding::bind(PortSpace::Ib, a, 0).unwrap();
        let port = first.socket_addr().port();
        assert!(EPHEMERAL_PORTS.contains(&port));
        assert!(PortBinding::bind(PortSpace::Ib, a, port).is_err());
        assert!(PortBinding::bind(PortSpace::Ib, any, port).is_err());
        let other_space = PortBinding::bind(PortSpace::IpoIb, a, port).unwrap();
        let other_address = PortBinding::bind(PortSpace::Ib, b, port).unwrap();
        drop((first, other_address));
        let wildcard = PortBinding::bind(PortSpace::Ib, any, port).unwrap();
        assert_eq!(wildcard.socket_addr(), SocketAddr::new(any, port));
        drop((wildcard, other_space));
    }
}
