use super::add_vd::ADD_VD_ALLOWED;
use super::*;

/// `expected` is the requests, one per line as `METHOD PATH [BODY]`, or `usage: MESSAGE`.
#[track_caller]
pub(crate) fn check(args: &str, expected: &str) {
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    let actual = match parse(&args) {
        Ok(invocation) => {
            let lines: Vec<String> = invocation.action.requests().iter().map(ToString::to_string).collect();
            lines.join("\n")
        }
        Err(UsageError(message)) => format!("usage: {message}"),
    };
    assert_eq!(actual, expected, "for {args:?}");
}

const CREATE_R5: &str = r#"POST /api/v1/vds {"level":"r5","drives":[0,1,2,3,4,5,6],"strip_kib":64,"name":"db","pdperarray":null,"write_policy":"wt","read_policy":"nora","io_policy":"direct"}"#;

#[test]
fn shows() {
    check("/c0 show", "GET /api/v1/controller");
    check("/C0 SHOW ALL", "GET /api/v1/controller");
    check("/c0 show events", "GET /api/v1/events");
    check("/c0/vall show", "GET /api/v1/vds");
    check("/c0/vall show all", "GET /api/v1/vds\nGET /api/v1/drives");
    check("/c0/v3 show", "GET /api/v1/vds/3");
    check("/c0/V3 Show All", "GET /api/v1/vds/3\nGET /api/v1/drives");
    check("/c0/sall show", "GET /api/v1/drives");
    check("/c0/sall show all", "GET /api/v1/drives");
    check("/c0/s7 show all", "GET /api/v1/drives/7");
    check("/c0/fall show", "GET /api/v1/foreign");
    check("/c0/fall import", "POST /api/v1/foreign/import");
    check("/c0/fall del", "DELETE /api/v1/foreign");
    check("/c0/fall delete", "DELETE /api/v1/foreign");
}

#[test]
fn add_vd_takes_tokens_in_any_order() {
    check("/c0 add vd r5 drives=0-6 strip=64 name=db wt nora direct", CREATE_R5);
    check("/c0 add vd direct nora wt name=db strip=64 drives=0-6 r5", CREATE_R5);
    check("/c0 ADD VD type=RAID5 drives=0-3,4-6 strip=64 name=db WT NoRA Direct", CREATE_R5);
    check(
        "/c0 add vd raid50 drives=0-7 pdperarray=4 awb adra cached",
        r#"POST /api/v1/vds {"level":"r50","drives":[0,1,2,3,4,5,6,7],"strip_kib":null,"name":null,"pdperarray":4,"write_policy":"awb","read_policy":"adra","io_policy":"cached"}"#,
    );
    check(
        "/c0 add vd jbod drives=9",
        r#"POST /api/v1/vds {"level":"jbod","drives":[9],"strip_kib":null,"name":null,"pdperarray":null,"write_policy":null,"read_policy":null,"io_policy":null}"#,
    );
    check(
        "/c0 add vd r6 drives=0-5 wb seqcutoff=8M",
        r#"POST /api/v1/vds {"level":"r6","drives":[0,1,2,3,4,5],"strip_kib":null,"name":null,"pdperarray":null,"write_policy":"wb","read_policy":null,"io_policy":null,"seq_cutoff":"8MiB"}"#,
    );
}

#[test]
fn add_vd_errors_name_the_token_and_what_is_allowed() {
    check("/c0 add vd r7 drives=0-3", "usage: unknown RAID level \"r7\"; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod");
    check("/c0 add vd type=raid3 drives=0-3", "usage: unknown RAID level \"raid3\"; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod");
    check("/c0 add vd r5 drives=0-x", "usage: drives=0-x: \"x\" is not a slot number");
    check("/c0 add vd r5 drives=", "usage: drives=: empty; give slot numbers such as 0-3,5");
    check("/c0 add vd r5 drives=0,,1", "usage: drives=0,,1: \"\" is not a slot number");
    check("/c0 add vd r5 drives=5-3", "usage: drives=5-3: range 5-3 runs backwards; write 3-5");
    check("/c0 add vd r5 drives=0-3,2", "usage: drives=0-3,2: slot 2 listed twice");
    check("/c0 add vd r0 drives=0-4000000000", "usage: drives=0-4000000000: more than 256 entries");
    check(
        "/c0 add vd r5 drives=0-3 strip=48",
        "usage: strip=48: 48 KiB is not a strip size; allowed (KiB): 8, 16, 32, 64, 128, 256, 512, 1024",
    );
    check(
        "/c0 add vd r5 drives=0-3 strip=big",
        "usage: strip=big: \"big\" is not a number of KiB; allowed (KiB): 8, 16, 32, 64, 128, 256, 512, 1024",
    );
    check("/c0 add vd r5 drives=0-3 wt wb", "usage: \"wb\": write policy given twice; give it once");
    check("/c0 add vd r5 r6 drives=0-3", "usage: \"r6\": RAID level given twice; give it once");
    check("/c0 add vd r5 drives=0-3 drives=4-6", "usage: \"drives=4-6\": drives= given twice; give it once");
    check("/c0 add vd drives=0-3", "usage: add vd needs a RAID level; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod");
    check("/c0 add vd r5", "usage: add vd needs drives=LIST, e.g. drives=0-3,5");
    check("/c0 add vd r5 drives=0-3 seqcutoff=1KiB", "usage: seqcutoff=\"1KiB\" is not allowed; allowed: default (the level's: 4MiB without parity, off with it), off, or a size in whole MiB from 1MiB to 65534MiB (e.g. 4MiB, 1GiB)");
    check("/c0 add vd r5 drives=0-3 size=10gb", &format!("usage: unknown option \"size=10gb\" for add vd; allowed: {ADD_VD_ALLOWED}"));
    check("/c0 add vd r5 drives=0-3 fast", &format!("usage: unknown option \"fast\" for add vd; allowed: {ADD_VD_ALLOWED}"));
    check("/c0 add vd r5 drives=0-3 pdperarray=x", "usage: pdperarray=x: \"x\" is not a number of drives per span");
    check("/c0 add vd r5 drives=0-3 name=", "usage: name= is empty; give 1 to 32 bytes");
    check(
        "/c0 add vd r5 drives=0-3 name=a-name-that-is-much-too-long-for-a-vd",
        "usage: name=a-name-that-is-much-too-long-for-a-vd: 37 bytes; at most 32 allowed",
    );
}

#[test]
fn add_vd_applies_the_layout_drive_count_rules() {
    check("/c0 add vd r5 drives=0-1", "usage: RAID5 needs 3 to 32 drives; got 2");
    check("/c0 add vd r1 drives=0-2", "usage: RAID1 needs exactly 2 drives; got 3");
    check("/c0 add vd jbod drives=0-1", "usage: JBOD needs exactly 1 drive; got 2");
    check("/c0 add vd r5 drives=0-5 pdperarray=3", "usage: pdperarray applies only to r10, r50 and r60, not RAID5");
    check(
        "/c0 add vd r50 drives=0-6 pdperarray=3",
        "usage: RAID50 needs 2 to 8 spans of equal size; 7 drives do not split into spans of 3",
    );
    check("/c0 add vd r60 drives=0-7 pdperarray=0", "usage: RAID60 needs 4 to 32 drives per span; got 0");
}

#[test]
fn vd_delete_and_set() {
    check("/c0/v2 del", "DELETE /api/v1/vds/2");
    check("/c0/v2 delete force", "DELETE /api/v1/vds/2?force=true");
    check("/c0/v2 set wrcache=WB", r#"PATCH /api/v1/vds/2 {"write_policy":"wb","read_policy":null,"io_policy":null,"name":null}"#);
    check(
        "/c0/v2 set rdcache=adra iopolicy=cached name=Logs wrcache=awb",
        r#"PATCH /api/v1/vds/2 {"write_policy":"awb","read_policy":"adra","io_policy":"cached","name":"Logs"}"#,
    );
    check("/c0/v2 set wrcache=wx", "usage: unknown write policy \"wx\"; allowed: wt, wb, awb");
    check("/c0/v2 set rdcache=always", "usage: unknown read policy \"always\"; allowed: nora, ra, adra");
    check("/c0/v2 set iopolicy=fast", "usage: unknown IO policy \"fast\"; allowed: direct, cached");
    let allowed =
        "wrcache=wt|wb|awb, rdcache=nora|ra|adra, iopolicy=direct|cached, name=NAME, ssdcaching=on|off|vN, seqcutoff=default|off|SIZE";
    check("/c0/v2 set", &format!("usage: set needs one or more of: {allowed}"));
    check("/c0/v2 set wb", &format!("usage: set: \"wb\" is not KEY=VALUE; allowed: {allowed}"));
    check("/c0/v2 set pdcache=on", &format!("usage: set: unknown property \"pdcache\"; allowed: {allowed}"));
    check("/c0/v2 set wrcache=wt wrcache=wb", "usage: \"wrcache=wb\": wrcache= given twice; give it once");
    let off = r#"PATCH /api/v1/vds/2 {"write_policy":null,"read_policy":null,"io_policy":null,"name":null,"ssd_caching":"off"}"#;
    check("/c0/v2 set ssdcaching=OFF", off);
    check("/c0/v2 set ssdcaching=v3", &off.replace("off", "v3"));
    check("/c0/v2 set ssdcaching=yes", "usage: ssdcaching=\"yes\" is not allowed; allowed: on, off, or vN (the cache VD to cache by)");
    let cutoff = r#"PATCH /api/v1/vds/2 {"write_policy":null,"read_policy":null,"io_policy":null,"name":null,"seq_cutoff":"4MiB"}"#;
    check("/c0/v2 set seqcutoff=4M", cutoff);
    check("/c0/v2 set seqcutoff=Off", &cutoff.replace("4MiB", "off"));
    check("/c0/v2 set seqcutoff=default", &cutoff.replace("4MiB", "default"));
    let allowed_cutoff = "allowed: default (the level's: 4MiB without parity, off with it), off, or a size in whole MiB from 1MiB to 65534MiB (e.g. 4MiB, 1GiB)";
    check("/c0/v2 set seqcutoff=100KiB", &format!("usage: seqcutoff=\"100KiB\" is not allowed; {allowed_cutoff}"));
    check("/c0/v2 set seqcutoff=soon", &format!("usage: seqcutoff: size \"soon\" does not start with a number; {allowed_cutoff}"));
}

#[test]
fn add_vd_cachecade_makes_a_cache_vd_of_r0_r1_or_r10() {
    check(
        "/c0 add vd cachecade type=raid0 drives=8-10 wt assignvds=0,1",
        r#"POST /api/v1/vds {"level":"r0","drives":[8,9,10],"strip_kib":null,"name":null,"pdperarray":null,"write_policy":"wt","read_policy":null,"io_policy":null,"cachecade":true,"assign_vds":[0,1]}"#,
    );
    check("/c0 add vd cachecade r5 drives=8-10", "usage: add vd cachecade: a cache VD is r0, r1 or r10, not r5");
    check(
        "/c0 add vd r1 drives=8-9 assignvds=0",
        "usage: assignvds= is for a cache VD: add vd cachecade r0|r1|r10 drives=LIST assignvds=LIST",
    );
    check(
        "/c0 add vd cachecade r1 drives=8-9 seqcutoff=4MiB",
        "usage: seqcutoff= is for a VD behind the journal; a cache VD (add vd cachecade) takes none",
    );
}

#[test]
fn drives() {
    check("/c0/s4 add hotsparedrive", r#"POST /api/v1/drives/4/hotspare {"drive_groups":[]}"#);
    check("/c0/s4 add HotSpareDrive DGs=0,2-3", r#"POST /api/v1/drives/4/hotspare {"drive_groups":[0,2,3]}"#);
    check("/c0/s4 delete hotsparedrive", "DELETE /api/v1/drives/4/hotspare");
    check("/c0/s4 del hotsparedrive", "DELETE /api/v1/drives/4/hotspare");
    check("/c0/s4 set offline", r#"POST /api/v1/drives/4/state {"state":"offline"}"#);
    check("/c0/s4 set GOOD", r#"POST /api/v1/drives/4/state {"state":"good"}"#);
    check(
        "/c0/s4 set broken",
        "usage: unknown drive state \"broken\"; allowed: offline, online, missing, good (or journal: the drive holds the cache's journal)",
    );
    check(
        "/c0/s4 set",
        "usage: set takes one drive state; allowed: offline, online, missing, good (or journal: the drive holds the cache's journal)",
    );
    check("/c0/s4 add hotsparedrive dgs=a", "usage: dgs=a: \"a\" is not a drive group number");
    check(
        "/c0/s4 add hotsparedrive spares=1",
        "usage: unknown option \"spares=1\" for add hotsparedrive; allowed: dgs=LIST (e.g. dgs=0,1)",
    );
}

#[test]
fn objects_and_commands_that_do_not_exist() {
    check("/c1 show", "usage: controller /c1 does not exist; storc has only /c0");
    check("/c1/v0 show", "usage: controller /c1 does not exist; storc has only /c0");
    check("/cx show", &format!("usage: \"/cx\" is not an object; expected one of: {OBJECTS}"));
    check("/c0/x1 show", &format!("usage: \"/c0/x1\" is not an object; expected one of: {OBJECTS}"));
    check("/c0/v0/s1 show", &format!("usage: \"/c0/v0/s1\" is not an object; expected one of: {OBJECTS}"));
    check("/c0/vx show", "usage: /c0/vx: \"x\" is not a VD number or \"all\"");
    check("/c0/s-1 show", "usage: /c0/s-1: \"-1\" is not a slot number or \"all\"");
    check("/c0/e252/s3 show", "usage: /c0/e252/s3: storc has no enclosures; name a drive by its slot, e.g. /c0/s3");
    check(
        "/c0/vall del",
        "usage: unknown command \"/c0/vall del\"; allowed after /c0/vall: show, show all, show cc, show bgi, show init (show badblocks, del, set, cc, bgi and init commands need one VD: /c0/vN)",
    );
    check(
        "/c0",
        "usage: missing command after /c0; allowed: show, show all, show events, show patrolread, show cc, start|stop|pause|resume patrolread, add vd LEVEL drives=LIST [options], add vd cachecade r0|r1|r10 drives=LIST [wt|wb] [assignvds=LIST], set autorebuild=on|off rebuildrate=0-100 copyback=on|off ccrate=0-100 bgirate=0-100 patrolread=on|off mode=auto|manual delay=HOURS prrate=0-100 includessds=on|off cc=off|seq|conc delay=HOURS starttime=YYYY/MM/DD HH",
    );
    check("/c0 set rebuildrate=101", "usage: rebuildrate=\"101\" is not allowed; allowed: 0 to 100 (percent)");
    check("/c0 set autorebuild=maybe", "usage: autorebuild=\"maybe\" is not allowed; allowed: on, off");
    check(
        "/c0 set speed=1",
        "usage: set: unknown property \"speed\"; allowed: autorebuild=on|off, rebuildrate=0-100, copyback=on|off, ccrate=0-100, bgirate=0-100, patrolread=on|off, mode=auto|manual, delay=HOURS, prrate=0-100, includessds=on|off, cc=off|seq|conc, starttime=YYYY/MM/DD HH",
    );
    check("/c0/fall show import", "usage: unknown command \"/c0/fall show import\"; allowed after /c0/fall: show, import, del");
}

#[test]
fn rebuild_commands_and_controller_settings() {
    check("/c0 set autorebuild=off rebuildrate=60", r#"PATCH /api/v1/controller {"auto_rebuild":false,"rebuild_rate_percent":60}"#);
    check("/c0/s8 show rebuild", "GET /api/v1/rebuilds");
    check("/c0/s2 set online force", r#"POST /api/v1/drives/2/state {"state":"online","force":true}"#);
    check("/c0/sall show rebuild", "GET /api/v1/rebuilds");
    check("/c0/s8 pause rebuild", r#"POST /api/v1/drives/8/rebuild {"action":"pause"}"#);
    check("/c0/s8 start rebuild", r#"POST /api/v1/drives/8/rebuild {"action":"start"}"#);
    check("/c0/s9 insert dg=0 array=1 row=2", r#"POST /api/v1/drives/9/insert {"drive_group":0,"array":1,"row":2}"#);
    check("/c0/s9 insert dg=0 row=2", "usage: insert needs dg=D array=A row=R (the member's drive group, span and position in it)");
    check(
        "/c0/s9 insert dg=x array=0 row=0",
        "usage: insert: \"dg=x\" is not KEY=NUMBER; allowed: dg=D array=A row=R (the member's drive group, span and position in it)",
    );
    check("/c0/s9 insert dg=0 dg=1 array=0 row=0", "usage: \"dg=1\": dg= given twice; give it once");
}

#[test]
fn show_badblocks_needs_one_vd() {
    check("/c0/v2 show badblocks", "GET /api/v1/vds/2/badblocks");
    check("/c0/V2 SHOW BadBlocks", "GET /api/v1/vds/2/badblocks");
    check(
        "/c0/vall show badblocks",
        "usage: unknown command \"/c0/vall show badblocks\"; allowed after /c0/vall: show, show all, show cc, show bgi, show init (show badblocks, del, set, cc, bgi and init commands need one VD: /c0/vN)",
    );
    check(
        "/c0/v2 show badblock",
        "usage: unknown command \"/c0/v2 show badblock\"; allowed after /c0/v2: show, show all, show badblocks, show cc, show bgi, show init, del [force], delete preservedcache, set wrcache=|rdcache=|iopolicy=|name=|ssdcaching=|seqcutoff=, start cc [repair|report], stop|pause|resume cc, stop|pause|resume bgi, start init [full] [force]",
    );
    let args: Vec<String> = ["/c0/v2", "show", "badblocks", "J"].map(String::from).to_vec();
    assert!(parse(&args).unwrap().json_output);
}

#[test]
fn a_trailing_j_asks_for_json() {
    let args = |text: &str| text.split_whitespace().map(String::from).collect::<Vec<_>>();
    let invocation = parse(&args("/c0/v0 set wrcache=wb J")).unwrap();
    assert!(invocation.json_output);
    assert_eq!(invocation.action.requests().len(), 1);
    assert!(parse(&args("/c0 show j")).unwrap().json_output);
    assert!(!parse(&args("/c0 show")).unwrap().json_output);
    assert!(wants_json(&args("/c9 show J")), "known even when the rest is wrong");
}

#[test]
fn number_lists() {
    let list = |text: &str| parse_number_list("drives", text, "slot");
    assert_eq!(list("0-3,5,7-8"), Ok(vec![0, 1, 2, 3, 5, 7, 8]));
    assert_eq!(list("4"), Ok(vec![4]));
    assert_eq!(list("3,1,2"), Ok(vec![3, 1, 2]), "order is kept: it is the member order");
    assert_eq!(list("2-2"), Ok(vec![2]));
    assert_eq!(list("1-"), Err(UsageError("drives=1-: \"\" is not a slot number".into())));
    assert_eq!(list("-1"), Err(UsageError("drives=-1: \"\" is not a slot number".into())));
    assert_eq!(list("1-2-3"), Err(UsageError("drives=1-2-3: \"2-3\" is not a slot number".into())));
    assert!(list(&format!("0-{}", LIST_ENTRIES_MAX - 1)).is_ok());
    assert!(list(&format!("0-{}", LIST_ENTRIES_MAX)).is_err());
}

#[test]
fn the_journal_is_the_battery() {
    check("/c0/bbu show", "GET /api/v1/journal");
    check("/c0/journal show all", "GET /api/v1/journal");
    check("/c0/BBU show status", "GET /api/v1/journal");
    // The device keeps its case: it is a path.
    check("/c0 set journal=/Data/Journal.img", r#"POST /api/v1/journal {"source":"/Data/Journal.img"}"#);
    check("/c0 set journal=ssd:sata:8GiB", r#"POST /api/v1/journal {"source":"ssd:sata:8GiB"}"#);
    check("/c0/journal delete", "DELETE /api/v1/journal");
    check("/c0/bbu del", "DELETE /api/v1/journal");
    check(
        "/c0/bbu start learn",
        "usage: unknown command \"/c0/bbu start learn\"; allowed after /c0/bbu: show, show all, show status, delete (assign a journal with /c0 set journal=PATH|ssd:sata:SIZE, a mirrored pair with journal=PATH,PATH, or a slot's drive with /c0/sN set journal)",
    );
    check("/c0 set journal=/a.img,/b.img", r#"POST /api/v1/journal {"source":"/a.img,/b.img"}"#);
    check("/c0/s8 set journal", "POST /api/v1/drives/8/journal");
    check("/c0/v1 delete preservedcache", "DELETE /api/v1/vds/1/cache");
}
