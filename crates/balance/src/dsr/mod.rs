//! DSR mode runtime: one thread, one `AF_PACKET` socket on the dedicated interface, the
//! sans-I/O [`DsrBalancer`] in between.
//!
//! The loop: wait for frames (or the next ARP/NS request, at most 200 ms), read a batch, take the
//! backend-table lock once for the whole batch, let the balancer classify/rewrite each frame, send
//! the forwarded frames and the ARP/NDP answers in one batch. Health checks, `braid backend ...`
//! and `braid status` act on the same shared [`BackendTable`]; the loop picks their changes up
//! through the table's generation counter.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_lb::dsr::{Action, DsrBalancer, DsrConfig, DsrStats, DsrTimers, Mac, Transport};
use braid_lb::BackendTable;

use braid_linux::packet::{
    with_empty_vnet, with_empty_vnet_tagged, FrameBatch, InterfaceInfo, PacketOptions, PacketSocket,
};

/// What DSR mode needs from the configuration.
#[derive(Debug, Clone)]
pub struct DsrSettings {
    /// The dedicated interface where frames for the VIP arrive and leave.
    pub interface: String,
    pub vip: IpAddr,
    /// 0 = every port.
    pub port: u16,
    pub transport: Transport,
    /// What picks a packet's backend.
    pub steer: braid_lb::dsr::Steer,
    pub timers: DsrTimers,
}

/// What `braid status` shows of the DSR data path (refreshed a few times a second).
#[derive(Debug, Clone, Default)]
pub struct DsrStatus {
    pub interface: String,
    pub mac: Option<Mac>,
    pub stats: DsrStats,
    pub active_flows: usize,
    pub closing_flows: usize,
    /// Each backend address and its learned MAC.
    pub neighbors: Vec<(IpAddr, Option<Mac>)>,
    /// Frames the kernel refused or that did not fit the send queue.
    pub send_errors: u64,
    /// Frames dropped before we could read them (receive queue full: the balancer is too slow).
    pub socket_drops: u64,
    /// The interface is down or gone: the data path waits for it to come back.
    pub interface_down: bool,
    /// Times the socket was reopened after the interface went down or away.
    pub interface_restarts: u64,
}

impl DsrStatus {
    /// JSON for the control socket (`"dsr"` key of the status reply).
    pub fn to_json(&self) -> serde_json::Value {
        let s = &self.stats;
        serde_json::json!({
            "interface": self.interface,
            "mac": self.mac.map(fmt_mac),
            "forwarded_packets": s.forwarded_packets,
            "forwarded_bytes": s.forwarded_bytes,
            "answered": s.answered,
            "learned": s.learned,
            "dropped_no_backend": s.dropped_no_backend,
            "dropped_no_mac": s.dropped_no_mac,
            "ignored": s.ignored,
            "malformed": s.malformed,
            "flows_moved": s.flows_moved,
            "flows_evicted": s.flows_evicted,
            "untracked_packets": s.untracked,
            "braid_routed_packets": s.braid_routed,
            "interface_down": self.interface_down,
            "interface_restarts": self.interface_restarts,
            "send_errors": self.send_errors,
            "socket_drops": self.socket_drops,
            "active_flows": self.active_flows,
            "closing_flows": self.closing_flows,
            "neighbors": self.neighbors.iter().map(|(ip, mac)| {
                serde_json::json!({"ip": ip.to_string(), "mac": mac.map(fmt_mac)})
            }).collect::<Vec<_>>(),
        })
    }
}

impl DsrStatus {
    /// The data path's figures as Prometheus metrics (registered under `braid_balance_dsr_`).
    pub fn register_metrics(&self, reg: &mut prometheus_client::registry::Registry) {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        type L = Vec<(&'static str, String)>;
        let s = &self.stats;
        let counter = |v: u64| {
            let c: Counter = Counter::default();
            c.inc_by(v);
            c
        };
        reg.register(
            "forwarded_packets",
            "Packets forwarded to backends",
            counter(s.forwarded_packets),
        );
        reg.register(
            "forwarded_bytes",
            "IP bytes forwarded to backends",
            counter(s.forwarded_bytes),
        );
        reg.register(
            "new_flows",
            "Flows that got a backend (new, or moved off a dead backend)",
            counter(s.new_flows),
        );
        reg.register(
            "flows_moved",
            "Flows moved from a backend that went down to a live one",
            counter(s.flows_moved),
        );
        reg.register(
            "flows_evicted",
            "Flows pushed out of the full flow table (least recently used first)",
            counter(s.flows_evicted),
        );
        reg.register(
            "untracked_packets",
            "Mid-connection TCP packets of unknown flows, forwarded by hash without creating a flow",
            counter(s.untracked),
        );
        reg.register(
            "braid_routed_packets",
            "Packets steered by the braid route id in their header (steer = \"braid\")",
            counter(s.braid_routed),
        );
        reg.register(
            "interface_restarts",
            "Times the data path reopened its interface after it went down or away",
            counter(self.interface_restarts),
        );
        let down: Gauge = Gauge::default();
        down.set(i64::from(self.interface_down));
        reg.register(
            "interface_down",
            "1 while the DSR interface is down or gone (nothing is forwarded)",
            down,
        );
        reg.register(
            "neighbor_replies",
            "ARP replies / Neighbor Advertisements sent for the VIP",
            counter(s.answered),
        );
        reg.register(
            "neighbors_learned",
            "Backend MACs learned (new or changed)",
            counter(s.learned),
        );
        reg.register(
            "ignored_frames",
            "Frames seen on the interface that are not for the VIP",
            counter(s.ignored),
        );
        let dropped: Family<L, Counter> = Family::default();
        for (reason, v) in [
            ("no_backend", s.dropped_no_backend),
            ("no_mac", s.dropped_no_mac),
            ("malformed", s.malformed),
            ("send_error", self.send_errors),
            ("socket_full", self.socket_drops),
        ] {
            dropped
                .get_or_create(&vec![("reason", reason.to_string())])
                .inc_by(v);
        }
        reg.register("dropped", "Frames for the VIP dropped, by reason", dropped);
        let flows: Family<L, Gauge> = Family::default();
        flows
            .get_or_create(&vec![("state", "active".to_string())])
            .set(self.active_flows as i64);
        flows
            .get_or_create(&vec![("state", "closing".to_string())])
            .set(self.closing_flows as i64);
        reg.register("flows", "Flows in the flow table, by state", flows);
        let known: Family<L, Gauge> = Family::default();
        for (ip, mac) in &self.neighbors {
            known
                .get_or_create(&vec![("backend", ip.to_string())])
                .set(i64::from(mac.is_some()));
        }
        reg.register(
            "backend_mac_known",
            "1 once the backend's MAC is learned (a backend without one gets no traffic)",
            known,
        );
    }
}

/// `02:00:00:00:00:01`.
pub fn fmt_mac(m: Mac) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// An opened DSR data path: the interface checked and the socket bound. Opening is separate from
/// running so that configuration errors (no such interface, VIP on the balancer itself, no
/// permission) surface before the balancer reports itself started.
pub struct Dsr {
    settings: DsrSettings,
    iface: InterfaceInfo,
    sock: PacketSocket,
}

impl Dsr {
    pub fn open(settings: DsrSettings) -> anyhow::Result<Dsr> {
        let iface = InterfaceInfo::lookup(&settings.interface)?;
        if iface.owns(settings.vip) {
            anyhow::bail!(
                "the VIP {} is an address of {} itself: in DSR mode the VIP lives on the backends' loopback, not on the balancer",
                settings.vip,
                settings.interface
            );
        }
        let sock = PacketSocket::open(iface.index, DSR_SOCKET).map_err(|e| {
            anyhow::anyhow!(
                "cannot open a raw socket on {} (DSR needs root or CAP_NET_RAW): {e}",
                settings.interface
            )
        })?;
        if let IpAddr::V6(v6) = settings.vip {
            sock.join_multicast(braid_lb::dsr::solicited_node_mac(v6))
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot join the VIP's solicited-node group on {}: {e}",
                        settings.interface
                    )
                })?;
        }
        if forwarding_enabled(&settings.interface, settings.vip) {
            tracing::warn!(
                interface = %settings.interface,
                "IP forwarding is on for this interface: the kernel will forward frames for the VIP too (duplicates); turn it off"
            );
        }
        Ok(Dsr {
            settings,
            iface,
            sock,
        })
    }

    pub fn interface(&self) -> &InterfaceInfo {
        &self.iface
    }

    fn config(&self) -> DsrConfig {
        DsrConfig {
            vip: self.settings.vip,
            port: self.settings.port,
            transport: self.settings.transport,
            mac: self.iface.mac,
            ipv4: self.iface.ipv4,
            ipv6: self.iface.ipv6,
            steer: self.settings.steer,
        }
    }

    /// Runs until `stop` is set. `table` is shared with the health checker and the control socket;
    /// `status` is refreshed for `braid status`.
    ///
    /// The interface may go down, or away and come back (a flap, a driver reset, a re-created
    /// VLAN or bond): the socket then reports an error, the loop says so, keeps its flows, polls
    /// the interface every [`REOPEN_INTERVAL`] and, once it is up again, opens a fresh socket,
    /// announces the VIP again and carries on.
    pub fn run(
        mut self,
        table: Arc<Mutex<BackendTable>>,
        status: Arc<Mutex<DsrStatus>>,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<()> {
        let cfg = self.config();
        if table
            .lock()
            .map(|t| t.backends().iter().any(|b| b.addr.ip().is_ipv6()))
            .unwrap_or(false)
            && cfg.ipv6.is_none()
        {
            tracing::warn!(interface = %self.iface.name, "IPv6 backends but no IPv6 address on the interface: their MACs cannot be resolved");
        }
        let mut path = DataPath {
            lb: DsrBalancer::new(cfg, self.settings.timers),
            counters: Counters::default(),
            table,
            status,
        };
        tracing::info!(
            interface = %self.iface.name,
            mac = %fmt_mac(self.iface.mac),
            vip = %self.settings.vip,
            port = self.settings.port,
            "DSR data path running"
        );
        while !stop.load(Ordering::Relaxed) {
            let err = path.serve(&self.sock, &self.iface, &stop);
            let Err(err) = err else { break };
            tracing::warn!(
                interface = %self.iface.name,
                error = %err,
                "DSR interface down or gone: forwarding stops until it is back"
            );
            path.counters.interface_down = true;
            path.publish(&self.iface);
            match self.reopen(&mut path, &stop) {
                Some((iface, sock)) => {
                    self.iface = iface;
                    self.sock = sock;
                    path.counters.interface_down = false;
                    path.counters.interface_restarts += 1;
                    tracing::info!(interface = %self.iface.name, "DSR interface back: forwarding again");
                }
                None => break, // stopped while waiting
            }
        }
        path.counters.socket_drops += self.sock.take_drops();
        path.publish(&self.iface);
        Ok(())
    }

    /// Waits until the interface exists and is up, then opens a new socket on it (the interface
    /// may have a new index or MAC if it was re-created). `None`: `stop` was set meanwhile.
    fn reopen(
        &self,
        path: &mut DataPath,
        stop: &AtomicBool,
    ) -> Option<(InterfaceInfo, PacketSocket)> {
        let mut last_error = String::new();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(REOPEN_INTERVAL);
            // Flows still idle out and `braid status` stays current while we wait.
            let now = Instant::now();
            let _ = path.lb.poll_transmit(&mut lock(&path.table), now);
            path.publish(&self.iface);
            let attempt = InterfaceInfo::lookup(&self.settings.interface).and_then(|iface| {
                if !iface.up {
                    anyhow::bail!("{} is down", iface.name);
                }
                let sock = PacketSocket::open(iface.index, DSR_SOCKET)?;
                if let IpAddr::V6(v6) = self.settings.vip {
                    sock.join_multicast(braid_lb::dsr::solicited_node_mac(v6))?;
                }
                Ok((iface, sock))
            });
            match attempt {
                Ok((iface, sock)) => {
                    path.lb.set_interface(iface.mac, iface.ipv4, iface.ipv6);
                    return Some((iface, sock));
                }
                Err(e) => {
                    let e = e.to_string();
                    if e != last_error {
                        tracing::debug!(error = %e, "DSR interface not back yet");
                        last_error = e;
                    }
                }
            }
        }
        None
    }
}

/// How often a DSR data path whose interface went down checks whether it is back.
/// The DSR socket: offload headers pass through (a frame leaves as it came: checksummed and
/// segmented by the kernel on the way out); only frames for the interface's own MACs.
const DSR_SOCKET: PacketOptions = PacketOptions {
    vnet_hdr: true,
    promiscuous: false,
};

pub const REOPEN_INTERVAL: Duration = Duration::from_millis(250);

/// Counters of the runtime itself (the balancer's own are in [`DsrStats`]).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    send_errors: u64,
    socket_drops: u64,
    interface_down: bool,
    interface_restarts: u64,
}

/// What survives a reopened socket: the balancer (flows, learned MACs), counters, shared state.
struct DataPath {
    lb: DsrBalancer,
    counters: Counters,
    table: Arc<Mutex<BackendTable>>,
    status: Arc<Mutex<DsrStatus>>,
}

impl DataPath {
    fn publish(&self, iface: &InterfaceInfo) {
        publish(
            &self.lb,
            &lock(&self.table),
            iface,
            self.counters,
            &self.status,
        );
    }

    /// Serves frames on `sock` until `stop` is set (`Ok`) or the socket fails (`Err`: the
    /// interface went down or away).
    fn serve(
        &mut self,
        sock: &PacketSocket,
        iface: &InterfaceInfo,
        stop: &AtomicBool,
    ) -> anyhow::Result<()> {
        let announce: Vec<Vec<u8>> = self
            .lb
            .announce()
            .iter()
            .map(|f| with_empty_vnet(f))
            .collect();
        let refs: Vec<&[u8]> = announce.iter().map(|f| f.as_slice()).collect();
        sock.send_batch(&refs);

        let mut batch = FrameBatch::new(64);
        let mut next_housekeeping = Instant::now();
        let mut last_publish = Instant::now();
        let mut forwards: Vec<usize> = Vec::with_capacity(64);
        let mut replies: Vec<Vec<u8>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next_housekeeping {
                let requests = {
                    let mut t = lock(&self.table);
                    let r = self.lb.poll_transmit(&mut t, now);
                    self.counters.socket_drops += sock.take_drops();
                    publish(&self.lb, &t, iface, self.counters, &self.status);
                    last_publish = now;
                    r
                };
                let frames: Vec<Vec<u8>> = requests.iter().map(|f| with_empty_vnet(f)).collect();
                let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
                let out = sock.send_batch(&refs);
                self.counters.send_errors += out.dropped as u64;
                let next = self
                    .lb
                    .poll_timeout()
                    .unwrap_or(now + Duration::from_millis(200));
                next_housekeeping = next
                    .min(now + Duration::from_millis(200))
                    .max(now + Duration::from_millis(1));
            }
            let wait = next_housekeeping.saturating_duration_since(Instant::now());
            let ready = sock
                .wait_readable(wait.min(Duration::from_secs(1)))
                .map_err(|e| anyhow::anyhow!("the DSR interface's socket: {e}"))?;
            if !ready {
                continue;
            }
            // Drain what is queued, a batch at a time (bounded so housekeeping still runs).
            for _ in 0..64 {
                let n = sock.recv_batch(&mut batch)?;
                if n == 0 {
                    break;
                }
                let now = Instant::now();
                forwards.clear();
                replies.clear();
                {
                    let mut t = lock(&self.table);
                    self.lb.sync_backends(&t, now);
                    for i in 0..n {
                        let vlan = batch.vlan(i);
                        let frame = batch.frame_mut(i);
                        if frame.is_empty() {
                            continue;
                        }
                        match self.lb.handle_frame(frame, &mut t, now) {
                            Action::Forward { .. } => forwards.push(i),
                            Action::Reply(r) => replies.push(with_empty_vnet_tagged(&r, vlan)),
                            Action::None | Action::Drop(_) => {}
                        }
                    }
                }
                // A frame that came tagged leaves tagged (one that cannot take its tag back is
                // not sent: untagged, it would land on another VLAN).
                forwards.retain(|&i| batch.restore_vlan(i));
                let mut out: Vec<&[u8]> = forwards.iter().map(|&i| batch.sendable(i)).collect();
                out.extend(replies.iter().map(|r| r.as_slice()));
                let res = sock.send_batch(&out);
                if res.dropped > 0 {
                    self.counters.send_errors += res.dropped as u64;
                    if let Some(e) = res.last_error {
                        tracing::debug!(error = %e, "send failed");
                    }
                }
                if n < batch.capacity() {
                    break;
                }
            }
            // Keep `braid status` fresh under load too (at most every 50 ms).
            if last_publish.elapsed() >= Duration::from_millis(50) {
                self.counters.socket_drops += sock.take_drops();
                self.publish(iface);
                last_publish = Instant::now();
            }
        }
        Ok(())
    }
}

fn lock(table: &Mutex<BackendTable>) -> std::sync::MutexGuard<'_, BackendTable> {
    // A panic elsewhere while holding the lock leaves a consistent-enough table for counters.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

fn publish(
    lb: &DsrBalancer,
    table: &BackendTable,
    iface: &InterfaceInfo,
    counters: Counters,
    status: &Mutex<DsrStatus>,
) {
    let (active, closing) = lb.flow_count();
    let neighbors: Vec<(IpAddr, Option<Mac>)> = table
        .backends()
        .iter()
        .map(|b| (b.addr.ip(), lb.neighbor(b.addr.ip())))
        .collect();
    let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
    // Say when a backend's MAC is learned or changes (the first thing to check when a backend
    // gets no traffic).
    for (ip, mac) in &neighbors {
        let Some(mac) = mac else { continue };
        let before = s
            .neighbors
            .iter()
            .find(|(i, _)| i == ip)
            .and_then(|(_, m)| *m);
        if before != Some(*mac) {
            tracing::info!(backend = %ip, mac = %fmt_mac(*mac), "backend MAC learned");
        }
    }
    *s = DsrStatus {
        interface: iface.name.clone(),
        mac: Some(iface.mac),
        stats: lb.stats(),
        active_flows: active,
        closing_flows: closing,
        neighbors,
        send_errors: counters.send_errors,
        socket_drops: counters.socket_drops,
        interface_down: counters.interface_down,
        interface_restarts: counters.interface_restarts,
    };
}

/// Whether the kernel forwards IP on `iface` (read from /proc; false if unknown).
fn forwarding_enabled(iface: &str, vip: IpAddr) -> bool {
    let path = match vip {
        IpAddr::V4(_) => format!("/proc/sys/net/ipv4/conf/{iface}/forwarding"),
        IpAddr::V6(_) => format!("/proc/sys/net/ipv6/conf/{iface}/forwarding"),
    };
    std::fs::read_to_string(path)
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_becomes_dsr_metrics() {
        let mut st = DsrStatus {
            send_errors: 2,
            socket_drops: 3,
            active_flows: 5,
            neighbors: vec![
                ("198.18.0.11".parse().unwrap(), Some([2, 0, 0, 0, 0, 1])),
                ("198.18.0.12".parse().unwrap(), None),
            ],
            ..DsrStatus::default()
        };
        st.stats.forwarded_packets = 7;
        st.stats.dropped_no_mac = 1;
        let mut root = prometheus_client::registry::Registry::default();
        st.register_metrics(root.sub_registry_with_prefix("braid_balance_dsr"));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &root).unwrap();
        for want in [
            "braid_balance_dsr_forwarded_packets_total 7\n",
            "braid_balance_dsr_dropped_total{reason=\"no_mac\"} 1\n",
            "braid_balance_dsr_dropped_total{reason=\"send_error\"} 2\n",
            "braid_balance_dsr_dropped_total{reason=\"socket_full\"} 3\n",
            "braid_balance_dsr_flows{state=\"active\"} 5\n",
            "braid_balance_dsr_backend_mac_known{backend=\"198.18.0.11\"} 1\n",
            "braid_balance_dsr_backend_mac_known{backend=\"198.18.0.12\"} 0\n",
        ] {
            assert!(out.contains(want), "missing {want:?} in\n{out}");
        }
    }
}
