"""Runtime memory: the buffer pool (dead values lend their buffers, results held keep theirs),
the plan's buffer decisions, and the buffers readied ahead of the first call (runtime/memory.py
`populate`, the prefault thread and how the first call stops it)."""
import os

import numpy as np
import pytest
from cells import MatMulChain, chain_reference, product_atol

import graphkernel
from graphkernel import Tensor
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.runtime.plan import StepKind
from graphkernel.tools.lab import NetBasicFuse

ON = CompileOptions(enable_graph_kernel=True)


@pytest.fixture
def python_runner(monkeypatch):
    """MatMulChain's plan through the Python runner and its pool (the compiled entry, which
    would take it, keeps a pool of its own: tests/test_entry_steps.py)."""
    from graphkernel.backends.c import cblas
    monkeypatch.setattr(cblas, "cblas", lambda: None)


def _pooled(exe, shape):
    pool = exe.executable.runner.pool
    return [a for b, (s, _) in enumerate(pool.buffers) if s == shape for a in pool.arrays(b)]


def test_dead_intermediates_lend_their_buffers_to_later_steps(rng, python_runner):
    x = rng.standard_normal((32, 32)).astype(np.float32) * 0.3
    w = rng.standard_normal((32, 32)).astype(np.float32) * 0.3
    exe = graphkernel.compile(MatMulChain(), x, w, options=ON)
    for _ in range(3):
        flat, last = exe.run_arrays(x, w)
        want_flat, want_last = chain_reference(x, w)
        # m1 outlives its last reader through the Reshape view returned to the caller.
        np.testing.assert_allclose(flat, want_flat, rtol=1e-5, atol=product_atol(x, w))
        np.testing.assert_allclose(last, want_last, rtol=1e-4, atol=1e-6)
    # Eight [32, 32] values per call (four matmuls, four Tanh), of which at most three are
    # alive at once (the view's base, a step's input and its output), plus the two results
    # the caller still holds from the call before (the returned view is m1's own memory, not a
    # copy: builder.py `_copies`): five buffers, where keeping every value would take eight.
    assert len(_pooled(exe, (32, 32))) <= 5
    assert not any(exe.plan.copy_out)


def test_results_held_keep_their_buffers_across_calls_with_reuse(rng, python_runner):
    x = rng.standard_normal((32, 32)).astype(np.float32) * 0.3
    w = rng.standard_normal((32, 32)).astype(np.float32) * 0.3
    exe = graphkernel.compile(MatMulChain(), x, w, options=ON)
    held = [exe.run_arrays(x * (i + 1), w) for i in range(4)]
    for i, (flat, last) in enumerate(held):
        want_flat, want_last = chain_reference(x * (i + 1), w)
        np.testing.assert_allclose(flat, want_flat, rtol=1e-5, atol=product_atol(x, w))
        np.testing.assert_allclose(last, want_last, rtol=1e-4, atol=1e-6)


def test_plan_memory_lends_dead_buffers_and_keeps_viewed_ones():
    from graphkernel.ir.types import TensorType
    from graphkernel.runtime.plan import Slot, SlotRole, Step, plan_memory
    a, b = TensorType((64, 64), np.dtype("<f4")), TensorType((8,), np.dtype("<f8"))
    # slot 0: input; step 0 makes slot 1 (pooled a); step 1 views it as slot 2 (may alias);
    # step 2 reads slot 2 and makes slot 3 (pooled a); step 3 reads 3, makes 4 and 5 (pooled
    # a and b). Slots 4 and 5 are results.
    slots = tuple([Slot(0, "x", a, SlotRole.INPUT)] +
                  [Slot(i, f"v{i}", t, SlotRole.VALUE) for i, t in
                   ((1, a), (2, a), (3, a), (4, a), (5, b))])

    def step(reads, writes, pooled, aliases=False):
        return Step(StepKind.KERNEL if pooled else StepKind.VIEW, "s", (), reads, writes,
                    tuple(slots[w].type for w in writes), pooled=pooled, aliases=aliases)
    steps = [step((0,), (1,), True), step((1,), (2,), False, aliases=True),
             step((2,), (3,), True), step((3,), (4, 5), True)]
    release, buffer_of, buffers = plan_memory(slots, steps, keep={0, 4, 5})
    assert release == [(), (1,), (2,), (3,)]
    # Step 2 cannot reuse step 0's buffer (the view in slot 2 holds it while step 2 runs);
    # step 3 can: slots 1 and 2 are gone by then.
    assert buffer_of == {1: 0, 3: 1, 4: 0, 5: 2}
    assert [(shape, dtype.str) for shape, dtype in buffers] == \
        [((64, 64), "<f4"), ((64, 64), "<f4"), ((8,), "<f8")]


def test_first_call_buffers_are_readied_ahead_without_duplicates(rng, python_runner):
    x = rng.standard_normal((128, 128)).astype(np.float32) * 0.1
    w = rng.standard_normal((128, 128)).astype(np.float32) * 0.1
    exe = graphkernel.compile(MatMulChain(), x, w, options=ON)
    runner = exe.executable.runner
    assert runner.prefaulting is not None  # 64 KiB buffers: worth touching ahead
    flat, last = exe.run_arrays(x, w)
    assert runner.prefaulting is None
    want_flat, want_last = chain_reference(x, w)
    np.testing.assert_allclose(flat, want_flat, rtol=1e-5, atol=product_atol(x, w))
    np.testing.assert_allclose(last, want_last, rtol=1e-4, atol=1e-6)
    # The buffers readied ahead were the ones the call needed: none was made twice, and a
    # second call (its results dropped) needs no new one.
    ready = len(_pooled(exe, (128, 128)))
    assert ready == 3
    del flat, last
    exe.run_arrays(x, w)
    assert len(_pooled(exe, (128, 128))) == ready


def test_the_compiled_entry_takes_the_buffers_readied_ahead(rng):
    x = rng.standard_normal((256, 256)).astype(np.float32)
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)
    runner = exe.executable.runner
    assert runner.entry_module is not None and runner.prefaulting is not None
    runner.prefaulting.join()
    (ready,) = [id(a) for b in range(len(runner.plan.buffers)) for a in runner.pool.arrays(b)]
    out = exe(Tensor(x))  # the first call: its result is written into the warm array
    assert runner.prefaulting is None
    assert id(out.asnumpy()) == ready  # (the pool kept it alive: its id is still its own)
    assert not any(runner.pool.arrays(b) for b in range(len(runner.plan.buffers)))
    np.testing.assert_allclose(out.asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)
    kept = out.asnumpy()
    second = exe(Tensor(x))  # the first result is still held: a new buffer
    assert second.asnumpy() is not kept
    np.testing.assert_array_equal(second.asnumpy(), kept)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux's /proc only")
@pytest.mark.parametrize("way", ["madvise", "touch"])
def test_populate_makes_a_fresh_array_resident_without_writing_it(way, monkeypatch):
    from graphkernel.runtime import memory

    if way == "touch":  # a kernel without MADV_POPULATE_WRITE: one element per page written
        monkeypatch.setitem(memory._populate_state, "fn", None)
    # 72 MiB: above glibc's largest mmap threshold, so fresh pages; the middle third is not
    # page-aligned at its start (the mapping's header) nor at its end.
    array = np.empty((3, 6 << 20), np.float32)[1]
    before = _resident_bytes()
    taken = memory.populate(array)
    if way == "madvise" and taken != "madvise":
        pytest.skip(f"this kernel refuses MADV_POPULATE_WRITE ({os.uname().release})")
    assert taken == way
    assert _resident_bytes() - before >= 0.9 * array.nbytes


def test_populate_stops_when_asked(monkeypatch):
    import threading

    from graphkernel.runtime import memory

    stop = threading.Event()
    stop.set()
    array = np.empty(48 << 20, np.uint8)
    if memory._madvise() is None:
        pytest.skip("no madvise here")
    assert memory.populate(array, stop) == "stopped"


def test_a_first_call_during_the_prefault_stops_it_and_is_right(rng):
    # The first call does not wait for the buffers readied ahead: it stops the thread where it
    # is, takes what it readied, and its kernels fault in the rest.
    x = rng.standard_normal((2048, 2048)).astype(np.float32)
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)
    runner = exe.executable.runner
    assert runner.prefaulting is not None
    out = exe(Tensor(x))
    assert runner.prefaulting is None
    np.testing.assert_allclose(out.asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)
    del out
    np.testing.assert_allclose(exe(Tensor(x + 1)).asnumpy(), ((x + 1) * 2 + 1) * 3, rtol=1e-6)


def test_every_way_into_the_entry_finishes_the_prefault_in_the_runner(rng):
    # The bare compiled `run` (CompiledCell.entry) takes the warm pages on its first call as
    # a Cell's call does: the runner alone finishes the prefault, and then hands out the
    # entry module's own functions, so no caller checks for it on each call.
    x = rng.standard_normal((256, 256)).astype(np.float32)
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)
    runner = exe.executable.runner
    assert runner.prefaulting is not None
    out = exe.entry(x, *runner.entry_constants)
    assert runner.prefaulting is None
    assert runner.entry is runner.entry_module.run
    assert runner.entry_call is runner.entry_module.call
    np.testing.assert_allclose(out, (x * 2 + 1) * 3, rtol=1e-6)
    import pathlib
    package = pathlib.Path(graphkernel.__file__).parent
    checking = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                      if "prefaulting" in p.read_text() or "finish_prefault(" in p.read_text())
    assert checking == ["runtime/runner.py"], checking


def test_pooled_arrays_start_on_a_vector_boundary_in_both_pools(rng, monkeypatch):
    """Every array either pool makes starts on a 64-byte line (numpy's own start 16 bytes into
    one, so that each 64-byte vector a kernel loads or stores there would span two lines), and
    the results are the same values."""
    from graphkernel.runtime.memory import VECTOR_ALIGNMENT, aligned_empty
    for shape, dtype in [((3, 5), np.float32), ((1 << 18,), np.float64), ((7,), np.int8),
                         ((2, 0, 3), np.float32)]:
        a = aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.flags.writeable and (a.ctypes.data % VECTOR_ALIGNMENT == 0 or a.size == 0)
    x = rng.standard_normal((300, 257)).astype(np.float32)  # rows not a whole line
    want = (x * 2 + 1) * 3
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)  # the compiled entry's pool
    assert exe.executable.runner.entry_module is not None
    outs = [exe(Tensor(x)).asnumpy() for _ in range(3)]  # held: each call takes a new one
    assert len({o.ctypes.data for o in outs}) == 3
    for out in outs:
        assert out.ctypes.data % VECTOR_ALIGNMENT == 0
        np.testing.assert_allclose(out, want, rtol=1e-6)
    # A result that is a view of a pooled array (MatMulChain's Reshape) refers to the byte
    # array, not to the pooled array: held, it still keeps that memory from the next calls.
    w = rng.standard_normal((32, 32)).astype(np.float32) * 0.3
    xs = x[:32, :32] * 0.3
    chain = graphkernel.compile(MatMulChain(), xs, w, options=ON)
    assert chain.executable.runner.entry is not None
    held = [chain.run_arrays(xs * (i + 1), w) for i in range(4)]
    for i, (flat, last) in enumerate(held):
        want_flat, want_last = chain_reference(xs * (i + 1), w)
        np.testing.assert_allclose(flat, want_flat, rtol=1e-5,
                                   atol=product_atol(xs * (i + 1), w))
        np.testing.assert_allclose(last, want_last, rtol=1e-4, atol=1e-6)
    from graphkernel.backends.c import cblas
    monkeypatch.setattr(cblas, "cblas", lambda: None)  # MatMulChain on the Python runner
    chain = graphkernel.compile(MatMulChain(), xs, w, options=ON)
    assert chain.executable.runner.entry is None
    held = [chain.run_arrays(xs, w) for _ in range(2)]
    pooled = [a for b in range(len(chain.executable.runner.pool.buffers))
              for a in chain.executable.runner.pool.arrays(b)]
    assert pooled and all(a.ctypes.data % VECTOR_ALIGNMENT == 0 for a in pooled)
    assert all(r.ctypes.data % VECTOR_ALIGNMENT == 0 for pair in held for r in pair)
