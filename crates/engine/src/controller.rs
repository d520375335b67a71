//! The controller: the drives it owns (by slot), the virtual drives laid over them, hot spares,
//! events, and the configuration every member carries on disk.
//!
//! Every change goes the same way: check everything first (bad input changes nothing), apply it
//! to the in-memory configuration, bump the generation and write the whole configuration to
//! every drive the controller owns. The engine reports member failures through a channel; the
//! controller's watcher thread books them in the configuration, off the shard threads, because
//! writing metadata blocks.

use crate::config::{
    ControllerConfig, ControllerId, DriveId, DriveRecord, DriveState, HotSpareRecord, IoPolicy, ReadPolicy, VdRecord, WritePolicy,
    VD_NAME_BYTES_MAX,
};
use crate::metadata::{self, Superblock};
use crate::vd::{MemberEvent, MemberState, VdLayout, VirtualDrive};
use crate::{Engine, VdRequest};
use drive::{Drive, DriveError, DriveInfo, DriveOp, IoCtx, Token};
use layout::Level;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Events kept in memory for `show events`.
const EVENTS_MAX: usize = 1000;

/// A drive offered to the controller at start: the drive and where it came from.
pub struct OfferedDrive {
    pub drive: Arc<dyn Drive>,
    /// `mem:8GiB`, a path, an emulated drive spec.
    pub source: String,
}

/// Why a control request was refused. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// Malformed or impossible input (400).
    BadInput(String),
    /// No such VD, slot or foreign configuration (404).
    NotFound(String),
    /// Not allowed in the current state (409).
    Conflict(String),
    /// The change was applied in memory but metadata could not be written (500).
    Io(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::BadInput(m) | ControlError::NotFound(m) | ControlError::Conflict(m) | ControlError::Io(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ControlError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

#[derive(Clone, Debug)]
pub struct Event {
    pub sequence: u64,
    pub time_unix_secs: u64,
    pub severity: Severity,
    pub description: String,
}

/// What `add vd` asks for.
#[derive(Clone, Debug)]
pub struct CreateVdSpec {
    pub level: Level,
    pub slots: Vec<u32>,
    pub strip_size_bytes: u64,
    pub name: Option<String>,
    pub drives_per_span: Option<usize>,
    pub write_policy: WritePolicy,
    pub read_policy: ReadPolicy,
    pub io_policy: IoPolicy,
}

/// What `set` changes on a VD; `None` keeps the current value.
#[derive(Clone, Debug, Default)]
pub struct VdChanges {
    pub write_policy: Option<WritePolicy>,
    pub read_policy: Option<ReadPolicy>,
    pub io_policy: Option<IoPolicy>,
    pub name: Option<String>,
}

/// What `/c0/sN set` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriveCommand {
    Offline,
    Online,
    Missing,
    Good,
}

/// A drive slot as the controller sees it now.
#[derive(Clone)]
pub struct SlotView {
    pub slot: u32,
    pub drive_id: DriveId,
    pub state: DriveState,
    /// Carries another controller's configuration (not written until imported or cleared).
    pub foreign: bool,
    pub vd: Option<u32>,
    pub hot_spare_drive_groups: Option<Vec<u32>>,
    pub capacity_bytes: u64,
    pub source: String,
    pub info: Option<DriveInfo>,
    pub read_errors: u32,
}

/// A configuration found on drives written by another controller.
#[derive(Clone, Debug)]
pub struct ForeignConfig {
    pub superblock: Superblock,
    /// Our slots holding its drives.
    pub slots: Vec<u32>,
}

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
    events: Mutex<(u64, VecDeque<Event>)>,
    member_events: crossbeam_channel::Sender<MemberEvent>,
    /// Called (outside the state lock) after every change of the VD set or of a VD's name.
    on_vds_changed: Mutex<Option<Box<dyn Fn() + Send>>>,
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

fn member_state_of(state: DriveState) -> MemberState {
    match state {
        DriveState::Online => MemberState::Online,
        DriveState::Missing => MemberState::Missing,
        _ => MemberState::Failed,
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
    /// # Errors
    /// If the metadata of a drive cannot be read at all, or a VD cannot be laid out again.
    /// `ours` is this controller's id if it has one (the daemon keeps it in its data directory):
    /// with drives of several controllers present, only it decides which configuration is ours.
    pub fn open(engine: Arc<Engine>, offered: Vec<OfferedDrive>, ours: Option<ControllerId>) -> Result<Arc<Controller>, ControlError> {
        let mut found = Vec::new();
        for (index, offer) in offered.iter().enumerate() {
            let outcome = metadata::read(&*offer.drive).map_err(|e| ControlError::Io(format!("drive {}: {e}", offer.source)))?;
            if let Some(outcome) = outcome {
                found.push((index, outcome.superblock));
            }
        }
        let assembly = metadata::assemble(ours, found.clone());
        let (sender, receiver) = crossbeam_channel::unbounded();
        let controller = Arc::new(Controller {
            engine,
            state: Mutex::new(State {
                config: ControllerConfig {
                    controller_id: ours.unwrap_or_else(|| ControllerId(random_id())),
                    generation: 0,
                    drives: Vec::new(),
                    vds: Vec::new(),
                    hot_spares: Vec::new(),
                },
                slots: BTreeMap::new(),
                vds: BTreeMap::new(),
                foreign: Vec::new(),
            }),
            events: Mutex::new((0, VecDeque::new())),
            member_events: sender,
            on_vds_changed: Mutex::new(None),
        });
        controller.assemble(offered, found, assembly)?;
        let watcher = Arc::downgrade(&controller);
        std::thread::Builder::new()
            .name("storc-watcher".into())
            .spawn(move || watch_members(watcher, receiver))
            .map_err(|e| ControlError::Io(format!("cannot start the watcher thread: {e}")))?;
        Ok(controller)
    }

    fn assemble(
        &self,
        offered: Vec<OfferedDrive>,
        found: Vec<(usize, Superblock)>,
        assembly: metadata::Assembly,
    ) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let superblock_of = |index: usize| found.iter().find(|(i, _)| *i == index).map(|(_, sb)| sb.clone());
        if let Some(ours) = &assembly.ours {
            state.config = ours.config.clone();
        }
        let ours_id = state.config.controller_id;
        let mut offered: Vec<Option<OfferedDrive>> = offered.into_iter().map(Some).collect();
        // Our drives keep their recorded slots.
        for index in 0..offered.len() {
            let Some(sb) = superblock_of(index) else { continue };
            if sb.controller_id != ours_id || state.config.drives.iter().all(|d| d.drive_id != sb.drive_id) {
                continue;
            }
            let offer = offered[index].take().expect("each drive once");
            let slot = state.config.drives.iter().find(|d| d.drive_id == sb.drive_id).expect("checked").slot;
            if sb.generation < state.config.generation {
                self.log(
                    Severity::Warning,
                    format!(
                        "drive at slot {slot} ({}) has configuration generation {} older than {}; it is out of date",
                        offer.source, sb.generation, state.config.generation
                    ),
                );
                mark_out_of_date(&mut state.config, slot);
            }
            state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id: sb.drive_id, foreign: false });
        }
        // Foreign drives and blank drives take the lowest free slots.
        for (index, offer) in offered.into_iter().enumerate() {
            let Some(offer) = offer else { continue };
            let slot =
                (0..).find(|s| !state.slots.contains_key(s) && state.config.drives.iter().all(|d| d.slot != *s)).expect("a free slot");
            // A drive that carries our id but left our configuration is blank to us.
            match superblock_of(index).filter(|sb| sb.controller_id != ours_id) {
                Some(sb) => {
                    state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id: sb.drive_id, foreign: true });
                    add_foreign(&mut state.foreign, sb, slot);
                }
                None => {
                    let drive_id = DriveId(random_id());
                    let capacity_bytes = offer.drive.info().capacity_bytes;
                    state.config.drives.push(DriveRecord { slot, drive_id, state: DriveState::UnconfiguredGood, capacity_bytes });
                    state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id, foreign: false });
                }
            }
        }
        mark_missing(&mut state);
        for record in state.config.vds.clone() {
            let vd = self.build_vd(&state, &record)?;
            state.vds.insert(record.vd_id, vd);
        }
        if !state.foreign.is_empty() {
            self.log(Severity::Warning, format!("{} foreign configuration(s) found; see /c0/fall show", state.foreign.len()));
        }
        self.persist(&mut state)?;
        self.log(
            Severity::Info,
            format!(
                "controller {:032x} started with {} drive(s) and {} VD(s), generation {}",
                ours_id.0,
                state.slots.len(),
                state.vds.len(),
                state.config.generation
            ),
        );
        Ok(())
    }

    /// Lays a recorded VD over its member slots; absent members stand in as missing drives.
    fn build_vd(&self, state: &State, record: &VdRecord) -> Result<Arc<VirtualDrive>, ControlError> {
        let mut members: Vec<Arc<dyn Drive>> = Vec::new();
        for slot in &record.member_slots {
            let capacity = state.config.drives.iter().find(|d| d.slot == *slot).map(|d| d.capacity_bytes).unwrap_or(0);
            match state.slots.get(slot) {
                Some(present) if !present.foreign => members.push(Arc::clone(&present.drive)),
                _ => members.push(Arc::new(MissingDrive::new(*slot, capacity))),
            }
        }
        let layout = VdLayout { level: record.level, strip_size_bytes: record.strip_size_bytes, drives_per_span: spanned(record) };
        let vd = VirtualDrive::new(u64::from(record.vd_id), &record.name, layout, members)
            .map_err(|e| ControlError::Io(format!("VD {} ({}) cannot be laid out again: {e}", record.vd_id, record.name)))?;
        for (index, slot) in record.member_slots.iter().enumerate() {
            let drive_state = state.config.drives.iter().find(|d| d.slot == *slot).map(|d| d.state).unwrap_or(DriveState::Missing);
            let present = state.slots.get(slot).is_some_and(|s| !s.foreign);
            let member_state = if present { member_state_of(drive_state) } else { MemberState::Missing };
            vd.set_member_state(index, member_state);
            // Out of service at assembly: writes may have reached the VD without it, before a
            // restart or a crash, and nothing on disk says which; only a rebuild may return it.
            if member_state != MemberState::Online {
                vd.presume_missed_writes(index);
            }
        }
        vd.set_notifier(self.member_events.clone());
        Ok(Arc::new(vd))
    }

    /// Bumps the generation and writes the configuration to every drive we own.
    fn persist(&self, state: &mut State) -> Result<(), ControlError> {
        state.config.generation += 1;
        let mut failures = Vec::new();
        for (slot, present) in state.slots.iter().filter(|(_, s)| !s.foreign) {
            let superblock = Superblock {
                controller_id: state.config.controller_id,
                drive_id: present.drive_id,
                slot: *slot,
                generation: state.config.generation,
                capacity_bytes: present.drive.info().capacity_bytes,
                written_unix_ns: now_unix_ns(),
                config: state.config.clone(),
            };
            if let Err(error) = metadata::write(&*present.drive, &superblock) {
                failures.push(format!("slot {slot}: {error}"));
            }
        }
        if failures.is_empty() {
            return Ok(());
        }
        let message = format!("configuration generation {} not written to {}", state.config.generation, failures.join("; "));
        self.log(Severity::Critical, message.clone());
        Err(ControlError::Io(message))
    }

    pub fn log(&self, severity: Severity, description: String) {
        match severity {
            Severity::Info => tracing::info!("{description}"),
            Severity::Warning => tracing::warn!("{description}"),
            Severity::Critical => tracing::error!("{description}"),
        }
        let mut events = self.events.lock().expect("events lock");
        events.0 += 1;
        let event = Event { sequence: events.0, time_unix_secs: now_unix_secs(), severity, description };
        events.1.push_back(event);
        if events.1.len() > EVENTS_MAX {
            events.1.pop_front();
        }
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("events lock").1.iter().cloned().collect()
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
    // Virtual drives

    /// Creates a VD over unconfigured good drives.
    ///
    /// # Errors
    /// Which slot or rule is wrong, and what is allowed; nothing changes.
    pub fn create_vd(&self, spec: CreateVdSpec) -> Result<VdRecord, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        check_new_members(&state, &spec.slots)?;
        let vd_id = (0..).find(|id| !state.vds.contains_key(id)).expect("a free VD id");
        let name = match &spec.name {
            Some(name) => parse_name(name)?,
            None => format!("v{vd_id}"),
        };
        if let Some(other) = state.config.vds.iter().find(|v| v.name == name) {
            return Err(ControlError::Conflict(format!(
                "VD name {name:?} is used by v{}; names are NBD export names and must be unique",
                other.vd_id
            )));
        }
        let members: Vec<Arc<dyn Drive>> = spec.slots.iter().map(|s| Arc::clone(&state.slots[s].drive)).collect();
        let layout = VdLayout { level: spec.level, strip_size_bytes: spec.strip_size_bytes, drives_per_span: spec.drives_per_span };
        let vd = VirtualDrive::new(u64::from(vd_id), &name, layout, members)
            .map_err(|e| ControlError::BadInput(format!("{e}: slots {}", slot_list(&spec.slots))))?;
        let record = VdRecord {
            vd_id,
            drive_group: vd_id,
            name,
            level: spec.level,
            strip_size_bytes: spec.strip_size_bytes,
            drives_per_span: vd.geometry().drives_per_span() as u32,
            member_slots: spec.slots.clone(),
            write_policy: spec.write_policy,
            read_policy: spec.read_policy,
            io_policy: spec.io_policy,
        };
        vd.set_notifier(self.member_events.clone());
        for slot in &spec.slots {
            set_drive_state(&mut state.config, *slot, DriveState::Online);
        }
        state.config.vds.push(record.clone());
        state.vds.insert(vd_id, Arc::new(vd));
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(
            Severity::Info,
            format!("created v{vd_id} {:?}: {} over slots {}", record.name, record.level, slot_list(&record.member_slots)),
        );
        self.vds_changed();
        persisted.map(|()| record)
    }

    /// Deletes a VD; its drives become unconfigured good. `in_use` says whether clients are
    /// connected to it; then `force` is needed.
    ///
    /// # Errors
    /// No such VD, or in use without `force`.
    pub fn delete_vd(&self, vd_id: u32, force: bool, in_use: bool) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(position) = state.config.vds.iter().position(|v| v.vd_id == vd_id) else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        if in_use && !force {
            return Err(ControlError::Conflict(format!("v{vd_id} has NBD clients connected; disconnect them or add `force`")));
        }
        let record = state.config.vds.remove(position);
        state.vds.remove(&vd_id);
        for slot in &record.member_slots {
            set_drive_state(&mut state.config, *slot, DriveState::UnconfiguredGood);
        }
        // A spare dedicated only to this drive group has nothing left to serve: it becomes
        // unconfigured good (as on a MegaRAID), never silently global.
        let dg = record.drive_group;
        let orphaned: Vec<u32> = state.config.hot_spares.iter().filter(|h| h.dedicated_drive_groups == [dg]).map(|h| h.slot).collect();
        state.config.hot_spares.retain(|h| !orphaned.contains(&h.slot));
        for spare in &mut state.config.hot_spares {
            spare.dedicated_drive_groups.retain(|g| *g != dg);
        }
        for slot in &orphaned {
            set_drive_state(&mut state.config, *slot, DriveState::UnconfiguredGood);
        }
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(Severity::Info, format!("deleted v{vd_id} {:?}", record.name));
        self.vds_changed();
        persisted
    }

    /// Changes a VD's policies or name.
    ///
    /// # Errors
    /// No such VD, or a bad or duplicate name.
    pub fn set_vd(&self, vd_id: u32, changes: VdChanges) -> Result<VdRecord, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let name = changes.name.as_deref().map(parse_name).transpose()?;
        if let Some(name) = &name {
            if let Some(other) = state.config.vds.iter().find(|v| &v.name == name && v.vd_id != vd_id) {
                return Err(ControlError::Conflict(format!("VD name {name:?} is used by v{}", other.vd_id)));
            }
        }
        let Some(record) = state.config.vds.iter_mut().find(|v| v.vd_id == vd_id) else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        record.write_policy = changes.write_policy.unwrap_or(record.write_policy);
        record.read_policy = changes.read_policy.unwrap_or(record.read_policy);
        record.io_policy = changes.io_policy.unwrap_or(record.io_policy);
        let renamed = name.is_some();
        if let Some(name) = name {
            record.name = name;
        }
        let record = record.clone();
        if renamed {
            let rebuilt = self.build_vd(&state, &record)?;
            state.vds.insert(vd_id, rebuilt);
        }
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(
            Severity::Info,
            format!(
                "v{vd_id}: policies {} {} {}, name {:?}",
                record.write_policy.short_name(),
                record.read_policy.short_name(),
                record.io_policy.short_name(),
                record.name
            ),
        );
        if renamed {
            self.vds_changed();
        }
        persisted.map(|()| record)
    }

    // -----------------------------------------------------------------------------------------
    // Drives and hot spares

    /// Takes a drive out, brings it back, marks it missing, or makes it unconfigured good.
    ///
    /// # Errors
    /// No such slot, or the change is not allowed from its state (with what is).
    pub fn set_drive(&self, slot: u32, command: DriveCommand) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.drives.iter().find(|d| d.slot == slot).cloned() else {
            drop(state);
            return Err(self.no_slot(slot));
        };
        let membership = member_of(&state, slot);
        let new_state = plan_drive_change(slot, record.state, command, membership.as_ref().map(|(vd, _)| vd))?;
        if let Some((vd_id, index)) = membership {
            let vd = Arc::clone(&state.vds[&vd_id]);
            if new_state == DriveState::Online && vd.member(index).has_missed_writes() {
                return Err(ControlError::Conflict(format!(
                    "slot {slot} missed writes to v{vd_id} while out of service; bringing it online would serve stale data. It needs a rebuild (not built yet); until then keep it offline"
                )));
            }
            vd.set_member_state(index, member_state_of(new_state));
        }
        set_drive_state(&mut state.config, slot, new_state);
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(
            Severity::Warning,
            format!("slot {slot}: {} -> {} by the administrator", record.state.short_name(), new_state.short_name()),
        );
        persisted
    }

    /// Makes an unconfigured good drive a hot spare, global (no drive groups) or dedicated.
    ///
    /// # Errors
    /// No such slot, the drive is not unconfigured good, or a drive group does not exist.
    pub fn add_hot_spare(&self, slot: u32, drive_groups: Vec<u32>) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.drives.iter().find(|d| d.slot == slot).cloned() else {
            drop(state);
            return Err(self.no_slot(slot));
        };
        if record.state != DriveState::UnconfiguredGood {
            return Err(ControlError::Conflict(format!(
                "slot {slot} is {}; only an unconfigured good (UGood) drive can become a hot spare",
                record.state.short_name()
            )));
        }
        for dg in &drive_groups {
            if state.config.vds.iter().all(|v| v.drive_group != *dg) {
                let dgs: Vec<String> = state.config.vds.iter().map(|v| v.drive_group.to_string()).collect();
                return Err(ControlError::NotFound(format!(
                    "drive group {dg} does not exist; drive groups: {}",
                    if dgs.is_empty() { "none".into() } else { dgs.join(", ") }
                )));
            }
        }
        set_drive_state(&mut state.config, slot, DriveState::HotSpare);
        state.config.hot_spares.push(HotSpareRecord { slot, dedicated_drive_groups: drive_groups.clone() });
        let persisted = self.persist(&mut state);
        drop(state);
        let kind = if drive_groups.is_empty() {
            "global".to_string()
        } else {
            format!("dedicated to drive group(s) {}", slot_list(&drive_groups))
        };
        self.log(Severity::Info, format!("slot {slot} is now a {kind} hot spare"));
        persisted
    }

    /// Turns a hot spare back into an unconfigured good drive.
    ///
    /// # Errors
    /// No such slot, or it is not a hot spare.
    pub fn delete_hot_spare(&self, slot: u32) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(position) = state.config.hot_spares.iter().position(|h| h.slot == slot) else {
            let exists = state.config.drives.iter().any(|d| d.slot == slot);
            drop(state);
            return Err(if exists { ControlError::Conflict(format!("slot {slot} is not a hot spare")) } else { self.no_slot(slot) });
        };
        state.config.hot_spares.remove(position);
        set_drive_state(&mut state.config, slot, DriveState::UnconfiguredGood);
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(Severity::Info, format!("slot {slot} is no longer a hot spare"));
        persisted
    }

    // -----------------------------------------------------------------------------------------
    // Foreign configurations

    /// Adopts every foreign configuration: its VDs join ours, its drives become our members.
    ///
    /// # Errors
    /// If there is none, or its VDs' names clash with ours.
    pub fn import_foreign(&self) -> Result<usize, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        if state.foreign.is_empty() {
            return Err(ControlError::NotFound("there is no foreign configuration to import".into()));
        }
        let foreign = std::mem::take(&mut state.foreign);
        let mut imported = 0;
        for config in &foreign {
            imported += import_one(&mut state, config)
                .map_err(|e| ControlError::Conflict(format!("foreign configuration {:032x}: {e}", config.superblock.controller_id.0)))?;
        }
        for record in state.config.vds.clone() {
            if !state.vds.contains_key(&record.vd_id) {
                let vd = self.build_vd(&state, &record)?;
                state.vds.insert(record.vd_id, vd);
            }
        }
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(Severity::Info, format!("imported {imported} VD(s) from {} foreign configuration(s)", foreign.len()));
        self.vds_changed();
        persisted.map(|()| imported)
    }

    /// Clears every foreign configuration; its drives become unconfigured good drives of ours.
    ///
    /// # Errors
    /// If there is none, or a drive's metadata cannot be cleared.
    pub fn clear_foreign(&self) -> Result<usize, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        if state.foreign.is_empty() {
            return Err(ControlError::NotFound("there is no foreign configuration to delete".into()));
        }
        let foreign = std::mem::take(&mut state.foreign);
        let slots: Vec<u32> = foreign.iter().flat_map(|f| f.slots.clone()).collect();
        for slot in &slots {
            let present = state.slots.get_mut(slot).expect("foreign drives are present");
            metadata::clear(&*present.drive).map_err(|e| ControlError::Io(format!("slot {slot}: {e}")))?;
            present.foreign = false;
            present.drive_id = DriveId(random_id());
            let record = DriveRecord {
                slot: *slot,
                drive_id: present.drive_id,
                state: DriveState::UnconfiguredGood,
                capacity_bytes: present.drive.info().capacity_bytes,
            };
            state.config.drives.push(record);
        }
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(Severity::Warning, format!("cleared {} foreign configuration(s) on slots {}", foreign.len(), slot_list(&slots)));
        persisted.map(|()| foreign.len())
    }

    // -----------------------------------------------------------------------------------------

    /// Flushes every VD and writes the configuration once more (clean shutdown).
    pub fn shutdown(&self) {
        for (record, vd) in self.vds() {
            if let Err(error) = self.engine.run(&vd, VdRequest::Flush).result {
                self.log(Severity::Warning, format!("v{}: flush at shutdown failed: {error}", record.vd_id));
            }
        }
        let mut state = self.state.lock().expect("controller lock");
        let _ = self.persist(&mut state);
        drop(state);
        self.log(Severity::Info, "controller stopped cleanly".into());
    }

    /// Books a member state change the engine made (a failed drive).
    fn member_changed(&self, event: MemberEvent) {
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.vds.iter().find(|v| u64::from(v.vd_id) == event.vd_id).cloned() else { return };
        let slot = record.member_slots[event.member];
        let drive_state = match event.state {
            MemberState::Online => return,
            MemberState::Failed => DriveState::Failed,
            MemberState::Missing => DriveState::Missing,
        };
        let before = state.config.drives.iter().find(|d| d.slot == slot).map(|d| d.state);
        if before != Some(DriveState::Online) {
            return;
        }
        set_drive_state(&mut state.config, slot, drive_state);
        let vd_state = state.vds[&record.vd_id].state();
        let _ = self.persist(&mut state);
        drop(state);
        self.log(
            Severity::Critical,
            format!("slot {slot} of v{} failed ({}); v{} is now {}", record.vd_id, event.reason, record.vd_id, vd_state.short_name()),
        );
    }
}

fn watch_members(controller: std::sync::Weak<Controller>, events: crossbeam_channel::Receiver<MemberEvent>) {
    while let Ok(event) = events.recv() {
        let Some(controller) = controller.upgrade() else { return };
        controller.member_changed(event);
    }
}

fn spanned(record: &VdRecord) -> Option<usize> {
    record.level.is_spanned().then_some(record.drives_per_span as usize)
}

fn set_drive_state(config: &mut ControllerConfig, slot: u32, state: DriveState) {
    if let Some(record) = config.drives.iter_mut().find(|d| d.slot == slot) {
        record.state = state;
    }
}

fn mark_out_of_date(config: &mut ControllerConfig, slot: u32) {
    let is_member = config.vds.iter().any(|v| v.member_slots.contains(&slot));
    if is_member {
        set_drive_state(config, slot, DriveState::Failed);
    }
}

/// Recorded drives that did not show up are missing.
fn mark_missing(state: &mut State) {
    let absent: Vec<u32> = state.config.drives.iter().map(|d| d.slot).filter(|s| !state.slots.contains_key(s)).collect();
    for slot in absent {
        set_drive_state(&mut state.config, slot, DriveState::Missing);
    }
}

fn add_foreign(foreign: &mut Vec<ForeignConfig>, superblock: Superblock, slot: u32) {
    match foreign.iter_mut().find(|f| f.superblock.controller_id == superblock.controller_id) {
        Some(existing) => {
            existing.slots.push(slot);
            if superblock.generation > existing.superblock.generation {
                existing.superblock = superblock;
            }
        }
        None => foreign.push(ForeignConfig { superblock, slots: vec![slot] }),
    }
}

/// The VD (and member index) a slot belongs to.
fn member_of(state: &State, slot: u32) -> Option<(u32, usize)> {
    state.config.vds.iter().find_map(|v| v.member_slots.iter().position(|s| *s == slot).map(|i| (v.vd_id, i)))
}

/// The state a drive command leads to, or why it is not allowed.
fn plan_drive_change(slot: u32, current: DriveState, command: DriveCommand, vd: Option<&u32>) -> Result<DriveState, ControlError> {
    let refuse = |allowed: &str| {
        Err(ControlError::Conflict(format!(
            "slot {slot} is {}; `set {}` is allowed only for {allowed}",
            current.short_name(),
            format!("{command:?}").to_lowercase()
        )))
    };
    match (command, current, vd) {
        (DriveCommand::Offline, DriveState::Online, Some(_)) => Ok(DriveState::Offline),
        (DriveCommand::Offline, _, _) => refuse("online members of a VD (Onln)"),
        (DriveCommand::Online, DriveState::Offline | DriveState::Failed | DriveState::Missing, Some(_)) => Ok(DriveState::Online),
        (DriveCommand::Online, _, _) => refuse("members of a VD that are Offln, Failed or Msng"),
        (DriveCommand::Missing, DriveState::Online | DriveState::Offline | DriveState::Failed, Some(_)) => Ok(DriveState::Missing),
        (DriveCommand::Missing, _, _) => refuse("members of a VD"),
        (DriveCommand::Good, DriveState::Failed | DriveState::Offline | DriveState::Missing, None) => Ok(DriveState::UnconfiguredGood),
        (DriveCommand::Good, _, Some(vd)) => Err(ControlError::Conflict(format!("slot {slot} is a member of v{vd}; delete the VD first"))),
        (DriveCommand::Good, _, None) => refuse("drives in no VD that are Failed, Offln or Msng"),
    }
}

/// Checks that `slots` can become the members of a new VD.
fn check_new_members(state: &State, slots: &[u32]) -> Result<(), ControlError> {
    if slots.is_empty() {
        return Err(ControlError::BadInput("a VD needs drives; give them as drives=0-3".into()));
    }
    for (i, slot) in slots.iter().enumerate() {
        if slots[..i].contains(slot) {
            return Err(ControlError::BadInput(format!("slot {slot} is listed twice: slots {}", slot_list(slots))));
        }
        if state.slots.get(slot).is_some_and(|s| s.foreign) {
            return Err(ControlError::Conflict(format!(
                "slot {slot} holds a foreign configuration; import it (/c0/fall import) or clear it (/c0/fall del) first"
            )));
        }
        let Some(record) = state.config.drives.iter().find(|d| d.slot == *slot) else {
            let mut known: Vec<u32> = state.config.drives.iter().map(|d| d.slot).chain(state.slots.keys().copied()).collect();
            known.sort_unstable();
            known.dedup();
            return Err(ControlError::NotFound(format!("slot {slot} does not exist; slots: {}", slot_list(&known))));
        };
        if record.state != DriveState::UnconfiguredGood || state.slots.get(slot).is_none_or(|s| s.foreign) {
            let what = match member_of(state, *slot) {
                Some((vd, _)) => format!("a member of v{vd}"),
                None if record.state == DriveState::HotSpare => format!("a hot spare (remove it with /c0/s{slot} delete hotsparedrive)"),
                None => record.state.short_name().to_string(),
            };
            return Err(ControlError::Conflict(format!("slot {slot} is {what}; a new VD needs unconfigured good (UGood) drives")));
        }
    }
    Ok(())
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

/// Moves one foreign configuration's VDs into ours. Returns how many.
fn import_one(state: &mut State, foreign: &ForeignConfig) -> Result<usize, String> {
    let theirs = &foreign.superblock.config;
    // Their slot numbers -> ours, through the drive ids.
    let slot_of = |their_slot: u32| -> Option<u32> {
        let drive_id = theirs.drives.iter().find(|d| d.slot == their_slot)?.drive_id;
        state.slots.iter().find(|(_, s)| s.drive_id == drive_id).map(|(slot, _)| *slot)
    };
    let mut new_records = Vec::new();
    for record in &theirs.vds {
        if state.config.vds.iter().any(|v| v.name == record.name) {
            return Err(format!("its VD name {:?} is already used here; rename ours first", record.name));
        }
        let taken: Vec<u32> = state.config.vds.iter().map(|v| v.vd_id).chain(new_records.iter().map(|r: &VdRecord| r.vd_id)).collect();
        let vd_id = (0..).find(|id| !taken.contains(id)).expect("a free id");
        let member_slots: Vec<u32> = record.member_slots.iter().map(|s| slot_of(*s).unwrap_or(u32::MAX)).collect();
        new_records.push(VdRecord { vd_id, drive_group: vd_id, member_slots, ..record.clone() });
    }
    for slot in &foreign.slots {
        let present = state.slots.get_mut(slot).expect("foreign drives are present");
        present.foreign = false;
        let their_state =
            theirs.drives.iter().find(|d| d.drive_id == present.drive_id).map(|d| d.state).unwrap_or(DriveState::UnconfiguredGood);
        let record = DriveRecord {
            slot: *slot,
            drive_id: present.drive_id,
            state: their_state,
            capacity_bytes: present.drive.info().capacity_bytes,
        };
        state.config.drives.push(record);
    }
    let count = new_records.len();
    state.config.vds.extend(new_records);
    Ok(count)
}

/// Stands in for a member that is not present: every operation fails as a pulled drive does.
struct MissingDrive {
    info: DriveInfo,
}

impl MissingDrive {
    fn new(slot: u32, capacity_bytes: u64) -> MissingDrive {
        let info = DriveInfo { name: format!("missing slot {slot}"), kind: drive::DriveKind::Memory, capacity_bytes, direct_io: false };
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
