"""What every component of flightwatch shares, and nothing else: ``agents``, ``loadgen``, ``streaming``, ``ui`` and
``stack`` import ``core`` and do not import each other (``pyproject.toml``'s import-linter contracts hold it).

    contract      the telemetry records, their encoding, the event and run IDs they carry
    cloudevents   the CloudEvents carriage of event and run IDs (HTTP binary and structured)
    telemetry     the batched, bounded writer into the telemetry topic
    kafka_options the Kafka client settings from the environment (SASL, TLS, secrets from files), both clients
    histogram     latency histograms (HDR) and their merge
    pacer         the pace schedule (rates and steps in absolute ns)
    units         durations, rates, sizes: parsing and one-line errors
    clock         clock offset against a reference (NTP-style)
    rundir        the run folder: the only code that knows paths under checkpoints/<run>/
    procs, memory, observer   process helpers: ports, stopping by PID, heap trimming, flightwatch's own CPU
"""
