//! The daemon's listeners: UDP and TCP on every `--listen` address, a task
//! per query, draining on shutdown.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::DnsProxy;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("--listen {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Bound sockets (std, bound before the runtime serves them, so a busy
/// address fails at start).
pub struct Bound {
    pub udp: Vec<std::net::UdpSocket>,
    pub tcp: Vec<std::net::TcpListener>,
}

impl Bound {
    /// The addresses actually bound (port 0 resolved), UDP and TCP share
    /// the port.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.tcp
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }
}

/// UDP sockets per listen address (SO_REUSEPORT: the kernel spreads
/// clients over them, one receive loop each, so queries are served on
/// every worker thread).
pub const UDP_SOCKETS_PER_LISTEN: usize = 2;

fn udp_socket(addr: SocketAddr, reuse: bool) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    if reuse {
        s.set_reuse_port(true)?;
    }
    // Room for bursts.
    let _ = s.set_recv_buffer_size(4 << 20);
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Binds UDP and TCP on each address; for port 0 both get the same
/// (random) port.
pub fn bind(addrs: &[SocketAddr]) -> Result<Bound, ListenError> {
    let mut b = Bound {
        udp: Vec::new(),
        tcp: Vec::new(),
    };
    for &addr in addrs {
        let err = |source| ListenError::Bind { addr, source };
        let mut tries = 0;
        loop {
            // The first socket is bound without SO_REUSEPORT semantics
            // toward others: if anything holds the port, this fails.
            let probe = std::net::UdpSocket::bind(addr).map_err(err)?;
            let actual = probe.local_addr().map_err(err)?;
            let tcp = match std::net::TcpListener::bind(actual) {
                Ok(t) => t,
                Err(e) if addr.port() == 0 && tries < 20 => {
                    tries += 1;
                    let _ = e;
                    continue;
                }
                Err(e) => return Err(err(e)),
            };
            drop(probe);
            let mut socks = Vec::new();
            for _ in 0..UDP_SOCKETS_PER_LISTEN {
                socks.push(udp_socket(actual, true).map_err(err)?);
            }
            tcp.set_nonblocking(true).map_err(err)?;
            // The first of each group stands for the address in addrs().
            b.udp.extend(socks);
            b.tcp.push(tcp);
            break;
        }
    }
    Ok(b)
}

/// Longest a TCP client may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once.
const TCP_MAX_CONNS: usize = 512;
/// TCP connections one client (address prefix, see `--client-prefix4`)
/// may hold at once; beyond, a new one is closed at once (alert).
pub const TCP_MAX_PER_CLIENT: usize = 64;
/// UDP queries in flight at once (beyond it, datagrams wait in the socket
/// buffer and the kernel drops the excess).
const UDP_MAX_INFLIGHT: usize = 4096;

/// Serves until `stop` is cancelled, then waits (at most `drain`) for the
/// queries in flight.
pub async fn serve(proxy: Arc<DnsProxy>, bound: Bound, stop: CancellationToken, drain: Duration) {
    let tracker = TaskTracker::new();
    let udp_slots = Arc::new(Semaphore::new(UDP_MAX_INFLIGHT));
    let tcp_slots = Arc::new(Semaphore::new(TCP_MAX_CONNS));
    let halt = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Handle::current();
    let mut threads = Vec::new();
    for s in bound.udp {
        let (proxy, tracker, slots, halt, rt) = (
            proxy.clone(),
            tracker.clone(),
            udp_slots.clone(),
            halt.clone(),
            rt.clone(),
        );
        match std::thread::Builder::new()
            .name("sbx-dnsproxy-udp".into())
            .spawn(move || udp_thread(proxy, s, rt, tracker, slots, halt))
        {
            Ok(t) => threads.push(t),
            Err(e) => tracing::error!("udp thread: {e}"),
        }
    }
    let mut loops = Vec::new();
    for l in bound.tcp {
        let l = match TcpListener::from_std(l) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("tcp listener: {e}");
                continue;
            }
        };
        loops.push(tokio::spawn(tcp_loop(
            proxy.clone(),
            l,
            stop.clone(),
            tracker.clone(),
            tcp_slots.clone(),
        )));
    }
    stop.cancelled().await;
    halt.store(true, Ordering::SeqCst);
    for l in loops {
        let _ = l.await;
    }
    // The UDP threads notice within one receive timeout.
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    tracker.close();
    if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
        tracing::warn!("drain: queries still in flight after {drain:?}");
    }
}

/// How often a UDP thread looks at the stop flag when idle.
const UDP_POLL: Duration = Duration::from_millis(100);

/// One UDP socket served by a plain thread: a blocking receive, the answer
/// computed right here when it needs no waiting (a cache hit, a refusal),
/// else handed to the runtime as a task. Under load this never parks a
/// thread between queries, which is what a DNS server spends most of its
/// time on otherwise.
fn udp_thread(
    proxy: Arc<DnsProxy>,
    sock: std::net::UdpSocket,
    rt: tokio::runtime::Handle,
    tracker: TaskTracker,
    slots: Arc<Semaphore>,
    halt: Arc<AtomicBool>,
) {
    let _ctx = rt.enter();
    if let Err(e) = sock
        .set_nonblocking(false)
        .and_then(|()| sock.set_read_timeout(Some(UDP_POLL)))
    {
        tracing::error!("udp socket: {e}");
        return;
    }
    let sock = Arc::new(sock);
    let mut batch = mmsg::Batch::new();
    let mut replies: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(mmsg::BATCH);
    while !halt.load(Ordering::Relaxed) {
        // Every datagram waiting (up to BATCH) in one system call.
        let n = match batch.recv(&sock) {
            Ok(n) => n,
            Err(e) => {
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    // ICMP errors from earlier sends surface here: go on.
                    tracing::debug!("udp recv: {e}");
                }
                continue;
            }
        };
        for i in 0..n {
            let Some((query, peer)) = batch.get(i) else {
                continue;
            };
            // A cached answer or a refusal of it: answered right here, no
            // copy of the query, no future.
            if let Some(r) = proxy.answer_udp_now(query, peer) {
                if let Some(reply) = r {
                    replies.push((reply, peer));
                }
                continue;
            }
            let query = query.to_vec();
            let p = proxy.clone();
            let mut fut = Box::pin(async move { p.handle_udp(&query, peer).await });
            match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(Some(reply)) => replies.push((reply, peer)),
                Poll::Ready(None) => {}
                Poll::Pending => {
                    // Bounded: beyond UDP_MAX_INFLIGHT waiting queries, new
                    // ones that must wait are dropped (the client retries).
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        tracing::debug!(
                            "udp: too many queries in flight, dropping one from {peer}"
                        );
                        continue;
                    };
                    let sock = sock.clone();
                    tracker.spawn_on(
                        async move {
                            let _permit = permit;
                            if let Some(reply) = fut.await {
                                send(&sock, &reply, peer);
                            }
                        },
                        &rt,
                    );
                }
            }
        }
        // All the answers ready now in one system call.
        if !replies.is_empty() {
            mmsg::send_all(&sock, &replies);
            replies.clear();
        }
    }
}

fn send(sock: &std::net::UdpSocket, reply: &[u8], peer: SocketAddr) {
    // A UDP send does not block on a socket buffer in practice; a full
    // buffer drops the datagram (as it would on the wire).
    if let Err(e) = sock.send_to(reply, peer) {
        tracing::debug!("udp send to {peer}: {e}");
    }
}

/// Open TCP connections per client key.
type PerClient = Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>;

/// One counted connection; uncounted (and forgotten at 0) when dropped.
struct ClientSlot(PerClient, IpAddr);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

async fn tcp_loop(
    proxy: Arc<DnsProxy>,
    listener: TcpListener,
    stop: CancellationToken,
    tracker: TaskTracker,
    slots: Arc<Semaphore>,
) {
    let per_client: PerClient = Arc::default();
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!("tcp accept: {e}");
                    // EMFILE and the like: back off a little.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let key = proxy.client_key(peer.ip());
        let over = {
            let mut m = per_client.lock().unwrap_or_else(|p| p.into_inner());
            let n = m.entry(key).or_insert(0);
            *n += 1;
            *n > TCP_MAX_PER_CLIENT
        };
        let slot = ClientSlot(per_client.clone(), key);
        if over {
            drop(stream);
            if proxy.note_tcp_refused(peer) {
                sbx_core::audit::emit(
                    "dns_rate_limited",
                    sbx_core::Severity::Alert,
                    serde_json::json!({"client": peer.to_string(), "dropped": 1, "name": "",
                                       "reason": "tcp_connections",
                                       "detail": format!("more than {TCP_MAX_PER_CLIENT} TCP connections from this client")}),
                );
            }
            continue;
        }
        let proxy = proxy.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            let _permit = permit;
            let _slot = slot;
            tcp_conn(proxy, stream, peer, stop).await;
        });
    }
}

async fn tcp_conn(
    proxy: Arc<DnsProxy>,
    mut s: TcpStream,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let _ = s.set_nodelay(true);
    loop {
        let mut len = [0u8; 2];
        let read = tokio::select! {
            // Between queries a shutdown closes the connection.
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(TCP_IDLE, s.read_exact(&mut len)) => r,
        };
        match read {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let n = u16::from_be_bytes(len) as usize;
        let mut msg = vec![0u8; n];
        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut msg)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let Some(reply) = proxy.handle(&msg, peer).await else {
            // Dropped (rate limit, not a query): close, as servers do.
            return;
        };
        if reply.len() > usize::from(u16::MAX) {
            return;
        }
        let mut out = Vec::with_capacity(reply.len() + 2);
        out.extend_from_slice(&(reply.len() as u16).to_be_bytes());
        out.extend_from_slice(&reply);
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// recvmmsg/sendmmsg: a batch of datagrams per system call.
mod mmsg {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    use std::os::fd::AsRawFd;

    pub const BATCH: usize = 32;
    /// Queries longer than this arrive cut (MSG_TRUNC) and are treated as
    /// malformed; real queries are a few hundred bytes.
    const SLOT: usize = 4096;

    pub struct Batch {
        bufs: Vec<u8>,
        addrs: Vec<libc::sockaddr_storage>,
        iovs: Vec<libc::iovec>,
        hdrs: Vec<libc::mmsghdr>,
    }

    // SAFETY: the raw pointers in `iovs` and `hdrs` point only into the
    // Batch's own heap buffers (`bufs`, `addrs`, `iovs`), which move with it
    // and are never shared; nothing in it is tied to a thread.
    unsafe impl Send for Batch {}

    impl Batch {
        pub fn new() -> Batch {
            Batch {
                bufs: vec![0u8; SLOT * BATCH],
                // SAFETY: sockaddr_storage is plain-old-data; all-zero is a
                // valid (AF_UNSPEC) value.
                addrs: vec![unsafe { std::mem::zeroed() }; BATCH],
                iovs: Vec::with_capacity(BATCH),
                hdrs: Vec::with_capacity(BATCH),
            }
        }

        /// Waits for at least one datagram (or the socket's timeout), then
        /// takes every one waiting, up to BATCH.
        pub fn recv(&mut self, sock: &std::net::UdpSocket) -> std::io::Result<usize> {
            self.iovs.clear();
            self.hdrs.clear();
            for slot in self.bufs.chunks_mut(SLOT) {
                self.iovs.push(libc::iovec {
                    iov_base: slot.as_mut_ptr().cast(),
                    iov_len: SLOT,
                });
            }
            for i in 0..BATCH {
                // SAFETY: mmsghdr is plain-old-data (null pointers, zero
                // lengths); every field read by the kernel is set below.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
                h.msg_hdr.msg_iov = &mut self.iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                self.hdrs.push(h);
            }
            // SAFETY: `hdrs` holds BATCH headers whose name and iovec point
            // into `addrs`, `iovs` and `bufs` (each slot SLOT bytes), all
            // alive and not otherwise borrowed across the call; the socket
            // is borrowed from `sock`.
            let n = unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    BATCH as u32,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(n as usize)
        }

        /// Datagram `i` of the last receive and its sender.
        pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
            let h = self.hdrs.get(i)?;
            let len = (h.msg_len as usize).min(SLOT);
            let peer = sockaddr(&self.addrs[i])?;
            Some((&self.bufs[i * SLOT..i * SLOT + len], peer))
        }
    }

    fn sockaddr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match i32::from(s.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in;
                // sockaddr_storage is large and aligned enough for it.
                let a: &libc::sockaddr_in =
                    unsafe { &*(s as *const libc::sockaddr_storage).cast() };
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))),
                    u16::from_be(a.sin_port),
                ))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6;
                // sockaddr_storage is large and aligned enough for it.
                let a: &libc::sockaddr_in6 =
                    unsafe { &*(s as *const libc::sockaddr_storage).cast() };
                Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }

    /// Sends every reply; what the kernel does not take is dropped (as on
    /// the wire), after one retry of the rest one by one.
    pub fn send_all(sock: &std::net::UdpSocket, replies: &[(Vec<u8>, SocketAddr)]) {
        let addrs: Vec<socket2::SockAddr> = replies
            .iter()
            .map(|(_, a)| socket2::SockAddr::from(*a))
            .collect();
        let mut iovs: Vec<libc::iovec> = replies
            .iter()
            .map(|(r, _)| libc::iovec {
                iov_base: r.as_ptr() as *mut libc::c_void,
                iov_len: r.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = (0..replies.len())
            .map(|i| {
                // SAFETY: mmsghdr is plain-old-data (null pointers, zero
                // lengths); the fields the kernel reads are set below.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = addrs[i].as_ptr() as *mut libc::c_void;
                h.msg_hdr.msg_namelen = addrs[i].len();
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        // SAFETY: each header points at an address in `addrs` and an iovec
        // in `iovs` over a reply in `replies`, all alive for the call; the
        // kernel only reads them; the socket is borrowed from `sock`.
        let n =
            unsafe { libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr(), hdrs.len() as u32, 0) };
        let sent = if n < 0 { 0 } else { n as usize };
        for (r, a) in &replies[sent..] {
            super::send(sock, r, *a);
        }
    }
}
