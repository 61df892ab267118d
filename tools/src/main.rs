//! `softroce`: the command-line face of the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod devinfo;
mod dump;

#[derive(Parser)]
#[command(name = "softroce", version, about = "Userspace RoCEv2 with kernel rxe semantics")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode RoCEv2 packets in pcap/pcapng captures and check their ICRC.
    Dump(dump::Args),
    /// List the RDMA devices and their attributes, as ibv_devinfo does.
    Devinfo(devinfo::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("SOFTROCE_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Dump(args) => dump::run(args),
        Command::Devinfo(args) => devinfo::run(args),
    }
}
