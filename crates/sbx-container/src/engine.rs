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
    pub url: String,
    /// "podman" or "docker" (from the version's components), for messages.
    pub kind: String,
    pub api: String,
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
    let v = docker.version().await.map_err(unreachable)?;
    let api = v.api_version.clone().unwrap_or_default();
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
    }
    .to_string();
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
    Ok(Engine {
        docker,
        url: url.to_string(),
        kind,
        api,
    })
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
