"""Starting and stopping a mink-node process for the interop suites."""

import os
import pathlib
import re
import signal
import subprocess
import threading
import time

from conftest import clean_env


class NodeProcess:
    """A mink-node on loopback ports chosen by the OS, with its stderr collected."""

    def __init__(self, binary, workdir, env=None):
        self.workdir = pathlib.Path(workdir)
        self.lines = []
        self.proc = subprocess.Popen(
            [str(binary)],
            cwd=workdir,
            env=clean_env(
                {
                    "RUST_LOG": "info",
                    "MINK_LISTENERS__FLIGHT": "127.0.0.1:0",
                    "MINK_LISTENERS__ADMIN": "127.0.0.1:0",
                    "MINK_LISTENERS__KAFKA": "127.0.0.1:0",
                    "MINK_LISTENERS__ICEBERG_REST": "127.0.0.1:0",
                    "MINK_META__HEARTBEAT_INTERVAL_MS": "200",
                    "MINK_META__LEASE_TIMEOUT_MS": "2000",
                    "MINK_META__NODE_SESSION_TIMEOUT_MS": "3000",
                    "MINK_META__TAIL_IDLE_INTERVAL_MAX_MS": "200",
                    # A new group does not wait 3 s for more members (the tests
                    # that need the wait set it).
                    "MINK_KAFKA__INITIAL_REBALANCE_DELAY_MS": "0",
                    **(env or {}),
                }
            ),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.flight_port = None
        self.admin_port = None
        self.kafka_port = None
        self.iceberg_rest_port = None
        found = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"admin HTTP listening on 127\.0\.0\.1:(\d+)", line)
                if m:
                    self.admin_port = int(m.group(1))
                m = re.search(r"Kafka listening on 127\.0\.0\.1:(\d+)", line)
                if m:
                    self.kafka_port = int(m.group(1))
                m = re.search(r"Flight listening on 127\.0\.0\.1:(\d+)", line)
                if m:
                    self.flight_port = int(m.group(1))
                m = re.search(r"Iceberg REST catalog listening on 127\.0\.0\.1:(\d+)", line)
                if m:
                    self.iceberg_rest_port = int(m.group(1))
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 60
        while (self.flight_port is None or self.admin_port is None) and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.flight_port is None or self.admin_port is None:
            self.kill()
            raise AssertionError("the node did not start:\n" + "".join(self.lines))

    @property
    def bootstrap(self):
        """The Kafka bootstrap address."""
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def iceberg_rest(self):
        """The Iceberg REST catalog's base URI."""
        return f"http://127.0.0.1:{self.iceberg_rest_port}"

    @property
    def location(self):
        return f"grpc://127.0.0.1:{self.flight_port}"

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def retry(fn, timeout=15, what="operation"):
    """Retries `fn` while the cluster settles (bucket leaders being assigned)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any transient error, re-raised at the deadline
            if time.monotonic() > deadline or "no leader yet" not in str(e):
                raise
            time.sleep(0.1)


def lose_object_store(objects_dir):
    """Makes a file:// object store unusable for the nodes on it, as a lost store would
    be: its directory is moved away and a plain file takes its name, so every request
    under it fails (even for root, who ignores permissions)."""
    objects_dir = pathlib.Path(objects_dir)
    objects_dir.rename(objects_dir.with_name(objects_dir.name + ".lost"))
    objects_dir.write_text("not a directory")


def wait_for(probe, timeout=15, what="a condition"):
    """Polls `probe` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.1)


class QueryProcess:
    """A mink-query on a loopback port chosen by the OS, against `nodes` (host:port of
    their Flight listeners), with its stderr collected."""

    def __init__(self, binary, workdir, nodes, env=None):
        self.lines = []
        self.proc = subprocess.Popen(
            [str(binary)],
            cwd=workdir,
            env=clean_env(
                {
                    "RUST_LOG": "info",
                    "MINK_QUERY_LISTEN": "127.0.0.1:0",
                    "MINK_QUERY_NODES": "[" + ",".join(f'"{n}"' for n in nodes) + "]",
                    **(env or {}),
                }
            ),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.port = None

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"Flight SQL listening on 127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 60
        while self.port is None and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.kill()
            raise AssertionError("mink-query did not start:\n" + "".join(self.lines))

    @property
    def uri(self):
        return f"grpc://127.0.0.1:{self.port}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
