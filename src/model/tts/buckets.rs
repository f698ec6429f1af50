//! Token2wav buckets of a text batch's finished segments (kinds `cosyvoice2` and `cosyvoice3`): which segments,
//! waiting after the LLM, go through token2wav together. While the LLM decodes only a run of
//! like-length segments that fills a bucket; at the batch's end all of them, split where padding
//! and calls cost least. The bucket cap backs off after out-of-memory errors (AIMD), and each
//! batch's buckets are counted for the log. [`run_bucket`] runs one through token2wav (out of
//! memory: the cap backs off and its segments wait again), [`cut_segments`] cuts the buckets'
//! waveforms into segments on a thread of their own, and [`vocode`] is token2wav's loop (on the
//! model's thread) that takes the LLM's finished segments and runs the buckets as they fill.
//!
//! Neighbours: `tts` (its model thread takes and runs the buckets), `crate::batch`
//! (the admission rules that bound a bucket by memory or tokens).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use crate::model::cuda_stream::SideStream;
use crate::model::tch_panic::caught;
use crate::model::token2wav::{stretched_len, HostWaves, TextToken2Wav};
use crate::batch::{Admission, BatchOutcome};
use crate::model::{ModelError, SynthItem};

/// A segment whose speech tokens wait for token2wav.
pub(super) struct Ready {
    pub item: usize,
    pub segment: usize,
    pub tokens: Vec<i64>,
    pub voice: i64,
    /// Its job's `speed` (`None`: 1).
    pub speed: Option<f64>,
}

impl Ready {
    /// Its length as buckets count it (`stretched_len`: a slow speed lengthens the vocoder's work).
    pub fn len(&self) -> usize {
        stretched_len(self.tokens.len(), self.speed)
    }
}

/// How full a text batch's token2wav buckets were (logged per batch: `token2wav buckets`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BucketStats {
    pub buckets: u64,
    pub segments: u64,
    /// Speech tokens the buckets' segments carry.
    pub tokens: u64,
    /// Bucket size × its longest segment, summed: what the flow ran on.
    pub padded_tokens: u64,
    /// The thread the buckets ran on (the model's: libtorch keeps cuDNN's plans and attention
    /// graphs per thread, so it must outlive the batch); `None` before the first bucket.
    pub thread: Option<std::thread::ThreadId>,
    /// The batch's closing buckets, run after the LLM's last segment came (the GPU has no decode
    /// to run beside them), and the milliseconds from that moment to token2wav's end.
    pub closing_buckets: u64,
    pub closing_ms: u64,
}

impl BucketStats {
    pub(super) fn add(&mut self, lengths: impl Iterator<Item = usize>) {
        let (mut n, mut sum, mut longest) = (0u64, 0u64, 0u64);
        for len in lengths {
            n += 1;
            sum += len as u64;
            longest = longest.max(len as u64);
        }
        self.buckets += 1;
        self.thread = Some(std::thread::current().id());
        self.segments += n;
        self.tokens += sum;
        self.padded_tokens += n * longest;
    }

    /// Real tokens over padded ones (1 with no padding).
    pub fn fill(&self) -> f64 {
        if self.padded_tokens == 0 { 1.0 } else { self.tokens as f64 / self.padded_tokens as f64 }
    }
}

/// While the LLM decodes a bucket is taken only when it is this full: its segments' speech tokens
/// over its size × its longest. Measured 2026-12-04 on the H200 (`scripts/device/run.sh text-e2e`):
/// taking the longest waiting segments as soon as a bucket's worth waited filled buckets to 0.54
/// (a few long segments padded a hundred short ones) and token2wav ran at 258 audio-s/s inside
/// text batches against 541 on equal lengths. The LLM keeps the GPU busy while like segments
/// gather; at the batch's end every waiting segment is taken, longest first (`flush`).
const MIN_FILL: f64 = 0.9;

/// A token2wav call's fixed cost in padded speech tokens, for splitting the batch-end leftovers.
/// From the H200 bench with both packages (2026-12-04): 32 ten-second items took 0.609 s and 64
/// took 1.148 s, i.e. 16.8 ms an item (250 tokens) and 70 ms a call — about 1,000 tokens' worth.
const BUCKET_OVERHEAD_TOKENS: usize = 1_000;

/// The least a token2wav call costs, in padded speech tokens, however little it holds: a small
/// bucket is launch-bound (ten Euler steps of the compiled estimator, the vocoder, the encoder).
/// From the H200 corpus run (2026-12-04, worker log): batch-end buckets of 36 to 128
/// short segments each took 0.27–0.32 s (flow steps 0.18–0.19 s), the time of ≈ 4,500 padded tokens
/// at the bench's 16.8 ms per 250, of which [`BUCKET_OVERHEAD_TOKENS`] is the call's overhead.
const CALL_FLOOR_TOKENS: usize = 3_500;

/// The next token2wav batch from `ready`, sorted longest first: a run of consecutive segments as
/// long as the admission rule and `max_batch` allow for its longest. With `flush`, the first run of
/// the split of all of them that costs least ([`cheapest_first_run`]); otherwise the longest run
/// that is complete (one more segment would not be admitted) and at least [`MIN_FILL`] full, or
/// (`least` above 0: `[llm] token2wav_least_bucket`) the longest part of a run, at least `least`
/// long, that is; or none: short and ragged runs wait for more segments to finish.
pub(super) fn take_bucket(ready: &mut Vec<Ready>, admission: &dyn Admission, max_batch: usize, least: usize, flush: bool) -> Option<Vec<Ready>> {
    if ready.is_empty() {
        return None;
    }
    ready.sort_by_key(|r| std::cmp::Reverse(r.len()));
    let lengths: Vec<usize> = ready.iter().map(Ready::len).collect();
    // How many segments from `start` one bucket admits (at least one: a lone segment that does
    // not fit is the worker's to split). The admission rule is monotone in size: bisect.
    let admitted = |start: usize| -> usize {
        let (mut fits, mut refused) = (1, (lengths.len() - start).min(max_batch) + 1);
        while refused - fits > 1 {
            let mid = (fits + refused) / 2;
            if admission.check(mid, lengths[start]).is_none() {
                fits = mid;
            } else {
                refused = mid;
            }
        }
        fits
    };
    if flush {
        let size = cheapest_first_run(&lengths, admitted);
        return Some(ready.drain(..size).collect());
    }
    let mut prefix = Vec::with_capacity(lengths.len() + 1);
    prefix.push(0usize);
    for len in &lengths {
        prefix.push(prefix[prefix.len() - 1] + len);
    }
    for start in 0..lengths.len() {
        let size = admitted(start);
        let complete = size == max_batch || admission.check(size + 1, lengths[start]).is_some();
        // Shorter runs further down admit at least as many and have fewer segments below them:
        // none of them is complete or longer either.
        if !complete && (least == 0 || size < least) {
            return None;
        }
        let fill = |n: usize| (prefix[start + n] - prefix[start]) as f64 / (n * lengths[start]) as f64;
        // A complete run goes whole; one taken for its length, as far as it is full (longest
        // first, a run's fill only falls as it grows).
        let size = match complete {
            true => size,
            false => (least..=size).rev().find(|&n| fill(n) >= MIN_FILL).unwrap_or(size),
        };
        if fill(size) >= MIN_FILL {
            return Some(ready.drain(start..start + size).collect());
        }
    }
    None
}

/// `lengths` (sorted longest first) split into consecutive runs, each at most `admitted(start)`
/// long, so that each run's padded tokens (at least [`CALL_FLOOR_TOKENS`]) plus
/// [`BUCKET_OVERHEAD_TOKENS`] add up to the least: the first run's length. Segments left waiting
/// for like-length peers (long ones, above all) go together instead of padding a bucket of short
/// ones, and short leftovers share calls. Dynamic programming over suffixes (a run's
/// cost is set by its first, longest segment): `lengths.len()` × `max_batch` steps.
fn cheapest_first_run(lengths: &[usize], admitted: impl Fn(usize) -> usize) -> usize {
    let n = lengths.len();
    let mut cost = vec![0usize; n + 1];
    let mut first = vec![1usize; n + 1];
    for start in (0..n).rev() {
        cost[start] = usize::MAX;
        for size in 1..=admitted(start).min(n - start) {
            let c = (size * lengths[start]).max(CALL_FLOOR_TOKENS) + BUCKET_OVERHEAD_TOKENS + cost[start + size];
            if c < cost[start] {
                cost[start] = c;
                first[start] = size;
            }
        }
    }
    first[0]
}

/// Clean buckets before the cap grows by one again.
const RECOVER_AFTER: usize = 4;

/// The token2wav bucket cap, AIMD: half the size of a bucket that ran out of memory, one more
/// after every `RECOVER_AFTER` clean buckets, never above `[llm] token2wav_max_bucket`; and the
/// least run of like segments taken while the LLM decodes (`[llm] token2wav_least_bucket`; 0:
/// only runs that fill a bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCap {
    pub cap: usize,
    pub least: usize,
    max: usize,
    clean: usize,
}

impl BucketCap {
    pub fn new(max: usize, least: usize) -> BucketCap {
        BucketCap { cap: max.max(1), least, max: max.max(1), clean: 0 }
    }

    pub fn clean(&mut self) {
        self.clean += 1;
        if self.clean >= RECOVER_AFTER {
            self.clean = 0;
            self.cap = (self.cap + 1).min(self.max);
        }
    }

    pub fn out_of_memory(&mut self, size: usize) {
        self.cap = (size / 2).max(1);
        self.clean = 0;
    }
}

/// Runs one token2wav batch (segments of jobs `dropped` marks failed are skipped) and sends its
/// host waveforms with each segment's (item, segment) to `cut`, counting it in `stats`.
/// Out of memory with more than one segment: the bucket cap backs off, the admission rule hears
/// of it, and the segments go back to `ready` to be taken again in smaller buckets — the LLM's
/// work for the batch is kept. One segment that does not fit alone fails the batch (the worker
/// splits it).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_bucket(
    token2wav: &mut dyn TextToken2Wav,
    batch: Vec<Ready>,
    dropped: &[AtomicBool],
    cut: &Sender<(Vec<(usize, usize)>, HostWaves)>,
    ready: &mut Vec<Ready>,
    cap: &mut BucketCap,
    admission: &mut dyn Admission,
    stats: &mut BucketStats,
) -> Result<(), ModelError> {
    let batch: Vec<Ready> = batch.into_iter().filter(|r| !dropped[r.item].load(Ordering::Relaxed)).collect();
    if batch.is_empty() {
        return Ok(());
    }
    let items: Vec<SynthItem> = batch.iter().map(|r| SynthItem { speed: r.speed, ..SynthItem::tokens(r.tokens.clone(), r.voice) }).collect();
    let started = std::time::Instant::now();
    // A libtorch failure tch raises as a panic is this bucket's error too: out of memory shrinks
    // the buckets below instead of failing the batch.
    match caught(batch.len(), || token2wav.run_to_host(&items)) {
        Ok((_mels, waves)) => {
            stats.add(batch.iter().map(|r| r.tokens.len()));
            // Where a bucket's time went on this thread, the waveforms' copy to the host included
            // (RUST_LOG=voxbatch::model::tts=debug); cutting them is the cutter's.
            if let Some(t) = token2wav.last_timing() {
                // Pipelined (`queued`), the stage times are their launches' only.
                tracing::debug!(
                    target: "voxbatch::model::tts",
                    segments = batch.len(),
                    queued = waves.is_queued(),
                    total_ms = started.elapsed().as_millis() as u64,
                    encoder_ms = t.encoder.as_millis() as u64,
                    flow_steps_ms = t.flow_steps.as_millis() as u64,
                    vocoder_ms = t.vocoder.as_millis() as u64,
                    encoder_wait_ms = t.waited[0].as_millis() as u64,
                    flow_steps_wait_ms = t.waited[1].as_millis() as u64,
                    vocoder_wait_ms = t.waited[2].as_millis() as u64,
                    alloc_retries = t.allocator[0],
                    cuda_mallocs = t.allocator[1],
                    cuda_frees = t.allocator[2],
                    "token2wav bucket"
                );
            }
            // A send fails only when the cutter stopped on an error, which the batch reports.
            let _ = cut.send((batch.iter().map(|r| (r.item, r.segment)).collect(), waves));
            cap.clean();
            admission.observe(&BatchOutcome::Clean);
            Ok(())
        }
        Err(e) if e.is_oom() && batch.len() > 1 => {
            token2wav.release_cached();
            cap.out_of_memory(batch.len());
            admission.observe(&BatchOutcome::OutOfMemory);
            tracing::warn!(segments = batch.len(), cap = cap.cap, "token2wav ran out of memory: smaller buckets from now on");
            ready.extend(batch);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Cuts each bucket's waveforms (the segments' (item, segment) in batch order, the bucket's host
/// waveforms) into each segment's samples, until every sender is gone. A queued copy (pipelined
/// buckets) is waited for here, off the token2wav thread; returns with the samples the GPU seconds
/// of the queued buckets (each from its first kernel to its copy's end, on its stream: the spans
/// of one stream do not overlap), 0 when none was queued.
pub(super) fn cut_segments(buckets: Receiver<(Vec<(usize, usize)>, HostWaves)>) -> Result<(Vec<(usize, usize, Vec<f32>)>, f64), ModelError> {
    let mut out = Vec::new();
    let mut queued_seconds = 0.0;
    for (owners, waves) in buckets {
        let (rows, gpu_seconds) = waves.into_timed_rows()?;
        queued_seconds += gpu_seconds.unwrap_or(0.0);
        for ((item, segment), samples) in owners.into_iter().zip(rows) {
            out.push((item, segment, samples));
        }
    }
    Ok((out, queued_seconds))
}

/// token2wav's loop of `TextToSpeech::decode_and_vocode`, on the model's thread: takes the segments the LLM
/// finishes from `segments` (and starts with `ready`), runs each full bucket as soon as it is
/// (`take_bucket`), waits for more when none is, and once the LLM has sent its last segment runs
/// the rest in the batch's last buckets — on `closing` when given (a stream of every SM, after
/// the decode's share of them was kept from token2wav: `[llm] decode_sms`). Stops early, without
/// error, when `abort` is set.
#[allow(clippy::too_many_arguments)]
pub(super) fn vocode(
    token2wav: &mut dyn TextToken2Wav,
    segments: Receiver<Ready>,
    mut closing: Option<&SideStream>,
    mut ready: Vec<Ready>,
    dropped: &[AtomicBool],
    abort: &AtomicBool,
    cut: &Sender<(Vec<(usize, usize)>, HostWaves)>,
    cap: &mut BucketCap,
    admission: &mut dyn Admission,
    stats: &mut BucketStats,
) -> Result<(), ModelError> {
    let mut decoding = true;
    let mut _closing_entered = None;
    // From the decode's end: how long the closing buckets take, and how many there are.
    let mut closing_since: Option<std::time::Instant> = None;
    let closed = |since: Option<std::time::Instant>, stats: &mut BucketStats| {
        if let Some(t) = since {
            stats.closing_ms += t.elapsed().as_millis() as u64;
        }
    };
    loop {
        if abort.load(Ordering::Relaxed) {
            closed(closing_since, stats);
            return Ok(());
        }
        while decoding {
            match segments.try_recv() {
                Ok(r) => ready.push(r),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => decoding = false,
            }
        }
        if !decoding {
            closing_since.get_or_insert_with(std::time::Instant::now);
            // The decode is done: the batch's last buckets may have every SM. The buckets before
            // were waited for (`run_bucket`), or are waited for by the cutter, and the memory
            // they leave cached is freed by the allocator when the new stream needs it.
            if let Some(stream) = closing.take() {
                // Until the batch's end: the caller's stream is current again after it.
                _closing_entered = Some(stream.enter_scoped().map_err(|e| ModelError::Inference(e.into()))?);
            }
        }
        if let Some(batch) = take_bucket(&mut ready, &*admission, cap.cap, cap.least, !decoding) {
            if !decoding {
                stats.closing_buckets += 1;
            }
            run_bucket(token2wav, batch, dropped, cut, &mut ready, cap, admission, stats)?;
            continue;
        }
        if !decoding {
            closed(closing_since, stats);
            return Ok(());
        }
        // Nothing to run yet: wait for the LLM's next segment.
        match segments.recv() {
            Ok(r) => ready.push(r),
            Err(_) => decoding = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::TokenBudget;

    #[test]
    fn the_bucket_cap_halves_below_an_oom_and_climbs_back_slowly_to_its_maximum() {
        let mut cap = BucketCap::new(128, 0);
        cap.out_of_memory(128);
        assert_eq!(cap.cap, 64);
        cap.out_of_memory(64);
        cap.out_of_memory(1);
        assert_eq!(cap.cap, 1, "never below one");
        for _ in 0..RECOVER_AFTER * 3 {
            cap.clean();
        }
        assert_eq!(cap.cap, 4, "one more per {RECOVER_AFTER} clean buckets");
        for _ in 0..RECOVER_AFTER * 1000 {
            cap.clean();
        }
        assert_eq!(cap.cap, 128, "never above max_batch");
        assert_eq!(BucketCap::new(0, 0).cap, 1);
    }

    fn waiting(lengths: impl IntoIterator<Item = usize>) -> Vec<Ready> {
        lengths.into_iter().enumerate().map(|(i, n)| Ready { item: i, segment: 0, tokens: vec![1; n], voice: 0, speed: None }).collect()
    }

    #[test]
    fn between_llm_steps_a_bucket_is_taken_only_when_like_segments_fill_it() {
        let budget = TokenBudget { max_batch_tokens: 1 << 30 };
        // One long segment among short ones: a bucket led by it would be a third full.
        let mut ready = waiting(std::iter::once(100).chain([10; 6]));
        let bucket = take_bucket(&mut ready, &budget, 4, 0, false).expect("four like short segments fill a bucket");
        assert_eq!(bucket.iter().map(|r| r.tokens.len()).collect::<Vec<_>>(), vec![10; 4]);
        assert!(take_bucket(&mut ready, &budget, 4, 0, false).is_none(), "100, 10, 10: no complete, full bucket");
        assert_eq!(ready.len(), 3, "nothing taken");
        ready.extend(waiting([98, 95, 90]));
        let bucket = take_bucket(&mut ready, &budget, 4, 0, false).expect("the long one has peers now");
        let lengths: Vec<usize> = bucket.iter().map(|r| r.tokens.len()).collect();
        assert_eq!(lengths, vec![100, 98, 95, 90]);
        let mut stats = BucketStats::default();
        stats.add(lengths.iter().copied());
        assert_eq!((stats.tokens, stats.padded_tokens), (383, 400));
        // At the batch's end everything goes, longest first, in as few calls as the cap allows
        // when each is this small (every call costs at least CALL_FLOOR_TOKENS): of the two-call
        // splits, the first is taken short — 50 alone, then the rest together.
        ready.extend(waiting([50, 1, 1]));
        let mut runs = Vec::new();
        while let Some(b) = take_bucket(&mut ready, &budget, 4, 0, true) {
            runs.push(b.iter().map(|r| r.tokens.len()).collect::<Vec<_>>());
        }
        assert_eq!(runs, vec![vec![50], vec![10, 10, 1, 1]]);
        assert!(ready.is_empty());
    }

    #[test]
    fn with_a_least_bucket_a_full_run_that_long_goes_before_the_bucket_fills() {
        let budget = TokenBudget { max_batch_tokens: 1 << 30 };
        let mut ready = waiting([100, 99, 98]);
        assert!(take_bucket(&mut ready, &budget, 8, 0, false).is_none(), "three of eight: no complete run");
        assert!(take_bucket(&mut ready, &budget, 8, 4, false).is_none(), "three, shorter than the least");
        ready.extend(waiting([97, 20]));
        let bucket = take_bucket(&mut ready, &budget, 8, 4, false).expect("five like segments: longer than the least");
        // 100, 99, 98, 97 and 20 pad the 20 five-fold (fill 0.83): the run of four like ones goes.
        assert_eq!(bucket.iter().map(|r| r.tokens.len()).collect::<Vec<_>>(), vec![100, 99, 98, 97]);
        assert_eq!(ready.len(), 1);
        // A ragged run is not taken early either.
        let mut ready = waiting([100, 60, 50, 40]);
        assert!(take_bucket(&mut ready, &budget, 8, 4, false).is_none(), "fill 0.63");
    }

    #[test]
    fn at_the_batchs_end_long_leftovers_go_together_not_in_front_of_short_ones() {
        let budget = TokenBudget { max_batch_tokens: 1 << 30 };
        // 24-s segments among 1.6-s ones.
        let mut ready = waiting([600, 590, 580].into_iter().chain([40; 200]));
        let mut runs = Vec::new();
        while let Some(b) = take_bucket(&mut ready, &budget, 128, 0, true) {
            runs.push((b.len(), b[0].tokens.len()));
        }
        // Longest first would pad 125 short segments to 600 (76,800 tokens for 6,770). The three
        // long ones go without the bulk of the short ones: at most what rides free under a call's
        // floor (here 2, for even halves of the rest).
        assert_eq!(runs[0].1, 600);
        assert!((3..=3 + CALL_FLOOR_TOKENS / 600).contains(&runs[0].0), "{runs:?}");
        assert_eq!(runs.iter().map(|r| r.0).sum::<usize>(), 203);
        assert!(runs[1..].iter().all(|r| r.1 == 40));
        // A lone segment past what memory admits still goes (the worker splits what fails).
        let mut ready = waiting([50, 50]);
        let tight = TokenBudget { max_batch_tokens: 10 };
        assert_eq!(take_bucket(&mut ready, &tight, 128, 0, true).map(|b| b.len()), Some(1));
    }

    #[test]
    fn at_the_batchs_end_short_leftovers_share_a_call_since_a_small_call_costs_its_launches() {
        let budget = TokenBudget { max_batch_tokens: 1 << 30 };
        // By padding alone three calls (1,200 + 1,200 + 600 tokens + 3 × 1,000) beat one (7,200 +
        // 1,000); each small call costs at least CALL_FLOOR_TOKENS, so one call wins.
        let mut ready = waiting([60; 20].into_iter().chain([30; 40]).chain([10; 60]));
        let bucket = take_bucket(&mut ready, &budget, 128, 0, true).expect("a bucket");
        assert_eq!(bucket.len(), 120, "all of them in one call");
        assert!(ready.is_empty());
        // Large runs are still split by length: 100 × 400 padded tokens is far above the floor.
        let mut ready = waiting([400; 100].into_iter().chain([40; 100]));
        assert_eq!(take_bucket(&mut ready, &budget, 128, 0, true).map(|b| b.len()), Some(100));
    }

    #[test]
    fn a_memory_limited_bucket_is_complete_at_what_memory_admits() {
        // 40 padded tokens: two segments of 20.
        let budget = TokenBudget { max_batch_tokens: 40 };
        let mut ready = waiting([20]);
        assert!(take_bucket(&mut ready, &budget, 128, 0, false).is_none(), "one of two");
        ready.extend(waiting([20, 20]));
        assert_eq!(take_bucket(&mut ready, &budget, 128, 0, false).map(|b| b.len()), Some(2));
        // A segment past the budget alone still goes (the worker splits what fails).
        let mut ready = waiting([50]);
        assert_eq!(take_bucket(&mut ready, &budget, 128, 0, true).map(|b| b.len()), Some(1));
    }
}
