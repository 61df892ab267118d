//! What the stack's own capture (rxe-spec V-13) costs per packet when on:
//! building a 4 KiB packet's IP and UDP headers and appending the record to
//! a buffered pcap file, the flush of each engine round included (one per
//! 16 packets here, about what a busy round sends). Off, it is one branch.
//! And what a trace (`softroce run --trace`) costs per 4 KiB packet: a line
//! with the packet in hex, formatted and written at once (to /dev/null: a
//! million 8 KiB lines would fill a disk; the file system's share is not
//! counted).

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softroce::capture::{Direction, LiveCapture};
use softroce::trace::Tracer;

fn bench(c: &mut Criterion) {
    let roce: Vec<u8> = (0..12 + 4096 + 4).map(|i| i as u8).collect();
    let (src, dst): (SocketAddr, SocketAddr) = ("127.0.0.1:4791".parse().unwrap(), "127.0.0.2:4791".parse().unwrap());
    let path = std::env::temp_dir().join(format!("softroce-bench-capture-{}.pcap", std::process::id()));
    let mut group = c.benchmark_group("capture_4k");
    group.throughput(Throughput::Elements(1));
    group.bench_function("record", |b| {
        let mut capture = LiveCapture::create(&path, u64::MAX).unwrap();
        let mut n = 0u32;
        b.iter(|| {
            capture.record(Direction::Sent, black_box(src), black_box(dst), black_box(n as u16), black_box(&roce));
            n = n.wrapping_add(1);
            if n.is_multiple_of(16) {
                capture.flush();
            }
        })
    });
    group.bench_function("trace", |b| {
        let mut capture = LiveCapture::default();
        capture.trace(Tracer::open(std::path::Path::new("/dev/null"), "bench").unwrap());
        let mut n = 0u32;
        b.iter(|| {
            capture.record(Direction::Sent, black_box(src), black_box(dst), black_box(n as u16), black_box(&roce));
            n = n.wrapping_add(1);
        })
    });
    group.finish();
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, bench);
criterion_main!(benches);
