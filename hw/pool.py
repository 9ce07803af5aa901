"""QLC decoder pool: E single-lane engines decoding whole packets side by side, symbols in order.

A packet's codes form one chain (where a code starts depends on the code before it), so one
engine decodes one symbol per clock, and hw.multilane's N-lane decoder, which walks N links of
that chain per clock, loses clock rate as N grows. Packets, though, are independent (each starts
on a beat boundary with its own count), as the container's blocks are. The pool gives whole
packets to E engines in turn, so E packets decode at once, each at the single lane's clock rate,
and puts their symbols back in packet order:

- **Input**: beats of W 32-bit words (first word on top, as hw.multilane's; W is the ``words``
  argument, by default ``default_words(E)``, enough for E codes of 11 bits a clock), each with a
  field ``words``, how many of its first words it holds, and ``last`` on a packet's final beat
  (AXI4-Stream's ``tkeep`` and ``tlast``). A packet is its serial words, padded to a whole word
  as for the single lane (not to a beat): only its final beat may hold fewer words, and the next
  packet starts on a new beat.
  The dispatcher so learns where a packet ends without parsing it. Counts on ``n`` as before; a
  packet of count 0 has no beats and no symbols and is dropped at the door.
- **Dispatch**: packet p's count and beats go to engine p mod E, through a count FIFO and a beat
  FIFO per engine (``depth`` beats: with a whole packet's beats in it, the dispatcher moves on
  while the engine decodes); a registered splitter hands the beat's words to the engine one a
  clock (the engine takes at most 11 bits a clock).
- **Engines**: hw.decoder's single lane, on one-word beats as when it stands alone (a window of
  the single lane's width, so its clock rate), each with its own tables.
- **Collect**: each engine's symbols are packed E to a beat into its output FIFO (``depth`` beats,
  a 4096-symbol packet's at E = 4; ``default_depth``), then through a register that takes the
  block RAM's output where it lies and two 3-beat FIFOs (the second feeds the output); the
  output takes packet p's beats from engine p mod E, and the next packet's from the clock after
  its last beat, so the symbol beats are hw.multilane's counted layout in packet order.
- **Errors**, in band: the FIFOs' beats carry a ``bad`` flag. An engine that meets an illegal
  codeword or bad padding stops. Its packer writes the symbols it emitted of that packet, then
  marks the error's place: the last beat of a packet whose padding is bad is written ``bad`` (a
  packet's last beat is written once the engine's ``padded`` verdict or its error has come),
  after an illegal codeword the partial beat is, or a beat of no symbols (``marks``). The output
  raises ``error`` on sending a ``bad`` beat or on meeting a marker, so after every symbol of
  the packets before and every symbol the engine emitted before its error, however far ahead
  of the output the engine is; then it takes and sends nothing, as the single lane does.
- **Tables**: a pending table write stops new counts; it goes to every engine at once when
  every counted packet is decoded (known a clock later: a registered check of every engine),
  so each packet is decoded with the table in force when its count arrived.

Throughput: up to E symbols per clock while E packets are in flight, so on a stream of many
packets; the output spends ceil(P / E) clocks on a P-symbol packet (11.907 per clock for
P = 1024 at E = 12, 1024 / 86; 11.977 for P = 4096, 4096 / 342). One packet alone decodes at
one symbol per clock.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth import C, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import MAX_CODE_LENGTH, Codebook
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.tables import (
    COUNT_BITS,
    WORD_BITS,
    SymbolLayout,
    TableWriteLayout,
    default_book,
    lane_layout,
    words_per_beat,
)

POOL_ENGINES = (2, 4, 8, 12, 13)
COUNT_DEPTH = 8  # counts queued per engine
DISPATCH_MARGIN = 3  # FIFO entries kept free: the room a ready reads is a clock old, a write late
TAIL_DEPTH = 3  # the smallest SyncFIFOBuffered that moves a beat every clock
HOLD_MARGIN = 8  # output FIFO beats kept free: an engine's 3 pipeline stages and a late hold


def _next(index: Value, count: int) -> Value:
    """``index`` + 1, wrapping at ``count``: the round the engines are taken in."""
    return Mux(index == count - 1, 0, index + 1)


def _pick(flags: list[Value], index: Value) -> Value:
    """The flag of the engine ``index`` names."""
    return Cat(*flags).bit_select(index, 1)


def _registered_move(m: Module, name: str, src, dst) -> None:
    """``src``'s beats into ``dst`` through a register, a beat a clock: ``src``'s output (a block
    RAM's, 5.8 ns from the clock on the ECP5) then ends at flip-flops the placer can put beside
    the block RAM, not at ``dst`` wherever that lies. (yosys 0.23 cannot fold a register into the
    ECP5 block RAM's own output register: it maps every DP16KD with REGMODE NOREG.)"""
    beat = Signal(src.width, name=f"{name}_beat")
    full = Signal(name=f"{name}_full")
    move = ~full | dst.w_rdy  # the register is empty, or its beat goes on this clock
    m.d.comb += [src.r_en.eq(move), dst.w_data.eq(beat), dst.w_en.eq(full)]
    with m.If(move):
        m.d.sync += [beat.eq(src.r_data), full.eq(src.r_rdy)]


def default_words(engines: int) -> int:
    """Input beat width in words: hw.multilane's power of two (``words_per_beat``) up to 8
    engines; past 8, the fewest words that carry E codes of 11 bits (5 at E = 12 or 13, not 8).
    Each engine's beat FIFO takes a block RAM per 36 bits of beat, and the dispatch register
    fans the beat out to every engine: at E = 13, 8-word beats took 169 of the LFE5U-85F's 208
    block RAMs and did not route."""
    if engines <= 8:
        return words_per_beat(engines)
    return -(-MAX_CODE_LENGTH * engines // WORD_BITS)


def default_depth(engines: int) -> int:
    """FIFO depth in beats: 1024 holds a 4096-symbol packet's symbols at E = 4; past 8 engines,
    512 still holds them (342 beats at E = 12) and keeps the FIFOs within the LFE5U-85F's 208
    block RAMs (a DP16KD is 512 x 36 or 1024 x 18)."""
    return 1024 if engines <= 8 else 512


def out_layout(engines: int) -> data.StructLayout:
    """An engine's output beat: the E-lane decoder's symbol ``beat``, ``bad`` when the engine's
    error follows its symbols, ``marks`` on a bad beat of no symbols (only the error's place;
    stored, so that the output's choice starts from a register)."""
    return data.StructLayout({"beat": lane_layout(engines), "bad": 1, "marks": 1})


def pool_beat_layout(size: int) -> data.StructLayout:
    """A beat ``size`` words wide (``data``, its first word on top) that holds its first
    ``words`` words, and ``last`` on a packet's final beat."""
    return data.StructLayout({"data": WORD_BITS * size, "last": 1, "words": range(size + 1)})


class QLCDecoderPool(wiring.Component):
    """Counts (``n``) and word beats with ``last`` (``i``) -> E-symbol beats (``o``) in packet
    order; ``tw`` loads every engine's tables."""

    def __init__(
        self,
        engines: int,
        book: Codebook | None = None,
        *,
        depth: int | None = None,
        words: int | None = None,
    ) -> None:
        """``words``: the input beat's width (``default_words(engines)``); a wider beat for a
        source whose beats are wider (the N-lane encoder's, in hw.loopback)."""
        if engines < 2:
            raise ValueError(f"a pool needs at least 2 engines, got {engines}")
        depth = default_depth(engines) if depth is None else depth
        words = default_words(engines) if words is None else words
        if depth <= HOLD_MARGIN:
            raise ValueError(f"FIFO depth must be over {HOLD_MARGIN}, got {depth}")
        if words < 1:
            raise ValueError(f"a beat needs at least 1 word, got {words}")
        self.engines, self.depth, self.words = engines, depth, words
        self.book = book or default_book()
        super().__init__(
            {
                "n": In(stream.Signature(COUNT_BITS)),
                "i": In(stream.Signature(pool_beat_layout(self.words))),
                "o": Out(stream.Signature(lane_layout(engines))),
                "tw": In(stream.Signature(TableWriteLayout)),
                "error": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        e_count, err = self.engines, Signal()
        m.d.comb += self.error.eq(err)
        engines = [QLCDecoder(self.book, hold=True) for _ in range(e_count)]
        counts = [SyncFIFOBuffered(width=COUNT_BITS, depth=COUNT_DEPTH) for _ in engines]
        beat = pool_beat_layout(self.words)
        beats = [SyncFIFOBuffered(width=beat.size, depth=self.depth) for _ in engines]
        width = out_layout(e_count).size
        outs = [SyncFIFOBuffered(width=width, depth=self.depth) for _ in engines]
        # behind each block-RAM FIFO, a register and two small FIFOs: the register takes the
        # block RAM's slow output where it lies, the first FIFO its beats (and the ready path
        # back to the block RAM), the second brings them to the output, whose choices (the
        # beat's ``last``, the next engine) so start from a register near them
        nears = [SyncFIFOBuffered(width=width, depth=TAIL_DEPTH) for _ in engines]
        tails = [SyncFIFOBuffered(width=width, depth=TAIL_DEPTH) for _ in engines]
        parts_of = zip(engines, counts, beats, outs, nears, tails, strict=True)
        for k, parts in enumerate(parts_of):
            names = ("engine", "counts", "beats", "out", "near", "tail")
            for name, part in zip(names, parts, strict=True):
                m.submodules[f"{name}{k}"] = part
            engine, count_fifo, beat_fifo, out, near, tail = parts
            self._feed_engine(m, k, engine, count_fifo, beat_fifo)
            _registered_move(m, f"out{k}_read", out, near)
            m.d.comb += [
                tail.w_data.eq(near.r_data),
                tail.w_en.eq(near.r_rdy),
                near.r_en.eq(tail.w_rdy),
            ]

        # micro-step 1, tables: a pending write holds new counts back, and goes to all engines
        # once every counted packet is decoded (an engine's tw.ready: no packet in its pipeline).
        # Whether they are is registered (a path through every engine), so it is a clock old:
        # then every engine was idle, with no count on its way; since then only a count taken
        # in that clock, on its way now, can have made one busy.
        settled, was_settled, ready = Signal(), Signal(), Signal()
        m.d.sync += was_settled.eq(settled)
        m.d.comb += self.tw.ready.eq(ready)
        for e in engines:
            m.d.comb += [
                e.tw.valid.eq(self.tw.valid & ready),
                e.tw.payload.eq(self.tw.payload),
            ]

        # micro-step 2, dispatch: counts and beats each go round the engines, a count of 0 to none
        nonzero = self.n.payload != 0
        counts_sent = self._dispatch(
            m, "count", self.n, counts, ~self.tw.valid & ~err, keep=nonzero, moves_on=nonzero
        )
        self._dispatch(m, "beat", self.i, beats, ~err, keep=C(1), moves_on=self.i.payload.last)

        idle = [
            e.tw.ready & (c.level == 0) & ~sent
            for e, c, sent in zip(engines, counts, counts_sent, strict=True)
        ]
        m.d.comb += [
            settled.eq(reduce(operator.and_, idle)),
            ready.eq(was_settled & ~reduce(operator.or_, counts_sent) & ~err),
        ]

        # micro-step 3, pack: each engine's symbols, E to a beat, into its output FIFO, each
        # packet's last beat with its verdict, an engine's error as a beat in its place
        for k, (e, o) in enumerate(zip(engines, outs, strict=True)):
            self._pack(m, k, e, o)

        # micro-step 4, collect: packet p's beats from engine p mod E, the next engine's from the
        # clock after its last beat; a beat marked bad is the error's place in the stream
        serve = Signal(range(e_count))
        head = Signal(out_layout(e_count))
        with m.Switch(serve):
            for k, t in enumerate(tails):
                with m.Case(k):
                    m.d.comb += [head.eq(t.r_data), t.r_en.eq(self.o.ready & ~err & ~head.marks)]
        at_head = _pick([t.r_rdy for t in tails], serve)
        m.d.comb += [
            self.o.valid.eq(at_head & ~err & ~head.marks),
            self.o.payload.eq(head.beat),
        ]
        sent = self.o.valid & self.o.ready
        with m.If((sent & head.bad) | (at_head & head.marks)):
            m.d.sync += err.eq(1)
        with m.Elif(sent & head.beat.last):
            m.d.sync += serve.eq(_next(serve, e_count))
        return m

    def _dispatch(
        self, m: Module, name: str, port, fifos: list, open_: Value, *, keep: Value, moves_on: Value
    ) -> list[Signal]:
        """``port``'s payloads for which ``keep`` holds round ``fifos`` (the next FIFO after one
        for which ``moves_on`` holds), ``port`` ready while ``open_``.
        Each payload waits a clock in a register, and ready reads registered room left in the
        FIFOs, so nothing here is a path from one end of the pool to the other in one clock.
        Returns each FIFO's registered write (a payload on its way to it)."""
        to = Signal(range(self.engines), name=f"{name}_to")
        rooms = [Signal(name=f"{name}_room{k}") for k in range(len(fifos))]
        writes = [Signal(name=f"{name}_write{k}") for k in range(len(fifos))]
        held = Signal(len(Value.cast(port.payload)), name=f"{name}_held")
        m.d.comb += port.ready.eq(_pick(rooms, to) & open_)
        take = port.valid & port.ready
        kept = take & keep
        m.d.sync += [
            held.eq(port.payload),
            *(r.eq(f.level < f.depth - DISPATCH_MARGIN) for r, f in zip(rooms, fifos, strict=True)),
            *(w.eq(kept & (to == k)) for k, w in enumerate(writes)),
        ]
        m.d.comb += [f.w_data.eq(held) for f in fifos] + [
            f.w_en.eq(w) for f, w in zip(fifos, writes, strict=True)
        ]
        with m.If(take & moves_on):
            m.d.sync += to.eq(_next(to, self.engines))
        return writes

    def _feed_engine(self, m: Module, k: int, engine, counts, beats) -> None:
        """Engine ``k``'s counts, and its beats' words one a clock: the FIFO's head beat is
        first taken into a register (a block RAM's output is slow, so no choice starts from it),
        then its first ``words`` words go out from a second register, one a clock."""
        m.d.comb += [
            engine.n.valid.eq(counts.r_rdy),
            engine.n.payload.eq(counts.r_data),
            counts.r_en.eq(engine.n.ready),
        ]
        head = Signal(pool_beat_layout(self.words), name=f"split{k}_beat")
        loaded = Signal(name=f"split{k}_loaded")
        index = Signal(range(self.words), name=f"split{k}_index")
        word, word_valid = Signal(WORD_BITS, name=f"split{k}_word"), Signal(name=f"split{k}_valid")
        free = ~word_valid | engine.i.ready
        done = index + 1 >= head.words  # this clock sends the beat's last word (or it has none)
        load = ~loaded | (free & done)
        in_order = Cat(head.data.word_select(w, WORD_BITS) for w in reversed(range(self.words)))
        m.d.comb += [
            engine.i.valid.eq(word_valid),
            engine.i.payload.eq(word),
            beats.r_en.eq(load),
        ]
        with m.If(load):
            m.d.sync += [loaded.eq(beats.r_rdy), head.eq(beats.r_data)]
        with m.If(free):
            m.d.sync += [
                word_valid.eq(loaded & (head.words != 0)),
                word.eq(in_order.word_select(index, WORD_BITS)),
            ]
            with m.If(loaded):
                m.d.sync += index.eq(Mux(done, 0, index + 1))

    def _pack(self, m: Module, k: int, engine, out) -> None:
        """Engine ``k``'s symbols into E-symbol beats (``count``, ``last``) written to ``out``.
        A packet's last beat is marked ``bad`` unless the engine's ``padded`` verdict has come
        (it comes before the last symbol reaches here, but waiting for it costs nothing when
        late); after an engine error, its partial beat, or a beat of no symbols, goes marked
        ``bad``, and nothing after it."""
        e_count = self.engines
        lanes = [Signal(8, name=f"pack{k}_lane{j}") for j in range(e_count)]
        held = Signal(range(e_count + 1), name=f"pack{k}_held")
        # each symbol first lands in a register by the engine (its rank LUT's block RAM output
        # is slow), then in its lane of the beat
        sym = Signal(SymbolLayout, name=f"pack{k}_symbol")
        take = Signal(name=f"pack{k}_take")
        m.d.sync += [take.eq(engine.o.valid), sym.eq(engine.o.payload)]
        # verdicts come before their packets' last beats, a packet at most ahead (the next
        # packet's is 4 clocks after its count, taken after this one's)
        verdicts = Signal(range(3), name=f"pack{k}_verdicts")
        pending, reported = Signal(name=f"pack{k}_pending"), Signal(name=f"pack{k}_reported")
        good = verdicts != 0
        ends = take & sym.last
        full_beat = take & ((held == e_count - 1) | sym.last)
        write_now = full_beat & (~sym.last | good | engine.error)
        defer = ends & ~good & ~engine.error  # the last beat waits in the lanes for its verdict
        # a write from the lanes (no symbol this clock): a deferred last beat, or after an
        # engine error what it emitted of its packet, or (none) a marker
        resolve = pending & (good | engine.error)
        flush = ~pending & ~reported & engine.error & ~engine.o.valid
        late = ~take & (resolve | flush) & out.w_rdy
        late_bad = ~(pending & good)
        word = Signal(out_layout(e_count), name=f"pack{k}_word")
        m.d.comb += [
            word.beat.data.eq(
                Cat(*(Mux(held == j, sym.data, lane) for j, lane in enumerate(lanes)))
            ),
            word.beat.count.eq(Mux(take, held + 1, held)),
            word.beat.last.eq(Mux(take, sym.last, pending)),
            word.bad.eq(Mux(take, sym.last & ~good, late_bad)),
            word.marks.eq(~take & late_bad & (held == 0)),
            out.w_en.eq(write_now | late),
            out.w_data.eq(word),
        ]
        consumed = (write_now & ends & good) | (late & pending & good)
        m.d.sync += verdicts.eq(verdicts + engine.padded - consumed)
        with m.If((write_now & word.bad) | (late & late_bad)):
            m.d.sync += reported.eq(1)
        with m.If(take):
            for j, lane in enumerate(lanes):
                with m.If(held == j):
                    m.d.sync += lane.eq(sym.data)
            m.d.sync += held.eq(Mux(write_now, 0, held + 1))
        with m.Elif(late):
            m.d.sync += held.eq(0)
        with m.If(defer):
            m.d.sync += pending.eq(1)
        with m.Elif(late):
            m.d.sync += pending.eq(0)
        # the engine's output is always taken; it stops parsing (``hold``, a register) while the
        # FIFO has room for fewer than HOLD_MARGIN beats (the symbols already in its pipeline and
        # the parse of the clock the hold is late by fit in those), or while a last beat waits
        # for its verdict. The FIFO's fill level so stays out of the engine's stall logic, whose
        # paths already span the engine.
        stop = Signal(name=f"pack{k}_stop")
        m.d.sync += stop.eq((out.level >= self.depth - HOLD_MARGIN) | defer | (pending & ~late))
        m.d.comb += [engine.o.ready.eq(1), engine.hold.eq(stop)]
