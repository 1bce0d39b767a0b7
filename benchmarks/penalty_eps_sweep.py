"""The ``rl.penalty_eps`` sweep of GRPO-RoC (issue 23): the ablation's grpo_roc runs again with other values.

GRPO-RoC keeps a positive trajectory with probability proportional to 1 / (p_total + penalty_eps). With eps small a
positive with clean tool calls (p_total 0) weighs 1/eps against 1/(0.5 + eps) for one whose calls half failed:
1000 : 2 at 1e-3 (clean ones are nearly always kept, as with the released code's top-k), 10 : 1.7 at 0.1 and
1 : 0.67 at 1 (nearly uniform, like GRPO's choice among positives).

Runs each (eps, seed) as the workflow's ablation run ``grpo_roc-seedS`` would (same config files, same SFT model and
data, same seed, so the same prompts per step), with only ``rl.penalty_eps`` changed, each in a fresh process, into
``OUT/eps<eps>-seed<seed>``; then prints ``ablation_summary`` over them (and over the workflow's own
``results/ablation/grpo_roc-seedS`` runs as eps 0.001 when ``--with-workflow-runs``).

    python benchmarks/penalty_eps_sweep.py WORKFLOW_DIR --out /tmp/sweep --eps 0.1 1 --seeds 0 1 2 \\
        [--configfile configs/cpu-learning.yaml configs/cpu-ablation.yaml] [--with-workflow-runs]

WORKFLOW_DIR is a folder where the ablation config has run (its results/sft/model and results/rl_data/train.jsonl).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHILD = "import json, sys; from rstar2.stages import rl; rl.run(json.loads(sys.argv[1]), *sys.argv[2:5])"


def params_for(configfiles: list[str], eps: float, seed: int) -> dict:
    """The ablation run grpo_roc-seed<seed>'s RL params with ``rl.penalty_eps`` = ``eps``."""
    from rstar2.params import to_dict
    from rstar2.stages import params as P

    cfg = P.validated_config(REPO, tuple(configfiles), ({"rl": {"penalty_eps": eps}},))
    return to_dict(P.rl(cfg, "stage1", ("grpo_roc", seed)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workflow_dir", help="where the ablation config ran (results/sft/model, results/rl_data)")
    ap.add_argument("--out", required=True, help="a folder for the sweep's runs")
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--configfile", nargs="+", default=["configs/cpu-learning.yaml", "configs/cpu-ablation.yaml"])
    ap.add_argument("--with-workflow-runs", action="store_true",
                    help="also summarise WORKFLOW_DIR/results/ablation/grpo_roc-seedS as the config's own eps")
    a = ap.parse_args(argv)
    wd, out = Path(a.workflow_dir), Path(a.out)
    model, data = wd / "results/sft/model", wd / "results/rl_data/train.jsonl"
    runs = []
    for eps in a.eps:
        for seed in a.seeds:
            folder = out / f"eps{eps:g}-seed{seed}"
            runs.append(f"grpo_roc eps {eps:g}={folder}")
            if (folder / "manifest.json").exists():
                print(f"[sweep] {folder} is done; kept", flush=True)
                continue
            t0 = time.time()
            folder.parent.mkdir(parents=True, exist_ok=True)
            with open(out / f"eps{eps:g}-seed{seed}.log", "w") as log:
                r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(params_for(a.configfile, eps, seed)),
                                    str(model), str(data), str(folder)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            if r.returncode:
                raise SystemExit(f"[sweep] eps {eps:g} seed {seed} failed: see {log.name}")
            print(f"[sweep] eps {eps:g} seed {seed}: {time.time() - t0:.0f} s", flush=True)
    if a.with_workflow_runs:
        from rstar2.stages import params as P

        own = P.validated_config(REPO, tuple(a.configfile))["rl"]["penalty_eps"]
        runs += [f"grpo_roc eps {own:g}={wd / 'results/ablation' / f'grpo_roc-seed{s}'}" for s in a.seeds]
    sys.path.insert(0, str(REPO / "benchmarks"))
    import ablation_summary

    ablation_summary.main(runs + ["--json", str(out / "summary.json")])


if __name__ == "__main__":
    main()
