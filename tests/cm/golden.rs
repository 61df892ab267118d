//! The kernel's own MADs (tests/data/cm/rping.pcap, see its README) against
//! the protocol.
