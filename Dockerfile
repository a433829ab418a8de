# StyleVAR inference service (API + web UI) on a CUDA runtime image.
#   docker build -t stylevar-serve .
#   docker run --gpus all -p 8000:8000 -v "$PWD/models/my-model:/models" stylevar-serve
# The model directory is a volume at /models (config.json + tokenizer/transformer safetensors);
# a fresh named volume starts with the embedded demo model.
#
# torch's CUDA and the host's driver: the pinned torch 2.14.1 / torchvision 0.29.1 are PyPI's Linux wheels, which
# bundle the CUDA 13.0 libraries (torch.__version__ 2.14.1+cu130, nvidia-*-cu13 dependencies) and so need an NVIDIA
# driver >= 580 on the host. The base image (no CUDA libraries of its own: the wheels bring them) states the same
# CUDA, so the NVIDIA container toolkit refuses to start this image on an older driver (NVIDIA_REQUIRE_CUDA) instead
# of letting the service fall back to the CPU; for an older driver see docs/gpus.md (a CUDA 12 build of torch).
FROM nvidia/cuda:13.0.0-base-ubuntu24.04
LABEL org.opencontainers.image.title="stylevar-serve" \
      io.stylevar.torch-cuda="13.0"

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
# torch and torchvision pinned (the CUDA build above); every extra a route or a UI tab needs: serve (the API), web
# (the UI at /ui), video (PyAV: POST /stylize/video and the Video tab), teacher (the UI's Magenta baseline).
# The project's own dependencies are bounded by pyproject.toml (this installs the project, not a named package).
# hadolint ignore=DL3013
RUN pip install "torch==2.14.1" "torchvision==0.29.1" ".[serve,web,video,teacher]"

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
