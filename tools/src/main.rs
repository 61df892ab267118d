//! `softroce`: the command-line face of the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter};

mod bench;
mod cli;
mod conform;
mod demo;
mod devinfo;
mod dump;
mod perf;
mod pingpong;
mod run;
mod stat;
mod trace;

#[derive(Parser)]
#[command(name = "softroce", version, about = "Userspace RoCEv2 with kernel rxe semantics")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure softroce's RC bandwidth, message rate and latency against raw UDP and TCP on this machine.
    Bench(bench::Args),
    /// Run every RDMA operation between two devices on loopback, checked, then measure bandwidth and latency.
    Demo(demo::Args),
    /// Probe a RoCE peer running stock perftest programs with scripted packets; report per rxe-spec rule.
    Conform(conform::Args),
    /// Decode RoCEv2 packets in pcap/pcapng captures and check their ICRC.
    Dump(dump::Args),
    /// List the RDMA devices and their attributes, as ibv_devinfo does.
    Devinfo(devinfo::Args),
    /// Ping-pong SENDs with a peer, as ibv_rc/uc/ud/srq_pingpong do (and with them).
    Pingpong(pingpong::Args),
    /// Measure bandwidth or latency with a peer, as perftest's ib_{send,write,read,atomic}_{bw,lat} do (and with them).
    Perf(perf::Args),
    /// Run a program with softroce as its libibverbs and librdmacm: `softroce run [--addr IP] -- CMD [ARGS...]`.
    Run(run::Args),
    /// Merge the events programs traced (SOFTROCE_TRACE) into one timeline of calls and packets, text or HTML.
    Trace(trace::Args),
    /// Show the counters of softroce devices open in running programs, as `rdma statistic` does.
    Stat(stat::Args),
    /// The second process of `softroce bench`'s two-process rows.
    #[command(hide = true)]
    BenchPeer(bench::PeerArgs),
}

/// The environment variable holding the log filter (`tracing` directives).
const LOG_ENV: &str = "SOFTROCE_LOG";

fn main() -> ExitCode {
    // Output piped into `head` and closed ends the program quietly, as for
    // any command-line tool, instead of a panic in the next print.
    // SAFETY: restoring the default action of a signal, before any thread.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Reloadable, so `demo -v` can widen it to the packet trace for a while.
    let (filter, log_filter) = reload::Layer::new(EnvFilter::from_env(LOG_ENV));
    // Colours only on a terminal: traces saved to files stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    tracing_subscriber::registry().with(filter).with(layer).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Conform(args) => conform::run(args),
        Command::Demo(args) => demo::run(args, &log_filter),
        Command::Dump(args) => dump::run(args),
        Command::Devinfo(args) => devinfo::run(args),
        Command::Pingpong(args) => pingpong::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Run(args) => run::run(args),
        Command::Stat(args) => stat::run(args),
        Command::Trace(args) => trace::run(args),
        Command::BenchPeer(args) => bench::peer(args),
    }
}
