//! SSD caching in the configuration (CacheCade): cache VDs, which VDs they cache, and making
//! both real at start, after an import and on every change. The caching itself is
//! [`crate::ssd_cache`]'s.
//!
//! A cache VD is a VD of RAID 0, 1 or 10 (MegaRAID's CacheCade levels) flagged in its record,
//! write-through or write-back; it is not exported, and VDs name it in their record
//! (`ssd_cache_vd_id`). A write-through cache VD that fails, goes missing or is deleted loses
//! nothing, and its VDs go on from their own members. A write-back one holds data its VDs do
//! not have: turning caching off or deleting it destages first, and if it fails beyond what
//! its level tolerates, each VD it held dirty lines of goes offline with an event (a VD with
//! none goes on uncached) until the cache VD is deleted, which discards those lines. At start
//! its dirty lines are read back whatever the stop was.

use super::*;
use crate::ssd_cache::{MapEntry, MapOwner, SsdCache, SsdCacheOptions, SsdCacheStats, DETACH_FLUSH_TIMEOUT};

/// How long a clean stop waits for the SSD caches' fills to end before it saves their maps
/// (with clients gone, a fill is two I/Os).
const MAP_SAVE_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A cache VD, or a VD it caches, as `show` reports it.
#[derive(Clone, Debug)]
pub enum SsdCacheView {
    /// This VD is a cache VD: what it holds, for which VDs.
    CacheVd { cached_vds: Vec<u32>, stats: SsdCacheStats },
    /// This VD is cached by cache VD `cache_vd_id`; `lines_valid` of the cache's lines are its,
    /// `lines_dirty` of them newer there than on its members; `lost`: the cache VD failed
    /// holding those (the VD is offline).
    Cached { cache_vd_id: u32, lines_valid: u64, lines_dirty: u64, line_bytes: u64, write_back: bool, lost: bool },
}

/// What `set ssdcaching=` asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SsdCaching {
    Off,
    /// By the one cache VD there is.
    On,
    /// By this cache VD.
    By(u32),
}

impl Controller {
    /// Creates a cache VD over unconfigured good drives, write-through or `write_back`, then has
    /// it cache `assign_vds` (`/c0 add vd cachecade ... wt|wb assignvds=0,1`). A write-back
    /// RAID0 cache VD is allowed with a warning event (as on MegaRAID): one lost SSD loses the
    /// dirty data of every VD it caches.
    ///
    /// # Errors
    /// A level other than RAID 0, 1 or 10, or what [`Controller::create_vd`] refuses; nothing
    /// changes. A VD of `assign_vds` that cannot be cached leaves the cache VD created (the
    /// error says which and why).
    pub fn create_cache_vd(&self, spec: CreateVdSpec, write_back: bool, assign_vds: &[u32]) -> Result<VdRecord, ControlError> {
        if !matches!(spec.level, Level::Raid0 | Level::Raid1 | Level::Raid10) {
            return Err(ControlError::BadInput(format!("a cache VD is RAID 0, 1 or 10 (CacheCade's levels), not {}", spec.level)));
        }
        let level = spec.level;
        let record = self.create_vd_of_kind(spec, Some(write_back))?;
        self.put_new_cache_in_service(record.vd_id);
        if write_back && level == Level::Raid0 {
            self.log(
                Severity::Warning,
                format!(
                    "cache VD v{} is RAID0 write-back: losing any one of its drives loses the data not yet destaged of every VD it caches (they go offline); RAID1 or RAID10 survives one",
                    record.vd_id
                ),
            );
        }
        for &vd_id in assign_vds {
            self.set_ssd_caching(vd_id, SsdCaching::By(record.vd_id)).map_err(|error| {
                ControlError::Conflict(format!("created cache VD v{}, but v{vd_id} is not cached: {error}", record.vd_id))
            })?;
        }
        Ok(record)
    }

    /// Turns SSD caching of a VD on (by the only cache VD, or a named one) or off.
    ///
    /// # Errors
    /// No such VD or cache VD, a cache VD asked to be cached, more than one cache VD for `on`,
    /// or a VD cached by another cache VD already; nothing changes.
    pub fn set_ssd_caching(&self, vd_id: u32, caching: SsdCaching) -> Result<(), ControlError> {
        if caching == SsdCaching::Off {
            self.drain_before_detach(vd_id)?;
        }
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.vds.iter().find(|v| v.vd_id == vd_id).cloned() else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        if record.cache_vd {
            return Err(ControlError::Conflict(format!("v{vd_id} is a cache VD; it cannot be cached")));
        }
        if caching != SsdCaching::Off && self.migrations.lock().expect("migrations lock").contains_key(&vd_id) {
            // Its dirty lines would not be on the members the migration copies.
            return Err(ControlError::Conflict(format!("v{vd_id} is being migrated; turn SSD caching on once the migration ends")));
        }
        let wanted = match caching {
            SsdCaching::Off => None,
            SsdCaching::On => Some(only_cache_vd(&state)?),
            SsdCaching::By(cache_vd_id) => {
                if !state.config.vds.iter().any(|v| v.vd_id == cache_vd_id && v.cache_vd) {
                    return Err(ControlError::NotFound(format!("v{cache_vd_id} is not a cache VD; {}", cache_vd_list(&state))));
                }
                Some(cache_vd_id)
            }
        };
        match (record.ssd_cache_vd_id, wanted) {
            (current, wanted) if current == wanted => return Ok(()),
            (Some(current), Some(_)) => {
                return Err(ControlError::Conflict(format!("v{vd_id} is cached by v{current}; set ssdcaching=off first")));
            }
            _ => {}
        }
        let vd = Arc::clone(&state.vds[&vd_id]);
        match wanted {
            Some(cache_vd_id) => {
                let cache = self.ssd_cache_for(&state, cache_vd_id)?;
                self.engine.attach_ssd_cache(&vd, &cache).map_err(ControlError::Conflict)?;
            }
            // Drained above (a write-back cache): nothing dirty is left to discard.
            None => self.engine.discard_ssd_cache(&vd),
        }
        state.config.vds.iter_mut().find(|v| v.vd_id == vd_id).expect("found above").ssd_cache_vd_id = wanted;
        let persisted = self.persist(&mut state);
        drop(state);
        let text = wanted.map_or("off".to_string(), |id| format!("on (cache VD v{id})"));
        self.log(Severity::Info, format!("v{vd_id}: SSD caching {text}"));
        persisted
    }

    /// A cache VD just created: its table is written (`running`, empty) before it caches
    /// anything; a write-back cache writes through until it is.
    fn put_new_cache_in_service(&self, cache_vd_id: u32) {
        let (cache, owner) = {
            let state = self.state.lock().expect("controller lock");
            let owner = MapOwner { controller_id: state.config.controller_id.0, generation: state.config.generation };
            (self.ssd_cache_for(&state, cache_vd_id), owner)
        };
        let started = cache.map_err(|e| e.to_string()).and_then(|cache| cache.begin_service(owner));
        if let Err(error) = started {
            self.log(
                Severity::Warning,
                format!("cache VD v{cache_vd_id}: its line table cannot be written ({error}); it writes through until the next start"),
            );
        }
    }

    /// Destages a VD's dirty lines before its write-back cache is turned off, outside the
    /// controller's lock (a member failure meanwhile must be recordable); its writes go
    /// through to it from then on.
    fn drain_before_detach(&self, vd_id: u32) -> Result<(), ControlError> {
        let (vd, _) = self.vd(vd_id).map(|(record, vd)| (vd, record))?;
        let Some(cache) = vd.ssd_cache().get().filter(|c| c.is_write_back()) else { return Ok(()) };
        if vd.ssd_cache().is_lost() {
            let cache_vd = cache.cache_vd().id();
            return Err(ControlError::Conflict(format!(
                "v{vd_id} is offline: its write-back cache VD v{cache_vd} failed holding data of it; delete v{cache_vd} to discard that data"
            )));
        }
        cache.flush_vd(&vd, DETACH_FLUSH_TIMEOUT).map_err(|error| {
            cache.end_drain(&vd);
            ControlError::Conflict(format!("v{vd_id}: SSD caching stays on: {error}"))
        })
    }

    /// Before a write-back cache VD is deleted: the VDs it caches are drained (outside the
    /// lock, see above), unless it failed, when their dirty lines are lost anyway.
    pub(super) fn drain_cache_vd_users(&self, cache_vd_id: u32) -> Result<(), ControlError> {
        let users: Vec<u32> = {
            let state = self.state.lock().expect("controller lock");
            let write_back = state.config.vds.iter().any(|v| v.vd_id == cache_vd_id && v.cache_vd && v.cache_write_back);
            let failed = state.vds.get(&cache_vd_id).is_none_or(|vd| vd.state() == crate::VdState::Offline);
            if !write_back || failed {
                return Ok(());
            }
            state.config.vds.iter().filter(|v| v.ssd_cache_vd_id == Some(cache_vd_id)).map(|v| v.vd_id).collect()
        };
        for user in users {
            self.drain_before_detach(user)?;
        }
        Ok(())
    }

    /// Before a VD cached write-back is deleted: its dirty lines are destaged (unless its cache
    /// VD failed: they are lost with it).
    pub(super) fn drain_for_delete(&self, vd_id: u32) -> Result<(), ControlError> {
        let Ok((_, vd)) = self.vd(vd_id) else { return Ok(()) };
        match vd.ssd_cache().is_lost() {
            true => Ok(()),
            false => self.drain_before_detach(vd_id),
        }
    }

    /// Undoes [`Controller::drain_cache_vd_users`] and [`Controller::drain_for_delete`] when
    /// the delete did not happen.
    pub(super) fn end_cache_vd_drains(&self, cache_vd_id: u32) {
        let state = self.state.lock().expect("controller lock");
        for user in state.config.vds.iter().filter(|v| v.ssd_cache_vd_id == Some(cache_vd_id) || v.vd_id == cache_vd_id) {
            if let Some(cache) = state.vds[&user.vd_id].ssd_cache().get() {
                cache.end_drain(&state.vds[&user.vd_id]);
            }
        }
    }

    /// The SSD cache side of a VD, if it has one.
    pub fn ssd_cache_view(&self, vd_id: u32) -> Option<SsdCacheView> {
        let state = self.state.lock().expect("controller lock");
        let record = state.config.vds.iter().find(|v| v.vd_id == vd_id)?;
        let caches = self.ssd_caches.lock().expect("ssd caches lock");
        if record.cache_vd {
            let cached_vds = state.config.vds.iter().filter(|v| v.ssd_cache_vd_id == Some(vd_id)).map(|v| v.vd_id).collect();
            return caches.get(&vd_id).map(|cache| SsdCacheView::CacheVd { cached_vds, stats: cache.stats() });
        }
        let cache_vd_id = record.ssd_cache_vd_id?;
        let cache = caches.get(&cache_vd_id)?;
        let vd = &state.vds[&vd_id];
        Some(SsdCacheView::Cached {
            cache_vd_id,
            lines_valid: cache.lines_valid_of(vd),
            lines_dirty: cache.lines_dirty_of(vd),
            line_bytes: cache.stats().line_bytes,
            write_back: cache.is_write_back(),
            lost: vd.ssd_cache().is_lost(),
        })
    }

    /// Makes the configuration's SSD caching real: a cache for every cache VD, every VD that
    /// names one attached to it, with the lines of `loaded` (maps read at start) for its cache
    /// VD. A VD that names no cache VD (an imported configuration whose numbers changed) is
    /// left uncached with an event. Returns whether a record changed (the caller persists).
    pub(super) fn apply_ssd_caches(&self, state: &mut State, loaded: &BTreeMap<u32, Vec<MapEntry>>) -> bool {
        let mut changed = false;
        for record in state.config.vds.iter().filter(|v| v.cache_vd) {
            if let Err(error) = self.ssd_cache_for(state, record.vd_id) {
                self.log(Severity::Warning, format!("cache VD v{} caches nothing: {error}", record.vd_id));
            }
        }
        for record in state.config.vds.clone() {
            let Some(cache_vd_id) = record.ssd_cache_vd_id else { continue };
            let vd = Arc::clone(&state.vds[&record.vd_id]);
            if vd.ssd_cache().get().is_some() {
                continue;
            }
            let cache = self.ssd_cache_for(state, cache_vd_id);
            let attached = cache.and_then(|c| self.engine.attach_ssd_cache(&vd, &c).map_err(ControlError::Conflict).map(|()| c));
            match attached {
                Ok(cache) => {
                    let Some(entries) = loaded.get(&cache_vd_id) else { continue };
                    let (lines, dirty) = cache.install_map(&vd, entries);
                    if lines > 0 {
                        self.log(
                            Severity::Info,
                            format!("v{}: SSD cache starts with {lines} line(s) ({dirty} dirty) on cache VD v{cache_vd_id}", record.vd_id),
                        );
                    }
                }
                Err(error) => {
                    self.log(Severity::Warning, format!("v{}: SSD caching off: {error}", record.vd_id));
                    state.config.vds.iter_mut().find(|v| v.vd_id == record.vd_id).expect("from the list").ssd_cache_vd_id = None;
                    changed = true;
                }
            }
        }
        changed
    }

    /// At start, before any client: each cache VD's table is read back (every dirty line; the
    /// clean ones too if the last clean stop wrote `found_generation`, the configuration
    /// assembled), the VDs are attached with their lines, then each table is put in service.
    /// A write-back cache VD that is offline or whose table cannot be read or written takes its
    /// VDs offline (their newest data may be on it). The I/O runs outside the state lock: a
    /// cache VD member failing meanwhile must be recordable.
    pub(super) fn start_ssd_caches(&self, found_generation: u64) {
        let (owner, caches) = {
            let state = self.state.lock().expect("controller lock");
            let owner = MapOwner { controller_id: state.config.controller_id.0, generation: found_generation };
            let cache_vd_ids: Vec<u32> = state.config.vds.iter().filter(|v| v.cache_vd).map(|v| v.vd_id).collect();
            let caches: Vec<(u32, Arc<SsdCache>, bool)> = cache_vd_ids
                .into_iter()
                .filter_map(|id| {
                    let online = state.vds[&id].state() != crate::VdState::Offline;
                    self.ssd_cache_for(&state, id).ok().map(|cache| (id, cache, online))
                })
                .collect();
            (owner, caches)
        };
        let mut loaded = BTreeMap::new();
        let mut unusable = Vec::new();
        for (cache_vd_id, cache, online) in &caches {
            let entries = if *online { cache.load_map(owner) } else { Err("it is offline".to_string()) };
            match entries {
                Ok(entries) => drop(loaded.insert(*cache_vd_id, entries)),
                Err(error) => {
                    self.log(Severity::Warning, format!("cache VD v{cache_vd_id}: its line table cannot be read: {error}"));
                    unusable.push(*cache_vd_id);
                }
            }
        }
        {
            let mut state = self.state.lock().expect("controller lock");
            if self.apply_ssd_caches(&mut state, &loaded) {
                let _ = self.persist(&mut state);
            }
        }
        for (cache_vd_id, cache, _) in &caches {
            if unusable.contains(cache_vd_id) {
                continue;
            }
            if let Err(error) = cache.begin_service(owner) {
                self.log(Severity::Warning, format!("cache VD v{cache_vd_id}: its line table cannot be written: {error}"));
                unusable.push(*cache_vd_id);
            }
        }
        for cache_vd_id in unusable {
            self.cache_vd_failed(cache_vd_id, true);
        }
    }

    /// A cache VD failed (or cannot keep its table): a write-back one takes offline each VD it
    /// may hold data of (all of them at start, when which is unknown; those with dirty lines
    /// later), and the others go on uncached; a write-through one loses nothing and its VDs go
    /// on uncached.
    pub(super) fn cache_vd_failed(&self, cache_vd_id: u32, at_start: bool) {
        let users: Vec<(u32, Arc<VirtualDrive>)> = {
            let state = self.state.lock().expect("controller lock");
            state
                .config
                .vds
                .iter()
                .filter(|v| v.ssd_cache_vd_id == Some(cache_vd_id))
                .map(|v| (v.vd_id, Arc::clone(&state.vds[&v.vd_id])))
                .collect()
        };
        for (vd_id, vd) in users {
            let Some(cache) = vd.ssd_cache().get() else { continue };
            let dirty = cache.lines_dirty_of(&vd);
            if cache.is_write_back() && (at_start || dirty > 0) {
                vd.ssd_cache().mark_lost();
                let what = if at_start { "may hold".to_string() } else { format!("holds {dirty} dirty line(s) of") };
                self.log(
                    Severity::Critical,
                    format!("v{vd_id} is offline: its write-back cache VD v{cache_vd_id} failed and {what} its newest data; delete v{cache_vd_id} to discard that data and bring v{vd_id} back"),
                );
            } else if !vd.ssd_cache().is_lost() {
                self.engine.discard_ssd_cache(&vd);
                self.log(Severity::Warning, format!("v{vd_id}: SSD caching suspended: its cache VD v{cache_vd_id} failed (nothing lost)"));
            }
        }
    }

    /// At a clean stop (clients gone, the configuration written): each cache's whole table,
    /// for a warm start. Outside the state lock, as at start.
    pub(super) fn save_ssd_cache_maps(&self) {
        let owner = {
            let state = self.state.lock().expect("controller lock");
            MapOwner { controller_id: state.config.controller_id.0, generation: state.config.generation }
        };
        let caches: Vec<(u32, Arc<SsdCache>)> =
            self.ssd_caches.lock().expect("ssd caches lock").iter().map(|(id, cache)| (*id, Arc::clone(cache))).collect();
        for (cache_vd_id, cache) in caches {
            if cache.cache_vd().state() == crate::VdState::Offline {
                continue;
            }
            match cache.save_map(owner, MAP_SAVE_IDLE_TIMEOUT) {
                Ok(lines) => self.log(Severity::Info, format!("cache VD v{cache_vd_id}: table of {lines} line(s) saved for a warm start")),
                Err(error) => self.log(Severity::Warning, format!("cache VD v{cache_vd_id}: table not saved ({error}); it starts cold")),
            }
        }
    }

    /// Takes a VD out of SSD caching before it is deleted: a cached VD is detached; a cache VD
    /// first has every VD it caches detached (they go on uncached).
    pub(super) fn unlink_ssd_caching(&self, state: &mut State, vd_id: u32) {
        let cache_vd = state.config.vds.iter().any(|v| v.vd_id == vd_id && v.cache_vd);
        let users: Vec<u32> = match cache_vd {
            true => state.config.vds.iter().filter(|v| v.ssd_cache_vd_id == Some(vd_id)).map(|v| v.vd_id).collect(),
            false => state.config.vds.iter().filter(|v| v.vd_id == vd_id && v.ssd_cache_vd_id.is_some()).map(|v| v.vd_id).collect(),
        };
        for user in users {
            // Drained first if its cache writes back and lives (`drain_cache_vd_users`); a VD
            // being deleted needs nothing of its own.
            let lost = state.vds[&user].ssd_cache().is_lost();
            self.engine.discard_ssd_cache(&state.vds[&user]);
            if lost && user != vd_id {
                self.log(
                    Severity::Critical,
                    format!("v{user} is back online without the data its failed write-back cache VD v{vd_id} held: it has what its members hold"),
                );
            }
            state.config.vds.iter_mut().find(|v| v.vd_id == user).expect("listed").ssd_cache_vd_id = None;
            if user != vd_id {
                self.log(Severity::Warning, format!("v{user}: SSD caching off: its cache VD v{vd_id} is being deleted"));
            }
        }
        if cache_vd {
            self.ssd_caches.lock().expect("ssd caches lock").remove(&vd_id);
        }
    }

    /// The cache of cache VD `cache_vd_id`, made on first use.
    fn ssd_cache_for(&self, state: &State, cache_vd_id: u32) -> Result<Arc<SsdCache>, ControlError> {
        if !state.config.vds.iter().any(|v| v.vd_id == cache_vd_id && v.cache_vd) {
            return Err(ControlError::NotFound(format!("v{cache_vd_id} is not a cache VD; {}", cache_vd_list(state))));
        }
        let mut caches = self.ssd_caches.lock().expect("ssd caches lock");
        if let Some(cache) = caches.get(&cache_vd_id) {
            return Ok(Arc::clone(cache));
        }
        let write_back = state.config.vds.iter().any(|v| v.vd_id == cache_vd_id && v.cache_write_back);
        let options = SsdCacheOptions { write_back, ..SsdCacheOptions::default() };
        let cache = self.engine.ssd_cache(&state.vds[&cache_vd_id], options).map_err(ControlError::Conflict)?;
        caches.insert(cache_vd_id, Arc::clone(&cache));
        Ok(cache)
    }
}

fn only_cache_vd(state: &State) -> Result<u32, ControlError> {
    let ids: Vec<u32> = state.config.vds.iter().filter(|v| v.cache_vd).map(|v| v.vd_id).collect();
    match ids[..] {
        [id] => Ok(id),
        [] => Err(ControlError::Conflict("there is no cache VD; create one with `/c0 add vd cachecade r0|r1|r10 drives=...`".into())),
        _ => Err(ControlError::Conflict(format!("{}: name one with ssdcaching=vN", cache_vd_list(state)))),
    }
}

fn cache_vd_list(state: &State) -> String {
    let ids: Vec<String> = state.config.vds.iter().filter(|v| v.cache_vd).map(|v| format!("v{}", v.vd_id)).collect();
    match ids.is_empty() {
        true => "there is no cache VD".into(),
        false => format!("cache VDs: {}", ids.join(", ")),
    }
}
