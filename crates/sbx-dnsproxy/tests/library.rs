//! The library API sbx-net uses: DnsProxy::handle with a real upstream,
//! the AnswerLog, UDP truncation, and an allowlist of 1,000,000 entries.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use sbx_dnsproxy::{AllowEntry, DnsProxy, ProxyConfig, parse_allow_entry};

fn client() -> SocketAddr {
    "127.0.0.1:40000".parse().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn handle_and_answer_log() {
    let up = upstream!();
    let proxy = DnsProxy::new(ProxyConfig {
        allow: vec![
            "*.allowed.test".into(),
            "exact.test".into(),
            "192.0.32.99".into(),
        ],
        upstreams: vec![up.addr],
        ..Default::default()
    })
    .unwrap();
    let log = proxy.answers();
    rt().block_on(async {
        let r = proxy
            .handle(
                &query_bytes("a.allowed.test", RecordType::A, true),
                client(),
            )
            .await
            .unwrap();
        let m = Message::from_vec(&r).unwrap();
        assert_eq!(ips(&m), ["192.0.32.10"]);
        let ip: IpAddr = "192.0.32.10".parse().unwrap();
        assert_eq!(log.names_for(ip), ["a.allowed.test"]);
        let a = &log.lookup(ip)[0];
        assert!(a.ttl <= 300 && a.ttl > 0);

        // A CNAME chain: every name of the chain is recorded for the address.
        proxy
            .handle(
                &query_bytes("hop1.allowed.test", RecordType::A, true),
                client(),
            )
            .await
            .unwrap();
        let mut names = log.names_for("192.0.32.20".parse().unwrap());
        names.sort();
        assert_eq!(
            names,
            ["exact.test", "hop1.allowed.test", "hop2.allowed.test"]
        );

        // Refused names and rebinding answers leave nothing in the log.
        let r = proxy
            .handle(&query_bytes("www.evil.test", RecordType::A, true), client())
            .await
            .unwrap();
        assert_eq!(
            Message::from_vec(&r).unwrap().metadata.response_code,
            ResponseCode::Refused
        );
        assert!(log.names_for("198.51.200.66".parse().unwrap()).is_empty());
        let r = proxy
            .handle(
                &query_bytes("bad.allowed.test", RecordType::A, true),
                client(),
            )
            .await
            .unwrap();
        assert_eq!(
            Message::from_vec(&r).unwrap().metadata.response_code,
            ResponseCode::Refused
        );
        assert!(log.names_for("198.51.200.66".parse().unwrap()).is_empty());

        // Garbage: dropped or FORMERR, never a panic.
        assert!(proxy.handle(&[1, 2, 3], client()).await.is_none());
    });
    assert_eq!(
        proxy.allowlist().ips(),
        ["192.0.32.99".parse::<IpAddr>().unwrap()]
    );
    assert!(proxy.is_allowed("X.Allowed.Test."));
    assert!(!proxy.is_allowed("allowed.test"));
}

#[test]
fn udp_replies_are_truncated_to_the_client_size() {
    let extra: Vec<String> = (1..=60)
        .map(|i| format!("--host-record=big.allowed.test,203.0.213.{i}"))
        .collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let up = match Upstream::start(&extra) {
        Some(u) => u,
        None => sbx_testutil::skip!("dnsmasq not installed"),
    };
    let proxy = DnsProxy::new(ProxyConfig {
        allow: vec!["*.allowed.test".into()],
        upstreams: vec![up.addr],
        ..Default::default()
    })
    .unwrap();
    rt().block_on(async {
        let q = query_bytes("big.allowed.test", RecordType::A, false);
        // Over TCP (handle) first: everything. (First, so that the answer
        // under test is the upstream's big one, not a SERVFAIL from an
        // upstream still starting on a loaded machine.)
        let mut m = Message::from_vec(&proxy.handle(&q, client()).await.unwrap()).unwrap();
        for _ in 0..50 {
            if ips(&m).len() == 60 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            m = Message::from_vec(&proxy.handle(&q, client()).await.unwrap()).unwrap();
        }
        assert!(!m.metadata.truncation);
        assert_eq!(ips(&m).len(), 60, "{m:?}");
        // No EDNS: at most 512 bytes over UDP, so TC and no answers.
        let r = proxy.handle_udp(&q, client()).await.unwrap();
        assert!(r.len() <= 512);
        let m = Message::from_vec(&r).unwrap();
        assert!(m.metadata.truncation, "{m:?}");
        assert!(m.answers.is_empty());
        // With EDNS 1232 it fits over UDP.
        let r = proxy
            .handle_udp(
                &query_bytes("big.allowed.test", RecordType::A, true),
                client(),
            )
            .await
            .unwrap();
        assert_eq!(ips(&Message::from_vec(&r).unwrap()).len(), 60);
    });
}

#[test]
fn a_million_entries() {
    let up = upstream!();
    let mut allow: Vec<String> = (0..1_000_000)
        .map(|i| format!("host{i}.allowed.test"))
        .collect();
    allow.push("*.wild.allowed.test".into());
    let proxy = DnsProxy::new(ProxyConfig {
        allow,
        upstreams: vec![up.addr],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(proxy.allowlist().len(), 1_000_001);
    rt().block_on(async {
        for (name, ok) in [
            ("host0.allowed.test", true),
            ("host999999.allowed.test", true),
            ("host1000000.allowed.test", false),
            ("x.y.wild.allowed.test", true),
            ("wild.allowed.test", false),
        ] {
            let r = proxy
                .handle(&query_bytes(name, RecordType::A, true), client())
                .await
                .unwrap();
            let m = Message::from_vec(&r).unwrap();
            let want = if ok {
                ResponseCode::NoError
            } else {
                ResponseCode::Refused
            };
            assert_eq!(m.metadata.response_code, want, "{name}");
        }
    });
    assert!(!up.was_asked("host1000000.allowed.test"));
}

#[test]
fn shared_entry_validation() {
    assert_eq!(
        parse_allow_entry("*.example.com").unwrap(),
        AllowEntry::Subdomains("example.com".into())
    );
    assert_eq!(
        parse_allow_entry("2a00:db8::1").unwrap(),
        AllowEntry::Ip("2a00:db8::1".parse().unwrap())
    );
    let e = parse_allow_entry("*.com").unwrap_err().to_string();
    assert!(e.contains("'*.com'"), "{e}");
    let e = DnsProxy::new(ProxyConfig {
        allow: vec!["ok.test".into(), "*".into()],
        ..Default::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("'*'"), "{e}");
    let _ = Duration::ZERO;
}

/// The fast path (wire templates) and the slow path (hickory messages)
/// give the same answers.
#[test]
fn fast_and_slow_paths_agree() {
    let up = upstream!();
    let mk = |fast| {
        DnsProxy::new(ProxyConfig {
            allow: vec![
                "*.allowed.test".into(),
                "exact.test".into(),
                "*.rebind.test".into(),
            ],
            upstreams: vec![up.addr],
            fast_path: fast,
            refused_rate: 0,
            ..Default::default()
        })
        .unwrap()
    };
    let (fast, slow) = (mk(true), mk(false));
    let summary = |r: &[u8]| {
        let m = Message::from_vec(r).unwrap();
        let mut answers: Vec<String> = m
            .answers
            .iter()
            .chain(m.authorities.iter())
            .map(|r| {
                format!(
                    "{} {} {}",
                    r.name.to_ascii().to_lowercase(),
                    r.record_type(),
                    r.data
                )
            })
            .collect();
        answers.sort();
        (
            m.metadata.id,
            m.metadata.response_code,
            m.metadata.recursion_desired,
            m.metadata.recursion_available,
            m.metadata.truncation,
            m.queries[0].name().to_ascii(),
            m.edns.is_some(),
            answers,
        )
    };
    rt().block_on(async {
        for (name, t) in [
            ("A.Allowed.Test", RecordType::A),
            ("a.allowed.test", RecordType::AAAA),
            ("alias.allowed.test", RecordType::A),
            ("hop1.allowed.test", RecordType::A),
            ("exact.test", RecordType::A),
            ("nx.exact.test", RecordType::A),
            ("h.allowed.test", RecordType::HTTPS),
            ("evil.test", RecordType::A),
            ("txt.allowed.test", RecordType::TXT),
            ("mixed.rebind.test", RecordType::A),
            ("priv.rebind.test", RecordType::A),
            ("bad.allowed.test", RecordType::A),
        ] {
            for edns in [true, false] {
                // Twice: the second from the cache.
                for _ in 0..2 {
                    let q = query_bytes_id(name, t, edns, 777);
                    let a = fast.handle_udp(&q, client()).await.unwrap();
                    let b = slow.handle_udp(&q, client()).await.unwrap();
                    assert_eq!(summary(&a), summary(&b), "{name} {t} edns={edns}");
                }
            }
        }
    });
    assert!(fast.stats().to_json()["cache_hits"].as_u64().unwrap() > 0);
}

/// Identical questions in flight at once cause one upstream query.
#[test]
fn concurrent_identical_questions_share_one_upstream_query() {
    let up = upstream!();
    let proxy = DnsProxy::new(ProxyConfig {
        allow: vec!["*.allowed.test".into()],
        upstreams: vec![up.addr],
        ..Default::default()
    })
    .unwrap();
    rt().block_on(async {
        let q = query_bytes("same.allowed.test", RecordType::A, true);
        let (a, b, c, d) = tokio::join!(
            proxy.handle(&q, client()),
            proxy.handle(&q, client()),
            proxy.handle_udp(&q, client()),
            proxy.handle(&q, client()),
        );
        for r in [a, b, c, d] {
            assert_eq!(
                ips(&Message::from_vec(&r.unwrap()).unwrap()),
                ["192.0.32.10"]
            );
        }
    });
    assert_eq!(up.times_asked("same.allowed.test"), 1);
}
