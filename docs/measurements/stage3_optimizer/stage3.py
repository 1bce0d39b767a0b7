import sys, json
sys.path.insert(0, "/work/main/tests")
if __name__ == "__main__":
    from rstar2.stages import rl
    from conftest import stage_params
    over = json.loads(sys.argv[2])
    params = stage_params("rl", "stage3", files=("config.yaml",), overrides=over)
    rl.run(params, "/tmp/zen3b/results/rl/stage2/model", "/tmp/zen3b/results/hard_problems/hard.jsonl", sys.argv[1],
           optimizer_from=sys.argv[3] if len(sys.argv) > 3 else None)
