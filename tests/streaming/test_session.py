"""The job's Spark settings: this machine's for a Spark it starts itself, the cluster's for one given a master
(through spark-submit, the Spark operator or a spark-defaults.conf). The run through spark-submit on a standalone
cluster is in tests/system/test_distributed.py."""
from __future__ import annotations

from streaming import session


def test_a_local_spark_gets_this_machines_settings(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/p")
    s = session.settings("local[2]", "r1", "run", given={})
    assert s["spark.master"] == "local[2]" and s["spark.driver.host"] == s["spark.driver.bindAddress"] == "127.0.0.1"
    assert s["spark.sql.shuffle.partitions"] == "2" and s["spark.app.name"] == "flightwatch-r1"
    assert "-XX:+AlwaysPreTouch" in s["spark.driver.extraJavaOptions"] and s["spark.executorEnv.PYTHONPATH"] == "/p"
    assert s["spark.ui.enabled"] == "false"  # here: one core less busy, no port opened


def test_a_clusters_spark_keeps_its_own(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/p")
    given = {"spark.master": "k8s://https://api:6443", "spark.sql.shuffle.partitions": "16",
             "spark.executorEnv.PYTHONPATH": "/opt/flightwatch", "spark.app.name": "__main__.py"}
    s = session.settings("local[2]", "r1", "run", given)
    assert not set(s) & set(session.LOCAL_ONLY), set(s) & set(session.LOCAL_ONLY)
    assert "spark.executorEnv.PYTHONPATH" not in s  # the image's
    assert s["spark.app.name"] == "flightwatch-r1" and s["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert "spark.ui.enabled" not in s  # a cluster's Spark UI stays on (Spark's default)
    assert s["spark.excludeOnFailure.enabled"] == "true"  # a host that fails tasks (its volume gone) gets no more
    assert "spark.excludeOnFailure.enabled" not in session.settings("local[2]", "r1", "run", given={})
    assert "spark.excludeOnFailure.enabled" not in session.settings(
        "local[2]", "r1", "run", {**given, "spark.excludeOnFailure.enabled": "false"})  # the cluster's word stands


def test_on_a_cluster_the_driver_memory_is_the_clusters_and_a_different_ask_is_said(monkeypatch, caplog):
    monkeypatch.setenv("PYTHONPATH", "/p")
    given = {"spark.master": "k8s://https://api:6443", "spark.driver.memory": "4g"}
    monkeypatch.setenv("FLIGHTWATCH_DRIVER_MEMORY", "4g")
    with caplog.at_level("WARNING"):
        assert "spark.driver.memory" not in session.settings("local[2]", "r1", "run", given)
    assert not caplog.records
    monkeypatch.setenv("FLIGHTWATCH_DRIVER_MEMORY", "8g")
    with caplog.at_level("WARNING"):
        session.settings("local[2]", "r1", "run", given)
    assert [r.getMessage() for r in caplog.records] == [
        "FLIGHTWATCH_DRIVER_MEMORY=8g is not used on a cluster: the driver was started with spark.driver.memory=4g "
        "(the SparkApplication's driver.memory, or spark-submit --driver-memory)"]


def test_a_master_in_spark_defaults_is_a_given_master(tmp_path, monkeypatch):
    (tmp_path / "spark-defaults.conf").write_text("# the cluster's\nspark.master   spark://10.0.0.5:7077\n"
                                                  "spark.executor.memory=4g\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert session.given_conf() == {"spark.master": "spark://10.0.0.5:7077", "spark.executor.memory": "4g"}
    assert session.given_master() == "spark://10.0.0.5:7077"
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "none"))
    assert session.given_master() is None
