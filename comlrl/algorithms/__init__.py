"""The algorithms' math, as pure functions on tensors: baselines and advantages, cross-mode credit, returns and GAE
over the multi-turn tree (:mod:`.advantages`); token log-probs from logits, loss normalizations, the clipped
policy-gradient loss with KL and rollout correction, the value loss (:mod:`.losses`); the team DPO / IPO and
Bradley-Terry losses, preference-pair selection, replay weights and centralized role tags (:mod:`.preference`).

What may live here: functions of tensors with hand-checkable results. What may not: models, tokenizers, configs,
I/O, or any speed path; this package imports nothing of comlrl but its errors (checked by import-linter).
"""
