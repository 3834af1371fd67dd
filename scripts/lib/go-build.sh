# Shared by the scripts that build a pinned Go tool once into the cache directory
# (scripts/helm.sh, scripts/kube-apiserver.sh). Sourced, not run.
#
#   GPUWATCH_CACHE_DIR   the cache (default ${XDG_CACHE_HOME:-~/.cache}/gpuwatch)
#   GPUWATCH_GO          the go command to build with (else go on PATH, else /usr/local/go/bin/go)

gpuwatch_cache_dir() {
  echo "${GPUWATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuwatch}"
}

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

# `make_workdir NAME`: a scratch directory for one build in $work, removed when the
# script exits (not in a $(...) subshell, whose exit would remove it at once). Go writes
# its module files read-only: they are made removable first.
make_workdir() {
  work="$(mktemp -d "${TMPDIR:-/tmp}/gpuwatch-$1-build.XXXXXX")"
  # shellcheck disable=SC2064  # expanded now, into the trap
  trap "chmod -R u+w $(printf %q "$work") 2>/dev/null; rm -rf $(printf %q "$work")" EXIT
}

# `cached_build BIN BUILD_FUNCTION`: BIN once built, one build at a time (parallel
# callers wait for the first one's lock, then find the binary there).
cached_build() {
  local bin="$1" build="$2"
  if [ ! -x "$bin" ]; then
    mkdir -p "$(dirname "$bin")"
    exec 9>"$(dirname "$bin")/.lock"
    flock 9
    [ -x "$bin" ] || "$build"
    flock -u 9
  fi
}

# Moves a built binary into place atomically: a concurrent caller never sees half of it.
install_binary() {
  mv "$1" "$2.tmp.$$"
  mv "$2.tmp.$$" "$2"
}
