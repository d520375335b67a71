//! storcli's consistency check commands: `/c0/vN start cc [repair|report]` (repair, the default,
//! rewrites what disagrees, as MegaRAID's check does; report only counts and logs it),
//! `/c0/vN stop|pause|resume cc`, `/c0/vN|vall show cc`; and their table (VD, Operation,
//! Progress%, Status, Estimated Time Left, as storcli prints it, with what the check found).

use super::parse::{Target, UsageError};
use super::render::Report;
use super::table::{section, Table};
use crate::api_types::{CcAction, CcView};
use serde_json::Value;

/// The tokens after `VERB cc`.
pub fn parse_action(verb: &str, tokens: &[String]) -> Result<CcAction, UsageError> {
    let lower: Vec<String> = tokens.iter().map(|token| token.to_ascii_lowercase()).collect();
    let repair = match (verb, lower.iter().map(String::as_str).collect::<Vec<_>>().as_slice()) {
        ("start", []) => Some(true),
        ("start", ["repair"]) => Some(true),
        ("start", ["report"]) => Some(false),
        ("start", _) => {
            return Err(UsageError(format!("start cc takes at most one of: repair (the default), report; not \"{}\"", tokens.join(" "))))
        }
        (_, []) => None,
        (_, _) => return Err(UsageError(format!("{verb} cc takes no options; repair or report goes with start only"))),
    };
    Ok(CcAction { action: verb.to_string(), repair })
}

/// storcli's table, one row per check (with the rows it checked and found inconsistent).
pub fn report(description: &str, target: Target, checks: &[CcView], answer: &Value) -> Report {
    let mut table = Table::new(&[
        "VD",
        "Operation",
        "Progress%",
        "Status",
        "Estimated Time Left",
        "Rate%",
        "Mode",
        "Rows Checked",
        "Inconsistent",
        "Repaired",
    ]);
    for check in checks.iter().filter(|c| matches!(target, Target::All) || target == Target::One(c.vd)) {
        let left = check.estimated_seconds_left.map_or("-".to_string(), |secs| format!("{} min {} s", secs / 60, secs % 60));
        table.push(vec![
            check.vd.to_string(),
            "CC".to_string(),
            format!("{:.1}", check.progress_percent),
            check.status.clone(),
            left,
            check.rate_percent.to_string(),
            if check.repair { "Repair" } else { "Report" }.to_string(),
            check.rows_checked.to_string(),
            check.rows_inconsistent.to_string(),
            check.rows_repaired.to_string(),
        ]);
    }
    let body = match (table.is_empty(), target) {
        (true, Target::One(vd)) => format!("v{vd}: CC Not in progress\n"),
        (true, Target::All) => "No consistency check in progress.\n".to_string(),
        (false, _) => table.render(),
    };
    Report { description: description.to_string(), text: section("VD Operation Status", &body), data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse::tests::check;
    use serde_json::json;

    #[test]
    fn cc_commands() {
        check("/c0/v0 start cc", r#"POST /api/v1/vds/0/cc {"action":"start","repair":true}"#);
        check("/c0/v0 Start CC Report", r#"POST /api/v1/vds/0/cc {"action":"start","repair":false}"#);
        check("/c0/v1 start cc repair", r#"POST /api/v1/vds/1/cc {"action":"start","repair":true}"#);
        check("/c0/v1 stop cc", r#"POST /api/v1/vds/1/cc {"action":"stop"}"#);
        check("/c0/v1 pause cc", r#"POST /api/v1/vds/1/cc {"action":"pause"}"#);
        check("/c0/v1 resume cc", r#"POST /api/v1/vds/1/cc {"action":"resume"}"#);
        check("/c0/v1 show cc", "GET /api/v1/ccs");
        check("/c0/vall show cc", "GET /api/v1/ccs");
        check("/c0/v1 start cc force", r#"usage: start cc takes at most one of: repair (the default), report; not "force""#);
        check("/c0/v1 stop cc report", "usage: stop cc takes no options; repair or report goes with start only");
        check("/c0 set ccrate=40", r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"cc_rate_percent":40}"#);
        check("/c0 set ccrate=101", "usage: ccrate=\"101\" is not allowed; allowed: 0 to 100 (percent)");
        check("/c0/vall start cc", "usage: unknown command \"/c0/vall start cc\"; allowed after /c0/vall: show, show all, show cc, show bgi, show init (show badblocks, del, set, cc, bgi and init commands need one VD: /c0/vN)");
    }

    #[test]
    fn the_table_shows_progress_and_findings() {
        let view = CcView {
            vd: 2,
            progress_percent: 37.5,
            status: "In progress".into(),
            estimated_seconds_left: Some(130),
            rate_percent: 30,
            repair: true,
            rows_checked: 300,
            rows_inconsistent: 2,
            rows_repaired: 2,
        };
        let report = report("Show CC Succeeded", Target::All, std::slice::from_ref(&view), &json!([]));
        for expected in ["VD", "Operation", "CC", "37.5", "In progress", "2 min 10 s", "Repair", "300"] {
            assert!(report.text.contains(expected), "{expected:?} in {}", report.text);
        }
        let other = super::report("Show CC Succeeded", Target::One(3), &[view], &json!([]));
        assert!(other.text.contains("v3: CC Not in progress"), "{}", other.text);
    }
}
