//! The soak's two network namespaces, joined by a veth pair whose RoCE
//! packets an nftables injector drops, duplicates and reorders in both
//! directions. This kernel has no netem, so reordering is made with HTB: a
//! random few packets go to a class limited to 1 Mbit/s, where they wait
//! behind each other while the packets after them pass (HTB's
//! `overlimits` counts the waits). Nothing touches the host's own
//! interfaces; everything goes with the namespaces when [`Lossy`] is
//! dropped.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

pub const ADDR_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
pub const ADDR_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2));
/// Packets in a thousand the injector drops, and duplicates, each way.
const DROP_PER_MILLE: u32 = 10;
const DUPLICATE_PER_MILLE: u32 = 10;
/// Packets in a thousand sent through the slow lane.
const SLOW_PER_MILLE: u32 = 20;
/// Packets the slow lane holds.
const SLOW_QUEUE: u32 = 24;

/// What the injector did, summed over both directions.
#[derive(Debug, Default)]
pub struct Injected {
    pub offered: u64,
    pub duplicated: u64,
    pub dropped: u64,
    /// Sent through the slow lane, and held back there behind its rate.
    pub slowed: u64,
    pub held_back: u64,
    /// Dropped because the slow lane was full.
    pub lane_dropped: u64,
}

pub struct Lossy {
    pub names: [String; 2],
    veths: [String; 2],
}

fn run(args: &[&str], input: Option<&str>) -> Result<String, String> {
    let mut command = Command::new(args[0]);
    command.args(&args[1..]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    let mut child = command.stderr(std::process::Stdio::piped()).spawn().map_err(|e| format!("{}: {e}", args[0]))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        stdin.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Lossy {
    /// Namespaces and veth names made from `tag` (the soak's pid), so that
    /// two soaks do not meet.
    pub fn create(tag: u32) -> Result<Lossy, String> {
        let lossy = Lossy {
            names: [format!("srsoak{tag}a"), format!("srsoak{tag}b")],
            veths: [format!("sk{tag}a"), format!("sk{tag}b")],
        };
        for ns in &lossy.names {
            run(&["ip", "netns", "add", ns], None)?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"], None)?;
        }
        let [a, b] = &lossy.veths;
        run(&["ip", "link", "add", a, "type", "veth", "peer", "name", b], None)?;
        for (k, (ns, veth)) in lossy.names.iter().zip(&lossy.veths).enumerate() {
            let (addr, peer) = if k == 0 { (ADDR_A, ADDR_B) } else { (ADDR_B, ADDR_A) };
            run(&["ip", "link", "set", veth, "netns", ns], None)?;
            run(&["ip", "-n", ns, "addr", "add", &format!("{addr}/24"), "dev", veth], None)?;
            run(&["ip", "-n", ns, "link", "set", veth, "up"], None)?;
            let tc = |args: &str| {
                let mut all = vec!["ip", "netns", "exec", ns, "tc"];
                all.extend(args.split_whitespace());
                run(&all, None)
            };
            tc(&format!("qdisc add dev {veth} root handle 1: htb default 10"))?;
            tc(&format!("class add dev {veth} parent 1: classid 1:10 htb rate 10gbit"))?;
            tc(&format!(
                "class add dev {veth} parent 1: classid 1:20 htb rate 1mbit ceil 1mbit burst 1600 cburst 1600"
            ))?;
            // A short queue: a packet waits in the lane at most ~0.2 s,
            // within the CM's response time, as a network's packet
            // lifetime is; beyond it the lane drops.
            tc(&format!("qdisc add dev {veth} parent 1:20 handle 20: pfifo limit {SLOW_QUEUE}"))?;
            let rules = format!(
                "table ip soak {{\n chain out {{\n  type filter hook postrouting priority 0; policy accept;\n  \
                 oifname \"{veth}\" udp dport 4791 counter\n  \
                 oifname \"{veth}\" udp dport 4791 numgen random mod 1000 < {DUPLICATE_PER_MILLE} counter dup to {peer} device \"{veth}\"\n  \
                 oifname \"{veth}\" udp dport 4791 numgen random mod 1000 < {DROP_PER_MILLE} counter drop\n  \
                 oifname \"{veth}\" udp dport 4791 numgen random mod 1000 < {SLOW_PER_MILLE} counter meta priority set 1:20\n }}\n}}\n"
            );
            run(&["ip", "netns", "exec", ns, "nft", "-f", "-"], Some(&rules))?;
        }
        Ok(lossy)
    }

    /// The injector's counters: packets seen, duplicated and dropped.
    pub fn counts(&self) -> Injected {
        let mut injected = Injected::default();
        for ns in &self.names {
            let Ok(text) = run(&["ip", "netns", "exec", ns, "nft", "list", "table", "ip", "soak"], None) else {
                continue;
            };
            let packets: Vec<u64> = text
                .lines()
                .filter_map(|l| l.split_once("counter packets ")?.1.split_whitespace().next()?.parse().ok())
                .collect();
            if let [offered, duplicated, dropped, slowed] = packets[..] {
                injected.offered += offered;
                injected.duplicated += duplicated;
                injected.dropped += dropped;
                injected.slowed += slowed;
            }
            let veth = &self.veths[self.names.iter().position(|n| n == ns).unwrap_or(0)];
            let classes = run(&["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", veth], None);
            // "class htb 1:20 ...\n Sent B bytes P pkt (dropped D, overlimits O requeues R)"
            let slow = classes.unwrap_or_default();
            let held = slow
                .split("class htb 1:20")
                .nth(1)
                .and_then(|c| c.split("overlimits ").nth(1)?.split_whitespace().next()?.parse::<u64>().ok());
            injected.held_back += held.unwrap_or(0);
            // "qdisc pfifo 20: parent 1:20 limit 24p\n Sent B bytes P pkt (dropped D, ..."
            let queues = run(&["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", veth], None);
            let lane_drops = queues.unwrap_or_default().split("parent 1:20").nth(1).and_then(|q| {
                q.split("(dropped ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
            });
            injected.lane_dropped += lane_drops.unwrap_or(0);
        }
        injected
    }
}

impl Drop for Lossy {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth, and so the pair.
        for ns in &self.names {
            let _ = run(&["ip", "netns", "del", ns], None);
        }
    }
}
