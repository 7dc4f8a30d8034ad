"""The command line's small promises (issue 46): the help hides the supervisor's internal command and shows
defaults, --version, user errors recognised without importing their modules, console lines with each stage's
figures, events as sentences, checks that run when a config is loaded (optional packages, a preset's task
parameters), and the early checks of `keelrl train` (task, model path, a reward model's pairs)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from keelrl.cli.main import USER_ERRORS, build_parser, is_user_error, main
from keelrl.config import ConfigError, load_config
from keelrl.config.checks import local_path
from keelrl.monitor.sinks import Terminal, describe_event, say
from keelrl.stages import check_run
from keelrl.stages.sft.data import DataError
from keelrl.tasks import TaskError

SMOKE = "configs/smoke.toml"


def test_help_hides_the_worker_and_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    text = build_parser().format_help()
    assert "SUPPRESS" not in text and "worker" not in text and "train" in text
    with pytest.raises(SystemExit):
        main(["rft", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal's width
    assert "(default 1000)" in out and "(default 8)" in out and "(default 2)" in out
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("keelrl ")


def test_user_errors_are_named_exception_classes() -> None:
    for name in USER_ERRORS:
        module, _, cls = name.rpartition(".")
        error = getattr(importlib.import_module(module), cls)
        assert issubclass(error, Exception) and is_user_error(error("x")), name
    assert is_user_error(TaskError("x")) and is_user_error(DataError("x"))
    assert not is_user_error(ValueError("x")) and not is_user_error(RuntimeError("x"))


def test_console_lines_show_each_stages_figures(capsys: pytest.CaptureFixture[str]) -> None:
    step = {
        "reward/mean": 0.5,
        "accuracy": 0.25,
        "loss/total": 0.693,
        "rm/accuracy": 0.75,
        "time/step_s": 1.0,
    }
    for stage in ("rl", "sft", "rm"):
        Terminal(10, 0, stage, False).log(1, step)
    rl, sft, rm = capsys.readouterr().out.splitlines()
    assert rl == "step     1  reward 0.500  acc 0.250  s/step 1.00"
    assert sft == "step     1  loss 0.6930  s/step 1.00"
    assert rm == "step     1  loss 0.6930  acc 0.750  s/step 1.00"


def test_the_terminal_prints_plain_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    sink = Terminal(10, 0, "sft", True, every=2)
    for step in (1, 2, 3):
        sink.log(step, {"loss/total": 1.0 / step})
    sink.log(4, {"eval/loss": 0.5})  # an eval is shown whatever the step
    sink.close()
    out = capsys.readouterr().out
    assert out.splitlines() == ["step     2  loss 0.5000", "step     4  eval_loss 0.5000"]


def test_a_reader_that_goes_away_ends_the_lines_not_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    os.close(read)  # `| head` has exited
    with open(write, "w") as closed:
        monkeypatch.setattr("sys.stdout", closed)
        terminal = Terminal(0)
        terminal.say("step 1")  # a broken pipe, but no exception
        assert terminal.gone
        terminal.say("step 2")
        assert say("done")  # the stream now writes to /dev/null: the final flush cannot fail


def test_events_read_as_sentences() -> None:
    guard = describe_event(
        "guard",
        7,
        {"rule": "unscored_episodes", "severity": "critical", "action": "stop", "evidence": {"frac": 0.9},
         "message": "90% of episodes have no reward.", "suggestion": "Check the verifier."},
    )  # fmt: skip
    assert guard == (
        "step 7 guard (unscored_episodes): 90% of episodes have no reward. (severity critical, action stop) "
        "What to do: Check the verifier."
    )
    plain = describe_event("score_errors", 3, {"count": 2, "first": "boom", "ratio": 0.123456})
    assert plain == "step 3 score errors: count 2, first boom, ratio 0.1235"
    rollback = describe_event(
        "rollback", 5, {"to_step": 4, "skipped_problems_from": {"cursor": 9}, "lr_scale": 0.5}
    )
    assert rollback == "step 5 rollback: to step 4, lr scale 0.5"


def test_a_presets_task_params_stay_with_its_task() -> None:
    assert load_config(SMOKE, ["task.name=multiply"]).task.params == {}
    assert load_config(SMOKE, ["task.name=countdown"]).task.params["max_number"] == 20  # the same task
    renamed = load_config(SMOKE, ["task.name=multiply", "task.params.max_digits=2"])
    assert renamed.task.params == {"max_digits": 2}


@pytest.mark.parametrize(
    ("setting", "module", "extra_spec"),
    [
        ("log.wandb=true", "wandb", "wandb>=0.17"),
        ("model.lora.rank=4", "peft", "peft>=0.10"),
        ("rollout.engine=vllm", "vllm", "vllm>=0.10.2"),
        ("distributed.scorer=ray", "ray", "ray>=2.9"),
        ("task.name=reasoning_gym:leg_counting", "reasoning_gym", "reasoning-gym>=0.1.25"),
    ],
)
def test_a_missing_optional_package_fails_on_load_with_its_pip_install(
    monkeypatch: pytest.MonkeyPatch, setting: str, module: str, extra_spec: str
) -> None:
    monkeypatch.setitem(__import__("sys").modules, module, None)  # as if not installed
    assert importlib.util.find_spec(module) is None
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, [setting])
    assert setting.split("=")[0] in str(err.value) and f"pip install '{extra_spec}'" in str(err.value)


def test_local_model_paths() -> None:
    assert local_path("./m") and local_path("/m") and local_path("~/m") and local_path("m.gguf")
    assert local_path("runs/x/final") and not local_path("Qwen/Qwen2.5-0.5B") and not local_path("gpt2")


def test_train_checks_its_inputs_first(tmp_path: Path) -> None:
    for path in (str(tmp_path / "nothing"), "runs/nothing/final"):
        with pytest.raises(ConfigError, match=f"model.path = '{path}' does not exist"):
            check_run(load_config(SMOKE, [f"model.path={path}"]))
    with pytest.raises(TaskError, match=r"'user_tasks:NeedsLevel' could not be built.*TypeError.*'level'"):
        check_run(load_config(SMOKE, ["task.name=user_tasks:NeedsLevel"]))
    with pytest.raises(
        TaskError, match=r"task.name = 'user_tasks:NoTestSplit' has no test problem: the test split"
    ):
        check_run(load_config(SMOKE, ["task.name=user_tasks:NoTestSplit"]))
    with pytest.raises(TaskError, match="does not exist"):
        check_run(load_config(SMOKE, [f"task.name=dir:{tmp_path / 'no_tasks'}"]))


def _pairs(path: Path, n: int, same_every: int = 0) -> Path:
    with path.open("w") as f:
        for i in range(n):
            same = same_every and i % same_every == 0
            f.write(
                json.dumps({"prompt": f"q{i}", "chosen": f"a{i}", "rejected": f"a{i}" if same else f"b{i}"})
                + "\n"
            )
    return path


def test_a_reward_model_needs_enough_distinct_pairs(tmp_path: Path) -> None:
    from keelrl.stages.sft.data import MIN_HELD_OUT_PAIRS, read_pairs

    rm = ["train.stage=rm", "data.eval_fraction=0.1"]
    with pytest.raises(DataError, match=r"14 preference pairs leave \d+ to train on and \d held out"):
        check_run(load_config(SMOKE, [*rm, f"data.path={_pairs(tmp_path / 'few.jsonl', 14)}"]))
    cfg = load_config(SMOKE, [*rm, f"data.path={_pairs(tmp_path / 'ties.jsonl', 600, same_every=4)}"])
    train, held_out, identical = read_pairs(cfg.data, cfg.task.seed)
    assert identical == 150 and len(train) + len(held_out) == 450 and len(held_out) >= MIN_HELD_OUT_PAIRS
    assert all(r["chosen"] != r["rejected"] for r in train + held_out)
    with pytest.raises(DataError, match=r"600 preference pairs \(600 with the same text chosen and rejected"):
        check_run(load_config(SMOKE, [*rm, f"data.path={_pairs(tmp_path / 'all.jsonl', 600, 1)}"]))


def test_a_ladder_refuses_a_grid_it_could_not_fit_before_running_it(tmp_path: Path) -> None:
    from keelrl.ladder.runner import run_ladder

    out = tmp_path / "ladder"
    # the smoke config evaluates at steps 0, 2 and 4: three points, and ScaleRL's curve needs four
    with pytest.raises(ConfigError, match=r"evaluates at steps \[0, 2, 4\].*eval.every_steps to at most 1"):
        run_ladder(SMOKE, ["eval.at_start=true"], out, axes=["algo.lr=1e-3,3e-3"], say=lambda _: None)
    with pytest.raises(ConfigError, match=r"model.path = '/nowhere/base' does not exist"):
        run_ladder(SMOKE, ["eval.at_start=true", "eval.every_steps=1"], out,
                   axes=["model.path=tiny,/nowhere/base"], say=lambda _: None)  # fmt: skip
    assert not out.exists(), "nothing ran"


def test_on_a_terminal_the_bar_is_as_wide_as_it_and_step_lines_stay_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    step = {"reward/mean": 0.5, "accuracy": 0.25, "format_rate": 1.0, "entropy": 1.0, "grad_norm": 0.1}
    for columns in (60, 150):
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.setenv("FORCE_COLOR", "1")  # rich then draws as on a terminal
        terminal = Terminal(10, 0, "rl", True)
        assert terminal.progress is not None
        terminal.log(3, step)
        terminal.close()
        out = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", capsys.readouterr().out)
        bars = [line for line in re.split("[\r\n]", out) if "━" in line]
        assert bars and columns - 12 <= max(map(len, bars)) <= columns, (columns, bars)
        assert (
            "step     3  reward 0.500  acc 0.250  fmt 1.00  ent 1.000  gn 0.100" in out
        )  # not cut at the width
