//! The journal's byte tables against docs/on-disk-format.md, replay's checks on a hand-made
//! device, and write-back through a real engine: acknowledged, never destaged, replayed.

use super::format::{checkpoint, record, superblock, Checkpoint, GroupEntry, RecordHeader, Seed, Superblock, BLOCK_BYTES};
use super::*;
use crate::config::WritePolicy;
use crate::metadata::tests::check_byte_table;
use crate::vd::{VdLayout, VirtualDrive, MEMBER_RESERVED_BYTES};
use crate::{Engine, EngineConfig};
use drive::MemDrive;
use layout::{Level, KIB, MIB};

#[test]
fn doc_tables_match_the_code() {
    check_byte_table("Journal superblock", &superblock::ALL);
    check_byte_table("Journal checkpoint", &checkpoint::ALL);
    check_byte_table("Journal record header", &record::ALL);
}

const CONTROLLER: u128 = 0x5ca1ab1e;
const JOURNAL_BYTES: u64 = 16 * MIB;

fn write_at(drive: &dyn drive::Drive, offset_bytes: u64, bytes: &[u8]) {
    crate::metadata::submit_and_wait(drive, drive::DriveOp::Write { offset_bytes, buf: drive::IoBuf::from_slice(bytes) }).unwrap();
}

/// A journal laid out for one partition, with `records` (VD offset, fill byte, length) written
/// one after the other from the checkpoint; returns the device and where each record sits.
fn hand_made(records: &[(u64, u8, usize)]) -> (Arc<dyn drive::Drive>, Vec<u64>) {
    let drive: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let seed = Seed::of_controller(CONTROLLER);
    let sb = Superblock::plan(CONTROLLER, 77, JOURNAL_BYTES, 1).unwrap();
    write_at(&*drive, 0, &sb.encode(seed, 0));
    let ring_start = sb.partition_offset_bytes(0) + format::RING_OFFSET_IN_PARTITION_BYTES;
    let checkpoint = Checkpoint {
        partition_index: 0,
        journal_id: 77,
        superblock_generation: sb.generation,
        counter: 1,
        tail_position_bytes: ring_start,
        tail_sequence: 500,
    };
    write_at(&*drive, sb.partition_offset_bytes(0) + BLOCK_BYTES, &checkpoint.encode(seed));
    let mut position = ring_start;
    let mut positions = Vec::new();
    for (index, &(vd_offset, fill, len)) in records.iter().enumerate() {
        let data = vec![fill; len];
        let header = RecordHeader::data(seed, 77, 500 + index as u64, position, 3, vd_offset, &data);
        write_at(&*drive, position, &header.encode(seed));
        let mut padded = data.clone();
        padded.resize(len.next_multiple_of(BLOCK_BYTES as usize), 0);
        write_at(&*drive, position + BLOCK_BYTES, &padded);
        positions.push(position);
        position += u64::from(header.record_bytes);
    }
    (drive, positions)
}

fn replayed(drive: &Arc<dyn drive::Drive>) -> (Journal, Vec<ReplayRecord>) {
    let mut seen = Vec::new();
    let journal = Journal::open(vec![Arc::clone(drive)], CONTROLLER, 1, 77, &mut |r| {
        seen.push(r.clone());
        Ok(())
    })
    .unwrap();
    (journal, seen)
}

#[test]
fn replay_returns_every_record_in_order_and_stops_at_the_first_bad_one() {
    let records = [(0, 1u8, 4096), (8192, 2, 512), (4096, 3, 12288), (1 << 20, 4, 4096)];
    let (drive, positions) = hand_made(&records);
    let (_, seen) = replayed(&drive);
    let got: Vec<(u64, u8, usize)> = seen.iter().map(|r| (r.vd_offset_bytes, r.data[0], r.data.len())).collect();
    assert_eq!(got, records.to_vec());
    assert!(seen.iter().all(|r| r.vd_id == 3 && r.data.iter().all(|&b| b == r.data[0])));

    // A torn data page in the third record: replay stops before it, even though the fourth is
    // intact (it could have been written before the third, so it was never acknowledged).
    let (drive, positions2) = hand_made(&records);
    assert_eq!(positions, positions2);
    write_at(&*drive, positions[2] + BLOCK_BYTES + 4096, &[9u8; 512]);
    let (_, seen) = replayed(&drive);
    assert_eq!(seen.len(), 2, "stops at the record whose page CRC fails");
}

/// A group record (format 4) after data records (format 3 and before): replay hands back its
/// writes in the order of their entries, and a group whose entries do not cover its data, or
/// name a write of no bytes, is no record.
#[test]
fn a_group_records_writes_replay_in_entry_order_after_older_data_records() {
    let (drive, positions) = hand_made(&[(0, 1, 4096)]);
    let seed = Seed::of_controller(CONTROLLER);
    let entries = [
        GroupEntry { vd_id: 3, len_bytes: 4096, vd_offset_bytes: 8192 },
        GroupEntry { vd_id: 4, len_bytes: 512, vd_offset_bytes: 0 },
        // The same range as the first, later: replay must lay it down second.
        GroupEntry { vd_id: 3, len_bytes: 4096, vd_offset_bytes: 8192 },
    ];
    let data: Vec<u8> = [vec![5u8; 4096], vec![6u8; 512], vec![7u8; 4096]].concat();
    let position = positions[0] + 2 * BLOCK_BYTES;
    let header = RecordHeader::group(seed, 77, 501, position, &entries, &data);
    assert_eq!(RecordHeader::decode(&header.encode(seed), seed).unwrap(), header, "a group header decodes as encoded");
    assert_eq!(header.group_entries(), entries.to_vec());
    write_at(&*drive, position, &header.encode(seed));
    let mut padded = data.clone();
    padded.resize(data.len().next_multiple_of(BLOCK_BYTES as usize), 0);
    write_at(&*drive, position + BLOCK_BYTES, &padded);
    let (journal, seen) = replayed(&drive);
    let got: Vec<(u32, u64, u8, usize)> = seen.iter().map(|r| (r.vd_id, r.vd_offset_bytes, r.data[0], r.data.len())).collect();
    assert_eq!(got, vec![(3, 0, 1, 4096), (3, 8192, 5, 4096), (4, 0, 6, 512), (3, 8192, 7, 4096)]);
    let report = journal.replay_report();
    assert_eq!((report.records, report.data_records, report.data_bytes), (4, 2, 4096 + 8704));

    let mut short = header.clone();
    short.entries[2].len_bytes = 2048;
    assert!(RecordHeader::decode(&short.encode(seed), seed).is_err(), "entries that do not cover the data");
    let mut empty = header.clone();
    empty.entries[1].len_bytes = 0;
    empty.entries[2].len_bytes += 512;
    assert!(RecordHeader::decode(&empty.encode(seed), seed).is_err(), "an entry of no bytes");
}

#[test]
fn after_replay_the_sequence_jumps_so_stale_records_never_validate() {
    let (drive, _) = hand_made(&[(0, 1, 4096), (4096, 2, 4096)]);
    let (journal, seen) = replayed(&drive);
    assert_eq!(seen.len(), 2);
    assert_eq!(journal.replay_report().records, 2);
    journal.finish_replay().unwrap();
    // The records are still on the device, but the new layout starts above their sequences.
    let (journal, seen) = replayed(&drive);
    assert!(seen.is_empty(), "stale records replayed again: {seen:?}");
    // A journal the metadata does not name is never replayed.
    let (drive, _) = hand_made(&[(0, 1, 4096)]);
    let journal2 = Journal::open(vec![Arc::clone(&drive)], CONTROLLER, 1, 78, &mut |_| panic!("untrusted")).unwrap();
    assert!(journal2.replay_report().untrusted && journal2.journal_id() != 77);
    assert!(journal.replay_report().found);
}

#[test]
fn another_controllers_journal_is_refused_and_a_blank_one_formatted() {
    let (drive, _) = hand_made(&[(0, 1, 4096)]);
    let error = Journal::open(vec![Arc::clone(&drive)], CONTROLLER + 1, 1, 77, &mut |_| Ok(())).err().unwrap();
    assert!(error.contains("belongs to controller"), "{error}");
    let blank: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let journal = Journal::open(vec![blank], CONTROLLER, 2, 0, &mut |_| panic!("nothing to replay")).unwrap();
    assert!(!journal.replay_report().found);
    let tiny: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(2 * MIB));
    let error = Journal::open(vec![tiny], CONTROLLER, 2, 0, &mut |_| Ok(())).err().unwrap();
    assert!(error.contains("too small"), "{error}");
}

const MEMBER_BYTES: u64 = MEMBER_RESERVED_BYTES + 8 * MIB;

fn raid5(members: &[Arc<dyn drive::Drive>]) -> Arc<VirtualDrive> {
    let layout = VdLayout { level: Level::Raid5, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    Arc::new(VirtualDrive::new(3, "v3", layout, members.to_vec()).unwrap())
}

fn mem_members() -> Vec<Arc<dyn drive::Drive>> {
    (0..4).map(|_| Arc::new(MemDrive::new(MEMBER_BYTES)) as Arc<dyn drive::Drive>).collect()
}

fn two_shards() -> EngineConfig {
    EngineConfig { shard_count: 2, ..EngineConfig::default() }
}

/// An engine of two shards with a blank journal on `journal_drive` and a WB RAID5 over
/// `members`.
fn write_back_rig(members: &[Arc<dyn drive::Drive>], journal_drive: &Arc<dyn drive::Drive>) -> (Engine, Arc<VirtualDrive>, Journal) {
    let engine = Engine::start(two_shards()).unwrap();
    let vd = raid5(members);
    let journal = Journal::open(vec![Arc::clone(journal_drive)], CONTROLLER, 2, 0, &mut |_| panic!("blank")).unwrap();
    journal.finish_replay().unwrap();
    engine.set_journal(Some(&journal));
    vd.set_write_policy(WritePolicy::WriteBack);
    (engine, vd, journal)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Write-back: acknowledged from the journal, lost from RAM with the engine (nothing was
/// destaged: the age limit had not passed), and back after replay (a large write's whole rows
/// were on the members already, imaged).
#[test]
fn write_back_data_only_in_the_journal_is_replayed_after_a_crash() {
    let members = mem_members();
    let journal_drive: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let trusted;
    let writes: Vec<(u64, Vec<u8>)> =
        vec![(0, pattern(64 * KIB as usize, 1)), (4 * MIB, pattern(3 * MIB as usize, 2)), (8 * KIB, pattern(4 * KIB as usize, 3))];
    {
        let (engine, vd, journal) = write_back_rig(&members, &journal_drive);
        trusted = journal.journal_id();
        for (offset, data) in &writes {
            engine.write_at(&vd, *offset, data).unwrap();
        }
        // Served from the cache.
        assert_eq!(engine.read_at(&vd, 8 * KIB, 4096).unwrap().as_slice(), &writes[2].1[..]);
        // Dropped at once: nothing was old enough to destage.
    }
    let vd = raid5(&members);
    let plain = Engine::start(two_shards()).unwrap();
    let before = plain.read_at(&vd, 8 * KIB, 4096).unwrap();
    assert_ne!(before.as_slice(), &writes[2].1[..], "the data never reached the members");
    let journal = Journal::open_with_images(
        vec![Arc::clone(&journal_drive)],
        CONTROLLER,
        2,
        trusted,
        &mut |record| {
            assert_eq!(record.vd_id, 3);
            plain.write_at(&vd, record.vd_offset_bytes, &record.data).map_err(|e| e.to_string())
        },
        &mut |image| crate::controller::write_row_image(&vd, image),
    )
    .unwrap();
    // The 3 MiB write's partial first and last rows are records; its whole rows went to the
    // members on the imaged path, and their images are in the ring too.
    assert!(journal.replay_report().records >= 4, "{:?}", journal.replay_report());
    assert!(journal.replay_report().images > 0, "{:?}", journal.replay_report());
    plain.flush(&vd).unwrap();
    journal.finish_replay().unwrap();
    let mut expected = vec![0u8; 8 * MIB as usize];
    for (offset, data) in &writes {
        expected[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
    }
    let got = plain.read_at(&vd, 0, expected.len()).unwrap();
    assert!(got.as_slice() == &expected[..], "replayed contents differ");
}

/// Group commit: writes that arrive while the journal is busy share group records, and after a
/// crash replay lays every acknowledged write down in the order it was admitted (each slot is
/// written several times, so an order swapped within or between groups shows).
#[test]
fn concurrent_write_back_writes_share_group_records_and_replay_in_order() {
    let members = mem_members();
    let journal_drive: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    const SLOTS: u64 = 16;
    const WRITES: u64 = 96;
    let trusted;
    {
        let (engine, vd, journal) = write_back_rig(&members, &journal_drive);
        trusted = journal.journal_id();
        let (tx, rx) = std::sync::mpsc::channel();
        for index in 0..WRITES {
            // Every slot is in row 0, which one shard owns: its writes are admitted in this order.
            let buf = drive::IoBuf::from_slice(&pattern(4096, index as u8));
            let tx = tx.clone();
            let done: crate::Done = Box::new(move |completion| tx.send(completion.result).unwrap());
            engine.submit(&vd, crate::vd::VdRequest::Write { offset_bytes: (index % SLOTS) * 4096, buf }, done);
        }
        for _ in 0..WRITES {
            rx.recv().unwrap().unwrap();
        }
    }
    let vd = raid5(&members);
    let plain = Engine::start(two_shards()).unwrap();
    let journal = Journal::open(vec![Arc::clone(&journal_drive)], CONTROLLER, 2, trusted, &mut |record| {
        plain.write_at(&vd, record.vd_offset_bytes, &record.data).map_err(|e| e.to_string())
    })
    .unwrap();
    let report = journal.replay_report();
    assert_eq!(report.records, WRITES, "every acknowledged write was replayed: {report:?}");
    assert!(report.data_records < WRITES, "writes placed together share records: {report:?}");
    for slot in 0..SLOTS {
        let last = (WRITES - SLOTS + slot) as u8;
        assert_eq!(plain.read_at(&vd, slot * 4096, 4096).unwrap().as_slice(), &pattern(4096, last)[..], "slot {slot}");
    }
}

/// Write-back over time: the destager writes everything to the members, the checkpoint frees
/// the journal, and a crash afterwards has nothing to replay.
#[test]
fn destaged_data_is_on_the_members_and_the_checkpoint_empties_the_journal() {
    let members = mem_members();
    let journal_drive: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let data = pattern(2 * MIB as usize, 9);
    let trusted;
    {
        let (engine, vd, journal) = write_back_rig(&members, &journal_drive);
        trusted = journal.journal_id();
        for chunk in 0..(data.len() / 8192) {
            engine.write_at(&vd, chunk as u64 * 8192, &data[chunk * 8192..(chunk + 1) * 8192]).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while journal.health().used_bytes() > 0 {
            assert!(std::time::Instant::now() < deadline, "the journal never emptied: {} bytes", journal.health().used_bytes());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let plain = Engine::start(two_shards()).unwrap();
    let vd = raid5(&members);
    let journal = Journal::open(vec![Arc::clone(&journal_drive)], CONTROLLER, 2, trusted, &mut |_| panic!("nothing to replay")).unwrap();
    assert_eq!(journal.replay_report().records, 0);
    assert!(plain.read_at(&vd, 0, data.len()).unwrap().as_slice() == &data[..], "destaged contents differ");
}

/// A mirrored pair: once a leg fails, a write-back write is not acknowledged until the
/// metadata names that leg stale (the controller's watcher does it; here the test), even though
/// the other leg has its record durable. Acknowledging earlier would let a restart that finds
/// only the failed leg (not yet known stale) replay it without the write.
#[test]
fn a_failed_leg_holds_acknowledgements_until_it_is_recorded_stale() {
    let members = mem_members();
    let failing = Arc::new(drive::FaultyDrive::new(Arc::new(MemDrive::new(JOURNAL_BYTES))));
    let legs: Vec<Arc<dyn drive::Drive>> = vec![Arc::new(MemDrive::new(JOURNAL_BYTES)), Arc::clone(&failing) as Arc<dyn drive::Drive>];
    let journal = Journal::open(legs, CONTROLLER, 1, 0, &mut |_| panic!("blank")).unwrap();
    journal.finish_replay().unwrap();
    let mut engine = crate::LocalEngine::new(crate::runtime::CompletionOrder::Fifo);
    engine.set_journal(Some(&journal));
    let vd = raid5(&members);
    vd.set_write_policy(WritePolicy::WriteBack);
    let acknowledged = std::rc::Rc::new(std::cell::Cell::new(0));
    let write = |engine: &mut crate::LocalEngine, seed: u8| {
        let done = std::rc::Rc::clone(&acknowledged);
        let request = crate::VdRequest::Write { offset_bytes: u64::from(seed) * 4096, buf: drive::IoBuf::from_slice(&pattern(4096, seed)) };
        engine.submit(&vd, request, move |completion| {
            completion.result.unwrap();
            done.set(done.get() + 1);
        });
    };
    write(&mut engine, 1);
    engine.run_until_idle();
    assert_eq!(acknowledged.get(), 1, "both legs in service: acknowledged");

    failing.set_failed(true);
    write(&mut engine, 2);
    for _ in 0..200 {
        engine.step();
        engine.tick();
    }
    assert!(journal.health().legs_pending(), "the failed leg waits to be recorded stale");
    assert!(journal.health().is_usable(), "one leg is left: the journal works");
    assert_eq!(acknowledged.get(), 1, "not acknowledged while the failed leg could still be replayed");

    let mask = journal.health().stale_mask();
    assert_eq!(mask, 0b10);
    journal.health().legs_recorded_stale(mask);
    engine.tick();
    engine.run_until_idle();
    assert_eq!(acknowledged.get(), 2, "acknowledged once the leg is recorded stale");
}

/// Row images (the write hole's parity log): a WT parity row write logs its member writes
/// before they go; replay hands every image back before any data record, and each holds exactly
/// what the members took. A caller that cannot write images back refuses such a journal rather
/// than skip them.
#[test]
fn parity_row_writes_are_logged_as_images_that_replay_hands_back_first() {
    let members = mem_members();
    let journal_drive: Arc<dyn drive::Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let journal = Journal::open(vec![Arc::clone(&journal_drive)], CONTROLLER, 1, 0, &mut |_| panic!("blank")).unwrap();
    journal.finish_replay().unwrap();
    assert!(journal.superblock().image_partition_bytes > 0, "{:?}", journal.superblock());
    let trusted = journal.journal_id();
    let vd = raid5(&members);
    let mut engine = crate::LocalEngine::new(crate::CompletionOrder::Fifo);
    engine.set_journal(Some(&journal));
    // A partial row, a write across a strip boundary, a whole row of the 3 + 1 RAID5.
    for (seed, (offset, len)) in [(4096, 8192), (64 * KIB - 4096, 8192), (3 * 192 * KIB, 192 * KIB)].into_iter().enumerate() {
        let request = crate::VdRequest::Write { offset_bytes: offset, buf: drive::IoBuf::from_slice(&pattern(len as usize, seed as u8)) };
        engine.run(&vd, request).result.unwrap();
    }
    // No tick ran, so no image checkpoint: a crash now leaves them all in the ring.
    drop(engine);
    let order = std::cell::RefCell::new(Vec::new());
    let mut images = Vec::new();
    let reopened = Journal::open_with_images(
        vec![Arc::clone(&journal_drive)],
        CONTROLLER,
        1,
        trusted,
        &mut |_| {
            order.borrow_mut().push("record");
            Ok(())
        },
        &mut |image| {
            order.borrow_mut().push("image");
            images.push(image.clone());
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(reopened.replay_report().images, images.len() as u64);
    assert!(images.len() >= 3, "one image per row write at least: {}", images.len());
    let order = order.into_inner();
    let first_record = order.iter().position(|&kind| kind == "record").unwrap_or(order.len());
    assert!(order[first_record..].iter().all(|&kind| kind == "record"), "images first: {order:?}");
    for image in &images {
        assert_eq!(image.vd_id, 3);
        assert!(image.writes.len() >= 2, "data and parity: {image:?}");
        for (member, offset_bytes, bytes) in &image.writes {
            let done = crate::metadata::submit_and_wait(
                &*members[*member as usize],
                drive::DriveOp::Read { offset_bytes: *offset_bytes, buf: drive::IoBuf::zeroed(bytes.len()) },
            )
            .unwrap();
            assert!(done.buf.unwrap().as_slice() == &bytes[..], "row {} member {member} at {offset_bytes}: not what it took", image.row);
        }
    }
    let refused = Journal::open(vec![journal_drive], CONTROLLER, 1, trusted, &mut |_| Ok(())).err().expect("refused");
    assert!(refused.contains("row image"), "{refused}");
}
