//! Helpers shared by the engine's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use engine::controller::Controller;
use engine::controller::CreateVdSpec;
use engine::{Engine, EngineConfig, VirtualDrive};
use layout::{Level, KIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One shard: the controller tests care about what reaches the drives, not about speed.
pub fn engine() -> Arc<Engine> {
    Arc::new(Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap())
}

/// `add vd` with a 64 KiB strip and the default policies.
pub fn spec(level: Level, slots: &[u32], name: &str) -> CreateVdSpec {
    CreateVdSpec {
        level,
        slots: slots.to_vec(),
        strip_size_bytes: 64 * KIB,
        name: Some(name.to_string()),
        drives_per_span: None,
        write_policy: WritePolicy::WriteThrough,
        read_policy: ReadPolicy::NoReadAhead,
        io_policy: IoPolicy::Direct,
        seq_cutoff: engine::config::SeqCutoff::LevelDefault,
    }
}

/// Bytes that differ from offset to offset and from seed to seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// `len` random bytes, the same for the same seed.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// `count` memory drives of `bytes` each.
pub fn mem_drives(count: usize, bytes: u64) -> Vec<Arc<dyn drive::Drive>> {
    (0..count).map(|_| Arc::new(drive::MemDrive::new(bytes)) as Arc<dyn drive::Drive>).collect()
}

/// Waits up to 30 s for `done`, naming `what` and the controller's recent events if it never is.
pub fn wait_until(what: &str, controller: &Controller, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        let events: Vec<String> = controller.events().into_iter().rev().take(8).map(|e| e.description).collect();
        assert!(Instant::now() < deadline, "{what} never happened; recent events: {events:#?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the VD's first `image.len()` bytes: they must be `image` (`when` says at which step).
pub fn check(engine: &Engine, vd: &Arc<VirtualDrive>, image: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, image.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let wrong = read.as_slice().iter().zip(image).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "{when}: first wrong byte");
}

/// Writes `count` 4 KiB pieces all over `image`'s span of the VD and records them in it.
pub fn scatter(engine: &Engine, vd: &Arc<VirtualDrive>, image: &mut [u8], seed: u8, count: u64) {
    for index in 0..count {
        let offset = (index * 7919 * 4096 + u64::from(seed) * 8192) % (image.len() as u64 - 4096);
        let data = pattern(4096, seed.wrapping_add(index as u8));
        engine.write_at(vd, offset, &data).unwrap();
        image[offset as usize..offset as usize + 4096].copy_from_slice(&data);
    }
}

/// A client on a thread of its own writing through `vd` (the handle it was given, as an NBD
/// connection holds one) until finished: 4 KiB blocks, and every fifth `big_block_bytes` (so
/// across rows), all over the VD, a flush after every 32nd; every write and flush must succeed.
/// [`Writer::finish`] returns the VD's image as written.
pub struct Writer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    writes: Arc<std::sync::atomic::AtomicU64>,
    thread: std::thread::JoinHandle<Vec<u8>>,
}

impl Writer {
    pub fn start(engine: &Arc<Engine>, vd: &Arc<VirtualDrive>, big_block_bytes: u64, seed: u64) -> Writer {
        Writer::resume(engine, vd, vec![0u8; vd.capacity_bytes() as usize], big_block_bytes, seed)
    }

    /// As [`Writer::start`], on a VD that holds `image` already (an earlier writer's).
    pub fn resume(engine: &Arc<Engine>, vd: &Arc<VirtualDrive>, image: Vec<u8>, big_block_bytes: u64, seed: u64) -> Writer {
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(image.len() as u64, vd.capacity_bytes(), "the image of the whole VD");
        let (engine, vd) = (Arc::clone(engine), Arc::clone(vd));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stop_seen, counted) = (Arc::clone(&stop), Arc::clone(&writes));
        let thread = std::thread::spawn(move || {
            let capacity = vd.capacity_bytes();
            let mut image = image;
            for n in seed.. {
                if stop_seen.load(SeqCst) {
                    break;
                }
                let len = if n % 5 == 0 { big_block_bytes } else { 4 * KIB };
                let offset = n.wrapping_mul(7919 * 4096) % (capacity - len) / 4096 * 4096;
                let bytes: Vec<u8> = (0..len).map(|i| ((i ^ n).wrapping_mul(2_654_435_761) >> 13) as u8).collect();
                engine.write_at(&vd, offset, &bytes).unwrap_or_else(|e| panic!("write {n} at {offset}: {e}"));
                image[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
                if n % 32 == 0 {
                    assert_eq!(engine.run(&vd, engine::VdRequest::Flush).result, Ok(()), "flush after write {n}");
                }
                counted.fetch_add(1, SeqCst);
            }
            image
        });
        Writer { stop, writes, thread }
    }

    /// Waits until `writes` more writes completed (60 s at most).
    pub fn wait_for(&self, writes: u64) {
        let until = self.writes.load(std::sync::atomic::Ordering::SeqCst) + writes;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.writes.load(std::sync::atomic::Ordering::SeqCst) < until {
            assert!(Instant::now() < deadline, "the writer is stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn finish(self) -> Vec<u8> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the writer saw no error")
    }
}

/// Writes `bytes` at `offset_bytes` of `drive` directly, past any VD: data a disk held before,
/// or damage done behind a VD's back.
pub fn write_drive_at(drive: &dyn drive::Drive, offset_bytes: u64, bytes: &[u8]) {
    let mut ctx = drive::IoCtx::without_ring();
    drive.submit(&mut ctx, 0, drive::DriveOp::Write { offset_bytes, buf: drive::IoBuf::from_slice(bytes) });
    let mut done = Vec::new();
    ctx.poll(&mut done, false);
    assert_eq!(done[0].result, Ok(()), "a direct write of {} bytes at {offset_bytes}", bytes.len());
}

/// Writes `byte` over every byte of `drive`, as a disk that held data before the VD.
pub fn fill_drive(drive: &dyn drive::Drive, byte: u8) {
    let chunk = vec![byte; 1 << 20];
    for offset_bytes in (0..drive.info().capacity_bytes).step_by(chunk.len()) {
        write_drive_at(drive, offset_bytes, &chunk);
    }
}

/// A drive that counts the reads and the flushes that reach it (a test's proof of what the
/// engine asked of its members).
pub struct CountingDrive {
    inner: Arc<dyn drive::Drive>,
    reads: std::sync::atomic::AtomicU64,
    flushes: std::sync::atomic::AtomicU64,
}

impl CountingDrive {
    pub fn over(inner: Arc<dyn drive::Drive>) -> Arc<CountingDrive> {
        Arc::new(CountingDrive { inner, reads: Default::default(), flushes: Default::default() })
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn flushes(&self) -> u64 {
        self.flushes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl drive::Drive for CountingDrive {
    fn info(&self) -> &drive::DriveInfo {
        self.inner.info()
    }

    fn submit(&self, ctx: &mut drive::IoCtx, token: drive::Token, op: drive::DriveOp) {
        let counter = match op {
            drive::DriveOp::Read { .. } | drive::DriveOp::ReadV { .. } => Some(&self.reads),
            drive::DriveOp::Flush => Some(&self.flushes),
            _ => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.submit(ctx, token, op)
    }

    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        self.inner.reads_zero(offset_bytes, len_bytes)
    }

    fn writes_durable(&self) -> bool {
        self.inner.writes_durable()
    }
}
