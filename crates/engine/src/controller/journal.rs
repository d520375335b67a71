//! The cache's journal at the controller: replayed at start, trusted through the metadata,
//! watched while it runs, and what `/c0/bbu show` reports.
//!
//! Trust is the one rule: the metadata names the journal whose records a restart may replay
//! (`journal_id`). It names a journal before the cache logs anything to it, and stops naming
//! it before any write goes to the members without it (the shards hold such writes until the
//! controller has detached a failed journal). So a journal that comes back after the members
//! took writes without it is never replayed over them. The same rule holds for one leg of a
//! mirrored pair: a leg that failed while the other went on is named stale in the metadata
//! (`journal_stale_legs`) before any record is acknowledged without it.

use super::{Controller, Severity};
use crate::config::WritePolicy;
use crate::journal::{Journal, LegState, ReplayReport, Trust};
use drive::Drive;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the journal watcher looks at the journal. Short: when a leg of a mirrored pair
/// fails, acknowledgements wait until the watcher has named it stale in the metadata.
const WATCH_INTERVAL: Duration = Duration::from_millis(50);

/// A journal device (or one leg of a mirrored pair) the daemon opened.
pub struct JournalOffer {
    pub drive: Arc<dyn Drive>,
    /// What the user named (`--journal` or `set journal=`).
    pub source: String,
    /// The file behind it, watched for removal (none for emulated drives).
    pub path: Option<PathBuf>,
    /// The slot whose drive holds it (`/c0/sN set journal`), or none for a device named by
    /// path (`--journal`, `set journal=`).
    pub slot: Option<u32>,
}

/// The journal's state, as `/c0/bbu show` names a battery's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalState {
    Optimal,
    /// A mirrored pair running on one leg: write-back goes on.
    Degraded,
    Failed,
    Missing,
}

impl JournalState {
    pub fn short_name(self) -> &'static str {
        match self {
            JournalState::Optimal => "Optimal",
            JournalState::Degraded => "Degraded",
            JournalState::Failed => "Failed",
            JournalState::Missing => "Missing",
        }
    }
}

/// What `/c0/bbu show` and `/c0/journal show` report.
#[derive(Clone, Debug)]
pub struct JournalView {
    pub state: JournalState,
    pub source: Option<String>,
    pub capacity_bytes: u64,
    /// Ring bytes over every partition.
    pub ring_bytes: u64,
    /// Bytes replay could need now.
    pub used_bytes: u64,
    pub partitions: u32,
    /// What the replay at this start did.
    pub replay: ReplayReport,
    /// Why it failed or is missing.
    pub reason: Option<String>,
    /// Each leg: what the user named, whether it is in service, and why not.
    pub legs: Vec<LegView>,
}

/// One leg of the journal in [`JournalView`].
#[derive(Clone, Debug)]
pub struct LegView {
    pub source: String,
    pub in_service: bool,
    pub reason: Option<String>,
}

/// The journal the controller runs with.
pub(super) struct Attached {
    journal: Journal,
    /// Each leg's source, file and (device, inode) of that file when it was opened: a file
    /// removed or replaced takes its leg out of service.
    legs: Vec<AttachedLeg>,
}

struct AttachedLeg {
    drive: Arc<dyn Drive>,
    source: String,
    path: Option<PathBuf>,
    inode: Option<(u64, u64)>,
    slot: Option<u32>,
}

impl Attached {
    fn source(&self) -> String {
        self.legs.iter().map(|leg| leg.source.as_str()).collect::<Vec<_>>().join(" + ")
    }
}

/// The journal slot of the controller: attached, or why not.
#[derive(Default)]
pub(super) struct JournalSlot {
    attached: Option<Attached>,
    /// Why there is no usable journal (failed, removed, never given).
    reason: Option<String>,
    failed: bool,
    replay: ReplayReport,
    detach_failed_logged: bool,
}

fn inode_of(path: &std::path::Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Controller {
    /// At start, after assembly and before anything is served: replays the journal the
    /// metadata trusts into the VDs, flushes them, lays the journal out anew, trusts it (in the
    /// metadata) and hands it to the shards.
    pub(super) fn open_journal(&self, offers: Vec<JournalOffer>) {
        let trust = self.journal_trust();
        if offers.is_empty() {
            self.journal.lock().expect("journal lock").reason =
                Some("no journal was given (storc serve --journal, /c0 set journal=PATH or /c0/sN set journal)".into());
            self.abandon_trusted_journal(trust, "no journal was given");
            self.warn_write_back_without_journal("no journal");
            self.settle_images_of_all(trust.journal_id != 0);
            return;
        }
        let vds = self.vds();
        // A VD that cannot take its records (offline: members missing) loses them, with an
        // event, rather than the whole journal failing: a journal left trusted but unreplayed
        // would be replayed later over what the other VDs' members took meanwhile.
        let unreplayed: std::cell::RefCell<std::collections::BTreeMap<u32, (u64, u64, String)>> = Default::default();
        let mut apply = |record: &crate::journal::ReplayRecord| {
            let Some((_, vd)) = vds.iter().find(|(r, _)| r.vd_id == record.vd_id) else {
                return Ok(()); // the VD was deleted after the record was written
            };
            let mut unreplayed = unreplayed.borrow_mut();
            if let Some(lost) = unreplayed.get_mut(&record.vd_id) {
                lost.0 += 1;
                lost.1 += record.data.len() as u64;
                return Ok(());
            }
            if let Err(error) = self.engine.write_at(vd, record.vd_offset_bytes, &record.data) {
                unreplayed.insert(record.vd_id, (1, record.data.len() as u64, error.to_string()));
            }
            Ok(())
        };
        // Row images go back to the members first; a VD whose images cannot be written needs
        // a resync of the regions they covered.
        let images_lost: std::cell::RefCell<std::collections::BTreeMap<u32, String>> = Default::default();
        let mut apply_image = |image: &crate::journal::ReplayImage| {
            if let Err(error) = super::journal_images::write_image(&vds, image) {
                images_lost.borrow_mut().entry(image.vd_id).or_insert(error);
            }
            Ok(())
        };
        let (controller_id, partitions) = (self.config().controller_id.0, self.engine.shard_count() as u32);
        let legs = offers.iter().map(|offer| Arc::clone(&offer.drive)).collect();
        let source = offers.iter().map(|offer| offer.source.as_str()).collect::<Vec<_>>().join(" + ");
        vds.iter().for_each(|(_, vd)| vd.set_replaying(true));
        let opened = Journal::open_with_images(legs, controller_id, partitions, trust, &mut apply, &mut apply_image);
        vds.iter().for_each(|(_, vd)| vd.set_replaying(false));
        let mut lost: Vec<u32> = unreplayed.borrow().keys().copied().collect();
        for (vd_id, error) in images_lost.into_inner() {
            self.log(Severity::Warning, format!("v{vd_id}: the journal's row images cannot be written back ({error})"));
            lost.push(vd_id);
        }
        for (vd_id, (records, bytes, error)) in unreplayed.into_inner() {
            self.log(
                Severity::Critical,
                format!("v{vd_id}: {records} journal records ({bytes} bytes) of its cache cannot be replayed ({error}) and are lost"),
            );
        }
        let journal = opened.and_then(|journal| {
            for (record, vd) in &vds {
                self.engine.flush(vd).map_err(|e| format!("v{}: flush after the journal's replay failed: {e}", record.vd_id))?;
            }
            journal.finish_replay()?;
            Ok(journal)
        });
        match journal {
            Ok(journal) => {
                let report = journal.replay_report();
                let said = match (report.found, report.untrusted) {
                    (true, _) => {
                        format!("replayed {} writes from {} records ({} bytes)", report.records, report.data_records, report.data_bytes)
                    }
                    (false, true) => {
                        "held no journal the metadata trusts (it was detached, or its legs are stale): formatted anew, nothing replayed"
                            .into()
                    }
                    (false, false) => "formatted".into(),
                };
                self.log(Severity::Info, format!("journal {source}: {said}"));
                if !report.found {
                    self.abandon_trusted_journal(trust, &format!("{source} does not hold it"));
                    self.settle_images_of_all(trust.journal_id != 0);
                } else {
                    self.settle_images(&lost);
                }
                if let Err(error) = self.trust_and_attach(journal, offers, report) {
                    self.log(Severity::Critical, format!("journal cannot be trusted in the metadata: {error}; WB VDs run WT"));
                }
            }
            Err(error) => {
                let mut slot = self.journal.lock().expect("journal lock");
                slot.reason = Some(error.clone());
                slot.failed = true;
                drop(slot);
                self.log(Severity::Critical, format!("journal {source} cannot be used: {error}"));
                self.abandon_trusted_journal(trust, "it cannot be used");
                self.warn_write_back_without_journal("the journal failed");
                self.settle_images_of_all(trust.journal_id != 0);
            }
        }
    }

    fn journal_trust(&self) -> Trust {
        let settings = self.config().settings;
        Trust { journal_id: settings.journal_id, stale_legs: settings.journal_stale_legs }
    }

    /// The metadata trusts a journal that is not here: whatever it held is lost, and it must
    /// never be replayed later over what the members take from now on.
    fn abandon_trusted_journal(&self, trust: Trust, why: &str) {
        if trust.journal_id == 0 {
            return;
        }
        self.log(
            Severity::Critical,
            format!(
                "the metadata trusts journal {:016x} but {why}: writes it held that were not yet on the members are lost; it is no longer trusted",
                trust.journal_id
            ),
        );
        let mut state = self.state.lock().expect("controller lock");
        state.config.settings.journal_id = 0;
        state.config.settings.journal_stale_legs = 0;
        if let Err(error) = self.persist(&mut state) {
            drop(state);
            self.log(Severity::Critical, format!("the journal's trust cannot be cleared in the metadata: {error}"));
        }
    }

    /// Names `journal` in the metadata (with the legs out of service already), then gives it
    /// to the shards.
    fn trust_and_attach(&self, journal: Journal, offers: Vec<JournalOffer>, replay: ReplayReport) -> Result<(), String> {
        let trust = journal.trust();
        {
            let mut state = self.state.lock().expect("controller lock");
            state.config.settings.journal_id = trust.journal_id;
            state.config.settings.journal_stale_legs = trust.stale_legs;
            self.persist(&mut state).map_err(|e| e.to_string())?;
        }
        journal.health().legs_recorded_stale(trust.stale_legs);
        self.engine.set_journal(Some(&journal));
        let legs = offers
            .into_iter()
            .map(|offer| {
                let inode = offer.path.as_deref().and_then(inode_of);
                AttachedLeg { drive: offer.drive, source: offer.source, path: offer.path, inode, slot: offer.slot }
            })
            .collect();
        let mut slot = self.journal.lock().expect("journal lock");
        *slot =
            JournalSlot { attached: Some(Attached { journal, legs }), reason: None, failed: false, replay, detach_failed_logged: false };
        Ok(())
    }

    fn warn_write_back_without_journal(&self, why: &str) {
        for (record, _) in self.vds() {
            if record.write_policy == WritePolicy::WriteBack {
                self.log(Severity::Warning, format!("v{} is WB and runs as WT: {why} (a bad battery)", record.vd_id));
            }
        }
    }

    /// Assigns a journal at run time (`/c0 set journal=PATH[,PATH]`): formatted anew, trusted,
    /// attached; WB VDs run WB again. A degraded pair is replaced this way: the cache is
    /// written out and the old journal detached first.
    ///
    /// # Errors
    /// A journal is attached and in full service already, or the devices cannot be used.
    pub fn attach_journal(&self, offers: Vec<JournalOffer>) -> Result<JournalView, super::ControlError> {
        if offers.is_empty() || offers.len() > crate::journal::format::LEGS_MAX {
            return Err(super::ControlError::BadInput(format!("a journal is one device or a mirrored pair of two, not {}", offers.len())));
        }
        if self.journal_view().state == JournalState::Optimal {
            return Err(super::ControlError::Conflict(
                "a journal is attached and in full service already; it is replaced only after it (or one of its legs) fails or is removed"
                    .into(),
            ));
        }
        self.replace_journal(offers)
    }

    /// Lays a journal out on `offers` and attaches it in place of the one attached, if any
    /// (written out and detached first), then frees the slot drives the old one held.
    pub(super) fn replace_journal(&self, offers: Vec<JournalOffer>) -> Result<JournalView, super::ControlError> {
        if self.journal.lock().expect("journal lock").attached.is_some() {
            self.detach_journal("it is replaced", true).map_err(super::ControlError::Io)?;
        }
        let legs = offers.iter().map(|offer| Arc::clone(&offer.drive)).collect();
        let partitions = self.engine.shard_count() as u32;
        let journal = Journal::open(legs, self.config().controller_id.0, partitions, 0, &mut |_| Ok(()))
            .and_then(|journal| journal.finish_replay().map(|()| journal))
            .map_err(super::ControlError::BadInput)?;
        let source = offers.iter().map(|offer| offer.source.as_str()).collect::<Vec<_>>().join(" + ");
        let kept: Vec<u32> = offers.iter().filter_map(|offer| offer.slot).collect();
        self.trust_and_attach(journal, offers, ReplayReport::default()).map_err(super::ControlError::Io)?;
        self.log(Severity::Info, format!("journal {source} attached: WB VDs run WB"));
        self.free_journal_drives(&kept, super::state::Cause::JournalReplaced);
        Ok(self.journal_view())
    }

    /// `/c0/journal delete`: the controller goes on without a journal, as a controller whose
    /// battery is taken out: what only the journal held is written to the members and made
    /// durable there first (writes wait meanwhile), then the metadata stops trusting it and the
    /// slot drives it used are unconfigured good again. WB VDs run WT until a journal is
    /// assigned again.
    ///
    /// # Errors
    /// No journal is attached; the cache cannot be written out or the metadata cannot be
    /// written (the journal stays attached and trusted).
    pub fn remove_journal(&self) -> Result<JournalView, super::ControlError> {
        let source = match &self.journal.lock().expect("journal lock").attached {
            Some(attached) => attached.source(),
            None => {
                return Err(super::ControlError::Conflict(
                    "no journal is attached; there is nothing to remove (/c0/journal show says why)".into(),
                ))
            }
        };
        let reason = format!("journal {source} was removed by the administrator");
        self.detach_journal(&reason, false).map_err(super::ControlError::Io)?;
        self.free_journal_drives(&[], super::state::Cause::JournalRemoved);
        self.log(
            Severity::Warning,
            format!("{reason}: WB VDs run WT until a journal is assigned (/c0 set journal=PATH or /c0/sN set journal)"),
        );
        Ok(self.journal_view())
    }

    pub fn journal_view(&self) -> JournalView {
        let slot = self.journal.lock().expect("journal lock");
        match &slot.attached {
            Some(attached) => {
                let health = attached.journal.health();
                let legs: Vec<LegView> = attached
                    .legs
                    .iter()
                    .zip(health.legs())
                    .map(|(leg, (_, state, reason))| LegView {
                        source: leg.source.clone(),
                        in_service: state == LegState::InService,
                        reason,
                    })
                    .collect();
                let state = match (health.is_usable(), legs.iter().all(|leg| leg.in_service)) {
                    (false, _) => JournalState::Failed,
                    (true, true) => JournalState::Optimal,
                    (true, false) => JournalState::Degraded,
                };
                JournalView {
                    state,
                    source: Some(attached.source()),
                    capacity_bytes: attached.journal.superblock().capacity_bytes,
                    ring_bytes: health.ring_bytes(),
                    used_bytes: health.used_bytes(),
                    partitions: attached.journal.superblock().partition_count,
                    replay: slot.replay,
                    reason: health.failure().or_else(|| legs.iter().find_map(|leg| leg.reason.clone())),
                    legs,
                }
            }
            None => JournalView {
                state: if slot.failed { JournalState::Failed } else { JournalState::Missing },
                source: None,
                capacity_bytes: 0,
                ring_bytes: 0,
                used_bytes: 0,
                partitions: 0,
                replay: slot.replay,
                reason: slot.reason.clone(),
                legs: Vec::new(),
            },
        }
    }

    /// `/c0/vN delete preservedcache`: drops the dirty data an offline VD holds in the cache
    /// (pinned: it cannot reach the members until they are back), as MegaRAID's command of
    /// that name does. Those writes are lost; the VD stays offline.
    ///
    /// # Errors
    /// No such VD, or it is not offline (its cache is written to its members as usual).
    pub fn discard_preserved_cache(&self, vd_id: u32) -> Result<String, super::ControlError> {
        let (_, vd) = self.vd(vd_id)?;
        if vd.state() != crate::VdState::Offline {
            return Err(super::ControlError::Conflict(format!(
                "v{vd_id} is not offline: its cached writes go to its members; only an offline VD's preserved cache can be discarded"
            )));
        }
        let pinned_before = self.engine.cache_stats().pinned_bytes;
        let rest = self.engine.forget(&vd);
        // An SSD cache may hold lines of those writes: the members will not.
        if let Some(cache) = vd.ssd_cache().get() {
            cache.drop_lines(&vd);
        }
        self.log(Severity::Critical, format!("v{vd_id}: its preserved cache was discarded by request; those writes are lost"));
        Ok(match rest {
            Ok(()) => format!("discarded the preserved cache of v{vd_id} (the controller held {pinned_before} pinned bytes)"),
            Err(error) => format!("discarded the preserved cache of v{vd_id}; the journal keeps its records until the rest of the cache can be written ({error})"),
        })
    }

    /// The legs of the attached journal still in service, as offers to lay a new journal out
    /// on (a leg added to them: `/c0/sN set journal`).
    pub(super) fn legs_in_service(&self) -> Vec<JournalOffer> {
        let slot = self.journal.lock().expect("journal lock");
        let Some(attached) = &slot.attached else { return Vec::new() };
        let health = attached.journal.health();
        attached
            .legs
            .iter()
            .zip(health.legs())
            .filter(|(_, (_, state, _))| *state == LegState::InService)
            .map(|(leg, _)| JournalOffer {
                drive: Arc::clone(&leg.drive),
                source: leg.source.clone(),
                path: leg.path.clone(),
                slot: leg.slot,
            })
            .collect()
    }

    /// Whether WB VDs run WB now.
    pub fn journal_usable(&self) -> bool {
        matches!(self.journal_view().state, JournalState::Optimal | JournalState::Degraded)
    }

    /// One look at the journal: a removed file takes its leg out of service; a leg out of
    /// service is named stale in the metadata (acknowledgements wait for that); a failed
    /// journal is detached (the metadata stops trusting it, then the shards let go of it and
    /// run WT).
    fn check_journal(&self) {
        let (source, reason, health, journal_id, out) = {
            let slot = self.journal.lock().expect("journal lock");
            let Some(attached) = &slot.attached else { return };
            let health = Arc::clone(attached.journal.health());
            let journal_id = attached.journal.journal_id();
            for (index, leg) in attached.legs.iter().enumerate() {
                let Some(path) = &leg.path else { continue };
                if inode_of(path) != leg.inode {
                    health.fail_leg(index, &format!("the journal file {} was removed or replaced", path.display()));
                }
            }
            let out: Vec<(u32, String)> = attached
                .legs
                .iter()
                .zip(health.legs())
                .filter(|(_, (_, state, _))| *state != LegState::InService)
                .filter_map(|(leg, (_, _, why))| leg.slot.map(|slot| (slot, why.unwrap_or_default())))
                .collect();
            (attached.source(), health.failure(), health, journal_id, out)
        };
        // Outside the journal lock: this takes the controller's.
        self.fail_journal_drives(&out);
        if reason.is_none() && health.legs_pending() {
            self.record_stale_legs(&source, &health, journal_id);
            return;
        }
        let Some(reason) = reason else { return };
        match self.detach_journal(&reason, true) {
            Ok(()) => self.log(
                Severity::Critical,
                format!("journal {source} failed: {reason}; WB VDs run WT until a journal is assigned (/c0 set journal=PATH or /c0/sN set journal)"),
            ),
            Err(error) => {
                // The shards keep holding writes, and this is tried again at the next look:
                // better stalled than overwritten by a replay.
                let mut slot = self.journal.lock().expect("journal lock");
                if !slot.detach_failed_logged {
                    slot.detach_failed_logged = true;
                    drop(slot);
                    self.log(
                        Severity::Critical,
                        format!("journal {source} failed ({reason}) and cannot be detached in the metadata: {error}"),
                    );
                }
            }
        }
    }

    /// A leg failed while the other goes on: the metadata names it stale, then the shards may
    /// acknowledge again.
    fn record_stale_legs(&self, source: &str, health: &crate::journal::Health, journal_id: u64) {
        let mask = health.stale_mask();
        let persisted = {
            let mut state = self.state.lock().expect("controller lock");
            if state.config.settings.journal_id != journal_id {
                // Replaced meanwhile (`set journal=`): the mask would be the new journal's.
                return;
            }
            state.config.settings.journal_stale_legs = mask;
            self.persist(&mut state)
        };
        if let Err(error) = persisted {
            self.log(
                Severity::Critical,
                format!("journal {source}: a failed leg cannot be named stale in the metadata ({error}); writes wait"),
            );
            return;
        }
        health.legs_recorded_stale(mask);
        let failed: Vec<String> = health
            .legs()
            .into_iter()
            .filter(|(_, state, _)| *state != LegState::InService)
            .map(|(name, _, why)| format!("{name} ({})", why.unwrap_or_default()))
            .collect();
        self.log(
            Severity::Critical,
            format!(
                "journal {source} is degraded: leg {} out of service; WB goes on with one copy of the cache (assign a new pair with /c0 set journal=PATH,PATH)",
                failed.join(", ")
            ),
        );
    }

    /// Writes what only the journal held to the members and makes it durable there (writes
    /// wait meanwhile), stops trusting the journal in the metadata, then takes it from the
    /// shards: once the metadata stops trusting it, nothing replays it.
    fn detach_journal(&self, reason: &str, failed: bool) -> Result<(), String> {
        self.engine.quiesce()?;
        {
            let mut state = self.state.lock().expect("controller lock");
            state.config.settings.journal_id = 0;
            state.config.settings.journal_stale_legs = 0;
            self.persist(&mut state).map_err(|e| e.to_string())?;
        }
        let mut slot = self.journal.lock().expect("journal lock");
        self.engine.set_journal(None);
        *slot = JournalSlot { attached: None, reason: Some(reason.to_string()), failed, replay: slot.replay, detach_failed_logged: false };
        Ok(())
    }

    /// Starts the thread that looks at the journal every [`WATCH_INTERVAL`].
    pub(super) fn start_journal_watch(&self) -> std::io::Result<()> {
        let controller = self.myself();
        std::thread::Builder::new().name("storc-journal".into()).spawn(move || loop {
            std::thread::sleep(WATCH_INTERVAL);
            let Some(controller) = controller.upgrade() else { return };
            controller.check_journal();
        })?;
        Ok(())
    }
}
