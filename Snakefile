# rStar2-Agent reproduction: base model -> non-reasoning SFT -> RL stages 1-2 -> hard-problem mining
# -> RL stage 3 -> evaluation -> report. Run: snakemake --cores 2   (see README.md)

from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


envvars:
    "PATH",


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/rl.smk"
include: "workflow/rules/evaluate.smk"


# Every stage's manifest is a target, so deleting any stage folder reruns that stage and what depends
# on it (Snakemake does not otherwise regenerate a missing intermediate output).
rule all:
    default_target: True
    input:
        all_manifests(),
