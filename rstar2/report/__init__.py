"""The report: evaluation beside the paper's numbers, training curves, data funnel and sample trajectories.

Modules, one job each: ``inputs`` reads the stage outputs leniently, ``paper`` holds the paper's numbers,
``document`` is a tiny block model rendered to both markdown and HTML, ``sections`` builds the evaluation and
funnel tables, ``training`` the RL section, ``plots`` draws the figures, ``trajectories`` renders sample rollouts.
``rstar2.stages.report.run`` ties them together.
"""
