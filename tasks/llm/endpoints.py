"""Which deployment a model string reaches: part of a call's identity in the call cache.

One open model is often served by several hosts (a vLLM box, a hosted provider, a second
region), all under the same LiteLLM model string. Their replies differ, so the call cache must
tell them apart: a configured ``api_base`` and the headers that pick a deployment are part of
the key. Credentials are not (a rotated key must still hit the cache), and neither is the
endpoint the run itself discovers for a local server it started (a new port each run).

An ``api_base`` that names environment variables (``${REFUSALBENCH_MODELS_URL:-http://models:8080/v1}``)
is keyed as written, not as expanded: the variable is where this deployment is reached from here
(the compose network, the local cluster's port), and moving it there is not a different deployment,
for the same reason a local server's own port is not part of the key. Changing what is written (the
variable or its default) is.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.core.envexpand import has_references

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Header names that carry credentials, never a deployment (compared lower-case) ...
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "api-key", "x-api-key"})
# ... and words that mark one in any other name (x-goog-api-key, x-auth-token, ocp-apim-subscription-key).
_CREDENTIAL_WORDS = ("key", "token", "secret", "auth", "password", "signature", "cookie")


@functools.lru_cache(maxsize=1024)  # on every call's cache key: parse each endpoint once
def normalised_endpoint(api_base: str) -> str:
    """``api_base`` as one spelling per endpoint: lower-case scheme and host, the port only when it
    is not the scheme's default, the path without a trailing slash, the query kept, credentials
    in the URL dropped (``HTTPS://Host:443/v1/`` -> ``https://host/v1``)."""
    parts = urlsplit(api_base.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # not a number: keep what was written
        port = None
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    path = parts.path.rstrip("/")
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{netloc}{path}{query}" if scheme else f"{netloc}{path}{query}"


def is_credential_header(name: str) -> bool:
    """Whether a request header carries credentials (and so is never part of a call's identity)."""
    lower = name.strip().lower()
    return lower in _CREDENTIAL_HEADERS or any(word in lower for word in _CREDENTIAL_WORDS)


def deployment_headers(headers: dict[str, Any]) -> dict[str, str]:
    """The headers that may select a deployment (every one that is not a credential), names lower-case."""
    return {
        name.strip().lower(): str(value) for name, value in sorted(headers.items()) if not is_credential_header(name)
    }


def endpoint_identity(cfg: ModelConfig) -> dict[str, Any]:
    """What the call-cache key adds for the deployment a model reaches: ``endpoint`` when it has an
    ``api_base`` of its own, ``headers`` when its ``extra_headers`` select one. Empty for a model
    reached at its provider's default endpoint, so its keys are what they always were."""
    identity: dict[str, Any] = {}
    written = cfg.api_base_as_written
    if written:  # a template is its own spelling: its parts are not a URL's until expanded
        identity["endpoint"] = written.strip() if has_references(written) else normalised_endpoint(written)
    headers = deployment_headers(cfg.extra_headers) if cfg.extra_headers else None
    if headers:
        identity["headers"] = headers
    return identity


def sole_deployment(cfg: ModelConfig, models: Iterable[ModelConfig]) -> bool:
    """Whether a reply cached before the deployment joined the key may serve ``cfg``: it has a
    deployment of its own, and no other model reaches the same model string at another one (two
    hosts of one model never share replies). Such an entry is migrated, so an existing
    single-endpoint config keeps its cache."""
    identity = endpoint_identity(cfg)
    return bool(identity) and not any(
        other.model == cfg.model and endpoint_identity(other) != identity for other in models
    )
