//! storcli's schedules of the quiet duties: patrol read (`/c0 show patrolread`, `/c0
//! start|stop|pause|resume patrolread`; settings through `/c0 set patrolread=on|off
//! mode=auto|manual delay=HOURS prrate=N includessds=on|off`) and the consistency check schedule
//! (`/c0 show cc`; `/c0 set cc=off|seq|conc delay=HOURS starttime=YYYY/MM/DD HH`), with their
//! properties as storcli names them. Times are UTC.

use super::parse::UsageError;
use super::render::Report;
use super::table::{days_from_civil, key_values, section, utc_time};
use crate::api_types::{ControllerView, PatrolReadView};
use serde_json::Value;

/// `YYYY/MM/DD HH` (or `YYYY/MM/DD`, midnight), UTC, as Unix seconds.
pub fn parse_start_time(text: &str) -> Result<u64, UsageError> {
    let refuse =
        || UsageError(format!("starttime=\"{text}\" is not allowed; allowed: YYYY/MM/DD HH (UTC, hour 0 to 23), e.g. 2026/11/24 02"));
    let (date, hour) = text.split_once([' ', '-', 'T']).map_or((text, "0"), |(date, hour)| (date, hour));
    let parts: Vec<i64> = date.split('/').map(|p| p.parse::<i64>()).collect::<Result<_, _>>().map_err(|_| refuse())?;
    let hour: i64 = hour.parse().map_err(|_| refuse())?;
    let [year, month, day] = parts[..] else { return Err(refuse()) };
    let valid = (1970..=9999).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day) && (0..=23).contains(&hour);
    let days = days_from_civil(year, month, day);
    // A day past the month's end (2026/02/30) would roll over: refused.
    if !valid || utc_time(days as u64 * 86_400)[..10] != format!("{year:04}-{month:02}-{day:02}") {
        return Err(refuse());
    }
    Ok(days as u64 * 86_400 + hour as u64 * 3600)
}

/// `/c0 show cc`: the consistency check schedule.
pub fn cc_schedule_report(controller: &ControllerView, answer: &Value) -> Report {
    let mode = match controller.cc_mode.as_str() {
        "seq" => "Sequential",
        "conc" => "Concurrent",
        _ => "Disabled",
    };
    let waiting = controller.cc_queue.iter().map(|vd| format!("v{vd}")).collect::<Vec<_>>().join(", ");
    let properties = [
        ("CC Operation Mode", mode.to_string()),
        ("CC Execution Delay", format!("{} hours", controller.cc_delay_hours)),
        ("CC Next Starttime", if controller.cc_mode == "off" { "-".into() } else { utc_time(controller.cc_next_start_unix_secs) }),
        ("CC Rate", format!("{}%", controller.cc_rate_percent)),
        ("CC VDs Waiting", if waiting.is_empty() { "None".into() } else { waiting }),
    ];
    Report { description: "None".to_string(), text: section("Controller Properties", &key_values(&properties)), data: answer.clone() }
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
        ("PR Last Start time", if view.last_start_unix_secs == 0 { "Never".into() } else { utc_time(view.last_start_unix_secs) }),
        ("PR Next Start time", view.next_start_unix_secs.map_or("-".into(), utc_time)),
    ];
    Report { description: "None".to_string(), text: section("Controller Properties", &key_values(&properties)), data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse::tests::check;
    use serde_json::json;

    #[test]
    fn patrol_read_commands() {
        check("/c0 show patrolread", "GET /api/v1/patrolread");
        check("/c0 start patrolread", r#"POST /api/v1/patrolread {"action":"start"}"#);
        check("/c0 Pause PatrolRead", r#"POST /api/v1/patrolread {"action":"pause"}"#);
        check(
            "/c0 set patrolread=on mode=manual delay=24 prrate=50 includessds=off",
            r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"patrol_read":true,"patrol_mode":"manual","patrol_delay_hours":24,"patrol_rate_percent":50,"patrol_include_ssds":false}"#,
        );
        check("/c0 set patrolread mode=sometimes", "usage: mode=\"sometimes\" is not allowed; allowed: auto, manual (patrol read)");
        check("/c0 set patrolread delay=0", "usage: delay=\"0\" is not allowed; allowed: 1 to 65535 (hours from one start to the next)");
        check(
            "/c0 set patrolread delay=24",
            r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"patrol_delay_hours":24}"#,
        );
        check(
            "/c0 set delay=24",
            "usage: set: delay= belongs to patrolread (patrolread mode=auto|manual delay=HOURS) or to cc=seq|conc (cc=seq delay=HOURS starttime=YYYY/MM/DD HH); give one of them before it",
        );
        check(
            "/c0 set cc=seq delay=24 starttime=2026/11/24 02",
            r#"PATCH /api/v1/controller {"auto_rebuild":null,"rebuild_rate_percent":null,"cc_mode":"seq","cc_delay_hours":24,"cc_start_unix_secs":1795485600}"#,
        );
        check(
            "/c0 set cc=conc starttime=2026/02/30",
            "usage: starttime=\"2026/02/30\" is not allowed; allowed: YYYY/MM/DD HH (UTC, hour 0 to 23), e.g. 2026/11/24 02",
        );
        check(
            "/c0 set cc=sometimes",
            "usage: cc=\"sometimes\" is not allowed; allowed: off, seq (one VD after another), conc (every VD at once)",
        );
        check("/c0 show cc", "GET /api/v1/controller");
        check("/c0 set prrate=101", "usage: prrate=\"101\" is not allowed; allowed: 0 to 100 (percent)");
        check("/c0 start patrolread now", "usage: start patrolread takes no options");
    }

    #[test]
    fn show_cc_gives_the_schedule() {
        let controller: ControllerView = serde_json::from_value(json!({
            "controller": 0, "controller_id": "0", "product": "storc", "version": "0", "generation": 1, "status": "Optimal",
            "drives": [], "vds": [], "foreign_configurations": 0, "nbd_endpoints": [], "shards": 1, "parity_kernels": "avx2",
            "auto_rebuild": true, "rebuild_rate_percent": 30, "copyback": true, "cc_rate_percent": 30,
            "cc_mode": "seq", "cc_delay_hours": 24, "cc_next_start_unix_secs": 1795485600, "cc_queue": [2, 3]
        }))
        .unwrap();
        let text = cc_schedule_report(&controller, &json!({})).text;
        for expected in [
            "CC Operation Mode = Sequential",
            "CC Execution Delay = 24 hours",
            "CC Next Starttime = 2026-11-24T02:00:00Z",
            "CC VDs Waiting = v2, v3",
        ] {
            assert!(text.contains(expected), "{expected:?} missing in:\n{text}");
        }
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
            "PR Last Start time = 2023-11-14T22:13:20Z",
            "PR Next Start time = 2023-11-21T22:13:20Z",
        ] {
            assert!(text.contains(expected), "{expected:?} missing in:\n{text}");
        }
    }
}
