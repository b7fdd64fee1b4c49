//! The normaliser over arbitrary bytes: never panics, and whatever it
//! accepts is canonical, idempotent, free of `..`, and has the same
//! components as the input; what it refuses, it refuses for the documented
//! reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sbx_path::NormaliseError;
use sbx_path::normalise::{components, has_dotdot, is_beneath, normalise_bytes};

fuzz_target!(|data: &[u8]| {
    // First byte: 0 = no base, else the base is "/b" + up to that many bytes.
    let (base, path): (Option<&[u8]>, &[u8]) = match data.split_first() {
        None => (None, data),
        Some((&0, rest)) => (None, rest),
        Some((&n, rest)) => {
            let k = (n as usize).min(rest.len());
            (Some(&rest[..k]), &rest[k..])
        }
    };
    let r = normalise_bytes(path, base);
    let expect_err = if path.is_empty() {
        Some(NormaliseError::Empty)
    } else if path.contains(&0) {
        Some(NormaliseError::Nul)
    } else if has_dotdot(path) {
        Some(NormaliseError::Traversal)
    } else if path[0] != b'/' && base.is_none_or(|b| b.first() != Some(&b'/')) {
        Some(NormaliseError::Relative)
    } else {
        None
    };
    match (&r, expect_err) {
        (Err(e), Some(want)) => assert_eq!(*e, want),
        (Err(e), None) => {
            // Only the base can be at fault now.
            let b = base.unwrap();
            assert!(path[0] != b'/');
            assert!(b.contains(&0) || has_dotdot(b), "{e:?}");
        }
        (Ok(n), None) => {
            assert_eq!(n[0], b'/');
            assert!(n.as_slice() == b"/" || !n.ends_with(b"/"));
            assert!(!n.windows(2).any(|w| w == b"//"));
            assert!(!has_dotdot(n));
            assert!(!n.split(|&b| b == b'/').any(|c| c == b"."));
            assert_eq!(normalise_bytes(n, None).as_ref(), Ok(n));
            // Same components as the input (after the base, if joined).
            let mut want: Vec<&[u8]> = Vec::new();
            if path[0] != b'/' {
                want.extend(components(base.unwrap()));
            }
            want.extend(components(path));
            assert_eq!(components(n).collect::<Vec<_>>(), want);
            // Every normalised path is beneath / and beneath itself, and a
            // byte-extension of its last component is not beneath it.
            assert!(is_beneath(n, b"/"));
            assert!(is_beneath(n, n));
            if n.as_slice() != b"/" {
                let mut longer = n.clone();
                longer.push(b'x');
                assert!(!is_beneath(&longer, n));
            }
        }
        (Ok(n), Some(want)) => panic!("accepted {n:?}, want {want:?}"),
    }
});
