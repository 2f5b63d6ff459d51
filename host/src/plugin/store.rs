//! The state of one plugin call's Store, and the host functions plugins may import.
//!
//! WASI is linked but grants nothing: no preopened directories, no environment, no arguments,
//! no stdio, no sockets. The only mounthost import is `host.log`, bounded per call; it is
//! offered at every contract version the host loads, and both write through [`CallState::log`].

use tracing::{Level as TLevel, event};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{Level, mounthost};
use super::limits::Limiter;
use super::{bindings_v010, bindings_v020, bindings_v030, bindings_v040};
use crate::secrets::Secrets;

/// Log lines one call may write; further lines are dropped (and that is said once).
pub const MAX_LOG_LINES: u32 = 64;
/// Characters kept of one log line.
pub const MAX_LOG_LINE: usize = 1024;

/// Everything a Store owns during one call.
pub struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// Memory and table limits.
    pub limiter: Limiter,
    /// The plugin's name, for log lines.
    pub plugin: String,
    /// The volume the call is about, for log lines ("" when none).
    pub volume: String,
    /// Used to scrub secret values out of log lines.
    pub secrets: Secrets,
    logged: u32,
}

impl CallState {
    /// Fresh state for one call.
    pub fn new(plugin: &str, volume: &str, secrets: Secrets, limiter: Limiter) -> Self {
        CallState {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            limiter,
            plugin: plugin.to_string(),
            volume: volume.to_string(),
            secrets,
            logged: 0,
        }
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl mounthost::plugin::types::Host for CallState {}

impl mounthost::plugin::host::Host for CallState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.write_log(level, &message);
        Ok(())
    }
}

/// The `host` interface of an earlier contract: the same logging, its own `level` type.
macro_rules! earlier_host {
    ($($b:ident),*) => {$(
        impl $b::mounthost::plugin::types::Host for CallState {}

        impl $b::mounthost::plugin::host::Host for CallState {
            async fn log(&mut self, level: $b::Level, message: String) -> wasmtime::Result<()> {
                let level = match level {
                    $b::Level::Trace => Level::Trace,
                    $b::Level::Debug => Level::Debug,
                    $b::Level::Info => Level::Info,
                    $b::Level::Warn => Level::Warn,
                    $b::Level::Error => Level::Error,
                };
                self.write_log(level, &message);
                Ok(())
            }
        }
    )*};
}

earlier_host!(bindings_v040, bindings_v030, bindings_v020, bindings_v010);

impl CallState {
    /// One plugin log line: counted, capped, scrubbed of secrets, tagged and emitted.
    fn write_log(&mut self, level: Level, message: &str) {
        self.logged += 1;
        if self.logged > MAX_LOG_LINES {
            if self.logged == MAX_LOG_LINES + 1 {
                event!(target: "mounthost::plugin", TLevel::WARN, plugin = %self.plugin,
                    volume.id = %self.volume, "plugin log limit of {MAX_LOG_LINES} lines reached; dropping the rest of this call's lines");
            }
            return;
        }
        let mut line = self.secrets.scrub(message);
        if line.len() > MAX_LOG_LINE {
            let mut end = MAX_LOG_LINE;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
            line.push('…');
        }
        let (plugin, volume) = (&self.plugin, &self.volume);
        match level {
            Level::Trace => {
                event!(target: "mounthost::plugin", TLevel::TRACE, plugin = %plugin, volume.id = %volume, "{line}")
            }
            Level::Debug => {
                event!(target: "mounthost::plugin", TLevel::DEBUG, plugin = %plugin, volume.id = %volume, "{line}")
            }
            Level::Info => {
                event!(target: "mounthost::plugin", TLevel::INFO, plugin = %plugin, volume.id = %volume, "{line}")
            }
            Level::Warn => {
                event!(target: "mounthost::plugin", TLevel::WARN, plugin = %plugin, volume.id = %volume, "{line}")
            }
            Level::Error => {
                event!(target: "mounthost::plugin", TLevel::ERROR, plugin = %plugin, volume.id = %volume, "{line}")
            }
        }
    }
}

impl CallState {
    /// Lines this call tried to log (including dropped ones).
    pub fn lines_logged(&self) -> u32 {
        self.logged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer the log lines land in.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_plugins_log_line_keeps_no_secret() {
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || sink.clone()).with_ansi(false).finish();
        let secrets: Secrets = [("token".to_string(), "s3cr3t-t0ken".to_string())].into_iter().collect();
        let mut call = CallState::new("model", "vol-1", secrets, Limiter::new(1 << 20));
        tracing::subscriber::with_default(subscriber, || {
            call.write_log(Level::Warn, "registry said 401 to Bearer s3cr3t-t0ken");
        });
        let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(out.contains("registry said 401 to Bearer") && out.contains("vol-1"), "{out}");
        assert!(!out.contains("s3cr3t-t0ken"), "{out}");
    }
}
