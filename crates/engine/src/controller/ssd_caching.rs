//! SSD caching in the configuration (CacheCade): cache VDs, which VDs they cache, and making
//! both real at start, after an import and on every change. The caching itself is
//! [`crate::ssd_cache`]'s.
//!
//! A cache VD is a VD of RAID 0, 1 or 10 (MegaRAID's CacheCade levels) flagged in its record;
//! it is not exported, and VDs name it in their record (`ssd_cache_vd_id`). The tier writes
//! through, so the configuration is all there is to keep: a cache VD that fails, goes missing or
//! is deleted loses nothing, and its VDs go on from their own members.

use super::*;
use crate::ssd_cache::{MapEntry, MapOwner, SsdCache, SsdCacheOptions, SsdCacheStats};

/// How long a clean stop waits for the SSD caches' fills to end before it saves their maps
/// (with clients gone, a fill is two I/Os).
const MAP_SAVE_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A cache VD, or a VD it caches, as `show` reports it.
#[derive(Clone, Debug)]
pub enum SsdCacheView {
    /// This VD is a cache VD: what it holds, for which VDs.
    CacheVd { cached_vds: Vec<u32>, stats: SsdCacheStats },
    /// This VD is cached by cache VD `cache_vd_id`; `lines_valid` of the cache's lines are its.
    Cached { cache_vd_id: u32, lines_valid: u64, line_bytes: u64 },
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
    /// Creates a cache VD over unconfigured good drives, then has it cache `assign_vds`
    /// (`/c0 add vd cachecade ... assignvds=0,1`).
    ///
    /// # Errors
    /// A level other than RAID 0, 1 or 10, or what [`Controller::create_vd`] refuses; nothing
    /// changes. A VD of `assign_vds` that cannot be cached leaves the cache VD created (the
    /// error says which and why).
    pub fn create_cache_vd(&self, spec: CreateVdSpec, assign_vds: &[u32]) -> Result<VdRecord, ControlError> {
        if !matches!(spec.level, Level::Raid0 | Level::Raid1 | Level::Raid10) {
            return Err(ControlError::BadInput(format!("a cache VD is RAID 0, 1 or 10 (CacheCade's levels), not {}", spec.level)));
        }
        let record = self.create_vd_of_kind(spec, true)?;
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
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.vds.iter().find(|v| v.vd_id == vd_id).cloned() else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        if record.cache_vd {
            return Err(ControlError::Conflict(format!("v{vd_id} is a cache VD; it cannot be cached")));
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
            None => self.engine.detach_ssd_cache(&vd),
        }
        state.config.vds.iter_mut().find(|v| v.vd_id == vd_id).expect("found above").ssd_cache_vd_id = wanted;
        let persisted = self.persist(&mut state);
        drop(state);
        let text = wanted.map_or("off".to_string(), |id| format!("on (cache VD v{id})"));
        self.log(Severity::Info, format!("v{vd_id}: SSD caching {text}"));
        persisted
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
        let lines_valid = cache.lines_valid_of(&state.vds[&vd_id]);
        Some(SsdCacheView::Cached { cache_vd_id, lines_valid, line_bytes: cache.stats().line_bytes })
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
                    let lines = cache.install_map(&vd, record.vd_id, entries);
                    self.log(
                        Severity::Info,
                        format!("v{}: SSD cache starts warm: {lines} line(s) on cache VD v{cache_vd_id}", record.vd_id),
                    );
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

    /// At start, before any client: each optimal cache VD's map from the last clean stop (if
    /// that stop wrote `found_generation`, the configuration assembled) is read, then every
    /// cache VD's map is invalidated, then the VDs are attached with their lines. A map that
    /// cannot be invalidated is not used. The maps' I/O runs outside the state lock: a cache
    /// VD member failing meanwhile must be recordable.
    pub(super) fn start_ssd_caches(&self, found_generation: u64) {
        let (owner, caches) = {
            let state = self.state.lock().expect("controller lock");
            let owner = MapOwner { controller_id: state.config.controller_id.0, generation: found_generation };
            let cache_vd_ids: Vec<u32> = state.config.vds.iter().filter(|v| v.cache_vd).map(|v| v.vd_id).collect();
            let caches: Vec<(u32, Arc<SsdCache>, bool)> = cache_vd_ids
                .into_iter()
                .filter_map(|id| {
                    let optimal = state.vds[&id].state() == crate::VdState::Optimal;
                    self.ssd_cache_for(&state, id).ok().map(|cache| (id, cache, optimal))
                })
                .collect();
            (owner, caches)
        };
        let mut loaded = BTreeMap::new();
        for (cache_vd_id, cache, optimal) in caches {
            let entries = if optimal { cache.load_map(owner) } else { Ok(Vec::new()) };
            match (entries, cache.invalidate_map()) {
                (Ok(entries), Ok(())) => drop(loaded.insert(cache_vd_id, entries)),
                (Err(error), _) | (_, Err(error)) => {
                    self.log(Severity::Warning, format!("cache VD v{cache_vd_id} starts cold: its map: {error}"));
                }
            }
        }
        let mut state = self.state.lock().expect("controller lock");
        if self.apply_ssd_caches(&mut state, &loaded) {
            let _ = self.persist(&mut state);
        }
    }

    /// At a clean stop (clients gone, the configuration written): each cache's map, naming the
    /// VDs it caches by number, for a warm start. Outside the state lock, as at start.
    pub(super) fn save_ssd_cache_maps(&self) {
        let (owner, caches, vd_ids) = {
            let state = self.state.lock().expect("controller lock");
            let owner = MapOwner { controller_id: state.config.controller_id.0, generation: state.config.generation };
            let caches: Vec<(u32, Arc<SsdCache>)> =
                self.ssd_caches.lock().expect("ssd caches lock").iter().map(|(id, cache)| (*id, Arc::clone(cache))).collect();
            // (instance, VD number, cache VD number) of every cached VD.
            let vd_ids: Vec<(u64, u32, u32)> = state
                .config
                .vds
                .iter()
                .filter_map(|v| v.ssd_cache_vd_id.map(|cache| (state.vds[&v.vd_id].instance_id(), v.vd_id, cache)))
                .collect();
            (owner, caches, vd_ids)
        };
        for (cache_vd_id, cache) in caches {
            let vd_id_of = |instance: u64| vd_ids.iter().find(|(i, _, c)| *i == instance && *c == cache_vd_id).map(|(_, id, _)| *id);
            match cache.save_map(owner, vd_id_of, MAP_SAVE_IDLE_TIMEOUT) {
                Ok(lines) => self.log(Severity::Info, format!("cache VD v{cache_vd_id}: map of {lines} line(s) saved for a warm start")),
                Err(error) => self.log(Severity::Warning, format!("cache VD v{cache_vd_id}: map not saved ({error}); it starts cold")),
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
            self.engine.detach_ssd_cache(&state.vds[&user]);
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
        let cache = self.engine.ssd_cache(&state.vds[&cache_vd_id], SsdCacheOptions::default()).map_err(ControlError::Conflict)?;
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
