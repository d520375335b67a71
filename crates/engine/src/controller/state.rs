//! The drive state machine: every state a drive can be in, and every change of state with its
//! cause, in one table ([`TRANSITIONS`]). [`check`] answers whether a change is allowed and why
//! not; `Controller::transition` is the only code that changes a drive's state: it asserts the
//! change is in the table (one that is not is a bug, and panics naming the slot, the states and
//! the cause) and records an event for it. An administrator's command that the table refuses is
//! answered with a [`ControlError`](super::ControlError) naming what is allowed, before anything
//! changes.
//!
//! It lives in `controller/`, not beside `vd.rs`, because it is the *controller's* machine: it
//! covers drives in no VD (UGood, hot spares, UBad) and changes the configuration written to
//! the members. The engine's own view of a member (`vd::MemberState`: in service or not) is
//! derived from it.
//!
//! | from | to | cause |
//! |---|---|---|
//! | UGood | Onln | VD created |
//! | UGood | HSP | made a hot spare |
//! | UGood | Msng | not found at start |
//! | UGood | Rbld | rebuild started |
//! | UGood | Cpybck | copyback started |
//! | HSP | UGood | hot spare removed |
//! | HSP | UGood | its VD deleted |
//! | HSP | Msng | not found at start |
//! | HSP | Rbld | rebuild started |
//! | HSP | Cpybck | copyback started |
//! | Onln | Offln | set offline |
//! | Onln | Failed | I/O failure |
//! | Onln | Failed | smaller than its VD's member size |
//! | Onln | Msng | set missing |
//! | Onln | Msng | I/O failure |
//! | Onln | Msng | not found at start |
//! | Onln | UGood | its VD deleted |
//! | Onln | UGood | copyback done |
//! | Onln | HSP | copyback done |
//! | Offln | Onln | set online |
//! | Offln | Msng | set missing |
//! | Offln | Msng | not found at start |
//! | Offln | UGood | its VD deleted |
//! | Offln | UGood | set good |
//! | Offln | UGood | replaced |
//! | Offln | Rbld | rebuild started |
//! | Failed | Onln | set online |
//! | Failed | Msng | set missing |
//! | Failed | Msng | not found at start |
//! | Failed | UBad | its VD deleted |
//! | Failed | UBad | replaced |
//! | Failed | UGood | set good |
//! | Failed | Rbld | rebuild started |
//! | Msng | Onln | set online |
//! | Msng | Failed | found again at start |
//! | Msng | UGood | found again at start |
//! | Msng | HSP | found again at start |
//! | Msng | Rbld | rebuild started |
//! | Rbld | Onln | rebuild done |
//! | Rbld | Failed | I/O failure |
//! | Rbld | Msng | not found at start |
//! | Rbld | UGood | its VD deleted |
//! | Cpybck | Onln | copyback done |
//! | Cpybck | UBad | I/O failure |
//! | Cpybck | Msng | not found at start |
//! | Cpybck | UGood | its VD deleted |
//! | Cpybck | HSP | its VD deleted |
//! | Cpybck | UGood | copyback stopped |
//! | Cpybck | HSP | copyback stopped |
//! | Cpybck | Rbld | rebuild started |
//! | UBad | UGood | set good |
//! | UGood | Jrnl | made the journal |
//! | Jrnl | UGood | journal replaced |
//! | Jrnl | UGood | journal removed |
//! | Jrnl | UBad | I/O failure |
//! | Jrnl | Msng | not found at start |
//! | UGood | Mgrt | migration started |
//! | Mgrt | Onln | migration done |
//! | Onln | UGood | migration done |
//! | Mgrt | UGood | migration stopped |
//! | Mgrt | UGood | its VD deleted |
//! | Mgrt | UBad | I/O failure |
//! | Mgrt | Msng | not found at start |
//!
//! `HSP` is one state; whether the spare is global (GHS) or dedicated (DHS) is whether its hot
//! spare record lists drive groups, and the CLI and API show it so.
//!
//! Choices beyond DESIGN.md's table, following what a MegaRAID does:
//! - A member recorded missing that is found again comes back Failed: it missed the writes made
//!   while it was gone. A spare comes back a spare, a drive in no VD UGood.
//! - When a VD is deleted, its Failed members become UBad, not UGood: a drive that failed stays
//!   suspect until the administrator says otherwise with `set good`. Members that were Onln,
//!   Offln (taken out by the administrator, not by errors), Rbld or Cpybck become UGood; a
//!   Missing member stays Msng, and is UGood when it is found again.
//! - `set good` makes a UBad, Failed or Offln drive in no VD UGood. There is no `set bad`
//!   (storcli has none): a drive becomes UBad only by failing.
//! - A UBad drive that is not found at start stays UBad: Msng would forget that it is bad, and
//!   it would come back UGood.
//! - Failed and UBad drives get no metadata writes: a failing drive may not take writes, and the
//!   configuration on the others already says what it is.
//! - A copy target (`Cpybck`) is in no VD until the copy is done, so when it fails it becomes
//!   UBad, and when the copy is stopped, or its VD deleted, it returns to what it was: UGood, or
//!   HSP when it was a hot spare (it keeps its hot spare record while it copies). When the
//!   member it copies leaves service, the target takes the member's place and is rebuilt (Rbld).
//! - At the end of a copy the source leaves the VD: a spare serving as a member (it kept its hot
//!   spare record: a revertible spare) returns to HSP, any other member becomes UGood.
//! - A journal drive (`Jrnl`, `/c0/sN set journal`) holds the cache's journal past its
//!   metadata area. It returns to UGood when another journal replaces it or the journal is removed; a leg that fails
//!   becomes UBad (as a failed copy target does). One that is not found at start is Msng and,
//!   found again, UGood: the journal ran without it, so what it holds is never replayed (the
//!   metadata stopped trusting it), and it is assigned again only by the administrator.

use super::DriveCommand;
use crate::config::{ControllerConfig, DriveState};
use std::fmt;

use DriveState::{
    Copyback as Cpybck, Failed, HotSpare as Hsp, Journal as Jrnl, Migrate as Mgrt, Missing as Msng, Offline as Offln, Online as Onln,
    Rebuild as Rbld, UnconfiguredBad as UBad, UnconfiguredGood as UGood,
};

/// Why a drive changes state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The administrator created a VD on the drive.
    VdCreated,
    /// The administrator deleted the drive's VD (or the drive group a spare was dedicated to).
    VdDeleted,
    /// The administrator made the drive a hot spare.
    SpareAdded,
    /// The administrator removed the hot spare.
    SpareRemoved,
    /// `/c0/sN set offline|online|missing|good`.
    Command(DriveCommand),
    /// The engine took the member out after an I/O error.
    IoFailure,
    /// Assembly: a drive the configuration records did not show up.
    Absent,
    /// Assembly: a drive recorded missing showed up again.
    Returned,
    /// Assembly: the member is smaller than its VD's recorded member size.
    Shrunk,
    /// A rebuild onto the drive began.
    RebuildStarted,
    /// A rebuild finished: every row is current.
    RebuildDone,
    /// A copy onto the drive began (copyback to the replaced slot, or proactive replacement).
    CopybackStarted,
    /// A copy finished: the target is a member, the source leaves the VD.
    CopybackDone,
    /// A copy ended before its end (the administrator stopped it, or it could not go on): the
    /// target returns to what it was.
    CopybackStopped,
    /// Another drive took the member's place in its VD.
    Replaced,
    /// The administrator made the drive the journal, or a leg of it (`/c0/sN set journal`).
    JournalAssigned,
    /// Another journal took the drive's place.
    JournalReplaced,
    /// The administrator removed the journal (`/c0/journal delete`).
    JournalRemoved,
    /// A migration of a whole VD onto the drive began (`/c0/vN start migrate`).
    MigrationStarted,
    /// A migration finished: the VD is a JBOD of the target, its old members leave it.
    MigrationDone,
    /// A migration ended before its end (stopped by the administrator, or it could not go on).
    MigrationStopped,
}

impl Cause {
    pub const ALL: [Cause; 24] = [
        Cause::VdCreated,
        Cause::VdDeleted,
        Cause::SpareAdded,
        Cause::SpareRemoved,
        Cause::Command(DriveCommand::Offline),
        Cause::Command(DriveCommand::Online),
        Cause::Command(DriveCommand::Missing),
        Cause::Command(DriveCommand::Good),
        Cause::IoFailure,
        Cause::Absent,
        Cause::Returned,
        Cause::Shrunk,
        Cause::RebuildStarted,
        Cause::RebuildDone,
        Cause::CopybackStarted,
        Cause::CopybackDone,
        Cause::CopybackStopped,
        Cause::Replaced,
        Cause::JournalAssigned,
        Cause::JournalReplaced,
        Cause::JournalRemoved,
        Cause::MigrationStarted,
        Cause::MigrationDone,
        Cause::MigrationStopped,
    ];

    /// How events and the table in the module docs name the cause.
    pub fn description(self) -> &'static str {
        match self {
            Cause::VdCreated => "VD created",
            Cause::VdDeleted => "its VD deleted",
            Cause::SpareAdded => "made a hot spare",
            Cause::SpareRemoved => "hot spare removed",
            Cause::Command(command) => command.cli_words(),
            Cause::IoFailure => "I/O failure",
            Cause::Absent => "not found at start",
            Cause::Returned => "found again at start",
            Cause::Shrunk => "smaller than its VD's member size",
            Cause::RebuildStarted => "rebuild started",
            Cause::RebuildDone => "rebuild done",
            Cause::CopybackStarted => "copyback started",
            Cause::CopybackDone => "copyback done",
            Cause::CopybackStopped => "copyback stopped",
            Cause::Replaced => "replaced",
            Cause::JournalAssigned => "made the journal",
            Cause::JournalReplaced => "journal replaced",
            Cause::JournalRemoved => "journal removed",
            Cause::MigrationStarted => "migration started",
            Cause::MigrationDone => "migration done",
            Cause::MigrationStopped => "migration stopped",
        }
    }
}

impl DriveCommand {
    /// The CLI's words for the command.
    pub fn cli_words(self) -> &'static str {
        match self {
            DriveCommand::Offline => "set offline",
            DriveCommand::Online => "set online",
            DriveCommand::Missing => "set missing",
            DriveCommand::Good => "set good",
        }
    }

    /// The state the command leads to.
    pub fn target(self) -> DriveState {
        match self {
            DriveCommand::Offline => Offln,
            DriveCommand::Online => Onln,
            DriveCommand::Missing => Msng,
            DriveCommand::Good => UGood,
        }
    }

    /// The drives the command applies to, as the administrator is told when it is refused. A
    /// unit test checks that the states named here are the table's.
    pub fn allowed_for(self) -> &'static str {
        match self {
            DriveCommand::Offline => "online members of a VD (Onln)",
            DriveCommand::Online => "members of a VD that are Offln, Failed or Msng",
            DriveCommand::Missing => "members of a VD that are Onln, Offln or Failed",
            DriveCommand::Good => "drives in no VD that are UBad, Failed or Offln",
        }
    }

    /// Whether the command applies to members of a VD (or else to drives in none).
    pub fn for_members(self) -> bool {
        self != DriveCommand::Good
    }
}

/// Every allowed change of a drive's state: (from, to, cause). The module docs show it as a
/// table, and a unit test checks that the two agree.
pub const TRANSITIONS: &[(DriveState, DriveState, Cause)] = &[
    (UGood, Onln, Cause::VdCreated),
    (UGood, Hsp, Cause::SpareAdded),
    (UGood, Msng, Cause::Absent),
    (UGood, Rbld, Cause::RebuildStarted),
    (UGood, Cpybck, Cause::CopybackStarted),
    (Hsp, UGood, Cause::SpareRemoved),
    (Hsp, UGood, Cause::VdDeleted),
    (Hsp, Msng, Cause::Absent),
    (Hsp, Rbld, Cause::RebuildStarted),
    (Hsp, Cpybck, Cause::CopybackStarted),
    (Onln, Offln, Cause::Command(DriveCommand::Offline)),
    (Onln, Failed, Cause::IoFailure),
    (Onln, Failed, Cause::Shrunk),
    (Onln, Msng, Cause::Command(DriveCommand::Missing)),
    (Onln, Msng, Cause::IoFailure),
    (Onln, Msng, Cause::Absent),
    (Onln, UGood, Cause::VdDeleted),
    (Onln, UGood, Cause::CopybackDone),
    (Onln, Hsp, Cause::CopybackDone),
    (Offln, Onln, Cause::Command(DriveCommand::Online)),
    (Offln, Msng, Cause::Command(DriveCommand::Missing)),
    (Offln, Msng, Cause::Absent),
    (Offln, UGood, Cause::VdDeleted),
    (Offln, UGood, Cause::Command(DriveCommand::Good)),
    (Offln, UGood, Cause::Replaced),
    (Offln, Rbld, Cause::RebuildStarted),
    (Failed, Onln, Cause::Command(DriveCommand::Online)),
    (Failed, Msng, Cause::Command(DriveCommand::Missing)),
    (Failed, Msng, Cause::Absent),
    (Failed, UBad, Cause::VdDeleted),
    (Failed, UBad, Cause::Replaced),
    (Failed, UGood, Cause::Command(DriveCommand::Good)),
    (Failed, Rbld, Cause::RebuildStarted),
    (Msng, Onln, Cause::Command(DriveCommand::Online)),
    (Msng, Failed, Cause::Returned),
    (Msng, UGood, Cause::Returned),
    (Msng, Hsp, Cause::Returned),
    (Msng, Rbld, Cause::RebuildStarted),
    (Rbld, Onln, Cause::RebuildDone),
    (Rbld, Failed, Cause::IoFailure),
    (Rbld, Msng, Cause::Absent),
    (Rbld, UGood, Cause::VdDeleted),
    (Cpybck, Onln, Cause::CopybackDone),
    (Cpybck, UBad, Cause::IoFailure),
    (Cpybck, Msng, Cause::Absent),
    (Cpybck, UGood, Cause::VdDeleted),
    (Cpybck, Hsp, Cause::VdDeleted),
    (Cpybck, UGood, Cause::CopybackStopped),
    (Cpybck, Hsp, Cause::CopybackStopped),
    (Cpybck, Rbld, Cause::RebuildStarted),
    (UBad, UGood, Cause::Command(DriveCommand::Good)),
    (UGood, Jrnl, Cause::JournalAssigned),
    (Jrnl, UGood, Cause::JournalReplaced),
    (Jrnl, UGood, Cause::JournalRemoved),
    (Jrnl, UBad, Cause::IoFailure),
    (Jrnl, Msng, Cause::Absent),
    (UGood, Mgrt, Cause::MigrationStarted),
    (Mgrt, Onln, Cause::MigrationDone),
    (Onln, UGood, Cause::MigrationDone),
    (Mgrt, UGood, Cause::MigrationStopped),
    (Mgrt, UGood, Cause::VdDeleted),
    (Mgrt, UBad, Cause::IoFailure),
    (Mgrt, Msng, Cause::Absent),
];

/// A change of state the table does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub from: DriveState,
    pub to: DriveState,
    pub cause: Cause,
}

impl Refusal {
    /// The states `cause` may lead to `to` from.
    pub fn allowed_from(&self) -> Vec<DriveState> {
        TRANSITIONS.iter().filter(|(_, to, cause)| *to == self.to && *cause == self.cause).map(|(from, _, _)| *from).collect()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (from, to, cause) = (self.from.short_name(), self.to.short_name(), self.cause.description());
        let allowed: Vec<&str> = self.allowed_from().iter().map(|s| s.short_name()).collect();
        if allowed.is_empty() {
            write!(f, "{from} -> {to} is not a drive state transition: `{cause}` never leads to {to}")
        } else {
            write!(f, "{from} -> {to} is not a drive state transition: `{cause}` leads to {to} only from {}", allowed.join(", "))
        }
    }
}

/// Whether `cause` may move a drive from `from` to `to`.
///
/// # Errors
/// The [`Refusal`], which names the states `cause` leads to `to` from.
pub fn check(from: DriveState, to: DriveState, cause: Cause) -> Result<(), Refusal> {
    if TRANSITIONS.contains(&(from, to, cause)) {
        Ok(())
    } else {
        Err(Refusal { from, to, cause })
    }
}

/// The state a member leaves to when its VD is deleted, or `None` if it stays (a missing member
/// stays missing; found again, it is in no VD and so UGood).
pub(super) fn after_vd_deleted(from: DriveState) -> Option<DriveState> {
    match from {
        Msng => None,
        Failed => Some(UBad),
        _ => Some(UGood),
    }
}

/// Whether the controller writes its configuration to a drive in this state: not to one that
/// failed, which may not take writes (the other drives' configuration says it failed).
pub(super) fn takes_metadata_writes(state: DriveState) -> bool {
    !matches!(state, Failed | UBad)
}

/// One change of state made: what its event says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Transition {
    pub slot: u32,
    pub from: DriveState,
    pub to: DriveState,
    pub cause: Cause,
}

impl Transition {
    /// "slot 3: Onln -> Failed (I/O failure: ...)".
    pub(super) fn description(&self, detail: Option<&str>) -> String {
        let detail = detail.map(|d| format!(": {d}")).unwrap_or_default();
        format!("slot {}: {} -> {} ({}{detail})", self.slot, self.from.short_name(), self.to.short_name(), self.cause.description())
    }

    pub(super) fn severity(&self) -> super::Severity {
        match self.cause {
            Cause::IoFailure | Cause::Shrunk => super::Severity::Critical,
            Cause::Command(_) | Cause::Absent | Cause::Returned => super::Severity::Warning,
            _ if self.to == Failed => super::Severity::Critical,
            _ => super::Severity::Info,
        }
    }
}

/// Moves `slot` to `to` in `config`.
///
/// # Panics
/// If the slot has no drive record or the table does not allow the change: every caller has
/// checked what it asks for, so either is a bug.
pub(super) fn apply(config: &mut ControllerConfig, slot: u32, to: DriveState, cause: Cause) -> Transition {
    let record = config.drives.iter_mut().find(|d| d.slot == slot);
    let record = record.unwrap_or_else(|| panic!("slot {slot}: no drive record to move to {} ({})", to.short_name(), cause.description()));
    let from = record.state;
    if let Err(refusal) = check(from, to, cause) {
        panic!("slot {slot}: {refusal}");
    }
    record.state = to;
    Transition { slot, from, to, cause }
}

/// Undoes `transition` when its configuration could not be written: nothing may say a change
/// happened that the drives do not record. Not a transition of the table: it returns to `from`.
///
/// # Panics
/// If the drive is no longer in `transition.to`.
pub(super) fn undo(config: &mut ControllerConfig, transition: &Transition) {
    let record = config.drives.iter_mut().find(|d| d.slot == transition.slot).expect("a transition's slot has a drive record");
    assert_eq!(record.state, transition.to, "slot {}: undoing a transition the drive has left", transition.slot);
    record.state = transition.from;
}

#[cfg(test)]
mod tests;
