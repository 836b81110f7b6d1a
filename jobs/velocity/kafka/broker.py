"""The local Kafka broker behind `velocity up` / `velocity down` (the embedded default).

What callers rely on:
- ``kafka_up`` is idempotent: when this data dir's broker already answers on
  ``VELOCITY_KAFKA_BOOTSTRAP`` it only reports it (``started=False``). Otherwise it writes
  ``<data_dir>/kafka/server.properties`` (one KRaft node that is broker and controller,
  listening on the loopback address only, the controller on the next port), formats the
  storage on the first start, starts the broker from the JARs ``infra/fetch_jars.sh``
  fetched from Maven Central, and returns once it answers a metadata request. It then
  creates the events and alerts topics when they are missing.
- ``kafka_down`` stops that broker (SIGTERM: a controlled shutdown) and waits until it is
  gone; it returns False and does nothing when none runs.
- Only a local broker is managed: ``local_kafka`` is None when the bootstrap names a host
  that is not a loopback address (the stream then uses that broker as it is) or is empty
  (no Kafka). A broker on the port that belongs to another data dir (another cluster id)
  is never adopted or stopped.
- The pure part (``local_kafka``, ``render_config``, ``broker_command``,
  ``format_command``, ``broker_libs``) needs no broker and no network.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from velocity.errors import UsageError, VelocityError
from velocity.operating.local_process import log_tail, pidfile_process, process_alive
from velocity.settings import Settings, loopback_address

_POLL_SECONDS = 0.2
BROKER_HEAP = "-Xmx512m"


@dataclass(frozen=True)
class LocalKafka:
    """Where the local broker listens and keeps its files (all under ``home``)."""

    host: str
    port: int
    home: Path
    """``<data_dir>/kafka``: config, pidfile, log, cluster id and the log segments."""

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.home / "server.properties"

    @property
    def log_config_path(self) -> Path:
        return self.home / "log4j2.properties"

    @property
    def pid_path(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_path(self) -> Path:
        return self.home / "broker.log"

    @property
    def data_path(self) -> Path:
        return self.home / "data"

    @property
    def cluster_id_path(self) -> Path:
        return self.home / "cluster.id"


@dataclass(frozen=True)
class KafkaStatus:
    """A running local broker, as ``kafka_up`` found or started it."""

    bootstrap: str
    pid: int | None
    version: str
    started: bool
    """True when this call started the broker, False when it was already running."""
    log_path: Path


def local_kafka(settings: Settings) -> LocalKafka | None:
    """The local broker that ``settings.kafka_bootstrap`` names, or None when it names no
    broker or one on another host (which Velocity uses but never starts or stops)."""
    servers = [s.strip() for s in settings.kafka_bootstrap.split(",") if s.strip()]
    if not servers:
        return None
    if len(servers) > 1:
        return None  # a cluster: someone else's to run
    host, colon, port_text = servers[0].rpartition(":")
    if colon and loopback_address(host.strip("[]").lower()) is None:
        return None
    bind = loopback_address(host.strip("[]").lower())
    if bind is None or not port_text.isdigit() or not 0 < int(port_text) < 65535:
        raise UsageError(
            f"VELOCITY_KAFKA_BOOTSTRAP {settings.kafka_bootstrap!r} has no valid port: "
            "use HOST:PORT, e.g. 127.0.0.1:9392"
        )
    return LocalKafka(bind, int(port_text), settings.data_dir / "kafka")


def broker_libs(settings: Settings) -> Path:
    """The newest complete broker folder ``infra/fetch_jars.sh`` fetched (its ``libs``)."""
    complete = sorted(
        (p for p in settings.kafka_home.glob("*/.complete")),
        key=lambda p: tuple(int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")),
    )
    if not complete:
        raise VelocityError(
            f"no Kafka broker JARs in {settings.kafka_home}; run `bash infra/fetch_jars.sh` "
            "(or `make setup`) once"
        )
    return complete[-1].parent / "libs"


def broker_version(libs: Path) -> str:
    return libs.parent.name


def render_config(broker: LocalKafka, partitions: int) -> str:
    """server.properties of a one-node KRaft cluster on the loopback address."""
    listeners = (
        f"PLAINTEXT://{broker.host}:{broker.port},"
        f"CONTROLLER://{broker.host}:{broker.controller_port}"
    )
    lines = [
        "# Written by `velocity up` on every start; change VELOCITY_KAFKA_BOOTSTRAP or",
        "# VELOCITY_DATA_DIR instead of editing this file.",
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{broker.host}:{broker.controller_port}",
        f"listeners={listeners}",
        f"advertised.listeners=PLAINTEXT://{broker.host}:{broker.port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={broker.data_path}",
        # One node: every internal topic has one replica.
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        f"num.partitions={partitions}",
        # Payments are kept a week, like the transactionIds the stream de-duplicates.
        "log.retention.hours=168",
    ]
    return "\n".join(lines) + "\n"


_LOG_CONFIG = """\
# Written by `velocity up`: warnings and the broker's start and stop, to broker.log.
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
"""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise VelocityError("java is not on PATH; the Kafka broker needs Java 17 (`make setup`)")
    return found


def _class_path(libs: Path) -> str:
    return str(libs / "*")


def broker_command(java: str, libs: Path, broker: LocalKafka) -> list[str]:
    """The broker's command line (it stays in the foreground; ``kafka_up`` detaches it)."""
    return [
        java, BROKER_HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={broker.log_config_path}",
        "-cp", _class_path(libs), "kafka.Kafka", str(broker.config_path),
    ]  # fmt: skip


def format_command(java: str, libs: Path, broker: LocalKafka, cluster_id: str) -> list[str]:
    """Formats empty storage for ``cluster_id``; refuses storage formatted before."""
    return [
        java, f"-Dlog4j2.configurationFile={broker.log_config_path}",
        "-cp", _class_path(libs), "kafka.tools.StorageTool", "format",
        # `=` keeps an id that starts with "-" from being read as an option.
        f"--cluster-id={cluster_id}", "-c", str(broker.config_path),
    ]  # fmt: skip


def kafka_up(settings: Settings, *, timeout_seconds: float = 90.0) -> KafkaStatus | None:
    """Start the local broker unless it already runs; None when Kafka is off or remote."""
    from velocity.kafka import topics

    broker = local_kafka(settings)
    if broker is None:
        return None
    libs = broker_libs(settings)
    running = _running_status(broker, libs, started=False)
    pid = _pidfile_broker(broker)
    if running is None and pid is not None:
        # Ours runs but did not answer the probe's second (still starting, or a busy
        # machine): wait for it; a second broker would die on the same log dirs.
        running = _await_answer(
            broker, libs, lambda: None if process_alive(pid) else "exited",
            started=False, timeout_seconds=timeout_seconds,
        )  # fmt: skip
    if running is not None:
        topics.ensure_topics(settings)
        return running
    java = _java()
    broker.home.mkdir(parents=True, exist_ok=True)
    broker.config_path.write_text(render_config(broker, settings.kafka_partitions))
    broker.log_config_path.write_text(_LOG_CONFIG)
    if not (broker.data_path / "meta.properties").exists():
        cluster_id = _cluster_id(broker)
        result = subprocess.run(
            format_command(java, libs, broker, cluster_id),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise VelocityError(
                f"formatting the Kafka storage in {broker.data_path} failed "
                f"(exit {result.returncode}): {(result.stderr or result.stdout).strip()[-800:]}"
            )
    with open(broker.log_path, "ab") as log:
        process = subprocess.Popen(
            broker_command(java, libs, broker),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives `velocity up`, like the daemonised Redis
        )  # fmt: skip
    broker.pid_path.write_text(f"{process.pid}\n")
    status = _await_answer(
        broker, libs,
        lambda: None if process.poll() is None else f"exited with {process.returncode}",
        started=True, timeout_seconds=timeout_seconds,
    )  # fmt: skip
    topics.ensure_topics(settings)
    return status


def kafka_down(settings: Settings, *, timeout_seconds: float = 60.0) -> bool:
    """Stop the local broker; True if one was stopped, False if none ran (or Kafka is off
    or remote)."""
    broker = local_kafka(settings)
    if broker is None:
        return False
    pid = _pidfile_broker(broker)
    if pid is None:
        broker.pid_path.unlink(missing_ok=True)  # stale, if anything
        return False
    os.kill(pid, signal.SIGTERM)  # a controlled shutdown: the log is flushed and closed
    deadline = time.monotonic() + timeout_seconds
    while process_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # its log recovers on the next start
            deadline = time.monotonic() + 10
        time.sleep(_POLL_SECONDS)
    broker.pid_path.unlink(missing_ok=True)
    return True


# -- internals --------------------------------------------------------------------------------


def _cluster_id(broker: LocalKafka) -> str:
    """This data dir's cluster id, made once: it also tells our broker from another."""
    if broker.cluster_id_path.exists():
        return broker.cluster_id_path.read_text().strip()
    cluster_id = new_cluster_id()
    broker.cluster_id_path.write_text(cluster_id + "\n")
    return cluster_id


def new_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid`` makes one: 16 random bytes in URL-safe
    base64 without padding, drawn again when it starts with "-" (1 in 64), which command
    lines would take for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _running_status(broker: LocalKafka, libs: Path, *, started: bool) -> KafkaStatus | None:
    """The status of this data dir's broker when it answers; None when nothing listens.
    Raises ``UsageError`` when another cluster answers on the port."""
    from velocity.kafka.topics import cluster_id_of

    answered = cluster_id_of(broker.bootstrap, timeout_seconds=1.0)
    if answered is None:
        return None
    ours = broker.cluster_id_path.read_text().strip() if broker.cluster_id_path.exists() else None
    if answered != ours:
        raise UsageError(
            f"a Kafka broker of another cluster ({answered}) answers on {broker.bootstrap}, not "
            f"the one of {broker.home}: stop it, or choose another port in "
            "VELOCITY_KAFKA_BOOTSTRAP"
        )
    return KafkaStatus(
        broker.bootstrap, _pidfile_broker(broker), broker_version(libs), started, broker.log_path
    )


def _await_answer(
    broker: LocalKafka,
    libs: Path,
    exited: Callable[[], str | None],
    *,
    started: bool,
    timeout_seconds: float,
) -> KafkaStatus:
    """The broker's status once it answers; ``exited()`` says how it ended, if it did."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        status = _running_status(broker, libs, started=started)
        if status is not None:
            return status
        ended = exited()
        if ended is not None:
            broker.pid_path.unlink(missing_ok=True)
            raise VelocityError(
                f"the Kafka broker {ended} while starting{log_tail(broker.log_path)}"
            )
        if time.monotonic() > deadline:
            raise VelocityError(
                f"the Kafka broker started but did not answer on {broker.bootstrap} within "
                f"{timeout_seconds:g}s{log_tail(broker.log_path)}"
            )
        time.sleep(_POLL_SECONDS)


def _pidfile_broker(broker: LocalKafka) -> int | None:
    """The live broker the pidfile names: only a process started with this config."""
    return pidfile_process(broker.pid_path, str(broker.config_path).encode())
