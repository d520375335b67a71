//! `--target` as text: the forms it accepts, parsed into a [`TargetSpec`], and written back
//! normalised for reports. Pure: opening a target is [`crate::open`]'s job.

use drive::{EmulatedDriveSpec, RbdSpec, RBD_FORM};
use engine::config::{IoPolicy, ReadPolicy, SeqCutoff, WritePolicy};
use layout::Level;
use nbd::NbdUri;
use std::path::PathBuf;

/// The forms `--target` accepts, for help texts and error messages.
pub const TARGET_FORMS: &str = "\
TARGET is one of:
  nbd://HOST[:PORT]/EXPORT          an NBD export over TCP (one connection per worker)
  nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH
                                    the same over TLS, with USER's key from a psktool file
  nbd+unix:///EXPORT?socket=PATH    an NBD export over a Unix socket
  PATH                              an existing file or block device (O_DIRECT through io_uring)
  raw:DRIVE                         one DRIVE (below) made in this process and driven directly
                                    through the engine's shards, past every RAID layer
  set:N:TARGET                      N disks, each a vd:... or raw:... TARGET, on one engine; a
                                    pattern's workers take the disks as IOMeter's do (8 workers
                                    on 16 disks: two each, every disk at the pattern's QD)
  vd:LEVEL:COUNTxDRIVE[:strip=KIB][:span=N][:POLICY...][:seqcutoff=C][:journal=DRIVE][:cachecade=...]
                                    a virtual drive built in this process, no daemon:
    LEVEL   r0 r1 r1e r5 r6 r10 r50 r60 jbod
    COUNT   member drives
    DRIVE   mem:SIZE[,filled]                   RAM, allocated on first write (filled: all of it
                                                written first, so that reads copy memory)
            hdd:7200|10k|15k:SIZE[,OPTION...]   emulated hard disk, real clock
            ssd:sata|sas|nvme:SIZE[,OPTION...]  emulated SSD, real clock
            file:DIR:SIZE[,filled]              sparse files made in DIR, removed at exit
                                                (filled: every block written once, as a drive
                                                is preconditioned, so that reads find data and
                                                writes allocate nothing; kept in DIR as
                                                storc-bench-filled-NAME-BYTES.img for later runs)
            rbd:POOL/IMAGE[?conf=PATH&id=USER]  existing RBD images of a Ceph cluster: a vd:'s
                                                members are IMAGE-0 ... IMAGE-(COUNT-1) (a set's
                                                IMAGE-DISK.MEMBER, a journal IMAGE-journal);
                                                raw: drives IMAGE itself (set: IMAGE-rawDISK)
    strip   strip size in KiB (default 64); span: drives per span for r10/r50/r60
    POLICY  wt|wb|awb (write, default wt), nora|ra|adra (read-ahead), direct|cached (IO)
    seqcutoff  from which stream length writes of a row or more go around the journal to the
            members: default (4MiB without parity, off with it), off, or a size in MiB
    journal the cache's journal (WB needs one; last, as it may hold colons): a DRIVE as above
    cachecade  an SSD cache in front of the VD: a cache VD built of its own drives (last of
            all; LEVEL:COUNTxDRIVE[:strip=KIB][:span=N], its LEVEL r0, r1 or r10), caching
            write-through (wt, default) or write-back (wb)
  e.g. vd:r5:8xhdd:15k:600GiB:strip=64   vd:r10:4xmem:1GiB   vd:r6:6xfile:/var/tmp:2GiB
       vd:r5:8xhdd:15k:600GiB:wb:journal=ssd:sata:8GiB
       vd:r10:8xhdd:15k:32GiB,nowritecache:cachecade=r0:3xssd:sas:2GiB:wb
       set:16:vd:jbod:1xssd:nvme:20GiB   set:16:raw:ssd:nvme:20GiB (the HBA tests of seed 002)
       vd:r0:4xrbd:rbd/bench?conf=/etc/ceph/ceph.conf   raw:rbd:rbd/bench-0";

/// A parsed `--target`.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetSpec {
    Nbd {
        uri: NbdUri,
        text: String,
    },
    Path(PathBuf),
    Vd(VdSpec),
    /// `raw:DRIVE`.
    Raw(MemberSpec),
    /// `set:N:TARGET`: `count` disks, each opened from `each` (a `Vd` or a `Raw`).
    Set {
        count: usize,
        each: Box<TargetSpec>,
    },
}

/// `vd:LEVEL:COUNTxDRIVE[:strip=KIB][:span=N]`.
#[derive(Clone, Debug, PartialEq)]
pub struct VdSpec {
    pub level: Level,
    pub drive_count: usize,
    pub drive: MemberSpec,
    pub strip_size_bytes: u64,
    pub drives_per_span: Option<usize>,
    pub write_policy: WritePolicy,
    pub read_policy: ReadPolicy,
    pub io_policy: IoPolicy,
    /// The cache's journal drive.
    pub journal: Option<MemberSpec>,
    /// The SSD cache's cache VD (`cachecade=`), built of its own drives.
    pub ssd_cache: Option<Box<VdSpec>>,
    /// From which stream length large writes go around the journal (`seqcutoff=`).
    pub seq_cutoff: SeqCutoff,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MemberSpec {
    Mem {
        capacity_bytes: u64,
        /// Every byte written before the run (`,filled`): reads then copy memory, where those
        /// of a fresh drive return zeros without touching any.
        filled: bool,
    },
    Emulated(EmulatedDriveSpec),
    Files {
        dir: PathBuf,
        capacity_bytes: u64,
        /// Every block written before the first run and the files kept for the next
        /// (`,filled`): a sparse file reads holes as zeros without touching the disk (a RAID5
        /// read-modify-write then reads nothing) and allocates blocks at every first write,
        /// which a drive does neither of.
        filled: bool,
    },
    /// Existing RBD images: this one (`raw:`), or named after it per member.
    Rbd(RbdSpec),
}

const STRIP_KIB_DEFAULT: u64 = 64;
const MEMBERS_MAX: usize = 32;
/// Disks of a `set:`: as many as two 16-port HBAs.
pub const SET_DISKS_MAX: usize = 32;

impl TargetSpec {
    /// # Errors
    /// A message that quotes the target, names the wrong part and lists the allowed forms.
    pub fn parse(text: &str) -> Result<TargetSpec, String> {
        let text = text.trim();
        if text.starts_with("nbd") && text.contains("://") {
            let uri: NbdUri = text.parse().map_err(|e| format!("--target {text}: {e}"))?;
            return Ok(TargetSpec::Nbd { uri, text: text.to_string() });
        }
        let wrong = |problem: String| format!("--target {text}: {problem}\n{TARGET_FORMS}");
        if let Some(rest) = text.strip_prefix("vd:") {
            return parse_vd(rest).map(TargetSpec::Vd).map_err(wrong);
        }
        if let Some(rest) = text.strip_prefix("raw:") {
            return parse_member(&rest.split(':').collect::<Vec<_>>()).map(TargetSpec::Raw).map_err(wrong);
        }
        if let Some(rest) = text.strip_prefix("set:") {
            return parse_set(rest).map_err(wrong);
        }
        if text.is_empty() {
            return Err(format!("--target is empty\n{TARGET_FORMS}"));
        }
        let path = PathBuf::from(text);
        if !path.exists() {
            return Err(format!(
                "--target {text}: no such file or device (create a file with: truncate -s 8G {text}); \
                 for a VD in this process write vd:..., for NBD nbd://...\n{TARGET_FORMS}"
            ));
        }
        Ok(TargetSpec::Path(path))
    }
}

fn parse_set(rest: &str) -> Result<TargetSpec, String> {
    let (count_text, each_text) = rest.split_once(':').ok_or("expected set:N:TARGET")?;
    let count: usize = count_text.parse().map_err(|_| format!("disk count {count_text:?} is not a number"))?;
    if !(1..=SET_DISKS_MAX).contains(&count) {
        return Err(format!("disk count {count} is not allowed; allowed: 1 to {SET_DISKS_MAX}"));
    }
    let each = if let Some(vd) = each_text.strip_prefix("vd:") {
        TargetSpec::Vd(parse_vd(vd)?)
    } else if let Some(drive) = each_text.strip_prefix("raw:") {
        TargetSpec::Raw(parse_member(&drive.split(':').collect::<Vec<_>>())?)
    } else {
        return Err(format!("each disk of a set is a vd:... or a raw:... target, not {each_text:?}"));
    };
    Ok(TargetSpec::Set { count, each: Box::new(each) })
}

fn parse_vd(rest: &str) -> Result<VdSpec, String> {
    // `cachecade=` comes last of all, `journal=` before it: their drives may hold colons.
    let (rest, ssd_cache) = match rest.split_once(":cachecade=") {
        Some((before, cache)) => (before, Some(Box::new(parse_cache_vd(cache)?))),
        None => (rest, None),
    };
    let (rest, journal) = match rest.split_once(":journal=") {
        Some((before, journal)) => {
            (before, Some(parse_member(&journal.split(':').collect::<Vec<_>>()).map_err(|e| format!("journal: {e}"))?))
        }
        None => (rest, None),
    };
    let (level_text, rest) = rest.split_once(':').ok_or("expected vd:LEVEL:COUNTxDRIVE")?;
    let level = Level::parse(level_text).map_err(|_| format!("unknown level {level_text:?}; allowed: r0 r1 r1e r5 r6 r10 r50 r60 jbod"))?;
    let (count_text, rest) = rest.split_once('x').ok_or_else(|| format!("expected COUNTxDRIVE after the level, found {rest:?}"))?;
    let drive_count: usize = count_text.parse().map_err(|_| format!("drive count {count_text:?} is not a number"))?;
    if !(1..=MEMBERS_MAX).contains(&drive_count) {
        return Err(format!("drive count {drive_count} is not allowed; allowed: 1 to {MEMBERS_MAX}"));
    }
    let mut segments: Vec<&str> = rest.split(':').collect();
    let mut strip_kib = STRIP_KIB_DEFAULT;
    let mut drives_per_span = None;
    let (mut write_policy, mut read_policy, mut io_policy) = (WritePolicy::WriteThrough, ReadPolicy::NoReadAhead, IoPolicy::Direct);
    let mut seq_cutoff = SeqCutoff::LevelDefault;
    // Options come after the drive, in any order.
    while let Some(&last) = segments.last() {
        if let Some(policy) = WritePolicy::ALL.into_iter().find(|p| p.short_name() == last) {
            write_policy = policy;
        } else if let Some(policy) = ReadPolicy::ALL.into_iter().find(|p| p.short_name() == last) {
            read_policy = policy;
        } else if let Some(policy) = IoPolicy::ALL.into_iter().find(|p| p.short_name() == last) {
            io_policy = policy;
        } else if let Some(("seqcutoff", value)) = last.split_once('=') {
            seq_cutoff = SeqCutoff::parse(value)?;
        } else if let Some((key @ ("strip" | "span"), value)) = last.split_once('=') {
            let number: u64 = value.parse().map_err(|_| format!("{key}={value:?} is not a number"))?;
            match key {
                "strip" => strip_kib = number,
                _ => drives_per_span = Some(number as usize),
            }
        } else {
            break;
        }
        segments.pop();
    }
    let drive = parse_member(&segments)?;
    Ok(VdSpec {
        level,
        drive_count,
        drive,
        strip_size_bytes: strip_kib * 1024,
        drives_per_span,
        write_policy,
        read_policy,
        io_policy,
        journal,
        ssd_cache,
        seq_cutoff,
    })
}

/// The cache VD of `cachecade=`: RAID0, 1 or 10, no journal of its own; its write policy is
/// its caching's (`wb`: write-back SSD caching).
fn parse_cache_vd(text: &str) -> Result<VdSpec, String> {
    let spec = parse_vd(text).map_err(|e| format!("cachecade: {e}"))?;
    if !matches!(spec.level, Level::Raid0 | Level::Raid1 | Level::Raid10) {
        return Err(format!("cachecade: a cache VD is r0, r1 or r10, not {}", spec.level.short_name()));
    }
    let other_policies =
        spec.read_policy != ReadPolicy::NoReadAhead || spec.io_policy != IoPolicy::Direct || spec.seq_cutoff != SeqCutoff::LevelDefault;
    if spec.journal.is_some() || spec.ssd_cache.is_some() || other_policies {
        return Err("cachecade: a cache VD takes LEVEL:COUNTxDRIVE[:strip=KIB][:span=N][:wt|wb] only".into());
    }
    Ok(spec)
}

/// `SIZE` or `SIZE,filled` of a `kind:` drive: the size's text and whether it is filled.
fn filled_option<'a>(kind: &str, text: &'a str) -> Result<(&'a str, bool), String> {
    match text.split_once(',') {
        None => Ok((text, false)),
        Some((capacity, "filled")) => Ok((capacity, true)),
        Some((_, option)) => Err(format!("{kind}: unknown option {option:?}; allowed: filled")),
    }
}

fn parse_member(segments: &[&str]) -> Result<MemberSpec, String> {
    let size = |text: &str| drive::parse_size_bytes(text).map_err(|e| format!("drive size: {e}"));
    match segments {
        ["mem", capacity] => {
            let (capacity, filled) = filled_option("mem", capacity)?;
            Ok(MemberSpec::Mem { capacity_bytes: size(capacity)?, filled })
        }
        ["hdd" | "ssd", ..] => EmulatedDriveSpec::parse(&segments.join(":")).map(MemberSpec::Emulated),
        ["rbd", rest @ ..] if !rest.is_empty() => RbdSpec::parse(&rest.join(":")).map(MemberSpec::Rbd),
        ["file", dir @ .., capacity] if !dir.is_empty() => {
            let dir = PathBuf::from(dir.join(":"));
            if !dir.is_dir() {
                return Err(format!("file drives: {} is not a directory", dir.display()));
            }
            let (capacity, filled) = filled_option("file", capacity)?;
            Ok(MemberSpec::Files { dir, capacity_bytes: size(capacity)?, filled })
        }
        _ => Err(format!(
            "unknown drive {:?}; allowed: mem:SIZE, hdd:CLASS:SIZE, ssd:CLASS:SIZE, file:DIR:SIZE, {RBD_FORM}",
            segments.join(":")
        )),
    }
}

impl TargetSpec {
    /// The target as `--target` writes it, normalised (every default spelled out).
    pub fn text(&self) -> String {
        match self {
            TargetSpec::Nbd { text, .. } => text.clone(),
            TargetSpec::Path(path) => path.display().to_string(),
            TargetSpec::Vd(vd) => format!("vd:{}", vd_spec_text(vd)),
            TargetSpec::Raw(drive) => format!("raw:{}", member_spec_text(drive)),
            TargetSpec::Set { count, each } => format!("set:{count}:{}", each.text()),
        }
    }
}

pub(crate) fn member_text(member: &MemberSpec) -> String {
    match member {
        MemberSpec::Emulated(spec) => format!("{spec} ({})", spec.class.model()),
        other => member_spec_text(other),
    }
}

/// The member as `--target` writes it, sizes in their largest whole binary unit.
pub(crate) fn member_spec_text(member: &MemberSpec) -> String {
    match member {
        MemberSpec::Mem { capacity_bytes, filled } => {
            format!("mem:{}{}", size_text(*capacity_bytes), if *filled { ",filled" } else { "" })
        }
        MemberSpec::Emulated(emulated) => emulated.to_string(),
        MemberSpec::Files { dir, capacity_bytes, filled } => {
            format!("file:{}:{}{}", dir.display(), size_text(*capacity_bytes), if *filled { ",filled" } else { "" })
        }
        MemberSpec::Rbd(rbd) => rbd.to_string(),
    }
}

fn size_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(unit, _)| bytes > 0 && bytes.is_multiple_of(*unit)) {
        Some((unit, name)) => format!("{}{name}", bytes / unit),
        None => bytes.to_string(),
    }
}

fn vd_spec_text(spec: &VdSpec) -> String {
    let member = member_spec_text(&spec.drive);
    let span = spec.drives_per_span.map(|n| format!(":span={n}")).unwrap_or_default();
    let policies = format!(":{}:{}:{}", spec.write_policy.short_name(), spec.read_policy.short_name(), spec.io_policy.short_name());
    let cutoff = match spec.seq_cutoff {
        SeqCutoff::LevelDefault => String::new(),
        cutoff => format!(":seqcutoff={}", cutoff.text()),
    };
    let journal = spec.journal.as_ref().map(|j| format!(":journal={}", member_spec_text(j))).unwrap_or_default();
    let cache = spec.ssd_cache.as_ref().map(|c| format!(":cachecade={}", vd_spec_text(c))).unwrap_or_default();
    let level = spec.level.short_name();
    format!("{level}:{}x{member}:strip={}{span}{policies}{cutoff}{journal}{cache}", spec.drive_count, spec.strip_size_bytes / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drive::EmulatedClass;

    fn vd(text: &str) -> VdSpec {
        match TargetSpec::parse(text) {
            Ok(TargetSpec::Vd(spec)) => spec,
            other => panic!("{text}: {other:?}"),
        }
    }

    fn error(text: &str) -> String {
        TargetSpec::parse(text).expect_err(text)
    }

    #[test]
    fn vd_targets_parse() {
        let spec = vd("vd:r5:8xhdd:15k:600GiB:strip=64");
        assert_eq!((spec.level, spec.drive_count, spec.strip_size_bytes), (Level::Raid5, 8, 64 * 1024));
        assert_eq!(spec.drive, MemberSpec::Emulated(EmulatedDriveSpec::new(EmulatedClass::Hdd15k, 600 << 30)));
        let spec = vd("vd:r5:8xhdd:15k:600GiB:wb:adra:strip=32:journal=ssd:sata:8GiB");
        assert_eq!((spec.write_policy, spec.read_policy, spec.io_policy), (WritePolicy::WriteBack, ReadPolicy::Adaptive, IoPolicy::Direct));
        assert_eq!(spec.journal, Some(MemberSpec::Emulated(EmulatedDriveSpec::new(EmulatedClass::SsdSata, 8 << 30))));
        assert_eq!(spec.strip_size_bytes, 32 * 1024);
        assert_eq!(vd("vd:r0:2xmem:1GiB:awb:cached").io_policy, IoPolicy::Cached);
        let cutoff = vd("vd:r5:8xfile:/tmp:2GiB,filled:wb:seqcutoff=4MiB:journal=file:/tmp:2GiB");
        assert_eq!((cutoff.seq_cutoff, cutoff.write_policy), (SeqCutoff::Mib(4), WritePolicy::WriteBack));
        assert!(vd_spec_text(&cutoff).contains(":wb:nora:direct:seqcutoff=4MiB:journal=file:"), "{}", vd_spec_text(&cutoff));
        assert_eq!(vd("vd:r1:2xmem:1GiB:seqcutoff=off").seq_cutoff, SeqCutoff::Never);
        assert_eq!(vd("vd:r1:2xmem:1GiB").seq_cutoff, SeqCutoff::LevelDefault);
        let spec = vd("vd:r50:8xmem:1GiB:strip=128:span=4");
        assert_eq!(spec.drive, MemberSpec::Mem { capacity_bytes: 1 << 30, filled: false });
        assert_eq!((spec.strip_size_bytes, spec.drives_per_span), (128 * 1024, Some(4)));
        let spec = vd("vd:r1:2xssd:nvme:1TiB,qd=4");
        assert!(matches!(spec.drive, MemberSpec::Emulated(EmulatedDriveSpec { queue_depth: Some(4), .. })));
        assert_eq!(vd("vd:r6:6xfile:/tmp:2GiB").drive, MemberSpec::Files { dir: "/tmp".into(), capacity_bytes: 2 << 30, filled: false });
        let filled = vd("vd:r5:8xfile:/tmp:2GiB,filled:wb:journal=file:/tmp:1GiB");
        assert_eq!(filled.drive, MemberSpec::Files { dir: "/tmp".into(), capacity_bytes: 2 << 30, filled: true });
        assert_eq!(vd(&TargetSpec::Vd(filled.clone()).text()), filled);
        let spec = vd("vd:r10:8xhdd:15k:32GiB,nowritecache:wb:journal=ssd:sata:1GiB:cachecade=r1:2xssd:sas:2GiB:strip=256");
        let cache = spec.ssd_cache.as_ref().expect("a cache VD");
        assert_eq!((cache.level, cache.drive_count, cache.strip_size_bytes), (Level::Raid1, 2, 256 * 1024));
        assert_eq!(cache.drive, MemberSpec::Emulated(EmulatedDriveSpec::new(EmulatedClass::SsdSas, 2 << 30)));
        assert!(spec.journal.is_some());
        let text = TargetSpec::Vd(spec.clone()).text();
        assert!(text.ends_with(":cachecade=r1:2xssd:sas:2GiB:strip=256:wt:nora:direct"), "{text}");
        assert_eq!(vd(&text), spec);
    }

    #[test]
    fn raw_drives_and_sets_parse_and_write_back_the_same() {
        let nvme = MemberSpec::Emulated(EmulatedDriveSpec::new(EmulatedClass::SsdNvme, 20 << 30));
        assert_eq!(TargetSpec::parse("raw:ssd:nvme:20GiB").unwrap(), TargetSpec::Raw(nvme.clone()));
        let set = TargetSpec::parse("set:16:vd:jbod:1xssd:nvme:20GiB").unwrap();
        let TargetSpec::Set { count: 16, each } = &set else { panic!("{set:?}") };
        assert!(matches!(**each, TargetSpec::Vd(VdSpec { level: Level::Jbod, drive_count: 1, .. })));
        assert_eq!(set.text(), "set:16:vd:jbod:1xssd:nvme:20GiB:strip=64:wt:nora:direct");
        assert_eq!(TargetSpec::parse(&set.text()).unwrap(), set);
        let filled = vd("vd:r5:8xmem:64MiB,filled:cached");
        assert_eq!(filled.drive, MemberSpec::Mem { capacity_bytes: 64 << 20, filled: true });
        assert_eq!(vd(&TargetSpec::Vd(filled.clone()).text()), filled);
        let raw_set = TargetSpec::parse("set:4:raw:mem:1GiB").unwrap();
        assert_eq!(raw_set.text(), "set:4:raw:mem:1GiB");
        assert_eq!(TargetSpec::parse(&raw_set.text()).unwrap(), raw_set);
    }

    #[test]
    fn rbd_members_parse_with_their_keys_and_write_back_the_same() {
        let spec = vd("vd:r0:4xrbd:rbd/bench?conf=/etc/ceph/a.conf&id=storc:strip=1024");
        let MemberSpec::Rbd(rbd) = &spec.drive else { panic!("{spec:?}") };
        assert_eq!((rbd.image_path().as_str(), rbd.client_name().as_str()), ("rbd/bench", "client.storc"));
        assert_eq!(spec.strip_size_bytes, 1 << 20);
        let text = TargetSpec::Vd(spec.clone()).text();
        assert_eq!(text, "vd:r0:4xrbd:rbd/bench?conf=/etc/ceph/a.conf&id=storc:strip=1024:wt:nora:direct");
        assert_eq!(vd(&text), spec);
        let raw = TargetSpec::parse("raw:rbd:pool/one").unwrap();
        assert_eq!(raw.text(), "raw:rbd:pool/one");
        let message = error("vd:r0:4xrbd:rbd/bench?user=x");
        assert!(message.contains("unknown key \"user\" (allowed keys: conf, id, timeout)"), "{message}");
        assert!(error("raw:rbd:bench").contains("expected POOL/IMAGE"));
    }

    #[test]
    fn wrong_targets_name_the_wrong_part() {
        let check = |text: &str, expected: &str| {
            let message = error(text);
            assert!(message.contains(expected), "{text}: {message:?} should contain {expected:?}");
            assert!(message.contains(text), "{message:?} should quote {text}");
        };
        check("vd:r7:8xmem:1GiB", "unknown level \"r7\"");
        check("vd:r5:eightxmem:1GiB", "drive count \"eight\"");
        check("vd:r5:99xmem:1GiB", "allowed: 1 to 32");
        check("vd:r5:8xtape:1GiB", "unknown drive \"tape:1GiB\"");
        check("vd:r5:8xhdd:12k:1GiB", "unknown hdd speed");
        check("vd:r5:8xmem:1GiB:strip=big", "strip=\"big\"");
        check("vd:r5:8xmem:1GiB:seqcutoff=512KiB", "allowed: default");
        check("vd:r5:8xfile:/no/such/dir:1GiB", "is not a directory");
        check("/no/such/device", "no such file or device");
        check("nbd://host:99999/x", "port");
        check("raw:tape:1GiB", "unknown drive \"tape:1GiB\"");
        check("raw:mem:1GiB,full", "unknown option \"full\"; allowed: filled");
        check("raw:file:/tmp:1GiB,full", "file: unknown option \"full\"; allowed: filled");
        check("set:0:raw:mem:1GiB", "allowed: 1 to 32");
        check("set:many:raw:mem:1GiB", "disk count \"many\"");
        check("set:2:/dev/null", "each disk of a set is a vd:... or a raw:...");
        check("set:2:set:2:raw:mem:1GiB", "each disk of a set");
        check("vd:r5:8xmem:1GiB:cachecade=r5:3xmem:1GiB", "a cache VD is r0, r1 or r10");
        check("vd:r5:8xmem:1GiB:cachecade=r0:3xmem:1GiB:ra", "LEVEL:COUNTxDRIVE[:strip=KIB][:span=N][:wt|wb] only");
        assert!(error("vd:r5").contains("vd:LEVEL:COUNTxDRIVE"));
    }
}
