//! Outgoing HTTP of a component (`wasi:http/outgoing-handler`): every
//! request is checked against the allowlist, with sbx-net's own matcher
//! (the `sbx-allow` crate), before anything is resolved or connected.
//!
//! The target is the request's URI as wasmtime-wasi-http builds it from
//! the guest's scheme and authority, which is exactly what its client
//! connects to: the scheme (http or https; anything else was refused
//! before), the host and the port (default 80 for http, 443 for https).
//! - a host that is an IP literal is allowed only by an address entry
//!   (`--allow 127.0.0.1:8080`, `--allow [::1]:443`): a name entry never
//!   covers an address, and nothing is looked up;
//! - a name is allowed by a name entry for that port (`*.example.com`
//!   covers its subdomains); only then is it resolved and connected;
//! - an authority with user information (`user@host`) is refused: the
//!   client would not connect where the host part says.
//!
//! A refused request fails in the guest with the wasi:http error
//! `HTTP-request-denied` and is a `net_denied` alert, the event sbx-net
//! writes; an allowed one is `net_allowed` (info).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use sbx_allow::Policy;
use sbx_core::{Severity, audit};

/// The outgoing-request hook of one run.
pub struct Egress {
    pub policy: Policy,
    /// When --timeout ends the run: waits in the client (connect, first
    /// byte, between bytes) are cut there, since a host call blocked in
    /// them sees no epoch.
    pub deadline: Option<Instant>,
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl Egress {
    /// The target of `uri`, allowed or why not.
    pub fn check(&self, uri: &http::Uri) -> (Option<Target>, Result<(), &'static str>) {
        let scheme = uri.scheme_str().unwrap_or("").to_ascii_lowercase();
        let Some(auth) = uri.authority() else {
            return (None, Err("no host in the request"));
        };
        let port = match (auth.port_u16(), scheme.as_str()) {
            (Some(p), _) => p,
            (None, "https") => 443,
            (None, _) => 80,
        };
        let t = Target {
            scheme,
            host: auth.host().to_ascii_lowercase(),
            port,
        };
        let verdict = if self.policy.names.is_empty() && self.policy.cidrs.is_empty() {
            Err("no network: no --allow entry")
        } else if auth.as_str().contains('@') {
            Err("user information in the authority")
        } else if let Ok(ip) = t
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            let ip = ip.to_canonical();
            match self.policy.cidr_allows(ip, port) {
                Some(_) => Ok(()),
                None if self.policy.cidrs.iter().any(|r| r.contains(ip)) => {
                    Err("port not allowed for this address")
                }
                None => Err("address not allowlisted (an IP literal needs an address entry)"),
            }
        } else if self.policy.name_allows(&t.host, port) {
            Ok(())
        } else if self.policy.name_listed(&t.host) {
            Err("port not allowed for this name")
        } else {
            Err("name not allowlisted")
        };
        (Some(t), verdict)
    }

    /// The guest's timeouts, none beyond the run's deadline.
    fn clamp(&self, o: Option<RequestOptions>) -> Option<RequestOptions> {
        let Some(d) = self.deadline else { return o };
        let left = d
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let cap = |t: Option<Duration>| Some(t.map_or(left, |t| t.min(left)));
        let o = o.unwrap_or_default();
        Some(RequestOptions {
            connect_timeout: cap(o.connect_timeout),
            first_byte_timeout: cap(o.first_byte_timeout),
            between_bytes_timeout: cap(o.between_bytes_timeout),
        })
    }
}

type Sent = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn Future<Output = Result<(), Error>> + Send>,
)>;

impl WasiHttpHooks for Egress {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        let (target, verdict) = self.check(request.uri());
        let fields = |t: &Option<Target>| match t {
            Some(t) => {
                json!({ "proto": "wasi-http", "scheme": t.scheme, "dst": t.host, "port": t.port })
            }
            None => json!({ "proto": "wasi-http", "uri": request.uri().to_string() }),
        };
        match verdict {
            Err(reason) => {
                let mut f = fields(&target);
                f["reason"] = json!(reason);
                f["method"] = json!(request.method().as_str());
                audit::emit("net_denied", Severity::Alert, f);
                Box::new(async { Err(Error::HttpRequestDenied) })
            }
            Ok(()) => {
                audit::emit("net_allowed", Severity::Info, fields(&target));
                // The crate's own client: it resolves the (allowed) name
                // and connects to it, over TLS for https.
                let default: &mut dyn WasiHttpHooks = wasmtime_wasi_http::default_hooks();
                default.send_request(request, self.clamp(options), fut)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(allow: &[&str]) -> Egress {
        let mut policy = Policy::default();
        for a in allow {
            policy.add(sbx_allow::parse_allow("--allow", a).unwrap());
        }
        Egress {
            policy,
            deadline: None,
        }
    }

    fn ok(e: &Egress, uri: &str) -> bool {
        e.check(&uri.parse().unwrap()).1.is_ok()
    }

    #[test]
    fn names_ports_and_literals() {
        let e = egress(&["api.example.com:8080", "*.pkg.dev", "127.0.0.1:9000"]);
        assert!(ok(&e, "http://api.example.com:8080/x"));
        assert!(ok(&e, "http://API.Example.com.:8080/x"));
        assert!(!ok(&e, "http://api.example.com/x"), "port 80 not listed");
        assert!(!ok(&e, "https://api.example.com/x"), "port 443 not listed");
        assert!(ok(&e, "https://a.pkg.dev/"));
        assert!(!ok(&e, "https://pkg.dev/"), "the wildcard is not the apex");
        assert!(!ok(&e, "http://other.example.com:8080/"));
        assert!(ok(&e, "http://127.0.0.1:9000/"));
        assert!(!ok(&e, "http://127.0.0.1:8080/"));
        assert!(!ok(&e, "http://[::1]:9000/"));
        assert!(!ok(&e, "http://[::ffff:127.0.0.2]:9000/"));
        assert!(!ok(&e, "http://u@api.example.com:8080/"));
        let none = egress(&[]);
        assert!(!ok(&none, "http://api.example.com/"));
        assert_eq!(
            none.check(&"http://x.org/".parse().unwrap()).1,
            Err("no network: no --allow entry")
        );
    }

    #[test]
    fn waits_end_at_the_deadline() {
        let mut e = egress(&[]);
        e.deadline = Some(Instant::now() + Duration::from_secs(5));
        let o = e
            .clamp(Some(RequestOptions {
                connect_timeout: Some(Duration::from_secs(1)),
                ..RequestOptions::default()
            }))
            .unwrap();
        assert_eq!(o.connect_timeout, Some(Duration::from_secs(1)));
        assert!(o.first_byte_timeout.unwrap() <= Duration::from_secs(5));
    }
}
