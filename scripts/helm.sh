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

HELM_VERSION="${GPUWATCH_HELM_VERSION:-v3.19.0}"
# The Kubernetes version helm assumes without a cluster (`helm template`): that of the
# client-go it is built with (v0.34 -> 1.34), as Helm's own Makefile sets it.
HELM_K8S_MAJOR=1
HELM_K8S_MINOR=34

cache="${GPUWATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuwatch}"
dir="$cache/helm/$HELM_VERSION"
bin="$dir/helm"

find_go() {
  if [ -n "${GPUWATCH_GO:-}" ]; then
    [ -x "$GPUWATCH_GO" ] && echo "$GPUWATCH_GO"
  elif command -v go >/dev/null 2>&1; then
    command -v go
  elif [ -x /usr/local/go/bin/go ]; then
    echo /usr/local/go/bin/go
  else
    return 1
  fi
}

build() {
  local go work pkg ldflags
  if ! go="$(find_go)"; then
    echo "helm.sh: no helm ($bin) and no Go toolchain to build it; install helm 3 and set GPUWATCH_HELM" >&2
    exit 3
  fi
  mkdir -p "$dir"
  work="$(mktemp -d "${TMPDIR:-/tmp}/gpuwatch-helm-build.XXXXXX")"
  # Module files are written read-only by go; make them removable before deleting.
  # (Expanded now: $work is local to this function and gone when the trap runs.)
  # shellcheck disable=SC2064
  trap "chmod -R u+w $(printf %q "$work") 2>/dev/null; rm -rf $(printf %q "$work")" EXIT
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
  # Into place atomically: a concurrent caller never sees half a binary.
  mv "$work/bin/helm" "$bin.tmp.$$"
  mv "$bin.tmp.$$" "$bin"
}

resolve() {
  if [ -n "${GPUWATCH_HELM:-}" ]; then
    echo "$GPUWATCH_HELM"
    return
  fi
  if [ ! -x "$bin" ]; then
    mkdir -p "$dir"
    # One build at a time: parallel test runs wait for the first.
    exec 9>"$dir/.lock"
    flock 9
    [ -x "$bin" ] || build
    flock -u 9
  fi
  echo "$bin"
}

helm="$(resolve)"
if [ "${1:-}" = "--path" ]; then
  echo "$helm"
  exit 0
fi
exec "$helm" "$@"
