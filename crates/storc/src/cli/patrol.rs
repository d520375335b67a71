//! storcli's patrol read commands: `/c0 show patrolread`, `/c0 start|stop|pause|resume
//! patrolread` (settings go through `/c0 set patrolread=on|off mode=auto|manual delay=HOURS
//! prrate=N includessds=on|off`), and the `show patrolread` properties as storcli names them.

use super::render::Report;
use super::table::{key_values, section};
use crate::api_types::PatrolReadView;
use serde_json::Value;

/// When, in UTC, `unix_secs` is (storcli prints the next start time).
fn utc_text(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs_of_day = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60)
}

pub fn report(view: &PatrolReadView, answer: &Value) -> Report {
    let enabled = |on: bool| if on { "Enabled" } else { "Disabled" }.to_string();
    let state = match view.progress_percent {
        Some(percent) => format!("{} {percent:.1}% (slot {})", view.state, view.current_slot.map_or("-".into(), |s| s.to_string())),
        None => view.state.clone(),
    };
    let properties = [
        (
            "PR Mode",
            if !view.enabled {
                "Disable".to_string()
            } else if view.mode == "manual" {
                "Manual".into()
            } else {
                "Auto".into()
            },
        ),
        ("PR Execution Delay", format!("{} hours", view.delay_hours)),
        ("PR Rate", format!("{}%", view.rate_percent)),
        ("PR on SSD", enabled(view.include_ssds)),
        ("PR Current State", state),
        ("PR Drives Done", format!("{} of {}", view.drives_done, view.drives_total)),
        ("PR Medium Errors Found", view.medium_errors.to_string()),
        ("PR Medium Errors Corrected", view.corrected.to_string()),
        ("PR Last Start time", if view.last_start_unix_secs == 0 { "Never".into() } else { utc_text(view.last_start_unix_secs) }),
        ("PR Next Start time", view.next_start_unix_secs.map_or("-".into(), utc_text)),
    ];
    Report { description: "None".to_string(), text: section("Controller Properties", &key_values(&properties)), data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse::UsageError;
    use serde_json::json;

    #[track_caller]
    fn check(args: &str, expected: &str) {
        let args: Vec<String> = args.split_whitespace().map(String::from).collect();
        let actual = match super::super::parse::parse(&args) {
            Ok(invocation) => invocation.action.requests().iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"),
            Err(UsageError(message)) => format!("usage: {message}"),
        };
        assert_eq!(actual, expected, "for {args:?}");
    }

    #[test]
    fn patrol_read_commands() {
        check("/c0 show patrolread", "GET /api/v1/patrolread");
        check("/c0 start patrolread", r#"POST /api/v1/patrolread {"action":"start"}"#);
        check("/c0 Pause PatrolRead", r#"POST /api/v1/patrolread {"action":"pause"}"#);
        check(
            "/c0 set patrolread=on mode=manual delay=24 prrate=50 includessds=off",
            r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"patrol_read":true,"patrol_mode":"manual","patrol_delay_hours":24,"patrol_rate_percent":50,"patrol_include_ssds":false}"#,
        );
        check("/c0 set mode=sometimes", "usage: mode=\"sometimes\" is not allowed; allowed: auto, manual (patrol read)");
        check("/c0 set delay=0", "usage: delay=\"0\" is not allowed; allowed: 1 to 65535 (hours between patrol reads)");
        check("/c0 set prrate=101", "usage: prrate=\"101\" is not allowed; allowed: 0 to 100 (percent)");
        check("/c0 start patrolread now", "usage: start patrolread takes no options");
    }

    #[test]
    fn show_patrolread_uses_storcli_names() {
        let view = PatrolReadView {
            enabled: true,
            mode: "auto".into(),
            delay_hours: 168,
            rate_percent: 30,
            include_ssds: false,
            state: "Active".into(),
            progress_percent: Some(12.5),
            current_slot: Some(2),
            drives_done: 1,
            drives_total: 4,
            medium_errors: 3,
            corrected: 2,
            last_start_unix_secs: 1_700_000_000,
            next_start_unix_secs: Some(1_700_604_800),
        };
        let text = report(&view, &json!({})).text;
        for expected in [
            "PR Mode = Auto",
            "PR Execution Delay = 168 hours",
            "PR on SSD = Disabled",
            "PR Current State = Active 12.5% (slot 2)",
            "PR Drives Done = 1 of 4",
            "PR Medium Errors Corrected = 2",
            "PR Last Start time = 2023-11-14 22:13:20 UTC",
            "PR Next Start time = 2023-11-21 22:13:20 UTC",
        ] {
            assert!(text.contains(expected), "{expected:?} missing in:\n{text}");
        }
    }
}
