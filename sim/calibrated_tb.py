"""cocotb test module: a model's calibrated tables in the decoder, one after another.

Each table of a table set (golden/tablefile.py, as zipccl.Calibrator.save writes it) is loaded
through the decoder's table-write port ``tw``; then the decoder takes the software's serial stream
of real symbols coded with that key's table and must give back the symbols, bit for bit, under
random back-pressure. The streams come from the software's own tables, not from the file: a table
that changed on its way through the file fails here.

Configured by the environment (set by tests/test_calibration.py): ZIPCCL_TABLES, the table set;
ZIPCCL_STREAMS, an .npz with ``symbols:<key>`` and ``stream:<key>`` (golden.streams.encode_serial
bytes) for every key; ZIPCCL_DONE, where the keys checked are written (a JSON list), so that a
run that checked nothing cannot pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge
from zipccl.golden import tablefile
from zipccl.golden.codebook import Codebook
from zipccl.hw.tables import Mem
from zipccl.sim.bench import SINGLE, Bench, serial_words, table_beats
from zipccl.sim.cocotb_suite import PERIOD_NS, CocotbPort
from zipccl.sim.suite import DEC_IN

DECODER_MEMS = (Mem.REGION, Mem.RANK, Mem.COUNT)
RATE = 0.7  # valid on the inputs, ready on the output


async def decode_stream(bench: Bench, book: Codebook, symbols: np.ndarray, stream: bytes) -> None:
    """Load ``book`` through ``tw``, decode ``stream`` as one packet, compare with ``symbols``."""
    await bench.feed({"tw": table_beats(book, DECODER_MEMS)})
    first = len(bench.sink.got)
    await bench.feed({"n": [len(symbols)], "i": serial_words(stream)})
    await bench.drain(first + len(symbols))
    got, want = bench.sink.got[first:], SINGLE.symbol_beats(symbols)
    if got != want:
        bad = next(
            (k for k, (g, w) in enumerate(zip(got, want, strict=False)) if g != w),
            min(len(got), len(want)),
        )
        raise AssertionError(
            f"{book.describe()}: beat {bad} of {len(want)} differs (got "
            f"{len(got)} beats): {got[bad : bad + 1]} != {want[bad : bad + 1]}"
        )


@cocotb.test()
async def calibrated_tables(dut) -> None:
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    for name in ("i__valid", "tw__valid", "n__valid", "o__ready"):
        getattr(dut, name).value = 0
    port = CocotbPort(dut)
    await FallingEdge(dut.clk)
    await port.reset()
    bench = Bench.make(port, DEC_IN, seed=7, in_rate=RATE, out_rate=RATE)
    entries = tablefile.load(os.environ["ZIPCCL_TABLES"])
    checked = []
    with np.load(os.environ["ZIPCCL_STREAMS"]) as streams:
        for key, entry in entries.items():
            stream = streams[f"stream:{key}"].tobytes()
            await decode_stream(bench, entry.table, streams[f"symbols:{key}"], stream)
            checked.append(key)
    Path(os.environ["ZIPCCL_DONE"]).write_text(json.dumps(checked))
