# One p2p node per container. Build context: this repository.
#   docker-compose build                       # CPU image on the local base (bench/docker_setup.sh)
#   docker build --build-arg BASE=python:3.11-slim .            # with Docker Hub at hand
#   docker build --build-arg BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 \
#                --build-arg TORCH=torch==2.13.0 --build-arg TORCH_INDEX=https://pypi.org/simple .
#     (a CUDA image: PyPI's torch carries the CUDA libraries; the base needs python3 + venv)
# The default is CPU-only torch: no CUDA packages, about 1 GB instead of several.
ARG BASE=p2p-base:bookworm
FROM ${BASE}
ARG TORCH=torch==2.13.0+cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/p2p
# Dependencies first, so that editing the code does not reinstall torch. docker/local/ may hold
# a torch wheel and pip's CA bundle (bench/docker_setup.sh copies this machine's); otherwise
# pip takes TORCH from TORCH_INDEX (PyPI for the rest) and trusts the image's CA store.
# (pyproject.toml is named twice so that COPY has a source when docker/local does not exist.)
COPY pyproject.toml docker/local* /tmp/local/
COPY pyproject.toml ./
RUN python3 -m venv /opt/venv \
 && if [ -f /tmp/local/pip-ca.crt ]; then export PIP_CERT=/tmp/local/pip-ca.crt; fi \
 && if ls /tmp/local/torch-*.whl >/dev/null 2>&1; then pip install /tmp/local/torch-*.whl; \
    else pip install --extra-index-url "$TORCH_INDEX" "$TORCH"; fi \
 && python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY README.md ./
COPY p2p/ p2p/
COPY nodes/ nodes/
RUN if [ -f /tmp/local/pip-ca.crt ]; then export PIP_CERT=/tmp/local/pip-ca.crt; fi \
 && pip install --no-deps . && python -c "import p2p, torch; print('p2p image: torch', torch.__version__)" \
 && rm -rf /tmp/local
EXPOSE 7000 7001 9100
# The metrics port of docker/swarm.toml serves /healthz (200 while the node runs).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:9100/healthz', timeout=2)"
ENTRYPOINT ["p2p"]
CMD ["start", "--listen", "0.0.0.0:7000", "--metrics", "0.0.0.0:9100"]
