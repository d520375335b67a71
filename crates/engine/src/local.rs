//! [`LocalEngine`]: one shard on the caller's thread, for the simulator and unit tests.

use crate::join::{validate_row, validate_run};
use crate::runtime::{CompletionOrder, Executor, Reactor};
use crate::vd::{CheckMode, CheckOutcome, MemberSet, VdCompletion, VdError, VdRequest, VirtualDrive};
use crate::{io, validate};
use drive::IoCtx;
use std::rc::Rc;
use std::sync::Arc;

/// One shard on the caller's thread, with completion order chosen by the caller: the
/// deterministic simulator and unit tests drive the real I/O paths through it.
pub struct LocalEngine {
    executor: Executor,
    /// What runs before every turn in the control plane's place (a watcher thread in the
    /// daemon); when it returns true the cache gets a tick.
    watcher: Option<Box<dyn FnMut() -> bool>>,
}

impl LocalEngine {
    pub fn new(order: CompletionOrder) -> LocalEngine {
        let reactor = Reactor::new(IoCtx::without_ring(), order);
        LocalEngine { executor: Executor::new(reactor), watcher: None }
    }

    /// Queues a request; `done` runs during a later [`LocalEngine::step`].
    pub fn submit(&mut self, vd: &Arc<VirtualDrive>, request: VdRequest, done: impl FnOnce(VdCompletion) + 'static) {
        if let Err(error) = validate(vd, &request) {
            return done(VdCompletion { result: Err(error), buf: request.into_buf() });
        }
        let reactor = Rc::clone(self.executor.reactor());
        let ahead = match &request {
            VdRequest::Read { offset_bytes, buf } => {
                crate::read_ahead_for(vd, *offset_bytes..offset_bytes + buf.len() as u64, crate::vd::policy::DEFAULT_READ_AHEAD_BYTES)
            }
            _ => None,
        };
        let bypass = match &request {
            VdRequest::Write { offset_bytes, buf } => vd.note_write_for_bypass(*offset_bytes, buf.len() as u64),
            _ => false,
        };
        let (reactor2, vd2) = (Rc::clone(&reactor), Arc::clone(vd));
        self.executor.spawn(async move { done(crate::cache::serve(reactor2, vd2, request, bypass).await) });
        if let Some(ahead) = ahead {
            // After the read, as on a shard.
            let vd = Arc::clone(vd);
            self.executor.spawn(async move { crate::cache::prefetch(reactor, vd, ahead).await });
        }
    }

    /// The shard's journal partition from now on (the journal must have one partition).
    pub fn set_journal(&mut self, journal: Option<&crate::journal::Journal>) {
        if let Some(journal) = journal {
            assert_eq!(journal.superblock().partition_count, 1, "a local engine is one shard");
        }
        let (data, images) = journal.map(|j| j.shard_specs(0)).map_or((None, None), |(data, images)| (Some(data), images));
        self.executor.reactor().cache().set_images(images.map(|spec| Rc::new(spec.build())));
        self.executor.reactor().cache().set_journal(data.map(|spec| Rc::new(spec.build())));
    }

    /// The cache's periodic nudge (the engine's ticker does this every 100 ms).
    pub fn tick(&mut self) {
        crate::cache::tick(self.executor.reactor());
    }

    /// Queues [`crate::Engine::quiesce`] of this shard; `done` runs during a later step.
    pub fn quiesce(&mut self, done: impl FnOnce(Result<(), String>) + 'static) {
        let reactor = Rc::clone(self.executor.reactor());
        self.executor.spawn(async move { done(crate::cache::quiesce(&reactor).await) });
    }

    /// Queues a checkpoint of the row images past everything logged (see
    /// [`crate::Engine::images_to_head`]).
    pub fn images_to_head(&mut self, done: impl FnOnce(Result<(), String>) + 'static) {
        let reactor = Rc::clone(self.executor.reactor());
        self.executor.spawn(async move { done(crate::cache::images_to_head(&reactor).await) });
    }

    /// The cache's size and the age at which dirty data is destaged, however small.
    pub fn set_cache_limits(&mut self, bytes: u64, age_limit: std::time::Duration) {
        self.executor.reactor().cache().set_limits_for_tests(bytes, age_limit);
    }

    /// Dirty bytes the cache holds.
    pub fn dirty_bytes(&self) -> u64 {
        self.executor.reactor().cache().dirty_bytes()
    }

    /// The clean cache's counters.
    pub fn clean_stats(&self) -> crate::cache::clean::CleanStats {
        self.executor.reactor().cache().clean_stats()
    }

    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.executor.reactor().cache().stats()
    }

    /// Queues a rebuild of the strips `targets` hold in row `row` (see [`crate::Engine::rebuild_row`]);
    /// `done` runs during a later [`LocalEngine::step`], or at once for a bad row or member.
    pub fn rebuild_row(&mut self, vd: &Arc<VirtualDrive>, row: u64, targets: MemberSet, done: impl FnOnce(Result<(), VdError>) + 'static) {
        self.rebuild_rows(vd, row, 1, targets, move |mut results| done(results.pop().expect("one row, one result")));
    }

    /// Queues a rebuild of a run of rows (see [`crate::Engine::rebuild_rows`]): one shard owns
    /// every row here, so the run is one job whatever its length.
    pub fn rebuild_rows(
        &mut self,
        vd: &Arc<VirtualDrive>,
        first_row: u64,
        row_count: u64,
        targets: MemberSet,
        done: impl FnOnce(Vec<Result<(), VdError>>) + 'static,
    ) {
        if row_count == 0 {
            return done(Vec::new());
        }
        if let Err(error) = validate_run(vd, first_row, row_count, targets) {
            return done(vec![Err(error); row_count as usize]);
        }
        let reactor = Rc::clone(self.executor.reactor());
        let vd = Arc::clone(vd);
        self.executor.spawn(async move { done(crate::cache::rebuilt_rows(reactor, &vd, first_row, row_count, targets).await) });
    }

    /// Queues a copy of member `member`'s strips of row `row` to its copy target (see
    /// [`crate::Engine::copy_row`]); `done` runs during a later [`LocalEngine::step`], or at once for
    /// a bad row or member.
    pub fn copy_row(&mut self, vd: &Arc<VirtualDrive>, row: u64, member: usize, done: impl FnOnce(Result<(), VdError>) + 'static) {
        if let Err(error) = validate_row(vd, row, MemberSet::of(&[member])) {
            return done(Err(error));
        }
        let reactor = Rc::clone(self.executor.reactor());
        let vd = Arc::clone(vd);
        self.executor.spawn(async move { done(io::copy_row(reactor, vd, row, member).await) });
    }

    /// Queues a check of row `row` (see [`Engine::check_row`]).
    pub fn check_row(
        &mut self,
        vd: &Arc<VirtualDrive>,
        row: u64,
        mode: CheckMode,
        done: impl FnOnce(Result<CheckOutcome, VdError>) + 'static,
    ) {
        self.check_rows(vd, row, 1, mode, move |mut results| done(results.pop().expect("one row, one result")));
    }

    /// Queues a check of a run of rows (see [`crate::Engine::check_rows`]): one shard owns them all
    /// here.
    pub fn check_rows(
        &mut self,
        vd: &Arc<VirtualDrive>,
        first_row: u64,
        row_count: u64,
        mode: CheckMode,
        done: impl FnOnce(Vec<Result<CheckOutcome, VdError>>) + 'static,
    ) {
        if row_count == 0 {
            return done(Vec::new());
        }
        if let Err(error) = validate_run(vd, first_row, row_count, MemberSet::default()) {
            return done(vec![Err(error); row_count as usize]);
        }
        let reactor = Rc::clone(self.executor.reactor());
        let vd = Arc::clone(vd);
        self.executor.spawn(async move { done(crate::cache::checked_rows(reactor, &vd, first_row, row_count, mode).await) });
    }

    /// Queues a clean pass of `vd`'s bitmap (see [`Engine::clean_write_intent`]).
    pub fn clean_write_intent(&mut self, vd: &Arc<VirtualDrive>, stopping: bool, done: impl FnOnce(Result<(), VdError>) + 'static) {
        let reactor = Rc::clone(self.executor.reactor());
        let vd = Arc::clone(vd);
        self.executor.spawn(async move { done(io::clean_write_intent(reactor, vd, stopping).await) });
    }

    /// Starts a job with `start` (given the completion to call) and runs the loop until it is
    /// done: the waiting half of every `run_*` below.
    fn wait_for<T: 'static>(&mut self, start: impl FnOnce(&mut LocalEngine, Box<dyn FnOnce(T)>)) -> T {
        let slot = Rc::new(std::cell::RefCell::new(None));
        let out = Rc::clone(&slot);
        start(self, Box::new(move |value| *out.borrow_mut() = Some(value)));
        self.run_until_idle();
        let value = slot.borrow_mut().take();
        value.expect("the job completed")
    }

    /// [`LocalEngine::images_to_head`], waiting for it.
    ///
    /// # Errors
    /// A member flush that failed.
    pub fn run_images_to_head(&mut self) -> Result<(), String> {
        self.wait_for(|engine, done| engine.images_to_head(done))
    }

    /// Rebuilds one row and waits for the outcome: for tests and tools.
    ///
    /// # Errors
    /// What the rebuild reported.
    pub fn run_rebuild_row(&mut self, vd: &Arc<VirtualDrive>, row: u64, targets: MemberSet) -> Result<(), VdError> {
        self.wait_for(|engine, done| engine.rebuild_row(vd, row, targets, done))
    }

    /// Rebuilds a run of rows and waits for the outcome of each: for tests and tools.
    pub fn run_rebuild_rows(
        &mut self,
        vd: &Arc<VirtualDrive>,
        first_row: u64,
        row_count: u64,
        targets: MemberSet,
    ) -> Vec<Result<(), VdError>> {
        self.wait_for(|engine, done| engine.rebuild_rows(vd, first_row, row_count, targets, done))
    }

    /// Copies one row to member `member`'s copy target and waits for the outcome.
    ///
    /// # Errors
    /// What the copy reported.
    pub fn run_copy_row(&mut self, vd: &Arc<VirtualDrive>, row: u64, member: usize) -> Result<(), VdError> {
        self.wait_for(|engine, done| engine.copy_row(vd, row, member, done))
    }

    /// Checks one row and waits for the outcome: for tests and tools.
    ///
    /// # Errors
    /// What the check of each row of the run reported, in order.
    pub fn run_check_rows(
        &mut self,
        vd: &Arc<VirtualDrive>,
        first_row: u64,
        row_count: u64,
        mode: CheckMode,
    ) -> Vec<Result<CheckOutcome, VdError>> {
        self.wait_for(|engine, done| engine.check_rows(vd, first_row, row_count, mode, done))
    }

    /// What the check reported.
    pub fn run_check_row(&mut self, vd: &Arc<VirtualDrive>, row: u64, mode: CheckMode) -> Result<CheckOutcome, VdError> {
        self.wait_for(|engine, done| engine.check_row(vd, row, mode, done))
    }

    /// Runs `watcher` before every turn from now on (see [`LocalEngine::step`]).
    pub fn set_watcher(&mut self, watcher: Option<Box<dyn FnMut() -> bool>>) {
        self.watcher = watcher;
    }

    /// One turn of the loop, after the watcher. Returns whether anything happened.
    pub fn step(&mut self) -> bool {
        if self.watcher.as_mut().is_some_and(|watch| watch()) {
            crate::cache::tick(self.executor.reactor());
        }
        self.executor.turn(false)
    }

    /// Turns until every request has completed.
    pub fn run_until_idle(&mut self) {
        while self.executor.live_tasks() > 0 || self.executor.reactor().in_flight() > 0 {
            self.step();
        }
    }

    pub fn requests_in_flight(&self) -> usize {
        self.executor.live_tasks()
    }

    /// Runs one request to completion and returns its outcome.
    pub fn run(&mut self, vd: &Arc<VirtualDrive>, request: VdRequest) -> VdCompletion {
        self.wait_for(|engine, done| engine.submit(vd, request, done))
    }
}
