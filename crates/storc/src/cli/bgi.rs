//! storcli's initialization commands: `/c0/vN|vall show bgi`, `/c0/vN stop|pause|resume bgi`,
//! `/c0/vN start init [full] [force]`, `/c0/vN|vall show init`; and their tables (VD,
//! Operation, Progress%, Status, Estimated Time Left, as storcli prints them).

use super::parse::{Target, UsageError};
use super::render::Report;
use super::table::{section, Table};
use crate::api_types::{BgiView, InitAction, InitView};
use serde_json::Value;

/// The tokens after `start init`: `full` and `force`, each at most once, in any order.
pub fn parse_init(tokens: &[String]) -> Result<InitAction, UsageError> {
    let mut action = InitAction { full: false, force: false };
    for token in tokens {
        let flag = match token.to_ascii_lowercase().as_str() {
            "full" => &mut action.full,
            "force" => &mut action.force,
            _ => return Err(UsageError(format!("start init takes: full, force; not \"{token}\""))),
        };
        if std::mem::replace(flag, true) {
            return Err(UsageError(format!("start init: \"{token}\" is given twice")));
        }
    }
    Ok(action)
}

fn time_left(seconds: Option<u64>) -> String {
    seconds.map_or("-".to_string(), |secs| format!("{} min {} s", secs / 60, secs % 60))
}

/// storcli's `show bgi` table, one row per VD with a BGI pending.
pub fn bgi_report(target: Target, bgis: &[BgiView], answer: &Value) -> Report {
    let mut table = Table::new(&["VD", "Operation", "Progress%", "Status", "Estimated Time Left", "Rate%", "Regions Left"]);
    for bgi in bgis.iter().filter(|b| matches!(target, Target::All) || target == Target::One(b.vd)) {
        table.push(vec![
            bgi.vd.to_string(),
            "BGI".to_string(),
            format!("{:.1}", bgi.progress_percent),
            bgi.status.clone(),
            time_left(bgi.estimated_seconds_left),
            bgi.rate_percent.to_string(),
            format!("{} of {}", bgi.regions_left, bgi.region_count),
        ]);
    }
    let body = match (table.is_empty(), target) {
        (true, Target::One(vd)) => format!("v{vd}: BGI Not in progress (the VD is consistent)\n"),
        (true, Target::All) => "No background initialization in progress.\n".to_string(),
        (false, _) => table.render(),
    };
    Report { description: "Show BGI Succeeded".to_string(), text: section("VD Operation Status", &body), data: answer.clone() }
}

/// storcli's `show init` table, one row per full initialization that runs.
pub fn init_report(target: Target, inits: &[InitView], answer: &Value) -> Report {
    let mut table = Table::new(&["VD", "Operation", "Progress%", "Status", "Elapsed"]);
    for init in inits.iter().filter(|i| matches!(target, Target::All) || target == Target::One(i.vd)) {
        let elapsed = format!("{} min {} s", init.elapsed_seconds / 60, init.elapsed_seconds % 60);
        table.push(vec![
            init.vd.to_string(),
            "INIT".to_string(),
            format!("{:.1}", init.progress_percent),
            "In progress".to_string(),
            elapsed,
        ]);
    }
    let body = match (table.is_empty(), target) {
        (true, Target::One(vd)) => format!("v{vd}: INIT Not in progress\n"),
        (true, Target::All) => "No initialization in progress.\n".to_string(),
        (false, _) => table.render(),
    };
    Report { description: "Show INIT Succeeded".to_string(), text: section("VD Operation Status", &body), data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse::tests::check;
    use serde_json::json;

    #[test]
    fn bgi_and_init_commands() {
        check("/c0/v0 show bgi", "GET /api/v1/bgis");
        check("/c0/vall show bgi", "GET /api/v1/bgis");
        check("/c0/v2 pause bgi", r#"POST /api/v1/vds/2/bgi {"action":"pause"}"#);
        check("/c0/v2 Resume BGI", r#"POST /api/v1/vds/2/bgi {"action":"resume"}"#);
        check("/c0/v2 stop bgi", r#"POST /api/v1/vds/2/bgi {"action":"stop"}"#);
        check(
            "/c0/v2 start bgi",
            "usage: start bgi: BGI starts by itself when a VD is created over drives that held data; allowed: stop, pause, resume bgi",
        );
        check("/c0/v2 stop bgi now", "usage: stop bgi takes no options");
        check("/c0/v1 start init", r#"POST /api/v1/vds/1/init {"full":false,"force":false}"#);
        check("/c0/v1 start init full", r#"POST /api/v1/vds/1/init {"full":true,"force":false}"#);
        check("/c0/v1 start init Force full", r#"POST /api/v1/vds/1/init {"full":true,"force":true}"#);
        check("/c0/v1 start init fast", r#"usage: start init takes: full, force; not "fast""#);
        check("/c0/v1 start init full full", r#"usage: start init: "full" is given twice"#);
        check("/c0/v1 show init", "GET /api/v1/inits");
        check("/c0 set bgirate=45", r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"bgi_rate_percent":45}"#);
        check("/c0 set bgirate=200", "usage: bgirate=\"200\" is not allowed; allowed: 0 to 100 (percent)");
    }

    #[test]
    fn bgi_table_follows_storcli() {
        let bgis = vec![BgiView {
            vd: 3,
            progress_percent: 42.5,
            status: "In progress".into(),
            estimated_seconds_left: Some(125),
            rate_percent: 30,
            regions_left: 5,
            region_count: 9,
        }];
        let text = bgi_report(Target::All, &bgis, &json!([])).text;
        assert!(text.contains("VD Operation Status"), "{text}");
        for expected in ["BGI", "42.5", "In progress", "2 min 5 s", "5 of 9"] {
            assert!(text.contains(expected), "{expected:?} missing in {text}");
        }
        assert!(bgi_report(Target::One(1), &bgis, &json!([])).text.contains("v1: BGI Not in progress"));
        let inits = vec![InitView { vd: 1, progress_percent: 12.0, elapsed_seconds: 61 }];
        let text = init_report(Target::One(1), &inits, &json!([])).text;
        assert!(text.contains("INIT") && text.contains("12.0") && text.contains("1 min 1 s"), "{text}");
    }
}
