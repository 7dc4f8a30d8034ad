"""The JSON of benchmarks/gpu_check.sh (issue 30): `drill REF KILL STEP` compares the uninterrupted run with
the one whose worker was SIGKILLed after STEP; `summary OUT DEVICE DRY` gathers every part into one object."""

from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path
from typing import Any

import torch

TIMING = ("time/", "throughput/", "time")  # wall-clock metrics: never expected to match


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    if (run / "metrics.jsonl").is_file():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            rows.setdefault(int(r["step"]), {}).update(
                {k: v for k, v in r.items() if isinstance(v, int | float) and not k.startswith(TIMING)}
            )
    return rows


def drill(ref: Path, kill: Path, killed_after: int) -> dict[str, Any]:
    a, b = _metrics(ref), _metrics(kill)
    diffs: dict[str, float] = {}
    for step in sorted(set(a) & set(b)):
        for key in set(a[step]) & set(b[step]):
            x, y = a[step][key], b[step][key]
            if math.isfinite(x) and math.isfinite(y):
                diffs[key] = max(diffs.get(key, 0.0), abs(x - y))
    sa, sb = _json(ref / "summary.json"), _json(kill / "summary.json")
    events = (
        [json.loads(x) for x in (kill / "events.jsonl").read_text().splitlines()]
        if (kill / "events.jsonl").is_file()
        else []
    )
    return {
        "killed_after_step": killed_after,
        "reference_finished": sa.get("state") == "finished",
        "killed_run_finished": sb.get("state") == "finished",
        "restarts": sum(1 for e in events if e.get("kind") == "restart"),
        "resumes": sum(1 for e in events if e.get("kind") == "resume"),
        "weights_identical": bool(sa) and sa.get("weights_sha256") == sb.get("weights_sha256"),
        "steps_compared": len(set(a) & set(b)),
        "metrics_identical": sorted(k for k, d in diffs.items() if d == 0.0),
        "metrics_differing_max_abs": {k: d for k, d in sorted(diffs.items()) if d > 0.0},
    }


def summary(out: Path, device: str, dry: bool) -> dict[str, Any]:
    learning = {}
    for path in sorted(out.glob("compare_b*.json")):
        c = _json(path)
        acc = c.get("metrics", {}).get("accuracy", {})
        run = _json(out / f"rl_{path.stem.split('_')[1]}" / "summary.json")
        learning[path.stem.split("_")[1]] = {
            "accuracy_change": acc.get("diff"), "ci95": acc.get("ci"), "verdict": acc.get("verdict"),
            "base": acc.get("a"), "final": acc.get("b"), "run_state": run.get("state"),
            "wall_seconds": run.get("wall_seconds"),
        }  # fmt: skip
    tests = (
        (out / "gpu_tests.log").read_text().strip().splitlines()[-1:]
        if (out / "gpu_tests.log").is_file()
        else []
    )
    return {
        "device": device,
        "dry_run": dry,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "learning": learning,
        "fault_drill": _json(out / "fault_drill.json"),
        "throughput": _json(out / "throughput.json").get("results"),
        "decode": _json(out / "decode.json").get("decode"),
        "update_profile": _json(out / "decode.json").get("update"),
        "gpu_tests": tests[0] if tests else None,
    }


if __name__ == "__main__":
    if sys.argv[1] == "drill":
        print(json.dumps(drill(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])), indent=2))
    else:
        print(json.dumps(summary(Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"), indent=2))
