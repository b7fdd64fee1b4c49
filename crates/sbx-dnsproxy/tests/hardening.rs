//! Issue 15, "Network and DNS": the allowlist matched on wire labels, the
//! budgets keyed by client prefix, the choice-of-name budget, and DNS
//! conformance (BADVERS, DNSSEC pass-through, CNAME loops, a silent
//! upstream), each against a real upstream (dnsmasq on 127.0.0.1).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use proptest::prelude::*;
use sbx_dnsproxy::{Allowlist, DnsProxy, ProxyConfig, TunnelLimits};
use sbx_testutil::identities;

const ALLOW: &[&str] = &["--allow", "*.allowed.test", "--allow", "exact.test"];

/// A query for `name` given as wire labels (a label may hold any byte).
fn query_for(name: &Name, t: RecordType) -> Vec<u8> {
    use hickory_proto::op::{MessageType, OpCode, Query};
    let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name.clone(), t));
    m.to_vec().unwrap()
}

/// `x\.allowed.test` is ONE label "x.allowed" under "test": its
/// presentation form split on '.' would put it under `*.allowed.test`.
#[test]
fn escaped_dot_label_is_refused_never_forwarded_and_alerted() {
    let up = upstream!();
    for who in identities() {
        let p = Proxy::start(&up, ALLOW, who);
        let before = up.queries().len();
        for labels in [
            &[&b"x.allowed"[..], b"test"][..],
            &[b"a.b.allowed", b"test"],
            &[b"x y", b"allowed", b"test"],
            &[b"x\\", b"allowed", b"test"],
        ] {
            let name = Name::from_labels(labels.iter().copied()).unwrap();
            let presentation = name.to_ascii();
            let q = query_for(&name, RecordType::A);
            let m = udp_exchange(p.addr, &q, Duration::from_secs(8)).expect("UDP answer");
            assert_eq!(rcode(&m), ResponseCode::Refused, "{presentation} over UDP");
            assert!(m.answers.is_empty());
            let m = tcp_query(p.addr, &q).expect("TCP answer");
            assert_eq!(rcode(&m), ResponseCode::Refused, "{presentation} over TCP");
        }
        // A real name under the wildcard still resolves (the upstream
        // answers it), so the refusal above is the matcher's doing.
        assert_eq!(ips(&p.ask("x.allowed.test", RecordType::A)), ["192.0.2.10"]);
        let after: Vec<String> = up.queries()[before..].to_vec();
        assert_eq!(
            after.len(),
            1,
            "only the plain name reached the upstream: {after:?}"
        );
        assert!(
            p.refusals("x\\.allowed.test", "bad_name") >= 2,
            "{:?}",
            p.events()
        );
        p.stop();
    }
}

/// The reference decision, from the wire labels: every label a hostname
/// label, and the labels equal to `exact.test` or ending in
/// `allowed.test` with at least one more label.
fn reference(labels: &[Vec<u8>]) -> bool {
    let ok = labels.iter().all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && l.iter()
                .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    });
    let lc: Vec<Vec<u8>> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
    let is = |l: &Vec<u8>, s: &str| l.as_slice() == s.as_bytes();
    let exact = lc.len() == 2 && is(&lc[0], "exact") && is(&lc[1], "test");
    let wild = lc.len() >= 3 && is(&lc[lc.len() - 2], "allowed") && is(&lc[lc.len() - 1], "test");
    ok && (exact || wild)
}

fn label() -> impl Strategy<Value = Vec<u8>> {
    // Bytes a hostname has, and bytes that confuse a presentation form.
    let byte = prop_oneof![
        4 => prop::sample::select(b"abxAB09-_".to_vec()),
        1 => prop::sample::select(b".\\ \"();$@*".to_vec()),
        1 => any::<u8>(),
    ];
    prop_oneof![
        6 => prop::collection::vec(byte, 1..6),
        1 => prop::sample::select(vec![
            b"allowed".to_vec(),
            b"test".to_vec(),
            b"exact".to_vec(),
            b"allowed.test".to_vec(),
            b"x.allowed".to_vec(),
            b"ALLOWED".to_vec(),
        ]),
    ]
}

fn names() -> impl Strategy<Value = Vec<Vec<u8>>> {
    (
        prop::collection::vec(label(), 0..4),
        prop::sample::select(vec![
            vec![],
            vec![b"test".to_vec()],
            vec![b"allowed".to_vec(), b"test".to_vec()],
            vec![b"exact".to_vec(), b"test".to_vec()],
            vec![b"allowed.test".to_vec()],
        ]),
    )
        .prop_map(|(mut a, b)| {
            a.extend(b);
            a
        })
        .prop_filter("a name at all", |v| !v.is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The matcher against hickory's own parser: names built from wire
    /// labels (any byte), through hickory's presentation form and back,
    /// and the proxy's decision on the wire query.
    #[test]
    fn matcher_agrees_with_the_wire_labels(labels in names()) {
        let Ok(name) = Name::from_labels(labels.clone()) else {
            return Ok(()); // too long for a name: hickory refuses it too
        };
        let want = reference(&labels);
        let allow = Allowlist::parse(&["*.allowed.test", "exact.test"]).unwrap();
        // The wire-label form.
        let wire = sbx_dnsproxy::allow::name_from_wire(&name);
        prop_assert_eq!(wire.as_deref().is_some_and(|n| allow.matches(n).is_some()), want);
        // The presentation form (escapes and all) never matches more.
        let ascii = name.to_ascii();
        let pres = ascii.strip_suffix('.').unwrap_or(&ascii).to_ascii_lowercase();
        prop_assert!(allow.matches(&pres).is_none() || want, "{} matched", pres);
        // What hickory's presentation-form parser reads back is the same
        // labels, and the same decision.
        if let Ok(back) = Name::from_ascii(&ascii) {
            prop_assert_eq!(back.iter().map(|l| l.to_ascii_lowercase()).collect::<Vec<_>>(),
                labels.iter().map(|l| l.to_ascii_lowercase()).collect::<Vec<_>>());
            let again = sbx_dnsproxy::allow::name_from_wire(&back);
            prop_assert_eq!(again.as_deref().is_some_and(|n| allow.matches(n).is_some()), want);
        }
        // The proxy: allowed names go upstream (none here: SERVFAIL),
        // everything else is REFUSED before any upstream is asked.
        let reply = RT.with(|rt| rt.block_on(PROXY.with(|p| {
            let p = p.clone();
            let q = query_for(&name, RecordType::A);
            async move { p.handle(&q, "127.0.0.1:5000".parse::<SocketAddr>().unwrap()).await }
        })));
        let m = Message::from_vec(&reply.expect("an answer")).unwrap();
        let expect = if want { ResponseCode::ServFail } else { ResponseCode::Refused };
        prop_assert_eq!(m.metadata.response_code, expect, "{:?}", labels);
    }
}

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    static PROXY: std::sync::Arc<DnsProxy> = DnsProxy::new(ProxyConfig {
        allow: vec!["*.allowed.test".into(), "exact.test".into()],
        // No upstream: an allowed name fails fast (SERVFAIL), and nothing
        // can be forwarded anywhere.
        upstreams: vec![],
        refused_rate: 0,
        tunnel: TunnelLimits {
            max_label_len: 0,
            max_name_len: 0,
            max_entropy: 0.0,
            max_distinct_per_window: 0,
            max_queries_per_window: 0,
            ..TunnelLimits::default()
        },
        ..Default::default()
    })
    .unwrap();
}
