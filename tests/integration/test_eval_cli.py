"""`keelrl eval` / `keelrl compare` end to end on a tiny random model, the eval pipeline on a scripted
sampler with known answers, and perplexity."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from keelrl.cli.main import main
from keelrl.config import TinyModelConfig
from keelrl.core.seeds import stable_hash
from keelrl.evals import EvalReport, evaluate, pass_at_k, perplexity, reference_perplexity
from keelrl.evals.likelihood import reference_completion
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.rollout import Generation, SamplingSettings
from keelrl.tasks import get_task
from keelrl.tasks.countdown import solve

TASK = ["--task", "countdown", "--task-param", "max_numbers=3", "--task-param", "max_number=20"]
SAMPLED = [
    "--problems",
    "6",
    "--samples",
    "4",
    "--k",
    "1,2,4",
    "--temperature",
    "1.0",
    "--max-new-tokens",
    "12",
]
TIMING = ("time_s", "problems_per_s", "completions_per_s", "tokens_per_s")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2), len(tok), tok.eos_token_id
    )
    out = tmp_path_factory.mktemp("models") / "tiny"
    save_hf_dir(model, tok, out)
    return str(out)


@pytest.fixture(scope="module")
def eval_json(tiny_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "a.json"
    assert main(["eval", tiny_dir, *TASK, *SAMPLED, "--out", str(out)]) == 0
    return out


def without_timing(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in TIMING}


def test_eval_json_structure(eval_json: Path) -> None:
    data = json.loads(eval_json.read_text())
    assert data["schema"] == "keelrl.eval/1"
    assert isinstance(data["accuracy"], float) and data["accuracy"] == data["metrics"]["accuracy"]["value"]
    expected = {"accuracy", "pass@1", "pass@2", "pass@4", "maj@2", "maj@4", "mean@n", "reward/mean"}
    expected |= {
        "format_rate",
        "truncated_frac",
        "length/mean",
        "sampled/truncated_frac",
        "sampled/length/mean",
    }
    assert expected <= set(data["metrics"])
    for m in data["metrics"].values():
        lo, hi = m["ci95"]
        assert lo <= m["value"] <= hi
    assert data["problems"] == 6
    assert set(data["by_difficulty"]) == {"n3"}  # max_numbers=3, min_numbers=3
    assert data["by_difficulty"]["n3"]["problems"] == 6
    s = data["settings"]
    assert (s["samples"], s["k"], s["temperature"], s["greedy"], s["template"]) == (
        4,
        [1, 2, 4],
        1.0,
        True,
        "compact",
    )
    assert s["task_params"] == {"max_numbers": 3, "max_number": 20}
    assert data["problems_per_s"] > 0
    recs = data["records"]
    assert len(recs["greedy"]) == 6 and all(len(r["correct"]) == 1 for r in recs["greedy"])
    assert len(recs["sampled"]) == 6 and all(len(r["correct"]) == 4 for r in recs["sampled"])
    assert all(len(r["lengths"]) == 4 and max(r["lengths"]) <= 12 for r in recs["sampled"])


def test_eval_is_deterministic_for_a_fixed_seed(tiny_dir: str, eval_json: Path, tmp_path: Path) -> None:
    again = tmp_path / "b.json"
    assert main(["eval", tiny_dir, *TASK, *SAMPLED, "--out", str(again)]) == 0
    assert without_timing(json.loads(again.read_text())) == without_timing(json.loads(eval_json.read_text()))
    other = tmp_path / "c.json"
    assert main(["eval", tiny_dir, *TASK, *SAMPLED, "--seed", "1", "--out", str(other)]) == 0
    texts = lambda p: [r["texts"] for r in json.loads(p.read_text())["records"]["sampled"]]  # noqa: E731
    assert texts(other) != texts(eval_json)  # the seed drives the sampled pass


def test_gates_set_the_exit_status(
    tiny_dir: str, eval_json: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["eval", tiny_dir, *TASK, "--problems", "4", "--max-new-tokens", "8"]
    assert main([*base, "--gate", "accuracy>=0", "--gate", "truncated_frac<=1"]) == 0
    assert "PASS accuracy>=0" in capsys.readouterr().out
    assert main([*base, "--gate", "accuracy>=0", "--gate", "accuracy>0.5"]) == 1
    assert "FAIL accuracy>0.5" in capsys.readouterr().err
    assert main([*base, "--gate", "accuracy>=base-0.01", "--baseline", str(eval_json)]) == 0
    assert main([*base, "--gate", "length/mean>base", "--baseline", str(eval_json)]) == 1
    # User errors exit 2 with one paragraph, before any model is loaded.
    assert main([*base, "--gate", "accuracy=>0.4"]) == 2
    assert "cannot parse gate" in capsys.readouterr().err
    assert main([*base, "--gate", "accuracy>=base"]) == 2
    assert "--baseline" in capsys.readouterr().err
    assert main([*base, "--gate", "pass@4>0.1"]) == 2  # greedy-only eval has no pass@4
    assert "'pass@4' is not in the results; available: accuracy" in capsys.readouterr().err
    assert main([*base, "--samples", "4", "--temperature", "0"]) == 2
    assert main([*base, "--samples", "2", "--k", "4"]) == 2


def test_compare_a_model_with_itself_is_indistinguishable(
    tiny_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp.json"
    assert main(["compare", tiny_dir, tiny_dir, *TASK, *SAMPLED, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    cmp = json.loads(out.read_text())
    assert cmp["problems"] == 6 and {"accuracy", "pass@4", "maj@4", "mean@n"} <= set(cmp["metrics"])
    for name, m in cmp["metrics"].items():
        assert m["verdict"] == "indistinguishable", name
        assert m["diff"] == 0.0
    assert "indistinguishable" in printed and "better" not in printed and "worse" not in printed


def test_compare_saved_results_and_a_model_against_a_result(
    tiny_dir: str, eval_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp.json"
    # A model against a saved result is evaluated with the result's settings: the same problems and samples.
    assert main(["compare", str(eval_json), tiny_dir, "--out", str(out), "--gate", "accuracy>=base"]) == 0
    cmp = json.loads(out.read_text())
    assert all(m["verdict"] == "indistinguishable" and m["diff"] == 0.0 for m in cmp["metrics"].values())
    assert cmp["setting_differences"] == {}
    # Results on different problems cannot be paired.
    fewer = tmp_path / "fewer.json"
    assert (
        main(["eval", tiny_dir, *TASK, "--problems", "3", "--max-new-tokens", "8", "--out", str(fewer)]) == 0
    )
    capsys.readouterr()
    assert main(["compare", str(eval_json), str(fewer)]) == 2
    assert "6 problems and B has 3" in capsys.readouterr().err


# --------------------------------------------------------------------------- scripted sampler: known answers


class ScriptedSampler:
    """Answers compact countdown prompts: greedy is right exactly when the numbers' sum is even; a sample is
    right when its seed says so (about 40%), otherwise it writes a well-formed wrong answer or none."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.policy_version = 0

    def update_weights(self, weights: Any, version: int) -> None:
        self.policy_version = version

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        out = []
        for ids, seed in zip(prompts, seeds):
            head = self.tok.decode(ids).split("\n")[0]  # "n1 n2 n3 -> target"
            left, target = head.split(" -> ")
            numbers = [int(x) for x in left.split()]
            if settings.temperature == 0:
                right = sum(numbers) % 2 == 0
            else:
                right = seed % 100 < 40
            if right:
                text = f"<answer>{solve(numbers, int(target))}</answer>"
            else:
                text = "<answer>1+1</answer>" if seed % 3 else "no idea"
            completion = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Generation(completion, [0.0] * len(completion), "eos"))
        return out


def test_evaluate_pipeline_on_known_answers() -> None:
    tok = build_char_tokenizer()
    task = get_task("countdown", max_numbers=3, max_number=20)
    kwargs: dict[str, Any] = dict(max_new_tokens=32, samples=8, ks=[1, 4, 8], temperature=1.0, seed=3)
    report = evaluate(ScriptedSampler(tok), tok, task, "compact", 30, batch_size=7, **kwargs)
    problems = [task.problem("test", i) for i in range(30)]
    even = [sum(p["numbers"]) % 2 == 0 for p in problems]
    table = report.table()
    assert list(table["accuracy"]) == [float(e) for e in even]
    for i, r in enumerate(report.sampled or []):
        expected = [stable_hash("eval", 3, i, j) % 100 < 40 for j in range(8)]
        assert r.correct == expected
        assert table["pass@4"][i] == pass_at_k(8, sum(expected), 4)
        assert all((a is None) == (t == "no idea") for a, t in zip(r.answers, r.texts))
    assert 0.2 < table["mean@n"].mean() < 0.6
    assert table["pass@1"].mean() == pytest.approx(table["mean@n"].mean())
    assert table["pass@1"].mean() < table["pass@4"].mean() < table["pass@8"].mean() <= 1.0
    # Wrong answers all read "1+1" and outvote the (differently written) right ones unless right ones lead.
    assert 0.0 <= table["maj@8"].mean() <= table["pass@8"].mean()
    summary = report.summary(resamples=500)
    assert summary["accuracy"] == pytest.approx(sum(even) / 30)
    lo, hi = summary["metrics"]["accuracy"]["ci95"]
    assert lo < summary["accuracy"] < hi
    # Batch size does not change any sample (per-(problem, sample) seeds).
    again = evaluate(ScriptedSampler(tok), tok, task, "compact", 30, batch_size=64, **kwargs)
    assert [r.texts for r in again.sampled or []] == [r.texts for r in report.sampled or []]
    assert (
        EvalReport.from_json(json.loads(json.dumps(report.to_json(resamples=100)))).table().keys()
        == table.keys()
    )


class RaisingChecker:
    """The countdown task, but its checker raises on completions without an answer tag (a buggy user task)."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def score(self, problem: dict[str, Any], completion: str) -> Any:
        if "<answer>" not in completion:
            raise KeyError("answer")
        return self.task.score(problem, completion)


def test_a_checker_that_raises_scores_zero_and_is_reported() -> None:
    from keelrl.evals import render_summary, summarize

    tok = build_char_tokenizer()
    task = RaisingChecker(get_task("countdown", max_numbers=3, max_number=20))
    report = evaluate(ScriptedSampler(tok), tok, task, "compact", 12, samples=6, ks=[1, 6], seed=5)
    sampled = report.sampled or []
    raised = 0
    for r in (report.greedy or []) + sampled:
        for text, err, reward, correct in zip(r.texts, r.score_errors, r.rewards, r.correct):
            assert (err is not None) == (text == "no idea")
            if err is not None:
                assert err == "KeyError: 'answer'" and reward == 0.0 and not correct
                raised += 1
    in_sampled = sum(t == "no idea" for r in sampled for t in r.texts)
    assert 0 < in_sampled < raised, "the scripted sampler writes 'no idea' in both passes"
    summary = report.summary(resamples=100)
    assert summary["score_errors"] == raised and summary["first_score_error"] == "KeyError: 'answer'"
    assert summarize(sampled)["reward/errors"] == in_sampled
    assert any("checker raised" in str(x) for x in render_summary(summary))  # a rich Text, not markup
    again = EvalReport.from_json(json.loads(json.dumps(report.to_json(resamples=100))))
    assert [r.score_errors for r in again.sampled or []] == [r.score_errors for r in sampled]


# ------------------------------------------------------------------------------------------------ perplexity


def test_perplexity_matches_a_hand_computed_value(tiny_dir: str) -> None:
    from keelrl.config import ModelConfig
    from keelrl.models.load import load_policy

    model, tok = load_policy(ModelConfig(path=tiny_dir))
    texts = ["12 + 3 = 15", "7*6 = 42, and some more text"]
    res = perplexity(model, tok, texts)
    total_nll, total_tok = 0.0, 0
    for text in texts:
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
        total_nll -= float(logp.gather(-1, ids[0, 1:, None]).sum())  # no BOS: scored from the 2nd token
        total_tok += ids.shape[1] - 1
    out = res.to_json(resamples=200)
    assert out["tokens"] == total_tok
    assert out["metrics"]["nll/token"]["value"] == pytest.approx(total_nll / total_tok, rel=1e-5)
    assert out["metrics"]["perplexity"]["value"] == pytest.approx(math.exp(total_nll / total_tok), rel=1e-5)
    lo, hi = out["metrics"]["perplexity"]["ci95"]
    assert lo <= out["metrics"]["perplexity"]["value"] <= hi
    # A random char model is close to uniform over its ~97 symbols.
    assert 30 < out["metrics"]["perplexity"]["value"] < 300


def test_reference_completions_are_checked_by_the_task() -> None:
    cd = get_task("countdown", max_numbers=3, max_number=20)
    p = cd.problem("test", 0)
    compact = reference_completion(cd, p, "<answer>")
    assert compact is not None and compact.endswith("</answer>") and "<answer>" not in compact
    assert cd.score(p, "<answer>" + compact).correct
    prefix = cd.prompt(p, "base").assistant_prefix
    base = reference_completion(cd, p, prefix)
    assert base is not None and base.startswith("</think>\n<answer>") and cd.score(p, prefix + base).correct
    mul = get_task("multiply", digits_a=2, digits_b=2)
    q = mul.problem("test", 0)
    assert reference_completion(mul, q, "<answer>") == f"{q['a'] * q['b']}</answer>"
    # A problem's own "reference" is used when present (and must score as correct).
    assert reference_completion(cd, {**p, "reference": "1+1"}, "<answer>") is None
    own = solve(p["numbers"], p["target"])
    assert reference_completion(cd, {**p, "reference": own}, "<answer>") == f"{own}</answer>"


def test_reference_perplexity_scores_each_problem_of_a_small_split_once(tiny_dir: str) -> None:
    # A data set's split with 3 problems, asked for 5: score its 3 references once each, as `evaluate` does
    # (its problem() wraps around, which would count problems twice and narrow the interval).
    from keelrl.config import ModelConfig
    from keelrl.models.load import load_policy

    class ThreeProblems:
        def __init__(self) -> None:
            self.inner = get_task("countdown", max_numbers=3, max_number=20)
            self.name = "three"

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def size(self, split: str) -> int:
            return 3

        def problem(self, split: str, index: int) -> dict[str, Any]:
            return self.inner.problem(split, index % 3)

    model, tok = load_policy(ModelConfig(path=tiny_dir))
    res = reference_perplexity(model, tok, ThreeProblems(), "compact", 5)  # type: ignore[arg-type]
    assert (len(res.nll), res.skipped) == (3, 0)


def test_reference_perplexity_and_the_cli(tiny_dir: str, tmp_path: Path) -> None:
    from keelrl.config import ModelConfig
    from keelrl.models.load import load_policy

    model, tok = load_policy(ModelConfig(path=tiny_dir))
    task = get_task("countdown", max_numbers=3, max_number=20)
    res = reference_perplexity(model, tok, task, "compact", 5)
    assert len(res.nll) == 5 and res.skipped == 0 and all(res.tokens > 3)
    out = tmp_path / "ppl.json"
    assert (
        main(["eval", tiny_dir, *TASK, "--problems", "5", "--perplexity", "reference", "--out", str(out)])
        == 0
    )
    data = json.loads(out.read_text())
    assert data["metrics"]["nll/token"]["value"] == pytest.approx(
        float(res.nll.sum() / res.tokens.sum()), rel=1e-6
    )
    text = tmp_path / "t.txt"
    text.write_text("12 + 3 = 15\n\n7*6 = 42\n")
    assert main(["eval", tiny_dir, "--perplexity", str(text), "--gate", "perplexity<1000"]) == 0
    assert main(["eval", tiny_dir, "--perplexity", str(tmp_path / "missing.txt")]) == 2
