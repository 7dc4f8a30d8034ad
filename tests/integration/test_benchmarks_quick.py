"""Every benchmark in benchmarks/ runs in the default suite, in its quick mode (seconds, tiny shapes; numbers that
mean nothing), and prints the JSON it promises: its keys, with values that are sane for what was run (not just
exit 0). A refactor that breaks a benchmark fails here, and a new benchmark without a quick case (here, or in
ELSEWHERE: another test that runs it) fails `test_every_benchmark_has_a_quick_case`.

Most run in this process (`runpy`, as `python benchmarks/NAME.py --quick` would: its directory on sys.path),
which saves each one the interpreter's and torch's start-up; torch's threads and RNG, os.environ and sys.path are
restored after each. Those that fork worker pools, or import TRL, run as subprocesses.
GPU-only scripts: gpu_throughput.py has a CPU quick path (the same code on tiny batches); gpu_check.sh and
cuda_smoke.sh are syntax- and argument-checked here (nothing in them runs without CUDA but gpu_check.sh's
--dry-run, which takes minutes: a `slow` test runs it), and gpu_check_report.py is run on small run directories.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# modules the benchmarks import, not benchmarks themselves: exercised through them
HELPERS = {
    "curriculum_families.py": "curriculum.py's families",
    "demo_setup.py": "the demo-config benchmarks' set-up and QUICK sizes",
    "eval_repeats.py": "reads two eval reports (test_eval_repeats below)",
    "gpu_check_report.py": "gpu_check.sh's JSON (test_gpu_check_report below)",
    "mutate_loss.py": "the mutation audit: minutes (it runs the test suite per mutant); `make mutants` runs it",
}
# benchmarks whose quick mode another default-suite test runs and checks (not run twice)
ELSEWHERE = {"episode_boxes.py": "tests/integration/test_harbor_tasks.py"}


def last_json(text: str) -> dict[str, Any]:
    """The JSON object a benchmark ends its stdout with (console lines and one-line progress JSON may precede)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("{"):
            try:
                found = json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
            assert isinstance(found, dict)
            return found
    raise AssertionError(f"no JSON object at the end of the output:\n{text[-2000:]}")


def positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def numbers(tree: Any) -> list[float]:
    """Every number in a JSON tree."""
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in numbers(v)]
    return [float(tree)] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def share(x: Any) -> bool:
    return isinstance(x, (int, float)) and 0.0 <= x <= 1.0


# ------------------------------------------------------------------------------------------ the checks


def check_async(r: dict[str, Any]) -> None:
    assert r["quick"] and set(r["median"]) == {"k0", "k0_2threads", "k0_recompute", "k1"}
    for arm in r["median"].values():
        assert positive(arm["steps_per_s"]) and positive(arm["train_s"]) and arm["gen_s"] >= 0
    assert positive(r["speedup_k1_vs_k0"]) and positive(r["speedup_k1_vs_k0_2threads"])
    assert all(len(runs) == 1 for runs in r["runs"].values())


def check_bf16_attention(r: dict[str, Any]) -> None:
    assert r["quick"] and len(r["matmul"]) == 1
    assert all(positive(r["matmul"][0][f"{d}_gflop_per_s"]) for d in ("float32", "bfloat16"))
    assert len(r["forward_backward"]) == 4 and all(map(positive, r["forward_backward"].values()))


def check_checkpoint_cost(r: dict[str, Any]) -> None:
    assert r["quick"] and r["same_final_weights"] is True  # checkpointing never changes training
    assert [run["arm"] for run in r["runs"]] == ["none", "sync", "async"]
    assert [run["saves"] for run in r["runs"]] == [0, 2, 2]  # 4 steps, every 2
    for arm in ("sync", "async"):
        a = r["arms"][arm]
        assert a["saves"] == 2 and positive(a["save_s_mean"]) and a["stall_s_max"] >= a["stall_s_mean"] >= 0
    assert positive(r["checkpoint_mb"]) and positive(r["step_s_without_saves"])
    assert isinstance(r["target_met"], bool)


def check_checker_agreement(r: dict[str, Any]) -> None:
    tiny, rg = r["countdown_vs_tinyzero"], r["reasoning_gym"]
    assert r["quick"] and tiny["completions"] > 40 and rg["completions"] == 3 * 2 * 6 and rg["datasets"] == 3
    assert tiny["unexpected"] == [] and rg["unexpected"] == []  # every disagreement a documented departure
    assert set(tiny["departures"]) <= {"last_line_only", "stated_value", "exact_grammar"}
    assert set(rg["departures"]) <= {"non_ascii_digit", "no_answer_is_0"} and 0.5 < rg["agreement"] <= 1.0
    assert all(ms >= 0 for ms in r["last_answer_ms"].values())


def check_code_size(r: dict[str, Any]) -> None:
    assert r["root"] == "src/keelrl" and r["files"] > 50 and r["physical_lines"] > r["code_lines"] > 10_000
    assert all(lines > 600 for lines in r["over_limit"].values())


def check_import_map(r: dict[str, Any]) -> None:
    assert r["modules"] > 100 and r["imports"] > r["modules"]
    assert r["upward_imports"] == 0 and r["two_way_pairs"] == 0 and r["unlayered_modules"] == []


def check_countdown_set_positions(r: dict[str, Any]) -> None:
    (model,) = r.values()
    assert len(model["x4_item_accuracy_by_position"]) == 4
    assert all(map(share, model["x4_item_accuracy_by_position"])) and share(model["x4_set_accuracy"])
    assert set(model["ops_written"]) == set("+-*/")


def check_cpu_overheads(r: dict[str, Any]) -> None:
    assert r["quick"]
    parts = ("head", "cache_rows", "adamw", "decode_attention", "matmul_rows")
    for part in parts:
        assert r[part] and all(map(positive, numbers(r[part]))), part
    assert len(r["matmul_rows"]) == 15  # 3 weights x 5 row counts


def check_curriculum(r: dict[str, Any]) -> None:
    assert r["quick"] and r["setup"]["steps"] == 2 and r["setup"]["buckets"] == ["n2", "n3", "n4"]
    for key in ("steps_to_target", "steps_to_hardest_bucket_target", "hardest_bucket_accuracy"):
        assert set(r[key]) == {"curriculum", "uniform", "fixed_hard"}
    hard = r["runs"]["fixed_hard"][0]["prompts_per_bucket"]
    assert hard == {"n2": 0.0, "n3": 0.0, "n4": 8.0}  # 2 steps x 4 prompts, all from the hardest bucket
    assert all(map(share, r["base_model"]["accuracy"].values())) and r["verdict"]


def check_env_learning(r: dict[str, Any]) -> None:
    assert r["quick"] and r["rl_steps"] == 2 and r["state"] == "finished"
    for side in ("before", "after"):
        assert share(r[side]["accuracy"]) and r[side]["turns_mean"] >= 1.0
    assert r["verdict"] in ("better", "worse", "indistinguishable")


def check_episodes(r: dict[str, Any]) -> None:
    assert r["quick"] and r["episodes"] == 2 and r["turns_per_episode"] >= 2
    assert set(r["seconds_per_batch"]) == {"1", "2"} and all(map(positive, r["seconds_per_batch"].values()))
    assert positive(r["speedup"])


def check_fp32_head(r: dict[str, Any]) -> None:
    assert r["quick"] and r["tokens"] == 8
    for k in ("bf16", "bf16_fp32_head"):
        assert 0 <= r[k]["mean_abs"] <= r[k]["max_abs"] < 0.1  # bf16 log-probs near fp32's


def check_gpu_throughput(r: dict[str, Any]) -> None:
    assert r["quick"] and r["device"] == "cpu" and [x["batch_size"] for x in r["results"]] == [8, 16]
    for row in r["results"]:
        assert row["steps_measured"] == 2  # 3 steps, the first left out
        for k in ("steps_per_s", "generation_tokens_per_s", "update_tokens_per_s", "peak_memory_gb"):
            assert positive(row[k]), k


def check_gpu_decode(r: dict[str, Any]) -> None:  # engineer H's (issue 48): its CPU quick path
    assert r["device"] == "cpu" and positive(r["decode"]["speedup"]) and r["decode"]["batch"] > 0
    assert positive(r["update"]["update_tokens_per_s"]) and positive(r["update"]["step_s"])


def check_guard_overhead(r: dict[str, Any]) -> None:
    assert r["quick"] and set(r["replay"]) == {"3", "1000", "10000"}  # the 3 steps' history, stretched
    for v in r["replay"].values():
        assert positive(v["total_s"]) and v["overhead"] == pytest.approx(v["total_s"] / r["step_s_median"])
    assert len(r["ab"]["step_s_median_on"]) == len(r["ab"]["step_s_median_off"]) == 1


def check_ladder(r: dict[str, Any]) -> None:
    assert r["quick"]
    pre, rl = r["pretrain"], r["rl"]
    assert (
        len(pre["runs"]) == 7 and len(pre["chinchilla"]["points"]) == 6
    )  # 2 widths x 3 lengths + the target
    assert positive(pre["validation"]["loss"]) and isinstance(pre["validation"]["inside_interval"], bool)
    assert len(rl["runs"]) == 3 and [f["steps"] for f in rl["fits"]] == [[0, 1, 2, 3]] * 2
    assert rl["validation"]["steps"] == [0, 1, 2, 3] and rl["prediction"]["made_at"]


def check_ladder_coverage(r: dict[str, Any]) -> None:  # issue 48's: a few small simulated ladders
    for kind in ("rl", "pretrain"):
        c = r[kind]
        assert c["validations"] == len(c["ladders"]) > 0 and share(c["coverage"])
        assert c["inside"] == sum(ladder["inside"] for ladder in c["ladders"])
    assert positive(r["seconds"])


def check_lora_learning(r: dict[str, Any]) -> None:
    (run,) = r["runs"]
    assert r["quick"] and run["state"] == "finished" and run["rank"] == 16 and share(run["final"])
    assert 0 < run["lora"]["adapter_parameters"] < run["lora"]["parameters"] and positive(
        run["checkpoint_bytes"]
    )
    assert [step for step, _ in run["evals"]] == [0, 1, 2]


def check_lora_sizes(r: dict[str, Any]) -> None:
    full, lora = r["h32_l1_r0"], r["h32_l1_r8"]
    assert full["lora"] is None and lora["lora"]["adapter_parameters"] > 0
    assert 0 < lora["bytes"] < full["bytes"]  # a LoRA checkpoint holds the adapters only


def check_objectives_learning(r: dict[str, Any]) -> None:
    (run,) = r["runs"]
    assert r["quick"] and run["objective"] == "ppo_clip" and run["state"] == "finished"
    assert [step for step, _ in run["evals"]] == [0, 1, 2] and share(run["final"]) and run["weights_sha256"]
    assert set(r["base_accuracy"]) == {"0"}


def check_ray_scoring(r: dict[str, Any]) -> None:
    assert r["quick"]
    for part in ("heavy", "sampling"):
        assert positive(r[part]["in_process"]["completions_per_s"])
        assert positive(r[part]["ray_1_worker"]["completions_per_s"]), part
    assert positive(r["cheap"]["ray_1_worker"]["batch_ms_median"]) and positive(
        r["sampling"]["ray_1_worker"]["startup_s"]
    )


def check_reward_model_demo(r: dict[str, Any]) -> None:
    assert r["quick"] and share(r["base"]["accuracy"])
    for rm in r["reward_models"].values():
        assert rm["pairs"] > 0 and rm["held_out_pairs"] >= 20 and share(rm["held_out_accuracy"])
    assert len(r["rl"]) == 5
    for entry in r["rl"].values():
        assert entry["ended"] == "finished" or entry["ended"].startswith("stopped")
        assert entry["by_step"] and all(share(s["trained_win_rate"]) for s in entry["by_step"])


def check_sandbox(r: dict[str, Any]) -> None:
    assert r["quick"] and r["levels"]
    for level in r["levels"].values():
        assert positive(level["trivial"]["executions_per_s"]) and positive(
            level["typical"]["executions_per_s"]
        )
        assert level["latency_ms"]["p90"] >= level["latency_ms"]["median"] > 0


def check_search_recipe(r: dict[str, Any]) -> None:
    (run,) = r["runs"]
    assert (
        r["quick"] and run["numbers"] == 3 and share(run["accuracy_before"]) and share(run["accuracy_after"])
    )
    assert run["difference"] == pytest.approx(run["accuracy_after"] - run["accuracy_before"])
    assert positive(run["seconds"]["total"])


def check_sft_from_scratch(r: dict[str, Any]) -> None:
    assert r["quick"] and r["steps"] == 22 and [e["step"] for e in r["evals"]] == [0, 11, 22]
    assert r["evals"][-1]["eval_loss"] < r["evals"][0]["eval_loss"]  # supervised training learns, even here
    assert math.isfinite(r["loss_spike_healthy_max_z"]) and positive(r["loss_spike_healthy_max_ratio"])


def check_update_paths(r: dict[str, Any]) -> None:
    s = r["shapes"]["micro"]
    assert s["rows"] == 4 and s["completion_tokens"] > 0
    assert all(map(positive, s["fwd_bwd_cpu_s"].values())) and all(map(positive, s["sampler_cpu_s"].values()))
    # fp32 paths agree with the padded forward, and the sampler's log-probs with the trainer's
    assert s["logprob_gap_vs_fp32_padded"]["shared_prefix"]["max_abs"] < 1e-4
    assert s["sampler_vs_trainer_fp32"]["max_abs"] < 1e-4


def check_vllm_engine(r: dict[str, Any]) -> None:
    assert r["quick"] and set(r) >= {"vllm", "tiny_demo"}
    for engine in ("hf", "vllm"):
        run = r["tiny_demo"][engine]
        assert run["steps"] == 2 and positive(run["step_s_median"]) and run["tokens_per_step"] > 0
    assert r["tiny_demo"]["vllm"]["sync_gap_max"] < 1e-3  # the engine's log-probs are the trainer's
    assert positive(r["tiny_demo"]["speedup_steps_per_s"])


def check_vs_trl(r: dict[str, Any]) -> None:
    assert r["quick"] and set(r["shapes"]) == {"micro"}
    micro = r["shapes"]["micro"]
    for side in ("keelrl", "trl"):
        s = micro[side]
        assert s["prompt_ids_identical"] is True  # both sides saw the same token ids
        assert s["timed_steps"] == 1 and len(s["reward_curve"]) == 2 and all(map(share, s["reward_curve"]))
        assert positive(s["steps_per_s"]) and positive(s["peak_rss_mb"]) and positive(s["mfu_step"])
    assert positive(r["ratio_steps_per_s"]["micro"])


def profile_text(text: str) -> None:
    """profile_step.py prints tables (a profiler, not a measurement): its per-phase line and the top list."""
    line = next(x for x in text.splitlines() if x.startswith("CPU s per step: total"))
    total = float(line.split("total ")[1].split(";")[0])
    phases = {k: float(v) for k, v in (p.rsplit(" ", 1) for p in line.split("; ")[1].split(", "))}
    assert set(phases) == {"next_batch", "rl_update", "other"} and total > 0
    assert phases["next_batch"] > 0 and phases["rl_update"] > 0
    assert "ncalls" in text


def torch_profile_text(text: str) -> None:
    assert "Self CPU" in text and "aten::" in text


@dataclass(frozen=True)
class Case:
    script: str
    argv: tuple[str, ...]
    check: Callable[[Any], None]
    subprocess: bool = False  # forks worker pools, or imports TRL: its own interpreter
    text: bool = False  # check the text output, not a JSON object


CASES = {
    "async": Case("async.py", ("--quick",), check_async, subprocess=True),
    "bf16_attention": Case("bf16_attention.py", ("--quick",), check_bf16_attention),
    "checkpoint_cost": Case("checkpoint_cost.py", ("--quick",), check_checkpoint_cost),
    "checker_agreement": Case("checker_agreement.py", ("--quick",), check_checker_agreement),
    "code_size": Case("code_size.py", (), check_code_size),  # itself a second
    "import_map": Case("import_map.py", (), check_import_map),  # a second or two: it reads the sources
    "countdown_set_positions": Case(
        "countdown_set_positions.py", ("--quick",), check_countdown_set_positions
    ),
    "cpu_overheads": Case("cpu_overheads.py", ("--quick",), check_cpu_overheads),
    "curriculum": Case("curriculum.py", ("--quick", "--jobs", "1", "--work", "{tmp}"), check_curriculum),
    "env_learning": Case("env_learning.py", ("--quick", "--out", "{tmp}"), check_env_learning),
    "episodes": Case("episodes.py", ("--quick",), check_episodes),
    "fp32_head": Case("fp32_head.py", ("--quick",), check_fp32_head),
    "gpu_decode": Case("gpu_decode.py", ("--quick",), check_gpu_decode),
    "gpu_throughput": Case("gpu_throughput.py", ("--quick",), check_gpu_throughput),
    "guard_overhead": Case("guard_overhead.py", ("--quick",), check_guard_overhead),
    "ladder": Case("ladder.py", ("--quick", "--out", "{tmp}"), check_ladder),
    "ladder_coverage": Case("ladder_coverage.py", ("--quick",), check_ladder_coverage),
    "lora_learning": Case("lora_learning.py", ("--quick", "--out", "{tmp}"), check_lora_learning),
    "lora_sizes": Case("lora_sizes.py", ("--quick", "--out", "{tmp}"), check_lora_sizes),
    "objectives_learning": Case(
        "objectives_learning.py", ("--quick", "--out", "{tmp}"), check_objectives_learning
    ),
    "profile_step": Case("profile_step.py", ("--quick",), profile_text, text=True),
    "profile_step_torch": Case(
        "profile_step.py", ("--quick", "--torch-profiler"), torch_profile_text, text=True
    ),
    "ray_scoring": Case("ray_scoring.py", ("--quick",), check_ray_scoring),
    "reward_model_demo": Case("reward_model_demo.py", ("--quick", "--out", "{tmp}"), check_reward_model_demo),
    "sandbox": Case("sandbox.py", ("--quick",), check_sandbox),
    "search_recipe": Case(
        "search_recipe.py", ("--quick", "--out", "{tmp}"), check_search_recipe, subprocess=True
    ),
    "sft_from_scratch": Case("sft_from_scratch.py", ("--quick", "--out", "{tmp}"), check_sft_from_scratch),
    "update_paths": Case("update_paths.py", ("--quick", "--cache-dir", "{tmp}"), check_update_paths),
    "vllm_engine": Case("vllm_engine.py", ("--quick",), check_vllm_engine),
    "vs_trl": Case("vs_trl.py", ("--quick", "--cache-dir", "{tmp}"), check_vs_trl, subprocess=True),
}
NEEDS = {
    "ray_scoring": "ray",
    "vllm_engine": "vllm",
    "vs_trl": "trl",
    "checker_agreement": "reasoning_gym",
}  # optional packages (make install-dev has them)
SHELL = ("gpu_check.sh", "cuda_smoke.sh")


def test_every_benchmark_has_a_quick_case() -> None:
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    covered = {c.script for c in CASES.values()} | set(HELPERS) | set(SHELL) | set(ELSEWHERE)
    assert scripts == covered, f"benchmarks without a quick case here: {sorted(scripts - covered)}"
    for script, test in ELSEWHERE.items():
        assert f"{script}" in (ROOT / test).read_text() and "--quick" in (ROOT / test).read_text(), test
    for case in CASES.values():
        if "--quick" not in case.argv and case.script not in ("code_size.py", "import_map.py"):
            raise AssertionError(f"{case.script} runs without --quick")


def run_in_process(script: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    saved_env, saved_path, threads = dict(os.environ), list(sys.path), torch.get_num_threads()
    saved_argv = sys.argv
    sys.path.insert(0, str(BENCH))
    sys.argv = [str(script), *argv]
    try:
        with torch.random.fork_rng(devices=[]):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exit_:
                assert exit_.code in (0, None), f"{script.name} exited {exit_.code}"
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CASES))
def test_quick_mode(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    if name in NEEDS:
        pytest.importorskip(
            NEEDS[name], reason=f"{NEEDS[name]} is not installed (make install-dev installs it)"
        )
    argv = [a.replace("{tmp}", str(tmp_path / "work")) for a in case.argv]
    script = BENCH / case.script
    if case.subprocess:
        done = subprocess.run(
            [sys.executable, str(script), *argv], cwd=ROOT, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = done.stdout
    else:
        monkeypatch.chdir(ROOT)  # benchmarks name configs/ relative to the repository
        out = run_in_process(script, argv, capsys)
    case.check(out if case.text else last_json(out))


def run_script(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("script", SHELL)
def test_gpu_scripts_parse_and_refuse_without_cuda(script: str, tmp_path: Path) -> None:
    """Nothing in these runs without CUDA (gpu_check.sh's dry run aside, below): their syntax, their arguments,
    and that without a GPU they stop at once with a sentence."""
    path = str(BENCH / script)
    assert run_script(["bash", "-n", path]).returncode == 0
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    if script == "gpu_check.sh":
        bad = run_script(["bash", path, str(tmp_path), "--bogus"], env)
        assert bad.returncode == 2 and "unknown argument --bogus" in bad.stderr
        assert run_script(["bash", path], env).returncode != 0  # OUT is required
    if not torch.cuda.is_available():
        args = [str(tmp_path)] if script == "gpu_check.sh" else []
        done = run_script(["bash", path, *args], {**env, "RUNS": str(tmp_path), "LOGS": str(tmp_path)})
        assert done.returncode == 1 and "no CUDA device" in done.stderr


def test_gpu_check_report(tmp_path: Path) -> None:
    """gpu_check_report.py's drill and summary on small run directories (what gpu_check.sh hands it)."""
    rows = [{"step": s, "time": 100.0 + s, "loss/total": 0.5 / s, "reward/mean": 0.1 * s} for s in (1, 2, 3)]
    for name, shift in (("ref", 0.0), ("kill", 0.25)):
        run = tmp_path / name
        run.mkdir()
        lines = [{**r, "reward/mean": r["reward/mean"] + (shift if r["step"] == 3 else 0.0)} for r in rows]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        (run / "summary.json").write_text(json.dumps({"state": "finished", "weights_sha256": "ab"}))
    (tmp_path / "kill" / "events.jsonl").write_text(json.dumps({"kind": "restart"}) + "\n")
    report = [sys.executable, str(BENCH / "gpu_check_report.py")]
    drill = json.loads(
        run_script([*report, "drill", str(tmp_path / "ref"), str(tmp_path / "kill"), "2"]).stdout
    )
    assert drill["weights_identical"] and drill["restarts"] == 1 and drill["steps_compared"] == 3
    assert drill["metrics_identical"] == ["loss/total", "step"]  # time is never compared
    assert drill["metrics_differing_max_abs"] == {"reward/mean": pytest.approx(0.25)}
    summary = json.loads(run_script([*report, "summary", str(tmp_path), "cpu", "1"]).stdout)
    assert summary["dry_run"] is True and summary["device"] == "cpu" and summary["learning"] == {}


def test_eval_repeats(tmp_path: Path) -> None:
    """eval_repeats.py's worked numbers: six draws of three problems ("3 1 -> 3" drawn four times, in both orders),
    counted over the draws and over distinct problems, with and without `--unordered numbers`."""
    draws = [([3, 1], 3, 1, 0)] * 3 + [([1, 3], 3, 1, 0), ([2, 2, 5], 9, 0, 1), ([1, 2, 3], 6, 1, 1)]
    for name, col in (("a", 2), ("b", 3)):
        records = [
            {
                "problem": {"numbers": d[0], "target": d[1]},
                "difficulty": f"n{len(d[0])}",
                "correct": [bool(d[col])],
            }
            for d in draws
        ]
        (tmp_path / f"{name}.json").write_text(json.dumps({"records": {"greedy": records}}))
    script = [
        sys.executable,
        str(BENCH / "eval_repeats.py"),
        str(tmp_path / "a.json"),
        str(tmp_path / "b.json"),
    ]
    r = json.loads(run_script([*script, "--unordered", "numbers"]).stdout)
    assert r["draws"] == 6 and r["distinct"] == 3 and r["repeats_that_disagree"] == 0
    assert r["over_draws"]["a"] == pytest.approx(5 / 6, abs=1e-4) and r["over_draws"]["diff"] == -0.5
    assert r["over_distinct"]["a"] == pytest.approx(2 / 3, abs=1e-4) and r["over_distinct"]["diff"] == 0.0
    assert r["by_difficulty_distinct"]["n2"] == {"draws": 4, "distinct": 1, "a": 1.0, "b": 0.0}
    ordered = json.loads(run_script(script).stdout)  # [3, 1] and [1, 3] are two problems
    assert ordered["distinct"] == 4 and ordered["over_distinct"]["diff"] == -0.25


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path: Path) -> None:
    """gpu_check.sh --dry-run on CPU: every part at tiny sizes (minutes)."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh"), str(tmp_path), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] is True and report["device"] == "cpu"
    assert set(report["learning"]) == {"b16", "b32"} and report["throughput"]
    assert report["fault_drill"]["reference_finished"]
