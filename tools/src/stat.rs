//! `softroce stat`: the counters of softroce devices open in running
//! programs (this user's), as `rdma statistic` shows kernel rxe's.

use std::process::ExitCode;
use std::time::Duration;

use softroce::verbs::stats::{self, Published};

#[derive(clap::Args)]
#[command(after_help = "Every program with a softroce device open (`softroce run` ones included) \
    publishes its counters five times a second in a per-user directory; this reads them. \
    Names follow kernel rxe's hw_counters where one means the same.")]
pub struct Args {
    /// One line per QP as well (`rdma statistic qp show`).
    #[arg(long)]
    qp: bool,
    /// Only this device.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Print again every this many seconds until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> ExitCode {
    let every = match args.watch {
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => {
            eprintln!("softroce stat: --watch takes a positive number of seconds, not {s}");
            return ExitCode::from(2);
        }
        None => None,
    };
    loop {
        let published = match stats::read_published() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("softroce stat: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shown: Vec<&Published> =
            published.iter().filter(|p| args.device.as_ref().is_none_or(|d| *d == p.device)).collect();
        if shown.is_empty() && every.is_none() {
            eprintln!("softroce stat: no running program has a softroce device open");
        }
        for p in shown {
            print_one(p, &args);
        }
        match every {
            Some(every) => std::thread::sleep(every),
            None => return ExitCode::SUCCESS,
        }
    }
}

fn print_one(p: &Published, args: &Args) {
    let link = format!("{}/1", p.device);
    if args.json {
        let mut object = serde_json::json!({ "ifname": link, "pid": p.pid });
        for (name, value) in &p.device_counters {
            object[name] = (*value).into();
        }
        println!("{object}");
    } else {
        println!("link {link} pid {} {}", p.pid, pairs(&p.device_counters));
    }
    if !args.qp {
        return;
    }
    for (qpn, counters) in &p.qps {
        if args.json {
            let mut object = serde_json::json!({ "ifname": link, "pid": p.pid, "lqpn": qpn });
            for (name, value) in counters {
                object[name] = (*value).into();
            }
            println!("{object}");
        } else {
            println!("link {link} pid {} lqpn {qpn} {}", p.pid, pairs(counters));
        }
    }
}

fn pairs(counters: &[(String, u64)]) -> String {
    counters.iter().map(|(name, value)| format!("{name} {value}")).collect::<Vec<_>>().join(" ")
}
