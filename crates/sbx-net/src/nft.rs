//! The sandbox's nftables rules, as one nf_tables netlink batch built
//! before the fork and sent by the child inside the new namespace. No `nft`
//! process, no capability that must survive an exec, and no libnftables:
//! the ruleset is fixed, so its expressions are written here directly,
//! exactly those libnftables compiles the same rules to (a test loads both
//! and compares `nft list ruleset`). Loading libnftables and parsing the
//! text cost about 3.5 ms of every start (docs/bench-policy.md section 10).

use std::io;

use crate::nfnl::{
    Buf, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NLM_F_ACK, NLM_F_APPEND,
    NLM_F_CREATE,
};
use crate::{nfnl, synq};

/// Addresses and ports of the sandbox side.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The extra address on `lo` (source of every outgoing connection).
    pub v4: std::net::Ipv4Addr,
    pub v6: std::net::Ipv6Addr,
    /// Where redirected TCP lands (127.0.0.1 and ::1 inside).
    pub tcp_port: u16,
    /// Where redirected DNS over UDP lands.
    pub dns_port: u16,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            v4: std::net::Ipv4Addr::new(10, 254, 0, 1),
            v6: "fd5b:5b5b:5b5b::1".parse().unwrap(),
            tcp_port: 61001,
            dns_port: 61053,
        }
    }
}

// linux/netfilter/nf_tables.h and nfnetlink.h
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_RETURN: i32 = -5;
const NFT_JUMP: i32 = -3;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_META_MARK: u32 = 3;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NH: u32 = 1; // NFT_PAYLOAD_NETWORK_HEADER
const TH: u32 = 2; // NFT_PAYLOAD_TRANSPORT_HEADER
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const NFT_REJECT_TCP_RST: u32 = 1;
const TCP: u8 = 6;
const UDP: u8 = 17;

/// A batch of nf_tables messages: BATCH_BEGIN, the ruleset, BATCH_END,
/// each message asking for its ack (the ruleset is about 4.7 KiB).
pub struct Batch {
    m: Box<Buf<8192>>,
    seq: u32,
}

/// One expression of a rule: its name and attributes.
#[derive(Clone, Copy)]
enum Expr<'a> {
    Meta(u32),
    Cmp(u32, &'a [u8]),
    Payload(u32, u32, u32),
    Bitwise(&'a [u8], &'a [u8]),
    Imm(&'a [u8]),
    Verdict(i32, Option<&'a str>),
    /// `redirect to :port` (the port loaded into reg 1 just before).
    Redir,
    RejectTcpRst,
}

impl Batch {
    fn new() -> Self {
        let mut b = Batch {
            m: Box::new(Buf::new()),
            seq: 0,
        };
        b.begin(NFNL_MSG_BATCH_BEGIN, 0, 0, NFNL_SUBSYS_NFTABLES);
        b.m.end();
        b
    }

    fn begin(&mut self, ty: u16, flags: u16, family: u8, res_id: u16) {
        self.seq += 1;
        self.m.begin(ty, flags, self.seq, family, res_id);
    }

    /// Starts an nf_tables message of `family` that asks for its ack.
    fn nft(&mut self, msg: u16, flags: u16, family: u8) {
        self.begin(
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            flags | NLM_F_ACK,
            family,
            0,
        );
    }

    /// NFTA_DATA_VALUE in a nest of type `ty`.
    fn value(&mut self, ty: u16, data: &[u8]) {
        self.m.nest(ty);
        self.m.attr(1, data);
        self.m.unnest();
    }

    fn table(&mut self, family: u8, name: &str) {
        self.nft(NFT_MSG_NEWTABLE, 0, family);
        self.m.attr_str(1, name); // NFTA_TABLE_NAME
        self.m.attr_be32(2, 0); // NFTA_TABLE_FLAGS
        self.m.end();
    }

    /// A base chain on the output hook (`kind` "filter" or "nat").
    fn base_chain(
        &mut self,
        family: u8,
        table: &str,
        name: &str,
        kind: &str,
        prio: i32,
        policy: u32,
    ) {
        self.nft(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family);
        self.m.attr_str(1, table); // NFTA_CHAIN_TABLE
        self.m.attr_str(3, name); // NFTA_CHAIN_NAME
        self.m.nest(4); // NFTA_CHAIN_HOOK
        self.m.attr_be32(1, NF_INET_LOCAL_OUT); // NFTA_HOOK_HOOKNUM
        self.m.attr_be32(2, prio as u32); // NFTA_HOOK_PRIORITY
        self.m.unnest();
        self.m.attr_be32(5, policy); // NFTA_CHAIN_POLICY
        self.m.attr_str(7, kind); // NFTA_CHAIN_TYPE
        self.m.end();
    }

    fn chain(&mut self, family: u8, table: &str, name: &str) {
        self.nft(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family);
        self.m.attr_str(1, table);
        self.m.attr_str(3, name);
        self.m.end();
    }

    fn rule(&mut self, family: u8, table: &str, chain: &str, exprs: &[Expr<'_>]) {
        self.nft(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family);
        self.m.attr_str(1, table); // NFTA_RULE_TABLE
        self.m.attr_str(2, chain); // NFTA_RULE_CHAIN
        self.m.nest(4); // NFTA_RULE_EXPRESSIONS
        for e in exprs {
            self.m.nest(1); // NFTA_LIST_ELEM
            self.expr(e);
            self.m.unnest();
        }
        self.m.unnest();
        self.m.end();
    }

    /// NFTA_EXPR_NAME and NFTA_EXPR_DATA; registers as libnftables 1.0
    /// allocates them (reg 1 for data, the verdict register for verdicts).
    fn expr(&mut self, e: &Expr<'_>) {
        let name = match e {
            Expr::Meta(_) => "meta",
            Expr::Cmp(..) => "cmp",
            Expr::Payload(..) => "payload",
            Expr::Bitwise(..) => "bitwise",
            Expr::Imm(_) | Expr::Verdict(..) => "immediate",
            Expr::Redir => "redir",
            Expr::RejectTcpRst => "reject",
        };
        self.m.attr_str(1, name);
        self.m.nest(2);
        match *e {
            Expr::Meta(key) => {
                self.m.attr_be32(1, NFT_REG_1); // NFTA_META_DREG
                self.m.attr_be32(2, key); // NFTA_META_KEY
            }
            Expr::Cmp(op, data) => {
                self.m.attr_be32(1, NFT_REG_1); // NFTA_CMP_SREG
                self.m.attr_be32(2, op); // NFTA_CMP_OP
                self.value(3, data); // NFTA_CMP_DATA
            }
            Expr::Payload(base, offset, len) => {
                self.m.attr_be32(1, NFT_REG_1); // NFTA_PAYLOAD_DREG
                self.m.attr_be32(2, base);
                self.m.attr_be32(3, offset);
                self.m.attr_be32(4, len);
            }
            Expr::Bitwise(mask, xor) => {
                self.m.attr_be32(1, NFT_REG_1); // NFTA_BITWISE_SREG
                self.m.attr_be32(2, NFT_REG_1); // NFTA_BITWISE_DREG
                self.m.attr_be32(3, mask.len() as u32); // NFTA_BITWISE_LEN
                self.value(4, mask); // NFTA_BITWISE_MASK
                self.value(5, xor); // NFTA_BITWISE_XOR
            }
            Expr::Imm(data) => {
                self.m.attr_be32(1, NFT_REG_1); // NFTA_IMMEDIATE_DREG
                self.value(2, data); // NFTA_IMMEDIATE_DATA
            }
            Expr::Verdict(code, chain) => {
                self.m.attr_be32(1, NFT_REG_VERDICT);
                self.m.nest(2); // NFTA_IMMEDIATE_DATA
                self.m.nest(2); // NFTA_DATA_VERDICT
                self.m.attr_be32(1, code as u32); // NFTA_VERDICT_CODE
                if let Some(c) = chain {
                    self.m.attr_str(2, c); // NFTA_VERDICT_CHAIN
                }
                self.m.unnest();
                self.m.unnest();
            }
            Expr::Redir => {
                self.m.attr_be32(1, NFT_REG_1); // NFTA_REDIR_REG_PROTO_MIN
                self.m.attr_be32(3, NF_NAT_RANGE_PROTO_SPECIFIED); // NFTA_REDIR_FLAGS
            }
            Expr::RejectTcpRst => {
                self.m.attr_be32(1, NFT_REJECT_TCP_RST); // NFTA_REJECT_TYPE
                self.m.attr(2, &[0]); // NFTA_REJECT_ICMP_CODE
            }
        }
        self.m.unnest();
    }

    fn finish(mut self) -> Self {
        self.begin(NFNL_MSG_BATCH_END, 0, 0, NFNL_SUBSYS_NFTABLES);
        self.m.end();
        self
    }

    /// Sends the batch on a new NETLINK_NETFILTER socket in the current
    /// network namespace and waits for every message's ack: the kernel
    /// applies all of it or nothing. After fork: allocates nothing.
    pub fn load(&self) -> io::Result<()> {
        let fd = nfnl::netlink_socket()?;
        // The last nf_tables message is the one before BATCH_END; an error
        // in any message comes before its ack.
        nfnl::request(&fd, self.m.bytes(), self.seq - 1)
    }
}

/// The ruleset: every DNS packet (UDP or TCP port 53, loopback servers such
/// as 127.0.0.53 included, so resolv.conf may say anything) and every TCP
/// connection to a non-loopback address is redirected to the gateway's
/// sockets; whatever else would leave the sandbox's own addresses is
/// dropped. TCP SYNs to non-loopback addresses first pass the SYN queue
/// (before the redirect, priority -150; [`crate::synq`] appends the queue
/// rule to the empty chain): a denied one comes back marked and is rejected
/// with a reset, so connect() is refused. In nft's words:
///
/// ```text
/// table inet sbx_net {
///   chain nat_out {
///     type nat hook output priority -100; policy accept;
///     udp dport 53 redirect to :DNS_PORT
///     tcp dport 53 redirect to :TCP_PORT
///     ip daddr 127.0.0.0/8 return
///     ip6 daddr ::1 return
///     meta l4proto tcp redirect to :TCP_PORT
///   }
///   chain filter_out {
///     type filter hook output priority 0; policy drop;
///     ip daddr 127.0.0.0/8 accept
///     ip daddr V4 accept
///     ip6 daddr ::1 accept
///     ip6 daddr V6 accept
///   }
/// }
/// table ip sbx_syn {     (and table ip6 sbx_syn, with ip6 daddr != ::1)
///   chain out {
///     type filter hook output priority -150; policy accept;
///     meta mark DENY_MARK reject with tcp reset
///     ip daddr != 127.0.0.0/8 tcp dport != 53 tcp flags & (fin|syn|rst|ack) == syn meta mark 0 jump q
///   }
///   chain q {
///   }
/// }
/// ```
pub fn ruleset(l: &Layout) -> Batch {
    use Expr::*;
    let dns = l.dns_port.to_be_bytes();
    let tcp = l.tcp_port.to_be_bytes();
    let port53 = 53u16.to_be_bytes();
    let v4 = l.v4.octets();
    let v6 = l.v6.octets();
    let lo6 = std::net::Ipv6Addr::LOCALHOST.octets();
    let ipv4 = [NFPROTO_IPV4];
    let ipv6 = [NFPROTO_IPV6];
    let is_v4 = [Meta(NFT_META_NFPROTO), Cmp(NFT_CMP_EQ, &ipv4)];
    let is_v6 = [Meta(NFT_META_NFPROTO), Cmp(NFT_CMP_EQ, &ipv6)];
    let daddr4 = |len| Payload(NH, 16, len);
    let daddr6 = Payload(NH, 24, 16);
    let (t, nat, filter) = ("sbx_net", "nat_out", "filter_out");

    let mut b = Batch::new();
    b.table(NFPROTO_INET, t);
    b.base_chain(NFPROTO_INET, t, nat, "nat", -100, NF_ACCEPT);
    b.base_chain(NFPROTO_INET, t, filter, "filter", 0, NF_DROP);
    for (proto, port) in [(UDP, &dns), (TCP, &tcp)] {
        let p = [proto];
        b.rule(
            NFPROTO_INET,
            t,
            nat,
            &[
                Meta(NFT_META_L4PROTO),
                Cmp(NFT_CMP_EQ, &p),
                Payload(TH, 2, 2),
                Cmp(NFT_CMP_EQ, &port53),
                Imm(port),
                Redir,
            ],
        );
    }
    let ret = Verdict(NFT_RETURN, None);
    let accept = Verdict(NF_ACCEPT as i32, None);
    let lo4 = [127u8];
    let v4_lo = |v| [&is_v4[..], &[daddr4(1), Cmp(NFT_CMP_EQ, &lo4), v]].concat();
    let v6_is = |a, v| [&is_v6[..], &[daddr6, Cmp(NFT_CMP_EQ, a), v]].concat();
    b.rule(NFPROTO_INET, t, nat, &v4_lo(ret));
    b.rule(NFPROTO_INET, t, nat, &v6_is(&lo6, ret));
    let tcp_p = [TCP];
    b.rule(
        NFPROTO_INET,
        t,
        nat,
        &[
            Meta(NFT_META_L4PROTO),
            Cmp(NFT_CMP_EQ, &tcp_p),
            Imm(&tcp),
            Redir,
        ],
    );
    b.rule(NFPROTO_INET, t, filter, &v4_lo(accept));
    b.rule(
        NFPROTO_INET,
        t,
        filter,
        &[&is_v4[..], &[daddr4(4), Cmp(NFT_CMP_EQ, &v4), accept]].concat(),
    );
    b.rule(NFPROTO_INET, t, filter, &v6_is(&lo6, accept));
    b.rule(NFPROTO_INET, t, filter, &v6_is(&v6, accept));

    let mark = synq::DENY_MARK.to_ne_bytes();
    let unmarked = 0u32.to_ne_bytes();
    let (mask, xor, syn) = ([0x17u8], [0u8], [0x02u8]);
    for (fam, not_lo) in [
        (NFPROTO_IPV4, [daddr4(1), Cmp(NFT_CMP_NEQ, &lo4)]),
        (NFPROTO_IPV6, [daddr6, Cmp(NFT_CMP_NEQ, &lo6)]),
    ] {
        b.table(fam, synq::TABLE);
        b.base_chain(fam, synq::TABLE, "out", "filter", -150, NF_ACCEPT);
        b.chain(fam, synq::TABLE, synq::QCHAIN);
        b.rule(
            fam,
            synq::TABLE,
            "out",
            &[
                Meta(NFT_META_L4PROTO),
                Cmp(NFT_CMP_EQ, &tcp_p),
                Meta(NFT_META_MARK),
                Cmp(NFT_CMP_EQ, &mark),
                RejectTcpRst,
            ],
        );
        b.rule(
            fam,
            synq::TABLE,
            "out",
            &[
                &not_lo[..],
                &[
                    Meta(NFT_META_L4PROTO),
                    Cmp(NFT_CMP_EQ, &tcp_p),
                    Payload(TH, 2, 2),
                    Cmp(NFT_CMP_NEQ, &port53),
                    Payload(TH, 13, 1),
                    Bitwise(&mask, &xor),
                    Cmp(NFT_CMP_EQ, &syn),
                    Meta(NFT_META_MARK),
                    Cmp(NFT_CMP_EQ, &unmarked),
                    Verdict(NFT_JUMP, Some(synq::QCHAIN)),
                ],
            ]
            .concat(),
        );
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// What `nft list ruleset` shows in a new network namespace after
    /// `load` ran there (as root: CAP_NET_ADMIN over the namespace).
    fn listed(load: impl Fn() -> io::Result<()> + Send + Sync + 'static) -> String {
        let mut c = Command::new("nft");
        c.args(["list", "ruleset"]);
        // SAFETY: the child only unshares and loads (the test process is
        // not multithreaded in a way the child depends on: it allocates,
        // as the loader's callers after a fork of a single thread do).
        unsafe {
            c.pre_exec(move || {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
                load()
            });
        }
        let out = c.output().expect("nft (the nftables package) runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// The batch is exactly the ruleset its documentation gives in nft's
    /// words: libnftables compiles that text (with the layout's values) to
    /// the same expressions, so both namespaces list the same rules.
    #[test]
    fn the_batch_lists_as_the_documented_ruleset() {
        let l = Layout::default();
        let text = format!(
            "table inet sbx_net {{
  chain nat_out {{
    type nat hook output priority -100; policy accept;
    udp dport 53 redirect to :{dns}
    tcp dport 53 redirect to :{tcp}
    ip daddr 127.0.0.0/8 return
    ip6 daddr ::1 return
    meta l4proto tcp redirect to :{tcp}
  }}
  chain filter_out {{
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ip daddr {v4} accept
    ip6 daddr ::1 accept
    ip6 daddr {v6} accept
  }}
}}
table ip {syn} {{
  chain out {{
    type filter hook output priority -150; policy accept;
    meta mark {mark} reject with tcp reset
    ip daddr != 127.0.0.0/8 tcp dport != 53 tcp flags & (fin|syn|rst|ack) == syn meta mark 0 jump {q}
  }}
  chain {q} {{
  }}
}}
table ip6 {syn} {{
  chain out {{
    type filter hook output priority -150; policy accept;
    meta mark {mark} reject with tcp reset
    ip6 daddr != ::1 tcp dport != 53 tcp flags & (fin|syn|rst|ack) == syn meta mark 0 jump {q}
  }}
  chain {q} {{
  }}
}}
",
            tcp = l.tcp_port,
            dns = l.dns_port,
            v4 = l.v4,
            v6 = l.v6,
            syn = synq::TABLE,
            q = synq::QCHAIN,
            mark = synq::DENY_MARK,
        );
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("rules.nft");
        std::fs::write(&f, text).unwrap();
        let want = listed(move || {
            let st = Command::new("nft").arg("-f").arg(&f).status()?;
            st.success()
                .then_some(())
                .ok_or_else(|| io::Error::other("nft -f failed"))
        });
        let batch = ruleset(&l);
        let got = listed(move || batch.load());
        assert!(want.contains("redirect to :61053"), "{want}");
        assert_eq!(got, want);
    }

    /// A batch the kernel refuses is an error, and none of it stays.
    #[test]
    fn a_refused_batch_is_an_error_and_applies_nothing() {
        let mut b = Batch::new();
        b.table(NFPROTO_INET, "sbx_net");
        b.rule(NFPROTO_INET, "sbx_net", "no_such_chain", &[Expr::Redir]);
        let b = b.finish();
        let got = listed(move || match b.load() {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => Err(io::Error::other(format!("expected ENOENT, got {other:?}"))),
        });
        assert_eq!(got, "", "a refused batch left: {got}");
    }
}
