"""Stand-in pynvml: one GPU with fixed readings (see README.md)."""

NVML_TEMPERATURE_GPU = 0


class _Utilization:
    gpu, memory = 37, 5


class _Memory:
    used, total, free = 1 << 30, 80 << 30, 79 << 30


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetName(h):
    return "Stand-in GPU"


def nvmlDeviceGetUtilizationRates(h):
    return _Utilization()


def nvmlDeviceGetMemoryInfo(h):
    return _Memory()


def nvmlDeviceGetPowerUsage(h):
    return 123456


def nvmlDeviceGetTemperature(h, sensor):
    return 40
