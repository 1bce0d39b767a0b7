# Multi-stage RL with GRPO-RoC (paper §2.2, §4.3) and the GRPO / GRPO-RoC ablation (paper §5.3, Fig. 4 and 9), one
# rule for every run: `run` is rl/stage1, rl/stage2, rl/stage3 (each stage starts from the previous stage's model;
# stage 3 trains on the mined hard problems) or ablation/MODE-seedS (stage 1 again from the same SFT model for every
# (mode, seed) pair of `ablation:`, all with one budget). rl_run_input / rl_run_params in common.smk say which.
# Step-level resume: each run checkpoints every rl.checkpoint_every steps into results/rl/checkpoints/<stage or
# ablation run>, which is deliberately not a declared output (Snakemake deletes declared outputs before rerunning a
# rule, so the checkpoints would be lost). A killed run resumes from its last checkpoint when the same inputs and
# params come back; the stage deletes its checkpoints after writing its manifest (rstar2/rl/checkpoints.py).
# Optimizer across stages (paper §4.3): a stage with continue_optimizer starts from the AdamW state and LR schedule
# the previous stage left in results/rl/stageN/optimizer (written before its manifest); stage 2 continues by
# default, stage 3 starts fresh.


rule rl:
    input:
        unpack(rl_run_input),
    output:
        model=directory("results/{run}/model"),
        manifest="results/{run}/manifest.json",
    wildcard_constraints:
        run=r"rl/stage[123]|ablation/(grpo_roc|grpo)-seed\d+",
    params:
        p=rl_run_params,
        optimizer=rl_optimizer_arg,
    conda:
        "../../envs/train.yaml"
    log:
        "logs/{run}.log",
    benchmark:
        "logs/benchmarks/{run}.tsv"
    threads: 2
    resources:
        **job_resources("rl"),
    shell:
        launch("rl") + " rl --params {params.p:q} --model {input.model} --data {input.data} {params.optimizer}"
        " --out results/{wildcards.run} 2>&1 | tee {log}"
