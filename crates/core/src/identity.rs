//! Per-client identity: X25519 static key pairs and the identity handshake (docs/protocol.md
//! §9.3). Normative text in the spec; this module is its implementation, sans I/O.
//!
//! Each client has its own key pair and knows the server's public key; the server lists its
//! clients' public keys. The HELLO carries the client's static public key sealed under a key
//! only the server can derive (so an observer cannot link a client's sessions by it, as in
//! WireGuard), which tells the server which client speaks with one X25519 operation whatever
//! the number of clients. The keys mix four Diffie-Hellman results (client ephemeral or static
//! with server static or ephemeral, the pattern of Noise IK) and an optional PSK:
//!
//! - `es = DH(e_c, S_s)`: only the server can open the HELLO (server authentication);
//! - `ss = DH(s_c, S_s)`: only this client could seal its HELLO body (client authentication,
//!   before the server spends anything on it);
//! - `ee = DH(e_c, E_s)` and `se = DH(s_c, E_s)`: the session keys are forward secret (a
//!   static key stolen later opens no recorded session) and bound to the client's static key.
//!
//! One client's stolen private key lets the thief be that client, nobody else. Each handshake
//! packet still gets its own AEAD key from its 32-byte packet salt (as the PSK handshake, §3),
//! so the nonce is fixed and a HELLO repeated on every link never reuses a key.
//!
//! The handshake packets are sealed with ChaCha20-Poly1305 whatever the session's cipher: they
//! are few and small, and a fixed choice means no trial decryption; the `cipher` field of the
//! bodies negotiates the session's AEAD as in the PSK handshake.
//!
//! x25519-dalek provides the curve: ring's X25519 only takes ephemeral private keys, and a
//! concentrator must load its static key from a file. It is the implementation WireGuard's Rust
//! ports and most of the Rust ecosystem use, audited, constant-time.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::crypto::{Aead, CryptoError, SessionKeys, C2S_INFO, S2C_INFO};
use crate::wire::{
    CipherId, Header, HelloRepr, IdAckRepr, WireError, HEADER_LEN, HELLO_LEN, ID_ACK_LEN,
    ID_HELLO_ACK_DATAGRAM_LEN, ID_HELLO_DATAGRAM_LEN, PACKET_SALT_LEN, TAG_LEN,
};

/// HKDF salt of the identity handshake's extracts.
pub const ID_SALT: &[u8] = b"braid v3 identity";
/// HKDF info prefixes (the packet salt follows each).
pub const ID_STATIC_INFO: &[u8] = b"braid v3 id static";
pub const ID_HELLO_INFO: &[u8] = b"braid v3 id hello";
pub const ID_ACK_INFO: &[u8] = b"braid v3 id ack";

/// Length of an X25519 key (private or public).
pub const KEY_LEN: usize = 32;

/// Where the client's ephemeral (HELLO) or the server's (HELLO-ACK) public key sits.
const EPH_AT: usize = HEADER_LEN + PACKET_SALT_LEN;
/// End of the cleartext part (header, packet salt, ephemeral public key).
const CLEAR_END: usize = EPH_AT + KEY_LEN;
/// End of the sealed static key in a HELLO.
const STATIC_END: usize = CLEAR_END + KEY_LEN + TAG_LEN;

/// A static (long-term) X25519 key pair.
#[derive(Clone)]
pub struct KeyPair {
    secret: StaticSecret,
    public: [u8; KEY_LEN],
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("KeyPair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl KeyPair {
    /// The key pair of a 32-byte private key (clamped as X25519 says; any 32 bytes are a key).
    pub fn from_private(private: [u8; KEY_LEN]) -> KeyPair {
        let secret = StaticSecret::from(private);
        let public = PublicKey::from(&secret).to_bytes();
        KeyPair { secret, public }
    }

    /// A fresh random key pair.
    pub fn generate(rng: &mut dyn rand_core::RngCore) -> KeyPair {
        let mut b = [0u8; KEY_LEN];
        rng.fill_bytes(&mut b);
        KeyPair::from_private(b)
    }

    pub fn public(&self) -> [u8; KEY_LEN] {
        self.public
    }

    pub fn private(&self) -> [u8; KEY_LEN] {
        self.secret.to_bytes()
    }

    /// X25519 of our private key and `their` public key. `None` for a low-order public key
    /// (the result would be all zeros, known to anyone): such a packet is dropped.
    pub fn dh(&self, their: &[u8; KEY_LEN]) -> Option<[u8; KEY_LEN]> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*their));
        shared.was_contributory().then(|| shared.to_bytes())
    }
}

/// The public key of a private key.
pub fn public_key(private: [u8; KEY_LEN]) -> [u8; KEY_LEN] {
    KeyPair::from_private(private).public
}

/// HKDF output length marker: 32 bytes.
struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

fn extract(salt: &[u8], parts: &[&[u8; 32]]) -> hkdf::Prk {
    let mut ikm = Vec::with_capacity(32 * parts.len());
    parts.iter().for_each(|p| ikm.extend_from_slice(&p[..]));
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(&ikm)
}

fn expand(prk: &hkdf::Prk, info: &[&[u8]]) -> [u8; 32] {
    let mut out = [0u8; 32];
    prk.expand(info, Len32)
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF-SHA256 expand of 32 bytes");
    out
}

fn packet_key(prk: &hkdf::Prk, info: &[u8], packet_salt: &[u8]) -> LessSafeKey {
    let key = expand(prk, &[info, packet_salt]);
    LessSafeKey::new(
        UnboundKey::new(&aead::CHACHA20_POLY1305, &key).expect("32-byte ChaCha20-Poly1305 key"),
    )
}

fn zero_nonce() -> Nonce {
    Nonce::assume_unique_for_key([0; aead::NONCE_LEN])
}

/// The secrets of one client handshake that both ends derive (client: when it starts the
/// handshake; server: when it opens the HELLO).
#[derive(Clone)]
pub struct HelloSecrets {
    /// `psk || es`: the key of the sealed static.
    static_prk: hkdf::Prk,
    /// `psk || es || ss`: the key of the HELLO body.
    hello_prk: hkdf::Prk,
    /// The raw DH results (kept for the session keys).
    es: [u8; 32],
    ss: [u8; 32],
}

impl HelloSecrets {
    fn new(psk: &[u8; 32], es: [u8; 32], ss: [u8; 32]) -> HelloSecrets {
        HelloSecrets {
            static_prk: extract(ID_SALT, &[psk, &es]),
            hello_prk: extract(ID_SALT, &[psk, &es, &ss]),
            es,
            ss,
        }
    }
}

/// The secrets after the HELLO-ACK's ephemeral: the ACK's key and the session keys.
pub struct AckSecrets {
    ack_prk: hkdf::Prk,
    ikm: [[u8; 32]; 5],
}

impl AckSecrets {
    fn new(
        psk: &[u8; 32],
        hello: &HelloSecrets,
        ee: [u8; 32],
        se: [u8; 32],
        client_salt: &[u8; 32],
    ) -> Self {
        let ikm = [*psk, hello.es, hello.ss, ee, se];
        AckSecrets {
            ack_prk: extract(client_salt, &[&ikm[0], &ikm[1], &ikm[2], &ikm[3], &ikm[4]]),
            ikm,
        }
    }

    /// The session's keys; `is_client` selects which direction is `send`.
    pub fn session_keys(
        &self,
        cipher: CipherId,
        client_salt: &[u8; 32],
        server_salt: &[u8; 32],
        is_client: bool,
    ) -> SessionKeys {
        let mut salt = [0u8; 64];
        salt[..32].copy_from_slice(client_salt);
        salt[32..].copy_from_slice(server_salt);
        let i = &self.ikm;
        let prk = extract(&salt, &[&i[0], &i[1], &i[2], &i[3], &i[4]]);
        let (c2s, s2c) = (expand(&prk, &[C2S_INFO]), expand(&prk, &[S2C_INFO]));
        let (send, recv) = if is_client { (c2s, s2c) } else { (s2c, c2s) };
        SessionKeys {
            send: std::sync::Arc::new(Aead::new(cipher, &send)),
            recv: std::sync::Arc::new(Aead::new(cipher, &recv)),
        }
    }
}

/// Client: one handshake's ephemeral key and the secrets it shares with the server.
pub struct ClientHandshake {
    ephemeral: KeyPair,
    secrets: HelloSecrets,
}

impl ClientHandshake {
    /// Starts a handshake of client `me` with the server whose public key is `server`.
    /// `None` if the server's key is of low order (a configuration the config loader refuses).
    pub fn start(
        me: &KeyPair,
        server: &[u8; KEY_LEN],
        psk: &[u8; 32],
        rng: &mut dyn rand_core::RngCore,
    ) -> Option<ClientHandshake> {
        let ephemeral = KeyPair::generate(rng);
        let es = ephemeral.dh(server)?;
        let ss = me.dh(server)?;
        Some(ClientHandshake {
            ephemeral,
            secrets: HelloSecrets::new(psk, es, ss),
        })
    }

    /// Writes a complete HELLO datagram (`header.ptype` must be [`crate::wire::PacketType::IdHello`]):
    /// header (counter 0), packet salt, our ephemeral public key, our static public key sealed,
    /// the HELLO body sealed.
    pub fn seal_hello(
        &self,
        me: &KeyPair,
        header: &Header,
        packet_salt: &[u8; PACKET_SALT_LEN],
        hello: &HelloRepr,
        out: &mut Vec<u8>,
    ) {
        out.clear();
        out.resize(ID_HELLO_DATAGRAM_LEN, 0);
        Header {
            counter: 0,
            ..*header
        }
        .emit(&mut out[..HEADER_LEN]);
        out[HEADER_LEN..EPH_AT].copy_from_slice(packet_salt);
        out[EPH_AT..CLEAR_END].copy_from_slice(&self.ephemeral.public);
        // The static key, sealed with the header, salt and ephemeral as AAD.
        {
            let (clear, rest) = out.split_at_mut(CLEAR_END);
            let stat = &mut rest[..KEY_LEN + TAG_LEN];
            stat[..KEY_LEN].copy_from_slice(&me.public);
            let tag = packet_key(&self.secrets.static_prk, ID_STATIC_INFO, packet_salt)
                .seal_in_place_separate_tag(zero_nonce(), Aad::from(&*clear), &mut stat[..KEY_LEN])
                .expect("seal of 32 bytes");
            stat[KEY_LEN..].copy_from_slice(tag.as_ref());
        }
        // The body, with everything before it as AAD.
        let (aad, body) = out.split_at_mut(STATIC_END);
        hello.emit(&mut body[..HELLO_LEN]);
        let tag = packet_key(&self.secrets.hello_prk, ID_HELLO_INFO, packet_salt)
            .seal_in_place_separate_tag(zero_nonce(), Aad::from(&*aad), &mut body[..HELLO_LEN])
            .expect("seal of a HELLO body");
        body[HELLO_LEN..].copy_from_slice(tag.as_ref());
    }

    /// Opens a HELLO-ACK answering this handshake. Returns its body and the secrets from which
    /// the session keys come. The length was checked by `check_len`.
    pub fn open_ack(
        &self,
        me: &KeyPair,
        psk: &[u8; 32],
        client_salt: &[u8; 32],
        datagram: &mut [u8],
    ) -> Result<(IdAckRepr, AckSecrets), CryptoError> {
        check_len(datagram, ID_HELLO_ACK_DATAGRAM_LEN)?;
        let mut server_eph = [0u8; KEY_LEN];
        server_eph.copy_from_slice(&datagram[EPH_AT..CLEAR_END]);
        let ee = self.ephemeral.dh(&server_eph).ok_or(CryptoError::Auth)?;
        let se = me.dh(&server_eph).ok_or(CryptoError::Auth)?;
        let secrets = AckSecrets::new(psk, &self.secrets, ee, se, client_salt);
        let packet_salt = salt_of(datagram);
        let (aad, sealed) = datagram.split_at_mut(CLEAR_END);
        let pt = packet_key(&secrets.ack_prk, ID_ACK_INFO, &packet_salt)
            .open_in_place(zero_nonce(), Aad::from(&*aad), sealed)
            .map_err(|_| CryptoError::Auth)?;
        let ack = IdAckRepr::parse(pt)?;
        Ok((ack, secrets))
    }
}

fn salt_of(datagram: &[u8]) -> [u8; PACKET_SALT_LEN] {
    let mut s = [0u8; PACKET_SALT_LEN];
    s.copy_from_slice(&datagram[HEADER_LEN..EPH_AT]);
    s
}

/// A handshake datagram of the wrong length (or counter) is malformed before any cryptography.
fn check_len(datagram: &[u8], want: usize) -> Result<(), CryptoError> {
    if datagram.len() < want {
        return Err(WireError::Truncated.into());
    }
    if datagram.len() > want || datagram[8..16].iter().any(|&b| b != 0) {
        return Err(WireError::Malformed.into());
    }
    Ok(())
}

/// Server: the first step of opening a HELLO: which client's static key it carries, and the
/// shared `es`. One X25519 operation and one AEAD open of 32 bytes; the datagram is not changed.
/// Errors: a wrong length or counter (malformed, no cryptography), or a HELLO not sealed for
/// this server (auth).
pub fn peek_client(
    server: &KeyPair,
    psk: &[u8; 32],
    datagram: &[u8],
) -> Result<([u8; KEY_LEN], [u8; 32]), CryptoError> {
    check_len(datagram, ID_HELLO_DATAGRAM_LEN)?;
    let mut client_eph = [0u8; KEY_LEN];
    client_eph.copy_from_slice(&datagram[EPH_AT..CLEAR_END]);
    let es = server.dh(&client_eph).ok_or(CryptoError::Auth)?;
    let static_prk = extract(ID_SALT, &[psk, &es]);
    let mut stat = [0u8; KEY_LEN + TAG_LEN];
    stat.copy_from_slice(&datagram[CLEAR_END..STATIC_END]);
    let packet_salt = salt_of(datagram);
    let pt = packet_key(&static_prk, ID_STATIC_INFO, &packet_salt)
        .open_in_place(zero_nonce(), Aad::from(&datagram[..CLEAR_END]), &mut stat)
        .map_err(|_| CryptoError::Auth)?;
    let mut client = [0u8; KEY_LEN];
    client.copy_from_slice(pt);
    Ok((client, es))
}

/// Server: a HELLO opened for one known client.
pub struct OpenedHello {
    pub hello: HelloRepr,
    pub client_eph: [u8; KEY_LEN],
    secrets: HelloSecrets,
}

/// Server: opens the HELLO of the client whose static public key is `client` (found by
/// [`peek_client`], with its `es`); `ss` is `DH(s_s, S_c)` (computed once per client).
pub fn open_hello(
    psk: &[u8; 32],
    es: [u8; 32],
    ss: [u8; 32],
    datagram: &mut [u8],
) -> Result<OpenedHello, CryptoError> {
    check_len(datagram, ID_HELLO_DATAGRAM_LEN)?;
    let secrets = HelloSecrets::new(psk, es, ss);
    let packet_salt = salt_of(datagram);
    // The body's key depends on the client's static key through `ss`, and the sealed static is
    // in the body's AAD: a body opens only under the static it came with.
    let mut client_eph = [0u8; KEY_LEN];
    client_eph.copy_from_slice(&datagram[EPH_AT..CLEAR_END]);
    let (aad, sealed) = datagram.split_at_mut(STATIC_END);
    let pt = packet_key(&secrets.hello_prk, ID_HELLO_INFO, &packet_salt)
        .open_in_place(zero_nonce(), Aad::from(&*aad), sealed)
        .map_err(|_| CryptoError::Auth)?;
    let hello = HelloRepr::parse(pt)?;
    Ok(OpenedHello {
        hello,
        client_eph,
        secrets,
    })
}

/// Server: the pending session's handshake state: its ephemeral key and the secrets, kept to
/// answer the client's repeats of the same HELLO with the same body.
pub struct ServerAnswer {
    ephemeral_public: [u8; KEY_LEN],
    pub secrets: AckSecrets,
}

impl ServerAnswer {
    /// A fresh ephemeral key for an accepted HELLO, and the secrets of the session it makes.
    /// `None` when the client's ephemeral key is of low order (dropped as a bad HELLO).
    pub fn new(
        psk: &[u8; 32],
        client: &[u8; KEY_LEN],
        opened: &OpenedHello,
        rng: &mut dyn rand_core::RngCore,
    ) -> Option<ServerAnswer> {
        let eph = KeyPair::generate(rng);
        let ee = eph.dh(&opened.client_eph)?;
        let se = eph.dh(client)?;
        Some(ServerAnswer {
            ephemeral_public: eph.public,
            secrets: AckSecrets::new(psk, &opened.secrets, ee, se, &opened.hello.salt),
        })
    }

    /// Writes a complete HELLO-ACK datagram (`header.ptype` must be
    /// [`crate::wire::PacketType::IdHelloAck`]).
    pub fn seal_ack(
        &self,
        header: &Header,
        packet_salt: &[u8; PACKET_SALT_LEN],
        ack: &IdAckRepr,
        out: &mut Vec<u8>,
    ) {
        out.clear();
        out.resize(ID_HELLO_ACK_DATAGRAM_LEN, 0);
        Header {
            counter: 0,
            ..*header
        }
        .emit(&mut out[..HEADER_LEN]);
        out[HEADER_LEN..EPH_AT].copy_from_slice(packet_salt);
        out[EPH_AT..CLEAR_END].copy_from_slice(&self.ephemeral_public);
        let (aad, body) = out.split_at_mut(CLEAR_END);
        ack.emit(&mut body[..ID_ACK_LEN]);
        let tag = packet_key(&self.secrets.ack_prk, ID_ACK_INFO, packet_salt)
            .seal_in_place_separate_tag(zero_nonce(), Aad::from(&*aad), &mut body[..ID_ACK_LEN])
            .expect("seal of a HELLO-ACK body");
        body[ID_ACK_LEN..].copy_from_slice(tag.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{HelloAckRepr, PacketType};
    use rand_core::SeedableRng;

    fn rng() -> rand_chacha::ChaCha8Rng {
        rand_chacha::ChaCha8Rng::seed_from_u64(7)
    }

    fn hello() -> HelloRepr {
        HelloRepr {
            session: 0x1234_5678,
            salt: [3; 32],
            cipher: CipherId::Aes256Gcm,
            timestamp: 1_700_000_000_000_000_000,
        }
    }

    fn header(ptype: PacketType, session: u32) -> Header {
        Header {
            ptype,
            link: 2,
            session,
            counter: 0,
        }
    }

    /// The whole exchange: the server finds the client by its sealed static key, both ends
    /// derive the same session keys, and a datagram sealed by one opens at the other.
    #[test]
    fn handshake_round_trip_gives_both_ends_the_same_keys() {
        let mut r = rng();
        let server = KeyPair::generate(&mut r);
        let client = KeyPair::generate(&mut r);
        let psk = [0u8; 32];
        let hs = ClientHandshake::start(&client, &server.public(), &psk, &mut r).unwrap();
        let mut dg = Vec::new();
        hs.seal_hello(
            &client,
            &header(PacketType::IdHello, 7 << 16),
            &[9; 32],
            &hello(),
            &mut dg,
        );
        assert_eq!(dg.len(), ID_HELLO_DATAGRAM_LEN);

        let (who, es) = peek_client(&server, &psk, &dg).unwrap();
        assert_eq!(who, client.public());
        let ss = server.dh(&who).unwrap();
        let opened = open_hello(&psk, es, ss, &mut dg.clone()).unwrap();
        assert_eq!(opened.hello, hello());

        let answer = ServerAnswer::new(&psk, &who, &opened, &mut r).unwrap();
        let ack = IdAckRepr {
            ack: HelloAckRepr {
                session: 0x0007_0001,
                salt: [5; 32],
                cipher: CipherId::Aes256Gcm,
            },
            v4: Some(("198.18.9.2".parse().unwrap(), 24)),
            v6: None,
        };
        let mut adg = Vec::new();
        answer.seal_ack(
            &header(PacketType::IdHelloAck, hello().session),
            &[8; 32],
            &ack,
            &mut adg,
        );
        assert_eq!(adg.len(), ID_HELLO_ACK_DATAGRAM_LEN);
        assert!(adg.len() < dg.len(), "the answer never amplifies");
        let (got, secrets) = hs.open_ack(&client, &psk, &hello().salt, &mut adg).unwrap();
        assert_eq!(got, ack);

        let c = secrets.session_keys(CipherId::Aes256Gcm, &hello().salt, &ack.ack.salt, true);
        let s =
            answer
                .secrets
                .session_keys(CipherId::Aes256Gcm, &hello().salt, &ack.ack.salt, false);
        let h = Header {
            ptype: PacketType::Probe,
            link: 1,
            session: 1,
            counter: 5,
        };
        let mut out = Vec::new();
        crate::crypto::seal_plaintext(&c.send, &h, b"twelve bytes", &mut out);
        assert_eq!(
            crate::crypto::open(&s.recv, &h, &mut out).unwrap(),
            b"twelve bytes"
        );
    }

    /// Another server, another PSK, a flipped byte anywhere, a wrong length: refused.
    #[test]
    fn a_hello_opens_only_at_its_server_and_untouched() {
        let mut r = rng();
        let server = KeyPair::generate(&mut r);
        let other = KeyPair::generate(&mut r);
        let client = KeyPair::generate(&mut r);
        let psk = [1u8; 32];
        let hs = ClientHandshake::start(&client, &server.public(), &psk, &mut r).unwrap();
        let mut dg = Vec::new();
        hs.seal_hello(
            &client,
            &header(PacketType::IdHello, 0),
            &[9; 32],
            &hello(),
            &mut dg,
        );
        assert!(matches!(
            peek_client(&other, &psk, &dg),
            Err(CryptoError::Auth)
        ));
        assert!(matches!(
            peek_client(&server, &[2; 32], &dg),
            Err(CryptoError::Auth)
        ));
        assert!(matches!(
            peek_client(&server, &psk, &dg[..dg.len() - 1]),
            Err(CryptoError::Wire(WireError::Truncated))
        ));
        for i in 0..dg.len() {
            if (8..16).contains(&i) {
                continue; // the counter: malformed, checked above in check_len
            }
            let mut bad = dg.clone();
            bad[i] ^= 0x40;
            let ok = peek_client(&server, &psk, &bad).and_then(|(who, es)| {
                let ss = server.dh(&who).ok_or(CryptoError::Auth)?;
                open_hello(&psk, es, ss, &mut bad).map(|_| ())
            });
            assert!(ok.is_err(), "byte {i} flipped and still accepted");
        }
        // A client that does not hold the private key of the static it claims cannot seal a
        // body the server opens: the body's key needs DH(s_c, S_s).
        let thief = KeyPair::generate(&mut r);
        let eph = KeyPair::generate(&mut r);
        let forged = ClientHandshake {
            secrets: HelloSecrets::new(
                &psk,
                eph.dh(&server.public()).unwrap(),
                thief.dh(&server.public()).unwrap(),
            ),
            ephemeral: eph,
        };
        let mut f = Vec::new();
        forged.seal_hello(
            &client,
            &header(PacketType::IdHello, 0),
            &[1; 32],
            &hello(),
            &mut f,
        );
        let (who, es) = peek_client(&server, &psk, &f).unwrap();
        assert_eq!(who, client.public(), "the static it claims");
        let ss = server.dh(&who).unwrap();
        assert!(matches!(
            open_hello(&psk, es, ss, &mut f),
            Err(CryptoError::Auth)
        ));
    }

    #[test]
    fn public_key_matches_the_rfc7748_vector() {
        // RFC 7748 §6.1: Alice's private and public keys.
        let private: [u8; 32] =
            hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public: [u8; 32] =
            hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(public_key(private), public);
    }

    fn hex(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
}
