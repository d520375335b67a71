//! Which hot spare takes over a failed member: MegaRAID's rule. A spare dedicated to the VD's
//! drive group first, then a global one; among those, the smallest that holds the VD's member
//! size (so that big spares stay for big VDs); lowest slot on a tie. Pure: no I/O, no state.

use crate::config::{ControllerConfig, DriveState, VdRecord};

/// A spare that can take over, or why none can (for the event that says the VD stays degraded).
pub(crate) fn choose_spare(config: &ControllerConfig, vd: &VdRecord, capacity_of: impl Fn(u32) -> Option<u64>) -> Result<u32, String> {
    let ready: Vec<(u32, bool)> = config
        .hot_spares
        .iter()
        .filter(|h| h.dedicated_drive_groups.is_empty() || h.dedicated_drive_groups.contains(&vd.drive_group))
        .filter(|h| config.drives.iter().any(|d| d.slot == h.slot && d.state == DriveState::HotSpare))
        .map(|h| (h.slot, !h.dedicated_drive_groups.is_empty()))
        .collect();
    if ready.is_empty() {
        return Err(format!("no hot spare serves drive group {} (global or dedicated)", vd.drive_group));
    }
    let fitting = ready
        .iter()
        .filter_map(|&(slot, dedicated)| capacity_of(slot).map(|bytes| (slot, dedicated, bytes)))
        .filter(|&(_, _, bytes)| bytes >= vd.member_size_bytes);
    // Dedicated before global, then the smallest that fits, then the lowest slot.
    let best = fitting.min_by_key(|&(slot, dedicated, bytes)| (!dedicated, bytes, slot));
    best.map(|(slot, _, _)| slot).ok_or_else(|| {
        let sizes: Vec<String> = ready
            .iter()
            .map(|&(slot, _)| match capacity_of(slot) {
                Some(bytes) => format!("slot {slot} has {bytes} bytes"),
                None => format!("slot {slot} is not present"),
            })
            .collect();
        format!("no hot spare fits: v{} needs {} bytes per member; {}", vd.vd_id, vd.member_size_bytes, sizes.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ControllerId, DriveId, DriveRecord, HotSpareRecord, IoPolicy, ReadPolicy, WritePolicy};
    use layout::Level;

    const GIB: u64 = 1 << 30;

    fn config(spares: &[(u32, &[u32], u64)]) -> (ControllerConfig, VdRecord, Vec<(u32, u64)>) {
        let vd = VdRecord {
            vd_id: 0,
            drive_group: 0,
            name: "db".into(),
            level: Level::Raid5,
            strip_size_bytes: 64 << 10,
            drives_per_span: 3,
            member_slots: vec![0, 1, 2],
            write_policy: WritePolicy::WriteThrough,
            read_policy: ReadPolicy::NoReadAhead,
            io_policy: IoPolicy::Direct,
            member_size_bytes: 8 * GIB,
            bad_blocks: Vec::new(),
            bgi_pending: false,
            cache_vd: false,
            cache_write_back: false,
            ssd_cache_vd_id: None,
            seq_cutoff: crate::config::SeqCutoff::LevelDefault,
        };
        let mut drives: Vec<DriveRecord> = (0..3)
            .map(|slot| DriveRecord {
                slot,
                drive_id: DriveId(slot.into()),
                state: DriveState::Online,
                capacity_bytes: 8 * GIB,
                rebuild_row: 0,
                copy_slot: None,
            })
            .collect();
        let mut hot_spares = Vec::new();
        let mut capacities = Vec::new();
        for &(slot, groups, bytes) in spares {
            drives.push(DriveRecord {
                slot,
                drive_id: DriveId(slot.into()),
                state: DriveState::HotSpare,
                capacity_bytes: bytes,
                rebuild_row: 0,
                copy_slot: None,
            });
            hot_spares.push(HotSpareRecord { slot, dedicated_drive_groups: groups.to_vec() });
            capacities.push((slot, bytes));
        }
        let config = ControllerConfig {
            controller_id: ControllerId(1),
            generation: 1,
            drives,
            vds: vec![vd.clone()],
            hot_spares,
            settings: Default::default(),
        };
        (config, vd, capacities)
    }

    fn check(spares: &[(u32, &[u32], u64)], expected: Result<u32, &str>) {
        let (config, vd, capacities) = config(spares);
        let capacity_of = |slot: u32| capacities.iter().find(|(s, _)| *s == slot).map(|(_, bytes)| *bytes);
        assert_eq!(choose_spare(&config, &vd, capacity_of), expected.map_err(str::to_string), "{spares:?}");
    }

    #[test]
    fn dedicated_first_then_the_smallest_global_that_fits() {
        check(&[(7, &[], 8 * GIB)], Ok(7));
        check(&[(7, &[], 16 * GIB), (8, &[], 8 * GIB)], Ok(8));
        check(&[(7, &[], 8 * GIB), (8, &[0], 16 * GIB)], Ok(8));
        check(&[(7, &[], 8 * GIB), (8, &[1], 8 * GIB)], Ok(7));
        check(&[(9, &[], 8 * GIB), (7, &[], 8 * GIB)], Ok(7));
    }

    #[test]
    fn no_spare_says_why() {
        check(&[], Err("no hot spare serves drive group 0 (global or dedicated)"));
        check(&[(8, &[1], 8 * GIB)], Err("no hot spare serves drive group 0 (global or dedicated)"));
        check(&[(7, &[], 4 * GIB)], Err("no hot spare fits: v0 needs 8589934592 bytes per member; slot 7 has 4294967296 bytes"));
    }
}
