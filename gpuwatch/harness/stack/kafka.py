"""The local Kafka broker: a single KRaft node run from jars that Maven fetches once."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import logging
import re
import shutil
import socket
import uuid
import warnings
from pathlib import Path
from typing import Any

from gpuwatch.harness.stack.processes import require_binary, require_java, run_logged, tail
from gpuwatch.harness.stack.service import (
    HOST,
    LocalService,
    Progress,
    StackError,
    StackPaths,
    Which,
)
from schemas.settings import Settings

log = logging.getLogger(__name__)

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
SCALA = "2.13"  # the only Scala build of Kafka 4.x
LOG4J_VERSION = "2.24.3"  # the log4j 2 line Kafka 4.1 is built against
MVN_TIMEOUT_S = 1800  # a cold ~/.m2 on a slow link downloads ~45 MB of jars and plugins
FORMAT_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30.0  # controlled shutdown of the broker and the KRaft controller
PROBE_TIMEOUT_S = 3.0
# What importing kafka-python 3.0 warns about (importlib.resources legacy API), by message:
# the warning is attributed to importlib, not to kafka.
KAFKA_IMPORT_WARNING = r"(read_text|open_text) is deprecated"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes some Maven versions print even in -B

_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by gpuwatch: the jars of a local Kafka {version} broker, fetched with
     `mvn dependency:copy-dependencies`. Safe to delete: the next `stack up` refetches. -->
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.gpuwatch.harness.stack</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def render_pom(version: str) -> str:
    """The Maven project whose runtime dependencies are a Kafka broker."""
    return _POM.format(version=version, scala=SCALA, log4j=LOG4J_VERSION)


def render_server_properties(*, port: int, controller_port: int, data_dir: Path) -> str:
    """server.properties of a combined broker + controller KRaft node on 127.0.0.1."""
    lines = [
        "# Written by `gpuwatch stack up` at every start; edits are overwritten.",
        "# One node is both broker and KRaft controller, on loopback only.",
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers={HOST}:{controller_port}",
        f"listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{HOST}:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data_dir}",
        "# gpuwatch creates its topics explicitly (`gpuwatch topics create`): a typo in a",
        "# topic name must fail, not create a stray topic.",
        "auto.create.topics.enable=false",
        "num.partitions=1",
        "# A single node can only hold one replica of the internal topics.",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "# 50 partitions by default; on a laptop creating them delays the first consumer group.",
        "offsets.topic.num.partitions=10",
        "transaction.state.log.num.partitions=10",
        "# Consumers of the local stack start at once rather than after 3 s.",
        "group.initial.rebalance.delay.ms=0",
        "# A development stack: small thread pools, a day of data, 64 MiB segments.",
        "num.network.threads=2",
        "num.io.threads=4",
        "num.recovery.threads.per.data.dir=1",
        "log.retention.hours=24",
        "log.segment.bytes=67108864",
    ]
    return "\n".join(lines) + "\n"


def render_log4j2() -> str:
    """log4j2.properties: INFO to stdout, which the stack writes to logs/kafka.log."""
    return """\
# Written by `gpuwatch stack up`. stdout goes to <state>/logs/kafka.log, together with
# anything the JVM itself prints (a crash, an out-of-memory error).
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.target = SYSTEM_OUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
# Per-request and state-change logs are for debugging Kafka itself.
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
# Each component dumps all its ~300 settings at start; server.properties is in the state dir.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def jar_dir(settings: Settings) -> Path:
    """Where the jars of the configured Kafka version live once fetched."""
    return _version_dir(settings) / "lib"


def jars_present(settings: Settings) -> bool:
    """True when the jars of the configured version were fetched completely."""
    version = settings.stack.kafka_version
    return (jar_dir(settings) / f"kafka_{SCALA}-{version}.jar").is_file()


def fetch_jars(settings: Settings, progress: Progress, which: Which = shutil.which) -> Path:
    """Fetch the broker's jars with Maven, once per version; returns the jar directory.

    Maven writes into lib.partial/, renamed to lib/ when complete, so an interrupted
    fetch is redone rather than run with missing jars. A file lock keeps two
    concurrent `stack up` (two state dirs, one cache) from fetching over each other.
    """
    version = settings.stack.kafka_version
    home = _version_dir(settings)
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if jars_present(settings):
            return jar_dir(settings)
        mvn = require_binary("mvn", which)
        progress(f"fetching Kafka {version} jars with Maven into {home} (first run only)...")
        pom = home / "pom.xml"
        pom.write_text(render_pom(version), encoding="utf-8")
        partial = home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        mvn_log = home / "mvn.log"
        argv = [
            mvn,
            "-B",
            "-q",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
            "-DincludeScope=runtime",
        ]
        code, _ = run_logged(
            argv,
            cwd=home,
            log_path=mvn_log,
            timeout_s=MVN_TIMEOUT_S,
            timed_out=(
                f"Maven did not fetch the Kafka {version} jars within {MVN_TIMEOUT_S} s; "
                f"see {mvn_log}"
            ),
        )
        if code != 0:
            raise StackError(
                f"Maven could not fetch the Kafka {version} jars (exit {code}); "
                f"check the network or your Maven mirror in ~/.m2/settings.xml. "
                f"Last lines of {mvn_log}:\n{_ANSI.sub('', tail(mvn_log))}"
            )
        shutil.rmtree(home / "lib", ignore_errors=True)
        partial.rename(home / "lib")
        log.info("fetched kafka_version=%s jars=%s", version, home / "lib")
    if not jars_present(settings):
        raise StackError(
            f"Maven ran but kafka_{SCALA}-{version}.jar is not in {jar_dir(settings)}; "
            f"see {mvn_log}"
        )
    return jar_dir(settings)


class KafkaService(LocalService):
    """Checks, prepares and probes the local broker of one state directory."""

    name = "kafka"
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, settings: Settings, paths: StackPaths, which: Which = shutil.which):
        stack = settings.stack
        super().__init__(paths, which, stack.kafka_port, (stack.kafka_controller_port,))
        self.settings = settings
        self.data_dir = self.home / "data"
        self.config = self.home / "server.properties"
        self.log4j = self.home / "log4j2.properties"
        self.log_path = paths.log("kafka")
        self.java = "java"

    def check(self) -> None:
        """Java 17+ must be there, and Maven too while the jars are not fetched."""
        self.java = require_java(17, self.which)
        if not jars_present(self.settings):
            require_binary("mvn", self.which)

    def prepare(self, progress: Progress) -> list[str]:
        """Fetch jars, write the configuration, format the storage once; the command line."""
        stack = self.settings.stack
        lib = fetch_jars(self.settings, progress, self.which)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            render_server_properties(
                port=stack.kafka_port,
                controller_port=stack.kafka_controller_port,
                data_dir=self.data_dir,
            ),
            encoding="utf-8",
        )
        self.log4j.write_text(render_log4j2(), encoding="utf-8")
        if not (self.data_dir / "meta.properties").is_file():
            self._format(lib, progress)
        return [
            self.java,
            f"-Xmx{stack.kafka_heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j}",
            "-cp",
            f"{lib}/*",
            MAIN_CLASS,
            str(self.config),
        ]

    def probe(self) -> bool:
        """True when the broker answers a metadata request with itself in it."""
        return probe(HOST, self.port)

    def _format(self, lib: Path, progress: Progress) -> None:
        progress(f"formatting Kafka storage in {self.data_dir}...")
        cluster_id = new_cluster_id()
        argv = [
            self.java,
            f"-Dlog4j2.configurationFile={self.log4j}",
            "-cp",
            f"{lib}/*",
            STORAGE_TOOL,
            "format",
            # One token: a base64url id may start with "-", which argparse would read
            # as the next option (about 1 start in 64 failed that way).
            f"--cluster-id={cluster_id}",
            "-c",
            str(self.config),
            "--standalone",
        ]
        code, offset = run_logged(
            argv,
            cwd=self.home,
            log_path=self.log_path,
            timeout_s=FORMAT_TIMEOUT_S,
            timed_out=f"formatting Kafka storage timed out; see {self.log_path}",
            header="--- gpuwatch: formatting storage\n",
        )
        if code != 0:
            raise StackError(
                f"formatting Kafka storage in {self.data_dir} failed (exit {code}); "
                f"last lines of {self.log_path}:\n{tail(self.log_path, offset=offset)}"
            )
        log.info("formatted kafka data_dir=%s cluster_id=%s", self.data_dir, cluster_id)


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a Kafka broker on host:port answers a metadata request.

    A plain TCP connect comes first: while the port is closed it answers at once
    and spares kafka-python's retries and error logs.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError:
        return False
    admin = _admin_client(f"{host}:{port}", int(timeout_s * 1000))
    if admin is None:
        return False
    try:
        cluster = admin.describe_cluster()
    except Exception as exc:  # kafka-python raises KafkaError and others; any means "not ready"
        log.debug("kafka probe failed address=%s:%d error=%r", host, port, exc)
        return False
    finally:
        with contextlib.suppress(Exception):
            admin.close()
    return bool(cluster.get("brokers"))


def _admin_client(bootstrap: str, timeout_ms: int) -> Any:
    """A connected KafkaAdminClient, or None when the broker does not answer in time.

    kafka-python 3.0 starts its IO thread before bootstrapping in the constructor and
    does not stop it when bootstrapping fails; built in two steps, the thread of a
    failed client can be stopped here instead of leaking at every probe.
    """
    with warnings.catch_warnings():
        # kafka-python 3.0 reads its protocol schemas with importlib.resources.read_text.
        warnings.filterwarnings("ignore", KAFKA_IMPORT_WARNING, DeprecationWarning)
        from gpuwatch.kafka import KafkaAdminClient

    admin = KafkaAdminClient.__new__(KafkaAdminClient)
    try:
        admin.__init__(
            bootstrap_servers=bootstrap,
            client_id="gpuwatch-stack-probe",
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
            reconnect_backoff_max_ms=500,
        )
    except Exception as exc:  # see probe()
        log.debug("kafka probe could not bootstrap address=%s error=%r", bootstrap, exc)
        for part, method in (("_metrics", "close"), ("_client", "close"), ("_net", "stop")):
            with contextlib.suppress(Exception):
                getattr(getattr(admin, part), method)()
        return None
    return admin


def _version_dir(settings: Settings) -> Path:
    return settings.stack.cache_dir.expanduser().resolve() / "kafka" / settings.stack.kafka_version
