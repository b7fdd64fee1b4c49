//! sbx-net against the test network: the namespace, the redirect, the
//! gateway with address allowlists, what is dropped, no inbound, SIGKILL.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sbx_testutil::{As, assert_event, audit_events, identities, run_as, stderr, stdout};

fn marker_lines(out: &str, key: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .collect()
}

#[test]
fn cidr_allowlist_allows_exactly_its_addresses_and_ports() {
    let w = world_or_skip!();
    let (a, b) = (w.a.ip, w.b.ip);
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let script = format!(
            "curl -sS -m5 http://{a}/; echo A80=$?; \
             curl -sS -m5 http://[{a6}]/; echo A6=$?; \
             curl -sS -m5 http://{a}:8080/ >/dev/null 2>&1; echo A8080=$?; \
             curl -sS -m5 http://{b}/ >/dev/null 2>&1; echo B80=$?; \
             t=$(mktemp -d); git clone -q http://{a}/repo.git $t/r && cat $t/r/README; echo GIT=$?; rm -rf $t",
            a6 = w.a.ip6
        );
        let out = w.sbx_net(
            who,
            &log,
            &[
                format!("--allow-cidr={a}/32:80"),
                format!("--allow-cidr=[{}]:80", w.a.ip6),
            ],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who:?}: {so}\n{}",
            stderr(&out)
        );
        assert!(so.contains("hello from A"), "{who:?}: {so}");
        assert_eq!(marker_lines(&so, "A80"), ["0"], "{so}");
        assert_eq!(marker_lines(&so, "A6"), ["0"], "{so}");
        assert_ne!(
            marker_lines(&so, "A8080"),
            ["0"],
            "port 8080 must be refused: {so}"
        );
        assert_ne!(
            marker_lines(&so, "B80"),
            ["0"],
            "denied address reached: {so}"
        );
        assert!(
            so.contains("repo over dumb http"),
            "git clone over HTTP: {so}"
        );
        assert_eq!(marker_lines(&so, "GIT"), ["0"], "{so}");
        let a_s = a.to_string();
        let b_s = b.to_string();
        assert_event(&log, "net_denied", "alert", |e| {
            e["dst"] == b_s.as_str() && e["port"] == 80
        });
        assert_event(&log, "net_denied", "alert", |e| {
            e["dst"] == a_s.as_str()
                && e["port"] == 8080
                && e["reason"].as_str().unwrap().contains("port")
        });
        assert_event(&log, "net_allowed", "info", |e| {
            e["dst"] == a_s.as_str() && e["port"] == 80
        });
        let end = assert_event(&log, "net_end", "info", |_| true);
        assert!(end["connections_allowed"].as_u64().unwrap() >= 3, "{end}");
        assert!(end["connections_denied"].as_u64().unwrap() >= 2, "{end}");
        assert!(
            end["bytes_in"].as_u64().unwrap() > 0 && end["bytes_out"].as_u64().unwrap() > 0,
            "{end}"
        );
    }
}

#[test]
fn udp_icmp_and_raw_never_leave() {
    let w = world_or_skip!();
    let a = w.a.ip;
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        // Even an allowed address gets no UDP (other than DNS) and no ICMP.
        let script = format!(
            "echo hi | socat -u - UDP4-SENDTO:{a}:9999 2>/dev/null; echo UDP=$?; \
             ping -c1 -W1 {a} >/dev/null 2>&1; echo PING=$?; \
             ping -6 -c1 -W1 {a6} >/dev/null 2>&1; echo PING6=$?; \
             {py} -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP); s.sendto(b\"x\"*8, (\"{a}\", 0))' 2>/dev/null; echo RAW=$?",
            a6 = w.a.ip6,
            py = common::PY
        );
        let out = w.sbx_net(
            who,
            &log,
            &[format!("--allow-cidr={a}/32:1-65535")],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{so}{}", stderr(&out));
        for k in ["UDP", "PING", "PING6", "RAW"] {
            let v = marker_lines(&so, k);
            assert_eq!(v.len(), 1, "{k}: {so}");
            assert_ne!(v[0], "0", "{who:?}: {k} got out: {so}");
        }
    }
    // Nothing arrived at the UDP sink (checked after every identity ran).
    let got = std::fs::read(&w.udp_log).unwrap_or_default();
    assert!(got.is_empty(), "UDP reached the test host: {got:?}");
}

#[test]
fn nothing_can_connect_in_and_loopback_inside_works() {
    let w = world_or_skip!();
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        // A port nothing on the host listens on (so a successful connect
        // below could only have reached into the sandbox).
        let port = (0..100u16)
            .map(|i| 20000 + ((std::process::id() as u16).wrapping_add(i * 7)) % 20000)
            .find(|p| {
                std::net::TcpStream::connect_timeout(
                    &std::net::SocketAddr::from(([127, 0, 0, 1], *p)),
                    Duration::from_millis(200),
                )
                .is_err()
            })
            .expect("a free port");
        let done = d.path().join("done");
        let script = format!(
            "ip -o link | awk '{{print \"LINK=\" $2}}'; \
             {py} -m http.server {port} --bind 0.0.0.0 --directory / >/dev/null 2>&1 & \
             i=0; until curl -s -o /dev/null http://127.0.0.1:{port}/ || [ $i -ge 100 ]; do sleep 0.05; i=$((i+1)); done; \
             curl -s -o /dev/null -w 'LOOP=%{{http_code}}\\n' http://127.0.0.1:{port}/; echo READY; \
             i=0; until [ -e {done} ] || [ $i -ge 200 ]; do sleep 0.05; i=$((i+1)); done; kill $!",
            py = common::PY,
            done = done.display()
        );
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log")
            .arg(&log)
            .args(["--", "/bin/sh", "-c", &script]);
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir("/");
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        run_as(&mut c, who);
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = Vec::new();
        for l in lines.by_ref() {
            let l = l.unwrap();
            if l == "READY" {
                break;
            }
            seen.push(l);
        }
        assert_eq!(marker_lines(&seen.join("\n"), "LINK"), ["lo:"], "{seen:?}");
        assert_eq!(marker_lines(&seen.join("\n"), "LOOP"), ["200"], "{seen:?}");
        // From the host namespace: the sandbox's port is not there.
        let r = std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_millis(500),
        );
        assert!(r.is_err(), "{who:?}: host reached the sandbox's server");
        // From a test host: no route to the sandbox's address either.
        let o = w.net.run(
            &w.attacker,
            &["curl", "-s", "-m2", &format!("http://10.254.0.1:{port}/")],
        );
        assert!(
            !o.status.success(),
            "{who:?}: a test host reached the sandbox"
        );
        std::fs::write(&done, "").unwrap();
        let st = child.wait().unwrap();
        assert!(st.success(), "{who:?}: {st}");
    }
}

#[test]
fn sigkill_of_the_supervisor_cuts_the_sandbox_off_and_leaves_nothing() {
    let w = world_or_skip!();
    let a = w.a.ip;
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let script = format!(
            "echo NETNS=$(readlink /proc/self/ns/net); \
             exec {py} -c 'import socket,time,sys; s=socket.create_connection((\"{a}\",8080)); s.sendall(b\"GET / HTTP/1.1\\r\\n\"); print(\"CONNECTED\", flush=True); time.sleep(30)'",
            py = common::PY
        );
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log").arg(&log);
        c.arg(format!("--allow-cidr={a}/32:8080"));
        c.args(["--", "/bin/sh", "-c", &script]);
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir("/");
        c.stdout(Stdio::piped()).stderr(Stdio::inherit());
        run_as(&mut c, who);
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut netns = String::new();
        for l in lines.by_ref() {
            let l = l.unwrap();
            if let Some(n) = l.strip_prefix("NETNS=") {
                netns = n.to_string();
            }
            if l == "CONNECTED" {
                break;
            }
        }
        assert!(netns.starts_with("net:["), "{netns}");
        let up = Instant::now() + Duration::from_secs(10);
        while established_8080(&w) == 0 {
            assert!(
                Instant::now() < up,
                "{who:?}: the connection through the gateway is not up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap(); // SIGKILL to the supervisor
        child.wait().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let procs = procs_in_netns(&netns);
            let conns = established_8080(&w);
            if procs.is_empty() && conns == 0 {
                break;
            }
            assert!(
                Instant::now() < end,
                "{who:?}: after SIGKILL, processes {procs:?} still in {netns}, {conns} connections up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // No host state: the rules lived only in the sandbox's namespace.
        let t = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&t.stdout).contains("sbx_net"),
            "an sbx_net table in the host namespace"
        );
        // The audit log has the start, no end (the supervisor was killed).
        let evs = audit_events(&log);
        assert!(evs.iter().any(|e| e["event"] == "net_start"));
        let _ = who;
    }
    let _ = As::Root;
}

fn established_8080(w: &common::World) -> usize {
    let o = w.net.run(
        &w.a,
        &["ss", "-Htn", "state", "established", "( sport = :8080 )"],
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

fn procs_in_netns(ns: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(l) = std::fs::read_link(e.path().join("ns/net"))
            && l.to_string_lossy() == ns
        {
            v.push(pid);
        }
    }
    v
}

#[test]
fn hundreds_of_concurrent_connections_do_not_stall_the_gateway() {
    let w = world_or_skip!();
    let a = w.a.ip;
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        // 300 connections held open (more than the threaded relays), then
        // one full request must still be answered, and then each held one
        // (so every one was relayed, and counted, before the end).
        let py = d.path().join("hold.py");
        std::fs::write(
            &py,
            format!(
                "import socket\n\
                 held = [socket.create_connection(('{a}', 8081), timeout=10) for _ in range(300)]\n\
                 print('HELD=%d' % len(held))\n\
                 s = socket.create_connection(('{a}', 8081), timeout=10)\n\
                 s.sendall(b'ping\\n')\n\
                 print('BODY=' + s.makefile().readline().strip())\n\
                 ok = 0\n\
                 for h in held:\n\
                 \x20   h.sendall(b'ping\\n')\n\
                 \x20   ok += h.makefile().readline().strip() == 'pong'\n\
                 print('FIRST=%d' % ok)\n"
            ),
        )
        .unwrap();
        sbx_testutil::chown_to_test_user(&py);
        let script = format!("{} {}", common::PY, py.display());
        let out = w.sbx_net(who, &log, &[format!("--allow-cidr={a}/32:8081")], &script);
        let so = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who:?}: {so}\n{}",
            stderr(&out)
        );
        assert_eq!(marker_lines(&so, "HELD"), ["300"], "{so}");
        assert_eq!(marker_lines(&so, "BODY"), ["pong"], "{so}");
        assert_eq!(marker_lines(&so, "FIRST"), ["300"], "{so}");
        let end = assert_event(&log, "net_end", "info", |_| true);
        assert!(end["connections_allowed"].as_u64().unwrap() >= 301, "{end}");
    }
}

#[test]
fn bulk_transfers_are_intact_both_ways() {
    let w = world_or_skip!();
    let a = w.a.ip;
    let want = {
        let o = std::process::Command::new("sha256sum")
            .arg(w.dir.path().join("a/big.bin"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        // Full duplex: 8 MiB written while the echo comes back (a relay
        // that stopped reading one way while blocked the other would hang).
        let py = d.path().join("echo.py");
        std::fs::write(
            &py,
            format!(
                "import socket, threading, hashlib, os\n\
                 data = os.urandom(8 << 20)\n\
                 s = socket.create_connection(('{a}', 8082), timeout=30)\n\
                 got = bytearray()\n\
                 def rd():\n    \
                     while len(got) < len(data):\n        \
                         b = s.recv(1 << 16)\n        \
                         if not b: break\n        \
                         got.extend(b)\n\
                 t = threading.Thread(target=rd); t.start()\n\
                 s.sendall(data); t.join(60)\n\
                 print('ECHO=' + str(hashlib.sha256(got).digest() == hashlib.sha256(data).digest()))\n"
            ),
        )
        .unwrap();
        sbx_testutil::chown_to_test_user(&py);
        let script = format!(
            "curl -sS -m30 http://{a}/big.bin | sha256sum | sed 's/ .*//; s/^/GET=/'; {} {}",
            common::PY,
            py.display()
        );
        let out = w.sbx_net(
            who,
            &log,
            &[format!("--allow-cidr={a}/32:80,8082")],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who:?}: {so}\n{}",
            stderr(&out)
        );
        assert_eq!(marker_lines(&so, "GET"), vec![want.as_str()], "{so}");
        assert_eq!(marker_lines(&so, "ECHO"), ["True"], "{so}");
        let end = assert_event(&log, "net_end", "info", |_| true);
        assert!(end["bytes_in"].as_u64().unwrap() >= 12 << 20, "{end}");
        assert!(end["bytes_out"].as_u64().unwrap() >= 8 << 20, "{end}");
    }
}

#[test]
fn the_rules_cannot_be_changed_unprivileged_and_flushing_them_as_root_gains_nothing() {
    let w = world_or_skip!();
    let (a, b) = (w.a.ip, w.b.ip);
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let script = format!(
            "nft flush ruleset 2>/dev/null; echo FLUSH=$?; \
             ip route add {b}/32 dev lo 2>/dev/null; echo ROUTE=$?; \
             ip link add x0 type dummy 2>/dev/null; echo LINK=$?; \
             curl -sS -m3 -o /dev/null http://{b}/ 2>/dev/null; echo B=$?; \
             curl -sS -m3 -o /dev/null http://{a}/ 2>/dev/null; echo A=$?; \
             ping -c1 -W1 {b} >/dev/null 2>&1; echo PING=$?"
        );
        let out = w.sbx_net(who, &log, &[format!("--allow-cidr={a}/32:80")], &script);
        let so = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who:?}: {so}\n{}",
            stderr(&out)
        );
        if who == sbx_testutil::As::User {
            // No capability in the sandbox's namespaces: the rules stand.
            for k in ["FLUSH", "ROUTE", "LINK"] {
                assert_ne!(marker_lines(&so, k), ["0"], "{k}: {so}");
            }
            assert_eq!(marker_lines(&so, "A"), ["0"], "{so}");
        }
        // Whatever was changed inside, nothing leads out: B stays unreachable
        // (as root the rules are gone, so even the allowed A is cut off).
        assert_ne!(marker_lines(&so, "B"), ["0"], "{who:?}: {so}");
        assert_ne!(marker_lines(&so, "PING"), ["0"], "{who:?}: {so}");
    }
}
