"""The pieces of fault handling one by one: which failures count as the infrastructure's, the sandbox
client's retries on a real pool whose zygote is really killed, the RL step's exclusion and counts, the stop line,
the grading pool's timeouts and restarts, the non-finite guard, and the report's fault table. The whole stages under
injected faults: tests/test_rl_faults.py; the HTTP service: tests/test_sandbox_service_faults.py."""

from __future__ import annotations

import json
import random
import threading

import pytest

from rstar2 import faults, grading_pool
from rstar2.rl import fault_accounting as fa
from rstar2.rl.finite_guard import FiniteGuard
from rstar2.rl.selection import select
from rstar2.rl.step_metrics import step_metrics
from rstar2.rollout import Trajectory
from rstar2.sandbox import INFRA_STATUS, ExecResult, Pool, SandboxClient, SandboxLimits, is_infra_failure


def test_only_failures_without_an_exit_are_the_infrastructures():
    assert is_infra_failure(ExecResult("error", None, "", "sandbox worker failed (zygote exited); the call was lost", 0))
    assert is_infra_failure(ExecResult(INFRA_STATUS, None, "", "not served", 0))
    for status, code in [("error", 1), ("timeout", -9), ("memory", 1), ("output-limit", -25), ("ok", 0)]:
        assert not is_infra_failure(ExecResult(status, code, "", "", 0)), status


def test_client_retries_a_killed_zygotes_calls_and_never_the_codes_own_errors(monkeypatch):
    monkeypatch.setenv(faults.ENV, json.dumps({"sandbox_kill_calls": [1], "sandbox_kill_delay_s": 0.1}))
    with Pool(SandboxLimits(timeout_s=3), workers=1, lean_workers=1, full_workers=0, slots=8) as pool:
        client = SandboxClient(pool=pool, retries=2, retry_backoff_s=0.1)
        try:
            lost = client.run_many([("import time; time.sleep(0.5); print(7)", "")])[0]
            assert (lost.status, lost.stdout, lost.attempts) == ("ok", "7\n", 2) and pool.restarts == 1
            err = client.run_many([("1/0", "")])[0]
            assert (err.status, err.attempts) == ("error", 1) and "ZeroDivisionError" in err.stderr
            monkeypatch.setenv(faults.ENV, json.dumps({"sandbox_kill_from": 1, "sandbox_kill_delay_s": 0.05}))
            gone = client.run_many([("import time; time.sleep(0.5); print(8)", "")])[0]
            assert (gone.status, gone.attempts) == (INFRA_STATUS, 3), gone
            assert "not served after 3 attempts" in gone.stderr and "local pool (" in gone.stderr
            assert client.infra_failures == 1 + 3
        finally:
            client.close()


def _traj(i: int, reward: float, statuses: list[str], attempts: int = 1) -> Trajectory:
    calls = [{"code": "print(1)", "status": s, "output": "Tool call failure\nreason: infra-error\nlost"
              if s == INFRA_STATUS else "1", "duration_s": 0.0, **({"attempts": attempts} if attempts > 1 else {})}
             for s in statuses]
    t = Trajectory(problem_id="p", question="q", gold="1", prompt_ids=[1, 2], response_ids=[3, 4, 5],
                   response_mask=[1, 0, 1], turns=[{"text": "<answer>1</answer>", "tool_calls": calls}],
                   finish_reason=INFRA_STATUS if INFRA_STATUS in statuses else "answer", reward=reward)
    t.grading_status = None if t.unserved else ("timeout" if i == 3 else "ok")
    return t


def test_unserved_trajectories_leave_selection_and_count_apart_from_the_models_errors():
    """One group of 2G = 6: one trajectory unserved, one with the model's own error, one retried and served."""
    group = [_traj(0, 1.0, ["ok"]), _traj(1, 1.0, ["error"]), _traj(2, 0.0, [INFRA_STATUS], attempts=3),
             _traj(3, 0.0, ["ok"]), _traj(4, 0.0, ["ok"], attempts=2), _traj(5, 1.0, ["ok", "ok"])]
    served, excluded, f = fa.split_step([group], grading_restarts=1)
    assert [len(served[0]), len(excluded[0])] == [5, 1] and excluded[0][0] is group[2]
    assert (f.tool_calls, f.unserved, f.retried, f.excluded, f.grading_timeouts, f.grading_restarts) == (7, 1, 1, 1, 1, 1)
    assert f.share == pytest.approx(1 / 7) and f.last_error == "lost"
    res = select(served, [[(0.0, 0.0)] * 5], 3, "grpo_roc", "topk", 1e-3, random.Random(0))
    assert all(res[0].trajs[i] is not group[2] for i in res[0].kept)
    m = {**step_metrics(res), **fa.metrics(f)}
    assert m["tool_error_ratio"] == pytest.approx(1 / 6)   # the model's one error of its 6 served calls
    assert (m["tool_infra_failure_ratio"], m["trajectories_excluded"], m["tool_calls_retried"]) == (
        pytest.approx(1 / 7), 1, 1)
    rows = fa.excluded_records(excluded[0])
    assert rows[0]["excluded"] == INFRA_STATUS and rows[0]["kept"] is False and "grading_status" not in rows[0]

    policy = fa.FaultPolicy(max_infra_share=0.2, max_nonfinite_steps=3, grading_stall_s=120)
    assert fa.over_share(f, policy, 7, "http://sbx:8088", "results/rl/stage1") is None   # 14% <= 20%
    worse = f + fa.StepFaults(tool_calls=3, unserved=3, last_error="connection refused")
    line = fa.over_share(worse, policy, 7, "http://sbx:8088", "results/rl/stage1")
    assert "\n" not in line and line.startswith("results/rl/stage1: step 7: the sandbox (http://sbx:8088)")
    assert "40% of the step's tool calls (4 of 10" in line and "max_infra_share 20%" in line
    assert "connection refused" in line
    fully = step_metrics(select([[]], [[]], 3, "grpo_roc", "topk", 1e-3, random.Random(0)))
    assert (fully["groups_dropped"], fully["groups_all_correct"], fully["groups_all_wrong"]) == (1, 0, 0)


def test_finite_guard_skips_non_finite_steps_and_stops_after_a_streak():
    g = FiniteGuard(2)
    assert g.check(0.5, 1.0, update=True) and g.row() == {"nonfinite_skipped": False, "skipped_steps": 0}
    assert not g.check(float("nan"), 1.0, update=True) and g.stop_reason(2) is None
    assert g.check(0.0, 0.0, update=False) and g.streak == 1   # a step without an update neither breaks nor extends
    assert not g.check(0.1, float("inf"), update=True) and g.row() == {"nonfinite_skipped": True, "skipped_steps": 2}
    assert "step 4: 2 optimizer steps in a row" in g.stop_reason(4)
    again = FiniteGuard(2)
    again.load_state_dict(g.state_dict())
    assert (again.streak, again.skipped) == (2, 2)
    assert again.check(0.2, 0.3, update=True) and again.streak == 0 and again.skipped == 2


def test_grading_pool_times_out_hung_items_restarts_a_stalled_pool_and_stops_when_it_cannot(monkeypatch):
    item = (r"so \boxed{4}", "4", "integer")
    monkeypatch.setenv(faults.ENV, json.dumps({"grading_hang_items": [2]}))
    p = grading_pool.GradingPool(workers=2, stall_s=2)
    try:
        assert [s for s, _, _ in p.map("score", [item] * 3, timeout_s=1.0)] == ["ok", "timeout", "ok"]
        assert (p.timeouts, p.restarts) == (1, 0)
    finally:
        p.close()
    monkeypatch.setenv(faults.ENV, json.dumps({"grading_stall": "once"}))
    p = grading_pool.GradingPool(workers=2, stall_s=2)
    restart, readers = p.restart, []

    def restart_recording_readers():
        # a drive thread of the stalled pass still reading its worker's connection when the restart closes it
        # would read the next worker's pipe (its descriptor is reused): CI saw a retried item fail that way
        readers.extend(t.name for t in threading.enumerate() if t.name.startswith("grading-drive-"))
        restart()

    p.restart = restart_recording_readers
    try:
        assert [v["reward"] for s, v, _ in p.map("score", [item] * 3, timeout_s=1.0)] == [1.0] * 3 and p.restarts == 1
        assert readers == []
    finally:
        p.close()
    monkeypatch.setenv(faults.ENV, json.dumps({"grading_stall": "always"}))
    p = grading_pool.GradingPool(workers=1, stall_s=1)
    try:
        with pytest.raises(grading_pool.GradingPoolStalled, match="again after a restart") as e:
            p.map("score", [item], timeout_s=1.0)
        assert isinstance(e.value, faults.StageFault)
    finally:
        p.close()


def test_report_shows_the_fault_table_only_where_a_stage_had_faults():
    from rstar2.report.faults import fault_rows, faults as fault_blocks

    clean = [{"step": 1, "tool_infra_failure_ratio": 0.0, "tool_calls_retried": 0, "skipped_steps": 0}]
    hurt = [{"step": 1, "tool_infra_failure_ratio": 0.0, "tool_calls_retried": 4, "skipped_steps": 0},
            {"step": 2, "tool_infra_failure_ratio": 0.25, "tool_calls_unserved": 1, "trajectories_excluded": 1,
             "grading_timeouts": 1, "reward_errors": 2, "skipped_steps": 1, "nonfinite_skipped": True}]
    assert fault_blocks({"stage1": clean}) == [] and fault_blocks({"stage1": [{"step": 1}]}) == []
    assert fault_rows({"stage1": clean, "stage2": hurt}) == [["stage2", "4", "1", "25% (step 2)", "1", "1", "0", "2",
                                                              "1"]]
    # a reward failing on some answers is enough for a row
    assert fault_rows({"stage3": [{"step": 1, "reward_errors": 3}]}) == [["stage3", "0", "0", "0%", "0", "0", "0", "3",
                                                                           "0"]]
