"""The job's Spark session: on this machine a local one kept on loopback; on a cluster, the cluster's.

A Spark given its master from outside (``spark-submit --master``, the Spark operator's driver pod, a
``spark-defaults.conf``) runs the job as that cluster says: the job then sets no master, driver host or bind
address, shuffle partition count, executor or driver memory, and gives its other settings only where the
cluster gave none. Without one, the job runs ``--master`` (``local[2]``) on 127.0.0.1 with the settings measured
for this machine.
"""
from __future__ import annotations

import os
import re
import sys

from core import classarchive
from core.procs import child_pythonpath
from core.rundir import ROOT as PROJECT_ROOT
from core.settings import get as setting

LOCAL_ONLY = ("spark.master", "spark.driver.host", "spark.driver.bindAddress", "spark.sql.shuffle.partitions",
              "spark.executor.memory", "spark.driver.memory", "spark.driver.extraJavaOptions",
              "spark.executor.extraJavaOptions", "spark.ui.enabled")
"""What the job sets only for a Spark it starts itself (a cluster's are the cluster's: its driver's memory is the
SparkApplication's ``driver.memory``, and its Spark UI stays on, as operators expect to reach it)."""


def _defaults_file() -> dict:
    """``spark-defaults.conf`` of ``SPARK_CONF_DIR`` (or ``$SPARK_HOME/conf``), as Spark reads it: KEY VALUE lines."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (os.path.join(os.environ["SPARK_HOME"], "conf")
                                                    if os.environ.get("SPARK_HOME") else None)
    out = {}
    if conf_dir is None:
        return out
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as f:
            for line in f:
                if (m := re.match(r"([^#!\s=:]+)\s*[=:\s]\s*(.*)", line.strip())):  # a Java properties line
                    out[m.group(1)] = m.group(2).strip()
    except OSError:
        pass
    return out


def given_conf() -> dict:
    """The Spark settings given from outside: spark-submit's (the JVM that started this process holds them as
    system properties; the Spark operator runs spark-submit too), else ``spark-defaults.conf``'s."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # started by spark-submit: its JVM is up, with the settings it was given
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        return dict(SparkConf().getAll())
    return _defaults_file()


def given_master() -> str | None:
    """The master a cluster gave, or None (the job then runs its ``--master``)."""
    return given_conf().get("spark.master")


def live_java_options(heap: str) -> str:
    """The live job's driver JVM options unless FLIGHTWATCH_DRIVER_JAVA_OPTIONS gives others. The live job lives as
    long as the run: its whole heap is committed and touched at start (as servers run a JVM) so that G1 does not grow
    it mid-run when a stall makes collections slow (a step of 70-110 MiB in soaks); it costs ~1.5 s of start per GiB.
    Its JIT stops at C1: C2 kept recompiling Spark's per-batch code paths for minutes (0.12 core of C2 thread at
    idle, 3 minutes in)."""
    return f"-Xms{heap} -XX:+AlwaysPreTouch -XX:TieredStopAtLevel=1"


def executor_java_options() -> str:
    """The executors' JVM options, on a cluster the job starts on (``--master spark://...``; a cluster that gives its
    own settings keeps its own): C1 only, as the driver's, and Spark's classes mapped from the class archive where one
    of this JVM and these jars exists (a host without it starts as before: ``-Xshare:auto`` maps nothing). The
    executors run the same per-batch code as the driver; a cluster's daemons: ``stack.spark.daemon_java_options``."""
    return " ".join(filter(None, ["-XX:TieredStopAtLevel=1", classarchive.java_options()]))


def settings(master: str, run_id: str, command: str, given: dict) -> dict:
    """What the job sets on its session builder, given what the cluster already set (``given``)."""
    heap = setting("FLIGHTWATCH_DRIVER_MEMORY", "2g")
    java_options = setting("FLIGHTWATCH_DRIVER_JAVA_OPTIONS")
    if java_options is None and command == "run":
        java_options = live_java_options(heap)
    if not any(cds in (java_options or "") for cds in ("Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")):
        # Spark's classes mapped from the archive `make install` built for this JVM and these jars (core.classarchive)
        java_options = " ".join(filter(None, [java_options, classarchive.java_options()])) or None
    ours = {
        "spark.master": master,
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": heap,
        "spark.executor.memory": setting("FLIGHTWATCH_EXECUTOR_MEMORY", "1g"),
        "spark.app.name": f"flightwatch-{run_id}",
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.sql.streaming.pollingDelay": "10ms",
        # local checkpoints without Hadoop's .crc side files: the offset and commit logs of every batch are
        # written in half the time (walCommit + commitOffsets, median 220 -> 100 ms a batch on two cores)
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
        # rename by FileSystem, not FileContext: FileContext's rename asks Hadoop's local file system for the link
        # status of source and target, which it gets by running `readlink` (4 processes forked a batch)
        "spark.sql.streaming.checkpointFileManagerClass":
            "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
        "spark.ui.showConsoleProgress": "false",
        # executors of a cluster (standalone, Kubernetes) import the project and use the same interpreter
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
    }
    if java_options:
        ours["spark.driver.extraJavaOptions"] = java_options
    if not master.startswith("local"):  # a local job's executor is its driver
        ours["spark.executor.extraJavaOptions"] = executor_java_options()
    if os.environ.get("PYSPARK_PYTHON") == WORKER_PYTHON:  # executors run the script too (the path is the driver's)
        ours["spark.executorEnv.FW_WORKER_PYTHON"] = os.environ["FW_WORKER_PYTHON"]
    if "spark.master" in given:  # a cluster's Spark: its own settings
        ours = {k: v for k, v in ours.items() if k not in LOCAL_ONLY}
        # an executor whose tasks fail (its host lost the run folders' volume: streaming.executors.check_run_folder)
        # gets no more of them: a task is run again on another, not on the same one until it fails four times
        ours["spark.excludeOnFailure.enabled"] = "true"
        asked = setting("FLIGHTWATCH_DRIVER_MEMORY")
        if asked and asked != given.get("spark.driver.memory"):
            import logging

            logging.getLogger("flightwatch.streaming").warning(
                "FLIGHTWATCH_DRIVER_MEMORY=%s is not used on a cluster: the driver was started with spark.driver.memory=%s "
                "(the SparkApplication's driver.memory, or spark-submit --driver-memory)", asked,
                given.get("spark.driver.memory", "Spark's default, 1g"))
    return {k: v for k, v in ours.items() if k not in given or k == "spark.app.name"}


WORKER_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker-python")
"""The job's Python workers, where they would run this interpreter (always for a local job; on a cluster, unless
PYSPARK_PYTHON names another): this interpreter, with pyspark imported compiled rather than from Spark's zip (~1 CPU-s
less in each of the five Python processes a job starts; the script says how)."""


def packages_installed() -> bool:
    """Whether this interpreter's pyspark and py4j are installed packages, not imported from a zip on PYTHONPATH (so
    that a worker does without Spark's zips of them), and the workers' script is there to run."""
    import importlib.util

    def compiled(name: str) -> bool:
        spec = importlib.util.find_spec(name)
        return bool(spec and spec.origin and os.path.isfile(spec.origin))

    return compiled("pyspark") and compiled("py4j") and os.access(WORKER_PYTHON, os.X_OK)


def build_spark(master: str, run_id: str, command: str):
    """The Spark session: the cluster's when one gave a master, else a local one on loopback, with the project
    importable by Python workers (here and on executors)."""
    given = given_conf()
    if "spark.master" not in given:  # Python workers run this interpreter, on loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:  # the image's (the entrypoint sets it), or this one
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if os.environ["PYSPARK_PYTHON"] == sys.executable and packages_installed():
        # this interpreter all the same, with pyspark imported compiled (a cluster's executors are given it too)
        os.environ["PYSPARK_PYTHON"], os.environ["FW_WORKER_PYTHON"] = WORKER_PYTHON, sys.executable
    os.environ["PYTHONPATH"] = child_pythonpath(PROJECT_ROOT)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in settings(master, run_id, command, given).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
