"""The job's JVM class archive (core.classarchive): named by its JVM and its jars, given to a local job's JVM only when
one of that key exists, and (the one `make install` built) mapped by the JVM Spark runs, with Spark's jars."""
from __future__ import annotations

import os
import subprocess

import pytest

from core import classarchive
from stack import spark
from streaming import session


@pytest.fixture
def spark_home(tmp_path, monkeypatch):
    """A Spark of two jars and a java of its own: the key is theirs."""
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    for name in ("a.jar", "b.jar"):
        (tmp_path / "spark" / "jars" / name).write_bytes(b"PK" + name.encode())
    (tmp_path / "jdk" / "bin").mkdir(parents=True)
    (tmp_path / "jdk" / "bin" / "java").write_text("#!/bin/sh\n")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setattr(classarchive, "FOLDER", str(tmp_path / "archives"))
    return tmp_path


def test_the_key_changes_with_a_jar_or_the_jvm_and_only_then(spark_home):
    k = classarchive.key()
    assert k == classarchive.key() and len(k) == 16
    jar = spark_home / "spark" / "jars" / "b.jar"
    os.utime(jar, ns=(0, 10**18))
    assert classarchive.key() not in (None, k)  # the JVM would refuse the archive of the jar before: another name
    k2 = classarchive.key()
    (spark_home / "spark" / "jars" / "c.jar").write_bytes(b"PK")
    assert classarchive.key() not in (k, k2)
    k3 = classarchive.key()
    (spark_home / "jdk" / "bin" / "java").write_text("#!/bin/sh\n# another build\n")
    assert classarchive.key() not in (k, k2, k3)


def test_a_job_maps_the_archive_only_when_one_of_its_key_exists(spark_home, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/p")
    assert classarchive.java_options() == ""
    s = session.settings("local[2]", "r1", "replay", given={})
    assert "spark.driver.extraJavaOptions" not in s  # none: the JVM starts as it did before
    os.makedirs(classarchive.FOLDER)
    (spark_home / "archives" / f"spark-{classarchive.key()}.jsa").write_bytes(b"")
    options = f"-XX:SharedArchiveFile={classarchive.path()} -Xshare:auto"
    assert session.settings("local[2]", "r1", "replay", given={})["spark.driver.extraJavaOptions"] == options
    live = session.settings("local[2]", "r1", "run", given={})["spark.driver.extraJavaOptions"]
    assert live.startswith("-Xms2g -XX:+AlwaysPreTouch") and live.endswith(options)
    monkeypatch.setenv("FLIGHTWATCH_DRIVER_JAVA_OPTIONS", "-Xshare:off")  # the user's word on CDS stands
    assert session.settings("local[2]", "r1", "run", given={})["spark.driver.extraJavaOptions"] == "-Xshare:off"
    monkeypatch.delenv("FLIGHTWATCH_DRIVER_JAVA_OPTIONS")
    cluster = session.settings("local[2]", "r1", "run", given={"spark.master": "spark://h:7077"})
    assert "spark.driver.extraJavaOptions" not in cluster  # a cluster's JVMs are the cluster's
    assert "spark.executor.extraJavaOptions" not in cluster
    assert "spark.executor.extraJavaOptions" not in s  # a local job's executor is its driver
    ours = session.settings("spark://h:7077", "r1", "run", given={})  # a cluster the job starts on (--master)
    assert ours["spark.executor.extraJavaOptions"] == f"-XX:TieredStopAtLevel=1 {options}"
    assert spark.daemon_java_options() == f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {options}"


@pytest.mark.integration
def test_the_installed_archive_is_mapped_by_the_jvm_spark_runs_with_sparks_jars():
    """`make install` built it (make test depends on it). -Xshare:on makes a JVM that cannot map it fail, as one of another
    JVM build or with other jars (or another order of them) would."""
    java, jars, archive = classarchive.java(), classarchive.spark_jars(), classarchive.path()
    if java is None:
        pytest.skip("no java here: Spark cannot run either")
    assert os.path.isfile(archive), f"no class archive for this JVM and these jars: run `make install` ({archive})"
    home = os.path.dirname(jars)  # spark-submit --version starts the JVM a job's driver runs, with its classpath
    ok = subprocess.run([os.path.join(home, "bin", "spark-submit"), "--driver-java-options",
                         f"-XX:SharedArchiveFile={archive} -Xshare:on -Xlog:cds=info", "--version"],
                        env=dict(os.environ, SPARK_HOME=home, JAVA_HOME=os.path.dirname(os.path.dirname(java))),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "Mapped dynamic region" in ok.stdout, ok.stdout[-2000:]
