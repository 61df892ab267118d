//! The files a kernel rxe host has for its devices, made for the program
//! `softroce run` starts: `/dev/infiniband/uverbsN` and the rxe-shaped
//! `/sys/class/infiniband/<dev>` and `/sys/class/infiniband_verbs` trees,
//! for the devices softroce's library lists, in its order.
//!
//! Consumers check these paths before they use a device: UCX skips, without
//! a word, every device whose `/dev/infiniband/<dev_name>` is not a
//! character device it can open read-write, and takes its GID types (RoCE v1
//! or v2) and LAG level from sysfs. No file may be created there on the host
//! (sysfs is the kernel's, and a uverbs name could collide with a real
//! device's), so the program gets a mount namespace of its own: `/dev` and
//! `/sys/class` become tmpfs copies holding the host's entries, bound back
//! (so `/dev/shm`, `/dev/pts` and every `/sys/class/net` are the host's),
//! plus softroce's. `/tmp`, where softroce keeps the state the processes of
//! a user share, and everything else stay the host's. The program's
//! children, `mpirun`'s daemons among them, inherit the namespace.
//!
//! Root gets a mount namespace alone. Any other user gets a user namespace
//! too, in which it is mapped to itself (mapped to root, its softroce state
//! would be root's), and the mounts are made with mount(2) in this process
//! before it becomes the program.

use std::ffi::{CString, OsStr};
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use softroce::verbs::device::{PhysState, PortState};
use softroce::verbs::Device;

/// `IB_USER_VERBS_ABI_VERSION`, the class's `abi_version`.
const UVERBS_ABI_VERSION: u32 = 6;
/// `RXE_UVERBS_ABI_VERSION`, each rxe device's `abi_version`.
const RXE_UVERBS_ABI_VERSION: u32 = 2;
/// rxe's `node_desc`.
const NODE_DESC: &str = "rxe";

/// Why the program runs without the files.
pub(crate) enum Error {
    /// The kernel lets this user make no namespace, or no mount in it,
    /// before any directory was covered: the program can still run, with
    /// the host's files.
    Unavailable(String),
    /// The namespace was made but could not be filled: this process is in
    /// it, half set up, and must not become the program.
    Failed(String),
}

/// Moves this process into a namespace holding the files for `devices`.
/// Single-threaded callers only: the kernel refuses a user namespace to a
/// process with threads.
pub(crate) fn enter(devices: &[Device]) -> Result<(), Error> {
    // SAFETY: unshare has no memory preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EPERM) {
            return Err(Error::Unavailable(format!("unshare(CLONE_NEWNS): {error}")));
        }
        let maps = IdMaps::of_this_process();
        // A user namespace can be made yet be refused the mappings or the
        // mounts (AppArmor's restriction does that), and this process cannot
        // leave one: a child tries first.
        probe(&maps)?;
        maps.enter().map_err(|(step, e)| Error::Failed(format!("{step}: {e}")))?;
    }
    fill(devices)
}

/// The user and group mapped to themselves in a new user namespace.
struct IdMaps {
    uid: String,
    gid: String,
}

impl IdMaps {
    fn of_this_process() -> IdMaps {
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        IdMaps { uid: format!("{uid} {uid} 1\n"), gid: format!("{gid} {gid} 1\n") }
    }

    /// unshare(2) into a user and mount namespace, then the mappings; on
    /// failure, the step that failed.
    fn enter(&self) -> Result<(), (Step, io::Error)> {
        // SAFETY: unshare has no memory preconditions.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            return Err((Step::Unshare, io::Error::last_os_error()));
        }
        // An unprivileged process maps its group only after giving up setgroups(2).
        let write = |file: &str, text: &str| fs::write(file, text).map_err(|e| (Step::Map, e));
        write("/proc/self/setgroups", "deny\n")?;
        write("/proc/self/uid_map", &self.uid)?;
        write("/proc/self/gid_map", &self.gid)
    }
}

/// What a user namespace needs, in order.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Unshare = 1,
    Map = 2,
    Mount = 3,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Unshare => "unshare(CLONE_NEWUSER)",
            Step::Map => "writing /proc/self/uid_map",
            Step::Mount => "mount(2) in the user namespace",
        })
    }
}

/// Makes a user namespace in a child, maps it and mounts a tmpfs there:
/// what [`enter`] will do, where failing costs nothing.
fn probe(maps: &IdMaps) -> Result<(), Error> {
    // SAFETY: this process has one thread, so the child may do anything
    // the parent could; it ends with _exit.
    match unsafe { libc::fork() } {
        -1 => Err(Error::Unavailable(format!("fork: {}", io::Error::last_os_error()))),
        0 => {
            let outcome = maps.enter().and_then(|()| {
                mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None)
                    .and_then(|()| mount_tmpfs(Path::new("/dev")))
                    .map_err(|e| (Step::Mount, e))
            });
            // The step and the errno, in an exit status.
            let status = match outcome {
                Ok(()) => 0,
                Err((step, e)) => (step as i32) << 6 | e.raw_os_error().unwrap_or(0).clamp(1, 63),
            };
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(status) }
        }
        child => {
            let mut status = 0;
            // SAFETY: our child; status is ours.
            if unsafe { libc::waitpid(child, &mut status, 0) } != child || !libc::WIFEXITED(status) {
                return Err(Error::Unavailable(format!("the namespace probe ended with status {status:#x}")));
            }
            match libc::WEXITSTATUS(status) {
                0 => Ok(()),
                code => {
                    let step = [Step::Unshare, Step::Map, Step::Mount].into_iter().find(|s| *s as i32 == code >> 6);
                    let errno = code & 63;
                    Err(Error::Unavailable(refusal(step.unwrap_or(Step::Unshare), errno)))
                }
            }
        }
    }
}

/// Why the kernel refused a user namespace, naming the setting that decides.
fn refusal(step: Step, errno: i32) -> String {
    let error = io::Error::from_raw_os_error(errno);
    let why = match (step, errno) {
        (Step::Unshare, libc::EPERM) if !user_is_mapped() => {
            "this process's user has no mapping in its own user namespace (/proc/self/uid_map), and such a \
             user may not make one"
        }
        (Step::Unshare, libc::EPERM) => {
            "unprivileged user namespaces are turned off (sysctl kernel.unprivileged_userns_clone=0 on \
             Debian, or kernel.apparmor_restrict_unprivileged_userns=1 with AppArmor), or a seccomp filter \
             (a container's) forbids them"
        }
        (Step::Unshare, libc::ENOSPC) => "sysctl user.max_user_namespaces is 0, or this user's are used up",
        (Step::Unshare, libc::EINVAL) => "this kernel has no user namespaces (CONFIG_USER_NS)",
        (Step::Map | Step::Mount, libc::EPERM | libc::EACCES) => {
            "the user namespace has no privilege in it: AppArmor restricts unprivileged user namespaces \
             (sysctl kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 23.10 and later)"
        }
        _ => "",
    };
    if why.is_empty() {
        format!("{step}: {error}")
    } else {
        format!("{step}: {error}: {why}")
    }
}

/// Whether this process's user ID has a mapping in the user namespace it
/// is in (one made without a mapping leaves it the overflow ID).
fn user_is_mapped() -> bool {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let maps = fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    maps.lines().any(|line| {
        let numbers: Vec<u32> = line.split_whitespace().filter_map(|n| n.parse().ok()).collect();
        matches!(numbers[..], [inside, _, count] if uid >= inside && uid - inside < count)
    })
}

/// Fills the new mount namespace: `/dev` with the host's entries and
/// `infiniband/`, `/sys/class` with the host's classes and the generated
/// `infiniband` and `infiniband_verbs`.
fn fill(devices: &[Device]) -> Result<(), Error> {
    // Mounts made from here on stay in this namespace. Until a tmpfs covers
    // a directory, the namespace looks like the host's, and a refusal (a
    // container's AppArmor profile refuses mounts to root) leaves the
    // program no worse off than without one.
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| Error::Unavailable(format!("making / private: {e}")))?;
    let null = fs::metadata("/dev/null").map_err(|e| Error::Unavailable(format!("/dev/null: {e}")))?;
    let null_number = format!("{}:{}", libc::major(null.rdev()), libc::minor(null.rdev()));
    rebuild(Path::new("/dev"), &["infiniband"], |dev, host| {
        let dir = dev.join("infiniband");
        fs::DirBuilder::new().mode(0o755).create(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // /dev/null: a character device anyone may open read-write, which
        // is all a consumer checks; mknod is not allowed in a user namespace.
        let null = host.join("null");
        for name in device_files(devices.len()) {
            bind(&null, &dir.join(name), false)?;
        }
        Ok(())
    })?;
    rebuild(Path::new("/sys/class"), &["infiniband", "infiniband_verbs"], |class, _| {
        write_files(class, sysfs_files(devices, &null_number))
    })
}

/// Writes `files` below `root`, read-only as sysfs attributes are, making
/// each directory once. Files of one directory with the same contents are
/// one file linked under each name: the thousand empty entries of a GID
/// table then cost one page of memory, not a thousand, and a third of the
/// time.
fn write_files(root: &Path, files: Vec<(PathBuf, String)>) -> Result<(), String> {
    let mut made = std::collections::HashSet::new();
    let mut written: std::collections::HashMap<(PathBuf, String), PathBuf> = std::collections::HashMap::new();
    for (path, text) in files {
        let path = root.join(path);
        let parent = path.parent().expect("files are below the root").to_owned();
        let context = |e: io::Error| format!("{}: {e}", path.display());
        if !made.contains(&parent) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&parent)
                .map_err(|e| format!("{}: {e}", parent.display()))?;
            made.insert(parent.clone());
        }
        if let Some(first) = written.get(&(parent.clone(), text.clone())) {
            fs::hard_link(first, &path).map_err(context)?;
            continue;
        }
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&path)
            .and_then(|mut file| io::Write::write_all(&mut file, text.as_bytes()))
            .map_err(context)?;
        written.insert((parent, text), path);
    }
    Ok(())
}

/// The names in `/dev/infiniband`: the devices' `uverbsN` (the `dev_name`
/// the library gives device N of its list) and `rdma_cm`, as on a kernel
/// rxe host.
fn device_files(count: usize) -> impl Iterator<Item = String> {
    (0..count).map(|index| format!("uverbs{index}")).chain(["rdma_cm".to_owned()])
}

/// Replaces `dir` by a tmpfs holding each of its entries but `replaced`
/// (bound back, symbolic links copied), then lets `add` put the new ones in.
/// `add` gets the directory and a path to the host's `dir`.
fn rebuild(dir: &Path, replaced: &[&str], add: impl FnOnce(&Path, &Path) -> Result<(), String>) -> Result<(), Error> {
    let context = |e: io::Error| Error::Unavailable(format!("{}: {e}", dir.display()));
    // The host's directory stays reachable through this descriptor once
    // the tmpfs covers it.
    let host = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(context)?;
    let host_path = PathBuf::from(format!("/proc/self/fd/{}", host.as_raw_fd()));
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(context)? {
        let entry = entry.map_err(context)?;
        let name = entry.file_name();
        if replaced.iter().any(|r| OsStr::new(r) == name) {
            continue;
        }
        let kind = entry.file_type().map_err(context)?;
        let target = if kind.is_symlink() { Some(fs::read_link(entry.path()).map_err(context)?) } else { None };
        entries.push((name, kind, target));
    }
    mount_tmpfs(dir).map_err(|e| Error::Unavailable(format!("mounting a tmpfs on {}: {e}", dir.display())))?;
    // From here on the directory is ours, and a failure leaves it half made.
    let populate = || {
        for (name, kind, target) in entries {
            let path = dir.join(&name);
            match target {
                Some(target) => {
                    std::os::unix::fs::symlink(target, &path).map_err(|e| format!("{}: {e}", path.display()))?
                }
                None => bind(&host_path.join(&name), &path, kind.is_dir())?,
            }
        }
        // Sockets, pipes and devices were bound like files; `host` stays
        // open until the new entries are in.
        add(dir, &host_path)
    };
    populate().map_err(Error::Failed)
}

/// Binds `source` (with everything mounted below it) onto a new `target`
/// of its kind.
fn bind(source: &Path, target: &Path, is_dir: bool) -> Result<(), String> {
    let made = if is_dir {
        fs::DirBuilder::new().mode(0o755).create(target)
    } else {
        OpenOptions::new().write(true).create_new(true).mode(0o600).open(target).map(drop)
    };
    made.and_then(|()| mount(Some(source), target, None, libc::MS_BIND | libc::MS_REC, None))
        .map_err(|e| format!("binding {} onto {}: {e}", source.display(), target.display()))
}

fn mount_tmpfs(dir: &Path) -> io::Result<()> {
    mount(Some(Path::new("tmpfs")), dir, Some("tmpfs"), libc::MS_NOSUID, Some("mode=755"))
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let source = source.map(|s| c(s.as_os_str().as_bytes())).transpose()?;
    let target = c(target.as_os_str().as_bytes())?;
    let fstype = fstype.map(|s| c(s.as_bytes())).transpose()?;
    let data = data.map(|s| c(s.as_bytes())).transpose()?;
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: NUL-terminated strings or NULL, as mount(2) takes them.
    let rc = unsafe { libc::mount(ptr(&source), target.as_ptr(), ptr(&fstype), flags, ptr(&data).cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The files of `/sys/class/infiniband` and `/sys/class/infiniband_verbs`
/// for `devices`, relative to `/sys/class`, with the contents the kernel's
/// `drivers/infiniband/core/sysfs.c` and `uverbs_main.c` (and rxe's `parent`
/// attribute) give an rxe device. `null` is the `major:minor` of the
/// character device standing for `uverbsN`.
fn sysfs_files(devices: &[Device], null: &str) -> Vec<(PathBuf, String)> {
    let mut files = vec![(PathBuf::from("infiniband_verbs/abi_version"), format!("{UVERBS_ABI_VERSION}\n"))];
    for (index, device) in devices.iter().enumerate() {
        let uverbs = PathBuf::from(format!("infiniband_verbs/uverbs{index}"));
        files.push((uverbs.join("ibdev"), format!("{}\n", device.name())));
        files.push((uverbs.join("abi_version"), format!("{RXE_UVERBS_ABI_VERSION}\n")));
        files.push((uverbs.join("dev"), format!("{null}\n")));

        let dir = PathBuf::from("infiniband").join(device.name());
        let attr = device.query_device();
        files.push((dir.join("node_type"), "1: CA\n".to_owned()));
        files.push((dir.join("node_guid"), format!("{}\n", guid(attr.node_guid))));
        files.push((dir.join("sys_image_guid"), format!("{}\n", guid(attr.sys_image_guid))));
        files.push((dir.join("node_desc"), format!("{NODE_DESC}\n")));
        // rxe has no get_dev_fw_str, so its fw_ver is an empty line.
        files.push((dir.join("fw_ver"), "\n".to_owned()));
        if let Some(netdev) = device.netdev() {
            files.push((dir.join("parent"), format!("{netdev}\n")));
        }
        let port = device.query_port(1).expect("port 1 exists");
        let ports = dir.join("ports/1");
        let state = match port.state {
            PortState::Active => "4: ACTIVE",
            PortState::Down => "1: DOWN",
        };
        let phys_state = match port.phys_state {
            PhysState::LinkUp => "5: LinkUp",
            PhysState::Polling => "2: Polling",
        };
        files.push((ports.join("state"), format!("{state}\n")));
        files.push((ports.join("phys_state"), format!("{phys_state}\n")));
        files.push((ports.join("link_layer"), "Ethernet\n".to_owned()));
        files.push((ports.join("rate"), format!("{}\n", rate(port.active_speed, port.active_width))));
        files.push((ports.join("lid"), format!("{:#x}\n", port.lid)));
        files.push((ports.join("sm_lid"), format!("{:#x}\n", port.sm_lid)));
        files.push((ports.join("lid_mask_count"), format!("{}\n", port.lmc)));
        files.push((ports.join("sm_sl"), format!("{}\n", port.sm_sl)));
        files.push((ports.join("cap_mask"), format!("0x{:08x}\n", port.port_cap_flags)));
        // ibv_query_pkey answers index 0 only.
        files.push((ports.join("pkeys/0"), "0xffff\n".to_owned()));
        // Every index of the table has a gids file, zeros where the entry is
        // empty; the attributes exist for the valid entries.
        for index in 0..port.gid_tbl_len as usize {
            let raw = device.gid(index).map_or([0; 16], <[u8; 16]>::from);
            files.push((ports.join(format!("gids/{index}")), format!("{}\n", gid_text(&raw))));
        }
        for index in 0..device.gid_table().len() {
            files.push((ports.join(format!("gid_attrs/types/{index}")), "RoCE v2\n".to_owned()));
            if let Some(netdev) = device.netdev() {
                files.push((ports.join(format!("gid_attrs/ndevs/{index}")), format!("{netdev}\n")));
            }
        }
    }
    files
}

/// A GUID as sysfs prints it: four groups of four hex digits.
fn guid(value: u64) -> String {
    let groups: Vec<String> =
        value.to_be_bytes().chunks_exact(2).map(|g| format!("{:02x}{:02x}", g[0], g[1])).collect();
    groups.join(":")
}

/// A GID as `%pI6` prints it: eight groups of four hex digits, none left out.
fn gid_text(raw: &[u8; 16]) -> String {
    let mut text = String::with_capacity(39);
    for (i, group) in raw.chunks_exact(2).enumerate() {
        if i > 0 {
            text.push(':');
        }
        let _ = write!(text, "{:02x}{:02x}", group[0], group[1]);
    }
    text
}

/// The port's `rate` as the kernel's `rate_show` prints it, from the IB
/// encodings of speed and width.
fn rate(speed: u8, width: u8) -> String {
    // Deci-Gb/s per lane; an unknown speed counts as SDR, as in the kernel.
    let (tenths, name) = match speed {
        2 => (50, "DDR"),
        4 => (100, "QDR"),
        8 => (100, "FDR10"),
        16 => (140, "FDR"),
        32 => (250, "EDR"),
        64 => (500, "HDR"),
        128 => (1000, "NDR"),
        _ => (25, "SDR"),
    };
    let lanes = match width {
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    let rate = tenths * lanes;
    format!("{}{} Gb/sec ({lanes}X {name})", rate / 10, if rate % 10 != 0 { ".5" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_reads_as_the_kernel_prints_it() {
        assert_eq!(rate(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(rate(1, 2), "10 Gb/sec (4X SDR)");
        assert_eq!(rate(32, 2), "100 Gb/sec (4X EDR)");
        assert_eq!(rate(16, 8), "168 Gb/sec (12X FDR)");
    }

    #[test]
    fn gid_text_has_eight_full_groups() {
        let gid: [u8; 16] = std::net::Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped().octets();
        assert_eq!(gid_text(&gid), "0000:0000:0000:0000:0000:ffff:7f00:0001");
        assert_eq!(gid_text(&[0; 16]), "0000:0000:0000:0000:0000:0000:0000:0000");
    }

    #[test]
    fn device_files_follow_the_device_list() {
        assert_eq!(device_files(2).collect::<Vec<_>>(), ["uverbs0", "uverbs1", "rdma_cm"]);
    }
}
