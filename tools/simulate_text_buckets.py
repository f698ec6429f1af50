#!/usr/bin/env python3
"""Simulates how a corpus's text batches go through the LLM's slots and token2wav's buckets
(issue 14), to compare scheduling rules on the CPU before spending GPU time on them. A model, not
the product: it mirrors src/model/tts/buckets.rs (`MIN_FILL`, the batch-end split with
`BUCKET_OVERHEAD_TOKENS` per call and each call's padded tokens counted as at least
`CALL_FLOOR_TOKENS`) and llm/speech_lm.rs's admission (FIFO as before 2026-12-04,
or longest first as now), with each segment decoding its forced length (`[llm] force_lengths`:
characters ÷ the speaking rate × 25).

Input: `voxbatch text CORPUS --format json` (segments per job). Text batches are the jobs in
order cut into `--batches` equal runs, or with `--work-budget N` cut as the worker's policy cuts
them (src/batch `WorkBudget`: the oldest job anchors a batch, the jobs farthest from its length
are dropped until the jobs' tokens add up to at most N, unless what would stay behind is at
most N/4; N = 8 fills × slots × 250). Time model, calibrated on that run (docs/PERFORMANCE.md "Like-length
token2wav buckets"): an LLM step costs 2.0 + 2.5 × active/512 ms (the CUDA-graph step times at
64–512 slots), token2wav 93 µs per padded speech token plus the call overhead (eager port).
With the rule of that run (FIFO admission, batch end taken longest first in full buckets) it gives
fill 0.778 and 77 buckets where the run measured 0.800 and 74.

Usage: simulate_text_buckets.py DRY_RUN.json [--batches 8 | --work-budget N] [--slots 512] [--cap 128]
       [--min-fill 0.9] [--admission fifo|longest] [--flush split|full]
"""
import argparse
import json
import math

ZH_CHARS_PER_SECOND, EN_CHARS_PER_SECOND, TOKENS_PER_SECOND = 4.0, 14.0, 25.0
OVERHEAD_TOKENS = 1000
CALL_FLOOR_TOKENS = 3500
T2W_SECONDS_PER_TOKEN = 93e-6


def speech_tokens(text, lang):
    rate = ZH_CHARS_PER_SECOND if lang == "zh" else EN_CHARS_PER_SECOND
    return max(1, math.ceil(sum(not c.isspace() for c in text) / rate * TOKENS_PER_SECOND))


def take(ready, cap, min_fill, flush):
    """buckets.rs `take_bucket` with a count cap for admission (the run's token cap never bound)."""
    ready.sort(reverse=True)
    n = len(ready)
    if n == 0:
        return None
    if flush == "full":
        bucket = ready[:cap]
    elif flush == "split":
        cost, first = [0] * (n + 1), [1] * (n + 1)
        for start in range(n - 1, -1, -1):
            best = None
            for size in range(1, min(cap, n - start) + 1):
                c = max(size * ready[start], CALL_FLOOR_TOKENS) + OVERHEAD_TOKENS + cost[start + size]
                if best is None or c < best:
                    best, first[start] = c, size
            cost[start] = best
        bucket = ready[:first[0]]
    else:
        prefix = [0]
        for x in ready:
            prefix.append(prefix[-1] + x)
        for start in range(n):
            if n - start < cap:
                return None
            if (prefix[start + cap] - prefix[start]) / (cap * ready[start]) >= min_fill:
                bucket = ready[start:start + cap]
                del ready[start:start + cap]
                return bucket
        return None
    del ready[:len(bucket)]
    return bucket


def work_batches(jobs, budget):
    """The worker's text batches under a work budget (see the module doc)."""
    pool, batches = list(range(len(jobs))), []
    while pool:
        anchor = sum(jobs[pool[0]])
        window = sorted(pool, key=lambda i: abs(sum(jobs[i]) - anchor))
        total = pool_total = sum(sum(jobs[i]) for i in window)
        while len(window) > 1 and total > budget:
            total -= sum(jobs[window.pop()])
        if pool_total - total <= budget // 4:  # a small remainder rides along (WorkBudget::remainder_allowance)
            window = list(pool)
        chosen = set(window)
        batches.append([jobs[i] for i in sorted(chosen)])
        pool = [i for i in pool if i not in chosen]
    return batches


def simulate(batches, a):
    tokens = padded = buckets = steps = 0
    llm_seconds = 0.0

    def record(bucket):
        nonlocal tokens, padded, buckets
        tokens += sum(bucket)
        padded += len(bucket) * max(bucket)
        buckets += 1

    for batch in batches:
        queue = [n for segments in batch for n in segments]
        if a.admission == "longest":
            queue.sort(reverse=True)
        queue.reverse()  # pop() from the end
        active, ready = [], []  # active: [length, steps left]
        while queue or active:
            while queue and len(active) < a.slots:
                n = queue.pop()
                active.append([n, n])
            steps += 1
            llm_seconds += (2.0 + 2.5 * len(active) / 512) / 1000
            for seq in active:
                seq[1] -= 1
            ready.extend(n for n, left in active if left == 0)
            active = [seq for seq in active if seq[1] > 0]
            while (bucket := take(ready, a.cap, a.min_fill, None)) is not None:
                record(bucket)
        while (bucket := take(ready, a.cap, a.min_fill, a.flush)) is not None:
            record(bucket)
    t2w_seconds = (padded + OVERHEAD_TOKENS * buckets) * T2W_SECONDS_PER_TOKEN
    return tokens, padded, buckets, steps, llm_seconds, t2w_seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dry_run")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--work-budget", type=int, help="cut batches as the worker's policy does, at this many tokens")
    ap.add_argument("--slots", type=int, default=512)
    ap.add_argument("--cap", type=int, default=128)
    ap.add_argument("--min-fill", type=float, default=0.9)
    ap.add_argument("--admission", choices=["fifo", "longest"], default="longest")
    ap.add_argument("--flush", choices=["split", "full"], default="split")
    a = ap.parse_args()
    with open(a.dry_run) as f:
        report = json.load(f)
    jobs = [[speech_tokens(s["text"], j["lang"]) for s in j["segments"]] for j in report["jobs"] if j.get("segments")]
    if a.work_budget:
        batches = work_batches(jobs, a.work_budget)
    else:
        per = math.ceil(len(jobs) / a.batches)
        batches = [jobs[i:i + per] for i in range(0, len(jobs), per)]
    tokens, padded, buckets, steps, llm, t2w = simulate(batches, a)
    audio = tokens / TOKENS_PER_SECOND
    print(json.dumps({"jobs": len(jobs), "segments": sum(map(len, jobs)), "speech_tokens": tokens, "text_batches": len(batches),
                      "admission": a.admission, "flush": a.flush, "min_fill": a.min_fill, "buckets": buckets,
                      "fill": round(tokens / padded, 3), "llm_steps": steps, "llm_seconds": round(llm, 1),
                      "token2wav_seconds": round(t2w, 1), "model_audio_s_per_s": round(audio / (llm + t2w), 1)}))


if __name__ == "__main__":
    main()
