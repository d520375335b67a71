//! storcli-style command lines to management API requests.
//!
//! Pure: no I/O, so every rule of the grammar is checked by table-driven tests, and a command that
//! breaks one is refused before anything reaches the daemon (bad input changes nothing). The rules
//! of levels, drive counts and policies come from `layout` and `engine::config`, the crates that
//! enforce them, so the CLI cannot drift from the controller.

use super::http::{Method, Request};
use crate::api_types::{
    AddHotSpare, AttachJournal, BgiAction, CcAction, CopybackAction, CreateVd, InitAction, InsertDrive, MigrateAction, PatrolReadAction,
    RebuildAction, SetController, SetDriveState, SetVd,
};
use engine::config::{IoPolicy, ReadPolicy, WritePolicy, VD_NAME_BYTES_MAX};
use layout::{DRIVES_PER_SPAN_MAX, SPAN_COUNT_MAX};

/// A command line that cannot be understood; the message names what is wrong and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

pub(super) fn usage<T>(message: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(message.into()))
}

/// No list of slots or drive groups can be longer than the largest VD (8 spans of 32 drives).
const LIST_ENTRIES_MAX: usize = SPAN_COUNT_MAX * DRIVES_PER_SPAN_MAX;
/// Strip sizes `strip=` takes, in KiB: the powers of two `layout` allows.
const STRIP_KIB_ALLOWED: [u64; 8] = [8, 16, 32, 64, 128, 256, 512, 1024];
const STRIP_KIB_DEFAULT: u64 = 64;
/// Drive states `/c0/sN set` takes (the words of `SetDriveState::state`).
const DRIVE_STATES: [&str; 4] = ["offline", "online", "missing", "good"];

#[derive(Clone, Debug, PartialEq)]
pub struct Invocation {
    pub action: Action,
    /// A trailing `J`: storcli's JSON envelope instead of text.
    pub json_output: bool,
}

/// `vall` / `sall`, or one VD or slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    All,
    One(u32),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    ShowController {
        all: bool,
    },
    ShowEvents,
    ShowVds {
        target: Target,
        all: bool,
    },
    ShowDrives {
        target: Target,
        all: bool,
    },
    AddVd(CreateVd),
    DeleteVd {
        vd: u32,
        force: bool,
    },
    /// `/c0/vN delete preservedcache`: an offline VD's pinned cache.
    DeletePreservedCache {
        vd: u32,
    },
    SetVd {
        vd: u32,
        changes: SetVd,
    },
    AddHotSpare {
        slot: u32,
        spare: AddHotSpare,
    },
    DeleteHotSpare {
        slot: u32,
    },
    SetDriveState {
        slot: u32,
        state: SetDriveState,
    },
    ShowForeign,
    ImportForeign,
    DeleteForeign,
    SetController(SetController),
    ShowRebuild {
        target: Target,
    },
    Rebuild {
        slot: u32,
        action: RebuildAction,
    },
    Insert {
        slot: u32,
        insert: InsertDrive,
    },
    ShowBadBlocks {
        vd: u32,
    },
    ShowCopyback {
        target: Target,
    },
    ShowMigrate {
        target: Target,
    },
    Migrate {
        vd: u32,
        action: MigrateAction,
    },
    Copyback {
        slot: u32,
        action: CopybackAction,
    },
    ShowCc {
        target: Target,
    },
    Cc {
        vd: u32,
        action: CcAction,
    },
    ShowBgi {
        target: Target,
    },
    Bgi {
        vd: u32,
        action: BgiAction,
    },
    ShowInit {
        target: Target,
    },
    Init {
        vd: u32,
        action: InitAction,
    },
    ShowPatrolRead,
    /// `/c0/bbu show`, `/c0/journal show`.
    ShowJournal,
    /// `/c0 set journal=DEVICE[,DEVICE]` (two for a mirrored pair).
    SetJournal(AttachJournal),
    /// `/c0/sN set journal`: the slot's drive holds the journal (or its second leg).
    SetDriveJournal {
        slot: u32,
    },
    /// `/c0/journal delete` (or `/c0/bbu delete`): the controller goes on without a journal.
    DeleteJournal,
    PatrolRead(PatrolReadAction),
    ShowCcSchedule,
}

/// What the first argument names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Object {
    Controller,
    Vds(Target),
    Slots(Target),
    Foreign,
    /// `/c0/bbu` or `/c0/journal`: the cache's journal, storcli's battery.
    Journal,
}

/// Whether the command asks for JSON (a trailing `J`); known even when the rest does not parse,
/// so that a usage error is reported in the form the caller reads.
pub fn wants_json(args: &[String]) -> bool {
    args.len() > 1 && args.last().is_some_and(|last| last.eq_ignore_ascii_case("j"))
}

/// Parses the arguments after the binary name (`--api` already removed).
///
/// # Errors
/// A [`UsageError`] naming the first wrong argument and what is allowed there.
pub fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let json_output = wants_json(args);
    let words = if json_output { &args[..args.len() - 1] } else { args };
    let Some((path, tokens)) = words.split_first() else {
        return usage(format!("missing object; expected one of: {OBJECTS}"));
    };
    let object = parse_object(path)?;
    let action = parse_action(object, path, tokens)?;
    Ok(Invocation { action, json_output })
}

const OBJECTS: &str = "/c0, /c0/vN, /c0/vall, /c0/sN, /c0/sall, /c0/fall, /c0/bbu, /c0/journal";

fn parse_object(path: &str) -> Result<Object, UsageError> {
    let lower = path.to_ascii_lowercase();
    let not_a_path = || usage(format!("\"{path}\" is not an object; expected one of: {OBJECTS}"));
    let Some(inner) = lower.strip_prefix('/') else {
        return not_a_path();
    };
    let segments: Vec<&str> = inner.split('/').collect();
    match segments[0].strip_prefix('c').map(str::parse::<u32>) {
        Some(Ok(0)) => {}
        Some(Ok(controller)) => return usage(format!("controller /c{controller} does not exist; storc has only /c0")),
        _ => return not_a_path(),
    }
    if segments.get(1).is_some_and(|segment| segment.starts_with('e')) {
        return usage(format!("{path}: storc has no enclosures; name a drive by its slot, e.g. /c0/s3"));
    }
    match segments[1..] {
        [] => Ok(Object::Controller),
        ["fall"] => Ok(Object::Foreign),
        ["bbu" | "journal"] => Ok(Object::Journal),
        [child] => parse_child(child, path).unwrap_or_else(not_a_path),
        _ => not_a_path(),
    }
}

/// `vN`, `vall`, `sN`, `sall`; `None` when the segment names nothing storc has.
fn parse_child(segment: &str, path: &str) -> Option<Result<Object, UsageError>> {
    let (noun, rest) = match segment.split_at_checked(1)? {
        ("v", rest) => ("VD", rest),
        ("s", rest) => ("slot", rest),
        _ => return None,
    };
    let target = match rest {
        "all" => Target::All,
        _ => match rest.parse::<u32>() {
            Ok(number) => Target::One(number),
            Err(_) => return Some(usage(format!("{path}: \"{rest}\" is not a {noun} number or \"all\""))),
        },
    };
    Some(Ok(if noun == "VD" { Object::Vds(target) } else { Object::Slots(target) }))
}

fn parse_action(object: Object, path: &str, tokens: &[String]) -> Result<Action, UsageError> {
    let lower: Vec<String> = tokens.iter().map(|token| token.to_ascii_lowercase()).collect();
    let words: Vec<&str> = lower.iter().map(String::as_str).collect();
    let action = match (object, words.as_slice()) {
        (Object::Controller, ["show"]) => Action::ShowController { all: false },
        (Object::Controller, ["show", "all"]) => Action::ShowController { all: true },
        (Object::Controller, ["show", "events"]) => Action::ShowEvents,
        (Object::Controller, ["add", "vd", ..]) => Action::AddVd(parse_add_vd(&tokens[2..])?),
        (Object::Controller, ["set", one]) if one.starts_with("journal=") => {
            // The device as typed: a path keeps its case.
            Action::SetJournal(AttachJournal { source: tokens[1]["journal=".len()..].to_string() })
        }
        (Object::Controller, ["set", ..]) => Action::SetController(settings::parse_set_controller(&tokens[1..])?),
        (Object::Controller, ["show", "patrolread"]) => Action::ShowPatrolRead,
        (Object::Controller, ["show", "cc"]) => Action::ShowCcSchedule,
        (Object::Controller, [verb @ ("start" | "stop" | "pause" | "resume"), "patrolread"]) => {
            Action::PatrolRead(PatrolReadAction { action: verb.to_string() })
        }
        (Object::Controller, [verb @ ("start" | "stop" | "pause" | "resume"), "patrolread", ..]) => {
            return usage(format!("{verb} patrolread takes no options"))
        }
        (Object::Slots(target), ["show", "rebuild"]) => Action::ShowRebuild { target },
        (Object::Slots(target), ["show", "copyback"]) => Action::ShowCopyback { target },
        (Object::Slots(Target::One(slot)), [verb @ ("start" | "stop" | "pause" | "resume"), "copyback", ..]) => {
            Action::Copyback { slot, action: super::copyback::parse_action(verb, &tokens[2..])? }
        }
        (Object::Slots(Target::One(slot)), ["insert", ..]) => Action::Insert { slot, insert: parse_insert(&tokens[1..])? },
        (Object::Slots(Target::One(slot)), [verb @ ("start" | "stop" | "pause" | "resume"), "rebuild"]) => {
            Action::Rebuild { slot, action: RebuildAction { action: verb.to_string() } }
        }
        (Object::Vds(target), ["show"]) => Action::ShowVds { target, all: false },
        (Object::Vds(target), ["show", "all"]) => Action::ShowVds { target, all: true },
        (Object::Vds(Target::One(vd)), ["show", "badblocks"]) => Action::ShowBadBlocks { vd },
        (Object::Vds(target), ["show", "cc"]) => Action::ShowCc { target },
        (Object::Vds(Target::One(vd)), [verb @ ("start" | "stop" | "pause" | "resume"), "cc", ..]) => {
            Action::Cc { vd, action: super::cc::parse_action(verb, &tokens[2..])? }
        }
        (Object::Vds(target), ["show", "bgi"]) => Action::ShowBgi { target },
        (Object::Vds(target), ["show", "migrate"]) => Action::ShowMigrate { target },
        (Object::Vds(Target::One(vd)), [verb @ ("start" | "stop" | "pause" | "resume"), "migrate", ..]) => {
            Action::Migrate { vd, action: super::migrate::parse_action(verb, &tokens[2..])? }
        }
        (Object::Vds(Target::One(_)), ["start", "bgi", ..]) => {
            return usage(
                "start bgi: BGI starts by itself when a VD is created over drives that held data; allowed: stop, pause, resume bgi",
            )
        }
        (Object::Vds(Target::One(_)), [verb @ ("stop" | "pause" | "resume"), "bgi", _, ..]) => {
            return usage(format!("{verb} bgi takes no options"))
        }
        (Object::Vds(Target::One(vd)), [verb @ ("stop" | "pause" | "resume"), "bgi"]) => {
            Action::Bgi { vd, action: BgiAction { action: verb.to_string() } }
        }
        (Object::Vds(target), ["show", "init"]) => Action::ShowInit { target },
        (Object::Vds(Target::One(vd)), ["start", "init", ..]) => Action::Init { vd, action: super::bgi::parse_init(&tokens[2..])? },
        (Object::Vds(Target::One(vd)), ["del" | "delete"]) => Action::DeleteVd { vd, force: false },
        (Object::Vds(Target::One(vd)), ["del" | "delete", "force"]) => Action::DeleteVd { vd, force: true },
        (Object::Vds(Target::One(vd)), ["del" | "delete", "preservedcache"]) => Action::DeletePreservedCache { vd },
        (Object::Vds(Target::One(vd)), ["set", ..]) => Action::SetVd { vd, changes: parse_set_vd(&tokens[1..])? },
        (Object::Slots(target), ["show"]) => Action::ShowDrives { target, all: false },
        (Object::Slots(target), ["show", "all"]) => Action::ShowDrives { target, all: true },
        (Object::Slots(Target::One(slot)), ["add", "hotsparedrive", ..]) => {
            Action::AddHotSpare { slot, spare: parse_hot_spare(&tokens[2..])? }
        }
        (Object::Slots(Target::One(slot)), ["del" | "delete", "hotsparedrive"]) => Action::DeleteHotSpare { slot },
        (Object::Slots(Target::One(slot)), ["set", "journal"]) => Action::SetDriveJournal { slot },
        (Object::Slots(Target::One(slot)), ["set", ..]) => Action::SetDriveState { slot, state: parse_drive_state(&words[1..])? },
        (Object::Foreign, ["show"] | ["show", "all"]) => Action::ShowForeign,
        (Object::Foreign, ["import"]) => Action::ImportForeign,
        (Object::Foreign, ["del" | "delete"]) => Action::DeleteForeign,
        (Object::Journal, ["show"] | ["show", "all"] | ["show", "status"]) => Action::ShowJournal,
        (Object::Journal, ["del" | "delete"]) => Action::DeleteJournal,
        _ => return usage(unknown_command(object, path, tokens)),
    };
    Ok(action)
}

/// One of a fixed set of words (a policy, a drive state), named for error messages.
struct Choice {
    what: &'static str,
    words: Vec<&'static str>,
}

impl Choice {
    fn write_policy() -> Choice {
        Choice { what: "write policy", words: WritePolicy::ALL.iter().map(|policy| policy.short_name()).collect() }
    }
    fn read_policy() -> Choice {
        Choice { what: "read policy", words: ReadPolicy::ALL.iter().map(|policy| policy.short_name()).collect() }
    }
    fn io_policy() -> Choice {
        Choice { what: "IO policy", words: IoPolicy::ALL.iter().map(|policy| policy.short_name()).collect() }
    }
    fn find(&self, text: &str) -> Option<&'static str> {
        self.words.iter().copied().find(|word| word.eq_ignore_ascii_case(text))
    }
    fn parse(&self, text: &str) -> Result<String, UsageError> {
        match self.find(text) {
            Some(word) => Ok(word.to_string()),
            None => usage(format!("unknown {} \"{text}\"; allowed: {}", self.what, self.words.join(", "))),
        }
    }
}

/// Refuses a second value for something given once already (`wt wb`, `name=a name=b`).
pub(super) fn set_once<T>(slot: &mut Option<T>, value: T, what: &str, token: &str) -> Result<(), UsageError> {
    if slot.is_some() {
        return usage(format!("\"{token}\": {what} given twice; give it once"));
    }
    *slot = Some(value);
    Ok(())
}

/// The VD name is also its NBD export name, so it must survive a shell and a URI unquoted.
fn parse_vd_name(text: &str) -> Result<String, UsageError> {
    if text.is_empty() {
        return usage(format!("name= is empty; give 1 to {VD_NAME_BYTES_MAX} bytes"));
    }
    if text.len() > VD_NAME_BYTES_MAX {
        return usage(format!("name={text}: {} bytes; at most {VD_NAME_BYTES_MAX} allowed", text.len()));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return usage(format!("name={text:?}: no spaces or control characters allowed"));
    }
    Ok(text.to_string())
}

/// `0-3,5,7-8`: numbers and inclusive ranges, each listed once, in the order given.
pub fn parse_number_list(key: &str, text: &str, noun: &str) -> Result<Vec<u32>, UsageError> {
    let fail = |why: String| UsageError(format!("{key}={text}: {why}"));
    if text.is_empty() {
        return Err(fail(format!("empty; give {noun} numbers such as 0-3,5")));
    }
    let mut numbers: Vec<u32> = Vec::new();
    for item in text.split(',') {
        let (first, last) = parse_range(item, noun).map_err(fail)?;
        let entry_count = (last - first) as usize + 1;
        if numbers.len() + entry_count > LIST_ENTRIES_MAX {
            return Err(fail(format!("more than {LIST_ENTRIES_MAX} entries")));
        }
        for number in first..=last {
            if numbers.contains(&number) {
                return Err(fail(format!("{noun} {number} listed twice")));
            }
            numbers.push(number);
        }
    }
    debug_assert!(!numbers.is_empty() && numbers.len() <= LIST_ENTRIES_MAX);
    Ok(numbers)
}

/// One item of a list: `5` or `7-8`, as (first, last) inclusive.
fn parse_range(item: &str, noun: &str) -> Result<(u32, u32), String> {
    let number = |part: &str| part.parse::<u32>().map_err(|_| format!("\"{part}\" is not a {noun} number"));
    let Some((first, last)) = item.split_once('-') else {
        let single = number(item)?;
        return Ok((single, single));
    };
    let (first, last) = (number(first)?, number(last)?);
    if first > last {
        return Err(format!("range {item} runs backwards; write {last}-{first}"));
    }
    Ok((first, last))
}

fn parse_set_vd(tokens: &[String]) -> Result<SetVd, UsageError> {
    const ALLOWED: &str =
        "wrcache=wt|wb|awb, rdcache=nora|ra|adra, iopolicy=direct|cached, name=NAME, ssdcaching=on|off|vN, seqcutoff=default|off|SIZE";
    if tokens.is_empty() {
        return usage(format!("set needs one or more of: {ALLOWED}"));
    }
    let mut changes = SetVd::default();
    for token in tokens {
        let Some((key, value)) = token.split_once('=') else {
            return usage(format!("set: \"{token}\" is not KEY=VALUE; allowed: {ALLOWED}"));
        };
        match key.to_ascii_lowercase().as_str() {
            "wrcache" => set_once(&mut changes.write_policy, Choice::write_policy().parse(value)?, "wrcache=", token)?,
            "rdcache" => set_once(&mut changes.read_policy, Choice::read_policy().parse(value)?, "rdcache=", token)?,
            "iopolicy" => set_once(&mut changes.io_policy, Choice::io_policy().parse(value)?, "iopolicy=", token)?,
            "name" => set_once(&mut changes.name, parse_vd_name(value)?, "name=", token)?,
            "ssdcaching" => set_once(&mut changes.ssd_caching, parse_ssd_caching(value)?, "ssdcaching=", token)?,
            "seqcutoff" => {
                let cutoff = engine::config::SeqCutoff::parse(value).or_else(usage)?;
                set_once(&mut changes.seq_cutoff, cutoff.text(), "seqcutoff=", token)?
            }
            _ => return usage(format!("set: unknown property \"{key}\"; allowed: {ALLOWED}")),
        }
    }
    Ok(changes)
}

/// `on`, `off`, or `vN`: the cache VD to cache by.
fn parse_ssd_caching(value: &str) -> Result<String, UsageError> {
    let lower = value.to_ascii_lowercase();
    let by_vd = lower.strip_prefix('v').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match lower.as_str() {
        "on" | "off" => Ok(lower),
        _ if by_vd => Ok(lower),
        _ => usage(format!("ssdcaching={value:?} is not allowed; allowed: on, off, or vN (the cache VD to cache by)")),
    }
}

pub(super) fn percent(key: &str, value: &str) -> Result<u8, UsageError> {
    match value.parse::<u8>().ok().filter(|rate| *rate <= 100) {
        Some(rate) => Ok(rate),
        None => usage(format!("{key}=\"{value}\" is not allowed; allowed: 0 to 100 (percent)")),
    }
}

pub(super) fn on_off(key: &str, value: &str) -> Result<bool, UsageError> {
    match value.to_ascii_lowercase().as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => usage(format!("{key}=\"{value}\" is not allowed; allowed: on, off")),
    }
}

fn parse_insert(tokens: &[String]) -> Result<InsertDrive, UsageError> {
    const ALLOWED: &str = "dg=D array=A row=R (the member's drive group, span and position in it)";
    let (mut drive_group, mut array, mut row) = (None, None, None);
    for token in tokens {
        let parsed = token.split_once('=').and_then(|(key, value)| Some((key.to_ascii_lowercase(), value.parse::<u32>().ok()?)));
        let Some((key, value)) = parsed else { return usage(format!("insert: \"{token}\" is not KEY=NUMBER; allowed: {ALLOWED}")) };
        match key.as_str() {
            "dg" => set_once(&mut drive_group, value, "dg=", token)?,
            "array" => set_once(&mut array, value, "array=", token)?,
            "row" => set_once(&mut row, value, "row=", token)?,
            _ => return usage(format!("insert: unknown option \"{key}\"; allowed: {ALLOWED}")),
        }
    }
    match (drive_group, array, row) {
        (Some(drive_group), Some(array), Some(row)) => Ok(InsertDrive { drive_group, array, row }),
        _ => usage(format!("insert needs {ALLOWED}")),
    }
}

fn parse_hot_spare(tokens: &[String]) -> Result<AddHotSpare, UsageError> {
    let drive_groups = match tokens {
        [] => Vec::new(),
        [token] => match token.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("dgs") => parse_number_list("dgs", value, "drive group")?,
            _ => return usage(format!("unknown option \"{token}\" for add hotsparedrive; allowed: dgs=LIST (e.g. dgs=0,1)")),
        },
        _ => return usage("add hotsparedrive takes at most one option: dgs=LIST (e.g. dgs=0,1)"),
    };
    Ok(AddHotSpare { drive_groups })
}

fn parse_drive_state(words: &[&str]) -> Result<SetDriveState, UsageError> {
    let allowed = format!("{} (or journal: the drive holds the cache's journal)", DRIVE_STATES.join(", "));
    match words {
        [word] if DRIVE_STATES.contains(word) => Ok(SetDriveState { state: word.to_string(), force: None }),
        ["online", "force"] => Ok(SetDriveState { state: "online".to_string(), force: Some(true) }),
        [word] => usage(format!("unknown drive state \"{word}\"; allowed: {allowed}")),
        _ => usage(format!("set takes one drive state; allowed: {allowed}")),
    }
}

mod add_vd;
mod help;
mod requests;
mod settings;

use add_vd::parse_add_vd;
use help::unknown_command;
pub(crate) use help::{ObjectCommands, OBJECT_COMMANDS};

#[cfg(test)]
pub(crate) mod tests;
