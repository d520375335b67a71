//! The DTOs of the web console's routes: `GET /api/v1/iostats` (its live charts) and
//! `POST /console/login`.

use serde::{Deserialize, Serialize};

/// Client I/O of every VD since the daemon started (NBD requests answered, failed ones included),
/// for rates between two samples: the console's live charts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IoStatsView {
    /// Milliseconds since the daemon started, on a clock that never steps.
    pub elapsed_ms: u64,
    pub vds: Vec<VdIoView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VdIoView {
    pub vd: u32,
    pub name: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Sums of each request's time from submission to completion.
    pub read_latency_ns_total: u64,
    pub write_latency_ns_total: u64,
}

/// `POST /console/login`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsoleLogin {
    pub token: String,
}
