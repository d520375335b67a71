//! A journal on a file opened `O_DSYNC` (`FileDriveConfig::durable_writes`, as `storc serve
//! --journal` opens one): each record is durable when its write completes, so write-back
//! writes are acknowledged without any flush of the journal. Opened without it, the same
//! writes wait for flushes. Either way the journal replays every acknowledged write after a
//! crash.

mod common;

use common::{pattern, CountingDrive};
use drive::{Drive, FileDrive, FileDriveConfig, MemDrive};
use engine::config::WritePolicy;
use engine::journal::Journal;
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use std::sync::Arc;

const CONTROLLER: u128 = 7;
const WRITES: u64 = 16;

fn raid5(members: &[Arc<dyn Drive>]) -> Arc<VirtualDrive> {
    let layout = VdLayout { level: Level::Raid5, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    Arc::new(VirtualDrive::new(1, "v1", layout, members.to_vec()).unwrap())
}

/// Small WB writes (data records, not whole rows) to a RAID5 whose journal is a file opened
/// with `durable_writes`; returns the journal flushes they caused, after checking that they
/// replay onto the members after a crash.
fn flushes_of_write_back_writes(durable_writes: bool) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let config = FileDriveConfig { create_size_bytes: Some(64 * MIB), preallocate: true, durable_writes, ..FileDriveConfig::default() };
    let file = FileDrive::open(&dir.path().join("journal.img"), &config).unwrap();
    assert_eq!(file.writes_durable(), durable_writes);
    let journal_drive = CountingDrive::over(Arc::new(file));
    let members: Vec<Arc<dyn Drive>> = (0..4).map(|_| Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + 8 * MIB)) as Arc<dyn Drive>).collect();
    let data = |i: u64| pattern(4 * KIB as usize, i as u8);
    let offset = |i: u64| i * 64 * KIB;

    let (flushes, trusted) = {
        let engine = Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap();
        let vd = raid5(&members);
        let journal = Journal::open(vec![Arc::clone(&journal_drive) as Arc<dyn Drive>], CONTROLLER, 1, 0, &mut |_| Ok(())).unwrap();
        journal.finish_replay().unwrap();
        engine.set_journal(Some(&journal));
        vd.set_write_policy(WritePolicy::WriteBack);
        let before = journal_drive.flushes();
        for i in 0..WRITES {
            engine.write_at(&vd, offset(i), &data(i)).unwrap();
        }
        assert!(engine.cache_stats().dirty_bytes > 0, "acknowledged from the journal, not yet destaged");
        (journal_drive.flushes() - before, journal.journal_id())
        // The engine goes with its cache: a crash, with the data in the journal only.
    };

    let plain = Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap();
    let vd = raid5(&members);
    let journal = Journal::open(vec![journal_drive as Arc<dyn Drive>], CONTROLLER, 1, trusted, &mut |record| {
        plain.write_at(&vd, record.vd_offset_bytes, &record.data).map_err(|e| e.to_string())
    })
    .unwrap();
    assert!(journal.replay_report().records >= WRITES, "{:?}", journal.replay_report());
    for i in 0..WRITES {
        assert_eq!(plain.read_at(&vd, offset(i), 4096).unwrap().as_slice(), &data(i)[..], "write {i} after replay");
    }
    flushes
}

#[test]
fn a_journal_written_o_dsync_acknowledges_write_back_writes_without_a_flush() {
    assert_eq!(flushes_of_write_back_writes(true), 0, "each record was durable when its write completed");
    assert!(flushes_of_write_back_writes(false) > 0, "without O_DSYNC, a record is durable only after a flush");
}
