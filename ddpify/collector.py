"""Fewer garbage collections while ddpify builds many objects that live on: a conversion's trees, torch's import.

At Python's thresholds the collector walks a growing heap again and again: 9-18% of a conversion's CPU
time on the bench corpus, ~13% of importing torch and torch._dynamo (2.6 against 3.0 CPU-s here). The
cycles either leaves are few, and young ones are still collected.
"""

from __future__ import annotations

import gc
import threading

FEWER_COLLECTIONS_THRESHOLDS = (20_000, 50, 1_000)  # young objects; young passes per middle pass; middle passes per full one


class FewerCollections:
    """While any thread is inside, the collector's thresholds are at least FEWER_COLLECTIONS_THRESHOLDS;
    the thresholds found come back when the last one leaves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._saved = gc.get_threshold()

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._saved = gc.get_threshold()
                gc.set_threshold(*(max(now, wanted) for now, wanted in zip(self._saved, FEWER_COLLECTIONS_THRESHOLDS)))
            self._inside += 1

    def __exit__(self, *_exc) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                gc.set_threshold(*self._saved)


FEWER_COLLECTIONS = FewerCollections()
