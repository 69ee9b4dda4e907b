//! SIGTERM/SIGINT: installed once at start, awaited by every long operation so it can stop
//! its children, abort its upload and report a failure instead of dying half-way.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// A handle that resolves once a termination signal has arrived.
#[derive(Clone, Debug)]
pub struct Interrupt(watch::Receiver<Option<&'static str>>);

impl Interrupt {
    /// Starts listening for SIGTERM and SIGINT. Needs a running Tokio runtime.
    pub fn install() -> std::io::Result<Interrupt> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::warn!(signal = name, "termination requested: stopping");
            let _ = tx.send(Some(name));
            // Keep the sender, so receivers never see a closed channel.
            std::future::pending::<()>().await;
        });
        Ok(Interrupt(rx))
    }

    /// Resolves with the signal's name once one has arrived.
    pub async fn wait(&self) -> &'static str {
        let mut rx = self.0.clone();
        loop {
            if let Some(name) = *rx.borrow_and_update() {
                return name;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
