import time

from rstar2 import grading
from rstar2.grading_pool import grade_many, score_many


def test_grade_many_matches_grade_and_survives_hanging_inputs():
    pairs = [("42", "42"), ("\\frac{1}{2}", "0.5"), ("41", "42"), (None, "7"),
             ("2003^{2002^{2001}}", "5"), ("9^{9^{9}}", "3"), ("12", "12")]
    t0 = time.time()
    res = grade_many(pairs, timeout_s=2.0)
    assert time.time() - t0 < 2 * 2.0 + 10  # the two hard items overlap across workers; none waits forever
    assert [r["score"] for r in res] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    for (p, g), r in zip(pairs[:4], res[:4]):
        assert r["status"] == "ok" and r["score"] == grading.grade(p, g)
    assert all(r["status"] in ("ok", "timeout") for r in res[4:6])
    assert all(r["duration_s"] <= 2.0 + 1.0 for r in res)


def test_bad_gold_is_an_error_not_a_crash():
    res = grade_many([("1", "")], timeout_s=5.0)
    assert res[0]["status"] == "error" and res[0]["score"] == 0.0 and "ValueError" in res[0]["error"]


def test_score_many_returns_score_trajectory_dicts():
    items = [("so <answer>\\boxed{7}</answer>", "7"), ("<answer>\\boxed{8}</answer>", "7")]
    res = score_many(items, timeout_s=5.0)
    assert [r["reward"] for r in res] == [1.0, 0.0]
    assert res[0]["pred"] == grading.score_trajectory(*items[0])["pred"] and res[0]["status"] == "ok"


def test_score_many_passes_the_answer_type():
    """A third item field selects the benchmark's grader: a letter counts under "choice" only."""
    final = r"The right option is \boxed{C}."
    res = score_many([(final, "C", "choice"), (final, "C")], timeout_s=5.0)
    assert res[0]["reward"] == 1.0 and res[0]["status"] == "ok"
    assert res[1]["status"] == "ok"
    from rstar2.grading import score_trajectory
    assert res[1]["reward"] == score_trajectory(final, "C")["reward"]


def test_worker_start_up_does_not_count_against_the_item_deadline(tmp_path):
    """Forkserver workers re-import the caller's script: a slow top level (here 3 s, as importing torch is) must
    not turn correct answers into timeouts under a 1 s grading deadline."""
    import subprocess
    import sys

    script = tmp_path / "slow_top_level.py"
    script.write_text(
        "import time\n"
        "time.sleep(3)\n"
        "from rstar2 import grading_pool\n"
        "if __name__ == '__main__':\n"
        "    print([r['status'] for r in grading_pool.score_many([('The result is \\\\boxed{804}.', '804')] * 4,"
        " timeout_s=1.0)])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['ok', 'ok', 'ok', 'ok']"
