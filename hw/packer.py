"""The encoders' output stage: left-aligned codes in, beats of the serial layout out.

Shared by the single-lane encoder (beat = one 32-bit word, codes up to 11 bits) and the N-lane
encoder (beat = ``words`` words, codes = the merged block of N codewords). The pending bits
``acc`` are left aligned with zeros below them (``n`` < beat), so a code goes in with one shift
by the *register* ``n`` and an OR; once ``n + length >= beat`` the top ``beat`` bits leave (the
first stream bit on top) and the bits past them become the new ``acc``, a fixed shift. A packet
whose bits do not fill its last beat takes one extra *flush* clock that sends ``acc`` as it is,
already zero padded. ``o.payload.bits`` counts the packet's bits and is final on the ``last`` beat.
"""

from __future__ import annotations

from amaranth import C, Cat, Module, Signal, Value
from zipccl.hw.tables import COUNT_BITS


def add_packer(
    m: Module,
    o,
    *,
    beat: int,
    code_bits: int,
    valid: Value,
    code: Value,
    length: Value,
    last: Value,
) -> Value:
    """Add the packer to ``m``, driving the stream ``o`` (payload: data, last, bits).

    ``code`` is left aligned in ``code_bits`` bits with ``length`` of them used. Returns the
    signal that the code is taken this clock (the previous stage may advance).
    """
    acc, n = Signal(beat, name="acc"), Signal(range(beat), name="n")
    total, flush = Signal(COUNT_BITS, name="total"), Signal(name="flush")
    o_valid, o_data = Signal(name="o_valid"), Signal(beat, name="o_data")
    o_last, o_bits = Signal(name="o_last"), Signal(COUNT_BITS, name="o_bits")

    out_free = ~o_valid | o.ready
    end = Signal(range(beat + code_bits))
    pack = valid & ~flush & (out_free | (end < beat))  # a full ``o`` blocks only a whole beat
    joined = Signal(beat + code_bits)
    m.d.comb += [
        joined.eq(Cat(C(0, code_bits), acc) | (Cat(C(0, beat), code) >> n)),
        end.eq(n + length),
    ]
    with m.If(o.ready):
        m.d.sync += o_valid.eq(0)
    with m.If(flush & out_free):
        m.d.sync += [
            o_valid.eq(1),
            o_data.eq(acc),
            o_last.eq(1),
            o_bits.eq(total),
            flush.eq(0),
            acc.eq(0),
            n.eq(0),
            total.eq(0),
        ]
    with m.Elif(pack):
        m.d.sync += total.eq(total + length)
        with m.If(end >= beat):
            aligned = end == beat
            m.d.sync += [
                o_valid.eq(1),
                o_data.eq(joined[code_bits:]),
                o_last.eq(last & aligned),
                o_bits.eq(total + length),
                acc.eq(Cat(C(0, beat - code_bits), joined[:code_bits])),
                n.eq(end - beat),
                flush.eq(last & ~aligned),
            ]
            with m.If(last & aligned):
                m.d.sync += total.eq(0)
        with m.Else():
            m.d.sync += [acc.eq(joined[code_bits:]), n.eq(end), flush.eq(last)]
    m.d.comb += [o.valid.eq(o_valid), o.payload.eq(Cat(o_data, o_last, o_bits))]
    return pack
