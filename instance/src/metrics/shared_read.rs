//! One reading at a time, shared by every request that waits for it: the WAL position at
//! `/status`. Each answer is a reading that started after its request arrived (a failover
//! compares positions read after the primary stopped, never older ones), but requests that
//! arrive together share one psql instead of starting one each. Under load, a psql per request
//! made each slower than the operator waits (2 s), the abandoned ones piled up, and a
//! synchronous failover that needs enough standbys' positions waited in vain.
//!
//! Generic over the reading, so the sharing is tested without a server.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Readings of `T`, one at a time, shared by the requests waiting for them.
pub struct SharedRead<T> {
    state: Mutex<State<T>>,
    done: Condvar,
}

struct State<T> {
    /// A reading is under way.
    reading: bool,
    /// The last reading: when it started, and what it gave.
    last: Option<(Instant, T)>,
}

impl<T: Clone> SharedRead<T> {
    pub fn new() -> Self {
        SharedRead {
            state: Mutex::new(State {
                reading: false,
                last: None,
            }),
            done: Condvar::new(),
        }
    }

    /// A reading that started no earlier than now: the one the next `read` makes, shared with
    /// every request that waits for it meanwhile. A reading under way that started before now
    /// is waited for, then a new one made (by this request or by another that waited too).
    pub fn fresh(&self, read: impl Fn() -> T) -> T {
        let asked = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some((started, value)) = &state.last
                && *started >= asked
            {
                return value.clone();
            }
            if state.reading {
                state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.reading = true;
            drop(state);
            let started = Instant::now();
            let value = read();
            state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.reading = false;
            state.last = Some((started, value));
            self.done.notify_all();
        }
    }
}

impl<T: Clone> Default for SharedRead<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// Requests that arrive while a reading is under way share the next one: eight requests,
    /// at most two readings (the one under way may have started before some of them), and each
    /// answer is a reading that started after its request (numbered above every reading begun
    /// before it asked).
    #[test]
    fn requests_that_arrive_together_share_one_reading_started_after_them() {
        let shared = Arc::new(SharedRead::new());
        let begun = Arc::new(AtomicU32::new(0));
        let read = {
            let begun = begun.clone();
            move || {
                let n = begun.fetch_add(1, Ordering::SeqCst) + 1;
                std::thread::sleep(Duration::from_millis(200));
                n
            }
        };
        let requests: Vec<_> = (0..8)
            .map(|_| {
                let (shared, read, begun) = (shared.clone(), read.clone(), begun.clone());
                std::thread::spawn(move || {
                    let before = begun.load(Ordering::SeqCst);
                    let n = shared.fresh(&read);
                    assert!(
                        n > before,
                        "reading {n} began before the request ({before})"
                    );
                    n
                })
            })
            .collect();
        let answers: Vec<u32> = requests.into_iter().map(|r| r.join().unwrap()).collect();
        assert!(begun.load(Ordering::SeqCst) <= 2, "{answers:?}");
        // A later request gets a new reading, not the last one.
        let last = begun.load(Ordering::SeqCst);
        assert_eq!(shared.fresh(&read), last + 1);
    }
}
