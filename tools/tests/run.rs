//! `softroce run`'s namespace: the `/dev/infiniband` and `/sys/class`
//! files a kernel rxe host has for its devices, as programs see them.
//! Most checks need root or user namespaces; CI runs as root.

use std::collections::BTreeSet;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SOFTROCE: &str = env!("CARGO_BIN_EXE_softroce");

/// The cdylib cargo built for this test (a dev-dependency), which `run`
/// finds beside the executable.
fn library() -> PathBuf {
    let exe = PathBuf::from(SOFTROCE);
    let dir = exe.parent().unwrap();
    [dir.join("libsoftroce_ibverbs.so"), dir.join("deps/libsoftroce_ibverbs.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("the cdylib is built with the tests (dev-dependency softroce-ibverbs)")
}

/// `softroce` and its library where nobody may run them: the build's
/// directory may be closed to it (a checkout under /root). Links if it can,
/// copies otherwise; removed when dropped.
struct PublicCopy(PathBuf);

impl PublicCopy {
    fn new(test: &str) -> PublicCopy {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("softroce-run-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (from, name) in [(library(), "libsoftroce_ibverbs.so"), (PathBuf::from(SOFTROCE), "softroce")] {
            let to = dir.join(name);
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).unwrap();
            }
        }
        PublicCopy(dir)
    }

    fn softroce(&self) -> PathBuf {
        self.0.join("softroce")
    }
}

impl Drop for PublicCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

fn finish(output: Output) -> Run {
    Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        success: output.status.success(),
    }
}

/// `PREFIX... SOFTROCE run RUN_ARGS... -- sh -c SCRIPT`; `$SOFTROCE` in
/// the script is the `softroce` that runs it.
fn run_with(softroce: &Path, prefix: &[&str], run_args: &[&str], script: &str) -> Run {
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest).arg(softroce);
            command
        }
        None => Command::new(softroce),
    };
    let output = command
        .arg("run")
        .args(run_args)
        .args(["--", "sh", "-c", script])
        .env("SOFTROCE", softroce)
        .env_remove("SOFTROCE_LIBIBVERBS")
        .env_remove("SOFTROCE_ADDR")
        .output()
        .unwrap();
    finish(output)
}

fn run_as(prefix: &[&str], run_args: &[&str], script: &str) -> Run {
    run_with(Path::new(SOFTROCE), prefix, run_args, script)
}

fn run(run_args: &[&str], script: &str) -> Run {
    run_as(&[], run_args, script)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The device names `softroce devinfo -l` lists, in order.
fn device_names() -> Vec<String> {
    let output = Command::new(SOFTROCE).args(["devinfo", "-l"]).env_remove("SOFTROCE_ADDR").output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// What the C library says of each device (name, dev_name, dev_path,
/// ibdev_path) and what a program finds at those paths, one line each,
/// read with ctypes from the `ibv_device`s `ibv_get_device_list` returns.
const DEVICE_PATHS: &str = r#"
import ctypes, os, stat
lib = ctypes.CDLL("libibverbs.so.1")
class Device(ctypes.Structure):
    _fields_ = [("ops", ctypes.c_void_p * 2), ("node_type", ctypes.c_int), ("transport_type", ctypes.c_int),
                ("name", ctypes.c_char * 64), ("dev_name", ctypes.c_char * 64),
                ("dev_path", ctypes.c_char * 256), ("ibdev_path", ctypes.c_char * 256)]
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.POINTER(Device))
count = ctypes.c_int()
devices = lib.ibv_get_device_list(ctypes.byref(count))
for i in range(count.value):
    d = devices[i].contents
    name, dev_name = d.name.decode(), d.dev_name.decode()
    node = "/dev/infiniband/" + dev_name
    mode = os.stat(node).st_mode
    usable = stat.S_ISCHR(mode) and os.access(node, os.R_OK | os.W_OK)
    ibdev = open(os.path.join(d.dev_path.decode(), "ibdev")).read().strip()
    node_type = open(os.path.join(d.ibdev_path.decode(), "node_type")).read().strip()
    print(name, dev_name, "usable" if usable else "unusable", ibdev, node_type.replace(" ", "_"))
"#;

/// The lines [`DEVICE_PATHS`] prints, under `softroce run` as `prefix`.
fn device_paths(softroce: &Path, prefix: &[&str]) -> Result<Vec<String>, Run> {
    let script = format!("exec python3 -c '{DEVICE_PATHS}'");
    let run = run_with(softroce, prefix, &[], &script);
    if !run.success {
        return Err(run);
    }
    Ok(run.stdout.lines().map(String::from).collect())
}

/// What the namespace gives every device the C library lists, in order.
fn expected_paths() -> Vec<String> {
    device_names().iter().enumerate().map(|(i, name)| format!("{name} uverbs{i} usable {name} 1:_CA")).collect()
}

#[test]
fn each_listed_device_has_its_character_device_and_sysfs_directories() {
    if !is_root() {
        eprintln!("skipped: root makes the mount namespace (the unprivileged path has its own test)");
        return;
    }
    let found = device_paths(Path::new(SOFTROCE), &[]).unwrap_or_else(|run| panic!("{}{}", run.stdout, run.stderr));
    assert!(!found.is_empty(), "no devices");
    assert_eq!(found, expected_paths());
}

/// `setpriv` as nobody: a user with no privilege and no home.
const NOBODY: [&str; 5] = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"];

#[test]
fn an_unprivileged_user_gets_the_same_files_mapped_to_itself() {
    if !is_root() {
        eprintln!("skipped: becoming another user takes root");
        return;
    }
    let copy = PublicCopy::new("nobody");
    let id = run_with(&copy.softroce(), &NOBODY, &[], "id -u; test -c /dev/infiniband/uverbs0 && echo char");
    if id.stderr.contains("no namespace for them") {
        eprintln!("skipped: this kernel allows no user namespace: {}", id.stderr);
        return;
    }
    assert!(id.success, "{}", id.stderr);
    // Mapped to itself, so its softroce state is its own.
    assert_eq!(id.stdout, "65534\nchar\n");
    let found = device_paths(&copy.softroce(), &NOBODY).unwrap_or_else(|run| panic!("{}{}", run.stdout, run.stderr));
    assert_eq!(found, expected_paths());
}

/// `softroce devinfo -v`'s GID table of each device: name → GIDs by index.
fn devinfo_gids() -> Vec<(String, Vec<Ipv6Addr>)> {
    let output = Command::new(SOFTROCE).args(["devinfo", "-v"]).env_remove("SOFTROCE_ADDR").output().unwrap();
    let mut devices: Vec<(String, Vec<Ipv6Addr>)> = Vec::new();
    for line in String::from_utf8(output.stdout).unwrap().lines() {
        if let Some(name) = line.strip_prefix("hca_id:\t") {
            devices.push((name.to_owned(), Vec::new()));
        } else if let Some((_, rest)) = line.split_once("GID[") {
            let gid = rest.split_once("]:").unwrap().1.trim().split(',').next().unwrap();
            devices.last_mut().unwrap().1.push(gid.parse().unwrap());
        }
    }
    devices
}

#[test]
fn sysfs_reads_as_rxe_and_agrees_with_devinfo() {
    if !is_root() {
        eprintln!("skipped: root makes the mount namespace");
        return;
    }
    let script = r#"cd /sys/class/infiniband || exit 1
for d in *; do
  for f in node_type node_desc ports/1/state ports/1/phys_state ports/1/link_layer ports/1/rate ports/1/pkeys/0; do
    echo "$d $f $(cat $d/$f)"
  done
  echo "$d gids $(ls $d/ports/1/gids | wc -l)"
  i=0
  while [ -e $d/ports/1/gid_attrs/types/$i ]; do
    echo "$d gid $i $(cat $d/ports/1/gids/$i) $(cat $d/ports/1/gid_attrs/types/$i | tr ' ' _) $(cat $d/ports/1/gid_attrs/ndevs/$i)"
    i=$((i + 1))
  done
  echo "$d empty $(cat $d/ports/1/gids/$i)"
done
cat /sys/class/infiniband_verbs/abi_version"#;
    let run = run(&[], script);
    assert!(run.success, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.last(), Some(&"6"));
    let devices = devinfo_gids();
    assert!(!devices.is_empty());
    for (name, gids) in devices {
        let netdev = name.strip_prefix("sr_").unwrap();
        for expected in [
            format!("{name} node_type 1: CA"),
            format!("{name} node_desc rxe"),
            format!("{name} ports/1/state 4: ACTIVE"),
            format!("{name} ports/1/phys_state 5: LinkUp"),
            format!("{name} ports/1/link_layer Ethernet"),
            format!("{name} ports/1/rate 2.5 Gb/sec (1X SDR)"),
            format!("{name} ports/1/pkeys/0 0xffff"),
            format!("{name} gids 1024"),
            format!("{name} empty 0000:0000:0000:0000:0000:0000:0000:0000"),
        ] {
            assert!(lines.contains(&expected.as_str()), "no {expected:?} in\n{}", run.stdout);
        }
        let prefix = format!("{name} gid ");
        let table: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix(&prefix)).collect();
        assert_eq!(table.len(), gids.len(), "{}", run.stdout);
        for (index, (line, gid)) in table.iter().zip(&gids).enumerate() {
            let words: Vec<&str> = line.split(' ').collect();
            assert_eq!(words[0], index.to_string());
            // Eight full groups, as %pI6 prints.
            assert_eq!(words[1].len(), 39, "{line}");
            assert_eq!(words[1].parse::<Ipv6Addr>().unwrap(), *gid, "{line}");
            assert_eq!(&words[2..], ["RoCE_v2", netdev], "{line}");
        }
    }
}

#[test]
fn an_address_makes_the_files_of_its_device_alone() {
    if !is_root() {
        eprintln!("skipped: root makes the mount namespace");
        return;
    }
    let run = run(
        &["--addr", "127.0.0.2"],
        "ls /dev/infiniband /sys/class/infiniband; cat /sys/class/infiniband/sr_lo/ports/1/gids/1",
    );
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.stdout, "/dev/infiniband:\nrdma_cm\nuverbs0\n\n/sys/class/infiniband:\nsr_lo\n0000:0000:0000:0000:0000:ffff:7f00:0002\n");
}

fn names(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map_or_else(|_| BTreeSet::new(), |d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
}

#[test]
fn the_rest_of_dev_sys_class_tmp_and_shm_is_the_hosts() {
    if !is_root() {
        eprintln!("skipped: root makes the mount namespace");
        return;
    }
    let marker = format!("softroce-run-test-{}", std::process::id());
    let script = format!(
        "ls -a /dev; echo --; ls -a /sys/class; echo --; touch /tmp/{marker} /dev/shm/{marker}; \
         test -c /dev/pts/ptmx && test -d /sys/class/net/lo && echo ok"
    );
    let run = run(&[], &script);
    assert!(run.success, "{}", run.stderr);
    let parts: Vec<&str> = run.stdout.split("--\n").collect();
    let listed = |text: &str| -> BTreeSet<String> {
        text.lines().filter(|l| *l != "." && *l != "..").map(String::from).collect()
    };
    let mut host_dev = names("/dev");
    host_dev.insert("infiniband".into());
    assert_eq!(listed(parts[0]), host_dev);
    let mut host_class = names("/sys/class");
    host_class.extend(["infiniband".into(), "infiniband_verbs".into()]);
    assert_eq!(listed(parts[1]), host_class);
    assert_eq!(parts[2], "ok\n");
    for dir in ["/tmp", "/dev/shm"] {
        let path = PathBuf::from(dir).join(&marker);
        assert!(path.exists(), "{} was not written on the host", path.display());
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn children_and_nested_runs_see_their_own_devices() {
    if !is_root() {
        eprintln!("skipped: root makes the mount namespace");
        return;
    }
    // A grandchild, started in the background after its parent has gone.
    let child = run(&[], "(sleep 0.1; test -c /dev/infiniband/uverbs0 && echo inherited) & wait");
    assert_eq!(child.stdout, "inherited\n", "{}", child.stderr);
    // A run inside a run makes the files of its own devices.
    let nested = "exec \"$SOFTROCE\" run --addr 127.0.0.2 -- sh -c 'ls /dev/infiniband /sys/class/infiniband'";
    let copy = PublicCopy::new("nested");
    for (softroce, prefix) in [(PathBuf::from(SOFTROCE), &[][..]), (copy.softroce(), &NOBODY[..])] {
        let run = run_with(&softroce, prefix, &[], nested);
        if run.stderr.contains("no namespace for them") {
            eprintln!("skipped as {prefix:?}: {}", run.stderr);
            continue;
        }
        assert!(run.success, "{prefix:?}: {}", run.stderr);
        assert_eq!(run.stdout, "/dev/infiniband:\nrdma_cm\nuverbs0\n\n/sys/class/infiniband:\nsr_lo\n", "{prefix:?}");
    }
}

#[test]
fn no_namespace_leaves_the_hosts_files() {
    let run = run(&["--no-namespace"], "ls /dev; echo --; ls /sys/class");
    assert!(run.success, "{}", run.stderr);
    let (dev, class) = run.stdout.split_once("--\n").unwrap();
    assert_eq!(dev.lines().map(String::from).collect::<BTreeSet<_>>(), names("/dev"));
    assert_eq!(class.lines().map(String::from).collect::<BTreeSet<_>>(), names("/sys/class"));
}

#[test]
fn without_user_namespaces_the_program_runs_without_the_files() {
    if !is_root() {
        eprintln!("skipped: needs root to make an unmapped user namespace");
        return;
    }
    // A user with no mapping in its user namespace may make no other.
    let run = run_as(&["unshare", "--user", "--"], &[], "test -e /dev/infiniband/uverbs0 || echo ran without");
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.stdout, "ran without\n");
    assert!(run.stderr.contains("no namespace for them") && run.stderr.contains("--no-namespace"), "{}", run.stderr);
}

#[test]
fn another_network_namespace_gets_the_files_of_its_devices() {
    if !is_root() {
        eprintln!("skipped: network namespaces take root");
        return;
    }
    let netns = format!("softroce-run-{}", std::process::id());
    let ip = |args: &[&str]| Command::new("ip").args(args).status().unwrap().success();
    assert!(ip(&["netns", "add", &netns]));
    let run = if ip(&["-n", &netns, "link", "set", "lo", "up"]) {
        Some(run_as(&["ip", "netns", "exec", &netns], &[], "ls /dev/infiniband /sys/class/infiniband"))
    } else {
        None
    };
    ip(&["netns", "delete", &netns]);
    let run = run.expect("lo comes up");
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.stdout, "/dev/infiniband:\nrdma_cm\nuverbs0\n\n/sys/class/infiniband:\nsr_lo\n");
}

#[test]
fn a_hosts_own_rdma_devices_are_replaced_not_merged() {
    if !is_root() {
        eprintln!("skipped: needs root to make a /dev with a kernel device's node");
        return;
    }
    // A /dev, in a mount namespace of the test's, that has a kernel
    // device's uverbs7 and the host's /dev/null.
    let fake = std::env::temp_dir().join(format!("softroce-run-dev-{}", std::process::id()));
    std::fs::create_dir(&fake).unwrap();
    let outer = format!(
        "mount -t tmpfs tmpfs {dir} && cp -a /dev/null {dir}/null && mkdir {dir}/infiniband && \
         touch {dir}/infiniband/uverbs7 && mount --bind {dir} /dev && exec \"$@\"",
        dir = fake.display()
    );
    let prefix = ["unshare", "--mount", "--", "sh", "-c", &outer, "sh"];
    let replaced = run_as(&prefix, &["--addr", "127.0.0.1"], "ls /dev/infiniband");
    let kept = run_as(&prefix, &["--no-namespace"], "ls /dev/infiniband");
    std::fs::remove_dir(&fake).unwrap();
    assert!(replaced.success, "{}", replaced.stderr);
    assert_eq!(replaced.stdout, "rdma_cm\nuverbs0\n");
    assert_eq!(kept.stdout, "uverbs7\n", "{}", kept.stderr);
}
