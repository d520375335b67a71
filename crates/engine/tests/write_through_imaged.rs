//! WT with a journal on a parity VD writes no data record: the row images its row writes log
//! first hold every byte it puts on the members (`cache::write`'s imaged path). A row whose
//! image cannot be logged goes unlogged, and the write must then be made durable by a flush
//! of the members before it is acknowledged, as WT with a journal promises (DESIGN.md's
//! durability table). The simulator's crash seeds check that imaged writes survive a crash.

mod common;

use common::{pattern, CountingDrive};
use drive::{Drive, MemDrive};
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;

#[test]
fn a_write_through_row_that_cannot_be_imaged_is_flushed_before_its_acknowledgement() {
    let engine = Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap();
    let members: Vec<Arc<CountingDrive>> = (0..4).map(|_| CountingDrive::over(Arc::new(MemDrive::new(64 * MIB)))).collect();
    let drives: Vec<Arc<dyn Drive>> = members.iter().map(|m| Arc::clone(m) as Arc<dyn Drive>).collect();
    // 1 MiB strips: a whole row's image (3 MiB of data, 1 MiB of parity) is larger than half
    // of the smallest image ring, which an 8 MiB journal gets.
    let layout = VdLayout { level: Level::Raid5, strip_size_bytes: MIB, drives_per_span: None, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v1", layout, drives).unwrap());
    let journal_drive: Arc<dyn Drive> = Arc::new(MemDrive::new(8 * MIB));
    let journal = engine::journal::Journal::open(vec![journal_drive], 1, 1, 0, &mut |_| Ok(())).unwrap();
    journal.finish_replay().unwrap();
    engine.set_journal(Some(&journal));
    let flushes = || members.iter().map(|m| m.flushes()).sum::<u64>();

    // A small write's image fits: the imaged path, no data record and no flush of its own.
    engine.write_at(&vd, 4096, &pattern(4096, 1)).unwrap();
    // The first whole row also checkpoints the images logged before it (flushing the members
    // they covered); the second has nothing before it but itself.
    engine.write_at(&vd, 0, &pattern(3 * MIB as usize, 2)).unwrap();
    let before = flushes();
    let row = pattern(3 * MIB as usize, 3);
    engine.write_at(&vd, 0, &row).unwrap();
    assert!(flushes() > before, "a row written without its image was acknowledged before a flush made it durable");
    assert!(engine.read_at(&vd, 0, row.len()).unwrap().as_slice() == row.as_slice());
    assert_eq!(engine.cache_stats().dirty_bytes, 0, "WT on the imaged path keeps nothing in the cache");
}
