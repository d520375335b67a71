//! What a command that names no known action is told: the actions its object allows. The same
//! table is the OBJECTS section of the man page (`storc man`), so the two cannot drift apart.

use super::*;

/// Each object of the storcli syntax: how it is written, what it is, and the commands it takes.
pub(crate) struct ObjectCommands {
    pub path: &'static str,
    pub what: &'static str,
    pub commands: &'static str,
}

pub(crate) const OBJECT_COMMANDS: [ObjectCommands; 7] = [
    ObjectCommands {
        path: "/c0",
        what: "the controller (storc has one)",
        commands: "show, show all, show events, show patrolread, show cc, start|stop|pause|resume patrolread, add vd LEVEL drives=LIST [options], add vd cachecade r0|r1|r10 drives=LIST [wt|wb] [assignvds=LIST], set autorebuild=on|off rebuildrate=0-100 copyback=on|off ccrate=0-100 bgirate=0-100 patrolread=on|off mode=auto|manual delay=HOURS prrate=0-100 includessds=on|off cc=off|seq|conc delay=HOURS starttime=YYYY/MM/DD HH",
    },
    ObjectCommands {
        path: "/c0/vall",
        what: "every virtual drive",
        commands: "show, show all, show cc, show bgi, show init (show badblocks, del, set, cc, bgi and init commands need one VD: /c0/vN)",
    },
    ObjectCommands {
        path: "/c0/vN",
        what: "virtual drive N",
        commands: "show, show all, show badblocks, show cc, show bgi, show init, del [force], delete preservedcache, set wrcache=|rdcache=|iopolicy=|name=|ssdcaching=|seqcutoff=, start cc [repair|report], stop|pause|resume cc, stop|pause|resume bgi, start init [full] [force]",
    },
    ObjectCommands {
        path: "/c0/sall",
        what: "every drive slot",
        commands: "show, show all, show rebuild, show copyback (add, delete, set, rebuild and copyback commands need one slot: /c0/sN)",
    },
    ObjectCommands {
        path: "/c0/sN",
        what: "the drive in slot N",
        commands: "show, show all, show rebuild, show copyback, add hotsparedrive [dgs=LIST], delete hotsparedrive, set offline|online|missing|good|journal, start|stop|pause|resume rebuild, insert dg=D array=A row=R, start copyback target=M, stop|pause|resume copyback",
    },
    ObjectCommands { path: "/c0/fall", what: "configurations of other controllers found on drives", commands: "show, import, del" },
    ObjectCommands {
        path: "/c0/journal",
        what: "the cache's journal, storcli's battery (also /c0/bbu)",
        commands: "show, show all, show status, delete (assign a journal with /c0 set journal=PATH|ssd:sata:SIZE, a mirrored pair with journal=PATH,PATH, or a slot's drive with /c0/sN set journal)",
    },
];

pub(super) fn unknown_command(object: Object, path: &str, tokens: &[String]) -> String {
    let entry = match object {
        Object::Controller => 0,
        Object::Vds(Target::All) => 1,
        Object::Vds(Target::One(_)) => 2,
        Object::Slots(Target::All) => 3,
        Object::Slots(Target::One(_)) => 4,
        Object::Foreign => 5,
        Object::Journal => 6,
    };
    let allowed = OBJECT_COMMANDS[entry].commands;
    if tokens.is_empty() {
        return format!("missing command after {path}; allowed: {allowed}");
    }
    format!("unknown command \"{path} {}\"; allowed after {path}: {allowed}", tokens.join(" "))
}
