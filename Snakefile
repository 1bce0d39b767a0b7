# rStar2-Agent reproduction: base model -> non-reasoning SFT -> RL stages 1-2 -> hard-problem mining
# -> RL stage 3 -> evaluation -> report. Run: snakemake --cores 2   (see README.md)

from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/rl.smk"
include: "workflow/rules/evaluate.smk"


rule all:
    default_target: True
    input:
        "results/report/manifest.json",
