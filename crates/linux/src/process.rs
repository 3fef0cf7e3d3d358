//! Process and thread settings: the open-files limit, a thread's timer slack (`PR_SET_TIMERSLACK`:
//! how late the kernel may wake a sleeping thread to batch wake-ups; the default 50 us would turn
//! the tunnel's batching waits of tens of microseconds into 50 us or more) and priority, the
//! signal a child gets when its parent dies, and signals to a child by PID.

use std::io;

/// Raises the soft open-files limit (`RLIMIT_NOFILE`) to the hard one (the usual soft default
/// of 1024 caps a proxy at about 500 concurrent TCP clients). Returns the soft limit in force
/// afterwards (1024 if it cannot be read).
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim = want;
            } else {
                tracing::debug!("could not raise the open-files limit");
            }
        }
    }
    lim.rlim_cur
}

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

/// Sets the calling thread's timer slack to 1 ns so that its sleeps (`ppoll`) end on time, and
/// gives it a real-time priority (`SCHED_FIFO` 20; best effort: ignored without the right) so
/// that a busy machine does not delay it by milliseconds. Only for threads that sleep between
/// short bursts of work (the lab's link emulator): they cannot starve the machine.
pub fn precise_timers() {
    // SAFETY: pthread_setschedparam on this thread with a valid param.
    let _ = set_timer_slack(1);
    unsafe {
        let param = libc::sched_param { sched_priority: 20 };
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param);
    }
}

/// Asks the kernel to send this process SIGTERM when its parent dies. Async-signal-safe: meant
/// for `CommandExt::pre_exec`, so that a child never outlives the process that started it.
pub fn terminate_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGTERM as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends SIGTERM to process `pid` (a child of ours, not yet reaped: the PID is still ours).
pub fn terminate(pid: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "PID out of range"))?;
    // SAFETY: kill with integer arguments.
    if unsafe { libc::kill(pid, libc::SIGTERM) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process runs as root (effective UID 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_limit_after_raising_is_the_hard_limit() {
        let soft = raise_fd_limit();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the struct we pass.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(soft, lim.rlim_cur);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
    }

    #[test]
    fn terminate_refuses_a_pid_out_of_range() {
        assert_eq!(
            terminate(u32::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

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
