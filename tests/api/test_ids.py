"""Job ids: lowercase Crockford ULIDs, in creation order, also when made in batches."""

from __future__ import annotations

import subprocess
import sys
import time

from hypothesis import given
from hypothesis import strategies as st

from later_django import ids

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def reference(value: int) -> str:
    """The 26-character base32 text of a 130-bit value, one character at a time."""
    chars = []
    for _ in range(26):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


@given(
    now_ms=st.integers(min_value=0, max_value=(1 << 48) - 1),
    last_random=st.integers(min_value=0, max_value=(1 << 79)),
    count=st.integers(min_value=1, max_value=40),
)
def test_a_batch_of_ids_counts_up_from_the_last_id_of_the_same_millisecond(
    now_ms, last_random, count
):
    # Near a boundary of the last 10 characters the shared prefix must change too.
    ids._last_ms, ids._last_random = now_ms, last_random
    batch = ids.new_job_ids(count, now_ms)
    expected = [reference((now_ms << 80) | (last_random + 1 + i)) for i in range(count)]
    assert batch == expected
    assert batch == sorted(batch)


def test_ids_across_a_carry_into_the_shared_prefix_stay_ordered():
    ids._last_ms, ids._last_random = 9, (1 << 50) - 3
    batch = ids.new_job_ids(6, 9)
    assert batch == [reference((9 << 80) | ((1 << 50) - 2 + i)) for i in range(6)]
    assert batch[1][:16] != batch[2][:16]


def test_single_ids_of_one_millisecond_increase_and_a_later_millisecond_sorts_after():
    first = ids.new_job_id(1_000)
    second = ids.new_job_id(1_000)
    later = ids.new_job_id(1_001)
    assert first < second < later
    assert all(len(i) == 26 and set(i) <= set(ALPHABET) for i in (first, second, later))


FORK_SCRIPT = """
import os
from later_django import ids

ids.new_job_ids(1)
parent_ms = ids._last_ms
made = []
for _ in range(2):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child makes an id in the parent's last millisecond
        os.write(write, ids.new_job_ids(1, parent_ms)[0].encode())
        os._exit(0)
    os.close(write)
    made.append(os.read(read, 64).decode())
    os.waitpid(pid, 0)
print(made[0], made[1])
"""


def test_forked_processes_never_continue_the_parents_ids():
    """Children forked after the parent made an id draw fresh random parts,
    so two of them making ids in the same millisecond cannot collide."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(out) == 2 and len(out[0]) == 26
    assert out[0] != out[1]


def test_an_ids_time_part_reads_back_as_the_time_it_was_made():
    from later_django.ids import id_time_ms

    alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
    for ms in (0, 1, 1_700_000_000_123, 2**48 - 1):
        time_part = "".join(alphabet[(ms >> (5 * (9 - i))) & 31] for i in range(10))
        assert id_time_ms(time_part + "0" * 16) == ms
    made = ids.new_job_id()
    assert abs(id_time_ms(made) - time.time() * 1000) < 5_000
