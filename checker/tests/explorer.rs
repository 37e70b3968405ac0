//! The Explorer: a clear error on a busy port, and it serves on a free one.

use mrcache_checker::{explore, CheckConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[test]
fn a_busy_port_is_an_error_not_a_panic() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let e = explore(&CheckConfig::default(), addr).unwrap_err();
    assert!(e.contains("cannot serve the Explorer"), "{e}");
}

#[test]
fn the_explorer_serves_its_status() {
    let addr: SocketAddr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    std::thread::spawn(move || explore(&CheckConfig::default(), addr));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET /.status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            if body.contains("unique_state_count") {
                assert!(body.contains("P2 freshness"), "{body}");
                return;
            }
        }
        assert!(Instant::now() < deadline, "the Explorer did not answer on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
