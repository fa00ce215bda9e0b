# RefusalBench images (used by docker-compose.yml).
#
#   docker build --target worker -t refusalbench:latest .          # Prefect worker / server / CLI
#   docker build --target models -t refusalbench-models:latest .   # + llama.cpp for local models
#
# Versions come from the project's own files: pyproject.toml and constraints.txt. torch is
# installed first, CPU-only (the default Linux wheel pulls the CUDA stack); point TORCH_INDEX_URL
# at another index carrying CPU wheels if the PyTorch one is not reachable.

ARG PYTHON_IMAGE=python:3.11-slim

# ------------------------------------------------------------------ base: the package + deps
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    REFUSALBENCH_PROJECT_DIR=/app \
    REFUSALBENCH_CACHE_DIR=/data/cache \
    REFUSALBENCH_MODEL_CACHE=/data/models \
    HF_HOME=/data/hf
WORKDIR /app

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# An extra index: torch's own dependencies still come from the default one; the CPU build
# (2.13.0+cpu) ranks above the plain version, so it is the one chosen.
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# Dependencies first (a layer that survives code edits), then the project itself.
COPY pyproject.toml constraints.txt ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["dask"]))' > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt

COPY . .
RUN pip install --no-deps . \
 && useradd --create-home --uid 1000 refusalbench \
 && mkdir -p /data/cache /data/models /data/hf /data/prefect /app/runs \
 && chown -R refusalbench:refusalbench /data /app
# Named volumes mounted under /data start with these owners (compose: worker-cache, model-weights ...).

# ------------------------------------------------------------------ worker: pulls runs from the work pool
FROM base AS worker
USER refusalbench
CMD ["prefect", "worker", "start", "--pool", "refusalbench", "--type", "process", "--with-healthcheck"]

# ------------------------------------------------------------------ llama.cpp wheel (build tools stay here)
FROM base AS llama-build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
# Portable CPU build: the image must run on any x86-64 host, not only the build machine.
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF"
RUN LLAMA_VERSION=$(sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml) \
 && CMAKE_ARGS="${CMAKE_ARGS}" pip wheel --no-deps -w /wheels "llama-cpp-python==${LLAMA_VERSION}"

# ------------------------------------------------------------------ models: the local model server
FROM base AS models
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=llama-build /wheels /wheels
RUN pip install -c constraints.txt --find-links /wheels ".[local]" && rm -rf /wheels
USER refusalbench
EXPOSE 8080
CMD ["refusalbench", "models", "serve", "--host", "0.0.0.0", "--port", "8080"]
