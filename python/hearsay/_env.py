"""Rank, world and rendezvous from a launcher's environment, so that `torchrun`, `srun`,
`mpirun` and `hearsay launch` start a script unchanged (what `hearsay run` does in C for
SLURM and Open MPI).

Only when the caller gave none of rank, world, rendezvous and bootstrap; an option the caller
gave always wins over one derived here. In order:

- Open MPI: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (first: an mpirun inside a Slurm
  allocation inherits the batch step's SLURM_PROCID, the same in every task);
- torchrun (and `hearsay launch`): RANK / WORLD_SIZE with MASTER_ADDR / MASTER_PORT. Rank 0
  listens at MASTER_ADDR:MASTER_PORT and the others bootstrap from there. torchrun's static
  rendezvous keeps its own store on MASTER_PORT (it says so with
  TORCHELASTIC_USE_AGENT_STORE=True): then the port above it is used. HEARSAY_MASTER_PORT
  names another port for every rank;
- SLURM: SLURM_PROCID / SLURM_NTASKS.

Without MASTER_ADDR, or when $HEARSAY_RENDEZVOUS is set (`hearsay launch -- COMMAND` sets it,
so that the nodes join in rank order and peer ids equal ranks), the peers meet through a
rendezvous file on a shared directory: $HEARSAY_RENDEZVOUS, or hearsay-JOB.addr in the working
directory, JOB being the launcher's job id (the same in every task, new for the next job),
which also names the run. The secret
comes from $HEARSAY_SECRET_FILE when no security option was given, the metrics file from
$HEARSAY_METRICS (`hearsay launch -- COMMAND` sets both)."""
import ipaddress
import os
import re
from typing import Dict, Mapping, Optional, Tuple

_PLACEMENT = ("rank", "world", "rendezvous", "bootstrap")
_SECURITY = ("secret-file", "insecure", "ca", "cert", "key")


def _get(env: Mapping[str, str], *names: str) -> Optional[str]:
    for n in names:
        v = env.get(n)
        if v:
            return v
    return None


def _int(what: str, v: str, lo: int) -> int:
    try:
        i = int(v)
    except ValueError:
        i = lo - 1
    if i < lo:
        raise ValueError(f"hearsay: {what} is '{v}', not an integer >= {lo}")
    return i


def _job_name(raw: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:80] or "job"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def launcher(env: Mapping[str, str]) -> Optional[Tuple[str, int, int, str]]:
    """(launcher, rank, world, job id) of the environment, or None outside a launcher."""
    if _get(env, "OMPI_COMM_WORLD_RANK") and _get(env, "OMPI_COMM_WORLD_SIZE"):
        job = _get(env, "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE")
        return ("mpirun", _int("OMPI_COMM_WORLD_RANK", env["OMPI_COMM_WORLD_RANK"], 0),
                _int("OMPI_COMM_WORLD_SIZE", env["OMPI_COMM_WORLD_SIZE"], 1), job or "job")
    if _get(env, "RANK") and _get(env, "WORLD_SIZE"):
        job = _get(env, "HEARSAY_RUN_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT")
        return ("torchrun", _int("RANK", env["RANK"], 0),
                _int("WORLD_SIZE", env["WORLD_SIZE"], 1), job or "job")
    if _get(env, "SLURM_PROCID") and _get(env, "SLURM_NTASKS"):
        job = _get(env, "SLURM_JOB_ID", "SLURM_JOBID")
        step = _get(env, "SLURM_STEP_ID", "SLURM_STEPID")
        if job and step:
            job = f"{job}.{step}"
        return ("srun", _int("SLURM_PROCID", env["SLURM_PROCID"], 0),
                _int("SLURM_NTASKS", env["SLURM_NTASKS"], 1), job or "job")
    return None


def options(given: Mapping[str, object], env: Mapping[str, str]) -> Dict[str, str]:
    """The options the environment adds to `given` (names with dashes); {} when the caller
    placed the node itself or no launcher is there."""
    if any(given.get(k) is not None for k in _PLACEMENT):
        return {}
    found = launcher(env)
    if found is None:
        return {}
    _, rank, world, job = found
    if rank >= world:
        raise ValueError(f"hearsay: the launcher's rank {rank} is not below its world {world}")
    out = {"rank": str(rank), "world": str(world)}
    if given.get("run-id") is None:
        out["run-id"] = "hearsay-" + _job_name(job)
    listen = _get(env, "HEARSAY_LISTEN")
    addr = _get(env, "MASTER_ADDR")
    port_s = _get(env, "HEARSAY_MASTER_PORT", "MASTER_PORT")
    if addr and port_s and not _get(env, "HEARSAY_RENDEZVOUS"):
        port = _int("MASTER_PORT", port_s, 1)
        if not _get(env, "HEARSAY_MASTER_PORT") and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            port += 1  # torchrun's own store listens on MASTER_PORT
        host = f"[{addr}]" if ":" in addr else addr
        if rank == 0:
            # The bootstrap every other rank dials; a host name is reached on every interface.
            listen = listen or f"{host if _is_ip(addr) else '0.0.0.0'}:{port}"
        else:
            out["bootstrap"] = f"{host}:{port}"
            # On one machine (a loopback master) the others stay on loopback too.
            listen = listen or (f"{host}:0" if _is_loopback(addr) else "0.0.0.0:0")
    else:
        out["rendezvous"] = _get(env, "HEARSAY_RENDEZVOUS") or f"hearsay-{_job_name(job)}.addr"
        listen = listen or "0.0.0.0:0"
    if given.get("listen") is None:
        out["listen"] = listen
    metrics = _get(env, "HEARSAY_METRICS")  # hearsay launch's run directory
    if metrics and given.get("metrics") is None:
        out["metrics"] = metrics
    if not any(given.get(k) not in (None, False, 0, "0") for k in _SECURITY):
        secret = _get(env, "HEARSAY_SECRET_FILE")
        if secret:
            out["secret-file"] = secret
    return out
