"""The registry: task name -> its self-play proposer."""

from __future__ import annotations

from keelrl.stages.selfplay.base import Proposer
from keelrl.stages.selfplay.code import CodeProposer
from keelrl.stages.selfplay.countdown import CountdownProposer

PROPOSERS: dict[str, Proposer] = {"countdown": CountdownProposer(), "code": CodeProposer()}
