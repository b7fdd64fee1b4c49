//! What validate costs next to its peers, measured in the same run:
//!   open      plain open(2) by path, no checks at all (the floor);
//!   naive     canonicalize + starts_with + open (the common, racy way);
//!   openat2   PathResolver::validate, Resolution::Openat2;
//!   walk      PathResolver::validate, Resolution::Walk (the fallback).
//! Prints ns per call and the ratios to `open` and to `naive`.
//!
//!   cargo bench -p sbx-path --bench validate
use std::fs;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use sbx_path::{Mode, PathResolver, Resolution};

fn time(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let dir = tempfile::Builder::new()
        .prefix("sbx-path-bench")
        .tempdir()
        .unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let depth = ["a", "b", "c", "d", "e", "f"];
    let mut leaf = root.join("tree");
    for d in depth {
        leaf.push(d);
    }
    fs::create_dir_all(&leaf).unwrap();
    let file = leaf.join("file.txt");
    fs::write(&file, "x").unwrap();
    let rule = root.join("tree");
    let n = 50_000;
    println!(
        "path depth beneath the rule: {} components; {n} calls each",
        depth.len() + 1
    );

    let open = time(n, || {
        black_box(fs::File::open(black_box(&file)).unwrap());
    });
    let naive = time(n, || {
        let c = fs::canonicalize(black_box(&file)).unwrap();
        assert!(c.starts_with(Path::new(&rule)));
        black_box(fs::File::open(&c).unwrap());
    });
    let mut rows = vec![("open", open), ("naive", naive)];
    for how in [Resolution::Openat2, Resolution::Walk] {
        let r = PathResolver::builder()
            .resolution(how)
            .allow_read(&rule)
            .build()
            .unwrap();
        let t = time(n, || {
            black_box(r.validate(black_box(&file), Mode::Read).unwrap());
        });
        rows.push((how.as_str(), t));
    }
    println!(
        "{:<8} {:>10} {:>9} {:>9}",
        "method", "ns/call", "x open", "x naive"
    );
    for (name, t) in rows {
        println!("{name:<8} {t:>10.0} {:>9.2} {:>9.2}", t / open, t / naive);
    }
}
