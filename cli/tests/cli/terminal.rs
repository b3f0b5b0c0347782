//! Manners at a terminal and a pipe: a closed pipe ends the command quietly, every line of
//! output fits 80 columns, and no stale progress line stays on a terminal when stdout goes
//! elsewhere.

use std::io::{BufRead, BufReader, Read};

use super::*;

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let dir = temp_dir("pipe");
    // `ndmem --steps 300 | head -1`: the reader takes the first line and goes away; the
    // run goes on, writes its reports and exits 0, without a word on stderr.
    let mut child = command(&dir, &["--steps", "300"], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("ndmem train: "), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    assert!(dir.join("ndmem-report.json").is_file() && dir.join("ndmem-report.svg").is_file());

    // `ndmem report x.json -o y.svg | head -0`: the pipe is closed before any output.
    let mut child = command(&dir, &["report", "ndmem-report.json", "-o", "y.svg"], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    assert!(dir.join("y.svg").is_file());
}

#[test]
fn every_line_of_output_fits_80_columns() {
    let dir = temp_dir("columns");
    let mut outputs = vec![("train".to_string(), short_run(&dir))];
    for args in [
        &["report", "ndmem-report.json", "-o", "again.svg"][..],
        &["limits"],
    ] {
        let out = ndmem(&dir, args, &[("NDMEM_MAX_DEVICE_BYTES", "50%")]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        outputs.push((args[0].to_string(), text(&out.stdout)));
    }
    let out = ndmem(
        &dir,
        &["--steps", "1", "--mode", "workspaces"],
        &[("NDMEM_WORKSPACES", "spill_everything")],
    );
    outputs.push(("one step".to_string(), text(&out.stdout)));
    for (what, stdout) in outputs {
        for line in stdout.lines() {
            assert!(
                line.chars().count() <= 80,
                "{what}: {} columns: {line}",
                line.chars().count()
            );
        }
    }
}

/// A terminal screen, enough of one to replay what the progress bars write: printable
/// characters, carriage return, line feed, and the CSI sequences for cursor up/down,
/// column, and erasing a line or the screen below.
#[derive(Debug, Default)]
struct Screen {
    lines: Vec<Vec<char>>,
    row: usize,
    column: usize,
}

impl Screen {
    /// Replays `bytes` (UTF-8 text with escape sequences).
    fn feed(&mut self, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\r' => self.column = 0,
                '\n' => self.row += 1,
                '\x1b' => {
                    if chars.peek() != Some(&'[') {
                        chars.next();
                        continue;
                    }
                    chars.next();
                    let mut parameter = String::new();
                    let mut last = ' ';
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() || c == '~' {
                            last = c;
                            break;
                        }
                        parameter.push(c);
                    }
                    let n: usize = parameter.parse().unwrap_or(0);
                    self.csi(last, n, &parameter);
                }
                c if c.is_control() => {}
                c => {
                    let column = self.column;
                    let line = self.line();
                    if line.len() < column {
                        line.resize(column, ' ');
                    }
                    if column < line.len() {
                        line[column] = c;
                    } else {
                        line.push(c);
                    }
                    self.column += 1;
                }
            }
        }
    }

    /// One CSI sequence ending in `last`, with numeric parameter `n`.
    fn csi(&mut self, last: char, n: usize, parameter: &str) {
        match last {
            'A' => self.row = self.row.saturating_sub(n.max(1)),
            'B' => self.row += n.max(1),
            'G' => self.column = n.saturating_sub(1),
            'K' => {
                let column = self.column;
                let line = self.line();
                match n {
                    1 => line.iter_mut().take(column + 1).for_each(|c| *c = ' '),
                    2 => line.clear(),
                    _ => line.truncate(column),
                }
            }
            'J' if !parameter.starts_with('?') => {
                let column = self.column;
                self.line().truncate(column);
                let row = self.row;
                self.lines.truncate(row + 1);
            }
            _ => {}
        }
    }

    /// The line under the cursor.
    fn line(&mut self) -> &mut Vec<char> {
        if self.lines.len() <= self.row {
            self.lines.resize(self.row + 1, Vec::new());
        }
        &mut self.lines[self.row]
    }

    /// The visible text, one string per non-blank line.
    fn visible(&self) -> Vec<String> {
        self.lines
            .iter()
            .map(|l| l.iter().collect::<String>().trim_end().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }
}

/// Runs the command with stderr on a new 80x24 pseudo-terminal and stdout piped; returns
/// stdout and everything written to the terminal.
#[allow(unsafe_code)]
fn with_terminal_stderr(dir: &Path, args: &[&str]) -> (Output, Vec<u8>) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into the locals and reads `size`; the name
    // and terminal settings are null (not wanted, defaults).
    let status = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(status, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and are owned by nothing else.
    let (master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    };
    let child = {
        let mut command = command(dir, args, &[]);
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::from(slave))
            .spawn()
            .unwrap()
        // The command, and with it the parent's copy of the terminal's slave side, drops
        // here: the master reads end of file (EIO) once the child has exited.
    };
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match master.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            }
        }
        bytes
    });
    let out = child.wait_with_output().unwrap();
    (out, reader.join().unwrap())
}

#[test]
fn no_stale_progress_line_stays_when_stdout_goes_elsewhere() {
    let dir = temp_dir("terminal");
    let (out, terminal) = with_terminal_stderr(&dir, &["--steps", "400", "--hidden", "8"]);
    assert!(out.status.success(), "{}", text(&terminal));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("loss curves identical"), "{stdout}");
    let mut screen = Screen::default();
    screen.feed(&terminal);
    let visible = screen.visible();
    assert!(
        visible.is_empty(),
        "left on the terminal: {visible:?} (raw: {:?})",
        text(&terminal)
    );
}

#[test]
fn the_screen_replays_what_a_terminal_shows() {
    let mut screen = Screen::default();
    screen.feed(b"abc\r\nde\x1b[1A\rX\x1b[2B\rlast\x1b[1A\x1b[2K");
    assert_eq!(
        screen.visible(),
        vec!["Xbc".to_string(), "last".to_string()]
    );
    let mut screen = Screen::default();
    screen.feed(b"one\r\ntwo\r\n\x1b[2A\x1b[J");
    assert!(screen.visible().is_empty(), "{:?}", screen.visible());
}
