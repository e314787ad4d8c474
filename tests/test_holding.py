"""``support.brokers.holding``, the secure-broker tests' leak check, finds a planted secret wherever a run writes:
an output, a log, JSON, and a Parquet archive part whose zstd pages do not hold the secret's bytes."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from support.brokers import holding

SECRET = "planted-pw-31c9"


def test_a_planted_secret_is_found_in_an_output_a_log_json_and_compressed_parquet(tmp_path):
    assert holding(tmp_path, SECRET, "nothing here") == []
    (tmp_path / "run" / "archive").mkdir(parents=True)
    (tmp_path / "run" / "job.log").write_text(f"connecting as fw:{SECRET}\n")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"target": f"amqps://fw:{SECRET}@h/v"}))
    # as the archive holds them (zstd, no dictionary): thousands of records, the secret in one; zstd codes its
    # literals, so the secret's bytes are not in the file (snappy's and lz4's would be) and a grep alone misses it
    configs = [json.dumps({"event_id": f"ev-{k:06d}", "at_ns": 1796000000000000000 + 997 * k}) for k in range(5000)]
    configs[2500] = json.dumps({"event_id": "ev-002500", "target": f"amqps://fw:{SECRET}@broker.example:5671/orders"})
    # (neither the column's least nor its greatest value: the footer's statistics keep those as they are)
    table = pa.table({"config": configs, "n": list(range(5000))})
    part = tmp_path / "run" / "archive" / "p-0.parquet"
    pq.write_table(table, part, compression="zstd", use_dictionary=False)
    assert SECRET.encode() not in part.read_bytes()  # not in the file's bytes
    assert sorted(holding(tmp_path, SECRET, "ok", f"said {SECRET}")) == sorted(
        ["output 1", str(tmp_path / "run" / "job.log"), str(tmp_path / "run" / "run.json"), str(part)])
