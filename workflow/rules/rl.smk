# Multi-stage RL with GRPO-RoC (paper §2.2, §4.3) and the GRPO / GRPO-RoC ablation (paper §5.3, Fig. 4 and 9), one
# rule for every run: `run` is rl/stage1, rl/stage2, rl/stage3 (each stage starts from the previous stage's model;
# stage 3 trains on the mined hard problems) or ablation/MODE-seedS (stage 1 again from the same SFT model for every
# (mode, seed) pair of `ablation:`, all with one budget). rl_run_input / rl_run_params in common.smk say which.
# Step-level resume: each run checkpoints every rl.checkpoint_every steps into results/rl/checkpoints/<stage or
# ablation run>, which is deliberately not a declared output (Snakemake deletes declared outputs before rerunning a
# rule, so the checkpoints would be lost). A killed run resumes from its last checkpoint when the same inputs and
# params come back; the per-step logs (declared: the report reads them) keep a second name there, so a resumed run
# finds them again (rstar2/rl/checkpoints.py). A finished stage keeps its outputs' hard links in results/rl/finished
# until Snakemake records the job complete (an interrupted workflow would otherwise train it again), then onsuccess
# or the next run's onstart deletes them and the checkpoints (rstar2/stages/interrupts.py).
# Optimizer across stages (paper §4.3): a stage with continue_optimizer reads the AdamW state and LR schedule the
# previous stage wrote to results/rl/stageN/optimizer, a declared output of rule rl_keeping_optimizer (the same
# rule for the stages whose next stage continues their optimizer: stage 1 by default).


rule rl:
    input:
        unpack(rl_run_input),
    output:
        model=directory("results/{run}/model"),
        metrics="results/{run}/metrics.jsonl",
        rollouts="results/{run}/rollouts.jsonl",
        heldout="results/{run}/heldout.jsonl",
        heldout_problems="results/{run}/heldout_problems.jsonl",
        manifest="results/{run}/manifest.json",
    wildcard_constraints:
        run=rl_runs_pattern(keeping_optimizer=False),
    params:
        p=rl_run_params,
        optimizer=rl_optimizer_arg,
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/{run}.log",
    benchmark:
        "logs/benchmarks/{run}.tsv"
    threads: 2
    resources:
        **job_resources("rl"),
    shell:
        logged(
            launch("rl") + " rl --params {params.p:q} --model {input.model} --data {input.data} {params.optimizer}"
            " --out results/{wildcards.run}",
            training=True,
        )


use rule rl as rl_keeping_optimizer with:
    output:
        model=directory("results/{run}/model"),
        metrics="results/{run}/metrics.jsonl",
        rollouts="results/{run}/rollouts.jsonl",
        heldout="results/{run}/heldout.jsonl",
        heldout_problems="results/{run}/heldout_problems.jsonl",
        optimizer=directory("results/{run}/optimizer"),
        manifest="results/{run}/manifest.json",
    wildcard_constraints:
        run=rl_runs_pattern(keeping_optimizer=True),
