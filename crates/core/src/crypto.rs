//! Keys and sealing. (Skeleton: the signatures are the contract; bodies are being written.)
//!
//! - Handshake key: `HKDF-SHA256(salt = "braid v1 handshake", ikm = psk)` expanded with info
//!   `"braid v1 hello"`; seals HELLO / HELLO-ACK (nonce = 4 zero bytes || random counter).
//! - Session keys: `prk = HKDF-Extract(salt = client_salt || server_salt, ikm = psk)`;
//!   client-to-server key = Expand(prk, "braid v1 c2s"), server-to-client = Expand(prk, "braid v1 s2c").
//! - Nonce for session packets: 4 zero bytes || the header's 64-bit counter (big-endian).
//! - AAD: the 16-byte outer header.

use crate::wire::{Body, CipherId, Header, HelloRepr, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("authentication failed")]
    Auth,
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// One direction's AEAD key.
pub struct Aead {/* ring::aead::LessSafeKey */}

impl Aead {
    pub fn new(cipher: CipherId, key: &[u8; 32]) -> Self {
        todo!()
    }
}

/// Both directions' keys of one session, from this endpoint's point of view.
pub struct SessionKeys {
    pub send: Aead,
    pub recv: Aead,
}

/// The key that seals HELLO and HELLO-ACK.
pub fn handshake_key(psk: &[u8; 32], cipher: CipherId) -> Aead {
    todo!()
}

/// Derives a session's keys. `is_client` selects which direction is `send`.
pub fn session_keys(
    psk: &[u8; 32],
    cipher: CipherId,
    client_salt: &[u8; 32],
    server_salt: &[u8; 32],
    is_client: bool,
) -> SessionKeys {
    todo!()
}

/// Writes a complete datagram into `out` (cleared first): header, then `body` sealed under `key`
/// with the header as AAD and `header.counter` as nonce.
pub fn seal(key: &Aead, header: &Header, body: &Body<'_>, out: &mut Vec<u8>) {
    todo!()
}

/// Writes a complete HELLO or HELLO-ACK datagram into `out`.
pub fn seal_hello(key: &Aead, header: &Header, hello: &HelloRepr, out: &mut Vec<u8>) {
    todo!()
}

/// Opens a datagram in place. Returns the plaintext body bytes (to be parsed with
/// `Body::parse(header.ptype, ..)` or `HelloRepr::parse`). The caller has already parsed the
/// header with `Header::parse` (to choose the key) and passes it in.
pub fn open<'a>(key: &Aead, header: &Header, datagram: &'a mut [u8]) -> Result<&'a [u8], CryptoError> {
    todo!()
}
