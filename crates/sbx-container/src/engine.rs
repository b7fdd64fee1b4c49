//! The connection to the engine: `--engine unix:///PATH` (or tcp://,
//! http://), else DOCKER_HOST, else the Docker socket; the API version the
//! engine speaks is checked before anything is created.

use bollard::{API_DEFAULT_VERSION, ClientVersion, Docker};

/// The oldest Engine API this tool speaks (Docker 20.10, Podman 3+ compat).
pub const MIN_API: (usize, usize) = (1, 41);
/// Per-request timeout (seconds) for the HTTP client; waits that can last
/// as long as the command use streaming requests, which it does not bound.
pub const TIMEOUT_S: u64 = 600;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("--engine {0}: expected unix:///PATH, tcp://HOST:PORT or http://HOST:PORT")]
    Url(String),
    #[error("engine {url} unreachable: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("engine {url} speaks Engine API {have}, older than the {}.{} sbx-container needs", MIN_API.0, MIN_API.1)]
    TooOld { url: String, have: String },
}

pub struct Engine {
    pub docker: Docker,
    /// "podman" or "docker" (from the version's components), for messages.
    pub kind: String,
}

/// The engine address: the flag, else DOCKER_HOST, else the default socket.
pub fn address(flag: Option<&str>) -> String {
    match flag {
        Some(f) => f.to_string(),
        None => match std::env::var("DOCKER_HOST") {
            Ok(h) if !h.is_empty() => h,
            _ => "unix:///var/run/docker.sock".to_string(),
        },
    }
}

/// Syntax check only (no connection): bad input is reported before any
/// request is made.
pub fn check_address(url: &str) -> Result<(), EngineError> {
    let ok = url
        .strip_prefix("unix://")
        .is_some_and(|p| p.starts_with('/'))
        || url.strip_prefix("tcp://").is_some_and(|h| !h.is_empty())
        || url.strip_prefix("http://").is_some_and(|h| !h.is_empty());
    if ok {
        Ok(())
    } else {
        Err(EngineError::Url(url.to_string()))
    }
}

fn parse_version(v: &str) -> Option<(usize, usize)> {
    let (a, b) = v.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Connects, pings and checks the API version.
pub async fn connect(url: &str) -> Result<Engine, EngineError> {
    check_address(url)?;
    let version = ClientVersion {
        major_version: MIN_API.0,
        minor_version: MIN_API.1,
    };
    let unreachable = |source| EngineError::Unreachable {
        url: url.to_string(),
        source,
    };
    let docker = if let Some(path) = url.strip_prefix("unix://") {
        Docker::connect_with_unix(path, TIMEOUT_S, &version).map_err(unreachable)?
    } else {
        let http = url.replacen("tcp://", "http://", 1);
        Docker::connect_with_http(&http, TIMEOUT_S, &version).map_err(unreachable)?
    };
    let _ = API_DEFAULT_VERSION;
    // /_ping's headers carry the API version (Podman's /version runs conmon
    // and the runtime to report theirs: a third of a second per call).
    let (api, kind) = match ping_headers(url).await {
        Some((api, kind)) if !api.is_empty() => (api, kind),
        _ => {
            let v = docker.version().await.map_err(unreachable)?;
            let kind = v
                .components
                .as_ref()
                .and_then(|c| c.first())
                .map(|c| c.name.to_lowercase())
                .unwrap_or_default();
            let kind = if kind.contains("podman") {
                "podman"
            } else {
                "docker"
            };
            (v.api_version.clone().unwrap_or_default(), kind.to_string())
        }
    };
    // Podman reports its own version as ApiVersion on the native API and the
    // Docker-compatible one on the compat endpoint; either way it must reach
    // the minimum.
    match parse_version(&api) {
        Some(have) if have >= MIN_API => {}
        _ => {
            return Err(EngineError::TooOld {
                url: url.to_string(),
                have: if api.is_empty() {
                    "unknown".into()
                } else {
                    api
                },
            });
        }
    }
    let _ = URL.set(url.to_string());
    Ok(Engine { docker, kind })
}

static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A GET over a plain HTTP/1.0 connection to the engine connected last:
/// (status, body). For the few answers whose typed form is stricter than
/// what engines send (Podman reports a transient container state
/// "stopped" that the typed model rejects).
pub async fn raw_get(path: &str) -> Option<(u16, String)> {
    raw_request("GET", path, "").await
}

/// A POST without a body, as [`raw_get`]; for the few libpod endpoints
/// the Docker API has no equivalent of (`/libpod/containers/ID/init`).
pub async fn raw_post(path: &str) -> Option<(u16, String)> {
    raw_request("POST", path, "Content-Length: 0\r\n").await
}

async fn raw_request(method: &str, path: &str, headers: &str) -> Option<(u16, String)> {
    let url = URL.get()?;
    let buf = http10(
        url,
        &format!(
            "{method} /v{}.{}{path} HTTP/1.0\r\nHost: engine\r\n{headers}\r\n",
            MIN_API.0, MIN_API.1
        ),
    )
    .await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

async fn http10(url: &str, req: &str) -> Option<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let io = async {
        if let Some(p) = url.strip_prefix("unix://") {
            let mut s = tokio::net::UnixStream::connect(p).await?;
            s.write_all(req.as_bytes()).await?;
            s.read_to_end(&mut buf).await?;
        } else {
            let host = url
                .trim_start_matches("tcp://")
                .trim_start_matches("http://");
            let host = host.split('/').next().unwrap_or(host);
            let mut s = tokio::net::TcpStream::connect(host).await?;
            s.write_all(req.as_bytes()).await?;
            s.read_to_end(&mut buf).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), io)
        .await
        .ok()?
        .ok()?;
    Some(buf)
}

/// GET /_ping over a plain HTTP/1.0 connection: (Api-Version, engine kind).
/// None when the engine cannot be reached that way (then the caller asks
/// bollard, whose error says why).
async fn ping_headers(url: &str) -> Option<(String, String)> {
    let buf = http10(url, "GET /_ping HTTP/1.0\r\nHost: engine\r\n\r\n").await?;
    let text = String::from_utf8_lossy(&buf);
    let head = text.split("\r\n\r\n").next()?;
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        return None;
    }
    let mut api = String::new();
    let mut kind = "docker".to_string();
    for l in head.lines() {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "api-version" {
            api = v.to_string();
        }
        if k == "libpod-api-version" || (k == "server" && v.to_ascii_lowercase().contains("libpod"))
        {
            kind = "podman".into();
        }
    }
    Some((api, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert!(check_address("unix:///run/x.sock").is_ok());
        assert!(check_address("tcp://127.0.0.1:2375").is_ok());
        assert!(check_address("unix://rel").is_err());
        assert!(check_address("/run/x.sock").is_err());
        assert_eq!(parse_version("1.41"), Some((1, 41)));
        assert!(parse_version("1.40").unwrap() < MIN_API);
    }
}
