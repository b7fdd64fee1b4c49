//! sbx-path: the "Minimal" level of sbx, for agents that run in-process
//! without kernel isolation.
//!
//! A [`PathResolver`] holds an allowlist of `(path, read|write)` rules
//! (write implies read). [`PathResolver::validate`] is called before every
//! file operation: it normalises the path (collapses `//`, drops `.`),
//! refuses any `..` component, requires an absolute path (or one relative to
//! a configured base), finds the governing rule (longest prefix, compared
//! component-wise: `/a/bc` is not under `/a/b`), and then opens the path
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` relative to an
//! `O_PATH` fd of the rule's root, pinned once when the resolver was built.
//! It hands back the opened fd: the caller reads and writes through it, so
//! there is no check-then-use race. A write of a name that does not exist
//! yet hands back its parent directory, and [`Validated::create`] makes it
//! with `O_CREAT | O_EXCL | O_NOFOLLOW`.
//!
//! Where `openat2` is missing (ENOSYS), paths are walked one component at a
//! time with `openat(O_PATH | O_NOFOLLOW)` ([`Resolution::Walk`]).
//!
//! Every refusal is a [`PathError`] that names the path and the rule or
//! component that refused it, with a stable [`PathError::kind`].
//!
//! What this level cannot do (see docs/path.md): a hard link to a file
//! outside the allowed tree is indistinguishable from a file inside it; and
//! nothing here isolates a process: code that does not call `validate`
//! is not constrained. The kernel-enforced levels are sbx-fs and beyond.
//!
//! ```no_run
//! use sbx_path::{Mode, PathResolver};
//! use std::io::Read;
//! let r = PathResolver::builder()
//!     .allow_read("/usr/share/doc")
//!     .allow_write("/tmp/work")
//!     .build()?;
//! let mut s = String::new();
//! r.validate("/usr/share/doc/bash/README", Mode::Read)?
//!     .into_file()
//!     .expect("exists")
//!     .read_to_string(&mut s)?;
//! let out = r.validate("/tmp/work/out.txt", Mode::Write)?;
//! let f = if out.exists() { out.into_file().unwrap() } else { out.create(0o644)? };
//! # drop(f);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
pub mod normalise;
mod resolver;
mod rules;
mod sys;

#[cfg(feature = "cli")]
pub mod cli;

pub use error::PathError;
pub use normalise::{NormaliseError, normalise};
pub use resolver::{Access, Builder, PathResolver, Target, Validated};
pub use rules::{Allowlist, Mode, Rule};
pub use sys::Resolution;
