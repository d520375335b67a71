//! The live progress bar of `storc bench run` and `suite`: points done out of the total, the
//! point being measured, elapsed time and an estimate of what is left. Drawn on stderr, and
//! only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(total_points: usize) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total_points as u64), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} points, {eta} left  {msg}")
            .expect("a valid template")
            .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// Shows the point now being measured.
    pub fn point_started(&self, label: &str) {
        self.bar.set_message(label.to_string());
    }

    pub fn point_finished(&self) {
        self.bar.inc(1);
    }

    /// Prints above the bar.
    pub fn println(&self, text: &str) {
        self.bar.suspend(|| println!("{text}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
