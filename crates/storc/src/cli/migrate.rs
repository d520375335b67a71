//! The migration commands: `/c0/vN start migrate target=M` (M the UGood slot that receives the
//! VD, a drive given with `--drive`: an RBD image, say), `/c0/vN stop migrate`,
//! `/c0/vN show migrate`; and their table (VD, Target, Progress%, Status, Estimated Time Left).

use super::parse::{Target, UsageError};
use super::render::Report;
use super::table::{section, Table};
use crate::api_types::{MigrateAction, MigrationView};
use serde_json::Value;

const START_USAGE: &str = "start migrate needs target=M, the UGood slot that receives the VD (e.g. /c0/v0 start migrate target=8)";

/// The tokens after `VERB migrate`.
pub fn parse_action(verb: &str, tokens: &[String]) -> Result<MigrateAction, UsageError> {
    let target = match (verb, tokens) {
        ("start", [token]) => Some(parse_target(token)?),
        ("start", []) => return Err(UsageError(START_USAGE.into())),
        ("start", _) => return Err(UsageError(format!("start migrate takes one option; {START_USAGE}"))),
        (_, []) => None,
        (_, _) => return Err(UsageError(format!("{verb} migrate takes no options; target= goes with start only"))),
    };
    Ok(MigrateAction { action: verb.to_string(), target })
}

fn parse_target(token: &str) -> Result<u32, UsageError> {
    let Some((_, value)) = token.split_once('=').filter(|(key, _)| key.eq_ignore_ascii_case("target")) else {
        return Err(UsageError(format!("unknown option \"{token}\" for start migrate; allowed: target=M")));
    };
    value.parse::<u32>().map_err(|_| UsageError(format!("target={value}: \"{value}\" is not a slot number")))
}

/// VD, Target, Progress%, Status, Estimated Time Left, Rate%.
pub fn report(description: &str, target: Target, migrations: &[MigrationView], answer: &Value) -> Report {
    let mut table = Table::new(&["VD", "Target", "Progress%", "Status", "Estimated Time Left", "Rate%"]);
    for migration in migrations.iter().filter(|m| matches!(target, Target::All) || target == Target::One(m.vd)) {
        let left = migration.estimated_seconds_left.map_or("-".to_string(), |secs| format!("{} min {} s", secs / 60, secs % 60));
        table.push(vec![
            format!("v{}", migration.vd),
            format!("/c0/s{}", migration.target_slot),
            format!("{:.1}", migration.progress_percent),
            migration.status.clone(),
            left,
            migration.rate_percent.to_string(),
        ]);
    }
    let body = match (table.is_empty(), target) {
        (true, Target::One(vd)) => format!("/c0/v{vd}: Not in progress\n"),
        (true, Target::All) => "No migration in progress.\n".to_string(),
        (false, _) => table.render(),
    };
    Report { description: description.to_string(), text: section("Migrate", &body), data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use crate::cli::parse::tests::check;

    #[test]
    fn migrate_commands_become_their_requests_and_bad_ones_say_what_is_allowed() {
        check("/c0/v0 start migrate target=8", r#"POST /api/v1/vds/0/migrate {"action":"start","target":8}"#);
        check("/c0/v2 stop migrate", r#"POST /api/v1/vds/2/migrate {"action":"stop"}"#);
        check("/c0/vall show migrate", "GET /api/v1/migrations");
        check(
            "/c0/v0 start migrate",
            "usage: start migrate needs target=M, the UGood slot that receives the VD (e.g. /c0/v0 start migrate target=8)",
        );
        check("/c0/v0 start migrate target=x", "usage: target=x: \"x\" is not a slot number");
        check("/c0/v0 stop migrate target=3", "usage: stop migrate takes no options; target= goes with start only");
    }
}
