"""The vLLM engine process: `python -m keelrl.rollout.vllm_server FD` (started by `VLLMSampler`, never by
hand). It holds one in-process `vllm.LLM` and answers the sampler over the socket it inherited as FD.

Why a process of its own: vLLM pins its threads for the whole process it runs in (on CPU `torch.set_num_threads`
becomes a no-op and it wants OMP_NUM_THREADS=1), and a crashed or hung engine must be killable without
killing the trainer. The engine dies with its parent (PR_SET_PDEATHSIG) and is restarted by it.

Messages (pickled tuples; every request gets one reply, `("error", text)` when it raised):
- ("generate", prompts, settings, seeds, stop_ids) -> ("progress",)* then ("done", [(ids, logprobs, finish)])
- ("load", path, layout, reset_prefix_cache) -> ("done", seconds): weights from the shared file, in place
- ("sleep",) / ("wake",) -> ("done", None): GPU sleep mode level 1 (weights offloaded) and back
- ("close",) -> ("done", None), then the process exits
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

PROGRESS_EVERY_S = 0.5  # how often a long generate reports that it is alive (the trainer's heartbeat)


def serve(conn: Connection, spec: dict[str, Any]) -> None:
    from vllm import LLM

    llm = LLM(
        model=spec["model_dir"],
        dtype=spec["dtype"],
        max_model_len=spec["max_model_len"] or None,
        seed=0,
        enforce_eager=spec["enforce_eager"],
        skip_tokenizer_init=True,  # token ids in, token ids out: nothing is re-tokenised
        load_format="dummy",  # the real weights are pushed before the first generate
        logprobs_mode="processed_logprobs",  # log softmax(logits / T): what the trainer computes
        block_size=spec["block_size"] or None,
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        enable_sleep_mode=spec["sleep_between_steps"],
    )
    conn.send(("ready", {"pid": os.getpid()}))
    handlers: dict[str, Callable[..., Any]] = {
        "generate": lambda *args: _generate(llm, conn, *args),
        "load": lambda *args: _load(llm, spec["tied_embeddings"], *args),
        "sleep": lambda: llm.sleep(level=1),
        "wake": lambda: llm.wake_up(),
        "close": lambda: None,
    }
    while True:
        kind, *args = conn.recv()
        try:
            if kind not in handlers:
                raise ValueError(f"unknown request {kind!r}")
            conn.send(("done", handlers[kind](*args)))
        except Exception:  # the request failed, the engine lives: the sampler raises the text
            conn.send(("error", traceback.format_exc()))
        if kind == "close":
            return


def _generate(
    llm: Any,
    conn: Connection,
    prompts: list[list[int]],
    settings: dict[str, Any],
    seeds: list[int],
    stop: list[int],
) -> list[tuple[list[int], list[float], str]]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    for i, (ids, seed) in enumerate(zip(prompts, seeds)):
        params = SamplingParams(
            max_tokens=settings["max_new_tokens"],
            temperature=settings["temperature"],
            top_p=settings["top_p"],
            top_k=settings["top_k"] or 0,
            seed=int(seed) % (2**63),
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=stop,
            detokenize=False,
        )
        engine.add_request(str(i), {"prompt_token_ids": list(ids)}, params)
    results: dict[int, tuple[list[int], list[float], str]] = {}
    last = time.monotonic()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                c = out.outputs[0]
                ids = list(c.token_ids)
                logps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids)]
                finish = "length" if c.finish_reason == "length" else "eos"
                results[int(out.request_id)] = (ids, logps, finish)
        if time.monotonic() - last > PROGRESS_EVERY_S:
            conn.send(("progress",))
            last = time.monotonic()
    return [results[i] for i in range(len(prompts))]


def _load(llm: Any, tied: bool, path: str, layout: list[Any], reset_prefix_cache: bool) -> float:
    """Reload the weights in place from views of the file the sampler wrote (`SharedWeights`), through the
    checkpoint-format path, which also works where vLLM repacks weights for its kernels, as on CPU. A model
    with tied embeddings gets the embedding as its head too: the file holds it once, and the engine's head
    would otherwise keep its old values."""
    import mmap

    import torch

    t0 = time.perf_counter()
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: reads share the pages
    buf = torch.frombuffer(mapped, dtype=torch.uint8)
    weights: dict[str, torch.Tensor] = {}
    for name, dtype, shape, start in layout:
        dt = getattr(torch, dtype)
        n = dt.itemsize * int(torch.Size(shape).numel())
        weights[name] = buf[start : start + n].view(dt).view(shape)
    if tied and "lm_head.weight" not in weights:
        embed = [k for k in weights if k.endswith("embed_tokens.weight")]
        if embed:
            weights["lm_head.weight"] = weights[embed[0]]
    llm.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": list(weights.items()), "is_checkpoint_format": True}
    )
    if reset_prefix_cache:
        llm.reset_prefix_cache()  # vLLM keeps KV computed with the old weights otherwise
    return time.perf_counter() - t0  # the mapping goes with the last view of it


def main() -> None:
    import json

    from keelrl.core.procs import die_with_parent

    die_with_parent()
    conn = Connection(int(sys.argv[1]))
    spec = json.loads(os.environ["KEELRL_ENGINE_SPEC"])
    try:
        serve(conn, spec)
    except (EOFError, ConnectionError):  # the sampler went away: nothing to answer
        pass
    except Exception:
        conn.send(("error", traceback.format_exc()))
        raise


if __name__ == "__main__":
    main()
