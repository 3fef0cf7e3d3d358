//! Soak test of `braid up` under faults (issue 13): runs `scripts/soak.sh` with the suite's
//! binary: one long TCP transfer through a 3-link bundle while links flap 100 times, one uplink
//! changes its address and each endpoint is restarted twice. It must complete, never move
//! nothing for more than 2 s, and end with every link UP. The script builds its own namespaces
//! (tagged with this process id), ends only the processes it started and deletes its namespaces;
//! this test bounds its time (kills the script by PID after 180 s). Needs root, as every
//! end-to-end test here.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn soak_transfer_survives_flaps_address_change_and_restarts() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/soak.sh");
    let mut child = Command::new("bash")
        .arg(script)
        .env("BRAID", env!("CARGO_BIN_EXE_braid"))
        .env("SOAK_TAG", format!("{}", std::process::id()))
        .env("SOAK_SECS", "75")
        .env("FLAPS", "100")
        .env("RESTARTS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run scripts/soak.sh");
    let end = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() >= end {
            // SIGTERM first: the script's trap ends its processes and deletes its namespaces.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        status.is_some(),
        "soak did not finish in 180 s:\n{stdout}\n{stderr}"
    );
    assert!(
        status.unwrap().success(),
        "soak failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("pass: every link UP"), "{stdout}");
    assert!(stdout.contains("100 flaps, 4 restarts"), "{stdout}");
}
