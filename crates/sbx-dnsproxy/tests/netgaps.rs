//! The gaps an attacker pass found in sbx-dnsproxy (issue 15 follow-up):
//! hex/base32/base64url tunnels that pass the entropy check, and
//! rebinding answers in special-purpose ranges (6to4, Teredo, NAT64,
//! benchmarking, reserved, documentation, CGNAT, mapped/compatible v6).
//! Against a real upstream (dnsmasq), as root and as the test user.

mod common;

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use sbx_testutil::identities;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `len` characters of `alphabet`-encoded random data, lower-cased
    /// (as a resolver may send it), cut into labels of at most `per`.
    fn encoded(&mut self, alphabet: &[u8], len: usize, per: usize) -> String {
        let s: Vec<u8> = (0..len)
            .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize].to_ascii_lowercase())
            .collect();
        // A label may not start or end with '-' (tunnels avoid it too).
        s.chunks(per)
            .map(|c| {
                let mut l = c.to_vec();
                for i in [0, l.len() - 1] {
                    if l[i] == b'-' {
                        l[i] = b'0';
                    }
                }
                String::from_utf8(l).unwrap()
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

const HEX: &[u8] = b"0123456789abcdef";
const BASE32: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
const BASE64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A tunnel in each encoding, chunks of 20-40 characters in labels short
/// enough for the length checks (hex stays under the entropy limit):
/// refused before anything is forwarded, each with a tunnel_* alert. Then
/// a slow tunnel of short chunks (below the encoding score's threshold)
/// runs into the novel-bytes budget. CDN-style hash names resolve.
#[test]
fn encoded_tunnels_are_refused_whatever_the_alphabet() {
    let up = upstream!();
    let mut rng = Rng(0x5eed_0000_1234_5678 ^ u64::from(std::process::id()));
    for who in identities() {
        // The refusal rate limit off: every refusal is answered, so each
        // one can be checked (the limit is tested elsewhere).
        let p = Proxy::start(
            &up,
            &["--allow", "*.allowed.test", "--refused-rate", "0"],
            who,
        );
        // Ordinary CDN hashes first: they resolve.
        for ok in [
            "d1a2b3c4.allowed.test",
            "d111111abcdef8.allowed.test",
            "r2---sn-4g5e6nsz.allowed.test",
            "ec2-54-123-45-67.eu-west-1.allowed.test",
        ] {
            let m = p.ask(ok, RecordType::A);
            assert_eq!(rcode(&m), ResponseCode::NoError, "{ok}");
            assert_eq!(ips(&m), ["192.0.32.10"], "{ok}");
        }
        for (enc, alphabet) in [("hex", HEX), ("base32", BASE32), ("base64url", BASE64URL)] {
            let mut refused = 0;
            let total = 40;
            for i in 0..total {
                let data = rng.encoded(alphabet, 20 + i % 21, 30);
                let name = format!("{data}.{i}.t.allowed.test");
                let m = p.ask(&name, RecordType::A);
                if rcode(&m) == ResponseCode::Refused {
                    refused += 1;
                    assert!(!up.was_asked(&name), "{enc}: {name} was forwarded");
                    let evs = p.events();
                    assert!(
                        evs.iter().any(|e| e["event"] == "dns_refused"
                            && e["severity"] == "alert"
                            && e["name"] == name.as_str()
                            && e["reason"].as_str().unwrap_or("").starts_with("tunnel_")),
                        "{enc}: no alert for {name}"
                    );
                }
            }
            assert!(
                refused * 10 >= total * 9,
                "{enc}: only {refused}/{total} refused"
            );
        }
        p.stop();
        // The slow tunnel: 12-character chunks (not scored), under one
        // wildcard entry, distinct-name limit off: the novel bytes budget
        // (2048 per window) stops it.
        let p = Proxy::start(
            &up,
            &["--allow", "*.allowed.test", "--max-subdomains", "0"],
            who,
        );
        let mut first_refused = None;
        for i in 0..400 {
            let name = format!("{}.allowed.test", rng.encoded(HEX, 12, 30));
            if rcode(&p.ask(&name, RecordType::A)) == ResponseCode::Refused {
                first_refused = Some((i, name));
                break;
            }
        }
        let (i, name) = first_refused.expect("the novel-bytes budget never stopped the tunnel");
        assert!((150..=171).contains(&i), "stopped after {i} names");
        assert!(!up.was_asked(&name));
        assert_event(&p.audit, "dns_refused", "alert", |e| {
            e["name"] == name.as_str() && e["reason"] == "tunnel_novel_bytes"
        });
        p.stop();
    }
}

/// Every special-purpose block an answer may point into is dropped as
/// rebinding (with its alert), also when an IPv6 form embeds a private or
/// loopback IPv4 address; public addresses still resolve.
#[test]
fn special_purpose_answers_are_rebinding() {
    let cases: &[(&str, &str, RecordType, &str)] = &[
        (
            "bench.special.test",
            "198.18.0.1",
            RecordType::A,
            "benchmarking",
        ),
        (
            "bench2.special.test",
            "198.19.255.1",
            RecordType::A,
            "benchmarking",
        ),
        (
            "class-e.special.test",
            "240.0.0.1",
            RecordType::A,
            "reserved",
        ),
        (
            "ietf.special.test",
            "192.0.0.8",
            RecordType::A,
            "ietf_protocol",
        ),
        (
            "doc1.special.test",
            "192.0.2.1",
            RecordType::A,
            "documentation",
        ),
        (
            "doc2.special.test",
            "198.51.100.1",
            RecordType::A,
            "documentation",
        ),
        (
            "doc3.special.test",
            "203.0.113.1",
            RecordType::A,
            "documentation",
        ),
        (
            "cgnat.special.test",
            "100.64.0.1",
            RecordType::A,
            "shared_cgnat",
        ),
        (
            "sixtofour.special.test",
            "2002:a00:1::1",
            RecordType::AAAA,
            "private",
        ),
        (
            "sixtofour-lo.special.test",
            "2002:7f00:1::1",
            RecordType::AAAA,
            "loopback",
        ),
        (
            "teredo.special.test",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            RecordType::AAAA,
            "teredo",
        ),
        (
            "nat64.special.test",
            "64:ff9b::a00:1",
            RecordType::AAAA,
            "private",
        ),
        (
            "nat64-ll.special.test",
            "64:ff9b::a9fe:a9fe",
            RecordType::AAAA,
            "link_local",
        ),
        (
            "compat.special.test",
            "::a00:1",
            RecordType::AAAA,
            "private",
        ),
        (
            "doc6.special.test",
            "2001:db8::1",
            RecordType::AAAA,
            "documentation",
        ),
    ];
    let mut extra: Vec<String> = cases
        .iter()
        .map(|(n, a, _, _)| format!("--host-record={n},{a}"))
        .collect();
    extra.push("--host-record=public.special.test,93.184.216.34,2606:4700::1111".into());
    let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    let Some(up) = Upstream::start(&refs) else {
        sbx_testutil::skip!("dnsmasq not installed (scripts/setup installs dnsmasq-base)");
    };
    for who in identities() {
        let p = Proxy::start(&up, &["--allow", "*.special.test"], who);
        for (name, addr, t, kind) in cases {
            let m = p.ask(name, *t);
            assert_eq!(rcode(&m), ResponseCode::Refused, "{name} ({addr})");
            assert!(ips(&m).is_empty(), "{name}");
            assert_event(&p.audit, "dns_refused", "alert", |e| {
                e["name"] == *name
                    && e["reason"] == "rebinding"
                    && e["detail"].as_str().unwrap_or("").contains(kind)
            });
        }
        assert_eq!(
            ips(&p.ask("public.special.test", RecordType::A)),
            ["93.184.216.34"]
        );
        assert_eq!(
            ips(&p.ask("public.special.test", RecordType::AAAA)),
            ["2606:4700::1111"]
        );
        p.stop();
    }
}
