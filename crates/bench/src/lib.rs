//! The reviewers' benchmark: IOMeter-style workers driving a target, measured the way the
//! source reviews measured (a fixed number of outstanding I/Os per worker, ramp-up excluded,
//! latency in HDR histograms that are merged, never averaged), with every pattern of BENCH.md
//! built in as data.
//!
//! # Map
//! - [`spec`]: access specifications (lines of block size, share, read %, random %,
//!   alignment) and how a worker picks its next request in its zone. Pure.
//! - [`distribution`]: how random requests fall in a zone (uniform, zipf, zoned hot spots),
//!   so that a cache has a hot set to find. Pure.
//! - [`patterns`]: the pattern table and the suites; a pattern's sweep expands to points.
//! - [`workload`]: workers that drive a [`target::Target`], closed or open loop.
//! - [`verify`]: `--verify`, headed sectors written and checked on read.
//! - [`target`], [`nbd_target`], [`build`], [`open`]: what is measured: a VD or a raw drive
//!   built in this process, a set of either (several disks, as an HBA's), a file or block
//!   device through io_uring, an NBD export; [`target_spec`] parses `--target`.
//! - [`runner`]: runs patterns on a target into [`results`], the serialisable result model.
//!
//! # Design decisions
//! **Completions drive the workers.** A completion records its request and issues the next one
//! from the callback, on the engine's (or the NBD connection's) own thread: the generator adds
//! no thread and no queue hop to the path it measures.
//!
//! **Patterns are data.** One table says what every pattern is; the runner, `storc bench list`,
//! the JSON results and the tests read the same table, so a definition cannot drift between
//! what is run and what is reported.
//!
//! **Results say what was measured.** Every result carries the target (level, drives, policies),
//! the machine, storc's version and every setting, so a number never travels without its
//! context. This crate measures; it asserts nothing about speed.

pub mod build;
pub mod distribution;
pub mod files;
pub mod machine;
pub mod nbd_target;
pub mod open;
pub mod patterns;
pub mod progress;
pub mod report;
pub mod results;
pub mod runner;
pub mod spec;
pub mod target;
pub mod target_spec;
pub mod verify;
pub mod workload;

#[cfg(test)]
mod tests;
