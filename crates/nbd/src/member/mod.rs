//! NBD exports as member drives: `--drive nbd://HOST:PORT/EXPORT` (or `nbds://`, `nbd+unix://`),
//! so that a RAID1 mirrors a local drive with an export on another machine, as DRBD does.
//!
//! # Where it lives, and why
//! Here, in the crate that knows NBD, implementing `drive::Drive`: `nbd` depends on `drive`
//! (for the trait and `IoBuf`), never the other way, so `drive` stays free of sockets, TLS and
//! OpenSSL, and the engine sees one more drive like any other.
//!
//! # Threads and completions
//! A shard submits an operation without blocking: it is cut into NBD requests (at the export's
//! largest request), entered in the link's table and queued for the writer thread, all under
//! one mutex, and the shard goes on. The writer sends requests in order (headers gather in a
//! buffer until the queue is empty; a WRITE's payload goes from the engine's buffers, lent by
//! the table and given back once sent). The reader thread receives replies (simple replies, in
//! any order) and reads a READ's data straight into the engine's buffers. When an operation's
//! last request is done, its completion goes to the submitting context through a
//! `drive::CompletionPort`, which wakes the shard. No shard ever waits on the network.
//!
//! # Stalls, reconnection, bounds
//! A supervisor thread cuts the connection when a request has waited longer than the timeout
//! (`?timeout=`, 10 s by default, 1 s to 300 s); the reader or writer cut it on any error (a
//! write that makes no progress for the timeout is one: SO_SNDTIMEO). A cut shuts the socket
//! (the reader and writer wake and end) and fails every request in flight as `DriveError::Gone`
//! once its buffers are back; operations submitted while the link is down fail at once. The
//! engine takes the member out (a vanished drive fails it at once) and the VD goes on degraded.
//! Meanwhile the supervisor reconnects, waiting 250 ms, then twice as long after each failed
//! attempt, up to 5 s; a new connection must show the same export size. Each successful
//! connection increments [`LinkStatus::connections`], which the daemon watches to re-add the
//! member (a resync of the regions written meanwhile). Bounds: one connection, two threads per
//! connection plus the supervisor, at most [`link::REQUESTS_IN_FLIGHT_MAX`] requests (the
//! table holds the engine's buffers, not copies), and every wait bounded by the timeout.
//! Dropping the drive cuts the link and joins every thread.

mod connection;
mod link;
mod probe;
mod requests;
mod spec;
mod supervisor;

pub use probe::ReconnectCheck;
pub use spec::{MemberSpec, SpecError, TIMEOUT_DEFAULT, TIMEOUT_MAX, TIMEOUT_MIN};

use crate::client::{Client, ClientConfig};
use crate::proto;
use drive::{check_op_range, Completion, Drive, DriveError, DriveInfo, DriveKind, DriveOp, IoCtx, Token, SECTOR_BYTES};
use link::Link;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The largest request sent to a server that does not say (the NBD spec's safe maximum).
const REQUEST_BYTES_DEFAULT: u32 = 32 << 20;

/// An NBD export used as a member drive.
pub struct NbdDrive {
    info: DriveInfo,
    spec: MemberSpec,
    link: Arc<Link>,
    supervisor: Option<JoinHandle<()>>,
}

/// Where a member's link stands, for the daemon's events and re-add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    pub connected: bool,
    /// Connections made so far: the first at open is 1, each reconnection adds one.
    pub connections: u64,
    /// Why the link last went down, or why the last reconnection failed.
    pub last_error: Option<String>,
    /// Why the reconnection check refused the export that answers now (cleared by a
    /// connection that goes live).
    pub refused: Option<String>,
}

/// What a connected server allows, checked at each connection.
pub(crate) struct Checked {
    pub(crate) capacity_bytes: u64,
    pub(crate) max_request_bytes: usize,
    pub(crate) can_flush: bool,
}

impl NbdDrive {
    /// Connects (within the spec's timeout) and starts the link's threads.
    ///
    /// # Errors
    /// The server cannot be reached, refuses the export, or offers one storc cannot use
    /// (read-only, blocks larger than 512 bytes, smaller than a sector); the message names the
    /// spec.
    pub fn open(spec: &MemberSpec) -> Result<NbdDrive, String> {
        let context = |problem: String| format!("--drive {}: {problem}", spec.text);
        let client = Client::connect_within(&spec.uri, &ClientConfig::default(), spec.timeout)
            .map_err(|e| context(format!("cannot connect (timeout {} s): {e}", spec.timeout.as_secs_f64())))?;
        let checked = check_export(&client, None).map_err(context)?;
        if !checked.can_flush {
            tracing::warn!(drive = %spec.text, "the export does not take FLUSH: storc cannot make writes durable on it");
        }
        let info = DriveInfo {
            name: spec.text.clone(),
            kind: DriveKind::Network,
            capacity_bytes: checked.capacity_bytes,
            direct_io: false,
            solid_state: false,
        };
        let link = Arc::new(Link::new(spec.text.clone(), spec.timeout));
        let first = supervisor::attach(&link, client, &checked).map_err(|e| context(format!("cannot start its threads: {e}")))?;
        let reconnect = supervisor::Reconnect { uri: spec.uri.clone(), info: info.clone() };
        let for_supervisor = Arc::clone(&link);
        let supervisor = std::thread::Builder::new()
            .name("storc-nbd-link".into())
            .spawn(move || supervisor::run(&for_supervisor, first, &reconnect))
            .map_err(|e| {
                // The connection's threads end once it is cut (nobody is left to join them).
                link.lock().stopping = true;
                link.cut_current("the drive could not start".into());
                context(format!("cannot start its supervisor thread: {e}"))
            })?;
        Ok(NbdDrive { info, spec: spec.clone(), link, supervisor: Some(supervisor) })
    }

    pub fn spec(&self) -> &MemberSpec {
        &self.spec
    }

    pub fn link_status(&self) -> LinkStatus {
        let state = self.link.lock();
        LinkStatus {
            connected: state.up.is_some(),
            connections: state.generation,
            last_error: state.last_error.clone(),
            refused: state.refused.clone(),
        }
    }

    /// Has every later connection checked by `check` before it goes live (see `probe`): until
    /// one passes, the link stays down and the drive's I/O fails as a drive gone.
    pub fn check_reconnections(&self, check: ReconnectCheck) {
        *self.link.reconnect_check.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::sync::Arc::new(check));
    }
}

/// Checks what the server offers; with `expected_capacity_bytes` (a reconnection), that it is
/// the export the drive was opened on, as far as its size tells.
pub(crate) fn check_export(client: &Client, expected_capacity_bytes: Option<u64>) -> Result<Checked, String> {
    let export = client.export();
    let capacity_bytes = export.size_bytes - export.size_bytes % SECTOR_BYTES;
    if export.transmission_flags & proto::NBD_FLAG_READ_ONLY != 0 {
        return Err(format!("export {:?} is read-only; a member must take writes", export.export_name));
    }
    if capacity_bytes == 0 {
        return Err(format!("export {:?} is {} bytes, less than one 512-byte sector", export.export_name, export.size_bytes));
    }
    if let Some(expected) = expected_capacity_bytes.filter(|expected| *expected != capacity_bytes) {
        return Err(format!("export {:?} is now {capacity_bytes} bytes, not {expected}: not the same export", export.export_name));
    }
    let sizes = export.block_sizes.unwrap_or(proto::BlockSizes { min_bytes: 1, preferred_bytes: 4096, max_bytes: REQUEST_BYTES_DEFAULT });
    if u64::from(sizes.min_bytes) > SECTOR_BYTES {
        return Err(format!("export {:?} needs blocks of {} bytes; storc writes 512-byte sectors", export.export_name, sizes.min_bytes));
    }
    let max_request_bytes = u64::from(sizes.max_bytes.min(REQUEST_BYTES_DEFAULT)) / SECTOR_BYTES * SECTOR_BYTES;
    if max_request_bytes == 0 {
        return Err(format!("export {:?} takes requests of at most {} bytes, less than a sector", export.export_name, sizes.max_bytes));
    }
    let can_flush = export.transmission_flags & proto::NBD_FLAG_SEND_FLUSH != 0;
    Ok(Checked { capacity_bytes, max_request_bytes: max_request_bytes as usize, can_flush })
}

impl Drive for NbdDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        if op.range_bytes().is_some_and(|(_, len_bytes)| len_bytes == 0) {
            return ctx.complete(Completion::of(token, Ok(()), op));
        }
        let mut state = self.link.lock();
        let Some(up) = &state.up else {
            drop(state);
            return ctx.fail(token, DriveError::Gone, op);
        };
        if matches!(op, DriveOp::Flush) && !up.can_flush {
            drop(state);
            return ctx.complete(Completion::of(token, Ok(()), op));
        }
        let requests = requests::split(op, up.max_request_bytes, token, ctx.remote_completion());
        let refused = state.enqueue(requests);
        drop(state);
        match refused {
            Ok(()) => self.link.writer_wake.notify_one(),
            Err(requests) => {
                // The table is full: the link does not answer. Cut it; the engine fails the member.
                self.link.cut_current(format!("{} requests without a reply", link::REQUESTS_IN_FLIGHT_MAX));
                for request in requests {
                    requests::Finished { op: request.op, part: request.part, segs: request.segs, outcome: Err(DriveError::Gone) }.deliver();
                }
            }
        }
    }
}

impl Drop for NbdDrive {
    fn drop(&mut self) {
        self.link.lock().stopping = true;
        self.link.supervisor_wake.notify_all();
        self.link.writer_wake.notify_all();
        if let Some(supervisor) = self.supervisor.take() {
            let _ = supervisor.join();
        }
    }
}
