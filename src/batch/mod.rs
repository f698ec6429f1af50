//! Batch assembly: which of the jobs a worker holds run together, and when.
//!
//! A pure state machine, no I/O: jobs are [`BatchPolicy::push`]ed in as they arrive and
//! [`BatchPolicy::decide`] says, for a given instant, either "wait (until …)" or "flush this
//! batch, for this reason". The worker owns the clock and the channel plumbing, so every rule
//! here is unit-tested with plain values.
//!
//! [`LengthBucketing`]: serve the highest priority, oldest job first; fill its batch with the
//! jobs of the same priority closest to it in length (sorted by length, minimal spread, so little
//! padding); cap by `max_batch` and by an [`Admission`] rule; a partial batch waits at most
//! `max_wait`. Three admission rules: [`TokenBudget`] (padded tokens ≤ `max_batch_tokens`),
//! [`WorkBudget`] (the jobs' tokens added up: text batches, whose padding the model thread
//! handles) and [`memory::MemoryBudget`] (predicted peak memory ≤ budget, with AIMD after
//! out-of-memory errors).
//!
//! Neighbours: `worker` feeds it parsed jobs and runs what it flushes on `model`.

pub mod memory;
pub mod split;

use std::time::{Duration, Instant};

/// A job waiting to be batched, with what the policy needs to know about it.
#[derive(Debug)]
pub struct Pending<T> {
    pub item: T,
    /// Input length in tokens (padding is counted in these).
    pub tokens: usize,
    /// 0-9, higher first.
    pub priority: u8,
    pub arrived: Instant,
    /// Arrival order (ties on `arrived`).
    pub seq: u64,
}

/// Why a batch was closed (recorded per batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    /// `max_batch` jobs.
    Full,
    /// Adding the next job would exceed the padded-token budget.
    Tokens,
    /// Adding the next job would exceed the predicted-memory budget.
    Memory,
    /// No more held jobs of a similar length (`max_length_ratio`).
    Bucket,
    /// The oldest job waited `max_wait`.
    Deadline,
    /// No more input is coming (drain or shutdown).
    Drain,
}

impl FlushReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FlushReason::Full => "full",
            FlushReason::Tokens => "tokens",
            FlushReason::Memory => "memory",
            FlushReason::Bucket => "bucket",
            FlushReason::Deadline => "deadline",
            FlushReason::Drain => "drain",
        }
    }
}

/// A batch to run.
#[derive(Debug)]
pub struct Flush<T> {
    /// Sorted by length, shortest first.
    pub items: Vec<Pending<T>>,
    pub reason: FlushReason,
}

impl<T> Flush<T> {
    /// (Σ tokens, batch size × longest, padding waste) of the batch.
    pub fn padding(&self) -> (usize, usize, f64) {
        padding(self.items.iter().map(|p| p.tokens))
    }
}

/// For items of these lengths run as one padded batch: (Σ tokens, size × longest, the fraction
/// of computed tokens that are padding, 1 − Σlen / (B · max_len)).
pub fn padding(lengths: impl Iterator<Item = usize>) -> (usize, usize, f64) {
    let (mut n, mut sum, mut max) = (0usize, 0usize, 0usize);
    for l in lengths {
        n += 1;
        sum += l;
        max = max.max(l);
    }
    let padded = n * max;
    let waste = if padded == 0 { 0.0 } else { 1.0 - sum as f64 / padded as f64 };
    (sum, padded, waste)
}

/// Default bound on longest/shortest input length within one batch.
pub const DEFAULT_MAX_LENGTH_RATIO: f64 = 1.5;
/// Absolute slack on that bound, so that very short jobs still batch together.
const LENGTH_SLACK_TOKENS: f64 = 8.0;

/// What to do now.
#[derive(Debug)]
pub enum Decision<T> {
    /// Nothing to run yet; decide again at this instant (or when a job arrives; `None` = only then).
    Wait(Option<Instant>),
    Flush(Flush<T>),
}

/// What happened to a batch, fed back to the admission rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOutcome {
    Clean,
    OutOfMemory,
}

/// Whether a batch of `batch` jobs, the longest `max_tokens` tokens long, may run.
pub trait Admission: Send {
    /// `None` when admitted, else why not.
    fn check(&self, batch: usize, max_tokens: usize) -> Option<FlushReason>;
    /// The same for a batch whose jobs' tokens add up to `total_tokens`: rules that count the
    /// work jobs bring rather than their padding ([`WorkBudget`]) look at it; the others at
    /// [`Admission::check`].
    fn check_jobs(&self, batch: usize, max_tokens: usize, _total_tokens: usize) -> Option<FlushReason> {
        self.check(batch, max_tokens)
    }
    /// Predicted peak memory in bytes, when the rule has a memory model.
    fn predicted_peak(&self, _batch: usize, _max_tokens: usize) -> Option<f64> {
        None
    }
    fn observe(&mut self, _outcome: &BatchOutcome) {}
    /// How many tokens of jobs a batch cut by this rule may still take when they are all that
    /// would stay behind (a soft budget: no batch of leftovers after a full one); 0 = none.
    fn remainder_allowance(&self) -> usize {
        0
    }
}

/// Padded tokens (batch size × longest input) at most `max_batch_tokens`.
#[derive(Debug, Clone, Copy)]
pub struct TokenBudget {
    pub max_batch_tokens: usize,
}

impl Admission for TokenBudget {
    fn check(&self, batch: usize, max_tokens: usize) -> Option<FlushReason> {
        (batch * max_tokens > self.max_batch_tokens).then_some(FlushReason::Tokens)
    }
}

/// The jobs' tokens added up at most `max_tokens` (kind `cosyvoice2` text batches: the model thread
/// segments and buckets them itself, so a batch's work is the sum of its jobs', not its size × its
/// longest). Without the sum ([`Admission::check`]) it assumes every job is the longest. A soft
/// budget: a batch takes the jobs past it when they are all that is left and add at most a quarter
/// of it ([`Admission::remainder_allowance`]) — on the H200 such a leftover (one chapter after a
/// full batch) ran alone at a fraction of the GPU (docs/PERFORMANCE.md, 2026-12-04).
#[derive(Debug, Clone, Copy)]
pub struct WorkBudget {
    pub max_tokens: usize,
}

impl Admission for WorkBudget {
    fn check(&self, batch: usize, max_tokens: usize) -> Option<FlushReason> {
        TokenBudget { max_batch_tokens: self.max_tokens }.check(batch, max_tokens)
    }

    fn check_jobs(&self, _batch: usize, _max_tokens: usize, total_tokens: usize) -> Option<FlushReason> {
        (total_tokens > self.max_tokens).then_some(FlushReason::Tokens)
    }

    fn remainder_allowance(&self) -> usize {
        self.max_tokens / 4
    }
}

/// A batch assembly policy.
pub trait BatchPolicy<T>: Send {
    fn push(&mut self, job: Pending<T>);
    /// `closing`: no more jobs will arrive; flush what is held.
    fn decide(&mut self, now: Instant, closing: bool) -> Decision<T>;
    /// Jobs held.
    fn len(&self) -> usize;
    /// The tokens of the jobs held, added up (the work they bring).
    fn tokens(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Takes every held job out (shutdown returns them to the queue).
    fn take_all(&mut self) -> Vec<Pending<T>>;
    /// Feeds back a batch's outcome.
    fn observe(&mut self, _outcome: &BatchOutcome) {}
    /// Predicted peak memory of a batch, when the policy has a memory model.
    fn predicted_peak(&self, _batch: usize, _max_tokens: usize) -> Option<f64> {
        None
    }
}

/// Length bucketing under a batch-size cap and an admission rule, with a deadline.
#[derive(Debug)]
pub struct LengthBucketing<T, A = TokenBudget> {
    pub max_batch: usize,
    pub max_wait: Duration,
    /// Longest job at most this × the shortest in one batch (bounds padding waste).
    pub max_length_ratio: f64,
    pub admission: A,
    pool: Vec<Pending<T>>,
}

impl<T> LengthBucketing<T, TokenBudget> {
    /// Bucketing with the padded-token cap only.
    pub fn new(max_batch: usize, max_wait: Duration, max_batch_tokens: usize) -> Self {
        LengthBucketing::with_admission(max_batch, max_wait, TokenBudget { max_batch_tokens: max_batch_tokens.max(1) })
    }
}

impl<T, A: Admission> LengthBucketing<T, A> {
    pub fn with_admission(max_batch: usize, max_wait: Duration, admission: A) -> Self {
        LengthBucketing { max_batch: max_batch.max(1), max_wait, max_length_ratio: DEFAULT_MAX_LENGTH_RATIO, admission, pool: Vec::new() }
    }

    /// Sets the bound on the longest/shortest length ratio within a batch.
    pub fn with_max_length_ratio(mut self, ratio: f64) -> Self {
        self.max_length_ratio = ratio.max(1.0);
        self
    }

    /// Index in `pool` of the job to serve first: highest priority, then oldest.
    fn anchor(&self) -> usize {
        let mut best = 0;
        for (i, p) in self.pool.iter().enumerate() {
            let b = &self.pool[best];
            if (p.priority, std::cmp::Reverse(p.seq)) > (b.priority, std::cmp::Reverse(b.seq)) {
                best = i;
            }
        }
        best
    }

    /// Picks the anchor's batch and removes it from the pool.
    fn select(&mut self, closing: bool) -> Flush<T> {
        let anchor = self.anchor();
        let anchor_seq = self.pool[anchor].seq;
        let priority = self.pool[anchor].priority;
        // Same-priority jobs sorted by length; the anchor's position in that order.
        let mut class: Vec<usize> = (0..self.pool.len()).filter(|&i| self.pool[i].priority == priority).collect();
        class.sort_by_key(|&i| (self.pool[i].tokens, self.pool[i].seq));
        let pos = class.iter().position(|&i| self.pool[i].seq == anchor_seq).unwrap_or(0);
        let k = self.max_batch.min(class.len());
        // The window of k jobs containing the anchor with the smallest length spread.
        let lo = pos.saturating_sub(k - 1);
        let hi = pos.min(class.len() - k);
        let start = (lo..=hi)
            .min_by_key(|&s| self.pool[class[s + k - 1]].tokens - self.pool[class[s]].tokens)
            .unwrap_or(lo);
        let mut window: Vec<usize> = class[start..start + k].to_vec();
        let anchor_tokens = self.pool[anchor].tokens;
        // Bound padding: the longest job at most `max_length_ratio` × the shortest (plus a few
        // tokens of slack for very short jobs); drop the job farthest in length from the anchor.
        let spread_ok = |w: &[usize], pool: &[Pending<T>]| {
            let lo = w.iter().map(|&i| pool[i].tokens).min().unwrap_or(0) as f64;
            let hi = w.iter().map(|&i| pool[i].tokens).max().unwrap_or(0) as f64;
            hi <= lo * self.max_length_ratio + LENGTH_SLACK_TOKENS
        };
        let mut bucket_limited = false;
        while window.len() > 1 && !spread_ok(&window, &self.pool) {
            bucket_limited = true;
            let far = window
                .iter()
                .enumerate()
                .filter(|(_, &i)| self.pool[i].seq != anchor_seq)
                .max_by(|(_, &a), (_, &b)| {
                    let d = |i: usize| ((self.pool[i].tokens.max(1) as f64) / (anchor_tokens.max(1) as f64)).ln().abs();
                    d(a).total_cmp(&d(b))
                })
                .map(|(w, _)| w);
            match far {
                Some(w) => {
                    window.remove(w);
                }
                None => break,
            }
        }
        // Enforce the admission rule by dropping the job farthest in length from the anchor.
        let mut limited_by: Option<FlushReason> = None;
        let mut total: usize = window.iter().map(|&i| self.pool[i].tokens).sum();
        while window.len() > 1 {
            let max_len = window.iter().map(|&i| self.pool[i].tokens).max().unwrap_or(0);
            let Some(reason) = self.admission.check_jobs(window.len(), max_len, total) else {
                break;
            };
            limited_by = Some(reason);
            let (far, job) = window
                .iter()
                .enumerate()
                .filter(|(_, &i)| self.pool[i].seq != anchor_seq)
                .max_by_key(|(_, &i)| self.pool[i].tokens.abs_diff(anchor_tokens))
                .map(|(w, &i)| (w, i))
                .unwrap_or((0, window[0]));
            total -= self.pool[job].tokens;
            window.remove(far);
        }
        // A soft budget takes a small remainder rather than leave it for a batch of its own (never
        // past the length-ratio bound: not when that bound already left jobs out).
        if limited_by.is_some() && !bucket_limited && class.len() == self.pool.len() && class.len() <= self.max_batch {
            let left: usize = self.pool.iter().map(|p| p.tokens).sum::<usize>() - total;
            if left <= self.admission.remainder_allowance() {
                // Still a batch the budget filled: it runs now.
                window = class.clone();
            }
        }
        let reason = if let Some(reason) = limited_by {
            reason
        } else if window.len() == self.max_batch {
            FlushReason::Full
        } else if bucket_limited {
            FlushReason::Bucket
        } else if closing {
            FlushReason::Drain
        } else {
            FlushReason::Deadline
        };
        // Remove selected jobs from the pool (highest index first keeps the others valid).
        let mut chosen = window.clone();
        chosen.sort_unstable_by(|a, b| b.cmp(a));
        let mut items: Vec<Pending<T>> = chosen.into_iter().map(|i| self.pool.swap_remove(i)).collect();
        items.sort_by_key(|p| (p.tokens, p.seq));
        Flush { items, reason }
    }
}

impl<T: Send, A: Admission> BatchPolicy<T> for LengthBucketing<T, A> {
    fn push(&mut self, job: Pending<T>) {
        self.pool.push(job);
    }

    fn tokens(&self) -> usize {
        self.pool.iter().map(|p| p.tokens).sum()
    }

    fn decide(&mut self, now: Instant, closing: bool) -> Decision<T> {
        if self.pool.is_empty() {
            return Decision::Wait(None);
        }
        let oldest = self.pool.iter().map(|p| p.arrived).min().unwrap_or(now);
        let deadline = oldest + self.max_wait;
        if closing || self.pool.len() >= self.max_batch || now >= deadline {
            return Decision::Flush(self.select(closing));
        }
        // Enough held that the anchor's batch is already capped by the admission rule.
        let max_len = self.pool.iter().map(|p| p.tokens).max().unwrap_or(0);
        let total = self.pool.iter().map(|p| p.tokens).sum();
        if self.pool.len() > 1 && self.admission.check_jobs(self.pool.len(), max_len, total).is_some() {
            let flush = self.select(closing);
            if matches!(flush.reason, FlushReason::Tokens | FlushReason::Memory) {
                return Decision::Flush(flush);
            }
            // Not capped after all: put it back and wait.
            self.pool.extend(flush.items);
        }
        Decision::Wait(Some(deadline))
    }

    fn len(&self) -> usize {
        self.pool.len()
    }

    fn take_all(&mut self) -> Vec<Pending<T>> {
        std::mem::take(&mut self.pool)
    }

    fn observe(&mut self, outcome: &BatchOutcome) {
        self.admission.observe(outcome);
    }

    fn predicted_peak(&self, batch: usize, max_tokens: usize) -> Option<f64> {
        self.admission.predicted_peak(batch, max_tokens)
    }
}

#[cfg(test)]
mod tests;
