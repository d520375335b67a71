//! The drive state machine against an independent statement of it, and its documentation.

use super::*;
use crate::config::DriveRecord;
use crate::config::{ControllerId, DriveId};

/// The causes as one letter each, for the matrix below.
fn letter(cause: Cause) -> char {
    match cause {
        Cause::VdCreated => 'c',
        Cause::VdDeleted => 'd',
        Cause::SpareAdded => 'a',
        Cause::SpareRemoved => 'r',
        Cause::Command(DriveCommand::Offline) => 'o',
        Cause::Command(DriveCommand::Online) => 'n',
        Cause::Command(DriveCommand::Missing) => 'm',
        Cause::Command(DriveCommand::Good) => 'g',
        Cause::IoFailure => 'i',
        Cause::Absent => 'x',
        Cause::Returned => 'b',
        Cause::Shrunk => 's',
        Cause::RebuildStarted => 'R',
        Cause::RebuildDone => 'D',
        Cause::CopybackStarted => 'C',
        Cause::CopybackDone => 'K',
        Cause::CopybackStopped => 'T',
        Cause::Replaced => 'p',
        Cause::JournalAssigned => 'j',
        Cause::JournalReplaced => 'J',
        Cause::JournalRemoved => 'e',
        Cause::MigrationStarted => 'W',
        Cause::MigrationDone => 'Z',
        Cause::MigrationStopped => 'Y',
    }
}

const COLUMNS: [DriveState; 11] = [UGood, Onln, Offln, Failed, Msng, Hsp, Rbld, Cpybck, UBad, Jrnl, Mgrt];

/// The whole machine written out again, by hand and in another shape: a row per `from`, a column
/// per `to` (in [`COLUMNS`] order), each cell the letters of the causes that make that change.
#[rustfmt::skip]
const MATRIX: [(DriveState, [&str; 11]); 11] = [
    //          UGood  Onln  Offln  Failed  Msng   HSP  Rbld  Cpybck  UBad  Jrnl  Mgrt
    (UGood,  [".",   "c",  ".",   ".",    "x",   "a", "R",  "C",    ".",  "j",  "W"]),
    (Onln,   ["dKZ", ".",  "o",   "is",   "mix", "K", ".",  ".",    ".",  ".",  "."]),
    (Offln,  ["dgp", "n",  ".",   ".",    "mx",  ".", "R",  ".",    ".",  ".",  "."]),
    (Failed, ["g",   "n",  ".",   ".",    "mx",  ".", "R",  ".",    "dp", ".",  "."]),
    (Msng,   ["b",   "n",  ".",   "b",    ".",   "b", "R",  ".",    ".",  ".",  "."]),
    (Hsp,    ["rd",  ".",  ".",   ".",    "x",   ".", "R",  "C",    ".",  ".",  "."]),
    (Rbld,   ["d",   "D",  ".",   "i",    "x",   ".", ".",  ".",    ".",  ".",  "."]),
    (Cpybck, ["dT",  "K",  ".",   ".",    "x",   "dT", "R", ".",    "i",  ".",  "."]),
    (UBad,   ["g",   ".",  ".",   ".",    ".",   ".", ".",  ".",    ".",  ".",  "."]),
    (Jrnl,   ["Je",  ".",  ".",   ".",    "x",   ".", ".",  ".",    "i",  ".",  "."]),
    (Mgrt,   ["dY",  "Z",  ".",   ".",    "x",   ".", ".",  ".",    "i",  ".",  "."]),
];
fn check(from: DriveState, to: DriveState, cause: Cause, expected_allowed: bool) {
    let outcome = super::check(from, to, cause);
    let case = format!("{} -> {} ({})", from.short_name(), to.short_name(), cause.description());
    assert_eq!(outcome.is_ok(), expected_allowed, "{case}");
    if let Err(refusal) = outcome {
        assert_eq!((refusal.from, refusal.to, refusal.cause), (from, to, cause), "{case}");
        assert!(!refusal.allowed_from().contains(&from), "{case}: the refusal names only states it allows");
        let message = refusal.to_string();
        assert!(message.starts_with(&format!("{} -> {} ", from.short_name(), to.short_name())), "{case}: {message}");
    }
}

#[test]
fn every_pair_of_states_under_every_cause_is_allowed_or_refused_as_the_matrix_says() {
    assert_eq!(MATRIX.map(|(from, _)| from), COLUMNS, "a row per state, in column order");
    for (from, cells) in MATRIX {
        for (to, cell) in COLUMNS.into_iter().zip(cells) {
            for cause in Cause::ALL {
                check(from, to, cause, cell.contains(letter(cause)));
            }
        }
    }
}

#[test]
fn every_state_and_cause_is_covered() {
    for state in DriveState::ALL {
        assert!(COLUMNS.contains(&state), "{state:?} has a column");
        assert!(TRANSITIONS.iter().any(|(from, _, _)| *from == state), "{state:?} can be left");
        assert!(TRANSITIONS.iter().any(|(_, to, _)| *to == state), "{state:?} can be reached");
    }
    let letters: Vec<char> = Cause::ALL.iter().map(|c| letter(*c)).collect();
    for (index, cause) in Cause::ALL.iter().enumerate() {
        assert!(!letters[..index].contains(&letter(*cause)), "{cause:?}: letter used twice");
        assert!(TRANSITIONS.iter().any(|(_, _, c)| c == cause), "{cause:?} causes something");
    }
    for (index, entry) in TRANSITIONS.iter().enumerate() {
        assert!(!TRANSITIONS[..index].contains(entry), "{entry:?} is listed twice");
        assert_ne!(entry.0, entry.1, "{entry:?}: a transition changes the state");
    }
}

/// The table in the module docs is the table in the code.
#[test]
fn the_module_docs_table_is_the_code() {
    let source = include_str!("../state.rs");
    let documented: Vec<Vec<String>> = source
        .lines()
        .filter_map(|line| line.strip_prefix("//! |"))
        .map(|row| row.trim_end_matches('|').split('|').map(|cell| cell.trim().to_string()).collect::<Vec<_>>())
        .filter(|cells| cells[0] != "from" && !cells[0].starts_with("---"))
        .collect();
    let coded: Vec<Vec<String>> = TRANSITIONS
        .iter()
        .map(|(from, to, cause)| vec![from.short_name().to_string(), to.short_name().to_string(), cause.description().to_string()])
        .collect();
    assert_eq!(documented, coded, "state.rs module docs vs TRANSITIONS (from, to, cause)");
}

/// What an administrator is told a command applies to names exactly the states the table
/// lets that command start from.
#[test]
fn each_commands_refusal_names_the_states_the_table_allows() {
    for command in [DriveCommand::Offline, DriveCommand::Online, DriveCommand::Missing, DriveCommand::Good] {
        let named: Vec<&str> = command.allowed_for().split(|c: char| !c.is_ascii_alphanumeric()).collect();
        let mut named: Vec<DriveState> = DriveState::ALL.into_iter().filter(|s| named.contains(&s.short_name())).collect();
        let mut allowed = Refusal { from: command.target(), to: command.target(), cause: Cause::Command(command) }.allowed_from();
        named.sort_by_key(|s| s.short_name());
        allowed.sort_by_key(|s| s.short_name());
        assert_eq!(named, allowed, "{command:?}: {:?}", command.allowed_for());
        let causes: Vec<Cause> = TRANSITIONS.iter().filter(|(_, to, _)| *to != command.target()).map(|(_, _, c)| *c).collect();
        assert!(!causes.contains(&Cause::Command(command)), "{command:?} leads only to {:?}", command.target());
    }
}

#[test]
fn a_deleted_vds_members_leave_by_the_table() {
    for from in [Onln, Offln, Failed, Rbld, Cpybck] {
        let to = after_vd_deleted(from).expect("a present member leaves");
        check(from, to, Cause::VdDeleted, true);
    }
    assert_eq!(after_vd_deleted(Failed), Some(UBad), "a failed drive stays suspect");
    assert_eq!(after_vd_deleted(Msng), None, "a missing member stays missing");
}

fn config_with(state: DriveState) -> ControllerConfig {
    let drives = vec![DriveRecord { slot: 4, drive_id: DriveId(1), state, capacity_bytes: 1 << 30, rebuild_row: 0, copy_slot: None }];
    ControllerConfig {
        controller_id: ControllerId(1),
        generation: 1,
        drives,
        vds: vec![],
        hot_spares: vec![],
        settings: Default::default(),
    }
}

#[test]
fn apply_moves_the_drive_and_says_so_and_undo_moves_it_back() {
    let mut config = config_with(Onln);
    let transition = apply(&mut config, 4, Failed, Cause::IoFailure);
    assert_eq!(config.drives[0].state, Failed);
    assert_eq!(transition.description(Some("write error")), "slot 4: Onln -> Failed (I/O failure: write error)");
    assert_eq!(transition.severity(), crate::controller::Severity::Critical);
    undo(&mut config, &transition);
    assert_eq!(config.drives[0].state, Onln);
}

/// A transition outside the table is a bug: it panics naming the slot, both states and the
/// cause, and changes nothing.
#[test]
fn apply_refuses_a_transition_outside_the_table() {
    let mut config = config_with(UBad);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply(&mut config, 4, Onln, Cause::VdCreated)));
    let payload = outcome.expect_err("UBad -> Onln is not in the table");
    let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(message, "slot 4: UBad -> Onln is not a drive state transition: `VD created` leads to Onln only from UGood");
    assert_eq!(config.drives[0].state, UBad);
}
