//! Refusal at SYN time. Every TCP SYN the sandbox sends to a non-loopback
//! address (DNS excepted) goes, before the NAT redirect, to an nfnetlink
//! queue; the supervisor reads it through a NETLINK_NETFILTER socket that
//! was created and bound *inside* the namespace and handed out, decides with
//! the gateway's own logic, and answers ACCEPT (the SYN goes on to the
//! redirect and the gateway) or REPEAT with [`DENY_MARK`] set, which makes
//! the chain's first rule `reject with tcp reset`: connect() fails with
//! ECONNREFUSED at once instead of succeeding and being reset.
//!
//! This kernel family has no native nft `queue` expression everywhere
//! (CONFIG_NFT_QUEUE), so the queue rule is the xtables NFQUEUE target
//! through nft_compat, added here over raw netlink to a chain the ruleset
//! created ([`crate::nft::ruleset`]). Fail-closed: with the supervisor gone
//! the queue has no listener and the kernel drops the SYN.
//!
//! The child side runs after fork and allocates nothing but stack buffers.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::nfnl::{
    Buf, HDR, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NLM_F_ACK,
    NLM_F_APPEND, NLM_F_CREATE, netlink_socket, request, send,
};

/// The queue number (per network namespace).
pub const QUEUE_NUM: u16 = 5153;
/// The mark a denied SYN is given (the reject rule matches it).
pub const DENY_MARK: u32 = 0x5b5b_0001;
/// The tables and the (regular) chain the NFQUEUE rule is appended to.
pub const TABLE: &str = "sbx_syn";
pub const QCHAIN: &str = "q";

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_MARK: u16 = 3;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NF_ACCEPT: u32 = 1;
const NF_REPEAT: u32 = 4;

/// Child side, after the ruleset is loaded: appends the NFQUEUE rule to
/// the `ip` and (when `v6`) `ip6` queue chains, binds the queue, and
/// returns the socket to hand out.
pub fn child_setup(v6: bool) -> io::Result<OwnedFd> {
    let fd = netlink_socket()?;
    let mut seq = 1;
    for fam in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        if fam == libc::AF_INET6 as u8 && !v6 {
            continue;
        }
        let mut m = Buf::<512>::new();
        m.begin(NFNL_MSG_BATCH_BEGIN, 0, seq, 0, NFNL_SUBSYS_NFTABLES);
        m.end();
        m.begin(
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
            seq + 1,
            fam,
            0,
        );
        m.attr_str(1, TABLE); // NFTA_RULE_TABLE
        m.attr_str(2, QCHAIN); // NFTA_RULE_CHAIN
        m.nest(4); // NFTA_RULE_EXPRESSIONS
        m.nest(1); // NFTA_LIST_ELEM
        m.attr_str(1, "target"); // NFTA_EXPR_NAME
        m.nest(2); // NFTA_EXPR_DATA
        m.attr_str(1, "NFQUEUE"); // NFTA_TARGET_NAME
        m.attr(2, &3u32.to_be_bytes()); // NFTA_TARGET_REV
        // struct xt_NFQ_info_v3 { u16 queuenum, queues_total, flags },
        // XT_ALIGN'ed to 8; no bypass flag: no listener means drop.
        let mut info = [0u8; 8];
        info[0..2].copy_from_slice(&QUEUE_NUM.to_ne_bytes());
        info[2..4].copy_from_slice(&1u16.to_ne_bytes());
        m.attr(3, &info); // NFTA_TARGET_INFO
        m.unnest();
        m.unnest();
        m.unnest();
        m.end();
        m.begin(NFNL_MSG_BATCH_END, 0, seq + 2, 0, NFNL_SUBSYS_NFTABLES);
        m.end();
        request(&fd, m.bytes(), seq + 1)?;
        seq += 3;
    }
    // Bind the queue to this socket and ask for the packets' first bytes.
    let mut m = Buf::<512>::new();
    m.begin(
        (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG,
        NLM_F_ACK,
        seq,
        0,
        QUEUE_NUM,
    );
    m.attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]);
    m.end();
    request(&fd, m.bytes(), seq)?;
    let mut m = Buf::<512>::new();
    m.begin(
        (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG,
        NLM_F_ACK,
        seq + 1,
        0,
        QUEUE_NUM,
    );
    let mut p = [0u8; 5];
    p[0..4].copy_from_slice(&128u32.to_be_bytes());
    p[4] = NFQNL_COPY_PACKET;
    m.attr(NFQA_CFG_PARAMS, &p);
    m.end();
    request(&fd, m.bytes(), seq + 1)?;
    Ok(fd)
}

/// The destination of a queued SYN (IP header and TCP ports), if it is one.
pub fn syn_dst(pkt: &[u8]) -> Option<SocketAddr> {
    let v = pkt.first()? >> 4;
    let (ip, l4) = match v {
        4 => {
            let ihl = ((pkt[0] & 15) as usize) * 4;
            if pkt.len() < 20 || pkt[9] != libc::IPPROTO_TCP as u8 {
                return None;
            }
            let a: [u8; 4] = pkt.get(16..20)?.try_into().ok()?;
            (IpAddr::V4(Ipv4Addr::from(a)), ihl)
        }
        6 => {
            // No extension headers on a SYN the kernel builds; anything
            // else is refused by the caller.
            if pkt.len() < 40 || pkt[6] != libc::IPPROTO_TCP as u8 {
                return None;
            }
            let a: [u8; 16] = pkt.get(24..40)?.try_into().ok()?;
            (IpAddr::V6(Ipv6Addr::from(a)), 40)
        }
        _ => return None,
    };
    let port = u16::from_be_bytes(pkt.get(l4 + 2..l4 + 4)?.try_into().ok()?);
    Some(SocketAddr::new(ip.to_canonical(), port))
}

/// Supervisor side: reads queued SYNs until the socket fails, answering
/// each with `allow(dst)` (`None`: not a TCP packet we understand, refused).
pub fn serve(fd: OwnedFd, allow: impl Fn(Option<SocketAddr>) -> bool) {
    let mut rb = vec![0u8; 65536];
    loop {
        // SAFETY: rb is a valid buffer for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), rb.as_mut_ptr().cast(), rb.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // ENOBUFS: the socket overflowed; the lost SYNs are
                // retransmitted and queued again.
                Some(libc::EINTR) | Some(libc::ENOBUFS) => continue,
                _ => {
                    tracing::error!("SYN queue: {e}");
                    return;
                }
            }
        }
        let mut off = 0usize;
        let n = n as usize;
        while off + HDR + 4 <= n {
            let len = u32::from_ne_bytes(rb[off..off + 4].try_into().unwrap()) as usize;
            if len < HDR || off + len > n {
                break;
            }
            let ty = u16::from_ne_bytes([rb[off + 4], rb[off + 5]]);
            if ty == (NFQNL_SUBSYS_PACKET) {
                handle(&fd, &rb[off..off + len], &allow);
            }
            off += (len + 3) & !3;
        }
    }
}

const NFQNL_SUBSYS_PACKET: u16 = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET;

fn handle(fd: &OwnedFd, m: &[u8], allow: &impl Fn(Option<SocketAddr>) -> bool) {
    let mut id = None;
    let mut payload: &[u8] = &[];
    let mut a = HDR + 4;
    while a + 4 <= m.len() {
        let l = u16::from_ne_bytes([m[a], m[a + 1]]) as usize;
        let t = u16::from_ne_bytes([m[a + 2], m[a + 3]]) & 0x3fff;
        if l < 4 || a + l > m.len() {
            break;
        }
        let v = &m[a + 4..a + l];
        match t {
            NFQA_PACKET_HDR if v.len() >= 4 => {
                id = Some(u32::from_be_bytes(v[0..4].try_into().unwrap()))
            }
            NFQA_PAYLOAD => payload = v,
            _ => {}
        }
        a += (l + 3) & !3;
    }
    let Some(id) = id else { return };
    let ok = allow(syn_dst(payload));
    let mut b = Buf::<512>::new();
    b.begin(
        (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT,
        0,
        0,
        0,
        QUEUE_NUM,
    );
    let mut vh = [0u8; 8];
    vh[0..4].copy_from_slice(&(if ok { NF_ACCEPT } else { NF_REPEAT }).to_be_bytes());
    vh[4..8].copy_from_slice(&id.to_be_bytes());
    b.attr(NFQA_VERDICT_HDR, &vh);
    if !ok {
        b.attr(NFQA_MARK, &DENY_MARK.to_be_bytes());
    }
    b.end();
    if let Err(e) = send(fd, b.bytes()) {
        tracing::warn!("SYN queue verdict: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6_syns() {
        let mut p = [0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[16..20].copy_from_slice(&[10, 1, 2, 3]);
        p[22..24].copy_from_slice(&443u16.to_be_bytes());
        assert_eq!(syn_dst(&p), Some("10.1.2.3:443".parse().unwrap()));
        p[9] = 17;
        assert_eq!(syn_dst(&p), None);
        let mut q = [0u8; 60];
        q[0] = 0x60;
        q[6] = 6;
        q[24..40].copy_from_slice(&"fd00::7".parse::<Ipv6Addr>().unwrap().octets());
        q[42..44].copy_from_slice(&80u16.to_be_bytes());
        assert_eq!(syn_dst(&q), Some("[fd00::7]:80".parse().unwrap()));
        assert_eq!(syn_dst(&q[..30]), None);
        assert_eq!(syn_dst(&[]), None);
    }
}
