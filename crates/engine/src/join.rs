//! Joining what shards did for one caller (a request's pieces, a run's parts), and the checks
//! a request or row job passes before anything is queued.

use crate::vd::{MemberSet, VdCompletion, VdError, VdRequest, VirtualDrive};
use crate::{shard_stride_rows, Done};
use drive::IoBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A run of rows cut where the shard that owns them changes: (first row, row count) each.
pub(crate) fn run_parts(geometry: &layout::Geometry, first_row: u64, row_count: u64) -> Vec<(u64, u64)> {
    let stride_rows = shard_stride_rows(geometry);
    let end_row = first_row + row_count;
    let mut parts = Vec::new();
    let mut row = first_row;
    while row < end_row {
        let part_end = ((row / stride_rows + 1) * stride_rows).min(end_row);
        parts.push((row, part_end - row));
        row = part_end;
    }
    parts
}

/// Gathers the results of a run's parts (one per shard) into one list, in row order.
pub(crate) struct RunJoin<T> {
    remaining: usize,
    results: Vec<Option<T>>,
    done: Option<Box<dyn FnOnce(Vec<T>) + Send>>,
}

impl<T: Send + 'static> RunJoin<T> {
    /// The parts of the run of `row_count` rows from `first_row`, each with the completion that
    /// files its results; `done` gets them all, in order, once the last part reported.
    #[allow(clippy::type_complexity)]
    pub(crate) fn split(
        geometry: &layout::Geometry,
        first_row: u64,
        row_count: u64,
        done: Box<dyn FnOnce(Vec<T>) + Send>,
    ) -> Vec<(u64, u64, Box<dyn FnOnce(Vec<T>) + Send>)> {
        let parts = run_parts(geometry, first_row, row_count);
        let results = (0..row_count).map(|_| None).collect();
        let joined = Arc::new(Mutex::new(RunJoin { remaining: parts.len(), results, done: Some(done) }));
        let file = move |part_first: u64| -> Box<dyn FnOnce(Vec<T>) + Send> {
            let joined = Arc::clone(&joined);
            Box::new(move |results: Vec<T>| {
                let mut join = joined.lock().expect("run join lock");
                let at = (part_first - first_row) as usize;
                for (slot, result) in join.results[at..at + results.len()].iter_mut().zip(results) {
                    *slot = Some(result);
                }
                join.remaining -= 1;
                if join.remaining == 0 {
                    let results = join.results.drain(..).map(|r| r.expect("every part reports its rows")).collect();
                    let done = join.done.take().expect("a run completes once");
                    drop(join);
                    done(results);
                }
            })
        };
        parts.into_iter().map(|(part_first, part_count)| (part_first, part_count, file(part_first))).collect()
    }
}

/// [`validate_row`] of a run of `row_count` (at least one) rows from `first_row`: its first and
/// last rows bound it.
pub(crate) fn validate_run(vd: &VirtualDrive, first_row: u64, row_count: u64, targets: MemberSet) -> Result<(), VdError> {
    validate_row(vd, first_row, targets).and_then(|()| validate_row(vd, first_row.saturating_add(row_count - 1), targets))
}

/// Checks a row job's row and members against the VD before anything is queued.
pub(crate) fn validate_row(vd: &VirtualDrive, row: u64, targets: MemberSet) -> Result<(), VdError> {
    if vd.is_retired() {
        return Err(VdError::Deleted { vd: vd.name() });
    }
    let row_count = vd.geometry().row_count();
    if row >= row_count {
        return Err(VdError::RowOutOfRange { vd: vd.name(), row, row_count });
    }
    let member_count = vd.members().len();
    match targets.iter().find(|&member| member >= member_count) {
        Some(member) => Err(VdError::MemberOutOfRange { vd: vd.name(), member, member_count }),
        None => Ok(()),
    }
}

/// Checks a request against the VD before anything is queued.
pub(crate) fn validate(vd: &VirtualDrive, request: &VdRequest) -> Result<(), VdError> {
    if vd.is_retired() {
        return Err(VdError::Deleted { vd: vd.name() });
    }
    if vd.is_initializing() {
        return Err(VdError::Initializing { vd: vd.name() });
    }
    match request.range_bytes() {
        Some((offset_bytes, len_bytes)) => vd.check_range(offset_bytes, len_bytes),
        None => Ok(()),
    }
}

/// Gathers the pieces of a request served by several shards.
pub(crate) struct Joiner {
    remaining: AtomicUsize,
    state: Mutex<JoinState>,
}

struct JoinState {
    bufs: Vec<Option<IoBuf>>,
    error: Option<VdError>,
    done: Option<Done>,
}

impl Joiner {
    pub(crate) fn new(piece_count: usize, done: Done) -> Arc<Joiner> {
        let bufs = (0..piece_count).map(|_| None).collect();
        Arc::new(Joiner { remaining: AtomicUsize::new(piece_count), state: Mutex::new(JoinState { bufs, error: None, done: Some(done) }) })
    }

    pub(crate) fn piece_done(&self, index: usize, completion: VdCompletion) {
        let mut state = self.state.lock().expect("joiner poisoned");
        state.bufs[index] = completion.buf;
        if let Err(error) = completion.result {
            state.error.get_or_insert(error);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // A flush's pieces (one per shard) carry no buffer; a read's or write's all do.
        let bufs: Option<Vec<IoBuf>> = state.bufs.drain(..).collect();
        let result = state.error.take().map_or(Ok(()), Err);
        let done = state.done.take().expect("completed once");
        drop(state);
        done(VdCompletion { result, buf: bufs.map(IoBuf::join) });
    }
}
