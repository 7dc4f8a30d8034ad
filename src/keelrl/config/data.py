"""The [data] section: what supervised fine-tuning (`keelrl sft`, `train.stage = "sft"`) trains on and how its
examples are batched. The loss normalisation is `algo.loss_agg`, the optimizer `algo.lr` and its schedule,
the same fields RL uses."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from keelrl.config.base import Section


class DataConfig(Section):
    path: str = Field(
        "",
        description=(
            'The training examples: a JSONL or JSON file (one record per line or a list: {"messages": [...]} '
            'chat turns, or {"prompt": ..., "completion": ...}, each a string or a message list), a Parquet, '
            "Arrow or CSV file, a folder of data files or one written by datasets' save_to_disk (its train "
            "split), or a keelrl run directory (its "
            "logged rollouts that were scored correct: rejection-sampling fine-tuning)."
        ),
    )
    eval_path: str = Field(
        "",
        description="Held-out examples for eval/loss, in the same formats ('' = data.eval_fraction of path).",
    )
    eval_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description=(
            "Share of data.path held out for eval/loss when eval_path is empty, chosen by a stable hash of each "
            "example's index and task.seed (the same examples on every run and resume)."
        ),
    )
    eval_examples: int = Field(
        512, ge=1, description="Held-out examples scored per eval (the first ones, in file order)."
    )
    batch_size: int = Field(
        32,
        ge=1,
        description=(
            "Examples per optimizer step, over all ranks. Step s takes examples s*batch_size .. of an order "
            "shuffled once per epoch, so the data position is the step alone (exact resume)."
        ),
    )
    max_length: int = Field(
        1024, ge=2, description="Longest example in tokens (prompt and answer); see data.too_long."
    )
    too_long: Literal["drop", "truncate", "error"] = Field(
        "drop",
        description=(
            "An example over data.max_length: drop it (counted and reported once), truncate it (its answer then "
            "ends without the stop token), or stop with an error."
        ),
    )
    packing: bool = Field(
        False,
        description=(
            "Pack a step's examples into rows of data.max_length tokens. Each example attends only to itself "
            "(block-diagonal attention, positions restarting at 0), so the loss is that of the unpacked batch; "
            "packing saves the padding's compute when lengths vary."
        ),
    )
    shuffle: bool = Field(
        True, description="Shuffle the examples each epoch (from train.seed and the epoch)."
    )
    task_eval: bool = Field(
        True,
        description=(
            "At each eval also sample the task's held-out problems (task.name, eval.problems) and report their "
            "accuracy; off for data unrelated to the task."
        ),
    )
