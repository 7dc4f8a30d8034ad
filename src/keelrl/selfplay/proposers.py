"""The registry: task name -> its self-play proposer."""

from __future__ import annotations

from keelrl.selfplay.base import Proposer
from keelrl.selfplay.code import CodeProposer
from keelrl.selfplay.countdown import CountdownProposer

PROPOSERS: dict[str, Proposer] = {"countdown": CountdownProposer(), "code": CodeProposer()}
