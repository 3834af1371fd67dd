# syntax=docker/dockerfile:1
# The gpuwatch image: one image for every verb (node-agent, k8s-watcher, worker, topics,
# simulate...), chosen by the command: `docker run IMAGE worker`.
#
# Build:  docker build -t gpuwatch:0.1.0 .
#
# Two stages: the build stage installs the package and its dependencies into a virtual
# environment (with the kubelet PodResources gRPC modules generated from api.proto);
# the runtime stage copies only that environment onto a fresh slim Python, so no pip
# cache, build tools or sources ship. It runs as an unprivileged user (uid 10001), on a
# read-only root filesystem where the platform allows (the package writes only to /tmp).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpuwatch
# grpcio-tools runs protoc for the PodResources modules; it is a build tool only and
# stays out of the runtime image (the runtime needs grpcio and protobuf).
RUN /opt/gpuwatch/bin/pip install "grpcio-tools>=1.85,<2" "setuptools>=69" wheel
COPY pyproject.toml setup.py README.md ./
COPY schemas/ schemas/
COPY producers/ producers/
COPY streams/ streams/
COPY sinks/ sinks/
COPY gpuwatch/ gpuwatch/
RUN /opt/gpuwatch/bin/python -m producers.podresources.codegen \
 && /opt/gpuwatch/bin/pip install --no-build-isolation . \
 && /opt/gpuwatch/bin/pip uninstall --yes grpcio-tools \
 && /opt/gpuwatch/bin/gpuwatch --version

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="gpuwatch" \
      org.opencontainers.image.description="Real-time GPU observability and cost attribution for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
# Two malloc arenas: the worker's threads (Kafka clients, the Redis writer) would each map
# an arena of their own, address space and resident pages a memory limit counts.
ENV PATH=/opt/gpuwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    HOME=/tmp
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 gpuwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpuwatch
COPY --from=build /opt/gpuwatch /opt/gpuwatch
USER 10001:10001
WORKDIR /tmp
# The metrics ports of the worker, the node agent and the watcher (each binds 127.0.0.1
# unless GPUWATCH_METRICS_BIND says otherwise).
EXPOSE 9480 9481 9482
ENTRYPOINT ["gpuwatch"]
CMD ["--help"]
