"""Mutation audit of the whole update path: does the default test suite catch each plausible one-line slip?

The update path: advantages (algo/advantages.py), objectives and losses (algo/objectives.py, algo/losses.py),
the critic (algo/gae.py, critic.py), off-policy corrections (algo/offpolicy.py), batch preparation and
micro-batching (update.py), weight sync (weight_sync.py), the asynchronous queue and its sampling process
(rollout/pipeline.py, rollout/process.py). Each mutant is one exact text replacement that changes one line of
one file (the text must occur exactly once) into a bug a person could write. For each, a fresh copy of
src/keelrl gets the patch and the test files that cover that code run against it, one file after the other until
one fails (PYTHONPATH at the copy; the default suite's markers, so no slow test counts; `-x`). A mutant is caught
when pytest exits 1 (a test failed); anything else (every file passed, an import error, a timeout) is not a
catch. Before the mutants, every test file used must pass unpatched.

A mutant that cannot change any observable result is not a bug; such mutants are listed in `EQUIVALENT` with
the reason, and not run.

    nice -n 10 python benchmarks/mutate_loss.py --out docs/mutate_loss.json   # all (make mutants; ~1 h on 2 cores)
    python benchmarks/mutate_loss.py --quick                                  # a few, for the default suite
    python benchmarks/mutate_loss.py --only tis_truncates_both_sides,gae_lambda_ignored

Prints JSON (also to --out); exits 1 if a test set fails unpatched or a mutant survives.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
U = "tests/unit/"
# the test files that cover each part of the update path
# (in the order they run: the quickest first, and a mutant stops at the first file that fails)
OBJ = (U + "test_losses.py", U + "test_objectives.py", U + "test_objectives_beyond_ppo.py", U + "test_kl_gradients.py",
       U + "test_trl_oracle.py")  # fmt: skip
GAE = (U + "test_gae.py",)
CRITIC = (U + "test_gae.py", U + "test_update_math.py")
OFF = (U + "test_offpolicy.py", U + "test_update_path.py")
ADV = (U + "test_advantages.py", U + "test_kl_gradients.py")
UPD = (U + "test_update_path.py", U + "test_update_math.py", U + "test_kl_gradients.py")
SYNC = (U + "test_weight_sync.py",)
PIPE = (U + "test_pipeline.py",)
ASYNC = ("tests/integration/test_async_quick.py",)

L, OB, G, CR, OP, AD = "algo/losses.py", "algo/objectives.py", "algo/gae.py", "step/critic.py", "algo/offpolicy.py", "algo/advantages.py"  # fmt: skip
BA, UP, WS, PL, PR, RC = (
    "step/batch.py",
    "step/update.py",
    "step/weight_sync.py",
    "rollout/pipeline.py",
    "rollout/process.py",
    "loop/recovery.py",
)

# name -> (file under src/keelrl, exact text, replacement, the test files that must catch it)

# fmt: off
MUTATIONS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    # --- losses: PPO-clip, KL estimators, normalisers (algo/losses.py) ---
    "clip_bounds_swapped_in_loss": (L, "ratio.clamp(1.0 - clip_low, 1.0 + clip_high)", "ratio.clamp(1.0 - clip_high, 1.0 + clip_low)", OBJ),
    "ratio_inverted": (L, "log_ratio = (logprobs - old_logprobs).clamp", "log_ratio = (old_logprobs - logprobs).clamp", OBJ),
    "dual_clip_ignored_in_loss": (L, "loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)", "loss = loss", OBJ),
    'clipfrac_low_on_the_wrong_sign': (L, '"clipped_low": ((ratio < 1.0 - clip_low) & (advantages < 0))', '"clipped_low": ((ratio < 1.0 - clip_low) & (advantages > 0))', OBJ),
    'always_token_mean': (L, 'if mode == "token_mean":', 'if True:', OBJ),
    "seq_mean_ignores_lengths": (L, "return mask / per_seq / max(", "return mask / max(", OBJ),
    "seq_mean_nan_on_empty_rows": (L, "per_seq = mask.sum(dim=1, keepdim=True).clamp_min(1.0)", "per_seq = mask.sum(dim=1, keepdim=True)", OBJ),
    "constant_ignores_max_len": (L, "mask / (max(global_seqs, 1.0) * max_new_tokens)", "mask / max(global_seqs, 1.0)", OBJ),
    "constant_uses_padded_len": (L, "(max(global_seqs, 1.0) * max_new_tokens)", "(max(global_seqs, 1.0) * mask.shape[1])", OBJ),
    "gspo_ratio_not_length_normalised": (L, "return ((logprobs - old_logprobs) * mask).sum(dim=1) / n", "return ((logprobs - old_logprobs) * mask).sum(dim=1)", OBJ),
    "k2_without_the_half": (L, "return 0.5 * log_r.square()", "return log_r.square()", OBJ),
    "k3_log_term_sign": (L, "return torch.exp(log_r) - 1.0 - log_r", "return torch.exp(log_r) - 1.0 + log_r", OBJ),
    'k3_is_ratio_detached': (L, '"k3_is": lambda lp, ref, old: torch.exp((lp - old).clamp(-20.0, 20.0))', '"k3_is": lambda lp, ref, old: torch.exp((lp - old).clamp(-20.0, 20.0)).detach()', OBJ),
    'k3_is_without_the_ratio': (L, '"k3_is": lambda lp, ref, old: torch.exp((lp - old).clamp(-20.0, 20.0)) * ', '"k3_is": lambda lp, ref, old: 1.0 * ', OBJ),
    "kl_reward_penalty_sign": (L, "return (sampler_logprobs - ref_logprobs).detach()", "return (ref_logprobs - sampler_logprobs).detach()", ADV),
    "kl_reward_penalty_off_the_mask": (L, "return (sampler_logprobs - ref_logprobs).detach().clamp(-20.0, 20.0) * mask", "return (sampler_logprobs - ref_logprobs).detach().clamp(-20.0, 20.0)", OBJ),
    # --- objectives and compute_loss (algo/objectives.py) ---
    "advantage_sign_flipped": (OB, "return x.advantages[:, None]", "return -x.advantages[:, None]", OBJ),
    "advantage_rows_reversed": (OB, "return x.advantages[:, None]", "return x.advantages.flip(0)[:, None]", OBJ),
    "kl_dropped": (OB, "loss = loss + algo.kl_coef * (kl_term(", "loss = loss + 0.0 * (kl_term(", OBJ),
    "kl_flipped": (OB, "loss = loss + algo.kl_coef * (kl_term(", "loss = loss - algo.kl_coef * (kl_term(", OBJ),
    "kl_coef_doubled": (OB, "loss = loss + algo.kl_coef * (kl_term(", "loss = loss + 2 * algo.kl_coef * (kl_term(", OBJ),
    'kl_estimator_ignored': (OB, 'kl_term = KL_LOSSES.get(algo.kl_estimator)', 'kl_term = KL_LOSSES.get("k3")', OBJ),
    'kl_in_the_loss_too_with_kl_in_the_reward': (OB, 'kl_term = KL_LOSSES.get(algo.kl_estimator)', 'kl_term = KL_LOSSES.get(algo.kl_estimator, KL_LOSSES["k1"])', OBJ),
    "kl_ratio_against_the_current_policy": (OB, "kl_term(x.logprobs, x.ref_logprobs, x.old_logprobs)", "kl_term(x.logprobs, x.ref_logprobs, x.logprobs.detach())", OBJ),
    'kl_ref_metric_uses_k1': (OB, 'named["kl/ref"] = (kl_penalty(x.logprobs, x.ref_logprobs, "k3")', 'named["kl/ref"] = (kl_penalty(x.logprobs, x.ref_logprobs, "k1")', OBJ),
    "entropy_dropped": (OB, "loss = loss - algo.entropy_coef * (x.entropy * w).sum()", "loss = loss", OBJ),
    "entropy_flipped": (OB, "loss = loss - algo.entropy_coef", "loss = loss + algo.entropy_coef", OBJ),
    "is_weights_ignored": (OB, "pg = pg * x.is_weights", "pg = pg", OBJ),
    "is_weights_inverted": (OB, "pg = pg * x.is_weights", "pg = pg / x.is_weights", OBJ),
    "clip_bounds_swapped_in_objective": (OB, "algo.clip_low, algo.clip_high", "algo.clip_high, algo.clip_low", OBJ),
    "dual_clip_ignored_in_objective": (OB, "algo.clip_high, algo.dual_clip)", "algo.clip_high, 0.0)", OBJ),
    "loss_weighted_by_metric_weights": (OB, "policy_loss = (pg * w).sum()", "policy_loss = (pg * x.metric_weights).sum()", OBJ),
    "metrics_weighted_like_the_loss": (OB, "m = x.metric_weights", "m = x.loss_weights", OBJ),
    'dual_clipfrac_not_logged': (OB, ', "clipfrac/dual": pstats["dual_clipped"]}', '}', OBJ),
    'ratio_max_over_padding': (OB, '"ratio/max": torch.where(x.mask.bool(), out.ratio, 0.0).max()', '"ratio/max": out.ratio.max()', OBJ),
    "gspo_clip_bounds_swapped": (OB, "algo.seq_clip_low, algo.seq_clip_high", "algo.seq_clip_high, algo.seq_clip_low", OBJ),
    "gspo_with_the_token_clip_range": (OB, "algo.seq_clip_low, algo.seq_clip_high", "algo.clip_low, algo.clip_high", OBJ),
    "gspo_token_gradient_through_the_sequence": (OB, "x.logprobs, x.old_logprobs, x.mask).detach()[:, None]", "x.logprobs, x.old_logprobs, x.mask)[:, None]", OBJ),
    "gspo_token_keeps_only_the_sequence_gradient": (OB, "_clipped(x.logprobs - x.logprobs.detach() + log_s", "_clipped(0.0 * x.logprobs + log_s", OBJ),
    "cispo_weight_not_detached": (OB, ".clamp(-20.0, 20.0)).detach()  # [b, T]", ".clamp(-20.0, 20.0))  # [b, T]", OBJ),
    "cispo_cap_ignored": (OB, "weight = ratio.clamp(algo.cispo_min, algo.cispo_max)", "weight = ratio.clamp_min(algo.cispo_min)", OBJ),
    "cispo_floor_ignored": (OB, "weight = ratio.clamp(algo.cispo_min, algo.cispo_max)", "weight = ratio.clamp_max(algo.cispo_max)", OBJ),
    "cispo_without_the_log_prob": (OB, "-weight * adv * x.logprobs", "-weight * adv", OBJ),
    # --- advantages (algo/advantages.py) ---
    "grpo_without_the_std": (AD, "return (g - mean) / (std + std_eps)", "return g - mean", ADV),
    "grpo_population_std": (AD, "std = g.std(dim=1, keepdim=True) if", "std = g.std(dim=1, keepdim=True, correction=0) if", ADV),
    "dr_grpo_without_the_baseline": (AD, "return g - g.mean(dim=1, keepdim=True)", "return g", ADV),
    "rloo_baseline_includes_itself": (AD, "return g - (g.sum(dim=1, keepdim=True) - g) / (n - 1)", "return g - g.sum(dim=1, keepdim=True) / n", ADV),
    "reinforce_pp_not_whitened": (AD, "whiten=True", "whiten=False", ADV),
    "reinforce_pp_always_group_baseline": (AD, "dr_grpo(g) if baseline else g.clone()", "dr_grpo(g)", ADV),
    "batch_whitening_with_the_sample_std": (AD, "(x.std(correction=0) + std_eps)", "(x.std() + std_eps)", ADV),
    "invalid_samples_counted": (AD, "if valid is None:\n", "if True:\n", ADV),
    "no_signal_inverted": (AD, "((hi == lo) | (keep.sum(dim=1) < 2))", "((hi != lo) | (keep.sum(dim=1) < 2))", ADV),
    'abs_mean_without_abs': (AD, '"advantage/abs_mean": float(shown.abs().mean())', '"advantage/abs_mean": float(shown.mean())', ADV),
    # --- GAE and the value loss (algo/gae.py) ---
    "terminal_reward_on_the_first_position": (G, "last = T - 1 - mask.bool().flip(1).float().argmax(dim=1)", "last = mask.bool().float().argmax(dim=1)", GAE),
    "gae_lambda_ignored": (G, "a_t = delta + gamma * lam * next_adv", "a_t = delta + gamma * next_adv", GAE),
    "gae_gamma_ignored_in_delta": (G, "rewards[:, t] + gamma * next_value", "rewards[:, t] + next_value", GAE),
    "gae_runs_through_inserted_positions": (G, "next_value = torch.where(on, values[:, t], next_value)", "next_value = values[:, t]", GAE),
    "returns_without_the_values": (G, "return adv, (adv + values) * mask", "return adv, adv * mask", GAE),
    "value_loss_unclipped": (G, "0.5 * torch.maximum(plain_sq, clipped_sq)", "0.5 * plain_sq", GAE),
    "value_loss_without_the_half": (G, "return 0.5 * torch.maximum(plain_sq, clipped_sq)", "return torch.maximum(plain_sq, clipped_sq)", GAE),
    "whiten_without_the_std": (G, "return (x - mean) / (var**0.5 + 1e-8) * mask", "return (x - mean) * mask", GAE),
    "whiten_without_the_mean": (G, "return (x - mean) / (var**0.5 + 1e-8) * mask", "return x / (var**0.5 + 1e-8) * mask", GAE),
    "explained_variance_inverted": (G, "return float(1.0 - (r - v).var() / r.var())", "return float((r - v).var() / r.var())", GAE),
    # --- the critic (critic.py) ---
    "critic_gamma_and_lambda_swapped": (CR, "values, mask, algo.gamma, algo.lam)", "values, mask, algo.lam, algo.gamma)", CRITIC),
    "critic_advantages_not_whitened": (CR, "white = whiten(adv, mask, total, total_sq, count)", "white = adv", CRITIC),
    "value_loss_summed": (CR, "loss = (per_token * metric_weights).sum()", "loss = (per_token * mb.target_mask).sum()", CRITIC),
    "critic_values_not_masked": (CR, "values = values * mask\n", "values = values\n", CRITIC),
    "shared_critic_ignores_value_coef": (CR, "(algo.value_coef if critic.shared else 1.0)", "1.0", CRITIC),
    "critic_kl_penalty_added": (CR, "token_rewards = token_rewards - kl_penalty", "token_rewards = token_rewards + kl_penalty", CRITIC),
    # --- off-policy corrections (algo/offpolicy.py) ---
    "tis_cap_ignored": (OP, "torch.exp(log_rho).clamp_max(algo.is_cap)", "torch.exp(log_rho)", OFF),
    "tis_truncates_both_sides": (OP, "torch.exp(log_rho).clamp_max(algo.is_cap)", "torch.exp(log_rho).clamp(1.0 / algo.is_cap, algo.is_cap)", OFF),
    "mis_keeps_the_outside": (OP, "rho * ((rho >= low) & (rho <= high))", "rho * ~((rho >= low) & (rho <= high))", OFF),
    "mis_without_the_ratio": (OP, "return rho * ((rho >= low)", "return 1.0 * ((rho >= low)", OFF),
    "decoupled_weight_inverted": (OP, "    return torch.exp(log_rho)\n", "    return torch.exp(-log_rho)\n", OFF),
    "behaviour_ratio_inverted": (OP, "log_rho = prox - behav", "log_rho = behav - prox", OFF),
    "sequence_level_uses_the_product": (OP, "sequence_log_ratio(prox, behav, mask)[:, None]", "(sequence_log_ratio(prox, behav, mask) * mask.sum(1))[:, None]", OFF),
    "weights_leak_off_the_mask": (OP, "algo).detach() * mask\n", "algo).detach()\n", OFF),
    "mismatch_k3_sign": (OP, "torch.exp(gap) - 1.0 - gap", "torch.exp(gap) - 1.0 + gap", OFF),
    "behaviour_clip_on_the_wrong_side": (OP, "((adv > 0) & (rho > 1.0 + clip_high))", "((adv < 0) & (rho > 1.0 + clip_high))", OFF),
    "behaviour_clip_low_bound_swapped": (OP, "(rho < 1.0 - clip_low)", "(rho < 1.0 - clip_high)", OFF),
    "behaviour_clip_high_bound_swapped": (OP, "(rho > 1.0 + clip_high))", "(rho > 1.0 + clip_low))", OFF),
    'ess_without_n': (OP, '(n * sums["sum_sq"])', 'sums["sum_sq"]', OFF),
    # --- batch preparation and micro-batching (step/batch.py, step/update.py) ---
    "collate_targets_one_late": (BA, "target[i, P - 1 : P - 1 + C] = ", "target[i, P : P + C] = ", UPD),
    "collate_sampler_logprobs_one_late": (BA, "slp[i, P - 1 : P - 1 + C] = ", "slp[i, P : P + C] = ", UPD),
    'collate_trains_unscored_rollouts': (BA, 'if C and r.status == "ok":', 'if C:', UPD),
    "select_cuts_to_the_shortest_row": (BA, "T = int(self.lengths[idx].max())", "T = int(self.lengths[idx].min())", UPD),
    "prepare_recompute_ratio_inverted": (UP, "correction_weights(batch.old_logprobs, batch.sampler_logprobs,", "correction_weights(batch.sampler_logprobs, batch.old_logprobs,", UPD),
    'prepare_staleness_ignored': (UP, 'if not (a.old_logprobs == "recompute" or cfg.rollout.max_staleness > 0):', 'if not (a.old_logprobs == "recompute"):', UPD),
    "prepare_minibatches_ignored": (UP, "elif a.ppo_epochs * a.minibatches > 1:", "elif a.ppo_epochs > 1:", UPD),
    'correction_off_still_weights': (UP, 'batch.is_weights = weights if a.correction != "off" else None', 'batch.is_weights = weights', UPD),
    'kl_reward_penalty_ignored': (UP, 'if a.kl_estimator == "k1_reward" and batch.ref_logprobs is not None:', 'if False:', ADV),
    "kl_reward_penalty_is_a_mean": (UP, "penalty = kl.sum(dim=1).tolist()", "penalty = kl.mean(dim=1).tolist()", ADV),
    "ppo_epochs_ignored": (UP, "for epoch in range(a.ppo_epochs):", "for epoch in range(1):", UPD),
    "minibatch_is_the_whole_batch": (UP, "mb_size = B // a.minibatches", "mb_size = B", UPD),
    "normalised_by_the_whole_batch": (UP, "g_tokens = all_reduce_sum(float(batch.target_mask[idx].sum()), world)", "g_tokens = all_reduce_sum(float(batch.target_mask.sum()), world)", UPD),
    "sequences_counted_over_the_whole_batch": (UP, "float((batch.target_mask[idx].sum(dim=1) > 0).sum())", "float((batch.target_mask.sum(dim=1) > 0).sum())", UPD),
    "first_micro_batch_only": (UP, "for i, mb in enumerate(mbs):", "for i, mb in enumerate(mbs[:1]):", UPD),
    "last_partial_micro_batch_dropped": (BA, "return [batch.select(order[i : i + size]) for i in range(0, len(order), size)]", "return [batch.select(order[i : i + size]) for i in range(0, len(order) - size + 1, size)]", UPD),
    "deferred_proximal_is_the_sampler": (UP, "lp_old = lp.detach()", "lp_old = mb.sampler_logprobs", UPD),
    "behaviour_clip_ratio_inverted": (UP, "log_rho = behaviour_log_ratio(lp_old, mb.sampler_logprobs,", "log_rho = behaviour_log_ratio(mb.sampler_logprobs, lp_old,", UPD),
    "behaviour_clip_advantage_sign_flipped": (UP, "trust = behaviour_trust_region(log_rho, mb.advantages,", "trust = behaviour_trust_region(log_rho, -mb.advantages,", UPD),
    "behaviour_clip_setting_ignored": (UP, "if is_w is not None and a.behaviour_clip:", "if is_w is not None:", UPD),
    'metrics_normalised_like_the_loss': (UP, 'mb.target_mask, "token_mean", g_tokens, g_seqs, max_new_tokens', 'mb.target_mask, a.loss_agg, g_tokens, g_seqs, max_new_tokens', UPD),
    "critic_warmup_inverted": (UP, "if not warmup:", "if warmup:", ("tests/integration/test_critic_run.py",)),
    # --- weight sync (weight_sync.py) ---
    "sync_check_never_fails": (WS, "    if gap.mean > tolerance:\n        run.event(", "    if gap.mean > 10 * tolerance:\n        run.event(", SYNC),
    "sync_second_failure_tolerated": (WS, "        if gap.mean > tolerance:\n            raise WeightSyncError(", "        if gap.mean > 10 * tolerance:\n            raise WeightSyncError(", SYNC),
    'sync_retry_keeps_the_prefix_cache': (WS, '        push(run, state, None)\n', '        push(run, state, "stale_prefix_cache")\n', SYNC),
    "sync_probe_takes_the_best_engine": (WS, "return max(gaps, key=lambda gap: gap.mean)", "return min(gaps, key=lambda gap: gap.mean)", SYNC),
    'sync_push_skipped': (WS, '    if drill == "skip":\n        return\n', '    if drill != "skip":\n        return\n', SYNC),
    # --- the asynchronous queue and its sampling process (rollout/pipeline.py, rollout/process.py) ---
    'push_without_snapshot': (PL, 'snapshot = [(k, v.detach().to("cpu", copy=True)) for k, v in dict(weights).items()]', 'snapshot = list(dict(weights).items())', PIPE),
    "schedule_one_version_late": (PL, "return max(step - staleness, floor)", "return max(step - staleness - 1, floor)", PIPE),
    "submit_version_unchecked": (PL, "if step != self.next_step or version != self.pushed_version:", "if step != self.next_step:", PIPE),
    "sampled_versions_unchecked": (PL, "if versions - {batch.version}:", "if False:", PIPE),
    "taken_batch_kept": (PL, "del self.batches[step]", "pass", PIPE),
    "restore_keeps_the_pushed_version": (PL, "self.pushed_version = -1  # whatever the sampler holds", "pass  # whatever the sampler holds", PIPE),
    "restore_next_step_wrong": (PL, "self.next_step, self.floor = step + len(batches), floor", "self.next_step, self.floor = step, floor", PIPE),
    "restore_floor_from_zero": (PL, "floor = batches[0].version if batches else step", "floor = batches[0].version if batches else 0", PIPE),
    "restore_schedule_unchecked": (PL, "or any(b.version != scheduled_version(b.step, self.staleness, floor) for b in batches)", "or False", PIPE),
    "rollback_replays_the_stored_batches": (RC, "state.pipeline = []  # not the checkpoint's queued batches", "pass  # not the checkpoint's queued batches", ASYNC),
    "staleness_metric_sign": (PL, "gather([version - r.policy_version for r in rollouts])", "gather([r.policy_version - version for r in rollouts])", ASYNC),
    "replaced_sampler_not_reloaded": (PR, "        if self._weights is not None:\n            self._load(", "        if False:\n            self._load(", PIPE),
    "process_weights_not_snapshotted": (PR, 'snapshot = {k: v.detach().to("cpu", copy=True) for k, v in dict(weights).items()}', "snapshot = dict(weights)", PIPE),
}
# fmt: on

# Mutants considered and left out because no observable result can change, each with the reason.
EQUIVALENT: dict[str, tuple[str, str, str, str]] = {
    "gae_values_not_masked_in_critic_advantages_then_masked_in_gae": (
        G, "values = values.detach().to(torch.float32) * mask", "values = values.detach().to(torch.float32)",
        "critic_advantages passes values already multiplied by the mask (critic.values_not_masked is the mutant "
        "that matters), and GAE reads values only where the mask is 1",
    ),
    "minibatch_order_not_shuffled": (
        UP, "perm = torch.randperm(B, generator=g).to(world.device)", "perm = torch.arange(B, device=world.device)",
        "any fixed split of the batch is a correct mini-batch schedule (and as reproducible); which rows share a "
        "mini-batch is a choice, not a result a test can call wrong",
    ),
}  # fmt: skip

QUICK = [
    "tis_truncates_both_sides",
    "rloo_baseline_includes_itself",
    "gae_lambda_ignored",
]  # light test files


def run_tests(src: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str | None]:
    """Run `tests` one file at a time against the package under `src` until one does not pass: (pytest's exit
    status: 0 all passed, 1 a test failed, -1 a timeout; the file that stopped it)."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for test in tests:
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", test]
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return -1, test
        if rc != 0:
            return rc, test
    return 0, None


def patched_copy(tmp: Path, name: str | None) -> Path:
    """A fresh copy of src/keelrl under tmp/<name>/, with mutation `name` applied (None: unpatched)."""
    src = tmp / (name or "baseline")
    shutil.copytree(ROOT / "src" / "keelrl", src / "keelrl", ignore=shutil.ignore_patterns("__pycache__"))
    if name is not None:
        rel, old, new, _ = MUTATIONS[name]
        path = src / "keelrl" / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(
                f"mutation {name}: {old!r} occurs {text.count(old)} times in {rel}, expected once"
            )
        path.write_text(text.replace(old, new))
    return src


def check_mutations() -> None:
    """Every mutation (and every equivalent one) applies to exactly one place and changes one line."""
    for name, (rel, old, new, *_) in {**MUTATIONS, **EQUIVALENT}.items():
        text = (ROOT / "src" / "keelrl" / rel).read_text()
        if text.count(old) != 1:
            raise SystemExit(
                f"mutation {name}: {old!r} occurs {text.count(old)} times in {rel}, expected once"
            )
        before, after = text.splitlines(), text.replace(old, new).splitlines()
        changed = [a for a, b in zip(before, after) if a != b] if len(before) == len(after) else None
        if changed is None or len(changed) != 1:
            raise SystemExit(f"mutation {name} does not change exactly one line of {rel}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants run at once")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    check_mutations()
    names = QUICK if args.quick else [n for n in args.only.split(",") if n] or list(MUTATIONS)
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        raise SystemExit(f"unknown mutants: {', '.join(unknown)}")
    test_files = sorted({f for n in names for f in MUTATIONS[n][3]})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutate_loss_") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        base = patched_copy(Path(tmp), None)
        baseline = dict(
            zip(test_files, pool.map(lambda f: run_tests(base, (f,), args.timeout)[0], test_files))
        )

        def one(name: str) -> dict:
            t0 = time.perf_counter()
            rc, by = run_tests(patched_copy(Path(tmp), name), MUTATIONS[name][3], args.timeout)
            s = round(time.perf_counter() - t0, 1)
            shutil.rmtree(Path(tmp) / name, ignore_errors=True)
            print(
                f"{name}: {'caught by ' + str(by) if rc == 1 else f'NOT caught (rc {rc})'} ({s} s)",
                file=sys.stderr,
            )
            return {
                "mutation": name,
                "file": MUTATIONS[name][0],
                "caught": rc == 1,
                "caught_by": by,
                "tests": list(MUTATIONS[name][3]),
                "rc": rc,
                "s": s,
            }

        results = list(pool.map(one, names))
    survivors = [r["mutation"] for r in results if not r["caught"]]
    failing = [f for f, rc in baseline.items() if rc != 0]
    out = {
        "command": "python benchmarks/mutate_loss.py" + (" --quick" if args.quick else ""),
        "baseline_passes": not failing,
        "baseline_failing": failing,
        "mutants": len(results),
        "caught": len(results) - len(survivors),
        "kill_rate": round((len(results) - len(survivors)) / max(len(results), 1), 4),
        "survivors": survivors,
        "equivalent": [{"mutation": n, "file": e[0], "why": e[3]} for n, e in EQUIVALENT.items()],
        "files": sorted({MUTATIONS[n][0] for n in names}),
        "mutations": results,
        "seconds": round(time.perf_counter() - start, 1),
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if not failing and not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
