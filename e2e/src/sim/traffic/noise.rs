//! Noisy traffic, opt-in (`--traffic-seed`, `SimOptions::traffic_noise`, or for one front the
//! Service annotation `sim.rollouts.dev/traffic-seed`): requests arrive as a
//! Poisson process whose rate swings over time, each request errs with its pod's error
//! probability, and latencies are drawn from a log-normal per release with an optional slow
//! tail; each pod's error rate and latency are scaled by its own log-normal factor. Every draw
//! comes from one generator seeded by the user, so the same seed, pods and ticks give the same
//! requests. Without it the generator counts, as `load` describes.

use std::collections::HashMap;
use std::f64::consts::TAU;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cluster::Pod;
use crate::sim::store::ObjectKey;

/// The noise settings of the traffic simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficNoise {
    /// Seeds every draw.
    pub seed: u64,
    /// Sigma of the log-normal factor each pod's error rate and latency median are scaled by
    /// (0: pods of a release are alike; 0.2: most pods within about +-20% of each other).
    pub pod_spread: f64,
    /// Relative amplitude of the load's swing: the rate is rps x (1 + swing x sin(2 pi t / period)).
    pub load_swing: f64,
    /// Period of that swing.
    pub load_period: Duration,
}

impl Default for TrafficNoise {
    fn default() -> Self {
        Self {
            seed: 0,
            pod_spread: 0.1,
            load_swing: 0.2,
            load_period: Duration::from_secs(120),
        }
    }
}

impl TrafficNoise {
    /// Checks the values a user can get wrong; the error names the option and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.pod_spread >= 0.0 && self.pod_spread.is_finite()) {
            return Err(format!(
                "traffic noise pod spread {}: give a non-negative sigma, e.g. 0.1",
                self.pod_spread
            ));
        }
        if !(0.0..=1.0).contains(&self.load_swing) {
            return Err(format!(
                "traffic noise load swing {}: give a share between 0 and 1, e.g. 0.2",
                self.load_swing
            ));
        }
        if self.load_period.is_zero() {
            return Err("traffic noise load period is 0: give a period, e.g. 120 s".to_string());
        }
        Ok(())
    }
}

/// The drawing state of noisy traffic: its generator, the time load has run, each pod's factor.
#[derive(Debug)]
pub struct Noise {
    settings: TrafficNoise,
    rng: StdRng,
    elapsed: Duration,
    pod_factors: HashMap<ObjectKey, f64>,
}

/// What one request's pod answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    pub error: bool,
    pub latency_seconds: f64,
}

impl Noise {
    pub fn new(settings: TrafficNoise) -> Self {
        Self {
            rng: StdRng::seed_from_u64(settings.seed),
            settings,
            elapsed: Duration::ZERO,
            pod_factors: HashMap::new(),
        }
    }

    /// The settings it draws with.
    pub fn settings(&self) -> &TrafficNoise {
        &self.settings
    }

    /// Moves the clock of the load's swing on by `elapsed`.
    pub fn advance(&mut self, elapsed: Duration) {
        self.elapsed += elapsed;
    }

    /// The rate at this point of the swing.
    pub fn swung_rps(&self, rps: f64) -> f64 {
        let phase = TAU * self.elapsed.as_secs_f64() / self.settings.load_period.as_secs_f64();
        (rps * (1.0 + self.settings.load_swing * phase.sin())).max(0.0)
    }

    /// How many requests arrive in `seconds` at `rps` (a Poisson draw).
    pub fn arrivals(&mut self, rps: f64, seconds: f64) -> u64 {
        let mean = self.swung_rps(rps) * seconds;
        poisson(&mut self.rng, mean)
    }

    /// Draws one request's answer from `pod` at `error_rate` (its rate at this moment).
    pub fn answer(&mut self, key: &ObjectKey, pod: &Pod, error_rate: f64) -> Answer {
        let spread = self.settings.pod_spread;
        let rng = &mut self.rng;
        let factor = *self
            .pod_factors
            .entry(key.clone())
            .or_insert_with(|| (spread * standard_normal(rng)).exp());
        let error = self.rng.random::<f64>() < (error_rate * factor).min(1.0);
        let median = pod.latency_seconds * factor;
        let mut latency_seconds =
            median * (pod.latency_spread * standard_normal(&mut self.rng)).exp();
        if pod.slow_share > 0.0 && self.rng.random::<f64>() < pod.slow_share {
            latency_seconds *= pod.slow_factor;
        }
        Answer {
            error,
            latency_seconds,
        }
    }

    /// Forgets the factors of pods that are gone.
    pub fn retain_pods(&mut self, keep: impl Fn(&ObjectKey) -> bool) {
        self.pod_factors.retain(|key, _| keep(key));
    }
}

/// A standard normal draw (Box-Muller).
pub fn standard_normal(rng: &mut impl Rng) -> f64 {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
}

/// A Poisson draw with mean `mean`: Knuth's product of uniforms in chunks of 500 (a sum of
/// Poisson draws is Poisson, and exp(-500) is still a normal float).
pub fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
    if !(mean > 0.0 && mean.is_finite()) {
        return 0;
    }
    const CHUNK: f64 = 500.0;
    let mut remaining = mean;
    let mut count = 0;
    while remaining > 0.0 {
        let part = remaining.min(CHUNK);
        remaining -= part;
        let limit = (-part).exp();
        let mut product = rng.random::<f64>();
        while product > limit {
            count += 1;
            product *= rng.random::<f64>();
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn pod(latency_ms: f64, spread: f64, slow_share: f64) -> Pod {
        Pod {
            labels: Map::new(),
            template_hash: "abc".into(),
            ready: true,
            error_rate: 0.0,
            latency_seconds: latency_ms / 1000.0,
            latency_spread: spread,
            slow_share,
            slow_factor: 10.0,
            warm_up: None,
        }
    }

    fn key(name: &str) -> ObjectKey {
        ("ns".to_string(), name.to_string())
    }

    #[test]
    fn poisson_draws_have_the_mean_and_variance_asked_for() {
        let mut rng = StdRng::seed_from_u64(7);
        for mean in [0.3, 5.0, 50.0, 1_200.0] {
            let n = 4_000;
            let draws: Vec<f64> = (0..n).map(|_| poisson(&mut rng, mean) as f64).collect();
            let m = draws.iter().sum::<f64>() / n as f64;
            let var = draws.iter().map(|d| (d - m).powi(2)).sum::<f64>() / (n - 1) as f64;
            // Five standard errors of the mean; the variance within 15%.
            assert!(
                (m - mean).abs() < 5.0 * (mean / n as f64).sqrt(),
                "mean {mean}: {m}"
            );
            assert!(
                (var / mean - 1.0).abs() < 0.15,
                "mean {mean}: variance {var}"
            );
        }
        assert_eq!(poisson(&mut rng, 0.0), 0);
        assert_eq!(poisson(&mut rng, f64::NAN), 0);
    }

    #[test]
    fn errors_are_drawn_with_the_pods_probability() {
        let mut noise = Noise::new(TrafficNoise {
            seed: 1,
            pod_spread: 0.0,
            ..TrafficNoise::default()
        });
        let p = pod(10.0, 0.0, 0.0);
        let n = 100_000;
        let errors = (0..n)
            .filter(|_| noise.answer(&key("a"), &p, 0.02).error)
            .count() as f64;
        // 2% of 100,000 is 2,000 with a standard deviation of about 44.
        assert!((errors - 2_000.0).abs() < 5.0 * 44.3, "{errors} errors");
    }

    #[test]
    fn latencies_are_log_normal_around_the_median_with_a_slow_tail() {
        let mut noise = Noise::new(TrafficNoise {
            seed: 2,
            pod_spread: 0.0,
            ..TrafficNoise::default()
        });
        let p = pod(100.0, 0.5, 0.0);
        let mut latencies: Vec<f64> = (0..20_001)
            .map(|_| noise.answer(&key("a"), &p, 0.0).latency_seconds)
            .collect();
        latencies.sort_by(f64::total_cmp);
        let median = latencies[10_000];
        assert!((median - 0.1).abs() < 0.004, "median {median}");
        // ln latency has sigma 0.5: the 84th percentile is at median x e^0.5.
        let p84 = latencies[(0.8413 * 20_000.0) as usize];
        assert!((p84 / 0.1 - 0.5f64.exp()).abs() < 0.05, "p84 {p84}");

        let slow = pod(100.0, 0.0, 0.05);
        let n = 20_000;
        let slow_count = (0..n)
            .filter(|_| noise.answer(&key("b"), &slow, 0.0).latency_seconds > 0.5)
            .count() as f64;
        assert!(
            (slow_count / n as f64 - 0.05).abs() < 0.01,
            "{slow_count} slow"
        );
    }

    #[test]
    fn pods_differ_by_their_own_factor_and_the_seed_reproduces_everything() {
        let settings = TrafficNoise {
            seed: 3,
            pod_spread: 0.3,
            ..TrafficNoise::default()
        };
        let p = pod(100.0, 0.0, 0.0);
        let draw = |noise: &mut Noise| -> Vec<f64> {
            ["a", "b", "c"]
                .iter()
                .map(|name| noise.answer(&key(name), &p, 0.0).latency_seconds)
                .collect()
        };
        let first = draw(&mut Noise::new(settings.clone()));
        assert_eq!(first, draw(&mut Noise::new(settings.clone())));
        assert!(first[0] != first[1] && first[1] != first[2], "{first:?}");
        // Without a latency spread a pod's every request takes its own median.
        let mut noise = Noise::new(settings);
        let again = draw(&mut noise);
        assert_eq!(again, draw(&mut noise));
    }

    #[test]
    fn the_load_swings_around_its_rate() {
        let mut noise = Noise::new(TrafficNoise {
            load_swing: 0.5,
            load_period: Duration::from_secs(40),
            ..TrafficNoise::default()
        });
        assert_eq!(noise.swung_rps(100.0), 100.0);
        noise.advance(Duration::from_secs(10));
        assert!((noise.swung_rps(100.0) - 150.0).abs() < 1e-9);
        noise.advance(Duration::from_secs(20));
        assert!((noise.swung_rps(100.0) - 50.0).abs() < 1e-9);
        assert!(
            TrafficNoise {
                load_swing: 1.5,
                ..TrafficNoise::default()
            }
            .validate()
            .is_err()
        );
    }
}
