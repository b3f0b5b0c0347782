//! Waiting for a forked child, with a deadline.

#![allow(unsafe_code)]

use std::time::{Duration, Instant};

/// Waits up to `limit` for the child `pid` to end: `Some(status)` (as `waitpid` gives it)
/// if it did; `None` if it was still running, in which case it is killed and reaped.
pub(crate) fn wait_or_kill(pid: libc::pid_t, limit: Duration) -> Option<libc::c_int> {
    let start = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: `pid` is this process's child; `status` is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether a child's `waitpid` status says it was ended by `SIGKILL` (how the fork tests'
/// children end themselves: running nothing of the parent's, not even a leak check).
pub(crate) fn killed(status: libc::c_int) -> bool {
    libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL
}
