//! Issue 15: an allowed CIDR that contains one of the host's own addresses
//! does not reach services bound to it; only `--allow-host-address ADDR`
//! opens that address (on the ports an entry grants).

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use sbx_testutil::{assert_event, identities, stderr, stdout};

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

#[test]
fn a_cidr_never_reaches_the_host_unless_named() {
    let w = world_or_skip!();
    // A service of the host, bound to the host's end of test host A's link
    // (an address of this host, inside A's /24).
    let host_ip = w.a.peer;
    let l = TcpListener::bind((host_ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    l.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let server = std::thread::spawn(move || {
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            match l.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let mut b = [0u8; 1024];
                    let _ = s.read(&mut b);
                    let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nhost service\n");
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    });
    let a = w.a.ip;
    let cidr = format!("--allow-cidr={}/24:80,{port}", {
        let o = a.octets();
        std::net::Ipv4Addr::new(o[0], o[1], o[2], 0)
    });
    let script = format!(
        "curl -sS -m5 http://{host_ip}:{port}/; echo HOST=$?; \
         curl -sS -m5 http://{a}/ >/dev/null; echo A=$?"
    );
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let out = w.sbx_net(who, &log, std::slice::from_ref(&cidr), &script);
        let so = stdout(&out);
        let diag = format!("{who:?}: {so}{}", stderr(&out));
        assert_ne!(marker(&so, "HOST"), "0", "host service reached: {diag}");
        assert!(!so.contains("host service"), "{diag}");
        assert_eq!(marker(&so, "A"), "0", "the rest of the CIDR works: {diag}");
        let h = host_ip.to_string();
        assert_event(&log, "net_denied", "alert", |e| {
            e["dst"] == h.as_str()
                && e["port"] == port
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("--allow-host-address"))
        });

        // Named explicitly: reachable.
        let (_d, log) = common::World::audit_dir();
        let out = w.sbx_net(
            who,
            &log,
            &[cidr.clone(), format!("--allow-host-address={host_ip}")],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(marker(&so, "HOST"), "0", "{who:?}: {so}{}", stderr(&out));
        assert!(so.contains("host service"), "{so}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = server.join();
}
