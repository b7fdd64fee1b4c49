//! The committed man pages and completions are what the clap definitions
//! produce; regenerate with `cargo xtask gen`.

#[test]
fn man_and_completions_are_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    for (rel, want) in xtask::render_all() {
        match std::fs::read(root.join(&rel)) {
            Ok(have) if have == want => {}
            _ => stale.push(rel.display().to_string()),
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files (run `cargo xtask gen`): {stale:?}"
    );
}

#[test]
fn every_man_page_has_exit_status_and_inherited_state() {
    for (rel, data) in xtask::render_all() {
        if rel.starts_with("man") {
            let text = String::from_utf8(data).unwrap();
            assert!(text.contains(".SH \"EXIT STATUS\""), "{}", rel.display());
            assert!(
                text.contains(".SH \"INHERITED STATE\""),
                "{}",
                rel.display()
            );
        }
    }
}
