"""One scheduler for every training process's trajectories (paper §3.2: one balancer over all inference engines).

In an RL run with several training processes each process is handed its own groups. With vLLM servers
(``trl vllm-serve`` / ``vllm serve``, every process reaching every server) the main process can instead roll
out the whole step: each process sends it its problems, its one ``Scheduler`` dispatches all of them over
every server's data-parallel ranks (KV reserved per rank, a trajectory kept on the rank that holds its
prefix), and each process gets back exactly its own trajectories, in its order, graded. So a busy GPU's
queue is taken by an idle one whichever process the trajectories came from. Tool calls and grading then
run where the main process runs (its sandbox client: the configured service, or its local pool).

Colocated vLLM cannot be shared this way (each process's ``vllm.LLM`` lives in that process): there every
process keeps rolling out its own groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class CentralDispatch:
    """How the training processes meet for a step's rollouts.

    index, count: this process and how many there are (process 0 runs the scheduler).
    gather: ``gather(obj) -> [obj of process 0, obj of process 1, ...]``, called by every process.
    broadcast: ``broadcast(obj) -> process 0's obj``, called by every process.
    """
    index: int
    count: int
    gather: Callable[[Any], list]
    broadcast: Callable[[Any], Any]


def run_centrally(problems: list[dict], rollout: Callable[[list[dict]], list], central: CentralDispatch) -> list:
    """Every process calls this with its own ``problems``; process 0 runs ``rollout`` on all of them at once and
    each process gets the results for its own problems (``rollout`` returns one result per problem, in order).

    Raises:
        RuntimeError: on processes other than 0, when the rollouts failed on process 0 (which re-raises its own
            error), so that no process waits forever for a step that will not come.
    """
    mine = central.gather(problems)
    if central.index != 0:
        status, payload = central.broadcast(None)
        if status != "ok":
            raise RuntimeError(f"the step's rollouts failed on the main process: {payload}")
        return payload[central.index]
    try:
        flat = rollout([p for ps in mine for p in ps])
    except BaseException as e:
        central.broadcast(("error", f"{type(e).__name__}: {e}"))
        raise
    shares, start = [], 0
    for ps in mine:
        shares.append(flat[start:start + len(ps)])
        start += len(ps)
    central.broadcast(("ok", shares))
    return shares[0]


def for_trainer(trainer) -> CentralDispatch | None:
    """The dispatch of a TRL trainer whose rollouts go to vLLM servers from several processes (accelerate's
    ``gather_object`` / ``broadcast_object_list``); None when there is one process or no server mode."""
    acc = getattr(trainer, "accelerator", None)
    if not getattr(trainer, "use_vllm", False) or trainer.args.vllm_mode != "server" or acc is None \
            or acc.num_processes < 2:
        return None
    from accelerate.utils import broadcast_object_list, gather_object

    return CentralDispatch(acc.process_index, acc.num_processes, gather=lambda obj: gather_object([obj]),
                           broadcast=lambda obj: broadcast_object_list([obj], from_process=0)[0])
