"""What the training loop calls on models: loading (:mod:`.models`), LoRA teams on a shared base (:mod:`.team`),
training-forward log-probs (:mod:`.logprobs`), value models (:mod:`.critic`), the joint reward model of MARLHF
(:mod:`.reward_model`) and the pairs it reads (:mod:`.reward_pairs`), a comparator's HTTP endpoint
(:mod:`.api_client`), reward calls and their checks (:mod:`.rewards`), and process-wide settings: seeds, device,
bf16 detection, heap policy (:mod:`.process`). Rollouts are a package of their own (:mod:`comlrl.rollout`).

What may live here: code that runs models for the loop. What may not: a training loop (:mod:`comlrl.trainers`), a
rollout (:mod:`comlrl.rollout`, which calls this package), or speed tricks (:mod:`comlrl.accel`, which this package
may call, never the other way round).
"""
