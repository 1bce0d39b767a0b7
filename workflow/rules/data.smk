# RL data curation: integer answers, dedupe, decontamination against the evaluation sets (paper §4.2).


rule rl_data:
    input:
        rl_data_files(),
    output:
        "results/rl_data/manifest.json",
    params:
        p=rl_data_params(),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/rl_data.log",
    priority: 10  # cheap and most likely to reveal a bad custom dataset: run it first
    threads: 1
    shell:
        "rstar2 rl-data --params {params.p:q} --out results/rl_data 2>&1 | tee {log}"


rule hard_problems:
    input:
        "results/rl/stage2/manifest.json",
        "results/rl_data/manifest.json",
    output:
        "results/hard_problems/manifest.json",
    params:
        p=hard_problems_params(),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/hard_problems.log",
    benchmark:
        "benchmarks/hard_problems.tsv"
    threads: 2
    shell:
        "rstar2 hard-problems --params {params.p:q} --model results/rl/stage2/model"
        " --data results/rl_data/train.jsonl --out results/hard_problems 2>&1 | tee {log}"
