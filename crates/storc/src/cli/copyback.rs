//! storcli's copyback commands: `/c0/sN start copyback target=M` (N the member to copy, M the
//! drive that receives it), `/c0/sN stop|pause|resume copyback`, `/c0/sN show copyback`; and
//! their table (Drive, Progress%, Status, Estimated Time Left, as storcli prints it).

use super::parse::{Target, UsageError};
use super::render::Report;
use super::table::{section, Table};
use crate::api_types::{CopybackAction, CopybackView};
use serde_json::Value;

const START_USAGE: &str = "start copyback needs target=M, the slot that receives the copy (e.g. /c0/s3 start copyback target=8)";

/// The tokens after `VERB copyback`.
pub fn parse_action(verb: &str, tokens: &[String]) -> Result<CopybackAction, UsageError> {
    let target = match (verb, tokens) {
        ("start", [token]) => Some(parse_target(token)?),
        ("start", []) => return Err(UsageError(START_USAGE.into())),
        ("start", _) => return Err(UsageError(format!("start copyback takes one option; {START_USAGE}"))),
        (_, []) => None,
        (_, _) => return Err(UsageError(format!("{verb} copyback takes no options; target= goes with start only"))),
    };
    Ok(CopybackAction { action: verb.to_string(), target })
}

fn parse_target(token: &str) -> Result<u32, UsageError> {
    let Some((key, value)) = token.split_once('=').filter(|(key, _)| key.eq_ignore_ascii_case("target")) else {
        return Err(UsageError(format!("unknown option \"{token}\" for start copyback; allowed: target=M")));
    };
    debug_assert!(key.eq_ignore_ascii_case("target"));
    if value.contains(':') {
        return Err(UsageError(format!("target={value}: storc has no enclosures; give the slot alone, e.g. target=8")));
    }
    value.parse::<u32>().map_err(|_| UsageError(format!("target={value}: \"{value}\" is not a slot number")))
}

/// storcli's table: Drive, Progress%, Status, Estimated Time Left (with the source, the VD and
/// the rate). A slot names the copies it is the target or the source of.
pub fn report(description: &str, target: Target, copies: &[CopybackView], answer: &Value) -> Report {
    let mut table = Table::new(&["Drive", "Source", "VD", "Progress%", "Status", "Estimated Time Left", "Rate%"]);
    let wanted =
        copies.iter().filter(|c| matches!(target, Target::All) || target == Target::One(c.slot) || target == Target::One(c.source_slot));
    for copy in wanted {
        let left = copy.estimated_seconds_left.map_or("-".to_string(), |secs| format!("{} min {} s", secs / 60, secs % 60));
        table.push(vec![
            format!("/c0/s{}", copy.slot),
            format!("/c0/s{}", copy.source_slot),
            format!("v{}", copy.vd),
            format!("{:.1}", copy.progress_percent),
            copy.status.clone(),
            left,
            copy.rate_percent.to_string(),
        ]);
    }
    let body = match (table.is_empty(), target) {
        (true, Target::One(slot)) => format!("/c0/s{slot}: Not in progress\n"),
        (true, Target::All) => "No copyback in progress.\n".to_string(),
        (false, _) => table.render(),
    };
    Report { description: description.to_string(), text: section("Copyback", &body), data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse::tests::check;
    use serde_json::json;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    /// `expected` is the requests, one per line as `METHOD PATH [BODY]`, or `usage: MESSAGE`.
    #[test]
    fn copyback_commands() {
        check("/c0 set copyback=off", r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"copyback":false}"#);
        check(
            "/c0 set copyback=ON rebuildrate=50",
            r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":50,"copyback":true}"#,
        );
        check("/c0 set copyback=maybe", "usage: copyback=\"maybe\" is not allowed; allowed: on, off");
        check("/c0 set rebuildrate=101", "usage: rebuildrate=\"101\" is not allowed; allowed: 0 to 100 (percent)");
        check("/c0/s3 start copyback target=8", r#"POST /api/v1/drives/3/copyback {"action":"start","target":8}"#);
        check("/c0/s3 Start CopyBack Target=8", r#"POST /api/v1/drives/3/copyback {"action":"start","target":8}"#);
        check("/c0/s8 stop copyback", r#"POST /api/v1/drives/8/copyback {"action":"stop"}"#);
        check("/c0/s8 pause copyback", r#"POST /api/v1/drives/8/copyback {"action":"pause"}"#);
        check("/c0/s8 resume copyback", r#"POST /api/v1/drives/8/copyback {"action":"resume"}"#);
        check("/c0/s8 show copyback", "GET /api/v1/copybacks");
        check("/c0/sall show copyback", "GET /api/v1/copybacks");
        check(
            "/c0/s3 start copyback",
            "usage: start copyback needs target=M, the slot that receives the copy (e.g. /c0/s3 start copyback target=8)",
        );
        check("/c0/s3 start copyback target=s8", "usage: target=s8: \"s8\" is not a slot number");
        check("/c0/s8 stop copyback target=3", "usage: stop copyback takes no options; target= goes with start only");
        let allowed = "show, show all, show rebuild, show copyback (add, delete, set, rebuild and copyback commands need one slot: /c0/sN)";
        check(
            "/c0/sall start copyback target=8",
            &format!("usage: unknown command \"/c0/sall start copyback target=8\"; allowed after /c0/sall: {allowed}"),
        );
    }

    #[test]
    fn actions_and_their_errors() {
        let start = parse_action("start", &words("target=8")).unwrap();
        assert_eq!(start, CopybackAction { action: "start".into(), target: Some(8) });
        assert_eq!(parse_action("start", &words("TARGET=8")).unwrap().target, Some(8));
        assert_eq!(parse_action("stop", &[]).unwrap(), CopybackAction { action: "stop".into(), target: None });
        let error = |verb: &str, text: &str| parse_action(verb, &words(text)).unwrap_err().0;
        assert_eq!(error("start", ""), START_USAGE);
        assert_eq!(error("start", "target=x"), "target=x: \"x\" is not a slot number");
        assert_eq!(error("start", "target=252:8"), "target=252:8: storc has no enclosures; give the slot alone, e.g. target=8");
        assert_eq!(error("start", "slot=8"), "unknown option \"slot=8\" for start copyback; allowed: target=M");
        assert_eq!(error("start", "target=8 target=9"), format!("start copyback takes one option; {START_USAGE}"));
        assert_eq!(error("stop", "target=8"), "stop copyback takes no options; target= goes with start only");
    }

    fn sample() -> Vec<CopybackView> {
        let view = |slot, source_slot, status: &str| CopybackView {
            slot,
            source_slot,
            vd: 0,
            progress_percent: 42.5,
            status: status.into(),
            estimated_seconds_left: Some(75),
            rate_percent: 30,
        };
        vec![view(8, 3, "In progress"), view(9, 5, "Paused")]
    }

    #[test]
    fn the_table_names_target_source_progress_and_time_left() {
        let copies = sample();
        let answer = json!([]);
        let all = report("Show Copyback Succeeded", Target::All, &copies, &answer);
        assert!(all.text.contains("Drive"), "{}", all.text);
        for expected in ["/c0/s8", "/c0/s3", "42.5", "In progress", "1 min 15 s", "/c0/s9", "Paused"] {
            assert!(all.text.contains(expected), "{expected:?} in {}", all.text);
        }
        let by_source = report("Show Copyback Succeeded", Target::One(3), &copies, &answer);
        assert!(by_source.text.contains("/c0/s8") && !by_source.text.contains("/c0/s9"), "{}", by_source.text);
        let none = report("Show Copyback Succeeded", Target::One(4), &copies, &answer);
        assert!(none.text.contains("/c0/s4: Not in progress"), "{}", none.text);
        let empty = report("Show Copyback Succeeded", Target::All, &[], &answer);
        assert!(empty.text.contains("No copyback in progress."), "{}", empty.text);
    }
}
