#!/usr/bin/env bash
# Runs a pinned kube-apiserver (builds it once from the Go module proxy into the cache
# directory), for the local stack's Kubernetes (`gpuwatch stack up --kube`).
#
#   scripts/kube-apiserver.sh --path      # build when missing; print the binary's path
#   scripts/kube-apiserver.sh --version   # any kube-apiserver arguments
#
# Which binary:
#   1. $GPUWATCH_KUBE_APISERVER, when set (one of your own, 1.34 or newer);
#   2. the cached build:
#      $GPUWATCH_CACHE_DIR (default ~/.cache/gpuwatch)/kube-apiserver/<version>/kube-apiserver;
#   3. otherwise it is built: k8s.io/kubernetes at <version> from the Go module proxy,
#      its ./staging replaces pointed at the published k8s.io/* modules of the same
#      release (the module as published names them by path, and the zip leaves them
#      out), vendor/ and go.work left out, then `go build ./cmd/kube-apiserver`. About
#      4 to 6 minutes on 2 cores and 1 GB of downloads the first time; the module and
#      build caches of that build live in a temporary directory removed afterwards.
# Exit status 3: no binary and no Go toolchain to build one.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too
# shellcheck source=scripts/lib/go-build.sh
. "$(dirname "$0")/lib/go-build.sh"

K8S_VERSION="${GPUWATCH_KUBE_VERSION:-v1.34.2}"
# The published staging modules of that release: v1.34.2 -> v0.34.2.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

dir="$(gpuwatch_cache_dir)/kube-apiserver/$K8S_VERSION"
bin="$dir/kube-apiserver"

build() {
  local go src major minor version_pkg ldflags
  if ! go="$(find_go)"; then
    echo "kube-apiserver.sh: no kube-apiserver ($bin) and no Go toolchain to build it;" \
      "set GPUWATCH_KUBE_APISERVER to one of your own" >&2
    exit 3
  fi
  make_workdir kube-apiserver
  export GOPATH="$work/gopath" GOMODCACHE="$work/mod" GOCACHE="$work/cache" \
    GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  echo "kube-apiserver.sh: building kube-apiserver $K8S_VERSION with" \
    "$("$go" version | cut -d' ' -f3) (once; several minutes)" >&2
  src="$("$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -d "$src" ] || { echo "kube-apiserver.sh: k8s.io/kubernetes@$K8S_VERSION not downloaded" >&2; exit 1; }
  cp -r "$src" "$work/src"
  chmod -R u+w "$work/src"
  cd "$work/src"
  rm -rf vendor go.work go.work.sum
  sed -i -E "s#^([[:space:]]*)(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+\$#\1\2 => \2 $STAGING_VERSION#" go.mod
  if grep -q '=> ./staging' go.mod; then
    echo "kube-apiserver.sh: go.mod still replaces a module by ./staging" >&2
    exit 1
  fi
  # What `kube-apiserver --version` and GET /version answer, as the release build sets it.
  major="${K8S_VERSION#v}"; major="${major%%.*}"
  minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  version_pkg=k8s.io/component-base/version
  ldflags="-s -w -X $version_pkg.gitVersion=$K8S_VERSION -X $version_pkg.gitMajor=$major"
  ldflags+=" -X $version_pkg.gitMinor=$minor -X $version_pkg.gitTreeState=clean"
  "$go" build -ldflags "$ldflags" -o "$work/kube-apiserver" ./cmd/kube-apiserver
  install_binary "$work/kube-apiserver" "$bin"
}

if [ -n "${GPUWATCH_KUBE_APISERVER:-}" ]; then
  apiserver="$GPUWATCH_KUBE_APISERVER"
else
  cached_build "$bin" build
  apiserver="$bin"
fi
if [ "${1:-}" = "--path" ]; then
  echo "$apiserver"
  exit 0
fi
exec "$apiserver" "$@"
