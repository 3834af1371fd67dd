#!/usr/bin/env bash
# Runs a pinned Helm 3 (builds it once from the Go module proxy into the cache directory).
#
#   scripts/helm.sh template gpuwatch deploy/helm/gpuwatch   # any helm command
#   scripts/helm.sh --path                                   # print the binary's path only
#
# The tests render the chart with it (tests/deploy). Which binary:
#   1. $GPUWATCH_HELM, when set (an installed helm 3 of your own);
#   2. the cached build: $GPUWATCH_CACHE_DIR (default ~/.cache/gpuwatch)/helm/<version>/helm;
#   3. otherwise it is built with `go install` (Go 1.24+: $GPUWATCH_GO, else on PATH or in
#      /usr/local/go/bin):
#      about 3 minutes on 2 cores the first time, then cached. The Go module and build
#      caches of that build live in a temporary directory removed afterwards.
# Exit status 3: no helm and no Go toolchain to build one.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too
# shellcheck source=scripts/lib/go-build.sh
. "$(dirname "$0")/lib/go-build.sh"

HELM_VERSION="${GPUWATCH_HELM_VERSION:-v3.19.0}"
# The Kubernetes version helm assumes without a cluster (`helm template`): that of the
# client-go it is built with (v0.34 -> 1.34), as Helm's own Makefile sets it.
HELM_K8S_MAJOR=1
HELM_K8S_MINOR=34

dir="$(gpuwatch_cache_dir)/helm/$HELM_VERSION"
bin="$dir/helm"

build() {
  local go pkg ldflags
  if ! go="$(find_go)"; then
    echo "helm.sh: no helm ($bin) and no Go toolchain to build it; install helm 3 and set GPUWATCH_HELM" >&2
    exit 3
  fi
  make_workdir helm
  pkg=helm.sh/helm/v3
  ldflags="-s -w -X $pkg/internal/version.version=$HELM_VERSION"
  ldflags+=" -X $pkg/pkg/chartutil.k8sVersionMajor=$HELM_K8S_MAJOR"
  ldflags+=" -X $pkg/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR"
  ldflags+=" -X $pkg/pkg/lint/rules.k8sVersionMajor=$HELM_K8S_MAJOR"
  ldflags+=" -X $pkg/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR"
  echo "helm.sh: building helm $HELM_VERSION with $("$go" version | cut -d' ' -f3) (once; a few minutes)" >&2
  env GOPATH="$work/gopath" GOMODCACHE="$work/mod" GOCACHE="$work/cache" \
    GOBIN="$work/bin" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
    "$go" install -ldflags "$ldflags" "$pkg/cmd/helm@$HELM_VERSION"
  install_binary "$work/bin/helm" "$bin"
}

if [ -n "${GPUWATCH_HELM:-}" ]; then
  helm="$GPUWATCH_HELM"
else
  cached_build "$bin" build
  helm="$bin"
fi
if [ "${1:-}" = "--path" ]; then
  echo "$helm"
  exit 0
fi
exec "$helm" "$@"
