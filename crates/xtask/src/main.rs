//! `cargo xtask gen`: writes man/ and completions/ at the workspace root.

use std::path::Path;

fn main() {
    let arg = std::env::args().nth(1);
    if arg.as_deref() != Some("gen") {
        eprintln!("usage: cargo xtask gen");
        std::process::exit(2);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (rel, data) in xtask::render_all() {
        let p = root.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).expect("create dir");
        std::fs::write(&p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    }
}
