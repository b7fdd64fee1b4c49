//! Allowlist entry validation and matching: any string either parses to an
//! entry that matches itself, or is an error naming it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sbx_dnsproxy::{AllowEntry, Allowlist, allow};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    match allow::parse_allow_entry(s) {
        Ok(e) => {
            let a = Allowlist::new([e.clone()]);
            match e {
                AllowEntry::Exact(n) => assert!(a.contains_name(&n)),
                AllowEntry::Subdomains(n) => {
                    assert!(!a.contains_name(&n));
                    let sub = format!("x.{n}");
                    if sub.len() <= 253 {
                        assert!(a.contains_name(&sub));
                    }
                }
                AllowEntry::Ip(_) => {}
            }
        }
        Err(e) => assert!(e.to_string().contains("allowlist entry")),
    }
    let a = Allowlist::parse(&["*.example.com", "exact.test"]).unwrap();
    let _ = a.matches(s);
});
