//! `/c0 set ...`: the controller's settings, and the schedules of patrol read and of the
//! consistency check, in storcli's forms.

use super::{on_off, percent, set_once, usage, UsageError};
use crate::api_types::SetController;

pub(super) fn parse_set_controller(tokens: &[String]) -> Result<SetController, UsageError> {
    const ALLOWED: &str = "autorebuild=on|off, rebuildrate=0-100, copyback=on|off, ccrate=0-100, bgirate=0-100, patrolread=on|off, mode=auto|manual, delay=HOURS, prrate=0-100, includessds=on|off, cc=off|seq|conc, starttime=YYYY/MM/DD HH";
    if tokens.is_empty() {
        return usage(format!("set needs one or more of: {ALLOWED}"));
    }
    let mut changes = SetController::default();
    // `mode=`, `delay=` and `starttime=` belong to the patrol read or to the check schedule,
    // whichever of `patrolread[=on|off]` and `cc=...` came last before them (storcli's forms).
    let mut context: Option<&str> = None;
    let mut index = 0;
    while index < tokens.len() {
        let token = &tokens[index];
        index += 1;
        if token.eq_ignore_ascii_case("patrolread") {
            context = Some("patrolread");
            continue;
        }
        let Some((key, value)) = token.split_once('=') else {
            return usage(format!("set: \"{token}\" is not KEY=VALUE; allowed: {ALLOWED}"));
        };
        let key = key.to_ascii_lowercase();
        match (key.as_str(), context) {
            ("autorebuild", _) => set_once(&mut changes.auto_rebuild, on_off("autorebuild", value)?, "autorebuild=", token)?,
            ("copyback", _) => set_once(&mut changes.copyback, on_off("copyback", value)?, "copyback=", token)?,
            ("rebuildrate", _) => set_once(&mut changes.rebuild_rate_percent, percent("rebuildrate", value)?, "rebuildrate=", token)?,
            ("ccrate", _) => set_once(&mut changes.cc_rate_percent, percent("ccrate", value)?, "ccrate=", token)?,
            ("bgirate", _) => set_once(&mut changes.bgi_rate_percent, percent("bgirate", value)?, "bgirate=", token)?,
            ("prrate", _) => set_once(&mut changes.patrol_rate_percent, percent("prrate", value)?, "prrate=", token)?,
            ("includessds", _) => set_once(&mut changes.patrol_include_ssds, on_off("includessds", value)?, "includessds=", token)?,
            ("patrolread", _) => {
                set_once(&mut changes.patrol_read, on_off("patrolread", value)?, "patrolread=", token)?;
                context = Some("patrolread");
            }
            ("cc", _) => {
                set_once(&mut changes.cc_mode, cc_mode(value)?, "cc=", token)?;
                context = Some("cc");
            }
            ("mode", Some("patrolread")) => set_once(&mut changes.patrol_mode, patrol_mode(value)?, "mode=", token)?,
            ("delay", Some("patrolread")) => set_once(&mut changes.patrol_delay_hours, delay_hours(value)?, "delay=", token)?,
            ("delay", Some("cc")) => set_once(&mut changes.cc_delay_hours, delay_hours(value)?, "delay=", token)?,
            ("starttime", Some("cc")) => {
                let (start, words) = start_time(value, tokens.get(index))?;
                index += words;
                set_once(&mut changes.cc_start_unix_secs, start, "starttime=", token)?;
            }
            ("mode" | "delay" | "starttime", _) => {
                return usage(format!(
                    "set: {key}= belongs to patrolread (patrolread mode=auto|manual delay=HOURS) or to cc=seq|conc (cc=seq delay=HOURS starttime=YYYY/MM/DD HH); give one of them before it"
                ))
            }
            _ => return usage(format!("set: unknown property \"{key}\"; allowed: {ALLOWED}")),
        }
    }
    Ok(changes)
}

fn cc_mode(value: &str) -> Result<String, UsageError> {
    match value.to_ascii_lowercase().as_str() {
        mode @ ("off" | "seq" | "conc") => Ok(mode.to_string()),
        _ => usage(format!("cc=\"{value}\" is not allowed; allowed: off, seq (one VD after another), conc (every VD at once)")),
    }
}

fn patrol_mode(value: &str) -> Result<String, UsageError> {
    match value.to_ascii_lowercase().as_str() {
        mode @ ("auto" | "manual") => Ok(mode.to_string()),
        _ => usage(format!("mode=\"{value}\" is not allowed; allowed: auto, manual (patrol read)")),
    }
}

fn delay_hours(value: &str) -> Result<u16, UsageError> {
    match value.parse::<u16>().ok().filter(|hours| *hours > 0) {
        Some(hours) => Ok(hours),
        None => usage(format!("delay=\"{value}\" is not allowed; allowed: 1 to 65535 (hours from one start to the next)")),
    }
}

/// `starttime=YYYY/MM/DD` and the hour, which storcli writes as the next word
/// (`starttime=2026/11/24 02`): Unix seconds, and how many more words it took.
fn start_time(value: &str, next: Option<&String>) -> Result<(u64, usize), UsageError> {
    let hour = next.filter(|word| word.len() <= 2 && word.bytes().all(|b| b.is_ascii_digit()));
    let text = hour.map_or(value.to_string(), |hour| format!("{value} {hour}"));
    Ok((crate::cli::patrol::parse_start_time(&text)?, usize::from(hour.is_some())))
}
