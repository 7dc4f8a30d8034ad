"""Per-episode overhead of the episode boxes (sandbox/boxes.py): a container (podman or docker) against bubblewrap,
side by side in one run. Prints JSON.

    python benchmarks/episode_boxes.py [--episodes 20] [--quick]

The task is the smallest Harbor task that does something (tasks/harbor.py): FROM debian:bookworm-slim (the stand-in
`keelrl tasks images` builds), WORKDIR /app; the oracle writes a file, the verifier reads it and writes reward.txt.
Per backend, `episodes` oracle episodes alternate with the other backend's, each timed from the box's start to the
verifier's end (`start_to_verifier_done_ms`, what Score.info["container_s"] records in training: starting the box,
uploading and running solution/solve.sh, emptying /tests and /logs/verifier, uploading tests/, running test.sh,
reading /logs/verifier), its verifier part (`verifier_ms`) and removing the box (`close_ms`). The image is built
before timing (`image_build_s`: once per machine, then cached by the build context's hash). `ratio` is the
container's median over bubblewrap's. The machine's load average is recorded: other work on it slows the clock.
--quick: 2 episodes (the default suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from keelrl.sandbox.boxes import find_runtime
from keelrl.tasks import get_task

FILES = {
    "instruction.md": "Write hello to /app/answer.txt.",
    "task.toml": '[verifier]\ntimeout_sec = 60.0\n[environment]\nallow_internet = false\nmemory = "512M"\n',
    "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
    "tests/test.sh": "#!/bin/bash\ngrep -qx hello /app/answer.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
    "solution/solve.sh": "#!/bin/bash\necho hello > /app/answer.txt\n",
}


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered) * 1000, 1),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="2 episodes per backend")
    args = ap.parse_args()
    n = 2 if args.quick else args.episodes
    root = Path(tempfile.mkdtemp(prefix="keelrl-bench-"))
    os.environ["XDG_CACHE_HOME"] = str(root / "cache")
    for rel, text in FILES.items():
        (root / "hello" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "hello" / rel).write_text(text)
    backends = ["bwrap"] if shutil.which("bwrap") else []
    rt = find_runtime()
    out: dict = {
        "quick": args.quick,
        "episodes": n,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "backends": {},
    }
    if rt is not None:
        from keelrl.sandbox.images import make_stand_ins

        make_stand_ins(rt, ["debian:bookworm-slim"])
        backends.append("container")
        out["runtime"] = rt.cli
    hello = f"dir:{root / 'hello'}"
    envs = {b: get_task(hello, sandbox={"backend": b}, validate_oracle=False) for b in backends}
    if "container" in envs:
        t0 = time.perf_counter()
        c = envs["container"]
        c.rt.image(c.fmt.spec(c.items["hello"], "container"))
        out["image_build_s"] = round(time.perf_counter() - t0, 2)
    times: dict[str, dict[str, list[float]]] = {b: {"start": [], "verifier": [], "close": []} for b in envs}
    for _ in range(n):
        for b, env in envs.items():  # alternating, so that load changes hit both alike
            t0 = time.perf_counter()
            score = env.oracle("hello")
            total = time.perf_counter() - t0
            if score.status != "ok" or score.reward != 1.0:
                sys.exit(f"{b}: the oracle did not score 1: {score}")
            times[b]["start"].append(score.info["container_s"])
            times[b]["verifier"].append(score.info["verifier_s"])
            times[b]["close"].append(total - score.info["container_s"])
    for b, t in times.items():
        out["backends"][b] = {
            "start_to_verifier_done_ms": stats(t["start"]),
            "verifier_ms": stats(t["verifier"]),
            "close_ms": stats(t["close"]),
        }
    if len(times) == 2:
        med = {b: statistics.median(t["start"]) for b, t in times.items()}
        out["ratio"] = round(med["container"] / med["bwrap"], 1)
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
