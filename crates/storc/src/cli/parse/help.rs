//! What a command that names no known action is told: the actions its object allows.

use super::*;

pub(super) fn unknown_command(object: Object, path: &str, tokens: &[String]) -> String {
    let allowed = match object {
        Object::Controller => {
            "show, show all, show events, show patrolread, show cc, start|stop|pause|resume patrolread, add vd LEVEL drives=LIST [options], add vd cachecade r0|r1|r10 drives=LIST [wt|wb] [assignvds=LIST], set autorebuild=on|off rebuildrate=0-100 copyback=on|off ccrate=0-100 bgirate=0-100 patrolread=on|off mode=auto|manual delay=HOURS prrate=0-100 includessds=on|off cc=off|seq|conc delay=HOURS starttime=YYYY/MM/DD HH"
        }
        Object::Vds(Target::All) => {
            "show, show all, show cc, show bgi, show init (show badblocks, del, set, cc, bgi and init commands need one VD: /c0/vN)"
        }
        Object::Vds(Target::One(_)) => {
            "show, show all, show badblocks, show cc, show bgi, show init, del [force], delete preservedcache, set wrcache=|rdcache=|iopolicy=|name=|ssdcaching=, start cc [repair|report], stop|pause|resume cc, stop|pause|resume bgi, start init [full] [force]"
        }
        Object::Slots(Target::All) => {
            "show, show all, show rebuild, show copyback (add, delete, set, rebuild and copyback commands need one slot: /c0/sN)"
        }
        Object::Slots(Target::One(_)) => {
            "show, show all, show rebuild, show copyback, add hotsparedrive [dgs=LIST], delete hotsparedrive, set offline|online|missing|good|journal, start|stop|pause|resume rebuild, insert dg=D array=A row=R, start copyback target=M, stop|pause|resume copyback"
        }
        Object::Foreign => "show, import, del",
        Object::Journal => "show, show all, show status, delete (assign a journal with /c0 set journal=PATH|ssd:sata:SIZE, a mirrored pair with journal=PATH,PATH, or a slot's drive with /c0/sN set journal)",
    };
    if tokens.is_empty() {
        return format!("missing command after {path}; allowed: {allowed}");
    }
    format!("unknown command \"{path} {}\"; allowed after {path}: {allowed}", tokens.join(" "))
}
