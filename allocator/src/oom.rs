//! A ready-made heap OOM hook for programs that would rather stop with one line than
//! abort: [`exit_on_oom`].
//!
//! Invariant: nothing here allocates (the heap is what just ran out) or unwinds (the hook
//! runs inside `GlobalAlloc::alloc`): the line is formatted into a stack buffer, written
//! with write(2), and the process ends with `_exit`.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::fmt::{self, Write as _};

use crate::error::ByteSize;
use crate::limits::ENV_MAX_HEAP;
use crate::tracking::HeapStats;

/// Writes one line on stderr naming the request, the limit and the live bytes, and ends
/// the process with exit status 1, instead of the abort that follows a refused allocation.
/// Install it with [`crate::heap::set_oom_hook`]:
///
/// ```no_run
/// ndmem_alloc::heap::set_oom_hook(ndmem_alloc::heap::exit_on_oom);
/// ```
///
/// The line reads `ndmem: heap limit reached: a request of 64.0 KiB would exceed
/// NDMEM_MAX_HEAP=1.00 MiB (1000.0 KiB held against it, 980.0 KiB of it live as last
/// published); raise NDMEM_MAX_HEAP`, or, for a limit set by [`crate::heap::set_limit`],
/// `... would exceed the heap limit of 1.00 MiB set by heap::set_limit (...); raise it
/// there`. The bytes held are exact (the budget the limit is checked against: live bytes
/// and what threads hold unspent); the live figure is as of each thread's last
/// publication, so other threads' recent allocations may be missing from it (see
/// [`crate::heap`]). (The request of a reallocation is its new size.) On a terminal it first
/// clears the current line (a progress bar, say). Destructors and `atexit` handlers do not
/// run: nothing that could need the heap runs after it.
///
/// The hook runs on every refusal, a fallible request's too (a global allocator cannot
/// tell `Vec::try_reserve` from `Vec::reserve`): with it installed, a refused
/// `try_reserve` ends the process instead of returning its error.
pub fn exit_on_oom(layout: Layout, stats: &HeapStats) {
    // One line, however many threads are refused at once: the first to get here writes
    // it and ends the process; the others wait for the end.
    static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if EXITING.swap(true, std::sync::atomic::Ordering::AcqRel) {
        loop {
            // SAFETY: pause(2) takes no arguments; the thread sleeps until the first
            // thread's _exit ends the process.
            unsafe { libc::pause() };
        }
    }
    let mut line = StackLine::default();
    // SAFETY: isatty only inspects file descriptor 2.
    if unsafe { libc::isatty(2) } == 1 {
        let _ = line.write_str("\r\x1b[2K");
    }
    let _ = describe(
        &mut line,
        layout,
        stats,
        crate::tracking::limit_set_in_code(),
        crate::tracking::heap::system_refused(),
    );
    line.finish();
    // SAFETY: the bytes are a live stack buffer that write(2) only reads; _exit ends the
    // process at once, which is sound from any thread.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::_exit(1);
    }
}

/// The text of [`exit_on_oom`]'s line, without the newline.
/// `in_code`: the limit was set by `heap::set_limit`, not by the variable.
fn describe(
    out: &mut impl fmt::Write,
    layout: Layout,
    stats: &HeapStats,
    in_code: bool,
    by_system: bool,
) -> fmt::Result {
    // The system refused with the limit not reached: the limit is not the reason.
    let limit = if by_system { None } else { stats.limit };
    match limit {
        Some(limit) if in_code => write!(
            out,
            "ndmem: heap limit reached: a request of {} would exceed the heap limit of {} set \
             by heap::set_limit ({}); raise it there",
            ByteSize(layout.size()),
            ByteSize(limit),
            Held(stats)
        ),
        Some(limit) => write!(
            out,
            "ndmem: heap limit reached: a request of {} would exceed {ENV_MAX_HEAP}={} ({}); \
             raise {ENV_MAX_HEAP}",
            ByteSize(layout.size()),
            ByteSize(limit),
            Held(stats)
        ),
        None => write!(
            out,
            "ndmem: out of memory: the system refused {} ({} of heap live)",
            ByteSize(layout.size()),
            ByteSize(stats.live_bytes)
        ),
    }
}

/// What a refused request found held against the heap limit: the exact reservation, and
/// the live bytes as published (which lag other threads' latest allocations).
struct Held<'a>(&'a HeapStats);

impl fmt::Display for Held<'_> {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stats = self.0;
        write!(
            out,
            "{} held against it, {} of it live as last published",
            ByteSize(stats.reserved_bytes.max(stats.live_bytes)),
            ByteSize(stats.live_bytes)
        )
    }
}

/// A fixed-size line buffer: text past its end is dropped, and it always ends with a
/// newline.
struct StackLine {
    bytes: [u8; 256],
    len: usize,
}

impl Default for StackLine {
    fn default() -> StackLine {
        StackLine {
            bytes: [0; 256],
            len: 0,
        }
    }
}

impl StackLine {
    /// Ends the line with a newline, overwriting the last byte when the buffer is full.
    fn finish(&mut self) {
        let at = self.len.min(self.bytes.len() - 1);
        self.bytes[at] = b'\n';
        self.len = at + 1;
    }
}

impl fmt::Write for StackLine {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let take = text.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + take].copy_from_slice(&text.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_line_truncates_and_always_ends_with_a_newline() {
        let mut line = StackLine::default();
        write!(line, "{} of {}", ByteSize(2048), 7).unwrap();
        line.finish();
        assert_eq!(&line.bytes[..line.len], b"2.00 KiB of 7\n");
        let mut line = StackLine::default();
        for _ in 0..100 {
            line.write_str("abcdef").unwrap();
        }
        line.finish();
        assert_eq!(line.len, 256);
        assert_eq!(line.bytes[255], b'\n');
        assert_eq!(line.bytes[254], b'c'); // byte 254 of "abcdef" repeated
    }

    #[test]
    fn the_line_names_request_limit_live_and_variable() {
        let stats = HeapStats {
            live_bytes: 1000,
            reserved_bytes: 1000 << 10, // shown as 1000.0 KiB
            limit: Some(1 << 20),
            ..HeapStats::default()
        };
        let request = Layout::from_size_align(65536, 8).unwrap();
        let mut line = StackLine::default();
        describe(&mut line, request, &stats, false, false).unwrap();
        let text = std::str::from_utf8(&line.bytes[..line.len]).unwrap();
        assert_eq!(
            text,
            "ndmem: heap limit reached: a request of 64.0 KiB would exceed NDMEM_MAX_HEAP=1.00 \
             MiB (1000.0 KiB held against it, 1000 B of it live as last published); raise \
             NDMEM_MAX_HEAP"
        );
        let mut line = StackLine::default();
        describe(&mut line, request, &stats, true, false).unwrap();
        let text = std::str::from_utf8(&line.bytes[..line.len]).unwrap();
        assert_eq!(
            text,
            "ndmem: heap limit reached: a request of 64.0 KiB would exceed the heap limit of \
             1.00 MiB set by heap::set_limit (1000.0 KiB held against it, 1000 B of it live as \
             last published); raise it there"
        );
        let unlimited = HeapStats {
            limit: None,
            ..stats
        };
        let mut line = StackLine::default();
        describe(
            &mut line,
            Layout::from_size_align(16, 8).unwrap(),
            &unlimited,
            false,
            false,
        )
        .unwrap();
        assert!(std::str::from_utf8(&line.bytes[..line.len])
            .unwrap()
            .contains("the system refused 16 B"));
        // Under a limit with room, the system refused: the line says so and does not
        // advise raising the limit.
        for in_code in [false, true] {
            let mut line = StackLine::default();
            describe(&mut line, request, &stats, in_code, true).unwrap();
            let text = std::str::from_utf8(&line.bytes[..line.len]).unwrap();
            assert!(text.contains("the system refused 64.0 KiB"), "{text}");
            assert!(!text.contains("limit") && !text.contains("raise"), "{text}");
        }
    }
}
