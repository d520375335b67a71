//! The background processes' row jobs (rebuild, consistency check, copyback, migration, the
//! bitmap's clean pass): each goes to the shard that owns its rows, under their locks, counted
//! in the VD's requests in flight like a client request.

use crate::join::{validate_row, validate_run, RunJoin};
use crate::{CheckDone, CheckMode, CheckRunDone, CleanDone, Engine, MemberSet, RebuildDone, RebuildRunDone, ShardMsg, VirtualDrive};
use std::sync::{Arc, Mutex};

/// A whole-row job of a background process, run on the shard that owns the row (or the run).
pub(crate) enum RowJob {
    /// Rows `row..row + row_count`, all owned by the shard.
    Rebuild {
        row_count: u64,
        targets: MemberSet,
        done: RebuildRunDone,
    },
    /// Rows `row..row + row_count`, all owned by the shard.
    Check {
        row_count: u64,
        mode: CheckMode,
        done: CheckRunDone,
    },
    Copy {
        member: usize,
        done: RebuildDone,
    },
    /// Rows `row..row + row_count`, all owned by the shard.
    Migrate {
        row_count: u64,
        done: RebuildRunDone,
    },
}

impl Engine {
    /// Rebuilds the strips that the `targets` members hold in row `row`, on the shard that owns
    /// the row, under its lock. `done` runs on a shard thread (at once for a bad row or member
    /// number). See [`Engine::rebuild_rows`].
    pub fn rebuild_row(&self, vd: &Arc<VirtualDrive>, row: u64, targets: MemberSet, done: RebuildDone) {
        self.rebuild_rows(vd, row, 1, targets, Box::new(move |mut results| done(results.pop().expect("one row, one result"))));
    }

    /// Rebuilds the strips that the `targets` members hold in the `row_count` rows from
    /// `first_row`, under their locks: what a rebuild process does. Each shard gets its part of
    /// the run ([`run_rows_for`] rows at most) and reads and writes each member's part of it in
    /// as few I/Os as the layout allows. `done` gets one result per row, in order, on a shard
    /// thread (at once for a bad row or member number).
    pub fn rebuild_rows(&self, vd: &Arc<VirtualDrive>, first_row: u64, row_count: u64, targets: MemberSet, done: RebuildRunDone) {
        if row_count == 0 {
            return done(Vec::new());
        }
        if let Err(error) = validate_run(vd, first_row, row_count, targets) {
            return done(vec![Err(error); row_count as usize]);
        }
        for (part_first, part_count, done) in RunJoin::split(vd.geometry(), first_row, row_count, done) {
            self.send_row(vd, part_first, RowJob::Rebuild { row_count: part_count, targets, done });
        }
    }

    /// Checks row `row` (and repairs it if `mode` says so) on the shard that owns it, under its
    /// lock. See [`Engine::check_rows`].
    pub fn check_row(&self, vd: &Arc<VirtualDrive>, row: u64, mode: CheckMode, done: CheckDone) {
        self.check_rows(vd, row, 1, mode, Box::new(move |mut results| done(results.pop().expect("one row, one result"))));
    }

    /// Checks the `row_count` rows from `first_row` (and repairs them if `mode` says so), under
    /// their locks: what a consistency check does. Each shard gets its part of the run and reads
    /// each member's part of it in as few I/Os as the layout allows. `done` gets one result per
    /// row, in order, on a shard thread (at once for a bad row number).
    pub fn check_rows(&self, vd: &Arc<VirtualDrive>, first_row: u64, row_count: u64, mode: CheckMode, done: CheckRunDone) {
        if row_count == 0 {
            return done(Vec::new());
        }
        if let Err(error) = validate_run(vd, first_row, row_count, MemberSet::default()) {
            return done(vec![Err(error); row_count as usize]);
        }
        for (part_first, part_count, done) in RunJoin::split(vd.geometry(), first_row, row_count, done) {
            self.send_row(vd, part_first, RowJob::Check { row_count: part_count, mode, done });
        }
    }

    /// Copies member `member`'s strips of row `row` to its copy target (see
    /// [`VirtualDrive::start_copy`]) on the shard that owns the row, under its lock: what a
    /// copyback or a proactive replacement does row by row. `done` runs on a shard thread.
    pub fn copy_row(&self, vd: &Arc<VirtualDrive>, row: u64, member: usize, done: RebuildDone) {
        if let Err(error) = validate_row(vd, row, MemberSet::of(&[member])) {
            return done(Err(error));
        }
        self.send_row(vd, row, RowJob::Copy { member, done });
    }

    /// Copies the `row_count` rows from `first_row` onto `vd`'s migration target (see
    /// [`VirtualDrive::start_migration`]), under their locks, each shard its part of the run:
    /// what a migration does. `done` gets one result per row, in order, on a shard thread (at
    /// once for a bad row number).
    pub fn migrate_rows(&self, vd: &Arc<VirtualDrive>, first_row: u64, row_count: u64, done: RebuildRunDone) {
        if row_count == 0 {
            return done(Vec::new());
        }
        if let Err(error) = validate_run(vd, first_row, row_count, MemberSet::default()) {
            return done(vec![Err(error); row_count as usize]);
        }
        for (part_first, part_count, done) in RunJoin::split(vd.geometry(), first_row, row_count, done) {
            self.send_row(vd, part_first, RowJob::Migrate { row_count: part_count, done });
        }
    }

    /// Runs a clean pass of `vd`'s write-intent bitmap on every shard (each clears its own idle
    /// regions; `stopping` clears every region with nothing in flight). `done` gets the first
    /// error once every shard has finished.
    pub fn clean_write_intent(&self, vd: &Arc<VirtualDrive>, stopping: bool, done: CleanDone) {
        let joined = Arc::new(Mutex::new((self.shards.len(), Ok(()), Some(done))));
        for shard in &self.shards {
            let joined = Arc::clone(&joined);
            let done: CleanDone = Box::new(move |result| {
                let mut state = joined.lock().expect("clean join lock");
                state.0 -= 1;
                if state.1.is_ok() {
                    state.1 = result;
                }
                if state.0 == 0 {
                    let result = std::mem::replace(&mut state.1, Ok(()));
                    (state.2.take().expect("done once"))(result);
                }
            });
            vd.begin_request();
            shard.send(ShardMsg::CleanIntent { vd: Arc::clone(vd), stopping, done });
        }
    }

    /// Hands a row job to the row's shard, counted in the VD's requests in flight like a request.
    fn send_row(&self, vd: &Arc<VirtualDrive>, row: u64, job: RowJob) {
        vd.begin_request();
        let shard = self.shard_of_row(vd, row);
        self.shards[shard].send(ShardMsg::Row { vd: Arc::clone(vd), row, job });
    }
}
