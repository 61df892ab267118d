//! perftest's result tables and the arithmetic behind them
//! (`print_report_bw`, `print_full_bw_report`, `print_report_lat`), with
//! nanosecond timestamps where perftest counts CPU cycles.

use super::proto::BwReport;

/// `RESULT_LINE`.
pub const RESULT_LINE: &str = "---------------------------------------------------------------------------------------";

/// The BW table header (`RESULT_FMT` or, with `--report_gbits`, `RESULT_FMT_G`).
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// `RESULT_FMT_LAT`, trailing space included.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// Bytes per reported unit: MiB (perftest's "MB") or 10^9/8 (Gb).
fn unit(gbits: bool) -> f64 {
    if gbits {
        125_000_000.0
    } else {
        1_048_576.0
    }
}

/// `print_full_bw_report`'s line: `REPORT_FMT`, or `REPORT_FMT_EXT` (six
/// decimals) for Gb/s figures under 0.1.
pub fn bw_line(r: &BwReport, gbits: bool) -> String {
    row(r, gbits && r.bw_avg < 0.1)
}

/// A bidirectional test's line: both sides' figures added, with our size
/// and iterations; the precision follows our own average, as in perftest.
pub fn bw_sum_line(mine: &BwReport, theirs: &BwReport, gbits: bool) -> String {
    let sum = BwReport {
        bw_peak: mine.bw_peak + theirs.bw_peak,
        bw_avg: mine.bw_avg + theirs.bw_avg,
        msg_rate: mine.msg_rate + theirs.msg_rate,
        ..*mine
    };
    row(&sum, gbits && mine.bw_avg < 0.1)
}

fn row(r: &BwReport, six_decimals: bool) -> String {
    if six_decimals {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        )
    }
}

/// Timestamps of one BW run: when each message was posted and when each
/// completion (by count of completed messages) arrived, in nanoseconds since
/// a common origin. With `no_peak` (perftest's `-N`, forced above 20000
/// iterations and for the SEND server) only the first post and the last
/// completion are kept.
pub struct BwTimes {
    /// Post time of message `i` (all QPs, in posting order).
    pub posted: Vec<u64>,
    /// Time the `j+1`-th message was known complete.
    pub completed: Vec<u64>,
    /// Keep only `posted[0]` and `completed[0]`.
    pub no_peak: bool,
}

impl BwTimes {
    /// Room for `total` messages.
    pub fn new(total: usize, no_peak: bool) -> BwTimes {
        let n = if no_peak { 1 } else { total.max(1) };
        BwTimes { posted: vec![0; n], completed: vec![0; n], no_peak }
    }

    /// Records the post of message `index`.
    pub fn post(&mut self, index: usize, now: u64) {
        if !self.no_peak {
            if let Some(t) = self.posted.get_mut(index) {
                *t = now;
            }
        } else if index == 0 {
            self.posted[0] = now;
        }
    }

    /// Records that `count` messages have completed (perftest's `totccnt`,
    /// which may overshoot the total by a partial CQ moderation batch).
    pub fn complete(&mut self, count: usize, now: u64) {
        if !self.no_peak {
            let last = self.completed.len() - 1;
            self.completed[count.saturating_sub(1).min(last)] = now;
        }
    }

    /// Records the end of the run (with `no_peak`).
    pub fn finish(&mut self, now: u64) {
        if self.no_peak {
            self.completed[0] = now;
        }
    }

    /// `print_report_bw`'s figures for `total` messages of `size` bytes,
    /// completions signaled every `cq_mod`.
    pub fn report(&self, size: u64, total: u64, cq_mod: u64, gbits: bool) -> BwReport {
        let ff = unit(gbits);
        let last = if self.no_peak { 0 } else { total.saturating_sub(1) as usize };
        let span = self.completed[last].saturating_sub(self.posted[0]).max(1) as f64 / 1e9;
        let bw_avg = size as f64 * total as f64 / (span * ff);
        let msg_rate = total as f64 / (span * 1e6);
        let bw_peak = if self.no_peak {
            0.0
        } else {
            // The shortest average time per message over any run of
            // messages from a post to a signaled completion.
            let n = total as usize;
            let cq_mod = cq_mod.max(1) as usize;
            // A completion time never recorded (perftest's zero, which its
            // unsigned arithmetic turns into a huge span) counts for nothing.
            let per_message = |i: usize, j: usize| match self.completed[j].checked_sub(self.posted[i]) {
                Some(d) if self.completed[j] != 0 => d as f64 / (j - i + 1) as f64,
                _ => f64::INFINITY,
            };
            let mut opt = per_message(0, 0);
            for i in 0..n {
                let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
                while j < n {
                    opt = opt.min(per_message(i, j));
                    j += cq_mod;
                }
                if !n.is_multiple_of(cq_mod) {
                    opt = opt.min(per_message(i, n - 1));
                }
            }
            if opt.is_finite() {
                size as f64 / (opt.max(1.0) / 1e9 * ff)
            } else {
                0.0
            }
        };
        BwReport { size, iters: total, bw_peak, bw_avg, msg_rate }
    }
}

/// `print_report_lat`'s line from the post time of each iteration; `rtt`
/// halves the figures for ping-pong tests (SEND, WRITE), where a post waits
/// for a round trip.
pub fn lat_line(size: u64, posted: &[u64], rtt: bool) -> String {
    let iters = posted.len();
    let factor = if rtt { 2.0 } else { 1.0 };
    let mut delta: Vec<u64> = posted.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
    delta.sort_unstable();
    // perftest drops the two largest.
    let n = delta.len().saturating_sub(2).max(1);
    let us = |d: u64| d as f64 / 1000.0 / factor;
    let median = if !(n - 1).is_multiple_of(2) { (delta[n / 2] + delta[n / 2 - 1]) / 2 } else { delta[n / 2] };
    let average = delta[..n].iter().map(|&d| us(d)).sum::<f64>() / n as f64;
    // perftest squares integer-truncated differences.
    let var: f64 = delta[..n].iter().map(|&d| ((average - us(d)) as i64).pow(2) as f64).sum::<f64>() / n as f64;
    let at = |i: usize| us(delta[i.min(delta.len() - 1)]);
    let p99 = (n as f64 * 0.99).ceil() as usize;
    let p999 = (n as f64 * 0.999).ceil() as usize;
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        size,
        iters,
        us(delta[0]),
        at(n),
        us(median),
        average,
        var.sqrt(),
        at(p99),
        at(p999)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bw_lines_are_perftests_format() {
        let r = BwReport { size: 65536, iters: 5000, bw_peak: 1234.567, bw_avg: 1200.0, msg_rate: 0.0192 };
        assert_eq!(bw_line(&r, false), " 65536      5000             1234.57            1200.00\t\t   0.019200");
        let small = BwReport { size: 2, iters: 1000, bw_peak: 0.01, bw_avg: 0.001, msg_rate: 0.0625 };
        assert_eq!(
            bw_line(&small, true),
            " 2          1000           0.010000            0.001000            0.062500"
        );
        let theirs = BwReport { size: 65536, iters: 4000, bw_peak: 1.0, bw_avg: 1.0, msg_rate: 0.0008 };
        assert_eq!(
            bw_sum_line(&r, &theirs, false),
            " 65536      5000             1235.57            1201.00\t\t   0.020000"
        );
    }

    #[test]
    fn bw_figures_follow_perftest() {
        // 4 messages of 1 MiB, one every millisecond, completions every 2.
        let mut t = BwTimes::new(4, false);
        for i in 0..4 {
            t.post(i, i as u64 * 1_000_000);
        }
        t.complete(2, 2_000_000);
        t.complete(4, 3_500_000);
        let r = t.report(1 << 20, 4, 2, false);
        assert_eq!(r.iters, 4);
        assert!((r.bw_avg - 4000.0 / 3.5).abs() < 1e-6, "{r:?}");
        assert!((r.msg_rate - 4.0 / 3500.0).abs() < 1e-9);
        // Message 3: posted at 3 ms, complete at 3.5 ms.
        assert!((r.bw_peak - 2000.0).abs() < 1e-6, "{r:?}");
        let mut n = BwTimes::new(4, true);
        n.post(0, 0);
        n.finish(4_000_000);
        assert_eq!(n.report(1 << 20, 4, 2, false).bw_peak, 0.0);
    }

    #[test]
    fn lat_line_has_perftests_columns() {
        // Round trips of 10 µs, one of 100 µs (dropped as a tail).
        let mut posted = vec![0u64];
        for i in 0..9 {
            posted.push(posted[i] + if i == 4 { 100_000 } else { 10_000 });
        }
        let line = lat_line(2, &posted, true);
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[..5], ["2", "10", "5.00", "5.00", "5.00"]);
    }
}
