//! Logging setup: text or JSON lines on stderr, filtered by `RUST_LOG`-style directives.
//! Cranelift and wasmtime are quiet by default; they log per function compiled.

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// Install the global subscriber. `directives` like `info,mounthost=debug`. Text is coloured
/// only on a terminal (and without `NO_COLOR`): a log written to a file or read by a collector
/// carries no escape codes.
pub fn init(format: LogFormat, directives: &str) {
    let filter = EnvFilter::try_new(format!("{directives},cranelift=warn,wasmtime=warn"))
        .unwrap_or_else(|_| EnvFilter::new("info,cranelift=warn,wasmtime=warn"));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// A log writer that keeps every byte written, for tests that read what was logged
/// (`tracing_subscriber::fmt().with_writer(move || captured.clone())`).
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
