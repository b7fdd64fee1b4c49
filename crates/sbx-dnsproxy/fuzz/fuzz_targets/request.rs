//! The request path: any bytes as a DNS message from a client, over UDP
//! (truncation) and TCP semantics. The upstream is a closed local port, so
//! an allowlisted question fails fast (SERVFAIL) and nothing leaves the
//! machine. The reply, when there is one, must be a well-formed response
//! with the query's id.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sbx_dnsproxy::{DnsProxy, ProxyConfig, TunnelLimits};

fn proxy() -> &'static (Arc<DnsProxy>, tokio::runtime::Runtime) {
    static P: OnceLock<(Arc<DnsProxy>, tokio::runtime::Runtime)> = OnceLock::new();
    P.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let p = DnsProxy::new(ProxyConfig {
            allow: vec!["*.allowed.test".into(), "exact.test".into(), "a".into()],
            // Port 9 (discard) on loopback: nothing listens, the send fails.
            upstreams: vec!["127.0.0.1:9".parse().unwrap()],
            upstream_timeout: Duration::from_millis(20),
            query_timeout: Duration::from_millis(50),
            refused_rate: 0,
            tunnel: TunnelLimits {
                max_distinct_per_window: 1_000_000,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        (p, rt)
    })
}

fuzz_target!(|data: &[u8]| {
    let (p, rt) = proxy();
    let client: SocketAddr = "127.0.0.1:5353".parse().unwrap();
    rt.block_on(async {
        for reply in [p.handle_udp(data, client).await, p.handle(data, client).await]
            .into_iter()
            .flatten()
        {
            assert!(reply.len() >= 12);
            assert_eq!(&reply[..2], &data[..2], "reply id");
            assert!(reply[2] & 0x80 != 0, "QR set");
        }
    });
});
