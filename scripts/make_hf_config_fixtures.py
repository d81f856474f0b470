#!/usr/bin/python3
"""Real Hugging Face config.json files, written by transformers itself, for the C++ config tests.

For each model below, builds the transformers config class (LlamaConfig, Qwen2Config,
Qwen3Config, MistralConfig) from the model's public hyper-parameters (the keys of its config.json
on the Hugging Face Hub, full sizes) and writes `XConfig(...).save_pretrained(dir)`'s config.json
to tests/fixtures/hf_configs/<name>_v<major>.json, where <major> is the major version of the
transformers that runs the script. Run it once with transformers 4 and once with transformers 5
to get the twins (same model, v4 layout: top-level `rope_theta` + `rope_scaling`; v5 layout:
`rope_parameters`), which the C++ tests load and compare (tests/test_model_config.cpp).

Models (hyper-parameters as published on the Hub):
  llama2_7b        meta-llama/Llama-2-7b-hf           (no rope_theta on the Hub: default 10000)
  llama3_2_1b      meta-llama/Llama-3.2-1B            (llama3 rope scaling, factor 32, tied)
  llama3_1_8b      meta-llama/Llama-3.1-8B            (llama3 rope scaling, factor 8)
  qwen2_5_0_5b     Qwen/Qwen2.5-0.5B                  (q/k/v bias, inactive sliding window)
  qwen3_0_6b       Qwen/Qwen3-0.6B                    (explicit head_dim 128 != 1024/16)
  smollm2_135m     HuggingFaceTB/SmolLM2-135M         (nanotron extra keys)
  mistral_7b_v0_3  mistralai/Mistral-7B-v0.3          (sliding_window null)
  mistral_7b_v0_1  mistralai/Mistral-7B-v0.1          (sliding_window 4096 < 32768: refused)

Usage (from the repository root; no torch needed, configs only):
    python3 -m venv /work/venvs/cfg4 && /work/venvs/cfg4/bin/pip install 'transformers<5'
    python3 -m venv /work/venvs/cfg5 && /work/venvs/cfg5/bin/pip install 'transformers>=5'
    /work/venvs/cfg4/bin/python scripts/make_hf_config_fixtures.py [--out tests/fixtures/hf_configs]
    /work/venvs/cfg5/bin/python scripts/make_hf_config_fixtures.py [--out tests/fixtures/hf_configs]
The checked-in files were made with transformers 4.57.6 (v4) and 5.24.0 (v5).

With --llama3-inv-freq, instead prints transformers' own llama3 inverse frequencies
(`ROPE_INIT_FUNCTIONS["llama3"]`, i.e. `_compute_llama3_parameters`) for Llama-3.2-1B's rope
scaling at head_dim 64, for the reference values in tests/ops/test_rope.cpp. torch is not needed:
transformers' function runs on a small numpy stand-in for the three torch calls it makes
(arange, .to, where), in float64 (the values in the test) and float32 (as transformers does).
"""

import argparse
import json
import os
import sys
import tempfile

import transformers
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

LLAMA3_2_ROPE = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

LLAMA3_1_ROPE = dict(LLAMA3_2_ROPE, factor=8.0)

# name -> (config class, the model's config.json keys as on the Hub, minus transformers_version).
MODELS = {
    "llama2_7b": (LlamaConfig, {
        "_name_or_path": "meta-llama/Llama-2-7b-hf",
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 11008,
        "max_position_embeddings": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "use_cache": True,
        "vocab_size": 32000,
    }),
    "llama3_2_1b": (LlamaConfig, {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": LLAMA3_2_ROPE,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    }),
    "llama3_1_8b": (LlamaConfig, {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": LLAMA3_1_ROPE,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    }),
    "qwen2_5_0_5b": (Qwen2Config, {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }),
    "qwen3_0_6b": (Qwen3Config, {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }),
    "smollm2_135m": (LlamaConfig, {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": 576,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536,
        "is_llama_config": True,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_interleaved": False,
        "rope_scaling": None,
        "rope_theta": 100000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 49152,
    }),
    "mistral_7b_v0_3": (MistralConfig, {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 32768,
    }),
    "mistral_7b_v0_1": (MistralConfig, {
        "architectures": ["MistralForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 32000,
    }),
}


def write_fixtures(out: str) -> None:
    major = int(transformers.__version__.split(".")[0])
    os.makedirs(out, exist_ok=True)
    for name, (cls, keys) in MODELS.items():
        config = cls(**keys)
        with tempfile.TemporaryDirectory() as tmp:
            config.save_pretrained(tmp)
            with open(os.path.join(tmp, "config.json")) as f:
                text = f.read()
        json.loads(text)  # well-formed
        path = os.path.join(out, f"{name}_v{major}.json")
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path} (transformers {transformers.__version__})")


class _NumpyTorch:
    """The few torch functions that transformers' `_compute_default_rope_parameters` and
    `_compute_llama3_parameters` call, on numpy arrays, so that transformers' own code runs
    without torch. `dtype=torch.float` becomes `float_dtype` (float64 or float32)."""

    def __init__(self, float_dtype):
        import numpy as np

        class Tensor(np.ndarray):
            def to(self, device=None, dtype=None):
                return self.astype(dtype) if dtype is not None else self

        self._np, self._tensor = np, Tensor
        self.float = float_dtype
        self.int64 = np.int64

    def arange(self, start, end, step, dtype=None):
        return self._np.arange(start, end, step, dtype=dtype).view(self._tensor)

    def where(self, cond, a, b):
        return self._np.where(cond, a, b).view(self._tensor)


def print_llama3_inv_freq() -> None:
    """Runs transformers' `_compute_llama3_parameters` (ROPE_INIT_FUNCTIONS["llama3"]) for
    Llama-3.2-1B (head_dim 64, theta 5e5, factor 32, low 1, high 4, original 8192): with torch if
    it is installed (float32, as transformers computes), and on the numpy shim above in float64
    and float32."""
    import numpy as np
    from transformers import modeling_rope_utils as mru

    config = LlamaConfig(**MODELS["llama3_2_1b"][1])
    fn = mru.ROPE_INIT_FUNCTIONS["llama3"]
    print(f"transformers {transformers.__version__}, {fn.__module__}.{fn.__name__}")
    try:
        import torch  # noqa: F401

        inv, attention = fn(config, "cpu")
        print("torch float32:", json.dumps([float(x) for x in inv.tolist()]))
    except ImportError:
        print("torch not installed: numpy shim only")
    saved = getattr(mru, "torch", None)
    try:
        for name, dt in (("float64", np.float64), ("float32", np.float32)):
            mru.torch = _NumpyTorch(dt)
            inv, attention = fn(config, "cpu")
            print(f"shim {name} (attention_factor {attention}):")
            print(json.dumps([repr(float(x)) for x in np.asarray(inv)]))
    finally:
        if saved is not None:
            mru.torch = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "hf_configs"))
    ap.add_argument("--llama3-inv-freq", action="store_true")
    args = ap.parse_args()
    if args.llama3_inv_freq:
        print_llama3_inv_freq()
    else:
        write_fixtures(os.path.normpath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
