//! The device's data in flight, within what its peers take in (rxe-spec
//! T-7a).
//!
//! A device's RC requesters send into one socket buffer at a peer on this
//! host, and the kernel drops what overflows it: each drop costs the QP a
//! go-back, its resends overflow the buffer again, and with thousands of
//! QPs the retries run out (congestion collapse). Each QP's window is a
//! share of the buffer, but a window has a floor of a few packets, so past
//! a few hundred QPs the floors alone overflow it; and a slow peer (kernel
//! rxe in an emulated VM) queues far less than the buffer before the QPs
//! at the back of its queue time out.
//!
//! So the budget charges every request packet on the wire to the device,
//! at what the kernel charges the receiver for it. It starts at rxe's
//! window, grows by what ACKs free while round trips are short and halves
//! on a long one, a timeout or a loss, never past the device's own socket
//! buffer.
//! A QP with new packets and no room waits in a first-come, first-served
//! line, and the room an ACK frees goes to the front of it, one turn
//! ([`TURN_BYTES`]) per QP, the turn's last packet asking for the ACK that
//! frees it. Resends are never held: they were charged when first sent, and
//! a QP that cannot resend cannot free its room.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::threaded::{replace_bool, replace_u64, replace_usize, QpCell};
use crate::transport::{buffer_charge, Qp, QpType, MAX_UNACKED_PSNS};

/// New bytes a QP sends per turn while others wait for room: one 64 KiB
/// message at MTU 4096, so that a turn around 4096 QPs takes a tenth of a
/// second at 3 GB/s.
pub(super) const TURN_BYTES: usize = 64 << 10;

/// Quarters of the peer's receive buffer the device's packets in flight may
/// take while QPs take turns. [`buffer_charge`] is what a packet of a long
/// train costs the receiver, and streams of a few QPs leave in long trains;
/// turns leave in short ones, which cost more (a lone packet up to twice its
/// bytes). With the whole buffer, 4096 QPs taking turns still lost packets
/// to it (145 timeouts in half a second); with three quarters, none. A few
/// QPs keep the whole buffer, which T-7's windows were measured against.
const TURNS_QUARTERS: usize = 3;

/// The budget a device starts with, and the least it falls to: rxe's window
/// of 128 packets at MTU 4096, what one QP sends before its first ACK.
const FLOOR_BYTES: usize = MAX_UNACKED_PSNS as usize * buffer_charge(4096);

/// The least time between two cuts of the budget: the QPs that report one
/// congestion at once cut it once.
const CUT_EVERY: Duration = Duration::from_millis(10);

#[derive(Debug)]
pub(super) struct SendBudget {
    /// Bytes of receive buffer the device's packets in flight may take
    /// at most; `None` where the link has no receive buffer to go by.
    limit: Option<usize>,
    /// What they may take now (three quarters of it while QPs wait in
    /// line): from [`FLOOR_BYTES`] it grows by what ACKs free while round
    /// trips are short, and halves on a long one, a timeout or a loss.
    cap: usize,
    /// When `cap` was last cut.
    cut_at: Option<Duration>,
    /// Bytes the device's packets in flight take now, as the QPs' last
    /// visits left them.
    in_flight: usize,
    /// QPs with new packets waiting for room, oldest first.
    line: VecDeque<Arc<QpCell>>,
}

impl SendBudget {
    /// A budget for the device whose own socket holds `receive_buffer`
    /// bytes (its peers' on this host hold as much).
    pub(super) fn new(receive_buffer: Option<usize>) -> SendBudget {
        let cap = receive_buffer.map_or(0, |bytes| bytes.min(FLOOR_BYTES));
        SendBudget { limit: receive_buffer, cap, cut_at: None, in_flight: 0, line: VecDeque::new() }
    }

    /// Each window's share of the buffer, among `sharing` QPs with packets
    /// in flight (rxe-spec T-7): the windows together fill the budget, and
    /// the line forms only when their floors overflow it.
    pub(super) fn share(&self, sharing: usize) -> Option<usize> {
        self.limit.map(|_| self.cap / sharing.max(1))
    }

    /// New packets of `qp`'s MTU the buffer has room for.
    fn room(&self, qp: &Qp) -> Option<u32> {
        if self.limit.is_none() || qp.qp_type() != QpType::Rc {
            return None;
        }
        let limit = if self.line.is_empty() { self.cap } else { self.cap / 4 * TURNS_QUARTERS };
        let packets = limit.saturating_sub(self.in_flight) / buffer_charge(qp.attr().path_mtu.bytes());
        Some(u32::try_from(packets).unwrap_or(u32::MAX))
    }

    /// Before `qp` sends: how many new packets it may. One `served` from
    /// the line gets a turn; while others wait, one that is not finishes
    /// the turn it has (at most a turn's worth) and then joins them;
    /// otherwise it may fill the room.
    pub(super) fn admit(&self, qp: &mut Qp, served: bool) {
        let Some(room) = self.room(qp) else {
            qp.set_allowance(None);
            return;
        };
        let turn = (TURN_BYTES / qp.attr().path_mtu.bytes()).max(1) as u32;
        let wanted = if served {
            Some(room.min(turn))
        } else if self.line.is_empty() {
            // No limit where the window holds it to less than the room: a
            // limit would only end its packets with needless AckReqs.
            (room < qp.window_space()).then_some(room)
        } else {
            Some(qp.allowance().map_or(0, |left| left.min(turn)))
        };
        // A QP stopped with packets out that nothing asked an ACK for would
        // wait for its ACK timeout: its next new packet asks, and ends it.
        let allowance = match wanted {
            Some(0) if qp.has_unasked_in_flight() => Some(1),
            wanted => wanted,
        };
        qp.set_allowance(allowance);
    }

    /// After a visit of `cell`'s QP at `now`: charges what it has in flight,
    /// moves the cap by what its round trips say, and puts it in line if it
    /// was held back with new packets to send.
    pub(super) fn settle(&mut self, cell: &Arc<QpCell>, qp: &Qp, now: Duration) {
        let Some(limit) = self.limit else { return };
        let charge = buffer_charge(qp.attr().path_mtu.bytes()) * qp.packets_in_flight() as usize;
        let before = replace_usize(&cell.marks.charged, charge);
        self.in_flight = self.in_flight + charge - before;
        // The peer's queue is the device's: a QP's long round trip, its
        // timeout or a packet lost says the device sends more than the peer
        // takes in (or than processes sharing its port leave room for).
        let c = qp.counters();
        let losses = c.timeouts + c.seq_naks_received;
        let lost = replace_u64(&cell.marks.losses, losses) < losses;
        let fast = qp.peer_is_fast();
        if lost || (fast == Some(false) && charge > 0) {
            if self.cut_at.is_none_or(|at| now >= at + CUT_EVERY) {
                self.cap = (self.cap / 2).max(FLOOR_BYTES.min(limit));
                self.cut_at = Some(now);
            }
        } else if fast == Some(true) && before > charge {
            // Doubles per round trip while the peer keeps up, as windows do (T-7).
            self.cap = (self.cap + before - charge).min(limit);
        }
        if qp.allowance() == Some(0) && qp.unsent_packets(1) > 0 && !replace_bool(&cell.marks.in_line, true) {
            self.line.push_back(Arc::clone(cell));
        }
    }

    /// `cell`'s QP was destroyed: what it had in flight no longer counts.
    pub(super) fn release(&mut self, cell: &QpCell) {
        self.in_flight -= replace_usize(&cell.marks.charged, 0);
    }

    /// Whether no QP waits in line for room.
    pub(super) fn line_is_empty(&self) -> bool {
        self.line.is_empty()
    }

    /// The QP at the front of the line (destroyed ones leave it as they
    /// come up).
    pub(super) fn next_in_line(&mut self) -> Option<Arc<QpCell>> {
        while let Some(cell) = self.line.pop_front() {
            cell.marks.in_line.store(false, Ordering::Relaxed);
            if !cell.marks.destroyed.load(Ordering::Acquire) {
                return Some(cell);
            }
        }
        None
    }

    /// Puts `cell`, taken from the line when the buffer had no room for
    /// its next packet, back at the front.
    pub(super) fn keep_first(&mut self, cell: Arc<QpCell>) {
        cell.marks.in_line.store(true, Ordering::Relaxed);
        self.line.push_front(cell);
    }

    /// Whether the buffer has room for a new packet of `qp`.
    pub(super) fn has_room(&self, qp: &Qp) -> bool {
        self.room(qp) != Some(0)
    }
}
