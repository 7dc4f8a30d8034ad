"""Multi-turn episodes: how much running a batch's environment steps concurrently buys. A scripted policy (the
swe_mini oracle: read the file, fix it, run the tests, stop) plays `--episodes` swe_mini episodes through
`run_multiturn` with 1 worker thread and with `--workers`, side by side, alternating, `--repeats` times each.
The sampler is scripted (its turns cost nothing), so the times are the environment's: tools, `run_tests` in
the sandbox, and the hidden tests at the end. Every episode must score 1 (the oracle), or the run fails.
Prints JSON: median seconds per batch for each worker count, the speed-up, sandbox isolation level.

    python benchmarks/episodes.py --out docs/episodes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    from keelrl.config import EpisodeConfig
    from keelrl.models.load import build_char_tokenizer
    from keelrl.rollout import Generation, SamplingSettings
    from keelrl.rollout.chat import PlainFormat
    from keelrl.rollout.episodes import Episode
    from keelrl.rollout.multiturn import episode_errors, run_multiturn, turn_seed
    from keelrl.sandbox.execute import detect_isolation
    from keelrl.tasks import get_task
    from keelrl.tasks.swe_mini import oracle_turns

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 episodes, 2 workers, one repeat: seconds")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.workers, args.repeats = 2, 2, 1

    tok = build_char_tokenizer()
    env = get_task("swe_mini", seed=0, workers=args.workers)
    episodes = [Episode(i, env.problem("train", i), i, 1000 + i) for i in range(args.episodes)]
    script = {
        turn_seed(e.seed, k): [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
        for e in episodes
        for k, text in enumerate(oracle_turns(e.problem), 1)
    }

    class Scripted:
        policy_version = 0

        def generate(self, prompts, settings, seeds):  # type: ignore[no-untyped-def]
            return [Generation(script[s], [0.0] * len(script[s]), "eos") for s in seeds]

    settings = SamplingSettings(max_new_tokens=4096)
    fmt = PlainFormat(tok, env.tools)
    times: dict[int, list[float]] = {1: [], args.workers: []}
    for _ in range(args.repeats):
        for workers in times:
            t0 = time.perf_counter()
            rollouts = run_multiturn(
                Scripted(),
                tok,
                fmt,
                env,
                episodes,
                settings,
                EpisodeConfig(max_turns=8, max_context_tokens=1 << 20, workers=workers),
            )
            times[workers].append(time.perf_counter() - t0)
            assert not episode_errors(rollouts) and all(r.reward == 1.0 for r in rollouts), (
                "the oracle must solve every episode"
            )
    med = {w: statistics.median(t) for w, t in times.items()}
    out = {
        "benchmark": "episodes",
        "quick": args.quick,
        "episodes": args.episodes,
        "turns_per_episode": len(oracle_turns(episodes[0].problem)),
        "isolation": detect_isolation(),
        "seconds_per_batch": {str(w): round(t, 3) for w, t in med.items()},
        "all_runs": {str(w): [round(x, 3) for x in t] for w, t in times.items()},
        "speedup": round(med[1] / med[args.workers], 2),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
