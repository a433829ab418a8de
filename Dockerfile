# StyleVAR inference service (API + web UI) on a CUDA runtime image.
#   docker build -t stylevar-serve .
#   docker run --gpus all -p 8000:8000 -v "$PWD/models/my-model:/models" stylevar-serve
# The model directory is a volume at /models (config.json + tokenizer/transformer safetensors);
# a fresh named volume starts with the embedded demo model.
FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Python from the distribution; the exact version follows the base image's release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml README.md ./
COPY backend ./backend
COPY stylevar ./stylevar
COPY serve ./serve
COPY web ./web
COPY training ./training
COPY data_tools ./data_tools
# PyPI's Linux torch wheels bundle the CUDA 12 libraries; the base image supplies the driver hook.
# Versions are bounded by pyproject.toml (this installs the project itself, not a named package).
# hadolint ignore=DL3013
RUN pip install ".[serve,web]"

RUN groupadd --gid 10001 stylevar \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin stylevar \
    && mkdir -p /models \
    && cp -r /app/stylevar/assets/demo/. /models/ \
    && chown -R 10001:10001 /models

USER 10001:10001
# The image listens on every interface: no API docs or schema, and /metrics only with the API key
# (when STYLEVAR_API_KEYS is set, which a public deployment should do; see docs/serving.md).
ENV STYLEVAR_HOST=0.0.0.0 \
    STYLEVAR_PORT=8000 \
    STYLEVAR_MODEL_DIR=/models \
    STYLEVAR_DOCS=false \
    STYLEVAR_METRICS_ACCESS=key
VOLUME ["/models"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 \
    CMD ["python", "-m", "serve.healthcheck"]

CMD ["python", "-m", "serve", "--host", "0.0.0.0"]
