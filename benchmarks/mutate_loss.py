"""Mutation audit of the policy and value losses: do the unit tests catch each plausible slip in their assembly?

Each mutation is one exact text replacement in algo/objectives.py, algo/losses.py, algo/gae.py or algo/offpolicy.py (it must match
exactly once). For each, a fresh copy of src/keelrl gets the patch and the loss tests run against it
(PYTHONPATH at the copy). Prints JSON, one entry per mutation with `caught`; exits 1 if any mutation
survives or the unpatched tests fail. About a minute on one core. MUTATE_TESTS="a.py b.py" picks
the test files (default: the objective, loss, GAE and TRL-oracle tests).

    python benchmarks/mutate_loss.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = os.environ.get(
    "MUTATE_TESTS",
    "tests/unit/test_objectives.py tests/unit/test_objectives_beyond_ppo.py tests/unit/test_losses.py "
    "tests/unit/test_trl_oracle.py tests/unit/test_gae.py tests/unit/test_offpolicy.py",
).split()
OBJ, LOSSES, GAE, OFF = "algo/objectives.py", "algo/losses.py", "algo/gae.py", "algo/offpolicy.py"

# name -> (file under src/keelrl, exact text, replacement)
MUTATIONS: dict[str, tuple[str, str, str]] = {
    "advantage_sign_flipped": (OBJ, "return x.advantages[:, None]", "return -x.advantages[:, None]"),
    "advantage_rows_reversed": (OBJ, "return x.advantages[:, None]", "return x.advantages.flip(0)[:, None]"),
    "kl_dropped": (OBJ, "loss = loss + algo.kl_coef * (kl * w).sum()", "loss = loss + 0.0 * (kl * w).sum()"),
    "kl_flipped": (OBJ, "loss = loss + algo.kl_coef * (kl", "loss = loss - algo.kl_coef * (kl"),
    "kl_coef_doubled": (OBJ, "loss = loss + algo.kl_coef * (kl", "loss = loss + 2 * algo.kl_coef * (kl"),
    "kl_estimator_ignored": (OBJ, "x.ref_logprobs, algo.kl_estimator)", 'x.ref_logprobs, "k1")'),
    "entropy_dropped": (OBJ, "loss = loss - algo.entropy_coef * (x.entropy * w).sum()", "loss = loss"),
    "entropy_flipped": (OBJ, "loss = loss - algo.entropy_coef", "loss = loss + algo.entropy_coef"),
    "tis_ignored": (OBJ, "pg = pg * x.is_weights", "pg = pg"),
    "tis_inverted": (OBJ, "pg = pg * x.is_weights", "pg = pg / x.is_weights"),
    "clip_bounds_swapped_in_objective": (
        OBJ,
        "algo.clip_low, algo.clip_high",
        "algo.clip_high, algo.clip_low",
    ),
    "clip_bounds_swapped_in_loss": (
        LOSSES,
        "ratio.clamp(1.0 - clip_low, 1.0 + clip_high)",
        "ratio.clamp(1.0 - clip_high, 1.0 + clip_low)",
    ),
    "ratio_inverted": (LOSSES, "(logprobs - old_logprobs).clamp", "(old_logprobs - logprobs).clamp"),
    "dual_clip_ignored_in_objective": (OBJ, "algo.clip_high, algo.dual_clip)", "algo.clip_high, 0.0)"),
    "dual_clip_ignored_in_loss": (
        LOSSES,
        "loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)",
        "loss = loss",
    ),
    "always_token_mean": (LOSSES, 'if mode == "token_mean":', "if True:"),
    "loss_weighted_by_metric_weights": (
        OBJ,
        "policy_loss = (pg * w).sum()",
        "policy_loss = (pg * x.metric_weights).sum()",
    ),
    "seq_mean_ignores_lengths": (LOSSES, "return mask / per_seq / max(", "return mask / max("),
    "constant_ignores_max_len": (
        LOSSES,
        "mask / (max(global_seqs, 1.0) * max_new_tokens)",
        "mask / max(global_seqs, 1.0)",
    ),
    "constant_uses_padded_len": (
        LOSSES,
        "(max(global_seqs, 1.0) * max_new_tokens)",
        "(max(global_seqs, 1.0) * mask.shape[1])",
    ),
    "metrics_weighted_like_the_loss": (OBJ, "m = x.metric_weights", "m = x.loss_weights"),
    "dual_clipfrac_not_logged": (OBJ, '"clipfrac/dual": pstats["dual_clipped"],', ""),
    "gspo_ratio_not_length_normalised": (
        LOSSES,
        "return ((logprobs - old_logprobs) * mask).sum(dim=1) / n",
        "return ((logprobs - old_logprobs) * mask).sum(dim=1)",
    ),
    "gspo_with_the_token_clip_range": (
        OBJ,
        "algo.seq_clip_low, algo.seq_clip_high",
        "algo.clip_low, algo.clip_high",
    ),
    "gspo_token_gradient_through_the_sequence": (
        OBJ,
        "x.logprobs, x.old_logprobs, x.mask).detach()[:, None]",
        "x.logprobs, x.old_logprobs, x.mask)[:, None]",
    ),
    "gspo_token_keeps_only_the_sequence_gradient": (
        OBJ,
        "_clipped(x.logprobs - x.logprobs.detach() + log_s",
        "_clipped(0.0 * x.logprobs + log_s",
    ),
    "cispo_weight_not_detached": (
        OBJ,
        ".clamp(-20.0, 20.0)).detach()  # [b, T]",
        ".clamp(-20.0, 20.0))  # [b, T]",
    ),
    "cispo_cap_ignored": (
        OBJ,
        "ratio.clamp(algo.cispo_min, algo.cispo_max)",
        "ratio.clamp_min(algo.cispo_min)",
    ),
    "cispo_without_the_log_prob": (OBJ, "-weight * adv * x.logprobs", "-weight * adv"),
    "gae_lambda_ignored": (GAE, "a_t = delta + gamma * lam * next_adv", "a_t = delta + gamma * next_adv"),
    "gae_gamma_ignored_in_delta": (GAE, "rewards[:, t] + gamma * next_value", "rewards[:, t] + next_value"),
    "gae_runs_through_inserted_positions": (
        GAE,
        "next_value = torch.where(on, values[:, t], next_value)",
        "next_value = values[:, t]",
    ),
    "returns_without_the_values": (GAE, "return adv, (adv + values) * mask", "return adv, adv * mask"),
    "value_loss_unclipped": (GAE, "0.5 * torch.maximum(plain_sq, clipped_sq)", "0.5 * plain_sq"),
    "whiten_without_the_std": (
        GAE,
        "return (x - mean) / (var**0.5 + 1e-8) * mask",
        "return (x - mean) * mask",
    ),
    "tis_cap_ignored": (OFF, "torch.exp(log_rho).clamp_max(algo.is_cap)", "torch.exp(log_rho)"),
    "mis_keeps_the_outside": (
        OFF,
        "rho * ((rho >= low) & (rho <= high))",
        "rho * ~((rho >= low) & (rho <= high))",
    ),
    "mis_without_the_ratio": (OFF, "return rho * ((rho >= low)", "return 1.0 * ((rho >= low)"),
    "decoupled_weight_inverted": (OFF, "    return torch.exp(log_rho)\n", "    return torch.exp(-log_rho)\n"),
    "behaviour_ratio_inverted": (OFF, "log_rho = prox - behav", "log_rho = behav - prox"),
    "sequence_level_uses_the_product": (
        OFF,
        "sequence_log_ratio(prox, behav, mask)[:, None]",
        "(sequence_log_ratio(prox, behav, mask) * mask.sum(1))[:, None]",
    ),
    "weights_leak_off_the_mask": (OFF, "algo).detach() * mask\n", "algo).detach()\n"),
    "mismatch_k3_sign": (OFF, "torch.exp(gap) - 1.0 - gap", "torch.exp(gap) - 1.0 + gap"),
    "behaviour_clip_on_the_wrong_side": (
        OFF,
        "((adv > 0) & (rho > 1.0 + clip_high))",
        "((adv < 0) & (rho > 1.0 + clip_high))",
    ),
    "behaviour_clip_bounds_swapped": (OFF, "(rho < 1.0 - clip_low)", "(rho < 1.0 - clip_high)"),
    "ess_without_n": (OFF, '(n * sums["sum_sq"])', 'sums["sum_sq"]'),
}


def run_tests(src: Path) -> int:
    """pytest's exit status for the loss tests against the package under `src` (0 pass, 1 a test failed)."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-x",
        "--noconftest",
        *TESTS,
    ]  # no tiny-model fixtures: faster start
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300).returncode


def patched_copy(tmp: Path, name: str | None) -> Path:
    """A fresh copy of src/keelrl under tmp/<name>/, with mutation `name` applied (None: unpatched)."""
    src = tmp / (name or "baseline")
    shutil.copytree(ROOT / "src" / "keelrl", src / "keelrl", ignore=shutil.ignore_patterns("__pycache__"))
    if name is not None:
        rel, old, new = MUTATIONS[name]
        path = src / "keelrl" / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(
                f"mutation {name}: {old!r} occurs {text.count(old)} times in {rel}, expected once"
            )
        path.write_text(text.replace(old, new))
    return src


def main() -> int:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutate_loss_") as tmp:
        baseline = run_tests(patched_copy(Path(tmp), None)) == 0
        results = []
        for name in MUTATIONS:
            t0 = time.perf_counter()
            rc = run_tests(patched_copy(Path(tmp), name))  # anything but a failing test (1) is not a catch
            s = round(time.perf_counter() - t0, 1)
            results.append(
                {"mutation": name, "file": MUTATIONS[name][0], "caught": rc == 1, "rc": rc, "s": s}
            )
    survivors = [r["mutation"] for r in results if not r["caught"]]
    out = {
        "tests": TESTS,
        "baseline_passes": baseline,
        "mutations": results,
        "caught": len(results) - len(survivors),
        "survivors": survivors,
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(out, indent=1))
    return 0 if baseline and not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
