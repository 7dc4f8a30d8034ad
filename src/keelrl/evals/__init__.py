"""Held-out evaluation that says how sure it is: the trainer's periodic eval and `keelrl eval` / `keelrl
compare` share this code and the sampler. run/run.py generates per-problem records, stats.py estimates and
bootstraps (pure, numpy only), report.py builds `EvalReport` and compares two, gates.py checks pass/fail
thresholds, likelihood.py computes perplexities, render.py draws rich tables. The names below are the
public API; the helpers stay in their modules.
"""

from keelrl.evals.gates import GateError, check_gate, check_gates, parse_gate
from keelrl.evals.likelihood import perplexity, reference_perplexity
from keelrl.evals.render import render_comparison, render_summary
from keelrl.evals.report import ComparisonError, EvalReport, compare_results, evaluate
from keelrl.evals.run import ProblemResult, run_eval, score_errors, summarize
from keelrl.evals.stats import maj_at_k, pass_at_k

__all__ = [
    "ComparisonError", "EvalReport", "GateError", "ProblemResult", "check_gate", "check_gates", "compare_results",
    "evaluate", "maj_at_k", "parse_gate", "pass_at_k", "perplexity", "reference_perplexity",
    "render_comparison", "render_summary", "run_eval", "score_errors", "summarize",
]  # fmt: skip
