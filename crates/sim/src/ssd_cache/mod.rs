//! Seeded runs of a write-back SSD cache (issue 13) against the reference model: a VD and its
//! cache VD on drives with volatile write caches; clients write, read (promoting lines) and
//! flush; lines are destaged (a small cache crosses its watermarks all the time) and drained;
//! a cache SSD fails (RAID1 cache VD); power cuts come between any two steps, each followed by
//! a restart that reads the dirty lines back from the cache VD's table. At the end the cache is
//! drained and detached: the VD alone must hold what the model says.
//!
//! The VD is RAID0, JBOD, RAID1, 5 or 6. A redundant VD's members fail, are rebuilt onto blank
//! drives, and (RAID6) hold a strip gone bad that a repairing check corrects (`members`); after
//! a power cut such a VD is resynced whole before anything is read, standing in for the
//! controller's write-intent bitmap. A RAID1 cache VD has a real bitmap ([`cache_vd`]) and the
//! resync of what it names. Power cuts come while the VD's members are all in service, or
//! while a RAID1 member is being rebuilt, which begins again after the restart (`members`).
//!
//! The tier runs on the threaded engine's `Router`, which `LocalEngine` does not have, so these
//! runs use the threaded engine: the workload, faults and power cuts come from the seed, but
//! the threads (destaging, table writes) interleave as they will, so a seed replays the same
//! steps without promising the same interleaving.

mod cache_vd;
mod members;

use crate::drive::VolatileDrive;
use crate::model::Model;
use drive::{Drive, FaultyDrive, IoBuf};
use engine::ssd_cache::{MapOwner, SsdCache, SsdCacheOptions};
use engine::{Engine, EngineConfig, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LINE_BYTES: u64 = 64 * KIB;
/// The cache VD's slots: few, so that the watermarks (a quarter, an eighth) are crossed often
/// and eviction competes with dirty lines.
const CACHE_SLOTS: u64 = 12;
const OWNER: MapOwner = MapOwner { controller_id: 0x5eed, generation: 1 };
/// How long a row job may take before the run is declared stuck.
const ROW_JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a destager may take to notice that its engine stopped (it looks every 10 ms).
const DESTAGER_END_TIMEOUT: Duration = Duration::from_secs(10);

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct SsdCacheReport {
    pub seed: u64,
    pub level: String,
    pub cache_level: String,
    pub writes: u64,
    /// Writes the cache kept (write-back), in part or whole.
    pub writes_absorbed: u64,
    pub reads: u64,
    pub flushes: u64,
    pub power_cuts: u64,
    /// Dirty lines read back from the table at the restarts.
    pub dirty_recovered: u64,
    pub lines_destaged: u64,
    pub ssd_failed: bool,
    /// A redundant VD's members failed, rebuilt onto blank drives, and (RAID6) strips gone bad
    /// that a repairing check corrected.
    pub member_failures: u64,
    pub rebuilds: u64,
    pub strips_repaired: u64,
    /// Whole-VD resyncs after power cuts.
    pub resyncs: u64,
    /// Power cuts under a RAID1 with a member being rebuilt.
    pub power_cuts_in_rebuild: u64,
    /// Regions of a RAID1 cache VD resynced after power cuts (its bitmap named them).
    pub cache_regions_resynced: u64,
}

/// The drives of a run: the VD's, then the cache VD's, each volatile, behind a fault switch.
struct Drives {
    volatile: Vec<Arc<VolatileDrive>>,
    faulty: Vec<Arc<FaultyDrive>>,
    vd_count: usize,
}

impl Drives {
    fn new(vd_count: usize, vd_member_bytes: u64, cache_count: usize, cache_member_bytes: u64) -> Drives {
        let sizes = std::iter::repeat_n(vd_member_bytes, vd_count).chain(std::iter::repeat_n(cache_member_bytes, cache_count));
        let volatile: Vec<Arc<VolatileDrive>> = sizes.map(|bytes| Arc::new(VolatileDrive::new(MEMBER_RESERVED_BYTES + bytes))).collect();
        let faulty = volatile.iter().map(|d| Arc::new(FaultyDrive::new(Arc::clone(d) as Arc<dyn Drive>))).collect();
        Drives { volatile, faulty, vd_count }
    }

    /// Puts a blank drive of the same size in place of drive `index`; returns it.
    fn replace_blank(&mut self, index: usize) -> Arc<dyn Drive> {
        self.volatile[index] = Arc::new(VolatileDrive::new(self.volatile[index].info().capacity_bytes));
        self.faulty[index] = Arc::new(FaultyDrive::new(Arc::clone(&self.volatile[index]) as Arc<dyn Drive>));
        Arc::clone(&self.faulty[index]) as Arc<dyn Drive>
    }

    fn members(&self, range: std::ops::Range<usize>) -> Vec<Arc<dyn Drive>> {
        self.faulty[range].iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect()
    }
}

/// The engine, the VD, its cache VD and the cache, as one start made them.
struct Running {
    engine: Arc<Engine>,
    vd: Arc<VirtualDrive>,
    cache_vd: Arc<VirtualDrive>,
    cache: Arc<SsdCache>,
}

/// How a start finds the drives.
struct Start {
    seed: u64,
    /// The run's first start, over blank drives.
    first: bool,
    /// A cache SSD has failed.
    ssd_failed: bool,
    /// A member of the VD being rebuilt (onto the drive in its place now), as the controller's
    /// metadata would say at assembly: the rebuild begins again.
    rebuilding: Option<usize>,
}

fn new_vd(id: u64, level: Level, members: Vec<Arc<dyn Drive>>) -> Result<Arc<VirtualDrive>, String> {
    let layout = VdLayout { level, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    VirtualDrive::new(id, &format!("v{id}"), layout, members).map(Arc::new).map_err(|e| e.to_string())
}

/// Starts the engine over the drives: the cache VD's bitmap opened, the table read back (after
/// a power cut, from the first copy where the bitmap says the copies may disagree), installed,
/// put in service. Returns the dirty lines read back.
fn start(drives: &Drives, levels: (Level, Level), how: &Start) -> Result<(Running, u64), String> {
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).map_err(|e| e.to_string())?);
    let vd = new_vd(0, levels.0, drives.members(0..drives.vd_count))?;
    if let Some(member) = how.rebuilding {
        vd.set_member_state(member, engine::MemberState::Failed);
        vd.start_rebuild(member, vd.member(member).drive());
    }
    let cache_vd = new_vd(1, levels.1, drives.members(drives.vd_count..drives.faulty.len()))?;
    cache_vd::open_bitmap(&cache_vd, how.seed, how.first, how.ssd_failed);
    let cache = engine.ssd_cache(&cache_vd, SsdCacheOptions { write_back: true, ..SsdCacheOptions::default() })?;
    let entries = cache.load_map(OWNER)?;
    engine.attach_ssd_cache(&vd, &cache)?;
    let (_, dirty) = cache.install_map(&vd, &entries);
    cache.begin_service(OWNER)?;
    Ok((Running { engine, vd, cache_vd, cache }, dirty as u64))
}

/// A power cut: the engine stops (its shards finish what they had started and are joined:
/// every drive I/O goes through them, so nothing reaches a drive after this), then every drive
/// loses, keeps or tears each write it had not flushed. The cache's destager, maybe in the
/// middle of a batch whose requests no shard will run, must end with its engine: a destager
/// that outlived it once spun on its failed lines for the rest of the process.
fn power_cut(running: Running, drives: &Drives, rng: &mut SmallRng) -> Result<(), String> {
    let Running { engine, vd, cache_vd, cache } = running;
    drop((vd, cache_vd));
    assert_eq!(Arc::strong_count(&engine), 1, "the run holds the only reference to its engine");
    drop(engine);
    let deadline = Instant::now() + DESTAGER_END_TIMEOUT;
    while !cache.destager_ended() {
        if Instant::now() > deadline {
            return Err(format!("the cache's destager still runs {DESTAGER_END_TIMEOUT:?} after its engine stopped"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(cache);
    for drive in &drives.volatile {
        drive.crash(rng);
    }
    Ok(())
}

fn run_request(running: &Running, request: VdRequest) -> Result<Option<IoBuf>, String> {
    let completion = running.engine.run(&running.vd, request);
    completion.result.map(|()| completion.buf).map_err(|e| e.to_string())
}

/// Reads the whole VD in line-sized pieces against the model.
fn verify_all(running: &Running, model: &mut Model, when: &str) -> Result<(), String> {
    let capacity = running.vd.capacity_bytes();
    let mut offset = 0;
    while offset < capacity {
        let len = LINE_BYTES.min(capacity - offset);
        let buf = run_request(running, VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(len as usize) })?
            .expect("a read returns its buffer");
        model.check_read(offset, buf.as_slice()).map_err(|e| format!("{when}: {e}"))?;
        offset += len;
    }
    Ok(())
}

/// One seeded run; an error names the seed and the step.
pub fn run_ssd_cache_seed(seed: u64) -> Result<SsdCacheReport, String> {
    run(seed).map_err(|e| format!("ssd cache seed {seed}: {e}"))
}

fn run(seed: u64) -> Result<SsdCacheReport, String> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xCAC4_E5EE_D000_0000);
    let (level, vd_count, data_count) =
        [(Level::Raid0, 2, 2), (Level::Raid0, 3, 3), (Level::Jbod, 1, 1), (Level::Raid1, 2, 1), (Level::Raid5, 3, 2), (Level::Raid6, 4, 2)]
            [rng.gen_range(0..6)];
    let redundant = data_count < vd_count;
    let cache_level = if rng.gen_bool(0.5) { Level::Raid1 } else { Level::Raid0 };
    let vd_member_bytes = 2 * MIB / data_count as u64;
    // Room for the slots and the table (a header and a block), mirrored or striped.
    let cache_bytes = CACHE_SLOTS * LINE_BYTES + 8 * KIB;
    let cache_member_bytes = if cache_level == Level::Raid1 { cache_bytes } else { cache_bytes.div_ceil(2).next_multiple_of(64 * KIB) };
    let mut drives = Drives::new(vd_count, vd_member_bytes, 2, cache_member_bytes);
    let mut members = members::Members::default();
    let mut report = SsdCacheReport {
        seed,
        level: level.short_name().into(),
        cache_level: cache_level.short_name().into(),
        ..SsdCacheReport::default()
    };
    let (mut running, _) = start(&drives, (level, cache_level), &Start { seed, first: true, ssd_failed: false, rebuilding: None })?;
    let mut model = Model::new(running.vd.capacity_bytes() as usize);
    // The hot part of the VD: most requests go there, so its lines are promoted and rewritten.
    let capacity = running.vd.capacity_bytes();
    let hot_bytes = (capacity / 2).min(10 * LINE_BYTES);
    let steps = rng.gen_range(60..160);
    for step in 0..steps {
        members.advance(&running, false)?;
        if redundant && rng.gen_bool(0.06) {
            members.event(&running, &mut drives, &mut rng, &mut report).map_err(|e| format!("step {step}: {e}"))?;
            continue;
        }
        let roll = rng.gen_range(0..100);
        let in_hot = rng.gen_bool(0.8);
        let span = if in_hot { hot_bytes } else { capacity };
        match roll {
            0..=44 => write(&running, &mut model, &mut rng, span, &mut report)?,
            45..=84 => {
                let (offset, len) = range(&mut rng, span);
                let buf = run_request(&running, VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(len as usize) })?
                    .expect("a read returns its buffer");
                model.check_read(offset, buf.as_slice()).map_err(|e| format!("step {step}: {e}"))?;
                report.reads += 1;
            }
            85..=91 => {
                let covers = model.submit_flush();
                run_request(&running, VdRequest::Flush)?;
                model.complete_flush(covers);
                report.flushes += 1;
            }
            92..=94 => {
                running.cache.flush_vd(&running.vd, Duration::from_secs(20))?;
                running.cache.end_drain(&running.vd);
            }
            95..=97 if members.cut_allowed(level) => {
                power_cut(running, &drives, &mut rng)?;
                model.crash();
                report.power_cuts += 1;
                let rebuilding = members.restart_rebuild();
                let how = Start { seed, first: false, ssd_failed: report.ssd_failed, rebuilding };
                let (restarted, dirty) = start(&drives, (level, cache_level), &how)?;
                running = restarted;
                report.dirty_recovered += dirty;
                report.power_cuts_in_rebuild += u64::from(rebuilding.is_some());
                if redundant && rebuilding.is_none() {
                    members::resync(&running, &mut report).map_err(|e| format!("after the power cut at step {step}: {e}"))?;
                }
                verify_all(&running, &mut model, &format!("after the power cut at step {step}"))?;
                cache_vd::resync(&running, &mut report).map_err(|e| format!("after the power cut at step {step}: {e}"))?;
            }
            98.. if cache_level == Level::Raid1 && !report.ssd_failed => {
                drives.faulty[drives.vd_count + rng.gen_range(0..2)].set_failed(true);
                report.ssd_failed = true;
            }
            _ => {}
        }
    }
    members.finish(&running)?;
    verify_all(&running, &mut model, "at the end")?;
    let stats = running.cache.stats();
    report.writes_absorbed = stats.writes_absorbed;
    report.lines_destaged = stats.lines_destaged;
    running.engine.detach_ssd_cache(&running.vd)?;
    verify_all(&running, &mut model, "the VD alone, after the cache was drained and detached")?;
    Ok(report)
}

/// A request's range in the first `span_bytes`: 4 KiB aligned, 4 KiB to 96 KiB (one or two
/// lines).
fn range(rng: &mut SmallRng, span_bytes: u64) -> (u64, u64) {
    let len = rng.gen_range(1..=24u64) * 4 * KIB;
    let offset = rng.gen_range(0..=(span_bytes - len) / (4 * KIB)) * 4 * KIB;
    (offset, len)
}

fn write(running: &Running, model: &mut Model, rng: &mut SmallRng, span: u64, report: &mut SsdCacheReport) -> Result<(), String> {
    let (offset, len) = range(rng, span);
    let mut data = vec![0u8; len as usize];
    rng.fill_bytes(&mut data);
    let id = model.submit_write(offset, &data);
    run_request(running, VdRequest::Write { offset_bytes: offset, buf: IoBuf::from_slice(&data) })?;
    model.complete_write(id);
    report.writes += 1;
    Ok(())
}
