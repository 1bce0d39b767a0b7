# Multi-stage RL with GRPO-RoC (paper §2.2, §4.3): each stage starts from the previous stage's model.
# Step-level resume: each stage checkpoints every rl.checkpoint_every steps into results/rl/checkpoints/stageN,
# which is deliberately not a declared output (Snakemake deletes declared outputs before rerunning a rule, so
# the checkpoints would be lost). A killed stage resumes from its last checkpoint when the same inputs and
# params come back; the stage deletes its checkpoints after writing its manifest (rstar2/rl/checkpoints.py).
# Optimizer across stages (paper §4.3): a stage with continue_optimizer starts from the AdamW state and LR
# schedule the previous stage left in results/rl/stageN/optimizer (written before its manifest, so the manifest
# input covers it); stage 2 continues by default, stage 3 starts fresh.


rule rl_stage1:
    input:
        "results/sft/manifest.json",
        "results/rl_data/manifest.json",
        heldout_files(),
    output:
        "results/rl/stage1/manifest.json",
    params:
        p=rl_params("stage1"),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/rl_stage1.log",
    benchmark:
        "benchmarks/rl_stage1.tsv"
    threads: 2
    resources:
        **job_resources("rl"),
    shell:
        launch("rl") + " rl --params {params.p:q} --model results/sft/model"
        " --data results/rl_data/train.jsonl --out results/rl/stage1 2>&1 | tee {log}"


if "stage2" in RL_STAGES:

    rule rl_stage2:
        input:
            "results/rl/stage1/manifest.json",
            "results/rl_data/manifest.json",
            heldout_files(),
        output:
            "results/rl/stage2/manifest.json",
        params:
            p=rl_params("stage2"),
        conda:
            "../../envs/rstar2.yaml"
        log:
            "logs/rl_stage2.log",
        benchmark:
            "benchmarks/rl_stage2.tsv"
        threads: 2
        resources:
            **job_resources("rl"),
        shell:
            launch("rl") + " rl --params {params.p:q} --model results/rl/stage1/model"
            + optimizer_from_arg("stage2") + " --data results/rl_data/train.jsonl --out results/rl/stage2 2>&1 | tee {log}"


if "stage3" in RL_STAGES:

    rule rl_stage3:
        input:
            "results/rl/stage2/manifest.json",
            "results/hard_problems/manifest.json",
            heldout_files(),
        output:
            "results/rl/stage3/manifest.json",
        params:
            p=rl_params("stage3"),
        conda:
            "../../envs/rstar2.yaml"
        log:
            "logs/rl_stage3.log",
        benchmark:
            "benchmarks/rl_stage3.tsv"
        threads: 2
        resources:
            **job_resources("rl"),
        shell:
            launch("rl") + " rl --params {params.p:q} --model results/rl/stage2/model"
            + optimizer_from_arg("stage3") + " --data results/hard_problems/hard.jsonl --out results/rl/stage3 2>&1 | tee {log}"


# The GRPO / GRPO-RoC ablation (paper §5.3, Fig. 4 and 9): stage 1 again from the same SFT model for every
# (mode, seed) pair of `ablation:`, all with the same budget (ablation.steps, held-out settings).
rule rl_ablation:
    input:
        "results/sft/manifest.json",
        "results/rl_data/manifest.json",
        heldout_files(),
    output:
        "results/ablation/{mode}-seed{seed}/manifest.json",
    wildcard_constraints:
        mode="grpo_roc|grpo",
        seed=r"\d+",
    params:
        p=lambda wc: rl_params("stage1", (wc.mode, wc.seed)),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/rl_ablation_{mode}-seed{seed}.log",
    benchmark:
        "benchmarks/rl_ablation_{mode}-seed{seed}.tsv"
    threads: 2
    resources:
        **job_resources("rl"),
    shell:
        launch("rl") + " rl --params {params.p:q} --model results/sft/model"
        " --data results/rl_data/train.jsonl --out results/ablation/{wildcards.mode}-seed{wildcards.seed}"
        " 2>&1 | tee {log}"
