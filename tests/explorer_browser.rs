//! `mrcache explore` in a real browser: the child serves stateright's
//! Explorer on 127.0.0.1, headless Chromium loads it, and the page renders the
//! model's initial state (its status, and the properties with spec IDs).
//! Chromium comes from Debian (`ci/setup.sh` installs it); without it this
//! test fails with a message saying so. Full tier: the browser test is
//! ignored by `cargo test`, run by ci/full.sh (`-- --ignored`).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
#[ignore = "full tier: ci/full.sh"]
fn the_explorer_page_renders_the_initial_state_in_headless_chromium() {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("headless Chromium is needed: `apt-get install chromium` (ci/setup.sh does)");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_mrcache"))
        .args(["explore", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _child = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "mrcache explore did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let profile = std::env::temp_dir().join(format!("mrcache-chromium-{}", std::process::id()));
    let out = Command::new("timeout")
        .arg("90")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    // Knockout filled in the status from /.status and the initial state.
    assert!(dom.contains(">AlgoModel<"), "the model's name is rendered:\n{dom}");
    assert!(dom.contains("P2 freshness"), "the properties are rendered:\n{dom}");
    assert!(dom.contains("Current State"), "the initial state is rendered:\n{dom}");
}

#[test]
fn a_busy_port_is_a_clear_error() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_mrcache")).args(["explore", "--port", &port.to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot serve the Explorer") && err.contains(&port.to_string()), "{err}");
}
