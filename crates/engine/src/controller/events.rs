//! The controller's event log: the last [`EVENTS_MAX`] events in memory for `show events`, and
//! optionally a file in the daemon's data directory so that the log covers earlier boots, as
//! storcli's does.
//!
//! The file is text, one event a line: `sequence TAB unix-seconds TAB severity TAB description`.
//! It is appended to as events happen and rewritten with only the recent events when it grows
//! past twice [`EVENTS_MAX`] lines. It is diagnostics, not state: a line lost in a crash or a
//! file that cannot be written costs history, never data, so it is not fsynced.

use super::{now_unix_secs, Event, Severity};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Events kept in memory for `show events` (and in the file after a rewrite).
pub const EVENTS_MAX: usize = 1000;

pub(super) struct EventLog {
    next_sequence: u64,
    recent: VecDeque<Event>,
    file: Option<EventFile>,
}

struct EventFile {
    path: PathBuf,
    file: File,
    line_count: usize,
}

impl EventLog {
    /// A log kept in memory only.
    pub(super) fn in_memory() -> EventLog {
        EventLog { next_sequence: 1, recent: VecDeque::new(), file: None }
    }

    /// A log that continues the one in `path` (created owner-only if absent). A line that does
    /// not parse is skipped: a torn last line after a crash is expected.
    pub(super) fn open(path: &Path) -> std::io::Result<EventLog> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(error),
        };
        let mut recent: VecDeque<Event> = text.lines().filter_map(parse_line).collect();
        let line_count = text.lines().count();
        while recent.len() > EVENTS_MAX {
            recent.pop_front();
        }
        let next_sequence = recent.back().map_or(1, |e| e.sequence + 1);
        let mut file = OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        if !text.is_empty() && !text.ends_with('\n') {
            // End a torn last line, so that the next event starts a line of its own.
            file.write_all(b"\n")?;
        }
        let file = Some(EventFile { path: path.to_path_buf(), file, line_count });
        Ok(EventLog { next_sequence, recent, file })
    }

    pub(super) fn push(&mut self, severity: Severity, description: String) {
        let event = Event { sequence: self.next_sequence, time_unix_secs: now_unix_secs(), severity, description };
        self.next_sequence += 1;
        if let Some(file) = &mut self.file {
            file.append(&event);
        }
        self.recent.push_back(event);
        if self.recent.len() > EVENTS_MAX {
            self.recent.pop_front();
        }
        if self.file.as_ref().is_some_and(|f| f.line_count > 2 * EVENTS_MAX) {
            self.rewrite();
        }
    }

    pub(super) fn recent(&self) -> Vec<Event> {
        self.recent.iter().cloned().collect()
    }

    /// Replaces the file with the recent events (write a new file, then rename it over the old).
    fn rewrite(&mut self) {
        let Some(file) = &mut self.file else { return };
        let temporary = file.path.with_extension("log.new");
        let text: String = self.recent.iter().map(format_line).collect();
        let replaced = std::fs::write(&temporary, text).and_then(|()| std::fs::rename(&temporary, &file.path));
        let reopened = replaced.and_then(|()| OpenOptions::new().append(true).open(&file.path));
        match reopened {
            Ok(reopened) => {
                file.file = reopened;
                file.line_count = self.recent.len();
            }
            Err(error) => tracing::warn!(path = %file.path.display(), %error, "cannot shorten the event log"),
        }
    }
}

impl EventFile {
    fn append(&mut self, event: &Event) {
        match self.file.write_all(format_line(event).as_bytes()) {
            Ok(()) => self.line_count += 1,
            Err(error) => tracing::warn!(path = %self.path.display(), %error, "cannot append to the event log"),
        }
    }
}

fn severity_name(severity: Severity) -> &'static str {
    match severity {
        Severity::Info => "info",
        Severity::Warning => "warning",
        Severity::Critical => "critical",
    }
}

fn format_line(event: &Event) -> String {
    // A description is one line in the file whatever it holds.
    let description = event.description.replace(['\n', '\r', '\t'], " ");
    format!("{}\t{}\t{}\t{description}\n", event.sequence, event.time_unix_secs, severity_name(event.severity))
}

fn parse_line(line: &str) -> Option<Event> {
    let mut fields = line.splitn(4, '\t');
    let sequence = fields.next()?.parse().ok()?;
    let time_unix_secs = fields.next()?.parse().ok()?;
    let severity = match fields.next()? {
        "info" => Severity::Info,
        "warning" => Severity::Warning,
        "critical" => Severity::Critical,
        _ => return None,
    };
    Some(Event { sequence, time_unix_secs, severity, description: fields.next()?.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reopened_log_continues_the_sequence_and_keeps_old_events() {
        let dir = std::env::temp_dir().join(format!("storc-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.log");
        let _ = std::fs::remove_file(&path);
        let mut log = EventLog::open(&path).unwrap();
        log.push(Severity::Info, "first\nboot".into());
        log.push(Severity::Critical, "slot 3 failed".into());
        drop(log);
        // A torn last line, as a crash may leave.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"3\t17").unwrap();
        let mut log = EventLog::open(&path).unwrap();
        log.push(Severity::Warning, "second boot".into());
        let descriptions: Vec<(u64, String)> = log.recent().into_iter().map(|e| (e.sequence, e.description)).collect();
        assert_eq!(descriptions, vec![(1, "first boot".to_string()), (2, "slot 3 failed".to_string()), (3, "second boot".to_string())]);
        for _ in 0..2 * EVENTS_MAX + 5 {
            log.push(Severity::Info, "filler".into());
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines <= 2 * EVENTS_MAX + 1, "the file is shortened, {lines} lines");
        assert_eq!(log.recent().len(), EVENTS_MAX);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
