//! sbx-net's flags.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false};

pub const TOOL: &str = "sbx-net";

/// Default of `--connect-timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: &str = "10s";

/// The egress policy sbx-net enforces: every flag but the command.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct NetSpec {
    /// Allow a DNS name (or *.domain, or an IP/CIDR) on PORTS (default 80,443).
    #[arg(long, value_name = "NAME[:PORTS]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,

    /// Allow an address range on PORTS (default 80,443).
    #[arg(long, value_name = "CIDR[:PORTS]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_cidr: Vec<String>,

    /// Read allow entries from FILE, one per line (# comments).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_file: Vec<PathBuf>,

    /// For connections allowed through a name: the TLS SNI (or HTTP Host)
    /// must be an allowed name that resolved to the destination address.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub sni_check: bool,

    /// DNS server the proxy forwards allowlisted names to (ADDR[:PORT],
    /// repeat; default: the nameservers of the host's /etc/resolv.conf).
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns_upstream: Vec<String>,

    /// Let DOMAIN and its subdomains resolve to private, loopback or
    /// link-local addresses (internal names; rebinding protection stays on
    /// for every other name). Repeat.
    #[arg(long, value_name = "DOMAIN")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns_rebind_allow: Vec<String>,

    /// Answer NXDOMAIN instead of REFUSED for names not allowlisted.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub dns_nxdomain: bool,

    /// Let the sandbox reach ADDR although it is one of this host's own
    /// addresses (services bound to it), on the ports an --allow-cidr or
    /// name entry grants. Without it the host's addresses are never
    /// reachable, whatever CIDR contains them. Repeat.
    #[arg(long, value_name = "ADDR", value_parser = parse_host_address)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_host_address: Vec<IpAddr>,

    /// A phantom credential: the command sees a placeholder in NAME; the
    /// gateway puts the real value (from sbx-net's own NAME, a file or an
    /// fd) into request headers to HOST only. See PHANTOM CREDENTIALS.
    /// Repeat.
    #[arg(long, value_name = "NAME@HOST[,HOST...][=file:PATH|=fd:N]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret: Vec<String>,

    /// Replace NAME's placeholder in request bodies to its hosts too (not
    /// only in headers). Repeat.
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret_in_body: Vec<String>,

    /// Give up connecting out after DURATION.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_CONNECT_TIMEOUT)]
    #[serde(skip_serializing_if = "is_default_timeout")]
    pub connect_timeout: String,
}

fn is_default_timeout(s: &str) -> bool {
    s == DEFAULT_CONNECT_TIMEOUT
}

/// An IP address, IPv6 in brackets or not; IPv4-mapped IPv6 as IPv4.
pub fn parse_host_address(s: &str) -> Result<IpAddr, String> {
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| ip.to_canonical())
        .map_err(|_| format!("'{s}' is not an IP address"))
}

impl Default for NetSpec {
    fn default() -> Self {
        NetSpec {
            allow: Vec::new(),
            allow_cidr: Vec::new(),
            allow_file: Vec::new(),
            sni_check: false,
            dns_upstream: Vec::new(),
            dns_rebind_allow: Vec::new(),
            dns_nxdomain: false,
            allow_host_address: Vec::new(),
            secret: Vec::new(),
            secret_in_body: Vec::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT.into(),
        }
    }
}

impl NetSpec {
    /// sbx-net's flags for this spec (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .each("--allow", &self.allow)
            .each("--allow-cidr", &self.allow_cidr)
            .each("--allow-file", &self.allow_file)
            .switch("--sni-check", self.sni_check)
            .each("--dns-upstream", &self.dns_upstream)
            .each("--dns-rebind-allow", &self.dns_rebind_allow)
            .switch("--dns-nxdomain", self.dns_nxdomain)
            .each(
                "--allow-host-address",
                self.allow_host_address.iter().map(|a| a.to_string()),
            )
            .each("--secret", &self.secret)
            .each("--secret-in-body", &self.secret_in_body)
            .unless_default(
                "--connect-timeout",
                &self.connect_timeout,
                DEFAULT_CONNECT_TIMEOUT.into(),
            )
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = NetSpec {
            allow: vec!["example.com".into(), "*.pypi.org:443".into()],
            allow_cidr: vec!["10.0.0.0/8:22".into()],
            allow_file: vec!["/f".into()],
            sni_check: true,
            dns_upstream: vec!["1.1.1.1".into()],
            dns_rebind_allow: vec!["corp".into()],
            dns_nxdomain: true,
            allow_host_address: vec!["10.1.2.3".parse().unwrap(), "::1".parse().unwrap()],
            secret: vec!["TOKEN@api.example.com=fd:3".into()],
            secret_in_body: vec!["TOKEN".into()],
            connect_timeout: "3s".into(),
        };
        crate::roundtrip::check(&full, full.args());
        crate::roundtrip::check(&NetSpec::default(), Vec::new());
    }
}
