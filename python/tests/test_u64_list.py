"""hmc._lib.u64_lists: lists of ints read in one C pass (capi/internal/transapi/pylist.c) gives
the values array.array('Q') gives, at every digit boundary of CPython's 30-bit digits; any entry
it cannot take whole (not a plain int, negative, 2**64 or more) makes it decline, so that the
checked conversion runs and names the entry."""
import array
import ctypes
import random

import pytest

from hmc import _lib, trans


@pytest.fixture(scope="module", autouse=True)
def loaded():
    _lib.load()


def test_values_at_digit_boundaries():
    edges = [0, 1, 2**64 - 1, 2**63, 2**63 - 1]
    for k in (30, 60):  # one, two and three digits
        edges += [2**k - 1, 2**k, 2**k + 1]
    rnd = random.Random(7)
    vals = edges + [rnd.getrandbits(rnd.randrange(1, 65)) for _ in range(5000)]
    got = _lib.u64_lists(vals)
    assert got is not None, "this interpreter's layout is known (CPython 3.0-3.14)"
    assert list(got) == list(array.array("Q", vals))
    assert len(_lib.u64_lists([])) == 0
    three = _lib.u64_lists(vals, vals[::-1], vals)
    assert list(three) == vals + vals[::-1] + vals
    assert _lib.u64_lists(vals, vals[:-1]) is None  # of different lengths


class Addr(int):
    pass


@pytest.mark.parametrize("bad", [-1, -(2**40), 2**64, 2**90, True, 1.0, "8", None, Addr(8)])
def test_declines_what_it_cannot_take_whole(bad):
    for pos in (0, 7, 15):
        vals = [4096 * i for i in range(16)]
        good = list(vals)
        vals[pos] = bad
        assert _lib.u64_lists(vals) is None, (bad, pos)
        assert _lib.u64_lists(good, good, vals) is None, (bad, pos)  # in any of the three


def test_declines_other_sequences():
    class L(list):
        pass
    for v in ((1, 2), L([1, 2]), array.array("Q", [1, 2]), range(3), "ab"):
        assert _lib.u64_lists(v) is None, v


def test_wrong_entries_still_named():
    with pytest.raises(ValueError, match=r"peer_buffer_addresses\[2\]"):
        trans._batch([1, 2, 3], [1, 2, -3], [8, 8, 8])
    with pytest.raises(TypeError, match=r"lengths\[1\]"):
        trans._batch([1, 2], [1, 2], [8, "x"])
    for lists in (([1, 2**63], [5, 6], [8, 9]), ([1, 2**63], [Addr(5), 6], [8, 9])):  # C; checked (a subclass)
        n, a, b, c, keep = trans._batch(*lists)
        got = [list((ctypes.c_uint64 * n).from_address(p if isinstance(p, int) else ctypes.addressof(p)))
               for p in (a, b, c)]
        assert n == 2 and got == [[1, 2**63], [5, 6], [8, 9]], got
