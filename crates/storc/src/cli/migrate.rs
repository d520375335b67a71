//! The migration commands: `/c0/vN start migrate target=M|SPEC` (M the UGood slot that receives
//! the VD; SPEC a drive the daemon opens, creates if missing and adds: `rbd:POOL/IMAGE` or the
//! absolute path of a file or block device), `/c0/vN pause|resume|stop migrate`,
//! `/c0/vN show migrate`; and their table (VD, Target, Drive, Progress%, Status, Estimated Time
//! Left, Rate%).

use super::parse::{Target, UsageError};
use super::render::Report;
use super::table::{section, Table};
use crate::api_types::{MigrateAction, MigrateTarget, MigrationView};
use serde_json::Value;

const START_USAGE: &str = "start migrate needs target=M (the UGood slot that receives the VD) or target=rbd:POOL/IMAGE or target=/PATH \
                           (a drive added for it, created if missing), e.g. /c0/v0 start migrate target=rbd:rbd/v0";

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

/// `target=8` is a slot; anything else a drive spec, which the daemon checks.
fn parse_target(token: &str) -> Result<MigrateTarget, UsageError> {
    let Some((_, value)) = token.split_once('=').filter(|(key, _)| key.eq_ignore_ascii_case("target")) else {
        return Err(UsageError(format!("unknown option \"{token}\" for start migrate; allowed: target=M|rbd:POOL/IMAGE|/PATH")));
    };
    if value.is_empty() {
        return Err(UsageError(format!("target= is empty; {START_USAGE}")));
    }
    Ok(value.parse::<u32>().map_or_else(|_| MigrateTarget::Drive(value.to_string()), MigrateTarget::Slot))
}

/// VD, Target, Progress%, Status, Estimated Time Left, Rate%.
pub fn report(description: &str, target: Target, migrations: &[MigrationView], answer: &Value) -> Report {
    let mut table = Table::new(&["VD", "Target", "Drive", "Progress%", "Status", "Estimated Time Left", "Rate%"]);
    for migration in migrations.iter().filter(|m| matches!(target, Target::All) || target == Target::One(m.vd)) {
        let left = migration.estimated_seconds_left.map_or("-".to_string(), |secs| format!("{} min {} s", secs / 60, secs % 60));
        table.push(vec![
            format!("v{}", migration.vd),
            format!("/c0/s{}", migration.target_slot),
            migration.target_source.clone(),
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
        check(
            "/c0/v0 start migrate target=rbd:rbd/v0?conf=/etc/ceph/ceph.conf",
            r#"POST /api/v1/vds/0/migrate {"action":"start","target":"rbd:rbd/v0?conf=/etc/ceph/ceph.conf"}"#,
        );
        check("/c0/v1 start migrate target=/srv/v1.img", r#"POST /api/v1/vds/1/migrate {"action":"start","target":"/srv/v1.img"}"#);
        check("/c0/v2 stop migrate", r#"POST /api/v1/vds/2/migrate {"action":"stop"}"#);
        check("/c0/v2 pause migrate", r#"POST /api/v1/vds/2/migrate {"action":"pause"}"#);
        check("/c0/v2 resume migrate", r#"POST /api/v1/vds/2/migrate {"action":"resume"}"#);
        check("/c0/vall show migrate", "GET /api/v1/migrations");
        check("/c0/v0 start migrate", &format!("usage: {}", super::START_USAGE));
        check("/c0/v0 start migrate target=", &format!("usage: target= is empty; {}", super::START_USAGE));
        check("/c0/v0 start migrate to=8", "usage: unknown option \"to=8\" for start migrate; allowed: target=M|rbd:POOL/IMAGE|/PATH");
        check("/c0/v0 stop migrate target=3", "usage: stop migrate takes no options; target= goes with start only");
    }
}
