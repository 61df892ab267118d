//! ICRC throughput on 4 KiB packets against plain CRC-32 of the same bytes.
//! The ratio should be close to 1: the masking adds a fixed ~60 bytes of copies,
//! and a second, small CRC call that the cached forms (the UDP link's)
//! mostly save.
//! The receive-side check of a UDP link, which solves for the unknown IPv4
//! ID, should cost little more than one ICRC, whatever the ID (0 from
//! single datagrams, 1, 2… from GSO trains, anything from kernel rxe).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softroce::wire::icrc;
use std::hint::black_box;
use std::net::Ipv4Addr;

fn bench(c: &mut Criterion) {
    let roce: Vec<u8> = (0..12 + 4096).map(|i| i as u8).collect();
    let ip = icrc::ipv4_header(
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        (20 + 8 + roce.len() + 4) as u16,
        0,
        0x40,
    );
    let udp = [0xc0, 0x00, 0x12, 0xb7, 0x10, 0x18, 0x00, 0x00];
    let all: Vec<u8> = [&[0xffu8; 8][..], &ip, &udp, &roce].concat();
    let mut group = c.benchmark_group("icrc_4k");
    group.throughput(Throughput::Bytes(all.len() as u64));
    group.bench_function("crc32fast_hash", |b| b.iter(|| crc32fast::hash(black_box(&all))));
    group.bench_function("icrc_compute", |b| {
        b.iter(|| icrc::compute(black_box(&ip), black_box(&udp), black_box(&roce)).unwrap())
    });
    let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let h = icrc::Ipv4Udp { src, dst, src_port: 0xc000, dst_port: 4791 };
    group.bench_function("icrc_compute_ipv4", |b| {
        let cache = &mut icrc::PrefixCache::default();
        b.iter(|| icrc::compute_ipv4(cache, black_box(h), black_box(0), 0x40, black_box(&roce)).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("icrc_unknown_id_4k");
    group.throughput(Throughput::Bytes(all.len() as u64));
    for id in [0u16, 7, 0xbeef] {
        let mut packet = [&roce[..], &[0; 4]].concat();
        let ip = icrc::ipv4_header(src, dst, (20 + 8 + packet.len()) as u16, id, 0x40);
        icrc::fill(&ip, &udp, &mut packet).unwrap();
        group.bench_function(format!("verify_ipv4_unknown_id_{id:#x}"), |b| {
            b.iter(|| {
                let got = icrc::verify_ipv4_unknown_id(src, dst, black_box(&udp), black_box(&packet));
                assert_eq!(got, Ok(Some(id)));
            })
        });
        let h = icrc::Ipv4Udp { src, dst, src_port: 0xc000, dst_port: 4791 };
        let cache = &mut icrc::PrefixCache::default();
        group.bench_function(format!("verify_ipv4_unknown_id_cached_{id:#x}"), |b| {
            b.iter(|| {
                let got = icrc::verify_ipv4_unknown_id_cached(cache, black_box(h), black_box(&packet));
                assert_eq!(got, Ok(Some(id)));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
