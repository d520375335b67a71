//! Where an emulated drive reads the time: the wall clock, or the simulator's virtual clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Nanoseconds since an origin the clock chooses.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;

    /// The wall-clock instant of `time_ns` for a real clock: the drive then hands each completion
    /// to the `IoCtx`, which holds it until that instant. `None` for a virtual clock: the drive
    /// holds its completions until the simulator calls `EmulatedDrive::poll_due`.
    fn wall_instant(&self, time_ns: u64) -> Option<Instant>;
}

/// Real time, from the moment the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct RealClock {
    origin: Instant,
}

impl RealClock {
    pub fn new() -> RealClock {
        RealClock { origin: Instant::now() }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock::new()
    }
}

impl Clock for RealClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn wall_instant(&self, time_ns: u64) -> Option<Instant> {
        Some(self.origin + Duration::from_nanos(time_ns))
    }
}

/// Simulated time: it stands still until whoever runs the simulation advances it. Clones share
/// one time, so the simulator keeps a clone and every drive reads the same instant.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock {
    now_ns: Arc<AtomicU64>,
}

impl VirtualClock {
    /// A clock at 0 ns.
    pub fn new() -> VirtualClock {
        VirtualClock::default()
    }

    /// Moves the clock to `time_ns`; a time that is not later than now leaves it where it is,
    /// since virtual time only moves forward.
    pub fn advance_to(&self, time_ns: u64) {
        self.now_ns.fetch_max(time_ns, Ordering::SeqCst);
    }

    pub fn advance_by(&self, duration_ns: u64) {
        self.now_ns.fetch_add(duration_ns, Ordering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    fn wall_instant(&self, _time_ns: u64) -> Option<Instant> {
        None
    }
}
