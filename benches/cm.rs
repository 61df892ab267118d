//! Connection setup time by rdma_cm (rxe-spec M-70): from a new id to
//! ESTABLISHED, resolve_addr, resolve_route, the QP's creation and the
//! REQ/REP/RTU handshake included, between a client on 127.0.0.1 and a
//! server on 127.0.0.2 that accepts on its own thread. The target is a
//! median under 1 ms.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use softroce::cm::{CmEventKind, CmId, CmOptions, ConnParam, EventChannel, PortSpace};
use softroce::verbs::{Context, ContextOptions, Device, QpType};

const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const STEP: Duration = Duration::from_secs(10);
/// Connections each side keeps before it lets the oldest go, so that
/// tearing one down is not part of what is timed.
const KEPT: usize = 32;
/// At most one connection a millisecond: each one closed waits out TimeWait
/// (about 2 s) in the protocol's table, which holds 4096.
const PACE: Duration = Duration::from_millis(1);

fn open(name: &str, ip: IpAddr, port: u16) -> (Context, EventChannel) {
    let device = Device::custom(name, vec![ip], [2, 0, 0, 0, 0, 1], 65536);
    let context = Context::open(&device, ContextOptions { port, ..ContextOptions::default() }).unwrap();
    let channel = EventChannel::with_options(CmOptions::with_context(&context)).unwrap();
    (context, channel)
}

fn params() -> ConnParam {
    ConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..ConnParam::default() }
}

/// Accepts every request, with a QP, until `stop`.
fn serve(context: Context, channel: EventChannel, stop: Arc<AtomicBool>) {
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(1024, None).unwrap();
    let mut kept = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let Some(event) = channel.get_event(Some(Duration::from_millis(50))) else { continue };
        if event.kind == CmEventKind::ConnectRequest {
            let qp = event.id.create_qp(pd.create_qp(QpType::Rc, &cq)).unwrap();
            event.id.accept(&params()).unwrap();
            kept.push_back((event.id, qp));
            if kept.len() > KEPT {
                kept.pop_front();
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let port = softroce::net::udp::free_port(&[CLIENT, SERVER]).unwrap();
    let (client, client_events) = open("bench_cm_client", CLIENT, port);
    let (server, server_events) = open("bench_cm_server", SERVER, port);
    let listener = CmId::new(&server_events, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(SERVER, 0)).unwrap();
    listener.listen(64).unwrap();
    let to = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let server_thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || serve(server, server_events, stop))
    };

    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(1024, None).unwrap();
    let mut kept = VecDeque::new();
    let mut group = c.benchmark_group("cm");
    group.sample_size(20).measurement_time(Duration::from_secs(4));
    group.bench_function("connection_setup", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let id = CmId::new(&client_events, PortSpace::Tcp).unwrap();
                id.resolve_addr(None, to, STEP).unwrap();
                wait(&client_events, &id, CmEventKind::AddrResolved);
                id.resolve_route(STEP).unwrap();
                wait(&client_events, &id, CmEventKind::RouteResolved);
                let qp = id.create_qp(pd.create_qp(QpType::Rc, &cq)).unwrap();
                id.connect(&params()).unwrap();
                wait(&client_events, &id, CmEventKind::Established);
                let took = start.elapsed();
                total += took;
                std::thread::sleep(PACE.saturating_sub(took));
                kept.push_back((id, qp));
                if kept.len() > KEPT {
                    kept.pop_front();
                }
            }
            total
        })
    });
    group.finish();
    stop.store(true, Ordering::Relaxed);
    server_thread.join().unwrap();
}

/// Waits for `kind` about `id`, passing over what the teardown of earlier
/// connections reports.
fn wait(channel: &EventChannel, id: &CmId, kind: CmEventKind) {
    loop {
        let event = channel.get_event(Some(STEP)).expect("an event");
        if event.id.same_as(id) {
            assert_eq!((event.kind, event.status), (kind, 0));
            return;
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
