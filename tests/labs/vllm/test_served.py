"""Measuring a server that is already running: what it serves decides what is predicted, the
token ids it is sent, and how its engine is labelled (labs/backends/vllm/served.py)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from labs.backends.vllm import backend as vllm_backend
from labs.backends.vllm.backend import VLLMBackend, where_label
from labs.backends.vllm.served import NOT_IN_CATALOG, catalog_match, read_served_model
from labs.backends.vllm.server import MODELS_DIR
from labs.parameters.catalog import LAB_MODEL_SHAPES
from labs.parameters.params import parse_lab_params
from labs.prediction.predict import lab_prediction, predict

SMALL = ("--num-prompts", "4", "--prompt-tokens", "64", "--output-tokens", "8")
SMALL += ("--max-tokens", "16", "--seed", "5")
# A model the catalog does not have, with a vocabulary far below the 32,000 ids drawn by default.
MYSTERY = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 3,
    "hidden_size": 192,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "vocab_size": 3000,
    "max_position_embeddings": 2048,
}


def model_dir(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def lab_llama_20m_config() -> dict[str, Any]:
    """config.json as `lab make-model lab-llama-20m` writes it (the facts that matter)."""
    shape = LAB_MODEL_SHAPES["lab-llama-20m"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": shape.layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_context,
    }


def lab_run(*options: str) -> str:
    out = io.StringIO()
    call_command("lab", "run", "--backend", "vllm", *options, stdout=out)
    return out.getvalue()


def test_a_model_not_in_the_catalog_gets_no_prediction_and_ids_within_its_vocabulary(
    fake_server: Any, tmp_path: Path
) -> None:
    root = model_dir(tmp_path, "mystery", MYSTERY)
    server = fake_server(
        {"model": "mystery", "root": str(root), "vocab_size": 3000, "ttft_ms": 5, "itl_ms": [2]}
    )
    result = json.loads(lab_run("--base-url", server.base_url, "--json", *SMALL))

    assert result["predicted"] is None and result["breakdown"] is None
    assert result["predicted_for"] is None
    assert result["no_prediction"].startswith(NOT_IN_CATALOG)
    assert "'mystery'" in result["no_prediction"]
    # The stand-in refuses ids at or above 3,000, as vLLM does: every request was served, so
    # every id was drawn within the served model's vocabulary (not the default 1,000-32,000).
    assert (result["measured"]["completed"], result["measured"]["failed"]) == (4, 0)
    assert len(server.measured_log()) == 4


def test_the_table_shows_the_reason_and_no_predicted_column(
    fake_server: Any, tmp_path: Path
) -> None:
    root = model_dir(tmp_path, "mystery", MYSTERY)
    server = fake_server({"model": "mystery", "root": str(root), "vocab_size": 3000})
    default_model = predict(parse_lab_params({"model": "llama-3-8b"}))
    text = lab_run("--base-url", server.base_url, *SMALL)

    lines = text.splitlines()
    assert lines[1].startswith(NOT_IN_CATALOG)
    assert not any("predicted" in line for line in lines)
    # A whole figure, not the tail of a longer one (a measured 64.84 ms holds "4.84 ms").
    default_tpot = re.escape(f"{default_model.tpot_s * 1000:,.2f} ms")
    assert not re.search(rf"(?<![\d.,]){default_tpot}", text)
    assert "where the time went" not in text


@pytest.mark.django_db  # the prediction looks up the device's stored calibration
def test_a_served_catalog_model_is_predicted_for_itself_on_the_named_hardware(
    fake_server: Any, tmp_path: Path
) -> None:
    root = model_dir(tmp_path, "lab-llama-20m", lab_llama_20m_config())
    server = fake_server({"model": "lab", "root": str(root), "vocab_size": 32000})
    result = json.loads(
        lab_run("--base-url", server.base_url, "--json", "--gpu", "a100-80gb", *SMALL)
    )

    expected = parse_lab_params(
        {"model": "lab-llama-20m", "gpu": "a100-80gb", "num_prompts": 4, "prompt_tokens": 64}
        | {"output_tokens": 8, "max_tokens": 16, "seed": 5, "concurrency": 4}
    )
    assert result["no_prediction"] is None
    assert result["predicted_for"] == "lab-llama-20m on a100-80gb"
    assert result["predicted"] == json.loads(json.dumps(lab_prediction(expected)))


def test_naming_another_model_than_the_served_one_is_refused(
    fake_server: Any, tmp_path: Path
) -> None:
    root = model_dir(tmp_path, "lab-llama-20m", lab_llama_20m_config())
    server = fake_server({"model": "lab", "root": str(root)})
    with pytest.raises(CommandError, match="model must be lab-llama-20m .*got llama-3-8b"):
        lab_run("--base-url", server.base_url, "--model", "llama-3-8b", *SMALL)
    assert server.get("/fake/log") == {}


def test_a_served_name_alone_proves_nothing(fake_server: Any) -> None:
    # The card's root is not a folder here (a server on another machine): whatever its name,
    # the architecture is unknown, so nothing is predicted.
    server = fake_server({"model": "lab-llama-20m", "root": "/nowhere/lab-llama-20m"})
    served = read_served_model(server.base_url)
    assert (served.id, served.root, served.config, served.catalog_slug) == (
        "lab-llama-20m",
        "/nowhere/lab-llama-20m",
        None,
        None,
    )
    assert served.max_model_len == 32768
    assert served.why_no_prediction().startswith(NOT_IN_CATALOG)
    assert "not readable from here" in served.why_no_prediction()


@pytest.mark.parametrize("size", ["8b", "70b"])
def test_llama_3_1_is_told_from_llama_3_by_its_context_and_rope_scaling(size: str) -> None:
    def bundled(slug: str) -> dict[str, Any]:
        return json.loads((MODELS_DIR / slug / "config.json").read_text())

    assert catalog_match(bundled(f"llama-3.1-{size}")) == f"llama-3.1-{size}"
    assert catalog_match(bundled(f"llama-3-{size}")) == f"llama-3-{size}"
    # As transformers 5 writes it: the scaling inside rope_parameters, no rope_scaling key.
    newer = bundled(f"llama-3.1-{size}")
    scaling = newer.pop("rope_scaling")
    newer["rope_parameters"] = {**scaling, "rope_theta": newer.pop("rope_theta")}
    assert catalog_match(newer) == f"llama-3.1-{size}"
    # Llama 3.1's context without its scaling, or the scaling without the context: neither.
    assert catalog_match({**bundled(f"llama-3.1-{size}"), "rope_scaling": None}) is None
    assert catalog_match({**bundled(f"llama-3-{size}"), "max_position_embeddings": 131072}) is None


def test_a_long_llama_3_1_run_on_a_server_serving_it_keeps_its_prediction(
    fake_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alice: Any
) -> None:
    """A 16,000-token Llama 3.1 8B run on a server serving Llama 3.1 8B served the model
    chosen: it was once taken for Llama 3 8B (the same shape), said to be "not the
    llama-3.1-8b you chose", and shown with no prediction."""
    from labs.models import LabRun, RunState
    from labs.runs import execution
    from labs.runs.selectors import device_prediction, served_note
    from tests.labs.factories import make_run

    config = json.loads((MODELS_DIR / "llama-3.1-8b" / "config.json").read_text())
    root = model_dir(tmp_path, "llama-3.1-8b", config)
    server = fake_server(
        {"model": "lab", "root": str(root), "max_model_len": 131072, "ttft_ms": 5, "itl_ms": [1]}
    )
    monkeypatch.setenv("LABS_VLLM_BASE_URL", server.base_url)
    monkeypatch.setattr(vllm_backend, "gpu_name", lambda: None)
    params = parse_lab_params(
        {"model": "llama-3.1-8b", "gpu": "h100-sxm", "num_prompts": 2, "prompt_tokens": 16000,
         "output_tokens": 4, "max_tokens": 8}
    )  # fmt: skip
    predicted = json.loads(json.dumps(device_prediction(params)))
    run = make_run(alice, backend="vllm", params=params.as_dict(), predicted=predicted)
    assert execution.run_execute(run_id=run.pk, hostname="vllm@test") == RunState.DONE
    run = LabRun.objects.get(pk=run.pk)
    assert run.result["meta"]["served_model"]["catalog_model"] == "llama-3.1-8b"
    assert run.predicted == predicted and "no_prediction" not in run.predicted
    assert served_note(run) == "The server served llama-3.1-8b (as 'lab'), the model you chose."


def test_catalog_match_needs_every_architecture_fact() -> None:
    config = lab_llama_20m_config()
    assert catalog_match(config) == "lab-llama-20m"
    assert catalog_match({**config, "vocab_size": 31999}) is None
    assert catalog_match({**config, "num_key_value_heads": 2}) is None
    # Alike in all but the MLP: another model, with other weights and time per token.
    assert catalog_match({**config, "intermediate_size": 4096}) is None
    config.pop("intermediate_size")
    assert catalog_match(config) is None
    assert catalog_match(MYSTERY) is None


def test_a_local_engine_this_worker_did_not_start_is_named_by_its_address() -> None:
    # Nothing says a server already running here uses the CPU (the CPU build's /version is
    # "0.32.0" like a GPU build's): its address, not a device.
    label = where_label("0.32.0", None, 1, "http://127.0.0.1:8000")
    assert label == "vLLM 0.32.0 at 127.0.0.1:8000 (already running on this machine)"
    assert "CPU" not in label
    # A remote server's device is not known from here; a worker's own server keeps its label.
    assert where_label("0.32.0", None, 1, "http://gpu-box:8000") == "vLLM 0.32.0 at gpu-box"
    assert where_label("0.33.0", None, 1, None) == "vLLM 0.33.0 on an unknown GPU"


def test_a_run_on_a_local_server_is_not_labelled_on_cpu(
    fake_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_backend, "gpu_name", lambda: None)  # no GPU on this machine
    root = model_dir(tmp_path, "lab-llama-20m", lab_llama_20m_config())
    server = fake_server({"model": "lab", "root": str(root), "version": "0.32.0"})
    params = parse_lab_params({"model": "lab-llama-20m", "num_prompts": 2, "prompt_tokens": 32})
    record = VLLMBackend(base_url=server.base_url, metrics_poll_s=0).run(params)
    assert record.where == (
        f"vLLM 0.32.0 at 127.0.0.1:{server.port} (already running on this machine)"
    )
    assert record.meta["served_model"] == {
        "id": "lab",
        "root": str(root),
        "max_model_len": 32768,
        "vocab_size": 32000,
        "catalog_model": "lab-llama-20m",
    }


def run_on_the_workers_server(
    owner: Any, server: Any, monkeypatch: pytest.MonkeyPatch, model: str
) -> Any:
    """A web run submitted for `model`, executed as a vLLM worker with LABS_VLLM_BASE_URL does."""
    from labs.models import LabRun, RunState
    from labs.runs import execution
    from labs.runs.selectors import device_prediction
    from tests.labs.factories import make_run

    monkeypatch.setenv("LABS_VLLM_BASE_URL", server.base_url)
    monkeypatch.setattr(vllm_backend, "gpu_name", lambda: None)
    params = parse_lab_params({"model": model, "num_prompts": 4, "prompt_tokens": 64})
    run = make_run(
        owner,
        backend="vllm",
        params=params.as_dict(),
        predicted=json.loads(json.dumps(device_prediction(params))),
    )
    assert execution.run_execute(run_id=run.pk, hostname="vllm@test") == RunState.DONE
    return LabRun.objects.get(pk=run.pk)


def test_a_web_run_stores_the_prediction_for_the_model_the_server_served(
    fake_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alice: Any, client: Any
) -> None:
    from labs.runs.selectors import device_prediction

    root = model_dir(tmp_path, "lab-llama-20m", lab_llama_20m_config())
    server = fake_server({"model": "lab", "root": str(root), "ttft_ms": 5, "itl_ms": [2]})
    run = run_on_the_workers_server(alice, server, monkeypatch, "qwen2.5-0.5b")

    served = parse_lab_params({"model": "lab-llama-20m", "num_prompts": 4, "prompt_tokens": 64})
    submitted = parse_lab_params({"model": "qwen2.5-0.5b", "num_prompts": 4, "prompt_tokens": 64})
    stored = {k: v for k, v in run.predicted.items() if k != "priced_with"}
    assert stored == json.loads(json.dumps(device_prediction(served)))
    assert stored != json.loads(json.dumps(device_prediction(submitted)))
    assert run.params["model"] == "qwen2.5-0.5b"  # what the learner asked for stays on record
    assert run.result["breakdown"]["source"] == "expected"

    client.force_login(alice)
    page = client.get(run.get_absolute_url())
    assert (
        "The server served lab-llama-20m (as &#x27;lab&#x27;), not the qwen2.5-0.5b you chose: "
        "the measured numbers are lab-llama-20m&#x27;s, and the prediction is for lab-llama-20m."
    ) in page.content.decode()
    assert any(row.predicted for row in page.context["rows"])


def test_a_web_run_on_a_server_serving_a_model_outside_the_catalog_predicts_nothing(
    fake_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alice: Any, client: Any
) -> None:
    root = model_dir(tmp_path, "mystery", MYSTERY)
    config = {"model": "mystery", "root": str(root), "vocab_size": 3000, "ttft_ms": 5}
    server = fake_server({**config, "itl_ms": [2]})
    run = run_on_the_workers_server(alice, server, monkeypatch, "qwen2.5-0.5b")

    (reason,) = run.predicted.values()
    assert list(run.predicted) == ["no_prediction"] and reason.startswith(NOT_IN_CATALOG)
    assert "'mystery', a 3-layer model" in reason
    assert run.result["breakdown"] is None  # no expected parts for a model nobody can price
    assert (run.result["completed"], run.result["failed"]) == (4, 0)

    client.force_login(alice)
    page = client.get(run.get_absolute_url())
    html = page.content.decode()
    assert "The server served &#x27;mystery&#x27;, not the qwen2.5-0.5b you chose: no " in html
    rows = page.context["rows"]
    assert rows and all(row.predicted in ("", "—") for row in rows)
    assert 'id="breakdown-title"' not in html


def test_a_web_run_on_a_server_serving_the_submitted_model_keeps_its_prediction(
    fake_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alice: Any
) -> None:
    root = model_dir(tmp_path, "lab-llama-20m", lab_llama_20m_config())
    server = fake_server({"model": "lab", "root": str(root), "ttft_ms": 5, "itl_ms": [2]})
    from labs.runs.selectors import device_prediction

    params = parse_lab_params({"model": "lab-llama-20m", "num_prompts": 4, "prompt_tokens": 64})
    run = run_on_the_workers_server(alice, server, monkeypatch, "lab-llama-20m")
    assert run.predicted == json.loads(json.dumps(device_prediction(params)))
