//! The calling thread's timer slack (`prctl(PR_SET_TIMERSLACK)`): how late the kernel may wake a
//! sleeping thread to batch wake-ups. The default, 50 us, would turn the data plane's short
//! batching waits (`batch_wait_us`, tens of microseconds) into waits of 50 us or more.

use std::io;

/// Sets the calling thread's timer slack to `ns` nanoseconds (at least 1; 0 would mean "back to
/// the default").
pub fn set_timer_slack(ns: u64) -> io::Result<()> {
    let ns = ns.max(1) as libc::c_ulong;
    // SAFETY: PR_SET_TIMERSLACK takes the value as an unsigned long; the other arguments are
    // unused.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's timer slack, nanoseconds.
pub fn timer_slack() -> io::Result<u64> {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the value.
    let rc = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_is_set_per_thread() {
        std::thread::spawn(|| {
            set_timer_slack(1000).unwrap();
            assert_eq!(timer_slack().unwrap(), 1000);
            set_timer_slack(0).unwrap();
            assert_eq!(timer_slack().unwrap(), 1, "0 is raised to 1 ns");
        })
        .join()
        .unwrap();
    }
}
