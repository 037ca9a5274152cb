"""A real Prometheus server for the tier: Debian's ``prometheus`` binary (or
``$PROMETHEUS_BIN``), started with a generated config (1 s scrape and evaluation
intervals, the given scrape targets and rule files), a temporary storage directory and
its web API on a free loopback port; stopped by its pid, its directory removed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from nsq_spark.testing import free_port


def prometheus_binary() -> str | None:
    return os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)


def promtool_binary() -> str | None:
    return os.environ.get("PROMTOOL_BIN") or shutil.which("promtool")


class PrometheusError(AssertionError):
    pass


class PrometheusServer:
    """``with PrometheusServer(binary, ["127.0.0.1:9100"], rules) as prom:
    prom.query("up")``."""

    def __init__(self, binary: str, targets: Sequence[str],
                 rule_files: Sequence[str | os.PathLike[str]] = (),
                 start_timeout: float = 30.0) -> None:
        self.binary = binary
        self.targets = list(targets)
        self.rule_files = [str(Path(p).resolve()) for p in rule_files]
        self.start_timeout = start_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "PrometheusServer":
        self._dir = tempfile.mkdtemp(prefix="nsq-spark-prometheus-")
        config = Path(self._dir, "prometheus.yml")
        # JSON is YAML: no YAML library needed
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": self.rule_files,
            "scrape_configs": [{"job_name": "nsq-spark",
                                "static_configs": [{"targets": self.targets}]}]}))
        self.port = free_port()
        self._log = open(Path(self._dir, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={config}",
             f"--storage.tsdb.path={Path(self._dir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self._dir)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited ({self.proc.returncode}):\n"
                                      f"{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready in {self.start_timeout} s:\n"
                              f"{self.logs()}")

    def logs(self) -> str:
        if self._dir is None:
            return ""
        path = Path(self._dir, "prometheus.log")
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- the HTTP API ---------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns ``data``; raises PrometheusError unless success."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad expression
            doc = json.loads(exc.read() or b"{}")
        if doc.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {doc.get('errorType')}: "
                                  f"{doc.get('error')}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self.api("query", query=expr)
        return list(data["result"]) if data["resultType"] == "vector" else [data]

    def values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def wait_for(self, expr: str, check: Callable[[list[float]], bool], timeout: float,
                 what: str) -> list[float]:
        """Poll ``expr`` until ``check(values)``; bounded by ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        got: list[float] = []
        while time.monotonic() < deadline:
            got = self.values(expr)
            if check(got):
                return got
            time.sleep(0.25)
        raise PrometheusError(f"{what}: {expr} was {got} after {timeout} s")
