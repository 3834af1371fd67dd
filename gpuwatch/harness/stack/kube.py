"""The local Kubernetes API server: etcd and a kube-apiserver 1.34 on loopback.

No kubelet, scheduler or controller manager runs: the API server stores and serves
objects, authenticates and authorizes requests (RBAC), admits them and runs the watch
cache, as it does in a cluster; whoever plays the kubelet (the simulator, a test)
writes pod status itself. The admin's credentials are a static token in the state
directory, named by the kubeconfig `stack up --kube` writes there; service accounts get
real tokens from the TokenRequest API, signed by a key pair made at the first start.

The binary is the one scripts/kube-apiserver.sh builds once from the Go module proxy
into the cache directory (or stack.kube_apiserver); etcd is Debian's etcd-server.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.harness.stack.processes import require_binary
from gpuwatch.harness.stack.service import (
    HOST,
    LocalService,
    Progress,
    StackError,
    StackPaths,
    Which,
    packaged,
)
from schemas.settings import Settings

log = logging.getLogger(__name__)

KUBE_VERSION = "v1.34.2"  # the release scripts/kube-apiserver.sh builds
PROBE_TIMEOUT_S = 2.0
ADMIN = "gpuwatch-admin"  # the static token's user, in system:masters
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc"

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def etcd_url(settings: Settings) -> str:
    """The etcd client URL the API server stores its objects at."""
    return f"http://{HOST}:{settings.stack.etcd_port}"


def credentials(settings: Settings) -> KubeCredentials:
    """The credentials of the stack's API server, in its state folder."""
    return KubeCredentials(StackPaths.of(settings.stack.state_dir).service_dir("kube-apiserver"))


def admin_kubeconfig(settings: Settings) -> Path:
    """The admin's kubeconfig of the stack's API server, which `stack up --kube` writes."""
    return credentials(settings).kubeconfig


def api_url(settings: Settings) -> str:
    """The URL of the stack's API server."""
    return f"https://{HOST}:{settings.stack.kube_port}"


class EtcdService(LocalService):
    """Checks, prepares and probes the local etcd of one state directory (a cluster of one)."""

    name = "etcd"

    def __init__(self, settings: Settings, paths: StackPaths, which: Which = shutil.which):
        super().__init__(
            paths, which, settings.stack.etcd_port, extra_ports=(settings.stack.etcd_peer_port,)
        )
        self.peer_port = settings.stack.etcd_peer_port
        self.binary = "etcd"

    def check(self) -> None:
        """etcd must be installed (Debian's etcd-server)."""
        self.binary = require_binary("etcd", self.which)

    def prepare(self, progress: Progress) -> list[str]:
        """The data directory; the command line."""
        data = self.home / "data"
        data.mkdir(parents=True, exist_ok=True)
        client = f"http://{HOST}:{self.port}"
        peer = f"http://{HOST}:{self.peer_port}"
        return [
            self.binary,
            "--name=gpuwatch",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gpuwatch={peer}",
            # The API server compacts every 5 minutes itself; keep etcd's own off.
            "--auto-compaction-retention=0",
            "--quota-backend-bytes=1073741824",
            # The API server's watch cache learns that the store moved on without a
            # change of its own resource from these notifications, and only then carries
            # a watch's bookmark forward. Clusters set 5 s (kubeadm, kind); 1 s here
            # lets a bookmark follow a change within a couple of seconds.
            "--experimental-watch-progress-notify-interval=1s",
        ]

    def probe(self) -> bool:
        """True when GET /health says the member is healthy."""
        try:
            with _OPENER.open(f"http://{HOST}:{self.port}/health", timeout=PROBE_TIMEOUT_S) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            log.debug("etcd probe failed port=%d error=%r", self.port, exc)
            return False


class KubeApiServerService(LocalService):
    """Checks, builds or finds, prepares and probes the local kube-apiserver."""

    name = "kube-apiserver"
    needs = ("etcd",)
    stop_timeout_s = 20.0  # it drains open watches and requests before it exits

    def __init__(self, settings: Settings, paths: StackPaths, which: Which = shutil.which):
        super().__init__(paths, which, settings.stack.kube_port)
        self.settings = settings
        self.credentials = KubeCredentials(self.home)
        self.configured = settings.stack.kube_apiserver
        self.cache_dir = settings.stack.cache_dir.expanduser().resolve()
        self.binary = self.configured or cached_binary(self.cache_dir)

    def check(self) -> None:
        """A binary, or the script that builds one, and openssl for the signing key."""
        require_binary("openssl", self.which)
        if self.configured is not None:
            if not os.access(self.configured, os.X_OK):
                raise StackError(
                    f"kube-apiserver {self.configured} is not an executable; fix "
                    "GPUWATCH_KUBE_APISERVER (stack.kube_apiserver)"
                )
        elif not os.access(self.binary, os.X_OK) and not build_script().is_file():
            raise StackError(
                f"no kube-apiserver at {self.binary}, and no {build_script()} to build one "
                "(reinstall gpuwatch), or set GPUWATCH_KUBE_APISERVER"
            )

    def prepare(self, progress: Progress) -> list[str]:
        """Build the binary once, make the credentials once; the command line."""
        if self.configured is None and not os.access(self.binary, os.X_OK):
            progress(f"building kube-apiserver {KUBE_VERSION} (once, several minutes)...")
            self.binary = build(self.cache_dir)
        self.credentials.ensure(self.which)
        self.credentials.write_kubeconfig(self.port)
        return command(
            self.binary, etcd=etcd_url(self.settings), port=self.port, credentials=self.credentials
        )

    def probe(self) -> bool:
        """True when /readyz answers ok and the bootstrap RBAC lets anyone read /version."""
        return self.credentials.ready(self.port)


def command(
    binary: Path | str,
    *,
    etcd: str,
    port: int,
    credentials: KubeCredentials,
    cert_dir: Path | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The kube-apiserver command line: on loopback, etcd at `etcd`, `credentials`' admin
    token and signing keys, its serving certificate in `cert_dir` (the credentials')."""
    c = credentials
    return [
        str(binary),
        f"--etcd-servers={etcd}",
        f"--bind-address={HOST}",
        f"--advertise-address={HOST}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir or c.cert_dir}",
        f"--token-auth-file={c.tokens}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={c.sa_public}",
        f"--service-account-signing-key-file={c.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # No controller manager makes each namespace's "default" account, which the
        # ServiceAccount admission plugin would require of every pod.
        "--disable-admission-plugins=ServiceAccount",
        # 1.34 turns a watch from resourceVersion "" or "0" into a watch-list, which
        # needs etcd's RequestWatchProgress (3.4.31+); Debian's etcd-server is 3.4.23.
        # Off, such a watch starts with the current objects as in 1.33 and before.
        "--feature-gates=WatchList=false",
        "--profiling=false",
        *extra,
    ]


class KubeCredentials:
    """The files of the local API server's identity and its admin's: one state folder."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.cert_dir = home / "certs"
        self.ca = self.cert_dir / "apiserver.crt"  # self-signed by the API server at start
        self.tokens = home / "tokens.csv"
        self.sa_key = home / "sa.key"
        self.sa_public = home / "sa.pub"
        self.kubeconfig = home / "kubeconfig"

    def ensure(self, which: Which = shutil.which) -> None:
        """The admin token and the service-account signing key pair, made once."""
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.tokens.exists():
            token = secrets.token_urlsafe(32)
            _write_private(self.tokens, f'{token},{ADMIN},{ADMIN},"system:masters"\n')
        if not (self.sa_key.exists() and self.sa_public.exists()):
            openssl = require_binary("openssl", which)
            _run([openssl, "genrsa", "-out", str(self.sa_key), "2048"])
            self.sa_key.chmod(0o600)
            _run([openssl, "rsa", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_public)])

    @property
    def admin_token(self) -> str:
        """The admin's bearer token."""
        return self.tokens.read_text("utf-8").split(",", 1)[0]

    def write_kubeconfig(self, port: int) -> None:
        """A kubeconfig of the admin (context "gpuwatch-local"), for kubectl and the tests."""
        self._write(self.kubeconfig, port, ADMIN, {"token": self.admin_token})

    def kubeconfig_for(self, path: Path, port: int, user: str, token: str) -> Path:
        """A kubeconfig at `path` of `user` with `token` (a service account's, say)."""
        self._write(path, port, user, {"token": token})
        return path

    def _write(self, path: Path, port: int, user: str, auth: dict[str, str]) -> None:
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuwatch-local",
                    "cluster": {
                        "server": f"https://{HOST}:{port}",
                        "certificate-authority": str(self.ca),
                    },
                }
            ],
            "users": [{"name": user, "user": auth}],
            "contexts": [
                {"name": "gpuwatch-local", "context": {"cluster": "gpuwatch-local", "user": user}}
            ],
            "current-context": "gpuwatch-local",
        }
        _write_private(path, yaml.safe_dump(config, sort_keys=False))

    def ready(self, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """Whether the API server on `port` is ready and has its bootstrap RBAC in place."""
        if not (self.ca.exists() and self.tokens.exists()):
            return False
        base = f"https://{HOST}:{port}"
        context = ssl.create_default_context(cafile=str(self.ca))
        https = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        admin = urllib.request.Request(
            f"{base}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        try:
            with https.open(admin, timeout=timeout_s) as r:
                if r.read().strip() != b"ok":
                    return False
            # Anonymous: 403 until the bootstrap roles and bindings are written.
            with https.open(f"{base}/version", timeout=timeout_s) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            log.debug("kube-apiserver probe failed port=%d error=%r", port, exc)
            return False


def cached_binary(cache_dir: Path) -> Path:
    """Where scripts/kube-apiserver.sh keeps its build."""
    return cache_dir / "kube-apiserver" / KUBE_VERSION / "kube-apiserver"


def build_script() -> Path:
    """scripts/kube-apiserver.sh (with its scripts/lib/go-build.sh), as this package ships it."""
    return packaged("kube-apiserver.sh")


def build(cache_dir: Path) -> Path:
    """Build the pinned kube-apiserver into `cache_dir` (once); its path."""
    env = os.environ | {"GPUWATCH_CACHE_DIR": str(cache_dir), "GPUWATCH_KUBE_VERSION": KUBE_VERSION}
    env.pop("GPUWATCH_KUBE_APISERVER", None)
    done = subprocess.run(
        [str(build_script()), "--path"], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise StackError(
            f"building kube-apiserver {KUBE_VERSION} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        )
    return Path(done.stdout.strip())


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StackError(f"{' '.join(command)} failed: {done.stderr.strip()}")


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (tokens, kubeconfigs)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
