//! The read path: hits from the cache VD, misses from the VD with the promotions they earn
//! (fills), and (write-back) reads that take dirty lines from the cache VD and the rest from
//! the VD.

use super::lines::LineKey;
use super::{SsdCache, Stream, STREAMS_TRACKED};
use crate::{Done, Engine, VdCompletion, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl SsdCache {
    pub(super) fn read(self: &Arc<Self>, engine: &Engine, vd: &Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, done: Done) {
        let len_bytes = buf.len() as u64;
        let keys = self.keys(vd, offset_bytes, len_bytes);
        let sequential = self.continues_long_stream(vd, offset_bytes, len_bytes);
        let slots = self.lines().begin_read(&keys);
        if let Some(slots) = slots {
            self.counters.read_hits.fetch_add(1, Ordering::Relaxed);
            return self.read_hit(vd, offset_bytes, buf, keys, slots, done);
        }
        // Some lines dirty, others not held: their VD is older than the cache VD there.
        let partial = if self.options.write_back { self.lines().begin_partial_read(&keys) } else { None };
        if let Some(slots) = partial {
            self.counters.read_hits.fetch_add(1, Ordering::Relaxed);
            return self.read_partial(engine, vd, (offset_bytes, buf), keys, slots, done);
        }
        if sequential {
            self.counters.read_bypassed.fetch_add(1, Ordering::Relaxed);
            return engine.submit_direct(vd, VdRequest::Read { offset_bytes, buf }, done);
        }
        self.counters.read_misses.fetch_add(1, Ordering::Relaxed);
        let within_one_line = keys.len() == 1;
        let promote: Vec<LineKey> = {
            let mut lines = self.lines();
            keys.into_iter().filter(|&key| lines.note_miss(key)).collect()
        };
        if promote.is_empty() {
            return engine.submit_direct(vd, VdRequest::Read { offset_bytes, buf }, done);
        }
        if let (true, [key]) = (within_one_line, &promote[..]) {
            let key = *key;
            // Within one line: the VD reads the whole line for the client and the fill at once
            // (on a hard disk the rest of a 64 KiB line costs a fraction of the seek).
            let Some(slot) = self.lines().begin_fill(key) else {
                return engine.submit_direct(vd, VdRequest::Read { offset_bytes, buf }, done);
            };
            return self.read_line_and_fill(engine, vd, (offset_bytes, buf), key, slot, done);
        }
        // The client first; then the lines it missed twice, from the VD to the cache VD.
        let (cache, vd_for_fill) = (Arc::clone(self), Arc::clone(vd));
        let done: Done = Box::new(move |completion| {
            done(completion);
            for key in promote {
                cache.fill(&vd_for_fill, key);
            }
        });
        engine.submit_direct(vd, VdRequest::Read { offset_bytes, buf }, done);
    }

    /// Reads every line of a hit from its slot on the cache VD; a failure has the VD serve the
    /// whole read again (the line is dropped).
    fn read_hit(self: &Arc<Self>, vd: &Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, keys: Vec<LineKey>, slots: Vec<u32>, done: Done) {
        let line = self.options.line_bytes;
        let pieces: Vec<(u64, IoBuf)> = self
            .split_by_line(offset_bytes, buf)
            .into_iter()
            .zip(&slots)
            .map(|((piece_start, piece), slot)| (u64::from(*slot) * line + piece_start % line, piece))
            .collect();
        assert_eq!(pieces.len(), keys.len(), "one piece per line read");
        let (cache, vd) = (Arc::clone(self), Arc::clone(vd));
        let joined: Done = Box::new(move |completion: VdCompletion| {
            let ok = completion.result.is_ok();
            let dirty = {
                let mut lines = cache.lines();
                let dirty = lines.any_dirty(&keys);
                for key in &keys {
                    lines.end_read(*key, ok);
                }
                dirty
            };
            // A dirty line has no other copy: its VD would return older data.
            if ok || dirty {
                return done(completion);
            }
            cache.counters.cache_read_errors.fetch_add(1, Ordering::Relaxed);
            let buf = completion.buf.expect("a read returns its buffer");
            cache.router.submit_plain(&vd, VdRequest::Read { offset_bytes, buf }, done);
        });
        let joiner = crate::join::Joiner::new(pieces.len(), joined);
        for (index, (cache_offset_bytes, piece)) in pieces.into_iter().enumerate() {
            let joiner = Arc::clone(&joiner);
            let piece_done: Done = Box::new(move |completion| joiner.piece_done(index, completion));
            self.router.submit_plain(&self.cache_vd, VdRequest::Read { offset_bytes: cache_offset_bytes, buf: piece }, piece_done);
        }
    }

    /// Promotes `key`: reads the line from the VD and writes it to its slot, then serves it,
    /// unless a write came meanwhile (see [`lines`]).
    fn fill(self: &Arc<Self>, vd: &Arc<VirtualDrive>, key: LineKey) {
        let Some(slot) = self.lines().begin_fill(key) else { return };
        let line = self.options.line_bytes;
        let offset_bytes = key.1 * line;
        let len_bytes = line.min(vd.capacity_bytes() - offset_bytes);
        let cache = Arc::clone(self);
        let read_done: Done = Box::new(move |completion| {
            if completion.result.is_err() {
                return cache.end_fill(key, false);
            }
            let buf = completion.buf.expect("a read returns its buffer");
            let written = Arc::clone(&cache);
            let write_done: Done = Box::new(move |completion| written.end_fill(key, completion.result.is_ok()));
            let cache_offset_bytes = u64::from(slot) * line;
            cache.router.submit_plain(&cache.cache_vd, VdRequest::Write { offset_bytes: cache_offset_bytes, buf }, write_done);
        });
        self.router.submit_plain(vd, VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) }, read_done);
    }

    /// A miss within line `key`, promoted with `slot` (its fill begun): the whole line is read
    /// from the VD, the client gets its part, and the line goes to the cache VD. If the line
    /// cannot be read whole (a bad block elsewhere in it), the fill is dropped and the client's
    /// range read alone.
    fn read_line_and_fill(
        self: &Arc<Self>,
        engine: &Engine,
        vd: &Arc<VirtualDrive>,
        (offset_bytes, mut buf): (u64, IoBuf),
        key: LineKey,
        slot: u32,
        done: Done,
    ) {
        let line = self.options.line_bytes;
        let line_offset_bytes = key.1 * line;
        let line_len_bytes = line.min(vd.capacity_bytes() - line_offset_bytes);
        let (cache, vd_for_retry) = (Arc::clone(self), Arc::clone(vd));
        let line_done: Done = Box::new(move |completion| {
            let Some(line_buf) = completion.buf.filter(|_| completion.result.is_ok()) else {
                cache.end_fill(key, false);
                return cache.router.submit_plain(&vd_for_retry, VdRequest::Read { offset_bytes, buf }, done);
            };
            let start = (offset_bytes - line_offset_bytes) as usize;
            let client_len = buf.len();
            buf.as_mut_slice().copy_from_slice(&line_buf.as_slice()[start..start + client_len]);
            done(VdCompletion { result: Ok(()), buf: Some(buf) });
            let written = Arc::clone(&cache);
            let write_done: Done = Box::new(move |completion| written.end_fill(key, completion.result.is_ok()));
            let cache_offset_bytes = u64::from(slot) * line;
            cache.router.submit_plain(&cache.cache_vd, VdRequest::Write { offset_bytes: cache_offset_bytes, buf: line_buf }, write_done);
        });
        let request = VdRequest::Read { offset_bytes: line_offset_bytes, buf: IoBuf::zeroed(line_len_bytes as usize) };
        engine.submit_direct(vd, request, line_done);
    }

    fn end_fill(&self, key: LineKey, ok: bool) {
        let installed = self.lines().end_fill(key, ok);
        let counter = if installed { &self.counters.promotions } else { &self.counters.fills_dropped };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the request in the stream table; whether it continues a stream already past the
    /// sequential cutoff.
    fn continues_long_stream(&self, vd: &VirtualDrive, offset_bytes: u64, len_bytes: u64) -> bool {
        let mut streams = self.streams.lock().expect("ssd cache streams lock");
        let tick = streams.iter().map(|s| s.last_use).max().unwrap_or(0) + 1;
        let instance = vd.instance_id();
        if let Some(stream) = streams.iter_mut().find(|s| s.vd_instance == instance && s.end_bytes == offset_bytes) {
            stream.end_bytes = offset_bytes + len_bytes;
            stream.run_bytes += len_bytes;
            stream.last_use = tick;
            return stream.run_bytes > self.options.sequential_cutoff_bytes;
        }
        let stream = Stream { vd_instance: instance, end_bytes: offset_bytes + len_bytes, run_bytes: len_bytes, last_use: tick };
        if streams.len() < STREAMS_TRACKED {
            streams.push(stream);
        } else if let Some(oldest) = streams.iter_mut().min_by_key(|s| s.last_use) {
            *oldest = stream;
        }
        false
    }

    /// `buf` (VD bytes from `offset_bytes`) cut at line boundaries, without copying: each
    /// piece with the VD offset it starts at.
    fn split_by_line(&self, offset_bytes: u64, mut buf: IoBuf) -> Vec<(u64, IoBuf)> {
        let line = self.options.line_bytes;
        let end_bytes = offset_bytes + buf.len() as u64;
        let mut pieces = Vec::new();
        let mut piece_start = offset_bytes;
        while piece_start < end_bytes {
            let piece_end = ((piece_start / line + 1) * line).min(end_bytes);
            let rest = buf.split_off((piece_end - piece_start) as usize);
            pieces.push((piece_start, std::mem::replace(&mut buf, rest)));
            piece_start = piece_end;
        }
        pieces
    }

    /// A read touching dirty lines and lines the cache does not hold: each line's part from
    /// where its newest data is (the pinned lines from the cache VD, the rest from the VD).
    /// No fallback on a failure: a dirty line has no other copy.
    pub(super) fn read_partial(
        self: &Arc<Self>,
        engine: &Engine,
        vd: &Arc<VirtualDrive>,
        (offset_bytes, buf): (u64, IoBuf),
        keys: Vec<LineKey>,
        slots: Vec<Option<u32>>,
        done: Done,
    ) {
        let line = self.options.line_bytes;
        let pieces: Vec<(Option<u32>, u64, IoBuf)> =
            self.split_by_line(offset_bytes, buf).into_iter().zip(&slots).map(|((start, piece), slot)| (*slot, start, piece)).collect();
        assert_eq!(pieces.len(), keys.len(), "one piece per line read");
        let pinned: Vec<LineKey> = keys.iter().zip(&slots).filter(|(_, s)| s.is_some()).map(|(k, _)| *k).collect();
        let cache = Arc::clone(self);
        let joined: Done = Box::new(move |completion: VdCompletion| {
            {
                let mut lines = cache.lines();
                for key in &pinned {
                    lines.end_read(*key, completion.result.is_ok());
                }
            }
            done(completion);
        });
        let joiner = crate::join::Joiner::new(pieces.len(), joined);
        for (index, (slot, piece_offset_bytes, piece)) in pieces.into_iter().enumerate() {
            let joiner = Arc::clone(&joiner);
            let piece_done: Done = Box::new(move |completion| joiner.piece_done(index, completion));
            match slot {
                Some(slot) => {
                    let cache_offset_bytes = u64::from(slot) * line + piece_offset_bytes % line;
                    let request = VdRequest::Read { offset_bytes: cache_offset_bytes, buf: piece };
                    self.router.submit_plain(&self.cache_vd, request, piece_done);
                }
                None => engine.submit_direct(vd, VdRequest::Read { offset_bytes: piece_offset_bytes, buf: piece }, piece_done),
            }
        }
    }
}
