//! Scheduled consistency checks (`/c0 set cc=off|seq|conc delay=HOURS starttime=...`, storcli's
//! CC schedule): at `next_start` a round starts, checking every VD with redundancy in repair
//! mode, one after another (`seq`) or all at once (`conc`); the next round is `delay` hours
//! later. The schedule, next start included, is in the metadata, so a restart keeps it; a round
//! under way is not (a restart forgets the VDs it had not reached yet). A VD that cannot be
//! checked when its turn comes (degraded, resyncing, a check already running) is skipped with an
//! event. The controller's periodic tick (the bitmap daemon's) drives it.

use super::*;
use crate::config::{CcMode, CcSchedule};

impl Controller {
    /// The schedule, and the VDs of a sequential round still waiting for their turn.
    pub fn cc_schedule(&self) -> (CcSchedule, Vec<u32>) {
        let schedule = self.state.lock().expect("controller lock").config.settings.cc_schedule;
        (schedule, self.cc_queue.lock().expect("cc queue lock").clone())
    }

    /// Called every few seconds: the next VD of a sequential round, and a round that is due.
    pub(super) fn cc_schedule_tick(&self) {
        self.start_next_queued_cc();
        let mut state = self.state.lock().expect("controller lock");
        let schedule = state.config.settings.cc_schedule;
        let now = now_unix_secs();
        if schedule.mode == CcMode::Off || now < schedule.next_start_unix_secs {
            return;
        }
        let delay_secs = u64::from(schedule.delay_hours) * 3600;
        let mut next = schedule.next_start_unix_secs;
        while next <= now {
            next += delay_secs;
        }
        state.config.settings.cc_schedule.next_start_unix_secs = next;
        let vds: Vec<u32> = state.config.vds.iter().filter(|v| v.level.span_kind() != layout::SpanKind::Stripe).map(|v| v.vd_id).collect();
        // Recorded before it starts: a crash must not start the same round again at once.
        if let Err(error) = self.persist(&mut state) {
            self.log(Severity::Warning, format!("scheduled consistency checks: the next start could not be recorded: {error}"));
        }
        drop(state);
        let listed = vds.iter().map(|vd| format!("v{vd}")).collect::<Vec<_>>().join(", ");
        let mode = schedule.mode.short_name();
        self.log(
            Severity::Info,
            format!("scheduled consistency check round started ({mode}): {listed}; the next in {} hours", schedule.delay_hours),
        );
        match schedule.mode {
            CcMode::Concurrent => vds.into_iter().for_each(|vd_id| self.start_scheduled_cc(vd_id)),
            _ => {
                *self.cc_queue.lock().expect("cc queue lock") = vds;
                self.start_next_queued_cc();
            }
        }
    }

    /// Sequential round: once no check runs, the next VD of the queue.
    fn start_next_queued_cc(&self) {
        if !self.checks().is_empty() {
            return;
        }
        let next = {
            let mut queue = self.cc_queue.lock().expect("cc queue lock");
            (!queue.is_empty()).then(|| queue.remove(0))
        };
        if let Some(vd_id) = next {
            self.start_scheduled_cc(vd_id);
        }
    }

    fn start_scheduled_cc(&self, vd_id: u32) {
        if let Err(error) = self.start_cc(vd_id, true) {
            self.log(Severity::Warning, format!("scheduled consistency check of v{vd_id} skipped: {error}"));
        }
    }
}
