//! `softroce run`: runs a program with softroce as its `libibverbs.so.1` and
//! `librdmacm.so.1`.
//!
//! The dynamic loader finds a library by its soname along `LD_LIBRARY_PATH`
//! before the system's directories, so a directory holding a
//! `libibverbs.so.1` and a `librdmacm.so.1` that link to softroce's cdylib,
//! put first on that path, is all it takes: no install step and no root. Both
//! names are links to one file, which the loader maps once (it knows files by
//! device and inode), so a program using both has one softroce. `--preload` adds
//! `LD_PRELOAD`, for programs that load libibverbs with `dlopen` by full
//! path or that carry an RPATH.
//!
//! The program also gets the `/dev/infiniband` and `/sys/class/infiniband`
//! files a kernel rxe host has for its devices ([`namespace`]), in a mount
//! namespace of its own, which `--no-namespace` does without.
//!
//! `run` becomes the program (exec), except with `--trace`: then it starts
//! the program, waits for it and for every process it left behind (`run`
//! is their subreaper), and renders the trace they wrote (`crate::trace`).

mod namespace;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use softroce::verbs::device::ADDR_ENV;
use softroce::verbs::Device;

/// The cdylib as cargo names it.
const CDYLIB: &str = "libsoftroce_ibverbs.so";
/// The names programs load it by: it is both libraries.
const SONAMES: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];
/// An explicit path to the cdylib, for installs that keep it elsewhere.
const LIB_ENV: &str = "SOFTROCE_LIBIBVERBS";

#[derive(clap::Args)]
#[command(trailing_var_arg = true)]
pub struct Args {
    /// Give the program's devices this address of the host alone (several,
    /// comma-separated). One user's programs share a device's addresses and
    /// RoCE port without it; another user's need an address of their own,
    /// say 127.0.0.2. Sets SOFTROCE_ADDR.
    #[arg(long, value_name = "IP[,IP]")]
    addr: Option<String>,
    /// The RoCE UDP port, if not 4791 (both ends must agree). Sets SOFTROCE_PORT.
    #[arg(long)]
    port: Option<u16>,
    /// Record every packet the program's devices send and receive into this
    /// pcap file, each as on the wire (SOFTROCE_PCAP; a second device
    /// records into FILE.1, and so on).
    #[arg(long, value_name = "FILE")]
    pcap: Option<std::path::PathBuf>,
    /// Run the program in this mount namespace, without the
    /// /dev/infiniband/uverbsN and /sys/class/infiniband files of its devices.
    #[arg(long)]
    no_namespace: bool,
    /// Trace the program's verbs and CM calls and the packets they cause,
    /// in every process it starts, into one timeline: text, or one HTML
    /// page for a FILE ending in .html; `-` writes text to stderr. `run`
    /// then waits for the program instead of becoming it, and renders the
    /// timeline when it ends (SOFTROCE_TRACE).
    #[arg(long, value_name = "FILE", conflicts_with = "print_env")]
    trace: Option<PathBuf>,
    /// Also preload the library (LD_PRELOAD).
    #[arg(long)]
    preload: bool,
    /// Print the environment a program needs to run on softroce, for a shell
    /// to `eval`, instead of running one.
    #[arg(long, conflicts_with = "command")]
    print_env: bool,
    /// The program and its arguments.
    #[arg(value_name = "CMD", required_unless_present = "print_env")]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> ExitCode {
    match prepare(&args) {
        Ok(env) if args.print_env => {
            for (name, value) in env {
                println!("export {name}='{}'", value.to_string_lossy());
            }
            ExitCode::SUCCESS
        }
        Ok(env) => {
            // Before any thread: the kernel refuses a user namespace to a
            // threaded process, and a traced program inherits it from here.
            if !args.no_namespace {
                if let Err(message) = enter_namespace(&args) {
                    eprintln!("softroce run: {message}");
                    return ExitCode::FAILURE;
                }
            }
            if let Some(output) = &args.trace {
                return crate::trace::run_traced(&args.command, env, output);
            }
            let (program, rest) = args.command.split_first().expect("clap requires a command");
            let error = Command::new(program).args(rest).envs(env).exec();
            eprintln!("softroce run: cannot run {}: {error}", program.to_string_lossy());
            ExitCode::from(127)
        }
        Err(message) => {
            eprintln!("softroce run: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Enters the namespace holding the files of the devices the program's
/// library will list: those of `--addr`, or of `SOFTROCE_ADDR` inherited.
/// A kernel that allows no namespace gets a warning, and the program runs
/// without the files; an error is a namespace that could not be filled.
fn enter_namespace(args: &Args) -> Result<(), String> {
    let inherited = std::env::var(ADDR_ENV).ok();
    let addresses = args.addr.as_deref().or(inherited.as_deref());
    let devices = Device::list_for(addresses).map_err(|e| e.to_string())?;
    match namespace::enter(&devices) {
        Ok(()) => Ok(()),
        Err(namespace::Error::Unavailable(why)) => {
            eprintln!(
                "softroce run: the program runs without /dev/infiniband and /sys/class/infiniband for \
                 its devices (UCX, for one, then finds none): no namespace for them: {why}. Run as root, \
                 allow user namespaces, or pass --no-namespace to go without them quietly."
            );
            Ok(())
        }
        Err(namespace::Error::Failed(why)) => Err(format!("cannot make the program's namespace: {why}")),
    }
}

/// The variables to set: the loader path (and preload), and the device choices.
fn prepare(args: &Args) -> Result<Vec<(&'static str, OsString)>, String> {
    let library = find_library()?;
    let dir = soname_dir(&library)?;
    let mut path = OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut env = vec![("LD_LIBRARY_PATH", path)];
    if args.preload {
        let mut preload = OsString::from(dir.join("libibverbs.so.1"));
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
            preload.push(" ");
            preload.push(old);
        }
        env.push(("LD_PRELOAD", preload));
    }
    if let Some(addr) = &args.addr {
        env.push((ADDR_ENV, addr.into()));
    }
    if let Some(port) = args.port {
        env.push(("SOFTROCE_PORT", port.to_string().into()));
    }
    if let Some(pcap) = &args.pcap {
        // Absolute, so that a program that changes directory records here.
        let absolute = std::path::absolute(pcap).map_err(|e| format!("{}: {e}", pcap.display()))?;
        env.push(("SOFTROCE_PCAP", absolute.into()));
    }
    Ok(env)
}

/// The cdylib: `SOFTROCE_LIBIBVERBS`, or beside this executable, where
/// cargo puts both (`target/release/`).
fn find_library() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(LIB_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() { Ok(path) } else { Err(format!("{LIB_ENV}={} is not a file", path.display())) };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().ok_or("this executable has no directory")?;
    [dir.join(CDYLIB), dir.join("deps").join(CDYLIB)].into_iter().find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "{CDYLIB} is not beside {}: build it with `cargo build --release -p softroce-ibverbs` \
             (or name it with {LIB_ENV})",
            exe.display()
        )
    })
}

/// A directory holding [`SONAMES`] linked to `library`: beside it if
/// that directory is writable, else in a private directory under the
/// system's temporary one.
fn soname_dir(library: &Path) -> Result<PathBuf, String> {
    let library = library.canonicalize().map_err(|e| format!("{}: {e}", library.display()))?;
    let beside = library.parent().map(|d| d.join("softroce-run"));
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let private = std::env::temp_dir().join(format!("softroce-run-{uid}"));
    let mut last_error = String::new();
    for dir in beside.into_iter().chain([private]) {
        match link_soname(&dir, &library) {
            Ok(()) => return Ok(dir),
            Err(e) => last_error = format!("{}: {e}", dir.display()),
        }
    }
    Err(format!("cannot make the {} links: {last_error}", SONAMES.join(" and ")))
}

fn link_soname(dir: &Path, library: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    // Another user's directory of that name must not choose our library.
    // SAFETY: getuid has no preconditions.
    if std::fs::metadata(dir)?.uid() != unsafe { libc::getuid() } {
        return Err(std::io::Error::other("owned by another user"));
    }
    for soname in SONAMES {
        let link = dir.join(soname);
        if std::fs::read_link(&link).ok().as_deref() == Some(library) {
            continue;
        }
        // Replaced atomically, so programs starting meanwhile see one or the other.
        let temporary = dir.join(format!(".{soname}.{}", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(library, &temporary)?;
        std::fs::rename(&temporary, &link)?;
    }
    Ok(())
}

/// The process `run --trace` waits for: signals that ask `run` to end go on
/// to it, so that `run` lives to render the trace.
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn pass_on(signal: libc::c_int) {
    let child = CHILD.load(std::sync::atomic::Ordering::Relaxed);
    if child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(child, signal) };
    }
}

/// Where nothing is to be done: the terminal sends SIGINT and SIGQUIT to
/// the program too.
extern "C" fn ignore(_signal: libc::c_int) {}

/// Runs `command` with `env` and a trace into `events`, waits for it and
/// returns its exit code (128 + the signal that killed it, as shells say).
pub fn spawn_and_wait(command: &[OsString], env: Vec<(&'static str, OsString)>, events: &Path) -> ExitCode {
    let (program, rest) = command.split_first().expect("clap requires a command");
    // Handlers, unlike ignored signals, are reset for the program by exec.
    // SAFETY: installing handlers that only call kill or nothing.
    unsafe {
        libc::signal(libc::SIGINT, ignore as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGQUIT, ignore as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGTERM, pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGHUP, pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
    // Orphans (a server the program started in the background and did not
    // wait for, mpirun's daemons) become ours, so that `run` waits for them
    // too: their events are part of the trace.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut child = match Command::new(program).args(rest).envs(env).env(softroce::trace::ENV, events).spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("softroce run: cannot run {}: {error}", program.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    CHILD.store(i32::try_from(child.id()).unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    let status = child.wait();
    CHILD.store(0, std::sync::atomic::Ordering::Relaxed);
    reap_orphans();
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            (None, Some(signal)) => ExitCode::from(u8::try_from(128 + signal).unwrap_or(255)),
            (None, None) => ExitCode::FAILURE,
        },
        Err(error) => {
            eprintln!("softroce run: waiting for {}: {error}", program.to_string_lossy());
            ExitCode::FAILURE
        }
    }
}

/// Waits until every process the program left behind has ended (a
/// terminal's Ctrl-C reaches them too).
fn reap_orphans() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only the status it is given.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}
