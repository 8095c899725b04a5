"""What the training loop calls on models: loading (:mod:`.models`), LoRA teams on a shared base (:mod:`.team`), batched
rollouts (:mod:`.rollout`) and the rollout engines behind them (:mod:`.generation`: comlrl's decode loop, transformers'
``generate``; the one place that picks), training-forward log-probs (:mod:`.logprobs`), per-row sampling streams
(:mod:`.sampling`), value models (:mod:`.critic`), reward calls and their checks (:mod:`.rewards`), and process-wide
settings: seeds, device, bf16 detection, heap policy (:mod:`.process`).

What may live here: code that runs models for the loop. What may not: the loop itself (:mod:`comlrl.trainers`) or
speed tricks (:mod:`comlrl.accel`, which this package may call, never the other way round).
"""
