"""Scores a JevBench-format task file (JSONL: id, state, question, labels, expected, ...) against a live server's
`/v1/systemone`, one question per request as JevBench's `typesafe` adapter sends it, and reports accuracy, Brier,
ECE, ordinal MAE and latency percentiles (the JevBench metric rules, docs/decisions.md).

    python bench/decisions.py --url http://127.0.0.1:8080 [--tasks bench/decisions/ninfer-suite.jsonl ...]
        [--model NAME] [--out results.json]

Rules: the distribution read is noul {no: 1 - p, yes: p}, choice `probabilities` by option key, score
`probabilities` by "0".."N-1"; accuracy is the argmax over exactly the labels (ties to the lexicographically
smallest label); a failed request (any non-200) counts as wrong and has no Brier/ECE contribution beyond a uniform
distribution; Brier is the multi-class sum of squares; ECE uses 10 bins of the top label's probability.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_TASKS = Path(__file__).parent / "decisions" / "ninfer-suite.jsonl"


def read_tasks(paths: list[Path]) -> list[dict[str, Any]]:
    tasks = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                tasks.append(json.loads(line))
    return tasks


def post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"{url}/v1/systemone", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def distribution(task: dict[str, Any], answer: dict[str, Any]) -> dict[str, float]:
    kind = task["question"]["type"]
    if kind == "noul":
        return {"no": 1.0 - answer["noul"], "yes": answer["noul"]}
    return {label: float(answer["probabilities"][label]) for label in task["labels"]}


def top_label(dist: dict[str, float]) -> str:
    best = max(dist.values())
    return min(label for label, p in dist.items() if p == best)


def expected_label(task: dict[str, Any]) -> str:
    return str(task["expected"])


def ece(points: list[tuple[float, bool]], bins: int = 10) -> float:
    total = len(points)
    err = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [(c, ok) for c, ok in points if lo <= c < hi or (b == bins - 1 and c == 1.0)]
        if inside:
            conf = sum(c for c, _ in inside) / len(inside)
            acc = sum(ok for _, ok in inside) / len(inside)
            err += len(inside) / total * abs(conf - acc)
    return err


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(url: str, tasks: list[dict[str, Any]], model: str | None, timeout: float) -> dict[str, Any]:
    correct, briers, calib, latencies, maes, failures = 0, [], [], [], [], 0
    for task in tasks:
        body = {"model": model or "jev-latest", "state": task["state"], "questions": {"q": task["question"]}}
        start = time.perf_counter()
        status, reply = post(url, body, timeout)
        latencies.append(time.perf_counter() - start)
        labels, want = task["labels"], expected_label(task)
        if status != 200:
            failures += 1
            dist = {label: 1.0 / len(labels) for label in labels}
            ok = False
        else:
            dist = distribution(task, reply["answers"]["q"])
            total = sum(dist.values())
            if abs(total - 1.0) > 2e-2:
                failures += 1
                dist, ok = {label: 1.0 / len(labels) for label in labels}, False
            else:
                dist = {k: v / total for k, v in dist.items()}
                ok = top_label(dist) == want
        correct += ok
        briers.append(sum((p - (label == want)) ** 2 for label, p in dist.items()))
        calib.append((max(dist.values()), ok))
        if task["question"]["type"] == "score" and status == 200:
            maes.append(abs(sum(int(k) * p for k, p in dist.items()) - int(task["expected"])))
    n = len(tasks)
    return {"tasks": n, "correct": correct, "accuracy": correct / n, "failures": failures,
            "brier": statistics.fmean(briers), "ece": ece(calib),
            "ordinal_mae": statistics.fmean(maes) if maes else None,
            "latency_p50_s": percentile(latencies, 0.50), "latency_p95_s": percentile(latencies, 0.95),
            "latency_mean_s": statistics.fmean(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--tasks", type=Path, nargs="+", default=[DEFAULT_TASKS], help="JevBench JSONL files")
    parser.add_argument("--model", default=None, help="the body's model (default jev-latest: any name serves)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here (JSON)")
    args = parser.parse_args()
    summary = run(args.url.rstrip("/"), read_tasks(args.tasks), args.model, args.timeout)
    summary["task_files"] = [str(p) for p in args.tasks]
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
