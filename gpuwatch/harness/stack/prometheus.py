"""The local Prometheus, run on deploy/prometheus/prometheus.yml (package data) in place.

The file names Prometheus's own address, 127.0.0.1:9090, as its self-scrape target. A
stack moved to another port (`GPUWATCH_STACK_PROMETHEUS_PORT`) runs on a copy in its
state directory with that target moved and the rule files named by absolute path, so
edited rules are still picked up by a reload; edits of the file itself by the next
`stack up`.
"""

from __future__ import annotations

import http.client
import logging
import shutil
import urllib.error
import urllib.request
from pathlib import Path

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

PROBE_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 15.0  # Prometheus flushes its head block on SIGTERM
RETENTION = "2d"  # a development stack: two days of samples are plenty
DEFAULT_PORT = 9090  # the port deploy/prometheus/prometheus.yml scrapes Prometheus at
SELF_JOB = "prometheus"

# No proxies: an http_proxy in the environment must not swallow requests to loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def default_config() -> Path:
    """deploy/prometheus/prometheus.yml, as this package ships it (with its rule files)."""
    return packaged("prometheus.yml")


def config_path(settings: Settings) -> Path:
    """The configuration Prometheus runs on: the setting, or the package's."""
    configured = settings.stack.prometheus_config
    return default_config() if configured is None else configured.expanduser().resolve()


def command(*, binary: str, config: Path, data_dir: Path, port: int) -> list[str]:
    """The prometheus command line.

    The configuration is used where it lies, not copied: its rule_files are resolved
    relative to it. --web.enable-lifecycle lets `curl -X POST .../-/reload` pick up
    edited rules without a restart.
    """
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address={HOST}:{port}",
        "--web.enable-lifecycle",
    ]


def moved(source: Path, port: int) -> str:
    """The configuration in `source` for a Prometheus on `port`.

    Rule files become absolute paths; the self-scrape job's 127.0.0.1:9090 becomes the
    port. Everything else is as it was.
    """
    config = yaml.safe_load(source.read_text())
    rules = config.get("rule_files") or ()
    config["rule_files"] = [str(source.parent / rule) for rule in rules]
    own = f"{HOST}:{DEFAULT_PORT}"
    for job in config.get("scrape_configs") or ():
        if job.get("job_name") != SELF_JOB:
            continue
        for group in job.get("static_configs") or ():
            targets = group.get("targets") or []
            group["targets"] = [f"{HOST}:{port}" if t == own else t for t in targets]
    header = f"# Rendered by `gpuwatch stack up` from {source} for port {port}: edit that.\n"
    return header + yaml.safe_dump(config, sort_keys=False)


class PrometheusService(LocalService):
    """Checks, prepares and probes the local Prometheus of one state directory."""

    name = "prometheus"
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, settings: Settings, paths: StackPaths, which: Which = shutil.which):
        super().__init__(paths, which, settings.stack.prometheus_port)
        self.config = config_path(settings)
        self.configured = settings.stack.prometheus_config is not None
        self.binary = "prometheus"

    def check(self) -> None:
        """prometheus must be installed and its configuration must exist."""
        self.binary = require_binary("prometheus", self.which)
        if not self.config.is_file():
            how = (
                "fix GPUWATCH_PROMETHEUS_CONFIG (stack.prometheus_config)"
                if self.configured
                else "reinstall gpuwatch, or set GPUWATCH_PROMETHEUS_CONFIG to a prometheus.yml"
            )
            raise StackError(f"Prometheus configuration {self.config} does not exist; {how}")

    def prepare(self, progress: Progress) -> list[str]:
        """Create the data directory (and the moved configuration); the command line."""
        data_dir = self.home / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = self.config
        if not self.configured and self.port != DEFAULT_PORT:
            config = self.home / "prometheus.yml"
            config.write_text(moved(self.config, self.port))
        return command(binary=self.binary, config=config, data_dir=data_dir, port=self.port)

    def probe(self) -> bool:
        """True when GET /-/ready answers 200."""
        return probe(HOST, self.port)


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a Prometheus on host:port says it is ready (GET /-/ready is 200)."""
    url = f"http://{host}:{port}/-/ready"
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        log.debug("prometheus probe failed url=%s error=%r", url, exc)
        return False
