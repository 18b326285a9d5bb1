"""An engine nobody closed: interpreter exit and garbage collection close it, and the process exits cleanly.

A run once ended with `terminate called without an active exception` (exit 134) after every test passed: the
event pump, a daemon thread waiting inside the native engine, woke after Python had started finalizing, and the
thread exit Python forces on it unwound through native frames. These tests run such programs in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

OPEN_AND_SUBMIT = """
import asyncio, gc, sys, time
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

def open_engine():
    return Engine.open_sync(sys.argv[1], EngineOptions(max_context=2048, max_concurrency=2))

def start(engine, n=1500):
    async def main():
        engine.submit(Request([5, 6, 7, 8], SamplingParams(temperature=0), max_new_tokens=n, stop_token_ids=()))
        await asyncio.sleep(0.05)  # decoding now, with a route to a loop that is about to close
    asyncio.run(main())
"""


def run_program(body: str, artifact) -> subprocess.CompletedProcess:
    source = OPEN_AND_SUBMIT + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", source, str(artifact)], capture_output=True, text=True, check=False,
                          timeout=120)


def assert_clean_exit(done: subprocess.CompletedProcess) -> None:
    assert "terminate called" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("done"), done.stdout


def test_exit_while_a_request_decodes_is_clean(tiny_llama_artifact):
    done = run_program("""
        engine = open_engine()
        start(engine)
        print("done")
    """, tiny_llama_artifact)
    assert_clean_exit(done)


def test_an_unreferenced_engine_is_closed_by_garbage_collection(tiny_llama_artifact):
    done = run_program("""
        import weakref
        engine = open_engine()
        start(engine)
        pump = engine._pump
        ref = weakref.ref(engine)
        del engine
        gc.collect()
        assert ref() is None, "something still holds the engine"
        assert pump.closed and not pump.thread.is_alive()
        print("done")
    """, tiny_llama_artifact)
    assert_clean_exit(done)


def test_exit_with_two_engines_and_a_constrained_request_waiting_is_clean(tiny_llama_artifact):
    # The constrained request's step waits for a mask while the interpreter exits.
    done = run_program("""
        import numpy as np
        class Slow:
            def fill_next_mask(self, new, mask):
                time.sleep(0.01)
                mask[:] = 0xFFFFFFFF
                return True
        engines = [open_engine(), open_engine()]
        start(engines[0])
        async def constrained():
            engines[1].submit(Request([5, 6], SamplingParams(temperature=0), max_new_tokens=1500,
                                      stop_token_ids=(), constraint=Slow()))
            await asyncio.sleep(0.05)
        asyncio.run(constrained())
        print("done")
    """, tiny_llama_artifact)
    assert_clean_exit(done)
