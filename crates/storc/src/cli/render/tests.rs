use super::*;

#[test]
fn cache_codes() {
    let cases = [
        (("nora", "wt", "direct"), "NRWTD"),
        (("ra", "wb", "direct"), "RWBD"),
        (("adra", "awb", "cached"), "ARAWBC"),
        (("nora", "wb", "cached"), "NRWBC"),
        (("sometimes", "wt", "direct"), "?WTD"),
    ];
    for ((read, write, io), expected) in cases {
        assert_eq!(cache_code(read, write, io), expected, "for {read} {write} {io}");
    }
}

pub fn sample_vd() -> VdView {
    VdView {
        vd: 0,
        drive_group: 0,
        name: "db".into(),
        level: "RAID5".into(),
        state: "Dgrd".into(),
        size_bytes: 48 << 30,
        strip_size_bytes: 64 << 10,
        drives_per_span: 4,
        span_count: 1,
        member_slots: vec![0, 1, 2, 3],
        member_states: vec!["Onln".into(), "Onln".into(), "Onln".into(), "Msng".into()],
        write_policy: "wb".into(),
        write_policy_effective: "wt".into(),
        read_policy: "nora".into(),
        io_policy: "direct".into(),
        export_name: "db".into(),
        resync: None,
        consistent: true,
        fast_path_off: Some("needs WT, NORA and Direct".into()),
        fast_path_reads: 0,
        fast_path_writes_off: Some("writes: RAID0 and JBOD only".into()),
        fast_path_writes: 0,
        gather_waits: 0,
        gathered_rows: 0,
        gathered_joins: 0,
        journal_bypass_cutoff_bytes: 4 << 20,
        seq_cutoff: "4MiB".into(),
        journal_bypassed_writes: 0,
        journal_bypassed_bytes: 0,
        journal_completed_rows: 0,
        cache_vd: false,
        ssd_cache: None,
    }
}

pub fn sample_drive(slot: u32) -> DriveView {
    DriveView {
        slot,
        drive_id: format!("{slot:x}0a1b2c3d4e5f60718293a4b5c6d7e8f"),
        state: "Onln".into(),
        drive_group: Some(0),
        vd: Some(0),
        size_bytes: 16 << 30,
        source: format!("mem:16GiB#{slot}"),
        kind: "Memory".into(),
        direct_io: false,
        hot_spare_drive_groups: vec![],
        read_errors: 0,
    }
}

#[test]
fn vd_show_all_lists_members_and_properties() {
    let vd = sample_vd();
    let drives: Vec<DriveView> = (0..3).map(sample_drive).collect();
    let answers = [json!([vd]), serde_json::to_value(&drives).unwrap()];
    let action = Action::ShowVds { target: Target::All, all: true };
    let report = report(&action, &answers).unwrap();
    assert!(report.text.contains("0/0   RAID5 Dgrd  Yes     48.0 GiB 64 KiB NRWTD No db   db\n"), "{}", report.text);
    assert!(report.text.contains("Fast Path = No: needs WT, NORA and Direct\n"), "{}", report.text);
    assert!(report.text.contains("\n3    -        Msng  0  -"), "a missing member keeps its row:\n{}", report.text);
    assert!(report.text.contains("Write Cache(effective) = WT (asked for WB; the journal is not ready)\n"));
    assert!(report.text.contains("Number of Drives Per Span = 4\n"));
    assert_eq!(report.data[0]["drives"].as_array().unwrap().len(), 3);
}

#[test]
fn controller_summary() {
    let controller = ControllerView {
        controller: 0,
        controller_id: "00112233445566778899aabbccddeeff".into(),
        product: "storc".into(),
        version: "0.1.0".into(),
        generation: 7,
        status: "Needs Attention".into(),
        drives: (0..3).map(sample_drive).collect(),
        vds: vec![sample_vd()],
        foreign_configurations: 0,
        nbd_endpoints: vec!["nbd://127.0.0.1:10809/db".into()],
        shards: 2,
        parity_kernels: "avx2".into(),
        auto_rebuild: true,
        rebuild_rate_percent: 30,
        copyback: true,
        cc_rate_percent: 30,
        bgi_rate_percent: 30,
        cc_mode: "seq".into(),
        cc_delay_hours: 168,
        cc_next_start_unix_secs: 1_800_000_000,
        cc_queue: vec![1, 2],
    };
    let answer = serde_json::to_value(&controller).unwrap();
    let summary = report(&Action::ShowController { all: false }, std::slice::from_ref(&answer)).unwrap();
    assert!(summary.text.contains("Controller Status = Needs Attention\n"));
    assert!(summary.text.contains("\nPD LIST :\n=========\n\n"));
    assert!(summary.text.contains("\n2    20a1b2c3 Onln  0  16.0 GiB Memory mem:16GiB#2\n"), "{}", summary.text);
    assert!(summary.text.contains("nbd://127.0.0.1:10809/db\n"));
    assert!(!summary.text.contains("Parity Kernels"));
    let all = report(&Action::ShowController { all: true }, &[answer]).unwrap();
    assert!(all.text.contains("Parity Kernels = avx2\n") && all.text.contains("Generation = 7\n"));
    assert!(all.text.contains("0/0   WB    WT               NORA DIRECT\n"), "{}", all.text);
}

#[test]
fn headers_and_envelopes() {
    let report = Report { description: "Show Events Succeeded".into(), text: "\nbody\n".into(), data: json!([]) };
    let expected = "CLI Version = storc 0.1.0\nController = 0\nStatus = Success\nDescription = Show Events Succeeded\n\nbody\n";
    assert_eq!(success(&report, false), expected);
    let envelope: Value = serde_json::from_str(&success(&report, true)).unwrap();
    let status = &envelope["Controllers"][0]["Command Status"];
    assert_eq!(status["Status"], "Success");
    assert_eq!(status["Controller"], 0);
    assert_eq!(envelope["Controllers"][0]["Response Data"], json!([]));

    assert_eq!(failure("no VD 9", Controller::Unknown, false), "CLI Version = storc 0.1.0\nStatus = Failure\nDescription = no VD 9\n");
    let envelope: Value = serde_json::from_str(&failure("no VD 9", Controller::Zero, true)).unwrap();
    assert_eq!(envelope["Controllers"][0]["Command Status"]["Description"], "no VD 9");
    assert!(envelope["Controllers"][0].get("Response Data").is_none());
}

#[test]
fn events_in_utc() {
    let events = json!([{ "sequence": 4, "time_unix_secs": 1_700_000_000u64, "severity": "warning", "description": "VD 0 is degraded" }]);
    let report = report(&Action::ShowEvents, &[events]).unwrap();
    assert!(report.text.contains("4   2023-11-14T22:13:20Z warning  VD 0 is degraded\n"), "{}", report.text);
}

#[test]
fn foreign_configurations() {
    let foreign = json!([{ "controller_id": "ffeeddccbbaa99887766554433221100", "generation": 3,
        "slots": [5, 6, 7], "vds": [{ "name": "old", "level": "RAID5", "size_bytes": 1u64 << 35 }] }]);
    let report = report(&Action::ShowForeign, &[foreign]).unwrap();
    assert!(report.text.starts_with("\nTotal foreign configurations = 1\n"), "{}", report.text);
    assert!(report.text.contains("\n0  ffeeddccbbaa99887766554433221100 3          5,6,7 1\n"));
    assert!(report.text.contains("\n0  old  RAID5 32.0 GiB\n"), "{}", report.text);
    let none = report_of(&Action::ShowForeign, json!([]));
    assert_eq!(none.text, "\nTotal foreign configurations = 0\n");
}

fn report_of(action: &Action, answer: Value) -> Report {
    report(action, &[answer]).unwrap()
}

#[test]
fn messages_become_the_description() {
    let deleted = report_of(&Action::DeleteVd { vd: 1, force: false }, json!({ "message": "VD 1 deleted" }));
    assert_eq!(deleted.description, "VD 1 deleted");
    assert_eq!(report_of(&Action::ImportForeign, Value::Null).description, "Succeeded");
}

#[test]
fn an_answer_of_another_shape_is_an_error_not_a_panic() {
    let error = report(&Action::ShowVds { target: Target::One(0), all: false }, &[json!({"vd": "zero"})]).unwrap_err();
    assert!(error.starts_with("the storc daemon's answer is not the VdView this CLI knows ("), "{error}");
}
