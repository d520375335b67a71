//! Controller settings (`/c0 set ...`): rebuild, copyback, check, BGI and patrol read rates
//! and switches, and the check schedule. Every change is checked first (bad input changes
//! nothing) and written to the metadata before it applies to the operations that run.

use super::*;
use crate::config::CcMode;

impl Controller {
    /// Changes controller settings (`/c0 set autorebuild=on|off rebuildrate=N copyback=on|off
    /// ccrate=N bgirate=N patrolread=on|off mode= delay= prrate=N includessds= cc= starttime=`);
    /// a new rate applies to running operations at once.
    ///
    /// # Errors
    /// A rate above 100 or a delay of 0 (nothing changes), or the metadata cannot be written.
    pub fn set_controller(&self, changes: ControllerChanges) -> Result<ControllerSettings, ControlError> {
        check_changes(&changes)?;
        let mut state = self.state.lock().expect("controller lock");
        apply_changes(&mut state.config.settings, &changes);
        let settings = state.config.settings;
        self.persist(&mut state)?;
        drop(state);
        self.apply_rates(&settings);
        self.log(Severity::Info, format!("controller settings: {}", settings_text(&settings)));
        Ok(settings)
    }

    /// Running operations take the new rates (and a patrol read turned off stops).
    fn apply_rates(&self, settings: &ControllerSettings) {
        for rebuild in self.rebuilds() {
            rebuild.progress.set_rate_percent(settings.rebuild_rate_percent);
        }
        for copy in self.copybacks() {
            copy.progress.set_rate_percent(settings.rebuild_rate_percent);
        }
        // A resync after an unclean stop runs at the rebuild rate (MegaRAID has no separate one
        // for it); a BGI at its own.
        for resync in self.resyncs.lock().expect("resyncs lock").values() {
            let rate_percent = if resync.bgi { settings.bgi_rate_percent } else { settings.rebuild_rate_percent };
            resync.progress.set_rate_percent(rate_percent);
        }
        for check in self.checks() {
            check.progress.set_rate_percent(settings.cc_rate_percent);
        }
        if let Some(patrol) = self.patrol_read() {
            patrol.progress.set_rate_percent(settings.patrol.rate_percent);
            if !settings.patrol.enabled {
                // Off means off: the one running stops too (as on MegaRAID).
                patrol.progress.set_control(crate::background::Control::Stop);
            }
        }
    }
}

/// Rates are percents; delays are at least an hour.
fn check_changes(changes: &ControllerChanges) -> Result<(), ControlError> {
    let rates = [
        ("rebuild rate", changes.rebuild_rate_percent),
        ("consistency check rate", changes.cc_rate_percent),
        ("background initialization rate", changes.bgi_rate_percent),
        ("patrol read rate", changes.patrol_rate_percent),
    ];
    if let Some((what, Some(rate))) = rates.into_iter().find(|(_, rate)| rate.is_some_and(|r| r > 100)) {
        return Err(ControlError::BadInput(format!("{what} {rate} is not allowed; allowed: 0 to 100 (percent)")));
    }
    let delays = [("consistency check delay", changes.cc_delay_hours), ("patrol read delay", changes.patrol_delay_hours)];
    if let Some((what, _)) = delays.into_iter().find(|(_, delay)| *delay == Some(0)) {
        return Err(ControlError::BadInput(format!("{what} 0 is not allowed; allowed: 1 to 65535 (hours)")));
    }
    Ok(())
}

/// The changes over the settings; what is not given stays. A check schedule turned on without a
/// start time starts a round at once.
fn apply_changes(settings: &mut ControllerSettings, changes: &ControllerChanges) {
    settings.auto_rebuild = changes.auto_rebuild.unwrap_or(settings.auto_rebuild);
    settings.rebuild_rate_percent = changes.rebuild_rate_percent.unwrap_or(settings.rebuild_rate_percent);
    settings.copyback = changes.copyback.unwrap_or(settings.copyback);
    settings.cc_rate_percent = changes.cc_rate_percent.unwrap_or(settings.cc_rate_percent);
    settings.bgi_rate_percent = changes.bgi_rate_percent.unwrap_or(settings.bgi_rate_percent);
    let patrol = &mut settings.patrol;
    patrol.enabled = changes.patrol_read.unwrap_or(patrol.enabled);
    patrol.manual = changes.patrol_manual.unwrap_or(patrol.manual);
    patrol.delay_hours = changes.patrol_delay_hours.unwrap_or(patrol.delay_hours);
    patrol.rate_percent = changes.patrol_rate_percent.unwrap_or(patrol.rate_percent);
    patrol.include_ssds = changes.patrol_include_ssds.unwrap_or(patrol.include_ssds);
    let cc = &mut settings.cc_schedule;
    let turned_on = cc.mode == CcMode::Off && changes.cc_mode.is_some_and(|mode| mode != CcMode::Off);
    cc.mode = changes.cc_mode.unwrap_or(cc.mode);
    cc.delay_hours = changes.cc_delay_hours.unwrap_or(cc.delay_hours);
    match changes.cc_start_unix_secs {
        Some(start) => cc.next_start_unix_secs = start,
        None if turned_on => cc.next_start_unix_secs = now_unix_secs(),
        None => {}
    }
}

/// The settings in `set`'s words, for the event.
fn settings_text(settings: &ControllerSettings) -> String {
    let on_off = |on: bool| if on { "on" } else { "off" };
    let (patrol, cc) = (&settings.patrol, &settings.cc_schedule);
    format!(
        "autorebuild={} rebuildrate={} copyback={} ccrate={} bgirate={}; patrolread={} mode={} delay={} prrate={} includessds={}; cc={} delay={} (next start at Unix second {})",
        on_off(settings.auto_rebuild),
        settings.rebuild_rate_percent,
        on_off(settings.copyback),
        settings.cc_rate_percent,
        settings.bgi_rate_percent,
        on_off(patrol.enabled),
        if patrol.manual { "manual" } else { "auto" },
        patrol.delay_hours,
        patrol.rate_percent,
        on_off(patrol.include_ssds),
        cc.mode.short_name(),
        cc.delay_hours,
        cc.next_start_unix_secs
    )
}
