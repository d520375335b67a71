//! How a request reaches the shards that own its rows: cut where the owner changes, each piece
//! counted in the VD's requests in flight and queued to its shard.
//!
//! The engine routes every request this way; the SSD cache ([`crate::ssd_cache`]) holds its own
//! copy of the router, since it issues reads and writes of both of its VDs from completions on
//! shard threads, where no `&Engine` is at hand.

use crate::join::Joiner;
use crate::{shard_stride_rows, Done, ShardLink, ShardMsg, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::sync::Arc;

/// What a request piece is: a read or a write, and for a write whether it may go around the
/// journal (`vd::journal_bypass`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub write: bool,
    pub bypass: bool,
}

impl Piece {
    pub const READ: Piece = Piece { write: false, bypass: false };
    pub const WRITE: Piece = Piece { write: true, bypass: false };
}

#[derive(Clone)]
pub(crate) struct Router {
    links: Arc<[Arc<ShardLink>]>,
}

impl Router {
    pub(crate) fn new(links: Arc<[Arc<ShardLink>]>) -> Router {
        Router { links }
    }

    /// The engine has stopped: its shards take no more requests (a request sent now is
    /// dropped with its completion, never called).
    pub(crate) fn stopped(&self) -> bool {
        self.links.iter().any(|link| link.is_stopped())
    }

    /// The shard that owns `row` of `vd`: rows are dealt to shards in strides, each VD's
    /// starting at a shard of its own, so that many VDs' first rows (where every file system
    /// keeps its hottest blocks, where every benchmark starts) do not all land on one shard.
    pub(crate) fn shard_of_row(&self, vd: &VirtualDrive, row: u64) -> usize {
        shard_of_row_among(vd, row, self.links.len())
    }

    /// A read or write through the shards' normal path: no Fast Path, no read-ahead, no SSD
    /// cache. Bad requests complete at once with an error.
    pub(crate) fn submit_plain(&self, vd: &Arc<VirtualDrive>, request: VdRequest, done: Done) {
        if let Err(error) = crate::join::validate(vd, &request) {
            return done(crate::VdCompletion { result: Err(error), buf: request.into_buf() });
        }
        match request {
            VdRequest::Read { offset_bytes, buf } => self.submit_pieces(vd, offset_bytes, buf, Piece::READ, done),
            VdRequest::Write { offset_bytes, buf } => self.submit_pieces(vd, offset_bytes, buf, Piece::WRITE, done),
            VdRequest::Flush => self.flush(vd, done),
        }
    }

    /// A flush on every shard: each holds its own part of the VD's cached data and journal.
    pub(crate) fn flush(&self, vd: &Arc<VirtualDrive>, done: Done) {
        let joiner = Joiner::new(self.links.len(), done);
        for index in 0..self.links.len() {
            let joiner = Arc::clone(&joiner);
            let done: Done = Box::new(move |completion| joiner.piece_done(index, completion));
            self.send_request(index, vd, VdRequest::Flush, false, done);
        }
    }

    /// Cuts a request into runs of rows owned by one shard and sends each to its shard.
    pub(crate) fn submit_pieces(&self, vd: &Arc<VirtualDrive>, offset_bytes: u64, mut buf: IoBuf, kind: Piece, done: Done) {
        let mut pieces: Vec<(usize, u64, IoBuf)> = Vec::new();
        let mut run_start = offset_bytes;
        let mut run_shard = None;
        for row in vd.geometry().rows(offset_bytes, buf.len() as u64) {
            let shard = self.shard_of_row(vd, row.row);
            if run_shard.is_some_and(|s| s != shard) {
                let rest = buf.split_off((row.vd_offset_bytes - run_start) as usize);
                pieces.push((run_shard.expect("checked"), run_start, std::mem::replace(&mut buf, rest)));
                run_start = row.vd_offset_bytes;
            }
            run_shard = Some(shard);
        }
        pieces.push((run_shard.unwrap_or(0), run_start, buf));
        let request = |offset_bytes, buf| match kind.write {
            true => VdRequest::Write { offset_bytes, buf },
            false => VdRequest::Read { offset_bytes, buf },
        };
        if pieces.len() == 1 {
            let (shard, offset, buf) = pieces.pop().expect("one piece");
            return self.send_request(shard, vd, request(offset, buf), kind.bypass, done);
        }
        let joiner = Joiner::new(pieces.len(), done);
        for (index, (shard, offset, buf)) in pieces.into_iter().enumerate() {
            let joiner = Arc::clone(&joiner);
            let done: Done = Box::new(move |completion| joiner.piece_done(index, completion));
            self.send_request(shard, vd, request(offset, buf), kind.bypass, done);
        }
    }

    /// Hands one request piece to a shard, counted in the VD's requests in flight until
    /// [`VirtualDrive::finish`] delivers it (a deletion waits for that count to drain).
    pub(crate) fn send_request(&self, shard: usize, vd: &Arc<VirtualDrive>, request: VdRequest, bypass: bool, done: Done) {
        vd.begin_request();
        self.links[shard].send(ShardMsg::Request { vd: Arc::clone(vd), request, done, bypass });
    }
}

/// [`Router::shard_of_row`] for an engine of `shard_count` shards.
pub(crate) fn shard_of_row_among(vd: &VirtualDrive, row: u64, shard_count: usize) -> usize {
    ((row / shard_stride_rows(vd.geometry()) + vd.id()) % shard_count as u64) as usize
}
