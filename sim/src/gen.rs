//! A seeded generator of realistic Pod mixes.
//!
//! The generator plays a node's life: Pods arrive until the CPU limits of the live containers
//! (requests for containers without a limit) reach `overcommit` x the machine's CPUs, as long
//! as the sum of requests stays within the node's allocatable CPUs (what the scheduler
//! enforces). Each Pod lives for an exponentially distributed time; whenever Pods leave, new
//! ones arrive to bring the node back to the target. The fill phase ends at `warmup_s`; the
//! measured window is the churn that follows.
//!
//! Randomness comes from a SplitMix64 generator written here, so a seed gives the same trace
//! on every platform and with every dependency version.

use crate::trace::{implied_qos, ContainerSpec, PodSpec, QosName, Trace};

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and fully determined by its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Index drawn with the given weights.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| *w as u64).sum();
        if total == 0 {
            return 0;
        }
        let mut x = self.next_u64() % total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w as u64 {
                return i;
            }
            x -= *w as u64;
        }
        weights.len() - 1
    }

    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.f64()).ln()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    pub seed: u64,
    /// Allocatable CPUs of the node (the sum of requests never exceeds it).
    pub machine_cpus: u64,
    /// Memory of the node in bytes (requests and limits of memory are not overcommitted
    /// beyond it).
    pub machine_memory: u64,
    /// Target: sum of CPU limits (requests where no limit) of live containers / CPUs.
    pub overcommit: f64,
    /// Pod arrivals in the trace (fill + churn).
    pub pods: usize,
    /// Percent of Pods per QoS class: Burstable, BestEffort, Guaranteed.
    pub mix: [u32; 3],
    /// Mean Pod lifetime in seconds.
    pub mean_lifetime_s: f64,
    /// GPUs on the machine; a few Guaranteed Pods ask for one when there are any.
    pub gpus: u32,
}

impl GenParams {
    pub fn new(seed: u64, machine_cpus: u64, machine_memory: u64, overcommit: f64) -> GenParams {
        GenParams {
            seed,
            machine_cpus,
            machine_memory,
            overcommit,
            pods: 3000,
            mix: [70, 20, 10],
            mean_lifetime_s: 600.0,
            gpus: 0,
        }
    }
}

/// CPU requests of Burstable main containers (milli-CPU) and their weights.
const BURSTABLE_REQ: [(u64, u32); 8] = [
    (100, 12),
    (250, 18),
    (500, 22),
    (1000, 20),
    (2000, 14),
    (4000, 8),
    (8000, 4),
    (16000, 2),
];
/// Whole-CPU sizes of Guaranteed main containers and their weights; 0 = a fractional size.
const GUARANTEED_CPUS: [(u64, u32); 7] = [
    (0, 15),
    (1, 15),
    (2, 25),
    (4, 20),
    (8, 15),
    (16, 7),
    (32, 3),
];
const FRACTIONAL_GUARANTEED: [u64; 3] = [250, 500, 1500];
/// Share of Burstable main containers without a CPU limit.
const NO_LIMIT: f64 = 0.1;
/// Share of Burstable Pods with a sidecar (100m request, 500m limit).
const SIDECAR_SHARE: f64 = 0.33;
/// Memory limit per requested CPU of a container, in MiB, and weights.
const MEM_PER_CPU_MIB: [(u64, u32); 4] = [(512, 25), (1024, 40), (2048, 30), (4096, 5)];

fn pick<T: Copy>(rng: &mut Rng, table: &[(T, u32)]) -> T {
    let w: Vec<u32> = table.iter().map(|x| x.1).collect();
    table[rng.weighted(&w)].0
}

fn round_to(v: u64, step: u64) -> u64 {
    v.div_ceil(step) * step
}

fn memory_for(rng: &mut Rng, cpu_milli: u64) -> u64 {
    let per_cpu = pick(rng, &MEM_PER_CPU_MIB);
    let mib = (cpu_milli.max(100) * per_cpu).div_ceil(1000);
    round_to(mib.max(64), 64) << 20
}

/// One random Pod of the given class. `limit_factor` is the mean limit/request ratio that
/// Burstable containers need for the node to reach its overcommit target.
fn make_pod(rng: &mut Rng, qos: QosName, limit_factor: f64, gpus: u32) -> Vec<ContainerSpec> {
    let mut out = Vec::new();
    match qos {
        QosName::BestEffort => {
            out.push(ContainerSpec {
                name: "app".into(),
                cpu_request: None,
                cpu_limit: None,
                memory_limit: None,
                gpus: 0,
            });
        }
        QosName::Guaranteed => {
            let n = pick(rng, &GUARANTEED_CPUS);
            let cpu = if n == 0 {
                FRACTIONAL_GUARANTEED[(rng.next_u64() % 3) as usize]
            } else {
                n * 1000
            };
            let gpu = u32::from(gpus > 0 && n >= 4 && rng.f64() < 0.1);
            out.push(ContainerSpec {
                name: "app".into(),
                cpu_request: Some(cpu),
                cpu_limit: Some(cpu),
                memory_limit: Some(memory_for(rng, cpu)),
                gpus: gpu,
            });
        }
        QosName::Burstable => {
            let req = pick(rng, &BURSTABLE_REQ);
            // Limit factor: uniform from 1x to (2 x mean - 1), so its mean is `limit_factor`;
            // a tenth of the containers set no limit at all.
            let no_limit = rng.f64() < NO_LIMIT;
            let spread = 1.0 + rng.f64() * 2.0 * (limit_factor - 1.0).max(0.0);
            let limit = (!no_limit).then(|| round_to((req as f64 * spread) as u64, 100).max(req));
            out.push(ContainerSpec {
                name: "app".into(),
                cpu_request: Some(req),
                cpu_limit: limit,
                memory_limit: Some(memory_for(rng, req)),
                gpus: 0,
            });
        }
    }
    // A third of the non-BestEffort Pods carry a small sidecar (Burstable by itself, so it
    // turns a Guaranteed Pod Burstable: only add it to Burstable Pods).
    if qos == QosName::Burstable && rng.f64() < SIDECAR_SHARE {
        out.push(ContainerSpec {
            name: "sidecar".into(),
            cpu_request: Some(100),
            cpu_limit: Some(500),
            memory_limit: Some(128 << 20),
            gpus: 0,
        });
    }
    out
}

/// CPU size of a container for the overcommit sum: its limit, or its request without one.
pub fn size_milli(c: &ContainerSpec) -> u64 {
    c.cpu_limit.unwrap_or(c.effective_request())
}

struct Live {
    departure: f64,
    request: u64,
    size: u64,
    memory: u64,
}

fn mean(table: &[(u64, u32)]) -> f64 {
    let w: f64 = table.iter().map(|x| x.1 as f64).sum();
    table.iter().map(|x| x.0 as f64 * x.1 as f64).sum::<f64>() / w.max(1.0)
}

/// The mean limit/request factor Burstable main containers need so that, with this mix, the
/// sum of limits reaches `overcommit` x the sum of requests with 15% to spare (requests can
/// then stay within the machine while limits reach the target).
pub fn limit_factor(mix: [u32; 3], overcommit: f64) -> f64 {
    let total = (mix[0] + mix[1] + mix[2]).max(1) as f64;
    let (pb, pg) = (mix[0] as f64 / total, mix[2] as f64 / total);
    let b = pb * mean(&BURSTABLE_REQ);
    let frac = FRACTIONAL_GUARANTEED.iter().sum::<u64>() as f64 / 3.0;
    let gw: f64 = GUARANTEED_CPUS.iter().map(|x| x.1 as f64).sum();
    let g = pg
        * GUARANTEED_CPUS
            .iter()
            .map(|x| if x.0 == 0 { frac } else { x.0 as f64 * 1000.0 } * x.1 as f64)
            .sum::<f64>()
        / gw;
    let (s_req, s_lim) = (pb * SIDECAR_SHARE * 100.0, pb * SIDECAR_SHARE * 500.0);
    let target = overcommit * 1.15 * (b + g + s_req);
    // limits = (1 - NO_LIMIT) * f * b + NO_LIMIT * b + g + s_lim
    let f = (target - NO_LIMIT * b - g - s_lim) / ((1.0 - NO_LIMIT) * b).max(1.0);
    f.max(1.0)
}

/// Generates a trace. Same parameters (seed included) -> the same trace.
pub fn generate(p: &GenParams) -> Trace {
    let mut rng = Rng::new(p.seed);
    let cap_milli = p.machine_cpus * 1000;
    let target = (p.overcommit * cap_milli as f64) as u64;
    let factor = limit_factor(p.mix, p.overcommit);
    let mut pods: Vec<PodSpec> = Vec::new();
    let mut live: Vec<Live> = Vec::new();
    let (mut req_sum, mut size_sum, mut mem_sum) = (0u64, 0u64, 0u64);
    let mut t = 0.0f64;
    let mut warmup: Option<f64> = None;
    let mut id = 0usize;
    while pods.len() < p.pods {
        // Fill up to the target. The class is drawn first (so arrivals follow the mix), then
        // a Pod of that class that the scheduler would still admit.
        'fill: while size_sum < target && pods.len() < p.pods {
            let qos = match rng.weighted(&p.mix) {
                0 => QosName::Burstable,
                1 => QosName::BestEffort,
                _ => QosName::Guaranteed,
            };
            let mut admitted = None;
            for _ in 0..20 {
                let containers = make_pod(&mut rng, qos, factor, p.gpus);
                let request: u64 = containers.iter().map(|c| c.effective_request()).sum();
                let size: u64 = containers.iter().map(size_milli).sum();
                let memory: u64 = containers.iter().filter_map(|c| c.memory_limit).sum();
                if req_sum + request <= cap_milli
                    && (p.machine_memory == 0 || mem_sum + memory <= p.machine_memory)
                    && size_sum + size <= target + target / 20
                {
                    admitted = Some((containers, request, size, memory));
                    break;
                }
            }
            let Some((containers, request, size, memory)) = admitted else {
                break 'fill;
            };
            let lifetime = rng.exp(p.mean_lifetime_s).max(1.0);
            let departure = round_ms(t + lifetime);
            let qos = implied_qos(&containers);
            pods.push(PodSpec {
                name: format!("pod-{id:05}"),
                namespace: "default".into(),
                qos,
                arrival_s: round_ms(t),
                departure_s: Some(departure),
                annotations: Default::default(),
                containers,
            });
            id += 1;
            live.push(Live {
                departure,
                request,
                size,
                memory,
            });
            req_sum += request;
            size_sum += size;
            mem_sum += memory;
            // Arrivals are spaced 100 ms apart.
            t += 0.1;
        }
        if warmup.is_none() {
            warmup = Some(round_ms(t));
        }
        // Advance to the next departure.
        let Some(next) = live
            .iter()
            .map(|l| l.departure)
            .min_by(|a, b| a.total_cmp(b))
        else {
            break;
        };
        t = t.max(next) + 0.001;
        live.retain(|l| {
            if l.departure <= next {
                req_sum -= l.request;
                size_sum -= l.size;
                mem_sum -= l.memory;
                false
            } else {
                true
            }
        });
    }
    Trace {
        name: format!("generated-seed{}-oc{:.2}", p.seed, p.overcommit),
        description: format!(
            "tap-sim generator: seed {}, {} CPUs, target overcommit {:.2}, {} pods, mix {}% Burstable / {}% BestEffort / {}% Guaranteed, mean lifetime {} s, Burstable limit factor {:.2}",
            p.seed, p.machine_cpus, p.overcommit, p.pods, p.mix[0], p.mix[1], p.mix[2], p.mean_lifetime_s, factor
        ),
        warmup_s: warmup.unwrap_or(0.0),
        pods,
    }
}

fn round_ms(t: f64) -> f64 {
    (t * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64, oc: f64) -> GenParams {
        let mut p = GenParams::new(seed, 384, 768 << 30, oc);
        p.pods = 800;
        p
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        let a = generate(&params(7, 2.0));
        let b = generate(&params(7, 2.0));
        assert_eq!(a, b);
        assert_eq!(a.to_json(), b.to_json());
        let c = generate(&params(8, 2.0));
        assert_ne!(a.pods, c.pods);
    }

    #[test]
    fn generated_traces_are_valid_and_respect_allocatable() {
        for oc in [1.0, 2.0, 3.0] {
            let t = generate(&params(1, oc));
            Trace::parse(&t.to_json()).unwrap();
            assert_eq!(t.pods.len(), 800);
            // Replay: requests never exceed the machine; limits reach the target.
            let mut events: Vec<(f64, i64, i64)> = Vec::new();
            for p in &t.pods {
                let r: i64 = p
                    .containers
                    .iter()
                    .map(|c| c.effective_request() as i64)
                    .sum();
                let s: i64 = p.containers.iter().map(|c| size_milli(c) as i64).sum();
                events.push((p.arrival_s, r, s));
                events.push((p.departure_s.unwrap(), -r, -s));
            }
            events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let (mut r, mut s, mut peak) = (0i64, 0i64, 0i64);
            for (_, dr, ds) in events {
                r += dr;
                s += ds;
                assert!(r <= 384_000, "requests {r} above allocatable");
                peak = peak.max(s);
            }
            let target = (oc * 384_000.0) as i64;
            assert!(
                peak >= target * 9 / 10,
                "oc {oc}: peak {peak} target {target}"
            );
        }
    }

    #[test]
    fn mix_is_roughly_as_asked() {
        let t = generate(&params(3, 2.0));
        let share = |qos: QosName| {
            t.pods.iter().filter(|p| p.qos == qos).count() as f64 / t.pods.len() as f64
        };
        let (be, g) = (share(QosName::BestEffort), share(QosName::Guaranteed));
        assert!((0.12..0.30).contains(&be), "BestEffort share {be}");
        assert!((0.04..0.16).contains(&g), "Guaranteed share {g}");
    }
}
