//! The lower bound of the autoscaling benchmark: at each instant, the fewest GPUs that can
//! hold the tasks live then (each from its arrival, never waiting, for its duration),
//! integrated over time. Whole-GPU tasks need their GPUs to themselves; shared tasks need
//! at least the Martello–Toth L2 bound of their shares packed into GPUs of 1000. Host CPU
//! and memory, node sizes and boot delays are left out, so no policy provisions less.

use super::Job;
use std::collections::BTreeMap;

/// One GPU in thousandths.
const GPU: u64 = 1000;

/// The Martello–Toth L2 lower bound on the GPUs that hold `shares` (thousandths, each
/// below 1000, with counts).
pub fn shared_bound(shares: &BTreeMap<u16, u32>) -> u64 {
    let half = (GPU / 2) as u16;
    let mut best = 0u64;
    let thresholds = std::iter::once(0u16).chain(shares.keys().copied().filter(|&s| s <= half));
    for k in thresholds {
        let (mut big, mut mid, mut mid_sum, mut small_sum) = (0u64, 0u64, 0u64, 0u64);
        for (&s, &n) in shares {
            let (s64, n64) = (u64::from(s), u64::from(n));
            if s64 > GPU - u64::from(k) {
                big += n64;
            } else if s > half {
                mid += n64;
                mid_sum += s64 * n64;
            } else if s >= k {
                small_sum += s64 * n64;
            }
        }
        let room = mid * GPU - mid_sum;
        let more = small_sum.saturating_sub(room).div_ceil(GPU);
        best = best.max(big + mid + more);
    }
    best
}

/// GPU-seconds of the lower bound over `jobs` (a task without a duration lives until
/// `trace_end`).
pub fn gpu_seconds(jobs: &[Job], trace_end: u64) -> u128 {
    // (time, starts?, job): ends before starts at the same instant.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(jobs.len() * 2);
    for (j, job) in jobs.iter().enumerate() {
        let end = job.end_after(job.created, trace_end);
        // A task that ends as it arrives holds nothing for any time.
        if end > job.created {
            events.push((job.created, true, j));
            events.push((end, false, j));
        }
    }
    events.sort_unstable();
    let mut whole = 0u64;
    let mut shares: BTreeMap<u16, u32> = BTreeMap::new();
    let mut total = 0u128;
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        while i < events.len() && events[i].0 == t {
            let (_, starts, j) = events[i];
            let job = &jobs[j];
            if job.share >= 1000 {
                if starts {
                    whole += u64::from(job.gpus);
                } else {
                    whole -= u64::from(job.gpus);
                }
            } else if starts {
                *shares.entry(job.share).or_default() += 1;
            } else {
                let n = shares.get_mut(&job.share).expect("started");
                *n -= 1;
                if *n == 0 {
                    shares.remove(&job.share);
                }
            }
            i += 1;
        }
        if let Some(&(next, _, _)) = events.get(i) {
            let gpus = whole + shared_bound(&shares);
            total += u128::from(gpus) * u128::from(next - t);
        }
    }
    total
}
