//! The management API requests each CLI action makes.

use super::*;

impl Action {
    /// The API calls that answer this command, in order; `render` gets their answers alike.
    pub fn requests(&self) -> Vec<Request> {
        const VDS: &str = "/api/v1/vds";
        const DRIVES: &str = "/api/v1/drives";
        const JOURNAL: &str = "/api/v1/journal";
        match self {
            Action::ShowController { .. } => vec![Request::get("/api/v1/controller")],
            Action::ShowEvents => vec![Request::get("/api/v1/events")],
            Action::ShowVds { target, all } => {
                let vds = Request::get(&target_path(VDS, *target));
                // `show all` lists each VD's drives, which only the drive list describes.
                if *all {
                    vec![vds, Request::get(DRIVES)]
                } else {
                    vec![vds]
                }
            }
            Action::ShowDrives { target, .. } => vec![Request::get(&target_path(DRIVES, *target))],
            Action::AddVd(create) => vec![Request::with_body(Method::Post, VDS, create)],
            Action::DeleteVd { vd, force } => {
                let query = if *force { "?force=true" } else { "" };
                vec![Request::without_body(Method::Delete, &format!("{VDS}/{vd}{query}"))]
            }
            Action::DeletePreservedCache { vd } => vec![Request::without_body(Method::Delete, &format!("{VDS}/{vd}/cache"))],
            Action::SetVd { vd, changes } => vec![Request::with_body(Method::Patch, &format!("{VDS}/{vd}"), changes)],
            Action::AddHotSpare { slot, spare } => {
                vec![Request::with_body(Method::Post, &format!("{DRIVES}/{slot}/hotspare"), spare)]
            }
            Action::DeleteHotSpare { slot } => {
                vec![Request::without_body(Method::Delete, &format!("{DRIVES}/{slot}/hotspare"))]
            }
            Action::SetDriveState { slot, state } => {
                vec![Request::with_body(Method::Post, &format!("{DRIVES}/{slot}/state"), state)]
            }
            Action::ShowForeign => vec![Request::get("/api/v1/foreign")],
            Action::ImportForeign => vec![Request::without_body(Method::Post, "/api/v1/foreign/import")],
            Action::DeleteForeign => vec![Request::without_body(Method::Delete, "/api/v1/foreign")],
            Action::SetController(changes) => vec![Request::with_body(Method::Patch, "/api/v1/controller", changes)],
            Action::ShowRebuild { .. } => vec![Request::get("/api/v1/rebuilds")],
            Action::Insert { slot, insert } => vec![Request::with_body(Method::Post, &format!("{DRIVES}/{slot}/insert"), insert)],
            Action::Rebuild { slot, action } => vec![Request::with_body(Method::Post, &format!("{DRIVES}/{slot}/rebuild"), action)],
            Action::ShowBadBlocks { vd } => vec![Request::get(&format!("{VDS}/{vd}/badblocks"))],
            Action::ShowCopyback { .. } => vec![Request::get("/api/v1/copybacks")],
            Action::ShowMigrate { .. } => vec![Request::get("/api/v1/migrations")],
            Action::Migrate { vd, action } => vec![Request::with_body(Method::Post, &format!("/api/v1/vds/{vd}/migrate"), action)],
            Action::Copyback { slot, action } => vec![Request::with_body(Method::Post, &format!("{DRIVES}/{slot}/copyback"), action)],
            Action::ShowCc { .. } => vec![Request::get("/api/v1/ccs")],
            Action::Cc { vd, action } => vec![Request::with_body(Method::Post, &format!("{VDS}/{vd}/cc"), action)],
            Action::ShowBgi { .. } => vec![Request::get("/api/v1/bgis")],
            Action::Bgi { vd, action } => vec![Request::with_body(Method::Post, &format!("{VDS}/{vd}/bgi"), action)],
            Action::ShowInit { .. } => vec![Request::get("/api/v1/inits")],
            Action::Init { vd, action } => vec![Request::with_body(Method::Post, &format!("{VDS}/{vd}/init"), action)],
            Action::ShowPatrolRead => vec![Request::get("/api/v1/patrolread")],
            Action::ShowJournal => vec![Request::get(JOURNAL)],
            Action::SetJournal(attach) => vec![Request::with_body(Method::Post, JOURNAL, attach)],
            Action::SetDriveJournal { slot } => vec![Request::without_body(Method::Post, &format!("{DRIVES}/{slot}/journal"))],
            Action::DeleteJournal => vec![Request::without_body(Method::Delete, JOURNAL)],
            Action::ShowCcSchedule => vec![Request::get("/api/v1/controller")],
            Action::PatrolRead(action) => vec![Request::with_body(Method::Post, "/api/v1/patrolread", action)],
        }
    }
}

fn target_path(collection: &str, target: Target) -> String {
    match target {
        Target::All => collection.to_string(),
        Target::One(number) => format!("{collection}/{number}"),
    }
}
