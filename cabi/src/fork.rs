//! fork() support, which softroce does not need.
//!
//! rdma-core marks registered memory `MADV_DONTFORK` so a child's copy-on-write cannot move
//! pages under the device's DMA. softroce reads and writes registered memory with the CPU, from
//! the owning process, so a fork leaves nothing to protect: these succeed and do nothing.

use std::os::raw::{c_int, c_void};

use crate::sys::{ibv_fork_status, IBV_FORK_UNNEEDED};

#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
symver!(ibv_dofork_range);

#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
symver!(ibv_dontfork_range);

#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}
symver!(ibv_fork_init);

#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}
symver!(ibv_is_fork_initialized);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_is_unneeded() {
        // SAFETY: none of them reads its arguments.
        unsafe {
            assert_eq!(ibv_fork_init(), 0);
            assert_eq!(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
            let mut page = [0u8; 64];
            assert_eq!(ibv_dontfork_range(page.as_mut_ptr().cast(), page.len()), 0);
            assert_eq!(ibv_dofork_range(page.as_mut_ptr().cast(), page.len()), 0);
        }
    }
}
