//! What the `keel` binary shares with the golden tests: the fixture runner
//! ([`fixture`], behind `keel test`) and the benchmark figures ([`bench`](mod@bench),
//! behind `keel bench`). The commands themselves live in the binary.
#![deny(missing_docs)]

pub mod bench;
pub mod fixture;
