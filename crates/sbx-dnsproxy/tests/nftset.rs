//! --nftset: answers for allowlisted names land in nftables sets. Runs in
//! a network namespace the test creates (a user namespace too when
//! unprivileged), never against the host's ruleset.

mod common;

use std::process::Command;

use sbx_testutil::{As, have, identities, run_as, skip};

const SCRIPT: &str = r#"
set -eu
ip link set lo up
nft add table inet sbxt
nft add set inet sbxt ok4 '{ type ipv4_addr; flags timeout; }'
nft add set inet sbxt ok6 '{ type ipv6_addr; }'
# The upstream: unbound (dnsmasq cannot drop privileges in a user namespace).
cat >"$DIR/unbound.conf" <<EOC
server:
  interface: 127.0.0.1
  port: 5300
  username: ""
  chroot: ""
  directory: "$DIR"
  pidfile: ""
  do-daemonize: no
  use-syslog: no
  logfile: ""
  module-config: "iterator"
  local-zone: "allowed.test." redirect
  local-data: "allowed.test. 120 IN A 192.0.32.10"
  local-data: "allowed.test. 120 IN AAAA 2a00:db8::10"
  local-data: "evil.test. 120 IN A 198.51.200.66"
remote-control:
  control-enable: no
EOC
"$UNBOUND" -d -c "$DIR/unbound.conf" &
up=$!
px=
# Whatever happens, nothing started here outlives the script.
trap 'kill $up $px 2>/dev/null || true' EXIT
"$PROXY" --listen 127.0.0.1:5301 --upstream 127.0.0.1:5300 --allow '*.allowed.test' \
    --answer-grace 30s --nftset inet:sbxt:ok4 --nftset inet:sbxt:ok6 >"$OUT" 2>&1 &
px=$!
i=0
until grep -q listening "$OUT"; do i=$((i+1)); [ $i -lt 500 ] || { cat "$OUT"; exit 3; }; sleep 0.01; done
i=0
until dig +time=1 +tries=1 -p 5300 @127.0.0.1 evil.test >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 50 ] || exit 4; done
echo "A=$(dig +short -p 5301 @127.0.0.1 a.allowed.test A)"
echo "AAAA=$(dig +short -p 5301 @127.0.0.1 b.allowed.test AAAA)"
echo "EVIL=$(dig +short -p 5301 @127.0.0.1 evil.test A)"
echo "--- ok4"; nft list set inet sbxt ok4
echo "--- ok6"; nft list set inet sbxt ok6
# A second answer for the same address refreshes the timeout (no error).
dig +short -p 5301 @127.0.0.1 c.allowed.test A >/dev/null
echo "--- ok4 again"; nft list set inet sbxt ok4
kill $px $up
wait $px || true
"#;

#[test]
fn answers_are_published_to_nft_sets() {
    for prog in ["nft", "dig", "unshare", "ip"] {
        if !have(prog) && !std::path::Path::new(&format!("/usr/sbin/{prog}")).exists() {
            skip!("{prog} not installed (scripts/setup)");
        }
    }
    let Some(unbound) = ["/usr/sbin/unbound", "/usr/bin/unbound"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        skip!("unbound not installed (scripts/setup)");
    };
    for who in identities() {
        let dir = sbx_testutil::shared_tempdir();
        let mut c = Command::new("unshare");
        if who == As::User || !sbx_testutil::is_root() {
            c.args(["--user", "--map-root-user"]);
        }
        c.args(["--net", "--", "sh", "-c", SCRIPT])
            .env("UNBOUND", unbound)
            .env("DIR", dir.path())
            .env("PROXY", sbx_testutil::bin("sbx-dnsproxy"))
            .env("OUT", dir.path().join("proxy.out"))
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && err.contains("unshare failed") {
            skip!("cannot create a network namespace as {who:?}: {err}");
        }
        assert!(
            out.status.success(),
            "{who:?} {:?}: {text}\n{err}",
            out.status
        );
        assert!(text.contains("A=192.0.32.10"), "{text}");
        assert!(text.contains("AAAA=2a00:db8::10"), "{text}");
        assert!(text.contains("EVIL=\n"), "{text}");
        let (ok4, rest) = text.split_once("--- ok6").unwrap();
        let (ok6, again) = rest.split_once("--- ok4 again").unwrap();
        assert!(
            ok4.contains("192.0.32.10 timeout"),
            "TTL-bound element: {ok4}"
        );
        assert!(
            !ok4.contains("198.51.200.66"),
            "a refused name's address is not published: {ok4}"
        );
        assert!(ok6.contains("2a00:db8::10"), "{ok6}");
        assert!(!ok6.contains("192.0.32.10"));
        assert!(again.contains("192.0.32.10 timeout"), "{again}");
    }
}
