//! One drive operation as NBD requests: cut at the export's largest request, each request's
//! buffers tracked while the writer or the reader holds them, and the pieces joined back into
//! the operation's buffers for its one completion.

use crate::proto::Command;
use drive::{Completion, CompletionPort, DriveError, DriveOp, IoBuf, Token};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A drive operation in flight on the link: completes once, when its last request does.
pub(super) struct Op {
    token: Token,
    port: CompletionPort,
    shape: Shape,
    state: Mutex<OpState>,
}

/// How the operation's buffers came in, so that they go back the same way.
enum Shape {
    /// Flush: none.
    NoData,
    /// Read or Write: one buffer.
    Single,
    /// ReadV or WriteV: these lengths, in order.
    Vectored(Vec<usize>),
}

struct OpState {
    parts_left: usize,
    /// The buffers each request returned, by request.
    pieces: Vec<Vec<IoBuf>>,
    /// The first error of any request.
    error: Option<DriveError>,
}

/// One NBD request of an operation.
pub(super) struct Request {
    pub(super) command: Command,
    pub(super) offset_bytes: u64,
    pub(super) len_bytes: u32,
    /// The bytes it reads into or writes from (pieces of the operation's buffers).
    pub(super) segs: Vec<IoBuf>,
    pub(super) op: Arc<Op>,
    pub(super) part: usize,
}

/// A request waiting for its reply.
pub(super) struct Entry {
    pub(super) command: Command,
    /// Its buffers; `None` while the writer (a WRITE's payload) or the reader (a READ's data)
    /// holds them. An entry leaves the table only with its buffers back and its outcome known.
    pub(super) segs: Option<Vec<IoBuf>>,
    pub(super) outcome: Option<Result<(), DriveError>>,
    pub(super) submitted_at: Instant,
    pub(super) op: Arc<Op>,
    pub(super) part: usize,
}

impl Entry {
    pub(super) fn new(request: &Request, segs: Option<Vec<IoBuf>>) -> Entry {
        Entry {
            command: request.command,
            segs,
            outcome: None,
            submitted_at: Instant::now(),
            op: Arc::clone(&request.op),
            part: request.part,
        }
    }

    /// Records an outcome; the first one stands (a reply read after the link was cut does not
    /// undo the error the cut gave it).
    pub(super) fn settle(&mut self, outcome: Result<(), DriveError>) {
        self.outcome.get_or_insert(outcome);
    }

    /// The finished request, if its buffers are back and its outcome is known.
    pub(super) fn finished(&mut self) -> Option<Finished> {
        if self.segs.is_none() || self.outcome.is_none() {
            return None;
        }
        let segs = self.segs.take().expect("checked");
        let outcome = self.outcome.take().expect("checked");
        Some(Finished { op: Arc::clone(&self.op), part: self.part, segs, outcome })
    }
}

/// A request that is done, to hand to its operation outside the link's lock.
pub(super) struct Finished {
    pub(super) op: Arc<Op>,
    pub(super) part: usize,
    pub(super) segs: Vec<IoBuf>,
    pub(super) outcome: Result<(), DriveError>,
}

impl Finished {
    /// Gives the request back to its operation, which completes on its submitter's context
    /// when this was its last request.
    pub(super) fn deliver(self) {
        if let Some(completion) = self.op.part_done(self.part, self.segs, self.outcome) {
            self.op.port.complete(completion);
        }
    }
}

/// Delivers every finished request (after the link's lock is dropped).
pub(super) fn deliver_all(finished: Vec<Finished>) {
    finished.into_iter().for_each(Finished::deliver);
}

impl Op {
    fn part_done(&self, part: usize, segs: Vec<IoBuf>, outcome: Result<(), DriveError>) -> Option<Completion> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.pieces[part] = segs;
        if let Err(error) = outcome {
            state.error.get_or_insert(error);
        }
        state.parts_left -= 1;
        if state.parts_left > 0 {
            return None;
        }
        let pieces: Vec<IoBuf> = std::mem::take(&mut state.pieces).into_iter().flatten().collect();
        let result = state.error.take().map_or(Ok(()), Err);
        let (buf, bufs) = match &self.shape {
            Shape::NoData => (None, Vec::new()),
            Shape::Single => (Some(IoBuf::join(pieces)), Vec::new()),
            Shape::Vectored(lens) => (None, regroup(pieces, lens)),
        };
        Some(Completion { token: self.token, result, buf, bufs })
    }
}

/// Joins pieces back into buffers of `lens` bytes, in order. Every buffer took at least one
/// piece (an empty buffer, one empty piece).
fn regroup(pieces: Vec<IoBuf>, lens: &[usize]) -> Vec<IoBuf> {
    let mut pieces = pieces.into_iter();
    let mut bufs = Vec::with_capacity(lens.len());
    for &len in lens {
        let mut whole = pieces.next().expect("a piece for every buffer");
        while whole.len() < len {
            whole.unsplit(pieces.next().expect("pieces cover every buffer"));
        }
        bufs.push(whole);
    }
    bufs
}

/// Cuts `op` into requests of at most `max_request_bytes` (a multiple of 512), all of one
/// operation that completes through `port` with `token`. A flush is one request.
pub(super) fn split(op: DriveOp, max_request_bytes: usize, token: Token, port: CompletionPort) -> Vec<Request> {
    let (command, offset_bytes, shape, bufs) = match op {
        DriveOp::Flush => (Command::Flush, 0, Shape::NoData, Vec::new()),
        DriveOp::Read { offset_bytes, buf } => (Command::Read, offset_bytes, Shape::Single, vec![buf]),
        DriveOp::Write { offset_bytes, buf } => (Command::Write, offset_bytes, Shape::Single, vec![buf]),
        DriveOp::ReadV { offset_bytes, bufs } => (Command::Read, offset_bytes, vectored(&bufs), bufs),
        DriveOp::WriteV { offset_bytes, bufs } => (Command::Write, offset_bytes, vectored(&bufs), bufs),
    };
    let parts = cut(bufs, max_request_bytes);
    let state = OpState { parts_left: parts.len(), pieces: (0..parts.len()).map(|_| Vec::new()).collect(), error: None };
    let op = Arc::new(Op { token, port, shape, state: Mutex::new(state) });
    let mut at_bytes = offset_bytes;
    let mut requests = Vec::with_capacity(parts.len());
    for (part, segs) in parts.into_iter().enumerate() {
        let len_bytes: usize = segs.iter().map(IoBuf::len).sum();
        let len_bytes = u32::try_from(len_bytes).expect("a request is at most the largest request");
        requests.push(Request { command, offset_bytes: at_bytes, len_bytes, segs, op: Arc::clone(&op), part });
        at_bytes += u64::from(len_bytes);
    }
    requests
}

fn vectored(bufs: &[IoBuf]) -> Shape {
    Shape::Vectored(bufs.iter().map(IoBuf::len).collect())
}

/// The buffers cut into runs of at most `max_bytes`, splitting a buffer where a run ends; at
/// least one run (empty for a flush).
fn cut(bufs: Vec<IoBuf>, max_bytes: usize) -> Vec<Vec<IoBuf>> {
    let mut parts = vec![Vec::new()];
    let mut room = max_bytes;
    for mut buf in bufs {
        loop {
            if room == 0 && !buf.is_empty() {
                parts.push(Vec::new());
                room = max_bytes;
            }
            if buf.len() <= room {
                room -= buf.len();
                parts.last_mut().expect("one part at least").push(buf);
                break;
            }
            let tail = buf.split_off(room);
            parts.last_mut().expect("one part at least").push(buf);
            room = 0;
            buf = tail;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use drive::{IoCtx, IoCtxConfig};

    fn pattern(len: usize, seed: u8) -> IoBuf {
        IoBuf::from_slice(&(0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect::<Vec<_>>())
    }

    /// Splits `op`, finishes its requests in reverse order (replies come in any order), and
    /// returns the one completion.
    fn round_trip(op: DriveOp, max_request_bytes: usize, fail_part: Option<usize>) -> (Vec<(u64, u32)>, Completion) {
        let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
        let requests = split(op, max_request_bytes, 42, ctx.remote_completion());
        let ranges = requests.iter().map(|r| (r.offset_bytes, r.len_bytes)).collect();
        for request in requests.into_iter().rev() {
            let outcome = if Some(request.part) == fail_part { Err(DriveError::Io(5)) } else { Ok(()) };
            Finished { op: request.op, part: request.part, segs: request.segs, outcome }.deliver();
        }
        let mut out = Vec::new();
        ctx.poll(&mut out, true);
        assert_eq!(out.len(), 1, "one completion per operation");
        (ranges, out.pop().unwrap())
    }

    #[test]
    fn an_operation_within_the_largest_request_is_one_request() {
        let (ranges, done) = round_trip(DriveOp::Read { offset_bytes: 4096, buf: pattern(8192, 1) }, 1 << 20, None);
        assert_eq!(ranges, [(4096, 8192)]);
        assert_eq!(done.token, 42);
        assert_eq!(done.buf.unwrap().as_slice(), pattern(8192, 1).as_slice());
        let (ranges, done) = round_trip(DriveOp::Flush, 1 << 20, None);
        assert_eq!((ranges, done.result), (vec![(0, 0)], Ok(())));
    }

    #[test]
    fn a_larger_operation_is_cut_and_its_buffers_come_back_whole() {
        let (ranges, done) = round_trip(DriveOp::Write { offset_bytes: 512, buf: pattern(10 * 1024, 3) }, 4096, None);
        assert_eq!(ranges, [(512, 4096), (4608, 4096), (8704, 2048)]);
        assert_eq!(done.buf.unwrap().as_slice(), pattern(10 * 1024, 3).as_slice());
        let bufs = vec![pattern(1024, 1), IoBuf::zeroed(0), pattern(6144, 2), pattern(512, 3)];
        let (ranges, done) = round_trip(DriveOp::ReadV { offset_bytes: 0, bufs }, 4096, None);
        assert_eq!(ranges, [(0, 4096), (4096, 3584)]);
        let lens: Vec<usize> = done.bufs.iter().map(IoBuf::len).collect();
        assert_eq!(lens, [1024, 0, 6144, 512]);
        assert_eq!(done.bufs[2].as_slice(), pattern(6144, 2).as_slice());
    }

    #[test]
    fn the_operation_fails_if_any_request_does() {
        let (_, done) = round_trip(DriveOp::Write { offset_bytes: 0, buf: pattern(8192, 3) }, 4096, Some(1));
        assert_eq!(done.result, Err(DriveError::Io(5)));
        assert_eq!(done.buf.unwrap().len(), 8192, "the buffer comes back with the error");
    }
}
