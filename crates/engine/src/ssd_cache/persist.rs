//! The line table across stops, at the cache's level: reading it back at start, installing a
//! VD's lines, putting the table in service (`running`) before any request, and saving it
//! whole (`clean`) at a clean stop. The format and the rules are in [`super::map`].

use super::lines::LineKey;
use super::map::{self, MapEntry, MapOwner};
use super::SsdCache;
use crate::{VdRequest, VirtualDrive};
use drive::IoBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl SsdCache {
    /// Saves the whole table for a warm start ([`map`]): new fills and destages stop, and once
    /// nothing reads, writes or fills a line (clients stopped first), every block is written
    /// from the lines held, then the header says `clean` at `owner`'s generation. Control plane
    /// only, at a clean stop, which is the end of the VDs' I/O: a write after it could leave a
    /// clean line older than its VD after a crash. Dirty lines stay dirty: they are read back
    /// at any start. Returns the lines saved.
    ///
    /// # Errors
    /// The tier did not go idle within `idle_timeout`, or the cache VD failed a write.
    pub fn save_map(self: &Arc<Self>, owner: MapOwner, idle_timeout: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + idle_timeout;
        loop {
            let mut lines = self.lines();
            lines.freeze();
            if lines.is_idle() && !lines.table_busy() {
                break;
            }
            drop(lines);
            if Instant::now() > deadline {
                return Err(format!("the cache still had I/O in flight after {idle_timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.write_whole_table(idle_timeout)?;
        let saved = self.lines().valid_count();
        self.write_header(owner, true)?;
        Ok(saved)
    }

    /// What the table says, for `owner`'s controller and this cache VD's geometry: every dirty
    /// line, and the clean ones if a clean stop at `owner`'s generation saved it (empty if the
    /// table is not ours). Read before [`SsdCache::begin_service`], and that before any request.
    ///
    /// # Errors
    /// The cache VD failed the read.
    pub fn load_map(&self, owner: MapOwner) -> Result<Vec<MapEntry>, String> {
        let slot_count = self.lines().slot_count();
        let offset_bytes = map::map_offset_bytes(slot_count, self.options.line_bytes);
        let header = self.read_cache_vd(offset_bytes, map::HEADER_BYTES)?;
        let Some(header) = map::decode_header(header.as_slice(), owner.controller_id, self.options.line_bytes, slot_count) else {
            return Ok(Vec::new());
        };
        let warm = header.clean && header.generation == owner.generation;
        let table_bytes = map::map_bytes(slot_count) as usize - map::HEADER_BYTES;
        let table = self.read_cache_vd(offset_bytes + map::HEADER_BYTES as u64, table_bytes)?;
        let entries = table
            .as_slice()
            .chunks_exact(map::BLOCK_BYTES)
            .enumerate()
            .flat_map(|(block, bytes)| map::decode_block(bytes, block as u32 * map::ENTRIES_PER_BLOCK, slot_count))
            .filter(|e| e.dirty || warm)
            .collect();
        Ok(entries)
    }

    /// Puts the table in service after the lines read back were installed: the header says
    /// `running`, then every block is written from the lines held (a line read back but not
    /// installed, of a VD gone, leaves the table), each flushed.
    ///
    /// # Errors
    /// The cache VD failed a write: the cache must not be used (its table is not trustworthy).
    pub fn begin_service(self: &Arc<Self>, owner: MapOwner) -> Result<(), String> {
        self.write_header(owner, false)?;
        self.write_whole_table(Duration::from_secs(60))?;
        self.in_service.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Makes `vd`'s lines of a table read back valid, dirty ones dirty (the VD is attached).
    /// Returns how many were installed and how many of those are dirty.
    pub fn install_map(&self, vd: &VirtualDrive, entries: &[MapEntry]) -> (usize, usize) {
        let lines_in_vd = vd.capacity_bytes().div_ceil(self.options.line_bytes);
        let lines: Vec<(LineKey, u32, bool)> = entries
            .iter()
            .filter(|e| u64::from(e.vd_id) == vd.id() && e.line < lines_in_vd)
            .map(|e| ((vd.instance_id(), e.line), e.slot, e.dirty))
            .collect();
        let installed = self.lines().install(&lines);
        (installed, self.lines().dirty_count_of(vd.instance_id()))
    }

    fn write_header(&self, owner: MapOwner, clean: bool) -> Result<(), String> {
        let slot_count = self.lines().slot_count();
        let offset_bytes = map::map_offset_bytes(slot_count, self.options.line_bytes);
        let header = map::encode_header(owner, self.options.line_bytes, slot_count, clean, self.options.write_back);
        self.run_on_cache_vd(VdRequest::Write { offset_bytes, buf: IoBuf::from_slice(&header) })?;
        self.run_on_cache_vd(VdRequest::Flush)
    }

    /// Writes every table block from the lines held, through the table's own writes, and waits.
    fn write_whole_table(self: &Arc<Self>, timeout: Duration) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let wanted = self.lines().request_all_blocks();
        for (block, generation) in wanted {
            let tx = tx.clone();
            let waiter = Box::new(move |ok: bool| {
                let _ = tx.send(ok);
            });
            // Bound first: the lock must be released before the waiter runs (it takes it).
            let ready = self.lines().table_wait(block, generation, waiter);
            if let Some((waiter, ok)) = ready {
                waiter(ok);
            }
        }
        drop(tx);
        self.kick_table();
        let deadline = Instant::now() + timeout;
        let mut all_ok = true;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(ok) => all_ok &= ok,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Err(format!("the line table not written after {timeout:?}")),
            }
        }
        match all_ok {
            true => Ok(()),
            false => Err(format!("cache VD {}: a write of the line table failed", self.cache_vd.name())),
        }
    }

    /// A request to the cache VD, waited for: control plane only.
    fn run_on_cache_vd(&self, request: VdRequest) -> Result<(), String> {
        self.run_read_on_cache_vd(request).map(drop)
    }

    fn read_cache_vd(&self, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, String> {
        self.run_read_on_cache_vd(VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes) })
            .map(|buf| buf.expect("a read returns its buffer"))
    }

    fn run_read_on_cache_vd(&self, request: VdRequest) -> Result<Option<IoBuf>, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.router.submit_plain(&self.cache_vd, request, Box::new(move |completion| drop(tx.send(completion))));
        let completion = rx.recv().map_err(|_| "the engine stopped".to_string())?;
        let name = self.cache_vd.name();
        completion.result.map(|()| completion.buf).map_err(|error| format!("cache VD {name}: {error}"))
    }
}
