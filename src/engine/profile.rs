//! `EXPERT_RUNTIME_PROFILE=1`: where an engine step's time goes, printed to stderr every 64
//! steps. Off by default (one branch per phase). With it on, the step waits for the device
//! after the forward pass, so the forward time is the host's work of issuing the pass (tensor
//! ops, kernel launches) and the device time is what the device still had to do after that:
//! the split that says whether a step is bound by the host or by the device.

use std::time::{Duration, Instant};

/// The phases of one step, in order.
#[derive(Clone, Copy)]
pub enum Phase {
    /// Choosing the rows of the pass.
    Plan,
    /// Building and issuing the forward pass.
    Forward,
    /// Waiting for the device to finish the pass (profiling only).
    Device,
    /// Copying logits and hidden states back.
    Readback,
    /// Sampling, advancing the tables, delivering tokens.
    Sample,
}

const PHASES: [&str; 5] = ["plan", "forward", "device", "readback", "sample"];
const REPORT_EVERY: u32 = 64;

#[derive(Default)]
pub struct StepProfile {
    on: bool,
    last: Option<Instant>,
    total: [Duration; 5],
    steps: u32,
    rows: usize,
}

impl StepProfile {
    pub fn from_env() -> Self {
        let on = std::env::var("EXPERT_RUNTIME_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
        Self { on, ..Self::default() }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    pub fn start(&mut self) {
        if self.on {
            self.last = Some(Instant::now());
        }
    }

    /// Ends `phase`: the time since the previous lap is added to it.
    pub fn lap(&mut self, phase: Phase) {
        if let Some(last) = self.last {
            let now = Instant::now();
            self.total[phase as usize] += now - last;
            self.last = Some(now);
        }
    }

    /// Counts a step of `rows` rows; reports and restarts every [`REPORT_EVERY`] steps.
    pub fn step_done(&mut self, rows: usize) {
        if !self.on {
            return;
        }
        self.steps += 1;
        self.rows += rows;
        if self.steps == REPORT_EVERY {
            eprintln!("{}", self.report());
            *self = Self { on: true, ..Self::default() };
        }
    }

    fn report(&self) -> String {
        let per_step = |d: Duration| d.as_secs_f64() * 1e3 / self.steps.max(1) as f64;
        let total: Duration = self.total.iter().sum();
        let phases: Vec<String> = PHASES.iter().zip(&self.total).map(|(n, &d)| format!("{n} {:.3}", per_step(d))).collect();
        format!(
            "expert-runtime profile: {} steps, {:.1} rows/step, ms/step {:.3} = {}",
            self.steps,
            self.rows as f64 / self.steps.max(1) as f64,
            per_step(total),
            phases.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_per_phase_and_off_costs_nothing() {
        let mut p = StepProfile { on: true, ..StepProfile::default() };
        p.start();
        std::thread::sleep(Duration::from_millis(2));
        p.lap(Phase::Forward);
        p.lap(Phase::Sample);
        p.step_done(3);
        assert!(p.total[Phase::Forward as usize] >= Duration::from_millis(2));
        assert_eq!(p.total[Phase::Plan as usize], Duration::ZERO);
        assert!(p.report().contains("1 steps, 3.0 rows/step"), "{}", p.report());
        let mut off = StepProfile::default();
        off.start();
        off.lap(Phase::Forward);
        off.step_done(1);
        assert_eq!(off.steps, 0);
        assert!(off.total.iter().all(|d| d.is_zero()));
    }
}
