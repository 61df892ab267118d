//! `--plot FILE.svg`: softroce's stream throughput against message size on a
//! log axis, one line per test, path MTU and QP count, with the baselines
//! as horizontal lines — the way perftest results are usually drawn.
//!
//! Each series is one `<polyline>` (with a marker per point, so a series of
//! one point shows); the baselines and legend samples are `<line>`s.

use std::fmt::Write;

use softroce::transport::Mtu;

use super::{size_label, Conn, Row, Test, RC_STREAMS};

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 600.0;
/// The plotting area.
const LEFT: f64 = 80.0;
const RIGHT: f64 = 690.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 520.0;
/// x of the legend.
const LEGEND: f64 = 715.0;
const LEGEND_ROW: f64 = 20.0;

/// The baselines drawn, with their legend labels and colours.
const BASELINES: [(Test, &str, &str); 3] = [
    (Test::Udp, "UDP, 4 KiB datagrams, sendmmsg", "#333333"),
    (Test::UdpGso, "UDP with GSO/GRO", "#8a5a00"),
    (Test::Tcp, "TCP, 64 KiB writes", "#7b3fa0"),
];

/// One line: a softroce stream test at one MTU and QP count.
struct Series {
    test: Test,
    conn: Conn,
    /// (message size, GB/s), by size.
    points: Vec<(usize, f64)>,
}

impl Series {
    fn label(&self) -> String {
        let op = match self.test {
            Test::RcWrite => "WRITE",
            Test::RcSend => "SEND",
            _ => "READ",
        };
        let qps = if self.conn.qps == 1 { "1 QP".to_owned() } else { format!("{} QPs", self.conn.qps) };
        format!("RC {op}, MTU {}, {qps}", self.conn.mtu.bytes())
    }

    /// Colour by test and MTU (lighter for 1024); 4 QPs dashed.
    fn style(&self) -> (&'static str, &'static str) {
        let dark = self.conn.mtu == Mtu::Mtu4096;
        let color = match (self.test, dark) {
            (Test::RcWrite, true) => "#1f5fbf",
            (Test::RcWrite, false) => "#7aa6e8",
            (Test::RcSend, true) => "#2e8b3a",
            (Test::RcSend, false) => "#86c98a",
            (_, true) => "#c0392b",
            (_, false) => "#eb9a90",
        };
        (color, if self.conn.qps == 1 { "none" } else { "7 4" })
    }
}

/// The streams' rows grouped into series, in the order they first appear;
/// rows over two engines per side (a few sizes only) are left to the table.
fn series(rows: &[Row]) -> Vec<Series> {
    let mut all: Vec<Series> = Vec::new();
    for row in rows {
        let (Some(conn), Ok(figures)) = (row.case.conn, &row.result) else { continue };
        if !RC_STREAMS.contains(&row.case.test) || conn.engines != 1 {
            continue;
        }
        let point = (row.case.size, figures.gbytes_per_s);
        match all.iter_mut().find(|s| s.test == row.case.test && s.conn == conn) {
            Some(s) => s.points.push(point),
            None => all.push(Series { test: row.case.test, conn, points: vec![point] }),
        }
    }
    for s in &mut all {
        s.points.sort_by_key(|&(size, _)| size);
    }
    all
}

/// The smallest of 1, 2 and 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|&step| step >= raw).unwrap_or(10.0 * power)
}

/// The drawing, with `note` (the machine, the timing) under the title.
pub fn svg(rows: &[Row], note: &str) -> String {
    let series = series(rows);
    let baselines: Vec<(&str, &str, f64)> = BASELINES
        .iter()
        .filter_map(|&(test, label, color)| {
            let row = rows.iter().find(|r| r.case.test == test)?;
            Some((label, color, row.result.as_ref().ok()?.gbytes_per_s))
        })
        .collect();

    // x: log2 of the size, over the sizes measured (or perftest's range).
    let sizes = series.iter().flat_map(|s| s.points.iter().map(|&(size, _)| size));
    let (mut lo, mut hi) = sizes.fold((f64::MAX, f64::MIN), |(lo, hi), size| {
        let x = (size as f64).log2();
        (lo.min(x), hi.max(x))
    });
    if lo > hi {
        (lo, hi) = (6.0, 22.0);
    }
    // Room around the outermost points, and a few sizes at least.
    let pad = ((4.0 - (hi - lo)) / 2.0).max(0.5);
    (lo, hi) = ((lo - pad).max(0.0), hi + pad);
    let x_of = |size: usize| LEFT + ((size as f64).log2() - lo) / (hi - lo) * (RIGHT - LEFT);

    // y: GB/s from 0, in steps of 1, 2 or 5 times a power of ten.
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|&(_, g)| g))
        .chain(baselines.iter().map(|b| b.2))
        .fold(0.0, f64::max);
    let step = nice_step((top * 1.05).max(1e-3) / 5.0);
    let y_max = (top * 1.05 / step).ceil().max(1.0) * step;
    let y_of = |g: f64| BOTTOM - g / y_max * (BOTTOM - TOP);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="30" font-size="17" font-weight="bold">softroce RC bandwidth over loopback UDP</text>"#
    );
    let _ = writeln!(out, r##"<text x="{LEFT}" y="50" fill="#555">{}</text>"##, escape(note));

    // Grid, ticks and their labels.
    let mut tick = 0.0;
    while tick <= y_max + step / 2.0 {
        let y = y_of(tick);
        let _ = writeln!(out, r##"<line x1="{LEFT}" y1="{y:.1}" x2="{RIGHT}" y2="{y:.1}" stroke="#e4e4e4"/>"##);
        let _ =
            writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 8.0, y + 4.0, trim(tick));
        tick += step;
    }
    // A tick per power of 2, labelled at powers of 4 when crowded.
    let every = if hi - lo > 10.0 { 2 } else { 1 };
    for exponent in (lo.ceil() as u32)..=(hi.floor() as u32) {
        let x = x_of(1 << exponent);
        let _ = writeln!(out, r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{BOTTOM}" stroke="#e4e4e4"/>"##);
        if exponent % every == 0 {
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                BOTTOM + 18.0,
                size_label(1 << exponent)
            );
        }
    }
    let _ = writeln!(out, r#"<path d="M{LEFT},{TOP} V{BOTTOM} H{RIGHT}" fill="none" stroke="black"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size (log scale)</text>"#,
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 44.0
    );
    let (yx, yy) = (LEFT - 55.0, (TOP + BOTTOM) / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{yx}" y="{yy}" text-anchor="middle" transform="rotate(-90 {yx} {yy})">throughput (GB/s)</text>"#
    );

    // Baselines across the whole width, labelled at their left end, where
    // small messages leave the room.
    for &(label, color, gbytes) in &baselines {
        let y = y_of(gbytes);
        let _ = writeln!(
            out,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{RIGHT}" y2="{y:.1}" stroke="{color}" stroke-width="1.5" stroke-dasharray="2 4"><title>{label}: {gbytes:.3} GB/s</title></line>"#
        );
        let _ =
            writeln!(out, r#"<text x="{:.1}" y="{:.1}" fill="{color}">{gbytes:.2} GB/s</text>"#, LEFT + 6.0, y - 5.0);
    }

    // The series.
    for s in &series {
        let (color, dash) = s.style();
        let points: Vec<String> =
            s.points.iter().map(|&(size, g)| format!("{:.1},{:.1}", x_of(size), y_of(g))).collect();
        let _ = writeln!(out, r#"<g><title>{}</title>"#, s.label());
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
            points.join(" ")
        );
        for &(size, g) in &s.points {
            let _ = writeln!(out, "{}", marker(x_of(size), y_of(g), color, s.conn.qps));
        }
        let _ = writeln!(out, "</g>");
    }

    // The legend: series, then baselines.
    let mut y = TOP + 5.0;
    for s in &series {
        let (color, dash) = s.style();
        let _ = writeln!(
            out,
            r#"<line x1="{LEGEND}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
            LEGEND + 30.0
        );
        let _ = writeln!(out, "{}", marker(LEGEND + 15.0, y, color, s.conn.qps));
        let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, LEGEND + 38.0, y + 4.0, s.label());
        y += LEGEND_ROW;
    }
    for &(label, color, _) in &baselines {
        let _ = writeln!(
            out,
            r#"<line x1="{LEGEND}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{color}" stroke-width="1.5" stroke-dasharray="2 4"/>"#,
            LEGEND + 30.0
        );
        let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{label}</text>"#, LEGEND + 38.0, y + 4.0);
        y += LEGEND_ROW;
    }
    out.push_str("</svg>\n");
    out
}

/// A point's marker: a circle for one QP, a square for several.
fn marker(x: f64, y: f64, color: &str, qps: usize) -> String {
    if qps == 1 {
        format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"/>"#)
    } else {
        format!(r#"<rect x="{:.1}" y="{:.1}" width="7" height="7" fill="{color}"/>"#, x - 3.5, y - 3.5)
    }
}

/// A tick value without float noise: `0.3`, not `0.30000000000000004`.
fn trim(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_one_two_or_five() {
        for (raw, step) in [(0.13, 0.2), (0.5, 0.5), (3.0, 5.0), (7.0, 10.0), (11.0, 20.0)] {
            assert!((nice_step(raw) - step).abs() < 1e-9, "{raw}: {}", nice_step(raw));
        }
        assert_eq!([0.0, 0.2, 0.30000000000000004, 1.5].map(trim), ["0", "0.2", "0.3", "1.5"]);
    }
}
