//! Allowlist lookup time with 1,000 vs 1,000,000 entries (benchmark (2) of
//! docs/bench-dnsproxy.md; run by scripts/bench-dnsproxy):
//!
//!     cargo run --release -p sbx-dnsproxy --example lookup_bench
//!
//! Prints ns per lookup for exact hits, wildcard hits and misses at both
//! sizes, and the ratio (1.0 = flat).

use std::hint::black_box;
use std::time::Instant;

use sbx_dnsproxy::Allowlist;

fn build(n: usize) -> Allowlist {
    let mut entries: Vec<String> = (0..n)
        .map(|i| format!("host{i}.example{}.test", i % 997))
        .collect();
    entries.extend((0..n / 100).map(|i| format!("*.cdn{i}.example.test")));
    Allowlist::parse(&entries).expect("valid entries")
}

/// ns per lookup of `names` (cycled) over at least ~0.3 s.
fn time(a: &Allowlist, names: &[String], want: bool) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let iters = 400_000;
        let t = Instant::now();
        let mut hits = 0usize;
        for i in 0..iters {
            if a.matches(black_box(&names[i % names.len()])).is_some() {
                hits += 1;
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / iters as f64;
        assert_eq!(hits == iters, want, "unexpected match result");
        best = best.min(ns);
    }
    best
}

fn main() {
    let small_n = 1_000;
    let big_n = 1_000_000;
    let t = Instant::now();
    let small = build(small_n);
    let small_build = t.elapsed();
    let t = Instant::now();
    let big = build(big_n);
    let big_build = t.elapsed();

    // The same kinds of names at both sizes; entries spread over the list.
    let exact = |n: usize| -> Vec<String> {
        (0..1024)
            .map(|k| {
                let i = (k * 7919) % n;
                format!("host{i}.example{}.test", i % 997)
            })
            .collect()
    };
    let wild = |n: usize| -> Vec<String> {
        (0..1024)
            .map(|k| format!("a.b.cdn{}.example.test", (k * 31) % (n / 100).max(1)))
            .collect()
    };
    let miss: Vec<String> = (0..1024)
        .map(|k| format!("x{k}.deep.sub.attacker{k}.example"))
        .collect();

    println!("allowlist lookup, ns per lookup (best of 5 x 400k lookups)");
    println!(
        "{:<16} {:>12} {:>12} {:>8}",
        "kind", "1,000", "1,000,000", "ratio"
    );
    let mut worst: f64 = 0.0;
    for (kind, s, b, want) in [
        ("exact hit", exact(small_n), exact(big_n), true),
        ("wildcard hit", wild(small_n), wild(big_n), true),
        ("miss", miss.clone(), miss.clone(), false),
    ] {
        let ts = time(&small, &s, want);
        let tb = time(&big, &b, want);
        worst = worst.max(tb / ts);
        println!("{kind:<16} {ts:>12.1} {tb:>12.1} {:>8.2}", tb / ts);
    }
    println!(
        "build: {} entries in {:.1} ms, {} entries in {:.0} ms",
        small.len(),
        small_build.as_secs_f64() * 1e3,
        big.len(),
        big_build.as_secs_f64() * 1e3
    );
    println!("worst ratio 1M/1k: {worst:.2}");
}
