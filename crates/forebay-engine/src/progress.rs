//! The progress bar of a long run: rows done, rows/s, bytes spilled, on stderr.
//!
//! Drawn by indicatif, which draws nothing when stderr is not a terminal; off entirely with
//! `progress: false`. The total is known (a bar with an ETA) when the source can count its
//! rows from footers; otherwise a spinner with counts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A running progress display; dropping it clears it.
pub(crate) struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Start drawing `label`: rows from `rows_done`, spilled bytes from `spilled`, with
    /// `total` rows computed on the drawing thread (footers may need reading).
    pub(crate) fn start(
        label: String,
        rows_done: Arc<dyn Fn() -> u64 + Send + Sync>,
        spilled: Arc<dyn Fn() -> u64 + Send + Sync>,
        total: Box<dyn FnOnce() -> Option<u64> + Send>,
    ) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_in = stop.clone();
        let thread = std::thread::Builder::new()
            .name(forebay_io::threads::thread_name("progress"))
            .spawn(move || {
                let target = ProgressDrawTarget::stderr_with_hz(4);
                if target.is_hidden() {
                    return; // not a terminal: draw nothing
                }
                let bar = ProgressBar::with_draw_target(None, target);
                bar.set_style(spinner_style());
                bar.set_prefix(label);
                bar.enable_steady_tick(Duration::from_millis(250));
                if let Some(n) = total() {
                    bar.set_length(n);
                    bar.set_style(bar_style());
                }
                while !stop_in.load(Ordering::Relaxed) {
                    bar.set_position(rows_done());
                    let spilled = spilled();
                    if spilled > 0 {
                        bar.set_message(format!("spilled {}", indicatif::HumanBytes(spilled)));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                bar.set_position(rows_done());
                bar.finish_and_clear();
            })
            .ok();
        Progress { stop, thread }
    }
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{prefix} [{bar:30}] {human_pos}/{human_len} rows, {rate}, eta {eta} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .with_key("rate", rows_per_second)
    .progress_chars("=> ")
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix} {spinner} {human_pos} rows, {rate} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .with_key("rate", rows_per_second)
}

/// `12,345 rows/s`: whole rows (indicatif's `{per_sec}` shows four decimals).
fn rows_per_second(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let rate = state.per_sec();
    let _ = if rate.is_finite() {
        write!(w, "{} rows/s", indicatif::HumanCount(rate.round() as u64))
    } else {
        write!(w, "- rows/s")
    };
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
