//! The daemon's watch over NBD member drives (`--drive nbd://...`): an event when a link goes
//! down or comes back, and the automatic re-add of a member its link failed.
//!
//! A link that stalls or breaks fails the requests in flight; the engine fails the member and
//! its VD goes on degraded, the write-intent bitmap noting every region written meanwhile. When
//! the drive's supervisor has connected again, the member is re-added here exactly as
//! `storc /c0/sN set online` would (Rbld over the dirty regions only, then Onln), because that
//! is what a DRBD user expects of a peer that comes back: the resync starts by itself. Only a
//! member that is Failed is re-added; one the administrator took offline, or whose place a hot
//! spare took, is left as it is (an event says so), and `set online` still works by hand.
//!
//! Every reconnection is checked before it goes live (`NbdDrive::check_reconnections`): the
//! export must still hold the metadata of the drive in its slot (drive id and controller id),
//! so a blank or another disk served at the same address is never written as the member.
//!
//! One thread polls each link's status every [`POLL_INTERVAL`]: polling, not callbacks, so a
//! flap between two looks is still seen (the connection count moved) and the link's own threads
//! never wait on the controller, whose re-add writes metadata.

use engine::config::DriveState;
use engine::controller::{Controller, DriveCommand, Severity};
use nbd::member::{LinkStatus, NbdDrive, ReconnectCheck};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the links are looked at.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long a link that came back waits for the engine's failure of its member to be recorded
/// before the re-add gives up (it is recorded within milliseconds: a metadata write).
const READD_WAIT_MAX: Duration = Duration::from_secs(30);

/// The watcher thread; `stop` joins it.
pub struct LinkWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LinkWatch {
    /// Starts watching `links` (no thread when there are none).
    pub fn start(controller: Arc<Controller>, links: Vec<Arc<NbdDrive>>) -> std::io::Result<LinkWatch> {
        let stop = Arc::new(AtomicBool::new(false));
        if links.is_empty() {
            return Ok(LinkWatch { stop, thread: None });
        }
        for link in &links {
            link.check_reconnections(same_drive_check(Arc::downgrade(&controller), link.spec().text.clone()));
        }
        let stop_seen = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("storc-links".into()).spawn(move || watch(&controller, links, &stop_seen))?;
        Ok(LinkWatch { stop, thread: Some(thread) })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the watcher last saw of one link.
struct Watched {
    drive: Arc<NbdDrive>,
    seen: LinkStatus,
    /// Since when the link is back and its member waits to be re-added.
    readd_since: Option<Instant>,
}

fn watch(controller: &Controller, links: Vec<Arc<NbdDrive>>, stop: &AtomicBool) {
    let mut watched: Vec<Watched> =
        links.into_iter().map(|drive| Watched { seen: drive.link_status(), drive, readd_since: None }).collect();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(POLL_INTERVAL);
        for link in &mut watched {
            look(controller, link);
        }
    }
}

/// Logs what changed since the last look, and re-adds the member once its link is back.
fn look(controller: &Controller, link: &mut Watched) {
    let now = link.drive.link_status();
    let name = slot_name(controller, link.drive.spec().text.as_str());
    let timeout_s = link.drive.spec().timeout.as_secs_f64();
    if link.seen.connected && (!now.connected || now.connections > link.seen.connections) {
        let why = now.last_error.as_deref().unwrap_or("the connection broke");
        controller.log(
            Severity::Warning,
            format!("{name}: NBD link lost ({why}); I/O to it fails (after {timeout_s} s at most) and its VD serves without it; reconnecting in the background"),
        );
    }
    if let Some(why) = now.refused.as_ref().filter(|why| link.seen.refused.as_ref() != Some(*why)) {
        controller.log(
            Severity::Critical,
            format!("{name}: the NBD export answers again but is not this slot's drive ({why}); not reconnected, the member stays out of service (a new disk is rebuilt whole: restart storc, then start rebuild on the drive it finds)"),
        );
    }
    if now.connections > link.seen.connections {
        controller.log(Severity::Info, format!("{name}: NBD link back (connection {})", now.connections));
        link.readd_since = Some(Instant::now());
    }
    link.seen = now;
    if let Some(since) = link.readd_since {
        if readd(controller, &link.drive, &name, since.elapsed()) {
            link.readd_since = None;
        }
    }
}

/// Re-adds the drive's member if its link failed it; whether the matter is settled (re-added,
/// or nothing to do), `false` to look again at the next poll.
fn readd(controller: &Controller, drive: &NbdDrive, name: &str, waited: Duration) -> bool {
    let source = drive.spec().text.as_str();
    let Some(slot) = controller.slots().into_iter().find(|view| view.source == source) else { return true };
    match (slot.state, slot.vd) {
        (DriveState::Failed, Some(vd_id)) => {
            match controller.set_drive(slot.slot, DriveCommand::Online) {
                Ok(()) => controller.log(Severity::Info, format!("{name}: re-added to v{vd_id} after its NBD link came back")),
                Err(error) => controller.log(Severity::Warning, format!("{name}: NBD link back, but not re-added to v{vd_id}: {error}")),
            }
            true
        }
        (DriveState::Online | DriveState::Rebuild, Some(vd_id)) => {
            // The engine took it out but the controller has not recorded it yet: look again.
            let unrecorded = controller.vd(vd_id).is_ok_and(|(_, vd)| vd.failures_unrecorded() > 0);
            !unrecorded || waited > READD_WAIT_MAX
        }
        (state, _) => {
            if state != DriveState::Online {
                let why = format!("it is {} (re-add is automatic for a Failed member only)", state.short_name());
                controller.log(Severity::Info, format!("{name}: NBD link back; not re-added: {why}"));
            }
            true
        }
    }
}

/// The check every reconnection of `source` passes before it goes live: the export must still
/// hold the metadata of the drive in its slot. The same address may now serve a blank disk or
/// another one; writing on (or resyncing only the dirty regions) as if it were the member would
/// leave it holding other data everywhere else.
fn same_drive_check(controller: Weak<Controller>, source: String) -> ReconnectCheck {
    Box::new(move |probe: &dyn drive::Drive| {
        let Some(controller) = controller.upgrade() else { return Ok(()) };
        let Some(slot) = controller.slots().into_iter().find(|view| view.source == source) else { return Ok(()) };
        let ours = controller.config().controller_id;
        match engine::metadata::read(probe) {
            Ok(Some(found)) if found.superblock.drive_id == slot.drive_id && found.superblock.controller_id == ours => Ok(()),
            Ok(Some(found)) => Err(format!(
                "it now holds drive {:032x} of controller {:032x}, not drive {:032x} of slot {}",
                found.superblock.drive_id.0, found.superblock.controller_id.0, slot.drive_id.0, slot.slot
            )),
            Ok(None) => {
                Err(format!("it now holds no storc metadata (a blank disk?), not drive {:032x} of slot {}", slot.drive_id.0, slot.slot))
            }
            Err(error) => Err(format!("its metadata cannot be read ({error})")),
        }
    })
}

/// `slot 1 (nbd://...)`, or the spec alone when no slot holds the drive.
fn slot_name(controller: &Controller, source: &str) -> String {
    match controller.slots().into_iter().find(|view| view.source == source) {
        Some(view) => format!("slot {} ({source})", view.slot),
        None => source.to_string(),
    }
}
