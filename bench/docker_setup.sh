#!/usr/bin/env bash
# Make this Debian machine (root) ready for the project's docker-compose swarm, with no Docker Hub:
#   1. installs the engine and the compose v1 CLI from Debian (docker.io, docker-compose) and
#      debootstrap, when missing;
#   2. starts containerd and dockerd in the background when no engine answers (no systemd here;
#      logs in /var/log/p2p-dockerd.log);
#   3. builds the base image the Dockerfile names (P2P_BASE_IMAGE, default p2p-base:bookworm):
#      a minimal Debian bookworm rootfs with Python 3.11 from debootstrap, `docker import`ed;
#   4. puts what the image build may need from this machine into docker/local/ (gitignored):
#      the CPU torch wheel when pip's find-links (/opt/wheels) has one (PyPI's torch would pull
#      GBs of CUDA packages), and pip's CA bundle when pip is set to use one (a TLS-inspecting
#      proxy: the image's own CA store would refuse PyPI's certificate).
# Idempotent: each step is skipped when its result is already there.
#   bench/docker_setup.sh            # then: docker-compose up --build
#   bench/docker_setup.sh --stop     # stop the engine this script started
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE="${P2P_BASE_IMAGE:-p2p-base:bookworm}"
MIRROR="${P2P_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [[ "${1:-}" == "--stop" ]]; then
  pkill -x dockerd || true
  for _ in $(seq 30); do pgrep -x dockerd >/dev/null || break; sleep 1; done
  pkill -x containerd || true
  echo "engine stopped (iptables keeps Docker's FORWARD policy until reboot: $(iptables -S FORWARD | head -1))"
  exit 0
fi

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if (( ${#missing[@]} )); then
  echo "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "starting the engine (containerd, dockerd)"
  pgrep -x containerd >/dev/null || (nohup containerd >/var/log/p2p-containerd.log 2>&1 &)
  (nohup dockerd --containerd=/run/containerd/containerd.sock >/var/log/p2p-dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start: see /var/log/p2p-dockerd.log" >&2; exit 1; }
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  echo "building $BASE_IMAGE with debootstrap (a few minutes)"
  rootfs="$(mktemp -d /tmp/p2p-rootfs.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$MIRROR" >/tmp/p2p-debootstrap.log 2>&1 \
    || { echo "debootstrap failed: see /tmp/p2p-debootstrap.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
fi

mkdir -p docker/local
for whl in /opt/wheels/torch-2.13.0+cpu-*.whl; do
  [[ -e "$whl" && ! -e "docker/local/$(basename "$whl")" ]] && cp "$whl" docker/local/
done
cert="${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}"
if [[ -n "$cert" && -f "$cert" ]]; then cp "$cert" docker/local/pip-ca.crt; fi
echo "ready: $(docker --version | cut -d, -f1), $(docker-compose --version | cut -d, -f1), base image $BASE_IMAGE"
