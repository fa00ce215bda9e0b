"""Serving local models: one llama.cpp server process for a run, or for ``models serve``.

Serving uses llama-cpp-python's OpenAI-compatible server (the optional ``local`` extra). One
server process holds every requested model under its registry name (the server swaps models on
demand, which on a small machine beats several processes fighting over the same cores). The
process itself is ``python -m refusalbench.tasks.llm.local_models`` (see ``server_process``); this
module launches it on loopback, waits until it answers, and stops it again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.config import LocalModelSpec, ModelConfig
from refusalbench.tasks.core.errors import ModelUnavailable
from refusalbench.tasks.llm.local_models.pull import is_pulled, weights_path

LOCAL_EXTRA_HINT = "pip install 'refusalbench[local]'"
# LiteLLM's OpenAI client insists on some key; the llama.cpp server ignores it.
LOCAL_API_KEY = "sk-local-no-key"


def llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def local_names(models: dict[str, ModelConfig], names: list[str] | None = None) -> list[str]:
    """Registry entries we must serve ourselves: marked local and given no api_base."""
    pool = names if names is not None else list(models)
    return [n for n in pool if models[n].local is not None and models[n].api_base is None]


def server_alias(name: str, spec: LocalModelSpec) -> str:
    return spec.alias or name


def build_server_config(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    host: str = "127.0.0.1",
    port: int,
    cache_dir: str | Path | None = None,
    n_threads: int | None = None,
) -> dict[str, Any]:
    """llama_cpp.server ``--config_file`` content serving ``names`` (weights must be pulled)."""
    threads = n_threads or os.cpu_count() or 1
    entries: list[dict[str, Any]] = []
    for name in names:
        cfg = models.get(name)
        if cfg is None:
            raise ModelUnavailable(f"{name}: not in the model registry")
        spec = cfg.local
        if spec is None:
            raise ModelUnavailable(f"{name}: not a local model (no 'local:' section)")
        if not is_pulled(name, spec, cache_dir):
            raise ModelUnavailable(f"{name}: weights not in the cache; run `refusalbench models pull {name}`")
        entry: dict[str, Any] = {
            "model": str(weights_path(name, spec, cache_dir)),
            "model_alias": server_alias(name, spec),
            "n_ctx": spec.n_ctx,
            "n_threads": threads,
            "n_threads_batch": threads,
            # The server defaults to logits for every prompt token (only needed for echoed
            # logprobs); over a 50k-260k vocabulary that dominates prompt processing.
            "logits_all": False,
            "verbose": False,
        }
        if spec.chat_format:
            entry["chat_format"] = spec.chat_format
        entries.append(entry)
    if not entries:
        raise ValueError("no models to serve")
    return {"host": host, "port": port, "interrupt_requests": False, "models": entries}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def endpoint_models(api_base: str, timeout: float = 2.0, path: str = "/models") -> list[str] | None:
    """Model ids listed by an endpoint at ``api_base`` + ``path`` (OpenAI's format; the provider
    profile's ``models_path``), or None when it does not answer."""
    url = api_base.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - http(s) endpoint from config
            payload = json.loads(reply.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    data = payload.get("data", []) if isinstance(payload, dict) else []
    return [str(item.get("id")) for item in data if isinstance(item, dict)]


class LlamaServer:
    """A running llama.cpp OpenAI-compatible server (subprocess); stop it or use it as a context manager."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, aliases: dict[str, str], workdir: Path):
        self.process = process
        self.host = host
        self.port = port
        self.aliases = aliases  # registry name -> alias the server answers to
        self.workdir = workdir
        self.log_path = workdir / "server.log"

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def api_bases(self) -> dict[str, str]:
        """Registry name -> endpoint, the shape ``Gateway(api_bases=...)`` takes."""
        return {name: self.api_base for name in self.aliases}

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        return _tail(self.log_path, lines)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise ModelUnavailable(
                    f"llama.cpp server exited with code {self.process.returncode} before it was ready:\n{self.log_tail()}"
                )
            if endpoint_models(self.api_base, timeout=1.0) is not None:
                return
            time.sleep(0.2)
        self.stop()
        raise ModelUnavailable(f"llama.cpp server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def with_endpoints(self, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        """Copy of ``models`` where the served entries point at this server."""
        out = dict(models)
        for name, alias in self.aliases.items():
            out[name] = models[name].model_copy(update={"api_base": self.api_base, "model": f"openai/{alias}"})
        return out

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _project_root() -> str:
    """The repository root (this file is <root>/tasks/local_models/server.py)."""
    return str(Path(__file__).resolve().parents[2])


def start_server(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    cache_dir: str | Path | None = None,
    n_threads: int | None = None,
    timeout: float = 180.0,
) -> LlamaServer:
    """Launch one llama.cpp server for ``names`` on loopback and wait until ``GET /v1/models`` answers."""
    if not llama_cpp_installed():
        raise ModelUnavailable(f"llama-cpp-python is not installed; {LOCAL_EXTRA_HINT}")
    chosen_port = port or free_port(host)
    config = build_server_config(models, names, host=host, port=chosen_port, cache_dir=cache_dir, n_threads=n_threads)
    workdir = Path(tempfile.mkdtemp(prefix="refusalbench-llama-"))
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    env = dict(os.environ)
    # The launcher lives in this package; make it importable even when run from a checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_project_root(), env.get("PYTHONPATH")) if p)
    command = [
        sys.executable,
        "-m",
        "refusalbench.tasks.llm.local_models",
        "--config_file",
        str(config_path),
        "--parent_pid",
        str(os.getpid()),
    ]
    log = (workdir / "server.log").open("wb")
    try:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    finally:
        log.close()
    aliases = {name: server_alias(name, models[name].local) for name in names}  # type: ignore[arg-type]
    server = LlamaServer(process, host, chosen_port, aliases, workdir)
    try:
        server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def local_endpoints(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    cache_dir: str | Path | None = None,
    timeout: float = 180.0,
) -> Iterator[dict[str, str]]:
    """For the flows: serve the local models among ``names`` for the duration of a run.

    Yields ``{registry name: api_base}`` for ``Gateway(api_bases=...)``; empty (and no server)
    when none of ``names`` is a local model without an api_base.
    """
    wanted = local_names(models, names)
    if not wanted:
        yield {}
        return
    with start_server(models, wanted, cache_dir=cache_dir, timeout=timeout) as server:
        yield server.api_bases


def serve_forever(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    cache_dir: str | Path | None = None,
    echo: Callable[[str], None] = print,
) -> int:
    """For ``models serve``: start, print the api_base, block until SIGTERM/SIGINT, stop; returns an exit code."""
    stop_requested = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with start_server(models, names, host=host, port=port, cache_dir=cache_dir) as server:
            echo(server.api_base)
            for name, alias in server.aliases.items():
                echo(f"  {name}: model={alias}")
            while not stop_requested.wait(0.5):
                if not server.running():
                    echo(f"llama.cpp server exited unexpectedly:\n{server.log_tail()}")
                    return 1
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
