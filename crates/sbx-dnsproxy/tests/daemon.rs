//! End-to-end tests of the sbx-dnsproxy daemon against a real upstream
//! (dnsmasq on 127.0.0.1), as root and as the unprivileged test user.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use sbx_testutil::identities;

const ALLOW: &[&str] = &["--allow", "*.allowed.test", "--allow", "exact.test"];

#[test]
fn allowed_names_resolve_over_udp_and_tcp() {
    let up = upstream!();
    for who in identities() {
        let p = Proxy::start(&up, ALLOW, who);
        let m = p.ask("a.allowed.test", RecordType::A);
        assert_eq!(rcode(&m), ResponseCode::NoError);
        assert_eq!(ips(&m), ["192.0.32.10"], "{who:?}");
        let m = p.ask("deep.sub.allowed.test", RecordType::AAAA);
        assert_eq!(ips(&m), ["2a00:db8::10"]);
        let m = p.ask_tcp("exact.test", RecordType::A);
        assert_eq!(ips(&m), ["192.0.32.20"]);
        // The question is echoed as asked (case preserved).
        let m = p.ask("MiXeD.Allowed.Test", RecordType::A);
        assert_eq!(m.queries[0].name().to_ascii(), "MiXeD.Allowed.Test.");
        assert_eq!(ips(&m), ["192.0.32.10"]);
        let (code, _) = p.stop();
        assert_eq!(code, 0);
    }
}

#[test]
fn several_listeners() {
    let up = upstream!();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--upstream",
        &up.addr.to_string(),
        "--allow",
        "*.allowed.test",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let p = Proxy::start_raw(&args, identities()[0]);
    assert_eq!(p.addrs.len(), 2);
    for a in &p.addrs {
        let m = udp_query(*a, "x.allowed.test", RecordType::A, Duration::from_secs(8)).unwrap();
        assert_eq!(ips(&m), ["192.0.32.10"], "{a}");
        let m = tcp_query(*a, &query_bytes("y.allowed.test", RecordType::A, false)).unwrap();
        assert_eq!(ips(&m), ["192.0.32.10"], "{a}");
    }
}

#[test]
fn not_allowlisted_is_refused_and_never_forwarded() {
    let up = upstream!();
    for who in identities() {
        let p = Proxy::start(&up, ALLOW, who);
        for (name, t) in [
            ("evil.test", RecordType::A),
            ("www.evil.test", RecordType::AAAA),
            ("allowed.test", RecordType::A), // the apex of a wildcard entry
            ("allowed.test.evil.test", RecordType::A),
            ("sub.exact.test", RecordType::A), // below an exact entry
        ] {
            let m = p.ask(name, t);
            assert_eq!(rcode(&m), ResponseCode::Refused, "{name}");
            assert!(m.answers.is_empty());
            assert!(!up.was_asked(name), "{name} was forwarded upstream");
            assert_event(&p.audit, "dns_refused", "alert", |e| {
                e["name"] == name
                    && e["reason"] == "not_allowlisted"
                    && e["qtype"] == t.to_string()
                    && e["client"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("127.0.0.1:"))
            });
        }
        p.stop();
    }
    // --nxdomain answers NXDOMAIN instead.
    let p = Proxy::start(
        &up,
        &["--allow", "exact.test", "--nxdomain"],
        identities()[0],
    );
    assert_eq!(
        rcode(&p.ask("evil.test", RecordType::A)),
        ResponseCode::NXDomain
    );
    assert!(!up.was_asked("evil.test"));
}

#[test]
fn only_allowed_record_types() {
    let up = upstream!();
    let p = Proxy::start(&up, ALLOW, identities()[0]);
    for t in [
        RecordType::TXT,
        RecordType::NULL,
        RecordType::ANY,
        RecordType::PTR,
        RecordType::MX,
        RecordType::SRV,
        RecordType::NS,
    ] {
        let m = p.ask("txt.allowed.test", t);
        assert_eq!(rcode(&m), ResponseCode::Refused, "{t}");
        assert_event(&p.audit, "dns_refused", "alert", |e| {
            e["name"] == "txt.allowed.test" && e["reason"] == "qtype" && e["qtype"] == t.to_string()
        });
    }
    // AXFR only travels over TCP.
    let m = p.ask_tcp("allowed.test", RecordType::AXFR);
    assert_eq!(rcode(&m), ResponseCode::Refused);
    assert!(
        !up.was_asked("txt.allowed.test"),
        "a refused type was forwarded"
    );
    // The allowed types: HTTPS is forwarded and answered.
    let m = p.ask("h.allowed.test", RecordType::HTTPS);
    assert_eq!(rcode(&m), ResponseCode::NoError);
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].record_type(), RecordType::HTTPS);
    p.stop();
    // --qtypes changes the set.
    let p = Proxy::start(
        &up,
        &["--allow", "*.allowed.test", "--qtypes", "A,TXT"],
        identities()[0],
    );
    let m = p.ask("txt.allowed.test", RecordType::TXT);
    assert_eq!(rcode(&m), ResponseCode::NoError);
    assert_eq!(m.answers.len(), 1);
    assert_eq!(
        rcode(&p.ask("a.allowed.test", RecordType::AAAA)),
        ResponseCode::Refused
    );
}

#[test]
fn cname_chains_only_through_allowlisted_names() {
    let up = upstream!();
    let p = Proxy::start(&up, ALLOW, identities()[0]);
    let m = p.ask("alias.allowed.test", RecordType::A);
    assert_eq!(rcode(&m), ResponseCode::NoError);
    assert_eq!(m.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(ips(&m), ["192.0.32.30"]);
    // Two hops, ending at an exact entry.
    let m = p.ask("hop1.allowed.test", RecordType::A);
    assert_eq!(ips(&m), ["192.0.32.20"]);
    // An alias leaving the allowlist is refused, its target never asked.
    let m = p.ask("bad.allowed.test", RecordType::A);
    assert_eq!(rcode(&m), ResponseCode::Refused);
    assert!(m.answers.is_empty());
    assert!(!up.was_asked("www.evil.test"));
    // Asking for the CNAME record itself: the same rule.
    assert_eq!(
        rcode(&p.ask("bad.allowed.test", RecordType::CNAME)),
        ResponseCode::Refused
    );
    let m = p.ask("alias.allowed.test", RecordType::CNAME);
    assert_eq!(m.answers.len(), 1);
    assert_event(&p.audit, "dns_refused", "alert", |e| {
        e["name"] == "bad.allowed.test"
            && e["reason"] == "cname_not_allowlisted"
            && e["detail"].as_str().unwrap().contains("www.evil.test")
    });
}

#[test]
fn rebinding_answers_are_dropped() {
    let up = upstream!();
    for who in identities() {
        let p = Proxy::start(
            &up,
            &["--allow", "*.rebind.test", "--allow", "*.internal.test"],
            who,
        );
        for (name, t) in [
            ("loop.rebind.test", RecordType::A),
            ("priv.rebind.test", RecordType::A),
            ("ll.rebind.test", RecordType::A),
            ("v6.rebind.test", RecordType::AAAA),
            ("svc.internal.test", RecordType::A),
            ("hint.rebind.test", RecordType::HTTPS), // an ipv4hint inside
        ] {
            let m = p.ask(name, t);
            assert_eq!(rcode(&m), ResponseCode::Refused, "{name}");
            assert!(ips(&m).is_empty(), "{name}");
            assert_event(&p.audit, "dns_refused", "alert", |e| {
                e["name"] == name && e["reason"] == "rebinding"
            });
        }
        // A mixed answer keeps the public address only.
        let m = p.ask("mixed.rebind.test", RecordType::A);
        assert_eq!(ips(&m), ["192.0.32.40"]);
        assert_event(&p.audit, "dns_answer_dropped", "alert", |e| {
            e["name"] == "mixed.rebind.test" && e["detail"].as_str().unwrap().contains("10.9.9.9")
        });
        p.stop();
    }
    // Named internal domains may point inside.
    let p = Proxy::start(
        &up,
        &[
            "--allow",
            "*.internal.test",
            "--rebind-allow",
            "internal.test",
        ],
        identities()[0],
    );
    assert_eq!(
        ips(&p.ask("svc.internal.test", RecordType::A)),
        ["10.1.2.3"]
    );
}

/// base32-ish random data, as a tunnel would encode it.
fn random_label(len: usize, seed: &mut u64) -> String {
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            A[(*seed % 32) as usize] as char
        })
        .collect()
}

#[test]
fn tunnelling_is_refused_and_alerted() {
    let up = upstream!();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    for who in identities() {
        let p = Proxy::start(
            &up,
            &["--allow", "*.allowed.test", "--max-subdomains", "20"],
            who,
        );
        // Long random labels (well within DNS limits).
        let long = format!(
            "{}.{}.t.allowed.test",
            random_label(60, &mut seed),
            random_label(60, &mut seed)
        );
        assert_eq!(rcode(&p.ask(&long, RecordType::A)), ResponseCode::Refused);
        assert_eq!(p.refusals(&long, "tunnel_label_length"), 1);
        // High-entropy subdomain in short labels.
        let hi = format!(
            "{}.{}.t.allowed.test",
            random_label(30, &mut seed),
            random_label(30, &mut seed)
        );
        assert_eq!(rcode(&p.ask(&hi, RecordType::A)), ResponseCode::Refused);
        assert_eq!(p.refusals(&hi, "tunnel_entropy"), 1);
        // TXT, the usual tunnel carrier, is refused by type.
        let txt = format!("{}.t.allowed.test", random_label(12, &mut seed));
        assert_eq!(rcode(&p.ask(&txt, RecordType::TXT)), ResponseCode::Refused);
        // Many distinct short subdomains: the first 20 resolve, then refused.
        let mut refused = Vec::new();
        for i in 0..30 {
            let n = format!("{}{i}.allowed.test", random_label(6, &mut seed));
            if rcode(&p.ask(&n, RecordType::A)) == ResponseCode::Refused {
                refused.push(n);
            }
        }
        assert_eq!(refused.len(), 10, "{refused:?}");
        for n in &refused {
            assert!(!up.was_asked(n), "{n} was forwarded");
        }
        assert_event(&p.audit, "dns_refused", "alert", |e| {
            e["reason"] == "tunnel_subdomain_rate" && e["name"] == refused[0].as_str()
        });
        for n in [&long, &hi, &txt] {
            assert!(!up.was_asked(n), "{n} was forwarded");
        }
        p.stop();
    }
}

#[test]
fn refused_queries_are_rate_limited() {
    let up = upstream!();
    let p = Proxy::start(
        &up,
        &[
            "--allow",
            "exact.test",
            "--refused-rate",
            "1",
            "--refused-burst",
            "3",
        ],
        identities()[0],
    );
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(p.addr).unwrap();
    for i in 0..40u16 {
        s.send(&query_bytes_id(
            &format!("n{i}.evil.test"),
            RecordType::A,
            false,
            i,
        ))
        .unwrap();
    }
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut answered = 0;
    let mut buf = [0u8; 1500];
    while s.recv(&mut buf).is_ok() {
        answered += 1;
    }
    assert!(answered >= 3, "the burst is answered ({answered})");
    assert!(
        answered < 40,
        "beyond the limit refused queries are dropped ({answered})"
    );
    assert_event(&p.audit, "dns_rate_limited", "alert", |e| {
        e["dropped"].as_u64().unwrap() >= 1
    });
    // An allowlisted name still resolves for that client.
    assert_eq!(ips(&p.ask("exact.test", RecordType::A)), ["192.0.32.20"]);
}

#[test]
fn answers_are_cached_for_their_ttl() {
    let up = upstream!("--host-record=short.allowed.test,192.0.32.77,2");
    let p = Proxy::start(&up, ALLOW, identities()[0]);
    let first = p.ask("c.allowed.test", RecordType::A);
    let second = p.ask("c.allowed.test", RecordType::A);
    assert_eq!(ips(&second), ["192.0.32.10"]);
    assert!(second.answers[0].ttl <= first.answers[0].ttl);
    assert!(first.answers[0].ttl <= 300 && first.answers[0].ttl >= 290);
    assert_eq!(
        up.times_asked("c.allowed.test"),
        1,
        "the second answer came from the cache"
    );
    // A 2-second TTL: after it, upstream is asked again.
    p.ask("short.allowed.test", RecordType::A);
    p.ask("short.allowed.test", RecordType::A);
    assert_eq!(up.times_asked("short.allowed.test"), 1);
    std::thread::sleep(Duration::from_millis(3100));
    assert_eq!(
        ips(&p.ask("short.allowed.test", RecordType::A)),
        ["192.0.32.77"]
    );
    assert_eq!(up.times_asked("short.allowed.test"), 2);
}

#[test]
fn dead_upstream_gives_servfail_in_bounded_time() {
    // A black hole: a bound UDP socket nobody reads, and a TCP port closed.
    let hole = UdpSocket::bind("127.0.0.1:0").unwrap();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &hole.local_addr().unwrap().to_string(),
        "--allow",
        "*.allowed.test",
        "--upstream-timeout",
        "300ms",
        "--query-timeout",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for who in identities() {
        let p = Proxy::start_raw(&args, who);
        let t0 = Instant::now();
        let m = udp_query(
            p.addr,
            "a.allowed.test",
            RecordType::A,
            Duration::from_secs(10),
        )
        .expect("an answer, not a hang");
        assert_eq!(rcode(&m), ResponseCode::ServFail);
        let m = p.ask_tcp("b.allowed.test", RecordType::A);
        assert_eq!(rcode(&m), ResponseCode::ServFail);
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert_event(&p.audit, "dns_upstream_failed", "warn", |e| {
            e["name"] == "a.allowed.test"
        });
        p.stop();
    }
}

#[test]
fn sighup_reloads_without_dropping_queries() {
    let up = upstream!();
    let dir = sbx_testutil::shared_tempdir();
    let file = dir.path().join("allow.txt");
    std::fs::write(&file, "# test list\na.allowed.test\n").unwrap();
    sbx_testutil::chown_to_test_user(&file);
    for who in identities() {
        std::fs::write(&file, "# test list\na.allowed.test\n").unwrap();
        let p = Proxy::start(&up, &["--allow-file", file.to_str().unwrap()], who);
        assert_eq!(
            rcode(&p.ask("b.allowed.test", RecordType::A)),
            ResponseCode::Refused
        );
        std::fs::write(&file, "a.allowed.test\nb.allowed.test  # added\n").unwrap();
        p.signal(libc::SIGHUP);
        // Queries keep being answered while the list is swapped.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert_eq!(
                ips(&p.ask("a.allowed.test", RecordType::A)),
                ["192.0.32.10"]
            );
            if rcode(&p.ask("b.allowed.test", RecordType::A)) == ResponseCode::NoError {
                break;
            }
            assert!(Instant::now() < deadline, "reload not applied");
        }
        assert_event(&p.audit, "allowlist_reloaded", "info", |e| {
            e["entries"] == 2
        });
        // A bad file keeps the old list.
        std::fs::write(&file, "*.com\n").unwrap();
        p.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !p
            .events()
            .iter()
            .any(|e| e["event"] == "allowlist_reload_failed")
        {
            assert!(Instant::now() < deadline, "no reload failure reported");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            ips(&p.ask("b.allowed.test", RecordType::A)),
            ["192.0.32.10"]
        );
        let (code, _) = p.stop();
        assert_eq!(code, 0);
    }
}

#[test]
fn sigterm_drains_queries_in_flight() {
    let hole = UdpSocket::bind("127.0.0.1:0").unwrap();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &hole.local_addr().unwrap().to_string(),
        "--allow",
        "*.allowed.test",
        "--upstream-timeout",
        "1s",
        "--query-timeout",
        "1s",
        "--stats",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let p = Proxy::start_raw(&args, identities()[0]);
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.connect(p.addr).unwrap();
    c.send(&query_bytes_id(
        "slow.allowed.test",
        RecordType::A,
        false,
        4242,
    ))
    .unwrap();
    // The query is in flight (upstream silent) when SIGTERM arrives.
    let deadline = Instant::now() + Duration::from_secs(5);
    while hole.peek_from(&mut [0u8; 1]).is_err() {
        assert!(Instant::now() < deadline);
    }
    let addr = p.addr;
    let (code, out) = p.stop();
    assert_eq!(code, 0);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 512];
    let n = c
        .recv(&mut buf)
        .expect("the query in flight was answered before exit");
    let m = hickory_proto::op::Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(m.metadata.id, 4242);
    assert_eq!(rcode(&m), ResponseCode::ServFail);
    // --stats printed the counters at exit.
    let stats: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(stats["stats"]["queries"], 1);
    assert_eq!(stats["stats"]["servfail"], 1);
    // Nothing listens any more.
    assert!(
        udp_query(
            addr,
            "a.allowed.test",
            RecordType::A,
            Duration::from_millis(300)
        )
        .is_none()
    );
}

#[test]
fn stats_on_sigusr1() {
    let up = upstream!();
    let mut p = Proxy::start(&up, &["--allow", "exact.test"], identities()[0]);
    p.ask("exact.test", RecordType::A);
    p.ask("exact.test", RecordType::A);
    p.ask("evil.test", RecordType::A);
    p.signal(libc::SIGUSR1);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut p.stdout, &mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let s = &v["stats"];
    assert_eq!(s["queries"], 3);
    assert_eq!(s["cache_hits"], 1);
    assert_eq!(s["refused_not_allowlisted"], 1);
    assert_eq!(s["upstream_queries"], 1);
}

#[test]
fn settings_from_a_config_file() {
    let up = upstream!();
    let dir = sbx_testutil::shared_tempdir();
    let cfg = dir.path().join("sbx.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"sbx-dnsproxy": {{"listen": ["127.0.0.1:0"], "upstream": ["{}"],
                "allow": ["*.allowed.test"], "nxdomain": true, "max-subdomains": 50}}}}"#,
            up.addr
        ),
    )
    .unwrap();
    sbx_testutil::chown_to_test_user(&cfg);
    for who in identities() {
        let p = Proxy::start_raw(
            &["--config".to_string(), cfg.to_str().unwrap().to_string()],
            who,
        );
        assert_eq!(
            ips(&p.ask("a.allowed.test", RecordType::A)),
            ["192.0.32.10"]
        );
        assert_eq!(
            rcode(&p.ask("evil.test", RecordType::A)),
            ResponseCode::NXDomain
        );
        p.stop();
    }
    // An unknown key is one line, 125.
    std::fs::write(
        &cfg,
        r#"{"sbx-dnsproxy": {"listen": ["127.0.0.1:0"], "bogus": 1}}"#,
    )
    .unwrap();
    let mut c = sbx_testutil::tool("sbx-dnsproxy");
    c.arg("--config").arg(&cfg);
    let out = sbx_testutil::output(&mut c);
    assert_usage_error(&out, "bogus");
}

#[test]
fn several_queries_on_one_tcp_connection() {
    use std::io::{Read, Write};
    let up = upstream!();
    let p = Proxy::start(&up, ALLOW, identities()[0]);
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    // Three queries written at once (pipelined), three answers in order.
    let mut out = Vec::new();
    for (i, n) in ["a.allowed.test", "exact.test", "evil.test"]
        .iter()
        .enumerate()
    {
        let q = query_bytes_id(n, RecordType::A, false, 100 + i as u16);
        out.extend_from_slice(&(q.len() as u16).to_be_bytes());
        out.extend_from_slice(&q);
    }
    s.write_all(&out).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let mut len = [0u8; 2];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        let m = hickory_proto::op::Message::from_vec(&buf).unwrap();
        got.push((m.metadata.id, rcode(&m), ips(&m)));
    }
    assert_eq!(
        got[0],
        (100, ResponseCode::NoError, vec!["192.0.32.10".to_string()])
    );
    assert_eq!(
        got[1],
        (101, ResponseCode::NoError, vec!["192.0.32.20".to_string()])
    );
    assert_eq!(got[2], (102, ResponseCode::Refused, vec![]));
}
