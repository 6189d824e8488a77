//! What a partly used GPU's free share is worth to the workload.
//!
//! FGD's measure asks which task shapes fit a GPU's free share *now*. It cannot tell a
//! gap that later arrivals will fill (680 free, while 650s and 320s keep coming) from one
//! that only rare small tasks could ever fill (210 free, when few tasks ask for less). This
//! module estimates, for every free share `g`, the share a GPU with `g` free is expected
//! to leave unused once the workload has filled it: the *gap value* `V(g)`.
//!
//! `V` is learned from the demand profile alone. Shared task shapes are drawn in proportion
//! to their weights (fixed seed: the result is deterministic) and packed into GPUs by the
//! rule the engine follows, "take the gap whose value drops most, or an idle GPU", with a
//! share of random choices so that gap sizes the rule avoids are still measured. `V(g)` is
//! the mean final unused share of the GPUs that passed through `g`. Packing and values
//! depend on each other, so the two are iterated, each round's values damped towards the
//! previous ones until they settle. Scarcity is what this captures: a gap size is cheap
//! only if enough tasks of fitting sizes arrive to fill all the gaps of that size the
//! workload creates.

use crate::rng::Rng;

/// Shares run 0..=1000 (thousandths of a GPU); 1000 is an idle GPU.
const SHARES: usize = 1001;
/// Tasks drawn: every common shape appears hundreds of times.
const SAMPLES: usize = 10_000;
const ROUNDS: usize = 16;
/// Weight of the previous round's values in the next ones.
const DAMPING: f64 = 0.7;
/// Share of placements made at random among the gaps that fit, in the simulation only.
const EXPLORE: f64 = 0.1;
/// Visits a gap size needs before its measured value is used.
const MIN_VISITS: u32 = 3;
const SEED: u64 = 0x6761_7073;

/// `V(g)` for `g` in `0..=1000`, from shared shapes given as `(share needed, weight)`;
/// shares outside `1..1000` are ignored. `V(0) = V(1000) = 0`, and a gap no shape fits is
/// worth its whole size.
pub(crate) fn gap_values(shapes: &[(u16, f64)]) -> Vec<f64> {
    let shapes: Vec<(u16, f64)> = shapes
        .iter()
        .copied()
        .filter(|&(need, w)| (1..1000).contains(&need) && w > 0.0)
        .collect();
    let mut value = vec![0.0; SHARES];
    settle(&mut value, &shapes, &Measured::default());
    if shapes.is_empty() {
        return value;
    }
    let draws = draw(&shapes);
    for round in 0..ROUNDS {
        let previous = value.clone();
        let measured = simulate(&draws, &value, round as u64);
        settle(&mut value, &shapes, &measured);
        for (v, old) in value.iter_mut().zip(&previous) {
            *v = DAMPING * old + (1.0 - DAMPING) * *v;
        }
    }
    value
}

/// Per gap size: the summed final unused share of the GPUs that passed through it, and
/// how many did.
struct Measured {
    sum: Vec<f64>,
    visits: Vec<u32>,
}

impl Default for Measured {
    fn default() -> Self {
        Measured {
            sum: vec![0.0; SHARES],
            visits: vec![0; SHARES],
        }
    }
}

/// New values: the measured mean where a gap size was visited often enough; elsewhere the
/// expectation if the next fitting task (drawn by weight) took the gap, or the whole gap
/// when nothing fits. Computed upwards, so smaller gaps are known first.
fn settle(value: &mut [f64], shapes: &[(u16, f64)], measured: &Measured) {
    value[0] = 0.0;
    for g in 1..1000 {
        value[g] = if measured.visits[g] >= MIN_VISITS {
            measured.sum[g] / f64::from(measured.visits[g])
        } else {
            let (mut acc, mut weight) = (0.0, 0.0);
            for &(need, w) in shapes.iter().filter(|&&(need, _)| usize::from(need) <= g) {
                acc += w * value[g - usize::from(need)];
                weight += w;
            }
            if weight > 0.0 { acc / weight } else { g as f64 }
        };
    }
    value[1000] = 0.0;
}

fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// `SAMPLES` shares drawn from the shapes in proportion to their weights.
fn draw(shapes: &[(u16, f64)]) -> Vec<u16> {
    let total: f64 = shapes.iter().map(|&(_, w)| w).sum();
    let mut rng = Rng::new(SEED);
    (0..SAMPLES)
        .map(|_| {
            let mut x = unit(&mut rng) * total;
            for &(need, w) in shapes {
                if x < w {
                    return need;
                }
                x -= w;
            }
            shapes[shapes.len() - 1].0
        })
        .collect()
}

/// Gap sizes that some GPU has now, as a bit set, so a task scans only those.
struct GapSet([u64; 16]);

impl GapSet {
    fn insert(&mut self, g: usize) {
        self.0[g / 64] |= 1 << (g % 64);
    }

    fn remove(&mut self, g: usize) {
        self.0[g / 64] &= !(1 << (g % 64));
    }

    /// Gap sizes from `from` up, ascending.
    fn from(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        (from / 64..16).flat_map(move |w| {
            let mut bits = self.0[w];
            if w == from / 64 {
                bits &= !0u64 << (from % 64);
            }
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * 64 + b
                })
            })
        })
    }
}

/// Packs `draws` into GPUs, each task where `value` drops most (an idle GPU if no gap is
/// better; the tighter fit on ties; at random for a share of them). Only GPUs opened in the
/// first half are measured: later ones have not had the chance to be filled.
fn simulate(draws: &[u16], value: &[f64], round: u64) -> Measured {
    let mut rng = Rng::new(SEED ^ (round + 1));
    let mut gaps: Vec<u16> = Vec::new();
    let mut measured_gpu: Vec<bool> = Vec::new();
    let mut history: Vec<(u32, u16)> = Vec::new();
    let mut at_gap: Vec<Vec<u32>> = vec![Vec::new(); SHARES];
    let mut present = GapSet([0; 16]);
    for (i, &need) in draws.iter().enumerate() {
        let need = usize::from(need);
        let mut chosen = 1000;
        if unit(&mut rng) < EXPLORE {
            let fitting: Vec<usize> = present.from(need).collect();
            let k = rng.below(fitting.len() + 1);
            chosen = fitting.get(k).copied().unwrap_or(1000);
        } else {
            let mut best = value[1000 - need] - value[1000];
            for g in present.from(need) {
                let cost = value[g - need] - value[g];
                // Ascending gaps: the first of equal costs is the tighter fit, and a gap
                // as good as an idle GPU is taken before one.
                if cost < best - 1e-9 || (chosen == 1000 && cost <= best + 1e-9) {
                    best = cost;
                    chosen = g;
                }
            }
        }
        let gpu = if chosen == 1000 {
            gaps.push(1000);
            measured_gpu.push(i < draws.len() / 2);
            (gaps.len() - 1) as u32
        } else {
            let gpu = at_gap[chosen].pop().expect("a present gap has a GPU");
            if at_gap[chosen].is_empty() {
                present.remove(chosen);
            }
            gpu
        };
        let left = gaps[gpu as usize] - need as u16;
        gaps[gpu as usize] = left;
        history.push((gpu, left));
        if left > 0 {
            at_gap[usize::from(left)].push(gpu);
            present.insert(usize::from(left));
        }
    }
    let mut measured = Measured::default();
    for (gpu, gap) in history {
        if measured_gpu[gpu as usize] {
            measured.sum[usize::from(gap)] += f64::from(gaps[gpu as usize]);
            measured.visits[usize::from(gap)] += 1;
        }
    }
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_only_rare_tasks_fit_are_worth_little() {
        // Mostly 810s (each leaves 190), and 650s and 350s that pair up exactly; 150s are
        // rare.
        let v = gap_values(&[(810, 0.5), (650, 0.2), (350, 0.2), (150, 0.02)]);
        assert_eq!(v[0], 0.0);
        assert_eq!(v[1000], 0.0);
        assert_eq!(v[100], 100.0, "nothing fits 100: all of it is lost");
        // 190 free: only the rare 150s fit, far too few for all the 810s' gaps.
        assert!(v[190] > 150.0, "V(190) = {}", v[190]);
        // 350 free: the 350s fill it exactly, and they are as common as the 650s.
        assert!(v[350] < 50.0, "V(350) = {}", v[350]);
    }

    #[test]
    fn deterministic_and_whole_gaps_without_shared_shapes() {
        let shapes = [(470, 0.6), (320, 0.3), (160, 0.1)];
        assert_eq!(gap_values(&shapes), gap_values(&shapes));
        let none = gap_values(&[(1000, 1.0)]);
        assert!(none[..1000].iter().enumerate().all(|(g, &v)| v == g as f64));
        assert_eq!(none[1000], 0.0);
    }

    #[test]
    fn gap_set_lists_present_sizes_in_order() {
        let mut set = GapSet([0; 16]);
        for g in [3, 64, 190, 999, 500] {
            set.insert(g);
        }
        set.remove(500);
        assert_eq!(set.from(0).collect::<Vec<_>>(), vec![3, 64, 190, 999]);
        assert_eq!(set.from(64).collect::<Vec<_>>(), vec![64, 190, 999]);
        assert_eq!(set.from(65).collect::<Vec<_>>(), vec![190, 999]);
        assert_eq!(set.from(1000).count(), 0);
    }
}
