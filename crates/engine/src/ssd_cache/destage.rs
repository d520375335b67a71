//! Destaging a write-back cache: dirty lines read from the cache VD and written to their VDs,
//! in LBA order from a cursor (an elevator over each VD: hard disks seek least so), a batch
//! at a time, each batch's VDs flushed before its lines are called clean. One thread per
//! write-back cache runs it (control plane: it blocks on its batch, never a shard).
//!
//! When: above the high watermark (a quarter of the lines dirty) until the low one (an
//! eighth), which keeps clean lines to evict and leaves hot lines dirty, where rewriting them
//! costs no disk I/O; everything once no client has written through the cache for a second
//! (write-back is not write-never); and every line of a VD asked for by [`SsdCache::flush_vd`]
//! (detaching its cache), whose writes go through to the VD meanwhile so that the drain ends.

use super::lines::Destage;
use super::SsdCache;
use crate::{Done, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Lines destaged at once (each a read of the cache VD and a write of a hard disk VD).
const DESTAGE_BATCH: usize = 8;
/// How often an idle destager looks for work.
const POLL: Duration = Duration::from_millis(10);
/// No write through the cache for this long: everything dirty is destaged.
const IDLE_BEFORE_DRAIN: Duration = Duration::from_secs(1);

/// Starts the destager of a write-back cache; it ends when the cache is dropped or its engine
/// stops.
pub(super) fn spawn(cache: &Arc<SsdCache>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let weak = Arc::downgrade(cache);
    let name = format!("storc-destage-{}", cache.cache_vd.name());
    std::thread::Builder::new().name(name).spawn(move || run(&weak))
}

fn run(cache: &Weak<SsdCache>) {
    loop {
        let Some(cache) = cache.upgrade() else { return };
        if cache.router.stopped() {
            return;
        }
        let destaged = cache.destage_round();
        drop(cache);
        if !destaged {
            std::thread::sleep(POLL);
        }
    }
}

impl SsdCache {
    /// One batch, if there is work by the rules above; whether it destaged a line. A batch
    /// whose lines all failed (a VD offline, the engine stopped) counts as none: the next
    /// round waits a [`POLL`], or the destager would spin on them.
    fn destage_round(self: &Arc<Self>) -> bool {
        let draining = self.draining.lock().expect("ssd cache draining lock").iter().next().copied();
        let since_write_ms = self.millis_since_created().saturating_sub(self.last_write_ms.load(Ordering::Relaxed));
        let idle = since_write_ms >= IDLE_BEFORE_DRAIN.as_millis() as u64;
        let batch = {
            let mut lines = self.lines();
            let (dirty, slots) = (lines.dirty_count(), lines.slot_count() as usize);
            let above_high = dirty > slots / 4;
            let active = self.destage_active.load(Ordering::Relaxed);
            let active = draining.is_some() || above_high || (active && dirty > slots / 8) || (idle && dirty > 0);
            self.destage_active.store(active, Ordering::Relaxed);
            if !active {
                return false;
            }
            lines.begin_destage(draining, DESTAGE_BATCH)
        };
        if batch.is_empty() {
            return false;
        }
        self.run_batch(batch) > 0
    }

    /// Whether the destager's thread has ended (a write-through cache has none): once the
    /// engine has stopped, it must, whoever still holds the cache.
    pub fn destager_ended(&self) -> bool {
        self.destager.lock().expect("ssd cache destager lock").as_ref().is_none_or(std::thread::JoinHandle::is_finished)
    }

    /// Notes a client write, for the idle rule.
    pub(super) fn note_write(&self) {
        self.last_write_ms.store(self.millis_since_created(), Ordering::Relaxed);
    }

    fn millis_since_created(&self) -> u64 {
        self.created.elapsed().as_millis() as u64
    }

    /// Destages `batch`; returns how many of its lines are clean now.
    fn run_batch(self: &Arc<Self>, batch: Vec<Destage>) -> usize {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, bool)>();
        let mut vds: BTreeMap<u64, Arc<VirtualDrive>> = BTreeMap::new();
        for (index, destage) in batch.iter().enumerate() {
            let vd = self.vds.lock().expect("ssd cache vds lock").get(&destage.key.0).and_then(Weak::upgrade);
            let Some(vd) = vd else {
                let _ = tx.send((index, false));
                continue;
            };
            vds.insert(destage.key.0, Arc::clone(&vd));
            self.destage_one(
                &vd,
                *destage,
                Box::new({
                    let tx = tx.clone();
                    move |ok| {
                        let _ = tx.send((index, ok));
                    }
                }),
            );
        }
        drop(tx);
        let mut ok = vec![false; batch.len()];
        while let Some((index, result)) = self.recv_unless_stopped(&rx) {
            ok[index] = result;
        }
        // A VD that fails its flush may not have the lines: they stay dirty.
        for (instance, vd) in vds {
            if self.wait(|done| self.router.flush(&vd, done)).is_err() {
                batch.iter().zip(ok.iter_mut()).filter(|(d, _)| d.key.0 == instance).for_each(|(_, ok)| *ok = false);
            }
        }
        let mut destaged = 0;
        {
            let mut lines = self.lines();
            for (destage, ok) in batch.into_iter().zip(ok) {
                let clean = lines.end_destage(destage, ok);
                destaged += usize::from(clean);
                let counter = if clean { &self.counters.lines_destaged } else { &self.counters.destage_retries };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.kick_table();
        destaged
    }

    /// Reads a line from its slot and writes it to its VD; `done(ok)` when both ended.
    fn destage_one(&self, vd: &Arc<VirtualDrive>, destage: Destage, done: Box<dyn FnOnce(bool) + Send>) {
        let line = self.options.line_bytes;
        let offset_bytes = destage.key.1 * line;
        let len_bytes = line.min(vd.capacity_bytes() - offset_bytes);
        let (router, vd) = (self.router.clone(), Arc::clone(vd));
        let read_done: Done = Box::new(move |completion| {
            let Some(buf) = completion.buf.filter(|_| completion.result.is_ok()) else { return done(false) };
            let written: Done = Box::new(move |completion| done(completion.result.is_ok()));
            router.submit_plain(&vd, VdRequest::Write { offset_bytes, buf }, written);
        });
        let cache_offset_bytes = u64::from(destage.slot) * line;
        self.router.submit_plain(
            &self.cache_vd,
            VdRequest::Read { offset_bytes: cache_offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) },
            read_done,
        );
    }

    fn wait(&self, submit: impl FnOnce(Done)) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        submit(Box::new(move |completion| drop(tx.send(completion.result))));
        match self.recv_unless_stopped(&rx) {
            Some(result) => result.map_err(|error| error.to_string()),
            None => Err("the engine stopped".into()),
        }
    }

    /// The next completion on `rx`; `None` once every sender is gone, or once the engine has
    /// stopped (a request it dropped may never call nor drop its completion: see
    /// `shard::StopTaking`), so that no destager outlives its engine waiting.
    fn recv_unless_stopped<T>(&self, rx: &Receiver<T>) -> Option<T> {
        loop {
            match rx.recv_timeout(POLL) {
                Ok(value) => return Some(value),
                Err(RecvTimeoutError::Timeout) if !self.router.stopped() => {}
                Err(_) => return None,
            }
        }
    }

    /// Destages every dirty line of `vd` and waits until the table says so; its writes go
    /// through to it from now on until [`SsdCache::end_drain`] (after detaching it, or on an
    /// error). Control plane only.
    ///
    /// # Errors
    /// Lines still dirty after `timeout` (the VD or the cache VD failing their writes).
    pub fn flush_vd(&self, vd: &VirtualDrive, timeout: Duration) -> Result<(), String> {
        let instance = vd.instance_id();
        {
            let mut draining = self.draining.lock().expect("ssd cache draining lock");
            draining.insert(instance);
            self.any_draining.store(true, Ordering::Release);
        }
        let deadline = Instant::now() + timeout;
        let result = loop {
            let (dirty, table_busy) = {
                let lines = self.lines();
                (lines.dirty_count_of(instance), lines.table_busy())
            };
            if dirty == 0 && !table_busy {
                break Ok(());
            }
            if Instant::now() > deadline {
                break Err(format!("{dirty} dirty line(s) of {} not destaged after {timeout:?}", vd.name()));
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        result
    }

    pub fn end_drain(&self, vd: &VirtualDrive) {
        let mut draining = self.draining.lock().expect("ssd cache draining lock");
        draining.remove(&vd.instance_id());
        self.any_draining.store(!draining.is_empty(), Ordering::Release);
    }

    /// Whether `vd`'s writes go through to it now (its lines are being drained).
    pub(super) fn is_draining(&self, vd: &VirtualDrive) -> bool {
        self.any_draining.load(Ordering::Acquire) && self.draining.lock().expect("ssd cache draining lock").contains(&vd.instance_id())
    }
}
