"""An event loop as a lane's reader: the worker's reports read on the loop its runs' calls use.

    ToolStarter.submit (calls started, all on one loop) ──hand_to_loop──> LoopReader
        loop: add_reader(dup of the pipe) ──look──> Readers.pump ──after──> go on (a timer for
        the frame's kill time), or stop: hand the lane back (`Readers.ensure_reader`), or close
        the pipes of a worker that died

So an ``MCP.*`` call costs the wake-ups a direct call does (worker -> loop -> server -> loop ->
worker), and ``exec_async`` runs whose calls run on their caller's loop never cross a thread
(see `readers.LoopReader` for when a loop may read, and how it hands the lane over).
"""

from __future__ import annotations

import functools
import os
import threading

from .fleet import Fleet, Out, run_all
from .hotloop import HotLoop, watch
from .readers import LoopReader, Waiter
from .runs import Phase, Run
from .workers import READER_THREAD

__all__ = ["LoopReading"]


class LoopReading:
    """Hands a lane to an event loop and drives the loop's looks at it (on the loop's thread)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def hand_to_loop(self, run: Run, out: Out) -> None:
        """Under the lock, on the thread that reads the run's worker, once the run's calls have
        started: the loop they all run on reads the worker from now on, if it may (see
        `LoopReader`)."""
        waiter: Waiter | None = run.waiter
        lane = run.lane
        if waiter is None or lane is None or lane.dead or run.phase is not Phase.PARKED:
            return
        loop = run.dispatcher.loop()
        if loop is None:
            return
        if waiter.loop is None:
            # A caller reading its own worker, alone on it; only codemode's loops (a caller's
            # own loop may stop at any time, while this caller waits on another thread).
            if lane.reader is not waiter or waiter.thread != threading.get_ident():
                return
            if not isinstance(loop, HotLoop) or self._fleet.readers.need_reader(lane, run):
                return
            keeper: Waiter | None = waiter
        else:
            if loop is not waiter.loop or lane.reader is not READER_THREAD:
                return
            if threading.current_thread() is not lane.thread:
                return  # (only the lane's thread may hand over its own reading, between looks)
            keeper = None
        reader = LoopReader(lane, loop, keeper)
        lane.reader = reader
        out.append(functools.partial(self._start, reader))

    def stop(self, reader: LoopReader) -> None:
        """At close: the loop reader stops on its loop (which runs it before it stops); on a
        loop closed already (its selector with it), its dup is closed here."""
        try:
            reader.loop.call_soon_threadsafe(self._after, reader)
        except RuntimeError:
            if reader.fd >= 0:
                os.close(reader.fd)
                reader.fd = -1

    def _start(self, reader: LoopReader) -> None:
        try:
            reader.loop.call_soon_threadsafe(self._attach, reader)
        except RuntimeError:  # closed: the lane's thread reads instead
            with self._fleet.lock:
                lane = reader.lane
                if lane.reader is reader:
                    lane.reader = None
                    self._fleet.readers.ensure_reader(lane)

    def _attach(self, reader: LoopReader) -> None:
        """On the loop's thread."""
        with self._fleet.lock:
            lane = reader.lane
            if lane.reader is reader and not lane.dead and not reader.leave:
                reader.fd = os.dup(lane.worker.rfd)  # (open: no one closes it while it is ours)
        if reader.fd >= 0:
            reader.loop.add_reader(reader.fd, self._look, reader)
            watch(reader.loop, 1)
        self._after(reader)

    def _look(self, reader: LoopReader) -> None:
        """On the loop's thread: the worker wrote (or a frame's kill time came)."""
        with self._fleet.lock:
            lane = reader.lane
            reader.pumping = lane.reader is reader and not lane.dead and not reader.leave
        if reader.pumping:
            self._fleet.readers.pump(lane, 0.0)
        self._after(reader)

    def _after(self, reader: LoopReader) -> None:
        """On the loop's thread: goes on reading while anything needs it (with a timer for the
        kill time of a frame in flight), else stops: hands the lane over, or closes the pipes
        of a worker that died."""
        out: Out = []
        delay: float | None = None
        readers = self._fleet.readers
        with self._fleet.lock:
            reader.pumping = False
            lane = reader.lane
            if lane.reader is reader and not lane.dead and not reader.leave and readers.need_reader(lane):
                delay = readers.poll_timeout(lane)
            elif lane.reader is reader:
                lane.reader = None
                if lane.dead:
                    out.append(lane.worker.kill)
                else:
                    readers.ensure_reader(lane)
        if reader.timer is not None:
            reader.timer.cancel()
            reader.timer = None
        if delay is not None:
            reader.timer = reader.loop.call_later(delay, self._look, reader)
        elif reader.fd >= 0:
            reader.loop.remove_reader(reader.fd)
            os.close(reader.fd)
            reader.fd = -1
            watch(reader.loop, -1)
        run_all(out)
