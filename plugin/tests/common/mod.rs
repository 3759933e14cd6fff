//! Helpers the privileged test files share.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Waits for `child` at most `within`; past it the child is killed and the test fails, saying
/// `what` did not end (a hung child must never hang the test run).
pub fn wait_within(child: &mut Child, within: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child
            .try_wait()
            .unwrap_or_else(|e| panic!("wait for {what}: {e}"))
        {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {within:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
