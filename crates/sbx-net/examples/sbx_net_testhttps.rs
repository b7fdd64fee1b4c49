//! Test server for the phantom-credential tests (run on a test host):
//! HTTPS (h2 and http/1.1 by ALPN) and plain HTTP, recording every request
//! it receives (version, method, path, headers, body) as a JSON line.
//!
//!   sbx_net_testhttps --cert C --key K --https PORT --http PORT --log FILE
//!
//! GET /sse streams server-sent events: the first at once, the last only
//! after GET /release arrived (on another connection) or 20 s passed; its
//! data says which. A client that sees the first event before the stream
//! ends, then releases it, proves the path between is not buffering.

use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

type Out = BoxBody<Bytes, Infallible>;

struct State {
    log: std::sync::Mutex<std::fs::File>,
    release: tokio::sync::Notify,
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn handle(st: Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Out> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into()),
            )
        })
        .collect();
    let line = serde_json::json!({
        "version": format!("{:?}", parts.version),
        "method": parts.method.to_string(),
        "uri": parts.uri.to_string(),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    });
    {
        let mut f = st.log.lock().unwrap();
        let _ = writeln!(f, "{line}");
        let _ = f.flush();
    }
    match parts.uri.path() {
        "/release" => {
            st.release.notify_waiters();
            st.release.notify_one();
            Response::new(Full::new(Bytes::from("released\n")).boxed())
        }
        "/sse" => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            let st = st.clone();
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from("data: first\n\n"))))
                    .await;
                let how = match tokio::time::timeout(Duration::from_secs(20), st.release.notified())
                    .await
                {
                    Ok(()) => "released",
                    Err(_) => "timeout",
                };
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from(format!(
                        "data: last {how}\n\n"
                    )))))
                    .await;
            });
            let stream = futures_util_stream(rx);
            let mut r = Response::new(stream.boxed());
            r.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            r
        }
        _ => Response::new(Full::new(Bytes::from(format!("ok {}\n", parts.uri.path()))).boxed()),
    }
}

/// An mpsc receiver as a Stream (no futures crate needed).
fn futures_util_stream(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl hyper::body::Body<Data = Bytes, Error = Infallible> + Send + Sync + 'static {
    struct RxBody(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);
    impl hyper::body::Body for RxBody {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx)
        }
    }
    let _ = &mut rx;
    RxBody(rx)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cert = arg(&args, "--cert").expect("--cert");
    let key = arg(&args, "--key").expect("--key");
    let https: u16 = arg(&args, "--https").expect("--https").parse().unwrap();
    let http: u16 = arg(&args, "--http").expect("--http").parse().unwrap();
    let log = arg(&args, "--log").expect("--log");
    let st = Arc::new(State {
        log: std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap(),
        ),
        release: tokio::sync::Notify::new(),
    });
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let tls_l = tokio::net::TcpListener::bind(("::", https)).await.unwrap();
    let plain_l = tokio::net::TcpListener::bind(("::", http)).await.unwrap();
    let st2 = st.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = plain_l.accept().await else {
                continue;
            };
            let st = st2.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| {
                    let st = st.clone();
                    async move { Ok::<_, Infallible>(handle(st, r).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    loop {
        let Ok((s, _)) = tls_l.accept().await else {
            continue;
        };
        let st = st.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(t) = acceptor.accept(s).await else {
                return;
            };
            let svc = hyper::service::service_fn(move |r| {
                let st = st.clone();
                async move { Ok::<_, Infallible>(handle(st, r).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(t), svc)
                .await;
        });
    }
}
