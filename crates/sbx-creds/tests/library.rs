//! The library API sbx-vm uses: the same secrets as a JSON document.

mod common;

use std::time::Duration;

use common::*;
use sbx_creds::{AuthConfig, ChildTokenSpec, Request, ServerConfig, Session};
use secrecy::SecretString;

#[test]
fn secrets_as_a_json_document() {
    let b = bao_or_skip!();
    let w = Work::new();
    let tf = w.cred("token", &b.app_token("10m"), As::Root);
    let req = Request {
        server: ServerConfig {
            addr: b.addr.clone(),
            ca_cert: None,
            namespace: None,
            timeout: Duration::from_secs(10),
        },
        auth: AuthConfig::Token { file: Some(tf) },
        secrets: vec![
            "DB=secret/app#db".parse().unwrap(),
            "PW=kv1/app#pw".parse().unwrap(),
        ],
        secret_all: vec!["APP=secret/app".parse().unwrap()],
        leases: vec![
            "CERT=pki/issue/web?common_name=vm.sbx.test#certificate"
                .parse()
                .unwrap(),
        ],
        child_token: Some(ChildTokenSpec {
            env: "VAULT_TOKEN".into(),
            policies: vec!["child".into()],
            orphan: false,
            ttl: None,
            num_uses: Some(5),
        }),
        ttl: Duration::from_secs(120),
        kv1: false,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s: Session = rt
        .block_on(Session::open(&req, None::<SecretString>))
        .unwrap();
    let doc = s.to_json();
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(v["version"], 1);
    assert!(v["ttl_seconds"].as_u64().unwrap() <= 120);
    assert!(v["expires_unix"].as_u64().unwrap() > 0);
    let env = v["env"].as_object().unwrap();
    assert_eq!(env["DB"], DB_PASS);
    assert_eq!(env["PW"], KV1_PASS);
    assert_eq!(env["APP_API"], API_KEY);
    assert!(
        env["CERT"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE")
    );
    let child = env["VAULT_TOKEN"].as_str().unwrap().to_string();
    // The child token works until revoked.
    let (code, _) = b
        .try_call("GET", "auth/token/lookup-self", Some(&child), None)
        .unwrap();
    assert_eq!(code, 200);
    let rep = rt.block_on(s.revoke_all());
    assert!(rep.failed.is_empty(), "{:?}", rep.failed);
    assert_eq!(rep.revoked, 2);
    let (code, _) = b
        .try_call("GET", "auth/token/lookup-self", Some(&child), None)
        .unwrap();
    assert_eq!(code, 403, "child token alive after revoke_all");
    // Idempotent.
    assert_eq!(rt.block_on(s.revoke_all()).revoked, 0);
}
