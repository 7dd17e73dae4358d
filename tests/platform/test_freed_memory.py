"""The route runtime's periodic heap trim must stay cheap: it runs every few ticks in a
process that may hold a whole fleet's table, where a fork costs milliseconds."""

import subprocess
import sys
from pathlib import Path

import pytest

from reach_platform.routes_runtime import return_freed_memory


def test_trimming_the_heap_forks_nothing_after_the_first_time(monkeypatch):
    return_freed_memory()  # the first call may look libc up

    def no_fork(popen, command, *args, **kwargs):
        raise AssertionError(f"a process was started: {command}")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_fork)
    for _ in range(3):
        return_freed_memory()


TRIM_SCRIPT = """
from reach_platform.routes_runtime import return_freed_memory
def rss_pages():
    return int(open('/proc/self/statm').read().split()[1])
# Blocks above pymalloc's 512 bytes come from glibc's heap; the last one kept pins the
# heap's top, so free() alone cannot shrink it.
blocks = [bytearray(1000) for _ in range(100_000)]
del blocks[:-1]
before = rss_pages()
return_freed_memory()
print(before - rss_pages())
"""


def test_trimming_the_heap_gives_memory_back():
    # In a child process, so this test run's own heap does not blur the figure.
    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    freed_mib = int(out.stdout) * 4096 / 2**20
    if freed_mib < 50:
        pytest.fail(f"the trim gave back {freed_mib:.1f} MiB of ~100 MiB freed")
