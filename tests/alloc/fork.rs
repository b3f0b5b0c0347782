//! `fork` beside threads using the pool: a child never inherits a lock another thread held.

#![allow(unsafe_code)]

use ndmem_alloc::{Limits, Pool};

use crate::common::forked::{killed, wait_or_kill};
use crate::{pool_with, MIB};

#[test]
fn a_fork_beside_a_thread_carving_blocks_leaves_the_child_a_usable_pool() {
    // The small classes' slabs are guarded by locks; a child forked while another thread
    // held one would inherit it held and hang on its first block from the OS.
    use std::sync::atomic::{AtomicBool, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    let churn = std::thread::spawn(|| {
        let pool = pool_with(64 * MIB);
        while !STOP.load(Ordering::Relaxed) {
            let blocks: Vec<_> = (0..64)
                .map(|_| pool.allocate(1 << 10, 16).unwrap())
                .collect();
            drop(blocks);
            pool.trim(); // every block back to its slab, the slab to the OS
        }
    });
    let mut hung = 0;
    for _ in 0..40 {
        // SAFETY: the child only takes blocks from a new pool and kills itself.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let pool = Pool::new(Limits::unlimited());
            let block = pool.allocate(1 << 10, 16);
            let code = if block.is_ok_and(|b| b.as_slice().iter().all(|x| *x == 0)) {
                libc::SIGKILL
            } else {
                libc::SIGABRT
            };
            // SIGKILL ends the child running nothing of the parent's (nor a leak check).
            // SAFETY: signals this process, the forked child.
            unsafe { libc::kill(libc::getpid(), code) };
        }
        match wait_or_kill(pid, std::time::Duration::from_secs(10)) {
            Some(status) => assert!(killed(status), "child status {status}"),
            None => hung += 1,
        }
    }
    STOP.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert_eq!(
        hung, 0,
        "children stuck after a fork beside a thread carving blocks"
    );
}
