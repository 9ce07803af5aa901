"""The switch's cost model without processes: fits, predictions, choices, the cache form."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl import _groups, switch
from zipccl.collectives import _profile
from zipccl.switch import COMPRESSED, NATIVE, Call, Line, Profile

GB = 1e9


def profile(link_gbps: float, codec_gbps: float = 300.0, alpha: float = 20e-6) -> Profile:
    """A synthetic profile: native ops on one link (all-reduce moves twice the bytes)."""
    link = Line(alpha, link_gbps * GB)
    native = {op: link for op in switch.OPS}
    native["all_reduce"] = Line(alpha, link_gbps * GB / 2)
    return Profile(
        native=native,
        compress=Line(30e-6, codec_gbps * GB),
        decompress=Line(30e-6, codec_gbps * GB),
        reduce=Line(10e-6, 1000 * GB),
        table=Line(300e-6, 1e18),
        ratio={
            "bfloat16": 0.7,
            "float16": 0.8,
            "float32": 0.88,
            "float8_e4m3fn": 0.85,
            "float8_e5m2": 0.77,
        },
    )


@given(st.floats(1e-7, 1e-2), st.floats(1e6, 1e12))
def test_line_fit_recovers_exact_lines(alpha, beta):
    sizes = [1e6, 8e6, 32e6]
    fit = Line.fit(sizes, [alpha + s / beta for s in sizes])
    assert fit.alpha == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert fit.beta == pytest.approx(beta, rel=1e-6)


def test_line_fit_flat_times_gives_pure_latency():
    fit = Line.fit([1.0, 2.0], [5.0, 5.0])
    assert fit.alpha == pytest.approx(5.0) and fit.beta > 1e12


@pytest.mark.parametrize(
    "op", ["all_gather", "all_to_all", "broadcast", "reduce_scatter", "all_reduce"]
)
def test_small_messages_stay_native(op):
    call = Call(op, 64 << 10, torch.bfloat16, 2)
    assert switch.choose(profile(3.3), call) != COMPRESSED


@pytest.mark.parametrize(
    "op", ["all_gather", "all_to_all", "broadcast", "reduce_scatter", "all_reduce"]
)
def test_large_messages_on_slow_links_compress(op):
    call = Call(op, 256 << 20, torch.bfloat16, 2, chunks=8)
    assert switch.choose(profile(3.3), call) == COMPRESSED


def test_fast_links_stay_native():
    call = Call("all_gather", 256 << 20, torch.bfloat16, 2, chunks=8)
    assert switch.choose(profile(250.0, codec_gbps=300.0), call) == NATIVE


def test_incompressible_dtype_stays_native():
    p = profile(20.0)
    p.ratio["float32"] = 0.99
    assert switch.choose(p, Call("all_gather", 256 << 20, torch.float32, 2, 8)) == NATIVE


def test_native_reduction_only_offered_for_two_ranks():
    p = profile(20.0)
    assert NATIVE in switch.predict(p, Call("reduce_scatter", 1 << 20, torch.bfloat16, 2))
    for world in (3, 8):
        times = switch.predict(p, Call("reduce_scatter", 1 << 20, torch.bfloat16, world))
        assert NATIVE not in times
        assert switch.choose(p, Call("all_reduce", 1 << 10, torch.bfloat16, world)) != NATIVE


def test_choice_needs_margin():
    """A predicted win under 10 % is not taken: auto must not lose to native on noise."""
    p = profile(20.0)
    call = Call("all_gather", 64 << 20, torch.bfloat16, 2, 2)
    times = switch.predict(p, call)
    expect = COMPRESSED if times[COMPRESSED] <= switch.MARGIN * times[NATIVE] else NATIVE
    assert switch.choose(p, call) == expect


def test_profile_round_trips_through_json():
    p = profile(25.0)
    assert Profile.from_json(p.to_json()) == p
    assert Profile.from_vector(p.vector()) == p


def test_mode_env(monkeypatch):
    monkeypatch.setenv("ZIPCCL_MODE", "Always")
    assert switch.mode() == "always"
    monkeypatch.setenv("ZIPCCL_MODE", "sometimes")
    with pytest.raises(ValueError, match="ZIPCCL_MODE must be one of"):
        switch.mode()
    monkeypatch.setenv("ZIPCCL_CHUNK_BYTES", "0")
    with pytest.raises(ValueError, match="ZIPCCL_CHUNK_BYTES"):
        switch.chunk_bytes(True)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.01, 3000),
    st.floats(1, 3000),
    st.floats(1e-6, 1e-3),
    st.sampled_from(["all_to_all", "all_gather", "broadcast"]),
    st.integers(2, 8),
)
def test_can_compress_is_sound(link_gbps, codec_gbps, alpha, op, world):
    """Where can_compress says no, no size or chunk count makes choose() compress."""
    p = profile(link_gbps, codec_gbps, alpha)
    if switch.can_compress(p, op, torch.bfloat16, world):
        return
    for n in [int(1.25**k) for k in range(150)]:
        for chunks in (1, 4, 64):
            assert switch.choose(p, Call(op, n, torch.bfloat16, world, chunks)) != COMPRESSED


def test_can_compress_examples():
    assert not switch.can_compress(
        profile(1000.0, codec_gbps=300.0), "all_to_all", torch.bfloat16, 2
    )
    assert switch.can_compress(profile(3.3), "all_to_all", torch.bfloat16, 2)
    p = profile(3.3)
    p.ratio["float32"] = 0.99
    assert not switch.can_compress(p, "all_to_all", torch.float32, 3)


def test_the_protocols_own_transfer_carries_the_compressed_bytes():
    """On gloo a compressed all-gather travels as an all-to-all, several times faster than
    gloo's own all-gather: the compressed time follows the measured wire line, the native time
    the op's own line (a model that charged the native line kept staged calls native)."""
    p = profile(3.3)
    slow = Line(20e-6, 1 * GB)
    slow_native = replace(p, native={**p.native, "all_gather": slow})
    call = Call("all_gather", 64 << 20, torch.bfloat16, 2)
    fast_wire = switch.predict_stages(slow_native, call)
    assert fast_wire[COMPRESSED] < fast_wire[NATIVE] / 3
    slow_wire = replace(slow_native, wire={**slow_native.wires, "all_gather": slow})
    assert switch.predict_stages(slow_wire, call)[COMPRESSED] > 2 * fast_wire[COMPRESSED]
    assert switch.wire_line(p, "reduce_scatter") is p.wires["all_to_all"]
    assert Profile.from_vector(slow_wire.vector()) == slow_wire


def test_best_chunks_follows_the_latencies():
    """A latency per collective of 1.5 ms (an all-gather over sockets) makes one chunk best and
    compression the choice at 256 MiB, where sixteen fixed chunks would have kept it native; with
    a slow codec and small latencies the model pipelines; small calls never split below
    MIN_CHUNK_BYTES; a tie goes to fewer chunks."""
    call = Call("all_gather", 256 << 20, torch.bfloat16, 2, chunks=16)
    sockets = profile(3.0, alpha=1.5e-3)
    assert switch.best_chunks(sockets, call) == 1
    assert switch.choose(sockets, call) == NATIVE
    assert switch.choose(sockets, replace(call, chunks=1)) == COMPRESSED
    assert switch.best_chunks(profile(25.0, codec_gbps=30.0, alpha=5e-6), call) > 1
    assert (
        switch.best_chunks(
            profile(25.0, codec_gbps=30.0, alpha=5e-6), replace(call, nbytes=6 << 20)
        )
        == 1
    )
    flat = replace(profile(25.0), decompress=Line(0.0, 1e18), compress=Line(0.0, 1e18))
    assert (
        switch.best_chunks(replace(flat, native={o: Line(0.0, 25 * GB) for o in switch.OPS}), call)
        == 1
    )


def test_host_staged_chunks_are_small_and_bounded():
    """On a host-staged group auto cuts a call into HOST_CHUNK_BYTES chunks (gloo moves several
    in flight faster than one), never more than CHUNK_CHOICES allows, never none."""
    mib = 1 << 20
    sizes = [0, 1, 4 * mib, 4 * mib + 1, 24 * mib, 64 * mib, 256 * mib, 1 << 40]
    assert [switch.host_chunks(n) for n in sizes] == [1, 1, 1, 2, 6, 16, 16, 16]
    assert switch.host_chunks(24 * mib) * switch.HOST_CHUNK_BYTES == 24 * mib


@pytest.mark.parametrize(
    "op", ["all_gather", "all_to_all", "broadcast", "reduce_scatter", "all_reduce"]
)
def test_measured_overhead_is_charged_to_every_compressed_call(op):
    """The profile's overhead (measured minus modelled compressed calls) adds to every compressed
    protocol once (all-reduce: to each half it compresses), to nothing else, and can turn a
    predicted win native; it survives the profile's vector form."""
    call = Call(op, 64 << 20, torch.bfloat16, 2, chunks=2)
    base, slow = profile(10.0), replace(profile(10.0), overhead=Line(2e-3, 1e18))
    before, after = switch.predict(base, call), switch.predict(slow, call)
    added = after[COMPRESSED] - before[COMPRESSED]
    if op == "all_reduce":  # each half takes its cheapest strategy, compressed or not
        assert 0 < added <= 4e-3 + 1e-12
    else:
        assert added == pytest.approx(2e-3)
    assert all(after[k] == before[k] for k in before if k != COMPRESSED)
    assert Profile.from_vector(slow.vector()) == slow
    tight = replace(base, overhead=Line(1.0, 1e18))
    assert switch.choose(tight, call) != COMPRESSED


def test_native_reduce_opt_in_offers_native_for_any_world(monkeypatch):
    p = profile(20.0)
    for op in ("reduce_scatter", "all_reduce"):
        assert NATIVE in switch.predict(p, Call(op, 1 << 20, torch.bfloat16, 4, 1, True))
        assert NATIVE not in switch.predict(p, Call(op, 1 << 20, torch.bfloat16, 2, 1, False))
    monkeypatch.setenv("ZIPCCL_NATIVE_REDUCE", "1")
    assert switch.native_reduce()
    monkeypatch.setenv("ZIPCCL_NATIVE_REDUCE", "yes")
    with pytest.raises(ValueError, match="ZIPCCL_NATIVE_REDUCE"):
        switch.native_reduce()


def test_verify_env(monkeypatch):
    from zipccl.collectives import verify_policy

    monkeypatch.delenv("ZIPCCL_VERIFY", raising=False)
    assert verify_policy() == "auto"
    monkeypatch.setenv("ZIPCCL_VERIFY", "0")
    assert (verify_policy(), verify_policy(True), verify_policy(False)) == ("0", "1", "0")
    monkeypatch.setenv("ZIPCCL_VERIFY", "always")
    with pytest.raises(ValueError, match="ZIPCCL_VERIFY must be one of"):
        verify_policy()


def test_exchange_cost_charged_to_zipccl_protocols():
    """The descriptor exchange the default policy runs for a2a_reduce / compressed counts against
    them: a profile with a costly exchange keeps a close call native."""
    p = profile(20.0)
    p.native["reduce_scatter"] = Line(100e-6, 20 * GB)  # slower than a2a + local reduction
    call = Call("reduce_scatter", 4 << 10, torch.bfloat16, 2, 1, True)
    assert switch.choose(p, call) == switch.A2A_REDUCE
    base = switch.predict(p, call)
    slow = replace(p, exchange=Line(1e-3, 1e18))
    costly = switch.predict(slow, call)
    assert costly[NATIVE] == base[NATIVE]
    assert all(costly[k] == pytest.approx(base[k] + 1e-3) for k in base if k != NATIVE)
    assert switch.choose(slow, call) == NATIVE
    assert Profile.from_json(slow.to_json()) == slow


def test_zipccl_protocols_need_a_clear_win_over_native():
    """a2a_reduce predicted a little faster than the native reduce-scatter (within MARGIN) stays
    native: a noisy profile must not trade the backend's reduction for zipccl's own protocol."""
    p = profile(20.0)
    call = Call("reduce_scatter", 4 << 10, torch.bfloat16, 2, 1, True)
    a2a = switch.predict(p, call)[switch.A2A_REDUCE]
    wire = call.nbytes / (20 * GB)
    for slower, want in ((1.05, NATIVE), (1.5, switch.A2A_REDUCE)):
        p.native["reduce_scatter"] = Line(slower * a2a - wire, 20 * GB)
        assert switch.predict(p, call)[NATIVE] == pytest.approx(slower * a2a)
        assert switch.choose(p, call) == want


def test_timed_together_interleaves_in_a_fixed_order():
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    best = _profile.timed_together(fns, cuda=False, rounds=3)
    assert set(best) == set("abc") and all(t >= 0 for t in best.values())
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab"


def test_group_key_follows_the_default_group_and_keeps_it_not(tmp_path):
    """Profiles and routes of a destroyed default group are not reused for a re-created one,
    and the profile cached under it does not keep the destroyed group alive."""
    import torch.distributed as dist

    def init(name: str) -> None:
        dist.init_process_group(
            "gloo", store=dist.FileStore(str(tmp_path / name), 1), rank=0, world_size=1
        )

    init("first")
    first, group = _groups.key(None), weakref.ref(dist.group.WORLD)
    try:
        assert first is _groups.key(dist.group.WORLD)
        switch.set_profile(None, profile(20.0))
        assert switch.profile_key(None) in switch.PROFILES
        dist.destroy_process_group()
        gc.collect()
        assert group() is None
        init("second")
        assert _groups.key(None) is not first
        assert switch.profile_key(None) not in switch.PROFILES
    finally:
        switch.PROFILES.pop(first, None)
        dist.destroy_process_group()


def _auto_picks(monkeypatch, gbps: float, op: str, red_code: int) -> Callable[..., tuple[str, int]]:
    """Auto's (strategy, chunks) for ``op`` of BF16 on a gloo group -- host-staged (CUDA) or a
    plain host one -- under the synthetic profile of a ``gbps`` link."""
    from zipccl.collectives import _agree, _profile, _transport

    monkeypatch.delenv("ZIPCCL_MODE", raising=False)
    monkeypatch.delenv("ZIPCCL_CHUNK_BYTES", raising=False)
    monkeypatch.setattr(_profile, "profile_for", lambda g: profile(gbps))

    def pick(nbytes: int, world: int = 2, staged: bool = True) -> tuple[str, int]:
        device = torch.device("cuda" if staged else "cpu", 0)
        g = _transport.Group(None, 0, world, device, "gloo", staged=staged)
        return _agree.strategy_and_chunks(g, op, torch.bfloat16, nbytes, red_code)

    return pick


@pytest.mark.parametrize("gbps", [1.0, 1000.0])
def test_staged_two_rank_all_reduce_goes_by_its_size(monkeypatch, gbps: float):
    """On a host-staged group auto keeps a two-rank all-reduce native below
    STAGED_ALL_REDUCE_COMPRESS_FROM (DDP's buckets run faster native on the lanes) and compresses
    it from there on, in host chunks, whatever the model says (a slow link, where it would
    compress everything, or a fast one, where it would compress nothing); with four ranks (no
    exact native reduction) and on a plain host group the rule does not apply."""
    pick = _auto_picks(monkeypatch, gbps, "all_reduce", 0)
    edge = switch.STAGED_ALL_REDUCE_COMPRESS_FROM
    assert pick(edge - 2)[0] == NATIVE
    assert pick(24 << 20)[0] == NATIVE  # DDP's default bucket
    assert pick(edge) == (COMPRESSED, switch.host_chunks(edge))
    assert pick(256 << 20)[0] == COMPRESSED
    slow = gbps < 10  # the model: compress; else gloo's own reduction, or where that is not
    assert pick(24 << 20, world=4)[0] == (COMPRESSED if slow else switch.A2A_REDUCE)  # exact
    assert pick(24 << 20, staged=False)[0] == (COMPRESSED if slow else NATIVE)


@pytest.mark.parametrize("gbps", [1.0, 1000.0])
def test_staged_broadcast_below_its_threshold_stays_native(monkeypatch, gbps: float):
    """On a host-staged group auto keeps a broadcast below STAGED_BROADCAST_COMPRESS_FROM native
    even where the model would compress it (a slow link); from there the model decides, as it
    does on a plain host group at every size."""
    pick = _auto_picks(monkeypatch, gbps, "broadcast", -1)
    edge = switch.STAGED_BROADCAST_COMPRESS_FROM
    slow = gbps < 10  # the model: compress every size; else nothing
    for world in (2, 4):
        assert pick(16 << 20, world)[0] == NATIVE
        assert pick(edge - 2, world)[0] == NATIVE
        assert pick(edge, world) == (
            (COMPRESSED, switch.host_chunks(edge)) if slow else (NATIVE, switch.host_chunks(edge))
        )
    assert pick(16 << 20, staged=False)[0] == (COMPRESSED if slow else NATIVE)
