"""The Kafka receiver's write-ahead log (``core.wal``): the last block written is what a restart reads, whatever
point a kill cut the file at, across rotations, and with a real kill -9 of a writer in the middle of its appends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from core.wal import WriteAheadLog

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _payload(i: int) -> bytes:
    return b'{"0": %d}\n%s' % (i, b"\n".join(b'{"kind":"recv","event_id":"e-%d"}' % k for k in range(i % 7)))


def test_the_last_block_is_read_back(tmp_path):
    log = WriteAheadLog(str(tmp_path / "wal"))
    assert log.last() is None
    for i in range(50):
        log.write(_payload(i))
        assert log.last() == _payload(i)
    log.close()
    assert WriteAheadLog(str(tmp_path / "wal")).last() == _payload(49)


def test_a_block_cut_anywhere_gives_the_one_before(tmp_path):
    path = str(tmp_path / "wal")
    log = WriteAheadLog(path)
    for i in range(3):
        log.write(_payload(i))
    log.close()
    whole = open(path, "rb").read()
    start_of_last = whole.rfind(b"\n%d " % len(_payload(2)), 0, len(whole) - len(_payload(2))) + 1
    for cut in range(start_of_last, len(whole)):
        with open(path, "wb") as f:
            f.write(whole[:cut])
        assert WriteAheadLog(path).last() == _payload(1), cut
    corrupt = bytearray(whole)
    corrupt[-3] ^= 0x01  # a flipped bit inside the last payload fails its CRC
    with open(path, "wb") as f:
        f.write(corrupt)
    assert WriteAheadLog(path).last() == _payload(1)


def test_a_restart_after_a_torn_block_starts_a_new_file(tmp_path):
    path = str(tmp_path / "wal")
    log = WriteAheadLog(path)
    log.write(_payload(1))
    log.write(_payload(2))
    log.close()
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    again = WriteAheadLog(path)
    assert again.last() == _payload(1)
    again.write(_payload(3))  # not after the torn block, where no reader would find it
    again.write(_payload(4))
    assert again.last() == _payload(4)
    assert open(path, "rb").read().startswith(b"%d " % len(_payload(3)))


def test_it_rotates_and_stays_bounded(tmp_path):
    path = str(tmp_path / "wal")
    log = WriteAheadLog(path, rotate_bytes=4096)
    for i in range(2000):
        log.write(_payload(i))
        assert os.path.getsize(path) <= 4096 + len(_payload(i)) + 32
    assert log.last() == _payload(1999)
    assert not os.path.exists(path + ".tmp")


def test_the_format_before_blocks_is_read_whole(tmp_path):
    path = tmp_path / "wal"
    path.write_bytes(b'{"0": 12}\n{"kind":"recv"}')
    assert WriteAheadLog(str(path)).last() == b'{"0": 12}\n{"kind":"recv"}'


WRITER = """
import sys
from core.wal import WriteAheadLog
log = WriteAheadLog(sys.argv[1], rotate_bytes=1 << 16)
i = int(sys.argv[2])
print("ready", flush=True)
while True:
    i += 1
    log.write(b'{"0": %d}\\n' % i + b"x" * (i % 3000))
"""


def test_kill_9_in_the_middle_of_appends_leaves_an_intact_last_block(tmp_path):
    """A real writer killed at 20 moments: each time the log gives an intact block, later than the last one read
    (a restart resumes from it), and the next writer goes on from there."""
    path, seen = str(tmp_path / "wal"), 0
    for round_ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, path, str(seen)], cwd=ROOT, stdout=subprocess.PIPE,
                                env=dict(os.environ, PYTHONPATH=ROOT))
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(0.01 + 0.007 * round_)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        last = WriteAheadLog(path).last()
        assert last is not None
        i = int(last.split(b"\n")[0].split(b":")[1].strip(b" }"))
        assert last == b'{"0": %d}\n' % i + b"x" * (i % 3000)
        assert i > seen
        seen = i
