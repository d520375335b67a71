//! `storc man` and `storc completions SHELL`: the manual pages and the shell completions, made
//! from the clap definition by `clap_mangen` and `clap_complete` (clap's own companions, so the
//! pages and completions follow every flag without a second copy to keep in step).
//!
//! The storcli-style commands (`storc /c0/v0 show all`) are parsed by hand, not by clap, so
//! storc(1) adds the OBJECTS section from the CLI's own table of objects and commands
//! (`cli::OBJECT_COMMANDS`, the same one its usage errors quote), then examples, files,
//! environment and exit status. The packaging script runs the built binary to make them
//! (`scripts/build-deb`), so the package's pages are the binary's own.

use crate::cli::{ObjectCommands, API_SOCKET_DEFAULT, OBJECT_COMMANDS};
use clap_mangen::roff::{bold, italic, roman, Roff};
use clap_mangen::Man;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ManArgs {
    /// Write every page (storc.1, and storc-serve.1, storc-bench.1, ... for the subcommands) into
    /// this directory, which must exist, instead of printing storc.1.
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// Shown by `storc --help` and in storc(1)'s description.
pub const OBJECT_SYNTAX_HELP: &str = "\
Controller commands take storcli's syntax, parsed before the subcommands above:
  storc [--api PATH|tcp:HOST:PORT|https://HOST:PORT [--api-ca FILE]] /c0[/vN|/vall|/sN|/sall|/fall|/journal] COMMAND... [J]
e.g. storc /c0 show, storc /c0/vall show, storc /c0/s3 set offline, storc /c0/v0 start cc.
A trailing J prints JSON. man storc lists every object and its commands.";

/// `storc man [--dir DIR]`.
pub fn man(command: clap::Command, args: &ManArgs) -> Result<(), String> {
    let page = storc_page(command.clone()).map_err(|e| format!("cannot render storc(1): {e}"))?;
    let Some(dir) = &args.dir else {
        return std::io::stdout().write_all(&page).map_err(|e| format!("cannot write storc(1): {e}"));
    };
    if !dir.is_dir() {
        return Err(format!("--dir {}: not a directory; create it first", dir.display()));
    }
    clap_mangen::generate_to(command, dir).map_err(|e| format!("cannot write the pages into {}: {e}", dir.display()))?;
    // generate_to wrote clap's plain storc.1 too: the page with the storcli syntax replaces it.
    let main = dir.join("storc.1");
    std::fs::write(&main, &page).map_err(|e| format!("cannot write {}: {e}", main.display()))?;
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("storc") && name.ends_with(".1"))
        .collect();
    names.sort();
    println!("{}", names.join("\n"));
    Ok(())
}

/// `storc completions SHELL`.
pub fn completions(mut command: clap::Command, args: &CompletionsArgs) -> Result<(), String> {
    // Into memory first: clap_complete panics on a write error (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "storc", &mut script);
    std::io::stdout().write_all(&script).map_err(|e| format!("cannot write the {} completions: {e}", args.shell))
}

/// storc(1): clap's sections for the subcommands and options, and the storcli syntax's own.
fn storc_page(command: clap::Command) -> std::io::Result<Vec<u8>> {
    let version = command.get_version().unwrap_or_default().to_string();
    // As clap_mangen::generate_to does: `help` is clap's, not a page of its own.
    let command = command.disable_help_subcommand(true);
    let man = Man::new(command).source(format!("storc {version}")).manual("storc manual");
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    object_synopsis().to_writer(&mut page)?;
    man.render_description_section(&mut page)?;
    objects_section().to_writer(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    closing_sections().to_writer(&mut page)?;
    man.render_version_section(&mut page)?;
    Ok(without_repeated_preambles(page))
}

/// Every rendered piece starts with roff's apostrophe preamble; one at the top is enough.
fn without_repeated_preambles(page: Vec<u8>) -> Vec<u8> {
    let preamble = Roff::new().render();
    let text = String::from_utf8(page).expect("roff output is UTF-8");
    format!("{preamble}{}", text.replace(&preamble, "")).into_bytes()
}

fn object_synopsis() -> Roff {
    let mut roff = Roff::new();
    roff.control("br", []);
    roff.text([
        bold("storc"),
        roman(" ["),
        bold("--api"),
        roman(" "),
        italic("PATH"),
        roman("|"),
        bold("tcp:"),
        italic("HOST:PORT"),
        roman("|"),
        bold("https://"),
        italic("HOST:PORT"),
        roman(" ["),
        bold("--api-ca"),
        roman(" "),
        italic("FILE"),
        roman("]] "),
        italic("OBJECT"),
        roman(" "),
        italic("COMMAND"),
        roman("... ["),
        bold("J"),
        roman("]"),
    ]);
    roff
}

fn objects_section() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["OBJECTS"]);
    roff.text([roman(
        "Controller commands take storcli's syntax: an object path, a command and its options, parsed by storc itself (so \
         the words are storcli's, not getopt's). They go to the daemon's management API: the socket given with --api, \
         else the STORC_API environment variable, else ",
    )]);
    roff.text([roman(format!("{API_SOCKET_DEFAULT}. A trailing J prints JSON. Bad input is refused before anything is sent."))]);
    for ObjectCommands { path, what, commands } in &OBJECT_COMMANDS {
        roff.control("TP", []);
        roff.text([bold(*path), roman(format!(": {what}"))]);
        roff.text([roman(*commands)]);
    }
    roff.control("SH", ["EXAMPLES"]);
    for (command, what) in EXAMPLES {
        roff.control("TP", []);
        roff.text([bold(command)]);
        roff.text([roman(what)]);
    }
    roff
}

const EXAMPLES: [(&str, &str); 8] = [
    ("storc serve --data-dir /var/lib/storc", "Runs the controller: eight 8 GiB sparse drives and a RAID5 on the first start."),
    ("storc /c0 show", "The controller, its drives and virtual drives."),
    ("storc /c0 add vd r5 drives=0-6 strip=64 name=db wt nora direct", "Creates a RAID5 of slots 0 to 6, exported over NBD as db."),
    ("storc /c0/s7 add hotsparedrive", "Makes slot 7 a global hot spare."),
    ("storc /c0/s2 set offline", "Takes a member out: the spare takes its place and is rebuilt."),
    ("storc /c0/v0 start cc", "Checks (and repairs) the parity of v0."),
    ("storc /c0/v0 show all J", "Everything about v0, as JSON."),
    ("storc serve --api-listen 127.0.0.1:9290 --metrics-any-user", "Serves Prometheus metrics at http://127.0.0.1:9290/metrics."),
];

fn closing_sections() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["FILES"]);
    for (file, what) in [
        ("DATA-DIR/api.sock", "The management API (HTTP/1.1 and JSON; GET /metrics for Prometheus), owner-only."),
        ("DATA-DIR/nbd.sock", "Every virtual drive as an NBD export named after it, owner-only."),
        ("DATA-DIR/controller.id", "Which configuration on the drives is this controller's."),
        ("DATA-DIR/events.log", "The last 1000 events, kept across restarts."),
        ("DATA-DIR/drive-N.img", "The default drives, when no --drive is given."),
    ] {
        roff.control("TP", []);
        roff.text([italic(file)]);
        roff.text([roman(what)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    roff.control("TP", []);
    roff.text([bold("STORC_API")]);
    roff.text([roman("The management API the storcli-style commands use when --api is not given.")]);
    roff.control("TP", []);
    roff.text([bold("STORC_API_CA")]);
    roff.text([roman(
        "The CA certificates (PEM) an https:// management API must verify against when --api-ca is not given; without \
         either, the system's trusted CAs.",
    )]);
    roff.control("TP", []);
    roff.text([bold("STORC_API_TOKEN")]);
    roff.text([roman("The API token sent over tcp: and https:// (else ./storc-data/api.token).")]);
    roff.control("TP", []);
    roff.text([bold("STORC_LOG")]);
    roff.text([roman("The log filter (tracing's syntax, e.g. info or engine=debug); warn by default.")]);
    roff.control("SH", ["EXIT STATUS"]);
    roff.text([roman(
        "0 on success; 1 when the daemon refused or failed the command, or could not be reached; 2 for a usage error \
         (nothing was sent).",
    )]);
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman("storc-serve(1), storc-bench(1), nbdinfo(1), nbdcopy(1), qemu-img(1), nbd-client(8)")]);
    roff
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn storc_1_documents_the_subcommands_and_every_object_of_the_storcli_syntax() {
        let page = String::from_utf8(storc_page(crate::Cli::command()).unwrap()).unwrap();
        assert_eq!(page.matches(&Roff::new().render()).count(), 1, "one preamble");
        for heading in [".SH NAME", ".SH SYNOPSIS", ".SH OBJECTS", ".SH EXAMPLES", ".SH OPTIONS", ".SH SUBCOMMANDS", ".SH \"EXIT STATUS\""]
        {
            assert!(page.contains(heading), "{heading} missing");
        }
        for object in &OBJECT_COMMANDS {
            assert!(page.contains(&format!("\\fB{}\\fR", object.path)), "{} missing", object.path);
        }
        for subcommand in ["storc\\-serve(1)", "storc\\-bench(1)"] {
            assert!(page.contains(subcommand), "{subcommand} missing:\n{page}");
        }
    }
}
