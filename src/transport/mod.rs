//! The RC, UC and UD transport as a sans-IO state machine.
//!
//! A [`Qp`] has no sockets, no threads and no clock. The caller feeds it work
//! requests ([`Qp::post_send`], [`Qp::post_recv`]), received packets
//! ([`Qp::handle_packet`]) and the current time ([`Qp::handle_timeout`]), and
//! drains packets to send ([`Qp::poll_transmit`], in a [`TransmitOrder`]),
//! completions ([`Qp::poll_completion`]), asynchronous events
//! ([`Qp::poll_event`]) and the next deadline ([`Qp::poll_timeout`]). Memory is reached only through
//! the [`Memory`] trait, where every access is checked. This is what makes
//! deterministic tests, fuzzing and teaching possible.

pub mod attr;
pub mod memory;
mod qp;
mod queue;
pub mod srq;
mod timer;
pub mod types;

pub use attr::{AttrMask, ModifyError, Mtu, QpAttr, QpState};
pub use memory::{AtomicOp, KeyUser, Lent, MemError, Memory, MemoryTable, Region, WindowType};
pub use qp::{
    buffer_charge, grh_area, Counters, FatalNaks, PostSendError, Qp, QpCap, TransmitOrder, ACK_ASK_DELAY, GRH_LEN,
    MAX_PKTS_PER_ACK, MAX_UNACKED_PSNS, MAX_WINDOW_PSNS, PIECED_READS,
};
pub use queue::{CqKind, Incoming, Transmit, TRANSMIT_HEADROOM};
pub use srq::{PostRecvError, Srq};
pub use timer::MIN_ACK_TIMEOUT;
pub use types::*;
