//! Interception of a connection to a host with a declared credential: the
//! sandbox's TLS ends here (a leaf of the per-run CA), the gateway speaks
//! HTTP/1.1 or HTTP/2 to it and to the real server (TLS verified against
//! the host's trust store), and rewrites requests: a placeholder in a
//! header of a request to one of its own hosts becomes the real value (in
//! the body too with `--secret-in-body`); a placeholder of a secret that
//! does not belong to this host, anywhere in the request, blocks it.
//! Responses pass as they come, frame by frame (streams stay streams).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::gateway::Gateway;
use crate::phantom::{self, Secret};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Out = BoxBody<Bytes, BoxError>;

/// What interception needs: the secrets, the sandbox-side and upstream TLS
/// configurations.
pub struct Intercept {
    pub secrets: Arc<Vec<Secret>>,
    pub server: Arc<rustls::ServerConfig>,
    /// Upstream, offering h2 and http/1.1 (the sandbox chose h2) or
    /// http/1.1 only (it chose http/1.1 or nothing): the real server sees
    /// the protocol the program speaks whenever it can.
    pub client: Arc<rustls::ClientConfig>,
    pub client_h1: Arc<rustls::ClientConfig>,
}

impl Intercept {
    /// Whether `host` is a declared host of some secret.
    pub fn declared(&self, host: &str) -> bool {
        self.secrets.iter().any(|s| s.for_host(host))
    }
}

/// A stream whose first bytes were already read (the ClientHello the
/// gateway looked at), given back before the rest.
pub struct Prefixed<S> {
    head: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(head: Vec<u8>, inner: S) -> Self {
        Prefixed {
            head,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pos < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.pos);
            let p = self.pos;
            buf.put_slice(&self.head[p..p + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The upstream connection: one per intercepted connection. HTTP/1.1
/// requests take turns on it (a request waits for the previous response).
enum Up {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<ScanBody>>),
    H2(hyper::client::conn::http2::SendRequest<ScanBody>),
}

struct Conn {
    gw: Arc<Gateway>,
    ic: Arc<Intercept>,
    host: String,
    dst: SocketAddr,
    up: Up,
}

/// Serves one intercepted connection: `inside` is the sandbox's (its
/// ClientHello in `head`), `outside` the TCP connection to the real server.
pub async fn serve(
    gw: Arc<Gateway>,
    ic: Arc<Intercept>,
    inside: Prefixed<TcpStream>,
    outside: TcpStream,
    dst: SocketAddr,
    host: String,
) {
    let inside = match tokio_rustls::TlsAcceptor::from(ic.server.clone())
        .accept(inside)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!("TLS from the sandbox for {host}: {e}");
            return;
        }
    };
    let wants_h2 = inside.get_ref().1.alpn_protocol() == Some(b"h2");
    // The real server must prove it is the host; otherwise the connection
    // ends before any request is read.
    let name = match rustls::pki_types::ServerName::try_from(host.clone()) {
        Ok(n) => n,
        Err(_) => return,
    };
    let cfg = if wants_h2 { &ic.client } else { &ic.client_h1 };
    let tls = match tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, outside)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            gw.upstream_refused(dst, &host, &e.to_string());
            return;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let up = if h2 {
        match hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await {
            Ok((s, c)) => {
                tokio::spawn(async move {
                    let _ = c.await;
                });
                Up::H2(s)
            }
            Err(e) => {
                gw.upstream_failed(dst, &format!("HTTP/2 handshake: {e}"));
                return;
            }
        }
    } else {
        match hyper::client::conn::http1::handshake(io).await {
            Ok((s, c)) => {
                tokio::spawn(async move {
                    let _ = c.await;
                });
                Up::H1(tokio::sync::Mutex::new(s))
            }
            Err(e) => {
                gw.upstream_failed(dst, &format!("HTTP/1.1 handshake: {e}"));
                return;
            }
        }
    };
    let conn = Arc::new(Conn {
        gw,
        ic,
        host,
        dst,
        up,
    });
    let svc = hyper::service::service_fn(move |req| {
        let c = conn.clone();
        async move { Ok::<_, Infallible>(c.handle(req).await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(inside), svc)
        .await;
}

fn text(status: StatusCode, msg: String) -> Response<Out> {
    let mut r = Response::new(Full::new(Bytes::from(msg)).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    r
}

impl Conn {
    fn blocked(&self, s: &Secret, place: &str) -> Response<Out> {
        self.gw.leak(&s.name, &self.host, self.dst, place);
        text(
            StatusCode::FORBIDDEN,
            format!(
                "sbx-net: blocked: the placeholder of {} may not go to {} ({place})\n",
                s.name, self.host
            ),
        )
    }

    /// A secret whose placeholder is in `b` and that does not belong here.
    fn foreign(&self, b: &[u8]) -> Option<&Secret> {
        self.ic
            .secrets
            .iter()
            .find(|s| !s.for_host(&self.host) && phantom::contains(b, s.placeholder.as_bytes()))
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Out> {
        let (mut parts, body) = req.into_parts();
        let version = parts.version;
        if let Some(s) = self.foreign(parts.uri.to_string().as_bytes()) {
            return self.blocked(s, "url");
        }
        let mut body_rewrites = false;
        for (k, v) in parts.headers.iter_mut() {
            if let Some(s) = self
                .foreign(v.as_bytes())
                .or_else(|| self.foreign(k.as_str().as_bytes()))
            {
                return self.blocked(s, "header");
            }
            for s in self.ic.secrets.iter().filter(|s| s.for_host(&self.host)) {
                if phantom::contains(v.as_bytes(), s.placeholder.as_bytes()) {
                    let new = phantom::replace(s, v.as_bytes());
                    let Ok(mut nv) = HeaderValue::from_bytes(&new) else {
                        return text(StatusCode::BAD_REQUEST, "sbx-net: bad header\n".into());
                    };
                    nv.set_sensitive(true);
                    *v = nv;
                }
            }
        }
        for s in self.ic.secrets.iter() {
            body_rewrites |= s.in_body && s.for_host(&self.host);
        }
        if body_rewrites {
            // The value and the placeholder may differ in length.
            parts.headers.remove(http::header::CONTENT_LENGTH);
        }
        // The request must be for the host whose TLS name was checked: a
        // Host or :authority naming another site on the same server
        // (domain fronting) would carry the value there.
        let claimed = parts
            .uri
            .authority()
            .map(|a| a.host().to_string())
            .or_else(|| {
                parts
                    .headers
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(|h| h.rsplit_once(':').map_or(h, |(n, _)| n).to_string())
            });
        if let Some(c) = claimed
            && !c.trim_end_matches('.').eq_ignore_ascii_case(&self.host)
        {
            return text(
                StatusCode::MISDIRECTED_REQUEST,
                format!("sbx-net: this connection is for {} only\n", self.host),
            );
        }
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let authority = match self.dst.port() {
            443 => self.host.clone(),
            p => format!("{}:{p}", self.host),
        };
        let scan = ScanBody::new(body, self.ic.secrets.clone(), self.host.clone());
        let (mut cut, scan) = scan.with_alert();
        let resp = match &self.up {
            Up::H2(s) => {
                parts.version = Version::HTTP_2;
                parts.uri = match Uri::try_from(format!("https://{authority}{path}")) {
                    Ok(u) => u,
                    Err(_) => return text(StatusCode::BAD_REQUEST, "sbx-net: bad URL\n".into()),
                };
                parts.headers.remove(http::header::HOST);
                let mut s = s.clone();
                let req = Request::from_parts(parts, scan);
                s.send_request(req).await
            }
            Up::H1(m) => {
                parts.version = Version::HTTP_11;
                parts.uri = match Uri::try_from(path) {
                    Ok(u) => u,
                    Err(_) => return text(StatusCode::BAD_REQUEST, "sbx-net: bad URL\n".into()),
                };
                if let Ok(h) = HeaderValue::from_str(&authority) {
                    parts.headers.insert(http::header::HOST, h);
                }
                let req = Request::from_parts(parts, scan);
                let fut = {
                    let mut g = m.lock().await;
                    if let Err(e) = g.ready().await {
                        return text(
                            StatusCode::BAD_GATEWAY,
                            format!("sbx-net: upstream connection: {e}\n"),
                        );
                    }
                    g.send_request(req)
                };
                fut.await
            }
        };
        // A body that carried another secret's placeholder was cut: say so.
        if let Ok((name, place)) = cut.try_recv() {
            self.gw.leak(&name, &self.host, self.dst, place);
            return text(
                StatusCode::FORBIDDEN,
                format!(
                    "sbx-net: blocked: the placeholder of {name} may not go to {} ({place})\n",
                    self.host
                ),
            );
        }
        match resp {
            Ok(r) => {
                let (mut p, b) = r.into_parts();
                p.version = version;
                Response::from_parts(p, b.map_err(|e| Box::new(e) as BoxError).boxed())
            }
            Err(e) => text(
                StatusCode::BAD_GATEWAY,
                format!("sbx-net: upstream request failed: {e}\n"),
            ),
        }
    }
}

/// The request body on its way out: scanned for placeholders across chunk
/// boundaries (the last `hold` bytes wait for the next chunk). A secret of
/// another host ends the body with an error (the request is cut before the
/// placeholder leaves); a secret of this host with `in_body` is replaced.
pub struct ScanBody {
    inner: Incoming,
    secrets: Arc<Vec<Secret>>,
    host: String,
    carry: Vec<u8>,
    hold: usize,
    done: bool,
    alert: Option<tokio::sync::oneshot::Sender<(String, &'static str)>>,
}

impl ScanBody {
    fn new(inner: Incoming, secrets: Arc<Vec<Secret>>, host: String) -> Self {
        let hold = phantom::longest(&secrets).saturating_sub(1);
        ScanBody {
            inner,
            secrets,
            host,
            carry: Vec::new(),
            hold,
            done: false,
            alert: None,
        }
    }

    fn with_alert(mut self) -> (tokio::sync::oneshot::Receiver<(String, &'static str)>, Self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.alert = Some(tx);
        (rx, self)
    }

    /// Checks and rewrites the carried bytes; returns what may go out now
    /// (everything when `last`).
    fn take(&mut self, last: bool) -> Result<Bytes, BoxError> {
        for s in self.secrets.iter() {
            let own = s.for_host(&self.host);
            if !own && phantom::contains(&self.carry, s.placeholder.as_bytes()) {
                if let Some(tx) = self.alert.take() {
                    let _ = tx.send((s.name.clone(), "body"));
                }
                return Err(
                    format!("the placeholder of {} may not go to {}", s.name, self.host).into(),
                );
            }
            if own && s.in_body && phantom::contains(&self.carry, s.placeholder.as_bytes()) {
                // Whole occurrences only: a placeholder split at the end
                // stays held back for the next chunk.
                self.carry = phantom::replace(s, &self.carry).to_vec();
            }
        }
        Ok(self.split(last))
    }

    fn split(&mut self, last: bool) -> Bytes {
        let keep = if last {
            0
        } else {
            self.hold.min(self.carry.len())
        };
        let cut = self.carry.len() - keep;
        let out: Vec<u8> = self.carry.drain(..cut).collect();
        Bytes::from(out)
    }
}

impl Body for ScanBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.done = true;
                    if self.carry.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(self.take(true).map(Frame::data)));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => {
                        self.carry.extend_from_slice(&d);
                        match self.take(false) {
                            Ok(b) if b.is_empty() => continue,
                            Ok(b) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                            Err(e) => {
                                self.done = true;
                                return Poll::Ready(Some(Err(e)));
                            }
                        }
                    }
                    Err(f) => {
                        // Trailers: the carried bytes go first.
                        if !self.carry.is_empty() {
                            let b = match self.take(true) {
                                Ok(b) => b,
                                Err(e) => {
                                    self.done = true;
                                    return Poll::Ready(Some(Err(e)));
                                }
                            };
                            // Trailers are dropped after a held chunk (rare:
                            // request trailers are almost never used).
                            self.done = true;
                            return Poll::Ready(Some(Ok(Frame::data(b))));
                        }
                        return Poll::Ready(Some(Ok(f)));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.inner.is_end_stream() && self.carry.is_empty())
    }
}
