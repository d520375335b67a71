//! The cache's journal at the controller: replayed at start, trusted through the metadata,
//! watched while it runs, and what `/c0/bbu show` reports.
//!
//! Trust is the one rule: the metadata names the journal whose records a restart may replay
//! (`journal_id`). It names a journal before the cache logs anything to it, and stops naming
//! it before any write goes to the members without it (the shards hold such writes until the
//! controller has detached a failed journal). So a journal that comes back after the members
//! took writes without it is never replayed over them.

use super::{Controller, Severity};
use crate::config::WritePolicy;
use crate::journal::{Journal, ReplayReport};
use drive::Drive;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the journal watcher looks at the journal.
const WATCH_INTERVAL: Duration = Duration::from_millis(200);

/// A journal device the daemon opened.
pub struct JournalOffer {
    pub drive: Arc<dyn Drive>,
    /// What the user named (`--journal` or `set journal=`).
    pub source: String,
    /// The file behind it, watched for removal (none for emulated drives).
    pub path: Option<PathBuf>,
}

/// The journal's state, as `/c0/bbu show` names a battery's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalState {
    Optimal,
    Failed,
    Missing,
}

impl JournalState {
    pub fn short_name(self) -> &'static str {
        match self {
            JournalState::Optimal => "Optimal",
            JournalState::Failed => "Failed",
            JournalState::Missing => "Missing",
        }
    }
}

/// What `/c0/bbu show` and `/c0/journal show` report.
#[derive(Clone, Debug)]
pub struct JournalView {
    pub state: JournalState,
    pub source: Option<String>,
    pub capacity_bytes: u64,
    /// Ring bytes over every partition.
    pub ring_bytes: u64,
    /// Bytes replay could need now.
    pub used_bytes: u64,
    pub partitions: u32,
    /// What the replay at this start did.
    pub replay: ReplayReport,
    /// Why it failed or is missing.
    pub reason: Option<String>,
}

/// The journal the controller runs with.
pub(super) struct Attached {
    journal: Journal,
    source: String,
    path: Option<PathBuf>,
    /// (device, inode) of the file when it was opened: a file removed or replaced is gone.
    inode: Option<(u64, u64)>,
}

/// The journal slot of the controller: attached, or why not.
#[derive(Default)]
pub(super) struct JournalSlot {
    attached: Option<Attached>,
    /// Why there is no usable journal (failed, removed, never given).
    reason: Option<String>,
    failed: bool,
    replay: ReplayReport,
    detach_failed_logged: bool,
}

fn inode_of(path: &std::path::Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Controller {
    /// At start, after assembly and before anything is served: replays the journal the
    /// metadata trusts into the VDs, flushes them, lays the journal out anew, trusts it (in the
    /// metadata) and hands it to the shards.
    pub(super) fn open_journal(&self, offer: Option<JournalOffer>) {
        let Some(offer) = offer else {
            self.journal.lock().expect("journal lock").reason = Some("no journal was given (storc serve --journal)".into());
            self.warn_write_back_without_journal("no journal");
            return;
        };
        let trusted = self.config().settings.journal_id;
        let vds = self.vds();
        let mut apply = |record: &crate::journal::ReplayRecord| {
            let Some((_, vd)) = vds.iter().find(|(r, _)| r.vd_id == record.vd_id) else {
                return Ok(()); // the VD was deleted after the record was written
            };
            self.engine.write_at(vd, record.vd_offset_bytes, &record.data).map_err(|e| e.to_string())
        };
        let (controller_id, partitions) = (self.config().controller_id.0, self.engine.shard_count() as u32);
        vds.iter().for_each(|(_, vd)| vd.set_replaying(true));
        let opened = Journal::open(Arc::clone(&offer.drive), controller_id, partitions, trusted, &mut apply);
        vds.iter().for_each(|(_, vd)| vd.set_replaying(false));
        let journal = opened.and_then(|journal| {
            for (record, vd) in &vds {
                self.engine.flush(vd).map_err(|e| format!("v{}: flush after the journal's replay failed: {e}", record.vd_id))?;
            }
            journal.finish_replay()?;
            Ok(journal)
        });
        match journal {
            Ok(journal) => {
                let report = journal.replay_report();
                let said = match (report.found, report.untrusted) {
                    (true, _) => format!("replayed {} records ({} bytes)", report.records, report.data_bytes),
                    (false, true) => {
                        "held records the metadata does not trust (written before it was detached): formatted anew, nothing replayed".into()
                    }
                    (false, false) => "formatted".into(),
                };
                self.log(Severity::Info, format!("journal {}: {said}", offer.source));
                if let Err(error) = self.trust_and_attach(journal, offer, report) {
                    self.log(Severity::Critical, format!("journal cannot be trusted in the metadata: {error}; WB VDs run WT"));
                }
            }
            Err(error) => {
                let mut slot = self.journal.lock().expect("journal lock");
                slot.reason = Some(error.clone());
                slot.failed = true;
                drop(slot);
                self.log(Severity::Critical, format!("journal {} cannot be used: {error}", offer.source));
                self.warn_write_back_without_journal("the journal failed");
            }
        }
    }

    /// Names `journal` in the metadata, then gives it to the shards.
    fn trust_and_attach(&self, journal: Journal, offer: JournalOffer, replay: ReplayReport) -> Result<(), String> {
        {
            let mut state = self.state.lock().expect("controller lock");
            state.config.settings.journal_id = journal.journal_id();
            self.persist(&mut state).map_err(|e| e.to_string())?;
        }
        self.engine.set_journal(Some(&journal));
        let inode = offer.path.as_deref().and_then(inode_of);
        let mut slot = self.journal.lock().expect("journal lock");
        *slot = JournalSlot {
            attached: Some(Attached { journal, source: offer.source, path: offer.path, inode }),
            reason: None,
            failed: false,
            replay,
            detach_failed_logged: false,
        };
        Ok(())
    }

    fn warn_write_back_without_journal(&self, why: &str) {
        for (record, _) in self.vds() {
            if record.write_policy == WritePolicy::WriteBack {
                self.log(Severity::Warning, format!("v{} is WB and runs as WT: {why} (a bad battery)", record.vd_id));
            }
        }
    }

    /// Assigns a journal at run time (`/c0 set journal=PATH`): formatted anew, trusted, attached;
    /// WB VDs run WB again.
    ///
    /// # Errors
    /// A journal is attached and healthy already, or the device cannot be used.
    pub fn attach_journal(&self, offer: JournalOffer) -> Result<JournalView, super::ControlError> {
        if self.journal.lock().expect("journal lock").attached.is_some() {
            return Err(super::ControlError::Conflict(
                "a journal is attached already; it is replaced only after it fails or is removed".into(),
            ));
        }
        let journal =
            Journal::open(Arc::clone(&offer.drive), self.config().controller_id.0, self.engine.shard_count() as u32, 0, &mut |_| Ok(()))
                .and_then(|journal| journal.finish_replay().map(|()| journal))
                .map_err(super::ControlError::BadInput)?;
        let source = offer.source.clone();
        self.trust_and_attach(journal, offer, ReplayReport::default()).map_err(super::ControlError::Io)?;
        self.log(Severity::Info, format!("journal {source} attached: WB VDs run WB"));
        Ok(self.journal_view())
    }

    pub fn journal_view(&self) -> JournalView {
        let slot = self.journal.lock().expect("journal lock");
        match &slot.attached {
            Some(attached) => {
                let health = attached.journal.health();
                JournalView {
                    state: if health.is_usable() { JournalState::Optimal } else { JournalState::Failed },
                    source: Some(attached.source.clone()),
                    capacity_bytes: attached.journal.superblock().capacity_bytes,
                    ring_bytes: health.ring_bytes(),
                    used_bytes: health.used_bytes(),
                    partitions: attached.journal.superblock().partition_count,
                    replay: slot.replay,
                    reason: health.failure(),
                }
            }
            None => JournalView {
                state: if slot.failed { JournalState::Failed } else { JournalState::Missing },
                source: None,
                capacity_bytes: 0,
                ring_bytes: 0,
                used_bytes: 0,
                partitions: 0,
                replay: slot.replay,
                reason: slot.reason.clone(),
            },
        }
    }

    /// Whether WB VDs run WB now.
    pub fn journal_usable(&self) -> bool {
        self.journal_view().state == JournalState::Optimal
    }

    /// One look at the journal: a removed file fails it; a failed journal is detached (the
    /// metadata stops trusting it, then the shards let go of it and run WT).
    fn check_journal(&self) {
        let (source, reason) = {
            let slot = self.journal.lock().expect("journal lock");
            let Some(attached) = &slot.attached else { return };
            if let Some(path) = &attached.path {
                if inode_of(path) != attached.inode {
                    attached.journal.health().fail(&format!("the journal file {} was removed or replaced", path.display()));
                }
            }
            let Some(reason) = attached.journal.health().failure() else { return };
            (attached.source.clone(), reason)
        };
        // What only the journal held is written to the members and made durable there first,
        // while writes wait: once the metadata stops trusting the journal, nothing replays it.
        let persisted = self.engine.quiesce().map_err(super::ControlError::Io).and_then(|()| {
            let mut state = self.state.lock().expect("controller lock");
            state.config.settings.journal_id = 0;
            self.persist(&mut state)
        });
        let mut slot = self.journal.lock().expect("journal lock");
        if let Err(error) = persisted {
            // The shards keep holding writes, and this is tried again at the next look: better
            // stalled than overwritten by a replay.
            if !slot.detach_failed_logged {
                slot.detach_failed_logged = true;
                drop(slot);
                self.log(Severity::Critical, format!("journal {source} failed ({reason}) and cannot be detached in the metadata: {error}"));
            }
            return;
        }
        self.engine.set_journal(None);
        *slot =
            JournalSlot { attached: None, reason: Some(reason.clone()), failed: true, replay: slot.replay, detach_failed_logged: false };
        drop(slot);
        self.log(
            Severity::Critical,
            format!("journal {source} failed: {reason}; WB VDs run WT until a journal is assigned (/c0 set journal=PATH)"),
        );
    }

    /// Starts the thread that looks at the journal every [`WATCH_INTERVAL`].
    pub(super) fn start_journal_watch(&self) -> std::io::Result<()> {
        let controller = self.myself();
        std::thread::Builder::new().name("storc-journal".into()).spawn(move || loop {
            std::thread::sleep(WATCH_INTERVAL);
            let Some(controller) = controller.upgrade() else { return };
            controller.check_journal();
        })?;
        Ok(())
    }
}
