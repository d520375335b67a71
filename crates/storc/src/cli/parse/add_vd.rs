//! `/c0 add vd ...`: a VD's level, drives, strip, name, span and policies in any order, and a
//! cache VD (`cachecade`), checked against `layout`'s rules before anything is sent.

use super::{parse_number_list, parse_vd_name, set_once, usage, Choice, UsageError, STRIP_KIB_ALLOWED, STRIP_KIB_DEFAULT};
use crate::api_types::CreateVd;
use layout::{Geometry, GeometryConfig, LayoutError, Level, KIB};

/// The tokens of `add vd`, in any order, before they are checked as a whole.
#[derive(Default)]
struct VdSpec {
    level: Option<Level>,
    drives: Option<Vec<u32>>,
    strip_kib: Option<u64>,
    name: Option<String>,
    pdperarray: Option<u32>,
    write_policy: Option<String>,
    read_policy: Option<String>,
    io_policy: Option<String>,
    cachecade: bool,
    assign_vds: Option<Vec<u32>>,
    seq_cutoff: Option<String>,
}

pub(super) const ADD_VD_ALLOWED: &str = "a level (r0, r1, r1e, r5, r6, r10, r50, r60, jbod or type=raid5), drives=LIST, \
     strip=KiB, name=NAME, pdperarray=N, wt|wb|awb, nora|ra|adra, direct|cached, seqcutoff=default|off|SIZE, cachecade, \
     assignvds=LIST";

pub(super) fn parse_add_vd(tokens: &[String]) -> Result<CreateVd, UsageError> {
    let mut spec = VdSpec::default();
    for token in tokens {
        match token.split_once('=') {
            Some((key, value)) => spec.take_option(&key.to_ascii_lowercase(), value, token)?,
            None => spec.take_word(token)?,
        }
    }
    spec.finish()
}

impl VdSpec {
    fn take_word(&mut self, token: &str) -> Result<(), UsageError> {
        if let Some(word) = Choice::write_policy().find(token) {
            return set_once(&mut self.write_policy, word.to_string(), "write policy", token);
        }
        if let Some(word) = Choice::read_policy().find(token) {
            return set_once(&mut self.read_policy, word.to_string(), "read policy", token);
        }
        if let Some(word) = Choice::io_policy().find(token) {
            return set_once(&mut self.io_policy, word.to_string(), "IO policy", token);
        }
        if token.eq_ignore_ascii_case("cachecade") {
            self.cachecade = true;
            return Ok(());
        }
        match parse_level(token) {
            Ok(level) => set_once(&mut self.level, level, "RAID level", token),
            Err(error) if looks_like_level(token) => Err(error),
            Err(_) => usage(format!("unknown option \"{token}\" for add vd; allowed: {ADD_VD_ALLOWED}")),
        }
    }

    fn take_option(&mut self, key: &str, value: &str, token: &str) -> Result<(), UsageError> {
        match key {
            "type" => set_once(&mut self.level, parse_level(value)?, "RAID level", token),
            "drives" => set_once(&mut self.drives, parse_number_list("drives", value, "slot")?, "drives=", token),
            "strip" => set_once(&mut self.strip_kib, parse_strip_kib(value)?, "strip=", token),
            "name" => set_once(&mut self.name, parse_vd_name(value)?, "name=", token),
            "pdperarray" => set_once(&mut self.pdperarray, parse_pdperarray(value)?, "pdperarray=", token),
            "assignvds" => set_once(&mut self.assign_vds, parse_number_list("assignvds", value, "VD")?, "assignvds=", token),
            "seqcutoff" => {
                let cutoff = engine::config::SeqCutoff::parse(value).or_else(usage)?;
                set_once(&mut self.seq_cutoff, cutoff.text(), "seqcutoff=", token)
            }
            _ => usage(format!("unknown option \"{token}\" for add vd; allowed: {ADD_VD_ALLOWED}")),
        }
    }

    fn finish(self) -> Result<CreateVd, UsageError> {
        let Some(level) = self.level else {
            return usage("add vd needs a RAID level; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod");
        };
        let Some(drives) = self.drives else {
            return usage("add vd needs drives=LIST, e.g. drives=0-3,5");
        };
        check_geometry(level, drives.len(), self.pdperarray, self.strip_kib.unwrap_or(STRIP_KIB_DEFAULT))?;
        if self.cachecade && !matches!(level, Level::Raid0 | Level::Raid1 | Level::Raid10) {
            return usage(format!("add vd cachecade: a cache VD is r0, r1 or r10, not {}", level.short_name()));
        }
        if !self.cachecade && self.assign_vds.is_some() {
            return usage("assignvds= is for a cache VD: add vd cachecade r0|r1|r10 drives=LIST assignvds=LIST");
        }
        if self.cachecade && self.seq_cutoff.is_some() {
            return usage("seqcutoff= is for a VD behind the journal; a cache VD (add vd cachecade) takes none");
        }
        Ok(CreateVd {
            cachecade: self.cachecade,
            assign_vds: self.assign_vds.unwrap_or_default(),
            level: level.short_name().to_string(),
            drives,
            strip_kib: self.strip_kib,
            name: self.name,
            pdperarray: self.pdperarray,
            write_policy: self.write_policy,
            read_policy: self.read_policy,
            io_policy: self.io_policy,
            seq_cutoff: self.seq_cutoff,
        })
    }
}

pub(super) fn parse_level(text: &str) -> Result<Level, UsageError> {
    Level::parse(text).map_err(|error| UsageError(error.to_string()))
}

/// `r7`, `raid3`: meant as a level, so the error lists the levels rather than every option.
fn looks_like_level(token: &str) -> bool {
    let lower = token.to_ascii_lowercase();
    let after_r = lower.strip_prefix("raid").or_else(|| lower.strip_prefix('r'));
    after_r.is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// Applies `layout`'s drive-count and span rules, the ones the controller applies, before
/// anything is sent. The member size is large enough that only those rules can fail.
fn check_geometry(level: Level, drive_count: usize, pdperarray: Option<u32>, strip_kib: u64) -> Result<(), UsageError> {
    const MEMBER_SIZE_BYTES: u64 = 1 << 40;
    let config = GeometryConfig {
        level,
        drive_count,
        drives_per_span: pdperarray.map(|count| count as usize),
        strip_size_bytes: strip_kib * KIB,
        member_size_bytes: MEMBER_SIZE_BYTES,
        member_reserved_bytes: 0,
    };
    match Geometry::new(config) {
        Ok(_) => Ok(()),
        Err(error @ LayoutError::MemberTooSmall { .. }) => {
            unreachable!("a 1 TiB member fits any strip: {error}")
        }
        Err(error) => usage(error.to_string()),
    }
}

fn parse_strip_kib(text: &str) -> Result<u64, UsageError> {
    let allowed = STRIP_KIB_ALLOWED.map(|kib| kib.to_string()).join(", ");
    match text.parse::<u64>() {
        Ok(kib) if STRIP_KIB_ALLOWED.contains(&kib) => Ok(kib),
        Ok(kib) => usage(format!("strip={text}: {kib} KiB is not a strip size; allowed (KiB): {allowed}")),
        Err(_) => usage(format!("strip={text}: \"{text}\" is not a number of KiB; allowed (KiB): {allowed}")),
    }
}

fn parse_pdperarray(text: &str) -> Result<u32, UsageError> {
    text.parse::<u32>().map_err(|_| UsageError(format!("pdperarray={text}: \"{text}\" is not a number of drives per span")))
}
