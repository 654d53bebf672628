"""Parse NCCL CUDA kernel names (as CUPTI / the TF profiler report them) into their parts.

Usage::

    from tf_otel.nccl.kernels import parse_kernel_name
    k = parse_kernel_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    k.collective, k.op, k.dtype, k.algorithm, k.protocol  # AllReduce Sum f32 RING LL

Two naming schemes exist (NCCL src/device/generate.py and its predecessor):

- NCCL >= 2.19: ``ncclDevKernel_<Coll>[_<RedOp>_<ty>]_<ALGO>_<PROTO>``, ``..._SendRecv``
  and ``ncclDevKernel_Generic[_N]`` (one kernel that runs any function from a table).
- older: ``ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<ctype>`` (e.g. ``..._Sum_float``).

Note: a kernel name gives the kernel's *specialisation*, not what it ran: NCCL runs other
(algorithm, protocol) pairs, reduction ops and types through the same kernel. Seen with NCCL
2.28.9 on an H100: every collective of a 2-rank job ran in a ``..._RING_LL`` kernel (the ring:
RING/PAT, LL/SIMPLE), Max reductions in ``..._Sum_...`` kernels, int8 / int32 in ``_u8`` /
``_u32`` ones. The plugin ring (ring.py) has the real ones; ``ring.join_kernels`` puts them on
the kernel's Record.

Unknown or malformed names give fields of None; nothing here raises. The ``normalize_*``
helpers map the profiler plugin's spellings ("ncclFloat32", "Ring", "Simple") onto the
kernel-name spellings ("f32", "RING", "SIMPLE") so both sources join on equal values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Tuple

COLLECTIVES: Tuple[str, ...] = (
    "AllGatherV",
    "AllGather",
    "AllReduce",
    "Broadcast",
    "ReduceScatter",
    "Reduce",
    "SendRecv",
    "Generic",
)
REDOPS: Tuple[str, ...] = ("Sum", "Prod", "MinMax", "Min", "Max", "PreMulSum", "SumPostDiv", "Avg")
# longest first: "NVLS_TREE" must win over "NVLS", "LL128" over "LL"
ALGORITHMS: Tuple[str, ...] = (
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS_TREE",
    "COLLNET",
    "NVLS",
    "TREE",
    "RING",
    "PAT",
)
PROTOCOLS: Tuple[str, ...] = ("LL128", "LL", "SIMPLE")

# kernel-name short types (new scheme) and C types (old scheme) -> short type
_DTYPES: Dict[str, str] = {
    t: t for t in ("i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16")
}
_DTYPES.update({"f8e4m3": "f8e4m3", "f8e5m2": "f8e5m2"})
_CTYPES: Dict[str, str] = {
    "int8_t": "i8",
    "uint8_t": "u8",
    "int32_t": "i32",
    "uint32_t": "u32",
    "int64_t": "i64",
    "uint64_t": "u64",
    "half": "f16",
    "float": "f32",
    "double": "f64",
    "__nv_bfloat16": "bf16",
    "rccl_bfloat16": "bf16",
    "__nv_fp8_e4m3": "f8e4m3",
    "__nv_fp8_e5m2": "f8e5m2",
}
# ncclDataType_t names (and the bare words NCCL prints) -> short type
_NCCL_TYPES: Dict[str, str] = {
    "int8": "i8",
    "char": "i8",
    "uint8": "u8",
    "int32": "i32",
    "int": "i32",
    "uint32": "u32",
    "int64": "i64",
    "uint64": "u64",
    "float16": "f16",
    "half": "f16",
    "float32": "f32",
    "float": "f32",
    "float64": "f64",
    "double": "f64",
    "bfloat16": "bf16",
    "float8e4m3": "f8e4m3",
    "float8e5m2": "f8e5m2",
}
_DTYPE_BYTES: Dict[str, int] = {
    "i8": 1,
    "u8": 1,
    "i32": 4,
    "u32": 4,
    "i64": 8,
    "u64": 8,
    "f16": 2,
    "f32": 4,
    "f64": 8,
    "bf16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
}
_ALGO_ALIASES: Dict[str, str] = {
    "collnetdirect": "COLLNET_DIRECT",
    "collnetchain": "COLLNET_CHAIN",
    "nvlstree": "NVLS_TREE",
}
_PREFIXES = ("ncclDevKernel_", "ncclKernel_")


@dataclass(frozen=True)
class NcclKernel:
    """The parts of one NCCL kernel name; a field is None when the name does not say."""

    collective: str | None = None
    op: str | None = None
    dtype: str | None = None
    algorithm: str | None = None
    protocol: str | None = None

    def attributes(self) -> Dict[str, str]:
        """The ``nccl.*`` span attributes of the trace contract (only the known ones)."""
        pairs = (
            ("nccl.collective", self.collective),
            ("nccl.op", self.op),
            ("nccl.dtype", self.dtype),
            ("nccl.algorithm", self.algorithm),
            ("nccl.protocol", self.protocol),
        )
        return {k: v for k, v in pairs if v is not None}


def _bare(name: str) -> str:
    """Strip what demanglers add: 'void ', argument lists, template arguments."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:].lstrip()
    for sep in ("(", "<"):
        i = s.find(sep)
        if i > 0:
            s = s[:i]
    return s.strip()


def is_nccl_kernel(name: str) -> bool:
    s = _bare(name)
    return any(s.startswith(p) for p in _PREFIXES)


def _take(rest: str, choices: Tuple[str, ...]) -> Tuple[str | None, str]:
    """Take the first of ``choices`` that ``rest`` starts with (whole '_'-separated words)."""
    for c in choices:
        if rest == c or rest.startswith(c + "_"):
            return c, rest[len(c) + 1 :]
    return None, rest


def _parse_new(rest: str) -> NcclKernel:
    coll, rest = _take(rest, COLLECTIVES)
    if coll is None or coll == "Generic":
        return NcclKernel(collective=coll)
    op, rest = _take(rest, REDOPS)
    dtype = None
    if op is not None:
        head, _, tail = rest.partition("_")
        dtype = _DTYPES.get(head)
        rest = tail if dtype else rest
    algo, rest = _take(rest, ALGORITHMS)
    proto, rest = _take(rest, PROTOCOLS)
    return NcclKernel(coll, op, dtype, algo, proto)


def _parse_old(rest: str) -> NcclKernel:
    coll, rest = _take(rest, COLLECTIVES)
    if coll is None:
        return NcclKernel()
    algo, rest = _take(rest, ALGORITHMS)
    proto, rest = _take(rest, PROTOCOLS)
    op, rest = _take(rest, REDOPS)
    dtype = _CTYPES.get(rest) if rest else None
    if coll in ("AllGather", "Broadcast", "SendRecv"):
        op, dtype = None, None  # the old scheme pads copies with a dummy Sum_int8_t
    return NcclKernel(coll, op, dtype, algo, proto)


@lru_cache(maxsize=1024)
def parse_kernel_name(name: str) -> NcclKernel | None:
    """The parts of an NCCL kernel name, or None when ``name`` is not an NCCL kernel."""
    try:
        s = _bare(name)
        if s.startswith("ncclDevKernel_"):
            return _parse_new(s[len("ncclDevKernel_") :])
        if s.startswith("ncclKernel_"):
            return _parse_old(s[len("ncclKernel_") :])
    except Exception:  # never raise on a name  # pragma: no cover
        return NcclKernel()
    return None


def _squash(s: str) -> str:
    s = s.strip()
    if s.lower().startswith("nccl"):
        s = s[4:]
    return s


def normalize_dtype(s: str | None) -> str | None:
    """'ncclFloat32' / 'float' / 'f32' -> 'f32'; unknown -> the input unchanged."""
    if not s:
        return None
    if s in _DTYPES:
        return s
    if s in _CTYPES:
        return _CTYPES[s]
    return _NCCL_TYPES.get(_squash(s).lower(), s)


def dtype_size(short: str | None) -> int | None:
    return _DTYPE_BYTES.get(short or "")


def normalize_algorithm(s: str | None) -> str | None:
    """'Ring' / 'NVLSTree' / 'CollNetDirect' -> 'RING' / 'NVLS_TREE' / 'COLLNET_DIRECT'."""
    if not s:
        return None
    low = s.strip().lower().replace("_", "")
    return _ALGO_ALIASES.get(low, s.strip().upper())


def normalize_protocol(s: str | None) -> str | None:
    """'Simple' / 'LL128' -> 'SIMPLE' / 'LL128'."""
    return s.strip().upper() if s else None


_COLL_BY_LOWER = {c.lower(): c for c in COLLECTIVES}
_COLL_BY_LOWER.update({"send": "Send", "recv": "Recv", "allgatherv": "AllGatherV"})


def normalize_collective(s: str | None) -> str | None:
    """'ncclAllReduce' / 'allreduce' / 'AllReduce' -> 'AllReduce'."""
    if not s:
        return None
    return _COLL_BY_LOWER.get(re.sub(r"[_\s]", "", _squash(s)).lower(), s)
