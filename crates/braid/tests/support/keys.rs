//! Key pairs made by the braid binary under test (`braid keygen`, `braid pubkey`), for the
//! end-to-end tests that use per-client keys. Included with `#[path]`.

use std::io::Write;
use std::process::{Command, Stdio};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// A new private key (base64), from `braid keygen`.
pub fn keygen() -> String {
    let o = Command::new(BRAID).arg("keygen").output().unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// The public key of `private`, from `braid pubkey` (the private key on its stdin).
pub fn pubkey_of(private: &str) -> String {
    let mut child = Command::new(BRAID)
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(private.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}
