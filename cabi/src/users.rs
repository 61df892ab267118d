//! How many objects use a verbs object (the QPs on a CQ, everything in a
//! PD), so that destroying it while they do fails with `EBUSY`, as the
//! kernel's destroy does, instead of leaving them pointing at freed memory.

use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Users(AtomicU32);

impl Users {
    /// An object was made on this one.
    pub(crate) fn hold(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// An object made on this one was destroyed.
    pub(crate) fn release(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether anything still uses it.
    pub(crate) fn busy(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}
