//! The write-back path: a write's parts on lines the cache holds go to the cache VD only (the
//! lines become dirty), the rest to the VD; it is acknowledged once every part is done and
//! the table on the cache VD says each line it dirtied is dirty ([`super::lines`]'s rules,
//! [`super::map`]'s format). The table's blocks are written here, one write per block at a
//! time: a flush of the cache VD first (the lines' data, fills included, is on it before an
//! entry names them), the block, a flush after.

use super::lines::{LineKey, TableStart, WriteAction};
use super::{map, SsdCache};
use crate::vd::VdError;
use crate::{Done, Engine, VdCompletion, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

impl SsdCache {
    pub(super) fn write_back(self: &Arc<Self>, engine: &Engine, vd: &Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, done: Done) {
        let line = self.options.line_bytes;
        let keys = self.keys(vd, offset_bytes, buf.len() as u64);
        let (actions, waits): (Vec<WriteAction>, Vec<Option<(u32, u64)>>) = {
            let mut lines = self.lines();
            keys.iter().map(|&key| lines.begin_write_back(key)).unzip()
        };
        let end_bytes = offset_bytes + buf.len() as u64;
        let mut cache_parts = Vec::new();
        let mut vd_runs: Vec<(u64, u64)> = Vec::new();
        for (key, action) in keys.iter().zip(&actions) {
            let line_start = key.1 * line;
            let (start, stop) = (offset_bytes.max(line_start), end_bytes.min(line_start + line));
            match *action {
                WriteAction::Update(slot) => cache_parts.push((u64::from(slot) * line + start - line_start, start, stop)),
                WriteAction::Skip => match vd_runs.last_mut() {
                    Some(run) if run.1 == start => run.1 = stop,
                    _ => vd_runs.push((start, stop)),
                },
            }
        }
        let mut waits: Vec<(u32, u64)> = waits.into_iter().flatten().collect();
        waits.sort_unstable();
        waits.dedup_by(|later, earlier| {
            later.0 == earlier.0 && {
                earlier.1 = earlier.1.max(later.1);
                true
            }
        });
        if !cache_parts.is_empty() {
            self.counters.writes_absorbed.fetch_add(1, Ordering::Relaxed);
        }
        let slice =
            |start: u64, stop: u64| IoBuf::from_slice(&buf.as_slice()[(start - offset_bytes) as usize..(stop - offset_bytes) as usize]);
        let parts: Vec<(u64, IoBuf)> = cache_parts.iter().map(|&(cache_offset, start, stop)| (cache_offset, slice(start, stop))).collect();
        let runs: Vec<(u64, IoBuf)> = vd_runs.iter().map(|&(start, stop)| (start, slice(start, stop))).collect();
        let join = WriteBackJoin::new(self, vd, keys, actions, parts.len() + runs.len() + waits.len(), (buf, done));
        for (cache_offset_bytes, data) in parts {
            let join = Arc::clone(&join);
            let part_done: Done = Box::new(move |completion| join.part_done(completion.result));
            self.router.submit_plain(&self.cache_vd, VdRequest::Write { offset_bytes: cache_offset_bytes, buf: data }, part_done);
        }
        for (run_offset_bytes, data) in runs {
            let join = Arc::clone(&join);
            let run_done: Done = Box::new(move |completion| join.part_done(completion.result));
            engine.submit_direct(vd, VdRequest::Write { offset_bytes: run_offset_bytes, buf: data }, run_done);
        }
        for (block, generation) in waits {
            let waiting = Arc::clone(&join);
            let waiter = Box::new(move |ok: bool| waiting.table_done(ok));
            // Bound first: the lock must be released before the waiter runs (it takes it).
            let ready = self.lines().table_wait(block, generation, waiter);
            if let Some((waiter, ok)) = ready {
                waiter(ok);
            }
        }
        self.kick_table();
    }

    /// Starts the table block writes that are due (each block one write at a time).
    pub(super) fn kick_table(self: &Arc<Self>) {
        let starts = self.lines().table_starts();
        for start in starts {
            self.write_table_block(start);
        }
    }

    fn write_table_block(self: &Arc<Self>, start: TableStart) {
        let TableStart { block, generation, image } = start;
        let slot_count = self.lines().slot_count();
        let offset_bytes = map::block_offset_bytes(slot_count, self.options.line_bytes, block);
        let bytes = IoBuf::from_slice(&map::encode_block(&image));
        let cache = Arc::clone(self);
        let written: Done = Box::new(move |completion| {
            if completion.result.is_err() {
                return cache.table_block_done(block, generation, false);
            }
            let flushed = Arc::clone(&cache);
            let after: Done = Box::new(move |completion| flushed.table_block_done(block, generation, completion.result.is_ok()));
            cache.router.flush(&cache.cache_vd, after);
        });
        let cache = Arc::clone(self);
        let before: Done = Box::new(move |completion| {
            if completion.result.is_err() {
                return cache.table_block_done(block, generation, false);
            }
            cache.router.submit_plain(&cache.cache_vd, VdRequest::Write { offset_bytes, buf: bytes }, written);
        });
        self.router.flush(&self.cache_vd, before);
    }

    fn table_block_done(self: &Arc<Self>, block: u32, generation: u64, ok: bool) {
        if !ok {
            self.counters.table_write_errors.fetch_add(1, Ordering::Relaxed);
        }
        let waiters = self.lines().table_written(block, generation, ok);
        self.kick_table();
        for waiter in waiters {
            waiter(ok);
        }
    }
}

/// A write-back write's parts and table waits: acknowledged when all are done.
struct WriteBackJoin {
    cache: Arc<SsdCache>,
    vd_name: String,
    keys: Vec<LineKey>,
    actions: Vec<WriteAction>,
    state: Mutex<JoinState>,
}

struct JoinState {
    remaining: usize,
    error: Option<VdError>,
    client: Option<(IoBuf, Done)>,
}

impl WriteBackJoin {
    fn new(
        cache: &Arc<SsdCache>,
        vd: &VirtualDrive,
        keys: Vec<LineKey>,
        actions: Vec<WriteAction>,
        parts: usize,
        client: (IoBuf, Done),
    ) -> Arc<WriteBackJoin> {
        assert!(parts > 0, "a write has at least one part");
        let state = Mutex::new(JoinState { remaining: parts, error: None, client: Some(client) });
        Arc::new(WriteBackJoin { cache: Arc::clone(cache), vd_name: vd.name(), keys, actions, state })
    }

    fn part_done(&self, result: Result<(), VdError>) {
        self.finish_one(result.err());
    }

    fn table_done(&self, ok: bool) {
        let error = (!ok).then(|| VdError::SsdCacheWrite {
            vd: self.vd_name.clone(),
            cache_vd: self.cache.cache_vd.name(),
            detail: "the cache VD failed to write its line table".into(),
        });
        self.finish_one(error);
    }

    fn finish_one(&self, error: Option<VdError>) {
        let mut state = self.state.lock().expect("write-back join lock");
        if let Some(error) = error {
            state.error.get_or_insert(error);
        }
        state.remaining -= 1;
        if state.remaining > 0 {
            return;
        }
        let (buf, done) = state.client.take().expect("acknowledged once");
        let result = state.error.take().map_or(Ok(()), Err);
        drop(state);
        {
            let mut lines = self.cache.lines();
            for (key, action) in self.keys.iter().zip(&self.actions) {
                lines.end_write(*key, *action, result.is_ok());
            }
        }
        self.cache.kick_table();
        done(VdCompletion { result, buf: Some(buf) });
    }
}
