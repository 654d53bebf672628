"""Where this process sits in the job: rank, world size, local rank, host and job id.

Read from the launcher's environment, no communication: Horovod (gloo), Open MPI, MPICH/Hydra
(PMI), PMIx, SLURM and TF_CONFIG. The job id is derived from launcher facts that every rank of one
launch shares, so every rank computes the same id alone; ``TF_OTEL_JOB_ID`` overrides.

Usage::

    topo = detect()
    topo.rank, topo.world_size, topo.job_id, topo.reference_host
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import uuid
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from tf_otel.health import log_once

COORDINATOR_BASE_PORT = 29400
COORDINATOR_PORT_SPAN = 500


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    host: str = ""
    job_id: str = ""
    launcher: str = "none"
    # where rank 0 runs, for the TCP services (None: unknown, needs TF_OTEL_COORDINATOR)
    reference_host: Optional[str] = "127.0.0.1"
    # the task name in PS mode, e.g. "worker:1"
    task: Optional[str] = None
    # ranks that run training steps (parameter servers do not); 0: all of world_size
    stepping_ranks: int = 0

    @property
    def step_world_size(self) -> int:
        """How many ranks report each step (a step root waits for these)."""
        return self.stepping_ranks or self.world_size

    @property
    def is_reference(self) -> bool:
        return self.rank == 0

    def coordinator_address(self) -> Optional[Tuple[str, int]]:
        """Default address of rank 0's coordinator (the clock service uses port + 1)."""
        if self.reference_host is None:
            return None
        digest = int(hashlib.sha256(self.job_id.encode()).hexdigest()[:8], 16)
        return self.reference_host, COORDINATOR_BASE_PORT + 2 * (digest % COORDINATOR_PORT_SPAN)


def _int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        raw = env.get(name)
        if raw is None:
            continue
        try:
            return int(raw)
        except ValueError:
            log_once("topology:" + name, "tf_otel: ignoring %s=%r (not an integer)", name, raw)
    return None


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def expand_slurm_nodelist(nodelist: str) -> List[str]:
    """Expand a SLURM node list such as ``gpu[01-03,07],login1`` into host names."""
    hosts: List[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", nodelist):
        prefix, ranges = match.group(1), match.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(prefix + lo)
                continue
            for n in range(int(lo), int(hi) + 1):
                hosts.append(prefix + str(n).zfill(len(lo)))
    return hosts


def _tf_config(env: Mapping[str, str]) -> Optional[Dict]:
    raw = env.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        config["cluster"], config["task"]["type"], int(config["task"]["index"])
        return config
    except (ValueError, KeyError, TypeError) as exc:
        log_once("topology:TF_CONFIG", "tf_otel: ignoring TF_CONFIG=%r (%s)", raw[:200], exc)
        return None


_TASK_ORDER = ("chief", "master", "worker", "ps", "evaluator")


def _from_tf_config(config: Dict, host: str) -> Topology:
    cluster: Dict[str, List[str]] = config["cluster"]
    tasks: List[Tuple[str, int, str]] = []
    for kind in sorted(
        cluster, key=lambda k: (_TASK_ORDER.index(k) if k in _TASK_ORDER else 99, k)
    ):
        for index, address in enumerate(cluster[kind]):
            tasks.append((kind, index, address))
    me = (config["task"]["type"], int(config["task"]["index"]))
    rank = next((i for i, t in enumerate(tasks) if (t[0], t[1]) == me), 0)
    my_host = tasks[rank][2].rpartition(":")[0]
    hosts = [t[2].rpartition(":")[0] for t in tasks]
    local = [i for i, h in enumerate(hosts) if h == my_host]
    return Topology(
        rank=rank,
        world_size=len(tasks),
        local_rank=local.index(rank) if rank in local else 0,
        local_size=len(local),
        host=host,
        job_id=_hash("tf_config", json.dumps(cluster, sort_keys=True)),
        launcher="tf_config",
        reference_host=hosts[0] or "127.0.0.1",
        task=f"{me[0]}:{me[1]}",
        stepping_ranks=sum(1 for t in tasks if t[0] in ("chief", "master", "worker")),
    )


def detect(env: Optional[Mapping[str, str]] = None, job_id: Optional[str] = None) -> Topology:
    """Read the topology from ``env`` (default: os.environ)."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    topo = _detect(env, host)
    if job_id:
        topo = Topology(**{**topo.__dict__, "job_id": job_id})
    return topo


def _detect(env: Mapping[str, str], host: str) -> Topology:
    launchers = (
        ("horovod", ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")),
        (
            "openmpi",
            (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ),
        ),
        ("pmi", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
        ("pmix", ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE")),
        ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")),
    )
    for launcher, (rank_var, size_var, local_var, local_size_var) in launchers:
        rank = _int(env, rank_var)
        size = _int(env, size_var)
        if rank is None or size is None:
            continue
        local_rank = _int(env, local_var) or 0
        local_size = _int(env, local_size_var) or 1
        job_id, reference_host = _launch_identity(env, launcher, size, local_size)
        return Topology(
            rank=rank,
            world_size=size,
            local_rank=local_rank,
            local_size=local_size,
            host=host,
            job_id=job_id,
            launcher=launcher,
            reference_host=reference_host,
        )
    config = _tf_config(env)
    if config is not None:
        return _from_tf_config(config, host)
    return Topology(host=host, job_id=uuid.uuid4().hex[:16], launcher="none")


def _launch_identity(
    env: Mapping[str, str], launcher: str, size: int, local_size: int
) -> Tuple[str, Optional[str]]:
    """A job id every rank of this launch derives alike, and rank 0's host if it can be known."""
    facts = [
        ("SLURM_JOB_ID", "SLURM_STEP_ID"),
        ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"),
        ("OMPI_MCA_ess_base_jobid",),
        ("PMIX_NAMESPACE",),
        ("OMPI_MCA_orte_hnp_uri",),
        ("PMI_KVSNAME",),
        ("PMI_PORT",),
    ]
    job_id = None
    for names in facts:
        values = [env.get(n) for n in names]
        if all(values):
            job_id = _hash(launcher, *names, *values)  # type: ignore[arg-type]
            break
    if job_id is None:
        # Nothing every rank shares: rank 0 and the others still agree on the parent's identity
        # when one local launcher started all of them (mpirun/horovodrun on one host).
        job_id = _hash(launcher, "ppid", str(os.getppid())) if size == local_size else "unknown"
        log_once(
            "topology:job_id",
            "tf_otel: no launcher job id in the environment; set TF_OTEL_JOB_ID to the same "
            "value on every rank so all ranks land in the same step traces",
        )
    reference_host: Optional[str] = None
    if size == local_size:
        reference_host = "127.0.0.1"
    elif env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"):
        nodes = expand_slurm_nodelist(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        reference_host = nodes[0] if nodes else None
    return job_id, reference_host
