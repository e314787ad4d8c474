"""The job's JVM class archive: Spark's classes, loaded and verified once, mapped by every local job's JVM.

A local job's JVM loads and verifies some 15,000 of Spark's classes at each start. Java's class data sharing (CDS,
a dynamic archive: JDK 13 and later) writes them once, as a JVM loaded them, into a file that later JVMs map instead.
Measured here (2 cores, JDK 17, Spark 4; ``python -m bench.jobstart``): a job's start to its first batch went from
19.1 s to 14.6 s (medians), and its CPU until its first batch with records from 26.0 to 20.7 s.

The archive holds for one JVM build and one classpath (the JVM checks each jar's size and time, and maps nothing on a
mismatch), so its file is named by a key of both and a JVM is only given an archive of its own key. ``make install``
builds it (``python -m stack.classarchive``); without it, a job starts as it did before, only slower.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys

FOLDER = os.path.join(sys.prefix, "flightwatch-jvm")
"""Where archives are kept: in the interpreter's environment (the venv), whose pyspark jars they describe."""


def java() -> str | None:
    """The java binary Spark's launcher runs (``$JAVA_HOME/bin/java``, else the PATH's), resolved, or None."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def spark_jars() -> str | None:
    """The folder of Spark's jars, resolved: ``$SPARK_HOME/jars``, else the pyspark package's, or None."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        spec = importlib.util.find_spec("pyspark")
        home = os.path.dirname(spec.origin) if spec and spec.origin else None
    # resolved, as pyspark's find_spark_home resolves them: one key whatever link leads here (VENV_CACHE's .venv)
    jars = os.path.realpath(os.path.join(home, "jars")) if home else None
    return jars if jars and os.path.isdir(jars) else None


def key() -> str | None:
    """A key of the JVM build and the jars (names, sizes, times), or None when either is missing."""
    binary, jars = java(), spark_jars()
    if binary is None or jars is None:
        return None
    h = hashlib.sha256()
    for path in [binary, os.path.join(os.path.dirname(os.path.dirname(binary)), "lib", "modules")] + sorted(
            os.path.join(jars, name) for name in os.listdir(jars)):
        try:
            st = os.stat(path)
        except OSError:
            continue
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def path(k: str | None = None) -> str | None:
    """The archive's file for this JVM and these jars (whether it exists or not), or None."""
    k = k or key()
    return os.path.join(FOLDER, f"spark-{k}.jsa") if k else None


def java_options() -> str:
    """The JVM option that maps the archive, when one of this JVM and these jars exists; else nothing."""
    p = path()
    return f"-XX:SharedArchiveFile={p} -Xshare:auto" if p and os.path.isfile(p) else ""
