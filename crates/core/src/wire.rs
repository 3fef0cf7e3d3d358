//! Wire protocol v1: every byte braid puts in a UDP datagram. The normative text is
//! `docs/protocol.md`; this module is its only implementation.
//!
//! Shape (smoltcp style): a `Packet<T: AsRef<[u8]>>` view over bytes whose `new_checked` is the one
//! door for untrusted input (after it no accessor can panic), and validated `Repr`s with
//! `parse`, `buffer_len` and `emit`. A malformed or truncated datagram is a [`WireError`], never a
//! panic.
//!
//! Outer header, 16 bytes, cleartext, authenticated as AEAD associated data:
//! ```text
//!  0      1      2             4                          8                               16
//!  +------+------+-------------+--------------------------+-------------------------------+
//!  | ver  | type |  link id    | receiver session id      | counter (AEAD nonce)          |
//!  +------+------+-------------+--------------------------+-------------------------------+
//! ```
//! then the sealed body: ciphertext || 16-byte tag. All integers big-endian.

use crate::LinkId;

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 16;
pub const TAG_LEN: usize = 16;
/// Sealed-body prefix common to DATA, PROBE, PROBE-ACK and CLOSE: link seq (4) + timestamp (4).
pub const COMMON_LEN: usize = 8;
/// Plaintext length of a DATA body before its payload.
pub const DATA_HEADER_LEN: usize = COMMON_LEN + 8 + 1;
/// Bytes braid adds around one tunnelled IP packet (outer header + DATA header + tag),
/// not counting the outer IP and UDP headers.
pub const DATA_OVERHEAD: usize = HEADER_LEN + DATA_HEADER_LEN + TAG_LEN;
pub const HELLO_LEN: usize = 40;
pub const PROBE_LEN: usize = COMMON_LEN + 4;
pub const PROBE_ACK_LEN: usize = COMMON_LEN + 36;

/// DATA flag: deliver without waiting for earlier sequence numbers (set by `flow-hash`).
pub const FLAG_UNORDERED: u8 = 0x01;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketType {
    Hello = 1,
    HelloAck = 2,
    Data = 3,
    Probe = 4,
    ProbeAck = 5,
    Close = 6,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("datagram truncated")]
    Truncated,
    #[error("unsupported protocol version {0}")]
    Version(u8),
    #[error("unknown packet type {0}")]
    UnknownType(u8),
    #[error("malformed field")]
    Malformed,
}

/// The outer header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub ptype: PacketType,
    pub link: LinkId,
    /// The session id chosen by the receiver of this packet (0 in HELLO).
    pub session: u32,
    /// Per-direction packet counter; the AEAD nonce. Random for HELLO/HELLO-ACK.
    pub counter: u64,
}

/// AEAD algorithm ids as carried in HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum CipherId {
    ChaCha20Poly1305 = 1,
    Aes256Gcm = 2,
}

/// HELLO and HELLO-ACK body (40 bytes): the sender's session id, its random salt, its cipher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRepr {
    pub session: u32,
    pub salt: [u8; 32],
    pub cipher: CipherId,
}

/// Prefix of every sealed, per-link body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Common {
    /// Per-link, per-direction sequence number of sealed packets (loss accounting per link).
    pub link_seq: u32,
    /// Sender's clock in microseconds, wrapping.
    pub ts: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRepr<'a> {
    pub common: Common,
    /// Bundle-wide data sequence number (for reordering and de-duplication).
    pub seq: u64,
    pub flags: u8,
    pub payload: &'a [u8],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRepr {
    pub common: Common,
    pub probe_id: u32,
    /// Zero bytes after the fixed fields (room for path-MTU probing).
    pub padding: u16,
}

/// PROBE-ACK: echoes a probe and reports what the receiver saw on that link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeAckRepr {
    pub common: Common,
    pub probe_id: u32,
    /// The probe's `ts`, echoed.
    pub echo_ts: u32,
    /// Microseconds between the probe's arrival and this ack's departure.
    pub hold_us: u32,
    /// Highest link seq received on this link from the probe's sender.
    pub rx_link_seq_max: u32,
    /// Sealed packets received on this link so far (wrapping).
    pub rx_packets: u32,
    /// Datagram bytes received on this link so far.
    pub rx_bytes: u64,
    /// Receiver's estimate of this link's current queueing delay (latest relative one-way delay
    /// minus its windowed minimum), microseconds.
    pub qdelay_us: u32,
    /// This link's base one-way delay minus that of the receiver's fastest link, microseconds.
    pub owd_offset_us: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    Data(DataRepr<'a>),
    Probe(ProbeRepr),
    ProbeAck(ProbeAckRepr),
    Close(Common),
}
