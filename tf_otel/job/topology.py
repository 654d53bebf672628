"""Where this process sits in the job: rank, world size, local rank, host and job id.

Read from the launcher's environment, no communication: Horovod (gloo), Open MPI, MPICH/Hydra
(PMI), PMIx, SLURM and TF_CONFIG. The job id is derived from launcher facts that every rank of one
launch shares, so every rank computes the same id alone; ``TF_OTEL_JOB_ID`` overrides.
Precedence, first found wins: launcher environment, then TF_CONFIG, then the cluster the
program gave its ``tf.distribute.Server`` (learned by instrument/cluster.py through
``learn_cluster``, before the first step), else a lone process with a random job id.

Rank 0's host (``reference_host``) comes from the launch too (SLURM's and Open MPI's node
lists, Horovod's rendezvous store, the cluster spec's first task): docs/guides/CLUSTER.md
("Rank 0's address without settings"). The attempt (``launch_attempt``) tells launches under
the same identity apart, so a rerun gets step trace ids of its own while every rank of one
attempt shares each step's; where it comes from: docs/guides/RELIABILITY.md. A numeric attempt
n > 0 names n - 1 as the attempt before it (``previous_attempt``).

Usage::

    topo = detect()
    topo.rank, topo.world_size, topo.job_id, topo.reference_host
    host, port = resolve_address(topo.coordinator_address())   # background threads only

    cluster_topology({"ps": [...], "worker": [...]}, "worker", 1, host)   # rank 1 of 3
    learn_cluster(program_cluster(cluster, "worker", 1))   # the program's own Server: detect()
                                                            # uses it (runtime/lifecycle.py)
    learn_attempt("3f9c0a1b2d4e")   # rank 0's, from the coordination service: detect() uses
                                    # it for a cluster-spec job of several ranks
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from tf_otel.health import log_once

COORDINATOR_BASE_PORT = 29400
COORDINATOR_PORT_SPAN = 500
# reference_host of a Horovod multi-host launch: rank 0's address is looked up at connect time
KV_SCHEME = "kv+http://"
KV_SCOPE = "tf_otel"
KV_TIMEOUT_S = 2.0


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
    # this launch of the job (``launch_attempt``); "": none known (ids from the job id alone)
    attempt: str = ""
    previous_attempt: Optional[str] = None  # the attempt before it, where known

    @property
    def trace_scope(self) -> str:
        """What a step's ids hash besides its key and number (otel/ids.py): the job id,
        and the attempt where there is one."""
        return f"{self.job_id}/attempt/{self.attempt}" if self.attempt else self.job_id

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
        if self.is_reference and self.reference_host.startswith(KV_SCHEME):
            publish_reference(self.reference_host)
        digest = int(hashlib.sha256(self.job_id.encode()).hexdigest()[:8], 16)
        return self.reference_host, COORDINATOR_BASE_PORT + 2 * (digest % COORDINATOR_PORT_SPAN)


# -- rank 0's address through Horovod's rendezvous key-value store ------------------------------


def kv_reference(env: Mapping[str, str], job_id: str) -> Optional[str]:
    """The lookup address of rank 0's host in horovodrun's rendezvous store, if there is one."""
    addr = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not port or not port.isdigit():
        return None
    host = f"[{addr}]" if ":" in addr else addr
    return f"{KV_SCHEME}{host}:{port}/{KV_SCOPE}/rank0-{job_id}"


def _kv_parts(reference: str) -> Tuple[str, int, str]:
    rest = reference[len(KV_SCHEME) :]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port), "/" + path


def _kv_request(reference: str, method: str) -> Tuple[int, bytes]:
    """One request to the store; a PUT sends this host's address, the one that reaches the
    launcher (so the other hosts reach it too): (status, body)."""
    import http.client

    host, port, path = _kv_parts(reference)
    conn = http.client.HTTPConnection(host, port, timeout=KV_TIMEOUT_S)
    try:
        conn.connect()
        body = b""
        if method == "PUT":
            local = conn.sock.getsockname()[0]
            body = json.dumps({"host": local, "hostname": socket.gethostname()}).encode()
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body))})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


_published: Dict[str, threading.Thread] = {}
_resolved: Dict[str, str] = {}
_kv_lock = threading.Lock()


def publish_reference(reference: str, attempts: int = 30) -> threading.Thread:
    """Rank 0: PUT this host's address (the one that reaches the launcher) into the store, on a
    daemon thread, once per process."""

    def run() -> None:
        for attempt in range(attempts):
            try:
                if _kv_request(reference, "PUT")[0] == 200:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(min(0.1 * 2**attempt, 2.0))
        log_once(
            "topology:kv_publish",
            "tf_otel: cannot publish rank 0's address in horovodrun's rendezvous store (%s); "
            "set TF_OTEL_COORDINATOR=HOST:PORT of rank 0 on every rank",
            reference,
        )

    with _kv_lock:
        thread = _published.get(reference)
        if thread is None:
            thread = threading.Thread(target=run, name="tf_otel-publish-rank0", daemon=True)
            _published[reference] = thread
            thread.start()
    return thread


def resolve_address(address: Tuple[str, int]) -> Tuple[str, int]:
    """The address to connect to. A rendezvous lookup (Horovod multi-host) is done here: it
    blocks up to a few seconds, so call it on background threads only. Raises OSError while rank
    0 has not published its address yet (callers retry)."""
    host, port = address
    if not host.startswith(KV_SCHEME):
        return address
    with _kv_lock:
        known = _resolved.get(host)
    if known is None:
        try:
            status, body = _kv_request(host, "GET")
        except (OSError, ValueError) as exc:
            raise OSError(f"rendezvous store unreachable ({exc})") from exc
        if status != 200:
            raise OSError("rank 0 has not published its address yet")
        try:
            known = str(json.loads(body)["host"])
        except (ValueError, KeyError, TypeError) as exc:
            raise OSError(f"bad rank 0 address in the rendezvous store ({exc})") from exc
        with _kv_lock:
            _resolved[host] = known
    return known, port


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
STEPPING_TASKS = ("chief", "master", "worker")  # the others (ps, evaluator) run no steps
TF_SERVER = "tf_server"  # launcher of an identity learned from the program's own Server


def normalise_cluster(cluster: Mapping[str, Any]) -> Dict[str, Any]:
    """A cluster spec as TF_CONFIG writes it: job name -> addresses in task order; a sparse job
    (task indices other than 0..n-1, as ``ClusterSpec`` allows) stays ``{"index": address}``.
    The same cluster gives the same value whether it came from TF_CONFIG, a ``ClusterSpec`` or
    a ``ClusterDef``. Raises ValueError / TypeError when it is not a cluster spec."""
    out: Dict[str, Any] = {}
    for job, tasks in cluster.items():
        if isinstance(tasks, Mapping):
            indexed = {int(index): str(address) for index, address in tasks.items()}
            if sorted(indexed) == list(range(len(indexed))):
                out[str(job)] = [indexed[i] for i in range(len(indexed))]
            else:
                out[str(job)] = {str(i): indexed[i] for i in sorted(indexed)}
        elif isinstance(tasks, (list, tuple)):
            out[str(job)] = [str(address) for address in tasks]
        else:
            raise TypeError(f"job {job!r}: tasks are a {type(tasks).__name__}")
    return out


def _cluster_tasks(cluster: Mapping[str, Any]) -> List[Tuple[str, int, str]]:
    """(job, task index, address) in rank order: chief, master, worker, ps, evaluator, then other
    jobs by name; tasks by index."""
    tasks: List[Tuple[str, int, str]] = []
    for kind in sorted(
        cluster, key=lambda k: (_TASK_ORDER.index(k) if k in _TASK_ORDER else 99, k)
    ):
        members = cluster[kind]
        pairs = (
            sorted((int(i), a) for i, a in members.items())
            if isinstance(members, Mapping)
            else list(enumerate(members))
        )
        for index, address in pairs:
            tasks.append((kind, index, address))
    return tasks


def rank0_task(cluster: Mapping[str, Any]) -> Tuple[str, int]:
    """The task that is rank 0 of a cluster spec (chief, else master, else worker 0...)."""
    kind, index, _ = _cluster_tasks(normalise_cluster(cluster))[0]
    return kind, index


def cluster_topology(
    cluster: Mapping[str, Any],
    task_type: str,
    task_index: int,
    host: str,
    launcher: str = "tf_config",
) -> Topology:
    """Task (``task_type``, ``task_index``) of a TensorFlow cluster spec: one rank per task in
    ``_cluster_tasks`` order (so the chief, else worker 0, is rank 0 and hosts the
    coordinator), world size = every task, parameter servers and evaluators are members that
    run no steps (``stepping_ranks``), and the job id hashes the sorted cluster spec, so every
    task computes the same id alone. TF_CONFIG and the program's own Server both come here: the
    same cluster gives the same topology (only ``launcher`` says where it was read)."""
    cluster = normalise_cluster(cluster)
    tasks = _cluster_tasks(cluster)
    if not tasks:
        raise ValueError("the cluster has no tasks")
    me = (task_type, int(task_index))
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
        launcher=launcher,
        reference_host=hosts[0] or "127.0.0.1",
        task=f"{me[0]}:{me[1]}",
        stepping_ranks=sum(1 for t in tasks if t[0] in STEPPING_TASKS),
    )


def _from_tf_config(config: Dict, host: str) -> Topology:
    return cluster_topology(
        config["cluster"], config["task"]["type"], int(config["task"]["index"]), host
    )


# -- the cluster the program gave its own tf.distribute.Server (instrument/cluster.py) ---------


@dataclass(frozen=True)
class ProgramCluster:
    """This process's task in the cluster its program built (normalised cluster spec)."""

    cluster: Dict[str, Any]
    task_type: str
    task_index: int

    def topology(self, host: str) -> Topology:
        return cluster_topology(self.cluster, self.task_type, self.task_index, host, TF_SERVER)


_program: Optional[ProgramCluster] = None


def program_cluster(
    cluster: Mapping[str, Any], task_type: str, task_index: int
) -> Optional[ProgramCluster]:
    """The program's cluster as an identity, or None when it cannot be one: a cluster of one
    task (``Server.create_local_server()``: nothing to join) or one that does not hold the
    task (said once)."""
    try:
        normal = normalise_cluster(cluster)
        tasks = _cluster_tasks(normal)
        index = int(task_index)
    except (ValueError, TypeError, AttributeError) as exc:
        log_once("topology:program_cluster", "tf_otel: ignoring the Server's cluster (%s)", exc)
        return None
    if len(tasks) <= 1:
        return None
    if not any((t[0], t[1]) == (task_type, index) for t in tasks):
        log_once(
            "topology:program_task",
            "tf_otel: the Server's task %s:%d is not in its cluster %s; ignored",
            task_type,
            index,
            sorted(normal),
        )
        return None
    return ProgramCluster(normal, str(task_type), index)


def learned_cluster() -> Optional[ProgramCluster]:
    """The program's cluster detect() uses when the environment names no launcher."""
    return _program


def learn_cluster(found: Optional[ProgramCluster]) -> None:
    """Set (None: forget) the program's cluster; runtime/lifecycle.py decides when (before the
    first step only)."""
    global _program
    _program = found


_attempt: Optional[str] = None


def learned_attempt() -> Optional[str]:
    """The attempt rank 0 handed out (instrument/attempt.py), or None."""
    return _attempt


def learn_attempt(attempt: Optional[str]) -> None:
    """Set (None: forget) the attempt every rank of this launch learned from rank 0;
    runtime/lifecycle.py decides when (before the first step only)."""
    global _attempt
    _attempt = attempt or None


def detect(
    env: Optional[Mapping[str, str]] = None,
    job_id: Optional[str] = None,
    attempt: Optional[str] = None,
) -> Topology:
    """Read the topology from ``env`` (default: os.environ; for os.environ, the cluster the
    program gave its ``tf.distribute.Server`` comes after the environment, see learn_cluster).
    ``job_id``, ``attempt``: TF_OTEL_JOB_ID, TF_OTEL_ATTEMPT (the settings)."""
    own = env is None or env is os.environ  # this process: what its program said counts too
    env = os.environ if env is None else env
    host = socket.gethostname()
    topo = _detect(env, host, _program if own else None)
    if job_id:
        topo = replace(topo, job_id=job_id)
    learned = _attempt if own else None
    found, previous = launch_attempt(env, topo, attempt, job_given=bool(job_id), learned=learned)
    return replace(topo, attempt=found, previous_attempt=previous)


# a launcher's count of the job's restarts (0 on its first run)
RESTART_COUNTS = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
# what differs between two launches of one program (the job id's facts but SLURM's)
LAUNCH_FACTS = (
    ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"),
    ("OMPI_MCA_ess_base_jobid",),
    ("PMIX_NAMESPACE",),
    ("OMPI_MCA_orte_hnp_uri",),
    ("PMI_KVSNAME",),
    ("PMI_PORT",),
)
# a rank alone with nothing to tell its launches apart draws one, once per process (detect()
# is asked again later in a process: the same attempt every time)
_PROCESS_ATTEMPT = uuid.uuid4().hex[:12]


def launch_attempt(
    env: Mapping[str, str],
    topo: Topology,
    explicit: Optional[str] = None,
    job_given: bool = False,
    learned: Optional[str] = None,
) -> Tuple[str, Optional[str]]:
    """This launch's attempt and the one before it (None: unknown), every rank alike (module
    docstring). ``explicit``: TF_OTEL_ATTEMPT; ``job_given``: the job id is TF_OTEL_JOB_ID's;
    ``learned``: the one rank 0 handed out (``learn_attempt``)."""
    if explicit:
        return explicit, _previous(explicit)
    count = _int(env, *RESTART_COUNTS)
    if count is None and env.get("SLURM_JOB_ID"):
        count = 0  # SLURM sets the count from the first requeue on
    launch = next(
        (_hash("attempt", *(env[n] for n in names)) for names in LAUNCH_FACTS if _all(env, names)),
        None,
    )
    # a launch id tells launches apart where the job id is not made of it: mpirun / horovodrun
    # / PMIx inside a SLURM job step (a SLURM job's id comes first; srun's own PMI namespace is
    # its step's). Never where the job id is TF_OTEL_JOB_ID's: an id given is the job's whole
    # identity, the same every launch (so are the steps its sampling and detail pick by trace
    # id, known before it runs) unless TF_OTEL_ATTEMPT or a restart count tells otherwise
    in_slurm = topo.launcher in _LAUNCHERS and _all(env, ("SLURM_JOB_ID", "SLURM_STEP_ID"))
    if job_given or not in_slurm or topo.launcher == "slurm":
        launch = None
    if count is not None:
        if launch is None:
            return str(count), _previous(str(count))
        return f"{count}.{launch[:8]}", None
    if job_given or topo.launcher not in ("tf_config", TF_SERVER):
        return "", None
    if topo.world_size == 1:
        return _PROCESS_ATTEMPT, None  # a rank alone, identified by its cluster spec alone
    if learned:
        return learned, None  # every rank of the cluster learned the same from rank 0
    return "", None


_LAUNCHERS = ("horovod", "openmpi", "pmi", "pmix", "slurm")


def _all(env: Mapping[str, str], names: Tuple[str, ...]) -> bool:
    return all(env.get(name) for name in names)


def _previous(attempt: str) -> Optional[str]:
    """n - 1 for a numeric attempt n > 0; None otherwise."""
    return str(int(attempt) - 1) if attempt.isdigit() and int(attempt) > 0 else None


def _detect(
    env: Mapping[str, str], host: str, program: Optional[ProgramCluster] = None
) -> Topology:
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
        try:
            return _from_tf_config(config, host)
        except (ValueError, TypeError, AttributeError) as exc:
            log_once("topology:TF_CONFIG.cluster", "tf_otel: ignoring TF_CONFIG (%s)", exc)
    if program is not None:
        return program.topology(host)
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
    elif launcher == "horovod" and kv_reference(env, job_id):
        # exact: rank 0 says where it is (horovodrun's -H order is not in the ranks' env)
        reference_host = kv_reference(env, job_id)
    elif launcher == "openmpi" and env.get("OMPI_MCA_orte_node_regex"):
        nodes = ompi_nodes(env["OMPI_MCA_orte_node_regex"], _int(env, "OMPI_MCA_orte_num_nodes"))
        reference_host = nodes[0] if nodes else None
    elif env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"):
        nodes = expand_slurm_nodelist(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        reference_host = nodes[0] if nodes else None
    return job_id, reference_host


def ompi_nodes(regex: str, num_nodes: Optional[int] = None) -> List[str]:
    """The nodes holding ranks, from Open MPI's ``OMPI_MCA_orte_node_regex`` such as
    ``login,node[2:1-3]@0(4)``: mpirun's own node first, then the daemons' nodes; when the list is
    longer than ``num_nodes`` mpirun's node holds no rank and is dropped."""
    names, _, _ = regex.partition("@")
    nodes: List[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[(\d+):([^\]]*)\])?([^,]*)", names):
        prefix, width, ranges, suffix = match.groups()
        if ranges is None:
            nodes.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return []
            for n in range(int(lo), int(hi or lo) + 1):
                nodes.append(prefix + str(n).zfill(int(width)) + suffix)
    if num_nodes is not None and 0 < num_nodes < len(nodes):
        nodes = nodes[len(nodes) - num_nodes :]
    return nodes
