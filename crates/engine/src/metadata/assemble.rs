//! Which configuration to run, from the superblocks found on a scan. Pure: no I/O.
//!
//! The rules (also in docs/on-disk-format.md, "Assembly"):
//! 1. Superblocks are grouped by controller id.
//! 2. In each group the newest generation wins; its configuration is taken from the drive with
//!    the lowest index among those at that generation. Drives at an older generation are
//!    stale (they missed changes: a failed, offline or pulled member). Drives at the newest
//!    generation whose configuration differs are conflicting (storc never writes that; it
//!    means two controllers shared an id).
//! 3. Our group is the one with our controller id. With no id of our own (a first start, or
//!    a controller whose id was lost), the only id present is adopted; with several, none is,
//!    because picking one would silently choose between two arrays: all are foreign then.
//! 4. Every other group is a foreign configuration, which the user may import or clear.
//!
//! Drives without metadata never reach this function: the caller lists them as unconfigured.

use super::Superblock;
use crate::config::{ControllerConfig, ControllerId, DriveId};
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// A drive whose superblock is older than its controller's newest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleDrive {
    pub drive_index: usize,
    pub drive_id: DriveId,
    pub slot: u32,
    pub generation: u64,
}

/// The drives of one controller id and the configuration they agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigGroup {
    pub controller_id: ControllerId,
    /// The newest generation's configuration.
    pub config: ControllerConfig,
    /// Drives (caller's indexes, ascending) whose superblock has that generation and config.
    pub current: Vec<usize>,
    /// Drives with an older generation, newest first.
    pub stale: Vec<StaleDrive>,
    /// Drives with the newest generation but another configuration, ascending.
    pub conflicting: Vec<usize>,
}

/// The outcome of a scan: our configuration, if any, and every foreign one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembly {
    pub ours: Option<ConfigGroup>,
    /// Ordered by controller id.
    pub foreign: Vec<ConfigGroup>,
}

/// Assembles the superblocks found on a scan, each with the caller's index of its drive.
/// `ours` is this controller's id, or `None` when it has none yet (see the module rules).
pub fn assemble(ours: Option<ControllerId>, found: Vec<(usize, Superblock)>) -> Assembly {
    let mut by_controller: BTreeMap<ControllerId, Vec<(usize, Superblock)>> = BTreeMap::new();
    for (drive_index, superblock) in found {
        by_controller.entry(superblock.controller_id).or_default().push((drive_index, superblock));
    }
    let adopted = match ours {
        Some(id) => Some(id),
        None if by_controller.len() == 1 => by_controller.keys().next().copied(),
        None => None,
    };
    let ours = adopted.and_then(|id| by_controller.remove(&id)).map(group);
    let foreign = by_controller.into_values().map(group).collect();
    Assembly { ours, foreign }
}

/// Splits one controller's drives into current, stale and conflicting.
fn group(mut drives: Vec<(usize, Superblock)>) -> ConfigGroup {
    assert!(!drives.is_empty(), "a group has at least one drive");
    drives.sort_by_key(|(drive_index, sb)| (Reverse(sb.generation), *drive_index));
    let (_, newest) = &drives[0];
    let (controller_id, config) = (newest.controller_id, newest.config.clone());
    let mut current = Vec::new();
    let mut stale = Vec::new();
    let mut conflicting = Vec::new();
    for (drive_index, sb) in &drives {
        debug_assert_eq!(sb.controller_id, controller_id);
        if sb.generation < config.generation {
            stale.push(StaleDrive { drive_index: *drive_index, drive_id: sb.drive_id, slot: sb.slot, generation: sb.generation });
        } else if sb.config == config {
            current.push(*drive_index);
        } else {
            conflicting.push(*drive_index);
        }
    }
    ConfigGroup { controller_id, config, current, stale, conflicting }
}
