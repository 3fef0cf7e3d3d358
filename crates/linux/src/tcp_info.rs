//! What the kernel's TCP knows of one of its connections (`TCP_INFO`, and BBR's own state from
//! `TCP_CC_INFO`), for the lab's sender: the round trip it measures, the minimum it sizes its
//! window by, its window and rates. A flow that slows down without loss (BBR whose round trip grew
//! beyond twice the minimum it keeps) shows why here and nowhere else.
//!
//! `libc::tcp_info` is the kernel's struct; a kernel older than a field leaves it zero (the
//! length it returns is shorter), which reads as "unknown" below.

use std::os::fd::AsRawFd;

/// One reading of a connection's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TcpInfo {
    /// Smoothed round trip, ms.
    pub rtt_ms: f64,
    /// The connection's minimum round trip (the kernel's, over minutes), ms; 0 if unknown.
    pub min_rtt_ms: f64,
    /// Congestion window, segments.
    pub cwnd: u32,
    /// The last delivery-rate sample, and the pacing rate, bit/s.
    pub delivery_rate_bps: f64,
    pub pacing_rate_bps: f64,
    /// Segments retransmitted so far.
    pub total_retrans: u32,
    /// BBR's bandwidth estimate (bit/s) and the minimum round trip it sizes its window by (ms,
    /// kept 10 s), when the connection runs BBR.
    pub bbr_bw_bps: Option<f64>,
    pub bbr_min_rtt_ms: Option<f64>,
    /// Segments sent and not yet acknowledged (in flight, with the lost and SACKed ones).
    #[serde(default)]
    pub unacked: u32,
    /// The window the receiver offers (bytes), and the bytes written but not yet sent.
    #[serde(default)]
    pub snd_wnd: u32,
    #[serde(default)]
    pub notsent_bytes: u32,
    /// Since the connection began, ms: time with data in flight, and of that the time held back
    /// by the receiver's window or by the socket's send buffer (the rest is the congestion
    /// window, pacing or the application). A sender that sends below its pacing rate without
    /// being window-limited shows which here.
    #[serde(default)]
    pub busy_ms: f64,
    #[serde(default)]
    pub rwnd_limited_ms: f64,
    #[serde(default)]
    pub sndbuf_limited_ms: f64,
    /// Bytes sent so far, retransmissions included: two readings give the rate the sender
    /// really sent at, to set against its pacing rate.
    #[serde(default)]
    pub bytes_sent: u64,
    /// Whether the last delivery-rate sample was taken while the sender had too little to send
    /// (BBR ignores such a sample when it is low).
    #[serde(default)]
    pub app_limited: bool,
    /// Bytes of the connection's packets handed below TCP and not yet freed or orphaned (in a
    /// qdisc, a device's ring): what TCP small queues bound to about a millisecond at the
    /// pacing rate. A TUN device orphans a packet as it queues it, so this stays small unless
    /// the packets wait before the device.
    #[serde(default)]
    pub wmem_alloc: u32,
}

// `read` takes the struct out of 8-byte words.
const _: () = assert!(std::mem::align_of::<libc::tcp_info>() <= 8);

/// Reads `TCP_INFO` (and `TCP_CC_INFO` for BBR) of a connected TCP socket; `None` if the
/// kernel refuses.
pub fn read(sock: &impl AsRawFd) -> Option<TcpInfo> {
    let fd = sock.as_raw_fd();
    // Read as 8-byte words, so that byte 7 (`tcpi_delivery_rate_app_limited`, bit 0: a bitfield
    // libc's struct leaves as padding) can be read too; a kernel older than a field leaves it 0.
    let mut raw = [0u64; std::mem::size_of::<libc::tcp_info>().div_ceil(8)];
    sockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut raw)?;
    // SAFETY: `raw` is at least as large as tcp_info and 8-byte aligned (tcp_info's fields are
    // at most 8 bytes wide), and tcp_info is plain integers, for which any bytes are valid.
    let ti: libc::tcp_info = unsafe { std::ptr::read(raw.as_ptr().cast()) };
    let app_limited = raw[0].to_ne_bytes()[7] & 1 == 1;
    let mut info = TcpInfo {
        rtt_ms: f64::from(ti.tcpi_rtt) / 1e3,
        min_rtt_ms: if ti.tcpi_min_rtt == u32::MAX {
            0.0
        } else {
            f64::from(ti.tcpi_min_rtt) / 1e3
        },
        cwnd: ti.tcpi_snd_cwnd,
        delivery_rate_bps: ti.tcpi_delivery_rate as f64 * 8.0,
        pacing_rate_bps: rate_bps(ti.tcpi_pacing_rate),
        total_retrans: ti.tcpi_total_retrans,
        unacked: ti.tcpi_unacked,
        snd_wnd: ti.tcpi_snd_wnd,
        notsent_bytes: ti.tcpi_notsent_bytes,
        busy_ms: ti.tcpi_busy_time as f64 / 1e3,
        rwnd_limited_ms: ti.tcpi_rwnd_limited as f64 / 1e3,
        sndbuf_limited_ms: ti.tcpi_sndbuf_limited as f64 / 1e3,
        bytes_sent: ti.tcpi_bytes_sent,
        app_limited,
        wmem_alloc: wmem_alloc(fd),
        ..TcpInfo::default()
    };
    if let Some((bw, min_rtt)) = bbr(fd) {
        info.bbr_bw_bps = Some(bw);
        info.bbr_min_rtt_ms = Some(min_rtt);
    }
    Some(info)
}

/// `SK_MEMINFO_WMEM_ALLOC` of the socket's memory counters (`SO_MEMINFO`); 0 if refused.
fn wmem_alloc(fd: libc::c_int) -> u32 {
    let i = libc::SK_MEMINFO_WMEM_ALLOC as usize;
    let mut mem = [0u32; 9];
    match sockopt(fd, libc::SOL_SOCKET, SO_MEMINFO, &mut mem) {
        Some(n) if n >= 4 * (i + 1) => mem[i],
        _ => 0,
    }
}

/// A rate in bytes per second as the kernel gives it (`u64::MAX`: unlimited), in bit/s.
fn rate_bps(bytes_per_s: u64) -> f64 {
    if bytes_per_s == u64::MAX {
        0.0
    } else {
        bytes_per_s as f64 * 8.0
    }
}

/// BBR's `struct tcp_bbr_info` (`TCP_CC_INFO`): bandwidth in bytes per second (two 32-bit
/// halves), minimum round trip in µs, then the gains. `None` for another algorithm (its info
/// is another struct, or none).
fn bbr(fd: libc::c_int) -> Option<(f64, f64)> {
    let mut name = [0u8; 16];
    sockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, &mut name)?;
    if !name.starts_with(b"bbr\0") {
        return None;
    }
    let mut buf = [0u32; 5];
    if sockopt(fd, libc::IPPROTO_TCP, libc::TCP_CC_INFO, &mut buf)? < 3 * 4 {
        return None;
    }
    let bw = u64::from(buf[0]) | (u64::from(buf[1]) << 32);
    Some((rate_bps(bw), f64::from(buf[2]) / 1e3))
}

/// `SO_MEMINFO` (asm-generic/socket.h; not exported by libc for every target).
const SO_MEMINFO: libc::c_int = 55;

/// `getsockopt(fd, level, opt)` into `out` (plain data: integers, bytes); the length the
/// kernel wrote, or `None` if it refused.
fn sockopt<T: Copy>(
    fd: libc::c_int,
    level: libc::c_int,
    opt: libc::c_int,
    out: &mut T,
) -> Option<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `out` is a live, writable `T` of `len` bytes, and the kernel writes at most
    // `len` bytes of integers into it.
    let r = unsafe { libc::getsockopt(fd, level, opt, (out as *mut T).cast(), &mut len) };
    (r == 0).then_some(len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reads_a_loopback_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        s.read_exact(&mut got).unwrap();
        let i = read(&c).expect("TCP_INFO");
        assert!(i.cwnd > 0, "{i:?}");
        assert!(i.rtt_ms > 0.0 && i.rtt_ms < 1000.0, "{i:?}");
        // The peer has offered a window; everything written went out.
        assert!(i.snd_wnd > 0 && i.notsent_bytes == 0, "{i:?}");
        // Not a TCP socket: refused.
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(read(&u).is_none());
    }
}
