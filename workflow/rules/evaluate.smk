# Evaluation with the training agent loop and grader (paper §5.1), then the report.


wildcard_constraints:
    model="|".join(MODEL_DIRS),


rule evaluate:
    input:
        model=model_dir,
        benchmarks=benchmark_files(),
    output:
        summary="results/eval/{model}/summary.json",
        per_problem=expand("results/eval/{{model}}/{bench}/per_problem.jsonl", bench=config["evaluate"]["benchmarks"]),
        manifest="results/eval/{model}/manifest.json",
    params:
        p=to_json(stage_params.evaluate(config)),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/evaluate_{model}.log",
    benchmark:
        "logs/benchmarks/evaluate_{model}.tsv"
    threads: 2
    resources:
        **job_resources("generate"),
    shell:
        logged(
            "rstar2 evaluate --params {params.p:q} --name {wildcards.model} --model {input.model}"
            " --out results/eval/{wildcards.model}"
        )


rule report:
    input:
        report_manifests(),
        report_files(),
    output:
        "results/report/manifest.json",
        report("results/report/learning_result.png", caption="../report/learning_result.rst", category="Evaluation"),
        report(
            "results/report/training_curves.png",
            caption="../report/training_curves.rst",
            category="Training",
        ),
        report("results/report/eval.png", caption="../report/eval.rst", category="Evaluation"),
        # the held-out curve and the ablation are shown in the HTML report only where the config makes them (a
        # figure of "no data" panels otherwise); the files are written either way
        report("results/report/learning_curve.png", caption="../report/learning_curve.rst", category="Training")
        if config["rl"]["heldout"]["benchmark"]
        else "results/report/learning_curve.png",
        report("results/report/ablation.png", caption="../report/ablation.rst", category="Training")
        if ABLATION_RUNS
        else "results/report/ablation.png",
        report("results/report/funnel.png", caption="../report/funnel.rst", category="Data"),
        report("results/report/summary.html", caption="../report/summary.rst", category="Summary"),
        report(
            "results/report/trajectories.html",
            caption="../report/trajectories.rst",
            category="Trajectories",
        ),
        "results/report/summary.md",
        "results/report/trajectories.md",
    params:
        p=to_json(stage_params.report(config, report_provenance())),
        inputs=report_inputs(),
    conda:
        "../../envs/rstar2.yaml"
    log:
        "logs/report.log",
    benchmark:
        "logs/benchmarks/report.tsv"
    threads: 1
    resources:
        **job_resources("default"),
    shell:
        logged("rstar2 report --params {params.p:q} --inputs {params.inputs:q} --out results/report")
