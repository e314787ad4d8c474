"""The job's Spark settings: this machine's for a Spark it starts itself, the cluster's for one given a master
(through spark-submit, the Spark operator or a spark-defaults.conf). The run through spark-submit on a standalone
cluster is in tests/system/test_distributed.py."""
from __future__ import annotations

import pytest

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


SPARKS_OWN = ("{p}/python/lib/pyspark.zip", "{p}/python/lib/py4j-0.10.9.9-src.zip", "{p}/jars/spark-core_2.13-4.3.0.jar")


def test_a_local_jobs_workers_drop_sparks_zips_of_pyspark_and_keep_the_rest_of_their_path_in_order(tmp_path):
    """streaming/worker-python: Spark's own copies of pyspark, py4j and its core jar off the path (the interpreter has
    them installed and compiled); every other entry kept, in its order; the interpreter the job gave run with the
    arguments as given."""
    import os
    import subprocess
    import sys

    import pyspark

    home = os.path.dirname(pyspark.__file__)
    spark = [s.format(p=home) for s in SPARKS_OWN]
    path = ":".join([spark[2], "/a b", "/c", spark[0], spark[1], "/d/pyspark.zip.not", "/c"])
    p = subprocess.run([session.WORKER_PYTHON, "-c", "import os, sys, pyspark, py4j; print(os.environ['PYTHONPATH']);"
                        "print(sys.argv[1:]); print(pyspark.__file__); print(py4j.__file__); print(sys.executable)",
                        "x y", "-m"], env=dict(os.environ, PYTHONPATH=path, FW_WORKER_PYTHON=sys.executable),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    kept, argv, imported, py4j_file, exe = p.stdout.splitlines()
    assert kept == "/a b:/c:/d/pyspark.zip.not:/c" and argv == "['x y', '-m']" and exe == sys.executable
    assert imported == pyspark.__file__ and ".zip" not in py4j_file
    assert session.packages_installed()
    # a driver whose pyspark is Spark's zip (a Spark distribution on PYTHONPATH) keeps it for its workers
    check = "from streaming import session; print(session.packages_installed())"
    p = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=":".join([spark[0], spark[1], session.PROJECT_ROOT])))
    assert p.stdout.strip() == "False", p.stdout + p.stderr


@pytest.mark.integration
def test_a_local_sessions_python_workers_import_the_installed_pyspark():
    """A real local session (``build_spark``): its task's Python worker imports pyspark from the package, compiled,
    not from Spark's zip, and runs this interpreter."""
    import os
    import subprocess
    import sys

    code = ("import sys; from streaming.session import build_spark; s = build_spark('local[1]', 'zips', 'replay');"
            "print(s.sparkContext.parallelize([0], 1).map(lambda _: (__import__('pyspark').__file__, "
            "sys.executable)).collect()[0]); s.stop()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHONPATH=session.PROJECT_ROOT), cwd=session.PROJECT_ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    import pyspark

    assert p.stdout.strip().splitlines()[-1] == repr((pyspark.__file__, sys.executable)), p.stdout


def test_a_clusters_executors_are_given_the_interpreter_the_workers_script_runs(monkeypatch):
    """Where the job's workers run the script, a cluster's executors are told which interpreter it runs (the script's
    path and the interpreter are the driver's, as PYTHONPATH's project is); where PYSPARK_PYTHON names another (an
    image's entrypoint), nothing is added."""
    monkeypatch.setenv("PYTHONPATH", "/p")
    given = {"spark.master": "spark://10.0.0.2:7077"}
    monkeypatch.setenv("PYSPARK_PYTHON", session.WORKER_PYTHON)
    monkeypatch.setenv("FW_WORKER_PYTHON", "/venv/bin/python")
    assert session.settings("local[2]", "r1", "run", given)["spark.executorEnv.FW_WORKER_PYTHON"] == "/venv/bin/python"
    monkeypatch.setenv("PYSPARK_PYTHON", "python3")
    assert "spark.executorEnv.FW_WORKER_PYTHON" not in session.settings("local[2]", "r1", "run", given)
