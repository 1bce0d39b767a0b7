import json, re, sys, dataclasses
sys.path.insert(0, "/work/main/tests")
if __name__ == "__main__":
    from rstar2 import models
    from rstar2.rollout import run_rollouts
    from rstar2.stages.params import parse, EvaluateParams
    from conftest import stage_params
    p = parse(EvaluateParams, stage_params("evaluate", files=("config.yaml",)), "p")
    model, tok = models.load(sys.argv[1])
    rows = [json.loads(l) for l in open("data/learning/heldout.jsonl")][:40]
    probs = [{"id": r["id"], "problem": r["problem"], "answer": r["answer"]} for r in rows]
    for T, tp in ((0.6, 0.95), (0.6, 1.0), (0.8, 1.0)):
        cfg = dataclasses.replace(p.rollout, temperature=T, top_p=tp)
        trajs = run_rollouts(model, tok, probs, cfg, seed=1, answer_type="integer")
        bad = sum(bool(re.search(r'\\boxed\{\d+</answer>', t.turns[-1].text if hasattr(t.turns[-1], "text") else str(t.record()["turns"][-1]["text"]))) for t in trajs)
        print(T, tp, "acc", sum(t.reward for t in trajs)/len(trajs), "unterminated", bad, flush=True)
