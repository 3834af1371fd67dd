#!/usr/bin/env bash
# Installs the OS packages the local stack needs (a JRE 17+, Maven, Redis, Prometheus,
# Alertmanager's amtool, etcd, openssl)
# when they are missing. Idempotent: does nothing when every command is present.
set -euo pipefail

missing=()
java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local major
  major=$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')
  [ -n "$major" ] && [ "${major%%.*}" -ge 17 ]
}
java_ok || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# amtool validates deploy/prometheus/alertmanager.yml in the tests.
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
# The local Kubernetes API server (`gpuwatch stack up --kube`): its store, and openssl for
# its service-account signing key.
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if [ ${#missing[@]} -eq 0 ]; then
  echo "os-deps: java, mvn, redis-server, prometheus, promtool, amtool, etcd and openssl are present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "os-deps: missing ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "os-deps: missing ${missing[*]} and no apt-get here; install them with your package manager" >&2
  exit 1
fi
echo "os-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
# --no-install-recommends: the prometheus package otherwise pulls node-exporter and friends.
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
