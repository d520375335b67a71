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
//! What the oracle may rely on: a write acknowledged while a journal is attached, under WT or
//! WB, is in the journal (WT logs before it writes the members), so it survives a crash; under
//! AWB, or without a journal, only a completed FLUSH makes writes durable.

use crate::run::{Sim, SimDrive};
use engine::config::WritePolicy;
use engine::journal::Journal;
use engine::VdRequest;
use layout::MIB;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Room for one partition's ring with its largest record twice over, and some more.
const JOURNAL_BYTES: u64 = 4 * MIB;

pub(crate) struct SimJournal {
    pub drive: SimDrive,
    /// The journal id "the metadata" names (0: none is trusted).
    pub trusted_id: u64,
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
        self.vd.set_write_policy(self.config.write_policy);
        self.vd.set_read_policies(self.config.read_policy, self.config.io_policy);
        self.engine.set_cache_limits(self.config.cache_bytes, Duration::from_millis(self.config.destage_age_ms));
        if !self.config.journal {
            return Ok(());
        }
        self.journal = Some(SimJournal {
            drive: SimDrive::blank(JOURNAL_BYTES),
            trusted_id: 0,
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
        let drive = Arc::clone(&journal.drive.faulty) as Arc<dyn drive::Drive>;
        let trusted = journal.trusted_id;
        let controller_id = self.controller_id();
        let (engine, vd) = (&mut self.engine, Arc::clone(&self.vd));
        let mut apply = |record: &engine::journal::ReplayRecord| {
            let request = VdRequest::Write { offset_bytes: record.vd_offset_bytes, buf: drive::IoBuf::from_slice(&record.data) };
            engine.run(&vd, request).result.map_err(|error| {
                let states: Vec<_> = (0..vd.members().len()).map(|m| vd.member(m).state()).collect();
                format!("{error} (members {states:?})")
            })
        };
        vd.set_replaying(true);
        let opened = Journal::open(drive, controller_id, 1, trusted, &mut apply).map_err(|e| format!("journal replay: {e}"));
        vd.set_replaying(false);
        let opened = opened?;
        let done = self.engine.run(&self.vd, VdRequest::Flush);
        done.result.map_err(|error| format!("flush after the journal's replay: {error}"))?;
        opened.finish_replay().map_err(|e| format!("journal layout after replay: {e}"))?;
        self.engine.set_journal(Some(&opened));
        let journal = self.journal.as_mut().expect("checked above");
        journal.replayed_records += opened.replay_report().records;
        journal.trusted_id = opened.journal_id();
        journal.attached = true;
        Ok(())
    }

    /// At the seeded operation the journal fails; the controller's part: write the cache out
    /// (the engine holds new writes meanwhile), stop trusting the journal, take it away.
    pub(crate) fn journal_some(&mut self, operation: usize) -> Result<(), String> {
        if self.config.journal_fail_at_operation != Some(operation) {
            return Ok(());
        }
        let Some(journal) = &self.journal else { return Ok(()) };
        journal.drive.faulty.set_failed(true);
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
        self.engine.set_journal(None);
        Ok(())
    }

    /// Whether a write acknowledged now is durable (see the module's comment).
    pub(crate) fn acknowledged_is_durable(&self) -> bool {
        self.config.write_policy != WritePolicy::AlwaysWriteBack && self.journal.as_ref().is_some_and(|j| j.attached)
    }

    /// After a restart: the new engine gets the cache's limits and the VD its policy, then the
    /// trusted journal is replayed.
    pub(crate) fn restart_cache(&mut self) -> Result<(), String> {
        self.vd.set_write_policy(self.config.write_policy);
        self.vd.set_read_policies(self.config.read_policy, self.config.io_policy);
        self.engine.set_cache_limits(self.config.cache_bytes, Duration::from_millis(self.config.destage_age_ms));
        if let Some(journal) = &mut self.journal {
            journal.attached = false;
        }
        self.open_journal()
    }
}
