"""The summary of the text-e2e target's end-to-end run (scripts/device/run.sh text-e2e):
throughput, NVML utilisation over the drain, the batch span and each batch, the token2wav buckets
and the LLM's phases from the worker log, the model's load. Reads OUT's report-campaign.json,
report-stage.json, nvml.csv, worker.log (and reference-fp32.json if there); writes
OUT/text-e2e-summary.json and prints it.
Run again on a run's saved files: `python3 scripts/device/lib/text_e2e_summary.py DIR T0 T1`
(T0, T1: the worker's start and end, Unix seconds; T1 − T0 is the summary's worker_wall_seconds)."""
import csv, json, sys, datetime
out, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
r = json.load(open(f"{out}/report-campaign.json")); t = r["total"]; w = r["workers"]
st = json.load(open(f"{out}/report-stage.json"))
audio_s = t["audio_hours"] * 3600; span = r["batch_span_seconds"]; infer_s = t["gpu_hours"] * 3600
util = []
for row in csv.reader(open(f"{out}/nvml.csv")):
    try:
        ts = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp(); util.append((ts, float(row[1])))
    except (ValueError, IndexError):
        pass
# NVML over the whole drain (model load and the first batch's frontend included), and over the
# working span (first to last sample with any kernel activity).
busy = [u for _, u in util]
active = [i for i, (_, u) in enumerate(util) if u > 0]
working = busy[active[0]: active[-1] + 1] if active else []
ref = json.load(open(f"{out}/reference-fp32.json")) if __import__("os").path.exists(f"{out}/reference-fp32.json") else {}
summary = {
    "jobs": t["jobs"], "chars": t["chars"], "audio_seconds": audio_s, "batch_span_seconds": span,
    "worker_wall_seconds": t1 - t0, "inference_seconds": infer_s,
    "e2e_audio_s_per_s_span": audio_s / span, "e2e_audio_s_per_s_wall": audio_s / (t1 - t0),
    "model_audio_s_per_gpu_s": audio_s / infer_s, "usd_per_million_chars": t["usd_per_million_chars"],
    "nvml_util_mean_drain": sum(busy) / len(busy) if busy else None, "nvml_samples": len(busy),
    "nvml_util_mean_working": sum(working) / len(working) if working else None,
    "nvml_working_seconds": (util[active[-1]][0] - util[active[0]][0]) if active else None,
    "nvml_util_mean_in_batches": t["gpu_util_mean"],
    "stages": {s["key"]: {"gpu_seconds": s["gpu_hours"] * 3600, "audio_s_per_gpu_s": s["audio_s_per_gpu_s"]} for s in st["rows"]},
    "reference_batch1": ref,
}
# token2wav buckets, from the worker log's per-batch lines (tts.rs): how full they were.
import re
# The worker log, read once: every summary below walks its lines.
WORKER_LOG = open(f"{out}/worker.log", errors="replace").read().splitlines()
buckets = {"text_batches": 0, "buckets": 0, "segments": 0, "tokens": 0, "padded_tokens": 0,
           "graph_steps": 0, "graphs_captured": 0, "graph_capture_ms": 0, "closing_buckets": 0, "closing_ms": 0}
for line in WORKER_LOG:
    if "token2wav buckets" not in line:
        continue
    fields = dict(re.findall(r"(\w+)=(\d+)", line))
    buckets["text_batches"] += 1
    # graph_*: small buckets' flow steps replayed as CUDA graphs ([model] flow_graphs).
    # closing_*: the buckets after the decode's end, and the time from that end to token2wav's (since
    # 2026-12-08; earlier logs have none).
    for k in ("buckets", "segments", "tokens", "padded_tokens", "graph_steps", "graphs_captured", "graph_capture_ms",
              "closing_buckets", "closing_ms"):
        buckets[k] += int(fields.get(k, 0))
if buckets["buckets"]:
    buckets["mean_bucket_size"] = buckets["segments"] / buckets["buckets"]
    buckets["fill"] = buckets["tokens"] / max(buckets["padded_tokens"], 1)
summary["token2wav_buckets"] = buckets
def is_load_end(line):
    """The model's load ends at "model loaded" (voxbatch::model); a text model's "warmed up" line
    (tts.rs) comes just before it and serves where the first is not logged (runs before 2026-12-05)."""
    return "model loaded" in line or "warmed up:" in line
def fields_summed(marker, names=None):
    """Every `<name>=<n>` of the worker log's lines holding `marker` (only `names`, when given),
    summed, from "model loaded" on (the load's warm-up sentence left out; the worker starts before
    its model has loaded, so "worker started" comes earlier)."""
    sums, started = dict.fromkeys(names or (), 0), False
    for line in WORKER_LOG:
        started = started or is_load_end(line)
        if started and marker in line:
            for k, v in re.findall(r"(\w+)=(\d+)", line):
                if names is None or k in sums:
                    sums[k] = sums.get(k, 0) + int(v)
    return sums
def ms_fields_summed(marker):
    """Every `<name>_ms=<n>` of those lines, summed, in seconds, under `<name>`."""
    return {k[:-3]: v / 1000 for k, v in fields_summed(marker).items() if k.endswith("_ms")}
# Each bucket's time by stage (tts.rs, debug), and the LLM's share of each text batch by phase
# (tts.rs "llm decode"): seconds summed over the drain.
summary["token2wav_bucket_seconds"] = ms_fields_summed("token2wav bucket ")
# The caching allocator's counts over the buckets (tts/buckets.rs, debug, since 2026-12-07): retries
# after freeing every cached block (each waits for the whole device), cudaMalloc and cudaFree calls.
summary["token2wav_bucket_allocator"] = fields_summed("token2wav bucket ", ("alloc_retries", "cuda_mallocs", "cuda_frees"))
# With [llm] pipelined_buckets (queued=true) a bucket's stages are not waited for: its times are
# the launches' only, and its GPU time is in the stage report's token2wav row instead.
summary["token2wav_bucket_seconds_launches_only"] = any("token2wav bucket " in l and "queued=true" in l for l in WORKER_LOG)
summary["llm_decode_seconds"] = ms_fields_summed("llm decode")
# From each text batch's last token2wav bucket to its end as the inference stage saw it (the
# model thread's work after the GPU's: what the GPU idles through at each batch's end).
import datetime as dt
def stamp(line):
    return dt.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
tails, last_buckets = [], None
for line in WORKER_LOG:
    if "token2wav buckets" in line:
        last_buckets = stamp(line)
    elif " inferred jobs=" in line and last_buckets is not None:
        tails.append(round(stamp(line) - last_buckets, 3)); last_buckets = None
summary["batch_end_seconds"] = tails
# NVML over the batch span: from the first batch's start to the last one's end, as the worker log
# times them (an "inferred" line at each batch's end with its infer_ms; log times are UTC, as the
# machine's nvidia-smi stamps are).
spans = []
for line in WORKER_LOG:
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z .*inferred jobs=\d+ infer_ms=(\d+)", line)
    if m:
        end = datetime.datetime.strptime(m.group(1)[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
        spans.append((end - int(m.group(2)) / 1000, end))
        summary.setdefault("batches", []).append({"jobs": int(re.search(r"inferred jobs=(\d+)", line).group(1)), "infer_seconds": int(m.group(2)) / 1000})
if spans:
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    inside = [u for ts, u in util if lo <= ts <= hi]
    summary["nvml_util_mean_batch_span"] = sum(inside) / len(inside) if inside else None
    # NVML inside each batch: where a drain's shortfall is (its first batch, above all).
    for b, (lo, hi) in zip(summary["batches"], spans):
        inside = [u for ts, u in util if lo <= ts <= hi]
        b["nvml_util_mean"] = round(sum(inside) / len(inside), 1) if inside else None
# The model's load (it overlaps the intake and the frontend; the GPU waits for it): its seconds
# and where they went (tts.rs "weights loaded": token2wav, LLM, KV cache and graphs; the rest
# of "model loaded" is the warm-up).
load_lines = {"weights loaded": "", "warmed up": "warm_up_", "model loaded": "total_"}
loaded_at = None
for line in WORKER_LOG:
    for marker, prefix in load_lines.items():
        if marker in line:
            for k, v in re.findall(r'(\w+)="?([\d.]+)"?', line[27:]):
                summary.setdefault("model_load", {})[prefix + k] = float(v)
    if is_load_end(line) and loaded_at is None:
        loaded_at = stamp(line)
# NVML from the model's load to the last batch's end: the drain's GPU time once the model can
# work (the intake and the frontend have worked through the load since the worker starts first).
if loaded_at is not None and spans:
    hi = max(e for _, e in spans)
    inside = [u for ts, u in util if loaded_at <= ts <= hi]
    summary["nvml_util_mean_after_load"] = sum(inside) / len(inside) if inside else None
    summary["after_load_seconds"] = hi - loaded_at
# The worker's start to its "worker stopped" line: the drain without what follows it (the
# process's exit; /metrics' linger, 20 s by default, which the runs up to 2026-12-06 16:50 UTC
# included in worker_wall_seconds; text-e2e.sh now sets it to 0 s).
stops = [stamp(line) for line in WORKER_LOG if "worker stopped" in line]
if stops:
    summary["worker_to_stop_seconds"] = stops[-1] - t0
    summary["e2e_audio_s_per_s_to_stop"] = audio_s / (stops[-1] - t0)
json.dump(summary, open(f"{out}/text-e2e-summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1)[:3000])
