//! The daemon's listeners: UDP and TCP on every `--listen` address, a task
//! per query, draining on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
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
        self.udp
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }
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
            let udp = std::net::UdpSocket::bind(addr).map_err(err)?;
            let actual = udp.local_addr().map_err(err)?;
            match std::net::TcpListener::bind(actual) {
                Ok(tcp) => {
                    udp.set_nonblocking(true).map_err(err)?;
                    tcp.set_nonblocking(true).map_err(err)?;
                    b.udp.push(udp);
                    b.tcp.push(tcp);
                    break;
                }
                Err(e) if addr.port() == 0 && tries < 20 => {
                    tries += 1;
                    let _ = e;
                    continue;
                }
                Err(e) => return Err(err(e)),
            }
        }
    }
    Ok(b)
}

/// Longest a TCP client may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once.
const TCP_MAX_CONNS: usize = 512;
/// UDP queries in flight at once (beyond it, datagrams wait in the socket
/// buffer and the kernel drops the excess).
const UDP_MAX_INFLIGHT: usize = 4096;

/// Serves until `stop` is cancelled, then waits (at most `drain`) for the
/// queries in flight.
pub async fn serve(proxy: Arc<DnsProxy>, bound: Bound, stop: CancellationToken, drain: Duration) {
    let tracker = TaskTracker::new();
    let udp_slots = Arc::new(Semaphore::new(UDP_MAX_INFLIGHT));
    let tcp_slots = Arc::new(Semaphore::new(TCP_MAX_CONNS));
    let mut loops = Vec::new();
    for s in bound.udp {
        let sock = match UdpSocket::from_std(s) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::error!("udp socket: {e}");
                continue;
            }
        };
        loops.push(tokio::spawn(udp_loop(
            proxy.clone(),
            sock,
            stop.clone(),
            tracker.clone(),
            udp_slots.clone(),
        )));
    }
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
    for l in loops {
        let _ = l.await;
    }
    tracker.close();
    if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
        tracing::warn!("drain: queries still in flight after {drain:?}");
    }
}

async fn udp_loop(
    proxy: Arc<DnsProxy>,
    sock: Arc<UdpSocket>,
    stop: CancellationToken,
    tracker: TaskTracker,
    slots: Arc<Semaphore>,
) {
    let mut buf = vec![0u8; 65535];
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let (n, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    // ICMP errors from earlier sends surface here: go on.
                    tracing::debug!("udp recv: {e}");
                    continue;
                }
            },
        };
        let query = buf[..n].to_vec();
        let proxy = proxy.clone();
        let sock = sock.clone();
        tracker.spawn(async move {
            let _permit = permit;
            if let Some(reply) = proxy.handle_udp(&query, peer).await
                && let Err(e) = sock.send_to(&reply, peer).await
            {
                tracing::debug!("udp send to {peer}: {e}");
            }
        });
    }
}

async fn tcp_loop(
    proxy: Arc<DnsProxy>,
    listener: TcpListener,
    stop: CancellationToken,
    tracker: TaskTracker,
    slots: Arc<Semaphore>,
) {
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
        let proxy = proxy.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            let _permit = permit;
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
