//! The timeline as one self-contained HTML page: a table whose columns are
//! the endpoints (a device of a process, or an untraced peer), with each call
//! in its endpoint's column and each packet an arrow across the columns
//! between its sender and receiver. A packet opens (`<details>`, no script)
//! to its decoded headers, what each field means, and the rxe-spec
//! statements that govern it.

use std::fmt::Write as _;

use super::{fate_text, statement, times, RowKind, Timeline};

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 1em; color: #222; }
h1 { font-size: 1.3em; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th, td { border-left: 1px solid #ccc; padding: 2px 6px; vertical-align: top; font-size: 0.85em; }
th { background: #f3f3f3; position: sticky; top: 0; text-align: left; }
td.time { font-family: monospace; color: #666; border-left: none; width: 7em; }
th.time { width: 7em; }
.call { font-family: monospace; color: #0b4f8a; word-break: break-word; }
.call b { color: #063052; }
.opened { color: #666; font-style: italic; }
td.packet { background: #fafafa; }
.arrow { display: flex; align-items: center; gap: 4px; font-family: monospace; white-space: nowrap; }
.arrow .line { flex: 1; border-top: 2px solid #0b4f8a; position: relative; text-align: center; }
.arrow .line span { position: relative; top: -0.75em; background: #fafafa; padding: 0 4px; font-size: 0.9em; color: #555; }
.alarm .arrow .line { border-top-color: #b00020; }
.alarm .arrow .line span { color: #b00020; }
.head { color: #0b4f8a; }
.alarm .head { color: #b00020; }
summary { cursor: pointer; font-family: monospace; word-break: break-word; }
.alarm summary { color: #b00020; }
.fate { color: #555; font-size: 0.9em; }
.explain { margin: 4px 0 4px 1em; padding: 0; }
.explain li { margin: 2px 0; }
.rule { margin: 4px 0 4px 1em; padding: 4px; border-left: 3px solid #0b4f8a; background: #eef4fa; }
";

/// The whole page.
pub fn page(timeline: &Timeline) -> String {
    let mut out = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<title>softroce trace</title><style>");
    out.push_str(STYLE);
    out.push_str("</style></head><body>\n<h1>softroce trace</h1>\n");
    out.push_str(
        "<p>Calls each program made, in its endpoint's column, and the packets they caused, as arrows \
         from sender to receiver, in time order (seconds since the first event). Click a packet to see \
         its headers explained and the rules that govern it.</p>\n",
    );
    let _ = write!(out, "<table>\n<thead><tr><th class=\"time\">time (s)</th>");
    for (i, endpoint) in timeline.endpoints.iter().enumerate() {
        let _ = write!(out, "<th>{} &mdash; {}</th>", Timeline::letter(i), escape(&endpoint.describe()));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    let columns = timeline.endpoints.len();
    for row in &timeline.rows {
        let _ = write!(out, "<tr><td class=\"time\">{:.6}</td>", row.time as f64 / 1e9);
        match &row.kind {
            RowKind::Opened | RowKind::Call { .. } => {
                for column in 0..columns {
                    if column != row.endpoint {
                        out.push_str("<td></td>");
                        continue;
                    }
                    match &row.kind {
                        RowKind::Call { name, details, repeated } => {
                            let _ = write!(
                                out,
                                "<td class=\"call\"><b>{}</b> {}{}</td>",
                                escape(name),
                                escape(details),
                                times(*repeated)
                            );
                        }
                        _ => {
                            let endpoint = &timeline.endpoints[row.endpoint];
                            let _ = write!(out, "<td class=\"opened\">opened device {}</td>", escape(&endpoint.device));
                        }
                    }
                }
            }
            RowKind::Packet(packet) => {
                let (low, high) = (packet.from.min(packet.to), packet.from.max(packet.to));
                for _ in 0..low {
                    out.push_str("<td></td>");
                }
                // The sender's letter, a line with what became of the
                // packet on it, the head, the receiver's letter; reversed
                // when the packet goes leftwards.
                let fate = escape(&fate_text(packet.fate));
                let line = format!("<div class=\"line\"><span>{fate}</span></div>");
                let (from, to) = (Timeline::letter(packet.from), Timeline::letter(packet.to));
                let arrow = if packet.from <= packet.to {
                    format!("{from} {line}<span class=\"head\">&#x25B6;</span> {to}")
                } else {
                    format!("{to} <span class=\"head\">&#x25C0;</span>{line} {from}")
                };
                let class = if packet.alarm { "packet alarm" } else { "packet" };
                let _ = write!(
                    out,
                    "<td class=\"{class}\" colspan=\"{}\"><div class=\"arrow\">{arrow}</div>",
                    high - low + 1
                );
                let _ = write!(
                    out,
                    "<details><summary>{}</summary><div class=\"fate\">{} &rarr; {}</div>",
                    escape(&packet.summary),
                    escape(&packet.src.to_string()),
                    escape(&packet.dst.to_string()),
                );
                out.push_str("<ul class=\"explain\">");
                for line in &packet.explanation {
                    let _ = write!(out, "<li>{}</li>", escape(line));
                }
                out.push_str("</ul>");
                for id in &packet.rules {
                    if let Some((page, text)) = statement(id) {
                        let _ = write!(
                            out,
                            "<div class=\"rule\"><a href=\"{}\">rxe-spec/{page}</a> {}</div>",
                            spec_link(page),
                            escape(&text)
                        );
                    }
                }
                out.push_str("</details></td>");
                for _ in high + 1..columns {
                    out.push_str("<td></td>");
                }
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
    if timeline.unreadable > 0 {
        let _ =
            writeln!(out, "<p>{} lines of the events file were not events and are left out.</p>", timeline.unreadable);
    }
    out.push_str("</body></html>\n");
    out
}

/// Where the rxe-spec page is: the source tree the tool was built from.
fn spec_link(page: &str) -> String {
    format!("file://{}/../rxe-spec/{page}", env!("CARGO_MANIFEST_DIR"))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}
