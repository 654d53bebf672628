"""Types of the native OTLP-JSON line decoder (src/lib.rs)."""

from typing import Any, List, Optional, Tuple

FORMAT: int

class LineDecoder:
    bailed: int
    scanned: int
    lists_scanned: int
    lists_recent: int
    def __init__(self, helper: Any, slot_keys: List[str], kept_keys: List[str]) -> None: ...
    def decode(self, data: bytes, begin: int, end: int) -> Optional[List[Tuple[Any, ...]]]: ...
    def spill_block(
        self,
        data: bytes,
        stop: int,
        skeleton: List[str],
        not_timeline: List[str],
        sync: List[str],
    ) -> Optional[Tuple[List[Tuple[str, int, int]], bytes, List[str], int]]: ...
