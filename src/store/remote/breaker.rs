//! The object store's circuit breaker: a pure state machine (no IO, no clock of its own: every call is given
//! `now`), so a hung store costs each request one refusal instead of a wait for the timeouts.
//!
//! Closed: calls go through, and `failures` of them in a row that fail (the store unavailable or timed out)
//! open it. Open: calls are refused at once for `cool_down`. Then half-open: one call (the probe) goes through;
//! its success closes the breaker, its failure opens it again. An answer to any call closes it too (one sent
//! before it opened may be answered late: the store is back). A probe that never reports (its task lost) is
//! replaced by another after `cool_down`, so the breaker cannot stay half-open for good.

use std::time::{Duration, Instant};

/// What the breaker says of the store, for `/metrics` (the gauge's value is [`BreakerState::gauge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    HalfOpen,
    Open,
}

impl BreakerState {
    /// 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

/// Whether a call may go to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// An ordinary call (the breaker is closed).
    Call,
    /// The one call let through to see whether the store is back; its verdict decides.
    Probe,
    /// Refused without asking the store; the breaker may let a probe through in `retry_in`.
    Refused { retry_in: Duration },
}

/// How an admitted call ended, as far as the store's health goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The store answered (a "not found" is an answer).
    Answered,
    /// Unavailable, or timed out.
    Failed,
    /// The call failed before it learnt anything of the store (a local file): no verdict.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probe_since: Option<Instant> },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    state: State,
}

impl Breaker {
    /// Opens after `threshold` (at least 1) failures in a row, for `cool_down`.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self { threshold: threshold.max(1), cool_down, state: State::Closed { failures: 0 } }
    }

    /// Asks to make a call at `now`. A [`Admission::Probe`] must be followed by [`Breaker::record`] with it.
    pub fn admit(&mut self, now: Instant) -> Admission {
        match self.state {
            State::Closed { .. } => Admission::Call,
            State::Open { until } if now < until => Admission::Refused { retry_in: until - now },
            State::Open { .. } => self.probe(now),
            State::HalfOpen { probe_since: Some(since) } if now < since + self.cool_down => {
                Admission::Refused { retry_in: since + self.cool_down - now }
            }
            State::HalfOpen { .. } => self.probe(now),
        }
    }

    fn probe(&mut self, now: Instant) -> Admission {
        self.state = State::HalfOpen { probe_since: Some(now) };
        Admission::Probe
    }

    /// The verdict of a call admitted as `admission`, at `now`. Any answer closes the breaker, also one to a call
    /// that started before it opened: the store answers now. Such a call's failure changes nothing (the breaker
    /// is already open, its cool-down not prolonged).
    pub fn record(&mut self, admission: Admission, verdict: Verdict, now: Instant) {
        match (admission, self.state, verdict) {
            (Admission::Probe, State::HalfOpen { .. }, Verdict::Answered) => self.state = State::Closed { failures: 0 },
            (Admission::Probe, State::HalfOpen { .. }, Verdict::Failed) => {
                self.state = State::Open { until: now + self.cool_down }
            }
            (Admission::Probe, State::HalfOpen { .. }, Verdict::Unknown) => {
                self.state = State::HalfOpen { probe_since: None }
            }
            (Admission::Call, _, Verdict::Answered) => self.state = State::Closed { failures: 0 },
            (Admission::Call, State::Closed { failures }, Verdict::Failed) => {
                let failures = failures + 1;
                self.state = if failures >= self.threshold {
                    State::Open { until: now + self.cool_down }
                } else {
                    State::Closed { failures }
                };
            }
            _ => {}
        }
    }

    /// The state at `now`, for the gauge: an open breaker whose cool-down is over is half-open (its next call
    /// probes).
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until } if now < until => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The failures in a row that open it, for messages.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const COOL: Duration = Duration::from_secs(5);

    fn fail(b: &mut Breaker, now: Instant) {
        let a = b.admit(now);
        assert_ne!(a, Admission::Refused { retry_in: Duration::ZERO });
        b.record(a, Verdict::Failed, now);
    }

    #[test]
    fn opens_after_the_threshold_of_failures_in_a_row_and_refuses_for_the_cool_down() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, COOL);
        fail(&mut b, t0);
        fail(&mut b, t0);
        assert_eq!(b.state(t0), BreakerState::Closed);
        fail(&mut b, t0);
        assert_eq!(b.state(t0), BreakerState::Open);
        assert_eq!(b.admit(t0 + Duration::from_secs(2)), Admission::Refused { retry_in: Duration::from_secs(3) });
    }

    #[test]
    fn an_answer_resets_the_count_and_not_found_is_an_answer() {
        let t0 = Instant::now();
        let mut b = Breaker::new(2, COOL);
        fail(&mut b, t0);
        let a = b.admit(t0);
        b.record(a, Verdict::Answered, t0);
        fail(&mut b, t0);
        assert_eq!(b.state(t0), BreakerState::Closed, "not two in a row");
        let a = b.admit(t0);
        b.record(a, Verdict::Unknown, t0);
        assert_eq!(b.state(t0), BreakerState::Closed, "a local failure is no verdict");
    }

    #[test]
    fn after_the_cool_down_one_probe_goes_through_and_decides() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, COOL);
        fail(&mut b, t0);
        let t1 = t0 + COOL;
        assert_eq!(b.state(t1), BreakerState::HalfOpen);
        assert_eq!(b.admit(t1), Admission::Probe);
        assert!(matches!(b.admit(t1), Admission::Refused { .. }), "one probe at a time");
        b.record(Admission::Probe, Verdict::Failed, t1);
        assert_eq!(b.state(t1), BreakerState::Open, "a failed probe re-opens");
        let t2 = t1 + COOL;
        assert_eq!(b.admit(t2), Admission::Probe);
        b.record(Admission::Probe, Verdict::Answered, t2);
        assert_eq!(b.state(t2), BreakerState::Closed);
        assert_eq!(b.admit(t2), Admission::Call);
    }

    #[test]
    fn a_lost_probe_is_replaced_after_the_cool_down() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, COOL);
        fail(&mut b, t0);
        assert_eq!(b.admit(t0 + COOL), Admission::Probe);
        assert!(matches!(b.admit(t0 + COOL + COOL / 2), Admission::Refused { .. }));
        assert_eq!(b.admit(t0 + COOL * 2), Admission::Probe);
    }

    #[test]
    fn a_late_answer_closes_the_breaker_and_a_late_failure_does_not_prolong_it() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, COOL);
        let (early, late) = (b.admit(t0), b.admit(t0));
        fail(&mut b, t0);
        b.record(late, Verdict::Failed, t0 + COOL / 2);
        assert_eq!(b.admit(t0 + COOL), Admission::Probe, "the cool-down counts from the first opening");
        b.record(Admission::Probe, Verdict::Failed, t0 + COOL);
        b.record(early, Verdict::Answered, t0 + COOL);
        assert_eq!(b.state(t0 + COOL), BreakerState::Closed, "the store answered");
        assert_eq!(b.admit(t0 + COOL), Admission::Call);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Call(Verdict),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Call(Verdict::Answered)),
            Just(Op::Call(Verdict::Failed)),
            Just(Op::Call(Verdict::Unknown)),
            (0u64..7_000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Against a model: the breaker refuses exactly while open, `threshold` failures in a row open it, and
        /// whatever happens it lets a call through again within a cool-down (it never stays shut).
        #[test]
        fn follows_the_model(threshold in 1u32..5, ops in proptest::collection::vec(op(), 1..200)) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut b = Breaker::new(threshold, COOL);
            let mut in_a_row = 0u32;
            let mut refused_since: Option<Instant> = None;
            for op in ops {
                match op {
                    Op::Wait(ms) => now += Duration::from_millis(ms),
                    Op::Call(verdict) => {
                        let before = b.state(now);
                        let admission = b.admit(now);
                        match admission {
                            Admission::Refused { retry_in } => {
                                prop_assert_ne!(before, BreakerState::Closed);
                                prop_assert!(retry_in <= COOL && !retry_in.is_zero());
                                let since = *refused_since.get_or_insert(now);
                                prop_assert!(now - since < COOL * 2, "refused for two cool-downs");
                                continue;
                            }
                            Admission::Call => prop_assert_eq!(before, BreakerState::Closed),
                            Admission::Probe => prop_assert_eq!(before, BreakerState::HalfOpen),
                        }
                        refused_since = None;
                        b.record(admission, verdict, now);
                        let expected = match (admission, verdict) {
                            (Admission::Call, Verdict::Failed) => {
                                in_a_row += 1;
                                if in_a_row >= threshold { BreakerState::Open } else { BreakerState::Closed }
                            }
                            (Admission::Call, Verdict::Unknown) => BreakerState::Closed,
                            (_, Verdict::Answered) => BreakerState::Closed,
                            (_, Verdict::Failed) => BreakerState::Open,
                            (_, Verdict::Unknown) => BreakerState::HalfOpen,
                        };
                        if expected != BreakerState::Closed || verdict == Verdict::Answered {
                            in_a_row = 0;
                        }
                        prop_assert_eq!(b.state(now), expected);
                    }
                }
            }
        }
    }
}
