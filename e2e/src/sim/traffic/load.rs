//! The load generator: every tick, each front with a rate gets its share of requests
//! (fractions carried to the next tick), a set share of them carrying the configured header;
//! each request takes the front's route for it, a destination by smooth weighted round-robin,
//! and a ready pod of that destination round-robin; the pod answers by its error rate.
//! Everything is counted, not drawn at random, so a test knows the split exactly; with noise
//! (`super::noise`) arrivals, errors and latencies are drawn instead, splits stay counted.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::cluster::Cluster;
use super::metrics::Metrics;
use super::noise::{Noise, TrafficNoise};
use super::routes::{Destination, Front};
use crate::sim::store::ObjectKey;

/// At most this much load is made up after a stalled tick, so a paused process does not burst.
const MAX_CATCH_UP: Duration = Duration::from_secs(2);

/// Smooth weighted round-robin (as nginx balances upstreams): over any run of `sum(weights)`
/// picks, each destination gets exactly its weight, interleaved as evenly as possible.
#[derive(Debug, Default)]
struct Smooth {
    weights: Vec<u64>,
    current: Vec<i128>,
}

impl Smooth {
    /// The next pick among `weights`; None when they are all 0. New weights start afresh.
    fn pick(&mut self, weights: &[u64]) -> Option<usize> {
        if self.weights != weights {
            self.weights = weights.to_vec();
            self.current = vec![0; weights.len()];
        }
        let total: i128 = weights.iter().map(|w| i128::from(*w)).sum();
        if total == 0 {
            return None;
        }
        for (current, weight) in self.current.iter_mut().zip(weights) {
            *current += i128::from(*weight);
        }
        let (best, _) = self
            .current
            .iter()
            .enumerate()
            .max_by_key(|(i, c)| (**c, std::cmp::Reverse(*i)))?;
        self.current[best] -= total;
        Some(best)
    }
}

/// A counted share: `take` says yes exactly floor(n x share) times in n calls.
#[derive(Debug, Default)]
struct Share {
    seen: u64,
    taken: u64,
}

impl Share {
    fn take(&mut self, share: f64) -> bool {
        self.seen += 1;
        let due = (self.seen as f64 * share + 1e-9).floor() as u64;
        let yes = due > self.taken;
        if yes {
            self.taken += 1;
        }
        yes
    }
}

/// What a front carries from tick to tick.
#[derive(Debug, Default)]
struct FrontState {
    /// Fraction of a request owed from earlier ticks.
    carry: f64,
    header: Share,
    /// Per route: its destination picker and its mirror share.
    pickers: HashMap<usize, Smooth>,
    mirrors: HashMap<usize, Share>,
    /// This front's draws when its Services ask for noise and the simulator does not.
    noise: Option<Noise>,
}

/// The load generator's state across ticks.
#[derive(Default)]
pub struct Generator {
    fronts: Vec<Front>,
    state: HashMap<String, FrontState>,
    /// Round-robin position per (Service, subset).
    cursors: HashMap<(ObjectKey, Option<String>), usize>,
    /// Noisy traffic's draws; None counts.
    noise: Option<Noise>,
}

impl Generator {
    pub fn new(noise: Option<Noise>) -> Self {
        Self {
            noise,
            ..Self::default()
        }
    }

    /// Forgets what it drew for pods that are gone.
    pub fn retain_pods(&mut self, cluster: &Cluster) {
        let fronts = self.state.values_mut().filter_map(|s| s.noise.as_mut());
        for noise in self.noise.iter_mut().chain(fronts) {
            noise.retain_pods(|key| cluster.pods.contains_key(key));
        }
    }

    /// Takes the rebuilt fronts, keeping the counters of those still there.
    pub fn set_fronts(&mut self, fronts: Vec<Front>) {
        self.state
            .retain(|id, _| fronts.iter().any(|front| front.id == *id));
        self.fronts = fronts;
    }

    /// Sends the requests owed for `elapsed` and records them in `metrics`.
    pub fn tick(
        &mut self,
        cluster: &mut Cluster,
        metrics: &mut Metrics,
        default_rps: f64,
        elapsed: Duration,
    ) {
        let elapsed = elapsed.min(MAX_CATCH_UP);
        let seconds = elapsed.as_secs_f64();
        if let Some(noise) = &mut self.noise {
            noise.advance(elapsed);
        }
        let mut ready: HashMap<(ObjectKey, Option<String>), Vec<String>> = HashMap::new();
        for front in &self.fronts {
            let load = front.load(cluster, default_rps);
            let rps = load.rps.unwrap_or(0.0);
            let state = self.state.entry(front.id.clone()).or_default();
            if rps <= 0.0 {
                state.carry = 0.0;
                continue;
            }
            // The simulator's noise wins; otherwise a front's Services may ask for their own.
            if self.noise.is_none() {
                let wanted = load.noise_seed.map(|seed| TrafficNoise {
                    seed,
                    pod_spread: load
                        .noise_pod_spread
                        .unwrap_or(TrafficNoise::default().pod_spread),
                    ..TrafficNoise::default()
                });
                if state.noise.as_ref().map(Noise::settings) != wanted.as_ref() {
                    state.noise = wanted.map(Noise::new);
                }
            }
            let mut noise = match &mut self.noise {
                Some(noise) => Some(noise),
                None => {
                    if let Some(noise) = state.noise.as_mut() {
                        noise.advance(elapsed);
                    }
                    state.noise.as_mut()
                }
            };
            let count = match noise.as_deref_mut() {
                Some(noise) => noise.arrivals(rps, seconds),
                None => {
                    let owed = state.carry + rps * seconds;
                    let count = owed.floor();
                    state.carry = owed - count;
                    count as u64
                }
            };
            for _ in 0..count {
                let header = match &load.header {
                    Some((name, value)) if state.header.take(load.header_share) => {
                        Some((name.as_str(), value.as_str()))
                    }
                    _ => None,
                };
                let Some(index) = front.route_for(header) else {
                    continue;
                };
                let route = &front.routes[index];
                let weights: Vec<u64> = route.backends.iter().map(|(_, w)| *w).collect();
                let picked = state.pickers.entry(index).or_default().pick(&weights);
                if let Some(chosen) = picked {
                    let destination = &route.backends[chosen].0;
                    deliver(
                        cluster,
                        metrics,
                        &mut self.cursors,
                        &mut ready,
                        noise.as_deref_mut(),
                        destination,
                    );
                }
                if let Some((mirror, percent)) = &route.mirror
                    && state
                        .mirrors
                        .entry(index)
                        .or_default()
                        .take(percent / 100.0)
                {
                    deliver(
                        cluster,
                        metrics,
                        &mut self.cursors,
                        &mut ready,
                        noise.as_deref_mut(),
                        mirror,
                    );
                }
            }
        }
    }
}

/// Hands one request to the next ready pod of a destination; none ready drops it (a 503).
fn deliver(
    cluster: &mut Cluster,
    metrics: &mut Metrics,
    cursors: &mut HashMap<(ObjectKey, Option<String>), usize>,
    ready: &mut HashMap<(ObjectKey, Option<String>), Vec<String>>,
    noise: Option<&mut Noise>,
    destination: &Destination,
) {
    let key = (
        destination.service.clone(),
        destination.subset.as_ref().map(|s| s.name.clone()),
    );
    let pods = ready
        .entry(key.clone())
        .or_insert_with(|| match &destination.subset {
            None => cluster.ready_pods(&destination.service, None),
            Some(subset) => match &subset.labels {
                Some(labels) => cluster.ready_pods(&destination.service, Some(labels)),
                None => Vec::new(),
            },
        });
    if pods.is_empty() {
        return;
    }
    let cursor = cursors.entry(key).or_default();
    let name = &pods[*cursor % pods.len()];
    *cursor = cursor.wrapping_add(1);
    let pod_key = (destination.service.0.clone(), name.clone());
    let (Some(pod), Some(series)) = (cluster.pods.get(&pod_key), metrics.pod_mut(&pod_key)) else {
        return;
    };
    let error_rate = pod.error_rate_at(SystemTime::now());
    match noise {
        Some(noise) => {
            let answer = noise.answer(&pod_key, pod, error_rate);
            series.observe(answer.error, answer.latency_seconds);
        }
        None => {
            series.record(error_rate, pod.latency_seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_round_robin_gives_each_its_weight_interleaved() {
        let mut smooth = Smooth::default();
        let picks: Vec<usize> = (0..10).filter_map(|_| smooth.pick(&[8, 2])).collect();
        assert_eq!(picks.iter().filter(|p| **p == 1).count(), 2);
        assert_ne!(picks[..5].iter().filter(|p| **p == 1).count(), 0);
        assert_eq!(smooth.pick(&[0, 0]), None);
    }

    #[test]
    fn shares_are_counted_exactly() {
        let mut share = Share::default();
        assert_eq!((0..100).filter(|_| share.take(0.1)).count(), 10);
    }
}
