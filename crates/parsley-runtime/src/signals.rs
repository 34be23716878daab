//! SIGINT and SIGTERM for [`Running::wait_for_signal`](crate::Running::wait_for_signal): a
//! watch installed by the call and removed when it returns.
//!
//! Built on `signal-hook`'s flag actions: a signal handler may only do async-signal-safe
//! things, so the handler sets flags and the waiting thread looks at them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::SigId;
use signal_hook::consts::{SIGINT, SIGTERM};

use parsley_task::error::SetupError;
use parsley_task::error::{Error, Result};

/// The signals a watch listens to.
const SIGNALS: [i32; 2] = [SIGINT, SIGTERM];

/// SIGINT and SIGTERM, watched from [`SignalWatch::install`] until the watch is dropped.
///
/// While installed, the first of them sets the watch's flags; one arriving once a flag is set
/// runs the signal's default action (the process terminates at once), a way out of a clean
/// stop that hangs. Dropping the watch removes its actions (see
/// [`Running::wait_for_signal`](crate::Running::wait_for_signal) for what remains).
#[derive(Debug)]
pub(crate) struct SignalWatch {
    /// Set by the first signal; arms the default action for the next one.
    arrived: Arc<AtomicBool>,
    /// The number of the last signal that arrived (0: none).
    which: Arc<AtomicUsize>,
    /// Its actions, removed on drop.
    ids: Vec<SigId>,
}

impl SignalWatch {
    /// Installs the watch: three actions per signal, in this order (signal-hook runs them in
    /// registration order): the default action if a signal already arrived, then which signal
    /// this is, then that one arrived.
    ///
    /// # Errors
    /// [`SetupError::Signals`] when an action cannot be registered (none stays registered then).
    pub(crate) fn install() -> Result<Self> {
        use signal_hook::flag;
        let mut watch = SignalWatch::unregistered();
        let failed = |source| Error::Setup(SetupError::Signals { source });
        // On an error, `watch` drops and takes back what was registered before it.
        for signal in SIGNALS {
            let id = flag::register_conditional_default(signal, watch.arrived.clone())
                .map_err(failed)?;
            watch.ids.push(id);
            let id = flag::register_usize(signal, watch.which.clone(), signal as usize)
                .map_err(failed)?;
            watch.ids.push(id);
            let id = flag::register(signal, watch.arrived.clone()).map_err(failed)?;
            watch.ids.push(id);
        }
        Ok(watch)
    }

    /// A watch with no action registered: nothing sets it (tests set it by hand).
    pub(crate) fn unregistered() -> Self {
        SignalWatch {
            arrived: Arc::new(AtomicBool::new(false)),
            which: Arc::new(AtomicUsize::new(0)),
            ids: Vec::new(),
        }
    }

    /// The signal that arrived, if one did.
    pub(crate) fn arrived(&self) -> Option<&'static str> {
        if !self.arrived.load(Ordering::SeqCst) {
            return None;
        }
        Some(match self.which.load(Ordering::SeqCst) as i32 {
            SIGINT => "SIGINT",
            SIGTERM => "SIGTERM",
            _ => "a signal",
        })
    }

    /// Sets the watch as a signal would (tests).
    #[cfg(test)]
    pub(crate) fn set(&self, signal: i32) {
        self.which.store(signal as usize, Ordering::SeqCst);
        self.arrived.store(true, Ordering::SeqCst);
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
