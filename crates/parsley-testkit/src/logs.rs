//! A test binary's log lines, captured in memory so that a test can assert what the runtime
//! said (a warning naming the coordinator, a line per startup wait).
//!
//! One `tracing` subscriber per process: the first call of [`captured`] installs it at the
//! level it asks for; later calls return the same buffer whatever level they ask.

use std::sync::{Arc, Mutex, OnceLock};

/// The lines at `level` and above of this test binary, without colours: a buffer every test of
/// the binary shares (installed by the first caller).
///
/// # Panics
/// When another global `tracing` subscriber was installed before the first call.
pub fn captured(level: tracing::Level) -> &'static Arc<Mutex<Vec<u8>>> {
    static LINES: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .init();
        lines
    })
}

/// The captured lines so far, as text (lossy UTF-8).
pub fn captured_text(level: tracing::Level) -> String {
    String::from_utf8_lossy(&captured(level).lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// A writer into the captured lines.
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
