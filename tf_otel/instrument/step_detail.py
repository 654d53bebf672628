"""Resource detail on chosen steps: peak RSS, the files read or written, the GPU allocator peak.

``TF_OTEL_RESOURCES_EVERY=N`` (0, the default: off): steps 0, N, 2N ... of every step key (the
same steps on every rank), when sampled. On those steps only, on the step span:

- ``tf_otel.memory.peak_rss``: the largest resident size seen during the step, sampled every
  ``SAMPLE_S`` (1 ms) by one background thread (parked between detail steps), and the process's
  ``ru_maxrss`` when the step raised it (then the true peak). Not the VmHWM reset of
  /proc/self/clear_refs: that would also reset the program's own ``ru_maxrss``.
- ``tf_otel.io.files`` / ``tf_otel.io.files.bytes`` / ``tf_otel.io.files.mode`` (parallel
  lists, at most ``MAX_FILES``, most bytes first; ``tf_otel.io.files.total``: how many moved):
  per regular file, how far its file position advanced during the step (``r``: opened read-only,
  so bytes read; ``w``: written; ``rw``: either), from /proc/self/fd and /proc/self/fdinfo
  read at the step's begin and end and every ``FILES_EVERY`` samples (5 ms) by the same thread
  (the positions of files already seen: every sample).
  A file opened during the step counts from position 0. Readers that use ``pread`` (TensorFlow's
  own C++ file readers: TFRecordDataset, tf.io.read_file...) never move the position: such files,
  open for reading, are listed in ``tf_otel.io.files.unmoved`` (names only); their bytes are in
  the step's ``tf_otel.io.read_bytes`` (instrument/step_resources.py). What is read after the
  last sample before a close (1 ms), or by a file opened and closed between two scans (5 ms),
  is not seen. When consecutive steps are detail steps, each one
  counts from the previous one's end, so their figures add up.
- ``tf_otel.gpu.memory.peak`` / ``tf_otel.gpu.memory.usage``: TensorFlow's allocator peak and
  current bytes on ``GPU:0`` of this process (``tf.config.experimental.get_memory_info``), its
  peak reset at the step's begin (``reset_memory_stats``: a program reading that peak itself sees
  per-step peaks on detail steps). No GPU: nothing, no error.

File names only, never contents. Linux only (no /proc: the RSS and file attributes are absent).
Cost: docs/guides/WHOLE_STEP.md.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from tf_otel.config import Settings
from tf_otel.health import count, fail_open
from tf_otel.instrument._patching import Error, HookOrder, StepCall, StepHook, add_step_hook
from tf_otel.step_handle import StepHandle

ATTR_PEAK_RSS = "tf_otel.memory.peak_rss"
ATTR_FILES = "tf_otel.io.files"
ATTR_FILE_BYTES = "tf_otel.io.files.bytes"
ATTR_FILE_MODE = "tf_otel.io.files.mode"
ATTR_FILES_TOTAL = "tf_otel.io.files.total"
ATTR_FILES_UNMOVED = "tf_otel.io.files.unmoved"
ATTR_GPU_PEAK = "tf_otel.gpu.memory.peak"
ATTR_GPU_USAGE = "tf_otel.gpu.memory.usage"
SAMPLE_S = 0.001
FILES_EVERY = 5  # an fd scan every 5 RSS samples
MAX_FILES = 16
MAX_TRACKED = 64  # files followed at once (one fdinfo descriptor each)
MAX_FDS = 4096  # fds looked at per scan
_NOT_DATA = ("/proc/", "/dev/", "/sys/")
_MODES = ("r", "w", "rw", "rw")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _fdinfo(text: bytes) -> Tuple[int, int, int]:
    """(pos, access mode, inode) from /proc/self/fdinfo/N."""
    pos = flags = ino = 0
    for line in text.split(b"\n"):
        if line.startswith(b"pos:"):
            pos = int(line[4:])
        elif line.startswith(b"flags:"):
            flags = int(line[6:], 8)
        elif line.startswith(b"ino:"):
            ino = int(line[4:])
    return pos, flags & 3, ino


class _File:
    __slots__ = ("path", "ino", "mode", "base", "pos", "info")

    def __init__(self, path: str, ino: int, mode: int, base: int, pos: int, info: int) -> None:
        self.path, self.ino, self.mode, self.base, self.pos, self.info = (
            path, ino, mode, base, pos, info
        )  # fmt: skip


class Files:
    """Regular files' positions through a step: an fdinfo fd kept open per file (one pread a
    scan); only fd numbers not seen before are resolved (readlink)."""

    def __init__(self) -> None:
        self.files: Dict[int, _File] = {}
        self.other: set = set()  # fd numbers that are not regular files (sockets, pipes, /proc)
        self.done: List[Tuple[str, int, int]] = []  # (path, mode, bytes) of files gone mid-step

    def reset(self) -> None:
        for f in self.files.values():
            with fail_open("step_detail.files"):
                os.close(f.info)
        self.files.clear()
        self.other.clear()
        self.done.clear()

    def _finish(self, fd: int) -> None:
        f = self.files.pop(fd)
        self.done.append((f.path, f.mode, f.pos - f.base))
        os.close(f.info)

    def scan(self, counting: bool) -> None:
        """Update positions; ``counting``: files first seen now were opened during the step
        (counted from 0), else they are the step's starting point."""
        names = os.listdir("/proc/self/fd")[:MAX_FDS]
        present = set()
        for name in names:
            fd = int(name)
            present.add(fd)
            known = self.files.get(fd)
            if known is not None:
                try:
                    pos, mode, ino = _fdinfo(os.pread(known.info, 4096, 0))
                except OSError:  # closed since the listing
                    self._finish(fd)
                    continue
                if ino == known.ino:
                    known.pos = pos
                    continue
                self._finish(fd)  # the number was closed and reused
            elif fd in self.other:
                continue
            self._add(fd, counting)
        for fd in [fd for fd in self.files if fd not in present]:
            self._finish(fd)
        self.other &= present

    def refresh(self) -> None:
        """Positions of the files already known (one pread each): between two scans, so a
        file read and closed loses at most one sample interval of reads."""
        for fd, known in list(self.files.items()):
            try:
                pos, _, ino = _fdinfo(os.pread(known.info, 4096, 0))
            except OSError:
                self._finish(fd)
                continue
            if ino != known.ino:
                self._finish(fd)
            else:
                known.pos = pos

    def _add(self, fd: int, counting: bool) -> None:
        if len(self.files) >= MAX_TRACKED:
            # each tracked file holds one fdinfo descriptor open: bounded, so a job with many
            # open shards never runs out of descriptors because of us
            count("step_detail.files_untracked")
            return
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if not path.startswith("/") or path.startswith(_NOT_DATA):
            self.other.add(fd)
            return
        try:
            info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY)
        except OSError:
            return
        try:
            pos, mode, ino = _fdinfo(os.pread(info, 4096, 0))
        except OSError:
            os.close(info)
            return
        self.files[fd] = _File(path, ino, mode, 0 if counting else pos, pos, info)

    def take(self) -> Tuple[List[Tuple[str, int, int]], List[str]]:
        """((path, mode, bytes) moved, paths open for reading that did not move); each live
        file's count restarts at its current position."""
        moved = [d for d in self.done if d[2] > 0]
        unmoved = []
        for f in self.files.values():
            if f.pos > f.base:
                moved.append((f.path, f.mode, f.pos - f.base))
            elif f.mode != 1:
                unmoved.append(f.path)
            f.base = f.pos
        self.done.clear()
        return moved, unmoved


class Sampler:
    """One parked thread: samples RSS (and scans files) while a detail step runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.go = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.statm: Optional[int] = None
        self.files = Files()
        self.active = False
        self.peak = 0
        self.last: Optional[Tuple[str, int]] = None  # the last detail step: (key, step)

    def rss(self) -> int:
        if self.statm is None:
            self.statm = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(self.statm, 128, 0).split()[1]) * _PAGE

    def begin(self, key: str, step: int) -> None:
        with self.lock:
            # consecutive detail steps of one key count on from the previous one's end
            if self.last != (key, step - 1):
                self.files.reset()
                self.files.scan(counting=False)
            else:
                self.files.scan(counting=True)
            self.peak = self.rss()
            self.active = True
        if self.thread is None or not self.thread.is_alive():
            thread = threading.Thread(target=self._run, name="tf_otel-step-detail", daemon=True)
            self.thread = thread
            thread.start()
        self.go.set()

    def end(self, key: str, step: int) -> Tuple[int, List[Tuple[str, int, int]], List[str]]:
        self.go.clear()
        with self.lock:
            self.active = False
            self.files.scan(counting=True)
            self.peak = max(self.peak, self.rss())
            self.last = (key, step)
            return (self.peak, *self.files.take())

    def _run(self) -> None:
        samples = 0
        while True:
            self.go.wait()
            with fail_open("step_detail.sampler"):
                while self.go.is_set():
                    rss = self.rss()
                    samples += 1
                    with self.lock:
                        if self.active:
                            self.peak = max(self.peak, rss)
                            if samples % FILES_EVERY == 0:
                                self.files.scan(counting=True)
                            else:
                                self.files.refresh()
                    time.sleep(SAMPLE_S)
            time.sleep(SAMPLE_S)  # a failing sampler must not spin

    def after_fork(self) -> None:
        """In a forked child: its /proc/self fds were opened by the parent."""
        self.thread = None
        self.statm = None
        self.files = Files()
        self.lock = threading.Lock()
        self.go = threading.Event()
        self.active = False
        self.last = None


sampler = Sampler()
_gpu: List[Optional[str]] = []  # [device] once looked up; [None]: no GPU


def _gpu_device() -> Optional[str]:
    if not _gpu:
        tf = sys.modules.get("tensorflow")
        if tf is None:
            return None
        _gpu.append("GPU:0" if tf.config.list_physical_devices("GPU") else None)
    return _gpu[0]


def _max_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


@dataclass
class _Detail:
    """A detail step from its start to its end."""

    max_rss_before: int  # the process's peak RSS so far
    sampling: bool = False  # the RSS / file sampler runs for this step
    gpu: Optional[str] = None  # the device whose memory stats were reset


class DetailHook(StepHook[_Detail]):
    order = HookOrder.DETAIL

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[_Detail]:
        if not handle.sampled or handle.step % self.every:
            return None
        detail = _Detail(_max_rss())
        handle.mark_detail("resources")
        with fail_open("step_detail.begin"):
            sampler.begin(handle.key, handle.step)
            detail.sampling = True
        with fail_open("step_detail.gpu"):
            device = _gpu_device()
            if device is not None:
                import tensorflow as tf

                tf.config.experimental.reset_memory_stats(device)
                detail.gpu = device
        return detail

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: Error, kept: Optional[_Detail]
    ) -> None:
        if kept is None:
            return
        attributes = handle.attributes
        device = kept.gpu
        if device is not None:
            with fail_open("step_detail.gpu"):
                import tensorflow as tf

                info = tf.config.experimental.get_memory_info(device)
                attributes[ATTR_GPU_PEAK] = int(info["peak"])
                attributes[ATTR_GPU_USAGE] = int(info["current"])
        if not kept.sampling:
            return
        peak, moved, unmoved = sampler.end(handle.key, handle.step)
        max_after = _max_rss()
        if max_after > kept.max_rss_before:  # the step set the process's record: that is its peak
            peak = max(peak, max_after)
        attributes[ATTR_PEAK_RSS] = peak
        moved.sort(key=lambda m: m[2], reverse=True)
        attributes[ATTR_FILES_TOTAL] = len(moved)
        if moved:
            moved = moved[:MAX_FILES]
            attributes[ATTR_FILES] = [m[0] for m in moved]
            attributes[ATTR_FILE_BYTES] = [m[2] for m in moved]
            attributes[ATTR_FILE_MODE] = [_MODES[m[1]] for m in moved]
        if unmoved:
            attributes[ATTR_FILES_UNMOVED] = sorted(set(unmoved))[:MAX_FILES]


def register(settings: Settings) -> None:
    every = settings.resources_every
    if not every:
        return
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=sampler.after_fork)
    add_step_hook(DetailHook(every))
