"""Stand-in torch for scripts/gpu_check.py's rank job (see ../README.md)."""

import time

from . import distributed  # noqa: F401

__version__ = "standin"
float32, bfloat16, float16 = "float32", "bfloat16", "float16"
int32, float64, int8 = "int32", "float64", "int8"


class device:
    def __init__(self, *args):
        self.args = args


class Tensor:
    def __init__(self, n, dtype):
        self.n, self.dtype = n, dtype

    def numel(self):
        return self.n


def ones(n, dtype=float32, device=None):
    return Tensor(n, dtype)


def empty(n, dtype=float32, device=None):
    return Tensor(n, dtype)


class _Nccl:
    @staticmethod
    def version():
        return (2, 28, 9)


class _Cuda:
    nccl = _Nccl()

    def set_device(self, d):
        pass

    def synchronize(self):
        time.sleep(0.0002)

    def is_available(self):
        return True


cuda = _Cuda()
version = type("version", (), {"cuda": "standin"})
