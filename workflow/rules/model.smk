# Base model and the non-reasoning SFT cold start (paper §4.1).


rule base_model:
    output:
        model=directory("results/base_model/model"),
        manifest="results/base_model/manifest.json",
    params:
        p=to_json(stage_params.base_model(config)),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/base_model.log",
    benchmark:
        "logs/benchmarks/base_model.tsv"
    # one core: converting the GGUF tokenizer and weights is single-threaded Python (~15 s of CPU in 31-33 s on a
    # 2-core Zen 3); rl_candidates, then sft_data run beside it. It starts first: everything after waits for it
    priority: 20
    threads: 1
    resources:
        **job_resources("default"),
    shell:
        logged("rstar2 base-model --params {params.p:q} --out results/base_model")


rule sft_data:
    input:
        sft_data_files(),
    output:
        data="results/sft_data/train.jsonl",
        manifest="results/sft_data/manifest.json",
    params:
        p=to_json(stage_params.sft_data(config)),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/sft_data.log",
    benchmark:
        "logs/benchmarks/sft_data.tsv"
    # one core: generating the tasks and running their tool calls is single-threaded Python (6 s at a load of
    # 1.2 on a 2-core Zen 3), so it runs beside base_model instead of after it
    priority: 5
    threads: 1
    resources:
        **job_resources("default"),
    shell:
        logged("rstar2 sft-data --params {params.p:q} --out results/sft_data")


rule sft:
    input:
        model="results/base_model/model",
        data="results/sft_data/train.jsonl",
    output:
        model=directory("results/sft/model"),
        manifest="results/sft/manifest.json",
    params:
        p=to_json(stage_params.sft(config)),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/sft.log",
    benchmark:
        "logs/benchmarks/sft.tsv"
    threads: 2
    resources:
        **job_resources("sft"),
    shell:
        logged(
            launch("sft") + " sft --params {params.p:q} --model {input.model} --data {input.data}"
            " --out results/sft",
            training=True,
        )
