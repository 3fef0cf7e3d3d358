//! Process-wide kernel settings the balancer and the lab need: the open-files limit, timer
//! precision and priority of a forwarding thread, the signal a child gets when its parent dies,
//! and signals to a child by PID.

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

/// Sets the calling thread's timer slack to 1 ns so that its sleeps (`ppoll`) end on time, and
/// gives it a real-time priority (`SCHED_FIFO` 20; best effort: ignored without the right) so
/// that a busy machine does not delay it by milliseconds. Only for threads that sleep between
/// short bursts of work (the lab's link emulator): they cannot starve the machine.
pub fn precise_timers() {
    // SAFETY: prctl with integer arguments; pthread_setschedparam on this thread with a valid
    // param.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
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
}
