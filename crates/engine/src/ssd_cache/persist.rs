//! The line map across a clean stop, at the cache's level: saving it once the tier is idle,
//! reading it back, invalidating it before anything changes, installing a VD's lines. The
//! format and the rules are in [`super::map`].

use super::lines::LineKey;
use super::map::{self, MapEntry, MapOwner};
use super::SsdCache;
use crate::{VdRequest, VirtualDrive};
use drive::IoBuf;

impl SsdCache {
    /// Saves the map of valid lines past the last slot, for a warm start ([`map`]): new fills
    /// stop, and once nothing reads, writes or fills a line (clients stopped first), the valid
    /// lines of VDs that `vd_id_of` names (by instance id) are written and the cache VD
    /// flushed. Control plane only, at a clean stop, which is the end of the VDs' I/O (as for
    /// the write-intent bitmap closed just before): a write after it could leave a saved line
    /// older than its VD after a crash. Returns the lines saved.
    ///
    /// # Errors
    /// The tier did not go idle within `idle_timeout`, or the cache VD failed the write.
    pub fn save_map(
        &self,
        owner: MapOwner,
        vd_id_of: impl Fn(u64) -> Option<u32>,
        idle_timeout: std::time::Duration,
    ) -> Result<usize, String> {
        let deadline = std::time::Instant::now() + idle_timeout;
        let valid = loop {
            let mut lines = self.lines();
            lines.freeze();
            if lines.is_idle() {
                break lines.valid_lines();
            }
            drop(lines);
            if std::time::Instant::now() > deadline {
                return Err(format!("the cache still had I/O in flight after {idle_timeout:?}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let entries: Vec<MapEntry> =
            valid.iter().filter_map(|&((instance, line), slot)| vd_id_of(instance).map(|vd_id| MapEntry { vd_id, slot, line })).collect();
        let slot_count = self.lines().slot_count();
        let bytes = map::encode(owner, self.options.line_bytes, slot_count, &entries);
        let offset_bytes = map::map_offset_bytes(slot_count, self.options.line_bytes);
        self.run_on_cache_vd(VdRequest::Write { offset_bytes, buf: IoBuf::from_slice(&bytes) })?;
        self.run_on_cache_vd(VdRequest::Flush)?;
        Ok(entries.len())
    }

    /// The map a clean stop of `owner` left, if there is one for this cache VD's geometry
    /// (empty otherwise). Read it before [`SsdCache::invalidate_map`], and that before any VD
    /// is attached.
    ///
    /// # Errors
    /// The cache VD failed the read.
    pub fn load_map(&self, owner: MapOwner) -> Result<Vec<MapEntry>, String> {
        let slot_count = self.lines().slot_count();
        let offset_bytes = map::map_offset_bytes(slot_count, self.options.line_bytes);
        let header = self.read_cache_vd(offset_bytes, map::HEADER_BYTES)?;
        let Some((count, crc)) = map::decode_header(header.as_slice(), owner, self.options.line_bytes, slot_count) else {
            return Ok(Vec::new());
        };
        let entry_bytes = (count as usize * map::ENTRY_BYTES).next_multiple_of(4096);
        if entry_bytes == 0 {
            return Ok(Vec::new());
        }
        let body = self.read_cache_vd(offset_bytes + map::HEADER_BYTES as u64, entry_bytes)?;
        let entries = map::decode_entries(&body.as_slice()[..count as usize * map::ENTRY_BYTES], crc, slot_count);
        Ok(entries.unwrap_or_default())
    }

    /// Zeroes the map's header and flushes: from now on the cache VD's lines may change, and
    /// no later start may read this map back.
    ///
    /// # Errors
    /// The cache VD failed the write or the flush.
    pub fn invalidate_map(&self) -> Result<(), String> {
        let slot_count = self.lines().slot_count();
        let offset_bytes = map::map_offset_bytes(slot_count, self.options.line_bytes);
        self.run_on_cache_vd(VdRequest::Write { offset_bytes, buf: IoBuf::zeroed(map::HEADER_BYTES) })?;
        self.run_on_cache_vd(VdRequest::Flush)
    }

    /// Makes `vd`'s lines of a map read back valid (the VD is attached, numbered `vd_id`).
    /// Returns how many were.
    pub fn install_map(&self, vd: &VirtualDrive, vd_id: u32, entries: &[MapEntry]) -> usize {
        let lines_in_vd = vd.capacity_bytes().div_ceil(self.options.line_bytes);
        let lines: Vec<(LineKey, u32)> =
            entries.iter().filter(|e| e.vd_id == vd_id && e.line < lines_in_vd).map(|e| ((vd.instance_id(), e.line), e.slot)).collect();
        self.lines().install(&lines)
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
