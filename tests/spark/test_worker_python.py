"""Which Python ``nsq_spark.spark.register`` gives Spark's Python workers (the rule:
nsq_spark/spark/_python.py), on stand-in contexts: no JVM. The live proof, a venv that is
not activated running the getting-started page's Spark query, is
tests/test_getting_started.py."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest

from nsq_spark.spark._python import choose_worker_python

pytestmark = pytest.mark.unit


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class Context:
    def __init__(self, master: str, conf: dict[str, str] | None = None,
                 python: str = "python3") -> None:
        self.master = master
        self.pythonExec = python
        self._conf = Conf(conf or {})

    def getConf(self) -> Conf:
        return self._conf


class Session:
    def __init__(self, sc: Any) -> None:
        self._sc = sc

    @property
    def sparkContext(self) -> Any:
        if self._sc is None:  # as Spark Connect's session does
            raise RuntimeError("[NOT_IMPLEMENTED] sparkContext() is not implemented.")
        return self._sc


@pytest.fixture(autouse=True)
def no_pyspark_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local-cluster[2,1,1024]"])
def test_a_local_master_runs_this_interpreter_when_nothing_is_set(master: str) -> None:
    sc = Context(master)
    assert choose_worker_python(Session(sc)) == sys.executable
    assert sc.pythonExec == sys.executable


def test_pyspark_python_in_the_environment_is_the_users_choice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    sc = Context("local[2]", python="/opt/py/bin/python")
    assert choose_worker_python(Session(sc)) is None
    assert sc.pythonExec == "/opt/py/bin/python"


def test_spark_pyspark_python_in_the_conf_is_the_users_choice() -> None:
    sc = Context("local[2]", conf={"spark.pyspark.python": "/opt/py/bin/python"})
    assert choose_worker_python(Session(sc)) is None
    assert sc.pythonExec == "python3"


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://k:443"])
def test_a_cluster_master_is_left_alone_with_one_warning_naming_the_fix(
        master: str, caplog: pytest.LogCaptureFixture) -> None:
    sc = Context(master)
    with caplog.at_level(logging.WARNING, logger="nsq_spark.spark"):
        assert choose_worker_python(Session(sc)) is None
    assert sc.pythonExec == "python3"  # this path may not exist on the workers
    (record,) = [r for r in caplog.records if r.name == "nsq_spark.spark"]
    text = record.getMessage()
    assert "PYSPARK_PYTHON" in text and "'python3'" in text and master in text, text
    assert "No module named 'nsq_spark'" in text, text


def test_spark_connect_has_no_context_and_nothing_changes() -> None:
    assert choose_worker_python(Session(None)) is None
