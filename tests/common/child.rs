//! This test binary, run again as a child process.
//!
//! A child starts with a fresh process: what it reads once per process (an environment
//! variable), or what every test of a binary moves at once (the RSS, the epoch and its
//! pending frees, the global pool), is then its own. [`Rerun`] builds the command and checks
//! the output; [`run_alone`] runs one test in a process of its own, so no other test runs
//! beside it and the test needs no lock.

use std::ffi::OsStr;
use std::process::{Command, Output};

/// Set in a child started by [`run_alone`]: the name of the test it runs.
const ALONE: &str = "NDMEM_TEST_ALONE";

/// The harness's name of test function `$test` of the calling module (`module::test`), as
/// [`Rerun::test`] and [`run_alone`] take it. The function must exist.
macro_rules! test_name {
    ($test:ident) => {{
        let _: fn() = $test;
        $crate::common::child::within_crate(concat!(module_path!(), "::", stringify!($test)))
    }};
}
pub(crate) use test_name;

/// `path` without its first segment (the test crate's name), as the test harness names it.
pub(crate) fn within_crate(path: &'static str) -> &'static str {
    path.split_once("::").map_or(path, |(_, rest)| rest)
}

/// A command running this test binary again.
pub(crate) struct Rerun {
    command: Command,
    /// The one test run, when the binary has the test harness.
    test: Option<String>,
    /// The environment variables set, for the message of a failure.
    env: Vec<String>,
}

impl Rerun {
    /// This binary with no arguments: for a `harness = false` binary, which picks what to
    /// run from the environment.
    pub(crate) fn binary() -> Self {
        Rerun {
            command: Command::new(std::env::current_exe().unwrap()),
            test: None,
            env: Vec::new(),
        }
    }

    /// This binary running only `test` (its full name, see [`test_name!`]), ignored or not.
    pub(crate) fn test(test: &str) -> Self {
        let mut rerun = Self::binary();
        rerun.command.args(["--exact", test, "--include-ignored"]);
        rerun.test = Some(test.to_owned());
        rerun
    }

    /// Sets an environment variable of the child.
    pub(crate) fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        let (key, value) = (key.as_ref(), value.as_ref());
        self.env
            .push(format!("{}={:?}", key.to_string_lossy(), value));
        self.command.env(key, value);
        self
    }

    /// Runs the child to its end.
    pub(crate) fn output(mut self) -> Output {
        self.command.output().unwrap()
    }

    /// Runs the child and checks that it succeeded and, for [`Rerun::test`], that the one
    /// test ran and passed (a name that matches nothing passes with 0 tests).
    pub(crate) fn passes(self) -> Output {
        let (test, env) = (self.test.clone(), self.env.join(" "));
        let out = self.output();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ran = test.is_none() || stdout.contains("test result: ok. 1 passed");
        assert!(
            out.status.success() && ran,
            "child {test:?} with {env}: {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// Runs test `test` (its full name, see [`test_name!`]) again in a process of its own and
/// checks that it passed there. Returns true in the calling process, whose test is then
/// done, and false in the child, where the test's body runs alone:
///
/// ```ignore
/// if common::child::run_alone(common::test_name!(this_test)) {
///     return;
/// }
/// ```
pub(crate) fn run_alone(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some_and(|running| running == test) {
        return false;
    }
    Rerun::test(test).env(ALONE, test).passes();
    true
}
