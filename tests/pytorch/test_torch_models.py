"""tune-model without a GPU and without torch: configs, presets, the problems a decode step needs,
the table and the HTML page from given numbers, and the command's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autogen.errors import UsageError
from autogen.torch.models import PRESETS, decode_plan, load_model, model_from_config
from autogen.torch.report import model_report_html, model_rows, model_table, step_estimates

ROOT = Path(__file__).resolve().parents[2]

LLAMA_3_8B_CONFIG = {  # Meta-Llama-3-8B's config.json, the keys that matter and a few that do not
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "hidden_act": "silu", "torch_dtype": "bfloat16", "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
    "max_position_embeddings": 8192, "tie_word_embeddings": False,
}


def shapes(plan, batch=None):
    return {(str(item.problem), item.role, item.count) for item in plan.items if batch in (None, item.batch)}


def test_llama_3_8b_config_file_gives_grouped_query_problems(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_3_8B_CONFIG))
    for source in (str(path), str(tmp_path)):  # the file, or its folder
        plan = decode_plan(load_model(source), [1])
        assert shapes(plan) == {
            ("hgemv bfloat16 m=4096,n=4096,batch=1", "q_proj", 32), ("hgemv bfloat16 m=1024,n=4096,batch=1", "k_proj", 32),
            ("hgemv bfloat16 m=1024,n=4096,batch=1", "v_proj", 32), ("hgemv bfloat16 m=4096,n=4096,batch=1", "o_proj", 32),
            ("hgemv bfloat16 m=14336,n=4096,batch=1", "gate_proj", 32),
            ("hgemv bfloat16 m=14336,n=4096,batch=1", "up_proj", 32),
            ("hgemv bfloat16 m=4096,n=14336,batch=1", "down_proj", 32),
            ("hgemv bfloat16 m=128256,n=4096,batch=1", "lm_head", 1),
            ("softmax float32 rows=1,cols=128256", "softmax over the vocabulary", 1)}
    assert load_model("llama-3-8b") == model_from_config(LLAMA_3_8B_CONFIG, "llama-3-8b")


def test_problems_are_deduplicated_with_their_roles_and_counts():
    plan = decode_plan(load_model("llama-3-8b"), [1, 2, 4, 8])
    assert len(plan.items) == 36 and len(plan.problems) == 24  # 6 problems per batch
    q = next(p for p in plan.problems if str(p) == "hgemv bfloat16 m=4096,n=4096,batch=4")
    assert plan.roles(q) == ["q_proj", "o_proj"] and plan.per_step(q) == 64
    assert [p.family for p in plan.problems].count("softmax") == 4


def test_mistral_qwen2_and_an_explicit_head_dim():
    mistral = load_model("mistral-7b")
    assert (mistral.kv_heads, mistral.head_dim, mistral.vocab) == (8, 128, 32000)
    qwen = decode_plan(load_model("qwen2-7b"), [2])
    assert ("hgemv bfloat16 m=512,n=3584,batch=2", "k_proj", 28) in shapes(qwen)
    assert ("hgemv bfloat16 m=18944,n=3584,batch=2", "up_proj", 28) in shapes(qwen)
    config = {**PRESETS["mistral-7b"], "head_dim": 64, "num_key_value_heads": None}
    model = model_from_config(config, "custom")
    assert (model.head_dim, model.kv_heads) == (64, 32)
    assert ("hgemv bfloat16 m=2048,n=4096,batch=1", "q_proj", 32) in shapes(decode_plan(model, [1]))


def test_fused_projections_phi3_and_gpt2_with_gelu():
    phi3 = decode_plan(load_model("phi-3-mini"), [1], "float16")
    assert ("hgemv float16 m=9216,n=3072,batch=1", "qkv_proj (fused)", 32) in shapes(phi3)
    assert ("hgemv float16 m=16384,n=3072,batch=1", "gate_up_proj (fused)", 32) in shapes(phi3)
    assert ("softmax float16 rows=1,cols=32064", "softmax over the vocabulary", 1) in shapes(phi3)
    gpt2 = decode_plan(load_model("gpt2"), [4])
    assert shapes(gpt2) == {
        ("hgemv bfloat16 m=2304,n=768,batch=4", "c_attn (fused qkv)", 12),
        ("hgemv bfloat16 m=768,n=768,batch=4", "attn.c_proj", 12), ("hgemv bfloat16 m=3072,n=768,batch=4", "c_fc", 12),
        ("hgemv bfloat16 m=768,n=3072,batch=4", "mlp.c_proj", 12),
        ("hgemv bfloat16 m=50257,n=768,batch=4", "lm_head", 1),
        ("gelu bfloat16 n=12288,approximate=tanh", "mlp gelu", 12),
        ("softmax float32 rows=4,cols=50257", "softmax over the vocabulary", 1)}
    erf = model_from_config({**PRESETS["gpt2"], "activation_function": "gelu", "n_inner": 1024}, "gpt2-erf")
    assert ("gelu bfloat16 n=1024,approximate=none", "mlp gelu", 12) in shapes(decode_plan(erf, [1]))


def test_float32_weights_are_sgemv_at_one_token_only():
    plan = decode_plan(load_model("gpt2"), [1, 2], "float32")
    assert {p.family for p in plan.problems if p.family not in ("gelu", "softmax")} == {"sgemv"}
    assert not [i for i in plan.items if i.batch == 2 and i.problem.family == "sgemv"]
    assert plan.notes and "batch 2" in plan.notes[0]


@pytest.mark.parametrize("config, message", [
    ({"model_type": "bert"}, "model_type 'bert' is not supported"),
    ({"model_type": "llama"}, "hidden_size must be a positive integer, got None"),
    ({**PRESETS["llama-3-8b"], "num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({**PRESETS["llama-3-8b"], "vocab_size": "big"}, "vocab_size must be a positive integer"),
    ({**PRESETS["llama-3-8b"], "hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({**PRESETS["llama-3-8b"], "num_key_value_heads": 5}, "not a multiple of num_key_value_heads 5"),
    ({**PRESETS["gpt2"], "activation_function": "relu"}, "activation_function 'relu'"),
])
def test_bad_configs_are_one_line_usage_errors(config, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_from_config(config, "x")


def test_bad_files_are_refused_without_waiting(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "big.json").write_bytes(b" " * ((1 << 20) + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for name, message in (("list.json", "holds a JSON list"), ("broken.json", "is not valid JSON"),
                          ("big.json", "larger than 1 MiB"), ("fifo", "not a regular file"),
                          ("missing.json", "neither a preset")):
        with pytest.raises(UsageError, match=message):
            load_model(str(tmp_path / name))
    with pytest.raises(UsageError, match="--batch"):
        decode_plan(load_model("gpt2"), [0])


def documents_for(plan, speedup=1.25):
    """Tune summaries as autogen.report.tune_summary shapes them, with made-up times."""
    documents = []
    for index, problem in enumerate(plan.problems):
        time = 10.0 + index
        documents.append({"gpu": "Test GPU", "winner": {
            "kernel": f"{problem.family}_k{index}", "time_us": time, "peer_time_us": time * speedup,
            "peer": "torch", "speedup_vs_peer": speedup, "pct_of_floor": 90.0}})
    return documents


def test_table_and_step_estimate_from_given_numbers():
    plan = decode_plan(load_model("gpt2"), [1, 4])
    documents = documents_for(plan)
    documents[-1] = {"gpu": "Test GPU", "winner": None, "no_winner": "no variant passed validation"}
    rows = model_rows(plan, documents)
    steps = step_estimates(plan, rows)
    batch1 = [i for i in plan.items if i.batch == 1]
    expected = sum(i.count * (10.0 + plan.problems.index(i.problem)) for i in batch1)
    assert steps[0]["autogen_us"] == pytest.approx(expected) and steps[0]["speedup"] == pytest.approx(1.25)
    assert steps[0]["launches"] == 12 * 5 + 2
    assert steps[1]["autogen_us"] is None and steps[1]["speedup"] is None  # the last problem has no winner
    text = model_table(plan, rows, steps)
    assert text.splitlines()[0].split() == ["problem", "roles", "per", "step", "kernel", "time", "us", "PyTorch",
                                            "us", "speedup", "%", "of", "floor"]
    assert "c_attn (fused qkv)" in text and "1.250x" in text and "none (no variant passed validation)" in text
    assert "batch 1: autogen" in text and "batch 4: autogen - us" in text


def test_html_report_is_self_contained():
    plan = decode_plan(load_model("llama-3-8b"), [1, 4])
    documents = documents_for(plan, speedup=0.8)
    documents[0]["winner"]["speedup_vs_peer"] = 1.3
    rows = model_rows(plan, documents)
    page = model_report_html(plan, rows, step_estimates(plan, rows), "Test <GPU>")
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 3
    assert "<script" not in page and "src=" not in page and "href=" not in page and "@import" not in page
    assert "Test &lt;GPU&gt;" in page and 'class="win"' in page and 'class="loss"' in page
    assert page.count('class="floor"') == len(rows)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "autogen", "tune-model", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, message", [
    (("no-such-model",), "neither a preset"),
    (("llama-3-8b", "--batch", "0"), "--batch"),
    (("llama-3-8b", "--dtype", "int8"), "invalid choice"),
    (("llama-3-8b", "--report", "/nonexistent-folder/r.html"), "does not exist"),
])
def test_cli_usage_errors_are_one_line_exit_2(args, message, tmp_path):
    done = run_cli(*args, "--db", str(tmp_path / "t.db"))
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_cli_without_a_gpu_says_so_in_one_line(tmp_path):
    from conftest import gpu_unavailable_reason
    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present: the command would tune")
    done = run_cli("gpt2", "--batch", "1", "--db", str(tmp_path / "t.db"), env={"AUTOGEN_NO_PRESTART": "1"})
    assert done.returncode == 1 and done.stderr.startswith("autogen: error:")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr and not done.stdout
