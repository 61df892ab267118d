//! The links on loopback (rxe-spec/verbs.md "The UDP link" and "The raw
//! link", rxe-spec/wire.md "GSO trains"). Apart from the busy tests: a raw
//! link sees every packet on `lo`, and other tests' traffic would crowd it.

mod raw_link;
mod shared_port;
mod udp_link;
