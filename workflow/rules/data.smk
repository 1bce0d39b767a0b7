# RL data curation (paper §4.2): candidates -> integer answers -> exact and near dedupe -> decontamination
# against the evaluation sets (rl_candidates), then label verification with a verifier model (rl_data).


rule rl_candidates:
    input:
        rl_data_files(),
    output:
        data="results/rl_candidates/train.jsonl",
        funnel="results/rl_candidates/funnel.json",
        manifest="results/rl_candidates/manifest.json",
    params:
        p=to_json(stage_params.rl_data(config)),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/rl_candidates.log",
    benchmark:
        "logs/benchmarks/rl_candidates.tsv"
    priority: 10  # cheap and most likely to reveal a bad custom dataset: it starts with base_model
    threads: 1
    resources:
        **job_resources("default"),
    shell:
        logged("rstar2 rl-candidates --params {params.p:q} --out results/rl_candidates")


# Only scheduled when label_verification is enabled with its own model (paper: Qwen3-32B).
rule verifier_model:
    output:
        model=directory("results/verifier_model/model"),
        manifest="results/verifier_model/manifest.json",
    params:
        p=lambda wildcards: params_json(stage_params.base_model(config, "label_verification.model")),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/verifier_model.log",
    benchmark:
        "logs/benchmarks/verifier_model.tsv"
    threads: 2
    resources:
        **job_resources("default"),
    shell:
        logged("rstar2 base-model --params {params.p:q} --out results/verifier_model")


# The prompt-length filter (rl_data.max_prompt_tokens, with the base model's tokenizer), then label
# verification; when label_verification.enabled is false it passes the rows through and records the step as
# "skipped" in the funnel.
rule rl_data:
    input:
        unpack(lambda wildcards: {**verifier_model_input(), **prompt_tokenizer_input()}),
        data="results/rl_candidates/train.jsonl",
        funnel="results/rl_candidates/funnel.json",
    output:
        data="results/rl_data/train.jsonl",
        funnel="results/rl_data/funnel.json",
        manifest="results/rl_data/manifest.json",
        funnel_plot=report("results/rl_data/funnel.png", caption="../report/funnel.rst", category="Data"),
    params:
        p=to_json(stage_params.label_verification(config)),
        model=verifier_model_arg,
        tokenizer=prompt_tokenizer_arg,
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/rl_data.log",
    benchmark:
        "logs/benchmarks/rl_data.tsv"
    # generating needs the cores; without label verification it only tokenizes, on one core (with 3 or more
    # cores it then runs beside sft; with 2 it waits for a core either way)
    threads: 2 if config["label_verification"]["enabled"] else 1
    resources:
        **job_resources("generate"),
    shell:
        logged(
            "rstar2 rl-data --params {params.p:q} --data {input.data} --funnel {input.funnel}"
            " {params.model} {params.tokenizer} --out results/rl_data"
        )


# Mining feeds stage 3 only.
if "stage3" in RL_STAGES:

    rule hard_problems:
        input:
            model="results/rl/stage2/model",
            data="results/rl_data/train.jsonl",
        output:
            data="results/hard_problems/hard.jsonl",
            manifest="results/hard_problems/manifest.json",
        params:
            p=to_json(stage_params.hard_problems(config)),
        conda:
            "../../envs/rstar2.yaml"
        log:
            "logs/hard_problems.log",
        benchmark:
            "logs/benchmarks/hard_problems.tsv"
        threads: 2
        resources:
            **job_resources("generate"),
        shell:
            logged(
                "rstar2 hard-problems --params {params.p:q} --model {input.model} --data {input.data}"
                " --out results/hard_problems"
            )
