//! How a download's progress is shown on stderr (so JSON on stdout stays clean): a bar on a
//! terminal, a line a second on a pipe. Shared by `mounthost cache pull` and
//! `mounthost dynamic`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::daemon::pull::human_bytes;

/// `pulled 1.0 MiB of 4.0 MiB (25%)`.
pub fn line(done: u64, total: u64) -> String {
    let pct = (done * 100).checked_div(total).unwrap_or(0);
    format!("pulled {} of {} ({pct}%)", human_bytes(done), human_bytes(total))
}

/// One download's progress, optionally labelled (a mount's id).
pub enum Shown {
    /// On a terminal; the bar appears with the first update.
    Bar { label: Option<String>, bar: Option<ProgressBar> },
    /// On a pipe.
    Lines { label: Option<String>, last: Option<Instant> },
}

impl Shown {
    pub fn new(label: Option<&str>) -> Self {
        let label = label.map(str::to_string);
        if std::io::stderr().is_terminal() {
            Shown::Bar { label, bar: None }
        } else {
            Shown::Lines { label, last: None }
        }
    }

    pub fn update(&mut self, done: u64, total: u64) {
        match self {
            Shown::Bar { label, bar } => {
                let bar = bar.get_or_insert_with(|| {
                    let bar = ProgressBar::new(total);
                    bar.set_style(
                        ProgressStyle::with_template(
                            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                        )
                        .expect("the template is valid"),
                    );
                    bar.set_message(label.clone().unwrap_or_default());
                    bar
                });
                bar.set_length(total);
                bar.set_position(done);
            }
            Shown::Lines { label, last } => {
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) || (total > 0 && done == total) {
                    match label {
                        Some(l) => eprintln!("{l}: {}", line(done, total)),
                        None => eprintln!("{}", line(done, total)),
                    }
                    *last = Some(Instant::now());
                }
            }
        }
    }

    /// Done (the bar fills) or not (it stops where it is).
    pub fn finish(&self, done: bool) {
        if let Shown::Bar { bar: Some(bar), .. } = self {
            if done {
                bar.set_position(bar.length().unwrap_or(0));
                bar.finish();
            } else {
                bar.abandon();
            }
        }
    }
}
