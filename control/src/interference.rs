//! What sharing a GPU with another service costs a service, estimated without I/O from its
//! own measured work: every task-bucket records the services its GPU(s) were shared with,
//! so a service's buckets split into those with a given neighbour and those without it, and
//! the two are compared. Latency is compared on its logarithm (p99 latencies are skewed and
//! an interfering neighbour multiplies them), with Welch's t-test, which does not assume the
//! two sides vary alike; a service without latency is judged on completed work instead.
//!
//! Neighbours come in sets, so a harmless neighbour that often sits beside a harmful one
//! would look harmful too. The estimate therefore explains effects away one at a time: the
//! strongest established neighbour is accepted, and the rest are compared again on buckets
//! free of it, until nothing more is established. Placement and consolidation act only on
//! established estimates; everything else is shown as "not enough evidence".

use std::collections::BTreeSet;
use tessera_model::work::Interference;

/// Samples each side needs before an effect is believed.
pub(crate) const MIN_SAMPLES: usize = 8;
/// 1 − the p-value an effect needs. Every service is compared against each of its
/// neighbours at once, so a loose threshold would turn chance into false pairs: at 0.99,
/// together with [`MIN_EFFECT`] and [`MIN_SAMPLES`], noise alone rarely passes.
pub(crate) const MIN_CONFIDENCE: f64 = 0.99;
/// The smallest relative change worth acting on (a real but tiny effect is not a reason to
/// keep two services apart).
pub(crate) const MIN_EFFECT: f64 = 0.10;
/// The neighbour name of the "any neighbour against running alone" estimate.
pub(crate) const ANY: &str = "*";

/// One task's work over one usage bucket, with the services it shared its GPU with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observation {
    pub service: String,
    /// The services of the other tasks on its GPU(s) during the whole bucket, sorted,
    /// deduplicated (may contain its own service: another replica). Empty: it ran alone.
    pub neighbours: Vec<String>,
    pub completed_per_sec: f64,
    pub latency_p99_ms: Option<f64>,
}

impl Observation {
    fn beside(&self, neighbour: &str) -> bool {
        self.neighbours.iter().any(|n| n == neighbour)
    }

    fn log_latency(&self) -> Option<f64> {
        self.latency_p99_ms
            .filter(|v| v.is_finite() && *v > 0.0)
            .map(f64::ln)
    }

    fn completed(&self) -> Option<f64> {
        Some(self.completed_per_sec).filter(|v| v.is_finite())
    }
}

/// What sharing with each neighbour costs `service`, from its observations (others'
/// observations are ignored): established estimates first, the largest effect first, the
/// "any neighbour" estimate (`*`) last.
pub(crate) fn estimate(service: &str, observations: &[Observation]) -> Vec<Interference> {
    let mine: Vec<&Observation> = observations
        .iter()
        .filter(|o| o.service == service)
        .collect();
    let candidates: BTreeSet<&str> = mine
        .iter()
        .flat_map(|o| o.neighbours.iter().map(String::as_str))
        .collect();
    let mut explained: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    loop {
        // Buckets free of every neighbour accepted so far, so what those cause is not
        // attributed to whoever shared the GPU with them.
        let free: Vec<&Observation> = mine
            .iter()
            .copied()
            .filter(|o| !o.neighbours.iter().any(|n| explained.contains(n.as_str())))
            .collect();
        let alone: Vec<&Observation> = free
            .iter()
            .copied()
            .filter(|o| o.neighbours.is_empty())
            .collect();
        let mut round: Vec<(&str, Interference)> = candidates
            .iter()
            .copied()
            .filter(|n| !explained.contains(n))
            .map(|n| {
                let (with, others): (Vec<&Observation>, Vec<&Observation>) =
                    free.iter().copied().partition(|o| o.beside(n));
                // Running alone is the cleanest baseline; without enough of it, every
                // bucket without the neighbour.
                let without = if alone.len() >= MIN_SAMPLES {
                    &alone
                } else {
                    &others
                };
                (n, compare(n, &with, without))
            })
            .collect();
        let strongest = round
            .iter()
            .enumerate()
            .filter(|(_, (_, i))| i.established)
            .max_by(|(_, (_, x)), (_, (_, y))| effect(x).total_cmp(&effect(y)))
            .map(|(k, _)| k);
        match strongest {
            Some(k) => {
                let (name, found) = round.swap_remove(k);
                explained.insert(name);
                out.push(found);
            }
            None => {
                out.extend(round.into_iter().map(|(_, i)| i));
                break;
            }
        }
    }
    out.sort_by(|x, y| {
        y.established
            .cmp(&x.established)
            .then(effect(y).total_cmp(&effect(x)))
            .then_with(|| x.neighbour.cmp(&y.neighbour))
    });
    let (shared, alone): (Vec<&Observation>, Vec<&Observation>) =
        mine.iter().copied().partition(|o| !o.neighbours.is_empty());
    if !shared.is_empty() && !alone.is_empty() {
        out.push(compare(ANY, &shared, &alone));
    }
    out
}

/// The size of the change an estimate tested (latency, or completed work without latency).
fn effect(i: &Interference) -> f64 {
    i.latency_p99_change
        .or(i.completed_change)
        .map_or(0.0, f64::abs)
}

/// `with` (sharing with `neighbour`) against `without`.
fn compare(neighbour: &str, with: &[&Observation], without: &[&Observation]) -> Interference {
    let series = |side: &[&Observation], of: fn(&Observation) -> Option<f64>| -> Vec<f64> {
        side.iter().copied().filter_map(of).collect()
    };
    let (latency_with, latency_without) = (
        series(with, Observation::log_latency),
        series(without, Observation::log_latency),
    );
    let (completed_with, completed_without) = (
        series(with, Observation::completed),
        series(without, Observation::completed),
    );
    let latency_p99_change = mean(&latency_with)
        .zip(mean(&latency_without))
        .map(|(a, b)| (a - b).exp() - 1.0);
    let completed_change = mean(&completed_with)
        .zip(mean(&completed_without))
        .filter(|(_, b)| *b > 0.0)
        .map(|(a, b)| a / b - 1.0);
    // Latency when both sides have it; completed work otherwise.
    let (tested_with, tested_without, change) = match latency_p99_change {
        Some(_) => (&latency_with, &latency_without, latency_p99_change),
        None => (&completed_with, &completed_without, completed_change),
    };
    let confidence = welch_confidence(tested_with, tested_without);
    let established = tested_with.len() >= MIN_SAMPLES
        && tested_without.len() >= MIN_SAMPLES
        && confidence >= MIN_CONFIDENCE
        && change.is_some_and(|c| c.abs() >= MIN_EFFECT);
    let samples_with = u32::try_from(with.len()).unwrap_or(u32::MAX);
    let samples_without = u32::try_from(without.len()).unwrap_or(u32::MAX);
    let who = match neighbour {
        ANY => "sharing a GPU (any neighbour)".to_owned(),
        // Its own service: another of its replicas on the same GPU.
        n if with.first().is_some_and(|o| o.service == n) => {
            format!("sharing with another {n} task")
        }
        n => format!("sharing with {n}"),
    };
    let what = match (latency_p99_change, completed_change) {
        (Some(l), _) => format!("p99 {}", percent(l)),
        (None, Some(c)) => format!("completed {}", percent(c)),
        (None, None) => "nothing comparable measured".to_owned(),
    };
    let summary = if established {
        format!("{who}: {what} (n = {samples_with})")
    } else {
        format!(
            "{who}: {what}, not enough evidence (n = {samples_with} with, {samples_without} without)"
        )
    };
    Interference {
        neighbour: neighbour.to_owned(),
        samples_with,
        samples_without,
        latency_p99_change,
        completed_change,
        confidence,
        established,
        summary,
    }
}

/// `+38 %`, `−20 %` (a real minus sign), `±0 %`.
fn percent(change: f64) -> String {
    let p = (change * 100.0).round();
    let sign = match p {
        _ if p > 0.0 => "+",
        _ if p < 0.0 => "−",
        _ => "±",
    };
    format!("{sign}{:.0} %", p.abs())
}

/// The p99 a task of a service would see beside `neighbours`: its baseline, raised by
/// every established estimate among them (an improvement is not counted on: placement asks
/// whether a neighbour would push a service past its target).
pub(crate) fn predicted_p99(
    baseline_p99_ms: f64,
    neighbours: &[&str],
    estimates: &[Interference],
) -> f64 {
    let distinct: BTreeSet<&str> = neighbours.iter().copied().filter(|n| *n != ANY).collect();
    distinct.iter().fold(baseline_p99_ms, |p99, n| {
        estimates
            .iter()
            .find(|e| e.established && e.neighbour == *n)
            .and_then(|e| e.latency_p99_change)
            .map_or(p99, |c| p99 * (1.0 + c.max(0.0)))
    })
}

/// The service's p99 running alone: the median over its alone buckets, or over all its
/// buckets when it has run alone too rarely to say; `None` without latency.
pub(crate) fn alone_p99(service: &str, observations: &[Observation]) -> Option<f64> {
    let latencies = |alone_only: bool| -> Vec<f64> {
        observations
            .iter()
            .filter(|o| o.service == service && (!alone_only || o.neighbours.is_empty()))
            .filter_map(|o| o.latency_p99_ms.filter(|v| v.is_finite() && *v > 0.0))
            .collect()
    };
    let alone = latencies(true);
    let mut picked = if alone.len() >= MIN_SAMPLES {
        alone
    } else {
        latencies(false)
    };
    picked.sort_by(f64::total_cmp);
    let mid = picked.len() / 2;
    match picked.len() {
        0 => None,
        n if n % 2 == 1 => picked.get(mid).copied(),
        _ => Some(f64::midpoint(*picked.get(mid - 1)?, *picked.get(mid)?)),
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// 1 − the two-sided p-value of Welch's t-test of `a` against `b`; 0 when a side has fewer
/// than two samples (no variance to judge by). Two constant sides are certain either way.
fn welch_confidence(a: &[f64], b: &[f64]) -> f64 {
    if a.len() < 2 || b.len() < 2 {
        return 0.0;
    }
    let constant = |v: &[f64]| v.windows(2).all(|w| w[0] == w[1]);
    if constant(a) && constant(b) {
        return if a.first() == b.first() { 0.0 } else { 1.0 };
    }
    let moments = |v: &[f64]| {
        let n = v.len() as f64;
        let m = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
        (n, m, var / n)
    };
    let ((na, ma, sa), (nb, mb, sb)) = (moments(a), moments(b));
    let se2 = sa + sb;
    if se2.is_nan() || se2 <= 0.0 {
        return 0.0;
    }
    // Welch–Satterthwaite degrees of freedom.
    let df = se2 * se2 / (sa * sa / (na - 1.0) + sb * sb / (nb - 1.0));
    let t = (ma - mb) / se2.sqrt();
    (1.0 - student_t_two_sided(t, df)).clamp(0.0, 1.0)
}

/// P(|T| ≥ |t|) for Student's t with `df` degrees of freedom: the tail of T is a regularized
/// incomplete beta function of df / (df + t²).
fn student_t_two_sided(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return 1.0;
    }
    if t.is_infinite() {
        return 0.0;
    }
    regularized_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// The regularized incomplete beta function `I_x(a, b)`. Its continued fraction converges
/// fast for `x < (a + 1) / (a + b + 2)`; above that, `I_x(a, b) = 1 − I_{1−x}(b, a)` turns
/// the question around.
fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    // x^a (1 − x)^b / (a B(a, b)), in logarithms so that large a and b do not overflow.
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (-x).ln_1p();
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - ln_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The continued fraction `1 / (1 + d₁ / (1 + d₂ / (1 + …)))` of `I_x(a, b)`, evaluated
/// forward by Lentz's method: each step multiplies the running value by the ratio of
/// successive convergents, kept as two products (C, D) nudged off zero so nothing divides
/// by it.
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPSILON: f64 = 1e-14;
    const MAX_TERMS: u32 = 500;
    let off_zero = |v: f64| if v.abs() < TINY { TINY } else { v };
    // The partial numerators: 1, then d₁, d₂, … (every partial denominator is 1).
    let numerator = |j: u32| {
        let m = f64::from(j / 2);
        if j == 0 {
            1.0
        } else if j % 2 == 1 {
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0))
        } else {
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m))
        }
    };
    let (mut value, mut c, mut d) = (TINY, TINY, 0.0);
    for j in 0..MAX_TERMS {
        let n = numerator(j);
        d = 1.0 / off_zero(1.0 + n * d);
        c = off_zero(1.0 + n / c);
        let ratio = c * d;
        value *= ratio;
        if (ratio - 1.0).abs() < EPSILON {
            break;
        }
    }
    value
}

/// ln Γ(x) for x > 0 by Lanczos's approximation (g = 7, nine terms; about 15 digits),
/// with the reflection formula below ½.
fn ln_gamma(x: f64) -> f64 {
    use std::f64::consts::PI;
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.9999999999998099,
        676.5203681218851,
        -1259.1392167224028,
        771.3234287776531,
        -176.6150291621406,
        12.507343278686905,
        -0.13857109526572012,
        9.984369578019572e-6,
        1.5056327351493116e-7,
    ];
    if x < 0.5 {
        return (PI / (PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let z = x - 1.0;
    let (first, rest) = COEFFICIENTS.split_at(1);
    let series = rest
        .iter()
        .zip(1u32..)
        .fold(first[0], |s, (c, i)| s + c / (z + f64::from(i)));
    let t = z + G + 0.5;
    0.5 * (2.0 * PI).ln() + (z + 0.5) * t.ln() - t + series.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64: deterministic noise without a crate.
    struct Rng(u64);

    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Lognormal noise: exp(σ·z), z roughly standard normal (twelve uniforms − 6).
        fn noise(&mut self, sigma: f64) -> f64 {
            (sigma * ((0..12).map(|_| self.uniform()).sum::<f64>() - 6.0)).exp()
        }

        /// Nothing with probability ⅓, else a random non-empty subset of `pool`.
        fn neighbours(&mut self, pool: &[&'static str]) -> Vec<&'static str> {
            if self.uniform() < 1.0 / 3.0 {
                return Vec::new();
            }
            loop {
                let picked: Vec<&str> = pool
                    .iter()
                    .copied()
                    .filter(|_| self.uniform() < 0.5)
                    .collect();
                if !picked.is_empty() {
                    return picked;
                }
            }
        }
    }

    fn obs(service: &str, neighbours: &[&str], completed: f64, p99: Option<f64>) -> Observation {
        Observation {
            service: service.into(),
            neighbours: neighbours.iter().map(|s| (*s).to_owned()).collect(),
            completed_per_sec: completed,
            latency_p99_ms: p99,
        }
    }

    #[test]
    fn student_t_tails_match_tables() {
        assert!((student_t_two_sided(2.0, 10.0) - 0.0734).abs() < 1e-3);
        assert!((student_t_two_sided(-2.0, 10.0) - 0.0734).abs() < 1e-3);
        assert!((student_t_two_sided(3.0, 30.0) - 0.0054).abs() < 1e-3);
        assert!((student_t_two_sided(0.0, 7.0) - 1.0).abs() < 1e-12);
        assert!((student_t_two_sided(1.0, 1.0) - 0.5).abs() < 1e-9);
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn finds_the_heavy_neighbour_and_no_false_pairs() {
        // `a` is 1.6× slower beside `heavy`; `c`, `d` and `e` harm no one.
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut fleet = Vec::new();
        for _ in 0..120 {
            let beside = rng.neighbours(&["c", "d", "e", "heavy"]);
            let f = if beside.contains(&"heavy") { 1.6 } else { 1.0 };
            let (p99, done) = (50.0 * f * rng.noise(0.15), 100.0 / f * rng.noise(0.1));
            fleet.push(obs("a", &beside, done, Some(p99)));
            for s in ["c", "d", "e"] {
                let beside = rng.neighbours(&["a", "c", "d", "e", "heavy"]);
                let (p99, done) = (30.0 * rng.noise(0.15), 20.0 * rng.noise(0.1));
                fleet.push(obs(s, &beside, done, Some(p99)));
            }
        }
        let a = estimate("a", &fleet);
        let heavy = &a[0];
        let change = heavy.latency_p99_change.unwrap_or(0.0);
        assert!(heavy.neighbour == "heavy" && heavy.established, "{a:?}");
        assert!((0.45..0.8).contains(&change), "{heavy:?}");
        assert!(
            heavy.completed_change.is_some_and(|c| c < -0.2),
            "{heavy:?}"
        );
        let expected = format!(
            "sharing with heavy: p99 +{:.0} % (n = {})",
            change * 100.0,
            heavy.samples_with
        );
        assert_eq!(heavy.summary, expected);
        let names: Vec<&str> = a.iter().map(|i| i.neighbour.as_str()).collect();
        assert_eq!(names.len(), 5, "{names:?}");
        assert_eq!(names[4], ANY);
        assert!(
            a[4].summary
                .starts_with("sharing a GPU (any neighbour): p99 +")
        );
        for i in &a[1..4] {
            assert!(
                !i.established && i.summary.contains("not enough evidence"),
                "{i:?}"
            );
        }
        for s in ["c", "d", "e"] {
            let found = estimate(s, &fleet);
            assert_eq!(found.len(), 6, "{found:?}");
            assert!(found.iter().all(|i| !i.established), "{found:?}");
        }
    }

    #[test]
    fn few_samples_are_not_enough_evidence() {
        let mut o: Vec<Observation> = Vec::new();
        for k in 0..5 {
            o.push(obs("a", &[], 10.0, Some(50.0 + f64::from(k))));
            o.push(obs("a", &["x"], 10.0, Some(100.0 + f64::from(k))));
        }
        let found = estimate("a", &o);
        let x = &found[0];
        assert!(!x.established && x.confidence > 0.99, "{x:?}");
        let expected = "sharing with x: p99 +96 %, not enough evidence (n = 5 with, 5 without)";
        assert_eq!(x.summary, expected);
    }

    #[test]
    fn identical_samples_and_completed_work_alone() {
        let ten =
            |alone: Observation, beside: Observation| [vec![alone; 10], vec![beside; 10]].concat();
        let base = || obs("a", &[], 10.0, Some(50.0));
        let same = estimate("a", &ten(base(), obs("a", &["x"], 10.0, Some(50.0))));
        assert!(
            same[0].confidence == 0.0 && !same[0].established,
            "{same:?}"
        );
        let slower = estimate("a", &ten(base(), obs("a", &["x"], 10.0, Some(60.0))));
        assert!(
            slower[0].confidence == 1.0 && slower[0].established,
            "{slower:?}"
        );
        assert_eq!(slower[0].summary, "sharing with x: p99 +20 % (n = 10)");
        // No latency: judged on completed work.
        let o = ten(obs("b", &[], 100.0, None), obs("b", &["x"], 80.0, None));
        let found = estimate("b", &o);
        let x = &found[0];
        assert!(x.established && x.latency_p99_change.is_none(), "{x:?}");
        assert_eq!(x.summary, "sharing with x: completed −20 % (n = 10)");
    }

    #[test]
    fn prediction_counts_established_harm_and_baseline_is_the_median() {
        let est = |n: &str, change: f64, established: bool| Interference {
            neighbour: n.into(),
            samples_with: 50,
            samples_without: 50,
            latency_p99_change: Some(change),
            completed_change: None,
            confidence: 0.999,
            established,
            summary: String::new(),
        };
        let e = [
            est("heavy", 0.5, true),
            est("maybe", 0.4, false),
            est("kind", -0.2, true),
            est("loud", 1.0, true),
        ];
        let p = |n: &[&str]| predicted_p99(40.0, n, &e);
        assert!((p(&["heavy", "maybe", "kind", "heavy"]) - 60.0).abs() < 1e-9);
        assert!((p(&["heavy", "loud"]) - 120.0).abs() < 1e-9);
        assert!((p(&[]) - 40.0).abs() < 1e-9);

        let mut o: Vec<Observation> = [7.0, 1.0, 9.0, 3.0, 5.0, 2.0, 8.0, 4.0, 6.0]
            .map(|v| obs("a", &[], 1.0, Some(v)))
            .to_vec();
        o.extend([
            obs("a", &["x"], 1.0, Some(1e3)),
            obs("b", &[], 1.0, Some(5e2)),
        ]);
        assert_eq!(alone_p99("a", &o), Some(5.0));
        // Too few alone buckets: every bucket counts.
        o.drain(..5);
        assert_eq!(alone_p99("a", &o), Some(6.0));
        assert_eq!(alone_p99("a", &[obs("a", &[], 1.0, None)]), None);
    }
}
