"""Jars from the Maven registry for the JVM parts the stack and the benchmarks run (Apache Kafka, RabbitMQ PerfTest):
an artifact list and every runtime dependency of theirs, copied into one folder under ``.stack/downloads/``
(git-ignored) by ``mvn -C dependency:copy-dependencies``: every file's checksum is checked against the registry's,
and a mismatch fails the fetch. A folder is complete once its marker is written; an interrupted fetch starts over.

    lib = maven.fetch("kafka-4.4.0", [("org.apache.kafka", "kafka_2.13", "4.4.0"), ...], "Apache Kafka 4.4.0")
    java -cp 'lib/*' MAIN ...
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from core.rundir import ROOT

CACHE = os.path.join(ROOT, ".stack", "downloads")
DONE = ".complete"


def pom(name: str, artifacts: list[tuple[str, str, str]]) -> str:
    deps = "".join(f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>\n"
                   for g, a, v in artifacts)
    return (f'<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
            f"  <groupId>flightwatch</groupId><artifactId>{name}</artifactId><version>1</version>\n"
            f"  <packaging>pom</packaging>\n  <dependencies>\n{deps}  </dependencies>\n</project>\n")


def fetch(name: str, artifacts: list[tuple[str, str, str]], what: str, cache: str = CACHE, log=print) -> str:
    """The folder of ``artifacts``' jars and their runtime dependencies (``cache/name/lib``), fetched if it is not
    yet; ``RuntimeError`` saying what failed."""
    where = os.path.join(cache, name)
    lib = os.path.join(where, "lib")
    if os.path.exists(os.path.join(lib, DONE)):
        return lib
    if shutil.which("mvn") is None:
        raise RuntimeError(f"{what} needs Maven to fetch its jars (apt-get install maven)")
    shutil.rmtree(lib, ignore_errors=True)
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "pom.xml"), "w") as f:
        f.write(pom(name, artifacts))
    log(f"fetching {what} and its dependencies from the Maven registry ...")
    done = subprocess.run(["mvn", "-q", "-B", "-C", "-f", os.path.join(where, "pom.xml"), "dependency:copy-dependencies",
                           f"-DoutputDirectory={lib}", "-DincludeScope=runtime"], capture_output=True, text=True)
    missing = [f"{a}-{v}.jar" for _, a, v in artifacts if not os.path.exists(os.path.join(lib, f"{a}-{v}.jar"))]
    if done.returncode != 0 or missing:
        raise RuntimeError(f"fetching {what} failed: {(done.stdout + done.stderr).strip()[-300:] or missing}")
    open(os.path.join(lib, DONE), "w").close()
    return lib


def fetch_main(module: str, fetch) -> int:
    """``python -m MODULE fetch``: the install step's fetch and nothing else; its folder printed, or one line and 2."""
    if sys.argv[1:] != ["fetch"]:
        print(f"usage: python -m {module} fetch", file=sys.stderr)
        return 2
    try:
        print(fetch())
    except RuntimeError as e:
        print(f"stack: error: {e}", file=sys.stderr)
        return 2
    return 0
