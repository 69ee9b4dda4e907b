//! How the manager stops the server: the signal it forwards for each signal it gets, and the
//! escalation when a shutdown mode takes too long (smart → fast → immediate).
//!
//! Pure: a state machine of (state, event, now) → (state, signal to send). PostgreSQL's modes:
//! SIGTERM smart (waits for clients), SIGINT fast (disconnects them, checkpoints), SIGQUIT
//! immediate (crash recovery at next start).

use std::time::{Duration, Instant};

/// A signal the manager receives or sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Int,
    Quit,
    Hup,
}

/// PostgreSQL's shutdown modes, in escalation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Smart,
    Fast,
    Immediate,
}

impl Mode {
    pub fn signal(self) -> Signal {
        match self {
            Mode::Smart => Signal::Term,
            Mode::Fast => Signal::Int,
            Mode::Immediate => Signal::Quit,
        }
    }
}

/// Where the server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    /// A shutdown in `mode` was asked at `since`.
    Stopping {
        mode: Mode,
        since: Instant,
    },
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Received(Signal),
    Tick,
}

/// How long each mode may take before the next one is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub smart: Duration,
    pub fast: Duration,
}

/// The next state and the signal to send to the server, if any.
pub fn step(state: State, event: Event, now: Instant, t: Timeouts) -> (State, Option<Signal>) {
    let asked = match event {
        Event::Received(Signal::Hup) => return (state, Some(Signal::Hup)),
        Event::Received(Signal::Term) => Some(Mode::Smart),
        Event::Received(Signal::Int) => Some(Mode::Fast),
        Event::Received(Signal::Quit) => Some(Mode::Immediate),
        Event::Tick => None,
    };
    match (state, asked) {
        (State::Running, Some(mode)) => stop(mode, now),
        (State::Running, None) => (state, None),
        // A second request escalates (at least one step), never de-escalates.
        (State::Stopping { mode, .. }, Some(new)) => stop(new.max(next(mode)), now),
        (State::Stopping { mode, since }, None) => match limit(mode, t) {
            Some(limit) if now.duration_since(since) >= limit => stop(next(mode), now),
            _ => (state, None),
        },
    }
}

fn stop(mode: Mode, now: Instant) -> (State, Option<Signal>) {
    (State::Stopping { mode, since: now }, Some(mode.signal()))
}

fn next(mode: Mode) -> Mode {
    match mode {
        Mode::Smart => Mode::Fast,
        Mode::Fast | Mode::Immediate => Mode::Immediate,
    }
}

fn limit(mode: Mode, t: Timeouts) -> Option<Duration> {
    match mode {
        Mode::Smart => Some(t.smart),
        Mode::Fast => Some(t.fast),
        Mode::Immediate => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        smart: Duration::from_secs(30),
        fast: Duration::from_secs(20),
    };

    #[test]
    fn transitions() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let stopping = |mode, s| State::Stopping { mode, since: at(s) };
        use Event::*;
        use Signal::*;
        let cases = [
            // (state, event, now, next state, signal sent)
            (State::Running, Tick, at(5), State::Running, None),
            (
                State::Running,
                Received(Hup),
                at(5),
                State::Running,
                Some(Hup),
            ),
            (
                State::Running,
                Received(Term),
                at(5),
                stopping(Mode::Smart, 5),
                Some(Term),
            ),
            (
                State::Running,
                Received(Int),
                at(5),
                stopping(Mode::Fast, 5),
                Some(Int),
            ),
            (
                State::Running,
                Received(Quit),
                at(5),
                stopping(Mode::Immediate, 5),
                Some(Quit),
            ),
            (
                stopping(Mode::Smart, 0),
                Tick,
                at(29),
                stopping(Mode::Smart, 0),
                None,
            ),
            (
                stopping(Mode::Smart, 0),
                Tick,
                at(30),
                stopping(Mode::Fast, 30),
                Some(Int),
            ),
            (
                stopping(Mode::Fast, 30),
                Tick,
                at(49),
                stopping(Mode::Fast, 30),
                None,
            ),
            (
                stopping(Mode::Fast, 30),
                Tick,
                at(50),
                stopping(Mode::Immediate, 50),
                Some(Quit),
            ),
            (
                stopping(Mode::Immediate, 50),
                Tick,
                at(500),
                stopping(Mode::Immediate, 50),
                None,
            ),
            (
                stopping(Mode::Smart, 0),
                Received(Term),
                at(3),
                stopping(Mode::Fast, 3),
                Some(Int),
            ),
            (
                stopping(Mode::Fast, 0),
                Received(Term),
                at(3),
                stopping(Mode::Immediate, 3),
                Some(Quit),
            ),
            (
                stopping(Mode::Smart, 0),
                Received(Quit),
                at(3),
                stopping(Mode::Immediate, 3),
                Some(Quit),
            ),
            (
                stopping(Mode::Fast, 0),
                Received(Hup),
                at(3),
                stopping(Mode::Fast, 0),
                Some(Hup),
            ),
        ];
        for (state, event, now, want_state, want_signal) in cases {
            assert_eq!(
                step(state, event, now, T),
                (want_state, want_signal),
                "{state:?} + {event:?}"
            );
        }
    }
}
