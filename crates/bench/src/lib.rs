//! The reviewers' benchmark: IOMeter-style workers driving a target, measured the way the
//! source reviews measured (closed loop with a fixed number of outstanding I/Os per worker,
//! ramp-up excluded, latency in HDR histograms that are merged, never averaged).
//!
//! A [`target::Target`] is anything that takes a read or write and calls back: a virtual drive
//! in this process, or one member drive driven raw (the baseline every RAID number is compared
//! with). Completions resubmit from the callback, on the engine's own threads, so the generator
//! adds no thread and no queue hop of its own.

pub mod target;
pub mod workload;
