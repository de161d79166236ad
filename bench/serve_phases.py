#!/usr/bin/env python3
"""Where a `bench serve` run's wall time went, from its JSON (--json: per request its start, TTFT and
inter-token gaps): the engine's steps rebuilt from the token times (a step delivers one token to every running
request at about the same moment; gaps over 4 ms between token times separate steps), split into
  prefill phase  until the last request's first token (the prompts' prefill, decodes of the requests already in),
  full decode    every request running, until the first request finishes,
  tail           requests finishing, the batch shrinking.
With requests = concurrency (serve_table.sh FACTOR=1) every request starts at once, so the run lasts about
prefill phase + output_len - 1 decode steps: output tok/s ~= requests x output_len / (P + (output_len - 1) x step).

usage: bench/serve_phases.py c256.json[.gz] [more ...]
"""
import gzip
import json
import statistics
import sys


def phases(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        d = json.load(f)
    if "itls" not in d:
        sys.exit(f"{path}: no per-request token times (bench serve's --json of a run, not its summary)")
    firsts, ends, times = [], [], []
    for start, ttft, itls in zip(d["start_times"], d["ttfts"], d["itls"]):
        t = start + ttft
        firsts.append(t)
        times.append(t)
        for gap in itls:
            t += gap
            times.append(t)
        ends.append(t)
    times.sort()
    steps = [0.0, times[0]]  # the run's start: the first step ends with the first token
    for prev, t in zip(times, times[1:]):
        if t - prev > 0.004:
            steps.append(t)
    wall = d["duration"]
    prefill_end, first_done = max(firsts), min(ends)
    print(f"{path}: {len(firsts)} requests, {wall:.2f} s, {d['total_output_tokens'] / wall:,.0f} output tok/s")
    rows = (("prefill phase", 0.0, prefill_end), ("full decode", prefill_end, first_done), ("tail", first_done, 1e18))
    for name, lo, hi in rows:
        gaps = [b - a for a, b in zip(steps, steps[1:]) if lo - 1e-6 <= a < hi - 1e-6]
        span = sum(gaps)
        per = statistics.median(gaps) * 1e3 if gaps else 0.0
        print(f"  {name:14s} {len(gaps):5d} steps {span:7.2f} s ({100 * span / wall:4.1f}%)  median step {per:7.2f} ms")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        phases(p)
