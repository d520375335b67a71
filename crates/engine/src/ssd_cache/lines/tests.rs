use super::*;
use crate::ssd_cache::map::SlotEntry;
use dirty::TableWaiter;

const VD: u64 = 7;

fn lines(slots: u32) -> Lines {
    let mut lines = Lines::new(slots, false);
    lines.attach(VD, 0);
    lines
}

fn write_back_lines(slots: u32) -> Lines {
    let mut lines = Lines::new(slots, true);
    lines.attach(VD, 0);
    lines
}

/// Runs every table write that is due to its end, as the cache does, with `ok`; returns the
/// images written.
fn write_table(lines: &mut Lines, ok: bool) -> Vec<TableStart> {
    let mut written = Vec::new();
    loop {
        let starts = lines.table_starts();
        if starts.is_empty() {
            return written;
        }
        for start in starts {
            for waiter in lines.table_written(start.block, start.generation, ok) {
                waiter(ok);
            }
            written.push(start);
        }
    }
}

/// Promotes line `n` of the VD: two misses, a fill that succeeds.
fn promote(lines: &mut Lines, n: u64) {
    assert!(!lines.note_miss((VD, n)));
    assert!(lines.note_miss((VD, n)));
    lines.begin_fill((VD, n)).expect("a slot");
    assert!(lines.end_fill((VD, n), true));
    lines.check();
}

/// Writes line `n` back (it must be held): dirty, its writer done.
fn make_dirty(lines: &mut Lines, n: u64) {
    let (action, _) = lines.begin_write_back((VD, n));
    assert!(matches!(action, WriteAction::Update(_)), "line {n} is held");
    lines.end_write((VD, n), action, true);
}

#[test]
fn a_line_is_promoted_on_its_second_miss_and_then_served() {
    let mut lines = lines(4);
    assert!(lines.begin_read(&[(VD, 1)]).is_none());
    promote(&mut lines, 1);
    let slots = lines.begin_read(&[(VD, 1)]).expect("a hit");
    lines.end_read((VD, 1), true);
    assert_eq!(slots.len(), 1);
    assert_eq!(lines.valid_count(), 1);
}

#[test]
fn a_scan_of_lines_read_once_evicts_nothing() {
    let mut lines = lines(4);
    for n in 0..4 {
        promote(&mut lines, n);
    }
    for n in 100..10_000 {
        assert!(!lines.note_miss((VD, n)), "a line read once is never promoted");
    }
    assert_eq!(lines.valid_count(), 4);
    assert!(lines.ghosts.len() <= lines.ghosts_max);
    lines.check();
}

#[test]
fn a_line_missed_again_outlives_its_old_ghost_entry() {
    let mut lines = lines(4);
    assert_eq!(lines.ghosts_max, 16);
    assert!(!lines.note_miss((VD, 1)) && lines.note_miss((VD, 1)), "promoted: its entry stays behind");
    assert!(!lines.note_miss((VD, 1)), "not filled, missed again: remembered anew");
    for n in 100..115 {
        lines.note_miss((VD, n));
    }
    // The old entry of line 1 has just left the queue; its new one has not.
    assert!(lines.ghosts.iter().all(|(key, miss)| *key != (VD, 1) || *miss != 1));
    lines.check();
    assert!(lines.note_miss((VD, 1)), "still remembered: its second miss promotes it");
}

#[test]
fn the_least_recently_used_idle_line_is_evicted() {
    let mut lines = lines(3);
    for n in 0..3 {
        promote(&mut lines, n);
    }
    // Line 0 is used again, line 1 is being read: line 2 is the one to go.
    lines.begin_read(&[(VD, 0)]).unwrap();
    lines.end_read((VD, 0), true);
    lines.begin_read(&[(VD, 1)]).unwrap();
    promote(&mut lines, 9);
    assert!(lines.begin_read(&[(VD, 2)]).is_none(), "line 2 was evicted");
    assert!(lines.begin_read(&[(VD, 0)]).is_some());
    assert_eq!(lines.evictions, 1);
    lines.check();
}

#[test]
fn a_write_during_a_fill_poisons_it_and_a_write_in_flight_blocks_one() {
    let mut lines = lines(4);
    lines.note_miss((VD, 1));
    lines.note_miss((VD, 1));
    lines.begin_fill((VD, 1)).unwrap();
    assert_eq!(lines.begin_write((VD, 1)), WriteAction::Skip);
    lines.end_write((VD, 1), WriteAction::Skip, true);
    assert!(!lines.end_fill((VD, 1), true), "the fill read the VD before the write");
    assert!(lines.begin_read(&[(VD, 1)]).is_none());
    lines.check();
    // A write in flight: no fill starts (it could read the VD before the write lands).
    assert_eq!(lines.begin_write((VD, 2)), WriteAction::Skip);
    lines.note_miss((VD, 2));
    assert!(lines.note_miss((VD, 2)));
    assert!(lines.begin_fill((VD, 2)).is_none());
    lines.end_write((VD, 2), WriteAction::Skip, true);
    assert!(lines.note_miss((VD, 2)), "remembered as missed: the next miss promotes it");
    assert!(lines.begin_fill((VD, 2)).is_some());
    lines.check();
}

#[test]
fn one_writer_updates_a_line_and_a_second_makes_it_stale() {
    let mut lines = lines(4);
    promote(&mut lines, 1);
    let first = lines.begin_write((VD, 1));
    assert!(matches!(first, WriteAction::Update(_)));
    assert_eq!(lines.begin_write((VD, 1)), WriteAction::Skip);
    assert!(lines.begin_read(&[(VD, 1)]).is_none(), "stale while two writes are in flight");
    lines.end_write((VD, 1), WriteAction::Skip, true);
    lines.end_write((VD, 1), first, true);
    assert!(lines.entries.is_empty(), "the stale line left once idle");
    assert_eq!(lines.free.len(), 4);
    lines.check();
}

#[test]
fn a_saved_map_installs_into_free_slots_once() {
    let mut lines = lines(4);
    promote(&mut lines, 1);
    let slot = lines.begin_read(&[(VD, 1)]).unwrap()[0];
    let mut fresh = self::lines(4);
    let saved = ((VD, 1), slot, false);
    let taken = ((VD, 9), slot, false);
    let dirty = ((VD, 6), 2, true);
    let installed = fresh.install(&[saved, ((VD, 2), 3, false), taken, ((VD, 5), 7, false), dirty]);
    assert_eq!(installed, 2, "a slot taken twice or out of range is skipped, and a dirty line by a write-through cache");
    assert!(fresh.begin_read(&[(VD, 1)]).is_some() && fresh.begin_read(&[(VD, 2)]).is_some());
    assert_eq!(fresh.free.len(), 2);
    fresh.check();
    fresh.freeze();
    assert!(fresh.note_miss((VD, 3)) || fresh.note_miss((VD, 3)));
    assert_eq!(fresh.begin_fill((VD, 3)), None, "frozen: no fill starts");
}

#[test]
fn failures_and_detaching_drop_lines_only_once_idle() {
    let mut lines = lines(4);
    promote(&mut lines, 1);
    promote(&mut lines, 2);
    lines.begin_read(&[(VD, 1)]).unwrap();
    lines.end_read((VD, 1), false);
    assert!(lines.begin_read(&[(VD, 1)]).is_none(), "a failed cache read drops the line");
    let update = lines.begin_write((VD, 2));
    lines.end_write((VD, 2), update, false);
    assert_eq!(lines.valid_count(), 0, "a failed update drops the line");
    promote(&mut lines, 3);
    lines.begin_read(&[(VD, 3)]).unwrap();
    lines.detach(VD);
    assert_eq!(lines.valid_count(), 0);
    assert!(!lines.note_miss((VD, 4)) && !lines.note_miss((VD, 4)), "a detached VD's lines are not promoted");
    lines.end_read((VD, 3), true);
    assert_eq!(lines.free.len(), 4);
    lines.check();
}

#[test]
fn a_write_back_write_dirties_a_held_line_and_waits_for_the_table_once() {
    let mut lines = write_back_lines(200);
    promote(&mut lines, 1);
    let (action, wait) = lines.begin_write_back((VD, 1));
    let WriteAction::Update(slot) = action else { panic!("a held line is written on the cache VD") };
    let (block, generation) = wait.expect("the table does not say dirty yet");
    // A second write meanwhile: written too (one copy: no order to keep), same table write.
    let (second, second_wait) = lines.begin_write_back((VD, 1));
    assert_eq!(second, WriteAction::Update(slot));
    assert_eq!(second_wait.map(|w| w.0), Some(block));
    lines.check();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for wait in [Some((block, generation)), second_wait].into_iter().flatten() {
        let acked = std::sync::Arc::clone(&acked);
        let waiter: TableWaiter = Box::new(move |ok| {
            assert!(ok);
            acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        assert!(lines.table_wait(wait.0, wait.1, waiter).is_none(), "not written yet");
    }
    let images = write_table(&mut lines, true);
    assert_eq!(acked.load(std::sync::atomic::Ordering::SeqCst), 2);
    let image = &images[0].image[slot as usize % 128];
    assert_eq!(*image, Some(SlotEntry { vd_id: 0, line: 1, dirty: true }), "the table names the dirty line");
    lines.end_write((VD, 1), action, true);
    lines.end_write((VD, 1), second, true);
    // Durable now: the next write to the line waits for nothing.
    let (again, wait) = lines.begin_write_back((VD, 1));
    assert_eq!(wait, None);
    lines.end_write((VD, 1), again, true);
    // A line not held is written around; it is not dirty.
    assert_eq!(lines.begin_write_back((VD, 2)), (WriteAction::Skip, None));
    lines.end_write((VD, 2), WriteAction::Skip, true);
    assert_eq!(lines.dirty_count(), 1);
    lines.check();
}

#[test]
fn a_dirty_line_is_never_evicted_and_its_slot_is_reused_only_once_the_table_says_clean() {
    let mut lines = write_back_lines(2);
    promote(&mut lines, 1);
    promote(&mut lines, 2);
    make_dirty(&mut lines, 1);
    write_table(&mut lines, true);
    for n in [3, 4] {
        assert!(lines.note_miss((VD, n)) || lines.note_miss((VD, n)));
        let slot = lines.begin_fill((VD, n)).expect("line 2 is clean and idle: evicted");
        assert!(lines.end_fill((VD, n), true));
        assert_ne!(Some(slot), lines.slot_keys.iter().position(|k| *k == Some((VD, 1))).map(|s| s as u32));
    }
    assert!(lines.begin_read(&[(VD, 1)]).is_some(), "the dirty line stayed");
    lines.end_read((VD, 1), false);
    assert!(lines.any_dirty(&[(VD, 1)]), "a failed read of a dirty line does not drop it");
    // Destaged, but the table still says dirty: not evictable yet.
    let destage = lines.begin_destage(None, 8);
    assert_eq!(destage.len(), 1);
    assert!(lines.end_destage(destage[0], true));
    lines.check();
    let starts = lines.table_starts();
    assert_eq!(starts.len(), 1);
    assert!(lines.note_miss((VD, 5)) || lines.note_miss((VD, 5)));
    assert_ne!(lines.begin_fill((VD, 5)), Some(destage[0].slot), "the other clean line goes first");
    assert!(lines.end_fill((VD, 5), true));
    assert!(lines.note_miss((VD, 6)) || lines.note_miss((VD, 6)));
    assert_ne!(lines.begin_fill((VD, 6)), Some(destage[0].slot), "line 1 waits for the table; line 5 goes");
    assert!(lines.end_fill((VD, 6), true));
    for start in starts {
        lines.table_written(start.block, start.generation, true);
    }
    assert!(lines.note_miss((VD, 7)) || lines.note_miss((VD, 7)));
    assert_eq!(lines.begin_fill((VD, 7)), Some(destage[0].slot), "clean in the table: line 1, the oldest, goes now");
    lines.check();
}

#[test]
fn a_write_during_a_destage_keeps_the_line_dirty() {
    let mut lines = write_back_lines(4);
    promote(&mut lines, 1);
    make_dirty(&mut lines, 1);
    let destage = lines.begin_destage(None, 8);
    assert_eq!(lines.begin_destage(None, 8).len(), 0, "a line destages once at a time");
    let (during, _) = lines.begin_write_back((VD, 1));
    lines.end_write((VD, 1), during, true);
    assert!(!lines.end_destage(destage[0], true), "a write came: still dirty");
    assert_eq!(lines.dirty_count(), 1);
    // A write in flight: no destage starts (it could read the slot half written).
    let (in_flight, _) = lines.begin_write_back((VD, 1));
    assert!(lines.begin_destage(None, 8).is_empty());
    lines.end_write((VD, 1), in_flight, true);
    let destage = lines.begin_destage(None, 8);
    assert!(lines.end_destage(destage[0], true));
    assert_eq!(lines.dirty_count(), 0);
    lines.check();
}

#[test]
fn destages_go_in_lba_order_from_a_cursor() {
    let mut lines = write_back_lines(16);
    for n in [9, 3, 12, 5] {
        promote(&mut lines, n);
        make_dirty(&mut lines, n);
    }
    let first: Vec<u64> = lines.begin_destage(None, 2).iter().map(|d| d.key.1).collect();
    assert_eq!(first, vec![3, 5]);
    let next: Vec<u64> = lines.begin_destage(None, 8).iter().map(|d| d.key.1).collect();
    assert_eq!(next, vec![9, 12], "from where the last batch stopped");
}

#[test]
fn a_discarded_dirty_line_frees_its_slot_only_after_the_table_write() {
    let mut lines = write_back_lines(1);
    promote(&mut lines, 1);
    make_dirty(&mut lines, 1);
    write_table(&mut lines, true);
    lines.detach(VD);
    assert!(lines.free.is_empty(), "the table still says dirty");
    lines.check();
    // A failed table write frees nothing either.
    write_table(&mut lines, false);
    assert!(lines.free.is_empty());
    lines.table.request(0);
    write_table(&mut lines, true);
    assert_eq!(lines.free, vec![0]);
    lines.check();
}

#[test]
fn a_write_after_a_destage_waits_for_a_table_write_after_the_clean_one_in_flight() {
    let mut lines = write_back_lines(4);
    promote(&mut lines, 1);
    make_dirty(&mut lines, 1);
    write_table(&mut lines, true);
    // Destaged: the table write that says clean starts.
    let destage = lines.begin_destage(None, 8);
    assert!(lines.end_destage(destage[0], true));
    let clean = lines.table_starts();
    assert_eq!(clean[0].image[destage[0].slot as usize], Some(SlotEntry { vd_id: 0, line: 1, dirty: false }));
    // Written again while the clean write is in flight: the disk says dirty now, but will say
    // clean once it lands; the write must wait for the next one.
    let (again, wait) = lines.begin_write_back((VD, 1));
    let (block, generation) = wait.expect("a wait: the write in flight says clean");
    assert!(generation > clean[0].generation);
    for start in clean {
        lines.table_written(start.block, start.generation, true);
    }
    let next = lines.table_starts();
    assert_eq!((next[0].block, next[0].generation), (block, generation));
    assert_eq!(next[0].image[destage[0].slot as usize], Some(SlotEntry { vd_id: 0, line: 1, dirty: true }));
    lines.end_write((VD, 1), again, true);
    lines.check();
}

#[test]
fn a_repair_drops_clean_lines_poisons_fills_and_keeps_dirty_lines() {
    let mut lines = write_back_lines(200);
    promote(&mut lines, 1);
    promote(&mut lines, 2);
    make_dirty(&mut lines, 2);
    lines.note_miss((VD, 3));
    lines.note_miss((VD, 3));
    lines.begin_fill((VD, 3)).unwrap();
    for n in 1..=4 {
        lines.begin_repair((VD, n));
    }
    assert!(lines.begin_read(&[(VD, 1)]).is_none(), "a clean line is not served across a repair");
    assert!(!lines.end_fill((VD, 3), true), "a fill that read the VD before the repair is dropped");
    lines.note_miss((VD, 4));
    assert!(lines.note_miss((VD, 4)), "a second miss would promote it");
    assert!(lines.begin_fill((VD, 4)).is_none(), "no fill starts while the repair runs");
    let slots = lines.begin_read(&[(VD, 2)]).expect("a dirty line is newer than the repair and stays");
    lines.end_read((VD, 2), true);
    assert_eq!(slots.len(), 1);
    for n in 1..=4 {
        lines.end_repair((VD, n));
    }
    assert_eq!(lines.dirty_count(), 1);
    lines.check();
}
