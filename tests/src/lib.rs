//! Integration tests of keel live in `all/`; this crate only builds the
//! guests they load (see `build.rs`).
