"""Where a process's threads spend their wall time, from Linux's scheduler statistics: every
`--every` seconds each thread's /proc/PID/task/TID/schedstat (nanoseconds on a CPU, nanoseconds
runnable but waiting for one, timeslices) and its name, one JSON line per thread and sample, until
the process exits. A thread whose wall time is mostly on a CPU computes or spins; mostly waiting
for a CPU, the machine's cores are oversubscribed; neither, it sleeps (a lock, a channel, the GPU).
Used on the device machine for the text worker's threads (issue 42, token2wav's host time):

    python3 tools/sample_threads.py --match 'voxbatch work --drain' --every 0.05 > threads.jsonl
    python3 tools/sample_threads.py --summarise threads.jsonl
"""
import argparse
import glob
import json
import os
import signal
import sys
import time


def find(match, timeout):
    exe, _, rest = match.partition(" ")
    end = time.time() + timeout
    while time.time() < end:
        for cmd in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                with open(cmd, "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if args and os.path.basename(args[0]) == exe.encode() and rest.encode() in b" ".join(args[1:]) and os.path.basename(os.path.dirname(cmd)) != str(os.getpid()):
                return int(os.path.basename(os.path.dirname(cmd)))
        time.sleep(0.05)
    return None


def sample(pid, every):
    while os.path.exists(f"/proc/{pid}"):
        now = time.time()
        for task in glob.glob(f"/proc/{pid}/task/*"):
            try:
                with open(f"{task}/schedstat") as f:
                    run, wait, slices = (int(x) for x in f.read().split())
                with open(f"{task}/comm") as f:
                    comm = f.read().strip()
            except (OSError, ValueError):
                continue
            print(json.dumps({"t": round(now, 3), "tid": int(os.path.basename(task)), "comm": comm, "run_ns": run, "wait_ns": wait, "slices": slices}))
        sys.stdout.flush()
        time.sleep(every)


def summarise(path):
    first, last = {}, {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            first.setdefault(r["tid"], r)
            last[r["tid"]] = r
    rows = []
    for tid, a in first.items():
        b = last[tid]
        wall = b["t"] - a["t"]
        if wall <= 0:
            continue
        rows.append((b["comm"], tid, wall, (b["run_ns"] - a["run_ns"]) / 1e9, (b["wait_ns"] - a["wait_ns"]) / 1e9))
    rows.sort(key=lambda r: -r[3])
    print(f"{'thread':<24} {'tid':>8} {'wall s':>8} {'on CPU s':>9} {'runnable, no CPU s':>19}")
    for comm, tid, wall, run, wait in rows[:40]:
        print(f"{comm:<24} {tid:>8} {wall:8.1f} {run:9.2f} {wait:19.2f}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    p = argparse.ArgumentParser()
    p.add_argument("--match", help="the process's executable name, then a substring of its arguments: 'voxbatch work --drain'")
    p.add_argument("--every", type=float, default=0.05)
    p.add_argument("--wait", type=float, default=120, help="seconds to wait for the process to start")
    p.add_argument("--summarise", help="a JSONL file this tool wrote: per thread, wall, on-CPU and runnable-without-CPU seconds")
    a = p.parse_args()
    if a.summarise:
        summarise(a.summarise)
        return
    pid = find(a.match, a.wait)
    if pid is None:
        sys.exit(f"no process matching {a.match!r}")
    sample(pid, a.every)


if __name__ == "__main__":
    main()
