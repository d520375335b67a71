//! The controller cache and its journal in a run: the VD's write policy, a journal on a
//! volatile drive that crashes like the members, a journal that fails at a seeded moment, and
//! the replay after a power cut.
//!
//! The simulator plays the controller's part as `controller/journal.rs` does: the journal id it
//! trusts stands for the metadata's `journal_id`; a failed journal is detached only after the
//! cache was written out and the members flushed (the engine holds writes meanwhile); a restart
//! replays the trusted journal through the VD's write path, flushes, and lays the journal out
//! anew.
//!
//! A mirrored journal may lose one leg at a seeded moment: the engine takes it out of service,
//! and the simulator, as the controller's watcher, names it stale in "the metadata" before
//! the engine acknowledges anything again. At a restart the failed leg may be back with what
//! it held (stale, never to be replayed) or missing, and a healthy pair may restart with
//! either leg alone: each leg in service holds every acknowledged write.
//!
//! What the oracle may rely on: a write acknowledged while a journal is attached, under WT or
//! WB, is in the journal (WT logs before it writes the members), so it survives a crash; under
//! AWB, or without a journal, only a completed FLUSH makes writes durable.

use crate::run::{Sim, SimDrive};
use engine::config::WritePolicy;
use engine::journal::Journal;
use engine::VdRequest;
use layout::MIB;
use rand::Rng;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Room for one partition's ring with its largest record twice over, and some more.
const JOURNAL_BYTES: u64 = 8 * MIB;

pub(crate) struct SimJournal {
    /// One drive, or the two legs of a mirrored pair.
    pub legs: Vec<SimDrive>,
    /// The journal id "the metadata" names (0: none is trusted).
    pub trusted_id: u64,
    /// The legs "the metadata" names stale (the watcher records them), and which leg failed.
    pub stale_legs: Rc<Cell<u8>>,
    pub failed_leg: Option<usize>,
    /// A leg failed in this run, and a restart since replayed records.
    pub leg_failed: bool,
    pub replayed_after_leg_failed: bool,
    /// A restart wrote row images back while a member was out of service: rows the crash tore
    /// whose missing member is reconstructed through the images' parity.
    pub images_replayed_degraded: bool,
    /// Whether the engine has it now.
    pub attached: bool,
    /// Records replayed over every restart.
    pub replayed_records: u64,
    pub detached: bool,
}

impl Sim {
    fn controller_id(&self) -> u128 {
        u128::from(self.config.seed) | 1 << 64
    }

    /// The clean cache's counters over all of the run's engines.
    pub(crate) fn clean_stats(&self) -> engine::cache::clean::CleanStats {
        // Bytes held are the current engine's; the counters are all of them.
        let now = self.engine.clean_stats();
        engine::cache::clean::CleanStats { bytes: now.bytes, ..now.plus(&self.clean_before) }
    }

    /// At the start of a run: the VD's policy, the cache's limits, and a blank journal.
    pub(crate) fn start_cache(&mut self) -> Result<(), String> {
        self.set_journal_bypass();
        self.vd.set_write_policy(self.config.write_policy);
        self.vd.set_read_policies(self.config.read_policy, self.config.io_policy);
        self.engine.set_cache_limits(self.config.cache_bytes, Duration::from_millis(self.config.destage_age_ms));
        if !self.config.journal {
            return Ok(());
        }
        let leg_count = if self.config.journal_mirrored { 2 } else { 1 };
        self.journal = Some(SimJournal {
            legs: (0..leg_count).map(|_| SimDrive::blank(JOURNAL_BYTES)).collect(),
            trusted_id: 0,
            stale_legs: Rc::new(Cell::new(0)),
            failed_leg: None,
            leg_failed: false,
            replayed_after_leg_failed: false,
            images_replayed_degraded: false,
            attached: false,
            replayed_records: 0,
            detached: false,
        });
        self.open_journal()
    }

    /// Opens (and replays) the journal, trusts it and hands it to the engine: at the start and
    /// after every restart.
    fn open_journal(&mut self) -> Result<(), String> {
        let Some(journal) = &self.journal else { return Ok(()) };
        if journal.detached {
            return Ok(());
        }
        let trusted = engine::journal::Trust { journal_id: journal.trusted_id, stale_legs: journal.stale_legs.get() };
        let legs = self.legs_to_offer();
        let controller_id = self.controller_id();
        let (engine, vd) = (&mut self.engine, Arc::clone(&self.vd));
        let mut apply = |record: &engine::journal::ReplayRecord| {
            let request = VdRequest::Write { offset_bytes: record.vd_offset_bytes, buf: drive::IoBuf::from_slice(&record.data) };
            engine.run(&vd, request).result.map_err(|error| {
                let states: Vec<_> = (0..vd.members().len()).map(|m| vd.member(m).state()).collect();
                format!("{error} (members {states:?})")
            })
        };
        // Row images first (the journal replays them before the records), as the controller does.
        let image_vd = Arc::clone(&vd);
        let mut apply_image = |image: &engine::journal::ReplayImage| engine::controller::write_row_image(&image_vd, image);
        vd.set_replaying(true);
        let opened = Journal::open_with_images(legs, controller_id, 1, trusted, &mut apply, &mut apply_image)
            .map_err(|e| format!("journal replay: {e}"));
        vd.set_replaying(false);
        let opened = opened?;
        // Every image was written back: the regions logged writes left dirty are whole.
        if let Some(intent) = vd.write_intent() {
            intent.images_replayed();
        }
        let done = self.engine.run(&self.vd, VdRequest::Flush);
        done.result.map_err(|error| format!("flush after the journal's replay: {error}"))?;
        opened.finish_replay().map_err(|e| format!("journal layout after replay: {e}"))?;
        if trusted.journal_id != 0 && !opened.replay_report().found {
            return Err(format!("the trusted journal {trusted:?} was offered but not found"));
        }
        let trust = opened.trust();
        opened.health().legs_recorded_stale(trust.stale_legs);
        self.engine.set_journal(Some(&opened));
        let journal = self.journal.as_mut().expect("checked above");
        journal.replayed_records += opened.replay_report().records;
        // Records or row images: either comes from the legs the replay chose (WB writes'
        // whole rows leave images, not records).
        let replayed_anything = opened.replay_report().records + opened.replay_report().images > 0;
        journal.replayed_after_leg_failed |= journal.leg_failed && replayed_anything;
        let degraded = self.vd.members().iter().any(|m| m.state() != engine::vd::MemberState::Online);
        journal.images_replayed_degraded |= degraded && opened.replay_report().images > 0;
        journal.trusted_id = trust.journal_id;
        journal.stale_legs.set(trust.stale_legs);
        journal.attached = true;
        let (health, recorded) = (Arc::clone(opened.health()), Rc::clone(&journal.stale_legs));
        self.engine.set_watcher(Some(Box::new(move || watch_legs(&health, &recorded))));
        Ok(())
    }

    /// The legs offered at a (re)start. After a leg failed: the survivor alone, or both with
    /// the failed one back holding what it held (stale). A healthy pair: both, or either alone
    /// (each holds every acknowledged write).
    fn legs_to_offer(&mut self) -> Vec<Arc<dyn drive::Drive>> {
        let journal = self.journal.as_ref().expect("a journal");
        let as_drive = |leg: &SimDrive| Arc::clone(&leg.faulty) as Arc<dyn drive::Drive>;
        let offered: Vec<usize> = match (journal.legs.len(), journal.failed_leg) {
            (1, _) => vec![0],
            (_, Some(failed)) if self.rng.gen_bool(0.5) => vec![1 - failed],
            // Not yet named stale: nothing was acknowledged without it, so it may come back
            // alone.
            (_, Some(failed)) if journal.stale_legs.get() & (1 << failed) == 0 && self.rng.gen_bool(0.5) => {
                journal.legs[failed].faulty.set_failed(false);
                vec![failed]
            }
            (_, Some(failed)) => {
                journal.legs[failed].faulty.set_failed(false);
                vec![0, 1]
            }
            (_, None) => [vec![0, 1], vec![0], vec![1]][self.rng.gen_range(0..3)].clone(),
        };
        let journal = self.journal.as_mut().expect("a journal");
        if offered.len() == 1 && journal.legs.len() == 2 {
            // The one left out is gone for good: the pair is the one offered from now on.
            journal.legs = vec![journal.legs.swap_remove(offered[0])];
            journal.failed_leg = None;
        } else if journal.failed_leg.is_some() {
            // Back, and laid out anew with the other at this start.
            journal.failed_leg = None;
        }
        journal.legs.iter().map(as_drive).collect()
    }

    /// At the seeded operation the journal fails; the controller's part: write the cache out
    /// (the engine holds new writes meanwhile), stop trusting the journal, take it away.
    pub(crate) fn journal_some(&mut self, operation: usize) -> Result<(), String> {
        if self.config.journal_fail_at_operation != Some(operation) {
            return Ok(());
        }
        let Some(journal) = &self.journal else { return Ok(()) };
        journal.legs.iter().for_each(|leg| leg.faulty.set_failed(true));
        self.faults.push("journal failed".into());
        let outcome = Rc::new(RefCell::new(None));
        let filed = Rc::clone(&outcome);
        self.engine.quiesce(move |result| *filed.borrow_mut() = Some(result));
        // The journal's failure shows at its next write; quiesce waits for the destaging.
        let mut steps = 0;
        while outcome.borrow().is_none() {
            self.step()?;
            steps += 1;
            if steps > 1_000_000 {
                return Err("the cache never emptied after the journal failed".into());
            }
        }
        let quiesced = outcome.borrow_mut().take().expect("arrived");
        quiesced.map_err(|error| format!("writing the cache out after the journal failed: {error}"))?;
        let journal = self.journal.as_mut().expect("checked above");
        journal.trusted_id = 0;
        journal.attached = false;
        journal.detached = true;
        self.engine.set_watcher(None);
        self.engine.set_journal(None);
        Ok(())
    }

    /// At the seeded operation one leg of a mirrored journal fails.
    pub(crate) fn journal_leg_some(&mut self, operation: usize) {
        if self.config.journal_leg_fail_at_operation != Some(operation) {
            return;
        }
        let Some(journal) = &mut self.journal else { return };
        if journal.legs.len() < 2 || !journal.attached {
            return;
        }
        let leg = self.rng.gen_range(0..2);
        journal.legs[leg].faulty.set_failed(true);
        journal.failed_leg = Some(leg);
        journal.leg_failed = true;
        self.faults.push(format!("journal leg {leg} failed"));
    }

    /// Streams of a row go around the journal in runs that want it; none do otherwise (the
    /// VDs here are too small for the default cutoff to matter, but a seed must not depend on it).
    fn set_journal_bypass(&self) {
        let cutoff_bytes = if self.config.journal_bypass { self.vd.geometry().row_data_bytes() } else { 0 };
        self.vd.journal_bypass().set_cutoff_bytes(cutoff_bytes);
    }

    /// Whether a write acknowledged now is durable (see the module's comment).
    pub(crate) fn acknowledged_is_durable(&self) -> bool {
        self.config.write_policy != WritePolicy::AlwaysWriteBack && self.journal.as_ref().is_some_and(|j| j.attached)
    }

    /// After a restart: the new engine gets the cache's limits and the VD its policy, then the
    /// trusted journal is replayed.
    pub(crate) fn restart_cache(&mut self) -> Result<(), String> {
        self.set_journal_bypass();
        self.vd.set_write_policy(self.config.write_policy);
        self.vd.set_read_policies(self.config.read_policy, self.config.io_policy);
        self.engine.set_cache_limits(self.config.cache_bytes, Duration::from_millis(self.config.destage_age_ms));
        if let Some(journal) = &mut self.journal {
            journal.attached = false;
        }
        self.open_journal()
    }
}

/// The controller's watcher, run before every turn of the engine: a leg out of service is
/// named stale in "the metadata" (`recorded`), then the engine may acknowledge again (the
/// returned true gives it a tick).
fn watch_legs(health: &engine::journal::Health, recorded: &Cell<u8>) -> bool {
    if !health.legs_pending() {
        return false;
    }
    let mask = health.stale_mask();
    recorded.set(mask);
    health.legs_recorded_stale(mask);
    true
}
