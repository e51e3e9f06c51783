"""A language model's decode-time problems, from a Hugging Face config.json or a built-in preset.

No torch and no weights: the dimensions alone say which GEMVs (and the softmax over the
vocabulary, and GELU where the model uses it) one decoded token costs, per layer and per step.
Architectures, and how their projections are laid out (as their Hugging Face modules hold them):

  llama, mistral, qwen2   q, k, v, o separate (grouped-query: k and v have num_key_value_heads *
                          head_dim rows); gate, up, down separate (SwiGLU)
  phi3                    qkv fused (one weight of (heads + 2 kv_heads) * head_dim rows), o;
                          gate_up fused (2 * intermediate rows), down
  gpt2                    c_attn fused qkv (3 * hidden rows), attn c_proj; c_fc, mlp c_proj, with
                          GELU between (gelu_new: the tanh form). Hugging Face's GPT-2 holds these
                          as Conv1D (weights in x out): the problems are those of an nn.Linear
                          layout (nanoGPT's), which autogen.torch.patch serves.

Every model: the LM head (vocab x hidden, tied or not) and the softmax over the vocabulary, in
float32 for bfloat16 and float32 models (the logits are upcast for sampling; softmax has no
bfloat16 kernel) and in float16 for float16 models. Weights in float16 or bfloat16 are hgemv
problems at each batch; float32 weights are sgemv problems, one token only (sgemv takes one vector).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autogen.core.problem import Problem
from autogen.core.registry import get_family
from autogen.errors import UsageError

MAX_CONFIG_BYTES = 1 << 20

# Published dimensions (the models' config.json files), nothing else.
PRESETS: dict[str, dict] = {
    "llama-3-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                   "hidden_act": "silu", "torch_dtype": "bfloat16"},
    "llama-2-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                   "hidden_act": "silu", "torch_dtype": "float16"},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                   "hidden_act": "silu", "torch_dtype": "bfloat16"},
    "qwen2-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                 "hidden_act": "silu", "torch_dtype": "bfloat16"},
    "phi-3-mini": {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                   "hidden_act": "silu", "torch_dtype": "bfloat16"},
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "vocab_size": 50257,
             "activation_function": "gelu_new"},
}
LLAMA_LIKE = ("llama", "mistral", "qwen2")
ARCHITECTURES = LLAMA_LIKE + ("phi3", "gpt2")
GELU_FORMS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide a model's decode-time problems."""

    name: str
    architecture: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    activation: str  # "silu" (gated MLP), or a GELU form: "tanh" or "none"
    dtype: str  # the config's torch_dtype where autogen serves it, else bfloat16

    def gemvs(self) -> list[tuple[str, int, int, int]]:
        """(role, rows, columns, times per step) of every weight a token multiplies."""
        h, q_rows, kv_rows = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = {
            "llama": [("q_proj", q_rows, h), ("k_proj", kv_rows, h), ("v_proj", kv_rows, h), ("o_proj", h, q_rows),
                      ("gate_proj", self.intermediate, h), ("up_proj", self.intermediate, h),
                      ("down_proj", h, self.intermediate)],
            "phi3": [("qkv_proj (fused)", q_rows + 2 * kv_rows, h), ("o_proj", h, q_rows),
                     ("gate_up_proj (fused)", 2 * self.intermediate, h), ("down_proj", h, self.intermediate)],
            "gpt2": [("c_attn (fused qkv)", 3 * h, h), ("attn.c_proj", h, h), ("c_fc", self.intermediate, h),
                     ("mlp.c_proj", h, self.intermediate)],
        }["llama" if self.architecture in LLAMA_LIKE else self.architecture]
        return [(role, rows, cols, self.layers) for role, rows, cols in per_layer] + [("lm_head", self.vocab, h, 1)]


def load_model(source: str) -> ModelShape:
    """A preset's name, a config.json file, or a folder holding one; UsageError (one line) otherwise."""
    if source in PRESETS:
        return model_from_config(PRESETS[source], source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise UsageError(f"{source!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    return model_from_config(_read_json(path), str(path))


def _read_json(path: Path) -> dict:
    # A regular file of bounded size: a FIFO or /dev/zero is refused, never waited on or read without end.
    try:
        if not path.is_file():
            raise UsageError(f"{path} is not a regular file; give a config.json")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UsageError(f"{path} is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a model config")
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} holds a JSON {type(config).__name__}, not a model config object")
    return config


def model_from_config(config: dict, name: str) -> ModelShape:
    """The ModelShape a Hugging Face config describes."""
    architecture = config.get("model_type")
    if architecture not in ARCHITECTURES:
        raise UsageError(f"{name}: model_type {architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}")

    def number(key: str, default: object = None) -> int:
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{name}: {key} must be a positive integer, got {value!r}")
        return value

    torch_dtype = config.get("torch_dtype", config.get("dtype"))
    dtype = torch_dtype if torch_dtype in DTYPES else "bfloat16"
    if architecture == "gpt2":
        hidden, heads = number("n_embd"), number("n_head")
        form = config.get("activation_function", "gelu_new")
        if form not in GELU_FORMS:
            raise UsageError(f"{name}: activation_function {form!r} is not a GELU autogen serves "
                             f"({', '.join(GELU_FORMS)})")
        inner = config.get("n_inner")
        return ModelShape(name, architecture, hidden, 4 * hidden if inner is None else number("n_inner"),
                          number("n_layer"), heads, heads, _head_dim(name, hidden, heads), number("vocab_size"),
                          GELU_FORMS[form], dtype)
    hidden, heads = number("hidden_size"), number("num_attention_heads")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UsageError(f"{name}: hidden_act {act!r}: a {architecture} model with a gated SiLU MLP is expected")
    kv_heads = number("num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
    if heads % kv_heads:
        raise UsageError(f"{name}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = number("head_dim") if config.get("head_dim") is not None else _head_dim(name, hidden, heads)
    return ModelShape(name, architecture, hidden, number("intermediate_size"), number("num_hidden_layers"), heads,
                      kv_heads, head_dim, number("vocab_size"), "silu", dtype)


def _head_dim(name: str, hidden: int, heads: int) -> int:
    if hidden % heads:
        raise UsageError(f"{name}: hidden size {hidden} is not a multiple of {heads} heads (and no head_dim is given)")
    return hidden // heads


@dataclass(frozen=True)
class StepItem:
    """One role of one decode step: which problem serves it, how many times a step runs it."""

    batch: int
    role: str
    problem: Problem
    count: int


@dataclass(frozen=True)
class DecodePlan:
    model: ModelShape
    dtype: str
    batches: tuple[int, ...]
    items: tuple[StepItem, ...]
    notes: tuple[str, ...]

    @property
    def problems(self) -> list[Problem]:
        """Each problem once, in the order the steps first need them."""
        return list(dict.fromkeys(item.problem for item in self.items))

    def roles(self, problem: Problem) -> list[str]:
        return list(dict.fromkeys(item.role for item in self.items if item.problem == problem))

    def per_step(self, problem: Problem) -> int:
        return sum(item.count for item in self.items if item.problem == problem)


def decode_plan(model: ModelShape, batches, dtype: str | None = None) -> DecodePlan:
    """Every problem one decoded token (per sequence of a batch) costs, at each batch size."""
    dtype = dtype or model.dtype
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    batches = tuple(dict.fromkeys(batches))
    if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batches):
        raise UsageError(f"--batch takes positive token counts, got {batches!r}")
    items, notes = [], []
    for batch in batches:
        items += _step(model, batch, dtype, notes)
    return DecodePlan(model, dtype, batches, tuple(items), tuple(dict.fromkeys(notes)))


def _step(model: ModelShape, batch: int, dtype: str, notes: list[str]) -> list[StepItem]:
    items = []
    if dtype == "float32" and batch > 1:
        notes.append(f"float32 weights: sgemv takes one vector, so batch {batch}'s GEMVs are left to PyTorch")
    else:
        for role, rows, cols, count in model.gemvs():
            problem = (get_family("sgemv").problem("float32", m=rows, n=cols) if dtype == "float32"
                       else get_family("hgemv").problem(dtype, m=rows, n=cols, batch=batch))
            items.append(StepItem(batch, role, problem, count))
    if model.activation != "silu":
        gelu = get_family("gelu").problem(dtype, n=batch * model.intermediate, approximate=model.activation)
        items.append(StepItem(batch, "mlp gelu", gelu, model.layers))
    softmax_dtype = "float16" if dtype == "float16" else "float32"
    items.append(StepItem(batch, "softmax over the vocabulary",
                          get_family("softmax").problem(softmax_dtype, rows=batch, cols=model.vocab), 1))
    return items
