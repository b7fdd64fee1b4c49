//! The sbx workspace root: it holds the end-to-end tests in `tests/` that
//! drive several tools in a chain. The tools live in `crates/`.
