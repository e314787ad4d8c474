#!/bin/bash
# Entrypoint of the flightwatch-spark image, as Spark on Kubernetes calls it: the driver pod runs
# `driver <spark-submit args>`, executor pods run `executor` with their settings in SPARK_* variables
# (set by Spark's Kubernetes scheduler). Anything else runs as a plain command.
set -euo pipefail
: "${SPARK_HOME:?SPARK_HOME is not set}"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-python3}"
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-/opt/spark/conf}"

case "${1:-}" in
  driver)
    shift
    # inside the driver pod spark-submit runs in client mode; the pod's IP is where executors reach it
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # the executor's JVM options arrive as SPARK_JAVA_OPT_0, _1, ... in order
    mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    exec java "${java_opts[@]}" -Xms"${SPARK_EXECUTOR_MEMORY:?}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CONF_DIR}:${SPARK_HOME}/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}"
    ;;
  *)
    exec "$@"
    ;;
esac
