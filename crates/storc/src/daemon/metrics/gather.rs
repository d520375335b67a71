//! The families of the controller, its drives, its VDs (their clients' I/O included) and the
//! NBD server; `gather_duties` has the background operations, the caches and the journal.
//!
//! States and words come from the management API's views (`api::vd_view`, `api::drive_view`),
//! so a scrape and `storc /c0 show` say the same thing.

use super::{flag, Columns, Family, Kind, Labels, Value};
use crate::api_types::{DriveView, VdView};
use crate::daemon::api::{self, AppState};
use engine::config::VdRecord;
use engine::{IoKind, VirtualDrive, LATENCY_BUCKET_BOUNDS_NS};
use std::sync::Arc;

/// Every drive state `storc /c0/sall show` prints.
pub(super) const DRIVE_STATES: [&str; 12] =
    ["UGood", "Onln", "Offln", "Failed", "Msng", "GHS", "DHS", "Rbld", "Cpybck", "UBad", "Jrnl", "Frgn"];
/// Every VD state.
pub(super) const VD_STATES: [&str; 4] = ["Optl", "Pdgd", "Dgrd", "OfLn"];
/// The states a VD's member drives are in (node_md's `node_md_disks` counts them the same way).
const MEMBER_STATES: [&str; 5] = ["Onln", "Rbld", "Offln", "Failed", "Msng"];

/// A VD as one scrape sees it.
pub(super) struct VdSeen {
    pub record: VdRecord,
    pub vd: Arc<VirtualDrive>,
    pub view: VdView,
}

impl VdSeen {
    pub fn labels(&self) -> Labels {
        vd_labels(self.record.vd_id)
    }
}

pub(super) fn vd_labels(vd_id: u32) -> Labels {
    vec![("vd", vd_id.to_string())]
}

fn slot_labels(slot: u32) -> Labels {
    vec![("slot", slot.to_string())]
}

/// Every family of one scrape. Blocks on the shards (the cache's counters): not on the runtime.
pub(super) fn all(state: &AppState) -> Vec<Family> {
    let drives: Vec<DriveView> = state.controller.slots().iter().map(api::drive_view).collect();
    let vds: Vec<VdSeen> =
        state.controller.vds().into_iter().map(|(record, vd)| VdSeen { view: api::vd_view(state, &record, &vd), record, vd }).collect();
    let mut families = controller(state, &drives, &vds);
    families.extend(drive_families(&drives));
    families.extend(vd_families(state, &vds));
    families.extend(vd_io_families(&vds));
    families.extend(nbd_families(&state.nbd.stats()));
    families.extend(super::gather_duties::all(state, &vds));
    families
}

fn controller(state: &AppState, drives: &[DriveView], vds: &[VdSeen]) -> Vec<Family> {
    let config = state.controller.config();
    let views: Vec<VdView> = vds.iter().map(|seen| seen.view.clone()).collect();
    let info: Labels = vec![
        ("controller", "0".into()),
        ("controller_id", format!("{:032x}", config.controller_id.0)),
        ("version", env!("CARGO_PKG_VERSION").into()),
        ("parity_kernels", parity::active_kernel_name().into()),
    ];
    vec![
        Family::new("storc_controller", Kind::Info, "The controller: its id, storc's version and the parity kernels in use.")
            .with(info, Value::Int(1)),
        Family::new(
            "storc_controller_needs_attention",
            Kind::Gauge,
            "1 when /c0 show says Needs Attention: a VD not optimal, or a drive Failed, Msng, Offln or UBad.",
        )
        .with(Vec::new(), flag(api::needs_attention(&views, drives))),
        Family::new("storc_controller_config_generation", Kind::Gauge, "The configuration's generation, raised by every change written.")
            .with(Vec::new(), Value::Int(config.generation)),
        Family::new("storc_foreign_configurations", Kind::Gauge, "Configurations of other controllers found on drives (/c0/fall show).")
            .with(Vec::new(), Value::Int(state.controller.foreign().len() as u64)),
    ]
}

fn drive_families(drives: &[DriveView]) -> Vec<Family> {
    let mut info = Family::new("storc_drive", Kind::Info, "A drive slot: what backs it, and the VD it is a member of.");
    let mut states = Family::new("storc_drive_state", Kind::Gauge, "1 for the drive's state (storcli's words), 0 for the others.");
    let mut size = Family::new("storc_drive_size_bytes", Kind::Gauge, "The drive's capacity.");
    let mut errors = Family::new(
        "storc_drive_read_errors",
        Kind::Gauge,
        "Read errors booked against the drive since it last came into service (repaired from redundancy; too many take it out).",
    );
    for drive in drives {
        let mut labels = slot_labels(drive.slot);
        labels.extend([
            ("drive_id", drive.drive_id.clone()),
            ("kind", drive.kind.clone()),
            ("source", drive.source.clone()),
            ("direct_io", drive.direct_io.to_string()),
            ("vd", drive.vd.map(|vd| vd.to_string()).unwrap_or_default()),
        ]);
        info.push(labels, Value::Int(1));
        states.push_state_set(&slot_labels(drive.slot), &DRIVE_STATES, &drive.state);
        size.push(slot_labels(drive.slot), Value::Int(drive.size_bytes));
        errors.push(slot_labels(drive.slot), Value::Int(u64::from(drive.read_errors)));
    }
    vec![info, states, size, errors]
}

fn vd_families(state: &AppState, vds: &[VdSeen]) -> Vec<Family> {
    let mut info = Family::new("storc_vd", Kind::Info, "A virtual drive: its name (the NBD export's), level and policies.");
    let mut states = Family::new("storc_vd_state", Kind::Gauge, "1 for the VD's state (Optl, Pdgd, Dgrd, OfLn), 0 for the others.");
    let mut members = Family::new("storc_vd_members", Kind::Gauge, "The VD's member drives by drive state.");
    let mut gauges = Columns::new(&VD_GAUGES);
    for seen in vds {
        let (view, labels) = (&seen.view, seen.labels());
        let mut described = labels.clone();
        described.extend([
            ("name", view.name.clone()),
            ("level", view.level.clone()),
            ("drive_group", view.drive_group.to_string()),
            ("write_policy", view.write_policy.clone()),
            ("write_policy_effective", view.write_policy_effective.clone()),
            ("read_policy", view.read_policy.clone()),
            ("io_policy", view.io_policy.clone()),
            ("cache_vd", seen.record.cache_vd.to_string()),
        ]);
        info.push(described, Value::Int(1));
        states.push_state_set(&labels, &VD_STATES, &view.state);
        for member_state in MEMBER_STATES {
            let count = view.member_states.iter().filter(|s| s.as_str() == member_state).count() as u64;
            let mut member_labels = labels.clone();
            member_labels.push(("state", member_state.to_string()));
            members.push(member_labels, Value::Int(count));
        }
        gauges.add(&labels, &vd_gauges(state, seen));
    }
    let mut families = vec![info, states, members];
    families.extend(gauges.into_families());
    families
}

/// A VD's families that take one value each, in the order [`vd_gauges`] gives them.
const VD_GAUGES: [(&str, Kind, &str); 13] = [
    ("storc_vd_size_bytes", Kind::Gauge, "The VD's capacity."),
    ("storc_vd_strip_size_bytes", Kind::Gauge, "The VD's strip size."),
    ("storc_vd_consistent", Kind::Gauge, "1 when no background initialization or resync is owed (its parity or copies agree)."),
    ("storc_vd_unsynced_regions", Kind::Gauge, "Write-intent bitmap regions awaiting a resync (after an unclean stop)."),
    ("storc_vd_bad_block_bytes", Kind::Gauge, "VD bytes whose data is lost (show badblocks): reads of them fail until written."),
    ("storc_vd_cache_dirty_bytes", Kind::Gauge, "The VD's bytes in the controller cache not yet on its members."),
    ("storc_vd_requests_in_flight", Kind::Gauge, "The VD's request pieces queued or running on the engine's shards."),
    ("storc_vd_nbd_connections", Kind::Gauge, "NBD clients connected to the VD's export (past the handshake)."),
    ("storc_vd_fast_path_reads", Kind::Counter, "Reads the Fast Path served (no shard hop, row lock or cache lookup)."),
    ("storc_vd_fast_path_writes", Kind::Counter, "Writes the Fast Path served (RAID0 and JBOD)."),
    ("storc_vd_journal_bypass_writes", Kind::Counter, "Write pieces of sequential streams that went to the members around the journal."),
    ("storc_vd_journal_bypass_bytes", Kind::Counter, "Bytes of sequential streams that went to the members around the journal."),
    (
        "storc_vd_journal_bypass_completed_rows",
        Kind::Counter,
        "Stream writes around the journal that took the cached rest of their row along, as one whole row.",
    ),
];

fn vd_gauges(state: &AppState, seen: &VdSeen) -> [u64; 13] {
    let view = &seen.view;
    let bad_block_bytes = seen.record.bad_blocks.iter().map(|b| b.len_bytes).sum();
    let connections = if seen.record.cache_vd { 0 } else { state.nbd.connections_to(&view.name) as u64 };
    [
        view.size_bytes,
        view.strip_size_bytes,
        u64::from(view.consistent),
        view.resync.as_ref().map_or(0, |resync| resync.regions),
        bad_block_bytes,
        seen.vd.cache_dirty_bytes(),
        seen.vd.requests_in_flight() as u64,
        connections,
        view.fast_path_reads,
        view.fast_path_writes,
        view.journal_bypassed_writes,
        view.journal_bypassed_bytes,
        view.journal_completed_rows,
    ]
}

/// What each VD's NBD clients saw, by kind of request (`op`: read, write, flush).
fn vd_io_families(vds: &[VdSeen]) -> Vec<Family> {
    let mut operations = Family::new("storc_vd_io_operations", Kind::Counter, "Client requests answered, failed ones included.");
    let mut bytes = Family::new("storc_vd_io_bytes", Kind::Counter, "Bytes clients read or wrote (write-zeroes count as writes).");
    let mut errors = Family::new("storc_vd_io_errors", Kind::Counter, "Client requests answered with an error.");
    let mut latency = Family::new(
        "storc_vd_io_duration_seconds",
        Kind::Histogram,
        "Time from a client request's submission to its answer (a FUA write's flush included).",
    );
    for seen in vds {
        for op in IoKind::ALL {
            let snapshot = seen.vd.client_io().snapshot(op);
            let mut labels = seen.labels();
            labels.push(("op", op.name().to_string()));
            operations.push(labels.clone(), Value::Int(snapshot.requests));
            if op != IoKind::Flush {
                bytes.push(labels.clone(), Value::Int(snapshot.bytes));
            }
            errors.push(labels.clone(), Value::Int(snapshot.errors));
            let buckets = LATENCY_BUCKET_BOUNDS_NS.iter().zip(&snapshot.buckets).map(|(&bound_ns, &count)| (bound_ns as f64 / 1e9, count));
            let histogram = Value::Histogram { sum: snapshot.latency_sum_seconds, count: snapshot.requests, buckets: buckets.collect() };
            latency.push(labels, histogram);
        }
    }
    vec![operations, bytes, errors, latency]
}

/// How connections' measurements of the way their readers take turns ended (`--nbd-hand-over auto`).
fn turn_choices(stats: &nbd::ServerStats) -> Family {
    let help = "NBD connections' measurements of how their readers take turns, by outcome: handing the socket over was at least 10% faster for a client that waits for each reply (hand_over), it was not (keep), or the client gave too few round trips to time (too_few_round_trips; the turn is kept).";
    let mut family = Family::new("storc_nbd_turn_choices", Kind::Counter, help);
    for (choice, count) in [
        ("hand_over", stats.turn_choices_hand_over),
        ("keep", stats.turn_choices_keep),
        ("too_few_round_trips", stats.turn_choices_too_few_round_trips),
    ] {
        family.push(vec![("choice", choice.to_string())], Value::Int(count));
    }
    family
}

fn nbd_families(stats: &nbd::ServerStats) -> Vec<Family> {
    let gauge = |name, help, value: usize| Family::new(name, Kind::Gauge, help).with(Vec::new(), Value::Int(value as u64));
    let counter = |name, help, value: u64| Family::new(name, Kind::Counter, help).with(Vec::new(), Value::Int(value));
    vec![
        gauge("storc_nbd_connections", "NBD connections open now on every listener, in any phase.", stats.connections_open),
        gauge(
            "storc_nbd_connections_max",
            "The most NBD connections served at once (storc serve --nbd-connections-max, lowered to fit the descriptor limit).",
            stats.connections_max,
        ),
        counter("storc_nbd_connections_accepted", "NBD connections accepted.", stats.connections_accepted),
        counter("storc_nbd_connections_refused", "NBD connections refused because the most allowed were open.", stats.connections_refused),
        counter("storc_nbd_replies_sent", "NBD replies sent on every connection.", stats.replies_sent),
        counter(
            "storc_nbd_reply_writes",
            "Socket writes that carried NBD replies: a burst of small requests read at once is answered in one write; a large reply takes several.",
            stats.reply_writes,
        ),
        turn_choices(stats),
        gauge(
            "storc_nbd_payload_in_flight_bytes",
            "READ and WRITE payload bytes in flight over every connection.",
            stats.payload_in_flight_bytes,
        ),
        gauge(
            "storc_nbd_payload_in_flight_max_bytes",
            "The bound on payload bytes in flight over every connection (--nbd-in-flight-bytes-max).",
            stats.payload_in_flight_bytes_max,
        ),
    ]
}
