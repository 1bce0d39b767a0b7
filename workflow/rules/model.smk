# Base model and the non-reasoning SFT cold start (paper §4.1).


rule base_model:
    output:
        "results/base_model/manifest.json",
    params:
        p=base_model_params(),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/base_model.log",
    threads: 2
    resources:
        **job_resources("default"),
    shell:
        "rstar2 base-model --params {params.p:q} --out results/base_model 2>&1 | tee {log}"


rule sft_data:
    input:
        sft_data_files(),
    output:
        "results/sft_data/manifest.json",
    params:
        p=sft_data_params(),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/sft_data.log",
    priority: 10
    threads: 2
    resources:
        **job_resources("default"),
    shell:
        "rstar2 sft-data --params {params.p:q} --out results/sft_data 2>&1 | tee {log}"


rule sft:
    input:
        "results/base_model/manifest.json",
        "results/sft_data/manifest.json",
    output:
        "results/sft/manifest.json",
    params:
        p=sft_params(),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/sft.log",
    benchmark:
        "benchmarks/sft.tsv"
    threads: 2
    resources:
        **job_resources("sft"),
    shell:
        launch("sft") + " sft --params {params.p:q} --model results/base_model/model"
        " --data results/sft_data/train.jsonl --out results/sft 2>&1 | tee {log}"
