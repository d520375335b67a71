//! The controller: the drives it owns (by slot), the virtual drives laid over them, hot spares,
//! events, and the configuration every member carries on disk.
//!
//! Every change goes the same way: check everything first (bad input changes nothing), apply it
//! to the in-memory configuration, bump the generation and write the whole configuration to
//! every drive the controller owns. The engine reports member failures through a channel; the
//! controller's watcher thread books them in the configuration, off the shard threads, because
//! writing metadata blocks.

use crate::config::{
    ControllerConfig, ControllerId, ControllerSettings, DriveId, DriveRecord, DriveState, HotSpareRecord, IoPolicy, ReadPolicy, SeqCutoff,
    VdRecord, WritePolicy, VD_NAME_BYTES_MAX,
};
use crate::metadata::{self, Superblock};

mod assemble;
mod bad_blocks;
mod bays;
mod bgi;
mod cc_schedule;
mod check;
mod commands;
mod copyback;
mod events;
mod journal;
mod journal_drive;
mod journal_images;
mod migrate;
mod patrol;
mod rebuild;
mod resync;
mod settings;
mod spares;
mod ssd_caching;
pub mod state;
mod types;

pub use bad_blocks::ranges_text;
pub use bgi::{BgiCommand, BgiView, InitView, FAST_INIT_BYTES};
pub use check::{CcCommand, CcTally, CcView, CC_ROW_EVENTS_MAX};
pub use copyback::{CopyView, CopybackCommand};
pub use journal::{JournalOffer, JournalState, JournalView};
pub use journal_drive::JOURNAL_DRIVE_OFFSET_BYTES;
pub use journal_images::write_row_image;
pub use migrate::MigrationView;
pub use patrol::{PatrolCommand, PatrolTally, PatrolView, PATROL_READ_BYTES, PROBE_BYTES};
pub use rebuild::{RebuildCommand, RebuildView};
pub use resync::{ResyncStatus, ResyncView, BITMAP_CLEAN_INTERVAL};
pub use ssd_caching::{SsdCacheView, SsdCaching};
pub use types::*;

use crate::vd::{MemberEvent, MemberState, VdLayout, VirtualDrive};
use crate::{Engine, VdRequest};
use drive::{Drive, DriveError, DriveInfo, DriveOp, IoCtx, Token};
pub use events::EVENTS_MAX;
use layout::Level;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// A present drive.
struct Slot {
    drive: Arc<dyn Drive>,
    source: String,
    drive_id: DriveId,
    /// Carries a foreign configuration; left untouched until import or clear.
    foreign: bool,
}

struct State {
    config: ControllerConfig,
    slots: BTreeMap<u32, Slot>,
    vds: BTreeMap<u32, Arc<VirtualDrive>>,
    foreign: Vec<ForeignConfig>,
}

pub struct Controller {
    engine: Arc<Engine>,
    state: Mutex<State>,
    events: Mutex<events::EventLog>,
    member_events: crossbeam_channel::Sender<MemberEvent>,
    /// Where VDs report changes of their bad-block lists (`bad_blocks`).
    bad_block_events: crossbeam_channel::Sender<crate::vd::BadBlockEvent>,
    /// Called (outside the state lock) after every change of the VD set or of a VD's name.
    on_vds_changed: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Rebuilds running or stopped, by the slot being rebuilt.
    rebuilds: Mutex<BTreeMap<u32, RebuildView>>,
    /// Copies (copyback, proactive replacement) running, by the target slot.
    copies: Mutex<BTreeMap<u32, CopyView>>,
    /// Migrations of whole VDs running, by VD (`migrate`).
    migrations: Mutex<BTreeMap<u32, MigrationView>>,
    /// Migrations stopped by the shutdown, by target slot: their VD and clean rows, recorded as
    /// checkpoints only if the shutdown writes everything out (`migrate`).
    stopped_migrations: Mutex<BTreeMap<u32, (Arc<VirtualDrive>, u64)>>,
    /// Spares whose copyback waits for the end of their rebuild (the slot they replaced got a
    /// good drive meanwhile).
    copyback_pending: Mutex<std::collections::BTreeSet<u32>>,
    /// The threads of rebuilds, resyncs and copies, joined at shutdown.
    rebuild_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Resyncs after an unclean stop, by VD (their threads are in `rebuild_threads`).
    resyncs: Mutex<BTreeMap<u32, ResyncView>>,
    /// Consistency checks running, by VD (their threads are in `rebuild_threads`).
    checks: Mutex<BTreeMap<u32, CcView>>,
    /// VDs whose BGI the administrator stopped: it is not started again until `resume bgi` or
    /// the next start of the controller.
    bgi_stopped: Mutex<std::collections::BTreeSet<u32>>,
    /// Full initializations running, by VD (their threads are in `rebuild_threads`).
    inits: Mutex<BTreeMap<u32, Arc<bgi::InitRun>>>,
    /// The VDs of a sequential round of scheduled checks still waiting for their turn.
    cc_queue: Mutex<Vec<u32>>,
    /// The patrol read that runs (its thread is in `rebuild_threads`).
    patrol: Mutex<Option<PatrolView>>,
    /// When this controller started: the first scheduled patrol read is one delay after it.
    started_unix_secs: u64,
    bitmap_daemon: Mutex<Option<resync::BitmapDaemon>>,
    /// The cache's journal, or why there is none.
    journal: Mutex<journal::JournalSlot>,
    /// This controller, for the threads it starts (set once, right after it is built).
    myself: std::sync::OnceLock<std::sync::Weak<Controller>>,
    /// The SSD cache of each cache VD, by its VD number (`ssd_caching`).
    ssd_caches: Mutex<BTreeMap<u32, Arc<crate::ssd_cache::SsdCache>>>,
}

fn now_unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// A fresh random 128-bit id (controller or drive), from the kernel's entropy.
fn random_id() -> u128 {
    let mut bytes = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into a live 16-byte array.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    assert_eq!(got, 16, "getrandom failed");
    u128::from_le_bytes(bytes)
}

/// The engine's view of a member in `state`: Onln is read and written, Rbld written only. A
/// copy target (Cpybck) is in no VD until its copy is done; a state of a drive in no VD on a
/// member slot (only a foreign configuration could record one) keeps the member out of service.
fn member_state_of(state: DriveState) -> MemberState {
    match state {
        DriveState::Online => MemberState::Online,
        DriveState::Missing => MemberState::Missing,
        DriveState::Rebuild => MemberState::Rebuilding,
        DriveState::Offline | DriveState::Failed | DriveState::Copyback => MemberState::Failed,
        DriveState::UnconfiguredGood | DriveState::HotSpare | DriveState::UnconfiguredBad | DriveState::Journal | DriveState::Migrate => {
            MemberState::Failed
        }
    }
}

fn parse_name(name: &str) -> Result<String, ControlError> {
    let ok = !name.is_empty()
        && name.len() <= VD_NAME_BYTES_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(name.to_string())
    } else {
        Err(ControlError::BadInput(format!(
            "VD name {name:?} is not allowed; allowed: 1 to {VD_NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_', '.'"
        )))
    }
}

fn slot_list(slots: &[u32]) -> String {
    slots.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}

impl Controller {
    /// Assembles the controller from the drives offered: reads their metadata, takes the newest
    /// configuration of our controller (or of the only one present, or starts a new one), marks
    /// members that are absent or out of date, sets other controllers' drives aside as foreign,
    /// and writes the assembled configuration back with a new generation.
    ///
    /// A drive whose metadata cannot be read is set aside with an event (its slot shows as
    /// missing), as a controller does with a disk it cannot identify: one bad drive must not
    /// keep the others from serving.
    ///
    /// # Errors
    /// If a VD cannot be laid out again, the event log cannot be opened, or metadata cannot be
    /// written back.
    pub fn open(engine: Arc<Engine>, offered: Vec<OfferedDrive>, options: ControllerOptions) -> Result<Arc<Controller>, ControlError> {
        let ours = options.ours;
        let event_log = match &options.event_log_path {
            Some(path) => {
                events::EventLog::open(path).map_err(|e| ControlError::Io(format!("cannot open the event log {}: {e}", path.display())))?
            }
            None => events::EventLog::in_memory(),
        };
        let mut startup_events = options.startup_events;
        let mut usable = Vec::new();
        let mut found = Vec::new();
        for offer in offered {
            match metadata::read(&*offer.drive) {
                Ok(outcome) => {
                    if let Some(outcome) = outcome {
                        found.push((usable.len(), outcome.superblock));
                    }
                    usable.push(offer);
                }
                Err(error) => startup_events
                    .push((Severity::Critical, format!("drive {} set aside: its metadata cannot be read: {error}", offer.source))),
            }
        }
        let offered = usable;
        let assembly = metadata::assemble(ours, found.clone());
        let (sender, receiver) = crossbeam_channel::unbounded();
        let (bad_block_sender, bad_block_receiver) = crossbeam_channel::unbounded();
        let controller = Arc::new(Controller {
            engine,
            state: Mutex::new(State {
                config: ControllerConfig {
                    controller_id: ours.unwrap_or_else(|| ControllerId(random_id())),
                    generation: 0,
                    drives: Vec::new(),
                    vds: Vec::new(),
                    hot_spares: Vec::new(),
                    settings: Default::default(),
                },
                slots: BTreeMap::new(),
                vds: BTreeMap::new(),
                foreign: Vec::new(),
            }),
            events: Mutex::new(event_log),
            member_events: sender,
            bad_block_events: bad_block_sender,
            on_vds_changed: Mutex::new(None),
            rebuilds: Mutex::new(BTreeMap::new()),
            copies: Mutex::new(BTreeMap::new()),
            migrations: Mutex::new(BTreeMap::new()),
            stopped_migrations: Mutex::new(BTreeMap::new()),
            copyback_pending: Mutex::new(std::collections::BTreeSet::new()),
            rebuild_threads: Mutex::new(Vec::new()),
            resyncs: Mutex::new(BTreeMap::new()),
            checks: Mutex::new(BTreeMap::new()),
            bgi_stopped: Mutex::new(std::collections::BTreeSet::new()),
            inits: Mutex::new(BTreeMap::new()),
            cc_queue: Mutex::new(Vec::new()),
            patrol: Mutex::new(None),
            started_unix_secs: now_unix_secs(),
            bitmap_daemon: Mutex::new(None),
            journal: Mutex::new(journal::JournalSlot::default()),
            myself: std::sync::OnceLock::new(),
            ssd_caches: Mutex::new(BTreeMap::new()),
        });
        let _ = controller.myself.set(Arc::downgrade(&controller));
        for (severity, description) in startup_events {
            controller.log(severity, description);
        }
        let found_generation = controller.assemble(offered, found, assembly)?;
        let journal_offers = controller.journal_offers_at_start(options.journal);
        controller.open_journal(journal_offers);
        controller.start_journal_watch().map_err(|e| ControlError::Io(format!("cannot start the journal thread: {e}")))?;
        controller.start_bitmap_daemon().map_err(|e| ControlError::Io(format!("cannot start the bitmap thread: {e}")))?;
        let watcher = Arc::downgrade(&controller);
        std::thread::Builder::new()
            .name("storc-watcher".into())
            .spawn(move || watch_members(watcher, receiver))
            .map_err(|e| ControlError::Io(format!("cannot start the watcher thread: {e}")))?;
        let watcher = Arc::downgrade(&controller);
        std::thread::Builder::new()
            .name("storc-badblocks".into())
            .spawn(move || bad_blocks::watch_bad_blocks(watcher, bad_block_receiver))
            .map_err(|e| ControlError::Io(format!("cannot start the bad-block thread: {e}")))?;
        // With the watcher running (a cache VD's failing member must be recordable) and before
        // any client: the maps are read and invalidated outside the state lock.
        controller.start_ssd_caches(found_generation);
        Ok(controller)
    }

    /// Lays a recorded VD over its member slots, at its recorded member size; absent members,
    /// and members now smaller than that size, stand in as missing drives.
    fn build_vd(&self, state: &State, record: &VdRecord) -> Result<Arc<VirtualDrive>, ControlError> {
        let members: Vec<Arc<dyn Drive>> = record
            .member_slots
            .iter()
            .map(|slot| match usable_member(state, record, *slot) {
                Some(drive) => Arc::clone(drive),
                None => Arc::new(MissingDrive::new(*slot, record.member_size_bytes)) as Arc<dyn Drive>,
            })
            .collect();
        let layout = VdLayout {
            level: record.level,
            strip_size_bytes: record.strip_size_bytes,
            drives_per_span: spanned(record),
            member_size_bytes: Some(record.member_size_bytes),
        };
        let vd = VirtualDrive::new(u64::from(record.vd_id), &record.name, layout, members)
            .map_err(|e| ControlError::Io(format!("VD {} ({}) cannot be laid out again: {e}", record.vd_id, record.name)))?;
        for (index, slot) in record.member_slots.iter().enumerate() {
            let drive_state = state.config.drives.iter().find(|d| d.slot == *slot).map(|d| d.state).unwrap_or(DriveState::Missing);
            let present = usable_member(state, record, *slot).is_some();
            let member_state = if present { member_state_of(drive_state) } else { MemberState::Missing };
            vd.set_member_state(index, member_state);
            // Out of service at assembly: writes may have reached the VD without it, before a
            // restart or a crash, and nothing on disk says which; only a rebuild may return it.
            if member_state != MemberState::Online {
                vd.presume_missed_writes(index);
            }
        }
        vd.set_notifier(self.member_events.clone());
        vd.set_write_policy(record.write_policy);
        vd.set_read_policies(record.read_policy, record.io_policy);
        vd.set_seq_cutoff(record.seq_cutoff);
        self.open_write_intent(state.config.controller_id, record.vd_id, &vd, crate::bitmap::control::Opening::Assembled);
        vd.bad_blocks().load(&record.bad_blocks);
        vd.bad_blocks().set_notifier(self.bad_block_events.clone());
        Ok(Arc::new(vd))
    }

    /// Bumps the generation and writes the configuration to every drive we own and that is in
    /// service. A failed drive (Failed, UBad) is skipped: it may not take writes, and the
    /// configuration on the others (the newest generation, which assembly trusts) already says
    /// it failed.
    ///
    /// A crash part-way leaves some drives one generation behind; assembly then takes the newest
    /// generation, and an older one only means a missed metadata update (see `assemble`).
    fn persist(&self, state: &mut State) -> Result<(), ControlError> {
        state.config.generation += 1;
        let failed = |slot: &u32| state.config.drives.iter().any(|d| d.slot == *slot && !state::takes_metadata_writes(d.state));
        let targets: Vec<(u32, &Slot)> =
            state.slots.iter().filter(|(slot, s)| !s.foreign && !failed(slot)).map(|(slot, present)| (*slot, present)).collect();
        let writes: Vec<(&dyn Drive, Superblock)> = targets
            .iter()
            .map(|(slot, present)| {
                let superblock = Superblock {
                    controller_id: state.config.controller_id,
                    drive_id: present.drive_id,
                    slot: *slot,
                    generation: state.config.generation,
                    capacity_bytes: present.drive.info().capacity_bytes,
                    written_unix_ns: now_unix_ns(),
                    config: state.config.clone(),
                };
                (&*present.drive, superblock)
            })
            .collect();
        let outcomes = metadata::write_all(&writes);
        let failures: Vec<String> = targets
            .iter()
            .zip(outcomes)
            .filter_map(|((slot, _), outcome)| outcome.err().map(|error| format!("slot {slot}: {error}")))
            .collect();
        if failures.is_empty() {
            state.vds.values().for_each(|vd| vd.metadata_current());
            return Ok(());
        }
        let message = format!("configuration generation {} not written to {}", state.config.generation, failures.join("; "));
        self.log(Severity::Critical, message.clone());
        Err(ControlError::Io(message))
    }

    /// Moves the drive at `slot` to `to` and records the event; the only way a drive's state
    /// changes. `detail` says more than the cause (which VD, which error).
    ///
    /// # Panics
    /// If the drive table does not allow the change (see [`state::apply`]).
    fn transition(&self, state: &mut State, slot: u32, to: DriveState, cause: state::Cause, detail: Option<&str>) -> state::Transition {
        let transition = state::apply(&mut state.config, slot, to, cause);
        self.log(transition.severity(), transition.description(detail));
        transition
    }

    /// Undoes a transition whose configuration could not be written, and records that.
    fn undo_transition(&self, state: &mut State, transition: &state::Transition) {
        state::undo(&mut state.config, transition);
        let description = format!("{}; undone, the metadata could not be written", transition.description(None));
        self.log(Severity::Warning, description);
    }

    pub fn log(&self, severity: Severity, description: String) {
        match severity {
            Severity::Info => tracing::info!("{description}"),
            Severity::Warning => tracing::warn!("{description}"),
            Severity::Critical => tracing::error!("{description}"),
        }
        self.events.lock().expect("events lock").push(severity, description);
    }

    /// The recent events, this boot's and earlier ones' when the log is kept in a file.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("events lock").recent()
    }

    fn myself(&self) -> std::sync::Weak<Controller> {
        self.myself.get().expect("set when the controller is built").clone()
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Runs `callback` after every change to the set of VDs (the NBD exports follow it).
    pub fn on_vds_changed(&self, callback: Box<dyn Fn() + Send>) {
        *self.on_vds_changed.lock().expect("callback lock") = Some(callback);
    }

    fn vds_changed(&self) {
        if let Some(callback) = &*self.on_vds_changed.lock().expect("callback lock") {
            callback();
        }
    }

    pub fn config(&self) -> ControllerConfig {
        self.state.lock().expect("controller lock").config.clone()
    }

    pub fn vds(&self) -> Vec<(VdRecord, Arc<VirtualDrive>)> {
        let state = self.state.lock().expect("controller lock");
        state.config.vds.iter().map(|r| (r.clone(), Arc::clone(&state.vds[&r.vd_id]))).collect()
    }

    pub fn vd(&self, vd_id: u32) -> Result<(VdRecord, Arc<VirtualDrive>), ControlError> {
        self.vds().into_iter().find(|(r, _)| r.vd_id == vd_id).ok_or_else(|| self.no_vd(vd_id))
    }

    fn no_vd(&self, vd_id: u32) -> ControlError {
        let ids: Vec<String> = self.config().vds.iter().map(|v| format!("v{}", v.vd_id)).collect();
        let known = if ids.is_empty() { "there are none".to_string() } else { format!("VDs: {}", ids.join(", ")) };
        ControlError::NotFound(format!("virtual drive v{vd_id} does not exist; {known}"))
    }

    pub fn slots(&self) -> Vec<SlotView> {
        let state = self.state.lock().expect("controller lock");
        let mut views: Vec<SlotView> = state.slots.iter().map(|(slot, present)| slot_view(&state, *slot, Some(present))).collect();
        for record in state.config.drives.iter().filter(|d| !state.slots.contains_key(&d.slot)) {
            views.push(slot_view(&state, record.slot, None));
        }
        views.sort_by_key(|v| v.slot);
        views
    }

    pub fn slot(&self, slot: u32) -> Result<SlotView, ControlError> {
        self.slots().into_iter().find(|v| v.slot == slot).ok_or_else(|| self.no_slot(slot))
    }

    fn no_slot(&self, slot: u32) -> ControlError {
        let slots: Vec<u32> = self.slots().iter().map(|v| v.slot).collect();
        ControlError::NotFound(format!("slot {slot} does not exist; slots: {}", slot_list(&slots)))
    }

    pub fn foreign(&self) -> Vec<ForeignConfig> {
        self.state.lock().expect("controller lock").foreign.clone()
    }

    // -----------------------------------------------------------------------------------------

    /// Flushes every VD and writes the configuration once more (clean shutdown).
    pub fn shutdown(&self) {
        // Rebuilds and copies stop at their watermark, checkpointed, and resume at the next start.
        self.stop_checks();
        self.stop_patrol();
        self.stop_resyncs();
        self.stop_rebuilds();
        // The cache goes to the members and the journal is checkpointed empty: a clean stop
        // leaves nothing to replay, and the bitmap's clean pass below sees every write.
        let quiesced = self.engine.quiesce();
        if let Err(error) = &quiesced {
            self.log(Severity::Warning, format!("cache not written out at shutdown ({error}); the journal keeps it for the next start"));
        }
        let mut flushed = true;
        for (record, vd) in self.vds() {
            if let Err(error) = self.engine.run(&vd, VdRequest::Flush).result {
                self.log(Severity::Warning, format!("v{}: flush at shutdown failed: {error}", record.vd_id));
                flushed = false;
            }
        }
        self.close_write_intents();
        // A failure the engine found is recorded by the watcher; the last write of the
        // configuration must not overtake it (it would bring the member back in service).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.vds().iter().any(|(_, vd)| vd.failures_unrecorded() > 0) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut state = self.state.lock().expect("controller lock");
        self.checkpoint_stopped_migrations(&mut state, quiesced.is_ok() && flushed);
        let persisted = self.persist(&mut state);
        drop(state);
        // Only after a stop that left nothing to replay and wrote its configuration: the maps
        // name that configuration's generation.
        if quiesced.is_ok() && persisted.is_ok() {
            self.save_ssd_cache_maps();
        }
        self.log(Severity::Info, "controller stopped cleanly".into());
    }

    /// Books a member failure the engine found: records it in the metadata, then lets the VD
    /// acknowledge the writes it held meanwhile (or fail them if it could not be recorded).
    fn member_changed(&self, event: MemberEvent) {
        if event.copy_target {
            return self.copy_target_failed(event);
        }
        let mut state = self.state.lock().expect("controller lock");
        // Matched by instance: a VD deleted meanwhile, or another created under its number,
        // must not settle this failure.
        let Some(vd) = state.vds.values().find(|vd| vd.instance_id() == event.instance_id).cloned() else { return };
        let record = state.config.vds.iter().find(|v| u64::from(v.vd_id) == event.vd_id).cloned().expect("a live VD has a record");
        let slot = record.member_slots[event.member];
        let drive_state = match event.state {
            MemberState::Online | MemberState::Rebuilding => unreachable!("the engine reports failures only"),
            MemberState::Failed => DriveState::Failed,
            MemberState::Missing => DriveState::Missing,
        };
        let before = state.config.drives.iter().find(|d| d.slot == slot).map(|d| d.state);
        if !matches!(before, Some(DriveState::Online | DriveState::Rebuild)) {
            // Already out of service in the configuration (the administrator was first).
            drop(state);
            return vd.failure_recorded(Ok(()));
        }
        let detail = format!("member of v{}: {}; v{} is now {}", record.vd_id, event.reason, record.vd_id, vd.state().short_name());
        self.transition(&mut state, slot, drive_state, state::Cause::IoFailure, Some(&detail));
        let recorded = self.persist(&mut state).map_err(|e| e.to_string());
        let take_over = recorded.is_ok();
        vd.failure_recorded(recorded);
        if take_over {
            self.take_over(&mut state, record.vd_id);
        }
        drop(state);
        if record.cache_vd && vd.state() == crate::VdState::Offline {
            self.cache_vd_failed(record.vd_id, false);
        }
    }
}

fn watch_members(controller: std::sync::Weak<Controller>, events: crossbeam_channel::Receiver<MemberEvent>) {
    while let Ok(event) = events.recv() {
        let Some(controller) = controller.upgrade() else { return };
        controller.member_changed(event);
    }
}

/// The drive at `slot` if the VD can use it: present, ours, and at least its member size.
fn usable_member<'a>(state: &'a State, record: &VdRecord, slot: u32) -> Option<&'a Arc<dyn Drive>> {
    let present = state.slots.get(&slot).filter(|s| !s.foreign)?;
    (present.drive.info().capacity_bytes >= record.member_size_bytes).then_some(&present.drive)
}

fn spanned(record: &VdRecord) -> Option<usize> {
    record.level.is_spanned().then_some(record.drives_per_span as usize)
}

/// The VD (and member index) a slot belongs to.
fn member_of(state: &State, slot: u32) -> Option<(u32, usize)> {
    state.config.vds.iter().find_map(|v| v.member_slots.iter().position(|s| *s == slot).map(|i| (v.vd_id, i)))
}

fn slot_view(state: &State, slot: u32, present: Option<&Slot>) -> SlotView {
    let record = state.config.drives.iter().find(|d| d.slot == slot);
    let vd = member_of(state, slot).map(|(vd, _)| vd);
    let read_errors = member_of(state, slot).map(|(vd, i)| state.vds[&vd].member(i).read_error_count()).unwrap_or(0);
    SlotView {
        slot,
        drive_id: present.map(|p| p.drive_id).or(record.map(|r| r.drive_id)).unwrap_or(DriveId(0)),
        state: record.map(|r| r.state).unwrap_or(DriveState::UnconfiguredGood),
        foreign: present.is_some_and(|p| p.foreign),
        vd,
        hot_spare_drive_groups: state.config.hot_spares.iter().find(|h| h.slot == slot).map(|h| h.dedicated_drive_groups.clone()),
        capacity_bytes: present.map(|p| p.drive.info().capacity_bytes).or(record.map(|r| r.capacity_bytes)).unwrap_or(0),
        source: present.map(|p| p.source.clone()).unwrap_or_else(|| "(not present)".into()),
        info: present.map(|p| p.drive.info().clone()),
        read_errors,
    }
}

/// Stands in for a member that is not present: every operation fails as a pulled drive does.
struct MissingDrive {
    info: DriveInfo,
}

impl MissingDrive {
    fn new(slot: u32, capacity_bytes: u64) -> MissingDrive {
        let info = DriveInfo {
            name: format!("missing slot {slot}"),
            kind: drive::DriveKind::Memory,
            capacity_bytes,
            direct_io: false,
            solid_state: false,
        };
        MissingDrive { info }
    }
}

impl Drive for MissingDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }
    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        ctx.fail(token, DriveError::Gone, op);
    }
}
