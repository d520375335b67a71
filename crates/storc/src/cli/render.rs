//! The daemon's answers in storcli's shapes: a header block then titled tables for people, or
//! storcli's JSON envelope around the API's own JSON for scripts (`J`).

use super::parse::{Action, Target};
use super::table::{human_size, key_values, section, strip_size, utc_time, Table};
use crate::api_types::{ControllerView, DriveView, EventView, ForeignView, Message, RebuildView, ResyncInfo, VdView};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

pub const CLI_VERSION: &str = concat!("storc ", env!("CARGO_PKG_VERSION"));
/// One daemon is one controller.
pub const CONTROLLER: u32 = 0;

const VD_LEGEND: &str = "\
Optl=Optimal|Pdgd=Partially Degraded|Dgrd=Degraded|OfLn=OffLine|DG=Drive Group|
Consist=parity and copies known to match the data (No: initialization or resync pending)|
Cache=read policy, write policy in effect, IO policy: NR=No Read Ahead|R=Read Ahead|
AR=Adaptive Read Ahead|WT=WriteThrough|WB=WriteBack|AWB=Always WriteBack|
D=Direct IO|C=Cached IO|FP=Fast Path for reads within a strip, on RAID0/JBOD writes too (Yes/No: why in show all)|
Export=NBD export name|CC:=a cache VD (SSD caching): it holds other VDs' hot lines and is not exported
";
const PD_LEGEND: &str = "\
UGood=Unconfigured Good|UBad=Unconfigured Bad|Onln=Online|Offln=Offline|Failed=Failed|
Msng=Missing|GHS=Global Hot Spare|DHS=Dedicated Hot Spare|Rbld=Rebuild|Cpybck=Copyback|
DG=Drive Group|DID=Drive ID (first 8 hex digits)
";

/// A successful command: the header's description, the text body, and the JSON `Response Data`.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub description: String,
    pub text: String,
    pub data: Value,
}

/// Whether a failure is known to concern controller 0 (a usage error may name no controller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    Zero,
    Unknown,
}

pub fn success(report: &Report, json_output: bool) -> String {
    if json_output {
        return envelope(Controller::Zero, "Success", &report.description, Some(&report.data));
    }
    header(Controller::Zero, "Success", &report.description) + &report.text
}

pub fn failure(message: &str, controller: Controller, json_output: bool) -> String {
    if json_output {
        return envelope(controller, "Failure", message, None);
    }
    header(controller, "Failure", message)
}

fn header(controller: Controller, status: &str, description: &str) -> String {
    let mut pairs = vec![("CLI Version", CLI_VERSION.to_string())];
    if controller == Controller::Zero {
        pairs.push(("Controller", CONTROLLER.to_string()));
    }
    pairs.push(("Status", status.to_string()));
    pairs.push(("Description", description.to_string()));
    key_values(&pairs)
}

fn envelope(controller: Controller, status: &str, description: &str, data: Option<&Value>) -> String {
    let mut command_status = json!({ "CLI Version": CLI_VERSION, "Status": status, "Description": description });
    if controller == Controller::Zero {
        command_status["Controller"] = json!(CONTROLLER);
    }
    let mut answer = json!({ "Command Status": command_status });
    if let Some(data) = data {
        answer["Response Data"] = data.clone();
    }
    let text = serde_json::to_string_pretty(&json!({ "Controllers": [answer] })).expect("JSON values serialize");
    text + "\n"
}

/// Turns the answers to `action.requests()` (one JSON value each, in order) into a report.
///
/// # Errors
/// An answer that is not the JSON the API promises (a daemon of another version).
pub fn report(action: &Action, answers: &[Value]) -> Result<Report, String> {
    assert_eq!(answers.len(), action.requests().len(), "one answer per request");
    let first = &answers[0];
    let report = match action {
        Action::ShowController { all } => controller_report(&decode(first)?, *all, first),
        Action::ShowEvents => events_report(&decode::<Vec<_>>(first)?, first),
        Action::ShowVds { target, all: false } => vd_list_report(*target, &decode_target(*target, first)?, first),
        Action::ShowVds { target, all: true } => {
            let drives = decode::<Vec<_>>(&answers[1])?;
            vd_details_report(&decode_target(*target, first)?, &drives)
        }
        Action::ShowDrives { target, all } => drives_report(&decode_target(*target, first)?, *all, first),
        Action::AddVd(_) => changed_vd_report("Add VD Succeeded", &decode(first)?, first),
        Action::SetVd { .. } => changed_vd_report("Set VD Properties Succeeded", &decode(first)?, first),
        Action::AddHotSpare { .. } => changed_drive_report("Add Hot Spare Succeeded", &decode(first)?, first),
        Action::DeleteHotSpare { .. } => changed_drive_report("Delete Hot Spare Succeeded", &decode(first)?, first),
        Action::SetDriveState { .. } => changed_drive_report("Set Drive State Succeeded", &decode(first)?, first),
        Action::ShowForeign => foreign_report(&decode::<Vec<_>>(first)?, first),
        Action::DeleteVd { .. } | Action::DeletePreservedCache { .. } | Action::ImportForeign | Action::DeleteForeign => {
            message_report(first)?
        }
        Action::SetController(_) => settings_report(&decode(first)?, first),
        Action::Insert { .. } => changed_drive_report("Insert Drive Succeeded", &decode(first)?, first),
        Action::ShowRebuild { target } => rebuild_report("Show Rebuild Succeeded", *target, &decode::<Vec<RebuildView>>(first)?, first),
        Action::Rebuild { slot, action } => {
            let description = format!("{} Rebuild Succeeded", capitalized(&action.action));
            rebuild_report(&description, Target::One(*slot), &[decode(first)?], first)
        }
        Action::ShowBadBlocks { .. } => super::bad_blocks::report(&decode(first)?, first),
        Action::ShowMigrate { target } => super::migrate::report("Show Migrate Succeeded", *target, &decode::<Vec<_>>(first)?, first),
        Action::Migrate { vd, action } => {
            let description = format!("{} Migrate Succeeded", capitalized(&action.action));
            super::migrate::report(&description, Target::One(*vd), &[decode(first)?], first)
        }
        Action::ShowCopyback { target } => super::copyback::report("Show Copyback Succeeded", *target, &decode::<Vec<_>>(first)?, first),
        Action::Copyback { slot, action } => {
            let description = format!("{} Copyback Succeeded", capitalized(&action.action));
            super::copyback::report(&description, Target::One(*slot), &[decode(first)?], first)
        }
        Action::ShowCc { target } => super::cc::report("Show CC Succeeded", *target, &decode::<Vec<_>>(first)?, first),
        Action::Cc { .. } | Action::Bgi { .. } | Action::Init { .. } => message_report(first)?,
        Action::ShowPatrolRead => super::patrol::report(&decode(first)?, first),
        Action::ShowJournal => super::journal::report("None", &decode(first)?, first),
        Action::SetJournal(_) | Action::SetDriveJournal { .. } => super::journal::report("Set Journal Succeeded", &decode(first)?, first),
        Action::DeleteJournal => super::journal::report("Delete Journal Succeeded", &decode(first)?, first),
        Action::ShowCcSchedule => super::patrol::cc_schedule_report(&decode(first)?, first),
        Action::PatrolRead(_) => message_report(first)?,
        Action::ShowBgi { target } => super::bgi::bgi_report(*target, &decode::<Vec<_>>(first)?, first),
        Action::ShowInit { target } => super::bgi::init_report(*target, &decode::<Vec<_>>(first)?, first),
    };
    Ok(report)
}

pub(super) fn decode<T: DeserializeOwned>(answer: &Value) -> Result<T, String> {
    let type_name = std::any::type_name::<T>().rsplit("::").next().unwrap_or("answer");
    serde_json::from_value(answer.clone()).map_err(|error| {
        format!("the storc daemon's answer is not the {type_name} this CLI knows ({error}); are daemon and CLI the same version?")
    })
}

/// `vall`/`sall` answers with a list, `vN`/`sN` with one object; both become a list.
fn decode_target<T: DeserializeOwned>(target: Target, answer: &Value) -> Result<Vec<T>, String> {
    match target {
        Target::All => decode(answer),
        Target::One(_) => Ok(vec![decode(answer)?]),
    }
}

fn controller_report(controller: &ControllerView, all: bool, answer: &Value) -> Report {
    let mut facts = vec![
        ("Product Name", controller.product.clone()),
        ("Controller Id", controller.controller_id.clone()),
        ("Version", controller.version.clone()),
        ("Controller Status", controller.status.clone()),
        ("Virtual Drives", controller.vds.len().to_string()),
        ("Physical Drives", controller.drives.len().to_string()),
    ];
    if all {
        facts.push(("Generation", controller.generation.to_string()));
        facts.push(("Foreign Configurations", controller.foreign_configurations.to_string()));
        facts.push(("Shards", controller.shards.to_string()));
        facts.push(("Parity Kernels", controller.parity_kernels.clone()));
        facts.push(("Auto Rebuild", if controller.auto_rebuild { "On" } else { "Off" }.to_string()));
        facts.push(("Rebuild Rate", format!("{}%", controller.rebuild_rate_percent)));
        facts.push(("Copyback", on_off(controller.copyback)));
        facts.push(("CC Rate", format!("{}%", controller.cc_rate_percent)));
        facts.push(("BGI Rate", format!("{}%", controller.bgi_rate_percent)));
    }
    let mut text = section("Basics", &key_values(&facts));
    text += &section("VD LIST", &vd_table_or_none(&controller.vds));
    if all && !controller.vds.is_empty() {
        text += &section("VD POLICIES", &policy_table(&controller.vds).render());
    }
    if let Some(table) = cachecade_table(&controller.vds) {
        text += &section("CACHECADE", &table.render());
    }
    text += &section("PD LIST", &pd_table_or_none(&controller.drives));
    let endpoints = if controller.nbd_endpoints.is_empty() { "None\n".to_string() } else { controller.nbd_endpoints.join("\n") + "\n" };
    text += &section("NBD Endpoints", &endpoints);
    let description = if all { "Show Controller Properties Succeeded" } else { "Show Controller Summary Succeeded" };
    Report { description: description.to_string(), text, data: answer.clone() }
}

fn vd_list_report(target: Target, vds: &[VdView], answer: &Value) -> Report {
    let title = match target {
        Target::All => "Virtual Drives".to_string(),
        Target::One(vd) => format!("/c0/v{vd}"),
    };
    let text = section(&title, &vd_table_or_none(vds));
    Report { description: "Show Virtual Drives Succeeded".to_string(), text, data: answer.clone() }
}

/// `show all` of VDs: per VD its table, its drives and its properties, as storcli prints them.
fn vd_details_report(vds: &[VdView], drives: &[DriveView]) -> Report {
    let mut text = String::new();
    let mut data = Vec::new();
    for vd in vds {
        let members: Vec<DriveView> = drives.iter().filter(|drive| vd.member_slots.contains(&drive.slot)).cloned().collect();
        text += &section(&format!("/c0/v{}", vd.vd), &(vd_table(std::slice::from_ref(vd)).render() + "\n" + VD_LEGEND));
        text += &section(&format!("PDs for VD {}", vd.vd), &(member_table(vd, &members).render() + "\n" + PD_LEGEND));
        text += &section(&format!("VD{} Properties", vd.vd), &key_values(&vd_properties(vd)));
        data.push(json!({ "vd": vd, "drives": members }));
    }
    if vds.is_empty() {
        text = section("Virtual Drives", "No virtual drives are configured.\n");
    }
    Report { description: "Show Virtual Drives Succeeded".to_string(), text, data: Value::Array(data) }
}

fn drives_report(drives: &[DriveView], all: bool, answer: &Value) -> Report {
    let text = if !all { section("Drive Information", &pd_table_or_none(drives)) } else { drives.iter().map(drive_details).collect() };
    Report { description: "Show Drive Information Succeeded".to_string(), text, data: answer.clone() }
}

fn drive_details(drive: &DriveView) -> String {
    let dash = || "-".to_string();
    let spare_drive_groups = match drive.state.as_str() {
        "GHS" => "all (global)".to_string(),
        "DHS" => join_numbers(&drive.hot_spare_drive_groups),
        _ => dash(),
    };
    let properties = [
        ("Drive ID", drive.drive_id.clone()),
        ("Source", drive.source.clone()),
        ("Kind", drive.kind.clone()),
        ("Direct I/O", if drive.direct_io { "Yes" } else { "No" }.to_string()),
        ("Read Errors", drive.read_errors.to_string()),
        ("DG", drive.drive_group.map_or_else(dash, |group| group.to_string())),
        ("VD", drive.vd.map_or_else(dash, |vd| vd.to_string())),
        ("Hot Spare DGs", spare_drive_groups),
        ("Size", format!("{} ({} bytes)", human_size(drive.size_bytes), drive.size_bytes)),
    ];
    let name = format!("/c0/s{}", drive.slot);
    section(&format!("Drive {name}"), &(pd_table(std::slice::from_ref(drive)).render() + "\n" + PD_LEGEND))
        + &section(&format!("Drive {name} - Detailed Information"), &key_values(&properties))
}

fn changed_vd_report(description: &str, vd: &VdView, answer: &Value) -> Report {
    let text = section(&format!("/c0/v{}", vd.vd), &(vd_table(std::slice::from_ref(vd)).render() + "\n" + VD_LEGEND));
    Report { description: description.to_string(), text, data: answer.clone() }
}

fn changed_drive_report(description: &str, drive: &DriveView, answer: &Value) -> Report {
    let text = section(&format!("Drive /c0/s{}", drive.slot), &(pd_table(std::slice::from_ref(drive)).render() + "\n" + PD_LEGEND));
    Report { description: description.to_string(), text, data: answer.clone() }
}

/// Answers that only say what happened: the daemon's sentence becomes the description.
fn settings_report(controller: &ControllerView, answer: &Value) -> Report {
    let facts = [
        ("Auto Rebuild", if controller.auto_rebuild { "On" } else { "Off" }.to_string()),
        ("Rebuild Rate", format!("{}%", controller.rebuild_rate_percent)),
        ("Copyback", on_off(controller.copyback)),
        ("CC Rate", format!("{}%", controller.cc_rate_percent)),
        ("BGI Rate", format!("{}%", controller.bgi_rate_percent)),
    ];
    Report { description: "Set Controller Properties Succeeded".to_string(), text: key_values(&facts), data: answer.clone() }
}

/// storcli's table: Drive, Progress%, Status, Estimated Time Left.
fn rebuild_report(description: &str, target: Target, rebuilds: &[RebuildView], answer: &Value) -> Report {
    let mut table = Table::new(&["Drive", "VD", "Progress%", "Status", "Estimated Time Left", "Rate%"]);
    let wanted = rebuilds.iter().filter(|r| matches!(target, Target::All) || target == Target::One(r.slot));
    for rebuild in wanted {
        let left = rebuild.estimated_seconds_left.map_or("-".to_string(), |secs| format!("{} min {} s", secs / 60, secs % 60));
        let row = vec![
            format!("/c0/s{}", rebuild.slot),
            format!("v{}", rebuild.vd),
            format!("{:.1}", rebuild.progress_percent),
            rebuild.status.clone(),
            left,
            rebuild.rate_percent.to_string(),
        ];
        table.push(row);
    }
    let body = match (table.is_empty(), target) {
        (true, Target::One(slot)) => format!("/c0/s{slot}: Not in progress\n"),
        (true, Target::All) => "No rebuild in progress.\n".to_string(),
        (false, _) => table.render(),
    };
    Report { description: description.to_string(), text: section("Rebuild", &body), data: answer.clone() }
}

fn on_off(on: bool) -> String {
    if on { "On" } else { "Off" }.to_string()
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|first| first.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
}

fn message_report(answer: &Value) -> Result<Report, String> {
    let description = if answer.is_null() { "Succeeded".to_string() } else { decode::<Message>(answer)?.message };
    Ok(Report { description, text: String::new(), data: answer.clone() })
}

fn events_report(events: &[EventView], answer: &Value) -> Report {
    let mut table = Table::new(&["Seq", "Time (UTC)", "Severity", "Description"]);
    for event in events {
        table.push(vec![event.sequence.to_string(), utc_time(event.time_unix_secs), event.severity.clone(), event.description.clone()]);
    }
    let body = if table.is_empty() { "No events.\n".to_string() } else { table.render() };
    Report { description: "Show Events Succeeded".to_string(), text: section("Events", &body), data: answer.clone() }
}

fn foreign_report(configurations: &[ForeignView], answer: &Value) -> Report {
    let mut summary = Table::new(&["FC", "Controller Id", "Generation", "Slots", "VDs"]);
    let mut vds = Table::new(&["FC", "Name", "TYPE", "Size"]);
    for (index, foreign) in configurations.iter().enumerate() {
        let row = vec![
            index.to_string(),
            foreign.controller_id.clone(),
            foreign.generation.to_string(),
            join_numbers(&foreign.slots),
            foreign.vds.len().to_string(),
        ];
        summary.push(row);
        for vd in &foreign.vds {
            vds.push(vec![index.to_string(), vd.name.clone(), vd.level.clone(), human_size(vd.size_bytes)]);
        }
    }
    let total = configurations.len().to_string();
    let mut text = "\n".to_string() + &key_values(&[("Total foreign configurations", total)]);
    if !summary.is_empty() {
        text += &section("Foreign Configurations", &summary.render());
        let vds_text = if vds.is_empty() { "None\n".to_string() } else { vds.render() };
        text += &section("Foreign VDs", &vds_text);
    }
    Report { description: "Show Foreign Configurations Succeeded".to_string(), text, data: answer.clone() }
}

/// The cache VDs: what they hold and how well they serve, or `None` if there are none.
fn cachecade_table(vds: &[VdView]) -> Option<Table> {
    let mut table =
        Table::new(&["VD", "TYPE", "Policy", "Size", "Lines", "Valid", "Dirty", "Hit ratio", "Hits", "Misses", "Bypassed", "Caches"]);
    for vd in vds.iter().filter(|vd| vd.cache_vd) {
        let Some(cache) = &vd.ssd_cache else { continue };
        let caches: Vec<String> = cache.cached_vds.iter().map(|v| format!("v{v}")).collect();
        table.push(vec![
            vd.vd.to_string(),
            vd.level.clone(),
            policy_name(cache.write_back).to_string(),
            human_size(vd.size_bytes),
            format!("{} x {} KiB", cache.line_count, cache.line_bytes / 1024),
            cache.lines_valid.to_string(),
            human_size(cache.lines_dirty * cache.line_bytes),
            format!("{:.2}", cache.hit_ratio),
            cache.read_hits.to_string(),
            cache.read_misses.to_string(),
            cache.read_bypassed.to_string(),
            if caches.is_empty() { "-".to_string() } else { caches.join(",") },
        ]);
    }
    (!table.is_empty()).then_some(table)
}

fn vd_table_or_none(vds: &[VdView]) -> String {
    if vds.is_empty() {
        return "No virtual drives are configured.\n".to_string();
    }
    vd_table(vds).render() + "\n" + VD_LEGEND
}

fn pd_table_or_none(drives: &[DriveView]) -> String {
    if drives.is_empty() {
        return "No physical drives.\n".to_string();
    }
    pd_table(drives).render() + "\n" + PD_LEGEND
}

fn vd_table(vds: &[VdView]) -> Table {
    let mut table = Table::new(&["DG/VD", "TYPE", "State", "Consist", "Size", "Strip", "Cache", "FP", "Name", "Export"]);
    for vd in vds {
        table.push(vec![
            format!("{}/{}", vd.drive_group, vd.vd),
            if vd.cache_vd { format!("CC:{}", vd.level) } else { vd.level.clone() },
            vd.state.clone(),
            if vd.consistent { "Yes" } else { "No" }.to_string(),
            human_size(vd.size_bytes),
            strip_size(vd.strip_size_bytes),
            cache_code(&vd.read_policy, &vd.write_policy_effective, &vd.io_policy),
            if vd.fast_path_off.is_none() { "Yes" } else { "No" }.to_string(),
            vd.name.clone(),
            if vd.cache_vd { "-".to_string() } else { vd.export_name.clone() },
        ]);
    }
    table
}

fn policy_table(vds: &[VdView]) -> Table {
    let mut table = Table::new(&["DG/VD", "Write", "Write(effective)", "Read", "IO"]);
    for vd in vds {
        table.push(vec![
            format!("{}/{}", vd.drive_group, vd.vd),
            vd.write_policy.to_uppercase(),
            vd.write_policy_effective.to_uppercase(),
            vd.read_policy.to_uppercase(),
            vd.io_policy.to_uppercase(),
        ]);
    }
    table
}

const PD_COLUMNS: [&str; 7] = ["Slot", "DID", "State", "DG", "Size", "Kind", "Source"];

fn pd_table(drives: &[DriveView]) -> Table {
    let mut table = Table::new(&PD_COLUMNS);
    for drive in drives {
        table.push(pd_row(drive));
    }
    table
}

fn pd_row(drive: &DriveView) -> Vec<String> {
    vec![
        drive.slot.to_string(),
        drive.drive_id.chars().take(8).collect(),
        drive.state.clone(),
        drive.drive_group.map_or_else(|| "-".to_string(), |group| group.to_string()),
        human_size(drive.size_bytes),
        drive.kind.clone(),
        drive.source.clone(),
    ]
}

/// A VD's members in member order; a member the drive list lacks (missing) still gets a row,
/// with the state the VD reports for it.
fn member_table(vd: &VdView, drives: &[DriveView]) -> Table {
    let mut table = Table::new(&PD_COLUMNS);
    for (index, slot) in vd.member_slots.iter().enumerate() {
        let row = match drives.iter().find(|drive| drive.slot == *slot) {
            Some(drive) => pd_row(drive),
            None => {
                let state = vd.member_states.get(index).cloned().unwrap_or_else(|| "-".to_string());
                let dash = || "-".to_string();
                vec![slot.to_string(), dash(), state, vd.drive_group.to_string(), dash(), dash(), dash()]
            }
        };
        table.push(row);
    }
    table
}

fn vd_properties(vd: &VdView) -> Vec<(&'static str, String)> {
    let mut write_effective = vd.write_policy_effective.to_uppercase();
    if vd.write_policy_effective != vd.write_policy {
        write_effective += &format!(" (asked for {}; the journal is not ready)", vd.write_policy.to_uppercase());
    }
    vec![
        ("Strip Size", strip_size(vd.strip_size_bytes)),
        ("Span Depth", vd.span_count.to_string()),
        ("Number of Drives Per Span", vd.drives_per_span.to_string()),
        ("Member Slots", join_numbers(&vd.member_slots)),
        ("Write Cache(initial setting)", vd.write_policy.to_uppercase()),
        ("Write Cache(effective)", write_effective),
        ("Read Cache", vd.read_policy.to_uppercase()),
        ("IO Policy", vd.io_policy.to_uppercase()),
        ("Export Name", vd.export_name.clone()),
        ("Size", format!("{} ({} bytes)", human_size(vd.size_bytes), vd.size_bytes)),
        ("Resync", resync_text(vd.resync.as_ref())),
        ("Fast Path", fast_path_text(vd)),
        ("Write Gathering", gathering_text(vd)),
        ("Journal Bypass", journal_bypass_text(vd)),
        ("SSD Caching", ssd_caching_text(vd)),
    ]
}

/// CacheCade, from either side: a cache VD's contents and counters, or the cache VD of a VD.
fn ssd_caching_text(vd: &VdView) -> String {
    let Some(cache) = &vd.ssd_cache else {
        return match vd.cache_vd {
            true => "cache VD (not ready)".into(),
            false => "Off".into(),
        };
    };
    let line_kib = cache.line_bytes / 1024;
    let policy = policy_name(cache.write_back);
    let dirty = human_size(cache.lines_dirty * cache.line_bytes);
    match cache.cache_vd {
        Some(cache_vd) if cache.lost => {
            format!("OFFLINE: its write-back cache VD v{cache_vd} failed holding {dirty} of its newest data; delete v{cache_vd} to discard it")
        }
        Some(cache_vd) => format!("On (cache VD v{cache_vd}, {policy}): {} of its {line_kib} KiB lines hold this VD, {dirty} dirty", cache.lines_valid),
        None => format!(
            "cache VD ({policy}) of {}: {} of {} {line_kib} KiB lines valid, {dirty} dirty; reads {} hits, {} misses, {} bypassed (hit ratio {:.2}); {} promotions, {} evictions, {} writes updated lines, {} kept (write-back), {} lines destaged",
            if cache.cached_vds.is_empty() { "no VD".to_string() } else { cache.cached_vds.iter().map(|v| format!("v{v}")).collect::<Vec<_>>().join(", ") },
            cache.lines_valid,
            cache.line_count,
            cache.read_hits,
            cache.read_misses,
            cache.read_bypassed,
            cache.hit_ratio,
            cache.promotions,
            cache.evictions,
            cache.write_updates,
            cache.writes_absorbed,
            cache.lines_destaged
        ),
    }
}

fn policy_name(write_back: bool) -> &'static str {
    if write_back {
        "write-back"
    } else {
        "write-through"
    }
}

/// Writes of sequential streams that went to the members around the journal (WB, or WT with a
/// journal; see `cache::bypass`), and the `seqcutoff` setting that decides it.
fn journal_bypass_text(vd: &VdView) -> String {
    let setting = match vd.seq_cutoff.as_str() {
        "" | "default" => "seqcutoff=default: the level's".to_string(),
        setting => format!("seqcutoff={setting}"),
    };
    match vd.journal_bypass_cutoff_bytes {
        0 => format!("Off ({setting})"),
        cutoff => format!(
            "streams from {} on ({setting}): {} writes ({}) went around the journal to the members, {} of them with the cached rest of their row",
            human_size(cutoff),
            vd.journal_bypassed_writes,
            human_size(vd.journal_bypassed_bytes),
            vd.journal_completed_rows
        ),
    }
}

/// Parity levels only: what the waits for the rest of a row brought.
fn gathering_text(vd: &VdView) -> String {
    if !matches!(vd.level.as_str(), "RAID5" | "RAID6" | "RAID50" | "RAID60") {
        return "- (parity levels only)".into();
    }
    format!(
        "{} row writes waited for a stream's next write, {} were joined by {} writes (full stripes instead of read-modify-writes)",
        vd.gather_waits, vd.gathered_rows, vd.gathered_joins
    )
}

fn fast_path_text(vd: &VdView) -> String {
    match (&vd.fast_path_off, &vd.fast_path_writes_off) {
        (None, None) => {
            format!("Yes, for reads and writes within a strip ({} reads, {} writes served)", vd.fast_path_reads, vd.fast_path_writes)
        }
        (None, Some(why_not_writes)) => format!("Yes, for reads within a strip ({} served); {why_not_writes}", vd.fast_path_reads),
        (Some(why), _) => format!("No: {why}"),
    }
}

fn resync_text(resync: Option<&ResyncInfo>) -> String {
    match resync {
        None => "None".into(),
        Some(ResyncInfo { percent_done: Some(done), regions, .. }) => format!("In progress {done}% ({regions} region(s) left)"),
        Some(ResyncInfo { regions, .. }) => {
            format!(
                "Pending ({regions} region(s) left; runs once every member is in service; reads that need their parity fail until then)"
            )
        }
    }
}

/// storcli's cache column: read policy (NR, R, AR), write policy (WT, WB, AWB), IO policy (D, C);
/// `NRWTD` is no read-ahead, write-through, direct. A word this CLI does not know shows as `?`.
pub fn cache_code(read_policy: &str, write_policy: &str, io_policy: &str) -> String {
    let read = match read_policy {
        "nora" => "NR",
        "ra" => "R",
        "adra" => "AR",
        _ => "?",
    };
    let write = match write_policy {
        "wt" => "WT",
        "wb" => "WB",
        "awb" => "AWB",
        _ => "?",
    };
    let io = match io_policy {
        "direct" => "D",
        "cached" => "C",
        _ => "?",
    };
    format!("{read}{write}{io}")
}

fn join_numbers(numbers: &[u32]) -> String {
    if numbers.is_empty() {
        return "-".to_string();
    }
    numbers.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
pub mod tests;
