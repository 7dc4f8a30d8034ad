"""Which config changes a resume refuses (setup.unsafe_changes)."""

from __future__ import annotations

import copy

from keelrl.config import Config, config_to_dict
from keelrl.loop.setup import unsafe_changes


def test_a_changed_learning_rate_is_refused_and_a_longer_run_is_not() -> None:
    old = config_to_dict(Config())
    new = copy.deepcopy(old)
    new["algo"]["lr"] = old["algo"]["lr"] * 2
    new["train"]["steps"] = old["train"]["steps"] + 100
    new["checkpoint"]["keep_last"] = 7
    assert unsafe_changes(old, new) == ["algo.lr"]


def test_a_field_added_since_the_checkpoint_is_no_change_while_it_keeps_its_default() -> None:
    new = config_to_dict(Config())
    old = copy.deepcopy(new)
    del old["faults"]["disk_full_at_step"]  # a checkpoint written before the field existed
    assert unsafe_changes(old, new) == []
    new["faults"]["disk_full_at_step"] = 4
    assert unsafe_changes(old, new) == ["faults.disk_full_at_step"]


def test_task_params_are_compared_key_by_key() -> None:
    old = config_to_dict(Config())
    old["task"]["params"] = {"max_numbers": 3}
    new = copy.deepcopy(old)
    new["task"]["params"] = {}
    assert unsafe_changes(old, new) == ["task.params.max_numbers"]
